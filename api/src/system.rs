//! `/health`, `/shutdown` and `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use pagefold_vmm::control::{Request, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::{blocking, unexpected, AppState};
use crate::{dedup, metrics};

/// How long `/health` waits for the backend's statistics: an engine wedged
/// on its own lock must not hang the health check too (it is reported
/// stalled instead).
pub const ENGINE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The engine part of `/health`: null without a backend; else whether its
/// statistics answered, how long ago its scanner last woke up, and the
/// engine's own judgement whether a wake-up is overdue.
async fn engine(s: &AppState) -> Result<Value, ApiError> {
    let Some(b) = s.handle.dedup().cloned() else {
        return Ok(Value::Null);
    };
    let name = b.name();
    Ok(
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, blocking(move || b.stats())).await {
            Ok(stats) => {
                let st = stats?;
                json!({
                    "backend": name,
                    "responding": true,
                    "last_wakeup_age_ms": st.last_wakeup_age_ms,
                    "wakeup_overdue": st.wakeup_overdue,
                })
            }
            Err(_) => json!({
                "backend": name,
                "responding": false,
                "last_wakeup_age_ms": null,
                "wakeup_overdue": true,
            }),
        },
    )
}

/// Healthy means the VMM's event loop answers and the dedup engine (if
/// any) is not stalled: its scanner woke up when it planned to and its
/// statistics answer. A stalled engine is a 503 with the same body
/// (`"status": "stalled"`), so a plain HTTP probe sees it.
pub async fn health(State(s): State<AppState>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let vms = s.vms().await?;
    let engine = engine(&s).await?;
    let stalled = engine["wakeup_overdue"] == true || engine["responding"] == false;
    let (code, status) = if stalled {
        (StatusCode::SERVICE_UNAVAILABLE, "stalled")
    } else {
        (StatusCode::OK, "ok")
    };
    Ok((
        code,
        Json(json!({
            "status": status,
            "vms": vms.len(),
            "dedup_backend": s.handle.dedup().map(|b| b.name()),
            "engine": engine,
        })),
    ))
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
