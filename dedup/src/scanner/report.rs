//! The engine's statistics, as the core's books have them.

use std::collections::BTreeMap;

use super::{Core, VMA_COST};
use crate::backend::{OwnerStats, Stats};
use crate::PAGE_SIZE;

impl Core {
    /// The statistics that depend on the core (not the mode, knobs or CPU
    /// clocks, which the engine adds): their meaning is in `crate::stats`.
    pub fn stats(&self) -> Stats {
        let pool = &self.pool;
        let pages_sharing = pool.mappers - pool.live;
        let mut zero = 0;
        let mut unshared = 0;
        let mut volatile = 0;
        let mut vmas = 0;
        let mut per_owner: BTreeMap<String, OwnerStats> = BTreeMap::new();
        let mut returned = 0;
        for r in &self.regions {
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
            *o.cow_breaks.get_or_insert(0) += r.cow_breaks;
            let back = r.returned();
            returned += back;
            o.pages_reported += r.reported;
            *o.pages_returned.get_or_insert(0) += back;
            o.bytes_saved +=
                ((r.saved_pages + r.ksm_saved + r.zero as f64) * PAGE_SIZE as f64) as u64;
        }
        // KSM's share of our regions (assist): counted from PFNs, its metadata
        // (one rmap item per page it scans) charged against the profit.
        let ksm = self.census.figures();
        let pages_sharing = pages_sharing + ksm.sharing;
        let ksm_meta = if self.assist.group().is_some() || ksm.sharing > 0 {
            crate::ksm::self_ksm_stat()
                .and_then(|s| s.rmap_items)
                .unwrap_or(0)
                * crate::assist::RMAP_ITEM_BYTES
        } else {
            0
        };
        let waits = self.prot.lock().unwrap_or_else(|e| e.into_inner()).waits;
        let bytes_saved = (pages_sharing + zero) * PAGE_SIZE as u64;
        let metadata = self.metadata_bytes() + ksm_meta;
        Stats {
            backend: "pagefold".into(),
            pages_shared: pool.shared + ksm.shared,
            pages_sharing,
            pages_unshared: unshared,
            pages_volatile: volatile,
            zero_pages: zero,
            full_scans: self.counters.full_scans,
            merges: self.merges_done(),
            cow_breaks: self.counters.origins.cow_breaks.total(),
            pool_pages: pool.slots_in_use(),
            vmas_created: vmas,
            map_count_headroom: self.vmas.headroom(),
            map_count_limited: self.vmas.limited(),
            bytes_saved,
            metadata_bytes: metadata,
            profit_bytes: bytes_saved as i64 - metadata as i64 - (vmas * VMA_COST) as i64,
            ksm_assist: self
                .assist
                .status(self.assist.group().and_then(|g| self.group_name(g))),
            ksm_pages_sharing: ksm.sharing,
            ksm_cpu_seconds: self.assist.cpu_seconds(),
            write_logged_regions: self.regions.iter().filter(|r| r.written.is_some()).count()
                as u64,
            clean_visits: self.counters.clean_visits,
            huge_pages_split: self.counters.huge_pages_split,
            origins: self.counters.origins,
            merge_cpu_seconds: self.counters.merge_cpu_s,
            settle_ms: self.settle.time().as_millis() as u64,
            hint_merges: self.hint_tally.merges(),
            hint_merge_delay_ms: self.hint_tally.mean_delay_ms(),
            pages_reported: self.counters.reported,
            pages_returned: Some(returned),
            write_waits: Some(waits.count),
            write_wait_us: Some(waits.total_us),
            max_write_wait_us: Some(waits.max_us),
            per_owner,
            ..Stats::default()
        }
    }
}
