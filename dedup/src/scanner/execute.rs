//! Executing a span's planned merges window by window (`merge::exec_chunk`)
//! and committing the results.

use super::*;
use crate::PAGE_SIZE;

impl Core {
    /// Executes the planned ops in address order (region, page), window by
    /// window: a slot's creator runs in the same window as the joins after
    /// it, so a run that starts with its slot's creator is one window and
    /// one `mmap`, not a window for the creator and one for the joins. A
    /// join whose slot
    /// a page after it creates (an unstable partner: the later page
    /// creates the pair's slot) waits for a second sweep; before its
    /// creator it would find the slot unwritten and fail. Once
    /// `OPS_BEFORE_YIELD` ops ran, a thread waiting for the core (VM
    /// creation or deletion) or the wake-up's deadline stops it: the ops
    /// left are abandoned, as if their final compare had failed (`commit`
    /// with `done` false: the pages keep their private copies), and queued
    /// for a second look at the next wake-up. Past the deadline by more
    /// than `DEADLINE_SLACK`, it stops after its first window. The plan is made before the
    /// execution and the waiter may come after it: executing a span of
    /// scattered pairs can take most of a second in a debug build, too
    /// long for a registration to wait, and seconds on a loaded emulated
    /// CPU (1.35 ms a merge), longer than a wake-up may last.
    pub(super) fn execute(&mut self, ops: Vec<Op>, freed: &mut Vec<u32>) {
        let cpu0 = mm::clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID);
        self.execute_ops(ops, freed);
        self.counters.merge_cpu_s += mm::clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - cpu0;
    }

    fn execute_ops(&mut self, mut ops: Vec<Op>, freed: &mut Vec<u32>) {
        let mut park = self.park_for_merges(ops.len());
        ops.sort_by_key(|o| (o.region, o.page));
        let later = self.joins_before_their_creator(&mut ops);
        let mut new_slots: Vec<u32> = Vec::new();
        let mut ran = 0;
        for (sweep, pending) in [(&ops, &later[..]), (&later, &[][..])] {
            let mut i = 0;
            while i < sweep.len() {
                if (ran >= OPS_BEFORE_YIELD || (ran > 0 && self.overdue())) && self.should_stop() {
                    self.abandon(&sweep[i..], &mut new_slots, freed);
                    self.abandon(pending, &mut new_slots, freed);
                    freed.extend(new_slots);
                    self.park_costs = park.finish();
                    return;
                }
                park.checkpoint();
                let s = i;
                i = window_end(sweep, s, park.window_pages());
                let chunk = &sweep[s..i];
                ran += chunk.len();
                let gaps = chunk[chunk.len() - 1].page - chunk[0].page + 1 != chunk.len();
                let t = Instant::now();
                let res = self.exec_window(chunk, pending);
                park.timed(chunk.len(), t.elapsed());
                if res.protect_failed && gaps {
                    // Not protectable as a whole (a VMA in a gap is not
                    // registered): each gapless part on its own.
                    let mut j = 0;
                    while j < chunk.len() {
                        let t = j;
                        j += 1;
                        while j < chunk.len() && chunk[j].page == chunk[j - 1].page + 1 {
                            j += 1;
                        }
                        let part = &chunk[t..j];
                        let res = self.exec_window(part, pending);
                        self.commit_window(part, res, &mut new_slots, freed);
                    }
                } else {
                    self.commit_window(chunk, res, &mut new_slots, freed);
                }
            }
        }
        // A created slot nobody ended up mapping is freed.
        freed.extend(new_slots);
        self.park_costs = park.finish();
    }

    /// Takes out of `ops` (sorted by region and page) the joins of a slot
    /// whose creator comes after them, and returns them in that order.
    fn joins_before_their_creator(&self, ops: &mut Vec<Op>) -> Vec<Op> {
        let mut created = std::collections::HashSet::new();
        let mut later = Vec::new();
        ops.retain(|op| {
            match op.kind {
                OpKind::New => {
                    created.insert(op.slot);
                }
                // A slot still reserved is created by an op of this batch.
                OpKind::Existing
                    if self.pool.state(op.slot) == SlotState::Reserved
                        && !created.contains(&op.slot) =>
                {
                    later.push(*op);
                    return false;
                }
                _ => {}
            }
            true
        });
        later
    }

    /// Gives up planned ops without running them: what `commit_window`
    /// does for a window none of whose ops succeeded (a slot they would
    /// have created is never written).
    fn abandon(&mut self, ops: &[Op], new_slots: &mut Vec<u32>, freed: &mut Vec<u32>) {
        for op in ops {
            if op.kind == OpKind::New {
                new_slots.push(op.slot);
                self.pool.fail(op.slot);
            }
            self.commit(op, false, freed);
            // A second look next wake-up (`run_rechecks`: if nothing wrote
            // it since, it is visited again at once), not at the next pass.
            // It was found unchanged already: no wait for a collection.
            if self.recheck_due.len() < RECHECK_CAP {
                self.recheck_due
                    .push(self.regions[op.region].gid_base + op.page as u32);
            }
        }
        self.counters.left_for_waiters += ops.len() as u64;
    }

    /// Runs one window of ops (`merge::exec_chunk`). `pending`: the ops
    /// still to run after this sweep, sorted by (region, page).
    pub(super) fn exec_window(&mut self, chunk: &[Op], pending: &[Op]) -> merge::ChunkResult {
        let r = &self.regions[chunk[0].region];
        let first = chunk[0];
        let continues_left = first.kind != OpKind::Zero
            && first.page > 0
            && region::kind(r.state[first.page - 1]) == MERGED
            && r.word[first.page - 1].wrapping_add(1) == first.slot
            // A left neighbour still waiting for the next sweep is not
            // mapped yet.
            && pending
                .binary_search_by_key(&(first.region, first.page - 1), |o| (o.region, o.page))
                .is_err();
        let base = r.addr;
        if r.huge {
            self.counters.huge_pages_split += split_huge_pages(base, chunk);
        }
        let ctx = Ctx {
            uffd: &self.uffd,
            prot: &self.prot,
            pagemap: &self.pagemap,
        };
        merge::exec_chunk(
            &ctx,
            &mut self.pool,
            base,
            chunk,
            continues_left,
            self.vmas.budget_mut(),
        )
    }

    /// Commits a window's ops from its result.
    pub(super) fn commit_window(
        &mut self,
        chunk: &[Op],
        res: merge::ChunkResult,
        new_slots: &mut Vec<u32>,
        freed: &mut Vec<u32>,
    ) {
        for (k, op) in chunk.iter().enumerate() {
            let done = res.done & (1 << k) != 0;
            if op.kind == OpKind::New {
                new_slots.push(op.slot);
                if res.written & (1 << k) == 0 {
                    self.pool.fail(op.slot);
                }
            }
            self.commit(op, done, freed);
        }
    }

    pub(super) fn commit(&mut self, op: &Op, done: bool, freed: &mut Vec<u32>) {
        let r = &mut self.regions[op.region];
        r.state[op.page] = op.old_state;
        if done {
            match op.kind {
                OpKind::Zero => {
                    r.set_kind(op.page, ZERO);
                    r.set_in_pool(op.page, false);
                    self.counters.origins.zero_merges += 1;
                    if op.origin != region::Origin::Hinted {
                        self.settle.note_zero_drop();
                    }
                }
                _ => {
                    r.set_in_pool(op.page, true);
                    r.set_kind(op.page, MERGED);
                    // Checked for copy-on-write every pass at first.
                    r.state[op.page] = region::with_level(r.state[op.page], 0);
                    r.word[op.page] = op.slot;
                    self.counters.merges += 1;
                }
            }
            r.state[op.page] = region::with_origin(r.state[op.page], op.origin);
            r.epoch[op.page] = self.settle.epoch();
            if r.written.is_some() {
                self.merged_since_collect.push(r.gid_base + op.page as u32);
            }
            *self.counters.origins.merges.at_mut(op.origin.index()) += 1;
            self.pass_progress += 1;
        } else {
            r.word[op.page] = op.hash;
            r.state[op.page] = region::with_level(op.old_state, 0);
            self.counters.abandoned += 1;
            if op.kind != OpKind::Zero
                && drop_mapper(&mut self.pool, &mut self.stable, op.slot) == 0
            {
                freed.push(op.slot);
            }
        }
    }
}

/// End (exclusive) of the merge window that starts at `ops[s]`: the ops
/// after it of the same phase (creating slots or joining them) and region,
/// within [`GAPPED_WINDOW_PAGES`] pages of the first (gaps allowed, see
/// `merge::exec_chunk`), or within [`CHUNK_PAGES`] while the window has no
/// gap (a run of pages of one content); and within `cap` pages (the pause
/// budget's, `BoundedPark::window_pages`).
fn window_end(ops: &[Op], s: usize, cap: usize) -> usize {
    let mut gapless = true;
    let mut i = s + 1;
    while i < ops.len() && ops[i].region == ops[s].region {
        let span = ops[i].page - ops[s].page;
        let next = ops[i].page == ops[i - 1].page + 1;
        let limit = if gapless && next {
            CHUNK_PAGES
        } else {
            GAPPED_WINDOW_PAGES
        }
        .min(cap);
        if span >= limit {
            break;
        }
        gapless &= next;
        i += 1;
    }
    // A window full in the middle of a run of consecutive slots ends where
    // that run starts instead (if that keeps at least half of it): the
    // run is then mapped whole by the next window, one `mmap` instead of
    // one in each window.
    if i < ops.len() && ops[i].continues_run(&ops[i - 1]) {
        let mut r = i - 1;
        while r > s && ops[r].continues_run(&ops[r - 1]) {
            r -= 1;
        }
        if r > s + (i - s) / 2 {
            return r;
        }
    }
    i
}

/// Splits the transparent huge pages under a window's ops, once per 2 MiB
/// frame, through a page the window replaces (`mm::split_huge_page_at`):
/// what the merge unmaps is then freed at once rather than at the
/// kernel's deferred split. Ops in pool VMAs are skipped: no huge page
/// maps them. Returns the calls made.
fn split_huge_pages(base: usize, chunk: &[Op]) -> u64 {
    let mut last = usize::MAX;
    let mut calls = 0;
    for op in chunk.iter().filter(|op| !op.in_pool) {
        let addr = base + op.page * PAGE_SIZE;
        let frame = addr / mm::HUGE_PAGE_SIZE;
        if frame == last {
            continue;
        }
        last = frame;
        calls += 1;
        if let Err(e) = mm::split_huge_page_at(addr) {
            log::debug!("huge page not split: {e}");
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(region: usize, page: usize, kind: OpKind) -> Op {
        Op {
            region,
            page,
            slot: page as u32,
            kind,
            hash: 0,
            old_state: 0,
            origin: Origin::Steady,
            in_pool: false,
        }
    }

    /// Window lengths (in ops) that `window_end` cuts `ops` into.
    fn windows(ops: &[Op]) -> Vec<usize> {
        let (mut v, mut s) = (Vec::new(), 0);
        while s < ops.len() {
            let e = window_end(ops, s, CHUNK_PAGES);
            v.push(e - s);
            s = e;
        }
        v
    }

    #[test]
    fn a_gapless_run_gets_full_windows() {
        let ops: Vec<Op> = (0..300).map(|p| op(0, p, OpKind::Existing)).collect();
        assert_eq!(
            windows(&ops),
            vec![CHUNK_PAGES, CHUNK_PAGES, 300 - 2 * CHUNK_PAGES]
        );
    }

    #[test]
    fn a_window_with_a_gap_spans_at_most_the_gapped_length() {
        // Every other page: 32 ops span 63 pages, the 33rd would make 65.
        let ops: Vec<Op> = (0..100).map(|k| op(0, 2 * k, OpKind::Existing)).collect();
        let w = windows(&ops);
        assert_eq!(w[0], GAPPED_WINDOW_PAGES / 2);
        assert!(w.iter().all(|&n| 2 * n - 1 <= GAPPED_WINDOW_PAGES), "{w:?}");
        // A run of 100 pages, then a gap: the gap ends the window (its
        // span would pass the gapped length) and starts the next.
        let mut ops: Vec<Op> = (0..100).map(|p| op(0, p, OpKind::Existing)).collect();
        ops.extend((0..10).map(|k| op(0, 102 + k, OpKind::Existing)));
        assert_eq!(windows(&ops), vec![100, 10]);
        // A gap early: the window keeps to the gapped length after it.
        let mut ops = vec![op(0, 0, OpKind::Existing)];
        ops.extend((2..200).map(|p| op(0, p, OpKind::Existing)));
        assert_eq!(windows(&ops)[0], GAPPED_WINDOW_PAGES - 1);
    }

    #[test]
    fn windows_keep_to_one_region_and_mix_creators_with_joins() {
        // Slots follow pages (`op`): a creator and the joins after it are
        // one run, one window.
        let mut ops: Vec<Op> = (0..10).map(|p| op(0, p, OpKind::New)).collect();
        ops.extend((10..20).map(|p| op(0, p, OpKind::Existing)));
        ops.extend((20..30).map(|p| op(1, p, OpKind::Existing)));
        assert_eq!(windows(&ops), vec![20, 10]);
    }

    #[test]
    fn a_full_window_ends_where_its_last_run_of_slots_starts() {
        // Pages 0..100 on slots 0..100, pages 100..200 on slots 1000..1100:
        // the first window would end 28 pages into the second run; it ends
        // at that run's start, and the next window maps the run whole.
        let run = |pages: std::ops::Range<usize>, slot0: u32| {
            let first = pages.start;
            pages.map(move |p| Op {
                slot: slot0 + (p - first) as u32,
                ..op(0, p, OpKind::Existing)
            })
        };
        let ops: Vec<Op> = run(0..100, 0).chain(run(100..200, 1000)).collect();
        assert_eq!(windows(&ops), vec![100, 100]);
        // A run that starts in the window's first half is not trimmed:
        // trimming would halve the window.
        let ops: Vec<Op> = run(0..40, 0).chain(run(40..300, 1000)).collect();
        assert_eq!(
            windows(&ops),
            vec![CHUNK_PAGES, CHUNK_PAGES, 300 - 2 * CHUNK_PAGES]
        );
        // Zero-page drops are no run of slots.
        let ops: Vec<Op> = (0..200).map(|p| op(0, p, OpKind::Zero)).collect();
        assert_eq!(windows(&ops), vec![CHUNK_PAGES, 200 - CHUNK_PAGES]);
    }

    /// Fills page `i` of `base` with content of its own, `tag`.
    fn fill(base: *mut u8, i: usize, tag: u64) {
        // SAFETY: `base` maps the test's pages and page `i` is one of them.
        let page = unsafe {
            std::slice::from_raw_parts_mut(base.add(i * crate::PAGE_SIZE), crate::PAGE_SIZE)
        };
        for (k, w) in page.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k as u64).to_le_bytes());
        }
    }

    /// Does page `i` of `base` hold what `fill(base, i, tag)` wrote?
    fn holds(base: *mut u8, i: usize, tag: u64) -> bool {
        let mut want = [0u8; crate::PAGE_SIZE];
        fill(want.as_mut_ptr(), 0, tag);
        // SAFETY: as in `fill`; read only.
        let page =
            unsafe { std::slice::from_raw_parts(base.add(i * crate::PAGE_SIZE), crate::PAGE_SIZE) };
        page == want
    }

    /// Two regions of `n` pages with the same contents, b's in a
    /// scattered order (b's page j holds a's page j * 7919 mod n): one VMA
    /// per merge, as between guests; a core that has seen them once.
    struct Pair {
        core: Core,
        a: *mut u8,
        b: *mut u8,
        n: usize,
    }

    impl Pair {
        fn new(n: usize) -> Pair {
            let len = n * crate::PAGE_SIZE;
            let (a, b) = (
                crate::mm::map_anon(len).unwrap(),
                crate::mm::map_anon(len).unwrap(),
            );
            for i in 0..n {
                fill(a, i, i as u64);
                fill(b, i, Pair::tag_b(n, i));
            }
            let mut core = Core::driven(1 << 26).unwrap();
            // SAFETY: `a` and `b` are our own private anonymous mappings
            // of `len` bytes, unmapped only after the unregisters in `drop`.
            unsafe { core.register(a as usize, len, "a".into(), "g".into()) }.unwrap();
            // SAFETY: as for `a`.
            unsafe { core.register(b as usize, len, "b".into(), "g".into()) }.unwrap();
            core.run_passes(1);
            assert_eq!(core.counters.merges, 0, "first sight only hashes");
            Pair { core, a, b, n }
        }

        fn tag_b(n: usize, j: usize) -> u64 {
            ((j * 7919) % n) as u64
        }

        /// Every page holds what it was filled with.
        fn intact(&self) {
            self.core.check_consistency().unwrap();
            for i in 0..self.n {
                assert!(holds(self.a, i, i as u64), "a's page {i}");
                assert!(holds(self.b, i, Pair::tag_b(self.n, i)), "b's page {i}");
            }
        }

        /// Every page shares, and holds what it was filled with.
        fn all_shared(&self) {
            let s = self.core.stats();
            let n = self.n as u64;
            assert_eq!((s.pages_shared, s.pages_sharing), (n, n), "{s:?}");
            self.intact();
        }
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            let ids: Vec<_> = self.core.regions.iter().map(|r| r.id).collect();
            for id in ids {
                // SAFETY: with unmerge the region keeps its content.
                let done = unsafe { self.core.unregister(id, true) };
                // Checked, but not while a failed assertion unwinds (a second panic
                // would abort).
                if !std::thread::panicking() {
                    done.unwrap();
                }
            }
            for r in [self.a, self.b] {
                // SAFETY: our own mappings, used no more: a driven core
                // touches its regions only when called, and this one is
                // not called again (even if an unregister failed).
                unsafe { crate::mm::unmap(r, self.n * crate::PAGE_SIZE) };
            }
        }
    }

    #[test]
    fn joins_whose_slot_a_later_page_creates_run_in_a_second_sweep() {
        // In the pass that pairs them, a's page is the unstable partner of
        // b's, so b's page (after a's in execution order) creates the slot
        // a's page joins. Run before their creators, those joins would
        // find the slot unwritten and fail (merged a pass later).
        let mut p = Pair::new(1024);
        p.core.run_passes(1);
        assert_eq!(p.core.counters.abandoned, 0);
        p.all_shared();
    }

    /// Plans every merge of a [`Pair`] of `n` pages in one pass (kept, as a
    /// hint visit's are), lets `stop` set what should stop the execution,
    /// then executes them; checks that every op was either made or
    /// abandoned and that no page changed, and returns (made, abandoned).
    fn execute_every_merge(p: &mut Pair, n: usize, stop: impl FnOnce(&mut Core)) -> (u64, u64) {
        let core = &mut p.core;
        let mut ops = Vec::new();
        let mut units = u64::MAX;
        for ri in 0..2 {
            let mut p = 0;
            while p < n {
                p += core.scan_span_inner(
                    ri,
                    p,
                    (n - p).min(SPAN_PAGES),
                    &mut units,
                    VisitMode::Merge,
                    Planned::Keep(&mut ops),
                );
            }
        }
        let planned = ops.len();
        assert!(planned >= 2 * n - 1, "{planned} ops planned");
        stop(core);
        let mut freed = Vec::new();
        core.execute(ops, &mut freed);
        core.release_slots(&freed);
        let (done, dropped) = (core.counters.merges, core.counters.abandoned);
        assert_eq!(done + dropped, planned as u64);
        p.intact();
        (done, dropped)
    }

    #[test]
    fn a_waiter_that_comes_after_the_plan_stops_the_execution_and_loses_nothing() {
        use std::sync::atomic::Ordering;
        let n = 2048;
        let mut p = Pair::new(n);
        // A waiter comes after the plan, before the merges run.
        let (done, dropped) =
            execute_every_merge(&mut p, n, |core| core.waiters.store(1, Ordering::Release));
        assert_eq!(p.core.counters.left_for_waiters, dropped);
        // It stops at the first window boundary past the bound (a's slot
        // creators are consecutive pages: windows of up to 128).
        assert!(
            (OPS_BEFORE_YIELD as u64..(OPS_BEFORE_YIELD + CHUNK_PAGES) as u64).contains(&done),
            "{done} executed, {dropped} abandoned"
        );

        // Without a waiter the abandoned merges are made on the next
        // passes: every page shares.
        p.core.waiters.store(0, Ordering::Release);
        p.core.run_passes(2);
        p.all_shared();
    }

    /// An execution that starts long past its wake-up's deadline runs one
    /// window, not `OPS_BEFORE_YIELD` ops, and loses nothing: the rest
    /// merges at the next wake-ups.
    #[test]
    fn an_overdue_execution_stops_after_one_window_and_loses_nothing() {
        let n = 2048;
        let mut p = Pair::new(n);
        let due = Instant::now() - DEADLINE_SLACK - Duration::from_secs(1);
        let (done, dropped) = execute_every_merge(&mut p, n, |core| core.set_deadline(Some(due)));
        assert!(
            (1..=CHUNK_PAGES as u64).contains(&done),
            "{done} executed, {dropped} abandoned"
        );
        p.core.set_deadline(None);
        p.core.run_passes(2);
        p.all_shared();
    }
}
