//! Errors of the benchmark harness.

use pagefold_dedup::ksm::KsmError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("mmap of {len} bytes: {source}")]
    Mmap {
        len: usize,
        #[source]
        source: pagefold_dedup::mm::MmError,
    },
    #[error("{system}: {source}")]
    Backend {
        system: String,
        #[source]
        source: pagefold_dedup::Error,
    },
    #[error("kernel KSM: {0}")]
    Ksm(#[from] KsmError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("serializing results: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no systems to run")]
    NoSystems,
    #[error("unknown system {name:?} (known: {known})")]
    UnknownSystem { name: String, known: String },
    #[error("auto controller: {0}")]
    Auto(#[from] pagefold_dedup::auto::AutoError),
    #[error("workload VMs: {0}")]
    Vm(String),
    #[error("Linux VMs: {0}")]
    LinuxVm(String),
    /// The host cannot run what was asked (e.g. Linux guests on PVM).
    #[error("{0}")]
    HostUnsupported(String),
    /// Options that name missing files or invalid VM settings.
    #[error("{0}")]
    InvalidInput(String),
    #[error("chart: {0}")]
    Chart(#[from] crate::chart::ChartError),
}

impl BenchError {
    /// A closure that files a backend's error under the system that ran
    /// it (for `map_err`).
    pub(crate) fn backend(
        system: &str,
    ) -> impl Fn(pagefold_dedup::Error) -> BenchError + Copy + '_ {
        move |source| BenchError::Backend {
            system: system.to_string(),
            source,
        }
    }
}

/// A workload VM's error, as text (`map_err`).
pub(crate) fn vm_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Vm(e.to_string())
}

/// A Linux VM's error, as text (`map_err`).
pub(crate) fn linux_vm_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::LinuxVm(e.to_string())
}

/// Bad input (options, image files), as text (`map_err`).
pub(crate) fn input_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::InvalidInput(e.to_string())
}
