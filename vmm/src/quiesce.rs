//! The VM's side of the dedup engine's merge batches
//! (`pagefold_dedup::quiesce`): parks the vCPUs between guest exits, so the
//! batch's TLB flushes do not interrupt a CPU running guest code. A vCPU
//! halted inside KVM (`crate::vcpu_stats`) runs on no CPU and is left
//! alone: kicked, it would wait out the batch at the gate, and its guest's
//! next interrupt with it.

use std::sync::{Arc, Mutex};

use pagefold_dedup::Quiesce;

use crate::state::VmShared;
use crate::vcpu;
use crate::vcpu_stats::VcpuBlocking;

/// Parks one VM's vCPUs on request (without pausing the VM).
pub struct VcpuQuiescer {
    shared: Arc<VmShared>,
    /// The vCPU threads to kick out of KVM_RUN, each with its `blocking`
    /// statistic where the kernel has one; emptied (by
    /// [`VcpuQuiescer::forget_threads`]) before they are joined, after which
    /// their ids may be reused.
    threads: Mutex<Vec<(libc::pthread_t, Option<Arc<VcpuBlocking>>)>>,
}

impl VcpuQuiescer {
    pub fn new(
        shared: Arc<VmShared>,
        threads: Vec<(libc::pthread_t, Option<Arc<VcpuBlocking>>)>,
    ) -> Self {
        Self {
            shared,
            threads: Mutex::new(threads),
        }
    }

    /// vCPUs halted in KVM right now.
    fn halted(&self) -> usize {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, b)| b.as_ref().is_some_and(|b| b.is_blocking()))
            .count()
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
    /// The hold alone: a vCPU in guest code parks at its next exit, or
    /// halts, unless the engine kicks it (`nudge`).
    fn request(&self) {
        self.shared.hold();
    }

    /// No vCPU runs guest code: each is out of KVM_RUN or halted in it. A
    /// halted one may wake during the batch and run beside it; that costs
    /// the batch IPIs, never correctness (`pagefold_dedup::quiesce`).
    fn stopped(&self) -> bool {
        self.shared.out_of_guest() || self.shared.in_guest() <= self.halted()
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

    /// A vCPU that halts is seen doing so (its `blocking` statistic), so
    /// the engine may wait for it to instead of kicking it.
    fn stops_unkicked(&self) -> bool {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        !threads.is_empty() && threads.iter().all(|(_, b)| b.is_some())
    }

    fn nudge(&self) {
        for (t, blocking) in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if blocking.as_ref().is_some_and(|b| b.is_blocking()) {
                continue;
            }
            let t = *t;
            // SAFETY: `t` belongs to a vCPU thread that has not been joined
            // (`forget_threads` runs before the join, under this lock), so
            // the id is valid; the kick signal has a no-op handler.
            unsafe {
                libc::pthread_kill(t, vcpu::kick_signal());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vcpu_stats::testutil::TestVcpu;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// A VM whose one vCPU is `h`, inside KVM_RUN as the VMM's run loop
    /// counts, and its quiescer with `h`'s `blocking` statistic.
    fn in_guest(h: &TestVcpu) -> (Arc<VmShared>, VcpuQuiescer) {
        let shared = Arc::new(VmShared::new("q").unwrap());
        assert!(shared.enter_guest());
        let q = VcpuQuiescer::new(
            shared.clone(),
            vec![(h.pthread(), Some(h.blocking.clone()))],
        );
        (shared, q)
    }

    /// Whether `h` returns from KVM_RUN (past `before` returns) within 5 s.
    fn exits_after(h: &TestVcpu, before: usize) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while h.exits.load(Ordering::SeqCst) == before && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        h.exits.load(Ordering::SeqCst) > before
    }

    /// A vCPU halted in KVM counts as stopped and is not kicked; without
    /// its statistic the same vCPU counts as running guest code.
    #[test]
    fn a_halted_vcpu_is_stopped_and_left_asleep() {
        let h = TestVcpu::halted();
        assert!(h.seen_blocking());
        let (shared, q) = in_guest(&h);
        let before = h.exits.load(Ordering::SeqCst);
        assert!(q.stops_unkicked());
        q.request();
        assert!(q.stopped());
        q.nudge();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            h.exits.load(Ordering::SeqCst),
            before,
            "kicked out of its HLT"
        );
        q.release();

        let blind = VcpuQuiescer::new(shared.clone(), vec![(h.pthread(), None)]);
        assert!(!blind.stops_unkicked());
        blind.request();
        assert!(!blind.stopped());
        blind.nudge();
        assert!(
            exits_after(&h, before),
            "the nudge did not kick a running vCPU"
        );
        blind.release();
        shared.leave_guest();
        assert!(blind.stopped());
    }

    /// A request alone does not kick a vCPU out of guest code (the
    /// engine may wait for it to halt on its own, `Parked::park`'s grace);
    /// a nudge does.
    #[test]
    fn a_request_leaves_a_running_vcpu_in_guest_code_until_a_nudge() {
        let h = TestVcpu::spinning();
        let (shared, q) = in_guest(&h);
        let before = h.exits.load(Ordering::SeqCst);
        q.request();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!q.stopped(), "a spinning vCPU reads as stopped");
        assert_eq!(
            h.exits.load(Ordering::SeqCst),
            before,
            "the request kicked the vCPU"
        );
        q.nudge();
        assert!(exits_after(&h, before), "the nudge did not kick the vCPU");
        q.release();
        shared.leave_guest();
    }
}
