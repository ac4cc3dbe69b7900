//! Whether a merge batch parks the guests, decided from what parking and
//! not parking cost on this host, measured while the engine runs.
//!
//! A park has a fixed price: kick every vCPU out of guest mode, wait for
//! them, release and wake them. It makes each page's TLB flushes local.
//! Without it each flush is an IPI to every CPU running a vCPU, which
//! costs a few hundred nanoseconds on a host with hardware virtualisation
//! and far more where IPIs trap to a hypervisor. So no constant is right
//! for every host: the engine measures a merge window's cost per page both
//! ways and the park's fixed cost, parks a batch when that is cheaper for
//! its size, and runs a small batch the other way now and then so that
//! the figure it does not use stays current.

use std::time::Duration;

use super::halt_grace::HaltGrace;

/// One batch in this many goes the other way, to keep measuring it.
const PROBE_EVERY: u32 = 32;

/// The fewest pages a parked step is cut to: below it a step's fixed costs
/// (a write-protect call, a `mmap`) would outweigh its pages.
pub(super) const MIN_STEP_PAGES: usize = 8;

/// The step of a park that measures: the first, before a parked page's
/// cost is known, and the one a probe park runs where even the least step
/// outlasts the pause budget ([`ParkCosts::park_fits`]). One page, the
/// least a park can stop the guests for: at the least step's eight, a
/// host where a merged page costs a millisecond (an emulated CPU) stopped
/// its guests 8 ms at each measure, eight times the default budget.
pub(super) const PROBE_STEP_PAGES: usize = 1;

/// Most pages run the other way as a probe: a probe on a host where the
/// other way is much dearer must stay cheap. A larger batch that probes
/// the running cost runs this many pages unparked, then parks.
pub(super) const PROBE_MAX_PAGES: usize = 64;

/// How a merge batch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// Parked from its first window.
    Park,
    /// Unparked throughout.
    Run,
    /// Its first this-many pages unparked (the running cost's probe), the
    /// rest parked.
    ProbeThenPark(usize),
}

/// The moving averages of the costs, nanoseconds (0: not measured yet).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct ParkCosts {
    /// A park's fixed cost: request, wait, release and wake.
    fixed_ns: f64,
    /// A page of a merge window while the guests are parked.
    parked_page_ns: f64,
    /// A page of a merge window while the guests run.
    running_page_ns: f64,
    /// What the engine waits between two parks of one batch that the
    /// pause budget split: the released threads leaving their wait, then
    /// the guests' run of the budget's length.
    gap_ns: f64,
    /// A page of a whole batch of at least [`PROBE_MAX_PAGES`] pages run
    /// parked: from its start to its end, parks and the guests' runs
    /// between them included.
    parked_batch_ns: f64,
    /// A page of a batch of at least [`PROBE_MAX_PAGES`] pages run
    /// unparked (or of a probe's pages).
    running_batch_ns: f64,
    /// Small batches since the last probe.
    since_probe: u32,
    /// Large batches since the last probe.
    since_large_probe: u32,
    /// How long a park waits for the guests to halt on their own.
    pub(super) halt_grace: HaltGrace,
}

/// A quarter of each new sample: one odd sample moves the average little.
fn follow(avg: f64, sample: f64) -> f64 {
    if avg > 0.0 {
        0.75 * avg + 0.25 * sample
    } else {
        sample
    }
}

/// Moves `avg` towards `ns` spread over `pages` pages (none: no sample).
fn follow_per_page(avg: &mut f64, pages: usize, ns: f64) {
    if pages > 0 {
        *avg = follow(*avg, ns / pages as f64);
    }
}

impl ParkCosts {
    /// How a batch of `pages` pages runs under the pause budget `budget`.
    ///
    /// A batch of at least [`PROBE_MAX_PAGES`] pages goes by what whole
    /// batches cost ([`ParkCosts::large_way`]). A smaller one goes by its
    /// windows' costs: parked, it pays each park's fixed cost, one park per
    /// budget's worth of parked work, with the guests' run between two of
    /// them (`gap_ns`, at least the budget); running, each page pays its
    /// flushes. Until the parked cost is known a small batch parks
    /// (parking is never the costly mistake where IPIs trap); until the
    /// running cost is known it runs, which measures it at a small price.
    /// One small batch in [`PROBE_EVERY`] goes the way not taken.
    pub(super) fn way(&mut self, pages: usize, budget: Option<Duration>) -> Way {
        if pages >= PROBE_MAX_PAGES {
            return self.large_way(pages, budget);
        }
        if self.fixed_ns <= 0.0 || self.parked_page_ns <= 0.0 {
            return Way::Park;
        }
        if self.running_page_ns <= 0.0 {
            return Way::Run;
        }
        let n = pages as f64;
        let park = self.park_fits(budget) && self.parked_ns(n, budget) <= n * self.running_page_ns;
        self.since_probe = self.since_probe.saturating_add(1);
        if self.since_probe < PROBE_EVERY {
            return if park { Way::Park } else { Way::Run };
        }
        self.since_probe = 0;
        let way = if park { Way::Run } else { Way::Park };
        self.log_probe(pages, way);
        way
    }

    /// [`ParkCosts::way`] for a batch of at least [`PROBE_MAX_PAGES`]
    /// pages: by the whole batches' measured cost per page each way. A
    /// window's cost per page depends on its size (a window pays its
    /// protect, remap and flushes once), and parked windows are cut to the
    /// budget while unparked ones are not; a large parked batch also pays
    /// a park and the guests' run per budget's worth of work. So large
    /// batches compare what whole batches cost: the running figure comes
    /// from the first [`PROBE_MAX_PAGES`] pages of a batch run unparked
    /// (cheap wherever running is dear), the parked one from parked
    /// batches. Where running is cheaper, a whole batch parks as a probe
    /// only once in [`PROBE_EVERY`] times the ratio of the costs, so that
    /// probing costs about the same share of the time whatever the ratio.
    fn large_way(&mut self, pages: usize, budget: Option<Duration>) -> Way {
        if !self.park_fits(budget) {
            // No park keeps within the budget here. One batch in
            // PROBE_EVERY parks for its first step (it then goes on
            // unparked, `BoundedPark::checkpoint`), so that the parked cost
            // stays current: a host that got faster parks again.
            self.since_large_probe = self.since_large_probe.saturating_add(1);
            if self.since_large_probe < PROBE_EVERY {
                return Way::Run;
            }
            self.since_large_probe = 0;
            self.log_probe(pages, Way::Park);
            return Way::Park;
        }
        // A probe measures running on its first pages and parking on the
        // rest, when the rest is large enough to count; a batch too small
        // for both runs whole as the running probe.
        let probe = if pages >= 2 * PROBE_MAX_PAGES {
            Way::ProbeThenPark(PROBE_MAX_PAGES)
        } else {
            Way::Run
        };
        match (self.parked_batch_ns > 0.0, self.running_batch_ns > 0.0) {
            // The first large batch measures both, or parks.
            (false, false) if probe == Way::Run => return Way::Park,
            (false, false) => return probe,
            (false, true) => return Way::Park,
            (true, false) => return probe,
            (true, true) => {}
        }
        let park = self.parked_batch_ns <= self.running_batch_ns;
        self.since_large_probe = self.since_large_probe.saturating_add(1);
        let every = if park {
            PROBE_EVERY
        } else {
            let ratio = self.parked_batch_ns / self.running_batch_ns;
            (f64::from(PROBE_EVERY) * ratio).min(f64::from(u32::MAX)) as u32
        };
        if self.since_large_probe < every {
            return if park { Way::Park } else { Way::Run };
        }
        self.since_large_probe = 0;
        let way = if park { probe } else { Way::Park };
        self.log_probe(pages, way);
        way
    }

    fn log_probe(&self, pages: usize, way: Way) {
        log::debug!(
            "park costs: {:.1} us a park, {:.2} us a page parked, {:.2} us running, \
             {:.1} us between parks; batches: {:.2} us a page parked, {:.2} us running; \
             a batch of {pages} probes: {way:?}",
            self.fixed_ns / 1e3,
            self.parked_page_ns / 1e3,
            self.running_page_ns / 1e3,
            self.gap_ns / 1e3,
            self.parked_batch_ns / 1e3,
            self.running_batch_ns / 1e3,
        );
    }

    /// `pages` pages of a batch (or of a probe) took `ns` from start to
    /// end, parked or not. Counts only from [`PROBE_MAX_PAGES`] pages.
    pub(super) fn batch_took(&mut self, parked: bool, pages: usize, ns: f64) {
        if pages < PROBE_MAX_PAGES {
            return;
        }
        let avg = if parked {
            &mut self.parked_batch_ns
        } else {
            &mut self.running_batch_ns
        };
        follow_per_page(avg, pages, ns);
    }

    /// The engine's time for `n` pages parked under `budget`, ns.
    fn parked_ns(&self, n: f64, budget: Option<Duration>) -> f64 {
        let work = n * self.parked_page_ns;
        let Some(b) = budget.map(|b| b.as_nanos() as f64).filter(|&b| b > 0.0) else {
            return work + self.fixed_ns;
        };
        let parks = (work / b).ceil().max(1.0);
        let gap = self.gap_ns.max(b);
        work + parks * self.fixed_ns + (parks - 1.0) * gap
    }

    /// A merge window of `pages` pages took `ns`, parked or not.
    pub(super) fn window(&mut self, parked: bool, pages: usize, ns: f64) {
        let avg = if parked {
            &mut self.parked_page_ns
        } else {
            &mut self.running_page_ns
        };
        follow_per_page(avg, pages, ns);
    }

    /// Parking and releasing the guests once took `ns`.
    pub(super) fn park_took(&mut self, ns: f64) {
        self.fixed_ns = follow(self.fixed_ns, ns);
    }

    /// The engine waited `ns` between two parks of one batch.
    pub(super) fn gap_took(&mut self, ns: f64) {
        self.gap_ns = follow(self.gap_ns, ns);
    }

    /// Can a park keep within `budget` on this host: does the least step
    /// ([`MIN_STEP_PAGES`] pages, the finest a park can be split) take
    /// at most the budget, at the measured cost of a parked page? Where
    /// it cannot (an emulated CPU, where a merged page costs hundreds of
    /// microseconds), every park outlasts the budget whatever the cut,
    /// and the guests pay for the engine's saving in stops: batches run
    /// unparked, and a park under way ends (`BoundedPark::checkpoint`).
    /// True while the cost is unknown or nothing bounds a park.
    pub(super) fn park_fits(&self, budget: Option<Duration>) -> bool {
        match budget {
            Some(b) if self.parked_page_ns > 0.0 => {
                MIN_STEP_PAGES as f64 * self.parked_page_ns <= b.as_nanos() as f64
            }
            _ => true,
        }
    }

    /// A page of a parked merge window, ns (0: not measured yet).
    pub(super) fn parked_page_ns(&self) -> f64 {
        self.parked_page_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(fixed: f64, parked: f64, running: f64) -> ParkCosts {
        let mut c = ParkCosts::default();
        c.park_took(fixed);
        c.window(true, 1, parked);
        c.window(false, 1, running);
        c
    }

    /// [`measured`] with whole large batches at `parked` and `running` ns
    /// a page.
    fn batches(parked: f64, running: f64) -> ParkCosts {
        let mut c = measured(50_000.0, parked, running);
        c.batch_took(true, 1000, parked * 1000.0);
        c.batch_took(false, 64, running * 64.0);
        c
    }

    const BUDGET: Option<Duration> = Some(Duration::from_micros(500));

    #[test]
    fn small_batches_park_until_measured_then_probe_running() {
        let mut c = ParkCosts::default();
        assert_eq!(c.way(8, BUDGET), Way::Park);
        c.window(true, 10, 20_000.0);
        assert_eq!(c.way(8, BUDGET), Way::Park, "no park measured yet");
        c.park_took(30_000.0);
        assert_eq!(c.parked_page_ns(), 2_000.0);
        assert_eq!(c.way(8, BUDGET), Way::Run, "the running cost is not known");
    }

    #[test]
    fn where_flushes_trap_small_batches_park() {
        // Parked 25 µs a page, 100 µs running, 50 µs a park.
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        for pages in [1, 8, 63] {
            assert_eq!(c.way(pages, BUDGET), Way::Park, "{pages}");
        }
    }

    #[test]
    fn with_cheap_flushes_a_small_batch_parks_from_its_break_even() {
        // Parked 2 µs a page, 2.5 µs running, 40 µs a park: from 80 pages
        // without a budget, never below 64 pages.
        let mut c = measured(40_000.0, 2_000.0, 2_500.0);
        assert_eq!(c.way(10, None), Way::Run);
        assert_eq!(c.way(63, None), Way::Run);
        // Dear parks under a budget: 4 ms between parks, 2 ms a park, and
        // 30 µs a page parked make 60 pages 4 parks.
        let mut c = measured(2_000_000.0, 30_000.0, 40_000.0);
        c.gap_took(4_000_000.0);
        assert_eq!(c.way(60, BUDGET), Way::Run);
        assert_eq!(c.way(60, None), Way::Run);
    }

    #[test]
    fn a_large_batch_measures_both_ways_then_takes_the_cheaper() {
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        // Nothing known of whole batches: the first probes running on 64
        // pages and parks the rest; one too small for both parks.
        assert_eq!(c.way(4096, BUDGET), Way::ProbeThenPark(PROBE_MAX_PAGES));
        assert_eq!(c.way(100, BUDGET), Way::Park);
        c.batch_took(false, PROBE_MAX_PAGES, 64.0 * 60_000.0);
        assert_eq!(
            c.way(4096, BUDGET),
            Way::Park,
            "parked batches not measured"
        );
        let mut r = measured(50_000.0, 25_000.0, 100_000.0);
        r.batch_took(true, 4032, 4032.0 * 20_000.0);
        assert_eq!(r.way(4096, BUDGET), Way::ProbeThenPark(PROBE_MAX_PAGES));
        assert_eq!(r.way(100, BUDGET), Way::Run, "running not measured");
        // Parked batches at 20 µs a page: parking is cheaper.
        c.batch_took(true, 4032, 4032.0 * 20_000.0);
        assert_eq!(c.way(4096, BUDGET), Way::Park);
        // An emulated CPU: a parked batch's page costs 490 µs with its
        // parks and the guests' runs, a running one 45 µs.
        let mut c = batches(490_000.0, 45_000.0);
        assert_eq!(c.way(4096, BUDGET), Way::Run);
        // Figures below 64 pages say nothing of large batches.
        c.batch_took(true, 10, 10.0);
        assert_eq!(c.way(4096, BUDGET), Way::Run);
    }

    #[test]
    fn the_dearer_way_is_probed_less_often_the_dearer_it_is() {
        // Parking cheaper: one large batch in 32 probes running on its
        // first pages.
        let mut c = batches(20_000.0, 60_000.0);
        let ways: Vec<Way> = (0..64).map(|_| c.way(4096, BUDGET)).collect();
        let probes: Vec<usize> = (0..64).filter(|&i| ways[i] != Way::Park).collect();
        assert_eq!(probes, [31, 63], "{ways:?}");
        assert_eq!(ways[31], Way::ProbeThenPark(PROBE_MAX_PAGES));
        // Running 10 times cheaper: a whole batch parks once in 320 (a
        // parked window's page within the budget: 25 µs).
        let mut c = measured(50_000.0, 25_000.0, 45_000.0);
        c.batch_took(true, 1000, 1000.0 * 450_000.0);
        c.batch_took(false, 64, 64.0 * 45_000.0);
        let ways: Vec<Way> = (0..640).map(|_| c.way(4096, BUDGET)).collect();
        let probes: Vec<usize> = (0..640).filter(|&i| ways[i] != Way::Run).collect();
        assert_eq!(probes, [319, 639]);
        assert_eq!(ways[319], Way::Park);
    }

    #[test]
    fn where_the_least_step_outlasts_the_budget_batches_run() {
        // 100 µs a parked page: 8 pages take 800 µs, over a 500 µs budget,
        // though parking is cheaper for the engine (running 200 µs).
        let mut c = measured(50_000.0, 100_000.0, 200_000.0);
        assert!(!c.park_fits(BUDGET));
        assert!(c.park_fits(None), "nothing bounds a park");
        assert!(c.park_fits(Some(Duration::from_micros(800))));
        for pages in [1, 8, 63] {
            assert_eq!(c.way(pages, BUDGET), Way::Run, "{pages}");
        }
        let mut c = batches(100_000.0, 200_000.0);
        assert_eq!(c.way(4096, BUDGET), Way::Run);
        // Without a budget the cheaper way wins as before.
        assert_eq!(c.way(4096, None), Way::Park);
        // Whole parked batches never measured (each park ends after its
        // first step): large batches still run, and one in 32 parks to
        // measure the parked page again.
        let mut c = measured(50_000.0, 100_000.0, 200_000.0);
        let ways: Vec<Way> = (0..64).map(|_| c.way(4096, BUDGET)).collect();
        let parks: Vec<usize> = (0..64).filter(|&i| ways[i] != Way::Run).collect();
        assert_eq!(parks, [31, 63], "{ways:?}");
        assert_eq!(ways[31], Way::Park);
        // 25 µs a parked page: 200 µs a least step, within the budget.
        assert!(measured(50_000.0, 25_000.0, 100_000.0).park_fits(BUDGET));
        assert!(ParkCosts::default().park_fits(BUDGET), "unknown: parks");
    }

    #[test]
    fn one_small_batch_in_thirty_two_probes_the_other_way() {
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        let ways: Vec<Way> = (0..64).map(|_| c.way(8, BUDGET)).collect();
        let runs: Vec<usize> = (0..64).filter(|&i| ways[i] == Way::Run).collect();
        assert_eq!(runs, [31, 63], "{ways:?}");
        let mut c = measured(40_000.0, 2_000.0, 2_500.0);
        let ways: Vec<Way> = (0..32).map(|_| c.way(8, None)).collect();
        assert_eq!(ways[31], Way::Park);
        assert!(ways[..31].iter().all(|&w| w == Way::Run));
    }

    #[test]
    fn averages_follow_a_quarter_of_each_sample() {
        let mut c = ParkCosts::default();
        c.window(false, 4, 4_000.0);
        c.window(false, 1, 5_000.0);
        assert_eq!(c.running_page_ns, 2_000.0);
        c.window(true, 0, 1.0);
        assert_eq!(c.parked_page_ns, 0.0, "an empty window measures nothing");
    }
}
