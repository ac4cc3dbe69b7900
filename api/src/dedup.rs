//! `/dedup`: the backend's statistics (all of them, as the backend reports
//! them, plus each knob's valid range so clients can show it) and changes
//! of mode, knobs and auto-mode settings: the body is a
//! [`DedupSettings`], checked once as the CLI's `dedup set` words are (see
//! [`crate::patch`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use pagefold_dedup::auto::{AutoError, AutoHandle};
use pagefold_dedup::{DedupBackend, DedupSettings};

use crate::body;
use crate::dedup_view::DedupView;
use crate::error::ApiError;
use crate::responses::{BadRequest, Conflict, Internal, NoBackend, SlowBody, TooLarge};
use crate::state::{blocking, AppState};
use pagefold_vmm::control::Request;

/// The `GET /dedup` body: every statistic, the knobs, their limits, and
/// auto mode's status and settings when the backend has a controller.
pub fn view(b: &dyn DedupBackend, auto: Option<&AutoHandle>) -> Result<DedupView, ApiError> {
    Ok(DedupView::new(
        b.stats(),
        b.knobs(),
        auto.map(|a| (a.status(), a.config())),
    ))
}

/// Dedup mode, knobs and every statistic, engine-wide and per VM.
#[utoipa::path(get, path = "/dedup", operation_id = "getDedup", tag = "dedup",
    responses(
        (status = 200, description = "Current state.", body = DedupView),
        (status = 404, response = NoBackend),
    ))]
pub async fn get(State(s): State<AppState>) -> Result<Json<DedupView>, ApiError> {
    let b = s.backend()?;
    let auto = s.handle.auto().cloned();
    Ok(Json(
        blocking(move || view(b.as_ref(), auto.as_ref())).await??,
    ))
}

/// Change the mode and/or knobs. Validated as a whole before anything
/// changes. A process without a backend starts one first (its VMs' memory
/// registered with it), so dedup can be turned on in a daemon started
/// without it; if that fails, nothing changes.
#[utoipa::path(patch, path = "/dedup", operation_id = "patchDedup", tag = "dedup",
    request_body(content = DedupSettings, content_type = "application/json"),
    responses(
        (status = 200, description = "Changed; the new state.", body = DedupView),
        (status = 400, response = BadRequest),
        (status = 408, response = SlowBody),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 500, response = Internal),
    ))]
pub async fn patch(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<DedupView>, ApiError> {
    let p: DedupSettings = body::json(&headers, body, s.max_body, s.body_timeout).await?;
    // The one check of this input, before anything changes: a bad knob
    // never leaves the mode changed (or the other way round), nor a
    // backend started.
    let p = p
        .validate()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if s.handle.dedup().is_none() {
        s.call(Request::StartDedup).await?;
    }
    let b = s.backend()?;
    let auto = s.handle.auto().cloned();
    let v = blocking(move || -> Result<DedupView, ApiError> {
        if p.touches_auto() {
            let a = auto.as_ref().ok_or_else(|| {
                ApiError::Conflict("this dedup backend has no auto-mode controller".into())
            })?;
            a.set_config(a.config().overlaid(&p)).map_err(|e| match e {
                // In range for the type, but above what this host's RAM
                // and the current pages_to_scan allow: a conflict with
                // the current state, not malformed input.
                AutoError::MaxScanningFactor { value, .. } if value >= 1 => {
                    ApiError::Conflict(e.to_string())
                }
                e => ApiError::BadRequest(e.to_string()),
            })?;
        }
        b.apply(&p)?;
        view(b.as_ref(), auto.as_ref())
    })
    .await??;
    Ok(Json(v))
}
