//! Host-side control of running workload guests: the WAIT_HOST gate and stop.
//! Shared (`Arc`) between the vCPU thread, which blocks in SLEEP/WAIT_HOST,
//! and whoever orchestrates (tests, the dedup driver, shutdown).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Gate releases and the stop flag, with a condvar to wake blocked guests.
///
/// Gates are counted, not levels: the n-th WAIT_HOST of a guest (n from 1)
/// returns once `release_gate` has been called n times, so a release that
/// comes before the guest reaches its WAIT_HOST is not lost. One control may
/// serve several VMs: each keeps its own count of gates passed, so one
/// release opens the next gate of every VM.
#[derive(Debug, Default)]
pub struct WorkloadControl {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    releases: u64,
    stopped: bool,
}

/// How a blocking wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Released,
    TimedOut,
    Stopped,
}

impl WorkloadControl {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked (plain counters).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the next WAIT_HOST gate (wakes guests waiting on it).
    pub fn release_gate(&self) {
        self.lock().releases += 1;
        self.wake.notify_all();
    }

    /// Number of gates released so far.
    pub fn releases(&self) -> u64 {
        self.lock().releases
    }

    /// Asks every guest on this control to stop: SLEEP and WAIT_HOST return
    /// at once and every later operation answers `status::STOPPED`, so the
    /// guest exits at its next device access (bounded shutdown).
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.wake.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Sleeps `dur` unless stopped first; true if stopped.
    pub(crate) fn sleep(&self, dur: Duration) -> bool {
        let deadline = Instant::now().checked_add(dur);
        let mut s = self.lock();
        loop {
            if s.stopped {
                return true;
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return false;
            }
            s = self
                .wake
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until gate `gate` (0-based) is released, the control is
    /// stopped, or `limit` passes (`None`: no limit).
    pub(crate) fn wait_gate(&self, gate: u64, limit: Option<Duration>) -> WaitOutcome {
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        let mut s = self.lock();
        loop {
            if s.stopped {
                return WaitOutcome::Stopped;
            }
            if s.releases > gate {
                return WaitOutcome::Released;
            }
            s = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return WaitOutcome::TimedOut;
                    }
                    self.wake
                        .wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(s).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn release_before_wait_is_not_lost() {
        let c = WorkloadControl::new();
        c.release_gate();
        assert_eq!(c.wait_gate(0, Some(Duration::ZERO)), WaitOutcome::Released);
        assert_eq!(
            c.wait_gate(1, Some(Duration::from_millis(10))),
            WaitOutcome::TimedOut
        );
        assert_eq!(c.releases(), 1);
    }

    #[test]
    fn timeout_waits_at_least_the_limit() {
        let c = WorkloadControl::new();
        let t = Instant::now();
        assert_eq!(
            c.wait_gate(0, Some(Duration::from_millis(30))),
            WaitOutcome::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(30));
        let t = Instant::now();
        assert!(!c.sleep(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn release_and_stop_wake_other_threads() {
        let c = Arc::new(WorkloadControl::new());
        let c2 = c.clone();
        let waiter = thread::spawn(move || c2.wait_gate(0, None));
        thread::sleep(Duration::from_millis(20));
        c.release_gate();
        assert_eq!(waiter.join().unwrap(), WaitOutcome::Released);

        let c3 = c.clone();
        let t = Instant::now();
        let sleeper = thread::spawn(move || c3.sleep(Duration::from_secs(60)));
        let c4 = c.clone();
        let gated = thread::spawn(move || c4.wait_gate(5, None));
        thread::sleep(Duration::from_millis(20));
        c.stop();
        assert!(sleeper.join().unwrap());
        assert_eq!(gated.join().unwrap(), WaitOutcome::Stopped);
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(c.is_stopped());
        // Once stopped, sleeps return at once.
        assert!(c.sleep(Duration::from_secs(60)));
    }
}
