//! The visit of an unmerged page: hash (or not), the volatility rule, and the
//! shortcuts that join a slot without hashing.

use super::*;

/// What a visit may do: only keep checksums (auto mode's idle rounds),
/// merge, merge on a second look (`run_rechecks`: the write log says the
/// page stayed unwritten for a whole interval), or merge a page a device
/// just filled (an I/O hint: a merge candidate on its first visit, always
/// due, no write-log shortcut).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum VisitMode {
    Checksum,
    Merge,
    SecondLook,
    Hinted,
}

impl VisitMode {
    /// The mode of a wake-up's scan.
    pub(super) fn of_scan(merge: bool) -> Self {
        if merge {
            VisitMode::Merge
        } else {
            VisitMode::Checksum
        }
    }

    pub(super) fn merges(self) -> bool {
        self != VisitMode::Checksum
    }

    pub(super) fn hinted(self) -> bool {
        self == VisitMode::Hinted
    }

    /// A merge visit of the scan's kind (not hinted).
    pub(super) fn scans(self) -> bool {
        matches!(self, VisitMode::Merge | VisitMode::SecondLook)
    }

    /// The origin of a merge this visit makes of an unchanged page.
    pub(super) fn origin(self) -> Origin {
        match self {
            VisitMode::Hinted => Origin::Hinted,
            VisitMode::SecondLook => Origin::SecondLook,
            _ => Origin::Steady,
        }
    }
}

/// The page a visit is at and what the visit starts from.
#[derive(Clone, Copy, Debug)]
pub(super) struct PageVisit {
    /// The region's index and the page's number in it.
    pub(super) ri: usize,
    pub(super) p: usize,
    /// The page's state word before the visit.
    pub(super) st: u8,
    /// The slot the left neighbour maps or was just planned onto: a run
    /// continues onto the next slot (one VMA for the run).
    pub(super) prev: Option<u32>,
    pub(super) mode: VisitMode,
}

/// Where a visit stands after its cheap checks.
enum Look {
    /// Done without reading the page: the slot it was planned onto, if any.
    Done(Option<u32>),
    /// Present and anonymous: read it.
    Read,
}

/// A visited page's fresh hash and what it says.
struct Hashed {
    h: u32,
    /// Not seen before, and not the zero page's hash.
    first_sight: bool,
    /// A first-seen page continuing a run of one pattern (`SEED_RUN`).
    seeded: bool,
    /// A merge candidate: hash unchanged since the last visit (KSM's
    /// rule), or hinted (a device just filled it), or seeded.
    unchanged: bool,
}

impl Core {
    /// Visits page `v.p` of region `v.ri` (pagemap entry `e`): its checks,
    /// its hash, and where it merges. Returns the slot it was planned onto
    /// (the next page's `prev`).
    pub(super) fn visit(
        &mut self,
        v: PageVisit,
        e: Entry,
        visit_units: &mut u64,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let v = self.hardened_visit(v);
        if let Look::Done(planned) = self.look(v, e, visit_units, ops) {
            return planned;
        }
        let (ri, p) = (v.ri, v.p);
        let kind = region::kind(v.st);
        *visit_units = visit_units.saturating_sub(HASH_COST);
        // SAFETY: the region is registered, hence mapped (register contract),
        // and stays so while we hold the core (unregister needs it).
        let page = unsafe { self.regions[ri].guest_page(p) };
        // A hinted page was just rewritten: its stored hash is stale.
        let plain = v.mode.scans() && !region::needs_rehash(v.st);
        if kind == HASHED && plain {
            if let Some(s) = self.join_unhashed(v, &page, ops) {
                return Some(s);
            }
        }
        if kind == NEW && plain && self.settle.first_sight() {
            if let Some(s) = self.continue_run_unhashed(v, &page, ops) {
                return Some(s);
            }
        }
        let hv = self.hash_page(v, &page);
        if !hv.unchanged {
            return self.volatile_page(v, &hv, &page, ops);
        }
        if !v.mode.merges() {
            return None;
        }
        let st = self.regions[ri].state[p];
        // A hardened region's zero pages go to the pool like any content:
        // a page dropped to the zero page would take a different path on
        // its first write (a fresh page, no copy) than a merged one.
        if hv.h == self.zero_hash && !self.regions[ri].hardened() && page.is_zero() {
            if !v.mode.hinted() && !self.settle.zero_drops() {
                // The guests refill such drops: it waits (`Settle::zero_drops`).
                return None;
            }
            let in_pool = self.regions[ri].in_pool(p);
            ops.push(Op {
                region: ri,
                page: p,
                slot: 0,
                kind: OpKind::Zero,
                hash: hv.h,
                old_state: st,
                in_pool,
                origin: v.mode.origin(),
            });
            self.regions[ri].state[p] = region::with_kind(st, ZERO);
            return None;
        }
        let group = self.regions[ri].group;
        let prev = if hv.seeded {
            self.seed_run_head(v, hv.h, group, ops)
        } else {
            v.prev
        };
        let origin = if hv.seeded {
            Origin::FirstSight
        } else {
            v.mode.origin()
        };
        self.place(PageVisit { st, prev, ..v }, hv.h, group, &page, origin, ops)
    }

    /// The visit a hardened region's page gets (`Region::hardened`): only
    /// a page unchanged over two visits (hashed, its hash unchanged at its
    /// previous visit, and now, which `hash_page` checks) may merge, by
    /// the scan's own rule; any other visit only keeps its checksum. So no
    /// merge at first sight, of a run's pattern, on a second look or of a
    /// device-filled page: each of those merges pages a guest may write
    /// next, and every candidate, merged or not, costs its guest the same
    /// copy-on-write fault on its first write (`place`), so candidates
    /// must be pages the guest leaves alone.
    fn hardened_visit(&self, v: PageVisit) -> PageVisit {
        if !self.regions[v.ri].hardened() || !v.mode.merges() {
            return v;
        }
        let st = v.st;
        let idle = v.mode == VisitMode::Merge
            && region::kind(st) == HASHED
            && !region::is_volatile(st)
            && !region::needs_rehash(st);
        PageVisit {
            mode: if idle {
                VisitMode::Merge
            } else {
                VisitMode::Checksum
            },
            ..v
        }
    }

    /// A visit's checks before the page is read: not due on this pass
    /// (smart scan), answered by the write log (`visit_clean`), absent or
    /// the zero page.
    fn look(&mut self, v: PageVisit, e: Entry, visit_units: &mut u64, ops: &mut Vec<Op>) -> Look {
        let (ri, p, st) = (v.ri, v.p, v.st);
        let kind = region::kind(st);
        // A span's entry carries `read_needed`'s verdict; for other callers
        // (rechecks) it is judged here.
        let judged = e.0 & DUE != 0;
        let due = e.0 & NOT_DUE == 0 && (judged || self.visit_due(ri, p, st, v.mode));
        if !due {
            // Smart scan, pass-aligned (see `region::due`): identical pages
            // are hashed on the same passes, so they always meet. Its
            // pagemap entry was not read (`read_needed`).
            *visit_units -= 1;
            self.note_run((kind == HASHED).then(|| self.regions[ri].word[p]));
            return Look::Done(None);
        }
        let mut e = e;
        let clean = if judged {
            e.0 & CLEAN != 0
        } else {
            self.log_clean(ri, p, st, v.mode)
        };
        if clean && kind == NEW {
            // Found absent (or the zero page) when last examined and not
            // written since: still so. Its entry was not read (`Entry(0)`
            // below: absent).
            self.counters.clean_visits += 1;
        }
        if clean && kind == HASHED {
            // A hardened region's candidate is hashed and placed in full:
            // `place` moves it onto a pool page even without a twin.
            if !self.regions[ri].hardened() {
                if let Some(planned) = self.visit_clean(v, visit_units, ops) {
                    return Look::Done(planned);
                }
            }
            // A pair or a new slot needs a fresh hash: read the entry the
            // span skipped, and visit in full.
            let mut one = [Entry(0)];
            if let Err(err) = self.pagemap.read(self.regions[ri].page_addr(p), &mut one) {
                log::warn!("{err}");
                return Look::Done(None);
            }
            e = one[0];
        }
        if !self.own_page(e) {
            *visit_units -= 1;
            self.note_run(None);
            let r = &mut self.regions[ri];
            r.state[p] = if kind == HASHED {
                region::with_level(region::with_kind(st, NEW), 0)
            } else {
                // Still absent: looked at less often (`visit_due`).
                region::with_level(st, region::level(st) + 1)
            };
            return Look::Done(None);
        }
        Look::Read
    }

    /// Does pagemap entry `e` show a page of the guest's own, the only kind
    /// a visit reads: present and anonymous, not the shared zero page (an
    /// absent page or the zero page costs nothing to keep).
    pub(super) fn own_page(&self, e: Entry) -> bool {
        e.present() && !e.file() && (self.zero_pfn == 0 || e.pfn() != self.zero_pfn)
    }

    /// Hashes the page and records the hash in its state: first sight,
    /// unchanged or volatile.
    fn hash_page(&mut self, v: PageVisit, page: &GuestPage) -> Hashed {
        let (ri, p, st) = (v.ri, v.p, v.st);
        let kind = region::kind(st);
        self.counters.pages_hashed += 1;
        let h64 = (self.hash_fn)(page.bytes());
        let h = fold(h64);
        self.cur_hi = (h64 >> 32) as u32;
        self.note_run(Some(h));
        // KSM's volatility rule: only a page whose hash is unchanged since its
        // previous visit is a candidate. A page seen for the first time may
        // still join an existing pool slot at once (see `join_first_seen`).
        let first_sight = kind == NEW && h != self.zero_hash;
        // A page of a run of identical first-seen pages (a region filled
        // with one pattern) is a candidate at once: see `SEED_RUN`. Not
        // one whose share copy-on-write broke (`REHASH`): a guest that
        // rewrites a pattern soon after writing it would churn merges.
        let seeded = first_sight
            && v.mode.merges()
            && self.settle.first_sight()
            && self.run.len() >= SEED_RUN
            && !region::needs_rehash(st);
        let unchanged =
            (kind == HASHED && self.regions[ri].word[p] == h) || v.mode.hinted() || seeded;
        let r = &mut self.regions[ri];
        r.word[p] = h;
        r.state[p] &= !region::REHASH;
        if kind == NEW {
            r.set_kind(p, HASHED);
            self.pass_progress += 1;
            self.fresh_hashed += 1;
        }
        if !unchanged {
            r.set_volatile(p, true);
            r.state[p] = region::with_level(r.state[p], 0);
        } else {
            r.set_volatile(p, false);
        }
        Hashed {
            h,
            first_sight,
            seeded,
            unchanged,
        }
    }

    /// A page whose hash changed (or that is new): queued for a second look
    /// after the next collection where a write log can tell, and a
    /// first-seen page may still join an existing slot at once.
    fn volatile_page(
        &mut self,
        v: PageVisit,
        hv: &Hashed,
        page: &GuestPage,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p) = (v.ri, v.p);
        if v.mode.scans()
            && (!hv.first_sight || self.merges_scattered(self.regions[ri].group))
            && self.regions[ri].written.is_some()
            && self.settle.second_looks()
            && self.recheck.len() < RECHECK_CAP
        {
            // Its second look (KSM's rule) can come after the next
            // collection: the write log tells whether it stayed unwritten
            // for a whole `LOG_INTERVAL`. For a page seen for the first
            // time only where the group's merges are scattered anyway:
            // pairing first-sight pages a wake-up later paired two
            // filling guests' pages in the order their fill fronts met
            // the scan, a VMA each where the scan's order makes runs
            // (`bench ksm-seed --vms-only` shows the difference). Where
            // every merge is a VMA of its own whatever the order (guests
            // that place pages as real ones do), it brings the merge a
            // pass sooner: the pages a build writes last need not wait
            // for that pass.
            self.recheck.push((self.regions[ri].gid_base + p as u32, 0));
        }
        if hv.first_sight && v.mode.merges() && self.settle.first_sight() {
            return self.join_first_seen(v, hv.h, page, ops);
        }
        None
    }

    /// A pool slot for a hardened region's page with no twin (`place`):
    /// the slot after the left neighbour's (the run's VMA grows), else the
    /// page's own slot in its region's window (`crate::slots`: a region's
    /// idle pages then map consecutive offsets, and their VMAs merge),
    /// else any. None outside hardened regions, and when the pool is full
    /// or the VMA budget is short and the slot would not extend a run: the
    /// page then waits in the unstable index as any unique page does.
    fn own_slot(&mut self, v: PageVisit, h: u32, group: u32) -> Option<u32> {
        if !self.regions[v.ri].hardened() {
            return None;
        }
        let after_left = v
            .prev
            .map(|x| x.wrapping_add(1))
            .filter(|&x| self.pool.is_free(x));
        if after_left.is_none() && self.vmas.short() {
            return None;
        }
        let hint = after_left.or_else(|| {
            self.regions[v.ri]
                .slot_base
                .map(|b| b + v.p as u32)
                .filter(|&x| self.pool.is_free(x))
        });
        self.pool.reserve(hint, h, self.cur_hi, group).ok()
    }

    /// The head of a run of one pattern: the pages of the run visited
    /// before it was `SEED_RUN` long. KSM's rule leaves them volatile, so
    /// without this they would wait a whole pass while the rest of the run
    /// merged in this one, and convergence would take a second pass. When
    /// page `p` seeds the
    /// run, they are placed first, in order, as seeded pages (same stored
    /// hash `h` as the run, first seen this pass, not rewritten after a
    /// broken share: `REHASH`), so the run's stripe starts at its first
    /// page as it would have had the run been known there. Returns the
    /// left neighbour's slot for `p` (`prev` when there is no head). The
    /// final compare under write-protection decides every merge, as
    /// always.
    fn seed_run_head(
        &mut self,
        v: PageVisit,
        h: u32,
        group: u32,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p, prev) = (v.ri, v.p, v.prev);
        let head = |st: u8, word: u32| {
            region::kind(st) == HASHED
                && region::is_volatile(st)
                && word == h
                && region::level(st) == 0
                && !region::needs_rehash(st)
        };
        let r = &self.regions[ri];
        let mut start = p;
        while start > 0
            && p - start < SEED_RUN as usize
            && head(r.state[start - 1], r.word[start - 1])
        {
            start -= 1;
        }
        if start == p {
            return prev;
        }
        let mut prev =
            (start > 0 && region::kind(r.state[start - 1]) == MERGED).then(|| r.word[start - 1]);
        for q in start..p {
            self.regions[ri].set_volatile(q, false);
            let st = self.regions[ri].state[q];
            // SAFETY: as for `p` in `visit`: registered, hence mapped.
            let page = unsafe { self.regions[ri].guest_page(q) };
            let at = PageVisit {
                p: q,
                st,
                prev,
                ..v
            };
            prev = self.place(at, h, group, &page, Origin::FirstSight, ops);
        }
        prev
    }

    /// Where an unchanged page with hash `h` (state `st`) merges
    /// (`choose`), planned, by the rule `origin` (an unstable partner's
    /// too: the pair is this visit's doing); or into the unstable index.
    /// Returns its slot.
    fn place(
        &mut self,
        v: PageVisit,
        h: u32,
        group: u32,
        page: &GuestPage,
        origin: Origin,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p, st, prev) = (v.ri, v.p, v.st, v.prev);
        let target = self.choose(v, h, group, page);
        let mut plan = |core: &mut Core,
                        r: usize,
                        pg: usize,
                        slot: u32,
                        kind: OpKind,
                        hash: u32,
                        origin: Origin| {
            let m = Plan {
                ri: r,
                p: pg,
                slot,
                kind,
                hash,
                old_state: core.regions[r].state[pg],
                origin,
            };
            core.plan(m, ops);
        };
        let extends = |s: u32| prev.is_some_and(|x| x.wrapping_add(1) == s);
        match target {
            Some(Target::Existing(s)) => {
                self.note_planned(group, 1, u64::from(!extends(s)));
                plan(self, ri, p, s, OpKind::Existing, h, origin);
                Some(s)
            }
            Some(Target::New(s)) => {
                self.note_planned(group, 1, u64::from(!extends(s)));
                self.stable.insert(group, h, s);
                plan(self, ri, p, s, OpKind::New, h, origin);
                Some(s)
            }
            Some(Target::Pair(s, cr, cp)) => {
                let partner_extends = cp > 0
                    && region::kind(self.regions[cr].state[cp - 1]) == MERGED
                    && self.regions[cr].word[cp - 1].wrapping_add(1) == s;
                self.note_planned(
                    group,
                    2,
                    u64::from(!extends(s)) + u64::from(!partner_extends),
                );
                self.stable.insert(group, h, s);
                plan(self, ri, p, s, OpKind::New, h, origin);
                plan(self, cr, cp, s, OpKind::Existing, h, origin);
                Some(s)
            }
            None => {
                if let Some(s) = self.own_slot(v, h, group) {
                    // A hardened region's candidate with no twin: onto a
                    // pool page of its own, so that its first write is the
                    // copy-on-write fault a merged page's is. A twin that
                    // comes later joins it (stable index).
                    self.note_planned(group, 1, u64::from(!extends(s)));
                    self.stable.insert(group, h, s);
                    plan(self, ri, p, s, OpKind::New, h, origin);
                    return Some(s);
                }
                let gid = self.file_unique(ri, p, st, h);
                if self.fold_collides(group, h) {
                    // Hashed on its next visits too (`REHASH`): a join by
                    // its stored hash would take the colliding slot, fail
                    // its compare, and keep the page from ever meeting its
                    // twin in the unstable index (each would try that slot
                    // on the pass the other is filed).
                    self.regions[ri].state[p] |= region::REHASH;
                }
                if v.mode.hinted() {
                    self.remember_hinted(group, h, gid);
                }
                None
            }
        }
    }

    /// A due visit of a HASHED page that nobody wrote since its last hash
    /// (its write log says so): its stored hash is its hash now, so it is
    /// "unchanged since the previous scan" without hashing or a pagemap
    /// read. Takes what `visit` would with that hash when no fresh hash is
    /// needed: a plain join of an existing slot (`join_unhashed`), or no
    /// partner at all (into the unstable index, a level up). Returns None
    /// when `choose` might pair it, grow a stripe or find a stable slot
    /// `join_unhashed` would not take: those file a slot under the hash,
    /// which must then be fresh, so the caller visits in full.
    pub(super) fn visit_clean(
        &mut self,
        v: PageVisit,
        visit_units: &mut u64,
        ops: &mut Vec<Op>,
    ) -> Option<Option<u32>> {
        let (ri, p, st, prev, merge) = (v.ri, v.p, v.st, v.prev, v.mode.merges());
        let h = self.regions[ri].word[p];
        if merge && h == self.zero_hash {
            return None;
        }
        let planned = if !merge {
            // Checksum-only round: nothing to learn from hashing it.
            self.regions[ri].set_volatile(p, false);
            self.note_run(Some(h));
            None
        } else {
            // SAFETY: the region is registered, hence mapped (register
            // contract), and stays so while we hold the core (unregister
            // needs it).
            let page = unsafe { self.regions[ri].guest_page(p) };
            if let Some(s) = self.join_unhashed(v, &page, ops) {
                Some(s)
            } else {
                let group = self.regions[ri].group;
                // Any stripe `choose` might grow (whatever its length: the
                // check is conservative), a stable slot, a partner: a fresh
                // hash decides. A candidate partner (unstable or hinted) is
                // not compared here: the full visit's `choose` compares it,
                // and comparing it twice would double the engine's page
                // compares for such pages.
                if prev.is_some_and(|ps| self.stripe_continues(ps, h, group))
                    || self.known_partner(ri, p, h, group)
                    || self.hinted_partner(ri, p, h, group, None).is_some()
                {
                    return None;
                }
                self.note_run(Some(h));
                self.regions[ri].set_volatile(p, false);
                self.file_unique(ri, p, st, h);
                None
            }
        };
        *visit_units -= 1;
        self.counters.clean_visits += 1;
        Some(planned)
    }

    /// A candidate page with no partner this time (state `st` before the
    /// visit, content hash `h`): into the unstable index, a smart-scan
    /// level up (leaving level 0 counts as pass progress: the page just
    /// became stable). Returns its page id.
    pub(super) fn file_unique(&mut self, ri: usize, p: usize, st: u8, h: u32) -> u32 {
        let r = &mut self.regions[ri];
        let lvl = region::level(st);
        if lvl == 0 {
            self.pass_progress += 1;
        }
        r.state[p] = region::with_level(r.state[p], (lvl + 1).min(MAX_LEVEL));
        let gid = r.gid_base + p as u32;
        let _ = self.unstable.insert(h, gid);
        gid
    }

    /// Joins an existing pool slot without hashing the page: its stored hash
    /// (from its previous visit) looks the slot up exactly as `choose` would
    /// (the left neighbour's next slot, then the stable index), and only a
    /// plain join is taken; anything else (a new slot, a pair, no target)
    /// returns None and the page is hashed as usual. Sound because the final
    /// compare under write-protection decides every merge; if the page
    /// changed, that compare fails and the page gets `REHASH`, so its next
    /// visit hashes it (a stale hash is never retried). KSM's "unchanged
    /// since the previous scan" holds for a join that succeeds: the page
    /// then equals a slot filed under its stored hash. New pool slots are
    /// always made from a fresh hash (the stable index never files a slot
    /// under a wrong hash).
    pub(super) fn join_unhashed(
        &mut self,
        v: PageVisit,
        page: &GuestPage,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p) = (v.ri, v.p);
        let h = self.regions[ri].word[p];
        if h == self.zero_hash {
            return None;
        }
        let group = self.regions[ri].group;
        let run = self.run;
        self.note_run(Some(h));
        let Some(s) = self.existing_target(v, h, false, group, page) else {
            self.run = run;
            return None;
        };
        // Kept in `old_state`: restored with it if the merge fails.
        let old = self.regions[ri].state[p] | region::REHASH;
        // Its content now equals the slot's (the final compare), whose hash
        // is its stored one: unchanged since that visit, KSM's rule.
        self.plan(Plan::join(ri, p, s, h, old, v.mode.origin()), ops);
        Some(s)
    }

    /// A page seen for the first time (just hashed) joins an existing pool
    /// slot at once, if `choose` would make it a plain join (the left
    /// neighbour's next slot, or a stable-index slot with room): a new VM
    /// whose content the pool already holds merges in its first pass
    /// instead of its second, and its first pass hashes each page once.
    /// Pairs and new slots still wait for a page seen unchanged (KSM's
    /// volatility rule; runs of one pattern excepted, see `SEED_RUN`):
    /// pairing pages at first sight while guests are
    /// still filling them forms pairs in whatever order the fill fronts
    /// meet the scan, and each takes a VMA (several times the VMAs of a
    /// linear layout, enough to engage the KSM assist for one). The final
    /// compare under write-protection decides
    /// the merge; a failed one leaves the page HASHED with this hash.
    pub(super) fn join_first_seen(
        &mut self,
        v: PageVisit,
        h: u32,
        page: &GuestPage,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p, prev) = (v.ri, v.p, v.prev);
        let group = self.regions[ri].group;
        let s = self.existing_target(v, h, true, group, page)?;
        let extends = prev.is_some_and(|x| x.wrapping_add(1) == s);
        if !extends && self.scattered_now(group, self.scan_at(&v)) {
            // As in `choose`: a page with a known partner that KSM can take.
            self.pass_groups.entry(group).or_default().deferred += 1;
            return None;
        }
        self.note_planned(group, 1, u64::from(!extends));
        let old = self.regions[ri].state[p];
        self.plan(Plan::join(ri, p, s, h, old, Origin::FirstSight), ops);
        Some(s)
    }

    /// Continues a run of merges without hashing a first-seen page: when its
    /// two left neighbours are merged onto consecutive pool slots `ps - 1`
    /// and `ps`, the page is planned onto `ps + 1` (the slot `choose` tries
    /// first) if that slot can take a mapper and, when already written,
    /// agrees with the page on a few sampled cache lines. Identical guests
    /// and page-cache extents repeat runs of content, so most of a new VM's
    /// pages continue a run: this skips their hash, a good part of the
    /// engine's merge CPU (`converge -- identical max`). The final compare under
    /// write-protection decides the merge as always; a wrong guess costs
    /// that compare, and the page keeps `REHASH` and kind NEW, so its next
    /// visit hashes it (first sight makes it a candidate there).
    pub(super) fn continue_run_unhashed(
        &mut self,
        v: PageVisit,
        page: &GuestPage,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let (ri, p) = (v.ri, v.p);
        let ps = v.prev?;
        let r = &self.regions[ri];
        let group = r.group;
        if p < 2 || region::kind(r.state[p - 2]) != MERGED || r.word[p - 2].wrapping_add(1) != ps {
            return None;
        }
        let s1 = ps.wrapping_add(1);
        if s1 == 0 {
            return None;
        }
        // Inside a run of one pattern continuing onto its stripe, the
        // guess needs no sample: see `SEED_RUN`.
        let same_run = self.run.is_long(self.pool.meta(s1).hash, SEED_RUN);
        if !self.has_room(s1, group)
            || (self.pool.state(s1) == SlotState::Written
                && !same_run
                && !page.sampled_lines_agree(self.pool.page(s1)))
        {
            return None;
        }
        self.note_run(Some(self.pool.meta(s1).hash));
        self.note_planned(group, 1, 0);
        // Kept in `old_state`: restored with it if the merge fails.
        let old = self.regions[ri].state[p] | region::REHASH;
        self.plan(Plan::join(ri, p, s1, 0, old, Origin::FirstSight), ops);
        Some(s1)
    }
}
