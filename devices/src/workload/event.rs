//! Events a workload device reports to the VMM, one per guest operation
//! worth knowing about, and their one-line rendering.

use pagefold_guest_abi::mailbox::{PhaseReport, NO_MISMATCH};
use pagefold_guest_abi::pause::PauseHistogram;
use pagefold_guest_abi::{phase, PAGE_SIZE};
use std::fmt;
use std::time::Duration;

/// An event of VM `vm`.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadEvent {
    pub vm: String,
    pub kind: EventKind,
}

/// What happened.
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// The guest started and accepted its parameters.
    Hello,
    /// Program slot `slot` (opcode `phase`, argument `arg`) started.
    PhaseBegin { phase: u32, slot: u32, arg: u64 },
    /// A phase ended. `elapsed` is measured by the host from PHASE_BEGIN to
    /// PHASE_END (authoritative: the guest's TSC may be virtualized).
    /// Boxed: the report is a few hundred bytes.
    PhaseEnd {
        report: Box<PhaseReport>,
        elapsed: Duration,
    },
    /// The histogram of a LATENCY phase's gaps, sent just before that
    /// phase's `PhaseEnd` (which carries the gap count, stopped time, run
    /// time and longest gap). Boxed: 2.5 KiB.
    Pauses {
        slot: u32,
        histogram: Box<PauseHistogram>,
    },
    /// `done` of `total` pages (total 0: open-ended, e.g. churn).
    Progress { phase: u32, done: u64, total: u64 },
    /// A line the guest logged.
    Log(String),
    /// The guest exited with `status` (`mailbox::exit_code`).
    Exit { status: u32 },
}

/// Gigabytes (10^9 bytes) per second.
pub(crate) fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s / 1e9
    } else {
        0.0
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Formats a PHASE_END: `fill: 65536 pages (256.0 MiB) in 612.3 ms (0.44 GB/s), zero 6553, dup 3276`.
pub(crate) fn fmt_phase_end(
    f: &mut fmt::Formatter<'_>,
    r: &PhaseReport,
    elapsed: Duration,
) -> fmt::Result {
    let name = phase::name(r.phase);
    match r.phase {
        phase::SLEEP | phase::WAIT_HOST => return write!(f, "{name}: {:.1} ms", ms(elapsed)),
        _ => {}
    }
    if matches!(r.phase, phase::LATENCY | phase::LATENCY_WRITE) {
        let p = &r.pauses;
        return write!(
            f,
            "{name}: {:.1} ms, {} gaps above {} us, stopped {:.3} ms, longest {:.1} us, {} pages written",
            p.run_ns as f64 / 1e6,
            p.gaps,
            pagefold_guest_abi::pause::GAP_THRESHOLD_NS / 1000,
            p.stopped_ns as f64 / 1e6,
            p.max_gap_ns as f64 / 1e3,
            r.pages
        );
    }
    if r.phase == phase::PROBE_MERGE {
        let p = &r.probe;
        let m = pagefold_guest_abi::merge_probe::MEDIAN;
        return write!(
            f,
            "{name}: {} pages ({} shared), accuracy {:.3} ({} of {} tested), threshold +{:.2} us, median write shared {:.2} us, unique {:.2} us; read after write: accuracy {:.3}, median shared {:.3} us, unique {:.3} us",
            p.pages,
            p.shared_pages,
            p.accuracy(),
            p.correct,
            p.tested,
            p.us(p.threshold_cycles),
            p.us(p.shared_cycles[m]),
            p.us(p.unique_cycles[m]),
            p.read_accuracy(),
            p.us(p.shared_read_cycles),
            p.us(p.unique_read_cycles)
        );
    }
    let mib = r.bytes as f64 / (1 << 20) as f64;
    if r.phase == phase::BUILD {
        return write!(
            f,
            "{name}: read {} pages ({mib:.1} MiB), wrote {}, reused {}, in {:.1} ms (cpu {:.1} ms), checksum {:#018x}",
            r.pages,
            r.pages_written,
            r.pages_reused,
            ms(elapsed),
            r.cpu_us as f64 / 1e3,
            r.checksum
        );
    }
    write!(
        f,
        "{name}: {} pages ({mib:.1} MiB) in {:.1} ms ({:.2} GB/s), zero {}, dup {}",
        r.pages,
        ms(elapsed),
        gbps(r.bytes, elapsed),
        r.zero_pages,
        r.dup_pages
    )?;
    if r.phase == phase::CHURN {
        write!(f, ", churn writes total {}", r.churn_writes_total)?;
    }
    if r.phase == phase::VERIFY {
        write!(f, ", mismatches {}", r.mismatches)?;
        if r.first_mismatch != NO_MISMATCH {
            write!(
                f,
                " (first: page {} word {}: expected {:#018x}, found {:#018x})",
                r.first_mismatch, r.mismatch_word, r.expected_word, r.found_word
            )?;
        }
    }
    Ok(())
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hello => write!(f, "guest started"),
            Self::PhaseBegin {
                phase: p,
                slot,
                arg,
            } => {
                write!(f, "{} begins (slot {slot}, arg {arg})", phase::name(*p))
            }
            Self::PhaseEnd { report, elapsed } => fmt_phase_end(f, report, *elapsed),
            Self::Progress {
                phase: p,
                done,
                total,
            } => {
                let mib = (done * PAGE_SIZE) as f64 / (1 << 20) as f64;
                if *total > 0 {
                    write!(
                        f,
                        "{}: {done}/{total} pages ({mib:.1} MiB)",
                        phase::name(*p)
                    )
                } else {
                    write!(f, "{}: {done} pages ({mib:.1} MiB)", phase::name(*p))
                }
            }
            Self::Pauses { slot, histogram } => {
                write!(
                    f,
                    "slot {slot}: {} gaps in the histogram",
                    histogram.total()
                )
            }
            Self::Log(text) => write!(f, "guest: {text}"),
            Self::Exit { status } => write!(f, "exit {status}"),
        }
    }
}

impl fmt::Display for WorkloadEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.vm, self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_end_is_one_readable_line() {
        let report = PhaseReport {
            phase: phase::FILL,
            pages: 65536,
            bytes: 65536 * 4096,
            zero_pages: 6553,
            dup_pages: 3276,
            first_mismatch: NO_MISMATCH,
            ..PhaseReport::default()
        };
        let ev = WorkloadEvent {
            vm: "vm0".into(),
            kind: EventKind::PhaseEnd {
                report: Box::new(report),
                elapsed: Duration::from_micros(612_300),
            },
        };
        assert_eq!(
            ev.to_string(),
            "vm0: fill: 65536 pages (256.0 MiB) in 612.3 ms (0.44 GB/s), zero 6553, dup 3276"
        );
    }

    #[test]
    fn verify_line_names_the_first_mismatch() {
        let report = PhaseReport {
            phase: phase::VERIFY,
            pages: 10,
            bytes: 40960,
            mismatches: 2,
            first_mismatch: 3,
            mismatch_word: 7,
            expected_word: 1,
            found_word: 2,
            ..PhaseReport::default()
        };
        let s = EventKind::PhaseEnd {
            report: Box::new(report),
            elapsed: Duration::from_millis(1),
        }
        .to_string();
        assert!(s.ends_with(
            "mismatches 2 (first: page 3 word 7: expected 0x0000000000000001, found 0x0000000000000002)"
        ));
        let r = PhaseReport {
            phase: phase::WAIT_HOST,
            ..PhaseReport::default()
        };
        let s = EventKind::PhaseEnd {
            report: Box::new(r),
            elapsed: Duration::from_millis(1500),
        }
        .to_string();
        assert_eq!(s, "wait-host: 1500.0 ms");
    }

    #[test]
    fn probe_merge_line_gives_accuracy_and_class_medians() {
        let mut r = PhaseReport {
            phase: phase::PROBE_MERGE,
            pages: 1024,
            ..PhaseReport::default()
        };
        r.probe.pages = 1024;
        r.probe.shared_pages = 512;
        r.probe.tested = 512;
        r.probe.correct = 500;
        r.probe.tsc_khz = 2_000_000;
        r.probe.threshold_cycles = 10_000;
        r.probe.shared_cycles[3] = 40_000;
        r.probe.unique_cycles[3] = 400;
        r.probe.read_correct = 512;
        r.probe.shared_read_cycles = 100;
        r.probe.unique_read_cycles = 500;
        let s = EventKind::PhaseEnd {
            report: Box::new(r),
            elapsed: Duration::from_millis(30),
        }
        .to_string();
        assert_eq!(
            s,
            "probe-merge: 1024 pages (512 shared), accuracy 0.977 (500 of 512 tested), threshold +5.00 us, median write shared 20.00 us, unique 0.20 us; read after write: accuracy 1.000, median shared 0.050 us, unique 0.250 us"
        );
    }

    #[test]
    fn other_events_render() {
        assert_eq!(
            EventKind::Progress {
                phase: phase::FILL,
                done: 256,
                total: 512
            }
            .to_string(),
            "fill: 256/512 pages (1.0 MiB)"
        );
        assert_eq!(EventKind::Log("hi".into()).to_string(), "guest: hi");
        assert_eq!(EventKind::Exit { status: 1 }.to_string(), "exit 1");
        assert_eq!(gbps(1_000_000_000, Duration::ZERO), 0.0);
    }
}
