//! The VM's side of the dedup engine's merge batches
//! (`pagefold_dedup::quiesce`): parks the vCPUs between guest exits, so the
//! batch's TLB flushes do not interrupt a CPU running guest code.

use std::sync::{Arc, Mutex};

use pagefold_dedup::Quiesce;

use crate::state::VmShared;
use crate::vcpu;

/// Parks one VM's vCPUs on request (without pausing the VM).
pub struct VcpuQuiescer {
    shared: Arc<VmShared>,
    /// The vCPU threads to kick out of KVM_RUN; emptied (by
    /// [`VcpuQuiescer::forget_threads`]) before they are joined, after which
    /// their ids may be reused.
    threads: Mutex<Vec<libc::pthread_t>>,
}

impl VcpuQuiescer {
    pub fn new(shared: Arc<VmShared>, threads: Vec<libc::pthread_t>) -> Self {
        Self {
            shared,
            threads: Mutex::new(threads),
        }
    }

    /// No more kicks: the threads are about to be joined.
    pub fn forget_threads(&self) {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Quiesce for VcpuQuiescer {
    fn request(&self) {
        self.shared.hold();
        if !self.shared.out_of_guest() {
            self.nudge();
        }
    }

    fn stopped(&self) -> bool {
        self.shared.out_of_guest()
    }

    fn release(&self) {
        self.shared.unhold();
    }

    fn holds_threads(&self) -> bool {
        self.shared.holds_a_vcpu()
    }

    fn wake(&self) {
        // One wake for the held vCPUs of every VM (the process's hold
        // gate): a batch's later wakes find no one left to wake.
        crate::state::wake_held_vcpus();
    }

    fn nudge(&self) {
        for &t in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // SAFETY: `t` belongs to a vCPU thread that has not been joined
            // (`forget_threads` runs before the join, under this lock), so
            // the id is valid; the kick signal has a no-op handler.
            unsafe {
                libc::pthread_kill(t, vcpu::kick_signal());
            }
        }
    }
}
