//! How long the guests' pages must stay unchanged before the scan merges
//! them, following how many of its merges the guests undo.
//!
//! KSM merges a page found unchanged over one pass; at its default rate a
//! pass takes minutes, so what it merges has stayed put for minutes. The
//! engine passes in seconds or less, which merges a new VM within a
//! second, but a busy guest's pages that were quiet for a pass are often
//! written again soon: a real guest frees memory and allocates it again,
//! zeroing it. Two Linux guests building one tree (`bench build --guest
//! linux`, `Stats::origins`) undid a quarter to a half of the merges the
//! scan made on its own pass (a few seconds there), more than half of
//! those of second looks after a quiet write-log interval, most of their
//! zero-page drops and of the merges made at first sight, against 0.3 %
//! of the merges of pages a device had just filled; most of the undone
//! merges were of pages broken for the first time, so no per-page
//! history tells them apart. Each undone merge costs the engine a merge
//! (most of its CPU there) and the guest a fault (docs/engine.md,
//! "Settling").
//!
//! So the settle time follows the undone share of the scan's merges (all
//! but the hinted ones; a break raises only the time its merge was made
//! under, and any break holds the time up, [`Settle::note_break`]),
//! judged once a second (each collection of the
//! write logs takes back the shares the guests' writes broke since the
//! previous one, `Core::take_back_written_shares`) and at each pass end:
//! it
//! starts at 0 (passes as fast as the pace
//! allows, second looks after one interval, merges at first sight), goes
//! to [`FIRST_STEP`] and doubles up to [`MAX_SETTLE`] while more than one
//! merge in [`HIGH_BREAKS`] is undone, and halves back (to 0 below the
//! first step) once fewer than one in [`LOW_BREAKS`] is and the time has
//! held for its own length since it last changed (the merges made under
//! it had that long to be undone: judged sooner, a window of merges that
//! had waited the settle time lowered it to 0 within seconds, before the
//! guests wrote any of them, and the scan went from 16 s to full pace and
//! back in half a minute). While it is not
//! 0, a pass starts no sooner than the settle time after the previous one
//! started (`Core::run_batch`), a second look waits as many write-log
//! intervals, and no page merges at first sight. Guests whose merges last
//! keep the full pace.
//!
//! Once the guests stop undoing merges, the time comes down to what
//! kernel KSM at the engine's knobs makes a page wait ([`ksm_wait`]: two
//! of its passes), not a halving at a time: a window of merges that
//! lasted, or a whole settle time in which the guests undid almost
//! nothing while the scan, held back, made few merges. Two Linux guests
//! that churn while they boot and then read files (`bench linux-read`)
//! left the time at 32 s, where it could only halve after holding 32 s,
//! then 16 s, and so on: the pages they wrote after their read waited
//! 32 s between passes while KSM at the same knobs merged them in
//! seconds. Guests that keep undoing merges (a build) keep it up.

use std::time::{Duration, Instant};

/// The settle time's first step up from 0.
pub(super) const FIRST_STEP: Duration = Duration::from_secs(2);

/// The longest settle time: about KSM's pass at 10,000 pages per 20 ms
/// on a slow host, far shorter than at its defaults.
pub(super) const MAX_SETTLE: Duration = Duration::from_secs(32);

/// How long kernel KSM at `pages_to_scan` pages every `sleep_ms` makes a
/// page of `tracked_pages` wait at most before it merges it: two full
/// passes, the first to record its checksum, the second to find it
/// unchanged (in whole batches).
pub(super) fn ksm_wait(tracked_pages: u64, pages_to_scan: u64, sleep_ms: u64) -> Duration {
    let batches = tracked_pages.div_ceil(pages_to_scan.max(1));
    Duration::from_millis(batches.saturating_mul(sleep_ms).saturating_mul(2))
}

/// How long a time the guests relapsed from holds at least before it is
/// lowered again ([`Settle::judge`]).
const RELAPSE_MIN: Duration = Duration::from_secs(16);

/// The longest such hold.
const RELAPSE_MAX: Duration = Duration::from_secs(256);

/// More than one merge in this many undone: settle longer.
const HIGH_BREAKS: u64 = 4;

/// Fewer than one in this many undone: settle less.
const LOW_BREAKS: u64 = 16;

/// Merges, or breaks of them, before the share is judged: a few merges
/// say nothing of a guest's habits.
const JUDGE_AFTER: u64 = 256;

/// The settle time and the figures it was last judged on.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settle {
    /// Turned off (`EngineConfig::settle`): the time stays 0.
    off: bool,
    time: Duration,
    /// The scan's merges and their copy-on-write breaks, as counted at the
    /// last judgement.
    merges_at: u64,
    breaks_at: u64,
    /// When the time last changed.
    changed_at: Option<Instant>,
    /// The current time's number, which each change advances (wrapping):
    /// the scan tags each merge with it (`Region::epoch`), so that a break
    /// counts against the time only if its merge was made under it.
    epoch: u8,
    /// Breaks of merges made under the current time, since the start.
    undone: u64,
    /// Breaks of the scan's merges whatever time they were made under,
    /// since the start, and as counted at the last judgement.
    all_undone: u64,
    all_at: u64,
    /// The last change lowered the time.
    lowered: bool,
    /// When the lowered time last earned a halving of `relapse`.
    calm_since: Option<Instant>,
    /// How long the time must hold before it is lowered, beyond its own
    /// length: 0 until the guests relapse (undo the merges of a time the
    /// scan had just lowered to), then [`RELAPSE_MIN`] doubling at each
    /// relapse up to [`RELAPSE_MAX`], halving each time a lowered time
    /// holds that long again.
    relapse: Duration,
    /// Second looks ([`Settle::second_looks`]), judged apart; their merges
    /// come counted from the caller.
    second_looks: Apart,
    /// The scan's zero drops ([`Settle::zero_drops`]), judged apart, and
    /// how many it made (hinted ones left out), cumulative.
    zero_drops: Apart,
    z_drops: u64,
}

/// A kind of the scan's merges judged on its own while the settle time is
/// up (second looks, zero drops): off once the guests undo more than one in
/// [`HIGH_BREAKS`] of them, judged once enough of their merges or breaks
/// came, and on again whenever the time is 0.
#[derive(Debug, Clone, Copy, Default)]
struct Apart {
    off: bool,
    /// Breaks of these merges (any time), cumulative.
    undone: u64,
    /// Their merges and breaks as counted at the last judgement.
    merges_at: u64,
    undone_at: u64,
}

impl Apart {
    /// Judges them by their cumulative `merges`; `settled`: the time is
    /// not 0. `what` names them in the log.
    fn judge(&mut self, merges: u64, settled: bool, what: &str) {
        let dm = merges.saturating_sub(self.merges_at);
        let db = self.undone.saturating_sub(self.undone_at);
        if settled && dm < JUDGE_AFTER && db < JUDGE_AFTER {
            return;
        }
        let off = settled && (self.off || db.saturating_mul(HIGH_BREAKS) > dm);
        if off != self.off {
            log::debug!(
                "{db} of {dm} {what} undone: {what} {}",
                if off { "off" } else { "on" }
            );
        }
        self.off = off;
        self.merges_at = merges;
        self.undone_at = self.undone;
    }
}

impl Settle {
    /// How long a page must stay unchanged before the scan merges it
    /// (0: one pass, however short).
    pub(super) fn time(&self) -> Duration {
        self.time
    }

    /// Write-log intervals (of `interval`) a second look waits: the settle
    /// time's worth, at least one.
    pub(super) fn intervals(&self, interval: Duration) -> u32 {
        if interval.is_zero() {
            return 1;
        }
        let n = self.time.as_nanos().div_ceil(interval.as_nanos());
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// The current time's number: tags the scan's merges.
    pub(super) fn epoch(&self) -> u8 {
        self.epoch
    }

    /// A merge tagged `merged_in` (its epoch) was undone: it counts if it
    /// was made under the current time. Breaks of merges made under an
    /// earlier, shorter time are no news: the raise since answered them.
    /// Counted instead, two Linux guests' boot, undoing the merges of its
    /// first seconds, took the time from 0 to 32 s in 8 s while the scan
    /// made no merge at all ("628 of 0 merges undone"), and the pages the
    /// guests wrote and then kept waited 32 s, against KSM's 2 s.
    ///
    /// Lowering the time is another matter: while the guests still undo
    /// merges made under a shorter time, going back to it would have them
    /// undo the new ones alike. Two Linux guests building a tree, their
    /// breaks counted only by epoch, went from 2 s back to 0 each time the
    /// merges made under 2 s had had 2 s to be undone (few were, so soon),
    /// and undid 33,000 merges against KSM's 7,500 at 10,000 pages per
    /// 20 ms. So every break counts against lowering ([`Settle::judge`]).
    ///
    /// `second_look`: the merge was a second look's (`Origin::SecondLook`),
    /// which [`Settle::second_looks`] answers to.
    pub(super) fn note_break(&mut self, merged_in: u8, second_look: bool) {
        self.all_undone += 1;
        self.second_looks.undone += u64::from(second_look);
        if merged_in == self.epoch {
            self.undone += 1;
        }
    }

    /// Breaks of merges made under the current time, cumulative.
    #[cfg(test)]
    pub(super) fn undone(&self) -> u64 {
        self.undone
    }

    /// Turns the settle time on, or off (back to 0, and stays there).
    pub(super) fn set_enabled(&mut self, on: bool) {
        self.off = !on;
        if self.off {
            self.time = Duration::ZERO;
        }
    }

    /// May a page changed at its visit get a second look (merge once the
    /// write log says it stayed unwritten for the settle time)? Not while
    /// the guests undo more than one in [`HIGH_BREAKS`] of those merges
    /// and the time is not 0: a page just written is likelier to be
    /// written again than one unchanged over a pass. Two Linux guests
    /// building a tree undid 8,153 of 8,358 second looks' merges (97 %)
    /// while settled at 2-8 s, against half of the merges of pages
    /// unchanged over a pass; such a page waits for its next visit.
    pub(super) fn second_looks(&self) -> bool {
        !self.second_looks.off
    }

    /// The scan dropped a zero page (not a hinted one).
    pub(super) fn note_zero_drop(&mut self) {
        self.z_drops += 1;
    }

    /// The guest wrote a page the scan had dropped to the zero page (not
    /// a hinted one). Counted as a break too ([`Settle::note_break`]).
    pub(super) fn note_zero_refill(&mut self) {
        self.zero_drops.undone += 1;
    }

    /// May the scan drop a zero page? Not while the guests refill more
    /// than one in [`HIGH_BREAKS`] of its drops and the time is not 0.
    /// Linux clears each page it allocates (`init_on_alloc`, on in
    /// Debian's kernels), so a zero page in a busy guest is mostly one
    /// just allocated, about to be filled: two Linux guests building a
    /// tree refilled 62-66 % of the drops, against 45 % of the merges of
    /// pages unchanged over a pass. Such a page waits, as hashed, until
    /// the time is back at 0; a device-filled one is dropped whatever the
    /// time.
    pub(super) fn zero_drops(&self) -> bool {
        !self.zero_drops.off
    }

    /// May a page merge at first sight?
    pub(super) fn first_sight(&self) -> bool {
        self.time.is_zero()
    }

    /// Judges the scan at `now` by its cumulative merges and the breaks
    /// noted so far ([`Settle::note_break`]), once enough of either came
    /// since the last judgement. A window's breaks, for raising the time,
    /// include those of merges made before it under the same time, not
    /// those of merges made under an earlier one; for lowering it, they
    /// include every break. Few breaks
    /// lower it only once it has held for its own length; until then the
    /// window grows. A window too small to judge lowers it too when it
    /// has held for its own length and the guests undid almost nothing
    /// meanwhile (fewer than `JUDGE_AFTER / LOW_BREAKS` merges): a scan
    /// held back by a long settle time makes few merges, and would wait
    /// for a judgeable window of them for minutes. Lowering goes at once
    /// down to `ksm_wait` ([`ksm_wait`] at the engine's knobs) if that is
    /// below half the time.
    pub(super) fn judge(
        &mut self,
        merges: u64,
        second_look_merges: u64,
        now: Instant,
        ksm_wait: Duration,
    ) {
        let settled = !self.time.is_zero();
        self.second_looks
            .judge(second_look_merges, settled, "second looks");
        self.zero_drops.judge(self.z_drops, settled, "zero drops");
        let dm = merges.saturating_sub(self.merges_at);
        let db = self.undone.saturating_sub(self.breaks_at);
        // Every break since the last judgement: what lowering answers to.
        let da = self.all_undone.saturating_sub(self.all_at).max(db);
        let since = self.changed_at.map(|t| now.saturating_duration_since(t));
        // A lowered time that held as long as the hold was right: the
        // guests may have calmed down.
        let calm = self
            .calm_since
            .is_some_and(|c| now.saturating_duration_since(c) >= self.relapse);
        if self.lowered && !self.relapse.is_zero() && calm {
            self.relapse /= 2;
            if self.relapse < RELAPSE_MIN {
                self.relapse = Duration::ZERO;
            }
            self.calm_since = Some(now);
        }
        let held = since.is_none_or(|d| d >= self.time.max(self.relapse));
        let small = dm < JUDGE_AFTER && db < JUDGE_AFTER;
        let quiet = small && held && da.saturating_mul(LOW_BREAKS) < JUDGE_AFTER;
        if self.off || (small && !quiet) || (quiet && self.time.is_zero()) {
            return;
        }
        let before = self.time;
        if quiet {
            self.lower(ksm_wait);
        } else if db.saturating_mul(HIGH_BREAKS) > dm {
            self.time = (self.time * 2).clamp(FIRST_STEP, MAX_SETTLE);
        } else if da.saturating_mul(LOW_BREAKS) < dm {
            if !held {
                return;
            }
            self.lower(ksm_wait);
        }
        if self.time != before {
            if self.time > before && self.lowered {
                self.relapse = (self.relapse * 2).clamp(RELAPSE_MIN, RELAPSE_MAX);
            }
            self.lowered = self.time < before;
            self.calm_since = Some(now);
            log::debug!(
                "{db} of {dm} merges undone ({da} of any time): settle time {before:?} -> {:?}, \
                 hold before lowering {:?}",
                self.time,
                self.relapse
            );
            self.changed_at = Some(now);
            self.epoch = self.epoch.wrapping_add(1);
        }
        self.merges_at = merges;
        self.breaks_at = self.undone;
        self.all_at = self.all_undone;
    }

    /// Merges last: halves the time, and at once down to `ksm_wait` if
    /// that is shorter; 0 below [`FIRST_STEP`].
    fn lower(&mut self, ksm_wait: Duration) {
        self.time = (self.time / 2).min(ksm_wait);
        if self.time < FIRST_STEP {
            self.time = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// Judges `st` once `breaks` merges made under its current time were
    /// undone in all (notes the missing ones).
    fn judge(st: &mut Settle, merges: u64, breaks: u64, now: Instant, wait: Duration) {
        let e = st.epoch();
        while st.undone() < breaks {
            st.note_break(e, false);
        }
        st.judge(merges, 0, now, wait);
    }

    /// A KSM wait no shorter than any settle time: lowering only halves.
    const HALVING: Duration = MAX_SETTLE;

    /// A moment well past every settle time since `t`'s last call.
    fn later(t: &mut Instant) -> Instant {
        *t += S(100);
        *t
    }

    #[test]
    fn undone_merges_lengthen_it_up_to_its_cap() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        assert!(st.first_sight());
        let (mut m, mut b) = (0, 0);
        for want in [2, 4, 8, 16, 32, 32] {
            m += 1000;
            b += 500;
            judge(&mut st, m, b, later(&mut t), HALVING);
            assert_eq!(st.time(), S(want));
            assert!(!st.first_sight());
        }
    }

    #[test]
    fn lasting_merges_shorten_it_to_zero_and_a_middle_share_keeps_it() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        judge(&mut st, 1000, 900, later(&mut t), HALVING);
        judge(&mut st, 2000, 1800, later(&mut t), HALVING);
        assert_eq!(st.time(), S(4));
        // One in eight undone: between the two thresholds.
        judge(&mut st, 3000, 1925, later(&mut t), HALVING);
        assert_eq!(st.time(), S(4));
        for want in [2, 0, 0] {
            let (m, b) = (st.merges_at + 1000, st.breaks_at + 10);
            judge(&mut st, m, b, later(&mut t), HALVING);
            assert_eq!(st.time(), S(want));
        }
        assert!(st.first_sight());
    }

    #[test]
    fn it_goes_down_only_after_holding_for_its_own_length() {
        let (mut st, t0) = (Settle::default(), Instant::now());
        for (i, want) in [2, 4, 8, 16].into_iter().enumerate() {
            let n = 1000 * (i as u64 + 1);
            judge(&mut st, n, n / 2, t0, HALVING);
            assert_eq!(st.time(), S(want));
        }
        // Lasting merges 10 s after it reached 16 s: too soon to judge
        // them, the window grows.
        judge(&mut st, 20_000, 2000, t0 + S(10), HALVING);
        assert_eq!((st.time(), st.merges_at), (S(16), 4000));
        // 16 s after: the window since 4,000 merges is judged, 16,000
        // merges and no more breaks.
        judge(&mut st, 20_000, 2000, t0 + S(16), HALVING);
        assert_eq!((st.time(), st.merges_at), (S(8), 20_000));
        // Breaks raise it at once, however recent the last change.
        judge(&mut st, 21_000, 2600, t0 + S(17), HALVING);
        assert_eq!(st.time(), S(16));
    }

    #[test]
    fn breaks_of_merges_made_under_an_earlier_time_do_not_count() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        let boot = st.epoch();
        for _ in 0..1000 {
            st.note_break(boot, false);
        }
        st.judge(2000, 0, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        let raised = st.epoch();
        assert_ne!(raised, boot);
        // The boot's merges keep being undone while the
        // scan, held back, makes none: no news, the time stays.
        for s in 1..=5 {
            for _ in 0..1000 {
                st.note_break(boot, false);
            }
            st.judge(2000, 0, t + Duration::from_millis(300 * s), HALVING);
        }
        assert_eq!((st.time(), st.undone()), (S(2), 1000));
        // Merges made under 2 s, half of them undone: up again.
        for _ in 0..500 {
            st.note_break(raised, false);
        }
        st.judge(3000, 0, t + S(3), HALVING);
        assert_eq!(st.time(), S(4));
    }

    #[test]
    fn it_stays_up_while_the_guests_undo_merges_made_under_a_shorter_time() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        let zero = st.epoch();
        judge(&mut st, 1000, 500, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        // Held for 2 s, none of the merges made under it undone yet, but
        // the guests keep undoing those made at 0: it stays.
        for _ in 0..300 {
            st.note_break(zero, false);
        }
        st.judge(2000, 0, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        // A window too small to judge is not quiet either.
        for _ in 0..100 {
            st.note_break(zero, false);
        }
        st.judge(2100, 0, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        // Once they stop, it comes down.
        st.judge(5000, 0, later(&mut t), HALVING);
        assert_eq!(st.time(), S(0));
    }

    #[test]
    fn a_time_the_guests_relapsed_from_holds_longer_each_time() {
        let (mut st, t0) = (Settle::default(), Instant::now());
        let mut t = t0;
        let (mut m, mut b) = (0, 0);
        // 0 is undone, 2 s lasts, again and again (two guests building).
        let mut holds = Vec::new();
        for _ in 0..7 {
            t += S(1);
            m += 1000;
            b += 500;
            judge(&mut st, m, b, t, HALVING);
            assert_eq!(st.time(), S(2));
            let raised = t;
            // Merges made under 2 s last: judged each second until the
            // time comes down.
            while st.time() == S(2) {
                t += S(1);
                m += 1000;
                judge(&mut st, m, b, t, HALVING);
            }
            holds.push((t - raised).as_secs());
        }
        assert_eq!(holds, [2, 16, 32, 64, 128, 256, 256]);
        // At 0 the merges now last: each hold's length at 0 halves it.
        assert_eq!(st.relapse, RELAPSE_MAX);
        for (hold, want) in [(256, 128), (128, 64), (64, 32), (32, 16), (16, 0)] {
            t += S(hold - 1);
            judge(&mut st, m, b, t, HALVING);
            assert_eq!(st.relapse, S(hold), "not held long enough yet");
            t += S(1);
            judge(&mut st, m, b, t, HALVING);
            assert_eq!((st.time(), st.relapse), (S(0), S(want)));
        }
        // Churn after a long calm holds the least.
        judge(&mut st, m + 1000, b + 500, t, HALVING);
        assert_eq!((st.time(), st.relapse), (S(2), RELAPSE_MIN));
    }

    #[test]
    fn second_looks_stop_while_settled_if_the_guests_undo_them() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        let e = st.epoch();
        // At 0 second looks stay on, however many are undone.
        for _ in 0..900 {
            st.note_break(e, true);
        }
        st.judge(1000, 1000, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        assert!(st.second_looks(), "judged on the window up to the raise");
        // Settled: one in five undone keeps them.
        let e = st.epoch();
        for _ in 0..60 {
            st.note_break(e, true);
        }
        st.judge(1300, 1300, t, HALVING);
        assert!(st.second_looks());
        // Half undone: off, and they stay off while the time is up.
        for _ in 0..150 {
            st.note_break(e, true);
        }
        st.judge(1600, 1600, t, HALVING);
        assert!(!st.second_looks());
        st.judge(1900, 1600, t, HALVING);
        assert!(!st.second_looks());
        // Back at 0: on again.
        let mut m = 1900;
        while !st.time().is_zero() {
            m += 1000;
            st.judge(m, 1600, later(&mut t), HALVING);
            assert!(!st.second_looks());
        }
        st.judge(m, 1600, later(&mut t), HALVING);
        assert!(st.second_looks());
    }

    #[test]
    fn zero_drops_stop_while_settled_if_the_guests_refill_them() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        let refill = |st: &mut Settle, n: u64| {
            let e = st.epoch();
            for _ in 0..n {
                st.note_zero_refill();
                st.note_break(e, false);
            }
        };
        let drops = |st: &mut Settle, n: u64| (0..n).for_each(|_| st.note_zero_drop());
        // At 0 zero drops stay on, however many are refilled.
        drops(&mut st, 1000);
        refill(&mut st, 900);
        st.judge(1000, 0, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        assert!(st.zero_drops(), "judged on the window up to the raise");
        // Settled: one in five refilled keeps them.
        drops(&mut st, 300);
        refill(&mut st, 60);
        st.judge(1300, 0, t, HALVING);
        assert!(st.zero_drops());
        // Half refilled: off, and they stay off while the time is up,
        // refills or not.
        drops(&mut st, 300);
        refill(&mut st, 150);
        st.judge(1600, 0, t, HALVING);
        assert!(!st.zero_drops());
        st.judge(1900, 0, t, HALVING);
        assert!(!st.zero_drops());
        // Back at 0: on again.
        let mut m = 1900;
        while !st.time().is_zero() {
            m += 1000;
            st.judge(m, 0, later(&mut t), HALVING);
            assert!(!st.zero_drops());
        }
        st.judge(m, 0, later(&mut t), HALVING);
        assert!(st.zero_drops());
    }

    #[test]
    fn turned_off_it_stays_at_zero() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        st.set_enabled(false);
        judge(&mut st, 1000, 900, later(&mut t), HALVING);
        assert_eq!(st.time(), Duration::ZERO);
        assert!(st.first_sight());
    }

    /// A settle time raised to 32 s from `t`, as a boot's churn does.
    fn raised(t: &mut Instant) -> Settle {
        let mut st = Settle::default();
        let (mut m, mut b) = (0, 0);
        for _ in 0..5 {
            m += 1000;
            b += 500;
            judge(&mut st, m, b, later(t), HALVING);
        }
        assert_eq!(st.time(), MAX_SETTLE);
        st
    }

    #[test]
    fn once_merges_last_it_comes_down_to_ksms_wait_at_once() {
        assert_eq!(ksm_wait(196_608, 4096, 20), Duration::from_millis(1920));
        assert_eq!(ksm_wait(524_288, 4096, 20), Duration::from_millis(5120));
        assert_eq!(ksm_wait(1, 0, 20), Duration::from_millis(40));
        // Two 1 GiB guests at 4,096 pages every 20 ms: 32 s to 5.12 s,
        // then halving.
        let mut t = Instant::now();
        let mut st = raised(&mut t);
        let wait = ksm_wait(524_288, 4096, 20);
        let (m, b) = (st.merges_at, st.breaks_at);
        judge(&mut st, m + 1000, b + 10, later(&mut t), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        judge(&mut st, m + 2000, b + 20, later(&mut t), wait);
        assert_eq!(st.time(), Duration::from_millis(2560));
        judge(&mut st, m + 3000, b + 30, later(&mut t), wait);
        assert_eq!(st.time(), Duration::ZERO);
        // Two 384 MiB guests: KSM's wait is below the first step, so
        // straight to 0.
        let mut st = raised(&mut t);
        let (m, b) = (st.merges_at, st.breaks_at);
        judge(
            &mut st,
            m + 1000,
            b + 10,
            later(&mut t),
            ksm_wait(196_608, 4096, 20),
        );
        assert_eq!(st.time(), Duration::ZERO);
    }

    #[test]
    fn a_quiet_settle_time_comes_down_without_a_judgeable_window() {
        let t0 = Instant::now();
        let mut t = t0;
        let mut st = raised(&mut t);
        let wait = ksm_wait(524_288, 4096, 20);
        let (m, b) = (st.merges_at, st.breaks_at);
        // The scan, held back, made 40 merges and the guests undid 15 in
        // the settle time's length: quiet.
        judge(&mut st, m + 40, b + 15, t + S(31), wait);
        assert_eq!(st.time(), MAX_SETTLE, "not held for its length yet");
        judge(&mut st, m + 40, b + 15, t + S(32), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        // 16 undone in a small window is not quiet: the window grows.
        let (m, b) = (st.merges_at, st.breaks_at);
        judge(&mut st, m + 40, b + 16, t + S(60), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        assert_eq!((st.merges_at, st.breaks_at), (m, b));
        // At 0 a quiet window changes nothing and is not consumed.
        let mut st = Settle::default();
        judge(&mut st, 10, 0, later(&mut t), HALVING);
        assert_eq!((st.time(), st.merges_at), (Duration::ZERO, 0));
    }

    #[test]
    fn a_few_merges_are_not_judged() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        judge(&mut st, 100, 100, later(&mut t), HALVING);
        assert_eq!(st.time(), Duration::ZERO);
        // Breaks alone, once many: merges made earlier are being undone.
        judge(&mut st, 100, 400, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
    }

    #[test]
    fn second_looks_wait_the_settle_time_in_intervals() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        assert_eq!(st.intervals(S(1)), 1);
        judge(&mut st, 1000, 900, later(&mut t), HALVING);
        judge(&mut st, 2000, 1800, later(&mut t), HALVING);
        assert_eq!(st.intervals(S(1)), 4);
        assert_eq!(st.intervals(Duration::from_millis(1500)), 3);
        assert_eq!(st.intervals(Duration::ZERO), 1);
    }
}
