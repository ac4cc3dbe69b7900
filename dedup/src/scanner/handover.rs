//! Judging each group's merges for the KSM assist, and handing regions to
//! kernel KSM and back.

use super::*;

/// A take-back from KSM this long is logged (the core is held through it).
const SLOW_TAKE_BACK: Duration = Duration::from_millis(200);

/// Bytes a take-back from KSM gives back per `MADV_UNMERGEABLE`: the core
/// is held through each, and one call over a whole region would hold it
/// for hundreds of milliseconds while VM creation and deletion wait; the
/// guests are parked through each, and the pause budget can end a park
/// only between two.
const TAKE_BACK_CHUNK: usize = 1 << 20;

/// How a take-back from KSM ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TakeBack {
    /// The region is the engine's again.
    Done,
    /// `MADV_UNMERGEABLE` failed: the region stays KSM's.
    Failed,
    /// Stopped between two chunks for a thread waiting for the core.
    Yielded,
}

impl Core {
    /// Makes region `ri` KSM's: `MADV_MERGEABLE`, after which the engine only
    /// watches its own earlier merges there. Called between spans, when the
    /// engine holds no page of it write-protected (assist.rs).
    pub(super) fn hand_to_ksm(&mut self, ri: usize) {
        let r = &mut self.regions[ri];
        // SAFETY: a registered region is a page-aligned private anonymous
        // mapping of this process (register contract); MADV_MERGEABLE
        // changes no content.
        match unsafe { crate::mm::madvise(r.addr, r.len(), libc::MADV_MERGEABLE) } {
            Ok(()) => {
                r.assisted = true;
                self.assist.new_work();
            }
            Err(e) => log::warn!("KSM assist: {e}"),
        }
    }

    /// Takes region `ri` back from KSM: `MADV_UNMERGEABLE` gives every KSM
    /// page of it a private copy and, holding the mmap lock, waits out any
    /// merge ksmd has in flight there, so the engine may protect its pages
    /// again afterwards. Returns false (region stays KSM's) on failure.
    pub(super) fn take_from_ksm(&mut self, ri: usize) -> bool {
        self.take_back(ri, false) == TakeBack::Done
    }

    /// [`Core::take_from_ksm`] in steps of `TAKE_BACK_CHUNK` bytes; with
    /// `yielding`, stops between two when another thread waits for the core
    /// ([`Core::waiters`]), and the next call goes on from there. The region
    /// stays KSM's (`assisted`) until its last byte is back, so the engine
    /// never protects a page of it meanwhile; `resume_handed_over` makes the
    /// part given back mergeable again if the engine goes back to merging
    /// before the take-back ends.
    pub(super) fn take_back(&mut self, ri: usize, yielding: bool) -> TakeBack {
        if !self.regions[ri].assisted {
            return TakeBack::Done;
        }
        let t = Instant::now();
        let (from, len) = (self.regions[ri].taken_back, self.regions[ri].len());
        // Each KSM page given back is a copy-on-write fault and a TLB
        // flush: parked through, up to the pause budget at once.
        let mut park = self.park_guests((len - from) / crate::PAGE_SIZE);
        while self.regions[ri].taken_back < len {
            park.checkpoint();
            let r = &self.regions[ri];
            let (addr, n) = (
                r.addr + r.taken_back,
                (len - r.taken_back).min(TAKE_BACK_CHUNK),
            );
            // SAFETY: `addr..+n` is a page-aligned part of a registered
            // region (register contract; `TAKE_BACK_CHUNK` and the region's
            // length are whole pages); MADV_UNMERGEABLE gives each KSM page
            // a private copy of the same bytes.
            let res = unsafe { crate::mm::madvise(addr, n, libc::MADV_UNMERGEABLE) };
            let r = &mut self.regions[ri];
            if let Err(e) = res {
                log::warn!("KSM assist: giving region back: {e}");
                return TakeBack::Failed;
            }
            r.taken_back += n;
            if yielding && r.taken_back < len && self.should_stop() {
                return TakeBack::Yielded;
            }
        }
        let r = &mut self.regions[ri];
        if t.elapsed() >= SLOW_TAKE_BACK {
            // The core is held meanwhile: VM creation and deletion wait.
            log::info!(
                "KSM assist: giving {} MiB back from KSM took {:?}",
                (len - from) >> 20,
                t.elapsed()
            );
        }
        r.assisted = false;
        r.taken_back = 0;
        r.ksm_merged = 0;
        r.ksm_saved = 0.0;
        // Unmerged pages keep stale hashes and levels: revisit them.
        for i in 0..r.npages {
            if region::kind(r.state[i]) == HASHED {
                r.set_kind(i, NEW);
                r.state[i] = region::with_level(r.state[i], 0);
            }
        }
        TakeBack::Done
    }

    /// A take-back that stopped half-way (mode `unmerge` left before it
    /// ended, or it failed) left part of a KSM region unmergeable: nobody
    /// would merge those pages, so they are KSM's again.
    pub(super) fn resume_handed_over(&mut self) {
        for r in self
            .regions
            .iter_mut()
            .filter(|r| r.assisted && r.taken_back > 0)
        {
            // SAFETY: the region's first `taken_back` bytes (whole chunks)
            // lie in the registered region (register contract);
            // MADV_MERGEABLE changes no content.
            match unsafe { crate::mm::madvise(r.addr, r.taken_back, libc::MADV_MERGEABLE) } {
                Ok(()) => r.taken_back = 0,
                Err(e) => log::warn!("KSM assist: {e}"),
            }
        }
    }

    /// Ends the assist once no region is KSM's any more.
    pub(super) fn release_assist_if_unused(&mut self) {
        if self.assist.group().is_some() && !self.regions.iter().any(|r| r.assisted) {
            self.assist.disengage();
            self.census.clear();
        }
    }

    /// Takes every region back from KSM and ends the assist (unmerge mode);
    /// false when it stopped for a waiter (see [`Core::take_back`]).
    pub fn end_assist(&mut self) -> bool {
        for ri in 0..self.regions.len() {
            if self.take_back(ri, true) == TakeBack::Yielded {
                return false;
            }
        }
        self.release_assist_if_unused();
        true
    }

    /// Counts merges planned this pass in `group`: pages and the new VMAs
    /// they start (those that do not extend the left neighbour's run).
    pub(super) fn note_planned(&mut self, group: u32, pages: u64, new_vmas: u64) {
        let g = self.pass_groups.entry(group).or_default();
        g.merged += pages;
        g.new_vmas += new_vmas;
    }

    /// Does `group` merge scattered pages (at least one new VMA per two
    /// pages merged, over at least 16 merges in this pass or the last)?
    pub(super) fn merges_scattered(&self, group: u32) -> bool {
        let scattered = |g: &GroupPass| g.merged >= 16 && g.new_vmas * 2 >= g.merged;
        self.pass_groups.get(&group).is_some_and(scattered)
            || self.last_pass_groups.get(&group).is_some_and(scattered)
    }

    /// The group's merges this pass are scattered (many new VMAs, few pages
    /// each), KSM could take them, and a sample of the pages ahead says the
    /// pass would outgrow what the engine may spend on them
    /// (`outgrows_budget`): the engine makes no more new VMAs. `at` is
    /// where the scan stands (`scan_at`).
    pub(super) fn scattered_now(&mut self, group: u32, at: (usize, usize)) -> bool {
        if !self.assist.can_try() {
            return false;
        }
        let cfg = self.assist.cfg;
        let g = self.pass_groups.get(&group).copied().unwrap_or_default();
        if g.new_vmas < cfg.flip_vmas {
            return false;
        }
        let pages: u64 = self
            .regions
            .iter()
            .filter(|r| r.group == group)
            .map(|r| r.npages as u64)
            .sum();
        if g.new_vmas < cfg.judge_at(pages, self.vmas.max_map_count()) {
            return false;
        }
        g.merged < cfg.flip_run_pages.saturating_mul(g.new_vmas)
            && self.outgrows_budget(group, &g, at)
    }

    /// Hands `group` to KSM if its merges this pass look scattered (many new
    /// VMAs for few pages) or the VMA budget refused merges with partners.
    pub(super) fn maybe_assist(&mut self, group: u32) {
        // Kernel KSM knows nothing of a hardened group's rules.
        let hardened = self
            .regions
            .iter()
            .any(|r| r.group == group && r.hardened());
        if hardened || !self.assist.can_try() {
            return;
        }
        let g = self.pass_groups.get(&group).copied().unwrap_or_default();
        let cfg = self.assist.cfg;
        let at = self.cursor.position();
        if !self.scattered_now(group, at) && g.deferred < cfg.flip_deferred {
            return;
        }
        if let Err(why) = self.assist.engage(group) {
            self.assist.failed(why);
            return;
        }
        log::info!(
            "handing group {group} to kernel KSM ({} new VMAs for {} merged pages, {} deferred this pass)",
            g.new_vmas,
            g.merged,
            g.deferred
        );
        for ri in 0..self.regions.len() {
            if self.regions[ri].group == group {
                self.hand_to_ksm(ri);
            }
        }
        self.release_assist_if_unused();
    }

    /// Installs the KSM assist's configuration, before any merge. The VMA
    /// budget depends on it (with KSM to take over, the engine keeps to half
    /// of the process's limit), so the budget is recomputed at once from
    /// `new`'s maps read (nothing has used it since): a budget left from
    /// before would hold until the next periodic read, and let the
    /// engine's first pass of a large scattered group fill the whole limit.
    pub(crate) fn set_assist(&mut self, cfg: AssistConfig) {
        self.assist = KsmAssist::new(cfg);
        self.vmas.set_reserve(self.assist.enabled());
    }

    /// Turns this pass's PFNs of assisted pages into the KSM figures, and
    /// each region's share of them.
    pub(super) fn count_census(&mut self) {
        let Some(c) = self.census.count() else {
            return;
        };
        for r in &mut self.regions {
            let (n, saved) = c
                .per_region
                .iter()
                .find(|x| x.0 == r.gid_base)
                .map(|x| (x.1, x.2))
                .unwrap_or((0, 0.0));
            r.ksm_merged = n;
            r.ksm_saved = saved;
        }
    }

    /// Judges each group visited for the KSM assist, once, after its
    /// planned merges ran (`maybe_assist` must not meet planned ops).
    pub(super) fn judge_groups(&mut self, mut groups: Vec<u32>) {
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            self.maybe_assist(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::PAGE_SIZE;

    /// KSM's flag (`mg` in /proc/self/smaps) for each page-sized step of
    /// `addr..addr + len`: true where the VMA holding it is mergeable.
    fn mergeable(addr: usize, len: usize) -> Vec<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut vmas: Vec<(usize, usize, bool)> = Vec::new();
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((s, e)) = head.split_once('-') {
                if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
                {
                    vmas.push((s, e, false));
                    continue;
                }
            }
            if let (Some(flags), Some(v)) = (line.strip_prefix("VmFlags:"), vmas.last_mut()) {
                v.2 = flags.split_whitespace().any(|f| f == "mg");
            }
        }
        (addr..addr + len)
            .step_by(PAGE_SIZE)
            .map(|a| vmas.iter().any(|&(s, e, mg)| mg && (s..e).contains(&a)))
            .collect()
    }

    #[test]
    fn a_take_back_stops_between_chunks_for_a_waiter_and_a_stopped_one_is_undone() {
        let len = 3 * TAKE_BACK_CHUNK;
        let ptr = crate::mm::map_anon(len).unwrap();
        let mem = ptr as usize;
        let mut core = Core::driven(1 << 26).unwrap();
        // SAFETY: `mem..+len` is the test's own private anonymous mapping,
        // unmapped only after the unregister below.
        unsafe { core.register(mem, len, "a".into(), "g".into()) }.unwrap();
        core.hand_to_ksm(0);
        assert!(core.regions[0].assisted);
        assert!(mergeable(mem, len).iter().all(|&m| m));

        // A waiter: one chunk goes back, then the core is let go.
        core.waiters.store(1, Ordering::Release);
        assert_eq!(core.take_back(0, true), TakeBack::Yielded);
        let chunk = TAKE_BACK_CHUNK / PAGE_SIZE;
        let mg = mergeable(mem, len);
        assert!(mg[..chunk].iter().all(|&m| !m), "first chunk still KSM's");
        assert!(
            mg[chunk..].iter().all(|&m| m),
            "more than a chunk went back"
        );
        assert!(
            core.regions[0].assisted,
            "the region is KSM's until the end"
        );
        // Called again, it goes on from there: one more chunk.
        assert_eq!(core.take_back(0, true), TakeBack::Yielded);
        assert_eq!(
            mergeable(mem, len).iter().filter(|&&m| !m).count(),
            2 * chunk
        );

        // The engine goes back to merging before the take-back ends: the
        // part given back is KSM's again (nobody else would merge it).
        core.resume_handed_over();
        assert!(mergeable(mem, len).iter().all(|&m| m));
        assert_eq!(core.regions[0].taken_back, 0);

        // Without a waiter (or not yielding) it runs to the end.
        assert_eq!(core.take_back(0, true), TakeBack::Yielded);
        core.waiters.store(0, Ordering::Release);
        assert_eq!(core.take_back(0, true), TakeBack::Done);
        assert!(!core.regions[0].assisted);
        assert_eq!(core.regions[0].taken_back, 0);
        assert!(mergeable(mem, len).iter().all(|&m| !m));
        // SAFETY: with unmerge the region keeps its content.
        unsafe { core.unregister(core.regions[0].id, true) }.unwrap();
        // SAFETY: the test's own mapping, no longer registered or used.
        unsafe { crate::mm::unmap(ptr, len) };
    }
}
