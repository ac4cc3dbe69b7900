//! A VM's run state, shared by its vCPU threads, its devices and the process
//! that owns it. Stopping is one-way and records the first reason given, so
//! every path (guest request, crash, signal, API) ends the VM the same way.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

use crate::pause::{GuestPauses, PauseLog};

/// Where a VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Paused,
    Stopping,
    /// Finished: its vCPUs are gone and its memory released. Only the
    /// runner's record of a finished VM carries it (kept until the VM is
    /// deleted, so an API client can read how it ended).
    Stopped,
}

/// Why a VM stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The workload guest exited through its control device.
    GuestExit {
        status: u32,
    },
    /// The guest asked for a reset (i8042) or a power-off/reset system event.
    GuestReset,
    GuestPowerOff,
    /// The guest crashed (triple fault, emulation failure, bad I/O...).
    GuestError {
        message: String,
    },
    /// A VMM-side failure (vCPU set-up, KVM error, device error).
    VmmError {
        message: String,
    },
    /// The host stopped it (signal, shutdown of the process).
    Stopped {
        reason: String,
    },
    /// Deleted through the API: a requested end, not a failure.
    Deleted,
}

impl Outcome {
    /// True if the VM ended the way its guest meant it to, successfully.
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            Outcome::GuestExit { status: 0 }
                | Outcome::GuestPowerOff
                | Outcome::GuestReset
                | Outcome::Deleted
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::GuestExit { status: 0 } => write!(f, "guest finished (exit status 0)"),
            Outcome::GuestExit { status } => {
                write!(f, "guest reported failure (exit status {status})")
            }
            Outcome::GuestReset => write!(f, "guest requested a reset"),
            Outcome::GuestPowerOff => write!(f, "guest powered off"),
            Outcome::GuestError { message } => write!(f, "guest error: {message}"),
            Outcome::VmmError { message } => write!(f, "VMM error: {message}"),
            Outcome::Stopped { reason } => write!(f, "stopped: {reason}"),
            Outcome::Deleted => write!(f, "deleted through the API"),
        }
    }
}

/// Where the held vCPU threads of every VM of the process wait: the dedup
/// engine holds all VMs for a batch and lets them all go at its end, and
/// one wake-up for all of them matters. Woken VM by VM, the first VM's
/// threads can preempt the engine thread on an oversubscribed host
/// before it wakes the next VM, whose guests then stay stopped for as
/// long: a stop the pause budget does not see.
static HOLD_GATE: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

fn gate() -> std::sync::MutexGuard<'static, ()> {
    HOLD_GATE.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wakes the vCPU threads of every VM that wait at the hold gate (their
/// VMs released since re-check their holds); see [`VmShared::unhold`].
pub fn wake_held_vcpus() {
    let _g = gate();
    HOLD_GATE.1.notify_all();
}

/// State shared by everything that can stop, pause or wait for a VM.
pub struct VmShared {
    pub name: String,
    state: Mutex<(RunState, Option<Outcome>)>,
    cv: Condvar,
    /// Written whenever the VM starts stopping: wakes the process event loop.
    pub exit_evt: EventFd,
    /// vCPU threads currently parked because the VM is paused.
    parked: AtomicUsize,
    /// vCPU threads that have not exited yet.
    live_vcpus: AtomicUsize,
    /// Outstanding requests to park the vCPUs without pausing the VM (the
    /// dedup engine's merge batches, `crate::quiesce`).
    holds: AtomicUsize,
    /// vCPU threads inside KVM_RUN (running guest code) right now.
    in_guest: AtomicUsize,
    /// vCPU threads waiting at the hold gate right now: a hold that keeps
    /// them is a stop of their guest.
    held: AtomicUsize,
    /// Every such stop, as long as each vCPU thread waited.
    pauses: PauseLog,
}

impl VmShared {
    pub fn new(name: &str) -> std::io::Result<Self> {
        Ok(Self {
            name: name.to_string(),
            state: Mutex::new((RunState::Running, None)),
            cv: Condvar::new(),
            exit_evt: EventFd::new(libc::EFD_NONBLOCK)?,
            parked: AtomicUsize::new(0),
            live_vcpus: AtomicUsize::new(0),
            holds: AtomicUsize::new(0),
            in_guest: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            pauses: PauseLog::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (RunState, Option<Outcome>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> RunState {
        self.lock().0
    }

    pub fn outcome(&self) -> Option<Outcome> {
        self.lock().1.clone()
    }

    /// Starts stopping the VM for `why`; the first reason given wins.
    /// Returns true if this call was the one that stopped it.
    pub fn request_stop(&self, why: Outcome) -> bool {
        let mut g = self.lock();
        let first = g.1.is_none();
        if first {
            g.1 = Some(why);
        }
        g.0 = RunState::Stopping;
        drop(g);
        self.cv.notify_all();
        // A held vCPU waits at the gate: it must see the stop too.
        wake_held_vcpus();
        let _ = self.exit_evt.write(1);
        first
    }

    /// Pauses a running VM; false if it is stopping.
    pub fn pause(&self) -> bool {
        let mut g = self.lock();
        if g.0 == RunState::Stopping {
            return false;
        }
        g.0 = RunState::Paused;
        true
    }

    /// Resumes a paused VM; false if it is stopping.
    pub fn resume(&self) -> bool {
        let mut g = self.lock();
        if g.0 == RunState::Stopping {
            return false;
        }
        g.0 = RunState::Running;
        drop(g);
        self.cv.notify_all();
        true
    }

    /// Called by a vCPU thread between runs: parks while paused (on the
    /// VM's own condition variable) or held (at the process's hold gate),
    /// and tells whether the thread should keep running.
    pub fn vcpu_checkpoint(&self) -> bool {
        // When this thread started waiting for a hold to end (one stop
        // may span several waits: other VMs' wakes are spurious here).
        let mut held_since: Option<Instant> = None;
        loop {
            {
                let mut g = self.lock();
                loop {
                    match g.0 {
                        RunState::Running => break,
                        RunState::Stopping | RunState::Stopped => return false,
                        RunState::Paused => {
                            self.parked.fetch_add(1, Ordering::SeqCst);
                            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                            self.parked.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                }
            }
            if self.holds.load(Ordering::SeqCst) == 0 {
                if let Some(t) = held_since {
                    self.pauses.record(t.elapsed());
                }
                return true;
            }
            // Held: re-checked under the gate's lock, which every wake
            // takes after the holds dropped, so no wake-up is missed.
            let g = gate();
            if self.holds.load(Ordering::SeqCst) > 0 && !self.stopping() {
                held_since.get_or_insert_with(Instant::now);
                self.parked.fetch_add(1, Ordering::SeqCst);
                self.held.fetch_add(1, Ordering::SeqCst);
                drop(HOLD_GATE.1.wait(g).unwrap_or_else(|e| e.into_inner()));
                self.held.fetch_sub(1, Ordering::SeqCst);
                self.parked.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// The VM is stopping or stopped (read without waiting on a held
    /// state lock's owner for long: the lock is only ever held briefly).
    fn stopping(&self) -> bool {
        matches!(self.state(), RunState::Stopping | RunState::Stopped)
    }

    /// A vCPU thread is about to enter KVM_RUN; false (and it must go back
    /// to its checkpoint) if a hold came in since that checkpoint. With
    /// [`VmShared::hold`]'s order (hold, then read `in_guest`) either the
    /// holder sees this thread in the guest or this thread sees the hold.
    pub fn enter_guest(&self) -> bool {
        self.in_guest.fetch_add(1, Ordering::SeqCst);
        if self.holds.load(Ordering::SeqCst) > 0 {
            self.in_guest.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The vCPU thread left KVM_RUN.
    pub fn leave_guest(&self) {
        self.in_guest.fetch_sub(1, Ordering::SeqCst);
    }

    /// Asks the vCPUs to park at their next checkpoint without pausing the
    /// VM (its state stays `running`); undone by [`VmShared::unhold`].
    pub fn hold(&self) {
        self.holds.fetch_add(1, Ordering::SeqCst);
    }

    /// Undoes one [`VmShared::hold`]; the vCPUs run again when none is
    /// left, once [`wake_held_vcpus`] wakes them (the dedup engine lets
    /// every VM of a batch go first, then wakes them all at once).
    pub fn unhold(&self) {
        self.holds.fetch_sub(1, Ordering::SeqCst);
    }

    /// True while a vCPU thread waits for a hold to end: the hold stops
    /// its guest.
    pub fn holds_a_vcpu(&self) -> bool {
        self.held.load(Ordering::SeqCst) > 0
    }

    /// The stops holds caused so far, one per vCPU thread kept waiting.
    pub fn guest_pauses(&self) -> GuestPauses {
        self.pauses.snapshot()
    }

    /// vCPU threads inside KVM_RUN (running guest code, or halted in KVM).
    pub fn in_guest(&self) -> usize {
        self.in_guest.load(Ordering::SeqCst)
    }

    /// True while no vCPU thread runs guest code.
    pub fn out_of_guest(&self) -> bool {
        self.in_guest.load(Ordering::SeqCst) == 0
    }

    pub fn vcpu_started(&self) {
        self.live_vcpus.fetch_add(1, Ordering::SeqCst);
    }

    pub fn vcpu_exited(&self) {
        self.live_vcpus.fetch_sub(1, Ordering::SeqCst);
        let _ = self.exit_evt.write(1);
    }

    pub fn live_vcpus(&self) -> usize {
        self.live_vcpus.load(Ordering::SeqCst)
    }

    pub fn parked_vcpus(&self) -> usize {
        self.parked.load(Ordering::SeqCst)
    }

    /// Waits until `cond` holds, calling `kick` every couple of milliseconds
    /// (to interrupt KVM_RUN); false on timeout.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut kick: impl FnMut(),
        cond: impl Fn() -> bool,
    ) -> bool {
        let end = Instant::now() + timeout;
        while !cond() {
            if Instant::now() >= end {
                return false;
            }
            kick();
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// A thread at its vCPU checkpoint, once it has parked there.
    fn parked_vcpu(s: &Arc<VmShared>) -> JoinHandle<bool> {
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.vcpu_checkpoint());
        assert!(s.wait_until(Duration::from_secs(5), || {}, || s.parked_vcpus() == 1));
        t
    }

    #[test]
    fn first_stop_reason_wins() {
        let s = VmShared::new("t").unwrap();
        assert!(s.request_stop(Outcome::GuestExit { status: 0 }));
        assert!(!s.request_stop(Outcome::Stopped { reason: "x".into() }));
        assert_eq!(s.outcome(), Some(Outcome::GuestExit { status: 0 }));
        assert_eq!(s.state(), RunState::Stopping);
        assert!(!s.pause());
        assert!(!s.resume());
        // Each stop request wakes the event loop (an eventfd counter).
        assert_eq!(s.exit_evt.read().unwrap(), 2);
    }

    #[test]
    fn pause_parks_and_stop_releases_vcpus() {
        let s = Arc::new(VmShared::new("t").unwrap());
        assert!(s.pause());
        let t = parked_vcpu(&s);
        assert!(s.resume());
        assert!(t.join().unwrap());
        assert!(s.pause());
        let t = parked_vcpu(&s);
        s.request_stop(Outcome::Stopped {
            reason: "test".into(),
        });
        assert!(!t.join().unwrap());
        assert!(Outcome::GuestPowerOff.is_success());
        assert!(!Outcome::GuestExit { status: 1 }.is_success());
    }

    #[test]
    fn a_hold_parks_vcpus_without_pausing_and_blocks_guest_entry() {
        let s = Arc::new(VmShared::new("t").unwrap());
        assert!(s.enter_guest());
        assert!(!s.out_of_guest());
        s.hold();
        // A thread already inside KVM_RUN is seen; one entering backs off.
        assert!(!s.out_of_guest());
        s.leave_guest();
        assert!(s.out_of_guest());
        assert!(!s.enter_guest());
        assert!(s.out_of_guest());
        assert_eq!(s.state(), RunState::Running);
        let t = parked_vcpu(&s);
        s.hold();
        s.unhold();
        wake_held_vcpus();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(s.parked_vcpus(), 1, "still held once");
        assert!(s.holds_a_vcpu());
        s.unhold();
        wake_held_vcpus();
        assert!(t.join().unwrap());
        assert!(!s.holds_a_vcpu());
        let p = s.guest_pauses();
        assert_eq!(p.count, 1, "one stop, however many wakes: {p:?}");
        assert!(p.max_s >= 0.02, "it waited through both sleeps: {p:?}");
        assert!(s.enter_guest());
        // A stop releases a held vCPU too.
        s.leave_guest();
        s.hold();
        let t = parked_vcpu(&s);
        s.request_stop(Outcome::Stopped {
            reason: "test".into(),
        });
        assert!(!t.join().unwrap());
    }
}
