//! The `build` benchmark (docs/benchmarks.md): two workload VMs build the
//! same source tree side by side (the guest's BUILD phase,
//! `pagefold_guest_abi::build`), `runs` times for each system; reports
//! what merging shared and what it cost the build, as mean and stdev over
//! runs (the LKML Feb 2019 two-VM kernel-build experiment: `real`, `user`,
//! `sys`, `npages`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_dedup::auto::{AutoController, ScriptHandle, ScriptedSource};
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KsmBackend, KSM_SYSFS};
use pagefold_dedup::{
    DedupBackend, DedupSettings, Engine, EngineConfig, Mode, Security, DEFAULT_KNOBS,
};
use pagefold_guest_abi::build::{
    area_pages, area_sharing, expected, image_bytes, tree_pages, TreeSpec,
};
use pagefold_guest_abi::expect::{Expectation, VmState};
use pagefold_guest_abi::phase;
use pagefold_vmm::config::{
    Config, DiskConfig, SerialOutput, SizeValue, VmConfig, VmDedup, WorkloadConfig,
};
use pagefold_vmm::runner::Runner;
use serde::{Deserialize, Serialize};

use crate::auto_bench::{bench_auto_config, FREE_AFTER, FREE_BEFORE, TOTAL};
use crate::error::{vm_err, BenchError};
use crate::host::{load_avg, other_ksm_users, HostId};
use crate::region::PAGE;
use crate::system::KSM_DEFAULT_KNOBS;

/// Names accepted by [`select_build_systems`], in run order.
pub const BUILD_SYSTEM_NAMES: [&str; 8] = [
    "off",
    "pagefold-on",
    "pagefold-on-nohints",
    "pagefold-on-nolog",
    "pagefold-on-noassist",
    "pagefold-auto",
    "ksm-default",
    "ksm-10000",
];

/// The LKML reference's KSM setting: pages_to_scan 10000 at KSM's default
/// sleep (20 ms).
pub const KSM_10000_KNOBS: DedupSettings = DedupSettings {
    pages_to_scan: Some(10_000),
    sleep_millisecs: Some(20),
    ..DedupSettings::NONE
};

/// Which dedup system runs beside the builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BuildSystem {
    /// No dedup backend at all.
    Off,
    /// pagefold's engine at its defaults, on from the start.
    PagefoldOn,
    /// The same without I/O hints (virtio-blk reads not fed to the engine).
    PagefoldOnNoHints,
    /// The same without the write log (KVM's dirty log not read: every
    /// visit reads pagemap, as before the log).
    PagefoldOnNoLog,
    /// The same with the KSM assist off: the engine alone. Whether the
    /// assist takes two Linux guests' group depends on how scattered one
    /// pass's merges come out, and it took it in some build runs and not
    /// in others of the same binary; then ksmd did the merging.
    PagefoldOnNoAssist,
    /// The same, never parking the vCPUs around merges (every merge's TLB
    /// flush is an IPI to the CPUs running them): what parking costs or
    /// saves on this host (`bench linux-read` only).
    PagefoldOnNoPark,
    /// pagefold's engine at its defaults with the guests in a hardened
    /// group (`Security::Hardened`, docs/security.md): what the
    /// side-channel defence keeps of the saving on real guests (`bench
    /// linux-read` only).
    PagefoldHardened,
    /// pagefold's engine with the auto controller on a scripted memory
    /// source, which crosses the threshold during the build.
    PagefoldAuto,
    /// Kernel KSM with these knobs, on from the start.
    Ksm(&'static str, DedupSettings),
}

impl BuildSystem {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::PagefoldOn => "pagefold-on",
            Self::PagefoldOnNoHints => "pagefold-on-nohints",
            Self::PagefoldOnNoLog => "pagefold-on-nolog",
            Self::PagefoldOnNoAssist => "pagefold-on-noassist",
            Self::PagefoldOnNoPark => "pagefold-on-nopark",
            Self::PagefoldHardened => "pagefold-hardened",
            Self::PagefoldAuto => "pagefold-auto",
            Self::Ksm(n, _) => n,
        }
    }

    pub(crate) fn kernel_ksm(&self) -> bool {
        matches!(self, Self::Ksm(..))
    }

    /// The security of the guests' dedup group under this system.
    pub(crate) fn security(&self) -> Security {
        match self {
            Self::PagefoldHardened => Security::Hardened,
            _ => Security::Default,
        }
    }
}

/// The systems named (all if `names` is empty), in run order.
pub fn select_build_systems(names: &[String]) -> Result<Vec<BuildSystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !BUILD_SYSTEM_NAMES.contains(&n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: BUILD_SYSTEM_NAMES.join(", "),
        });
    }
    Ok([
        BuildSystem::Off,
        BuildSystem::PagefoldOn,
        BuildSystem::PagefoldOnNoHints,
        BuildSystem::PagefoldOnNoLog,
        BuildSystem::PagefoldOnNoAssist,
        BuildSystem::PagefoldAuto,
        BuildSystem::Ksm("ksm-default", KSM_DEFAULT_KNOBS),
        BuildSystem::Ksm("ksm-10000", KSM_10000_KNOBS),
    ]
    .into_iter()
    .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name()))
    .collect())
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub tree: TreeSpec,
    /// Runs per system.
    pub runs: usize,
    /// pagefold-auto: the scripted free memory drops below the threshold
    /// once a VM has compiled this fraction of its files.
    pub auto_trigger_fraction: f64,
    pub sample_interval: Duration,
    /// Longest a run may take.
    pub timeout: Duration,
    /// Where the tree image is written (removed afterwards).
    pub image_dir: PathBuf,
    pub progress: bool,
    /// Host CPUs for the VMs' vCPU threads (`vcpu_affinity`); None: any.
    /// The reference host had CPUs to spare for the merger; on a host
    /// whose CPUs the builds fill, keeping the guests off one CPU leaves
    /// it to the merger, as there.
    pub vcpu_affinity: Option<Vec<usize>>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            tree: TreeSpec {
                seed: 0x6b65_726e,
                files: 2000,
                rounds: 200,
            },
            runs: 5,
            auto_trigger_fraction: 0.25,
            sample_interval: Duration::from_millis(50),
            timeout: Duration::from_secs(300),
            image_dir: std::env::temp_dir(),
            progress: true,
            vcpu_affinity: None,
        }
    }
}

/// One observation during a run (time from the start of the builds).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct BuildSample {
    pub t_s: f64,
    /// `pages_sharing + zero_pages` (see [`BuildRun::npages`]).
    pub npages: u64,
    /// The backend's full scans, merges and COW breaks so far (pagefold's
    /// merges only; KSM's `full_scans` and host-wide `cow_ksm`): how fast
    /// the passes go, and when merges are undone.
    #[serde(default)]
    pub full_scans: u64,
    #[serde(default)]
    pub merges: u64,
    #[serde(default)]
    pub cow_breaks: u64,
    /// pagefold's settle time (`Stats::settle_ms`).
    #[serde(default)]
    pub settle_ms: u64,
    /// The engine's CPU so far, and of it, executing merges.
    #[serde(default)]
    pub cpu_s: f64,
    #[serde(default)]
    pub merge_cpu_s: f64,
    /// Of `cpu_s`, ksmd's while the KSM assist had a group (pagefold), or
    /// ksmd's in all (KSM).
    #[serde(default)]
    pub ksm_cpu_s: f64,
    /// Both guests' vCPU time held by the engine's parks so far (the VMM's
    /// record, `GuestPauses::total_s`): guest time lost to merging beside
    /// the engine's CPU (0 for KSM, which parks nothing).
    #[serde(default)]
    pub parked_s: f64,
}

impl BuildSample {
    /// The sample at `t_s` from the backend's statistics (None: off).
    pub(crate) fn of(t_s: f64, st: Option<&pagefold_dedup::Stats>) -> Self {
        BuildSample {
            t_s,
            npages: st.map_or(0, npages),
            full_scans: st.map_or(0, |s| s.full_scans),
            merges: st
                .filter(|s| s.backend == "pagefold")
                .map_or(0, |s| s.merges),
            cow_breaks: st.map_or(0, |s| s.cow_breaks),
            settle_ms: st.map_or(0, |s| s.settle_ms),
            cpu_s: st.map_or(0.0, |s| s.cpu_seconds),
            merge_cpu_s: st.map_or(0.0, |s| s.merge_cpu_seconds),
            ksm_cpu_s: st.map_or(0.0, |s| {
                if s.backend == "pagefold" {
                    s.ksm_cpu_seconds
                } else {
                    s.cpu_seconds
                }
            }),
            parked_s: 0.0,
        }
    }

    /// The sample with the guests' parked time as the VMM recorded it.
    pub(crate) fn parked(mut self, r: &Runner) -> Self {
        self.parked_s = r.vms().iter().map(|v| v.info().guest_pauses.total_s).sum();
        self
    }
}

/// One run of one system.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRun {
    /// Guest build time: the slower VM's BUILD phase (host-measured).
    pub real_s: f64,
    /// This process's user and system CPU over the builds (vCPU threads,
    /// device and engine threads; not ksmd).
    pub user_s: f64,
    pub sys_s: f64,
    /// Guests' CPU-bound part (compile and link), TSC-measured in the
    /// guest, mean of the two VMs (includes time the vCPU was preempted).
    pub guest_cpu_s: f64,
    /// The dedup engine's (or ksmd's) CPU over the builds.
    pub engine_cpu_s: f64,
    /// Pages merged when the builds ended: `pages_sharing + zero_pages`.
    /// KSM (use_zero_pages 0) counts zero pages in `pages_sharing`;
    /// pagefold counts them apart; the sum is the same saving for both.
    pub npages: u64,
    pub pages_sharing: u64,
    pub zero_pages: u64,
    /// Largest `npages` seen during the builds.
    pub peak_npages: u64,
    /// When `npages` first reached its end-of-build value (s from start).
    pub t_final_npages_s: Option<f64>,
    /// pagefold's COW breaks (KSM does not count them: 0).
    pub cow_breaks: u64,
    /// pagefold's merges over the builds (pages mapped onto the pool or
    /// dropped to zero; 0 for KSM, which does not count them). The engine's
    /// CPU goes mostly per merge, and runs differ in how many they make.
    pub merges: u64,
    /// pagefold with I/O hints: merges made on hinted visits, and their
    /// mean delay from the device's fill to the merge (None without any).
    /// A hinted page the scan reached first is merged by the scan: on a
    /// small tree every merge may be.
    pub hint_merges: u64,
    pub hint_merge_delay_ms: Option<f64>,
    /// pagefold's merges and COW breaks over the builds by the rule that
    /// let each page merge (None for KSM, which cannot tell).
    #[serde(default)]
    pub origins: Option<pagefold_dedup::MergeOrigins>,
    /// Per VM: pages read, written, reused; output checksum.
    pub pages_read: u64,
    pub pages_written: u64,
    pub pages_reused: u64,
    pub checksums: Vec<u64>,
    /// pagefold-auto: when the scripted memory crossed the threshold.
    pub trigger_s: Option<f64>,
    pub samples: Vec<BuildSample>,
}

#[cfg(test)]
impl BuildRun {
    /// A run that saved `npages` pages (all shared, reached at 50 s) with
    /// `cow_breaks` breaks, in 100 s and 1 s of engine CPU; nothing else.
    pub(crate) fn test_run(npages: u64, cow_breaks: u64) -> Self {
        BuildRun {
            real_s: 100.0,
            user_s: 0.0,
            sys_s: 0.0,
            guest_cpu_s: 0.0,
            engine_cpu_s: 1.0,
            npages,
            pages_sharing: npages,
            zero_pages: 0,
            peak_npages: npages,
            t_final_npages_s: Some(50.0),
            cow_breaks,
            merges: 0,
            hint_merges: 0,
            hint_merge_delay_ms: None,
            origins: None,
            pages_read: 0,
            pages_written: 0,
            pages_reused: 0,
            checksums: vec![],
            trigger_s: None,
            samples: Vec::new(),
        }
    }
}

/// Mean and stdev over runs, one per system.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildRow {
    pub system: String,
    pub runs: usize,
    pub real_mean_s: f64,
    pub real_stdev_s: f64,
    pub user_mean_s: f64,
    pub user_stdev_s: f64,
    pub sys_mean_s: f64,
    pub sys_stdev_s: f64,
    pub guest_cpu_mean_s: f64,
    pub engine_cpu_mean_s: f64,
    pub engine_cpu_stdev_s: f64,
    pub npages_mean: f64,
    pub npages_stdev: f64,
    /// Pages merged over the build, in page-seconds (the area under the
    /// npages curve, [`npages_area`]), mean over runs: what merging earlier
    /// (I/O hints) gains, which the end-of-build npages does not show.
    pub npages_area_mean: f64,
    /// The area divided by the build's length ([`npages_time_mean`]), mean
    /// over runs: the pages merged on average while the build ran. The
    /// area grows with the build's length (a build slowed down uniformly
    /// has a larger area for the same merging); this mean does not, so it
    /// is the fairer of the two between systems whose builds took
    /// different times.
    pub npages_time_mean: f64,
    pub peak_saving_mean_bytes: f64,
    pub cow_breaks_mean: f64,
    /// Mean merges per run (pagefold), and the engine's CPU per merge in
    /// microseconds (total engine CPU / total merges; None without merges).
    pub merges_mean: f64,
    pub engine_us_per_merge: Option<f64>,
    /// Mean over runs of each run's mean delay from a device fill to its
    /// hinted merge (the goal: within 1 s of the read); None when no
    /// run merged on hints.
    pub hint_merge_delay_mean_ms: Option<f64>,
    pub t_final_npages_s: Option<f64>,
    pub checksums_agree: bool,
    /// `hardware`, `pvm`, `emulated-svm` or `other`: build times under
    /// emulation compare only within one run. Empty in rows written
    /// before it was recorded.
    #[serde(default)]
    pub host_kind: String,
    /// The host kernel's release.
    #[serde(default)]
    pub host_kernel: String,
    /// `vm.max_map_count` during the run (0: not recorded).
    #[serde(default)]
    pub max_map_count: u64,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
    pub per_run: Vec<BuildRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildReport {
    pub tree: TreeInfo,
    pub rows: Vec<BuildRow>,
    pub unrestored: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TreeInfo {
    pub seed: u64,
    pub files: u32,
    pub rounds: u32,
    pub tree_pages: u64,
    pub expected_checksum: u64,
    pub expected_pages_written: u64,
    pub expected_pages_reused: u64,
    /// What a perfect merger saves at the end of the builds, in pages
    /// (`pages_sharing + zero_pages`): the written pages of the two build
    /// areas (exact, from the host's run of the same build) plus the fill
    /// (exact, `expect`); the identical guest images and page tables add a
    /// few more.
    pub possible_npages: u64,
}

/// Mean and sample standard deviation (0 for fewer than 2 values).
pub fn mean_stdev(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// This process's (user, system) CPU seconds, all threads.
pub fn self_rusage() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we pass; no other
    // memory is touched.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// The two VMs' configs: same tree, one dedup group; small fill, then the
/// build (scattered placement), then a gate so memory stays in place until
/// the harness has read the end-of-build figures.
pub fn build_configs(image: &Path, tree: &TreeSpec) -> Vec<VmConfig> {
    let area_mib = (area_pages(tree_pages(tree)) * PAGE as u64).div_ceil(1 << 20);
    let memory = (area_mib + 32).div_ceil(2) * 2;
    ["build-a", "build-b"]
        .iter()
        .map(|name| VmConfig {
            name: (*name).into(),
            vcpus: 1,
            memory: SizeValue::Mib(memory),
            serial: SerialOutput::Null,
            dedup: VmDedup {
                enabled: true,
                group: Some("build".into()),
                security: Default::default(),
            },
            workload: Some(WorkloadConfig {
                seed: 7,
                shared: Some(SizeValue::Text("2M".into())),
                private: Some(SizeValue::Text("2M".into())),
                phases: vec!["fill".into(), "build".into(), "wait:600000".into()],
                disks: vec![DiskConfig {
                    path: image.to_path_buf(),
                    readonly: true,
                }],
                ..WorkloadConfig::default()
            }),
            kernel: None,
            vcpu_affinity: None,
        })
        .collect()
}

/// Guest-physical base of disk 0's virtio-mmio window, as
/// `disk::attach_disks` places it (slot n at `0xd000_0000 + n*0x1000`).
const DISK0_MMIO: u64 = 0xd000_0000;

/// [`TreeInfo::possible_npages`] for [`build_configs`].
pub fn possible_npages(image: &Path, tree: &TreeSpec) -> Result<u64, BenchError> {
    let image_end =
        pagefold_vmm::workload::boot::image_end(pagefold_vmm::workload::image::WORKLOAD_ELF)
            .map_err(vm_err)?;
    let disks = [pagefold_vmm::workload::GuestDisk {
        mmio: DISK0_MMIO,
        sectors: tree_pages(tree) * pagefold_guest_abi::disk::SECTORS_PER_PAGE,
    }];
    let mut params = Vec::new();
    for (i, c) in build_configs(image, tree).iter().enumerate() {
        let ranges = pagefold_vmm::memory::ram_ranges(c.memory_bytes()).map_err(vm_err)?;
        let w = c.workload.clone().unwrap_or_default();
        params.push(
            pagefold_vmm::workload::params_with_disks(
                &w, &c.name, i, &ranges, image_end, 0, &disks,
            )
            .map_err(vm_err)?,
        );
    }
    let states: Vec<VmState<'_>> = params
        .iter()
        .map(|p| VmState {
            params: p,
            churn_writes: 0,
        })
        .collect();
    // The build areas are unpredicted for `expect`: counted apart.
    let e = Expectation::compute(&states).map_err(|e| vm_err(format!("{e:?}")))?;
    Ok(e.sharing_pages + e.zero_pages + area_sharing(*tree, params.len() as u64))
}

/// Runs every system `opts.runs` times (runs interleaved: run 1 of every
/// system, then run 2, ... so load drift spreads over all systems), holding
/// the KSM lock; checks KSM tunables are as found afterwards.
pub fn run_build_bench(
    systems: &[BuildSystem],
    opts: &BuildOptions,
) -> Result<BuildReport, BenchError> {
    if systems.is_empty() || opts.runs == 0 {
        return Err(BenchError::NoSystems);
    }
    let _lock = ksm_exclusive()?;
    let root = Path::new(KSM_SYSFS);
    let before = snapshot_tunables(root);
    let want = expected(opts.tree);
    let image = opts
        .image_dir
        .join(format!("pagefold-build-tree-{}.img", std::process::id()));
    std::fs::write(&image, image_bytes(opts.tree)).map_err(|source| BenchError::Write {
        path: image.display().to_string(),
        source,
    })?;
    let possible = match possible_npages(&image, &opts.tree) {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&image);
            return Err(e);
        }
    };
    let mut runs: Vec<Vec<BuildRun>> = vec![Vec::new(); systems.len()];
    let host = HostId::current();
    let mut loads = vec![[0.0; 3]; systems.len()];
    let mut warnings: Vec<Vec<String>> = vec![Vec::new(); systems.len()];
    let mut result = Ok(());
    'outer: for run in 0..opts.runs {
        for (i, s) in systems.iter().enumerate() {
            if run == 0 {
                (loads[i], warnings[i]) = first_run_context(*s);
            }
            if opts.progress {
                eprintln!("[build] {} run {}/{}", s.name(), run + 1, opts.runs);
            }
            match run_once(*s, opts, &image) {
                Ok(r) => {
                    if opts.progress {
                        eprintln!(
                            "[build] {} run {}: real {:.2} s, user {:.2} s, sys {:.2} s, engine {:.2} s, npages {}",
                            s.name(),
                            run + 1,
                            r.real_s,
                            r.user_s,
                            r.sys_s,
                            r.engine_cpu_s,
                            r.npages
                        );
                    }
                    runs[i].push(r);
                }
                Err(e) => {
                    result = Err(e);
                    break 'outer;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&image);
    let unrestored = crate::host::unrestored_tunables(root, &before);
    result?;
    let rows = systems
        .iter()
        .zip(runs)
        .zip(loads.into_iter().zip(warnings))
        .map(|((s, r), (load, w))| row(s.name(), r, want.checksum, &host, load, w))
        .collect();
    Ok(BuildReport {
        tree: TreeInfo {
            seed: opts.tree.seed,
            files: opts.tree.files,
            rounds: opts.tree.rounds,
            tree_pages: tree_pages(&opts.tree),
            expected_checksum: want.checksum,
            expected_pages_written: want.pages_written,
            expected_pages_reused: want.pages_reused,
            possible_npages: possible,
        },
        rows,
        unrestored,
    })
}

/// The area under a run's npages curve in page-seconds: each sample's
/// npages held until the next sample (the samples end with the build).
pub(crate) fn npages_area(samples: &[BuildSample]) -> f64 {
    samples
        .windows(2)
        .map(|w| (w[1].t_s - w[0].t_s).max(0.0) * w[0].npages as f64)
        .sum()
}

/// The time-weighted mean of a run's npages over the build: its area
/// divided by the time the samples cover (0 for fewer than two samples).
pub(crate) fn npages_time_mean(samples: &[BuildSample]) -> f64 {
    match (samples.first(), samples.last()) {
        (Some(a), Some(b)) if b.t_s > a.t_s => npages_area(samples) / (b.t_s - a.t_s),
        _ => 0.0,
    }
}

/// Mean and stdev of `runs` for one system; checksums agree when every
/// run's two VMs reported `want`. `host` is where the runs ran.
pub(crate) fn row(
    system: &str,
    runs: Vec<BuildRun>,
    want: u64,
    host: &HostId,
    load_avg: [f64; 3],
    mut warnings: Vec<String>,
) -> BuildRow {
    warnings.extend(
        runs.iter()
            .enumerate()
            .filter_map(|(i, r)| assist_warning(system, i, r)),
    );
    let col = |f: fn(&BuildRun) -> f64| -> (f64, f64) {
        mean_stdev(&runs.iter().map(f).collect::<Vec<_>>())
    };
    let (real_mean_s, real_stdev_s) = col(|r| r.real_s);
    let (user_mean_s, user_stdev_s) = col(|r| r.user_s);
    let (sys_mean_s, sys_stdev_s) = col(|r| r.sys_s);
    let (guest_cpu_mean_s, _) = col(|r| r.guest_cpu_s);
    let (engine_cpu_mean_s, engine_cpu_stdev_s) = col(|r| r.engine_cpu_s);
    let (npages_mean, npages_stdev) = col(|r| r.npages as f64);
    let (npages_area_mean, _) = col(|r| npages_area(&r.samples));
    let (npages_time_mean, _) = col(|r| npages_time_mean(&r.samples));
    let (peak, _) = col(|r| (r.peak_npages * PAGE as u64) as f64);
    let (cow_breaks_mean, _) = col(|r| r.cow_breaks as f64);
    let (merges_mean, _) = col(|r| r.merges as f64);
    let total_merges: u64 = runs.iter().map(|r| r.merges).sum();
    let engine_us_per_merge = (total_merges > 0)
        .then(|| runs.iter().map(|r| r.engine_cpu_s).sum::<f64>() * 1e6 / total_merges as f64);
    let delays: Vec<f64> = runs.iter().filter_map(|r| r.hint_merge_delay_ms).collect();
    let hint_merge_delay_mean_ms = (!delays.is_empty()).then(|| mean_stdev(&delays).0);
    let finals: Vec<f64> = runs.iter().filter_map(|r| r.t_final_npages_s).collect();
    let t_final_npages_s = (!finals.is_empty()).then(|| mean_stdev(&finals).0);
    let checksums_agree = runs
        .iter()
        .all(|r| r.checksums.len() == 2 && r.checksums.iter().all(|&c| c == want));
    BuildRow {
        system: system.into(),
        runs: runs.len(),
        real_mean_s,
        real_stdev_s,
        user_mean_s,
        user_stdev_s,
        sys_mean_s,
        sys_stdev_s,
        guest_cpu_mean_s,
        engine_cpu_mean_s,
        engine_cpu_stdev_s,
        npages_mean,
        npages_stdev,
        npages_area_mean,
        npages_time_mean,
        peak_saving_mean_bytes: peak,
        cow_breaks_mean,
        merges_mean,
        engine_us_per_merge,
        hint_merge_delay_mean_ms,
        t_final_npages_s,
        checksums_agree,
        host_kind: host.kind.clone(),
        host_kernel: host.kernel.clone(),
        max_map_count: host.max_map_count,
        load_avg,
        warnings,
        per_run: runs,
    }
}

/// A pagefold run in which the KSM assist took the guests' group says so:
/// ksmd then does the merging, its CPU counts as the engine's, and the
/// run's figures describe kernel KSM at the assist's pace more than the
/// engine. Whether it engages depends on how scattered a pass's merges
/// come out, so runs of one system can differ in it.
fn assist_warning(system: &str, i: usize, run: &BuildRun) -> Option<String> {
    let ksmd = run.samples.last().map_or(0.0, |x| x.ksm_cpu_s);
    (system.starts_with("pagefold") && ksmd > 0.0).then(|| {
        format!(
            "run {}: the KSM assist took the guests' group; ksmd used {ksmd:.1} s of the \
             engine's {:.1} s of CPU (docs/engine.md, \"The KSM assist\")",
            i + 1,
            run.engine_cpu_s
        )
    })
}

/// A backend for `s` (None for `off`), and the scripted source's handle
/// for pagefold-auto.
pub(crate) type Made = (Option<Arc<dyn DedupBackend>>, Option<ScriptHandle>);

pub(crate) fn make_backend(s: BuildSystem) -> Result<Made, BenchError> {
    let e = BenchError::backend(s.name());
    match s {
        BuildSystem::Off => Ok((None, None)),
        BuildSystem::PagefoldOn
        | BuildSystem::PagefoldOnNoHints
        | BuildSystem::PagefoldOnNoLog
        | BuildSystem::PagefoldOnNoAssist
        | BuildSystem::PagefoldOnNoPark
        | BuildSystem::PagefoldHardened
        | BuildSystem::PagefoldAuto => {
            // The engine as the VMM runs it (KSM assist auto, I/O hints,
            // write log). The run holds the KSM lock (`ksm_exclusive`), so
            // the assist is told so: otherwise it finds the lock taken and
            // never engages.
            let mut config = crate::system::engine_config_locked();
            if s == BuildSystem::PagefoldOnNoAssist {
                config.assist.mode = pagefold_dedup::AssistMode::Off;
            }
            let engine = Engine::new(EngineConfig {
                io_hints: s != BuildSystem::PagefoldOnNoHints,
                write_log: s != BuildSystem::PagefoldOnNoLog,
                quiesce_min_ops: if s == BuildSystem::PagefoldOnNoPark {
                    0
                } else {
                    pagefold_vmm::dedup::quiesce_min_ops()
                },
                ..config
            })
            .map_err(pagefold_dedup::Error::from)
            .map_err(e)?;
            let mut handle = None;
            if s == BuildSystem::PagefoldAuto {
                let src = ScriptedSource::new(ScriptedSource::sample(TOTAL, FREE_BEFORE));
                handle = Some(src.handle());
                let ctl = AutoController::new(
                    bench_auto_config(),
                    Box::new(src),
                    DEFAULT_KNOBS.pages_to_scan,
                )?;
                engine.set_round_policy(Box::new(ctl));
            }
            let b: Arc<dyn DedupBackend> = Arc::new(engine);
            let mode = if handle.is_some() {
                Mode::Auto
            } else {
                Mode::On
            };
            b.set_mode(mode).map_err(e)?;
            Ok((Some(b), handle))
        }
        BuildSystem::Ksm(_, knobs) => {
            let k = KsmBackend::new()
                .map_err(pagefold_dedup::Error::from)
                .map_err(e)?;
            let b: Arc<dyn DedupBackend> = Arc::new(k);
            let on = DedupSettings {
                mode: Some(Mode::On),
                ..knobs
            };
            let set = on
                .validate()
                .map_err(pagefold_dedup::Error::from)
                .and_then(|k| b.apply(&k));
            if let Err(err) = set {
                b.shutdown();
                return Err(e(err));
            }
            Ok((Some(b), None))
        }
    }
}

/// What the tick hook tracks during one run (both build-benchmark forms).
#[derive(Default)]
pub(crate) struct Track {
    /// When the builds started, this process's (user, sys) CPU and the
    /// engine's CPU then.
    pub(crate) started: Option<(Instant, (f64, f64), f64)>,
    /// The same CPU figures when the builds ended.
    pub(crate) done: Option<((f64, f64), f64)>,
    pub(crate) trigger_s: Option<f64>,
    pub(crate) samples: Vec<BuildSample>,
    pub(crate) last_sample: Option<Instant>,
    pub(crate) end_stats: Option<pagefold_dedup::Stats>,
    pub(crate) base_cow: u64,
    pub(crate) base_merges: u64,
    pub(crate) base_origins: pagefold_dedup::MergeOrigins,
    pub(crate) error: Option<String>,
}

impl Track {
    /// The builds start now.
    pub(crate) fn start(&mut self, r: &Runner) {
        let st = r.dedup().map(|b| b.stats());
        let cpu = st.as_ref().map_or(0.0, |s| s.cpu_seconds);
        self.started = Some((Instant::now(), self_rusage(), cpu));
        self.base_cow = st.as_ref().map_or(0, |s| s.cow_breaks);
        self.base_origins = st.as_ref().map_or_else(Default::default, |s| s.origins);
        self.base_merges = st.map_or(0, |s| s.merges);
    }

    /// The builds are over: takes the end figures and stops the VMs.
    pub(crate) fn finish(&mut self, r: &mut Runner) {
        let st = r.dedup().map(|b| b.stats());
        self.done = Some((self_rusage(), st.as_ref().map_or(0.0, |s| s.cpu_seconds)));
        self.end_stats = st;
        r.stop_all("builds done");
    }

    /// Both the start and the end of the builds were seen.
    pub(crate) fn finished(&self) -> bool {
        self.started.is_some() && self.done.is_some()
    }

    /// The run's figures from this trace (CPU, npages over the builds) and
    /// from the guests (`real_s`, `guest_cpu_s`, `checksums`); the page
    /// counts of the built-in guest's report are left at 0. None unless
    /// [`Track::finished`].
    pub(crate) fn into_run(
        self,
        real_s: f64,
        guest_cpu_s: f64,
        checksums: Vec<u64>,
    ) -> Option<BuildRun> {
        let ((_, ru0, cpu0), (ru1, cpu1)) = (self.started?, self.done?);
        let end = self.end_stats;
        let final_n = end.as_ref().map_or(0, npages);
        let t_final_npages_s = (final_n > 0)
            .then(|| {
                self.samples
                    .iter()
                    .find(|x| x.npages >= final_n)
                    .map(|x| x.t_s)
            })
            .flatten();
        Some(BuildRun {
            real_s,
            user_s: ru1.0 - ru0.0,
            sys_s: ru1.1 - ru0.1,
            guest_cpu_s,
            engine_cpu_s: (cpu1 - cpu0).max(0.0),
            npages: final_n,
            pages_sharing: end.as_ref().map_or(0, |s| s.pages_sharing),
            zero_pages: end.as_ref().map_or(0, |s| s.zero_pages),
            peak_npages: self.samples.iter().map(|x| x.npages).max().unwrap_or(0),
            t_final_npages_s,
            cow_breaks: end
                .as_ref()
                .map_or(0, |s| s.cow_breaks.saturating_sub(self.base_cow)),
            // KSM's `merges` is this process's merged pages now, not a count.
            merges: end
                .as_ref()
                .filter(|s| s.backend == "pagefold")
                .map_or(0, |s| s.merges.saturating_sub(self.base_merges)),
            hint_merges: end.as_ref().map_or(0, |s| s.hint_merges),
            hint_merge_delay_ms: end
                .as_ref()
                .filter(|s| s.hint_merges > 0)
                .map(|s| s.hint_merge_delay_ms),
            origins: end
                .as_ref()
                .filter(|s| s.backend == "pagefold")
                .map(|s| s.origins.since(&self.base_origins)),
            pages_read: 0,
            pages_written: 0,
            pages_reused: 0,
            checksums,
            trigger_s: self.trigger_s,
            samples: self.samples,
        })
    }
}

pub(crate) fn npages(st: &pagefold_dedup::Stats) -> u64 {
    st.pages_sharing + st.zero_pages
}

/// After a run's VMs are gone: for kernel KSM, lets ksmd drop this
/// process's stale rmap items so the next run's counters start from
/// nothing; then turns the backend off.
pub(crate) fn end_backend(s: BuildSystem, backend: Option<&Arc<dyn DedupBackend>>) {
    if s.kernel_ksm() {
        crate::host::wait_ksm_released();
    }
    if let Some(b) = backend {
        let _ = b.set_mode(Mode::Off);
        b.shutdown();
    }
}

/// A runner of Linux guests on `backend` that does not echo their
/// consoles; if none can be made, the backend is ended
/// ([`end_backend`]) and the error given as a Linux VM's.
pub(crate) fn quiet_linux_runner(
    s: BuildSystem,
    backend: &Option<Arc<dyn DedupBackend>>,
) -> Result<Runner, BenchError> {
    match Runner::new(backend.clone(), true) {
        Ok(mut r) => {
            r.echo = false;
            Ok(r)
        }
        Err(err) => {
            end_backend(s, backend.as_ref());
            Err(crate::error::linux_vm_err(err))
        }
    }
}

/// One run: fresh backend, two fresh VMs, both builds, figures.
fn run_once(s: BuildSystem, opts: &BuildOptions, image: &Path) -> Result<BuildRun, BenchError> {
    let (backend, script) = make_backend(s)?;
    let mut vms = build_configs(image, &opts.tree);
    for vm in &mut vms {
        vm.vcpu_affinity.clone_from(&opts.vcpu_affinity);
    }
    let cfg = Config {
        dedup: Default::default(),
        vms,
        stdin: None,
        // Benchmarks run their VMs in-process without the VMM's filters.
        seccomp: Some(false),
    };
    let mut runner = match Runner::new(backend.clone(), true) {
        Ok(r) => r,
        Err(err) => {
            if let Some(b) = &backend {
                b.shutdown();
            }
            return Err(vm_err(err));
        }
    };
    runner.echo = false;
    runner.start_all(&cfg).map_err(vm_err)?;
    let names: Vec<String> = cfg.vms.iter().map(|v| v.name.clone()).collect();
    let t_run = Instant::now();
    let mut tr = Track::default();
    let report = runner.run(|r| {
        if tr.done.is_some() || tr.error.is_some() {
            return;
        }
        if t_run.elapsed() > opts.timeout {
            tr.error = Some(format!("the builds did not finish in {:?}", opts.timeout));
            r.stop_all("benchmark timeout");
            return;
        }
        let phases_done = |n: usize| {
            names
                .iter()
                .all(|v| r.summary(v).is_some_and(|s| s.phases.len() >= n))
        };
        if names.iter().any(|v| r.summary(v).is_none()) {
            tr.error = Some("a VM stopped before its build ended".into());
            r.stop_all("a VM failed");
            return;
        }
        if tr.started.is_none() && phases_done(1) {
            tr.start(r);
        }
        let Some((t0, _, _)) = tr.started else { return };
        if let (Some(h), None) = (&script, tr.trigger_s) {
            let far = names.iter().any(|v| {
                r.summary(v)
                    .and_then(|s| s.last_progress)
                    .is_some_and(|(p, done, total)| {
                        p == phase::BUILD
                            && total > 0
                            && done as f64 >= total as f64 * opts.auto_trigger_fraction
                    })
            });
            if far {
                h.set(ScriptedSource::sample(TOTAL, FREE_AFTER));
                tr.trigger_s = Some(t0.elapsed().as_secs_f64());
            }
        }
        let due = tr
            .last_sample
            .is_none_or(|l| l.elapsed() >= opts.sample_interval);
        let finished = phases_done(2);
        if due || finished {
            tr.last_sample = Some(Instant::now());
            let st = r.dedup().map(|b| b.stats());
            let sample = BuildSample::of(t0.elapsed().as_secs_f64(), st.as_ref());
            let n = sample.npages;
            tr.samples.push(sample);
            if opts.progress
                && tr.samples.len()
                    % (1000 / opts.sample_interval.as_millis().max(1) as usize).max(1)
                    == 0
            {
                let prog: Vec<String> = names
                    .iter()
                    .map(|v| match r.summary(v).and_then(|s| s.last_progress) {
                        Some((p, d, t)) if p == phase::BUILD => format!("{d}/{t}"),
                        _ => "-".into(),
                    })
                    .collect();
                eprintln!(
                    "[build {}] {:5.1} s: files {}, npages {}",
                    s.name(),
                    t0.elapsed().as_secs_f64(),
                    prog.join(" "),
                    n
                );
            }
        }
        if finished {
            tr.finish(r);
        }
    });
    drop(runner);
    end_backend(s, backend.as_ref());
    let report = report.map_err(vm_err)?;
    if let Some(e) = tr.error {
        return Err(vm_err(e));
    }
    if !tr.finished() {
        return Err(vm_err("the builds did not finish"));
    }
    let mut real_s = 0.0f64;
    let mut guest_cpu = 0.0;
    let mut checksums = Vec::new();
    let (mut read, mut written, mut reused) = (0, 0, 0);
    for v in &report.vms {
        let Some(b) = v
            .summary
            .phases
            .iter()
            .find(|p| p.report.phase == phase::BUILD)
        else {
            return Err(vm_err(format!(
                "{}: no build report ({})",
                v.name, v.outcome
            )));
        };
        real_s = real_s.max(b.elapsed.as_secs_f64());
        guest_cpu += b.report.cpu_us as f64 / 1e6 / report.vms.len() as f64;
        checksums.push(b.report.checksum);
        read = b.report.pages;
        written = b.report.pages_written;
        reused = b.report.pages_reused;
    }
    let mut run = tr
        .into_run(real_s, guest_cpu, checksums)
        .ok_or_else(|| vm_err("the builds did not finish"))?;
    (run.pages_read, run.pages_written, run.pages_reused) = (read, written, reused);
    Ok(run)
}

/// A system's load average and warnings, taken before its first run (both
/// build-benchmark forms): other processes driving kernel KSM skew its rows.
pub(crate) fn first_run_context(s: BuildSystem) -> ([f64; 3], Vec<String>) {
    let mut warnings = Vec::new();
    if s.kernel_ksm() {
        let others = other_ksm_users();
        if !others.is_empty() {
            warnings.push(format!("other processes use KSM: {}", others.join(", ")));
        }
    }
    (load_avg(), warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_stdev() {
        assert_eq!(mean_stdev(&[]), (0.0, 0.0));
        assert_eq!(mean_stdev(&[3.0]), (3.0, 0.0));
        let (m, s) = mean_stdev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138_089_935).abs() < 1e-6, "{s}");
    }

    #[test]
    fn a_sample_splits_ksmd_cpu_from_the_engine_s() {
        let st = |backend: &str| pagefold_dedup::Stats {
            backend: backend.into(),
            cpu_seconds: 5.0,
            ksm_cpu_seconds: 3.0,
            ..pagefold_dedup::Stats::default()
        };
        // pagefold: ksmd's part of its CPU is the assist's.
        let x = BuildSample::of(1.0, Some(&st("pagefold")));
        assert_eq!((x.cpu_s, x.ksm_cpu_s), (5.0, 3.0));
        // KSM: all of it is ksmd's.
        let x = BuildSample::of(1.0, Some(&st("ksm")));
        assert_eq!((x.cpu_s, x.ksm_cpu_s), (5.0, 5.0));
        assert_eq!(BuildSample::of(1.0, None).ksm_cpu_s, 0.0);
    }

    /// A run whose last sample shows ksmd's CPU under the assist.
    fn run_with_ksmd(ksm_cpu_s: f64) -> BuildRun {
        BuildRun {
            engine_cpu_s: 4.0,
            samples: vec![BuildSample {
                ksm_cpu_s,
                ..BuildSample::of(9.0, None)
            }],
            ..BuildRun::test_run(1, 0)
        }
    }

    /// A pagefold row says which runs the KSM assist took over (ksmd's CPU
    /// in the engine's); kernel KSM's rows, all ksmd, do not.
    #[test]
    fn a_row_names_the_runs_the_ksm_assist_took_over() {
        let host = HostId {
            kind: "pvm".into(),
            kernel: "6.18".into(),
            max_map_count: 65530,
        };
        let runs = vec![run_with_ksmd(0.0), run_with_ksmd(2.5)];
        let r = row("pagefold-on", runs, 7, &host, [0.0; 3], vec!["x".into()]);
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert_eq!(r.warnings[0], "x");
        assert!(
            r.warnings[1].starts_with("run 2: the KSM assist took")
                && r.warnings[1].contains("ksmd used 2.5 s of the engine's 4.0 s"),
            "{:?}",
            r.warnings
        );
        let k = row(
            "ksm-10000",
            vec![run_with_ksmd(4.0)],
            7,
            &host,
            [0.0; 3],
            vec![],
        );
        assert!(k.warnings.is_empty(), "{:?}", k.warnings);
        // The plain table shows it too, under the rows.
        let t = crate::build_report::rows_table("h", &[r], &[]);
        assert!(
            t.contains("warning: pagefold-on: run 2: the KSM assist took the guests' group"),
            "{t}"
        );
    }

    #[test]
    fn npages_area_holds_each_sample_until_the_next() {
        let s = |t_s: f64, npages: u64| BuildSample {
            npages,
            ..BuildSample::of(t_s, None)
        };
        assert_eq!(npages_area(&[]), 0.0);
        assert_eq!(npages_area(&[s(0.0, 5)]), 0.0);
        // 10 pages for 1 s, 30 for 0.5 s; the last sample ends the build.
        let a = npages_area(&[s(0.0, 10), s(1.0, 30), s(1.5, 99)]);
        assert!((a - 25.0).abs() < 1e-9, "{a}");
        // Merging the same pages sooner gives the larger area.
        let late = npages_area(&[s(0.0, 0), s(1.0, 100), s(2.0, 100)]);
        let early = npages_area(&[s(0.0, 100), s(1.0, 100), s(2.0, 100)]);
        assert!(early > late);
    }

    #[test]
    fn npages_time_mean_does_not_reward_a_slower_build() {
        let s = |t_s: f64, npages: u64| BuildSample {
            npages,
            ..BuildSample::of(t_s, None)
        };
        assert_eq!(npages_time_mean(&[]), 0.0);
        assert_eq!(npages_time_mean(&[s(1.0, 5)]), 0.0);
        // 10 pages for 1 s, 30 for 0.5 s: 25 page s over 1.5 s.
        let m = npages_time_mean(&[s(0.0, 10), s(1.0, 30), s(1.5, 99)]);
        assert!((m - 25.0 / 1.5).abs() < 1e-9, "{m}");
        // The same run, its build twice as slow (the curve stretched in
        // time): twice the area, the same mean.
        let short = [s(0.0, 0), s(1.0, 100), s(2.0, 100)];
        let slow = [s(0.0, 0), s(2.0, 100), s(4.0, 100)];
        assert!((npages_area(&slow) - 2.0 * npages_area(&short)).abs() < 1e-9);
        assert!((npages_time_mean(&slow) - npages_time_mean(&short)).abs() < 1e-9);
        // Merging sooner in a build of the same length: a higher mean.
        let sooner = [s(0.0, 0), s(0.5, 100), s(2.0, 100)];
        assert!(npages_time_mean(&sooner) > npages_time_mean(&short));
    }

    #[test]
    fn selects_build_systems_in_run_order() {
        let all = select_build_systems(&[]).unwrap();
        let names: Vec<_> = all.iter().map(|s| s.name()).collect();
        assert_eq!(names, BUILD_SYSTEM_NAMES);
        let two = select_build_systems(&["ksm-10000".into(), "off".into()]).unwrap();
        assert_eq!(
            two,
            [
                BuildSystem::Off,
                BuildSystem::Ksm("ksm-10000", KSM_10000_KNOBS)
            ]
        );
        assert!(select_build_systems(&["ksm-max".into()]).is_err());
    }

    #[test]
    fn configs_are_two_valid_vms_in_one_group_big_enough_for_the_area() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let img = file.path().to_path_buf();
        let tree = BuildOptions::default().tree;
        std::fs::write(&img, image_bytes(TreeSpec { files: 3, ..tree })).unwrap();
        let c = build_configs(&img, &tree);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].dedup_group(), c[1].dedup_group());
        for v in &c {
            v.validate().unwrap();
            assert!(v.memory_bytes() > area_pages(tree_pages(&tree)) * PAGE as u64);
            assert_eq!(v.memory_bytes() % (2 << 20), 0);
        }
    }

    /// The short form CI runs: every system, two runs each, a small tree.
    /// Both VMs of every run must build the host's predicted output, `off`
    /// must merge nothing, pagefold must merge the identical page caches,
    /// and KSM's tunables must be as found.
    #[test]
    fn short_form_runs_every_system_within_two_minutes() {
        let t = Instant::now();
        let opts = BuildOptions {
            tree: TreeSpec {
                seed: 0x5107,
                files: 150,
                // Long enough that a page written during the build can stay
                // unwritten for the write log's interval and merge inside
                // the measured window (`pagefold_dedup::LOG_INTERVAL`).
                rounds: 200,
            },
            runs: 2,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BuildOptions::default()
        };
        let r = run_build_bench(&select_build_systems(&[]).unwrap(), &opts).unwrap();
        assert!(r.unrestored.is_empty(), "{:?}", r.unrestored);
        assert_eq!(r.rows.len(), BUILD_SYSTEM_NAMES.len());
        for row in &r.rows {
            assert_eq!(row.runs, 2, "{}", row.system);
            assert!(row.checksums_agree, "{row:?}");
            assert!(row.real_mean_s > 0.0 && row.user_mean_s > 0.0, "{row:?}");
            for run in &row.per_run {
                assert_eq!(run.checksums, [r.tree.expected_checksum; 2]);
                assert_eq!(run.pages_read, r.tree.tree_pages);
                assert_eq!(run.pages_written, r.tree.expected_pages_written);
                assert_eq!(run.pages_reused, r.tree.expected_pages_reused);
            }
        }
        assert!(
            r.tree.possible_npages > 2 * r.tree.tree_pages,
            "{:?}",
            r.tree
        );
        for row in &r.rows {
            assert!(
                row.npages_mean <= r.tree.possible_npages as f64 * 1.02 + 64.0,
                "{row:?} vs {:?}",
                r.tree
            );
        }
        let off = &r.rows[0];
        assert_eq!((off.npages_mean, off.engine_cpu_mean_s), (0.0, 0.0));
        for on in &r.rows[1..5] {
            // pagefold-on, pagefold-on-nohints, -nolog and -noassist all
            // merge.
            assert!(on.peak_saving_mean_bytes > 0.0, "{on:?}");
            assert!(on.per_run.iter().all(|x| x.merges > 0), "{on:?}");
            assert!(on.engine_us_per_merge.is_some_and(|u| u > 0.0), "{on:?}");
        }
        // Merges are pagefold's count: none for `off` or kernel KSM.
        for row in r.rows.iter().filter(|x| !x.system.starts_with("pagefold")) {
            assert_eq!(row.merges_mean, 0.0, "{row:?}");
            assert_eq!(row.engine_us_per_merge, None, "{row:?}");
        }
        // Merges made on hinted visits only where hints are on (auto
        // mode's depend on when it triggers: not asserted). Where they are
        // on, the scan may reach a hinted page first on a tree this small
        // (every merge was the scan's in 3 of 12 runs on a 2-core PVM
        // host), so that some are is not asserted: dedup/tests/hints.rs
        // shows hinted pages merging before any scan could.
        for row in r.rows.iter().filter(|x| x.system != "pagefold-auto") {
            let hinted = matches!(
                row.system.as_str(),
                "pagefold-on" | "pagefold-on-nolog" | "pagefold-on-noassist"
            );
            for run in &row.per_run {
                if !hinted {
                    assert_eq!(run.hint_merges, 0, "{}: {run:?}", row.system);
                }
                assert_eq!(
                    run.hint_merge_delay_ms.is_some(),
                    run.hint_merges > 0,
                    "{}: {run:?}",
                    row.system
                );
            }
            assert_eq!(
                row.hint_merge_delay_mean_ms.is_some(),
                row.per_run.iter().any(|x| x.hint_merges > 0),
                "{row:?}"
            );
        }
        let json = crate::build_json(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for key in [
            "system",
            "runs",
            "real_mean_s",
            "real_stdev_s",
            "user_mean_s",
            "sys_mean_s",
            "engine_cpu_mean_s",
            "npages_mean",
            "npages_stdev",
            "npages_area_mean",
            "npages_time_mean",
            "hint_merge_delay_mean_ms",
            "merges_mean",
            "engine_us_per_merge",
            "t_final_npages_s",
            "checksums_agree",
            "host_kind",
            "host_kernel",
        ] {
            assert!(v["rows"][0].get(key).is_some(), "{key} missing");
        }
        assert!(crate::build_table(&r).contains("pagefold-auto"));
        assert!(crate::build_chart(&r).svg().unwrap().contains("<svg"));
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "short form took {:?}",
            t.elapsed()
        );
    }
}
