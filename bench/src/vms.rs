//! Two workload VMs with identical content in one dedup group: the
//! in-VM variant of both benchmarks. The VMs are created directly with
//! `pagefold_vmm::vm::Vm` (no event loop needed for workload guests), so
//! the harness sees every guest report and knows when both fills are done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;
use pagefold_dedup::DedupBackend;
use pagefold_devices::workload::EventKind;
use pagefold_guest_abi::expect::{Expectation, VmState};
use pagefold_guest_abi::phase;
use pagefold_vmm::config::{SerialOutput, SizeValue, VmConfig, VmDedup, WorkloadConfig};
use pagefold_vmm::state::Outcome;
use pagefold_vmm::vm::{Vm, VmResources};
use pagefold_vmm::workload::Event;
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::error::BenchError;

/// The two VMs' shape.
#[derive(Debug, Clone)]
pub struct VmOptions {
    pub memory: String,
    /// Identical in both VMs (same seed and private seed).
    pub shared: String,
    pub zero_permille: u32,
    pub dup_permille: u32,
    /// Longest wait for both guests to finish their fill.
    pub fill_timeout: Duration,
}

impl Default for VmOptions {
    fn default() -> Self {
        Self {
            memory: "512M".into(),
            shared: "256M".into(),
            zero_permille: 50,
            dup_permille: 50,
            fill_timeout: Duration::from_secs(120),
        }
    }
}

/// What a perfect merger saves on the VMs' data pages (exact, from the
/// guest ABI's generator). Guest page tables and the identical guest image
/// add a few more shareable pages on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Expected {
    /// Non-zero duplicates (KSM's `pages_sharing` with a zero-page path).
    pub pages_sharing: u64,
    /// All-zero data pages.
    pub zero_pages: u64,
}

impl Expected {
    /// Pages a perfect merger frees (sharing + zero pages).
    pub fn saved_pages(&self) -> u64 {
        self.pages_sharing + self.zero_pages
    }
}

impl VmOptions {
    /// The two VM configs: same workload seeds, one dedup group, phases
    /// `fill` then `wait` (the guest blocks until released or stopped).
    pub fn configs(&self) -> Vec<VmConfig> {
        ["bench-a", "bench-b"]
            .iter()
            .map(|name| VmConfig {
                name: (*name).into(),
                vcpus: 1,
                memory: SizeValue::Text(self.memory.clone()),
                serial: SerialOutput::Null,
                dedup: VmDedup {
                    enabled: true,
                    group: Some("bench".into()),
                },
                workload: Some(WorkloadConfig {
                    seed: 7,
                    private_seed: Some(7),
                    shared: Some(SizeValue::Text(self.shared.clone())),
                    private: Some(SizeValue::Mib(0)),
                    zero_permille: self.zero_permille,
                    dup_permille: self.dup_permille,
                    phases: vec!["fill".into(), "wait".into()],
                    ..WorkloadConfig::default()
                }),
                kernel: None,
            })
            .collect()
    }

    /// The exact expectation for [`VmOptions::configs`], computed from the
    /// same parameter blocks the VMM gives the guests.
    pub fn expected(&self) -> Result<Expected, BenchError> {
        let image_end = pagefold_vmm::boot::image_end(pagefold_vmm::workload_image::WORKLOAD_ELF)
            .map_err(|e| BenchError::Vm(e.to_string()))?;
        let mut params = Vec::new();
        for (i, c) in self.configs().iter().enumerate() {
            let ranges = pagefold_vmm::memory::ram_ranges(c.memory_bytes())
                .map_err(|e| BenchError::Vm(e.to_string()))?;
            let w = c.workload.clone().unwrap_or_default();
            let p = pagefold_vmm::workload::params(&w, &c.name, i, &ranges, image_end, 0)
                .map_err(|e| BenchError::Vm(e.to_string()))?;
            params.push(p);
        }
        let states: Vec<VmState<'_>> = params
            .iter()
            .map(|p| VmState {
                params: p,
                churn_writes: 0,
            })
            .collect();
        let e = Expectation::compute(&states).map_err(|e| BenchError::Vm(format!("{e:?}")))?;
        Ok(Expected {
            pages_sharing: e.sharing_pages,
            zero_pages: e.zero_pages,
        })
    }
}

/// Two running workload VMs registered with one backend.
pub struct VmPair {
    vms: Vec<Vm>,
    pub expected: Expected,
    /// Wall time of the slower fill.
    pub fill_s: f64,
}

fn vm_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Vm(e.to_string())
}

impl VmPair {
    /// Creates and starts both VMs on `backend` and waits until both
    /// guests have finished `fill` (they then block in `wait`).
    pub fn start(
        backend: &Arc<dyn DedupBackend>,
        opts: &VmOptions,
        progress: bool,
    ) -> Result<VmPair, BenchError> {
        let expected = opts.expected()?;
        let kvm = Kvm::new().map_err(|e| vm_err(format!("/dev/kvm: {e}")))?;
        let cpuid = pagefold_vmm::x86::cpuid::supported(&kvm).map_err(vm_err)?;
        let (tx, rx) = crossbeam_channel::unbounded::<Event>();
        let res = VmResources {
            kvm: Arc::new(kvm),
            cpuid,
            dedup: Some(backend.clone()),
            events: tx,
            report_wake: Arc::new(EventFd::new(libc::EFD_NONBLOCK).map_err(vm_err)?),
            prefix_output: false,
        };
        let mut pair = VmPair {
            vms: Vec::new(),
            expected,
            fill_s: 0.0,
        };
        let t0 = Instant::now();
        for (i, c) in opts.configs().iter().enumerate() {
            let mut vm = Vm::create(&res, c, i).map_err(vm_err)?;
            vm.start().map_err(vm_err)?;
            pair.vms.push(vm);
        }
        let mut filled = 0;
        while filled < pair.vms.len() {
            let left = opts.fill_timeout.saturating_sub(t0.elapsed());
            let ev = rx.recv_timeout(left).map_err(|_| {
                vm_err(format!(
                    "the guests did not finish fill within {:?}",
                    opts.fill_timeout
                ))
            })?;
            match ev.kind {
                EventKind::PhaseEnd { report, .. } if report.phase == phase::FILL => {
                    if report.mismatches != 0 {
                        return Err(vm_err(format!("{}: fill reported mismatches", ev.vm)));
                    }
                    filled += 1;
                    if progress {
                        eprintln!(
                            "[vms] {} filled {} pages in {:.2} s",
                            ev.vm,
                            report.pages,
                            t0.elapsed().as_secs_f64()
                        );
                    }
                }
                EventKind::Exit { status } => {
                    return Err(vm_err(format!("{} exited early (status {status})", ev.vm)))
                }
                _ => {}
            }
        }
        pair.fill_s = t0.elapsed().as_secs_f64();
        Ok(pair)
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
    fn both_vms_are_identical_and_in_one_group() {
        let c = VmOptions::default().configs();
        assert_eq!(c.len(), 2);
        assert_ne!(c[0].name, c[1].name);
        assert_eq!(c[0].dedup_group(), c[1].dedup_group());
        assert_eq!(c[0].workload, c[1].workload);
        for v in &c {
            v.validate().unwrap();
        }
    }

    #[test]
    fn expectation_counts_one_vm_worth_of_sharing() {
        let o = VmOptions {
            shared: "16M".into(),
            zero_permille: 100,
            dup_permille: 0,
            memory: "64M".into(),
            ..VmOptions::default()
        };
        let e = o.expected().unwrap();
        // 4096 pages per VM in blocks of 1000: each block starts with 100
        // zero pages, the last (96 pages) is all zero: 496 per VM. The
        // non-zero pages of B all equal A's.
        let pages = 16 * 256;
        let zero = 2 * (4 * 100 + 96);
        assert_eq!(e.zero_pages, zero);
        assert_eq!(e.pages_sharing, (2 * pages - zero) / 2);
        assert_eq!(e.saved_pages(), e.pages_sharing + zero);
    }
}
