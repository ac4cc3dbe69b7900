//! Judging each group's merges for the KSM assist, and handing regions to
//! kernel KSM and back.

use super::*;

/// A take-back from KSM this long is logged (the core is held through it).
const SLOW_TAKE_BACK: Duration = Duration::from_millis(200);

impl Core {
    /// Makes region `ri` KSM's: `MADV_MERGEABLE`, after which the engine only
    /// watches its own earlier merges there. Called between spans, when the
    /// engine holds no page of it write-protected (assist.rs).
    pub(super) fn hand_to_ksm(&mut self, ri: usize) {
        let r = &mut self.regions[ri];
        match crate::mm::madvise(r.addr, r.len(), libc::MADV_MERGEABLE) {
            Ok(()) => {
                r.assisted = true;
                self.assist.new_work();
            }
            Err(e) => log::warn!("pagefold: KSM assist: {e}"),
        }
    }

    /// Takes region `ri` back from KSM: `MADV_UNMERGEABLE` gives every KSM
    /// page of it a private copy and, holding the mmap lock, waits out any
    /// merge ksmd has in flight there, so the engine may protect its pages
    /// again afterwards. Returns false (region stays KSM's) on failure.
    pub(super) fn take_from_ksm(&mut self, ri: usize) -> bool {
        let r = &mut self.regions[ri];
        if !r.assisted {
            return true;
        }
        let t = Instant::now();
        let res = crate::mm::madvise(r.addr, r.len(), libc::MADV_UNMERGEABLE);
        if t.elapsed() >= SLOW_TAKE_BACK {
            // The core is held meanwhile: VM creation and deletion wait.
            log::warn!(
                "pagefold: KSM assist: giving {} MiB back from KSM took {:?}",
                r.len() >> 20,
                t.elapsed()
            );
        }
        match res {
            Ok(()) => {
                r.assisted = false;
                r.ksm_merged = 0;
                r.ksm_saved = 0.0;
                // Unmerged pages keep stale hashes and levels: revisit them.
                for i in 0..r.npages {
                    if region::kind(r.state[i]) == HASHED {
                        r.set_kind(i, NEW);
                        r.state[i] = region::with_level(r.state[i], 0);
                    }
                }
                true
            }
            Err(e) => {
                log::warn!("pagefold: KSM assist: giving region back: {e}");
                false
            }
        }
    }

    /// Ends the assist once no region is KSM's any more.
    pub(super) fn release_assist_if_unused(&mut self) {
        if self.assist.group().is_some() && !self.regions.iter().any(|r| r.assisted) {
            self.assist.disengage();
            self.census = Census::default();
        }
    }

    /// Takes every region back from KSM and ends the assist (unmerge mode).
    pub fn end_assist(&mut self) {
        for ri in 0..self.regions.len() {
            self.take_from_ksm(ri);
        }
        self.release_assist_if_unused();
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
    /// each) and KSM could take them: the engine makes no more new VMAs.
    pub(super) fn scattered_now(&self, group: u32) -> bool {
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
        if g.new_vmas < cfg.judge_at(pages, self.max_map_count) {
            return false;
        }
        g.merged < cfg.flip_run_pages.saturating_mul(g.new_vmas)
    }

    /// Hands `group` to KSM if its merges this pass look scattered (many new
    /// VMAs for few pages) or the VMA budget refused merges with partners.
    pub(super) fn maybe_assist(&mut self, group: u32) {
        if !self.assist.can_try() {
            return;
        }
        let g = self.pass_groups.get(&group).copied().unwrap_or_default();
        let cfg = self.assist.cfg;
        if !self.scattered_now(group) && g.deferred < cfg.flip_deferred {
            return;
        }
        if let Err(why) = self.assist.engage(group) {
            self.assist.failed(why);
            return;
        }
        log::info!(
            "pagefold: handing group {group} to kernel KSM ({} new VMAs for {} merged pages, {} deferred this pass)",
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
    /// before would hold until the next read, 10 s later, and let the
    /// engine's first pass of a large scattered group fill the whole limit.
    pub(crate) fn set_assist(&mut self, cfg: AssistConfig) {
        self.assist = KsmAssist::new(cfg);
        self.set_budget();
    }

    /// Turns this pass's PFNs of assisted pages into the KSM figures.
    pub(super) fn count_census(&mut self) {
        if self.census_pages.is_empty() && self.census.shared == 0 {
            return;
        }
        let mut pages = std::mem::take(&mut self.census_pages);
        let c = Census::count(&mut pages);
        pages.clear();
        self.census_pages = pages;
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
        self.census = c;
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
