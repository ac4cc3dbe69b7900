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
use pagefold_vmm::config::{Config, SerialOutput, SizeValue, VmConfig, VmDedup, WorkloadConfig};
use pagefold_vmm::state::Outcome;
use pagefold_vmm::vm::{Vm, VmResources};
use pagefold_vmm::workload::Event;
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::error::{vm_err, BenchError};

/// Where the workload guest puts its data pages in guest memory: the
/// `[vm.workload]` key `placement`. Two VMs with the same seed hold the
/// same pages either way; with `scattered` the guests place them (in
/// extents of `extent_pages`) in a VM-specific random order, as page caches
/// do, so twins are not at the same guest address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Page i of the data at data offset i (the guest's default).
    #[default]
    Linear,
    /// A seeded random order of extents.
    Scattered,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Linear => "linear",
            Placement::Scattered => "scattered",
        })
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "linear" => Ok(Placement::Linear),
            "scattered" => Ok(Placement::Scattered),
            o => Err(format!(
                "unknown placement {o:?} (expected linear or scattered)"
            )),
        }
    }
}

/// The two VMs' shape.
#[derive(Debug, Clone)]
pub struct VmOptions {
    pub memory: String,
    /// Identical in both VMs (same seed and private seed).
    pub shared: String,
    pub zero_permille: u32,
    pub dup_permille: u32,
    /// `placement` of `[vm.workload]`; `linear` writes no key (the
    /// guest's default, accepted by every build).
    pub placement: Placement,
    /// `extent_pages` of `[vm.workload]`; `None` writes no key.
    pub extent_pages: Option<u32>,
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
            placement: Placement::Linear,
            extent_pages: None,
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
    ///
    /// Built from [`VmOptions::config_toml`], the same text a user would
    /// write, so the placement keys reach the VMM exactly as the config
    /// file format defines them. A build whose `[vm.workload]` does not
    /// know them refuses the config here, before any VM starts.
    pub fn configs(&self) -> Result<Vec<VmConfig>, BenchError> {
        if self.workload_keys().is_empty() {
            return Ok(self.base_configs());
        }
        let text = self.config_toml()?;
        let cfg: Config = toml::from_str(&text).map_err(|e| {
            BenchError::Vm(format!(
                "this build does not accept the workload keys {:?} (placement {}): {e}",
                self.workload_keys().keys().collect::<Vec<_>>(),
                self.placement
            ))
        })?;
        Ok(cfg.vms)
    }

    /// `[vm.workload]` keys beyond the built-in fields: `placement` when
    /// not linear, `extent_pages` when set.
    fn workload_keys(&self) -> toml::Table {
        let mut t = toml::Table::new();
        if self.placement != Placement::Linear {
            t.insert("placement".into(), self.placement.to_string().into());
        }
        if let Some(n) = self.extent_pages {
            t.insert("extent_pages".into(), i64::from(n).into());
        }
        t
    }

    /// The two VMs as a pagefold config file (`[[vm]]` tables, each with
    /// its `[vm.workload]`), e.g. for `pagefold run --config`.
    pub fn config_toml(&self) -> Result<String, BenchError> {
        let toml_err =
            |e: &dyn std::fmt::Display| BenchError::Vm(format!("VM config as TOML: {e}"));
        let mut vms = Vec::new();
        for c in self.base_configs() {
            let mut v = toml::Table::try_from(&c).map_err(|e| toml_err(&e))?;
            if let Some(toml::Value::Table(w)) = v.get_mut("workload") {
                w.extend(self.workload_keys());
            }
            vms.push(toml::Value::Table(v));
        }
        let mut doc = toml::Table::new();
        doc.insert("vm".into(), toml::Value::Array(vms));
        toml::to_string(&doc).map_err(|e| toml_err(&e))
    }

    /// The configs with the fields every build knows.
    fn base_configs(&self) -> Vec<VmConfig> {
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
                    security: Default::default(),
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
                vcpu_affinity: None,
            })
            .collect()
    }

    /// The exact expectation for [`VmOptions::configs`], computed from the
    /// same parameter blocks the VMM gives the guests.
    pub fn expected(&self) -> Result<Expected, BenchError> {
        let image_end =
            pagefold_vmm::workload::boot::image_end(pagefold_vmm::workload::image::WORKLOAD_ELF)
                .map_err(|e| BenchError::Vm(e.to_string()))?;
        let mut params = Vec::new();
        for (i, c) in self.configs()?.iter().enumerate() {
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
        for (i, c) in opts.configs()?.iter().enumerate() {
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
        let c = VmOptions::default().configs().unwrap();
        assert_eq!(c.len(), 2);
        assert_ne!(c[0].name, c[1].name);
        assert_eq!(c[0].dedup_group(), c[1].dedup_group());
        assert_eq!(c[0].workload, c[1].workload);
        for v in &c {
            v.validate().unwrap();
        }
    }

    /// What `config_toml` writes, read back as plain TOML.
    fn workload_tables(o: &VmOptions) -> Vec<toml::Table> {
        let text = o.config_toml().unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let vms = doc["vm"].as_array().unwrap();
        assert_eq!(vms.len(), 2, "{text}");
        vms.iter()
            .map(|v| v["workload"].as_table().unwrap().clone())
            .collect()
    }

    #[test]
    fn scattered_placement_writes_the_workload_keys() {
        let o = VmOptions {
            placement: Placement::Scattered,
            extent_pages: Some(4),
            ..VmOptions::default()
        };
        let text = o.config_toml().unwrap();
        assert!(text.contains("[vm.workload]"), "{text}");
        for w in workload_tables(&o) {
            assert_eq!(w["placement"].as_str(), Some("scattered"), "{text}");
            assert_eq!(w["extent_pages"].as_integer(), Some(4), "{text}");
            // Everything else as in the linear pair.
            assert_eq!(w["seed"].as_integer(), Some(7));
            assert_eq!(w["shared"].as_str(), Some("256M"));
            let phases: Vec<_> = w["phases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            assert_eq!(phases, ["fill", "wait"]);
        }
        // Either this build's VMM knows the keys (and keeps them), or it
        // refuses the config naming them: never a silent linear run.
        match o.configs() {
            Ok(c) => {
                let back = toml::Table::try_from(&c[0]).unwrap();
                let w = back["workload"].as_table().unwrap();
                assert_eq!(w["placement"].as_str(), Some("scattered"));
                assert_eq!(w["extent_pages"].as_integer(), Some(4));
            }
            Err(e) => assert!(e.to_string().contains("placement"), "{e}"),
        }
    }

    #[test]
    fn linear_placement_writes_no_new_key_and_parses_as_before() {
        let o = VmOptions::default();
        for w in workload_tables(&o) {
            // No key, or the VMM's own default written back by a build
            // that has the field.
            let p = w.get("placement").map(|p| p.as_str());
            assert!(matches!(p, None | Some(Some("linear"))), "{w:?}");
            assert!(!w.contains_key("extent_pages"), "{w:?}");
        }
        // The text is a valid pagefold config giving the same VMs.
        let cfg: Config = toml::from_str(&o.config_toml().unwrap()).unwrap();
        assert_eq!(cfg.vms, o.configs().unwrap());
        // An extent without scattering is still passed on.
        let e = VmOptions {
            extent_pages: Some(8),
            ..VmOptions::default()
        };
        for w in workload_tables(&e) {
            assert_eq!(w["extent_pages"].as_integer(), Some(8));
            let p = w.get("placement").map(|p| p.as_str());
            assert!(matches!(p, None | Some(Some("linear"))), "{w:?}");
        }
        assert_eq!("scattered".parse::<Placement>(), Ok(Placement::Scattered));
        assert!("random".parse::<Placement>().is_err());
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
