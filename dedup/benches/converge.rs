//! Quick convergence/CPU measurement of the engine on a 300 MiB region, the
//! two shapes of the KSM baseline (`identical`: every page the same,
//! `distinct`: every page unique but 43; figures belong in
//! docs/benchmarks.md).
//!
//! `cargo bench -p pagefold-dedup --bench converge -- [identical|distinct|scattered] [default|max] [steady_secs]`
//!
//! `... -- [identical|distinct] unmerge [runs]`: unmerge of the merged
//! region by the engine and by kernel KSM (`run` = 2), alternated, in one run
//! (takes the KSM lock; KSM's knobs are journaled and restored).
//!
//! `scattered`: two regions of `PAGEFOLD_SCATTERED_PAGES` pages (default
//! 131072 = 512 MiB each) where the second holds the first's distinct pages
//! in a random order; `PAGEFOLD_ASSIST=auto|off` (default auto) says whether
//! kernel KSM may take what the VMA budget cannot (takes the KSM lock).
//! `PAGEFOLD_BOOST_MAX=1` turns off mode on's scan-rate boost (default 16).
//! or `... -- [identical|distinct] passes [passes]` (per-pass CPU on the
//! calling thread).
//!
//! `... -- teardown [pages]`: two regions holding the same `pages`
//! (default 65536) distinct pages at the same offsets, merged at max
//! effort, then unregistered one after the other: how long each
//! unregister takes (the second frees every pool slot).
//!
//! Converged = `pages_sharing` reached the value it then kept for 3 more
//! full scans (the baseline's definition); reported time and CPU are at the
//! first moment that value was reached.

use std::time::{Duration, Instant};

use pagefold_dedup::{DedupBackend, Engine, EngineConfig, Knobs, Mode, RegionSpec, DEFAULT_KNOBS};

const PS: usize = 4096;
const PAGES: usize = 76800;

/// A fresh private anonymous mapping of `pages` pages, base pages only.
fn anon(pages: usize) -> *mut u64 {
    let p = pagefold_dedup::mm::map_anon(pages * PS).expect("mmap");
    // SAFETY: the mapping just made; MADV_NOHUGEPAGE changes no content.
    unsafe { pagefold_dedup::mm::madvise(p as usize, pages * PS, libc::MADV_NOHUGEPAGE) }
        .expect("madvise");
    p as *mut u64
}

/// Fills page `i` of the mapping at `base` with the content for value `v`
/// (equal values, equal pages).
///
/// # Safety
/// Page `i` of `base` must be inside a writable mapping.
unsafe fn fill_page(base: *mut u64, i: usize, v: u64) {
    for w in 0..PS / 8 {
        // SAFETY: page `i` is inside the mapping (the caller's contract).
        unsafe { *base.add(i * PS / 8 + w) = v.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ w as u64 };
    }
}

fn region(shape: &str) -> usize {
    let base = anon(PAGES);
    for i in 0..PAGES {
        // identical: every page the same non-zero content; distinct: every
        // page unique except 43 equal ones (the baseline's 1 shared / 42).
        let v = if shape == "identical" || i % 1000 == 7 && i < 43_000 {
            0xABCD
        } else {
            i as u64 + 1
        };
        // SAFETY: page i < PAGES of the mapping.
        unsafe { fill_page(base, i, v) };
    }
    base as usize
}

/// Times the unregistering of two merged regions (see the module doc).
fn teardown(n: usize) {
    let fill = || {
        let p = anon(n);
        for i in 0..n {
            // SAFETY: page i < n of the mapping.
            unsafe { fill_page(p, i, i as u64 + 1) };
        }
        p as usize
    };
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 10000,
            sleep_millisecs: 0,
            max_page_sharing: 256,
        },
        ..EngineConfig::default()
    })
    .unwrap();
    let ids: Vec<_> = [fill(), fill()]
        .into_iter()
        .enumerate()
        .map(|(k, addr)| {
            // SAFETY: the mapping stays until the process exits.
            unsafe {
                e.register(RegionSpec {
                    host_addr: addr,
                    len: n * PS,
                    owner: format!("r{k}"),
                    group: "g".into(),
                    security: Default::default(),
                })
                .unwrap()
            }
        })
        .collect();
    e.set_mode(Mode::On).unwrap();
    let t = Instant::now();
    while e.stats().pages_sharing < n as u64 {
        assert!(t.elapsed() < Duration::from_secs(120), "{:?}", e.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    e.set_mode(Mode::Off).unwrap();
    for (k, id) in ids.into_iter().enumerate() {
        let t = Instant::now();
        // SAFETY: the region's memory is not used again.
        unsafe { e.unregister_unmapping(id).unwrap() };
        println!(
            "teardown {n} shared pages: unregister {} {:.1} ms",
            if k == 0 { "first" } else { "last " },
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// Two regions: A with `n` distinct pages, B with A's pages in a seeded
/// random order. Returns their addresses.
fn scattered(n: usize) -> (usize, usize) {
    let (a, b) = (anon(n), anon(n));
    let mut perm: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        perm.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for (i, &j) in perm.iter().enumerate() {
        // SAFETY: i and j (a permutation of 0..n) are pages of the
        // n-page mappings.
        unsafe {
            fill_page(a, i, i as u64 + 1);
            fill_page(b, j, i as u64 + 1);
        }
    }
    (a as usize, b as usize)
}

fn main() {
    let args: Vec<String> = std::env::args().filter(|a| !a.starts_with("--")).collect();
    let shape = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("identical")
        .to_string();
    let preset = args
        .get(2)
        .map(String::as_str)
        .unwrap_or("default")
        .to_string();
    let steady: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    if shape == "teardown" {
        teardown(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(65_536));
        return;
    }
    let knobs = if preset == "max" {
        Knobs {
            pages_to_scan: 10000,
            sleep_millisecs: 0,
            max_page_sharing: 256,
        }
    } else {
        DEFAULT_KNOBS
    };
    let assist = std::env::var("PAGEFOLD_ASSIST").unwrap_or_else(|_| "auto".into());
    let scattered_pages: usize = std::env::var("PAGEFOLD_SCATTERED_PAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(131_072);
    let _ksm_lock = (shape == "scattered" && assist == "auto")
        .then(|| pagefold_dedup::ksm::ksm_exclusive().expect("KSM lock"));
    let (addr, extra) = if shape == "scattered" {
        let (a, b) = scattered(scattered_pages);
        (a, Some(b))
    } else {
        (region(&shape), None)
    };
    let len = if shape == "scattered" {
        scattered_pages * PS
    } else {
        PAGES * PS
    };
    let boost_max = std::env::var("PAGEFOLD_BOOST_MAX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(pagefold_dedup::testing::DEFAULT_BOOST_MAX);
    let e = Engine::new(EngineConfig {
        knobs,
        boost_max,
        assist: pagefold_dedup::AssistConfig {
            mode: assist.parse().expect("PAGEFOLD_ASSIST: auto or off"),
            lock_held: _ksm_lock.is_some(),
            ..Default::default()
        },
        ..EngineConfig::default()
    })
    .unwrap();
    if let Some(b) = extra {
        // SAFETY: the mapping stays until the process exits.
        unsafe {
            e.register(RegionSpec {
                host_addr: b,
                len,
                owner: "b".into(),
                group: "g".into(),
                security: Default::default(),
            })
            .unwrap()
        };
    }
    if preset == "unmerge" {
        unmerge_side_by_side(&shape, knobs);
        return;
    }
    if preset == "passes" {
        // Per-pass cost on the calling thread: pass 1 hashes, pass 2 merges.
        // SAFETY: the mapping stays until the process exits.
        unsafe {
            e.register(RegionSpec {
                host_addr: addr,
                len: PAGES * PS,
                owner: "bench".into(),
                group: "g".into(),
                security: Default::default(),
            })
            .unwrap()
        };
        let cpu = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: valid out-pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
        };
        // [steady_secs] is the number of passes here (default 4).
        let passes = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4u32);
        for pass in 1..=passes {
            let (c, t) = (cpu(), Instant::now());
            e.scan_now(1);
            let s = e.stats();
            println!(
                "{shape} pass {pass}: {:.1} ms CPU ({:.3} us/page), {:.1} ms wall, sharing {}",
                (cpu() - c) * 1e3,
                (cpu() - c) * 1e6 / PAGES as f64,
                t.elapsed().as_secs_f64() * 1e3,
                s.pages_sharing
            );
        }
        return;
    }
    // SAFETY: the mapping stays until the process exits.
    unsafe {
        e.register(RegionSpec {
            host_addr: addr,
            len,
            owner: "bench".into(),
            group: "g".into(),
            security: Default::default(),
        })
        .unwrap()
    };
    let t0 = Instant::now();
    let cpu0 = e.stats().cpu_seconds;
    e.set_mode(Mode::On).unwrap();
    let (mut val, mut since, mut since_scans, mut since_cpu) = (u64::MAX, Duration::ZERO, 0, 0.0);
    let ksm_full_scans = || {
        std::fs::read_to_string("/sys/kernel/mm/ksm/full_scans")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut since_ksm_scans = 0;
    let trace = std::env::var("PAGEFOLD_TRACE").is_ok();
    let mut next_trace = Duration::ZERO;
    loop {
        std::thread::sleep(Duration::from_millis(2));
        let s = e.stats();
        if trace && t0.elapsed() >= next_trace {
            next_trace += Duration::from_millis(500);
            let ksm = |n: &str| {
                std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{n}"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            eprintln!(
                "t={:5.1}s sharing {:6} (ksm {:6}) scans {:3} cpu {:.2} (ksmd {:.2}) vmas {:5} (process {:5}) | ksm run {} pts {} sleep {} full_scans {} sharing {} unshared {} {}",
                t0.elapsed().as_secs_f64(),
                s.pages_sharing,
                s.ksm_pages_sharing,
                s.full_scans,
                s.cpu_seconds - cpu0,
                s.ksm_cpu_seconds,
                s.vmas_created,
                pagefold_dedup::mm::vma_count().unwrap_or(0),
                ksm("run"),
                ksm("pages_to_scan"),
                ksm("sleep_millisecs"),
                ksm("full_scans"),
                ksm("pages_sharing"),
                ksm("pages_unshared"),
                s.ksm_assist
            );
        }
        if s.pages_sharing != val {
            val = s.pages_sharing;
            since = t0.elapsed();
            since_scans = s.full_scans;
            since_cpu = s.cpu_seconds - cpu0;
            since_ksm_scans = ksm_full_scans();
        } else if s.full_scans >= since_scans + 3
            && val > 0
            // KSM needs two of its own scans to merge (checksum, then merge).
            && (!s.ksm_assist.starts_with("engaged") || ksm_full_scans() >= since_ksm_scans + 2)
            || t0.elapsed() > Duration::from_secs(300)
        {
            break;
        }
    }
    let s = e.stats();
    println!(
        "{shape}/{preset}: converged at {:.3} s, engine CPU {:.3} s; pages_shared {} pages_sharing {} pool {} vmas {} \
         (3 more scans seen at {:.2} s, full_scans {}); metadata {:.2} B/page, profit {} MiB; \
         ksm_assist {:?}, ksm sharing {}, ksmd CPU {:.3} s, map_count_limited {}",
        since.as_secs_f64(),
        since_cpu,
        s.pages_shared,
        s.pages_sharing,
        s.pool_pages,
        s.vmas_created,
        t0.elapsed().as_secs_f64(),
        s.full_scans,
        e.metadata_per_page(),
        s.profit_bytes >> 20,
        s.ksm_assist,
        s.ksm_pages_sharing,
        s.ksm_cpu_seconds,
        s.map_count_limited
    );
    // Steady state: nothing changes.
    let (c1, f1, t1) = (e.stats().cpu_seconds, e.stats().full_scans, Instant::now());
    std::thread::sleep(Duration::from_secs(steady));
    let s2 = e.stats();
    let dt = t1.elapsed().as_secs_f64();
    println!(
        "{shape}/{preset}: steady {:.1} s: CPU {:.4} s = {:.3}% of a core, {} full scans",
        dt,
        s2.cpu_seconds - c1,
        (s2.cpu_seconds - c1) / dt * 100.0,
        s2.full_scans - f1
    );
    let t = Instant::now();
    e.set_mode(Mode::Unmerge).unwrap();
    assert!(e.wait_mode(Mode::Off, Duration::from_secs(60)));
    println!(
        "{shape}/{preset}: unmerge of {} pages: {:.3} s",
        s2.pages_sharing + s2.pool_pages,
        t.elapsed().as_secs_f64()
    );
    e.shutdown();
}

/// Times unmerging `PAGES` merged pages: the engine's unmerge, then KSM's
/// (`run` = 2 after KSM merged the same content at max effort), `runs` times.
fn unmerge_side_by_side(shape: &str, knobs: Knobs) {
    use pagefold_dedup::ksm::{self, KsmSysfs};
    let runs: usize = std::env::args()
        .filter(|a| !a.starts_with("--"))
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let _lock = ksm::ksm_exclusive().expect("KSM lock");
    ksm::journal::recover();
    let sys = KsmSysfs::open().expect("KSM sysfs");
    let read = |n: &str| sys.read_u64(n).unwrap_or(0);
    for run in 1..=runs {
        // The engine.
        let addr = region(shape);
        let e = Engine::new(EngineConfig {
            knobs,
            ..EngineConfig::default()
        })
        .unwrap();
        // SAFETY: the mapping stays until it is unmapped below, after the
        // engine is gone.
        unsafe {
            e.register(RegionSpec {
                host_addr: addr,
                len: PAGES * PS,
                owner: "bench".into(),
                group: "g".into(),
                security: Default::default(),
            })
            .unwrap()
        };
        e.scan_now(3);
        let merged = e.stats().pages_sharing + e.stats().pool_pages;
        let t = Instant::now();
        e.set_mode(Mode::Unmerge).unwrap();
        assert!(e.wait_mode(Mode::Off, Duration::from_secs(60)));
        let engine_s = t.elapsed().as_secs_f64();
        e.shutdown();
        drop(e);
        // SAFETY: our mapping, no longer registered.
        unsafe { libc::munmap(addr as *mut libc::c_void, PAGES * PS) };

        // Kernel KSM on the same content.
        let addr = region(shape);
        // SAFETY: our mapping.
        unsafe { libc::madvise(addr as *mut libc::c_void, PAGES * PS, libc::MADV_MERGEABLE) };
        sys.write("pages_to_scan", 10000).unwrap();
        sys.write("sleep_millisecs", 0).unwrap();
        sys.write("run", 1).unwrap();
        let t0 = Instant::now();
        let want = if shape == "identical" { 76000 } else { 40 };
        while ksm::self_ksm_stat()
            .and_then(|s| s.merging_pages)
            .unwrap_or(0)
            < want
            && t0.elapsed() < Duration::from_secs(120)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let ksm_merged = ksm::self_ksm_stat()
            .and_then(|s| s.merging_pages)
            .unwrap_or(0);
        let t = Instant::now();
        sys.write("run", 2).unwrap();
        let ksm_s = t.elapsed().as_secs_f64();
        sys.write("run", 0).unwrap();
        // SAFETY: our mapping.
        unsafe { libc::munmap(addr as *mut libc::c_void, PAGES * PS) };
        println!(
            "{shape} unmerge run {run}: pagefold {merged} pages in {engine_s:.3} s, kernel KSM (run=2) {ksm_merged} pages in {ksm_s:.3} s: ratio {:.2}x (load {})",
            engine_s / ksm_s,
            std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').next().unwrap_or("?"),
        );
        let _ = read("pages_sharing");
    }
    for e in sys.restore() {
        eprintln!("restoring KSM knobs: {e}");
    }
}
