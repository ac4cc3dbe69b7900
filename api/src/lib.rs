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
//! CLI's `KEY=VALUE` form of a dedup update); [`view`], [`dedup_view`] (the
//! answers' bodies as types); [`schema`], [`responses`], [`openapi`] (the
//! generated OpenAPI spec); [`metrics`] (Prometheus text, built with
//! prometheus-client); [`error`] (errors as HTTP answers); [`client`] (an
//! HTTP/1.1 client over the Unix socket, with typed calls).

pub mod balloon;
pub mod body;
pub mod client;
pub mod dedup;
pub mod dedup_view;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod responses;
pub mod router;
pub mod schema;
pub mod server;
pub mod socket;
pub mod spec;
pub mod state;
pub mod system;
pub mod view;
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
pub use dedup_view::DedupView;
pub use error::ApiError;
pub use listen::{default_socket_path, ListenConfig};
pub use server::{Limits, Server, ServerError};

/// The prefix of every route.
pub const PREFIX: &str = "/api/v1";
