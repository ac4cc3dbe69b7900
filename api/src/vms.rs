//! `/vms` and `/vms/{name}`: list, inspect, create (from a `[[vm]]`-shaped
//! JSON body), pause/resume and delete VMs, through the VMM's control
//! channel.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::control::{Request, Response};
use pagefold_vmm::vm::VmInfo;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::body;
use crate::error::ApiError;
use crate::responses::{BadRequest, Conflict, Internal, NotFound, SlowBody, TooLarge, Unavailable};
use crate::state::{name, unexpected, AppState};

fn vm(r: Response) -> Result<Json<VmInfo>, ApiError> {
    match r {
        Response::Vm(v) => Ok(Json(*v)),
        other => Err(unexpected(&other)),
    }
}

/// Every VM of the process.
#[utoipa::path(get, path = "/vms", operation_id = "listVms", tag = "vms",
    responses(
        (status = 200, description = "The VMs.", body = Vec<crate::schema::VmInfoSchema>),
        (status = 503, response = Unavailable),
    ))]
pub async fn list(State(s): State<AppState>) -> Result<Json<Vec<VmInfo>>, ApiError> {
    Ok(Json(s.vms().await?))
}

/// One VM.
#[utoipa::path(get, path = "/vms/{name}", operation_id = "getVm", tag = "vms",
    params(("name" = crate::schema::VmNameSchema, Path, description = "The VM's name.")),
    responses(
        (status = 200, description = "The VM.", body = crate::schema::VmInfoSchema),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn get(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<VmInfo>, ApiError> {
    vm(s.call(Request::GetVm(name(p)?)).await?)
}

/// Fills in `name` from the path, or checks that the body's agrees.
pub fn config_for(path_name: &str, mut v: serde_json::Value) -> Result<VmConfig, ApiError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::BadRequest("the VM config must be a JSON object".into()))?;
    match obj.get("name") {
        None => {
            obj.insert("name".into(), path_name.into());
        }
        Some(serde_json::Value::String(n)) if n == path_name => {}
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "the body's name {other} differs from the path's {path_name:?}"
            )))
        }
    }
    serde_json::from_value(v).map_err(|e| ApiError::BadRequest(format!("invalid VM config: {e}")))
}

/// Create and start a VM (same description as a `[[vm]]` table of the
/// config file).
#[utoipa::path(put, path = "/vms/{name}", operation_id = "createVm", tag = "vms",
    params(("name" = crate::schema::VmNameSchema, Path, description = "The VM's name.")),
    request_body(content = crate::schema::VmConfigSchema, content_type = "application/json"),
    responses(
        (status = 201, description = "Created and started.", body = crate::schema::VmInfoSchema),
        (status = 400, response = BadRequest),
        (status = 408, response = SlowBody),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 500, response = Internal),
        (status = 503, response = Unavailable),
    ))]
pub async fn put(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    b: Body,
) -> Result<(StatusCode, Json<VmInfo>), ApiError> {
    let n = name(p)?;
    let v: serde_json::Value = body::json(&headers, b, s.max_body, s.body_timeout).await?;
    let cfg = config_for(&n, v)?;
    let info = vm(s.call(Request::CreateVm(Box::new(cfg))).await?)?;
    Ok((StatusCode::CREATED, info))
}

/// The states a client may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = VmTarget)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Paused,
    Running,
}

/// The state to put the VM in.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = VmStatePatch)]
#[serde(deny_unknown_fields)]
pub struct StatePatch {
    pub state: Target,
}

/// Pause or resume a VM.
#[utoipa::path(patch, path = "/vms/{name}", operation_id = "setVmState", tag = "vms",
    params(("name" = crate::schema::VmNameSchema, Path, description = "The VM's name.")),
    request_body(content = StatePatch, content_type = "application/json"),
    responses(
        (status = 200, description = "The VM in its new state.", body = crate::schema::VmInfoSchema),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 408, response = SlowBody),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 503, response = Unavailable),
    ))]
pub async fn patch(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    b: Body,
) -> Result<Json<VmInfo>, ApiError> {
    let n = name(p)?;
    let sp: StatePatch = body::json(&headers, b, s.max_body, s.body_timeout).await?;
    let req = match sp.state {
        Target::Paused => Request::Pause(n),
        Target::Running => Request::Resume(n),
    };
    vm(s.call(req).await?)
}

/// Stop a VM and release its memory and dedup regions.
#[utoipa::path(delete, path = "/vms/{name}", operation_id = "deleteVm", tag = "vms",
    params(("name" = crate::schema::VmNameSchema, Path, description = "The VM's name.")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn delete(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    match s.call(Request::DeleteVm(name(p)?)).await? {
        Response::Done => Ok(StatusCode::NO_CONTENT),
        other => Err(unexpected(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn name_is_filled_in_or_checked() {
        let c = config_for("a", json!({"memory": "64M"})).unwrap();
        assert_eq!(c.name, "a");
        let c = config_for("a", json!({"name": "a", "memory": 64})).unwrap();
        assert_eq!(c.name, "a");
        let e = config_for("a", json!({"name": "b", "memory": 64})).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
        let e = config_for("a", json!([1])).unwrap_err();
        assert!(e.to_string().contains("object"), "{e}");
        let e = config_for("a", json!({"memory": 64, "cpus": 2})).unwrap_err();
        assert!(e.to_string().contains("cpus"), "{e}");
    }

    #[test]
    fn workload_placement_is_accepted() {
        let c = config_for(
            "a",
            json!({"memory": 64, "workload": {"placement": "scattered", "extent_pages": 8}}),
        )
        .unwrap();
        let w = c.workload.unwrap();
        assert_eq!(w.placement, pagefold_vmm::config::PlacementKind::Scattered);
        assert_eq!(w.extent_pages, Some(8));
        let e = config_for(
            "a",
            json!({"memory": 64, "workload": {"placement": "zigzag"}}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("zigzag"), "{e}");
    }
}
