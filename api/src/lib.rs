//! pagefold's HTTP API: a small REST interface (JSON under `/api/v1`, plus
//! Prometheus metrics) to the VMM's control channel and dedup backend, served
//! on a Unix socket (and optionally loopback TCP) from its own thread, so
//! the VMM's event loop never waits on a client.
//!
//! Module map: [`listen`] (where to listen, loopback policy), [`socket`]
//! (Unix socket creation, stale-socket handling, clean-up); [`server`]
//! (runtime thread, connection limits and timeouts); [`router`] (routes,
//! fallbacks); [`state`] (what handlers share: the router imports the
//! handlers, the handlers import the state); [`vms`], [`dedup`], [`system`]
//! (handlers); [`body`] (size- and time-limited JSON bodies); [`patch`] (the
//! CLI's `KEY=VALUE` form of a dedup update); [`metrics`] (Prometheus text); [`error`] (errors as
//! HTTP answers); [`client`] (an HTTP/1.1 client over the Unix socket).

pub mod body;
pub mod client;
pub mod dedup;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod patch;
pub mod router;
pub mod server;
pub mod socket;
pub mod state;
pub mod system;
pub mod vms;

#[cfg(test)]
mod route_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod testutil;

pub use client::{Client, ClientError};
pub use error::ApiError;
pub use listen::{default_socket_path, ListenConfig};
pub use server::{Limits, Server, ServerError};

/// Every route, as (method, path under `/api/v1`): the OpenAPI spec test
/// checks `openapi.yaml` against this list, and the router is built from the
/// same handlers.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("PUT", "/shutdown"),
    ("GET", "/dedup"),
    ("PATCH", "/dedup"),
    ("GET", "/vms"),
    ("GET", "/vms/{name}"),
    ("PUT", "/vms/{name}"),
    ("PATCH", "/vms/{name}"),
    ("DELETE", "/vms/{name}"),
];

/// The prefix of every route.
pub const PREFIX: &str = "/api/v1";
