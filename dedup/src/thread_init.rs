//! The start hook of the threads the dedup backends spawn: the engine's
//! scanner and fault handler, the KSM backend's auto-mode driver. The VMM
//! installs its seccomp filters there; this crate knows nothing about them
//! (nor depends on the VMM or seccompiler), it only promises to run the
//! hook first thing on each thread it starts.

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
