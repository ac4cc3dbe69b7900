//! Whether a group judged scattered would outgrow the VMA budget: a sample
//! of the pages its pass has still to scan says how many more runs the
//! pass would make.
//!
//! The KSM assist pays off only for a group whose scattered duplicates the
//! engine cannot hold: merged by the engine, a group's pages cost nothing
//! more, whereas KSM scans every page of the group for as long as it has
//! it. A group's merges so far say little about the rest of its pass (a
//! scattered copy of one region has all its merges in the second region,
//! a build's page caches have theirs in bursts), so the pages still ahead
//! are asked directly: a page that is present, not yet merged, and whose
//! content has a partner the engine knows (in the pool or among the pages
//! hashed this pass) will merge when the scan gets there.

use super::*;

/// Pages of the rest of a pass that a projection hashes: enough to tell a
/// group whose every page ahead has a partner from one where a few percent
/// have (a binomial share of 512 is within 5 points of the truth 19 times in
/// 20), few enough to cost about a millisecond once per pass.
const PROJECTION_SAMPLES: u64 = 512;

/// What a projection found (logged with the judgement).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Projection {
    /// Pages of the group's pass still to scan.
    pub(super) left: u64,
    /// Pages sampled among them, and those that would merge.
    pub(super) sampled: u64,
    pub(super) hits: u64,
    /// New runs the rest of the pass would make.
    pub(super) runs: u64,
}

impl Core {
    /// Where the scan stands for a judgement made during visit `v`: the
    /// page itself on the scan's own visits, the cursor on others (a
    /// hinted page or a second look lies anywhere).
    pub(super) fn scan_at(&self, v: &PageVisit) -> (usize, usize) {
        if v.mode == VisitMode::Merge {
            (v.ri, v.p)
        } else {
            self.cursor.position()
        }
    }

    /// Whether `group`'s merges this pass (`g` so far, the scan at `at`)
    /// would take more VMAs than `AssistConfig::flip_pass_vmas` allows: by
    /// default, the pass's runs so far and all the VMA budget has left, so
    /// that a group whose duplicates fit stays the engine's. Decided once
    /// a pass, at the group's first judgement: the answer holds until the
    /// pass ends, and if the pass makes more runs than projected, the
    /// budget refuses them and the refusals hand the group over
    /// (`AssistConfig::flip_deferred`).
    pub(super) fn outgrows_budget(
        &mut self,
        group: u32,
        g: &GroupPass,
        at: (usize, usize),
    ) -> bool {
        if let Some(out) = g.outgrows {
            return out;
        }
        let proj = self.project_runs(group, g, at);
        let pass_vmas = 2 * (g.new_vmas + proj.runs);
        let allowance = self
            .assist
            .cfg
            .flip_pass_vmas
            .unwrap_or_else(|| 2 * g.new_vmas + self.vmas.spendable().max(0) as u64);
        let out = pass_vmas >= allowance;
        log::info!(
            "group {group} judged scattered ({} new VMAs for {} merged pages): {} of {} pages sampled ahead would merge, {} more runs projected of {} pages left, {pass_vmas} VMAs for the pass against {allowance} allowed: {}",
            g.new_vmas,
            g.merged,
            proj.hits,
            proj.sampled,
            proj.runs,
            proj.left,
            if out { "KSM takes it" } else { "the engine keeps it" }
        );
        self.pass_groups.entry(group).or_default().outgrows = Some(out);
        out
    }

    /// Projects the new runs the rest of `group`'s pass would make: samples
    /// its pages from `at` to the end of the pass at an even stride and
    /// counts those that would merge (`would_merge`). Each costs at most a
    /// run, fewer where the pass's merges so far shared runs.
    pub(super) fn project_runs(&self, group: u32, g: &GroupPass, at: (usize, usize)) -> Projection {
        // The group's page ranges still ahead, in pass order.
        let ranges: Vec<(usize, usize, usize)> = self
            .regions
            .iter()
            .enumerate()
            .filter(|(ri, r)| r.group == group && !r.assisted && *ri >= at.0)
            .map(|(ri, r)| {
                let from = if ri == at.0 { at.1.min(r.npages) } else { 0 };
                (ri, from, r.npages)
            })
            .filter(|&(_, from, end)| from < end)
            .collect();
        let left: u64 = ranges.iter().map(|&(_, f, e)| (e - f) as u64).sum();
        let sampled = PROJECTION_SAMPLES.min(left);
        let mut proj = Projection {
            left,
            sampled,
            ..Projection::default()
        };
        if sampled == 0 || g.merged == 0 {
            return proj;
        }
        for k in 0..sampled {
            // The middle of the k-th of `sampled` equal slices.
            let mut idx = (2 * k + 1) * left / (2 * sampled);
            for &(ri, from, end) in &ranges {
                let n = (end - from) as u64;
                if idx < n {
                    if self.would_merge(ri, from + idx as usize, group) {
                        proj.hits += 1;
                    }
                    break;
                }
                idx -= n;
            }
        }
        // Runs per page merged so far, doubled (a pair merges two pages for
        // a run), at most one.
        let per_page = (2 * g.new_vmas).min(g.merged) as f64 / g.merged as f64;
        proj.runs = (proj.hits as f64 / sampled as f64 * left as f64 * per_page).round() as u64;
        proj
    }

    /// Would page `p` of region `ri` merge when the scan visits it: present
    /// and private (an absent page or the zero page costs no VMA), not
    /// merged already, not all zeros (dropped, not mapped), and with a
    /// partner the engine knows under its hash (a pool slot of the group
    /// or a page hashed this pass; not compared: this only counts).
    fn would_merge(&self, ri: usize, p: usize, group: u32) -> bool {
        let r = &self.regions[ri];
        if region::kind(r.state[p]) == MERGED {
            return false;
        }
        let Ok(e) = self.pagemap.entry(r.page_addr(p)) else {
            return false;
        };
        if !self.own_page(e) {
            return false;
        }
        // SAFETY: registered regions are mapped, and stay so while we hold
        // the core (unregister needs it); a read changes nothing.
        let page = unsafe { r.guest_page(p) };
        let h = fold((self.hash_fn)(page.bytes()));
        if h == self.zero_hash && page.is_zero() {
            return false;
        }
        self.known_partner(ri, p, h, group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PAGE_SIZE;

    const N: usize = 2048;

    /// What region b holds, page by page.
    #[derive(Clone, Copy, Debug)]
    enum Ahead {
        /// a's pages in another order: every page has a partner.
        Copy,
        /// Contents of its own.
        Unique,
        /// Zeros: dropped, never mapped onto the pool.
        Zeros,
    }

    /// Writes `v` and its page number into page `i` at `mem` (distinct,
    /// non-zero contents).
    fn fill(mem: usize, i: usize, v: u64) {
        let at = (mem + i * PAGE_SIZE) as *mut u64;
        for w in 0..PAGE_SIZE / 8 {
            // SAFETY: `at` is page `i` of the test's own mapping.
            unsafe { at.add(w).write(v.wrapping_mul(w as u64 + 1) | 1) };
        }
    }

    /// Regions a and b of one group, the scan half-way through its second
    /// pass: a's pages hashed unchanged (in this pass's index), b's not yet
    /// visited. Returns what a pass so far of one run per two merged pages
    /// projects, the judgement under `allowance`, and the judgement asked
    /// again in the same pass under the opposite allowance.
    fn project(ahead: Ahead, allowance: Option<u64>) -> (Projection, bool, bool) {
        let len = N * PAGE_SIZE;
        let (pa, pb) = (
            crate::mm::map_anon(len).unwrap(),
            crate::mm::map_anon(len).unwrap(),
        );
        let (a, b) = (pa as usize, pb as usize);
        for i in 0..N {
            fill(a, i, 1000 + i as u64);
            match ahead {
                Ahead::Copy => fill(b, i, 1000 + (i * 7919 % N) as u64),
                Ahead::Unique => fill(b, i, 900_000 + i as u64),
                // SAFETY: page i of the test's own mapping.
                Ahead::Zeros => unsafe { *((b + i * PAGE_SIZE) as *mut u8) = 0 },
            }
        }
        let mut core = Core::driven(1 << 26).unwrap();
        core.set_assist(AssistConfig {
            flip_pass_vmas: allowance,
            ..AssistConfig::default()
        });
        // SAFETY: the test's own private anonymous mappings, unmapped only
        // after the unregisters below.
        let ia = unsafe { core.register(a, len, "a".into(), "g".into()) }.unwrap();
        // SAFETY: as above.
        let ib = unsafe { core.register(b, len, "b".into(), "g".into()) }.unwrap();
        // Pass 1 hashes every page; pass 2 goes as far as a's end.
        core.run_passes(1);
        core.run_batch(N as u64, true);
        assert_eq!(
            core.cursor.position(),
            (1, 0),
            "the scan is not at b's start"
        );
        assert_eq!(core.merges_done(), 0, "nothing to merge before b");
        let group = core.regions[1].group;
        let g = GroupPass {
            merged: 2,
            new_vmas: 1,
            ..GroupPass::default()
        };
        let proj = core.project_runs(group, &g, (1, 0));
        let out = core.outgrows_budget(group, &g, (1, 0));
        // Judged once a pass: whatever the allowance says next.
        core.assist.cfg.flip_pass_vmas = Some(if out { u64::MAX } else { 0 });
        let g = core.pass_groups.get(&group).copied().unwrap_or_default();
        let again = core.outgrows_budget(group, &g, (1, 0));
        for id in [ia, ib] {
            // SAFETY: nothing was merged: the regions keep their content.
            unsafe { core.unregister(id, true) }.unwrap();
        }
        // SAFETY: the test's own mappings, no longer registered or used.
        unsafe {
            crate::mm::unmap(pa, len);
            crate::mm::unmap(pb, len);
        }
        (proj, out, again)
    }

    #[test]
    fn pages_ahead_with_partners_project_a_run_each() {
        let (p, out, again) = project(Ahead::Copy, Some(3 * N as u64));
        assert_eq!((p.left, p.sampled), (N as u64, PROJECTION_SAMPLES));
        assert_eq!(p.hits, PROJECTION_SAMPLES, "{p:?}");
        assert_eq!(p.runs, N as u64, "{p:?}");
        // 2 x (1 + 2,048) VMAs for the pass: within 3 x 2,048.
        assert!(!out && !again);
        let (_, out, again) = project(Ahead::Copy, Some(2 * N as u64));
        assert!(out && again);
    }

    #[test]
    fn unique_pages_and_zero_pages_ahead_project_nothing() {
        for ahead in [Ahead::Unique, Ahead::Zeros] {
            let (p, out, _) = project(ahead, Some(3));
            assert_eq!(p.left, N as u64, "{ahead:?}");
            assert_eq!((p.hits, p.runs), (0, 0), "{ahead:?}: {p:?}");
            // The runs so far alone: 2 x 1 VMAs, under 3.
            assert!(!out, "{ahead:?}");
        }
    }

    #[test]
    fn the_default_allowance_is_what_the_budget_has_left() {
        // 2 x 2,049 VMAs, far below half of `vm.max_map_count`.
        let (p, out, _) = project(Ahead::Copy, None);
        assert_eq!(p.runs, N as u64);
        assert!(!out);
    }
}
