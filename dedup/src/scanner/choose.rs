//! Where a page merges: the left neighbour's next slot, a stripe, the stable
//! index, or an unstable partner; and planning the op.

use super::*;

/// A merge to plan: page `p` of region `ri` onto pool slot `slot`.
pub(super) struct Plan {
    pub(super) ri: usize,
    pub(super) p: usize,
    pub(super) slot: u32,
    pub(super) kind: OpKind,
    /// The content hash the slot is filed under (0: unknown, for a guess
    /// the final compare checks).
    pub(super) hash: u32,
    /// The page's state to restore if the merge fails.
    pub(super) old_state: u8,
    /// The rule that let the page merge.
    pub(super) origin: Origin,
}

/// What the slot after the left neighbour's offers a page.
enum LeftStep {
    /// Join it: the run goes on in its VMA.
    Join(u32),
    /// The page has the left neighbour's content and grows its stripe
    /// onto this slot (a new pool page).
    GrowStripe(u32),
    /// Nothing: look elsewhere.
    Elsewhere,
}

impl Plan {
    /// Page `p` of region `ri` joins the existing slot `slot` (content
    /// hash `hash`, 0 for a guess); `old_state` is restored if it fails.
    pub(super) fn join(
        ri: usize,
        p: usize,
        slot: u32,
        hash: u32,
        old_state: u8,
        origin: Origin,
    ) -> Self {
        Plan {
            ri,
            p,
            slot,
            kind: OpKind::Existing,
            hash,
            old_state,
            origin,
        }
    }
}

impl Core {
    /// Plans `m`: the op to execute, a pool reference taken, and the page
    /// provisionally MERGED (`commit` puts `m.old_state` back if the merge
    /// fails).
    pub(super) fn plan(&mut self, m: Plan, ops: &mut Vec<Op>) {
        self.pool.add_mapper(m.slot);
        let r = &mut self.regions[m.ri];
        ops.push(Op {
            region: m.ri,
            page: m.p,
            slot: m.slot,
            kind: m.kind,
            hash: m.hash,
            old_state: m.old_state,
            in_pool: r.in_pool(m.p),
            origin: m.origin,
        });
        r.state[m.p] = region::with_kind(m.old_state, MERGED);
        r.word[m.p] = m.slot;
    }

    /// Slot `s` can take one more mapper from `group`: reserved or written,
    /// the group's, below `max_page_sharing`.
    pub(super) fn has_room(&self, s: u32, group: u32) -> bool {
        let st = self.pool.state(s);
        let m = self.pool.meta(s);
        (st == SlotState::Reserved || st == SlotState::Written)
            && m.group == group
            && (m.mappers as u64) < self.knobs.max_page_sharing
    }

    /// Can a page with hash `h` of `group` join slot `s`? Just hashed
    /// (`fresh`), exactly when `usable` says so (the 64-bit hash under a
    /// strong hash). Joined by its stored hash instead, a strong hash has
    /// only the 32-bit fold, which collides (twice, on average, in a pair
    /// of 64 Ki-page guests): a written slot must then also agree with
    /// the page on a few sampled lines, since a join onto another
    /// content's slot would only fail its final compare.
    fn joinable(&self, s: u32, h: u32, fresh: bool, group: u32, page: &GuestPage) -> bool {
        if fresh || !self.strong_hash {
            return self.usable(s, h, group, page);
        }
        self.has_room(s, group)
            && self.pool.meta(s).hash == h
            && (self.pool.state(s) == SlotState::Reserved
                || page.sampled_lines_agree(self.pool.page(s)))
    }

    /// Does the stable index hold a slot of `group` under the fold `h` of
    /// other content than the page just hashed (its 64-bit hash differs)?
    /// A join by the stored hash alone (`join_unhashed`) would pick that
    /// slot and fail its final compare on every visit.
    pub(super) fn fold_collides(&self, group: u32, h: u32) -> bool {
        self.strong_hash
            && self
                .stable
                .get(group, h)
                .iter()
                .take(512)
                .any(|&s| self.pool.meta(s).hash_hi != self.cur_hi)
    }

    /// The first choice of `choose` and `existing_target`: the slot after
    /// the left neighbour's (`prev`), when `takes` says the page may join
    /// it, or a stripe to grow there.
    fn left_step(
        &self,
        v: PageVisit,
        h: u32,
        group: u32,
        takes: impl Fn(&Core, u32) -> bool,
    ) -> LeftStep {
        let (ri, p) = (v.ri, v.p);
        let Some(ps) = v.prev else {
            return LeftStep::Elsewhere;
        };
        let s1 = ps.wrapping_add(1);
        if s1 == 0 {
            LeftStep::Elsewhere
        } else if takes(self, s1) {
            LeftStep::Join(s1)
        } else if self.grows_stripe(ri, p, ps, h, group) {
            LeftStep::GrowStripe(s1)
        } else {
            LeftStep::Elsewhere
        }
    }

    /// `choose`'s answer when it is a plain join of an existing slot, by
    /// the hash (`fresh`: just hashed, see `joinable`).
    pub(super) fn existing_target(
        &mut self,
        v: PageVisit,
        h: u32,
        fresh: bool,
        group: u32,
        page: &GuestPage,
    ) -> Option<u32> {
        match self.left_step(v, h, group, |c, s| c.joinable(s, h, fresh, group, page)) {
            LeftStep::Join(s) => return Some(s),
            // `choose` grows the stripe: a new slot needs a fresh hash.
            LeftStep::GrowStripe(_) => return None,
            LeftStep::Elsewhere => {}
        }
        if self.vmas.short() {
            return None;
        }
        self.skip_full_slots(group, h);
        let joinable = |s: u32| self.joinable(s, h, fresh, group, page);
        let mut fallback = None;
        for &s in self.stable.with_room(group, h).iter().take(512) {
            if !joinable(s) {
                continue;
            }
            if joinable(s.wrapping_add(1)) {
                return Some(s);
            }
            fallback.get_or_insert(s);
        }
        fallback
    }

    /// Moves (group, h)'s stable slots with room past those full at
    /// `max_page_sharing` (`StableIndex::skip_full`): the lookups below
    /// look at 512 slots at most.
    fn skip_full_slots(&mut self, group: u32, h: u32) {
        let (pool, max) = (&self.pool, self.knobs.max_page_sharing);
        self.stable
            .skip_full(group, h, max, |s| u64::from(pool.meta(s).mappers) >= max);
    }

    /// The page just visited held `content` (see [`run::SameRun::note`]).
    pub(super) fn note_run(&mut self, content: Option<u32>) {
        self.run.note(content);
    }

    /// Stripe length worth having for a same-content run of the current
    /// length r: a stripe of L pool pages turns the run into r/L VMAs. Pure
    /// memory would favour shorter stripes (a pool page costs several times
    /// a VMA's kernel memory), but every VMA also costs an mmap and one of
    /// the process's limited map slots, so L = sqrt(r): a run of 16 pages
    /// gets 4 pool pages, 4096 pages get 64. Under map-count pressure: the
    /// full stripe.
    pub(super) fn wanted_stripe(&self) -> u32 {
        if self.vmas.below_quarter() {
            return self.stripe_max;
        }
        let l = (self.run.len() as f64).sqrt() as u32;
        l.clamp(1, self.stripe_max)
    }

    /// Is slot `s` usable for a page with hash `h` in `group`?
    pub(super) fn usable(&self, s: u32, h: u32, group: u32, page: &GuestPage) -> bool {
        let st = self.pool.state(s);
        let m = self.pool.meta(s);
        self.has_room(s, group)
            && m.hash == h
            && if self.strong_hash {
                m.hash_hi == self.cur_hi
            } else {
                st == SlotState::Reserved || page.equals(self.pool.page(s))
            }
    }

    /// Could the stripe ending at slot `ps` grow by a slot for content `h`
    /// of `group`: the next slot is free and `ps` holds that content
    /// (`choose` then also wants the stripe shorter than `wanted_stripe`).
    pub(super) fn stripe_continues(&self, ps: u32, h: u32, group: u32) -> bool {
        let s1 = ps.wrapping_add(1);
        let pm = self.pool.meta(ps);
        s1 != 0 && self.pool.is_free(s1) && pm.hash == h && pm.group == group
    }

    /// Should page `p` of region `ri`, whose left neighbour maps slot `ps`,
    /// grow the stripe ending at `ps` by a new slot for content `h`: the
    /// stripe can grow (`stripe_continues`) and is shorter than
    /// `wanted_stripe`, unless the run of pages it would extend spans
    /// `stripe_max` pages already while the stripe's first slot has room.
    /// That stripe is short because its first slots filled up
    /// (`max_page_sharing`) one after the other; growing it there would
    /// make the run one page longer at each filled slot, and runs of
    /// `stripe_max + 1` pages do not fit two to a window, which would
    /// nearly halve the pages per window. The page starts a new run at the
    /// stripe's first slot instead (`choose`'s stable index), and the
    /// stripe grows at that run's end. A stripe whose slots are all full
    /// grows: a fresh one continues the run.
    pub(super) fn grows_stripe(&self, ri: usize, p: usize, ps: u32, h: u32, group: u32) -> bool {
        if !self.stripe_continues(ps, h, group) {
            return false;
        }
        let len = self.stripe_len(ps, h, group);
        len < self.wanted_stripe()
            && (self.run_before(ri, p, ps) < self.stripe_max || !self.has_room(ps + 1 - len, group))
    }

    /// Pages right before page `p` of region `ri` that map consecutive
    /// slots ending at `ps` (the run page `p` would extend), counted up to
    /// `stripe_max`.
    fn run_before(&self, ri: usize, p: usize, ps: u32) -> u32 {
        let r = &self.regions[ri];
        let mut n = 0;
        while n < self.stripe_max
            && (n as usize) < p
            && region::kind(r.state[p - 1 - n as usize]) == MERGED
            && ps.checked_sub(n) == Some(r.word[p - 1 - n as usize])
        {
            n += 1;
        }
        n
    }

    /// Length of the same-content stripe (slots with room) ending at `s`.
    pub(super) fn stripe_len(&self, s: u32, h: u32, group: u32) -> u32 {
        let mut n = 1;
        let mut x = s;
        while x > 0 && n < self.stripe_max {
            let m = self.pool.meta(x - 1);
            let st = self.pool.state(x - 1);
            // Full slots (max_page_sharing) end the stripe: a new stripe may
            // start right after a full one and must be able to grow.
            if m.hash != h
                || m.group != group
                || st == SlotState::Free
                || st == SlotState::Failed
                || m.mappers as u64 >= self.knobs.max_page_sharing
            {
                break;
            }
            n += 1;
            x -= 1;
        }
        n
    }

    pub(super) fn choose(
        &mut self,
        v: PageVisit,
        h: u32,
        group: u32,
        page: &GuestPage,
    ) -> Option<Target> {
        let (ri, p, prev) = (v.ri, v.p, v.prev);
        // 1. Continue the left neighbour's run: no new VMA.
        match self.left_step(v, h, group, |c, s| c.usable(s, h, group, page)) {
            LeftStep::Join(s) => return Some(Target::Existing(s)),
            LeftStep::GrowStripe(s1) => {
                // Same content as the left neighbour: grow its stripe so
                // the run stays one VMA.
                if let Ok(s) = self.pool.reserve(Some(s1), h, self.cur_hi, group) {
                    return Some(Target::New(s));
                }
            }
            LeftStep::Elsewhere => {}
        }
        // A hardened group is never KSM's (`maybe_assist`): only the VMA
        // budget holds its merges back.
        let scattered = !self.regions[ri].hardened() && self.scattered_now(group, self.scan_at(&v));
        if self.vmas.short() || scattered {
            // Out of map-count headroom, or the group's merges look
            // scattered and KSM is about to take them: only run-extending
            // merges. A page with a known partner (a candidate under its
            // hash, not compared: this only counts) is counted: KSM can
            // take those.
            if self.known_partner(ri, p, h, group) {
                self.pass_groups.entry(group).or_default().deferred += 1;
            }
            return None;
        }
        // 2. Stable index: a slot with room, preferably one whose successor
        //    has room too (the run then continues along the stripe instead
        //    of costing a VMA per page); lowest first.
        self.skip_full_slots(group, h);
        let mut fallback = None;
        for &s in self.stable.with_room(group, h).iter().take(512) {
            if !self.usable(s, h, group, page) {
                continue;
            }
            if self.usable(s.wrapping_add(1), h, group, page) {
                return Some(Target::Existing(s));
            }
            fallback.get_or_insert(s);
        }
        if let Some(s) = fallback {
            return Some(Target::Existing(s));
        }
        // 3. Unstable index: a page seen earlier this pass.
        let found = self
            .unstable_partner(ri, p, h, group, Some(page))
            .or_else(|| self.hinted_partner(ri, p, h, group, Some(page)));
        let (cr, cp) = self.locate(found?)?;
        if cr == ri && cp > p {
            // The partner lies ahead in this region: it may be visited later
            // in this very span (hinted pages are visited out of cursor
            // order), where its provisional MERGED state would meet a
            // pagemap entry read before the merge and be taken for a
            // copy-on-write break (its pool reference dropped twice: a
            // mapper-count underflow). It pairs with this page when
            // its own visit comes.
            return None;
        }
        // The new content's slot: next to the left neighbour's (this
        // region's run goes on); else the earlier-registered page's own
        // slot in its region's window (`crate::slots`), so that region's
        // merged pages map consecutive offsets whatever order they merge
        // in; else next to the partner's left neighbour's. On a scattered
        // layout the left neighbour's run keeps the visited region
        // contiguous from the first merge on, where the window first would
        // leave both sides fragmented until the earlier region filled in,
        // costing more VMAs per merge and fewer merges per second.
        let (lr, lp) = if cr <= ri { (cr, cp) } else { (ri, p) };
        let hint = prev
            .map(|x| x.wrapping_add(1))
            .filter(|&x| self.pool.is_free(x))
            .or_else(|| {
                self.regions[lr]
                    .slot_base
                    .map(|b| b + lp as u32)
                    .filter(|&x| self.pool.is_free(x))
            })
            .or_else(|| {
                (cp > 0 && region::kind(self.regions[cr].state[cp - 1]) == MERGED)
                    .then(|| self.regions[cr].word[cp - 1].wrapping_add(1))
                    .filter(|&x| self.pool.is_free(x))
            });
        let s = self.pool.reserve(hint, h, self.cur_hi, group).ok()?;
        Some(Target::Pair(s, cr, cp))
    }

    /// Has page `p` of region `ri`, hash `h`, a partner the engine knows
    /// under its hash: a slot of the group in the pool, or a page seen
    /// unchanged earlier this pass. Not compared: for counting, and for
    /// deciding whether a fresh hash is worth taking.
    pub(super) fn known_partner(&self, ri: usize, p: usize, h: u32, group: u32) -> bool {
        !self.stable.get(group, h).is_empty()
            || self.unstable_partner(ri, p, h, group, None).is_some()
    }

    /// A page seen earlier this pass (unstable index) with this content
    /// (`page`'s, compared in full), or, for `None`, any candidate filed
    /// under `h` that is still unchanged: the question `visit_clean` asks
    /// before a full visit that would compare the partner again.
    pub(super) fn unstable_partner(
        &self,
        ri: usize,
        p: usize,
        h: u32,
        group: u32,
        page: Option<&GuestPage>,
    ) -> Option<u32> {
        let me = self.regions[ri].gid_base + p as u32;
        let regions = &self.regions;
        let locate = |gid: u32| locate_in(regions, gid);
        let key_of = |gid: u32| -> Option<u32> {
            let (r, pp) = locate(gid)?;
            let rg = &regions[r];
            let s = rg.state[pp];
            (gid != me && region::kind(s) == HASHED && !region::is_volatile(s) && rg.group == group)
                .then_some(rg.word[pp])
        };
        self.unstable.find(h, key_of, |gid| {
            let Some(page) = page else {
                return true;
            };
            let Some((r, pp)) = locate(gid) else {
                return false;
            };
            // SAFETY: registered regions are mapped, and stay so while we
            // hold the core (unregister needs it).
            let other = unsafe { regions[r].guest_page(pp) };
            other.equals(page.bytes())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driven core over one region of `n` pages of one pattern at
    /// `max_page_sharing` `m`, after its first pass; unregistered and
    /// unmapped on drop.
    struct OnePattern {
        core: Core,
        a: *mut u8,
        len: usize,
    }

    impl OnePattern {
        fn first_pass(n: usize, m: u64) -> OnePattern {
            let len = n * crate::PAGE_SIZE;
            let a = crate::mm::map_anon(len).unwrap();
            // SAFETY: `a` is our fresh mapping of `len` bytes.
            unsafe { std::ptr::write_bytes(a, 7, len) };
            let mut core = Core::driven(1 << 30).unwrap();
            core.knobs.max_page_sharing = m;
            // SAFETY: `a..+len` is our own private anonymous mapping,
            // unmapped only after the unregister in `drop`.
            unsafe { core.register(a as usize, len, "a".into(), "g".into()) }.unwrap();
            core.run_passes(1);
            OnePattern { core, a, len }
        }
    }

    impl Drop for OnePattern {
        fn drop(&mut self) {
            let id = self.core.regions[0].id;
            // SAFETY: with unmerge the region keeps its content.
            let done = unsafe { self.core.unregister(id, true) };
            // Not while a failed assertion unwinds (a second panic aborts).
            if !std::thread::panicking() {
                done.unwrap();
            }
            // SAFETY: our own mapping, used no more: a driven core touches
            // its regions only when called, and this one is not called
            // again (even if the unregister failed).
            unsafe { crate::mm::unmap(self.a, self.len) };
        }
    }

    /// Lengths of the runs of pages of region `ri` that map consecutive
    /// slots (`word`), in address order.
    fn slot_runs(core: &Core, ri: usize) -> Vec<u32> {
        let r = &core.regions[ri];
        let mut runs = Vec::new();
        let mut prev: Option<u32> = None;
        for p in 0..r.state.len() {
            let s = (region::kind(r.state[p]) == MERGED).then(|| r.word[p]);
            match (prev, s) {
                (Some(a), Some(b)) if a.wrapping_add(1) == b => *runs.last_mut().unwrap() += 1,
                (_, Some(_)) => runs.push(1),
                _ => {}
            }
            prev = s;
        }
        runs
    }

    /// One pattern over 32k pages at `max_page_sharing` 32 needs 1,024
    /// slots, twice the 512 a lookup looks at: the lookups start past the
    /// full slots, so the pool holds about one slot per 32 pages and the
    /// saving is KSM's (32,768 - 1,024 pages). Before, every lookup met
    /// 512 full slots, and most pages went to slots of their own: 15,710
    /// slots, 17,058 pages sharing.
    #[test]
    fn a_pattern_past_512_full_slots_still_finds_room() {
        const N: usize = 32 * 1024;
        const M: u64 = 32;
        let f = OnePattern::first_pass(N, M);
        let s = f.core.stats();
        let ideal = (N as u64 / M) as f64;
        assert!(s.pool_pages as f64 <= ideal * 1.1, "{s:?}");
        assert!(s.pages_sharing as f64 >= (N as f64 - ideal) * 0.99, "{s:?}");
        f.core.check_consistency().unwrap();
    }

    /// A region of one pattern whose stripe slides (its slots fill up one
    /// after the other at `max_page_sharing`, here 128 so that 32k pages
    /// reach that regime) still merges in runs of at most `stripe_max`
    /// pages: a page that would make the run longer starts a new one at
    /// the stripe's first slot with room. Before, each filled slot made a
    /// run of `stripe_max + 1` pages or more (66 here).
    #[test]
    fn a_sliding_stripe_keeps_its_runs_within_stripe_max() {
        const N: usize = 32 * 1024;
        let f = OnePattern::first_pass(N, 128);
        let core = &f.core;
        let s = core.stats();
        assert_eq!(s.pages_sharing + s.pages_shared, N as u64, "{s:?}");
        let runs = slot_runs(core, 0);
        let longest = runs.iter().max().copied().unwrap_or(0);
        let full = runs.iter().filter(|&&l| l == core.stripe_max).count();
        assert!(longest <= core.stripe_max, "a run of {longest} pages");
        // Most of the region is runs of a whole stripe (two to a window).
        assert!(
            full * core.stripe_max as usize > N * 3 / 4,
            "{full} full runs"
        );
        core.check_consistency().unwrap();
    }
}
