//! `/dedup`: the backend's statistics (all of them, as the backend reports
//! them, plus each knob's valid range so clients can show it) and changes
//! of mode and knobs, validated like the CLI's (see [`crate::patch`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use pagefold_dedup::auto::{AutoError, AutoHandle};
use pagefold_dedup::{DedupBackend, Knobs};
use serde_json::{json, Value};

use crate::body;
use crate::error::ApiError;
use crate::patch::DedupPatch;
use crate::state::{blocking, AppState};

/// The knobs' valid ranges, for clients.
pub fn limits() -> Value {
    let r = |(min, max): (u64, u64)| json!({ "min": min, "max": max });
    json!({
        "pages_to_scan": r(Knobs::PAGES_TO_SCAN),
        "sleep_millisecs": r(Knobs::SLEEP_MILLISECS),
        "max_page_sharing": r(Knobs::MAX_PAGE_SHARING),
    })
}

/// The `GET /dedup` body: every statistic, the knobs, their limits, and
/// auto mode's status and settings when the backend has a controller.
pub fn view(b: &dyn DedupBackend, auto: Option<&AutoHandle>) -> Result<Value, ApiError> {
    let stats = b.stats();
    let mut v = serde_json::to_value(&stats)
        .map_err(|e| ApiError::Internal(format!("serializing dedup stats: {e}")))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::Internal("dedup stats are not a JSON object".into()))?;
    if obj.get("knobs").is_none_or(Value::is_null) {
        obj.insert("knobs".into(), json!(b.knobs()));
    }
    obj.insert("limits".into(), limits());
    if let Some(a) = auto {
        if !obj.contains_key("auto") {
            let status = serde_json::to_value(a.status())
                .map_err(|e| ApiError::Internal(format!("serializing auto status: {e}")))?;
            obj.insert("auto".into(), status);
        }
        let c = a.config();
        obj.insert(
            "auto_config".into(),
            json!({
                "auto_threshold": c.threshold_pct,
                "max_scanning_factor": c.max_scanning_factor,
                "memory_signal": c.memory_signal,
            }),
        );
    }
    Ok(v)
}

pub async fn get(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let b = s.backend()?;
    let auto = s.handle.auto().cloned();
    Ok(Json(
        blocking(move || view(b.as_ref(), auto.as_ref())).await??,
    ))
}

pub async fn patch(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let b = s.backend()?;
    let auto = s.handle.auto().cloned();
    let p: DedupPatch = body::json(&headers, body, s.max_body, s.body_timeout).await?;
    let v = blocking(move || -> Result<Value, ApiError> {
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
