//! `/dedup`: the backend's statistics (all of them, as the backend reports
//! them, plus each knob's valid range so clients can show it) and changes
//! of mode and knobs, validated like the CLI's (see [`crate::patch`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use pagefold_dedup::auto::{AutoError, AutoHandle};
use pagefold_dedup::DedupBackend;

use crate::body;
use crate::dedup_view::DedupView;
use crate::error::ApiError;
use crate::patch::DedupPatch;
use crate::responses::{BadRequest, Conflict, Internal, NoBackend, SlowBody, TooLarge};
use crate::router::{blocking, AppState};

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
/// changes.
#[utoipa::path(patch, path = "/dedup", operation_id = "patchDedup", tag = "dedup",
    request_body(content = crate::schema::DedupPatchSchema, content_type = "application/json"),
    responses(
        (status = 200, description = "Changed; the new state.", body = DedupView),
        (status = 400, response = BadRequest),
        (status = 404, response = NoBackend),
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
    let b = s.backend()?;
    let auto = s.handle.auto().cloned();
    let p: DedupPatch = body::json(&headers, body, s.max_body, s.body_timeout).await?;
    let v = blocking(move || -> Result<DedupView, ApiError> {
        // Check everything first, so a bad knob never leaves the mode
        // changed (or the other way round).
        let bad = |e: crate::patch::PatchError| ApiError::BadRequest(e.to_string());
        let c = p.check(&b.knobs()).map_err(bad)?;
        if p.touches_auto() {
            let a = auto.as_ref().ok_or_else(|| {
                ApiError::Conflict("this dedup backend has no auto-mode controller".into())
            })?;
            let cfg = p.auto_config(a.config()).map_err(bad)?;
            a.set_config(cfg).map_err(|e| match e {
                // In range for the type, but above what this host's RAM
                // and the current pages_to_scan allow: a conflict with
                // the current state, not malformed input.
                AutoError::MaxScanningFactor { value, .. } if value >= 1 => {
                    ApiError::Conflict(e.to_string())
                }
                e => ApiError::BadRequest(e.to_string()),
            })?;
        }
        if c.knobs != Default::default() {
            b.set_knobs(c.knobs)?;
        }
        if let Some(m) = c.mode {
            b.set_mode(m)?;
        }
        view(b.as_ref(), auto.as_ref())
    })
    .await??;
    Ok(Json(v))
}
