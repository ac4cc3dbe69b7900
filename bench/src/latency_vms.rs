//! The latency benchmark's two workload VMs: the `vms` pair of the other
//! benchmarks (same seeds, one dedup group, `full` = linear placement,
//! `scattered` = scattered placement), with a program that runs the pause
//! probe between host-released gates, and the guests' reports kept.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;
use pagefold_dedup::DedupBackend;
use pagefold_devices::workload::{EventKind, PhaseRecord, WorkloadSummary};
use pagefold_guest_abi::pause::{PauseHistogram, PauseStats, PauseSummary};
use pagefold_guest_abi::phase;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::state::Outcome;
use pagefold_vmm::vm::{Vm, VmResources};
use pagefold_vmm::workload::Event;
use vmm_sys_util::eventfd::EventFd;

use crate::error::{vm_err, BenchError};
use crate::vms::VmOptions;

/// The guests' program: fill, wait (gate 1: merging starts), probe while
/// merging, wait (gate 2: merged), probe with writes to merged pages, wait
/// until stopped.
pub fn program(probe: Duration) -> Vec<String> {
    let ms = probe.as_millis();
    vec![
        "fill".into(),
        "wait".into(),
        format!("latency:{ms}"),
        "wait".into(),
        format!("latency-write:{ms}"),
        "wait".into(),
    ]
}

/// Both guests' probe of one phase, taken together.
#[derive(Debug, Clone, Copy)]
pub struct ProbeResult {
    pub stats: PauseStats,
    /// The guests' histograms merged.
    pub histogram: PauseHistogram,
    /// Shared pages the guests rewrote (LATENCY_WRITE).
    pub pages_written: u64,
}

/// Two running probe VMs and what their guests reported.
pub struct ProbePair {
    vms: Vec<Vm>,
    events: crossbeam_channel::Receiver<Event>,
    summaries: BTreeMap<String, WorkloadSummary>,
}

impl ProbePair {
    /// Both VMs' windows of the engine's parks so far.
    pub fn guest_pauses(&self) -> pagefold_vmm::pause::GuestPauses {
        self.vms
            .iter()
            .map(|v| v.info().guest_pauses)
            .fold(Default::default(), |a, b| a.merged(&b))
    }

    /// Creates both VMs (registered with `backend` if there is one, mode
    /// left as it is), starts them and waits until both guests filled.
    pub fn start(
        backend: Option<&Arc<dyn DedupBackend>>,
        opts: &VmOptions,
        probe: Duration,
    ) -> Result<ProbePair, BenchError> {
        let mut configs = opts.configs()?;
        for c in &mut configs {
            if let Some(w) = c.workload.as_mut() {
                w.phases = program(probe);
            }
        }
        Self::start_configs(backend, configs, opts.fill_timeout)
    }

    /// Creates the workload VMs of `configs` (each program starting with
    /// `fill`), registered with `backend` if there is one, starts them and
    /// waits until every guest filled, at most `fill_timeout`.
    pub fn start_configs(
        backend: Option<&Arc<dyn DedupBackend>>,
        configs: Vec<VmConfig>,
        fill_timeout: Duration,
    ) -> Result<ProbePair, BenchError> {
        let kvm = Kvm::new().map_err(|e| vm_err(format!("/dev/kvm: {e}")))?;
        let cpuid = pagefold_vmm::x86::cpuid::supported(&kvm).map_err(vm_err)?;
        let (tx, rx) = crossbeam_channel::unbounded::<Event>();
        let res = VmResources {
            kvm: Arc::new(kvm),
            cpuid,
            dedup: backend.cloned(),
            events: tx,
            report_wake: Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(vm_err)?),
            prefix_output: false,
        };
        let mut pair = ProbePair {
            vms: Vec::new(),
            events: rx,
            summaries: BTreeMap::new(),
        };
        for (i, c) in configs.iter().enumerate() {
            pair.summaries
                .insert(c.name.clone(), WorkloadSummary::new(&c.name));
            let mut vm = Vm::create(&res, c, i).map_err(vm_err)?;
            vm.start().map_err(vm_err)?;
            pair.vms.push(vm);
        }
        pair.wait_phase(phase::FILL, fill_timeout)?;
        Ok(pair)
    }

    /// Opens the next gate of both guests.
    pub fn release(&self) {
        for vm in &self.vms {
            if let Some(c) = vm.workload_control() {
                c.release_gate();
            }
        }
    }

    /// Folds events in until every guest has ended one more phase `op`
    /// than before, or `limit` passes.
    pub fn wait_phase(&mut self, op: u32, limit: Duration) -> Result<(), BenchError> {
        let names: Vec<String> = self.summaries.keys().cloned().collect();
        self.wait_phase_of(&names, op, limit)
    }

    /// Folds events in until each guest of `vms` has ended one more phase
    /// `op` than before, or `limit` passes.
    pub fn wait_phase_of(
        &mut self,
        vms: &[String],
        op: u32,
        limit: Duration,
    ) -> Result<(), BenchError> {
        let count = |s: &BTreeMap<String, WorkloadSummary>| -> Vec<usize> {
            vms.iter()
                .map(|v| s.get(v).map_or(0, |w| w.phases_of(op).count()))
                .collect()
        };
        let want: Vec<usize> = count(&self.summaries).iter().map(|n| n + 1).collect();
        let t0 = Instant::now();
        while count(&self.summaries).iter().zip(&want).any(|(a, b)| a < b) {
            let left = limit.saturating_sub(t0.elapsed());
            let ev = self.events.recv_timeout(left).map_err(|_| {
                vm_err(format!(
                    "the guests did not end {} within {limit:?}",
                    phase::name(op)
                ))
            })?;
            if let EventKind::Exit { status } = ev.kind {
                return Err(vm_err(format!("{} exited early (status {status})", ev.vm)));
            }
            if let Some(s) = self.summaries.get_mut(&ev.vm) {
                s.record(&ev.kind);
            }
        }
        Ok(())
    }

    /// The last phase `op` guest `vm` ended, if any.
    pub fn last_phase(&self, vm: &str, op: u32) -> Option<PhaseRecord> {
        self.summaries.get(vm)?.phases_of(op).last().copied()
    }

    /// The guests' last phase `op` taken together. `None` if a guest has
    /// not reported one with its histogram.
    pub fn last_probe(&self, op: u32) -> Option<ProbeResult> {
        let mut runs: Vec<(PauseSummary, PauseHistogram)> = Vec::new();
        let mut histogram = PauseHistogram::ZERO;
        let mut pages_written = 0;
        for s in self.summaries.values() {
            let p = s.phases_of(op).last()?;
            let (_, h) = s
                .pauses
                .iter()
                .rev()
                .find(|(slot, _)| *slot == p.report.slot)?;
            runs.push((p.report.pauses, *h));
            histogram.merge(h);
            pages_written += p.report.pages;
        }
        Some(ProbeResult {
            stats: PauseStats::combine(&runs),
            histogram,
            pages_written,
        })
    }

    /// Stops both VMs; their regions are unregistered before their memory
    /// is unmapped (`Vm::finish`).
    pub fn stop(mut self) {
        for vm in &mut self.vms {
            vm.finish(Outcome::Stopped {
                reason: "benchmark done".into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_probes_between_gates() {
        let p = program(Duration::from_millis(1500));
        assert_eq!(
            p,
            [
                "fill",
                "wait",
                "latency:1500",
                "wait",
                "latency-write:1500",
                "wait"
            ]
        );
        let mut c = VmOptions::default().configs().unwrap().remove(0);
        c.workload.as_mut().unwrap().phases = p;
        c.validate().unwrap();
    }
}
