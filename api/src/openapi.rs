//! The OpenAPI description of the API, generated from the handlers' and
//! bodies' annotations (utoipa) by the same route table that builds the
//! router ([`crate::router::api_routes`]), so a route cannot be served and
//! left undocumented or the other way round. `api/openapi.json` is this
//! spec, committed for tools that want a file (scripts/api-fuzz.sh,
//! clients); a test fails when the two differ.

use utoipa::OpenApi;

use crate::responses::{
    BadRequest, Conflict, Internal, NoBackend, NotFound, SlowBody, TooLarge, Unavailable,
};

/// How to bring `api/openapi.json` up to date.
pub const REGENERATE: &str =
    "cargo run -p pagefold-api --example openapi > api/openapi.json (or UPDATE_OPENAPI=1 cargo test -p pagefold-api openapi)";

/// What the derived paths do not say: the API as a whole.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "pagefold API",
        version = "1",
        description = "Control and observe a pagefold process: its VMs and its guest-memory
dedup engine. Served on a Unix socket (default
`$XDG_RUNTIME_DIR/pagefold/api.sock`, else `/run/pagefold/api.sock` for
root), optionally on loopback TCP. No authentication: access is the
socket file's mode (0600). Every error is a JSON object `{\"error\": \"...\"}`.
The metrics are also served outside this prefix at `/metrics`
(Prometheus' default scrape path). See docs/api.md.

Generated from the server's code (api/src/openapi.rs); do not edit
api/openapi.json by hand.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "/api/v1")),
    components(responses(
        BadRequest, NotFound, NoBackend, SlowBody, Conflict, TooLarge, Internal, Unavailable
    )),
)]
struct ApiDoc;

/// The spec's frame (info, servers, shared responses); the router adds
/// the paths and their schemas.
pub fn base() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The whole spec.
pub fn spec() -> utoipa::openapi::OpenApi {
    crate::router::api_routes().split_for_parts().1
}

/// The spec could not be written out.
#[derive(Debug, thiserror::Error)]
#[error("writing the OpenAPI spec as JSON: {0}")]
pub struct SpecError(#[from] serde_json::Error);

/// The spec as committed in `api/openapi.json`: pretty JSON, ending in a
/// newline. JSON rather than YAML: YAML 1.1 readers (PyYAML, so
/// schemathesis) take the unquoted mode names `off` and `on` for booleans.
pub fn json() -> Result<String, SpecError> {
    Ok(spec().to_pretty_json()? + "\n")
}
