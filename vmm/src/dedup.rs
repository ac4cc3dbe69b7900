//! Creates the process's dedup backend from the config.

use std::sync::Arc;

use pagefold_dedup::DedupBackend;

use crate::config::Config;

/// Errors creating a backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("dedup backend {backend}: {message}")]
    Backend { backend: String, message: String },
}

/// The backend for `cfg`, or none when no VM has dedup enabled.
pub fn create_backend(cfg: &Config) -> Result<Option<Arc<dyn DedupBackend>>, Error> {
    if !cfg.vms.iter().any(|v| v.dedup.enabled) || cfg.dedup.mode == pagefold_dedup::Mode::Off {
        return Ok(None);
    }
    Err(Error::Backend {
        backend: cfg.dedup.backend.clone(),
        message: "not wired in yet".into(),
    })
}
