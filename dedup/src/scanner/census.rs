//! The census of KSM's sharing in the regions the KSM assist handed to
//! KSM: each census pass collects the frames of their present pages and
//! counts the shared ones ([`Census::count`]). It is paced by time, not by
//! `pages_to_scan` (a census is pagemap walks and a sort, not a scan).

use std::time::{Duration, Instant};

use crate::assist::Census;

/// Longest a batch walks KSM's regions for the census (the core lock is
/// held meanwhile): a census of gigabytes of KSM regions takes far longer
/// than a wake-up should, so it is done in slices, on consecutive wake-ups
/// (see [`BatchReport::census_pending`]).
pub(super) const CENSUS_SLICE: Duration = Duration::from_millis(20);

/// How long after the last census the next one is due, given what the last
/// one cost and what KSM is doing. While KSM works (`ksm_busy`: it merged
/// in one of its last `IDLE_SCANS` full scans), at most 5 % of a core (20x
/// the cost apart, and 1 s) once it has finished a full scan since (what
/// it merged in it is counted at once: the figure a converging group
/// settles on), and at most 2 % (50x apart: progress shows) in between.
/// Once it idles, every 2 s at most 0.5 % (200x apart); a full scan of an
/// idle KSM brought nothing to count.
fn census_interval(cost: Duration, ksm_scanned: bool, ksm_busy: bool) -> Duration {
    let floor = Duration::from_secs(1).max(cost * 20);
    if ksm_busy && ksm_scanned {
        floor
    } else if ksm_busy {
        floor.max(cost * 50)
    } else {
        Duration::from_secs(2).max(cost * 200)
    }
}

/// Longest an idle KSM's census waits while nothing moved (see
/// [`Activity`]), and at least 1000x its cost (0.1 % of a core): the
/// bound on how stale the figures get through a change no counter shows
/// (a write into our memory from another process).
fn quiet_interval(cost: Duration) -> Duration {
    Duration::from_secs(30).max(cost * 1000)
}

/// What moves whenever KSM's sharing in our regions can have changed:
/// KSM's count of this process's merged pages (`ksm_merging_pages`: it
/// merged, or unmerged), and this process's minor faults (a write that
/// breaks a share of a KSM page, or of a pool page of the engine's, is a
/// fault in this process: a vCPU's through KVM, a device thread's, the
/// engine's). While both stay put, an idle KSM's census would count the
/// same figures again: skipped, up to [`quiet_interval`]. Counting every
/// 2 s instead made an idle assisted group cost more CPU than KSM at its
/// defaults spends scanning the same memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Activity {
    pub(super) ksm_merging: u64,
    pub(super) faults: u64,
}

impl Activity {
    /// The counters now; None where the kernel lacks one.
    pub(super) fn now() -> Option<Activity> {
        Some(Activity {
            ksm_merging: crate::ksm::self_ksm_stat()?.merging_pages?,
            faults: crate::ksm::self_minor_faults()?,
        })
    }
}

/// The census's figures and pace.
#[derive(Debug)]
pub(super) struct CensusRoom {
    /// (PFN, region `gid_base`) of present anonymous pages of assisted
    /// regions seen this pass; counted at the pass end.
    frames: Vec<(u64, u32)>,
    /// KSM sharing among our assisted regions, as of the last census.
    figures: Census,
    /// This pass collects the census (at most one a second: sorting a
    /// frame list per pass would cost more than the pass itself).
    due: bool,
    /// When the last census pass ended.
    at: Option<Instant>,
    /// Time spent on assisted spans in this census pass, and what the last
    /// census pass cost in all.
    spans: Duration,
    cost: Duration,
    /// Time spent on assisted census spans in the current batch.
    slice: Duration,
    /// The counters that move with KSM's sharing, read when the last
    /// census was scheduled (None: not read, or not readable).
    activity: Option<Activity>,
}

impl Default for CensusRoom {
    fn default() -> Self {
        CensusRoom {
            frames: Vec::new(),
            figures: Census::default(),
            due: true,
            at: None,
            spans: Duration::ZERO,
            cost: Duration::ZERO,
            slice: Duration::ZERO,
            activity: None,
        }
    }
}

impl CensusRoom {
    /// This pass collects the census.
    pub(super) fn due(&self) -> bool {
        self.due
    }

    /// The figures of the last census.
    pub(super) fn figures(&self) -> &Census {
        &self.figures
    }

    /// Forgets the figures (the assist ended).
    pub(super) fn clear(&mut self) {
        self.figures = Census::default();
    }

    /// A batch starts: its census time slice is whole again.
    pub(super) fn start_batch(&mut self) {
        self.slice = Duration::ZERO;
    }

    /// The batch spent its census time slice.
    pub(super) fn slice_spent(&self) -> bool {
        self.slice >= CENSUS_SLICE
    }

    /// A census span took `spent`.
    pub(super) fn charge(&mut self, spent: Duration) {
        self.spans += spent;
        self.slice += spent;
    }

    /// Records a present page of an assisted region, frame `pfn`.
    pub(super) fn note_frame(&mut self, pfn: u64, gid_base: u32) {
        self.frames.push((pfn, gid_base));
    }

    /// Counts this pass's frames into new figures, when there is anything
    /// to count (frames, or sharing to find gone); None otherwise.
    pub(super) fn count(&mut self) -> Option<&Census> {
        let t = Instant::now();
        if self.frames.is_empty() && self.figures.shared == 0 {
            self.finish(t);
            return None;
        }
        self.figures = Census::count(&mut self.frames);
        self.frames.clear();
        self.finish(t);
        Some(&self.figures)
    }

    /// The census pass ends: what it cost in all (its spans' pagemap
    /// walks, the count), which [`census_interval`] keeps to a small share
    /// of a core.
    fn finish(&mut self, t: Instant) {
        self.cost = std::mem::take(&mut self.spans) + t.elapsed();
        self.at = Some(Instant::now());
        log::debug!(
            "census pass: cost {:?}, KSM sharing {} (shared {})",
            self.cost,
            self.figures.sharing,
            self.figures.shared
        );
    }

    /// Are the last census's figures still current: was it taken while
    /// KSM idled, and has nothing that moves with KSM's sharing moved
    /// since (`activity` reads the counters now)?
    pub(super) fn current(&self, activity: impl FnOnce() -> Option<Activity>) -> bool {
        self.activity.is_some() && activity() == self.activity
    }

    /// Decides whether the next pass collects the census, from what the
    /// last one cost and what KSM is doing; `activity` reads the counters
    /// that move with KSM's sharing (only when an idle KSM's census would
    /// be due).
    pub(super) fn schedule(
        &mut self,
        ksm_scanned: bool,
        ksm_busy: bool,
        activity: impl FnOnce() -> Option<Activity>,
    ) {
        let every = census_interval(self.cost, ksm_scanned, ksm_busy);
        let age = self.at.map(|t| t.elapsed());
        let mut due = age.is_none_or(|a| a >= every);
        let mut seen = None;
        if due && !ksm_busy {
            seen = activity();
            let quiet = seen.is_some() && seen == self.activity;
            if quiet && age.is_some_and(|a| a < quiet_interval(self.cost)) {
                due = false;
            }
        }
        if due && !self.due {
            log::debug!(
                "census due: {every:?} after the last (cost {:?}; KSM scanned {ksm_scanned}, busy {ksm_busy})",
                self.cost
            );
        }
        if due {
            self.activity = seen;
        }
        self.due = due;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn census_pace_keeps_each_state_within_its_share_of_a_core() {
        let ms = Duration::from_millis;
        // Cheap censuses: the time floors rule.
        assert_eq!(census_interval(ms(2), true, true), ms(1000));
        assert_eq!(census_interval(ms(2), false, true), ms(1000));
        assert_eq!(census_interval(ms(2), false, false), ms(2000));
        assert_eq!(quiet_interval(ms(2)), ms(30_000));
        // 2 x 2 GiB (~150 ms a census): 5 %, 2 %, 0.5 % of a core, and
        // 0.1 % while nothing moves.
        let c = ms(150);
        for (scanned, busy, share) in [
            (true, true, 0.05),
            (false, true, 0.02),
            (false, false, 0.005),
        ] {
            let every = census_interval(c, scanned, busy);
            let got = c.as_secs_f64() / every.as_secs_f64();
            assert!((got - share).abs() < 1e-9, "{scanned} {busy}: {got}");
        }
        assert!((c.as_secs_f64() / quiet_interval(c).as_secs_f64() - 0.001).abs() < 1e-9);
        // A full scan of a KSM still merging is counted sooner than
        // anything else; a full scan of an idle KSM brought nothing new.
        assert!(census_interval(c, true, true) < census_interval(c, false, true));
        assert_eq!(
            census_interval(c, true, false),
            census_interval(c, false, false)
        );
    }

    fn room_counted_ago(secs: u64) -> CensusRoom {
        CensusRoom {
            at: Some(Instant::now() - Duration::from_secs(secs)),
            cost: Duration::from_millis(5),
            ..CensusRoom::default()
        }
    }

    /// A reader of the counters that finds these values.
    fn a(ksm_merging: u64, faults: u64) -> impl FnOnce() -> Option<Activity> {
        move || {
            Some(Activity {
                ksm_merging,
                faults,
            })
        }
    }

    #[test]
    fn an_idle_ksm_is_counted_again_only_once_something_moved() {
        let mut room = room_counted_ago(3);
        // The counters unknown at the last census: counted (the 2 s rule).
        room.schedule(true, false, a(1000, 50));
        assert!(room.due());
        room.count();
        room.at = Some(Instant::now() - Duration::from_secs(3));
        // Nothing moved: not before the quiet interval.
        room.schedule(true, false, a(1000, 50));
        assert!(!room.due());
        // A fault (a write, maybe to a merged page): counted.
        room.schedule(false, false, a(1000, 51));
        assert!(room.due());
        room.count();
        room.at = Some(Instant::now() - Duration::from_secs(3));
        // KSM merged or unmerged: counted.
        room.schedule(false, false, a(990, 51));
        assert!(room.due());
        room.count();
        // Nothing moved, but the figures are 31 s old: counted.
        room.at = Some(Instant::now() - Duration::from_secs(31));
        room.schedule(false, false, a(990, 51));
        assert!(room.due());
        // Counters the kernel lacks never hold a census back.
        let mut room = room_counted_ago(3);
        room.schedule(false, false, || None);
        assert!(room.due());
        room.count();
        room.at = Some(Instant::now() - Duration::from_secs(3));
        room.schedule(false, false, || None);
        assert!(room.due());
    }

    #[test]
    fn figures_stay_current_while_nothing_moves_after_an_idle_census() {
        let mut room = room_counted_ago(3);
        // No census taken while KSM idled yet: not known current.
        assert!(!room.current(a(1000, 50)));
        room.schedule(true, false, a(1000, 50));
        assert!(room.due());
        room.count();
        assert!(room.current(a(1000, 50)));
        assert!(!room.current(a(1000, 51)));
        assert!(!room.current(a(1001, 50)));
        assert!(!room.current(|| None));
        // A census taken while KSM was busy read no counters.
        let mut room = room_counted_ago(3);
        room.schedule(true, true, || panic!("read while KSM is busy"));
        room.count();
        assert!(!room.current(a(1000, 50)));
    }

    #[test]
    fn a_busy_ksm_is_counted_on_its_own_pace_without_reading_counters() {
        let mut room = room_counted_ago(2);
        room.schedule(true, true, || panic!("read while KSM is busy"));
        assert!(room.due());
        let mut room = room_counted_ago(0);
        room.schedule(false, false, || panic!("read before the census is due"));
        assert!(!room.due());
    }

    #[test]
    fn this_processs_faults_count_its_first_touches() {
        let f = crate::ksm::self_minor_faults().expect("/proc/self/stat");
        assert!(f > 0);
        let v: Vec<u8> = vec![1; 64 << 12];
        let g = crate::ksm::self_minor_faults().unwrap();
        assert!(g >= f + 32, "64 touched pages, {} faults", g - f);
        drop(v);
    }
}
