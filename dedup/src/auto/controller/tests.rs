//! Controller tests on a scripted memory source.

use super::*;
use crate::auto::config::{page_size, PsiMetric, PsiTrigger};
use crate::auto::scripted::{ScriptHandle, ScriptedSource};
use crate::auto::source::Psi;
use crate::settings::{MemorySignal, SettingsError};

const GIB: u64 = 1 << 30;
const TOTAL: u64 = 16 * GIB;
/// 20 % of 16 GiB.
const TRIGGER: u64 = TOTAL / 5;
/// Trigger line + total/16.
const STOP: u64 = TRIGGER + TOTAL / 16;

fn cfg() -> AutoConfig {
    AutoConfig {
        sample_interval_ms: 0,
        ..AutoConfig::default()
    }
}

fn free(bytes: u64) -> MemSample {
    ScriptedSource::sample(TOTAL, bytes)
}

fn controller(c: AutoConfig, initial_free: u64) -> (AutoController, ScriptHandle) {
    let src = ScriptedSource::new(free(initial_free));
    let h = src.handle();
    (AutoController::new(c, Box::new(src), 100).unwrap(), h)
}

/// A controller that is triggered, having planned exactly one (triggered) round.
fn triggered(c: AutoConfig) -> (AutoController, ScriptHandle) {
    let (mut a, h) = controller(c, TRIGGER - 1);
    assert_eq!(
        a.plan(0, 100),
        RoundPlan {
            pages_to_visit: 100,
            merge: true
        }
    );
    (a, h)
}

/// Plans a round after one with `merges` merges; returns the factor used.
fn step(a: &mut AutoController, merges: u64) -> u64 {
    let p = a.plan(merges, 100);
    assert!(p.merge);
    assert_eq!(p.pages_to_visit % 100, 0);
    p.pages_to_visit / 100
}

#[test]
fn untriggered_scans_slowly_and_only_checksums() {
    let (mut a, _h) = controller(cfg(), TOTAL / 2);
    for _ in 0..10 {
        assert_eq!(
            a.plan(0, 100),
            RoundPlan {
                pages_to_visit: UNTRIGGERED_PAGES_PER_WAKEUP,
                merge: false
            }
        );
    }
    // Never more than the knob itself.
    assert_eq!(a.plan(0, 3).pages_to_visit, 3);
    let s = a.status();
    assert!(!s.auto_triggered);
    assert_eq!(s.triggered_times, 0);
    assert_eq!(s.rounds, 11);
    assert_eq!(s.triggered_rounds, 0);
}

#[test]
fn triggers_strictly_below_threshold() {
    let (mut a, h) = controller(cfg(), TRIGGER);
    assert!(!a.plan(0, 100).merge, "exactly at the threshold: not below");
    h.set(free(TRIGGER - 1));
    assert_eq!(
        a.plan(0, 100),
        RoundPlan {
            pages_to_visit: 100,
            merge: true
        }
    );
    let s = a.status();
    assert!(s.auto_triggered);
    assert_eq!(s.triggered_times, 1);
    assert_eq!(s.trigger_bytes, TRIGGER);
    assert_eq!(s.stop_bytes, STOP);
    assert_eq!(s.free_bytes, TRIGGER - 1);
    assert_eq!(s.total_bytes, TOTAL);
}

#[test]
fn stops_only_above_threshold_plus_sixteenth() {
    let (mut a, h) = triggered(cfg());
    for f in [TRIGGER, TRIGGER + 1, (TRIGGER + STOP) / 2, STOP] {
        h.set(free(f));
        assert!(a.plan(1, 100).merge, "free {f} is not above the stop line");
    }
    h.set(free(STOP + 1));
    assert_eq!(
        a.plan(1, 100),
        RoundPlan {
            pages_to_visit: UNTRIGGERED_PAGES_PER_WAKEUP,
            merge: false
        }
    );
    assert!(!a.status().auto_triggered);
    assert_eq!(a.status().scanning_factor, 1);
}

#[test]
fn noise_between_the_lines_changes_nothing() {
    // Untriggered: noise between the lines never triggers.
    let (mut a, h) = controller(cfg(), STOP + 1);
    assert!(!a.plan(0, 100).merge);
    for i in 0..50 {
        h.set(free(if i % 2 == 0 { TRIGGER } else { STOP }));
        assert!(!a.plan(0, 100).merge);
    }
    assert_eq!(a.status().triggered_times, 0);
    // Triggered: the same noise never stops it.
    h.set(free(TRIGGER - 1));
    assert!(a.plan(0, 100).merge);
    for i in 0..50 {
        h.set(free(if i % 2 == 0 { TRIGGER } else { STOP }));
        assert!(a.plan(1, 100).merge);
    }
    assert_eq!(a.status().triggered_times, 1);
}

#[test]
fn factor_doubles_keeps_and_halves_exactly() {
    let (mut a, _h) = triggered(cfg());
    // First triggered round merged 10, compared with 0: doubles.
    assert_eq!(step(&mut a, 10), 2);
    assert_eq!(step(&mut a, 10), 4, "10 > 10/2");
    assert_eq!(step(&mut a, 5), 4, "5 is not > 10/2");
    assert_eq!(step(&mut a, 3), 8, "3 > 5/2");
    assert_eq!(step(&mut a, 1), 8, "1 is not > 3/2");
    assert_eq!(step(&mut a, 0), 4);
    assert_eq!(step(&mut a, 0), 2);
    assert_eq!(step(&mut a, 0), 1);
    assert_eq!(step(&mut a, 0), 1, "floor 1");
    assert_eq!(a.status().scanning_factor, 1);
}

#[test]
fn factor_is_capped_by_max_scanning_factor() {
    let (mut a, _h) = triggered(cfg());
    let seen: Vec<u64> = (1..=6).map(|i| step(&mut a, 1000 * i)).collect();
    assert_eq!(seen, [2, 4, 8, 16, 16, 16]);
    let (mut a, _h) = triggered(AutoConfig {
        max_scanning_factor: 5,
        ..cfg()
    });
    let seen: Vec<u64> = (1..=4).map(|i| step(&mut a, 1000 * i)).collect();
    assert_eq!(seen, [2, 4, 5, 5]);
    assert_eq!(a.status().effective_max_scanning_factor, 5);
}

#[test]
fn factor_is_capped_by_ram_when_pages_to_scan_grows() {
    let (mut a, _h) = triggered(cfg());
    for i in 1..=4 {
        step(&mut a, 1000 * i);
    }
    assert_eq!(a.status().scanning_factor, 16);
    // A knob so large that two wake-ups' worth would exceed RAM.
    let pages = TOTAL / page_size();
    let big = pages / 2;
    let p = a.plan(1_000_000, big);
    assert_eq!(p.pages_to_visit, big * 2);
    assert_eq!(a.status().effective_max_scanning_factor, 2);
}

#[test]
fn first_round_after_trigger_ignores_checksum_round_and_starts_at_one() {
    let (mut a, h) = controller(cfg(), TOTAL / 2);
    assert!(!a.plan(0, 100).merge);
    h.set(free(TRIGGER - 1));
    // The count passed here belongs to a checksum-only round: ignored.
    assert_eq!(a.plan(12345, 100).pages_to_visit, 100);
    // First triggered round merged nothing: stays 1.
    assert_eq!(step(&mut a, 0), 1);
    // Then merges start: compared with the previous (0), doubles.
    assert_eq!(step(&mut a, 7), 2);
}

#[test]
fn stop_resets_factor_and_retrigger_counts() {
    let (mut a, h) = triggered(cfg());
    step(&mut a, 10);
    step(&mut a, 10);
    assert_eq!(a.status().scanning_factor, 4);
    h.set(free(STOP + 1));
    assert!(!a.plan(10, 100).merge);
    assert_eq!(a.status().scanning_factor, 1);
    h.set(free(TRIGGER - 1));
    assert_eq!(a.plan(0, 100).pages_to_visit, 100);
    h.set(free(STOP + 1));
    assert!(!a.plan(0, 100).merge);
    h.set(free(0));
    assert!(a.plan(0, 100).merge);
    assert_eq!(a.status().triggered_times, 3);
}

#[test]
fn memory_signal_selects_free_or_available() {
    let sample = MemSample {
        total_bytes: TOTAL,
        free_bytes: TRIGGER - 1,
        available_bytes: TOTAL / 2,
        psi: None,
    };
    let mk = |signal| {
        let src = ScriptedSource::new(sample);
        AutoController::new(
            AutoConfig {
                memory_signal: signal,
                ..cfg()
            },
            Box::new(src),
            100,
        )
        .unwrap()
    };
    assert!(!mk(MemorySignal::Available).plan(0, 100).merge);
    assert!(mk(MemorySignal::Free).plan(0, 100).merge);
}

fn with_psi(free_bytes: u64, some_avg10: f64) -> MemSample {
    MemSample {
        psi: Some(Psi {
            some_avg10,
            ..Psi::default()
        }),
        ..free(free_bytes)
    }
}

#[test]
fn sustained_psi_triggers_and_releases_with_hysteresis() {
    let c = AutoConfig {
        psi_trigger: Some(PsiTrigger {
            metric: PsiMetric::SomeAvg10,
            trigger_pct: 10.0,
            sustain_samples: 3,
            release_pct: 5.0,
        }),
        ..cfg()
    };
    let src = ScriptedSource::new(with_psi(TOTAL / 2, 0.0));
    let h = src.handle();
    let mut a = AutoController::new(c, Box::new(src), 100).unwrap();
    // Two high samples, then a dip: not sustained.
    h.push([
        with_psi(TOTAL / 2, 20.0),
        with_psi(TOTAL / 2, 20.0),
        with_psi(TOTAL / 2, 1.0),
        with_psi(TOTAL / 2, 20.0),
        with_psi(TOTAL / 2, 20.0),
    ]);
    for _ in 0..5 {
        assert!(!a.plan(0, 100).merge);
    }
    // Third consecutive high sample: triggered although memory is plentiful.
    h.set(with_psi(TOTAL / 2, 20.0));
    assert!(a.plan(0, 100).merge);
    assert!(a.status().psi_pressure);
    // Between release and trigger: keeps merging.
    h.set(with_psi(TOTAL / 2, 7.0));
    assert!(a.plan(1, 100).merge);
    // Below release, memory above the stop line: stops.
    h.set(with_psi(TOTAL / 2, 4.0));
    assert!(!a.plan(1, 100).merge);
    assert_eq!(a.status().triggered_times, 1);
}

#[test]
fn samples_are_rate_limited() {
    let src = ScriptedSource::new(free(TOTAL / 2));
    let h = src.handle();
    let mut a = AutoController::new(
        AutoConfig {
            sample_interval_ms: 3_600_000,
            ..AutoConfig::default()
        },
        Box::new(src),
        100,
    )
    .unwrap();
    h.set(free(0));
    for _ in 0..10 {
        assert!(!a.plan(0, 100).merge, "must not have re-sampled");
    }
    assert_eq!(h.samples_taken(), 1);
}

struct Failing(u32);
impl MemorySource for Failing {
    fn sample(&mut self) -> Result<MemSample, AutoError> {
        self.0 += 1;
        if self.0 == 1 {
            Ok(free(TRIGGER - 1))
        } else {
            Err(AutoError::Parse {
                what: "test",
                detail: "broken".into(),
            })
        }
    }
}

#[test]
fn failed_samples_keep_the_last_one_and_are_counted() {
    let mut a = AutoController::new(cfg(), Box::new(Failing(0)), 100).unwrap();
    assert!(a.plan(0, 100).merge);
    assert!(a.plan(1, 100).merge);
    let s = a.status();
    assert_eq!(s.sample_errors, 2);
    assert!(s.last_error.unwrap().contains("broken"));
}

#[test]
fn handle_reads_status_and_changes_config_from_another_thread() {
    let (mut a, h) = controller(cfg(), TOTAL / 2);
    let handle = a.handle();
    a.plan(0, 100);
    let t = std::thread::spawn(move || {
        let s = handle.status();
        assert_eq!(s.rounds, 1);
        assert_eq!(s.threshold_pct, 20);
        let e = handle
            .set_config(AutoConfig {
                max_scanning_factor: 0,
                ..cfg()
            })
            .unwrap_err();
        assert!(e.to_string().contains("max_scanning_factor"), "{e}");
        handle
            .set_config(AutoConfig {
                threshold_pct: 60,
                ..cfg()
            })
            .unwrap();
        handle
    });
    let handle = t.join().unwrap();
    assert_eq!(handle.config().threshold_pct, 60);
    // Free memory is 50 %: below the new 60 % threshold.
    h.set(free(TOTAL / 2));
    assert!(a.plan(0, 100).merge);
    let s = handle.status();
    assert_eq!(s.threshold_pct, 60);
    assert_eq!(s.trigger_bytes, TOTAL / 100 * 60 + TOTAL % 100 * 60 / 100);
    assert!(s.auto_triggered);
}

#[test]
fn new_rejects_invalid_config() {
    let src = ScriptedSource::new(free(TOTAL / 2));
    let e = AutoController::new(
        AutoConfig {
            threshold_pct: 150,
            ..cfg()
        },
        Box::new(src),
        100,
    )
    .err()
    .unwrap();
    assert!(matches!(
        e,
        AutoError::Settings(SettingsError::Threshold(150))
    ));
}

#[test]
fn status_serializes() {
    let (a, _h) = controller(cfg(), TOTAL / 2);
    let v = serde_json::to_value(a.status()).unwrap();
    assert_eq!(v["auto_triggered"], false);
    assert_eq!(v["memory_signal"], "available");
    assert_eq!(v["total_bytes"], TOTAL);
    assert_eq!(v["stop_bytes"], STOP);
}
