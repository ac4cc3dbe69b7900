//! A VM created or deleted while the scanner merges a large scattered
//! group waits for a span, not for the whole batch. Its own test binary:
//! its 65,536 scattered merges take most of the process's map-count
//! budget, and an engine test running beside it in one process then
//! found the budget below a quarter and laid its stripes out in full
//! (`wanted_stripe`), failing that test's sqrt-rule count.

mod common;

use std::time::Duration;

use common::*;
use pagefold_dedup::{DedupBackend, Engine, EngineConfig, Knobs, Mode};

/// Registers and unregisters a small region (what creating and deleting a
/// VM do); how long each call took.
fn time_a_small_registration(e: &Engine) -> (Duration, Duration) {
    let c = Mem::new(64);
    c.fill_from(5_000_000);
    let t = std::time::Instant::now();
    let id = c.register(e, "c", "g");
    let reg = t.elapsed();
    let t = std::time::Instant::now();
    e.unregister(id).unwrap();
    (reg, t.elapsed())
}

#[test]
fn registering_memory_waits_for_a_span_not_for_the_scanners_whole_batch() {
    // VM creation and deletion register and unregister memory under the
    // engine's core lock, which the scanner holds for a batch. Two 256 MiB
    // regions holding the same pages in a random order, `pages_to_scan`
    // 20000 at sleep 0: the first batch merged for 1.5 s (release build),
    // and a region registered meanwhile waited all of it. A waiter now gets
    // the core at the next span boundary (one span of up to 4,096 pages
    // merged: ~50-110 ms here).
    use pagefold_dedup::{AssistConfig, AssistMode};
    use std::time::Instant;
    let n = 65536;
    let (a, b, _) = scattered_pair(n);
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 20000,
            sleep_millisecs: 0,
            max_page_sharing: 256,
        },
        // Every merge here is scattered: the engine keeps them (no KSM).
        assist: AssistConfig {
            mode: AssistMode::Off,
            ..AssistConfig::default()
        },
        ..EngineConfig::default()
    })
    .unwrap();
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    e.set_mode(Mode::On).unwrap();
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    // The slowest call: (register, unregister) and when, for the message.
    let mut worst_at = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(4) {
        let at = start.elapsed();
        let (reg, unreg) = time_a_small_registration(&e);
        if reg.max(unreg) > worst {
            worst = reg.max(unreg);
            worst_at = (reg, unreg, at);
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = e.stats();
    eprintln!(
        "worst wait {worst:?} over {rounds} rounds (register {:?}, unregister {:?}, {:?} into the run), {} merges, {} left for waiters",
        worst_at.0,
        worst_at.1,
        worst_at.2,
        s.merges,
        e.left_for_waiters()
    );
    // The scanner was busy merging all along (else nothing was shown).
    assert!(s.merges > 20_000, "{s:?}");
    assert!(
        worst < Duration::from_millis(600),
        "a registration waited {worst:?} for the scanner ({rounds} rounds; register {:?}, unregister {:?}, {:?} into the run): {s:?}",
        worst_at.0,
        worst_at.1,
        worst_at.2
    );
    e.shutdown();
}
