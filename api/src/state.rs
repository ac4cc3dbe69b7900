//! What every handler shares: the VMM handle and body limits
//! ([`AppState`]), and the helpers for calling into the VMM and the dedup
//! backend. Handlers never block the runtime thread: calls into the VMM
//! (which may wait up to 30 s for the event loop) and into the dedup backend
//! run on tokio's blocking pool. Its own module so that handlers import it
//! and the router imports the handlers, with no import going back.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use pagefold_dedup::DedupBackend;
use pagefold_vmm::control::{self, Request, Response};
use pagefold_vmm::vm::VmInfo;

use crate::error::ApiError;

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
                "deduplication is off in this process: no dedup backend (PATCH /dedup with a mode starts one)"
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
