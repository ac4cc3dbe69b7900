//! The `ksm-seed` benchmark: how fast, and at what CPU cost, does each
//! system merge the 2022 auto-mode test's 300 MiB region?

use std::time::{Duration, Instant};

use pagefold_dedup::ksm::{
    count_ksm_pages, ksm_exclusive, self_ksm_stat, snapshot_tunables, KSM_SYSFS,
};
use pagefold_dedup::{DedupBackend, Mode, RegionSpec};
use serde::Serialize;

use crate::error::BenchError;
use crate::region::{Region, Shape, SEED_REGION_BYTES};
use crate::settle::{Sample, Settler};
use crate::system::System;

/// How to run `ksm-seed`.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    pub region_bytes: usize,
    pub shapes: Vec<Shape>,
    /// Converged = `pages_sharing` held for this many full scans.
    pub settle_scans: u64,
    pub sample_interval: Duration,
    /// Give up on a run after this long (reported as not converged).
    pub timeout: Duration,
    /// Print progress lines to stderr about once a second.
    pub progress: bool,
}

impl Default for SeedOptions {
    fn default() -> Self {
        Self {
            region_bytes: SEED_REGION_BYTES,
            shapes: Shape::ALL.to_vec(),
            settle_scans: 3,
            // Max-effort KSM does a full scan in ~40 ms: sample finer.
            sample_interval: Duration::from_millis(10),
            timeout: Duration::from_secs(300),
            progress: true,
        }
    }
}

/// One result row (the JSON array's element).
#[derive(Debug, Clone, Serialize)]
pub struct SeedRow {
    pub system: String,
    pub shape: Shape,
    /// Seconds until `pages_sharing` first reached its settled value.
    pub converge_s: Option<f64>,
    /// Merging-side CPU seconds up to then.
    pub cpu_s: Option<f64>,
    /// The settled (or, on timeout, last) value.
    pub pages_sharing: u64,
    pub pages_shared: u64,
    pub converged: bool,
    pub full_scans_to_converge: Option<u64>,
    /// Merging-side CPU per second while holding the settled value.
    pub steady_cpu_per_s: Option<f64>,
    /// Wall time of the whole run (until settled or timeout).
    pub run_s: f64,
    /// Kernel KSM only: KSM pages of our region at the end (exact, from
    /// kpageflags), to tell our merges from other processes'.
    pub own_ksm_pages: Option<u64>,
    pub warnings: Vec<String>,
}

/// `pages_sharing` over time for one (system, shape).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub system: String,
    pub shape: Shape,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    pub rows: Vec<SeedRow>,
    pub series: Vec<Series>,
    /// KSM tunables that were not as found after the benchmark (empty when
    /// everything was restored).
    pub unrestored: Vec<String>,
}

/// Other processes using KSM make host-wide counters and scan times
/// include their pages.
fn other_ksm_users() -> Vec<String> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).ok()?;
            let s = pagefold_dedup::ksm::parse_ksm_stat(&text);
            let mergeable = text.lines().any(|l| l.trim() == "ksm_mergeable: yes");
            (mergeable || s.merging_pages.unwrap_or(0) > 0).then(|| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                format!("{pid} ({})", comm.trim())
            })
        })
        .collect()
}

/// Runs every system on every shape, holding the KSM lock throughout, and
/// checks at the end that every KSM tunable is as found.
pub fn run_ksm_seed(systems: &[System], opts: &SeedOptions) -> Result<SeedReport, BenchError> {
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    let _lock = ksm_exclusive()?;
    let root = std::path::Path::new(KSM_SYSFS);
    let before = snapshot_tunables(root);
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for &shape in &opts.shapes {
        for system in systems {
            let (row, samples) = run_seed_once(system, shape, opts)?;
            rows.push(row);
            series.push(Series {
                system: system.name.clone(),
                shape,
                samples,
            });
        }
    }
    let after = snapshot_tunables(root);
    let unrestored = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: was {v:?}, now {:?}", after.get(k)))
        .collect();
    Ok(SeedReport {
        rows,
        series,
        unrestored,
    })
}

fn backend_err(system: &System) -> impl Fn(pagefold_dedup::Error) -> BenchError + '_ {
    move |source| BenchError::Backend {
        system: system.name.clone(),
        source,
    }
}

/// One (system, shape) run on a fresh region and a fresh backend. The
/// caller holds the KSM lock.
pub fn run_seed_once(
    system: &System,
    shape: Shape,
    opts: &SeedOptions,
) -> Result<(SeedRow, Vec<Sample>), BenchError> {
    let err = backend_err(system);
    let mut warnings = Vec::new();
    if system.kernel_ksm {
        let others = other_ksm_users();
        if !others.is_empty() {
            warnings.push(format!(
                "other processes use KSM (host-wide counters include them): {}",
                others.join(", ")
            ));
        }
    }
    let mut region = Region::map(opts.region_bytes)?;
    region.fill(shape);
    let backend = system.build()?;
    if let Some(k) = system.knobs {
        backend.set_knobs(k).map_err(&err)?;
    }
    let spec = RegionSpec {
        host_addr: region.addr(),
        len: region.len(),
        owner: "ksm-seed".into(),
        group: "ksm-seed".into(),
    };
    // SAFETY: region is a private anonymous mapping that outlives the
    // registration (unregistered below before it is dropped).
    let id = unsafe { backend.register(spec) }.map_err(&err)?;
    let result = sample_until_settled(&*backend, system, shape, opts);
    let own_ksm_pages = system
        .kernel_ksm
        .then(|| count_ksm_pages(region.addr(), region.len()).ok())
        .flatten();
    let teardown = teardown(&*backend, id, system);
    let (settled, samples) = result?;
    teardown?;
    let last = samples.last().copied();
    let row = SeedRow {
        system: system.name.clone(),
        shape,
        converge_s: settled.map(|s| s.converge_s),
        cpu_s: settled.map(|s| s.cpu_s),
        pages_sharing: settled
            .map(|s| s.pages_sharing)
            .or(last.map(|s| s.pages_sharing))
            .unwrap_or(0),
        pages_shared: last.map(|s| s.pages_shared).unwrap_or(0),
        converged: settled.is_some(),
        full_scans_to_converge: settled.map(|s| s.full_scans_to_converge),
        steady_cpu_per_s: settled.and_then(|s| s.steady_cpu_per_s()),
        run_s: last.map(|s| s.t_s).unwrap_or(0.0),
        own_ksm_pages,
        warnings,
    };
    if opts.progress {
        eprintln!(
            "[{} {}] done: converge {} s, cpu {} s, pages_sharing {}",
            row.system,
            row.shape,
            fmt_opt(row.converge_s),
            fmt_opt(row.cpu_s),
            row.pages_sharing
        );
    }
    Ok((row, samples))
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

type Sampled = (Option<crate::settle::Settled>, Vec<Sample>);

fn sample_until_settled(
    backend: &dyn DedupBackend,
    system: &System,
    shape: Shape,
    opts: &SeedOptions,
) -> Result<Sampled, BenchError> {
    let base = backend.stats();
    let t0 = Instant::now();
    backend.set_mode(Mode::On).map_err(backend_err(system))?;
    let mut settler = Settler::new(opts.settle_scans);
    let mut samples = Vec::new();
    let mut next_progress = Duration::from_secs(1);
    loop {
        std::thread::sleep(opts.sample_interval);
        let st = backend.stats();
        let t = t0.elapsed();
        let s = Sample {
            t_s: t.as_secs_f64(),
            pages_sharing: st.pages_sharing,
            pages_shared: st.pages_shared,
            full_scans: st.full_scans.saturating_sub(base.full_scans),
            cpu_s: (st.cpu_seconds - base.cpu_seconds).max(0.0),
        };
        samples.push(s);
        if let Some(done) = settler.push(s) {
            return Ok((Some(done), samples));
        }
        if opts.progress && t >= next_progress {
            next_progress += Duration::from_secs(1);
            eprintln!(
                "[{} {shape}] {:6.1} s  pages_sharing {:6}  full_scans {:3}  cpu {:.2} s",
                system.name, s.t_s, s.pages_sharing, s.full_scans, s.cpu_s
            );
        }
        if t >= opts.timeout {
            return Ok((None, samples));
        }
    }
}

/// Stops merging and gives the region back. For kernel KSM, ksmd keeps
/// running until this process's stale rmap items are gone, so the next run
/// does not start with the previous run's `pages_sharing`.
fn teardown(
    backend: &dyn DedupBackend,
    id: pagefold_dedup::RegionId,
    system: &System,
) -> Result<(), BenchError> {
    let err = backend_err(system);
    if !system.kernel_ksm {
        backend.set_mode(Mode::Off).map_err(&err)?;
    }
    backend.unregister(id).map_err(&err)?;
    if system.kernel_ksm {
        let t = Instant::now();
        while self_ksm_stat()
            .and_then(|s| s.merging_pages)
            .is_some_and(|m| m > 0)
            && t.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        backend.set_mode(Mode::Off).map_err(&err)?;
    }
    backend.shutdown();
    Ok(())
}
