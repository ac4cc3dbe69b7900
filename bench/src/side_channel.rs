//! The `side-channel` benchmark: the write-timing attack on merged pages
//! (the guest's PROBE_MERGE phase, `pagefold_guest_abi::merge_probe`)
//! against each system. Two workload VMs: a victim that holds content and
//! sits idle, and an attacker whose probe pages are half content the
//! victim also holds (variant `shared`) or all-zero pages (variant `zero`),
//! and half content no one else holds. Once the system has merged what it
//! will, the attacker writes every probe page once, times each write, and
//! classifies the pages by a threshold learned from half of them; its
//! accuracy on the other half is the row's figure (chance: 0.5). The read
//! the attacker times right after each write (a page the kernel just
//! copied or cleared is in the cache) gives a second accuracy.

use std::time::{Duration, Instant};

use pagefold_dedup::{DedupBackend, Mode};
use pagefold_guest_abi::phase;
use pagefold_vmm::config::{
    PlacementKind, SerialOutput, SizeValue, VmConfig, VmDedup, WorkloadConfig,
};
use pagefold_vmm::workload::merge_probe::{probe_row, ProbeRow};
use serde::Serialize;

use crate::error::{vm_err, BenchError};
use crate::host::{load_avg, HostId, KsmSession};
use crate::latency_run::{build_backend, ksm_warnings, teardown};
use crate::latency_vms::ProbePair;
use crate::system::{engine_factory, System};

/// What the attacker's "shared" probe pages hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Content the victim VM holds too (merged across the VMs).
    Shared,
    /// All-zero pages (merged by the zero-page path).
    Zero,
}

impl Variant {
    pub const ALL: [Variant; 2] = [Variant::Shared, Variant::Zero];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Shared => "shared",
            Variant::Zero => "zero",
        }
    }
}

/// Where a system puts the victim and the attacker: the dedup settings of
/// both VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Both in one dedup group (the attack's own setting).
    OneGroup,
    /// Each VM its own group (the VMM's default).
    PerVm,
    /// Both in one hardened group (`Security::Hardened`, docs/security.md).
    Hardened,
}

impl Grouping {
    /// The `[vm] dedup` table of either VM.
    pub fn dedup(self) -> VmDedup {
        VmDedup {
            group: self.shares().then(|| "side-channel".into()),
            security: if self == Grouping::Hardened {
                pagefold_dedup::Security::Hardened
            } else {
                pagefold_dedup::Security::Default
            },
            ..VmDedup::default()
        }
    }

    /// Whether the victim's pages may merge with the attacker's.
    pub fn shares(self) -> bool {
        self != Grouping::PerVm
    }
}

/// A system the attack runs against: `off` has no backend.
pub struct AttackSystem {
    pub name: String,
    pub system: Option<System>,
    pub grouping: Grouping,
}

/// Names accepted by [`select_side_channel_systems`], in run order.
pub const SIDE_CHANNEL_SYSTEM_NAMES: [&str; 6] = [
    "off",
    "pagefold-on",
    "pagefold-groups",
    "pagefold-hardened",
    "ksm-default",
    "ksm-max",
];

/// The systems named in `names` (all if empty), in run order: `off`
/// (dedup off: the attack must fall to chance), pagefold's engine at its
/// defaults with attacker and victim in one group (`pagefold-on`) and in
/// a group each (`pagefold-groups`), and in one hardened group
/// (`pagefold-hardened`), kernel KSM at its defaults and at max effort
/// (KSM has no groups).
pub fn select_side_channel_systems(names: &[String]) -> Result<Vec<AttackSystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !SIDE_CHANNEL_SYSTEM_NAMES.contains(&n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: SIDE_CHANNEL_SYSTEM_NAMES.join(", "),
        });
    }
    let pagefold = |name: &str| {
        let mut s = System::pagefold_default(engine_factory());
        s.name = name.into();
        Some(s)
    };
    let all = [
        (None, Grouping::OneGroup),
        (pagefold("pagefold-on"), Grouping::OneGroup),
        (pagefold("pagefold-groups"), Grouping::PerVm),
        (pagefold("pagefold-hardened"), Grouping::Hardened),
        (Some(System::ksm_default()), Grouping::OneGroup),
        (Some(System::ksm_max()), Grouping::OneGroup),
    ];
    Ok(SIDE_CHANNEL_SYSTEM_NAMES
        .iter()
        .zip(all)
        .filter(|(n, _)| names.is_empty() || names.iter().any(|m| m == *n))
        .map(|(n, (system, grouping))| AttackSystem {
            name: (*n).to_string(),
            system,
            grouping,
        })
        .collect())
}

/// How to run `side-channel`.
#[derive(Debug, Clone)]
pub struct SideChannelOptions {
    pub variants: Vec<Variant>,
    /// Probe pages of each label (the attacker writes twice as many).
    pub probe_pages: u64,
    /// RAM of each VM.
    pub memory: String,
    /// Longest wait for the system to merge the attacker's shared pages.
    pub merge_timeout: Duration,
    /// The saving counts as converged once it reached its target and held
    /// still this long.
    pub settle: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
}

impl Default for SideChannelOptions {
    fn default() -> Self {
        Self {
            variants: Variant::ALL.to_vec(),
            probe_pages: 1000,
            memory: "32M".into(),
            merge_timeout: Duration::from_secs(120),
            settle: Duration::from_secs(1),
            progress: true,
        }
    }
}

/// The victim's and the attacker's content seed (same seed: the
/// attacker's shared region is the victim's).
const SEED: u64 = 0x5ca1_ab1e;

/// The victim's name, and the attacker's.
pub const VICTIM: &str = "victim";
pub const ATTACKER: &str = "attacker";

/// The two VMs of one run: the victim holds `probe_pages` pages of the
/// shared content and waits; the attacker holds its probe pages, waits for
/// the host's gate (merging converged), probes, and waits to be stopped.
pub fn attack_configs(
    variant: Variant,
    probe_pages: u64,
    memory: &str,
    grouping: Grouping,
) -> Vec<VmConfig> {
    let kib = |pages: u64| SizeValue::Text(format!("{}K", pages * 4));
    let vm = |name: &str, w: WorkloadConfig| VmConfig {
        name: name.into(),
        vcpus: 1,
        memory: SizeValue::Text(memory.into()),
        serial: SerialOutput::Null,
        dedup: grouping.dedup(),
        workload: Some(w),
        kernel: None,
        vcpu_affinity: None,
    };
    let victim = WorkloadConfig {
        seed: SEED,
        private_seed: Some(1),
        shared: Some(kib(probe_pages)),
        private: Some(SizeValue::Mib(0)),
        zero_permille: 0,
        dup_permille: 0,
        phases: vec!["fill".into(), "wait".into(), "wait".into()],
        ..WorkloadConfig::default()
    };
    // Zero variant: private pages only, the first half of each block of
    // 1000 zero, the rest unique (the guest takes as many of each).
    let (shared, private, zero_permille) = match variant {
        Variant::Shared => (probe_pages, probe_pages, 0),
        Variant::Zero => (0, 2 * probe_pages, 500),
    };
    // The attacker's pages sit at random addresses (scattered, one page per
    // extent), so that neither label lies in a range of guest addresses of
    // its own: the attack must read merging, not where pages are.
    let attacker = WorkloadConfig {
        seed: SEED,
        private_seed: Some(2),
        shared: Some(kib(shared)),
        private: Some(kib(private)),
        zero_permille,
        dup_permille: 0,
        placement: PlacementKind::Scattered,
        extent_pages: Some(1),
        phases: vec![
            "fill".into(),
            "wait".into(),
            "probe-merge".into(),
            "wait".into(),
        ],
        ..WorkloadConfig::default()
    };
    vec![vm(VICTIM, victim), vm(ATTACKER, attacker)]
}

/// Pages the system should save on the attacker's probe pages: its
/// shared pages where the victim is in its group, its zero pages always.
fn target_pages(variant: Variant, probe_pages: u64, grouping: Grouping) -> u64 {
    match variant {
        Variant::Shared if grouping.shares() => probe_pages,
        Variant::Shared => 0,
        Variant::Zero => probe_pages,
    }
}

/// One (system, variant) result.
#[derive(Debug, Clone, Serialize)]
pub struct SideChannelRow {
    pub system: String,
    pub variant: Variant,
    /// Share of the attacker's test pages its write times classified right
    /// (chance 0.5).
    pub accuracy: f64,
    /// The same by the read of another line of each page right after the
    /// write (cache-hot after a copy or a clearing).
    pub read_accuracy: f64,
    /// `pages_sharing + zero_pages` when the attacker probed (0 for
    /// `off`; host-wide for KSM).
    pub pages_saved: u64,
    /// What the system should save on the probe pages (the wait's target).
    pub target_pages: u64,
    /// Merging-side CPU seconds from merging on to the probe's end.
    pub engine_cpu_s: f64,
    /// Median write time of each label, and the learned threshold.
    pub shared_median_us: f64,
    pub unique_median_us: f64,
    pub threshold_us: f64,
    /// The guest's full result (counts, each label's quantiles).
    pub probe: ProbeRow,
    /// From merging on until the attacker was released.
    pub merge_wait_s: f64,
    /// The saving reached its target and held still before the release.
    pub converged: bool,
    pub host_kind: String,
    pub host_kernel: String,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SideChannelReport {
    pub rows: Vec<SideChannelRow>,
    /// KSM tunables not as found after the benchmark (empty: all restored).
    pub unrestored: Vec<String>,
}

/// Runs every system on every variant, holding the KSM lock throughout,
/// and checks that every KSM tunable is as found at the end.
pub fn run_side_channel_bench(
    systems: &[AttackSystem],
    opts: &SideChannelOptions,
) -> Result<SideChannelReport, BenchError> {
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    if !(1..=pagefold_guest_abi::merge_probe::MAX_PROBES as u64 / 2).contains(&opts.probe_pages) {
        return Err(BenchError::InvalidInput(format!(
            "probe pages per label: {} (valid 1..={})",
            opts.probe_pages,
            pagefold_guest_abi::merge_probe::MAX_PROBES / 2
        )));
    }
    let ksm = KsmSession::start()?;
    let mut rows = Vec::new();
    let mut result = Ok(());
    'all: for &variant in &opts.variants {
        for system in systems {
            match run_once(system, variant, opts) {
                Ok(r) => rows.push(r),
                Err(e) => {
                    result = Err(e);
                    break 'all;
                }
            }
        }
    }
    let unrestored = ksm.finish();
    if !unrestored.is_empty() {
        log::error!("KSM tunables not restored: {}", unrestored.join("; "));
    }
    result?;
    Ok(SideChannelReport { rows, unrestored })
}

/// The backend's saving and CPU (zeros without one).
fn counters(backend: Option<&dyn DedupBackend>) -> (u64, f64) {
    backend.map_or((0, 0.0), |b| {
        let st = b.stats();
        (st.pages_sharing + st.zero_pages, st.cpu_seconds)
    })
}

/// Runs the attack on `sys` with `variant`; the caller holds the KSM lock.
fn run_once(
    sys: &AttackSystem,
    variant: Variant,
    opts: &SideChannelOptions,
) -> Result<SideChannelRow, BenchError> {
    let kernel_ksm = sys.system.as_ref().is_some_and(|s| s.kernel_ksm);
    let tag = format!("[{} {}]", sys.name, variant.name());
    let host = HostId::current();
    let load = load_avg();
    let warnings = ksm_warnings(kernel_ksm);
    let target = if sys.system.is_some() {
        target_pages(variant, opts.probe_pages, sys.grouping)
    } else {
        0
    };
    let configs = attack_configs(variant, opts.probe_pages, &opts.memory, sys.grouping);
    let backend = sys.system.as_ref().map(build_backend).transpose()?;
    let mut vms = match ProbePair::start_configs(backend.as_ref(), configs, FILL_TIMEOUT) {
        Ok(p) => p,
        Err(e) => {
            if let Some(b) = &backend {
                b.shutdown();
            }
            return Err(e);
        }
    };
    let b = backend.as_deref();
    let result = attack(&mut vms, b, target, &tag, opts);
    vms.stop();
    let down = teardown(b, kernel_ksm, &sys.name);
    let m = result?;
    down?;
    let row = SideChannelRow {
        system: sys.name.clone(),
        variant,
        accuracy: m.probe.accuracy,
        read_accuracy: m.probe.read_accuracy,
        pages_saved: m.saved,
        target_pages: target,
        engine_cpu_s: m.cpu_s,
        shared_median_us: m.probe.shared_median_us,
        unique_median_us: m.probe.unique_median_us,
        threshold_us: m.probe.threshold_us,
        probe: m.probe,
        merge_wait_s: m.wait_s,
        converged: m.converged,
        host_kind: host.kind,
        host_kernel: host.kernel,
        load_avg: load,
        warnings,
    };
    if opts.progress {
        eprintln!(
            "{tag} accuracy {:.3} ({} of {}; read after write {:.3}), median write shared {:.2} us, unique {:.2} us, threshold {:.2} us, saved {} pages, engine CPU {:.2} s",
            row.accuracy,
            row.probe.correct,
            row.probe.tested,
            row.read_accuracy,
            row.shared_median_us,
            row.unique_median_us,
            row.threshold_us,
            row.pages_saved,
            row.engine_cpu_s
        );
    }
    Ok(row)
}

/// Both guests must fill their few MiB within this long.
const FILL_TIMEOUT: Duration = Duration::from_secs(60);

/// The probe itself writes a few thousand pages; this bounds a stuck one.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one attack measured.
struct Measured {
    probe: ProbeRow,
    saved: u64,
    cpu_s: f64,
    wait_s: f64,
    converged: bool,
}

/// Turns merging on, waits for the saving, releases the attacker and
/// reads its result.
fn attack(
    vms: &mut ProbePair,
    backend: Option<&dyn DedupBackend>,
    target: u64,
    tag: &str,
    opts: &SideChannelOptions,
) -> Result<Measured, BenchError> {
    let (_, cpu0) = counters(backend);
    if let Some(b) = backend {
        b.set_mode(Mode::On)
            .map_err(BenchError::backend(b.name()))?;
    }
    let t0 = Instant::now();
    let converged = backend.is_none() || wait_merged(backend, target, tag, opts);
    let wait_s = t0.elapsed().as_secs_f64();
    let (saved, _) = counters(backend);
    if opts.progress {
        eprintln!("{tag} {saved} pages saved after {wait_s:.1} s (target {target}); probing");
    }
    vms.release();
    vms.wait_phase_of(&[ATTACKER.to_string()], phase::PROBE_MERGE, PROBE_TIMEOUT)?;
    let (_, cpu1) = counters(backend);
    let rec = vms
        .last_phase(ATTACKER, phase::PROBE_MERGE)
        .ok_or_else(|| vm_err("the attacker ended no probe-merge phase"))?;
    let probe = probe_row(&rec).ok_or_else(|| vm_err("the probe phase has no result"))?;
    if probe.tested == 0 {
        return Err(vm_err("the attacker tested no page (no TSC rate?)"));
    }
    Ok(Measured {
        probe,
        saved,
        cpu_s: (cpu1 - cpu0).max(0.0),
        wait_s,
        converged,
    })
}

/// Waits until the saving reaches `target` and then holds still for
/// `opts.settle` (what there is to merge is merged), or the merge timeout
/// passes; true if it converged. Progress once a second.
fn wait_merged(
    backend: Option<&dyn DedupBackend>,
    target: u64,
    tag: &str,
    opts: &SideChannelOptions,
) -> bool {
    let t0 = Instant::now();
    let mut next = Duration::from_secs(1);
    let mut last = (u64::MAX, Instant::now());
    while t0.elapsed() < opts.merge_timeout {
        let (saved, _) = counters(backend);
        if saved != last.0 {
            last = (saved, Instant::now());
        }
        if saved >= target && last.1.elapsed() >= opts.settle {
            return true;
        }
        if opts.progress && t0.elapsed() >= next {
            next += Duration::from_secs(1);
            eprintln!(
                "{tag} {:5.1} s  saved {saved} (target {target})",
                t0.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if opts.progress {
        eprintln!(
            "{tag} no steady saving of {target} pages after {:?}",
            opts.merge_timeout
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn systems_are_selected_by_name_in_run_order() {
        let all = select_side_channel_systems(&[]).unwrap();
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, SIDE_CHANNEL_SYSTEM_NAMES);
        assert!(all[0].system.is_none());
        let on = all[1].system.as_ref().unwrap();
        assert_eq!(
            (on.name.as_str(), on.knobs, all[1].grouping),
            ("pagefold-on", None, Grouping::OneGroup)
        );
        assert_eq!(all[2].grouping, Grouping::PerVm);
        assert_eq!(all[3].grouping, Grouping::Hardened);
        assert!(all[5].system.as_ref().unwrap().kernel_ksm);
        let two = ["ksm-max".to_string(), "off".to_string()];
        let s = select_side_channel_systems(&two).unwrap();
        let names: Vec<_> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["off", "ksm-max"]);
        let e = select_side_channel_systems(&["pagefold-paranoid".to_string()]).err();
        assert!(e.unwrap().to_string().contains("pagefold-paranoid"));
    }

    #[test]
    fn configs_give_the_attacker_half_shared_or_zero_probe_pages() {
        for variant in Variant::ALL {
            for grouping in [Grouping::OneGroup, Grouping::PerVm, Grouping::Hardened] {
                let c = attack_configs(variant, 1000, "32M", grouping);
                assert_eq!(c.len(), 2);
                for vm in &c {
                    vm.validate().unwrap();
                    assert_eq!(vm.dedup_group() == "side-channel", grouping.shares());
                    assert!(vm.dedup.enabled);
                }
                let a = c[1].workload.as_ref().unwrap();
                assert_eq!(a.phases, ["fill", "wait", "probe-merge", "wait"]);
                assert_eq!(a.placement, PlacementKind::Scattered);
                let v = c[0].workload.as_ref().unwrap();
                assert_eq!(v.seed, a.seed);
                assert_ne!(v.private_seed, a.private_seed);
                // The victim waits twice: the release that starts the
                // probe must not end its program (and unmap its pages).
                assert_eq!(v.phases, ["fill", "wait", "wait"]);
            }
        }
        let z = attack_configs(Variant::Zero, 1000, "32M", Grouping::OneGroup);
        assert_eq!(
            z[1].workload.as_ref().unwrap().placement,
            PlacementKind::Scattered
        );
        assert_eq!(z[1].workload.as_ref().unwrap().zero_permille, 500);
        assert_eq!(target_pages(Variant::Shared, 1000, Grouping::PerVm), 0);
        assert_eq!(target_pages(Variant::Zero, 1000, Grouping::PerVm), 1000);
    }

    /// The attack end to end, on real workload VMs: against pagefold's
    /// engine at its defaults with attacker and victim in one group, and
    /// against kernel KSM at max effort, it tells merged pages (shared
    /// content, zero pages) from unmerged ones by its write times (at least
    /// 0.9; 0.8 on pagefold's zero pages) and by the read after each write
    /// (at least 0.9); with dedup off it is at chance. Holds the KSM lock; the KSM tunables must come back as found.
    #[test]
    fn the_attack_reads_merging_in_one_group_and_nothing_with_dedup_off_or_hardened() {
        let names = ["off", "pagefold-on", "pagefold-hardened", "ksm-max"].map(String::from);
        let systems = select_side_channel_systems(&names).unwrap();
        let opts = SideChannelOptions {
            merge_timeout: Duration::from_secs(60),
            progress: false,
            ..SideChannelOptions::default()
        };
        let r = run_side_channel_bench(&systems, &opts).unwrap();
        assert!(r.unrestored.is_empty(), "{:?}", r.unrestored);
        assert_eq!(r.rows.len(), 8);
        for x in &r.rows {
            let what = format!("{} {}: {x:?}", x.system, x.variant.name());
            // As many pages of each label; half of them tested.
            assert_eq!(
                (x.probe.pages, x.probe.shared_pages),
                (2000, 1000),
                "{what}"
            );
            assert_eq!(x.probe.tested, 1000, "{what}");
            let q = &x.probe;
            assert!(q.shared_us.windows(2).all(|w| w[0] <= w[1]), "{what}");
            assert!(q.unique_us.windows(2).all(|w| w[0] <= w[1]), "{what}");
            if x.system == "off" {
                assert!(x.accuracy <= 0.65, "{what}");
                assert!(x.read_accuracy <= 0.65, "{what}");
                assert_eq!(x.pages_saved, 0, "{what}");
            } else if x.system == "pagefold-hardened" {
                // Every probe page moved onto the pool, shared or not: the
                // attack falls to chance by either timer, and the saving
                // is what the default group's is.
                assert!(x.converged && x.pages_saved >= x.target_pages, "{what}");
                assert!(x.accuracy <= 0.65, "{what}");
                assert!(x.read_accuracy <= 0.65, "{what}");
            } else {
                assert!(x.converged && x.pages_saved >= x.target_pages, "{what}");
                // Issue 34's goal, 0.9, for the cross-VM attack and for
                // KSM. Against pagefold's zero-page path the gap the attack
                // reads is about 1 us (a zero page's refill against the
                // dirty log's fault on an unmerged page), and on a loaded
                // 2-CPU host the accuracy varies more (0.891-0.995 in
                // eight runs at load 5-7): the bound keeps a margin there
                // and still fails an attack at chance.
                let least = if x.system == "pagefold-on" && x.variant == Variant::Zero {
                    0.8
                } else {
                    0.9
                };
                assert!(x.accuracy >= least, "{what}");
                // The page a write made the kernel copy or clear is in the
                // cache after it.
                assert!(x.read_accuracy >= 0.9, "{what}");
                assert!(
                    x.probe.shared_read_median_us < x.probe.unique_read_median_us,
                    "{what}"
                );
                // The merged label's writes are the slow ones.
                assert!(x.shared_median_us > x.unique_median_us, "{what}");
            }
        }
    }
}
