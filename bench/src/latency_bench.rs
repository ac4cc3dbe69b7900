//! Running the `latency` benchmark: every system on every shape, under
//! the KSM lock, with the KSM tunables checked at the end.

use crate::error::BenchError;
use crate::host::KsmSession;
use crate::latency::{LatencyOptions, LatencyReport, LatencySystem};

/// Runs every system on every shape, holding the KSM lock throughout, and
/// checks that every KSM tunable is as found at the end (the KSM backend
/// journals what it writes, so a `kill -9` is undone by the next run).
pub fn run_latency_bench(
    systems: &[LatencySystem],
    opts: &LatencyOptions,
) -> Result<LatencyReport, BenchError> {
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    let ksm = KsmSession::start()?;
    let mut rows = Vec::new();
    let mut result = Ok(());
    'all: for &shape in &opts.shapes {
        for system in systems {
            match crate::latency_run::run_once(system, shape, opts) {
                Ok(r) => rows.extend(r),
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
    Ok(LatencyReport { rows, unrestored })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::latency::{select_latency_systems, LatencyShape, ProbePhase};
    use crate::vms::VmOptions;

    /// The short form: tiny VMs, short probes, `off`, pagefold at its
    /// defaults and KSM at max effort on the full shape (KSM lock held,
    /// tunables checked). The probe's figures must be consistent, `off`
    /// must merge and break nothing, and the merging systems must merge
    /// the pair and see the write probe break merged pages.
    #[test]
    fn short_form_probes_off_pagefold_and_ksm() {
        let opts = LatencyOptions {
            shapes: vec![LatencyShape::Full],
            vm: VmOptions {
                memory: "64M".into(),
                shared: "16M".into(),
                ..VmOptions::default()
            },
            probe: Duration::from_millis(300),
            merge_timeout: Duration::from_secs(30),
            progress: false,
        };
        let names = ["off", "pagefold-on", "ksm-max"].map(String::from);
        let systems = select_latency_systems(&names).unwrap();
        let r = run_latency_bench(&systems, &opts).unwrap();
        assert!(r.unrestored.is_empty(), "{:?}", r.unrestored);
        assert_eq!(r.rows.len(), 6);
        for x in &r.rows {
            let what = format!("{} {}: {x:?}", x.system, x.phase.name());
            // Two guests, 300 ms of TSC time each, overshot by at most
            // each one's last gap.
            let over = 2.0 * x.max_us / 1e3 + 0.01;
            assert!((600.0..=600.0 + over).contains(&x.probe_ms), "{what}");
            assert!(x.gaps > 0, "{what}");
            assert!(x.p50_us <= x.p99_us && x.p99_us <= x.p999_us, "{what}");
            assert!(x.p999_us <= x.max_us, "{what}");
            assert!(x.stopped_ms_per_s < 1000.0, "{what}");
            // One write per ms of each guest's run, but for the writes due
            // during its last gap (the run ends before them).
            let max_ms = (x.max_us / 1e3).ceil() as u64;
            let written = if x.phase == ProbePhase::Cow {
                2 * (300 - max_ms.min(300)).saturating_sub(2)..=2 * 301
            } else {
                0..=0
            };
            assert!(written.contains(&x.pages_written), "{what}");
            assert!(x.spectrum.windows(2).all(|w| w[0].1 <= w[1].1), "{what}");
        }
        let off: Vec<_> = r.rows.iter().filter(|x| x.system == "off").collect();
        assert!(off
            .iter()
            .all(|x| x.merged_pages == 0 && x.cow_breaks == Some(0)));
        for sys in ["pagefold-on", "ksm-max"] {
            let cow = r
                .rows
                .iter()
                .find(|x| x.system == sys && x.phase == ProbePhase::Cow)
                .unwrap();
            // The write probe started at 90 % merged and rewrote ~600
            // shared pages of the ~7800 merged ones.
            assert!(cow.merged_pages * 10 >= cow.possible_pages * 8, "{cow:?}");
            if let Some(c) = cow.cow_breaks {
                assert!(c > 0, "{cow:?}");
            }
        }
        let on_cow = r
            .rows
            .iter()
            .find(|x| x.system == "pagefold-on" && x.phase == ProbePhase::Cow);
        assert!(on_cow.unwrap().cow_breaks.is_some());
    }
}
