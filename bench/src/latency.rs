//! The `latency` benchmark: what merging costs a running guest. Two
//! workload VMs with identical content run the pause probe
//! (`pagefold_guest_abi::pause`) while each system merges them, then again
//! while rewriting merged pages (COW breaks); the rows hold the guests'
//! pause percentiles, stopped time per second, merged pages and COW breaks.

use std::time::Duration;

use serde::Serialize;

use crate::error::BenchError;
use crate::system::{engine_factory, System};
use crate::vms::{Placement, VmOptions};

/// The VM shapes: the `vms` pair of `ksm-seed --vms` with linear
/// placement (`full`: twins at the same guest address) or scattered
/// placement (`scattered`: twins at unrelated addresses, a VMA per merge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencyShape {
    Full,
    Scattered,
}

impl LatencyShape {
    pub const ALL: [LatencyShape; 2] = [LatencyShape::Full, LatencyShape::Scattered];

    pub fn name(self) -> &'static str {
        match self {
            LatencyShape::Full => "full",
            LatencyShape::Scattered => "scattered",
        }
    }

    pub(crate) fn placement(self) -> Placement {
        match self {
            LatencyShape::Full => Placement::Linear,
            LatencyShape::Scattered => Placement::Scattered,
        }
    }
}

/// Which probe phase a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbePhase {
    /// The probe from the moment merging starts.
    Merging,
    /// The probe rewriting one shared page per ms, once merged.
    Cow,
}

impl ProbePhase {
    pub fn name(self) -> &'static str {
        match self {
            ProbePhase::Merging => "merging",
            ProbePhase::Cow => "cow",
        }
    }
}

/// A system of the comparison: `off` has no backend at all.
pub struct LatencySystem {
    pub name: String,
    pub system: Option<System>,
}

/// Names accepted by [`select_latency_systems`], in run order.
pub const LATENCY_SYSTEM_NAMES: [&str; 5] = [
    "off",
    "pagefold-on",
    "pagefold-max",
    "ksm-default",
    "ksm-max",
];

/// The systems named in `names` (all if empty), in run order: `off`,
/// pagefold's engine at its defaults (`pagefold-on`) and at max effort,
/// kernel KSM at its defaults and at max effort (`system.rs`).
pub fn select_latency_systems(names: &[String]) -> Result<Vec<LatencySystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !LATENCY_SYSTEM_NAMES.contains(&n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: LATENCY_SYSTEM_NAMES.join(", "),
        });
    }
    let mut on = System::pagefold_default(engine_factory());
    on.name = "pagefold-on".into();
    let all = [
        None,
        Some(on),
        Some(System::pagefold_max(engine_factory())),
        Some(System::ksm_default()),
        Some(System::ksm_max()),
    ];
    Ok(LATENCY_SYSTEM_NAMES
        .iter()
        .zip(all)
        .filter(|(n, _)| names.is_empty() || names.iter().any(|m| m == *n))
        .map(|(n, system)| LatencySystem {
            name: (*n).to_string(),
            system,
        })
        .collect())
}

/// How to run `latency`.
#[derive(Debug, Clone)]
pub struct LatencyOptions {
    pub shapes: Vec<LatencyShape>,
    /// The VM pair (its placement is set per shape).
    pub vm: VmOptions,
    /// Length of each probe phase.
    pub probe: Duration,
    /// Between the two probes: wait until the saving reaches 90 % of the
    /// exact expectation, at most this long.
    pub merge_timeout: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
}

impl Default for LatencyOptions {
    fn default() -> Self {
        Self {
            shapes: LatencyShape::ALL.to_vec(),
            vm: VmOptions::default(),
            probe: Duration::from_secs(5),
            merge_timeout: Duration::from_secs(60),
            progress: true,
        }
    }
}

/// One (system, shape, phase) result: both guests' probes taken together.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub system: String,
    pub shape: LatencyShape,
    pub phase: ProbePhase,
    /// Gaps above the probe's 1 µs threshold, both guests.
    pub gaps: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Stopped time per second of probe time.
    pub stopped_ms_per_s: f64,
    /// Probe time, summed over the guests.
    pub probe_ms: f64,
    /// `pages_sharing + zero_pages` at the end of the phase (0 for `off`).
    pub merged_pages: u64,
    /// The exact possible saving of the pair.
    pub possible_pages: u64,
    /// Merged pages written back to private copies during the phase: for
    /// KSM the host-wide `cow_ksm` of /proc/vmstat (null where the kernel
    /// has no such counter); for the engine its `cow_breaks` plus
    /// `cow_ksm` (the breaks of pages its KSM assist handed to KSM).
    pub cow_breaks: Option<u64>,
    /// Shared pages the guests rewrote during the phase.
    pub pages_written: u64,
    /// Merging-side CPU seconds during the phase.
    pub engine_cpu_s: f64,
    /// The engine's parks of the guests during the phase (both VMs'
    /// windows, from the VMM's record; 0 for KSM, which never parks).
    pub parks: u64,
    /// Their 99th percentile and longest, µs.
    pub park_p99_us: f64,
    pub park_max_us: f64,
    /// Parked time per second of probe time (per guest).
    pub parked_ms_per_s: f64,
    /// The percentile spectrum: (1/(1-q), µs) at q = 0.5, 0.9, 0.99,
    /// 0.999, 0.9999 (for the chart).
    pub spectrum: Vec<(f64, f64)>,
    pub host_kind: String,
    pub host_kernel: String,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    pub rows: Vec<LatencyRow>,
    /// KSM tunables not as found after the benchmark (empty: all restored).
    pub unrestored: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systems_are_selected_by_name_in_run_order() {
        let all = select_latency_systems(&[]).unwrap();
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, LATENCY_SYSTEM_NAMES);
        assert!(all[0].system.is_none());
        let on = all[1].system.as_ref().unwrap();
        assert_eq!((on.name.as_str(), on.knobs), ("pagefold-on", None));
        assert!(all[4].system.as_ref().unwrap().kernel_ksm);
        let two = ["ksm-max".to_string(), "off".to_string()];
        let s = select_latency_systems(&two).unwrap();
        let names: Vec<_> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["off", "ksm-max"]);
        let e = select_latency_systems(&["pagefold-default".to_string()]).err();
        assert!(e.unwrap().to_string().contains("pagefold-default"));
    }

    #[test]
    fn shapes_map_to_the_pair_placements() {
        assert_eq!(LatencyShape::Full.placement(), Placement::Linear);
        assert_eq!(LatencyShape::Scattered.placement(), Placement::Scattered);
        let j = serde_json::to_string(&(LatencyShape::Scattered, ProbePhase::Cow)).unwrap();
        assert_eq!(j, r#"["scattered","cow"]"#);
    }
}
