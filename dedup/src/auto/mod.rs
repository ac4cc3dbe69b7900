//! Auto mode: merge only while host free memory is low.
//!
//! From the 2022 KSM auto-mode proposal (never merged upstream), semantics
//! kept, bugs fixed; see `docs/auto-mode.md`. [`AutoController`] implements
//! [`crate::policy::RoundPolicy`], so any scanner (pagefold's engine, or the
//! KSM backend's driver thread) runs it the same way; [`AutoHandle`] lets the
//! API read [`AutoStatus`] while the scanner thread owns the controller.

mod config;
mod controller;
mod error;
mod scripted;
mod source;
mod status;

pub use crate::settings::MemorySignal;
pub use config::{
    max_scanning_factor_limit, page_size, AutoConfig, PsiMetric, PsiTrigger,
    DEFAULT_MAX_SCANNING_FACTOR, DEFAULT_SAMPLE_INTERVAL_MS, DEFAULT_THRESHOLD_PCT,
};
pub use controller::{AutoController, UNTRIGGERED_PAGES_PER_WAKEUP};
pub use error::AutoError;
pub use scripted::{ScriptHandle, ScriptedSource};
pub use source::{parse_meminfo, parse_psi, MemSample, MemorySource, ProcMemSource, Psi};
pub use status::{AutoHandle, AutoStatus};
