//! The whole OpenAPI spec, taken from the route table that also builds the
//! router. `api/openapi.json` is this spec, committed for tools that want a
//! file (scripts/api-fuzz.sh, clients); a test fails when the two differ.

/// How to bring `api/openapi.json` up to date.
pub const REGENERATE: &str =
    "cargo run -p pagefold-api --example openapi > api/openapi.json (or UPDATE_OPENAPI=1 cargo test -p pagefold-api openapi)";

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
