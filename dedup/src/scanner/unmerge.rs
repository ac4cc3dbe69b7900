//! Unmerging: giving merged pages private copies again.

use super::*;

impl Core {
    /// Gives every page of region `ri` that lies in a pool VMA (merged, or
    /// merged and copied-on-write since) a private anonymous mapping again;
    /// returns the pages left in pool VMAs. Slots nothing maps any more are
    /// added to `freed`, for the caller to release (`release_unmapped`):
    /// they stay in the stable index until then, which is safe because
    /// nothing merges while the core is held here.
    pub(super) fn unmerge_region(&mut self, ri: usize, freed: &mut Vec<u32>) -> u64 {
        let npages = self.regions[ri].npages;
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
                        if self.pool.remove_mapper(slot) == 0 {
                            freed.push(slot);
                        }
                    }
                }
                Ok(false) => left += (i - s) as u64,
                Err(e) => {
                    log::warn!("pagefold: unmerge: {e}");
                    left += (i - s) as u64;
                }
            }
        }
        left
    }

    /// Unmerges every region (mode `unmerge`); returns pages left merged.
    pub fn unmerge_all(&mut self) -> u64 {
        // KSM first: no engine protection may meet a KSM merge.
        self.end_assist();
        let mut left = 0;
        let mut freed = Vec::new();
        for ri in 0..self.regions.len() {
            left += self.unmerge_region(ri, &mut freed);
        }
        self.release_unmapped(&freed);
        self.unstable.reset(0);
        left
    }
}
