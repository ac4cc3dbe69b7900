//! Write logs: which pages guests wrote since the scan last looked.

use super::*;

impl Core {
    /// Gives region `id` a write log (`None` takes it away). Every page
    /// starts as written: the first visits examine them in full.
    pub fn set_write_log(&mut self, id: RegionId, log: Option<Arc<dyn WriteLog>>) {
        if let Some(r) = self.regions.iter_mut().find(|r| r.id == id) {
            r.written = log.map(|l| Written::new(l, r.npages));
        }
    }

    /// Marks host ranges written by a device (hints the engine did not
    /// visit: dropped, or received while not merging).
    pub fn mark_written(&mut self, hints: &[Hint]) {
        for h in hints {
            if let Some(r) = self.regions.iter_mut().find(|r| r.contains(h.addr)) {
                let (first, end) = r.pages_of(h.addr, h.len);
                if let Some(w) = r.written.as_mut() {
                    w.mark(first, end);
                }
            }
        }
    }

    /// Marks every page of every logged region written (device writes
    /// whose ranges were lost).
    pub fn mark_all_written(&mut self) {
        for r in &mut self.regions {
            if let Some(w) = r.written.as_mut() {
                w.mark_all();
            }
        }
    }

    /// Collects the write logs when `log_interval` has passed since the
    /// last collection, and moves on the pages queued for a second look:
    /// a page written since the collection before its visit shows in this
    /// one and leaves the queue (the scan's next pass looks at it); one
    /// that stayed unwritten for the settle time (`settle.rs`; at least
    /// one interval) is due (`run_rechecks`); the others wait for the next
    /// collection.
    pub(super) fn collect_write_logs_when_due(&mut self) {
        if self
            .last_collect
            .is_some_and(|t| t.elapsed() < self.log_interval)
        {
            return;
        }
        self.collect_write_logs();
        self.last_collect = Some(Instant::now());
        self.judge_settle();
        let need = self.settle.intervals(self.log_interval);
        let (regions, due) = (&self.regions, &mut self.recheck_due);
        self.recheck.retain_mut(|(gid, waited)| {
            let Some((ri, p)) = locate_in(regions, *gid) else {
                return false;
            };
            let r = &regions[ri];
            let unwritten = r.written.as_ref().is_some_and(|w| !w.get(p));
            if region::kind(r.state[p]) != HASHED || !unwritten {
                return false;
            }
            *waited += 1;
            if *waited >= need {
                due.push(*gid);
                return false;
            }
            true
        });
    }

    /// Adds what each region's write log recorded since the last
    /// collection, and takes back at once the shares those writes broke
    /// (`take_back_written_shares`); a log that fails is dropped (the
    /// region is then read in full).
    fn collect_write_logs(&mut self) {
        let recent: std::collections::HashSet<u32> = self.merged_since_collect.drain(..).collect();
        let mut written_shares = Vec::new();
        for (ri, r) in self.regions.iter_mut().enumerate() {
            // KSM's region (the assist) is left uncollected: its marks wait
            // for the take-back anyway (a census span keeps them), and the
            // log holds every write until its next collection, the first
            // after the take-back. Each collection of KVM's log also
            // write-protects every page written since the one before, and
            // the guests' next write to each faults: once a second through
            // an assisted Linux build, for marks nobody read.
            if r.assisted {
                continue;
            }
            let (state, base) = (&r.state, r.gid_base);
            if let Some(w) = r.written.as_mut() {
                let seen = w.collect_with(|p| {
                    if matches!(region::kind(state[p]), MERGED | ZERO)
                        && !recent.contains(&(base + p as u32))
                    {
                        written_shares.push((ri, p));
                    }
                });
                if let Err(e) = seen {
                    log::warn!("{} ({:?}): {e}; reading pagemap instead", r.owner, r.id);
                    r.written = None;
                }
            }
        }
        self.take_back_written_shares(&written_shares);
    }

    /// Merged and zero-dropped pages (region index, page) that a write log
    /// saw written since the previous collection, each merged before it:
    /// each one's pagemap entry says, as at a visit (`check_merged`,
    /// `check_zero`), whether the write gave it a private copy, and such a
    /// share is taken back now, not at the scan's next visit, a pass (up to
    /// the settle time) later. The settle time (`settle.rs`) sees the
    /// guests undoing merges within a collection, and the statistics count
    /// the breaks within a second. Pages merged since the previous
    /// collection are not among them (the write may predate the merge,
    /// whose compare saw it): their visit tells.
    fn take_back_written_shares(&mut self, pages: &[(usize, usize)]) {
        let mut freed = Vec::new();
        for &(ri, p) in pages {
            let mut e = [Entry(0)];
            if let Err(err) = self.pagemap.read(self.regions[ri].page_addr(p), &mut e) {
                log::debug!("{err}");
                continue;
            }
            match region::kind(self.regions[ri].state[p]) {
                MERGED if span::copied_on_write(e[0]) => self.break_share(ri, p, &mut freed),
                ZERO => self.check_zero(ri, p, e[0]),
                _ => {}
            }
        }
        self.release_slots(&freed);
    }

    /// Does region `ri`'s write log say page `p` needs a full look (written
    /// since it was last examined, or its periodic check is due)? False
    /// without a log (the smart-scan schedule alone decides then).
    pub(super) fn log_marks(&self, ri: usize, p: usize) -> bool {
        self.regions[ri].written.as_ref().is_some_and(|w| {
            w.get(p) || (self.counters.passes + (p / VERIFY_BLOCK) as u64) % VERIFY_PASSES == 0
        })
    }

    /// Can the write log answer this due visit of page `p` (kind MERGED,
    /// ZERO or HASHED without `REHASH`) without pagemap or hashing?
    /// Never on a hinted visit: a device wrote the page, which KVM's log
    /// does not see.
    pub(super) fn log_clean(&self, ri: usize, p: usize, st: u8, mode: VisitMode) -> bool {
        let r = &self.regions[ri];
        r.written.is_some()
            && !mode.hinted()
            && !r.assisted
            && !self.log_marks(ri, p)
            && match region::kind(st) {
                MERGED | ZERO => true,
                HASHED => !region::needs_rehash(st),
                // Level > 0: found absent at its last visit (`visit`).
                _ => region::level(st) > 0 && !region::needs_rehash(st),
            }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::writelog::WriteLogError;
    use crate::{RecordedWrites, PAGE_SIZE};

    /// [`RecordedWrites`] that counts its collections.
    #[derive(Default)]
    struct Counted {
        writes: RecordedWrites,
        collections: AtomicUsize,
    }

    impl WriteLog for Counted {
        fn collect(&self, bits: &mut [u64]) -> Result<(), WriteLogError> {
            self.collections.fetch_add(1, Ordering::Relaxed);
            self.writes.collect(bits)
        }
    }

    #[test]
    fn ksms_region_is_not_collected_and_its_writes_come_after_the_take_back() {
        let len = 64 * PAGE_SIZE;
        let ptr = crate::mm::map_anon(len).unwrap();
        let mut core = Core::driven(1 << 26).unwrap();
        // SAFETY: `ptr..+len` is the test's own private anonymous mapping,
        // unmapped only after the unregister below.
        unsafe { core.register(ptr as usize, len, "a".into(), "g".into()) }.unwrap();
        let log = Arc::new(Counted::default());
        core.set_write_log(core.regions[0].id, Some(log.clone()));
        core.collect_write_logs();
        assert_eq!(log.collections.load(Ordering::Relaxed), 1);
        core.regions[0].written.as_mut().unwrap().clear_range(0, 64);

        core.hand_to_ksm(0);
        assert!(core.regions[0].assisted);
        log.writes.record(5);
        core.collect_write_logs();
        core.collect_write_logs();
        assert_eq!(
            log.collections.load(Ordering::Relaxed),
            1,
            "KSM's region was collected"
        );

        assert!(core.take_from_ksm(0));
        core.collect_write_logs();
        assert_eq!(log.collections.load(Ordering::Relaxed), 2);
        let w = core.regions[0].written.as_ref().unwrap();
        assert!(w.get(5), "the write made while KSM had the region is lost");
        assert!(!w.get(6));
        // SAFETY: with unmerge the region keeps its content.
        unsafe { core.unregister(core.regions[0].id, true) }.unwrap();
        // SAFETY: the test's own mapping, no longer registered or used.
        unsafe { crate::mm::unmap(ptr, len) };
    }
}
