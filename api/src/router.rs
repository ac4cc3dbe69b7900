//! The route table: every route to its handler, and the fallbacks for
//! unknown paths and methods. Shared state is in [`crate::state`].

use axum::http::{Method, Uri};
use axum::routing::{get, put};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{dedup, system, vms, PREFIX};

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("method {method} is not allowed on {}", uri.path()))
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let p = |s: &str| format!("{PREFIX}{s}");
    Router::new()
        .route(&p("/health"), get(system::health))
        .route(&p("/metrics"), get(system::metrics))
        .route(&p("/shutdown"), put(system::shutdown))
        .route(&p("/dedup"), get(dedup::get).patch(dedup::patch))
        .route(&p("/vms"), get(vms::list))
        .route(
            &p("/vms/{name}"),
            get(vms::get)
                .put(vms::put)
                .patch(vms::patch)
                .delete(vms::delete),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}
