//! `/dedup`: the backend's statistics (all of them, as the backend reports
//! them, plus each knob's valid range so clients can show it) and changes
//! of mode, knobs and auto-mode settings: the body is a
//! [`DedupSettings`], checked once as the CLI's `dedup set` words are (see
//! [`crate::patch`]).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use pagefold_dedup::auto::{AutoError, AutoHandle};
use pagefold_dedup::{DedupBackend, DedupSettings, Knobs};
use serde::Serialize;
use serde_json::Value;

use crate::body;
use crate::error::ApiError;
use crate::state::{blocking, AppState};

/// A knob's valid range (inclusive), as `GET /dedup` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub min: u64,
    pub max: u64,
}

/// The knobs' valid ranges, for clients, by knob name.
pub fn limits() -> BTreeMap<&'static str, Limit> {
    Knobs::RANGES
        .into_iter()
        .map(|(name, (min, max))| (name, Limit { min, max }))
        .collect()
}

fn to_value(what: &str, v: impl Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::Internal(format!("serializing {what}: {e}")))
}

/// The `GET /dedup` body: every statistic, the knobs, their limits, and
/// auto mode's status and settings when the backend has a controller.
pub fn view(b: &dyn DedupBackend, auto: Option<&AutoHandle>) -> Result<Value, ApiError> {
    let mut v = to_value("dedup stats", b.stats())?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::Internal("dedup stats are not a JSON object".into()))?;
    if obj.get("knobs").is_none_or(Value::is_null) {
        obj.insert("knobs".into(), to_value("knobs", b.knobs())?);
    }
    obj.insert("limits".into(), to_value("limits", limits())?);
    if let Some(a) = auto {
        if !obj.contains_key("auto") {
            obj.insert("auto".into(), to_value("auto status", a.status())?);
        }
        let settings = a.config().settings();
        obj.insert("auto_config".into(), to_value("auto settings", settings)?);
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
    let p: DedupSettings = body::json(&headers, body, s.max_body, s.body_timeout).await?;
    let v = blocking(move || -> Result<Value, ApiError> {
        // The one check of this input, before anything changes: a bad knob
        // never leaves the mode changed (or the other way round).
        let p = p
            .validate()
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
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
