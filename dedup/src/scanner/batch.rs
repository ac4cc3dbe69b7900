//! One wake-up's scan (`run_batch`), whole passes, the end of a pass, and the
//! second looks at pages written last wake-up (`run_rechecks`).

use super::*;

impl Core {
    /// Runs one wake-up over at most `pages_to_visit` page visits; `merge`
    /// false means checksum only (auto mode's idle rounds).
    pub fn run_batch(&mut self, pages_to_visit: u64, merge: bool) -> BatchReport {
        let mut rep = BatchReport::default();
        if self.regions.is_empty() {
            return rep;
        }
        self.refresh_map_count(false);
        self.resume_handed_over();
        self.collect_write_logs_when_due();
        if merge && self.run_rechecks() {
            // Someone waits for the core: the scan waits for the next
            // wake-up, after the rechecks left.
            rep.yielded = true;
            return rep;
        }
        let before = self.merges_done();
        let fresh_before = self.fresh_hashed;
        let mut visit_units = pages_to_visit.saturating_mul(HASH_COST);
        let units0 = visit_units;
        self.census.start_batch();
        if self.cursor.at_pass_start() {
            // The settle time (`settle.rs`): a page unchanged since its
            // previous visit has then stayed so for at least that long.
            let settled = self
                .pass_started
                .is_none_or(|t| t.elapsed() >= self.settle.time());
            if merge && !settled && !self.passes_forced {
                return rep;
            }
            self.pass_started = Some(Instant::now());
            if self.unstable.is_empty() {
                self.unstable.reset(self.tracked_pages() as usize);
            }
        }
        while visit_units > 0 {
            let (ri, start) = self.cursor.next(self.regions.len());
            // Read pagemap only for pages this wake-up can visit: every visit
            // costs at least one visit unit, so a small wake-up (auto mode's
            // untriggered rounds scan ~5 pages) must not pay for a whole span.
            // (KSM's regions are not paced by visits: whole spans.)
            let mut n = (self.regions[ri].npages - start).min(SPAN_PAGES);
            if !self.regions[ri].assisted {
                n = n.min(usize::try_from(visit_units).unwrap_or(usize::MAX).max(1));
            }
            let mode = VisitMode::of_scan(merge);
            let used = self.scan_span(ri, start, n, &mut visit_units, mode, Planned::Run);
            let npages = self.regions[ri].npages;
            if self.cursor.advance(used, npages, self.regions.len()) {
                self.end_pass();
                rep.pass_completed = true;
                break;
            }
            if self.census.slice_spent() {
                rep.census_pending = true;
                break;
            }
            if self.should_stop() {
                // Someone waits for the core, or the wake-up's time is up:
                // the rest of the batch's pace is left, the cursor stays
                // where the span ended.
                rep.yielded = true;
                break;
            }
        }
        rep.merges = self.merges_done() - before;
        rep.spent = units0 - visit_units;
        rep.fresh = self.fresh_hashed - fresh_before;
        if rep.merges > 0 {
            self.idle_passes = 0;
        }
        self.vmas.publish();
        rep
    }

    /// Merges made so far, zero-page drops included (what a batch reports).
    pub(super) fn merges_done(&self) -> u64 {
        self.counters.merges + self.counters.origins.zero_merges
    }

    /// Judges the settle time (`settle.rs`) by the scan's merges (all but
    /// the hinted ones; second looks' also apart) and the copy-on-write
    /// breaks of them noted so far (`Settle::note_break`): at each
    /// collection of the write logs (which takes back the shares the
    /// guests' writes broke since the previous one) and at each pass end,
    /// as a pass can take tens of seconds while guests boot. Once merges
    /// last, the time comes down to what KSM at the engine's knobs makes
    /// a page of the tracked regions wait.
    pub(super) fn judge_settle(&mut self) {
        let ksm_wait = settle::ksm_wait(
            self.tracked_pages(),
            self.knobs.pages_to_scan,
            self.knobs.sleep_millisecs,
        );
        let o = &self.counters.origins;
        self.settle.judge(
            o.merges.total() - o.merges.hinted,
            o.merges.second_look,
            Instant::now(),
            ksm_wait,
        );
    }

    /// Runs whole passes synchronously (tests, benchmarks).
    #[cfg(any(test, feature = "testing"))]
    pub fn run_passes(&mut self, passes: u64) {
        // As a wake-up does first.
        self.release_deferred();
        self.passes_forced = true;
        for _ in 0..passes {
            if self.regions.is_empty() {
                break;
            }
            while !self.run_batch(1 << 30, true).pass_completed {}
        }
        self.passes_forced = false;
    }

    pub(super) fn end_pass(&mut self) {
        self.counters.passes += 1;
        self.judge_settle();
        if log::log_enabled!(log::Level::Debug) {
            let (o, c) = (&self.counters.origins, &self.counters);
            log::debug!(
                "pass {} in {:.2?}: {} hashed, merges {}/{}/{}/{} ({} zero drops) \
                 (steady/second look/first sight/hinted), {} undone, settle {:?}; \
                 thread CPU {:.2} s, {:.2} s of it merging",
                c.passes,
                self.pass_started.map(|t| t.elapsed()).unwrap_or_default(),
                c.pages_hashed,
                o.merges.steady,
                o.merges.second_look,
                o.merges.first_sight,
                o.merges.hinted,
                o.zero_merges,
                o.cow_breaks.total(),
                self.settle.time(),
                crate::mm::clock_seconds(libc::CLOCK_THREAD_CPUTIME_ID),
                c.merge_cpu_s,
            );
        }
        // Read at most once per pass end, whoever asks first.
        let activity = std::cell::OnceCell::new();
        let activity = || *activity.get_or_init(census::Activity::now);
        // While KSM assists, a pass counts when KSM finished a full scan
        // and the figure it reports includes that scan: the pass took a
        // census, or nothing that moves with KSM's sharing moved since the
        // last one (the census skipped as quiet: its figures are current).
        if self.assist.group().is_none()
            || ((self.census.due()
                || (self.assist.ksm_scan_uncounted() && self.census.current(activity)))
                && self.assist.ksm_scanned_since_last_look())
        {
            self.counters.full_scans += 1;
        }
        // KSM merging in assisted regions is progress too: keep the pace
        // (and the census fresh) while it works.
        let ksm_before = self.census.figures().sharing;
        if self.census.due() {
            self.count_census();
            if self.census.figures().sharing != ksm_before {
                self.pass_progress += 1;
            }
        }
        if self.assist.ksm_busy() {
            // KSM works for us (maybe between its checksum and merge scans):
            // not idle, keep the census on time.
            self.pass_progress += 1;
        }
        self.census.schedule(
            self.assist.ksm_scan_uncounted(),
            self.assist.ksm_busy(),
            activity,
        );
        if self.pass_progress == 0 {
            self.idle_passes = self.idle_passes.saturating_add(1);
        } else {
            self.idle_passes = 0;
        }
        self.pass_progress = 0;
        self.last_pass_groups = std::mem::take(&mut self.pass_groups);
        self.unstable.reset(self.tracked_pages() as usize);
        // Per-region savings and VMA estimate (O(pages), once per pass in
        // which merges, copy-on-write breaks or registrations happened:
        // passes over KSM-assisted regions come every wake-up).
        let key = (
            self.counters.merges,
            self.counters.origins.cow_breaks.total(),
            self.regions.len() as u64,
            self.ids.regions_joined(),
        );
        let recount = key != self.recount_key;
        self.recount_key = key;
        if recount {
            self.recount_savings();
        }
        self.refresh_map_count(false);
    }

    /// Recomputes each region's saved pages (its share of every pool page
    /// it maps) and VMA estimate: O(pages).
    pub(super) fn recount_savings(&mut self) {
        for r in self.regions.iter_mut() {
            let mut saved = 0.0;
            let mut vmas = 0;
            let mut prev: Option<u32> = None;
            for i in 0..r.npages {
                if region::kind(r.state[i]) == MERGED {
                    let s = r.word[i];
                    let m = self.pool.meta(s).mappers.max(1);
                    saved += 1.0 - 1.0 / m as f64;
                    if prev != Some(s.wrapping_sub(1)) {
                        vmas += 1;
                    }
                    prev = Some(s);
                } else {
                    prev = None;
                }
            }
            r.saved_pages = saved;
            r.vmas = vmas;
        }
    }

    /// Gives the pages whose second look is due (`recheck_due`) that look
    /// now: a page whose content had changed when it was last hashed waits,
    /// under KSM's volatility rule, until a later visit finds it unchanged,
    /// which the scan brings a whole pass later. With a write log the
    /// engine knows at the next collection whether anyone wrote it since
    /// the previous one, which came before its visit: if not, it stayed
    /// unwritten for a whole `LOG_INTERVAL` and is visited now as unchanged
    /// (`visit_clean`, or in full when it may pair). Written pages are left
    /// to the scan (due at its next pass).
    /// The merges run in slices of `SPAN_PAGES` queued pages, each planned
    /// and executed before the next (no provisional merge state is left for
    /// a span to meet); between two, a thread waiting for the core gets it
    /// (the queue holds up to `RECHECK_CAP` pages) and the rest stays
    /// queued for the next wake-up. Returns true when it stopped so.
    pub(super) fn run_rechecks(&mut self) -> bool {
        if self.recheck_due.is_empty() {
            return false;
        }
        let mut queue = std::mem::take(&mut self.recheck_due);
        let run = self.run;
        let mut at = 0;
        while at < queue.len() {
            let end = (at + SPAN_PAGES).min(queue.len());
            let mut ops: Vec<Op> = Vec::new();
            let mut units = u64::MAX;
            let mut groups: Vec<u32> = Vec::new();
            for &gid in &queue[at..end] {
                let Some((ri, p)) = self.locate(gid) else {
                    continue;
                };
                let r = &self.regions[ri];
                let st = r.state[p];
                // Planned as a partner by an earlier recheck (MERGED now),
                // hashed since, or written since: nothing to do here.
                if r.assisted
                    || region::kind(st) != HASHED
                    || !self.log_clean(ri, p, st, VisitMode::Merge)
                {
                    continue;
                }
                let prev = (p > 0 && region::kind(r.state[p - 1]) == MERGED).then(|| r.word[p - 1]);
                groups.push(r.group);
                self.note_run(None);
                let v = PageVisit {
                    ri,
                    p,
                    st,
                    prev,
                    mode: VisitMode::SecondLook,
                };
                self.visit(v, Entry(0), &mut units, &mut ops);
            }
            self.execute_planned(ops);
            self.judge_groups(groups);
            at = end;
            if at < queue.len() && self.should_stop() {
                // Ahead of the pages these visits queued.
                queue.drain(..at);
                queue.append(&mut self.recheck_due);
                self.recheck_due = queue;
                self.run = run;
                return true;
            }
        }
        self.run = run;
        false
    }

    /// Executes merge ops planned outside a scan span (hint visits,
    /// rechecks) and frees the slots that ended up unused.
    pub(super) fn execute_planned(&mut self, ops: Vec<Op>) {
        if !ops.is_empty() {
            let mut freed = Vec::new();
            self.execute(ops, &mut freed);
            self.release_slots(&freed);
        }
    }
}
