//! I/O hints: visiting the pages a device just filled before the scan comes
//! round.

use super::*;

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
        // The merges of every range are planned first and executed together
        // (`deferred`): each batch parks the VMs' vCPUs, and a wake-up's
        // hints are many small ranges (one per virtio request), and a park
        // per range would cost more engine CPU than the hints save.
        self.deferred = Some(Vec::new());
        let mut visited: Vec<HintVisit> = Vec::new();
        while done < hints.len() && visit_units > 0 {
            let h = hints[done];
            let Some(ri) = self.regions.iter().position(|r| r.contains(h.addr)) else {
                done += 1;
                continue;
            };
            let r = &self.regions[ri];
            if r.assisted {
                done += 1;
                continue;
            }
            let (first, end) = r.pages_of(h.addr, h.len);
            // The device wrote them (KVM's log sees guest writes only): if
            // this visit does not reach them all, the scan's will.
            if let Some(w) = self.regions[ri].written.as_mut() {
                w.mark(first, end);
            }
            if visited
                .iter()
                .any(|v| v.region == ri && v.first < end && first < v.end)
            {
                // A page read again in this wake-up: what is planned for it
                // runs first, so the page is seen as it then is.
                self.flush_hint_ops(&mut visited);
            }
            let planned = self.deferred.as_ref().map_or(0, Vec::len);
            let mut p = first;
            self.trusted = true;
            while p < end && visit_units > 0 {
                let n = (end - p).min(SPAN_PAGES);
                p += self.scan_span(ri, p, n, &mut visit_units, true);
            }
            self.trusted = false;
            let planned = self.deferred.as_ref().map_or(0, Vec::len) - planned;
            visited.push(HintVisit {
                region: ri,
                first,
                end: p,
                planned,
                at: h.at,
            });
            if p < end {
                let addr = self.regions[ri].page_addr(p);
                hints[done].len = h.addr + h.len - addr;
                hints[done].addr = addr;
                break;
            }
            done += 1;
            if self.someone_waits() {
                // Someone waits for the core (a VM coming or going): the
                // ranges left stay first in line for the next wake-up.
                break;
            }
        }
        self.flush_hint_ops(&mut visited);
        self.deferred = None;
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
    pub(super) fn flush_hint_ops(&mut self, visited: &mut Vec<HintVisit>) {
        let ops = self.deferred.replace(Vec::new()).unwrap_or_default();
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
            self.hint_merges += merged;
            self.hint_delay_sum += merged as f64 * age;
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
        let key = (group as u64) << 32 | h as u64;
        if self.hint_index.insert(key, gid).is_none() {
            self.hint_fifo.push_back(key);
            while self.hint_fifo.len() > HINT_INDEX_CAP {
                if let Some(old) = self.hint_fifo.pop_front() {
                    self.hint_index.remove(&old);
                }
            }
        }
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
        let key = (group as u64) << 32 | h as u64;
        let gid = *self.hint_index.get(&key)?;
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
