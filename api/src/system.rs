//! `/health`, `/shutdown` and `/metrics` (also served at the root's
//! `/metrics`, Prometheus' default scrape path).

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use pagefold_vmm::control::{Request, Response};

use crate::error::ApiError;
use crate::responses::Unavailable;
use crate::state::{blocking, unexpected, AppState};
use crate::view::{EngineHealth, Health, HealthOrError, HealthStatus, ShutdownBody, ShuttingDown};
use crate::{dedup, metrics};

/// How long `/health` waits for the backend's statistics: an engine wedged
/// on its own lock must not hang the health check too (it is reported
/// stalled instead).
pub const ENGINE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The engine part of `/health`: none without a backend; else whether its
/// statistics answered, how long ago its scanner last woke up, and the
/// engine's own judgement whether a wake-up is overdue.
async fn engine(s: &AppState) -> Result<Option<EngineHealth>, ApiError> {
    let Some(b) = s.handle.dedup().cloned() else {
        return Ok(None);
    };
    let backend = b.name().to_string();
    Ok(Some(
        match tokio::time::timeout(ENGINE_PROBE_TIMEOUT, blocking(move || b.stats())).await {
            Ok(stats) => {
                let st = stats?;
                EngineHealth {
                    backend,
                    responding: true,
                    last_wakeup_age_ms: Some(st.last_wakeup_age_ms),
                    wakeup_overdue: st.wakeup_overdue,
                }
            }
            Err(_) => EngineHealth {
                backend,
                responding: false,
                last_wakeup_age_ms: None,
                wakeup_overdue: true,
            },
        },
    ))
}

/// The VMM's event loop answers and the dedup engine is not stalled.
///
/// Healthy means the VMM's event loop answers and the dedup engine (if
/// any) is not stalled: its scanner woke up when it planned to and its
/// statistics answer. A stalled engine is a 503 with the same body
/// (`"status": "stalled"`), so a plain HTTP probe sees it.
#[utoipa::path(get, path = "/health", operation_id = "getHealth", tag = "system",
    responses(
        (status = 200, description = "Healthy.", body = Health),
        (status = 503, description = "The dedup engine is stalled (a Health body with `\"status\":\"stalled\"`), or the VMM is shutting down (an Error body).",
            body = HealthOrError),
    ))]
pub async fn health(State(s): State<AppState>) -> Result<(StatusCode, Json<Health>), ApiError> {
    let vms = s.vms().await?;
    let mut h = Health {
        status: HealthStatus::Ok,
        vms: vms.len(),
        dedup_backend: s.handle.dedup().map(|b| b.name().to_string()),
        engine: engine(&s).await?,
    };
    let code = if h.stalled() {
        h.status = HealthStatus::Stalled;
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    Ok((code, Json(h)))
}

/// Stop every VM and end the process (serve mode too).
#[utoipa::path(put, path = "/shutdown", operation_id = "shutdown", tag = "system",
    responses(
        (status = 202, description = "Shutting down.", body = ShutdownBody),
        (status = 503, response = Unavailable),
    ))]
pub async fn shutdown(
    State(s): State<AppState>,
) -> Result<(StatusCode, Json<ShutdownBody>), ApiError> {
    match s.call(Request::Shutdown).await? {
        Response::Done => Ok((
            StatusCode::ACCEPTED,
            Json(ShutdownBody {
                status: ShuttingDown::ShuttingDown,
            }),
        )),
        other => Err(unexpected(&other)),
    }
}

/// Every VM figure and dedup statistic, in Prometheus' text format.
///
/// Prometheus text format 0.0.4, or OpenMetrics 1.0 for clients that ask
/// for it (`Accept: application/openmetrics-text`, as Prometheus does).
/// Also served at `/metrics`, Prometheus' default scrape path.
#[utoipa::path(get, path = "/metrics", operation_id = "getMetrics", tag = "system",
    responses(
        (status = 200, description = "Metrics; per-VM series carry a `vm` label.",
            content(
                (String = "text/plain"),
                (String = "application/openmetrics-text"),
            )),
        (status = 503, response = Unavailable),
    ))]
pub async fn metrics(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let vms = s.vms().await?;
    let backend = s.handle.dedup().cloned();
    let auto = s.handle.auto().cloned();
    let view = blocking(move || backend.map(|b| dedup::view(b.as_ref(), auto.as_ref())))
        .await?
        .transpose()?;
    let format = metrics::Format::for_accept(
        headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
    );
    let text = metrics::render(view.as_ref(), &vms, format)
        .map_err(|e| ApiError::Internal(format!("encoding the metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, format.content_type())], text))
}
