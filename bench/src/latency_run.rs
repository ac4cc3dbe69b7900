//! One (system, shape) run of the latency benchmark: a fresh backend and
//! VM pair; merging starts as the guests' first probe does; once 90 % of
//! the possible saving is merged (or the wait times out) the second probe
//! rewrites merged pages. Two rows come out, one per probe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_dedup::{DedupBackend, Mode};
use pagefold_guest_abi::phase;

use crate::error::BenchError;
use crate::host::{load_avg, other_ksm_users, HostId};
use crate::latency::{LatencyOptions, LatencyRow, LatencyShape, LatencySystem, ProbePhase};
use crate::latency_vms::{ProbePair, ProbeResult};
use crate::system::System;
use crate::vms::VmOptions;
use pagefold_vmm::pause::GuestPauses;

/// Quantiles of the chart's spectrum, in parts per million.
const SPECTRUM_PPM: [u32; 5] = [500_000, 900_000, 990_000, 999_000, 999_900];

/// A phase's guests may take this long beyond the probe itself (exits,
/// a slow host) before the run is given up.
const PHASE_SLACK: Duration = Duration::from_secs(60);

/// The backend's counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    saved: u64,
    cow: Option<u64>,
    cpu_s: f64,
    /// Both VMs' park windows so far.
    parks: GuestPauses,
}

impl Counters {
    /// `off` reads all zero: nothing merges, nothing breaks.
    fn read(backend: Option<&dyn DedupBackend>, kernel_ksm: bool, pair: &ProbePair) -> Counters {
        let parks = pair.guest_pauses();
        let Some(b) = backend else {
            return Counters {
                cow: Some(0),
                parks,
                ..Counters::default()
            };
        };
        let st = b.stats();
        // Kernel KSM's breaks are counted host-wide only (cow_ksm in
        // /proc/vmstat), read here for the KSM rows. The engine counts its
        // own, and its KSM assist hands scattered groups to kernel KSM,
        // whose breaks only the kernel sees: the engine's rows add both.
        let ksm = pagefold_dedup::ksm::cow_ksm();
        Counters {
            saved: st.pages_sharing + st.zero_pages,
            cow: if kernel_ksm {
                ksm
            } else {
                Some(st.cow_breaks + ksm.unwrap_or(0))
            },
            cpu_s: st.cpu_seconds,
            parks,
        }
    }
}

/// What one probe phase measured, with the counters around it.
struct Measured {
    probe: ProbeResult,
    start: Counters,
    end: Counters,
}

/// What every row of one run shares.
struct RunInfo {
    system: String,
    shape: LatencyShape,
    possible: u64,
    host: HostId,
    load: [f64; 3],
    warnings: Vec<String>,
}

impl RunInfo {
    /// The row of one probe.
    fn row(&self, phase: ProbePhase, m: &Measured) -> LatencyRow {
        let st = &m.probe.stats;
        let parks = m.end.parks.since(&m.start.parks);
        // Per guest: the pair's windows are both guests' stops.
        let probe_s = st.run_ms / 1e3;
        LatencyRow {
            system: self.system.clone(),
            shape: self.shape,
            phase,
            gaps: st.gaps,
            p50_us: st.p50_us,
            p99_us: st.p99_us,
            p999_us: st.p999_us,
            max_us: st.max_us,
            stopped_ms_per_s: st.stopped_ms_per_s,
            probe_ms: st.run_ms,
            merged_pages: m.end.saved,
            possible_pages: self.possible,
            cow_breaks: m.end.cow.zip(m.start.cow).map(|(e, s)| e.saturating_sub(s)),
            pages_written: m.probe.pages_written,
            engine_cpu_s: (m.end.cpu_s - m.start.cpu_s).max(0.0),
            parks: parks.count,
            park_p99_us: parks.p99_s * 1e6,
            park_max_us: parks.max_s * 1e6,
            parked_ms_per_s: if probe_s > 0.0 {
                parks.total_s * 1e3 / probe_s
            } else {
                0.0
            },
            spectrum: spectrum(&m.probe),
            host_kind: self.host.kind.clone(),
            host_kernel: self.host.kernel.clone(),
            load_avg: self.load,
            warnings: self.warnings.clone(),
        }
    }
}

/// Warnings about the host, taken before the run.
pub(crate) fn ksm_warnings(kernel_ksm: bool) -> Vec<String> {
    let others = other_ksm_users();
    if !kernel_ksm || others.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "other processes use KSM (pages_sharing and cow_ksm include them): {}",
        others.join(", ")
    )]
}

/// Runs `ls` on `shape`; the caller holds the KSM lock.
pub(crate) fn run_once(
    ls: &LatencySystem,
    shape: LatencyShape,
    opts: &LatencyOptions,
) -> Result<Vec<LatencyRow>, BenchError> {
    let kernel_ksm = ls.system.as_ref().is_some_and(|s| s.kernel_ksm);
    let vm = VmOptions {
        placement: shape.placement(),
        ..opts.vm.clone()
    };
    let info = RunInfo {
        system: ls.name.clone(),
        shape,
        possible: vm.expected()?.saved_pages(),
        host: HostId::current(),
        load: load_avg(),
        warnings: ksm_warnings(kernel_ksm),
    };
    let backend = ls.system.as_ref().map(build_backend).transpose()?;
    let mut pair = match ProbePair::start(backend.as_ref(), &vm, opts.probe) {
        Ok(p) => p,
        Err(e) => {
            if let Some(b) = &backend {
                b.shutdown();
            }
            return Err(e);
        }
    };
    let tag = format!("[{} {}]", ls.name, shape.name());
    let b = backend.as_deref();
    let result = measure(&mut pair, b, kernel_ksm, info.possible, &tag, opts);
    pair.stop();
    let down = teardown(b, kernel_ksm, &ls.name);
    let [merging, cow] = result?;
    down?;
    let rows = vec![
        info.row(ProbePhase::Merging, &merging),
        info.row(ProbePhase::Cow, &cow),
    ];
    if opts.progress {
        for r in &rows {
            eprintln!(
                "{tag} {}: gaps {}, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us, stopped {:.2} ms/s, merged {}, cow breaks {}",
                r.phase.name(),
                r.gaps,
                r.p99_us,
                r.p999_us,
                r.max_us,
                r.stopped_ms_per_s,
                r.merged_pages,
                r.cow_breaks.map_or("-".into(), |c| c.to_string())
            );
        }
    }
    Ok(rows)
}

/// A fresh backend with the system's knobs, mode still off.
pub(crate) fn build_backend(s: &System) -> Result<Arc<dyn DedupBackend>, BenchError> {
    let backend: Arc<dyn DedupBackend> = Arc::from(s.build()?);
    if let Some(k) = s.knobs {
        let applied = k
            .validate()
            .map_err(pagefold_dedup::Error::from)
            .and_then(|k| backend.apply(&k));
        if let Err(e) = applied {
            backend.shutdown();
            return Err(BenchError::backend(&s.name)(e));
        }
    }
    Ok(backend)
}

/// Turns merging on as the first probe starts, waits for the saving,
/// runs the write probe.
fn measure(
    pair: &mut ProbePair,
    backend: Option<&dyn DedupBackend>,
    kernel_ksm: bool,
    possible: u64,
    tag: &str,
    opts: &LatencyOptions,
) -> Result<[Measured; 2], BenchError> {
    let limit = opts.probe + PHASE_SLACK;
    let start = Counters::read(backend, kernel_ksm, pair);
    if let Some(b) = backend {
        b.set_mode(Mode::On)
            .map_err(BenchError::backend(b.name()))?;
    }
    if opts.progress {
        eprintln!("{tag} merging on; probe for {:?}", opts.probe);
    }
    pair.release();
    pair.wait_phase(phase::LATENCY, limit)?;
    let merging = Measured {
        probe: probe_of(pair, phase::LATENCY)?,
        start,
        end: Counters::read(backend, kernel_ksm, pair),
    };
    wait_merged(pair, backend, kernel_ksm, possible, tag, opts);
    let start = Counters::read(backend, kernel_ksm, pair);
    if opts.progress {
        eprintln!(
            "{tag} {} of {possible} pages merged; write probe for {:?}",
            start.saved, opts.probe
        );
    }
    pair.release();
    pair.wait_phase(phase::LATENCY_WRITE, limit)?;
    if backend.is_some() && !kernel_ksm {
        // The engine counts a break when a collection of the write log
        // (once a `LOG_INTERVAL`) shows the write and its scan visits
        // the page; kernel KSM's `cow_ksm` counts in the fault itself.
        std::thread::sleep(2 * pagefold_dedup::LOG_INTERVAL);
    }
    let cow = Measured {
        probe: probe_of(pair, phase::LATENCY_WRITE)?,
        start,
        end: Counters::read(backend, kernel_ksm, pair),
    };
    Ok([merging, cow])
}

fn probe_of(pair: &ProbePair, op: u32) -> Result<ProbeResult, BenchError> {
    pair.last_probe(op).ok_or_else(|| {
        BenchError::Vm(format!(
            "a guest ended {} without its pause histogram",
            phase::name(op)
        ))
    })
}

/// Waits until the saving reaches 90 % of `possible` or the merge
/// timeout passes (`off` does not wait), printing progress once a second.
fn wait_merged(
    pair: &ProbePair,
    backend: Option<&dyn DedupBackend>,
    kernel_ksm: bool,
    possible: u64,
    tag: &str,
    opts: &LatencyOptions,
) {
    if backend.is_none() {
        return;
    }
    let t0 = Instant::now();
    let mut next = Duration::from_secs(1);
    while t0.elapsed() < opts.merge_timeout {
        let saved = Counters::read(backend, kernel_ksm, pair).saved;
        if saved * 10 >= possible * 9 {
            return;
        }
        if opts.progress && t0.elapsed() >= next {
            next += Duration::from_secs(1);
            eprintln!(
                "{tag} {:5.1} s  merged {saved} of {possible}",
                t0.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if opts.progress {
        eprintln!("{tag} not 90 % merged after {:?}", opts.merge_timeout);
    }
}

/// (1/(1-q), µs) for the chart, capped at the exact maximum.
fn spectrum(p: &ProbeResult) -> Vec<(f64, f64)> {
    SPECTRUM_PPM
        .iter()
        .filter_map(|&ppm| {
            let us = p.histogram.quantile_us(ppm)? as f64;
            Some((1e6 / f64::from(1_000_000 - ppm), us.min(p.stats.max_us)))
        })
        .collect()
}

/// Stops merging and shuts the backend down; for kernel KSM, first waits
/// until ksmd released this process's pages (as `ksm-seed` does), so the
/// next run starts from clean counters. The VMs are already stopped.
pub(crate) fn teardown(
    backend: Option<&dyn DedupBackend>,
    kernel_ksm: bool,
    name: &str,
) -> Result<(), BenchError> {
    let Some(b) = backend else {
        return Ok(());
    };
    if kernel_ksm {
        crate::host::wait_ksm_released();
    }
    let r = b.set_mode(Mode::Off).map_err(BenchError::backend(name));
    b.shutdown();
    r
}
