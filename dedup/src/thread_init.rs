//! The start hook of the threads the dedup backends spawn: the engine's
//! scanner and fault handler, the KSM backend's auto-mode driver. The VMM
//! installs its seccomp filters there; this crate knows nothing about them
//! (nor depends on the VMM or seccompiler), it only promises to run the
//! hook first thing on each thread it starts (the scanner sets its nice
//! value just before, [`SCANNER_NICE`], which a filter could forbid).

use std::sync::Arc;

/// The backends' threads, as named to a [`ThreadInit`] hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupThread {
    /// The engine's `pagefold-scan`: scanning, merging, KSM assist, auto mode.
    Scanner,
    /// The engine's `pagefold-uffd`: the userfaultfd write-protect fault
    /// handler.
    FaultHandler,
    /// The KSM backend's `ksm-auto`: auto mode's driver (reads
    /// `/proc/self/ksm_stat`, writes KSM's sysfs knobs through the journal).
    KsmDriver,
}

/// The engine's scanner thread's nice value: ksmd's, which the kernel sets
/// to 5 when it starts it (`ksm_scan_thread` in mm/ksm.c). Scanning and
/// merging are background work: where the scanner and a guest's vCPU
/// thread (nice 0) share a CPU, the guest gets about three times the
/// scanner's share, as it does against ksmd. The fault handler keeps the
/// default: a guest's write waits for it.
pub const SCANNER_NICE: i32 = 5;

/// Sets the calling thread's nice value (per thread on Linux). Raising it
/// needs no privilege; a failure (a seccomp filter installed before, an
/// odd kernel) leaves the thread as it was, which only costs the guests
/// CPU, and is logged.
pub fn renice_self(nice: i32) {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: plain syscall on this thread's own id; no memory is passed.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if r != 0 {
        log::info!(
            "thread {tid}: nice {nice} not set: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A hook each backend thread runs first, on itself.
#[derive(Clone)]
pub struct ThreadInit(pub Arc<dyn Fn(DedupThread) + Send + Sync>);

impl ThreadInit {
    /// Runs the hook, if any, for `thread` (on the calling thread).
    pub fn run(init: Option<&ThreadInit>, thread: DedupThread) {
        if let Some(f) = init {
            (f.0)(thread);
        }
    }
}

impl std::fmt::Debug for ThreadInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadInit(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of thread `tid`.
    fn nice_of(tid: libc::pid_t) -> i32 {
        // SAFETY: plain syscall; getpriority returns the nice value
        // itself for PRIO_PROCESS (errno tells -1 apart, unused here: the
        // values tested are not -1).
        unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
    }

    #[test]
    fn renice_self_changes_only_the_calling_thread() {
        // SAFETY: gettid takes no arguments.
        let me = unsafe { libc::gettid() };
        let before = nice_of(me);
        let other = std::thread::spawn(move || {
            renice_self(SCANNER_NICE);
            // SAFETY: gettid takes no arguments.
            nice_of(unsafe { libc::gettid() })
        })
        .join()
        .unwrap();
        // Lowering a nice value needs privilege: a test run above it
        // stays where it was.
        assert!(
            other == SCANNER_NICE || (before > SCANNER_NICE && other == before),
            "nice {other}, the test ran at {before}"
        );
        assert_eq!(nice_of(me), before, "the caller's thread was reniced");
    }
}
