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
//! but the hinted ones; a break counts against the time its merge was
//! made under, [`Settle::note_break`]), judged once a second (each collection of the
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
    /// Breaks of merges made under the current time, since the start:
    /// what `judge` is given as `breaks` (`Core::judge_settle`).
    undone: u64,
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
    pub(super) fn note_break(&mut self, merged_in: u8) {
        if merged_in == self.epoch {
            self.undone += 1;
        }
    }

    /// Breaks of merges made under the current time, cumulative.
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

    /// May a page merge at first sight?
    pub(super) fn first_sight(&self) -> bool {
        self.time.is_zero()
    }

    /// Judges the scan at `now` by its cumulative merges and the breaks
    /// counted so far of those made under the current time (`undone`),
    /// once enough of either came since the last judgement. A window's
    /// breaks include those of merges made before it under the same time,
    /// not those of merges made under an earlier one. Few breaks
    /// lower it only once it has held for its own length; until then the
    /// window grows. A window too small to judge lowers it too when it
    /// has held for its own length and the guests undid almost nothing
    /// meanwhile (fewer than `JUDGE_AFTER / LOW_BREAKS` merges): a scan
    /// held back by a long settle time makes few merges, and would wait
    /// for a judgeable window of them for minutes. Lowering goes at once
    /// down to `ksm_wait` ([`ksm_wait`] at the engine's knobs) if that is
    /// below half the time.
    pub(super) fn judge(&mut self, merges: u64, breaks: u64, now: Instant, ksm_wait: Duration) {
        let dm = merges.saturating_sub(self.merges_at);
        let db = breaks.saturating_sub(self.breaks_at);
        let held = self
            .changed_at
            .is_none_or(|t| now.saturating_duration_since(t) >= self.time);
        let small = dm < JUDGE_AFTER && db < JUDGE_AFTER;
        let quiet = small && held && db.saturating_mul(LOW_BREAKS) < JUDGE_AFTER;
        if self.off || (small && !quiet) || (quiet && self.time.is_zero()) {
            return;
        }
        let before = self.time;
        if quiet {
            self.lower(ksm_wait);
        } else if db.saturating_mul(HIGH_BREAKS) > dm {
            self.time = (self.time * 2).clamp(FIRST_STEP, MAX_SETTLE);
        } else if db.saturating_mul(LOW_BREAKS) < dm {
            if !held {
                return;
            }
            self.lower(ksm_wait);
        }
        if self.time != before {
            log::debug!(
                "{db} of {dm} merges undone: settle time {before:?} -> {:?}",
                self.time
            );
            self.changed_at = Some(now);
            self.epoch = self.epoch.wrapping_add(1);
        }
        self.merges_at = merges;
        self.breaks_at = breaks;
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
            st.judge(m, b, later(&mut t), HALVING);
            assert_eq!(st.time(), S(want));
            assert!(!st.first_sight());
        }
    }

    #[test]
    fn lasting_merges_shorten_it_to_zero_and_a_middle_share_keeps_it() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        st.judge(1000, 900, later(&mut t), HALVING);
        st.judge(2000, 1800, later(&mut t), HALVING);
        assert_eq!(st.time(), S(4));
        // One in eight undone: between the two thresholds.
        st.judge(3000, 1925, later(&mut t), HALVING);
        assert_eq!(st.time(), S(4));
        for want in [2, 0, 0] {
            let (m, b) = (st.merges_at + 1000, st.breaks_at + 10);
            st.judge(m, b, later(&mut t), HALVING);
            assert_eq!(st.time(), S(want));
        }
        assert!(st.first_sight());
    }

    #[test]
    fn it_goes_down_only_after_holding_for_its_own_length() {
        let (mut st, t0) = (Settle::default(), Instant::now());
        for (i, want) in [2, 4, 8, 16].into_iter().enumerate() {
            let n = 1000 * (i as u64 + 1);
            st.judge(n, n / 2, t0, HALVING);
            assert_eq!(st.time(), S(want));
        }
        // Lasting merges 10 s after it reached 16 s: too soon to judge
        // them, the window grows.
        st.judge(20_000, 2000, t0 + S(10), HALVING);
        assert_eq!((st.time(), st.merges_at), (S(16), 4000));
        // 16 s after: the window since 4,000 merges is judged, 16,000
        // merges and no more breaks.
        st.judge(20_000, 2000, t0 + S(16), HALVING);
        assert_eq!((st.time(), st.merges_at), (S(8), 20_000));
        // Breaks raise it at once, however recent the last change.
        st.judge(21_000, 2600, t0 + S(17), HALVING);
        assert_eq!(st.time(), S(16));
    }

    #[test]
    fn breaks_of_merges_made_under_an_earlier_time_do_not_count() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        let boot = st.epoch();
        for _ in 0..1000 {
            st.note_break(boot);
        }
        st.judge(2000, st.undone(), later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
        let raised = st.epoch();
        assert_ne!(raised, boot);
        // The boot's merges keep being undone while the
        // scan, held back, makes none: no news, the time stays.
        for s in 1..=5 {
            for _ in 0..1000 {
                st.note_break(boot);
            }
            st.judge(
                2000,
                st.undone(),
                t + Duration::from_millis(300 * s),
                HALVING,
            );
        }
        assert_eq!((st.time(), st.undone()), (S(2), 1000));
        // Merges made under 2 s, half of them undone: up again.
        for _ in 0..500 {
            st.note_break(raised);
        }
        st.judge(3000, st.undone(), t + S(3), HALVING);
        assert_eq!(st.time(), S(4));
    }

    #[test]
    fn turned_off_it_stays_at_zero() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        st.set_enabled(false);
        st.judge(1000, 900, later(&mut t), HALVING);
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
            st.judge(m, b, later(t), HALVING);
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
        st.judge(m + 1000, b + 10, later(&mut t), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        st.judge(m + 2000, b + 20, later(&mut t), wait);
        assert_eq!(st.time(), Duration::from_millis(2560));
        st.judge(m + 3000, b + 30, later(&mut t), wait);
        assert_eq!(st.time(), Duration::ZERO);
        // Two 384 MiB guests: KSM's wait is below the first step, so
        // straight to 0.
        let mut st = raised(&mut t);
        let (m, b) = (st.merges_at, st.breaks_at);
        st.judge(m + 1000, b + 10, later(&mut t), ksm_wait(196_608, 4096, 20));
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
        st.judge(m + 40, b + 15, t + S(31), wait);
        assert_eq!(st.time(), MAX_SETTLE, "not held for its length yet");
        st.judge(m + 40, b + 15, t + S(32), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        // 16 undone in a small window is not quiet: the window grows.
        let (m, b) = (st.merges_at, st.breaks_at);
        st.judge(m + 40, b + 16, t + S(60), wait);
        assert_eq!(st.time(), Duration::from_millis(5120));
        assert_eq!((st.merges_at, st.breaks_at), (m, b));
        // At 0 a quiet window changes nothing and is not consumed.
        let mut st = Settle::default();
        st.judge(10, 0, later(&mut t), HALVING);
        assert_eq!((st.time(), st.merges_at), (Duration::ZERO, 0));
    }

    #[test]
    fn a_few_merges_are_not_judged() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        st.judge(100, 100, later(&mut t), HALVING);
        assert_eq!(st.time(), Duration::ZERO);
        // Breaks alone, once many: merges made earlier are being undone.
        st.judge(100, 400, later(&mut t), HALVING);
        assert_eq!(st.time(), S(2));
    }

    #[test]
    fn second_looks_wait_the_settle_time_in_intervals() {
        let (mut st, mut t) = (Settle::default(), Instant::now());
        assert_eq!(st.intervals(S(1)), 1);
        st.judge(1000, 900, later(&mut t), HALVING);
        st.judge(2000, 1800, later(&mut t), HALVING);
        assert_eq!(st.intervals(S(1)), 4);
        assert_eq!(st.intervals(Duration::from_millis(1500)), 3);
        assert_eq!(st.intervals(Duration::ZERO), 1);
    }
}
