//! Stopping the threads that run guest code for the length of a merge batch.
//!
//! Every merge changes page-table entries of the process (write-protect,
//! remap, unprotect), and each change flushes the TLB of every CPU that is
//! running a thread of the process at that moment: an inter-processor
//! interrupt that the engine waits for. On a host where IPIs trap to the
//! hypervisor (nested or PVM) such a flush costs far more while a vCPU runs
//! on another CPU than when none does, and the flushes can become most of
//! the engine's CPU. A VMM that can park its vCPUs between
//! guest exits offers a [`Quiesce`]; the engine parks them around a batch
//! of merges that is worth it, so the batch's flushes stay local. Nothing
//! depends on it for correctness (write-protection keeps every merge
//! race-free, docs/merge-races.md §8): a VM that does not stop in time
//! simply keeps running.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Something that can park the threads running guest code in a region.
pub trait Quiesce: Send + Sync {
    /// Asks the threads to park at their next exit from guest code;
    /// returns at once. It does not force a thread out of guest code:
    /// [`Quiesce::nudge`] does. Every call is followed by one
    /// [`Quiesce::release`].
    fn request(&self);
    /// True once no thread is running guest code (parked, or not running).
    fn stopped(&self) -> bool;
    /// Undoes one [`Quiesce::request`]. The threads may wait for
    /// [`Quiesce::wake`] to run again.
    fn release(&self);
    /// Wakes the threads [`Quiesce::release`] let go. A batch releases all
    /// its quiescers first and then wakes them: woken one by one, the
    /// first one's threads could take the CPU from the engine before it
    /// releases the next, whose threads would stay stopped meanwhile.
    fn wake(&self) {}
    /// Some thread waits for this park to end: the park stops it. A park
    /// that stops no one (its guests idle outside guest code) need not
    /// end at the pause budget. The default assumes one does.
    fn holds_threads(&self) -> bool {
        true
    }
    /// Sends whatever forces the threads out of guest code (a kick), to
    /// those still in it.
    fn nudge(&self) {}
    /// Its threads may stop without a kick: it sees a thread that sleeps
    /// until its next interrupt (a halted vCPU) as stopped. A park then
    /// waits a little for them to stop so before it kicks them
    /// ([`Parked::park`]): a guest that halts on its own is not stopped
    /// at all, where a kicked one waits out the batch.
    fn stops_unkicked(&self) -> bool {
        false
    }
}

/// Longest wait for the threads to park: past it the batch runs anyway.
pub const PARK_DEADLINE: Duration = Duration::from_millis(2);

/// How often a park polls its quiescers while it waits for them to stop
/// on their own: it sleeps between polls, leaving the CPU to the guests,
/// which need one to reach their halt.
const GRACE_POLL: Duration = Duration::from_micros(25);

/// The quiescers of a batch, parked for as long as this lives.
pub struct Parked {
    held: Vec<Arc<dyn Quiesce>>,
}

/// How a park's grace went ([`Parked::park`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    /// The park waited for threads to stop without a kick.
    pub tried: bool,
    /// Every thread stopped without a kick.
    pub unkicked: bool,
    /// How long the park waited for that.
    pub waited: Duration,
}

impl Parked {
    /// Requests every quiescer in `all` (each once) and waits, up to
    /// [`PARK_DEADLINE`], until all have stopped, kicking those whose
    /// threads are still in guest code. Where some can stop without a
    /// kick ([`Quiesce::stops_unkicked`]) it first waits up to `grace`
    /// for them to, kicking only the others.
    pub fn park<'a>(
        all: impl IntoIterator<Item = &'a Arc<dyn Quiesce>>,
        grace: Duration,
    ) -> (Parked, Grace) {
        let mut held: Vec<Arc<dyn Quiesce>> = Vec::new();
        for q in all {
            if !held.iter().any(|h| Arc::ptr_eq(h, q)) {
                q.request();
                held.push(q.clone());
            }
        }
        let start = Instant::now();
        let tried = !grace.is_zero()
            && held.iter().any(|q| q.stops_unkicked())
            && !held.iter().all(|q| q.stopped());
        let mut unkicked = false;
        if tried {
            held.iter()
                .filter(|q| !q.stops_unkicked() && !q.stopped())
                .for_each(|q| q.nudge());
            let end = start + grace;
            loop {
                if held.iter().all(|q| q.stopped()) {
                    unkicked = true;
                    break;
                }
                if Instant::now() >= end {
                    break;
                }
                std::thread::sleep(GRACE_POLL);
            }
        }
        let waited = start.elapsed();
        let end = Instant::now() + PARK_DEADLINE;
        let mut next_nudge = Instant::now();
        while !held.iter().all(|q| q.stopped()) {
            let now = Instant::now();
            if now >= end {
                log::trace!("vCPUs did not park within {PARK_DEADLINE:?}");
                break;
            }
            if now >= next_nudge {
                held.iter().filter(|q| !q.stopped()).for_each(|q| q.nudge());
                next_nudge = now + Duration::from_micros(200);
            }
            std::thread::yield_now();
        }
        let grace = Grace {
            tried,
            unkicked,
            waited: if tried { waited } else { Duration::ZERO },
        };
        (Parked { held }, grace)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        for q in &self.held {
            q.release();
        }
        for q in &self.held {
            q.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Count {
        requests: AtomicUsize,
        releases: AtomicUsize,
        stop_after: usize,
        polls: AtomicUsize,
        nudges: AtomicUsize,
        /// Sees its threads halt: stops after `stop_after` polls without
        /// a kick. Otherwise only a kick stops it (after `stop_after`
        /// more polls).
        halts: bool,
    }

    impl Quiesce for Count {
        fn request(&self) {
            self.requests.fetch_add(1, Ordering::SeqCst);
        }
        fn stopped(&self) -> bool {
            let polls = self.polls.fetch_add(1, Ordering::SeqCst);
            (self.halts || self.nudges.load(Ordering::SeqCst) > 0) && polls >= self.stop_after
        }
        fn release(&self) {
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
        fn nudge(&self) {
            self.nudges.fetch_add(1, Ordering::SeqCst);
        }
        fn stops_unkicked(&self) -> bool {
            self.halts
        }
    }

    /// Threads that halt within the grace are never kicked, and the
    /// others are kicked at once.
    #[test]
    fn a_park_waits_for_halting_threads_and_kicks_the_others() {
        let halting = Arc::new(Count {
            stop_after: 5,
            halts: true,
            ..Count::default()
        });
        let running = Arc::new(Count::default());
        let (h, r): (Arc<dyn Quiesce>, Arc<dyn Quiesce>) = (halting.clone(), running.clone());
        let (p, grace) = Parked::park(&[h, r], Duration::from_secs(10));
        assert!(grace.tried && grace.unkicked, "{grace:?}");
        assert!(grace.waited < Duration::from_secs(10));
        assert_eq!(
            halting.nudges.load(Ordering::SeqCst),
            0,
            "kicked a halting VM"
        );
        assert!(running.nudges.load(Ordering::SeqCst) >= 1);
        drop(p);
    }

    /// A thread that does not halt within the grace is kicked after it;
    /// with no grace it is kicked at once.
    #[test]
    fn a_grace_ends_in_a_kick_and_no_grace_kicks_at_once() {
        let slow = Arc::new(Count {
            stop_after: usize::MAX,
            halts: true,
            ..Count::default()
        });
        let q: Arc<dyn Quiesce> = slow.clone();
        let t = Instant::now();
        let (p, grace) = Parked::park(&[q], Duration::from_millis(3));
        assert!(grace.tried && !grace.unkicked, "{grace:?}");
        assert!(grace.waited >= Duration::from_millis(3));
        assert!(t.elapsed() >= Duration::from_millis(3) + PARK_DEADLINE);
        assert!(slow.nudges.load(Ordering::SeqCst) >= 1, "never kicked");
        drop(p);

        let halting = Arc::new(Count {
            halts: true,
            stop_after: 1_000_000,
            ..Count::default()
        });
        let q: Arc<dyn Quiesce> = halting.clone();
        let (p, grace) = Parked::park(&[q], Duration::ZERO);
        assert!(!grace.tried && grace.waited.is_zero(), "{grace:?}");
        assert!(halting.nudges.load(Ordering::SeqCst) >= 1);
        drop(p);
    }

    #[test]
    fn each_quiescer_is_requested_once_and_released_once() {
        let a = Arc::new(Count {
            stop_after: 3,
            ..Count::default()
        });
        let b = Arc::new(Count::default());
        let (da, db): (Arc<dyn Quiesce>, Arc<dyn Quiesce>) = (a.clone(), b.clone());
        let t = Instant::now();
        let (p, grace) = Parked::park(&[da.clone(), db, da], Duration::from_millis(1));
        assert!(!grace.tried, "none of them stops unkicked");
        let waited = t.elapsed();
        assert_eq!(p.held.len(), 2);
        // It polled until a stopped (its fourth poll), or until the
        // deadline: a loaded machine may deschedule this thread for longer
        // than that between two polls (seen once in the full suite).
        let polls = a.polls.load(Ordering::SeqCst);
        assert!(
            polls > 3 || waited >= PARK_DEADLINE,
            "gave up after {polls} polls and {waited:?}"
        );
        drop(p);
        for c in [&a, &b] {
            assert_eq!(c.requests.load(Ordering::SeqCst), 1);
            assert_eq!(c.releases.load(Ordering::SeqCst), 1);
        }
    }

    #[test]
    fn a_quiescer_that_never_stops_costs_at_most_the_deadline() {
        let q: Arc<dyn Quiesce> = Arc::new(Count {
            stop_after: usize::MAX,
            ..Count::default()
        });
        let t = Instant::now();
        drop(Parked::park(&[q], Duration::from_millis(1)));
        assert!(t.elapsed() >= PARK_DEADLINE);
        assert!(t.elapsed() < PARK_DEADLINE * 50, "{:?}", t.elapsed());
    }
}
