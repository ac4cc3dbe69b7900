//! A batch's park of the guests (`crate::quiesce`), bounded by the pause
//! budget: a guest is never held for much longer than the budget at once.
//! Parking saves the batch's TLB-flush IPIs, but every window of it is a
//! stop of the guests' vCPUs, which their tenants feel as latency.
//!
//! A park can end only between two steps of the batch (merge windows), so
//! a step must fit in the budget too: the park measures what a page of a
//! step costs on this host and sizes the steps to half the budget. The
//! cost differs by orders of magnitude between hosts (page-table changes
//! trap on a paravirtualised host), so it is measured, not assumed
//! ([`ParkCosts`], which also decides whether a merge batch parks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::park_costs::{ParkCosts, Way, MIN_STEP_PAGES, PROBE_STEP_PAGES};
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
    /// What the current park took to start, ns.
    park_ns: f64,
    /// The host's measured costs, updated by this batch.
    costs: ParkCosts,
    /// Pages still to run unparked before the first park (the running
    /// cost's probe, [`Way::ProbeThenPark`]).
    probe_left: usize,
    /// The first park waits for the probe to end.
    park_after_probe: bool,
    /// The batch's figures count ([`ParkCosts::batch_took`]): it had
    /// guests to park, whichever way it went.
    measured: bool,
    /// Pages of the batch's windows so far.
    pages: usize,
    /// `pages` when the current park began.
    parked_from: usize,
    /// When the batch's current way began (its start, or the end of its
    /// probe), and its pages then.
    way_since: (Instant, usize),
}

/// Longest wait for released threads to leave their wait before the
/// guests' run time starts counting anyway.
const RELEASE_WAIT: Duration = Duration::from_millis(10);

impl BoundedPark {
    /// Parks `quiescers` (none: a batch that does not park). `costs`:
    /// the host's costs as measured so far ([`Self::finish`] returns them
    /// with this batch's measurements).
    pub(super) fn start(
        quiescers: Vec<Arc<dyn Quiesce>>,
        budget: Option<Duration>,
        costs: ParkCosts,
    ) -> Self {
        BoundedPark::start_as(quiescers, budget, costs, Way::Park)
    }

    /// [`BoundedPark::start`], the way `way` says: [`Way::Run`] parks
    /// nothing, [`Way::ProbeThenPark`] parks after its first pages.
    pub(super) fn start_as(
        quiescers: Vec<Arc<dyn Quiesce>>,
        budget: Option<Duration>,
        costs: ParkCosts,
        way: Way,
    ) -> Self {
        let measured = !quiescers.is_empty();
        let (quiescers, probe_left) = match way {
            Way::Run => (Vec::new(), 0),
            Way::Park => (quiescers, 0),
            Way::ProbeThenPark(n) => (quiescers, n),
        };
        let mut p = BoundedPark {
            measured,
            pages: 0,
            parked_from: 0,
            way_since: (Instant::now(), 0),
            park_after_probe: probe_left > 0 && !quiescers.is_empty(),
            quiescers,
            budget,
            parked: None,
            since: Instant::now(),
            park_ns: 0.0,
            costs,
            probe_left,
        };
        if !p.park_after_probe {
            p.park();
        }
        p
    }

    /// A batch that parks nothing.
    pub(super) fn none(costs: ParkCosts) -> Self {
        BoundedPark::start(Vec::new(), None, costs)
    }

    /// Parks the quiescers, if any: the window starts now.
    fn park(&mut self) {
        self.since = Instant::now();
        self.parked_from = self.pages;
        if !self.quiescers.is_empty() {
            let wait = self.costs.halt_grace.next();
            let (parked, grace) = Parked::park(&self.quiescers, wait);
            self.costs.halt_grace.took(grace);
            self.parked = Some(parked);
            // The guests ran while the park waited for them to halt: the
            // park, and its budget, begin after that wait.
            self.since += grace.waited;
            self.park_ns = self.since.elapsed().as_nanos() as f64;
        }
    }

    /// Ends the park, if one is on, and counts what parking and releasing
    /// cost.
    fn release(&mut self) {
        if let Some(p) = self.parked.take() {
            let t = Instant::now();
            drop(p);
            self.costs
                .park_took(self.park_ns + t.elapsed().as_nanos() as f64);
        }
    }

    /// The batch ends: the guests go, and the costs it measured come back.
    pub(super) fn finish(mut self) -> ParkCosts {
        let parked = self.parked.is_some();
        self.release();
        self.way_took(parked);
        self.costs
    }

    /// The batch's pages since its current way began took the time since
    /// then: a figure of that way ([`ParkCosts::batch_took`]).
    fn way_took(&mut self, parked: bool) {
        let (t, p) = self.way_since;
        if self.measured {
            self.costs
                .batch_took(parked, self.pages - p, t.elapsed().as_nanos() as f64);
        }
        self.way_since = (Instant::now(), self.pages);
    }

    /// Most pages the next step may span: as many as half the budget pays
    /// for at the measured cost, at least [`MIN_STEP_PAGES`];
    /// [`PROBE_STEP_PAGES`] before a cost is known (the first parked step
    /// measures it: unbounded, it held the guests for a whole batch,
    /// seconds on an emulated CPU) and where even the least step outlasts
    /// the budget (a probe park: its one step measures, then the batch
    /// runs unparked); unbounded (`usize::MAX`) while unparked.
    pub(super) fn window_pages(&self) -> usize {
        if self.park_after_probe {
            return self.probe_left.max(1);
        }
        let per = self.costs.parked_page_ns();
        match self.budget {
            Some(_)
                if self.parked.is_some() && (per <= 0.0 || !self.costs.park_fits(self.budget)) =>
            {
                PROBE_STEP_PAGES
            }
            Some(b) if self.parked.is_some() => {
                let pages = b.as_nanos() as f64 / 2.0 / per;
                (pages as usize).max(MIN_STEP_PAGES)
            }
            _ => usize::MAX,
        }
    }

    /// A merge window of `pages` pages took `took`, parked or not
    /// ([`ParkCosts::window`]: moving averages, so one slow window does
    /// not halve the next ones).
    pub(super) fn timed(&mut self, pages: usize, took: Duration) {
        let parked = self.parked.is_some();
        self.costs.window(parked, pages, took.as_nanos() as f64);
        self.pages += pages;
        if self.park_after_probe {
            self.probe_left = self.probe_left.saturating_sub(pages);
        }
    }

    /// Between two steps of the batch: a park that has lasted the budget
    /// ends, the guests run for as long as the budget, and the next steps
    /// park them anew. So a guest stops at most about the budget plus one
    /// step at a time, and at most half the time while the batch lasts.
    pub(super) fn checkpoint(&mut self) {
        if self.park_after_probe {
            if self.probe_left == 0 {
                self.park_after_probe = false;
                self.way_took(false);
                self.park();
            }
            return;
        }
        let Some(budget) = self.budget else {
            return;
        };
        if self.parked.is_some()
            && self.pages > self.parked_from
            && !self.costs.park_fits(Some(budget))
        {
            // Even the least step outlasts the budget here: the rest of
            // the batch runs unparked (`ParkCosts::park_fits`). Not before
            // a step ran parked: a park that ended before any step would
            // have stopped the guests for nothing, and measured nothing.
            log::debug!(
                "a parked step of {MIN_STEP_PAGES} pages takes {:.0} us, over the pause \
                 budget of {} us: the batch goes on unparked",
                MIN_STEP_PAGES as f64 * self.costs.parked_page_ns() / 1e3,
                budget.as_micros()
            );
            self.release();
            self.way_took(true);
            self.quiescers.clear();
            return;
        }
        if self.parked.is_none() || self.since.elapsed() < budget {
            return;
        }
        if !self.quiescers.iter().any(|q| q.holds_threads()) {
            // No guest is kept waiting by this park (idle guests, outside
            // guest code): it goes on, and the budget counts from now.
            self.since = Instant::now();
            return;
        }
        self.release();
        // The guests run for as long as the budget from when the last
        // released thread has left its wait: waking a thread can take a
        // while on a busy host, and parked again before it ran, a guest
        // would get no run at all between two parks.
        let t = Instant::now();
        while self.quiescers.iter().any(|q| q.holds_threads()) && t.elapsed() < RELEASE_WAIT {
            std::thread::sleep(Duration::from_micros(50));
        }
        std::thread::sleep(budget);
        self.costs.gap_took(t.elapsed().as_nanos() as f64);
        self.park();
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
        let mut p = BoundedPark::start(q, Some(budget), ParkCosts::default());
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
        let mut p = BoundedPark::start(q, None, ParkCosts::default());
        std::thread::sleep(Duration::from_millis(2));
        p.checkpoint();
        drop(p);
        assert_eq!(l.windows.lock().unwrap().len(), 1);
        let mut none = BoundedPark::none(ParkCosts::default());
        assert!(!none.is_parked());
        none.checkpoint();
        assert!(!none.is_parked());
        none.timed(100, Duration::from_millis(1));
        assert_eq!(none.window_pages(), usize::MAX, "unparked: no cap");
        let costs = none.finish();
        assert_eq!(
            costs.parked_page_ns(),
            0.0,
            "an unparked window is not a parked cost"
        );
    }

    #[test]
    fn a_probe_runs_its_pages_unparked_then_parks() {
        let (l, q) = log();
        let mut p = BoundedPark::start_as(
            q,
            Some(Duration::from_secs(1)),
            ParkCosts::default(),
            Way::ProbeThenPark(64),
        );
        assert!(!p.is_parked());
        assert_eq!(p.window_pages(), 64, "the probe is one window");
        p.checkpoint();
        assert!(!p.is_parked(), "the probe has not run yet");
        p.timed(40, Duration::from_micros(400));
        assert_eq!(p.window_pages(), 24);
        p.checkpoint();
        assert!(!p.is_parked());
        p.timed(24, Duration::from_micros(240));
        p.checkpoint();
        assert!(p.is_parked(), "parked once the probe ran");
        p.timed(100, Duration::from_micros(100));
        let costs = p.finish();
        assert_eq!(l.windows.lock().unwrap().len(), 1);
        assert_eq!(l.held.load(Ordering::SeqCst), 0);
        // 10 µs a page running (the probe), 1 µs parked; and both ways'
        // whole-batch figures (real time here), so no more probing.
        let mut c = costs;
        assert_eq!(c.parked_page_ns(), 1_000.0);
        assert_ne!(
            c.way(4096, None),
            Way::ProbeThenPark(super::super::park_costs::PROBE_MAX_PAGES),
            "both ways of a large batch are measured: {costs:?}"
        );
        // Run: no park at all.
        let (l, q) = log();
        let mut p = BoundedPark::start_as(q, None, ParkCosts::default(), Way::Run);
        p.checkpoint();
        p.timed(10, Duration::from_micros(10));
        p.finish();
        assert!(l.windows.lock().unwrap().is_empty());
    }

    #[test]
    fn a_park_whose_least_step_outlasts_the_budget_ends_and_the_batch_runs() {
        let (l, q) = log();
        let budget = Duration::from_micros(500);
        let mut p = BoundedPark::start(q, Some(budget), ParkCosts::default());
        assert!(p.is_parked());
        assert_eq!(
            p.window_pages(),
            PROBE_STEP_PAGES,
            "the first step measures"
        );
        p.checkpoint();
        assert!(p.is_parked(), "no step ran yet");
        // 1 page in 500 µs: a least step of 4 ms.
        p.timed(PROBE_STEP_PAGES, Duration::from_micros(500));
        p.checkpoint();
        assert!(!p.is_parked(), "released at the first checkpoint");
        assert_eq!(l.held.load(Ordering::SeqCst), 0);
        assert_eq!(p.window_pages(), usize::MAX, "unparked: no cap");
        p.timed(1000, Duration::from_millis(10));
        p.checkpoint();
        assert!(!p.is_parked(), "and not parked again in this batch");
        let costs = p.finish();
        assert_eq!(l.windows.lock().unwrap().len(), 1, "one park, one step");
        assert!(!costs.park_fits(Some(budget)), "{costs:?}");
        // A probe park with those costs known runs its first step parked
        // (measuring it again), then ends.
        let (l, q) = log();
        let mut p = BoundedPark::start(q, Some(budget), costs);
        p.checkpoint();
        assert!(p.is_parked(), "the probe's step runs parked");
        assert_eq!(p.window_pages(), PROBE_STEP_PAGES, "and is one page");
        // 50 µs a page: a quarter of the way from 500 µs, still over.
        p.timed(PROBE_STEP_PAGES, Duration::from_micros(50));
        p.checkpoint();
        assert!(!p.is_parked());
        let costs = p.finish();
        assert!(
            (costs.parked_page_ns() - 387_500.0).abs() < 1.0,
            "{costs:?}"
        );
        assert_eq!(l.windows.lock().unwrap().len(), 1);
        // Within the budget the park goes on.
        let (_l, q) = log();
        let mut p = BoundedPark::start(q, Some(budget), ParkCosts::default());
        p.timed(PROBE_STEP_PAGES, Duration::from_micros(10));
        p.checkpoint();
        assert!(p.is_parked());
    }

    #[test]
    fn steps_are_sized_to_half_the_budget_at_the_measured_cost() {
        let (_l, q) = log();
        let mut p = BoundedPark::start(q, Some(Duration::from_micros(500)), ParkCosts::default());
        assert_eq!(p.window_pages(), PROBE_STEP_PAGES, "no cost known yet");
        // 128 pages in 3.2 ms: 25 µs a page, 250 µs pays for 10 pages.
        p.timed(128, Duration::from_micros(3200));
        assert_eq!(p.window_pages(), 10);
        // One fast step moves the average a quarter of the way.
        p.timed(10, Duration::from_micros(50));
        let costs = p.finish();
        assert!((costs.parked_page_ns() - 20_000.0).abs() < 1.0, "{costs:?}");
        // A host where a page costs 2 µs: 125 pages per step.
        let (_l, q) = log();
        let mut known = ParkCosts::default();
        known.window(true, 1, 2_000.0);
        let mut fast = BoundedPark::start(q, Some(Duration::from_micros(500)), known);
        assert_eq!(fast.window_pages(), 125);
        // Never below the floor while the least step fits: 8 pages at
        // about 44 µs (a quarter of the way from 2 µs to 170 µs) take 350
        // µs, within the budget, though half of it pays for only 5.
        fast.timed(1, Duration::from_micros(170));
        assert_eq!(fast.window_pages(), MIN_STEP_PAGES);
        // Where it does not fit, the one-page probe step.
        fast.timed(1, Duration::from_millis(100));
        assert_eq!(fast.window_pages(), PROBE_STEP_PAGES);
    }
}
