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
/// one cost. When KSM has finished a full scan since (what it merged in it
/// is counted at once: the figure a converging group settles on), at most
/// 5 % of a core (20x the cost apart, and 1 s); in between, while KSM
/// works, at most 2 % (50x apart: progress shows); once it idles, every
/// 2 s at most 0.5 % (200x apart, so that the engine's share of an idle
/// assisted group costs about what idle KSM at its defaults does).
fn census_interval(cost: Duration, ksm_scanned: bool, ksm_busy: bool) -> Duration {
    let floor = Duration::from_secs(1).max(cost * 20);
    if ksm_scanned {
        floor
    } else if ksm_busy {
        floor.max(cost * 50)
    } else {
        Duration::from_secs(2).max(cost * 200)
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

    /// Decides whether the next pass collects the census, from what the
    /// last one cost and what KSM is doing.
    pub(super) fn schedule(&mut self, ksm_scanned: bool, ksm_busy: bool) {
        let every = census_interval(self.cost, ksm_scanned, ksm_busy);
        let due = self.at.is_none_or(|t| t.elapsed() >= every);
        if due && !self.due {
            log::debug!(
                "census due: {every:?} after the last (cost {:?}; KSM scanned {ksm_scanned}, busy {ksm_busy})",
                self.cost
            );
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
        // 2 x 2 GiB (~150 ms a census): 5 %, 2 %, 0.5 % of a core.
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
        // A finished KSM scan is counted sooner than anything else.
        assert!(census_interval(c, true, false) < census_interval(c, false, true));
    }
}
