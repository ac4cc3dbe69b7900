//! Kernel-KSM backend (madvise + sysfs): in-kernel KSM behind the same
//! [`crate::DedupBackend`] interface as pagefold's engine, for side-by-side
//! runs and as a fallback.

mod backend;
mod driver;
mod error;
pub mod journal;
mod lock;
mod procstat;
mod shared;
mod sysfs;

pub use backend::{KsmBackend, KsmOptions};
pub use driver::MIN_ROUND;
pub use error::KsmError;
pub use lock::{ksm_exclusive, ksm_exclusive_at, try_ksm_flock, KsmExclusive, KSM_LOCK_PATH};
pub use procstat::{
    clock_ticks, count_ksm_pages, cow_ksm, cpu_seconds, find_by_comm, parse_ksm_stat,
    parse_stat_ticks, self_ksm_stat, self_minor_faults, ProcessKsmStat,
};
pub use sysfs::{snapshot_tunables, KsmSysfs, KSM_SYSFS, TUNABLES};
