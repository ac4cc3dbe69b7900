//! pagefold's dedup engine: a userspace samepage-merging engine for any
//! registered host memory region. It knows nothing of KVM: the VMM registers
//! regions, the engine sees memory.
//!
//! Module map: `pagemap`, `uffd`, `mm` (syscall wrappers); `hash`; `pool`
//! (memfd, slot metadata); `slots` (where a merge's slot lies); `index`
//! (stable/unstable indices); `region` (per-page state); `scanner` (core
//! state, planning); `merge` (the race-free merge/unmerge path); `fault`
//! (uffd handler thread); `stats`;
//! `engine` ([`Engine`], the [`DedupBackend`] implementation); `settings`
//! (the typed settings every input parses into, checked once);
//! `thread_init` (the backends' thread start hook).
//!
//! The public surface is chosen: every engine module is private and what
//! the VMM, the API and the benchmarks use is re-exported below. Four
//! modules stay public as namespaces of their own: [`ksm`] (the kernel-KSM
//! backend and its sysfs journal), [`auto`] (the auto-mode controller),
//! [`mm`] and [`pagemap`] (the memory helpers the VMM and the benchmarks
//! share with the engine). `testing` (feature `testing`) holds the hooks
//! of the engine's own tests and benches.
#![deny(missing_docs)]

mod assist;
mod backend;
mod policy;
mod settings;

mod engine;
mod fault;
mod hash;
mod index;
mod merge;
pub mod mm;
pub mod pagemap;
mod pool;
mod quiesce;
mod region;
mod scanner;
mod slots;
mod stats;
mod thread_init;
mod uffd;
mod writelog;

pub use assist::{AssistConfig, AssistMode};
pub use backend::{
    ByOrigin, DedupBackend, Error, MergeOrigins, OwnerStats, RegionId, RegionSpec, Result,
    Security, Stats,
};
pub use engine::{Engine, EngineConfig, EngineError, DEFAULT_KNOBS};
pub use hash::xxh3;
pub use policy::{RoundPlan, RoundPolicy};
pub use quiesce::Quiesce;
pub use region::GuestPage;
pub use scanner::{DEFAULT_QUIESCE_MIN_OPS, LOG_INTERVAL};
#[cfg(feature = "clap")]
pub use settings::flag;
pub use settings::{
    BackendKind, CheckedSettings, DedupSettings, Knobs, MemorySignal, Mode, SettingsError,
    DEFAULT_MAX_GUEST_PAUSE_US,
};
pub use thread_init::{DedupThread, ThreadInit, SCANNER_NICE};
pub use writelog::{RecordedWrites, WriteLog, WriteLogError};
pub mod auto;
pub mod ksm;

/// Hooks for the engine's own tests and benches: a scanner core they drive
/// pass by pass, the write-log verifier's constants, the assist's pacing.
/// Never compiled into the `pagefold` binary.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::assist::{ksm_pace, KsmAssist, CONVERGE_BOOST};
    pub use crate::engine::DEFAULT_BOOST_MAX;
    pub use crate::hash::HashFn;
    pub use crate::scanner::{Core, Hint, SPAN_PAGES};
    pub use crate::writelog::{VERIFY_BLOCK, VERIFY_PASSES};
}

/// The page size the engine works with (x86_64 base pages).
pub const PAGE_SIZE: usize = 4096;

/// The mask of bits `0..n` (`n` <= 128): a merge window's pages
/// (`merge.rs`, up to `CHUNK_PAGES`), a bitmap word's pages (`writelog.rs`,
/// up to 64).
pub(crate) fn low_bits(n: usize) -> u128 {
    debug_assert!(n <= 128);
    if n == 0 {
        0
    } else {
        u128::MAX >> (128 - n)
    }
}
