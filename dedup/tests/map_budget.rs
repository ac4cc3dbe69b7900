//! The VMA budget with the KSM assist enabled: the engine's own merges
//! stay within half of `vm.max_map_count` from its first pass on, the rest
//! being kernel KSM's to take. A scattered group too large for the budget
//! is merged with the layout judgement switched off (and no hand-over), so
//! only the budget stands between the engine and the process limit. Its own
//! test binary: it counts the process's VMAs.

mod common;

use common::*;
use pagefold_dedup::{AssistConfig, AssistMode, DedupBackend, Engine, EngineConfig, Knobs, Mode};

/// Pairs: B's copies sit between pages of B's own, so each of its merges
/// is a pool mapping plus a split of B's guest mapping, 2 x 20,000 VMAs on
/// every kernel, beyond half the default limit. (With B's copies side by
/// side, once all were merged B was one pool VMA per page and nothing
/// else: 21,676 VMAs in all on Linux 6.1, under half the limit, and the
/// budget never had to hold.)
const N: usize = 20_000;

#[test]
fn with_the_assist_enabled_the_engine_keeps_to_half_the_map_limit() {
    let max = pagefold_dedup::mm::max_map_count();
    assert!(
        (N as u64) * 2 > max / 2,
        "vm.max_map_count {max} too large for this test's {N} pairs"
    );
    let (a, b) = (Mem::new(N), Mem::new(2 * N));
    // B holds A's pages in a scattered order (a stride coprime with N) on
    // its even pages, and pages no one else has on its odd ones.
    let at = |i: usize| 2 * ((i * 7919) % N);
    for i in 0..N {
        a.fill(i, i as u64 + 1);
        b.fill(at(i), i as u64 + 1);
        b.fill(2 * i + 1, (1 << 40) + i as u64);
    }
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 20_000,
            sleep_millisecs: 0,
            max_page_sharing: 256,
        },
        assist: AssistConfig {
            mode: AssistMode::Auto,
            // Never judged scattered and never handed over: KSM is not
            // touched, the budget alone limits the engine.
            flip_vmas: u64::MAX,
            flip_deferred: u64::MAX,
            ..AssistConfig::default()
        },
        ..EngineConfig::default()
    })
    .unwrap();
    a.register(&e, "a", "g");
    b.register(&e, "b", "g");
    let vmas0 = pagefold_dedup::mm::vma_count().unwrap();
    let others0 = other_vmas();
    e.set_mode(Mode::On).unwrap();
    e.scan_now(4);
    let s = e.stats();
    let vmas = pagefold_dedup::mm::vma_count().unwrap();
    assert!(s.pages_sharing > 1000, "the engine merged little: {s:?}");
    assert!(s.map_count_limited, "the budget never held: {s:?}");
    assert!(
        vmas <= max / 2,
        "VMAs {vmas0} -> {vmas}, more than half of vm.max_map_count {max} (VMAs \
         outside the pool's and the test's regions: {others0} -> {}): {s:?}",
        other_vmas()
    );
    assert_eq!(s.ksm_pages_sharing, 0, "{s:?}");
    for i in 0..N {
        assert_eq!(a.read(i), pattern(i as u64 + 1), "A page {i}");
        assert_eq!(b.read(at(i)), pattern(i as u64 + 1), "B page");
        assert_eq!(
            b.read(2 * i + 1),
            pattern((1 << 40) + i as u64),
            "B's own page"
        );
    }
    e.shutdown();
}

/// VMAs of this process that map neither the engine's pool nor anonymous
/// memory (thread stacks and malloc arenas are anonymous too, but their
/// guard pages are not readable): what a failure of the budget's bound
/// owes to the rest of the process rather than to the engine's merges.
fn other_vmas() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains("pagefold-pool"))
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 5 || f.get(1).is_some_and(|p| p.starts_with("---"))
        })
        .count()
}
