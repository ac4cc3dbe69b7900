//! Errors of the kernel-KSM backend.

use std::path::PathBuf;

use super::journal::JournalError;
use crate::auto::AutoError;
use crate::backend::Error;

/// Errors of the kernel-KSM backend.
#[derive(Debug, thiserror::Error)]
pub enum KsmError {
    /// The kernel has no KSM (CONFIG_KSM off) or sysfs is not mounted.
    #[error("kernel KSM is not available: {path} is missing (kernel built without CONFIG_KSM, or sysfs not mounted)")]
    Absent {
        /// The KSM sysfs directory looked for.
        path: PathBuf,
    },
    /// Reading or writing a KSM sysfs file failed.
    #[error("{op} {path}: {source}")]
    Sysfs {
        /// What was being done (`reading`, `writing`).
        op: &'static str,
        /// The sysfs file.
        path: PathBuf,
        /// Why it failed.
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
        /// KSM pages in use on the host, by any process.
        pages_shared: u64,
        /// The knob's current value.
        current: u64,
        /// The value asked for.
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
    Parse {
        /// The file or field.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// `madvise(MADV_MERGEABLE/UNMERGEABLE)` failed.
    #[error("madvise({advice}) on {addr:#x}+{len:#x}: {source}")]
    Madvise {
        /// The advice (`MADV_MERGEABLE`, `MADV_UNMERGEABLE`).
        advice: &'static str,
        /// Start of the range.
        addr: usize,
        /// Length of the range, bytes.
        len: usize,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The lock file serialising KSM users could not be taken.
    #[error("locking {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The auto-mode controller failed.
    #[error("auto mode: {0}")]
    Auto(#[from] AutoError),
    /// The auto-mode thread could not be started.
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
