//! `/vms/{name}/balloon`: set a VM's balloon target, through the VMM's
//! control channel. The balloon's figures are in the VM's view
//! (`GET /vms/{name}`, `balloon`).

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use pagefold_vmm::control::{Request, Response};
use pagefold_vmm::vm::VmInfo;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::body;
use crate::error::ApiError;
use crate::responses::{BadRequest, Conflict, NotFound, SlowBody, TooLarge, Unavailable};
use crate::state::{name, unexpected, AppState};

/// The size to ask the balloon for.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = BalloonTarget)]
#[serde(deny_unknown_fields)]
pub struct BalloonTarget {
    /// MiB the guest should give up into its balloon (0: take it all
    /// back); at most the VM's memory.
    #[schema(minimum = 0)]
    pub target_mib: u64,
}

/// Ask a VM's balloon for a size: the guest inflates or deflates towards
/// it (watch `balloon.actual_mib`).
#[utoipa::path(put, path = "/vms/{name}/balloon", operation_id = "setVmBalloon", tag = "vms",
    params(("name" = crate::schema::VmNameSchema, Path, description = "The VM's name.")),
    request_body(content = BalloonTarget, content_type = "application/json"),
    responses(
        (status = 200, description = "The VM, with the new target.", body = crate::schema::VmInfoSchema),
        (status = 400, response = BadRequest),
        (status = 404, response = NotFound),
        (status = 408, response = SlowBody),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 503, response = Unavailable),
    ))]
pub async fn put(
    State(s): State<AppState>,
    p: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    b: Body,
) -> Result<Json<VmInfo>, ApiError> {
    let n = name(p)?;
    let t: BalloonTarget = body::json(&headers, b, s.max_body, s.body_timeout).await?;
    match s
        .call(Request::SetBalloon {
            vm: n,
            target_mib: t.target_mib,
        })
        .await?
    {
        Response::Vm(v) => Ok(Json(*v)),
        other => Err(unexpected(&other)),
    }
}
