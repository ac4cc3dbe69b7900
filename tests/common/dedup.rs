//! In-process helpers for dedup tests on live VMs: a runner with the real
//! backend, and an oracle that reads guest memory and the kernel's pagemap.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use pagefold_dedup::{Mode, Stats};
use pagefold_guest_abi::classes::{slot_content, Content, DataLayout, SlotUse};
use pagefold_guest_abi::expect::{Expectation, VmState};
use pagefold_guest_abi::generator::{check_page, PageWords};
use pagefold_vmm::config::Config;
use pagefold_vmm::runner::Runner;
use pagefold_vmm::vm::Vm;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

pub const PAGE: usize = 4096;

/// The live-VM dedup tests check the engine's exact sharing and settle on
/// its full scans: unless a test's config names `ksm_assist`, the KSM assist
/// is off here (kernel KSM's own pace and a host-global lock would make them
/// depend on other KSM users). The assist is tested in dedup/tests/assist.rs
/// and torture.rs (with writers) and by the scattered benchmark.
fn engine_only(cfg_toml: &str, mut cfg: Config) -> Config {
    if !cfg_toml.contains("ksm_assist") {
        cfg.dedup.ksm_assist = pagefold_dedup::AssistMode::Off;
    }
    cfg
}

/// Builds a runner with the backend the config asks for, and starts its VMs.
pub fn start(cfg_toml: &str) -> Runner {
    super::require_kvm();
    let cfg: Config = toml::from_str(cfg_toml).expect("test config");
    let cfg = engine_only(cfg_toml, cfg);
    cfg.validate(None).expect("valid test config");
    let dedup = pagefold_vmm::dedup::create(&cfg, true).expect("dedup backend");
    let mut runner = Runner::with_dedup(dedup, true).expect("runner");
    runner.echo = false;
    runner.start_all(&cfg).expect("start VMs");
    runner
}

/// As [`start`], with auto mode reading a scripted host-memory source.
pub fn start_with_source(
    cfg_toml: &str,
    source: Box<dyn pagefold_dedup::auto::MemorySource>,
) -> Runner {
    super::require_kvm();
    let cfg: Config = toml::from_str(cfg_toml).expect("test config");
    let cfg = engine_only(cfg_toml, cfg);
    cfg.validate(None).expect("valid test config");
    let dedup = pagefold_vmm::dedup::create_backend_with_source(&cfg, true, Some(source))
        .expect("dedup backend");
    let mut runner = Runner::with_dedup(dedup, true).expect("runner");
    runner.echo = false;
    runner.start_all(&cfg).expect("start VMs");
    runner
}

/// Polls `cond` every 20 ms (taking in guest reports) until it holds.
pub fn wait_for(
    r: &mut Runner,
    what: &str,
    limit: Duration,
    mut cond: impl FnMut(&Runner) -> bool,
) {
    let end = Instant::now() + limit;
    while !cond(r) {
        assert!(
            Instant::now() < end,
            "timed out after {limit:?} waiting for {what}"
        );
        r.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stats(r: &Runner) -> Stats {
    r.dedup().expect("backend").stats()
}

pub fn set_mode(r: &Runner, m: Mode) {
    r.dedup().expect("backend").set_mode(m).expect("set mode");
}

/// Waits until every VM's guest has reported `phases` finished phases (it
/// then sits in its next phase, e.g. a WAIT_HOST gate).
pub fn wait_phases(r: &mut Runner, phases: usize, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let done = r.vms().iter().all(|v| {
            r.summary(v.name())
                .map(|s| s.phases.len() >= phases)
                .unwrap_or(false)
        });
        if done {
            return;
        }
        assert!(
            Instant::now() < end,
            "guests did not finish {phases} phases in {limit:?}"
        );
        for v in r.vms() {
            assert!(
                !v.is_stopping(),
                "VM {} stopped early: {:?}",
                v.name(),
                v.info().outcome
            );
        }
        r.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `pages_sharing` and `zero_pages` hold still over `scans`
/// more full scans; returns the settled stats.
pub fn wait_settled(r: &Runner, scans: u64, limit: Duration) -> Stats {
    let end = Instant::now() + limit;
    let mut last = stats(r);
    let mut since = last.full_scans;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let s = stats(r);
        if (s.pages_sharing, s.zero_pages, s.pages_shared)
            != (last.pages_sharing, last.zero_pages, last.pages_shared)
        {
            since = s.full_scans;
        } else if s.full_scans >= since + scans && s.pages_sharing > 0 {
            return s;
        }
        last = s;
        assert!(
            Instant::now() < end,
            "dedup did not settle within {limit:?}: {last:?}"
        );
    }
}

/// Releases the guests' gates, runs the VMs to their end, and requires every
/// guest to have verified its memory with no mismatch and exited with 0.
pub fn finish_ok(mut r: Runner) {
    release(&r);
    let report = r.run(|_| {}).expect("run");
    for v in &report.vms {
        assert_eq!(v.exit_status, Some(0), "{} {:?}", v.name, v.outcome);
        assert_eq!(
            v.mismatches, 0,
            "{}: guest memory changed under dedup",
            v.name
        );
        assert!(
            v.phases.iter().any(|p| p.phase == "verify"),
            "{} did not verify",
            v.name
        );
    }
}

/// Releases every VM's WAIT_HOST gate.
pub fn release(r: &Runner) {
    for v in r.vms() {
        v.workload_control().expect("workload VM").release_gate();
    }
}

/// One page of a VM, as the oracle sees it.
#[derive(Debug, Clone, Copy)]
pub struct PageView {
    pub host: usize,
    pub in_data: bool,
    pub zero: bool,
    pub hash: u64,
    pub pfn: u64,
    /// Mapped from a file (the engine's pool) rather than anonymous memory.
    pub file: bool,
    /// What the page is in the workload's data area (through its
    /// placement), if it is in one.
    pub slot_use: Option<SlotUse>,
    /// For a data-area slot whose content the ABI predicts (not a record
    /// page, not disk data of unknown content): whether the page holds
    /// exactly that content, as of FILL and DISK_READ with no churn.
    pub as_predicted: Option<bool>,
}

fn pagemap() -> File {
    File::open("/proc/self/pagemap").expect("pagemap")
}

fn pm_entry(f: &File, addr: usize) -> u64 {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (addr / PAGE) as u64 * 8)
        .expect("pagemap read");
    u64::from_le_bytes(b)
}

/// Of the anonymous VMAs that start in a VM's RAM: how many there are and
/// how many say `nh` (`MADV_NOHUGEPAGE`) in `/proc/self/smaps`. Merges
/// and zero drops add VMAs of their own (pool file mappings, fresh
/// anonymous ones), so a caller counts, not requires all.
#[allow(dead_code)]
pub fn anon_vmas_without_huge_pages(vm: &Vm) -> (usize, usize) {
    let ranges = vm.ram_host_ranges();
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read smaps");
    let (mut anon, mut nh) = (0, 0);
    let mut inside_anon = false;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, _)) = first.split_once('-').filter(|(a, b)| {
            usize::from_str_radix(a, 16).is_ok() && usize::from_str_radix(b, 16).is_ok()
        }) {
            let start = usize::from_str_radix(a, 16).unwrap();
            // Fields: perms, offset, device, inode, [path].
            let inode = f.nth(3).unwrap_or("0");
            inside_anon = inode == "0" && ranges.iter().any(|&(s, l)| start >= s && start < s + l);
            anon += usize::from(inside_anon);
        } else if inside_anon && first == "VmFlags:" {
            nh += usize::from(f.any(|flag| flag == "nh"));
        }
    }
    (anon, nh)
}

/// The zero page's PFN, as a read of untouched anonymous memory maps it.
pub fn zero_pfn() -> u64 {
    let pm = pagefold_dedup::pagemap::Pagemap::open().expect("open pagemap");
    pagefold_dedup::mm::zero_pfn(&pm)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Reads (and so faults in, read-only) every page of a VM's RAM and returns
/// what the oracle needs. Reads never break a merge.
pub fn view(vm: &Vm) -> Vec<PageView> {
    let pm = pagemap();
    let params = vm.workload_params();
    let layout = params.map(|p| DataLayout::new(p).expect("layout"));
    let mem = vm.memory();
    let mut out = Vec::new();
    for region in mem.iter() {
        let base = region.start_addr().0;
        let host = mem
            .get_host_address(GuestAddress(base))
            .expect("host address") as usize;
        for off in (0..region.len() as usize).step_by(PAGE) {
            let gpa = base + off as u64;
            let h = host + off;
            // SAFETY: `h` is a page of this VM's live guest memory mapping;
            // a racy read of guest memory is fine for a byte snapshot.
            let bytes = unsafe { std::slice::from_raw_parts(h as *const u8, PAGE) };
            let snapshot = bytes.to_vec();
            let e = pm_entry(&pm, h);
            // The placement decides which slot holds which page: ask the
            // layout, never assume logical order.
            let slot = layout.and_then(|l| l.gpa_slot(gpa).map(|s| (l, s)));
            let slot_use = slot.map(|(l, s)| l.slot_use(s));
            let in_data = matches!(slot_use, Some(SlotUse::Page(_) | SlotUse::Disk(_)));
            let as_predicted = slot.and_then(|(l, s)| {
                let p = params.expect("params of a workload VM");
                slot_content(p, &l, s, 0).map(|c| matches_content(&snapshot, c))
            });
            out.push(PageView {
                host: h,
                in_data,
                zero: snapshot.iter().all(|&b| b == 0),
                hash: fnv(&snapshot),
                pfn: e & ((1 << 55) - 1),
                file: e >> 61 & 1 == 1,
                slot_use,
                as_predicted,
            });
        }
    }
    out
}

/// Whether page bytes are exactly `c`.
fn matches_content(bytes: &[u8], c: Content) -> bool {
    match c {
        Content::Zero => bytes.iter().all(|&b| b == 0),
        Content::Pattern(base) => {
            let mut words: PageWords = [0; 512];
            for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            check_page(&words, base)
        }
    }
}

/// What a perfect dedup frees among non-zero pages: pages beyond the first
/// of each content.
pub fn ideal_sharing<'a>(pages: impl Iterator<Item = &'a PageView>) -> u64 {
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut n = 0;
    for p in pages.filter(|p| !p.zero) {
        *counts.entry(p.hash).or_default() += 1;
        n += 1;
    }
    n - counts.len() as u64
}

/// Distinct physical frames among non-zero pages.
pub fn distinct_frames<'a>(pages: impl Iterator<Item = &'a PageView>) -> u64 {
    let mut f: Vec<u64> = pages.filter(|p| !p.zero).map(|p| p.pfn).collect();
    f.sort_unstable();
    f.dedup();
    f.len() as u64
}

/// The data layout (with its placement) of a workload VM.
pub fn layout(vm: &Vm) -> DataLayout {
    DataLayout::new(vm.workload_params().expect("workload VM")).expect("layout")
}

/// The ABI's prediction for the data areas of `vms` (no churn).
pub fn expectation(vms: &[&Vm]) -> Expectation {
    let states: Vec<VmState<'_>> = vms
        .iter()
        .map(|v| VmState {
            params: v.workload_params().expect("workload VM"),
            churn_writes: 0,
        })
        .collect();
    Expectation::compute(&states).expect("expectation")
}
