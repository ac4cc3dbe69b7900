//! The engine's seccomp filter lets the KSM assist through. An engine whose
//! threads install the VMM's filters, as `pagefold run` does, hands a
//! scattered group to kernel KSM from its scanner thread (the cooperative
//! lock, `MADV_MERGEABLE`, KSM's knobs written through the journal), KSM
//! merges every pair, and the assist gives KSM back (`MADV_UNMERGEABLE`,
//! knobs restored). The filters run in log mode, so a forbidden syscall is
//! written to a file and fails instead of ending the test binary: the test
//! asserts the file stayed empty. Its own binary: the filter switch and the
//! SIGSYS handler are process-wide.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TempDir;
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};
use pagefold_dedup::{
    AssistConfig, AssistMode, DedupBackend, DedupThread, Engine, EngineConfig, Knobs, Mode,
    RegionSpec, ThreadInit, PAGE_SIZE,
};
use pagefold_vmm::seccomp::{self, ThreadKind};

/// Pages per region: enough single-page merges for the assist to flip.
const N: usize = 4000;

/// A private anonymous mapping of `N` pages, unmapped on drop.
struct Mem(usize);

impl Mem {
    /// Page `i` holds the pattern of `v` (non-zero, unique per `v`).
    fn new(values: impl Fn(usize) -> u64) -> Mem {
        let p = pagefold_dedup::mm::map_anon(N * PAGE_SIZE).unwrap();
        // Base pages, as a guest's memory is merged.
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(p.cast(), N * PAGE_SIZE, libc::MADV_NOHUGEPAGE) };
        for i in 0..N {
            let v = values(i);
            for k in 0..PAGE_SIZE / 8 {
                let w = v.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64) | 1;
                // SAFETY: word k of page i lies inside the mapping.
                unsafe { p.add(i * PAGE_SIZE + k * 8).cast::<u64>().write(w) };
            }
        }
        Mem(p as usize)
    }

    fn spec(&self, owner: &str) -> RegionSpec {
        RegionSpec {
            host_addr: self.0,
            len: N * PAGE_SIZE,
            owner: owner.into(),
            group: "g".into(),
            security: Default::default(),
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: ours, no longer registered (the engine is gone by then)
        // and not used after the drop.
        unsafe { pagefold_dedup::mm::unmap(self.0 as *mut u8, N * PAGE_SIZE) };
    }
}

/// Page `i` of A holds value `i + 1`; B holds the same values with its
/// pages in a fixed pseudo-random order: every merge is a VMA of its own.
fn scattered(i: usize) -> u64 {
    // Multiplying by a number coprime with N permutes 0..N.
    ((i * 2654435761) % N) as u64 + 1
}

#[test]
fn the_ksm_assist_runs_under_the_engine_filter() {
    let _ksm = ksm_exclusive().unwrap();
    let before = snapshot_tunables(Path::new(KSM_SYSFS));
    let dir = TempDir::new("seccomp-assist");
    let log = dir.path("seccomp.log");
    // Before any thread starts: configure reads them once.
    std::env::set_var("PAGEFOLD_SECCOMP_LOG", &log);
    std::env::set_var("PAGEFOLD_RUNTIME_DIR", dir.path("runtime"));
    std::env::remove_var("PAGEFOLD_SECCOMP_SELFTEST");
    seccomp::configure(true).unwrap();
    let init = ThreadInit(Arc::new(|t| {
        let kind = match t {
            DedupThread::Scanner => ThreadKind::Engine,
            DedupThread::FaultHandler => ThreadKind::Fault,
            DedupThread::KsmDriver => ThreadKind::Ksm,
        };
        seccomp::install(kind).unwrap();
    }));
    let e = Engine::new(EngineConfig {
        knobs: Knobs {
            pages_to_scan: 4096,
            sleep_millisecs: 5,
            max_page_sharing: 256,
        },
        assist: AssistConfig {
            mode: AssistMode::Auto,
            flip_vmas: 256,
            flip_group_den: 0,
            // Its groups are far smaller than the VMA budget: judged
            // scattered is enough.
            flip_pass_vmas: Some(0),
            lock_held: true,
            ..AssistConfig::default()
        },
        thread_init: Some(init),
        ..EngineConfig::default()
    })
    .unwrap();
    let a = Mem::new(|i| i as u64 + 1);
    let b = Mem::new(scattered);
    // SAFETY: both mappings outlive the engine (dropped after it below).
    unsafe {
        e.register(a.spec("a")).unwrap();
        e.register(b.spec("b")).unwrap();
    }
    e.set_mode(Mode::On).unwrap();

    let t = Instant::now();
    let mut s = e.stats();
    while !(s.ksm_assist.starts_with("engaged") && s.ksm_pages_sharing > 0)
        && t.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(200));
        s = e.stats();
    }
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(s.ksm_assist.starts_with("engaged: group g"), "{s:?}");
    assert!(s.ksm_pages_sharing > 0, "KSM merged nothing: {s:?}");
    // Handing KSM back (unmerge) runs on the scanner thread too.
    e.set_mode(Mode::Unmerge).unwrap();
    e.shutdown();
    drop(e);
    let logged = logged + &std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(logged, "", "the engine filter refused syscalls");
    assert_eq!(snapshot_tunables(Path::new(KSM_SYSFS)), before);
}
