//! The frame of the OpenAPI description (info, servers, shared responses).
//! The route table ([`crate::router::api_routes`]) adds the paths from the
//! handlers' annotations (utoipa), and [`crate::spec`] takes the whole spec
//! from it, so a route cannot be served and left undocumented or the other
//! way round.

use utoipa::OpenApi;

use crate::responses::{
    BadRequest, Conflict, Internal, NoBackend, NotFound, SlowBody, TooLarge, Unavailable,
};

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
