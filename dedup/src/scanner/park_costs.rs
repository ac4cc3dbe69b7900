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

/// One batch in this many goes the other way, to keep measuring it.
const PROBE_EVERY: u32 = 32;

/// Largest batch run the other way as a probe: a probe on a host where
/// the other way is much dearer must stay cheap.
const PROBE_MAX_PAGES: usize = 64;

/// The moving averages of the costs, nanoseconds (0: not measured yet).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct ParkCosts {
    /// A park's fixed cost: request, wait, release and wake.
    fixed_ns: f64,
    /// A page of a merge window while the guests are parked.
    parked_page_ns: f64,
    /// A page of a merge window while the guests run.
    running_page_ns: f64,
    /// Batches since the last probe.
    since_probe: u32,
}

/// A quarter of each new sample: one odd sample moves the average little.
fn follow(avg: f64, sample: f64) -> f64 {
    if avg > 0.0 {
        0.75 * avg + 0.25 * sample
    } else {
        sample
    }
}

impl ParkCosts {
    /// Should a batch of `pages` pages park the guests? Parks until both
    /// ways are measured (parking is never the costly mistake where IPIs
    /// trap), then whichever is cheaper for `pages`; a probe batch goes the
    /// other way.
    pub(super) fn park(&mut self, pages: usize) -> bool {
        let n = pages as f64;
        let cheaper = if self.fixed_ns > 0.0 && self.running_page_ns > 0.0 {
            self.fixed_ns + n * self.parked_page_ns <= n * self.running_page_ns
        } else {
            true
        };
        self.since_probe = self.since_probe.saturating_add(1);
        let measured_parked = self.fixed_ns > 0.0 && self.parked_page_ns > 0.0;
        if measured_parked && self.since_probe >= PROBE_EVERY && pages <= PROBE_MAX_PAGES {
            self.since_probe = 0;
            log::debug!(
                "park costs: {:.1} us a park, {:.2} us a page parked, {:.2} us running; \
                 a batch of {pages} runs {} as a probe",
                self.fixed_ns / 1e3,
                self.parked_page_ns / 1e3,
                self.running_page_ns / 1e3,
                if cheaper { "unparked" } else { "parked" }
            );
            return !cheaper;
        }
        cheaper
    }

    /// A merge window of `pages` pages took `ns`, parked or not.
    pub(super) fn window(&mut self, parked: bool, pages: usize, ns: f64) {
        if pages == 0 {
            return;
        }
        let per = ns / pages as f64;
        if parked {
            self.parked_page_ns = follow(self.parked_page_ns, per);
        } else {
            self.running_page_ns = follow(self.running_page_ns, per);
        }
    }

    /// Parking and releasing the guests once took `ns`.
    pub(super) fn park_took(&mut self, ns: f64) {
        self.fixed_ns = follow(self.fixed_ns, ns);
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

    #[test]
    fn parks_until_both_ways_are_measured() {
        let mut c = ParkCosts::default();
        assert!(c.park(1));
        c.window(true, 10, 20_000.0);
        c.park_took(30_000.0);
        assert!(c.park(1), "the running cost is not known yet");
        assert_eq!(c.parked_page_ns(), 2_000.0);
    }

    #[test]
    fn where_flushes_trap_every_batch_parks() {
        // Parked 25 µs a page, 100 µs running, 50 µs a park.
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        for pages in [1, 8, 4096] {
            assert!(c.park(pages), "{pages}");
        }
    }

    #[test]
    fn with_cheap_flushes_only_large_batches_park() {
        // Parked 2 µs a page, 2.5 µs running, 40 µs a park: from 80 pages.
        let mut c = measured(40_000.0, 2_000.0, 2_500.0);
        assert!(!c.park(10));
        assert!(!c.park(79));
        assert!(c.park(80));
        assert!(c.park(4096));
    }

    #[test]
    fn one_small_batch_in_thirty_two_probes_the_other_way() {
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        let ways: Vec<bool> = (0..64).map(|_| c.park(8)).collect();
        assert_eq!(ways.iter().filter(|&&p| !p).count(), 2, "{ways:?}");
        assert!(!ways[31] && !ways[63]);
        // A large batch never probes: it waits for a small one.
        let mut c = measured(50_000.0, 25_000.0, 100_000.0);
        let large: Vec<bool> = (0..40).map(|_| c.park(4096)).collect();
        assert!(large.iter().all(|&p| p));
        assert!(!c.park(8), "the next small batch probes");
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
