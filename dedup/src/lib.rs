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
//! Modules nothing outside the engine uses are private (`fault`, `index`,
//! `pool`, `slots`, `uffd`, `stats`, `policy`, `thread_init`); what of
//! them the VMM needs is re-exported below. The rest stay public for the
//! VMM, the benchmarks and the integration tests.

pub mod assist;
pub mod backend;
mod policy;
pub mod settings;

pub mod engine;
mod fault;
pub mod hash;
mod index;
pub mod merge;
pub mod mm;
pub mod pagemap;
mod pool;
pub mod quiesce;
pub mod region;
pub mod scanner;
mod slots;
mod stats;
mod thread_init;
mod uffd;
pub mod writelog;

pub use assist::{AssistConfig, AssistMode};
pub use backend::{DedupBackend, Error, RegionId, RegionSpec, Stats};
pub use engine::{Engine, EngineConfig, EngineError, DEFAULT_KNOBS};
pub use policy::{RoundPlan, RoundPolicy};
pub use scanner::DEFAULT_QUIESCE_MIN_OPS;
pub use settings::{
    BackendKind, CheckedSettings, DedupSettings, Knobs, MemorySignal, Mode, SettingsError,
};
pub use thread_init::{DedupThread, ThreadInit};
pub use writelog::{WriteLog, WriteLogError};
pub mod auto;
pub mod ksm;

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
