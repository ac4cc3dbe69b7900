//! The route table and what every handler shares. Handlers never block the
//! runtime thread: calls into the VMM (which may wait up to 30 s for the
//! event loop) and into the dedup backend run on tokio's blocking pool.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::{Method, Uri};
use axum::routing::get;
use axum::Router;
use pagefold_dedup::DedupBackend;
use pagefold_vmm::control::{self, Request, Response};
use pagefold_vmm::vm::VmInfo;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::{dedup, system, vms, PREFIX};

/// What every handler needs.
#[derive(Clone)]
pub struct AppState {
    pub handle: control::Handle,
    /// Largest request body accepted.
    pub max_body: usize,
    /// How long a client may take to send its body.
    pub body_timeout: Duration,
}

impl AppState {
    pub fn new(handle: control::Handle) -> AppState {
        AppState {
            handle,
            max_body: 64 * 1024,
            body_timeout: Duration::from_secs(10),
        }
    }

    /// Sends a request to the VMM's event loop, off the runtime thread.
    pub async fn call(&self, req: Request) -> Result<Response, ApiError> {
        let h = self.handle.clone();
        tokio::task::spawn_blocking(move || h.call(req))
            .await
            .map_err(|e| ApiError::Internal(format!("request task failed: {e}")))?
            .map_err(ApiError::from)
    }

    /// The dedup backend, or 404 when the process has none.
    pub fn backend(&self) -> Result<Arc<dyn DedupBackend>, ApiError> {
        self.handle.dedup().cloned().ok_or_else(|| {
            ApiError::NotFound(
                "deduplication is off in this process: no dedup backend (start pagefold with --dedup on or auto and VMs with dedup enabled)"
                    .into(),
            )
        })
    }

    /// The VM list.
    pub async fn vms(&self) -> Result<Vec<VmInfo>, ApiError> {
        match self.call(Request::ListVms).await? {
            Response::Vms(v) => Ok(v),
            other => Err(unexpected(&other)),
        }
    }
}

/// Runs `f` (a backend call: may take a lock) on the blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("request task failed: {e}")))
}

/// A reply of the wrong kind: a bug in the VMM or here.
pub fn unexpected(r: &Response) -> ApiError {
    ApiError::Internal(format!("unexpected reply from the VMM: {r:?}"))
}

/// The `{name}` path segment, with a JSON 400 for undecodable ones and for
/// names outside the documented pattern (`.`, `..`, `-rf`, ...), which no
/// VM can have.
pub fn name(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let n = p.map(|Path(n)| n).map_err(|e| {
        ApiError::BadRequest(format!("invalid VM name in the path: {}", e.body_text()))
    })?;
    pagefold_vmm::config::validate_vm_name(&n).map_err(ApiError::BadRequest)?;
    Ok(n)
}

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
