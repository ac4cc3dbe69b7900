//! How long a park waits for the guests' vCPUs to halt on their own
//! before it kicks them ([`crate::quiesce::Parked::park`]).
//!
//! A vCPU that sleeps in the kernel until its next interrupt (a guest with
//! nothing to do executes HLT) runs on no CPU: a merge's TLB flushes send
//! it nothing, and a park need not stop it. An idle guest is mostly so,
//! and between its interrupts it runs only briefly; kicked out of guest
//! code in such a run, it waits at the VMM's gate for the whole batch, and
//! so does its next interrupt. Waiting for it to halt instead costs the
//! guest nothing and the engine a short sleep. A busy guest does not halt
//! within any short wait, so the wait is kept up only while it pays: the
//! park learns from how its last waits ended.

use std::time::Duration;

use crate::quiesce::Grace;

/// The longest wait for halts: about the run an idle guest makes to
/// answer a timer or a device interrupt, with room for a slow host. A
/// wait that ends in a kick costs the engine this much time, asleep.
pub(super) const GRACE: Duration = Duration::from_millis(1);

/// While waiting does not pay, one park in this many waits anyway, so
/// that guests that go idle again are noticed.
const RETRY_EVERY: u32 = 16;

/// What the last waits for halts achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct HaltGrace {
    /// Moving share of waits in which every vCPU halted or left guest code
    /// unkicked: each new wait counts for half (`None`: none yet).
    share: Option<f64>,
    /// Parks without a wait since the last one.
    skipped: u32,
    /// Waits, and those that ended with no kick (for the log).
    tried: u64,
    unkicked: u64,
}

impl HaltGrace {
    /// Whether waiting pays, as far as the last waits tell.
    fn waits(&self) -> bool {
        self.share.is_none_or(|s| s >= 0.5)
    }

    /// How long the next park may wait for halts.
    pub(super) fn next(&mut self) -> Duration {
        if self.waits() {
            return GRACE;
        }
        self.skipped += 1;
        if self.skipped >= RETRY_EVERY {
            self.skipped = 0;
            return GRACE;
        }
        Duration::ZERO
    }

    /// A park's wait ended as `g` says.
    pub(super) fn took(&mut self, g: Grace) {
        if !g.tried {
            return;
        }
        self.tried += 1;
        let x = if g.unkicked {
            self.unkicked += 1;
            1.0
        } else {
            0.0
        };
        let before = self.waits();
        self.share = Some(self.share.map_or(x, |s| (s + x) / 2.0));
        let now = self.waits();
        if before != now {
            log::debug!(
                "parks {} for the guests' vCPUs to halt ({} of {} waits so far \
                 ended without a kick)",
                if now { "wait again" } else { "stop waiting" },
                self.unkicked,
                self.tried
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(unkicked: bool) -> Grace {
        Grace {
            tried: true,
            unkicked,
            waited: GRACE,
        }
    }

    #[test]
    fn waits_while_guests_halt_and_stops_after_two_kicks_in_a_row() {
        let mut g = HaltGrace::default();
        assert_eq!(g.next(), GRACE, "the first park tries");
        g.took(wait(true));
        g.took(wait(false));
        assert_eq!(g.next(), GRACE, "one kick after a halt still waits");
        g.took(wait(false));
        assert_eq!(g.next(), Duration::ZERO, "two kicks in a row stop it");
    }

    #[test]
    fn retries_now_and_then_and_waits_again_once_a_retry_pays() {
        let mut g = HaltGrace::default();
        g.took(wait(false));
        let graces: Vec<Duration> = (0..RETRY_EVERY).map(|_| g.next()).collect();
        assert_eq!(graces.iter().filter(|d| !d.is_zero()).count(), 1);
        assert_eq!(*graces.last().unwrap(), GRACE);
        g.took(wait(true));
        assert_eq!(g.next(), GRACE);
    }

    #[test]
    fn a_park_that_did_not_wait_teaches_nothing() {
        let mut g = HaltGrace::default();
        g.took(wait(false));
        let before = g;
        g.took(Grace {
            tried: false,
            unkicked: false,
            waited: Duration::ZERO,
        });
        assert_eq!(g, before);
    }
}
