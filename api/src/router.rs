//! The route table: every route to its handler, and the fallbacks for
//! unknown paths and methods. Shared state is in [`crate::state`].

use axum::http::{Method, Uri};
use axum::routing::get;
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{balloon, dedup, system, vms, PREFIX};

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("method {method} is not allowed on {}", uri.path()))
}

/// Every route under [`PREFIX`], with its OpenAPI description: the one
/// route table both the router and the spec ([`crate::openapi`]) come from.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(crate::openapi::base())
        .routes(routes!(system::health))
        .routes(routes!(system::metrics))
        .routes(routes!(system::shutdown))
        .routes(routes!(dedup::get, dedup::patch))
        .routes(routes!(vms::list))
        .routes(routes!(vms::get, vms::put, vms::patch, vms::delete))
        .routes(routes!(balloon::put))
}

/// The whole API: the routes under [`PREFIX`], plus the metrics at
/// `/metrics`, the path Prometheus scrapes by default.
pub fn router(state: AppState) -> Router {
    let (api, _) = api_routes().split_for_parts();
    Router::new()
        .nest(PREFIX, api.method_not_allowed_fallback(method_not_allowed))
        .route("/metrics", get(system::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The metrics listener's routes: `GET /metrics` and nothing else; every
/// other path is a 404, so the control API is out of reach.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(system::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}
