//! A span of the scan: one pagemap read for the pages that need it, then each
//! page's visit.

use super::*;

/// Where the merges a span plans go.
pub(super) enum Planned<'a> {
    /// Executed at the end of the span: the scan's spans.
    Run,
    /// Appended here, for the caller to execute: a hint visit plans the
    /// merges of all of a wake-up's ranges first and runs them together,
    /// under one park of the vCPUs instead of one per range.
    Keep(&'a mut Vec<Op>),
}

impl Core {
    /// Scans pages `start..start+n` of region `ri`; returns pages consumed.
    pub(super) fn scan_span(
        &mut self,
        ri: usize,
        start: usize,
        n: usize,
        visit_units: &mut u64,
        mode: VisitMode,
        planned: Planned<'_>,
    ) -> usize {
        if self.regions[ri].assisted && !self.census.due() {
            // KSM's region: the engine only counts KSM's sharing and notices
            // copy-on-write breaks of its own earlier merges there, both on
            // census passes (pagemap walks of 100k+ VMAs are not free).
            return n;
        }
        if !self.regions[ri].assisted {
            return self.scan_span_inner(ri, start, n, visit_units, mode, planned);
        }
        // A census span is a pagemap read and a frame list, not a scan: it
        // is paced by time (`CENSUS_SLICE` per batch, a pass every second
        // or two), not by `pages_to_scan`: charged by visit units, a census
        // at an idle engine's slow wake-ups would take many seconds, and
        // the sharing KSM reached would go unreported all that while.
        let t = Instant::now();
        let mut units = n as u64 * HASH_COST;
        let used = self.scan_span_inner(ri, start, n, &mut units, mode, planned);
        self.census.charge(t.elapsed());
        used
    }

    /// `scan_span`'s work: `read_needed`, then each page's visit by kind,
    /// then the span's planned merges (executed here, or kept for the
    /// caller: `planned`).
    pub(super) fn scan_span_inner(
        &mut self,
        ri: usize,
        start: usize,
        n: usize,
        visit_units: &mut u64,
        mode: VisitMode,
        planned: Planned<'_>,
    ) -> usize {
        let mut entries = std::mem::take(&mut self.scratch);
        if entries.len() < n {
            entries.resize(n, Entry(0));
        }
        if let Err(e) = self.read_needed(ri, start, &mut entries[..n], mode) {
            log::warn!("{e}");
            self.scratch = entries;
            return n;
        }
        let mut ops: Vec<Op> = Vec::new();
        let mut freed: Vec<u32> = Vec::new();
        let mut prev: Option<u32> =
            if start > 0 && region::kind(self.regions[ri].state[start - 1]) == MERGED {
                Some(self.regions[ri].word[start - 1])
            } else {
                None
            };
        let mut used = 0;
        if start == 0 {
            self.run.note(None);
        }
        while used < n && *visit_units > 0 {
            if ops.len() >= OPS_BEFORE_YIELD && self.should_stop() {
                // Someone waits for the core, or the wake-up's time is up:
                // the span ends here, its merges run, and the batch yields
                // (the cursor goes on from here).
                break;
            }
            let p = start + used;
            let e = entries[used];
            used += 1;
            if let Some(&ahead) = self.regions[ri].state.get(p + PREFETCH_AHEAD) {
                if region::kind(ahead) == MERGED {
                    self.pool
                        .prefetch_meta(self.regions[ri].word[p + PREFETCH_AHEAD]);
                }
            }
            let st = self.regions[ri].state[p];
            let v = PageVisit {
                ri,
                p,
                st,
                prev,
                mode,
            };
            match region::kind(st) {
                MERGED => {
                    *visit_units -= 1;
                    prev = self.check_merged(v, e, visit_units, &mut ops, &mut freed);
                    continue;
                }
                ZERO => {
                    *visit_units -= 1;
                    prev = None;
                    self.note_run(None);
                    self.check_zero(ri, p, e);
                    continue;
                }
                _ => {}
            }
            if self.regions[ri].assisted {
                // KSM's page: pagemap only, and its frame for the census.
                *visit_units -= 1;
                prev = None;
                self.note_run(None);
                self.census_page(ri, e);
                continue;
            }
            prev = self.visit(v, e, visit_units, &mut ops);
        }
        // Every page visited here that its write log marked was examined
        // (marked pages are due and not `log_clean`): its mark is spent. A
        // census span of KSM's region examines no content: its marks stay
        // for when the engine takes the region back.
        let census = self.regions[ri].assisted;
        if let Some(w) = self.regions[ri].written.as_mut().filter(|_| !census) {
            w.clear_range(start, start + used);
        }
        self.scratch = entries;
        self.end_span(ri, mode, ops, freed, planned);
        used
    }

    /// A span's planned merges run (or go to the caller, who executes them
    /// and judges the group for the KSM assist, which must not meet planned
    /// ops), and the slots it freed are released.
    fn end_span(
        &mut self,
        ri: usize,
        mode: VisitMode,
        mut ops: Vec<Op>,
        mut freed: Vec<u32>,
        planned: Planned<'_>,
    ) {
        let kept = match planned {
            Planned::Keep(to) => {
                to.append(&mut ops);
                true
            }
            Planned::Run => {
                if !ops.is_empty() {
                    self.execute(ops, &mut freed);
                }
                false
            }
        };
        self.release_slots(&freed);
        if mode.merges() && !kept {
            let group = self.regions[ri].group;
            self.maybe_assist(group);
        }
    }

    /// A merged page's visit: still merged, or its share broken by
    /// copy-on-write (its slot reference dropped, into `freed` when it was
    /// the last). Returns the next page's `prev`.
    fn check_merged(
        &mut self,
        v: PageVisit,
        e: Entry,
        visit_units: &mut u64,
        ops: &mut Vec<Op>,
        freed: &mut Vec<u32>,
    ) -> Option<u32> {
        let (ri, p, st) = (v.ri, v.p, v.st);
        if e.0 & NOT_DUE != 0 {
            // Checked on its own smart-scan schedule; its pagemap entry was
            // not read.
            let s = self.regions[ri].word[p];
            self.note_run(Some(self.pool.meta(s).hash));
            return Some(s);
        }
        // Not written since it was merged or last checked (`log_clean`):
        // still merged, its entry was not read.
        let clean = e.0 & CLEAN != 0;
        if clean || !copied_on_write(e) {
            self.counters.clean_visits += u64::from(clean);
            let r = &mut self.regions[ri];
            let s = r.word[p];
            r.state[p] = region::with_level(st, region::level(st) + 1);
            self.note_run(Some(self.pool.meta(s).hash));
            return Some(s);
        }
        self.break_share(ri, p, freed);
        self.note_run(None);
        if !v.mode.hinted() || self.regions[ri].assisted {
            return None;
        }
        // A device refilled it: a candidate right away.
        let st = self.regions[ri].state[p];
        self.visit(
            PageVisit {
                st,
                prev: None,
                ..v
            },
            e,
            visit_units,
            ops,
        )
    }

    /// Merged page `p` of region `ri` has a private copy now (copy-on-write
    /// broke its share): hashed at its next visit (level 0), not seeded by
    /// a run (`REHASH`, see `SEED_RUN`), its slot reference dropped (into
    /// `freed` when it was the last).
    pub(super) fn break_share(&mut self, ri: usize, p: usize, freed: &mut Vec<u32>) {
        let r = &mut self.regions[ri];
        let s = r.word[p];
        r.set_kind(p, NEW);
        let origin = region::origin(r.state[p]);
        r.state[p] = region::with_level(r.state[p], 0) | region::REHASH;
        r.cow_breaks += 1;
        *self.counters.origins.cow_breaks.at_mut(origin.index()) += 1;
        if origin != region::Origin::Hinted {
            self.settle
                .note_break(r.epoch[p], origin == region::Origin::SecondLook);
        }
        if drop_mapper(&mut self.pool, &mut self.stable, s) == 0 {
            freed.push(s);
        }
    }

    /// A zero-dropped page's visit: present and not the zero page means the
    /// guest wrote it (a copy-on-write break of the zero page).
    pub(super) fn check_zero(&mut self, ri: usize, p: usize, e: Entry) {
        if e.0 & CLEAN != 0 {
            self.counters.clean_visits += 1;
        } else if e.present() && (self.zero_pfn == 0 || e.pfn() != self.zero_pfn) {
            let r = &mut self.regions[ri];
            r.set_kind(p, NEW);
            let origin = region::origin(r.state[p]);
            r.state[p] = region::with_level(r.state[p], 0);
            r.cow_breaks += 1;
            *self.counters.origins.cow_breaks.at_mut(origin.index()) += 1;
            if origin != region::Origin::Hinted {
                self.settle
                    .note_break(r.epoch[p], origin == region::Origin::SecondLook);
                self.settle.note_zero_refill();
            }
            self.counters.origins.zero_refills += 1;
        }
    }

    /// A page of KSM's region, on a census pass: its frame, when present
    /// and anonymous.
    fn census_page(&mut self, ri: usize, e: Entry) {
        if self.census.due() && e.present() && !e.file() && e.pfn() != 0 && e.pfn() != self.zero_pfn
        {
            let key = self.regions[ri].gid_base;
            self.census.note_frame(e.pfn(), key);
        }
    }

    /// Is an unmerged page due for a visit on this pass (smart scan)? A
    /// HASHED page at level L is hashed once every 2^L passes; a NEW page
    /// that keeps being absent (guest RAM never touched) rises a level per
    /// absent visit the same way, so untouched memory costs a pagemap
    /// entry once every 2^MAX_LEVEL passes. ZERO pages, and every page of
    /// a hinted visit, are always due.
    pub(super) fn visit_due(&self, ri: usize, p: usize, st: u8, mode: VisitMode) -> bool {
        !matches!(region::kind(st), HASHED | NEW)
            || mode.hinted()
            || self.log_marks(ri, p)
            || region::due(
                self.counters.passes,
                region::level(st),
                self.regions[ri].word[p],
            )
    }

    /// Is a MERGED page due for its copy-on-write check on this pass? A
    /// share that stays intact is checked less often (level L: once every
    /// 2^L passes, L up to `MAX_LEVEL`), as unique pages are hashed less
    /// often: each check is a pagemap walk over the page's own VMA (one per
    /// scattered merge), the largest part of the engine's CPU when
    /// guests' merges are scattered. A broken share is noticed at most
    /// 2^MAX_LEVEL passes late; until then the pool keeps the page's
    /// reference (the guest's new copy is already its own).
    pub(super) fn merged_due(&self, ri: usize, p: usize, st: u8, mode: VisitMode) -> bool {
        mode.hinted()
            || self.regions[ri].assisted
            || self.log_marks(ri, p)
            || region::due(
                self.counters.passes,
                region::level(st),
                self.regions[ri].word[p],
            )
    }

    /// Fills `out` with the pagemap entries of pages `start..` of region
    /// `ri` that this pass needs (zero pages, new and hashed pages due for
    /// a visit, merged pages due for their copy-on-write check), each
    /// marked `DUE` or `NOT_DUE`; a page not due, or due but answered by
    /// its write log, gets no entry (absent) and is not looked at. Reads
    /// runs of needed pages, bridging gaps of up to `READ_GAP` pages: a
    /// pagemap read walks every VMA it covers, and a scattered merge is a
    /// VMA.
    pub(super) fn read_needed(
        &self,
        ri: usize,
        start: usize,
        out: &mut [Entry],
        mode: VisitMode,
    ) -> Result<(), crate::pagemap::PagemapError> {
        const READ_GAP: usize = 8;
        let r = &self.regions[ri];
        if r.assisted {
            // A census pass: every frame counts.
            return self.pagemap.read(r.page_addr(start), out);
        }
        let n = out.len();
        debug_assert!(n <= SPAN_PAGES);
        // Each page is judged once (smart-scan schedule, write log); the
        // span's loop and `visit` take the verdict from the entry's marker
        // instead of judging again: the judgement, with the checks of the
        // log, is a visible part of the engine's CPU.
        let mut read = [0u64; SPAN_PAGES / 64];
        let mut not_due = [0u64; SPAN_PAGES / 64];
        let mut clean = [0u64; SPAN_PAGES / 64];
        for (i, e) in out.iter_mut().enumerate() {
            let p = start + i;
            let st = r.state[p];
            let due = match region::kind(st) {
                MERGED => self.merged_due(ri, p, st, mode),
                HASHED | NEW => self.visit_due(ri, p, st, mode),
                _ => true,
            };
            *e = if !due {
                not_due[i / 64] |= 1 << (i % 64);
                Entry(NOT_DUE)
            } else if !mode.hinted()
                && matches!(region::kind(st), HASHED | NEW)
                && r.written.as_ref().is_some_and(|w| w.recorded(p))
            {
                // An unmerged page its log saw written is mapped, private
                // and anonymous (`Written::recorded`): the visit only needs
                // to hash it. Written pages of a guest are scattered, so
                // each would be a pagemap read of its own, most of the
                // engine's reads while guests build. A merged or zero page
                // still gets its entry read: a write recorded before its
                // merge does not mean the share broke, and the slot's
                // mapper count depends on knowing that.
                Entry(PM_PRESENT | DUE)
            } else if self.log_clean(ri, p, st, mode) {
                // Nobody wrote it since it was last examined: the visit
                // knows its entry (see `log_clean`).
                clean[i / 64] |= 1 << (i % 64);
                Entry(DUE | CLEAN)
            } else {
                read[i / 64] |= 1 << (i % 64);
                Entry(DUE)
            };
        }
        let bit = |m: &[u64], i: usize| m[i / 64] & (1 << (i % 64)) != 0;
        let mut i = 0;
        while i < n {
            if !bit(&read, i) {
                i += 1;
                continue;
            }
            // A run from i: extend while a page to read follows within
            // READ_GAP pages.
            let mut end = i + 1;
            let mut gap = 0;
            let mut j = end;
            while j < n && gap <= READ_GAP {
                if bit(&read, j) {
                    end = j + 1;
                    gap = 0;
                } else {
                    gap += 1;
                }
                j += 1;
            }
            self.pagemap
                .read(r.page_addr(start + i), &mut out[i..end])?;
            // The read replaced the verdicts of the pages it covered.
            for (k, e) in out[i..end].iter_mut().enumerate() {
                e.0 |= if bit(&not_due, i + k) {
                    NOT_DUE
                } else if bit(&clean, i + k) {
                    DUE | CLEAN
                } else {
                    DUE
                };
            }
            i = end;
        }
        Ok(())
    }
}

/// Does a merged page's pagemap entry show a private copy (copy-on-write
/// broke its share)? Present and anonymous: a write fault copied the pool
/// page. Absent (merged, never touched since the `MAP_FIXED`) or present
/// and file-backed (the pool page itself) means still merged
/// (docs/merge-races.md §11).
pub(super) fn copied_on_write(e: Entry) -> bool {
    e.present() && !e.file()
}
