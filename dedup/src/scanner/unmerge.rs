//! Unmerging: giving merged pages private copies again.
use super::*;

/// An unmerge step this long is logged (the core is held through it).
const SLOW_UNMERGE_STEP: Duration = Duration::from_millis(200);

impl Core {
    /// Gives every page of region `ri` that lies in a pool VMA (merged, or
    /// merged and copied-on-write since) a private anonymous mapping again;
    /// returns the pages left in pool VMAs. Slots nothing maps any more are
    /// added to `freed`, for the caller to release (`release_unmapped`):
    /// they stay in the stable index until then, which is safe because
    /// nothing merges while the core is held here.
    ///
    /// With `yielding`, stops after a chunk when another thread waits for
    /// the core ([`Core::waiters`]) and returns None.
    pub(super) fn unmerge_region(
        &mut self,
        ri: usize,
        freed: &mut Vec<u32>,
        yielding: bool,
    ) -> Option<u64> {
        let npages = self.regions[ri].npages;
        // The vCPUs stay parked over chunks, up to the pause budget (a
        // scattered region's chunks are a page or two each, a park costs a
        // kick and a wait): every chunk flushes the TLB, which costs most
        // while vCPUs run (scripts/unmerge_under_load.py measures both
        // ways). Parked at the first chunk: a region with nothing in the
        // pool parks nothing.
        let mut park: Option<BoundedPark> = None;
        let mut left = 0;
        let mut i = 0;
        while i < npages {
            if !self.regions[ri].in_pool(i) {
                i += if i % 64 == 0 && self.regions[ri].in_pool[i / 64] == 0 {
                    64
                } else {
                    1
                };
                continue;
            }
            let s = i;
            while i < npages && i - s < merge::UNMERGE_CHUNK_PAGES && self.regions[ri].in_pool(i) {
                i += 1;
            }
            let addr = self.regions[ri].page_addr(s);
            let r = &self.regions[ri];
            let slots: Vec<Option<*const u8>> = (s..i)
                .map(|p| {
                    (region::kind(r.state[p]) == MERGED)
                        .then(|| self.pool.page_ptr(r.word[p]) as *const u8)
                })
                .collect();
            match park.as_mut() {
                Some(p) => p.checkpoint(),
                None => park = Some(self.park_guests(SPAN_PAGES)),
            }
            let ok = {
                let ctx = self.ctx();
                merge::unmerge_chunk(&ctx, addr, i - s, &slots)
            };
            match ok {
                Ok(true) => {
                    for p in s..i {
                        let r = &mut self.regions[ri];
                        r.set_in_pool(p, false);
                        if region::kind(r.state[p]) != MERGED {
                            continue;
                        }
                        let slot = r.word[p];
                        r.set_kind(p, NEW);
                        if drop_mapper(&mut self.pool, &mut self.stable, slot) == 0 {
                            freed.push(slot);
                        }
                    }
                }
                Ok(false) => left += (i - s) as u64,
                Err(e) => {
                    log::warn!("unmerge: {e}");
                    left += (i - s) as u64;
                }
            }
            // After a chunk, so that each call makes progress.
            if yielding && i < npages && self.should_stop() {
                return None;
            }
        }
        Some(left)
    }

    /// Unmerges every region (mode `unmerge`); returns the pages left
    /// merged, or None when it stopped early for a thread waiting for the
    /// core (VM creation or deletion; the caller lets it in and calls
    /// again, which goes on where the pages still in the pool are).
    pub fn unmerge_all(&mut self) -> Option<u64> {
        let t0 = Instant::now();
        // KSM first: no engine protection may meet a KSM merge.
        let ksm_done = self.end_assist();
        let t1 = Instant::now();
        let mut left = None;
        let mut freed = Vec::new();
        if ksm_done {
            left = Some(0);
            for ri in 0..self.regions.len() {
                match self.unmerge_region(ri, &mut freed, true) {
                    Some(n) => left = left.map(|l| l + n),
                    None => {
                        left = None;
                        break;
                    }
                }
            }
        }
        let t2 = Instant::now();
        self.release_unmapped(&freed);
        self.unstable.reset(0);
        // No pass follows in mode `off`: the per-owner savings are brought
        // up to date here.
        self.recount_savings();
        if t0.elapsed() >= SLOW_UNMERGE_STEP {
            // VM creation and deletion wait meanwhile.
            log::info!(
                "an unmerge step held the engine for {:?} (KSM take-backs and assist end {:?}; unmerging {:?}; freeing slots {:?}; {left:?} pages left)",
                t0.elapsed(),
                t1 - t0,
                t2 - t1,
                t2.elapsed()
            );
        }
        left
    }
}
