//! I/O hints: visiting the pages a device just filled before the scan comes
//! round.

use std::collections::{BTreeSet, VecDeque};

use super::*;

/// Hinted pages without a partner yet, by group and content hash, kept
/// across passes (the unstable index forgets every pass) so that a second
/// VM's read of the same file finds the first's pages; the oldest go first
/// beyond [`HINT_INDEX_CAP`].
#[derive(Debug, Default)]
pub(super) struct HintIndex {
    /// `group << 32 | hash` -> page id.
    pages: HashMap<u64, u32>,
    /// The keys of `pages`, oldest first.
    fifo: VecDeque<u64>,
}

impl HintIndex {
    fn key(group: u32, hash: u32) -> u64 {
        (group as u64) << 32 | hash as u64
    }

    /// Remembers page `gid` for its content, in place of the page known
    /// for it (the newer is likelier still unchanged); the content keeps
    /// its place in the queue.
    fn remember(&mut self, group: u32, hash: u32, gid: u32) {
        let key = Self::key(group, hash);
        if self.pages.insert(key, gid).is_none() {
            self.fifo.push_back(key);
            while self.fifo.len() > HINT_INDEX_CAP {
                if let Some(old) = self.fifo.pop_front() {
                    self.pages.remove(&old);
                }
            }
        }
    }

    /// The page remembered for this content, if any.
    fn get(&self, group: u32, hash: u32) -> Option<u32> {
        self.pages.get(&Self::key(group, hash)).copied()
    }
}

/// Merges made on hinted visits, and how long after the device filled
/// their pages they came.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HintTally {
    merges: u64,
    /// Sum over those merges of their delays, in seconds.
    delay_sum: f64,
}

impl HintTally {
    /// `merged` merges, `age` seconds after the fill on average.
    fn add(&mut self, merged: u64, age: f64) {
        self.merges += merged;
        self.delay_sum += merged as f64 * age;
    }

    pub(super) fn merges(&self) -> u64 {
        self.merges
    }

    /// The mean delay in milliseconds (0 without merges).
    pub(super) fn mean_delay_ms(&self) -> f64 {
        if self.merges == 0 {
            return 0.0;
        }
        self.delay_sum * 1e3 / self.merges as f64
    }
}

/// Most merges a wake-up's hint visits plan before they run them: a span's
/// worth, so that they run in steps no longer than a span's.
const HINT_PLAN_MAX: usize = SPAN_PAGES;

impl Core {
    /// Visits device-filled ranges first (I/O hints), within `pages_to_visit` page
    /// visits, from the front of `hints`; what the visits did not reach is
    /// left in `hints` (the rest of a range included). Ranges outside the
    /// regions (or in KSM's) are dropped.
    ///
    /// Returns what the visit did (merges and first-time hashes), which
    /// counts towards the wake-up's pace like the scan's own.
    pub fn run_hints(&mut self, hints: &mut Vec<Hint>, pages_to_visit: u64) -> BatchReport {
        let before = self.merges_done();
        let fresh_before = self.fresh_hashed;
        let mut visit_units = pages_to_visit.saturating_mul(HASH_COST);
        let mut done = 0;
        // The merges of the ranges are planned first (`pending`) and
        // executed together, up to `HINT_PLAN_MAX` at a time: each batch
        // parks the VMs' vCPUs, and a wake-up's hints are many small
        // ranges (one per virtio request), and a park per range would cost
        // more engine CPU than the hints save.
        let mut pending: Vec<Op> = Vec::new();
        let mut visited: Vec<HintVisit> = Vec::new();
        // The pages of `pending`'s ops, by (region, page).
        let mut pending_pages: BTreeSet<(usize, usize)> = BTreeSet::new();
        while done < hints.len() && visit_units > 0 {
            let h = hints[done];
            let Some(ri) = self.regions.iter().position(|r| r.contains(h.addr)) else {
                done += 1;
                continue;
            };
            let (first, end) = self.regions[ri].pages_of(h.addr, h.len);
            // The device wrote them (KVM's log sees guest writes only): if
            // this visit does not reach them all, the scan's will. KSM's
            // region keeps its marks for when the engine takes it back:
            // unmarked, a page a device rewrote there would pass for
            // unchanged (`log_clean`), and a merged one for still shared.
            if let Some(w) = self.regions[ri].written.as_mut() {
                w.mark(first, end);
            }
            if self.regions[ri].assisted {
                done += 1;
                continue;
            }
            let revisits = visited
                .iter()
                .any(|v| v.region == ri && v.first < end && first < v.end);
            if revisits || pending_pages.range((ri, first)..(ri, end)).next().is_some() {
                // A page read again in this wake-up, or a page an earlier
                // range planned a merge for (an unstable partner of one of
                // its pages, anywhere in any region): what is planned runs
                // first, so the page is seen as it then is. Visited with
                // its merge still planned, its provisional MERGED state
                // would meet a pagemap entry of a private page and be
                // taken for a copy-on-write break (its pool reference
                // dropped, then counted again by the merge).
                self.flush_hint_ops(&mut visited, &mut pending);
                pending_pages.clear();
            }
            let mut planned = pending.len();
            let mut from = first;
            let mut p = first;
            while p < end && visit_units > 0 {
                let n = (end - p).min(SPAN_PAGES);
                let keep = Planned::Keep(&mut pending);
                p += self.scan_span(ri, p, n, &mut visit_units, VisitMode::Hinted, keep);
                if pending.len() >= HINT_PLAN_MAX && p < end {
                    // A long range (adjacent requests queue as one): its
                    // part so far runs now, like a plan of many ranges.
                    visited.push(HintVisit {
                        region: ri,
                        first: from,
                        end: p,
                        planned: pending.len() - planned,
                        at: h.at,
                    });
                    self.flush_hint_ops(&mut visited, &mut pending);
                    pending_pages.clear();
                    (planned, from) = (0, p);
                    if self.should_stop() {
                        break;
                    }
                }
            }
            pending_pages.extend(pending[planned..].iter().map(|o| (o.region, o.page)));
            visited.push(HintVisit {
                region: ri,
                first: from,
                end: p,
                planned: pending.len() - planned,
                at: h.at,
            });
            if p < end {
                let addr = self.regions[ri].page_addr(p);
                hints[done].len = h.addr + h.len - addr;
                hints[done].addr = addr;
                break;
            }
            done += 1;
            if pending.len() >= HINT_PLAN_MAX {
                // As large a plan as one span's: its execution is one step
                // of bounded length, after which a waiter or the wake-up's
                // deadline can end the visits. Planning is cheap, running
                // the merges is not: a guest reading a file that another
                // guest holds plans a merge for nearly every hinted page.
                self.flush_hint_ops(&mut visited, &mut pending);
                pending_pages.clear();
            }
            if self.should_stop() {
                // Someone waits for the core (a VM coming or going), or the
                // wake-up's time is up: the ranges left stay first in line
                // for the next wake-up.
                break;
            }
        }
        self.flush_hint_ops(&mut visited, &mut pending);
        hints.drain(..done);
        BatchReport {
            merges: self.merges_done() - before,
            fresh: self.fresh_hashed - fresh_before,
            ..BatchReport::default()
        }
    }

    /// Executes the merges planned by hint visits so far, counts them (and
    /// their delay since the device filled the pages: the ranges' planned
    /// ops weigh their ages), and judges the groups for the KSM assist.
    pub(super) fn flush_hint_ops(&mut self, visited: &mut Vec<HintVisit>, pending: &mut Vec<Op>) {
        let ops = std::mem::take(pending);
        let before = self.merges_done();
        self.execute_planned(ops);
        let merged = self.merges_done() - before;
        let planned: usize = visited.iter().map(|v| v.planned).sum();
        if merged > 0 && planned > 0 {
            let age: f64 = visited
                .iter()
                .map(|v| v.planned as f64 * v.at.elapsed().as_secs_f64())
                .sum::<f64>()
                / planned as f64;
            self.hint_tally.add(merged, age);
        }
        let groups = visited
            .iter()
            .map(|v| self.regions[v.region].group)
            .collect();
        self.judge_groups(groups);
        visited.clear();
    }

    /// Remembers a hinted page that found no partner.
    pub(super) fn remember_hinted(&mut self, group: u32, h: u32, gid: u32) {
        self.hint_index.remember(group, h, gid);
    }

    /// A hinted page from an earlier pass with this content, still HASHED
    /// with the same hash (its content compared with `page`'s; for `None`
    /// not compared: `visit_clean`'s question, as for `unstable_partner`).
    pub(super) fn hinted_partner(
        &self,
        ri: usize,
        p: usize,
        h: u32,
        group: u32,
        page: Option<&GuestPage>,
    ) -> Option<u32> {
        let gid = self.hint_index.get(group, h)?;
        let me = self.regions[ri].gid_base + p as u32;
        let (r, pp) = self.locate(gid)?;
        let rg = &self.regions[r];
        let ok = gid != me
            && !rg.assisted
            && rg.group == group
            && region::kind(rg.state[pp]) == HASHED
            && rg.word[pp] == h
            // SAFETY: registered regions are mapped, and stay so while we
            // hold the core (unregister needs it).
            && page.is_none_or(|page| unsafe { rg.guest_page(pp) }.equals(page.bytes()));
        ok.then_some(gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PAGE_SIZE;

    #[test]
    fn the_hint_index_keeps_the_newest_page_and_forgets_the_oldest_content() {
        let mut ix = HintIndex::default();
        ix.remember(1, 7, 100);
        ix.remember(1, 7, 200);
        assert_eq!(ix.get(1, 7), Some(200), "the newer page replaces");
        assert_eq!(ix.fifo.len(), 1, "one content, queued once");
        assert_eq!(ix.get(2, 7), None, "groups are apart");
        for h in 0..HINT_INDEX_CAP as u32 {
            ix.remember(3, h, h);
        }
        assert_eq!(ix.get(1, 7), None, "the oldest went first");
        assert_eq!(ix.get(3, 0), Some(0));
        assert_eq!(ix.pages.len(), HINT_INDEX_CAP);
        assert_eq!(ix.fifo.len(), HINT_INDEX_CAP);
    }

    #[test]
    fn the_tally_weighs_delays_by_merges() {
        let mut t = HintTally::default();
        assert_eq!(t.mean_delay_ms(), 0.0);
        t.add(3, 0.010);
        t.add(1, 0.050);
        assert_eq!(t.merges(), 4);
        assert!((t.mean_delay_ms() - 20.0).abs() < 1e-9);
    }

    /// A device's write into a region handed to KSM is marked in its write
    /// log like anywhere else: the region keeps its marks for when the
    /// engine takes it back, and a page rewritten there unmarked would
    /// pass for unchanged (`log_clean`), a merged one for still shared.
    #[test]
    fn a_hint_into_ksms_region_marks_the_pages_written() {
        const N: usize = 64;
        let len = N * PAGE_SIZE;
        let ptr = crate::mm::map_anon(len).unwrap();
        let mem = ptr as usize;
        let mut core = Core::driven(1 << 26).unwrap();
        // SAFETY: the test's own private anonymous mapping, unmapped only
        // after the unregister below.
        let id = unsafe { core.register(mem, len, "a".into(), "g".into()) }.unwrap();
        let log = Arc::new(crate::writelog::RecordedWrites::default());
        core.set_write_log(id, Some(log));
        // The first pass examines every page: no mark is left.
        core.run_passes(1);
        let marked = |core: &Core| {
            let w = core.regions[0].written.as_ref().unwrap();
            (0..N).filter(|&p| w.get(p)).collect::<Vec<_>>()
        };
        assert_eq!(marked(&core), Vec::<usize>::new());
        core.hand_to_ksm(0);
        let mut hints = vec![Hint {
            addr: mem + 5 * PAGE_SIZE,
            len: 3 * PAGE_SIZE,
            at: Instant::now(),
        }];
        core.run_hints(&mut hints, 1 << 20);
        assert!(hints.is_empty());
        assert_eq!(marked(&core), vec![5, 6, 7]);
        // SAFETY: with unmerge the region keeps its content.
        unsafe { core.unregister(id, true) }.unwrap();
        // SAFETY: the test's own mapping, no longer registered or used.
        unsafe { crate::mm::unmap(ptr, len) };
    }
}
