//! The error answers the OpenAPI spec names once and every operation refers
//! to: each is an [`ErrorBody`] with a status-specific meaning.

#![allow(dead_code)]

use utoipa::ToResponse;

use crate::view::ErrorBody;

/// Malformed or invalid input; the message names the field (and the valid
/// range).
#[derive(ToResponse)]
pub struct BadRequest(ErrorBody);

/// No VM of that name.
#[derive(ToResponse)]
pub struct NotFound(ErrorBody);

/// Deduplication is off in this process (no backend).
#[derive(ToResponse)]
pub struct NoBackend(ErrorBody);

/// The request body did not arrive in time (10 s).
#[derive(ToResponse)]
pub struct SlowBody(ErrorBody);

/// Conflicts with the current state (VM exists, VM stopping or finished,
/// mode unsupported by the backend, not enough host memory).
#[derive(ToResponse)]
pub struct Conflict(ErrorBody);

/// Body larger than 64 KiB.
#[derive(ToResponse)]
pub struct TooLarge(ErrorBody);

/// The VMM or the backend failed (e.g. a KVM error creating the VM).
#[derive(ToResponse)]
pub struct Internal(ErrorBody);

/// The VMM is shutting down.
#[derive(ToResponse)]
pub struct Unavailable(ErrorBody);
