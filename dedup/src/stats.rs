//! Statistics: built from the core's counters after every wake-up (so
//! `stats()` never waits for a scan in progress), plus the engine threads'
//! CPU clocks read live.
//!
//! Semantics (KSM's where KSM has the figure):
//! * `pages_shared`: pool pages mapped by at least two guest pages;
//! * `pages_sharing`: sum over pool pages of (mappers - 1), the pages saved
//!   by the pool; a pool page with one mapper saves nothing and counts 0;
//! * `zero_pages`: pages the engine dropped to the zero page (like KSM's
//!   `ksm_zero_pages`, not part of `pages_sharing`);
//! * `pages_unshared`: hashed pages, stable since their last visit, with no
//!   partner; `pages_volatile`: hashed pages whose hash changed;
//! * `bytes_saved` = (`pages_sharing` + `zero_pages`) x 4096;
//! * `vmas_created`: pool-mapping VMAs in the regions (runs of consecutive
//!   slots, recounted once per full scan);
//! * `profit_bytes` = saved - engine metadata - VMAs x 256 B of kernel memory.

use std::collections::BTreeMap;

use crate::backend::{OwnerStats, Stats};
use crate::scanner::{Core, VMA_COST};
use crate::PAGE_SIZE;

/// CPU clocks of the engine's threads.
#[derive(Debug, Default)]
pub struct Clocks {
    live: Vec<(std::thread::ThreadId, libc::clockid_t)>,
    exited: f64,
}

impl Clocks {
    /// Registers the calling thread.
    pub fn enter(&mut self) {
        if let Some(c) = crate::mm::current_thread_clock() {
            self.live.push((std::thread::current().id(), c));
        }
    }

    /// Unregisters the calling thread, keeping its CPU time.
    pub fn leave(&mut self) {
        let me = std::thread::current().id();
        if let Some(pos) = self.live.iter().position(|&(t, _)| t == me) {
            let (_, c) = self.live.swap_remove(pos);
            self.exited += crate::mm::clock_seconds(c);
        }
    }

    /// Total CPU seconds of the engine's threads, past and present.
    pub fn seconds(&self) -> f64 {
        self.exited
            + self
                .live
                .iter()
                .map(|&(_, c)| crate::mm::clock_seconds(c))
                .sum::<f64>()
    }
}

/// Builds the statistics that depend on the core (not mode/knobs/cpu).
pub fn build(core: &Core) -> Stats {
    let pool = &core.pool;
    let pages_sharing = pool.mappers - pool.live;
    let mut zero = 0;
    let mut unshared = 0;
    let mut volatile = 0;
    let mut vmas = 0;
    let mut per_owner: BTreeMap<String, OwnerStats> = BTreeMap::new();
    for r in &core.regions {
        zero += r.zero;
        unshared += r.hashed - r.volatile;
        volatile += r.volatile;
        vmas += r.vmas;
        let o = per_owner.entry(r.owner.clone()).or_default();
        if o.group.is_empty() {
            o.group = r.group_name.clone();
        }
        o.pages_tracked += r.npages as u64;
        o.pages_merged += r.merged + r.ksm_merged;
        o.zero_pages += r.zero;
        o.bytes_saved += ((r.saved_pages + r.ksm_saved + r.zero as f64) * PAGE_SIZE as f64) as u64;
    }
    // KSM's share of our regions (assist): counted from PFNs, its metadata
    // (one rmap item per page it scans) charged against the profit.
    let ksm = &core.census;
    let pages_sharing = pages_sharing + ksm.sharing;
    let ksm_meta = if core.assist.group().is_some() || ksm.sharing > 0 {
        crate::ksm::self_ksm_stat()
            .and_then(|s| s.rmap_items)
            .unwrap_or(0)
            * crate::assist::RMAP_ITEM_BYTES
    } else {
        0
    };
    let bytes_saved = (pages_sharing + zero) * PAGE_SIZE as u64;
    let metadata = core.metadata_bytes() + ksm_meta;
    Stats {
        backend: "pagefold".into(),
        pages_shared: pool.shared + ksm.shared,
        pages_sharing,
        pages_unshared: unshared,
        pages_volatile: volatile,
        zero_pages: zero,
        full_scans: core.counters.full_scans,
        merges: core.counters.merges + core.counters.zero_merges,
        cow_breaks: core.counters.cow_breaks,
        pool_pages: pool.slots_in_use(),
        vmas_created: vmas,
        map_count_headroom: core.map_headroom,
        map_count_limited: core.map_limited,
        bytes_saved,
        metadata_bytes: metadata,
        profit_bytes: bytes_saved as i64 - metadata as i64 - (vmas * VMA_COST) as i64,
        ksm_assist: core
            .assist
            .status(core.assist.group().and_then(|g| core.group_name(g))),
        ksm_pages_sharing: ksm.sharing,
        ksm_cpu_seconds: core.assist.cpu_seconds(),
        write_logged_regions: core.regions.iter().filter(|r| r.written.is_some()).count() as u64,
        clean_visits: core.counters.clean_visits,
        huge_pages_split: core.counters.huge_pages_split,
        hint_merges: core.hint_merges,
        hint_merge_delay_ms: if core.hint_merges > 0 {
            core.hint_delay_sum * 1e3 / core.hint_merges as f64
        } else {
            0.0
        },
        per_owner,
        ..Stats::default()
    }
}
