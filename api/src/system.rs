//! `/health`, `/shutdown` and `/metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use pagefold_vmm::control::{Request, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::router::{blocking, unexpected, AppState};
use crate::{dedup, metrics};

/// Healthy means the VMM's event loop answers.
pub async fn health(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let vms = s.vms().await?;
    Ok(Json(json!({
        "status": "ok",
        "vms": vms.len(),
        "dedup_backend": s.handle.dedup().map(|b| b.name()),
    })))
}

/// Stops every VM and ends the process (also in `serve` mode).
pub async fn shutdown(State(s): State<AppState>) -> Result<(StatusCode, Json<Value>), ApiError> {
    match s.call(Request::Shutdown).await? {
        Response::Done => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"status": "shutting down"})),
        )),
        other => Err(unexpected(&other)),
    }
}

/// Prometheus text format, version 0.0.4.
pub async fn metrics(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let vms = s.vms().await?;
    let backend = s.handle.dedup().cloned();
    let auto = s.handle.auto().cloned();
    let view = blocking(move || backend.map(|b| dedup::view(b.as_ref(), auto.as_ref())))
        .await?
        .transpose()?;
    let text = metrics::render(view.as_ref(), &vms);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}
