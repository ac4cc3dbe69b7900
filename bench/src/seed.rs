//! The `ksm-seed` benchmark: how fast, and at what CPU cost, does each
//! system merge the 2022 auto-mode test's 300 MiB region, the `scattered`
//! pair of regions (same pages, random order) and, with `--vms`, two
//! identical workload VMs?

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_dedup::ksm::count_ksm_pages;
use pagefold_dedup::{mm, DedupBackend, Mode};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::host::{load_avg, other_ksm_users, HostId, KsmSession};
use crate::region::{Shape, PAGE, SCATTERED_REGION_BYTES, SEED_REGION_BYTES};
use crate::settle::{Sample, Settled, Settler};
use crate::system::System;
use crate::target::{Attached, Case, RegionSizes};
use crate::vms::VmOptions;

/// How to run `ksm-seed`.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    /// The one region of `full` and `sparse`.
    pub region_bytes: usize,
    /// Each of the two regions of `scattered`.
    pub scattered_bytes: usize,
    pub cases: Vec<Case>,
    pub vm: VmOptions,
    /// Converged = `pages_sharing` (and `zero_pages`) held for this many
    /// full scans.
    pub settle_scans: u64,
    /// After settling, systems with `measure_steady` keep running this long
    /// to measure steady-state CPU.
    pub steady: Duration,
    pub sample_interval: Duration,
    /// Give up on a run after this long (reported as not converged).
    pub timeout: Duration,
    /// Print progress lines to stderr about once a second.
    pub progress: bool,
}

impl SeedOptions {
    fn sizes(&self) -> RegionSizes {
        RegionSizes {
            seed_bytes: self.region_bytes,
            scattered_bytes: self.scattered_bytes,
        }
    }

    /// Pages a perfect merger frees in `case`, where the case alone says
    /// (the VM case's exact figure comes from the guests' parameters).
    fn possible_saving(&self, case: Case) -> Option<u64> {
        match case {
            Case::Region(shape @ (Shape::Full | Shape::Sparse)) => {
                Some(shape.ideal_sharing(self.region_bytes.div_ceil(PAGE)))
            }
            Case::Region(Shape::Scattered) => {
                Some(Shape::Scattered.ideal_sharing(self.scattered_bytes.div_ceil(PAGE)))
            }
            Case::Vms => None,
        }
    }
}

impl Default for SeedOptions {
    fn default() -> Self {
        Self {
            region_bytes: SEED_REGION_BYTES,
            scattered_bytes: SCATTERED_REGION_BYTES,
            cases: Shape::TEST_2022.iter().map(|&s| Case::Region(s)).collect(),
            vm: VmOptions::default(),
            settle_scans: 3,
            // One default KSM scan of 300 MiB takes ~18.5 s: cover more.
            steady: Duration::from_secs(30),
            // Max-effort KSM does a full scan in ~40 ms: sample finer.
            sample_interval: Duration::from_millis(10),
            timeout: Duration::from_secs(400),
            progress: true,
        }
    }
}

/// One result row (the JSON array's element). Rows read back from older
/// JSON lack the fields added since: those read as their defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedRow {
    pub system: String,
    /// `full`, `sparse`, `scattered` or `vms`.
    pub shape: Case,
    /// Seconds until `pages_sharing` first reached its settled value.
    pub converge_s: Option<f64>,
    /// Merging-side CPU seconds up to then.
    pub cpu_s: Option<f64>,
    /// The settled (or, on timeout, last) value.
    pub pages_sharing: u64,
    pub pages_shared: u64,
    /// Pages dropped to the zero page, counted apart from `pages_sharing`.
    pub zero_pages: u64,
    /// `pages_sharing + zero_pages`: the pages the run freed.
    pub saved_pages: u64,
    /// Pages a perfect merger frees here (`full`: every page but one, before
    /// KSM's `max_page_sharing`; `sparse`: 42; `scattered`: the pages of one
    /// region; `vms`: the exact data-page expectation).
    pub possible_saving: Option<u64>,
    /// `saved_pages` as % of kernel KSM's saving in the same case (the
    /// largest saving of the KSM systems in this report); filled in once
    /// every system has run.
    pub pct_of_ksm_saving: Option<f64>,
    pub converged: bool,
    pub full_scans_to_converge: Option<u64>,
    /// Merging-side CPU per wall second from convergence until settled
    /// (the confirming full scans).
    pub confirm_cpu_per_s: Option<f64>,
    /// Merging-side CPU per wall second over the steady window after
    /// settling (systems with `measure_steady` only).
    pub steady_cpu_per_s: Option<f64>,
    pub steady_window_s: Option<f64>,
    /// Wall time of the whole run (until settled or timeout, plus the
    /// steady window).
    pub run_s: f64,
    /// Kernel KSM only, region cases: KSM pages of our region at the end
    /// (exact, from kpageflags), to tell our merges from other processes'.
    pub own_ksm_pages: Option<u64>,
    /// VM case: exact non-zero sharing and zero pages of the data pages.
    pub expected_pages_sharing: Option<u64>,
    pub expected_zero_pages: Option<u64>,
    /// Mappings of this process (`/proc/self/maps` lines) with the memory
    /// attached, before merging started.
    pub vmas_before: Option<u64>,
    /// The same at the end of the run (settled or timed out): a remapping
    /// merger splits VMAs, KSM does not.
    pub vmas: Option<u64>,
    /// `vm.max_map_count` during the run.
    pub max_map_count: Option<u64>,
    /// The backend reported at some sample that it held back merges
    /// because the process neared `vm.max_map_count` (always false for KSM).
    pub map_count_limited: bool,
    /// `hardware`, `pvm`, `emulated-svm` or `other`: times under emulation
    /// compare only within one run.
    #[serde(default)]
    pub host_kind: String,
    /// The host kernel's release (KSM's behaviour changes between kernels).
    #[serde(default)]
    pub host_kernel: String,
    /// Host load average (1, 5, 15 min) when the run started.
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
}

/// `pages_sharing` over time for one (system, case).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub system: String,
    pub shape: Case,
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

/// Runs every system on every case, holding the KSM lock throughout, and
/// checks at the end that every KSM tunable is as found (also after a
/// failed run: the backend restores its knobs on shutdown).
pub fn run_ksm_seed(systems: &[System], opts: &SeedOptions) -> Result<SeedReport, BenchError> {
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    let ksm = KsmSession::start()?;
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut result = Ok(());
    'all: for &case in &opts.cases {
        for system in systems {
            match run_seed_once(system, case, opts) {
                Ok((row, samples)) => {
                    rows.push(row);
                    series.push(Series {
                        system: system.name.clone(),
                        shape: case,
                        samples,
                    });
                }
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
    fill_pct_of_ksm(&mut rows);
    Ok(SeedReport {
        rows,
        series,
        unrestored,
    })
}

/// One (system, case) run on fresh memory and a fresh backend. The caller
/// holds the KSM lock.
pub fn run_seed_once(
    system: &System,
    case: Case,
    opts: &SeedOptions,
) -> Result<(SeedRow, Vec<Sample>), BenchError> {
    let err = BenchError::backend(&system.name);
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
    let load = load_avg();
    let host = HostId::current();
    let backend: Arc<dyn DedupBackend> = Arc::from(system.build()?);
    if let Some(k) = system.knobs {
        if let Err(e) = k
            .validate()
            .map_err(pagefold_dedup::Error::from)
            .and_then(|k| backend.apply(&k))
        {
            backend.shutdown();
            return Err(err(e));
        }
    }
    let attached = match Attached::attach(&backend, case, opts.sizes(), &opts.vm, opts.progress) {
        Ok(a) => a,
        Err(e) => {
            backend.shutdown();
            return Err(e);
        }
    };
    let vmas_before = mm::vma_count().ok();
    let result = sample_until_settled(&*backend, system, case, opts);
    let vmas = mm::vma_count().ok();
    let own_ksm_pages = if system.kernel_ksm && case != Case::Vms {
        attached
            .regions()
            .map(|r| count_ksm_pages(r.addr(), r.len()).ok())
            .sum::<Option<u64>>()
    } else {
        None
    };
    let expected = attached.expected();
    let detached = attached.detach(&*backend);
    let teardown = teardown(&*backend, system);
    let run = result?;
    detached?;
    teardown?;
    let last = run.samples.last().copied();
    let settled = run.settled;
    let pages_sharing = settled
        .map(|s| s.pages_sharing)
        .or(last.map(|s| s.pages_sharing))
        .unwrap_or(0);
    let zero_pages = settled
        .map(|s| s.zero_pages)
        .or(last.map(|s| s.zero_pages))
        .unwrap_or(0);
    let row = SeedRow {
        system: system.name.clone(),
        shape: case,
        converge_s: settled.map(|s| s.converge_s),
        cpu_s: settled.map(|s| s.cpu_s),
        pages_sharing,
        pages_shared: last.map(|s| s.pages_shared).unwrap_or(0),
        zero_pages,
        saved_pages: pages_sharing + zero_pages,
        possible_saving: expected
            .map(|e| e.saved_pages())
            .or(opts.possible_saving(case)),
        pct_of_ksm_saving: None,
        converged: settled.is_some(),
        full_scans_to_converge: settled.map(|s| s.full_scans_to_converge),
        confirm_cpu_per_s: settled.and_then(|s| s.steady_cpu_per_s()),
        steady_cpu_per_s: run.steady.map(|w| w.cpu_per_s),
        steady_window_s: run.steady.map(|w| w.wall_s),
        run_s: last.map(|s| s.t_s).unwrap_or(0.0),
        own_ksm_pages,
        expected_pages_sharing: expected.map(|e| e.pages_sharing),
        expected_zero_pages: expected.map(|e| e.zero_pages),
        vmas_before,
        vmas,
        max_map_count: Some(mm::max_map_count()),
        map_count_limited: run.map_count_limited,
        host_kind: host.kind,
        host_kernel: host.kernel,
        load_avg: load,
        warnings,
    };
    if opts.progress {
        eprintln!(
            "[{} {}] done: converge {} s, cpu {} s, pages_sharing {}, zero_pages {}, steady cpu/s {}, vmas {} -> {}{}",
            row.system,
            row.shape,
            fmt_opt(row.converge_s),
            fmt_opt(row.cpu_s),
            row.pages_sharing,
            row.zero_pages,
            row.steady_cpu_per_s
                .map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "-".into()),
            row.vmas_before.map_or("-".into(), |v| v.to_string()),
            row.vmas.map_or("-".into(), |v| v.to_string()),
            if row.map_count_limited { ", map_count_limited" } else { "" }
        );
    }
    Ok((row, run.samples))
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// CPU over the steady window.
#[derive(Debug, Clone, Copy)]
struct Window {
    wall_s: f64,
    cpu_per_s: f64,
}

struct Run {
    settled: Option<Settled>,
    steady: Option<Window>,
    samples: Vec<Sample>,
    /// Some sample's stats had `map_count_limited`.
    map_count_limited: bool,
}

fn sample_until_settled(
    backend: &dyn DedupBackend,
    system: &System,
    case: Case,
    opts: &SeedOptions,
) -> Result<Run, BenchError> {
    let base = backend.stats();
    let t0 = Instant::now();
    backend
        .set_mode(Mode::On)
        .map_err(BenchError::backend(&system.name))?;
    let mut settler = Settler::new(opts.settle_scans);
    let mut samples = Vec::new();
    let mut next_progress = Duration::from_secs(1);
    let mut settled: Option<Settled> = None;
    let mut map_count_limited = false;
    loop {
        std::thread::sleep(opts.sample_interval);
        let st = backend.stats();
        map_count_limited |= st.map_count_limited;
        let t = t0.elapsed();
        let s = Sample {
            t_s: t.as_secs_f64(),
            pages_sharing: st.pages_sharing,
            pages_shared: st.pages_shared,
            zero_pages: st.zero_pages,
            full_scans: st.full_scans.saturating_sub(base.full_scans),
            cpu_s: (st.cpu_seconds - base.cpu_seconds).max(0.0),
        };
        samples.push(s);
        if opts.progress && t >= next_progress {
            next_progress += Duration::from_secs(1);
            eprintln!(
                "[{} {case}] {:6.1} s  pages_sharing {:6}  zero {:5}  full_scans {:3}  cpu {:.2} s{}",
                system.name,
                s.t_s,
                s.pages_sharing,
                s.zero_pages,
                s.full_scans,
                s.cpu_s,
                if settled.is_some() { "  (settled; steady window)" } else { "" }
            );
        }
        match settled {
            None => {
                if let Some(done) = settler.push(s) {
                    settled = Some(done);
                    if !system.measure_steady || opts.steady.is_zero() {
                        return Ok(Run {
                            settled,
                            steady: None,
                            samples,
                            map_count_limited,
                        });
                    }
                } else if t >= opts.timeout {
                    return Ok(Run {
                        settled: None,
                        steady: None,
                        samples,
                        map_count_limited,
                    });
                }
            }
            Some(done) => {
                let wall = s.t_s - done.settled_s;
                if wall >= opts.steady.as_secs_f64() {
                    let steady = Some(Window {
                        wall_s: wall,
                        cpu_per_s: (s.cpu_s - done.cpu_at_settled_s) / wall,
                    });
                    return Ok(Run {
                        settled,
                        steady,
                        samples,
                        map_count_limited,
                    });
                }
            }
        }
    }
}

/// Stops merging and shuts the backend down. For kernel KSM, ksmd keeps
/// running until this process's stale rmap items are gone, so the next run
/// does not start with the previous run's `pages_sharing`. The memory has
/// already been detached.
fn teardown(backend: &dyn DedupBackend, system: &System) -> Result<(), BenchError> {
    let err = BenchError::backend(&system.name);
    if system.kernel_ksm {
        crate::host::wait_ksm_released();
    }
    let r = backend.set_mode(Mode::Off).map_err(&err);
    backend.shutdown();
    r
}

/// Pages a run freed: merged duplicates plus zero pages.
pub fn saved(r: &SeedRow) -> u64 {
    r.pages_sharing + r.zero_pages
}

/// Is `name` one of the kernel-KSM systems?
pub fn is_ksm(name: &str) -> bool {
    name.starts_with("ksm-")
}

/// Fills every row's `pct_of_ksm_saving`: its saving as % of the largest
/// saving a kernel-KSM system reached in the same case. KSM at any effort
/// ends at the same saving when it converges; the largest is what KSM
/// showed it can do, also when one KSM setting timed out.
pub fn fill_pct_of_ksm(rows: &mut [SeedRow]) {
    let best: Vec<(Case, u64)> = rows
        .iter()
        .filter(|r| is_ksm(&r.system))
        .map(|r| (r.shape, saved(r)))
        .collect();
    for r in rows.iter_mut() {
        let ksm = best
            .iter()
            .filter(|(c, _)| *c == r.shape)
            .map(|&(_, s)| s)
            .max();
        r.pct_of_ksm_saving = ksm
            .filter(|&k| k > 0)
            .map(|k| saved(r) as f64 * 100.0 / k as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::{engine_factory, System};

    /// The `scattered` shape end to end at 32 MiB per region (8192 pages),
    /// for kernel KSM and pagefold at max effort: both must free every page
    /// of region B, and the rows must carry the VMA and map-limit columns.
    /// Takes a few seconds; holds the KSM lock (`run_ksm_seed`) and checks
    /// that every KSM tunable is restored.
    #[test]
    fn scattered_shape_merges_every_page_of_b() {
        let opts = SeedOptions {
            scattered_bytes: 32 << 20,
            cases: vec![Case::Region(Shape::Scattered)],
            steady: Duration::ZERO,
            timeout: Duration::from_secs(60),
            progress: false,
            ..SeedOptions::default()
        };
        let systems = [System::ksm_max(), System::pagefold_max(engine_factory())];
        let r = run_ksm_seed(&systems, &opts).unwrap();
        assert!(r.unrestored.is_empty(), "{:?}", r.unrestored);
        assert_eq!(r.rows.len(), 2);
        let pages = 8192;
        for row in &r.rows {
            assert_eq!(row.shape, Case::Region(Shape::Scattered));
            assert!(row.converged, "{row:?}");
            assert_eq!(row.possible_saving, Some(pages), "{row:?}");
            assert!(row.vmas_before.is_some_and(|v| v > 2));
            assert!(row.vmas.is_some() && row.max_map_count.is_some());
            assert!(row.cpu_s.is_some_and(|c| c > 0.0), "{row:?}");
        }
        let ksm = &r.rows[0];
        // Exact from kpageflags, whatever else uses KSM on the host: every
        // page of A and of B is now a KSM page.
        assert_eq!(ksm.own_ksm_pages, Some(2 * pages), "{ksm:?}");
        assert!(ksm.saved_pages >= pages, "{ksm:?}");
        assert!(!ksm.map_count_limited);
        let pf = &r.rows[1];
        // 8192 scattered pages need far fewer VMAs than vm.max_map_count:
        // nothing holds the engine back, it frees exactly B's pages.
        assert!(!pf.map_count_limited, "{pf:?}");
        assert_eq!((pf.pages_sharing, pf.zero_pages), (pages, 0), "{pf:?}");
        assert!(
            pf.pct_of_ksm_saving.is_some_and(|p| p > 0.0 && p <= 100.0),
            "{pf:?}"
        );
        // The series are there for the chart: one shape, two systems.
        assert_eq!(r.series.len(), 2);
        assert!(r
            .series
            .iter()
            .all(|s| s.shape == Case::Region(Shape::Scattered) && !s.samples.is_empty()));
    }
}
