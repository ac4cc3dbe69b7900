//! The host's reading of a PROBE_MERGE phase: the guest's classification
//! of its timed writes and each class's write times, in microseconds
//! (`pagefold_guest_abi::merge_probe` does the arithmetic).

use pagefold_devices::workload::PhaseRecord;
use pagefold_guest_abi::merge_probe::{MergeProbe, MEDIAN};
use pagefold_guest_abi::phase;
use serde::Serialize;

/// A PROBE_MERGE phase's result, as reports print it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeRow {
    /// Share of the test half classified right (chance: 0.5).
    pub accuracy: f64,
    /// Probe pages written, and of them those labelled shared.
    pub pages: u64,
    pub shared_pages: u64,
    /// Test pages, and those classified right.
    pub tested: u64,
    pub correct: u64,
    /// The learned threshold, above the local baseline of each write:
    /// slower writes are called merged.
    pub threshold_us: f64,
    /// Median write time of each label.
    pub shared_median_us: f64,
    pub unique_median_us: f64,
    /// Write times of each label at min, p10, p25, p50, p75, p90, max
    /// (`merge_probe::QUANTILES_PERMILLE`).
    pub shared_us: [f64; 7],
    pub unique_us: [f64; 7],
    /// The read right after each write (another cache line of the page),
    /// classified the same way: share of the test half right, and each
    /// label's median read time.
    pub read_accuracy: f64,
    pub shared_read_median_us: f64,
    pub unique_read_median_us: f64,
}

impl From<&MergeProbe> for ProbeRow {
    fn from(p: &MergeProbe) -> Self {
        let us = |c: &[u64; 7]| c.map(|x| p.us(x));
        Self {
            accuracy: p.accuracy(),
            pages: p.pages,
            shared_pages: p.shared_pages,
            tested: p.tested,
            correct: p.correct,
            threshold_us: p.us(p.threshold_cycles),
            shared_median_us: p.us(p.shared_cycles[MEDIAN]),
            unique_median_us: p.us(p.unique_cycles[MEDIAN]),
            shared_us: us(&p.shared_cycles),
            unique_us: us(&p.unique_cycles),
            read_accuracy: p.read_accuracy(),
            shared_read_median_us: p.us(p.shared_read_cycles),
            unique_read_median_us: p.us(p.unique_read_cycles),
        }
    }
}

/// The probe of phase `p`, if it is a PROBE_MERGE phase.
pub fn probe_row(p: &PhaseRecord) -> Option<ProbeRow> {
    (p.report.phase == phase::PROBE_MERGE).then(|| ProbeRow::from(&p.report.probe))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_guest_abi::mailbox::PhaseReport;
    use std::time::Duration;

    #[test]
    fn probe_phases_give_a_row_in_microseconds_and_others_none() {
        let mut report = PhaseReport {
            phase: phase::PROBE_MERGE,
            ..PhaseReport::default()
        };
        report.probe = MergeProbe {
            pages: 8,
            shared_pages: 4,
            train_pages: 4,
            tested: 4,
            correct: 3,
            threshold_cycles: 3000,
            tsc_khz: 1_000_000,
            shared_cycles: [10_000, 11_000, 12_000, 20_000, 21_000, 22_000, 30_000],
            unique_cycles: [100, 110, 120, 200, 210, 220, 300],
            read_correct: 4,
            shared_read_cycles: 50,
            unique_read_cycles: 250,
        };
        let rec = PhaseRecord {
            report,
            elapsed: Duration::from_millis(1),
        };
        let row = probe_row(&rec).unwrap();
        assert_eq!(row.accuracy, 0.75);
        assert_eq!(row.threshold_us, 3.0);
        assert_eq!((row.shared_median_us, row.unique_median_us), (20.0, 0.2));
        assert_eq!(row.shared_us[6], 30.0);
        assert_eq!(row.read_accuracy, 1.0);
        assert_eq!(
            (row.shared_read_median_us, row.unique_read_median_us),
            (0.05, 0.25)
        );
        let other = PhaseRecord {
            report: PhaseReport {
                phase: phase::FILL,
                ..report
            },
            ..rec
        };
        assert!(probe_row(&other).is_none());
    }
}
