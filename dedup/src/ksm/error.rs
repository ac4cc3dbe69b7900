//! Errors of the kernel-KSM backend.

use std::path::PathBuf;

use super::journal::JournalError;
use crate::auto::AutoError;
use crate::backend::Error;

#[derive(Debug, thiserror::Error)]
pub enum KsmError {
    /// The kernel has no KSM (CONFIG_KSM off) or sysfs is not mounted.
    #[error("kernel KSM is not available: {path} is missing (kernel built without CONFIG_KSM, or sysfs not mounted)")]
    Absent { path: PathBuf },
    /// Reading or writing a KSM sysfs file failed.
    #[error("{op} {path}: {source}")]
    Sysfs {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kernel refuses to change `max_page_sharing` while KSM pages exist.
    #[error(
        "max_page_sharing can only be changed while no KSM pages exist \
         (pages_shared = {pages_shared}, possibly other processes'); \
         set mode unmerge first, then change it (current {current}, requested {requested})"
    )]
    MaxPageSharingBusy {
        pages_shared: u64,
        current: u64,
        requested: u64,
    },
    /// The kernel's scan-time advisor owns `pages_to_scan` (writes get EINVAL).
    #[error(
        "cannot set KSM pages_to_scan while the kernel's advisor is active \
         (advisor_mode = {0:?}); write none to /sys/kernel/mm/ksm/advisor_mode first"
    )]
    AdvisorActive(String),
    /// The backend was shut down; it no longer drives KSM.
    #[error("the KSM backend is shut down")]
    ShutDown,
    /// A `/proc` or sysfs file had unexpected content.
    #[error("parsing {what}: {detail}")]
    Parse { what: String, detail: String },
    /// `madvise(MADV_MERGEABLE/UNMERGEABLE)` failed.
    #[error("madvise({advice}) on {addr:#x}+{len:#x}: {source}")]
    Madvise {
        advice: &'static str,
        addr: usize,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    /// The lock file serialising KSM users could not be taken.
    #[error("locking {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("auto mode: {0}")]
    Auto(#[from] AutoError),
    #[error("starting the KSM auto-mode thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The global-state journal (see [`super::journal`]) failed.
    #[error("global-state journal: {0}")]
    Journal(#[source] JournalError),
}

impl From<JournalError> for KsmError {
    /// A knob read or write that failed inside the journal is a sysfs
    /// failure like any other; only the journal's own failures are new.
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Knob { op, path, source } => KsmError::Sysfs { op, path, source },
            other => KsmError::Journal(other),
        }
    }
}

impl From<KsmError> for Error {
    /// OS failures keep their `io::Error` (with what was being done as
    /// context); everything else becomes a readable `Unsupported`.
    fn from(e: KsmError) -> Self {
        match e {
            KsmError::Sysfs { op, path, source } => Error::Os {
                context: format!("{op} {}", path.display()),
                source,
            },
            KsmError::Madvise {
                advice,
                addr,
                len,
                source,
            } => Error::Os {
                context: format!("madvise({advice}) on {addr:#x}+{len:#x}"),
                source,
            },
            KsmError::Lock { path, source } => Error::Os {
                context: format!("locking {}", path.display()),
                source,
            },
            KsmError::Thread(source) => Error::Os {
                context: "starting the KSM auto-mode thread".into(),
                source,
            },
            other => Error::Unsupported(other.to_string()),
        }
    }
}
