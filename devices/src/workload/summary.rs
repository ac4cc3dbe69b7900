//! A VM's events folded into what the final report and tests need.

use super::event::{fmt_phase_end, gbps, EventKind};
use pagefold_guest_abi::mailbox::PhaseReport;
use pagefold_guest_abi::pause::{PauseHistogram, PauseStats};
use pagefold_guest_abi::phase;
use std::fmt;
use std::time::Duration;

/// One finished phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseRecord {
    pub report: PhaseReport,
    /// Host-measured duration.
    pub elapsed: Duration,
}

impl PhaseRecord {
    /// Bytes written or checked per second, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        gbps(self.report.bytes, self.elapsed)
    }
}

/// Everything a VM's workload reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadSummary {
    pub vm: String,
    /// HELLO seen.
    pub started: bool,
    /// Finished phases, in order.
    pub phases: Vec<PhaseRecord>,
    /// Guest log lines.
    pub logs: Vec<String>,
    /// Last PROGRESS: (phase, done, total).
    pub last_progress: Option<(u32, u64, u64)>,
    /// Exit code, once the guest exited.
    pub exit_status: Option<u32>,
    /// Histograms of the LATENCY phases, by program slot, in order.
    pub pauses: Vec<(u32, PauseHistogram)>,
}

impl WorkloadSummary {
    pub fn new(vm: impl Into<String>) -> Self {
        Self {
            vm: vm.into(),
            ..Self::default()
        }
    }

    /// Folds in one event of this VM.
    pub fn record(&mut self, kind: &EventKind) {
        match kind {
            EventKind::Hello => self.started = true,
            EventKind::PhaseBegin { .. } => {}
            EventKind::PhaseEnd { report, elapsed } => self.phases.push(PhaseRecord {
                report: **report,
                elapsed: *elapsed,
            }),
            EventKind::Progress { phase, done, total } => {
                self.last_progress = Some((*phase, *done, *total))
            }
            EventKind::Pauses { slot, histogram } => self.pauses.push((*slot, **histogram)),
            EventKind::Log(text) => self.logs.push(text.clone()),
            EventKind::Exit { status } => self.exit_status = Some(*status),
        }
    }

    /// Finished phases with opcode `op`.
    pub fn phases_of(&self, op: u32) -> impl Iterator<Item = &PhaseRecord> + '_ {
        self.phases.iter().filter(move |p| p.report.phase == op)
    }

    /// Pause statistics of each finished LATENCY or LATENCY_WRITE phase
    /// with opcode `op`: its record and its histogram's percentiles.
    pub fn pause_stats(&self, op: u32) -> Vec<(PhaseRecord, PauseStats)> {
        self.phases_of(op)
            .filter_map(|p| {
                let (_, h) = self.pauses.iter().find(|(s, _)| *s == p.report.slot)?;
                Some((*p, PauseStats::compute(&p.report.pauses, h)))
            })
            .collect()
    }

    /// Mismatching pages over all VERIFY phases.
    pub fn mismatches(&self) -> u64 {
        self.phases.iter().map(|p| p.report.mismatches).sum()
    }

    /// Churn writes since the last FILL (input of the ABI's
    /// `version_after_churn` and `expect::VmState`).
    pub fn churn_writes(&self) -> u64 {
        let since_fill = self
            .phases
            .iter()
            .rposition(|p| p.report.phase == phase::FILL)
            .map_or(0, |i| i + 1);
        self.phases[since_fill..]
            .iter()
            .rev()
            .find(|p| p.report.phase == phase::CHURN)
            .map_or(0, |p| p.report.churn_writes_total)
    }

    /// The guest exited with 0 and verified without mismatches.
    pub fn succeeded(&self) -> bool {
        self.exit_status == Some(0) && self.mismatches() == 0
    }
}

impl fmt::Display for WorkloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exit = match self.exit_status {
            Some(s) => format!("exit {s}"),
            None => "no exit".to_string(),
        };
        writeln!(
            f,
            "{}: {} phases, {} mismatches, {exit}",
            self.vm,
            self.phases.len(),
            self.mismatches()
        )?;
        for p in &self.phases {
            write!(f, "  ")?;
            fmt_phase_end(f, &p.report, p.elapsed)?;
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(op: u32, pages: u64, ms: u64) -> EventKind {
        let report = PhaseReport {
            phase: op,
            pages,
            bytes: pages * 4096,
            churn_writes_total: pages,
            ..Default::default()
        };
        EventKind::PhaseEnd {
            report: Box::new(report),
            elapsed: Duration::from_millis(ms),
        }
    }

    #[test]
    fn pause_stats_pair_each_latency_phase_with_its_histogram() {
        let mut s = WorkloadSummary::new("vm1");
        let mut h = PauseHistogram::ZERO;
        for ns in [2_000, 2_000, 2_000, 90_000] {
            h.record_ns(ns);
        }
        let mut report = PhaseReport {
            phase: phase::LATENCY,
            slot: 1,
            ..Default::default()
        };
        report.pauses.gaps = 4;
        report.pauses.stopped_ns = 96_000;
        report.pauses.run_ns = 100_000_000;
        report.pauses.max_gap_ns = 90_000;
        s.record(&end(phase::FILL, 10, 1));
        s.record(&EventKind::Pauses {
            slot: 1,
            histogram: Box::new(h),
        });
        s.record(&EventKind::PhaseEnd {
            report: Box::new(report),
            elapsed: Duration::from_millis(100),
        });
        let st = s.pause_stats(phase::LATENCY);
        assert_eq!(st.len(), 1);
        let (rec, p) = st[0];
        assert_eq!(rec.report.slot, 1);
        assert_eq!(p.gaps, 4);
        assert_eq!(p.p50_us, 3.0);
        assert_eq!(p.max_us, 90.0);
        assert!((p.stopped_ms_per_s - 0.96).abs() < 1e-9);
        assert!(s.pause_stats(phase::LATENCY_WRITE).is_empty());
    }

    #[test]
    fn folds_events_and_tracks_churn_since_fill() {
        let mut s = WorkloadSummary::new("vm1");
        for e in [
            EventKind::Hello,
            end(phase::FILL, 1000, 4),
            end(phase::CHURN, 30, 10),
            end(phase::CHURN, 70, 10),
            EventKind::Log("x".into()),
            end(phase::VERIFY, 1000, 2),
            EventKind::Exit { status: 0 },
        ] {
            s.record(&e);
        }
        assert!(s.started && s.succeeded());
        assert_eq!(s.phases.len(), 4);
        assert_eq!(s.churn_writes(), 70);
        assert_eq!(s.phases_of(phase::CHURN).count(), 2);
        assert!((s.phases_of(phase::FILL).next().unwrap().gbps() - 1.024).abs() < 1e-9);
        s.record(&end(phase::FILL, 1000, 4));
        assert_eq!(s.churn_writes(), 0);
        let text = s.to_string();
        assert!(text.starts_with("vm1: 5 phases, 0 mismatches, exit 0\n"));
        assert!(text.contains("  churn: 70 pages"));
    }

    #[test]
    fn mismatches_fail_the_summary() {
        let mut s = WorkloadSummary::new("vm2");
        let report = PhaseReport {
            phase: phase::VERIFY,
            mismatches: 3,
            ..Default::default()
        };
        s.record(&EventKind::PhaseEnd {
            report: Box::new(report),
            elapsed: Duration::from_millis(1),
        });
        s.record(&EventKind::Exit { status: 1 });
        assert_eq!(s.mismatches(), 3);
        assert!(!s.succeeded());
    }
}
