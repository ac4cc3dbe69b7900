//! The `auto` benchmark (docs/benchmarks.md): two workload VMs with
//! identical content, a scripted memory source that crosses the auto-mode
//! threshold at a known time. Measures how fast each system reacts and
//! what it costs before and after the trigger. Always-on systems start
//! merging at that same instant, with the content already in place.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_dedup::auto::{AutoConfig, AutoController, MemorySource, ScriptedSource};
use pagefold_dedup::ksm::{KsmBackend, KsmOptions};
use pagefold_dedup::{DedupBackend, DedupSettings, Engine, Mode, DEFAULT_KNOBS};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::host::{load_avg, mem_available, other_ksm_users, HostId, KsmSession};
use crate::region::PAGE;
use crate::system::KSM_DEFAULT_KNOBS;
use crate::target::{Attached, Case, RegionSizes};
use crate::vms::VmOptions;

/// Builds a backend reading the given memory source (always-on systems
/// ignore it).
pub type AutoFactory = Box<
    dyn Fn(Box<dyn MemorySource>) -> Result<Box<dyn DedupBackend>, pagefold_dedup::Error>
        + Send
        + Sync,
>;

pub struct AutoSystem {
    pub name: String,
    /// `Mode::Auto` (waits for the trigger) or `Mode::On` (switched on at
    /// the trigger instant).
    pub mode: Mode,
    pub knobs: Option<DedupSettings>,
    pub kernel_ksm: bool,
    pub factory: AutoFactory,
}

/// Auto mode samples the scripted source on every round here, so the
/// trigger moment is exact.
pub fn bench_auto_config() -> AutoConfig {
    AutoConfig {
        sample_interval_ms: 0,
        ..AutoConfig::default()
    }
}

fn ksm_factory(auto: bool) -> AutoFactory {
    Box::new(move |src| {
        let b = KsmBackend::with_options(KsmOptions {
            auto: bench_auto_config(),
            memory_source: auto.then_some(src),
            ..KsmOptions::default()
        })
        .map_err(pagefold_dedup::Error::from)?;
        Ok(Box::new(b) as Box<dyn DedupBackend>)
    })
}

fn engine_factory(auto: bool) -> AutoFactory {
    Box::new(move |src| {
        let e = Engine::new(crate::system::engine_config_locked())
            .map_err(pagefold_dedup::Error::from)?;
        if auto {
            let ctl = AutoController::new(bench_auto_config(), src, DEFAULT_KNOBS.pages_to_scan)
                .map_err(|e| pagefold_dedup::Error::Unsupported(e.to_string()))?;
            e.set_round_policy(Box::new(ctl));
        }
        Ok(Box::new(e) as Box<dyn DedupBackend>)
    })
}

impl AutoSystem {
    /// pagefold's engine, its own default knobs, the auto controller.
    pub fn pagefold_auto() -> Self {
        Self {
            name: "pagefold-auto".into(),
            mode: Mode::Auto,
            knobs: None,
            kernel_ksm: false,
            factory: engine_factory(true),
        }
    }

    /// Kernel KSM driven by the same controller, KSM's default knobs.
    pub fn ksm_auto() -> Self {
        Self {
            name: "ksm-auto".into(),
            mode: Mode::Auto,
            knobs: Some(KSM_DEFAULT_KNOBS),
            kernel_ksm: true,
            factory: ksm_factory(true),
        }
    }

    /// pagefold's engine always on (default knobs).
    pub fn pagefold_on() -> Self {
        Self {
            name: "pagefold-on".into(),
            mode: Mode::On,
            knobs: None,
            kernel_ksm: false,
            factory: engine_factory(false),
        }
    }

    /// Kernel KSM always on at its defaults.
    pub fn ksm_default() -> Self {
        Self {
            name: "ksm-default".into(),
            mode: Mode::On,
            knobs: Some(KSM_DEFAULT_KNOBS),
            kernel_ksm: true,
            factory: ksm_factory(false),
        }
    }
}

/// Names accepted by [`select_auto_systems`], in run order.
pub const AUTO_SYSTEM_NAMES: [&str; 4] =
    ["pagefold-auto", "ksm-auto", "pagefold-on", "ksm-default"];

/// The systems named (all if `names` is empty), in run order.
pub fn select_auto_systems(names: &[String]) -> Result<Vec<AutoSystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !AUTO_SYSTEM_NAMES.contains(&n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: AUTO_SYSTEM_NAMES.join(", "),
        });
    }
    Ok([
        AutoSystem::pagefold_auto(),
        AutoSystem::ksm_auto(),
        AutoSystem::pagefold_on(),
        AutoSystem::ksm_default(),
    ]
    .into_iter()
    .filter(|s| names.is_empty() || names.contains(&s.name))
    .collect())
}

#[derive(Debug, Clone)]
pub struct AutoOptions {
    pub vm: VmOptions,
    /// Time spent untriggered (after the fill) before free memory drops.
    pub untriggered: Duration,
    /// Keep sampling this long after reaching 90 % (chart, triggered CPU).
    pub after: Duration,
    pub timeout: Duration,
    pub sample_interval: Duration,
    pub progress: bool,
}

impl Default for AutoOptions {
    fn default() -> Self {
        Self {
            vm: VmOptions::default(),
            untriggered: Duration::from_secs(20),
            after: Duration::from_secs(5),
            timeout: Duration::from_secs(300),
            sample_interval: Duration::from_millis(20),
            progress: true,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AutoRow {
    pub system: String,
    /// From the threshold crossing (always-on: from switching on, content
    /// in place) to 90 % of the possible saving.
    pub trigger_to_90pct_s: Option<f64>,
    /// Merging-side CPU while untriggered, percent of one CPU (auto
    /// systems only; KSM: 0, ksmd is stopped).
    pub untriggered_cpu_pct: Option<f64>,
    /// Merging-side CPU from the crossing to 90 % (or timeout).
    pub triggered_cpu_s: f64,
    /// This process's pages freed at the end (the backend's `bytes_saved`).
    pub saved_bytes: u64,
    /// What a perfect merger frees on the data pages (exact).
    pub possible_saved_bytes: u64,
    /// Merging-side CPU per second over `after` (steady while triggered).
    pub triggered_cpu_pct_after: Option<f64>,
    /// `hardware`, `pvm`, `emulated-svm` or `other`: times under emulation
    /// compare only within one run. Empty in rows written before it was
    /// recorded.
    #[serde(default)]
    pub host_kind: String,
    /// The host kernel's release.
    #[serde(default)]
    pub host_kernel: String,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
}

/// One observation (time relative to the trigger; negative before).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AutoSample {
    pub t_s: f64,
    pub saved_bytes: u64,
    /// What the scripted source reported.
    pub script_free_bytes: u64,
    /// The host's real `MemAvailable`.
    pub host_available_bytes: Option<u64>,
    pub cpu_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AutoSeries {
    pub system: String,
    pub samples: Vec<AutoSample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AutoReport {
    pub rows: Vec<AutoRow>,
    pub series: Vec<AutoSeries>,
    /// Script: total, free before and after the crossing, the threshold.
    pub total_bytes: u64,
    pub threshold_bytes: u64,
    pub unrestored: Vec<String>,
}

/// The scripted host: 16 GiB, 50 % free, then 10 % (threshold 20 %).
pub const TOTAL: u64 = 16 << 30;
pub const FREE_BEFORE: u64 = TOTAL / 2;
pub const FREE_AFTER: u64 = TOTAL / 10;

/// Runs every system, holding the KSM lock throughout; checks KSM
/// tunables are as found afterwards.
pub fn run_auto_all(systems: &[AutoSystem], opts: &AutoOptions) -> Result<AutoReport, BenchError> {
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    let ksm = KsmSession::start()?;
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut result = Ok(());
    for s in systems {
        match run_auto(s, opts) {
            Ok((row, samples)) => {
                rows.push(row);
                series.push(AutoSeries {
                    system: s.name.clone(),
                    samples,
                });
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let unrestored = ksm.finish();
    result?;
    let threshold_pct = bench_auto_config().threshold_pct;
    Ok(AutoReport {
        rows,
        series,
        total_bytes: TOTAL,
        threshold_bytes: TOTAL / 100 * threshold_pct,
        unrestored,
    })
}

/// Runs one system. The caller holds the KSM lock.
pub fn run_auto(
    system: &AutoSystem,
    opts: &AutoOptions,
) -> Result<(AutoRow, Vec<AutoSample>), BenchError> {
    let e = BenchError::backend(&system.name);
    let mut warnings = Vec::new();
    if system.kernel_ksm {
        let others = other_ksm_users();
        if !others.is_empty() {
            warnings.push(format!("other processes use KSM: {}", others.join(", ")));
        }
    }
    let load = load_avg();
    let host = HostId::current();
    let src = ScriptedSource::new(ScriptedSource::sample(TOTAL, FREE_BEFORE));
    let script = src.handle();
    let backend: Arc<dyn DedupBackend> = Arc::from((system.factory)(Box::new(src)).map_err(&e)?);
    let setup = (|| {
        if let Some(k) = system.knobs {
            k.validate()
                .map_err(pagefold_dedup::Error::from)
                .and_then(|k| backend.apply(&k))
                .map_err(&e)?;
        }
        if system.mode == Mode::Auto {
            backend.set_mode(Mode::Auto).map_err(&e)?;
        }
        // Only VMs here: no host regions to size.
        let sizes = RegionSizes {
            seed_bytes: 0,
            scattered_bytes: 0,
        };
        Attached::attach(&backend, Case::Vms, sizes, &opts.vm, opts.progress)
    })();
    let attached = match setup {
        Ok(a) => a,
        Err(err) => {
            backend.shutdown();
            return Err(err);
        }
    };
    let possible = attached.expected().map(|x| x.saved_pages()).unwrap_or(0) * PAGE as u64;
    let measured = measure(&*backend, system, opts, &script, possible);
    let detached = attached.detach(&*backend);
    if system.kernel_ksm {
        crate::host::wait_ksm_released();
    }
    let off = backend.set_mode(Mode::Off).map_err(&e);
    backend.shutdown();
    let (mut row, samples) = measured?;
    detached?;
    off?;
    row.possible_saved_bytes = possible;
    (row.host_kind, row.host_kernel) = (host.kind, host.kernel);
    row.load_avg = load;
    row.warnings = warnings;
    Ok((row, samples))
}

/// This process's saving: the KSM backend's `bytes_saved` comes from
/// `/proc/self/ksm_stat`, so pages other processes (or an earlier test
/// binary whose rmap items ksmd has not dropped yet) have merged do not
/// count; host-wide `pages_sharing` would.
fn saved_bytes(st: &pagefold_dedup::Stats) -> u64 {
    st.bytes_saved
}

fn measure(
    backend: &dyn DedupBackend,
    system: &AutoSystem,
    opts: &AutoOptions,
    script: &pagefold_dedup::auto::ScriptHandle,
    possible: u64,
) -> Result<(AutoRow, Vec<AutoSample>), BenchError> {
    let mut samples = Vec::new();
    let base = backend.stats().cpu_seconds;
    let start = Instant::now();
    let untriggered = opts.untriggered.as_secs_f64();
    let mut free = FREE_BEFORE;
    let record = |samples: &mut Vec<AutoSample>, t_s: f64, free: u64| {
        let st = backend.stats();
        let s = AutoSample {
            t_s,
            saved_bytes: saved_bytes(&st),
            script_free_bytes: free,
            host_available_bytes: mem_available(),
            cpu_s: (st.cpu_seconds - base).max(0.0),
        };
        samples.push(s);
        s
    };
    // Untriggered: content in place, free memory plentiful.
    while start.elapsed() < opts.untriggered {
        std::thread::sleep(opts.sample_interval);
        record(
            &mut samples,
            start.elapsed().as_secs_f64() - untriggered,
            free,
        );
    }
    let cpu_untriggered = backend.stats().cpu_seconds - base;
    let wall_untriggered = start.elapsed().as_secs_f64();
    let untriggered_cpu_pct =
        (system.mode == Mode::Auto).then(|| cpu_untriggered / wall_untriggered * 100.0);
    // The crossing (auto) or switching on (always-on systems).
    free = FREE_AFTER;
    let t0 = Instant::now();
    if system.mode == Mode::Auto {
        script.set(pagefold_dedup::auto::ScriptedSource::sample(
            TOTAL, FREE_AFTER,
        ));
    } else {
        backend
            .set_mode(Mode::On)
            .map_err(BenchError::backend(&system.name))?;
    }
    let target = possible * 9 / 10;
    let mut reached: Option<(f64, f64)> = None;
    let mut next_progress = Duration::from_secs(1);
    let last = loop {
        std::thread::sleep(opts.sample_interval);
        let t = t0.elapsed();
        let last = record(&mut samples, t.as_secs_f64(), free);
        if reached.is_none() && target > 0 && last.saved_bytes >= target {
            reached = Some((t.as_secs_f64(), last.cpu_s));
        }
        if opts.progress && t >= next_progress {
            next_progress += Duration::from_secs(1);
            eprintln!(
                "[{} auto] {:5.1} s after trigger: saved {:.1} / {:.1} MiB, cpu {:.2} s",
                system.name,
                t.as_secs_f64(),
                last.saved_bytes as f64 / 1048576.0,
                possible as f64 / 1048576.0,
                last.cpu_s
            );
        }
        match reached {
            Some((at, _)) if t.as_secs_f64() - at >= opts.after.as_secs_f64() => break last,
            None if t >= opts.timeout => break last,
            _ => {}
        }
    };
    let (trigger_to_90pct_s, triggered_cpu_s, after_pct) = match reached {
        Some((at, cpu)) => {
            let wall = last.t_s - at;
            (
                Some(at),
                cpu - cpu_untriggered,
                (wall > 0.0).then(|| (last.cpu_s - cpu) / wall * 100.0),
            )
        }
        None => (None, last.cpu_s - cpu_untriggered, None),
    };
    Ok((
        AutoRow {
            system: system.name.clone(),
            trigger_to_90pct_s,
            untriggered_cpu_pct,
            triggered_cpu_s: triggered_cpu_s.max(0.0),
            saved_bytes: last.saved_bytes,
            possible_saved_bytes: possible,
            triggered_cpu_pct_after: after_pct,
            // The caller fills in the run's context.
            host_kind: String::new(),
            host_kernel: String::new(),
            load_avg: [0.0; 3],
            warnings: Vec::new(),
        },
        samples,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_auto_systems() {
        let s = select_auto_systems(&[]).unwrap();
        let names: Vec<_> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, AUTO_SYSTEM_NAMES);
        assert_eq!(s[0].mode, Mode::Auto);
        assert_eq!(s[2].mode, Mode::On);
        assert!(select_auto_systems(&["nope".into()]).is_err());
    }

    /// Small VMs, short windows: ksm-auto must do nothing before the
    /// crossing and reach 90 % after it, leaving KSM's tunables as found.
    #[test]
    fn ksm_auto_reacts_to_the_scripted_crossing() {
        let opts = AutoOptions {
            vm: VmOptions {
                memory: "64M".into(),
                shared: "8M".into(),
                ..VmOptions::default()
            },
            untriggered: Duration::from_millis(500),
            after: Duration::from_millis(100),
            timeout: Duration::from_secs(60),
            progress: false,
            ..AutoOptions::default()
        };
        let r = run_auto_all(&[AutoSystem::ksm_auto()], &opts).unwrap();
        assert!(r.unrestored.is_empty(), "{:?}", r.unrestored);
        let row = &r.rows[0];
        // KSM does not run at all while untriggered.
        assert_eq!(row.untriggered_cpu_pct, Some(0.0));
        assert!(row.trigger_to_90pct_s.is_some(), "{row:?}");
        assert_eq!(row.host_kind, HostId::current().kind, "{row:?}");
        assert_eq!(row.host_kernel, crate::host::kernel_release());
        assert!(
            row.saved_bytes >= row.possible_saved_bytes * 9 / 10,
            "{row:?}"
        );
        assert!(row.possible_saved_bytes > 0);
        let s = &r.series[0].samples;
        assert!(s.first().unwrap().t_s < 0.0 && s.last().unwrap().t_s > 0.0);
        // Nothing saved before the crossing.
        assert!(s.iter().filter(|x| x.t_s < 0.0).all(|x| x.saved_bytes == 0));
    }
}
