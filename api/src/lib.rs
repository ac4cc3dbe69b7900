//! HTTP API (see issue: API).
