//! Errors of the auto-mode controller.

use std::path::PathBuf;

/// Everything that can go wrong configuring auto mode or sampling memory.
#[derive(Debug, thiserror::Error)]
pub enum AutoError {
    /// A setting out of range (`auto_threshold` is a percentage of RAM).
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    /// `max_scanning_factor` must keep one wake-up within total RAM.
    #[error(
        "max_scanning_factor must be in 1..={max} (total RAM pages {total_pages} / \
         pages_to_scan {pages_to_scan}), got {value}"
    )]
    MaxScanningFactor {
        /// The factor asked for.
        value: u64,
        /// The largest factor allowed.
        max: u64,
        /// Total RAM, in pages.
        total_pages: u64,
        /// The `pages_to_scan` knob the factor multiplies.
        pages_to_scan: u64,
    },
    /// A PSI trigger threshold outside 0..=100 %, or release above trigger.
    #[error("invalid PSI trigger: {0}")]
    PsiTrigger(String),
    /// A PSI metric name that is not `some_avg10|some_avg60|full_avg10|full_avg60`.
    #[error(
        "unknown PSI metric {0:?} (expected some_avg10, some_avg60, full_avg10 or full_avg60)"
    )]
    UnknownPsiMetric(String),
    /// Reading a `/proc` file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why the read failed.
        #[source]
        source: std::io::Error,
    },
    /// A `/proc` file lacked a field or had an unparsable one.
    #[error("parsing {what}: {detail}")]
    Parse {
        /// The file or field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The memory source reported a total of zero bytes.
    #[error("memory source reported MemTotal = 0")]
    ZeroTotal,
}
