//! A batch's park of the guests (`crate::quiesce`), bounded by the pause
//! budget: a guest is never held for much longer than the budget at once.
//! Parking saves the batch's TLB-flush IPIs, but every window of it is a
//! stop of the guests' vCPUs, which their tenants feel as latency.
//!
//! A park can end only between two steps of the batch (merge windows), so
//! a step must fit in the budget too: the park measures what a page of a
//! step costs on this host and sizes the steps to half the budget. The
//! cost differs by orders of magnitude between hosts (page-table changes
//! trap on a paravirtualised host), so it is measured, not assumed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::quiesce::{Parked, Quiesce};

/// The park of one batch (merges, an unmerge, a take-back from KSM). Held
/// for the batch; its owner calls [`BoundedPark::checkpoint`] between two
/// steps (windows, chunks), where a park may end.
pub(super) struct BoundedPark {
    /// What parks: empty when the batch does not park at all.
    quiescers: Vec<Arc<dyn Quiesce>>,
    /// Longest park; `None`: as long as the batch.
    budget: Option<Duration>,
    parked: Option<Parked>,
    since: Instant,
    /// Measured cost of a page of a step, nanoseconds (0: not yet known).
    ns_per_page: f64,
}

/// The fewest pages a step is cut to: below it a step's fixed costs (a
/// write-protect call, a `mmap`) would outweigh its pages.
const MIN_STEP_PAGES: usize = 8;

impl BoundedPark {
    /// Parks `quiescers` (none: a batch that does not park).
    /// `ns_per_page`: the cost the last batch measured ([`Self::cost`]).
    pub(super) fn start(
        quiescers: Vec<Arc<dyn Quiesce>>,
        budget: Option<Duration>,
        ns_per_page: f64,
    ) -> Self {
        let since = Instant::now();
        let parked = (!quiescers.is_empty()).then(|| Parked::park(&quiescers));
        BoundedPark {
            quiescers,
            budget,
            parked,
            since,
            ns_per_page,
        }
    }

    /// A batch that parks nothing.
    pub(super) fn none(ns_per_page: f64) -> Self {
        BoundedPark::start(Vec::new(), None, ns_per_page)
    }

    /// Most pages the next step may span: as many as half the budget pays
    /// for at the measured cost, at least [`MIN_STEP_PAGES`]; unbounded
    /// (`usize::MAX`) while unparked or before a cost is known.
    pub(super) fn window_pages(&self) -> usize {
        match self.budget {
            Some(b) if self.parked.is_some() && self.ns_per_page > 0.0 => {
                let pages = b.as_nanos() as f64 / 2.0 / self.ns_per_page;
                (pages as usize).max(MIN_STEP_PAGES)
            }
            _ => usize::MAX,
        }
    }

    /// A step of `pages` pages took `took`: the cost follows it (a moving
    /// average, so one slow step does not halve the next ones). Steps run
    /// unparked cost more (their flushes reach running vCPUs) and are not
    /// what sizes parked steps: not counted.
    pub(super) fn timed(&mut self, pages: usize, took: Duration) {
        if pages == 0 || self.parked.is_none() {
            return;
        }
        let per = took.as_nanos() as f64 / pages as f64;
        self.ns_per_page = if self.ns_per_page > 0.0 {
            0.75 * self.ns_per_page + 0.25 * per
        } else {
            per
        };
    }

    /// The measured cost, for the next batch.
    pub(super) fn cost(&self) -> f64 {
        self.ns_per_page
    }

    /// Between two steps of the batch: a park that has lasted the budget
    /// ends, the guests run for as long as the budget, and the next steps
    /// park them anew. So a guest stops at most about the budget plus one
    /// step at a time, and at most half the time while the batch lasts.
    pub(super) fn checkpoint(&mut self) {
        let Some(budget) = self.budget else {
            return;
        };
        if self.parked.is_none() || self.since.elapsed() < budget {
            return;
        }
        self.parked = None;
        std::thread::sleep(budget);
        self.since = Instant::now();
        self.parked = Some(Parked::park(&self.quiescers));
    }

    /// The guests are parked now.
    #[cfg(test)]
    pub(super) fn is_parked(&self) -> bool {
        self.parked.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Records when it was held and released.
    #[derive(Default)]
    struct Log {
        held: AtomicUsize,
        windows: Mutex<Vec<(Instant, Option<Instant>)>>,
    }

    impl Quiesce for Log {
        fn request(&self) {
            self.held.fetch_add(1, Ordering::SeqCst);
            self.windows.lock().unwrap().push((Instant::now(), None));
        }
        fn stopped(&self) -> bool {
            true
        }
        fn release(&self) {
            self.held.fetch_sub(1, Ordering::SeqCst);
            self.windows.lock().unwrap().last_mut().unwrap().1 = Some(Instant::now());
        }
    }

    fn log() -> (Arc<Log>, Vec<Arc<dyn Quiesce>>) {
        let l = Arc::new(Log::default());
        let q: Arc<dyn Quiesce> = l.clone();
        (l, vec![q])
    }

    #[test]
    fn a_park_that_lasted_the_budget_lets_the_guests_run_as_long() {
        let (l, q) = log();
        let budget = Duration::from_millis(3);
        let mut p = BoundedPark::start(q, Some(budget), 0.0);
        p.checkpoint();
        assert_eq!(l.windows.lock().unwrap().len(), 1, "within the budget");
        std::thread::sleep(budget);
        p.checkpoint();
        assert!(p.is_parked());
        drop(p);
        assert_eq!(l.held.load(Ordering::SeqCst), 0, "released once each");
        let w = l.windows.lock().unwrap();
        assert_eq!(w.len(), 2, "parked again after the checkpoint");
        let (end0, start1) = (w[0].1.unwrap(), w[1].0);
        assert!(
            start1 - end0 >= budget,
            "the guests ran {:?}",
            start1 - end0
        );
    }

    #[test]
    fn without_a_budget_or_quiescers_nothing_changes() {
        let (l, q) = log();
        let mut p = BoundedPark::start(q, None, 0.0);
        std::thread::sleep(Duration::from_millis(2));
        p.checkpoint();
        drop(p);
        assert_eq!(l.windows.lock().unwrap().len(), 1);
        let mut none = BoundedPark::none(0.0);
        assert!(!none.is_parked());
        none.checkpoint();
        assert!(!none.is_parked());
        none.timed(100, Duration::from_millis(1));
        assert_eq!(none.window_pages(), usize::MAX, "unparked: no cap");
    }

    #[test]
    fn steps_are_sized_to_half_the_budget_at_the_measured_cost() {
        let (_l, q) = log();
        let mut p = BoundedPark::start(q, Some(Duration::from_micros(500)), 0.0);
        assert_eq!(p.window_pages(), usize::MAX, "no cost known yet");
        // 128 pages in 3.2 ms: 25 µs a page, 250 µs pays for 10 pages.
        p.timed(128, Duration::from_micros(3200));
        assert_eq!(p.window_pages(), 10);
        // One fast step moves the average a quarter of the way.
        p.timed(10, Duration::from_micros(50));
        assert!((p.cost() - 20_000.0).abs() < 1.0, "{}", p.cost());
        // A host where a page costs 2 µs: 125 pages per step.
        let (_l, q) = log();
        let mut fast = BoundedPark::start(q, Some(Duration::from_micros(500)), 2_000.0);
        assert_eq!(fast.window_pages(), 125);
        // Never below the floor.
        fast.timed(1, Duration::from_millis(100));
        assert_eq!(fast.window_pages(), MIN_STEP_PAGES);
    }
}
