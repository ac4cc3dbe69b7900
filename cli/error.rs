//! The CLI's error type: one variant per kind of failure, each mapped to an
//! exit code (0 ok, 1 guest failure, 2 bad input, 3 VM failure, 4 the host
//! cannot do what was asked).

use pagefold_vmm::{config, runner};

/// Errors the CLI reports; each maps to an exit code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(transparent)]
    Runner(#[from] runner::Error),
    #[error("{0}")]
    Dedup(String),
    #[error("{0}")]
    Io(String),
    /// The host lacks what the command needs (e.g. Linux guests on a PVM
    /// host): nothing was started. Only the benchmarks raise it so far.
    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    #[error("{0}")]
    HostUnsupported(String),
    #[error(transparent)]
    Seccomp(#[from] pagefold_vmm::seccomp::Error),
    /// Stdout is a pipe whose reader went away (`| head -1`): the command
    /// ends quietly with exit status 0.
    #[error("standard output closed")]
    StdoutClosed,
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::StdoutClosed => 0,
            Error::Usage(_) | Error::Config(_) => 2,
            Error::HostUnsupported(_) => 4,
            // A workload that does not fit its VM, or a kernel image the
            // loader cannot load, is bad input too.
            Error::Runner(runner::Error::Vm { source, .. }) if source.is_bad_input() => 2,
            _ => 3,
        }
    }
}
