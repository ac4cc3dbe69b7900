//! The `auto` benchmark (docs/benchmarks.md): two regions with identical
//! content, auto mode on, a scripted memory source that crosses the
//! threshold at a known time. Measures how fast each system reacts and what
//! it costs before and after the trigger.

use std::time::{Duration, Instant};

use pagefold_dedup::auto::{AutoConfig, MemorySource, ScriptedSource};
use pagefold_dedup::ksm::{ksm_exclusive, KsmBackend, KsmOptions};
use pagefold_dedup::{DedupBackend, KnobUpdate, Mode, RegionSpec};
use serde::Serialize;

use crate::error::BenchError;
use crate::region::{Region, PAGE};
use crate::system::DEFAULT_KNOBS;

/// Builds a backend in auto mode reading the given memory source.
pub type AutoFactory = Box<
    dyn Fn(Box<dyn MemorySource>) -> Result<Box<dyn DedupBackend>, pagefold_dedup::Error>
        + Send
        + Sync,
>;

pub struct AutoSystem {
    pub name: String,
    pub knobs: Option<KnobUpdate>,
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

impl AutoSystem {
    /// Kernel KSM driven by the auto controller, KSM's default knobs.
    pub fn ksm_default() -> Self {
        Self {
            name: "ksm-auto".into(),
            knobs: Some(DEFAULT_KNOBS),
            factory: Box::new(|src| {
                let b = KsmBackend::with_options(KsmOptions {
                    auto: bench_auto_config(),
                    memory_source: Some(src),
                    ..KsmOptions::default()
                })
                .map_err(pagefold_dedup::Error::from)?;
                Ok(Box::new(b) as Box<dyn DedupBackend>)
            }),
        }
    }

    /// pagefold's engine: `factory` must build it in a way that its auto
    /// controller reads the given source (e.g. `AutoController::new(
    /// bench_auto_config(), src, ..)`).
    pub fn pagefold(factory: AutoFactory) -> Self {
        Self {
            name: "pagefold-auto".into(),
            knobs: Some(DEFAULT_KNOBS),
            factory,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AutoOptions {
    /// Size of each of the two regions.
    pub region_bytes: usize,
    /// Time spent untriggered before free memory drops.
    pub untriggered: Duration,
    pub timeout: Duration,
    pub sample_interval: Duration,
    pub progress: bool,
}

impl Default for AutoOptions {
    fn default() -> Self {
        Self {
            region_bytes: 64 << 20,
            untriggered: Duration::from_secs(10),
            timeout: Duration::from_secs(300),
            sample_interval: Duration::from_millis(20),
            progress: true,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AutoRow {
    pub system: String,
    /// From the threshold crossing to 90 % of the possible saving.
    pub trigger_to_90pct_s: Option<f64>,
    /// Merging-side CPU while untriggered, percent of one CPU.
    pub untriggered_cpu_pct: f64,
    /// Merging-side CPU from the crossing to 90 % (or timeout).
    pub triggered_cpu_s: f64,
    /// `pages_sharing` x page size at the end.
    pub saved_bytes: u64,
    /// One region's size: every page of B can share A's copy.
    pub possible_saved_bytes: u64,
}

const TOTAL: u64 = 16 << 30;

fn err(system: &AutoSystem) -> impl Fn(pagefold_dedup::Error) -> BenchError + '_ {
    move |source| BenchError::Backend {
        system: system.name.clone(),
        source,
    }
}

/// Runs one system; holds the KSM lock for the whole run.
pub fn run_auto(system: &AutoSystem, opts: &AutoOptions) -> Result<AutoRow, BenchError> {
    let _lock = ksm_exclusive()?;
    let e = err(system);
    let src = ScriptedSource::new(ScriptedSource::sample(TOTAL, TOTAL / 2));
    let script = src.handle();
    let backend = (system.factory)(Box::new(src)).map_err(&e)?;
    if let Some(k) = system.knobs {
        backend.set_knobs(k).map_err(&e)?;
    }
    let mut a = Region::map(opts.region_bytes)?;
    let mut b = Region::map(opts.region_bytes)?;
    a.fill_distinct(0x5eed);
    b.fill_distinct(0x5eed);
    let possible = b.pages() as u64;
    let mut ids = Vec::new();
    for (r, owner) in [(&a, "vm-a"), (&b, "vm-b")] {
        let spec = RegionSpec {
            host_addr: r.addr(),
            len: r.len(),
            owner: owner.into(),
            group: "auto".into(),
        };
        // SAFETY: private anonymous mappings unregistered before drop.
        ids.push(unsafe { backend.register(spec) }.map_err(&e)?);
    }
    backend.set_mode(Mode::Auto).map_err(&e)?;
    let cpu0 = backend.stats().cpu_seconds;
    std::thread::sleep(opts.untriggered);
    let cpu1 = backend.stats().cpu_seconds;
    let untriggered_cpu_pct = (cpu1 - cpu0) / opts.untriggered.as_secs_f64() * 100.0;
    // Free memory drops to 10 % (threshold 20 %).
    script.set(ScriptedSource::sample(TOTAL, TOTAL / 10));
    let t0 = Instant::now();
    let target = possible * 9 / 10;
    let mut reached = None;
    let mut next_progress = Duration::from_secs(1);
    let mut last = backend.stats();
    while t0.elapsed() < opts.timeout {
        std::thread::sleep(opts.sample_interval);
        last = backend.stats();
        if last.pages_sharing >= target {
            reached = Some(t0.elapsed().as_secs_f64());
            break;
        }
        if opts.progress && t0.elapsed() >= next_progress {
            next_progress += Duration::from_secs(1);
            eprintln!(
                "[{} auto] {:5.1} s after trigger: pages_sharing {} / {target}",
                system.name,
                t0.elapsed().as_secs_f64(),
                last.pages_sharing
            );
        }
    }
    let triggered_cpu_s = (last.cpu_seconds - cpu1).max(0.0);
    backend.set_mode(Mode::Off).map_err(&e)?;
    for id in ids {
        backend.unregister(id).map_err(&e)?;
    }
    backend.shutdown();
    Ok(AutoRow {
        system: system.name.clone(),
        trigger_to_90pct_s: reached,
        untriggered_cpu_pct,
        triggered_cpu_s,
        saved_bytes: last.pages_sharing * PAGE as u64,
        possible_saved_bytes: possible * PAGE as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_dedup::ksm::{snapshot_tunables, KSM_SYSFS};

    #[test]
    fn ksm_auto_reacts_to_the_scripted_crossing() {
        let before = snapshot_tunables(std::path::Path::new(KSM_SYSFS));
        let row = run_auto(
            &AutoSystem::ksm_default(),
            &AutoOptions {
                region_bytes: 4 << 20,
                untriggered: Duration::from_millis(500),
                timeout: Duration::from_secs(60),
                progress: false,
                ..AutoOptions::default()
            },
        )
        .unwrap();
        assert_eq!(snapshot_tunables(std::path::Path::new(KSM_SYSFS)), before);
        // KSM does not run at all while untriggered.
        assert_eq!(row.untriggered_cpu_pct, 0.0);
        assert!(row.trigger_to_90pct_s.is_some(), "{row:?}");
        assert!(
            row.saved_bytes >= row.possible_saved_bytes * 9 / 10,
            "{row:?}"
        );
        assert_eq!(row.possible_saved_bytes, 4 << 20);
    }
}
