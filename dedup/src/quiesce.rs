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
    /// Asks the threads to park at their next chance; returns at once.
    /// Every call is followed by one [`Quiesce::release`].
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
    /// Re-sends whatever wakes the threads out of guest code (a thread may
    /// have entered it just after the request).
    fn nudge(&self) {}
}

/// Longest wait for the threads to park: past it the batch runs anyway.
pub const PARK_DEADLINE: Duration = Duration::from_millis(2);

/// The quiescers of a batch, parked for as long as this lives.
pub struct Parked {
    held: Vec<Arc<dyn Quiesce>>,
}

impl Parked {
    /// Requests every quiescer in `all` (each once) and waits, up to
    /// [`PARK_DEADLINE`], until all have stopped.
    pub fn park<'a>(all: impl IntoIterator<Item = &'a Arc<dyn Quiesce>>) -> Parked {
        let mut held: Vec<Arc<dyn Quiesce>> = Vec::new();
        for q in all {
            if !held.iter().any(|h| Arc::ptr_eq(h, q)) {
                q.request();
                held.push(q.clone());
            }
        }
        let end = Instant::now() + PARK_DEADLINE;
        let mut next_nudge = Instant::now() + Duration::from_micros(200);
        while !held.iter().all(|q| q.stopped()) {
            let now = Instant::now();
            if now >= end {
                log::trace!("vCPUs did not park within {PARK_DEADLINE:?}");
                break;
            }
            if now >= next_nudge {
                held.iter().for_each(|q| q.nudge());
                next_nudge = now + Duration::from_micros(200);
            }
            std::thread::yield_now();
        }
        Parked { held }
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
    }

    impl Quiesce for Count {
        fn request(&self) {
            self.requests.fetch_add(1, Ordering::SeqCst);
        }
        fn stopped(&self) -> bool {
            self.polls.fetch_add(1, Ordering::SeqCst) >= self.stop_after
        }
        fn release(&self) {
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
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
        let p = Parked::park(&[da.clone(), db, da]);
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
        drop(Parked::park(&[q]));
        assert!(t.elapsed() >= PARK_DEADLINE);
        assert!(t.elapsed() < PARK_DEADLINE * 50, "{:?}", t.elapsed());
    }
}
