//! What auto mode shows the API, and the handle through which the API reads
//! it (and changes the configuration) while the scanner thread owns the
//! controller.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use super::config::AutoConfig;
use super::error::AutoError;
use super::source::Psi;
use crate::settings::MemorySignal;

/// A snapshot of the controller, published after every `plan()`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoStatus {
    /// Merging is on (free memory went below the trigger line, or sustained
    /// PSI pressure), and stays on until free memory is above the stop line.
    pub auto_triggered: bool,
    /// Multiplier of `pages_to_scan` for the next triggered wake-up.
    pub scanning_factor: u64,
    /// How many times auto mode went from untriggered to triggered.
    pub triggered_times: u64,
    /// Configured threshold, percent of total RAM.
    pub threshold_pct: u64,
    /// Configured cap of the factor.
    pub max_scanning_factor: u64,
    /// Cap actually applied: also bounded by total RAM pages / pages_to_scan.
    pub effective_max_scanning_factor: u64,
    /// Merging starts when the memory signal drops below this.
    pub trigger_bytes: u64,
    /// Merging stops when the memory signal rises above this.
    pub stop_bytes: u64,
    /// Host RAM, bytes (`MemTotal`).
    pub total_bytes: u64,
    /// Free host memory, bytes (`MemFree`).
    pub free_bytes: u64,
    /// Available host memory, bytes (`MemAvailable`).
    pub available_bytes: u64,
    /// Which of free/available is compared against the two lines.
    pub memory_signal: MemorySignal,
    /// `None` when the kernel offers no PSI.
    pub psi: Option<Psi>,
    /// Sustained PSI pressure is currently counted as a reason to merge.
    pub psi_pressure: bool,
    /// Wake-ups planned so far.
    pub rounds: u64,
    /// Of those, wake-ups that were allowed to merge.
    pub triggered_rounds: u64,
    /// `pages_to_scan` knob seen in the last `plan()`.
    pub pages_to_scan: u64,
    /// What the last plan asked for.
    pub last_plan_pages: u64,
    /// Whether the last plan allowed merging.
    pub last_plan_merge: bool,
    /// Failed memory samples (the previous sample is then reused).
    pub sample_errors: u64,
    /// The last failed sample's error, if any.
    pub last_error: Option<String>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub status: AutoStatus,
    pub config: AutoConfig,
    /// Set by [`AutoHandle::set_config`], applied by the next `plan()`.
    pub pending: Option<AutoConfig>,
}

pub(super) fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Status is plain data: a panic elsewhere leaves it readable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Cheap to clone; `Send + Sync`. Reads the latest published status.
#[derive(Debug, Clone)]
pub struct AutoHandle {
    pub(super) shared: Arc<Mutex<Shared>>,
}

impl AutoHandle {
    /// The status as of the controller's last plan.
    pub fn status(&self) -> AutoStatus {
        lock(&self.shared).status.clone()
    }

    /// The configuration in force (or about to be, if a change is pending).
    pub fn config(&self) -> AutoConfig {
        let s = lock(&self.shared);
        s.pending.unwrap_or(s.config)
    }

    /// Validates `config` against the last sampled total RAM and the last
    /// seen `pages_to_scan`, then hands it to the controller, which applies
    /// it at its next `plan()`.
    pub fn set_config(&self, config: AutoConfig) -> Result<(), AutoError> {
        let mut s = lock(&self.shared);
        config.validate(s.status.total_bytes, s.status.pages_to_scan)?;
        s.pending = Some(config);
        Ok(())
    }
}
