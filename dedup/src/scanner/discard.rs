//! Giving pages back at their owner's request: a balloon's inflated
//! pages, the ranges free page reporting reports (`DedupBackend::discard`).
//!
//! The owner no longer needs the content, so the memory is freed and the
//! range reads zeros afterwards. Runs under the core, like every merge,
//! unmerge and registration, so no merge window is open, no page is
//! write-protected and no planned merge is in flight while it runs
//! (docs/merge-races.md §24).

use super::*;
use crate::PAGE_SIZE;

impl Core {
    /// Gives `addr..+len` (page aligned, inside one registered region)
    /// back: pages outside pool VMAs get `MADV_DONTNEED`, runs of pages in
    /// pool VMAs (merged, or merged once and written since) fresh anonymous
    /// memory with `MAP_FIXED`, where `MADV_DONTNEED` would show the pool
    /// page. A merged page's slot reference is dropped, without a copy: the
    /// slot is freed when no page maps it any more (for a hardened group,
    /// at the scanner's next wake-up: docs/security.md). Every page given
    /// back is NEW and "found absent" (not hashed until it is seen
    /// mapped), unmarked in its write log, and counted in
    /// `Region::reported`. Returns the pages given back; a run of pool
    /// pages the VMA budget or the kernel refuses keeps its mapping and
    /// its books (it is not counted).
    ///
    /// # Safety
    /// The range's owner no longer needs its content (it reads zeros
    /// afterwards).
    pub unsafe fn discard(&mut self, addr: usize, len: usize) -> Result<u64, ScanError> {
        region::check_bounds(addr, len)?;
        let end = addr + len;
        let ri = self
            .regions
            .iter()
            .position(|r| r.contains(addr) && end <= r.addr + r.len())
            .ok_or(ScanError::NotRegistered { addr, len })?;
        let (first, last) = self.regions[ri].pages_of(addr, len);
        if self.regions[ri].huge {
            self.split_partial_huge_pages(addr, end);
        }
        let mut freed = Vec::new();
        let mut done = 0;
        let mut i = first;
        // A MERGED page lies in a pool VMA even without its `in_pool` bit
        // (a merge a panic left uncommitted, docs/merge-races.md §14).
        let pool_vma = |r: &Region, p: usize| r.in_pool(p) || region::kind(r.state[p]) == MERGED;
        while i < last {
            let pool = pool_vma(&self.regions[ri], i);
            let s = i;
            while i < last && pool_vma(&self.regions[ri], i) == pool {
                i += 1;
            }
            let given = if pool {
                self.discard_pool_run(ri, s, i)
            } else {
                let (a, l) = (self.regions[ri].page_addr(s), (i - s) * PAGE_SIZE);
                // SAFETY: `a..+l` lies in a registered region, a private
                // anonymous mapping (the register contract), and holds no
                // page of a pool VMA (`in_pool` clear), so the drop makes it
                // read zeros, never a pool page; its owner gave the content
                // up (this function's contract).
                match unsafe { mm::madvise(a, l, libc::MADV_DONTNEED) } {
                    Ok(()) => true,
                    Err(e) => {
                        log::warn!("discard: {e}");
                        false
                    }
                }
            };
            if given {
                for p in s..i {
                    self.forget_page(ri, p, &mut freed);
                }
                if let Some(w) = self.regions[ri].written.as_mut() {
                    w.clear_range(s, i);
                }
                done += (i - s) as u64;
            }
        }
        self.regions[ri].reported += done;
        self.counters.reported += done;
        if self.regions[ri].hardened() {
            // A slot freed now would make this call take a hole punch
            // longer exactly when the page was its slot's last mapper: the
            // guest would learn whether another page shared it.
            self.deferred_release.append(&mut freed);
        } else {
            self.release_slots(&freed);
        }
        Ok(done)
    }

    /// Frees the slots hardened groups' discards left for the scanner
    /// (see [`Core::discard`]); those joined again since stay.
    pub fn release_deferred(&mut self) {
        if !self.deferred_release.is_empty() {
            let freed = std::mem::take(&mut self.deferred_release);
            self.release_slots(&freed);
        }
    }

    /// Maps fresh anonymous memory over pages `s..e` of region `ri`, all in
    /// pool VMAs, and registers it with the userfaultfd again (a `MAP_FIXED`
    /// VMA is not registered, docs/merge-races.md §2 step 5); in a
    /// KSM-assisted region the new VMA is made mergeable, as the region is.
    /// False when the VMA budget or the kernel refused (nothing changed).
    fn discard_pool_run(&mut self, ri: usize, s: usize, e: usize) -> bool {
        // Inside a pool VMA the new mapping splits it: up to two more VMAs,
        // as a merge's run costs.
        let budget = self.vmas.budget_mut();
        if budget.headroom < 2 {
            budget.limited = true;
            return false;
        }
        let (a, l) = (self.regions[ri].page_addr(s), (e - s) * PAGE_SIZE);
        // SAFETY: `a..+l` lies in a registered region, a private mapping
        // (the register contract); its owner gave the content up (the
        // contract of `discard`), so zeros are what it expects to read.
        if let Err(err) = unsafe { mm::map_anon_fixed(a, l) } {
            // A refused MAP_FIXED leaves the old mapping in place
            // (docs/merge-races.md §13).
            if err.errno() == Some(libc::ENOMEM) {
                budget.limited = true;
                budget.headroom = 0;
            }
            log::warn!("discard: {err}");
            return false;
        }
        budget.headroom -= 2;
        if let Err(err) = self.uffd.register_wp(a, l) {
            // As after a merge: later protects there fail and abandon.
            log::warn!("re-register after discard: {err}");
        }
        if self.regions[ri].assisted {
            // SAFETY: MADV_MERGEABLE changes no content; the range is the
            // region's.
            if let Err(err) = unsafe { mm::madvise(a, l, libc::MADV_MERGEABLE) } {
                log::warn!("discard: {err}");
            }
        }
        true
    }

    /// The books of page `p` of region `ri` after it was given back: a
    /// merged page drops its slot reference (into `freed` when it was the
    /// last), every page is NEW and found absent (level 1: `log_clean`
    /// answers its visits until it is written; without a log it is looked
    /// at less often), out of the pool VMAs, and marked given back unless
    /// KSM has the region (the engine does not hash KSM's unmerged pages,
    /// so it would never see it mapped again).
    fn forget_page(&mut self, ri: usize, p: usize, freed: &mut Vec<u32>) {
        let r = &mut self.regions[ri];
        let merged = (region::kind(r.state[p]) == MERGED).then(|| r.word[p]);
        r.set_kind(p, NEW);
        r.state[p] = region::with_level(r.state[p] & !region::REHASH, 1);
        r.set_in_pool(p, false);
        let assisted = r.assisted;
        r.set_discarded(p, !assisted);
        if let Some(s) = merged {
            if drop_mapper(&mut self.pool, &mut self.stable, s) == 0 {
                freed.push(s);
            }
        }
    }

    /// Splits the transparent huge pages that `addr..end` covers only in
    /// part (its first and last 2 MiB frames), so that the small pages
    /// given back are freed at once rather than at the huge page's
    /// deferred split (docs/merge-races.md §23).
    fn split_partial_huge_pages(&mut self, addr: usize, end: usize) {
        let huge = mm::HUGE_PAGE_SIZE;
        let head = addr & !(huge - 1);
        let tail = (end - 1) & !(huge - 1);
        let mut at = Vec::with_capacity(2);
        if head != addr || end < head + huge {
            at.push(addr);
        }
        if tail != head && end != tail + huge {
            at.push(tail);
        }
        for a in at {
            match mm::split_huge_page_at(a) {
                Ok(()) => self.counters.huge_pages_split += 1,
                Err(e) => log::debug!("discard: {e}"),
            }
        }
    }
}
