//! Facts about the host that qualify a measurement: its kind and kernel,
//! load from other work (the machine is shared with builds), other KSM
//! users, real free memory.
//! The `/proc` files are read with the procfs crate.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use pagefold_dedup::ksm::{
    ksm_exclusive, self_ksm_stat, snapshot_tunables, KsmExclusive, KsmSysfs, KSM_SYSFS,
};

use crate::error::BenchError;
use procfs::{Current, LoadAverage, Meminfo};

/// `/proc/loadavg`'s 1, 5 and 15 minute averages (zeros if unreadable).
pub fn load_avg() -> [f64; 3] {
    LoadAverage::current().map_or([0.0; 3], |l| averages(&l))
}

/// procfs reads the averages as `f32`; the kernel prints two decimals, so
/// rounding to two decimals gives the printed value back exactly as an
/// `f64` (reports show 1.4, not 1.399999976158142).
fn averages(l: &LoadAverage) -> [f64; 3] {
    [l.one, l.five, l.fifteen].map(|a| (f64::from(a) * 100.0).round() / 100.0)
}

/// The host kernel's release (`/proc/sys/kernel/osrelease`; empty if
/// unreadable): KSM's behaviour and KVM's cost change between kernels, so
/// a row says which one it ran on.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The host a row ran on. Times under an emulated host, or on PVM, are
/// not a hardware host's and compare only within one run, so
/// every benchmark row records this next to its figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostId {
    /// `hardware`, `pvm`, `emulated-svm` or `other`
    /// ([`pagefold_vmm::host_kind::HostKind::name`]).
    pub kind: String,
    /// [`kernel_release`].
    pub kernel: String,
    /// `vm.max_map_count` ([`pagefold_dedup::mm::max_map_count`]: the
    /// kernel's default, 65530, if unreadable): the engine's VMA budget,
    /// so whether scattered merges stay with it or go to kernel KSM.
    pub max_map_count: u64,
}

impl HostId {
    /// This host, as rows record it.
    pub fn current() -> Self {
        Self {
            kind: pagefold_vmm::host_kind::host_kind().name().to_string(),
            kernel: kernel_release(),
            max_map_count: pagefold_dedup::mm::max_map_count(),
        }
    }
}

/// The line a report prints once to say where its rows ran, from each
/// row's (`host_kind`, `host_kernel`): "host pvm (Linux 6.18.0)". Rows
/// of one run share their host; rows put together from several runs may
/// not, and then the line lists each host once ("hosts differ: ...") so a
/// reader does not compare their times. Rows written before the host was
/// recorded (an empty kind) say nothing; None when no row names a host.
pub fn host_line<'a>(hosts: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for h in hosts {
        if !h.0.is_empty() && !seen.contains(&h) {
            seen.push(h);
        }
    }
    let name = |(kind, kernel): &(&str, &str)| format!("{kind} (Linux {kernel})");
    match seen.as_slice() {
        [] => None,
        [one] => Some(format!("host {}", name(one))),
        many => Some(format!(
            "hosts differ: {}",
            many.iter().map(name).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Interrupts of the kinds in `/proc/interrupts` that a merger makes
/// other CPUs take, summed over CPUs: `TLB` (TLB shootdowns: every change
/// to the VMM's page tables, a remap or a write protection, flushes the
/// TLBs of the CPUs running its vCPUs, each one an exit from the guest)
/// and `RES` (rescheduling: threads woken on other CPUs). None where the
/// file or the line is missing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ipis {
    pub tlb_shootdowns: u64,
    pub reschedules: u64,
}

impl Ipis {
    /// Now.
    pub fn current() -> Option<Ipis> {
        parse_ipis(&std::fs::read_to_string("/proc/interrupts").ok()?)
    }

    /// Those taken since `before`.
    pub fn since(self, before: Ipis) -> Ipis {
        Ipis {
            tlb_shootdowns: self.tlb_shootdowns.saturating_sub(before.tlb_shootdowns),
            reschedules: self.reschedules.saturating_sub(before.reschedules),
        }
    }
}

/// [`Ipis`] from the text of `/proc/interrupts`: a line `TLB: n0 n1 ...
/// TLB shootdowns` holds one count per CPU before its description.
fn parse_ipis(text: &str) -> Option<Ipis> {
    let sum = |name: &str| -> Option<u64> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name}:")))?;
        let counts = line.trim_start()[name.len() + 1..]
            .split_whitespace()
            .map_while(|w| w.parse::<u64>().ok());
        Some(counts.sum())
    };
    Some(Ipis {
        tlb_shootdowns: sum("TLB")?,
        reschedules: sum("RES")?,
    })
}

/// `MemAvailable` of `/proc/meminfo` in bytes.
pub fn mem_available() -> Option<u64> {
    Meminfo::current().ok()?.mem_available
}

/// Other processes using KSM make host-wide counters and scan times
/// include their pages.
pub fn other_ksm_users() -> Vec<String> {
    let me = std::process::id();
    let Ok(procs) = procfs::process::all_processes() else {
        return Vec::new();
    };
    procs
        .filter_map(Result::ok)
        .filter(|p| u32::try_from(p.pid).ok() != Some(me))
        .filter_map(|p| {
            // procfs has no ksm_stat reader: the engine's parser reads it.
            let text = std::fs::read_to_string(format!("/proc/{}/ksm_stat", p.pid)).ok()?;
            let s = pagefold_dedup::ksm::parse_ksm_stat(&text);
            let mergeable = text.lines().any(|l| l.trim() == "ksm_mergeable: yes");
            (mergeable || s.merging_pages.unwrap_or(0) > 0).then(|| {
                let comm = p.stat().map(|s| s.comm).unwrap_or_default();
                format!("{} ({comm})", p.pid)
            })
        })
        .collect()
}

/// Waits (at most 30 s) until ksmd no longer counts pages of this process
/// (`merging_pages` in /proc/self/ksm_stat), then drops this process's
/// leftover rmap items ([`drain_ksm_items`]): after a kernel-KSM run's
/// memory is gone, the next run's counters must not start from the old
/// ones, nor its pages from the old pages' smart-scan ages.
pub fn wait_ksm_released() {
    let t = Instant::now();
    while self_ksm_stat()
        .and_then(|s| s.merging_pages)
        .is_some_and(|m| m > 0)
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    drain_ksm_items();
}

/// Rmap items KSM still keeps for this process.
fn rmap_items() -> u64 {
    self_ksm_stat().and_then(|s| s.rmap_items).unwrap_or(0)
}

/// Lets ksmd scan until this process has no rmap items left (at most
/// 10 s), with every knob restored afterwards. Call it only when none of
/// the process's memory is mergeable any more.
///
/// KSM keeps a process's rmap items, with their smart-scan ages, after the
/// memory is unmapped, until ksmd next scans the process, and memory mapped
/// at the same address inherits them (scripts/probes/ksm_stale_rmap.c). A
/// kernel-KSM system's backend puts `run` back to 0 when it shuts down,
/// which can be before ksmd came round: after `ksm-default` in the build
/// benchmark 300 to 7,400 items were left, and the first `ksm-10000` run's VMs,
/// whose RAM the kernel maps at the same addresses, inherited them. With
/// no mergeable memory left, one pass of ksmd over the process drops them
/// all.
pub fn drain_ksm_items() {
    let stale = rmap_items();
    if stale == 0 {
        return;
    }
    // The benchmark holds the KSM lock; the writes are journaled, and the
    // knobs go back when `sysfs` drops.
    let Ok(sysfs) = KsmSysfs::open() else {
        return;
    };
    let pace = sysfs
        .write("pages_to_scan", 10_000)
        .and_then(|()| sysfs.write("sleep_millisecs", 0))
        .and_then(|()| sysfs.write("run", 1));
    if let Err(e) = pace {
        log::warn!("bench: could not run ksmd to drop stale rmap items: {e}");
        return;
    }
    let t = Instant::now();
    while rmap_items() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = rmap_items();
    if left > 0 {
        log::warn!("bench: {left} KSM rmap items of this process left after 10 s");
    } else {
        log::info!(
            "bench: ksmd dropped {stale} stale rmap items in {:?}",
            t.elapsed()
        );
    }
}

/// A benchmark's hold on kernel KSM, for all of its systems: the lock that
/// keeps other KSM users (tests, other benchmarks) out, and the tunables as
/// the run found them.
pub struct KsmSession {
    _lock: KsmExclusive,
    before: BTreeMap<String, String>,
}

impl KsmSession {
    /// Takes the lock; knobs a killed pagefold (an earlier benchmark
    /// included) left changed go back before the tunables are recorded:
    /// they are not the host's settings.
    pub fn start() -> Result<KsmSession, BenchError> {
        let lock = ksm_exclusive()?;
        pagefold_dedup::ksm::journal::recover();
        Ok(KsmSession {
            _lock: lock,
            before: snapshot_tunables(Path::new(KSM_SYSFS)),
        })
    }

    /// Ends the hold: the tunables no longer as found
    /// ([`unrestored_tunables`]), checked before the lock goes.
    pub fn finish(self) -> Vec<String> {
        unrestored_tunables(Path::new(KSM_SYSFS), &self.before)
    }
}

/// The KSM tunables under `root` that are no longer what `before` (a
/// [`snapshot_tunables`] taken before a benchmark) recorded, one line each
/// ("name: was .., now ..").
pub fn unrestored_tunables(root: &Path, before: &BTreeMap<String, String>) -> Vec<String> {
    let after = snapshot_tunables(root);
    before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: was {v:?}, now {:?}", after.get(k)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::FromRead;

    #[test]
    fn load_averages_keep_the_printed_decimals() {
        let l = LoadAverage::from_read("1.40 2.63 3.36 2/345 6789\n".as_bytes()).unwrap();
        assert_eq!(averages(&l), [1.40, 2.63, 3.36]);
    }

    #[test]
    fn draining_drops_the_rmap_items_of_unmapped_memory_and_restores_the_knobs() {
        use pagefold_dedup::ksm::{ksm_exclusive, KSM_SYSFS};
        let _ksm = ksm_exclusive().unwrap();
        let root = Path::new(KSM_SYSFS);
        let before = snapshot_tunables(root);
        // 256 distinct pages that KSM scans (and keeps rmap items for)...
        let len = 256 * 4096;
        let p = pagefold_dedup::mm::map_anon(len).unwrap();
        for i in 0..len / 8 {
            // SAFETY: word i lies inside the mapping.
            unsafe { p.cast::<u64>().add(i).write(i as u64 | 1 << 40) };
        }
        let sysfs = KsmSysfs::open().unwrap();
        // SAFETY: advice on our own mapping.
        let r = unsafe { libc::madvise(p.cast(), len, libc::MADV_MERGEABLE) };
        assert_eq!(r, 0);
        sysfs.write("pages_to_scan", 10_000).unwrap();
        sysfs.write("sleep_millisecs", 0).unwrap();
        sysfs.write("run", 1).unwrap();
        let t = Instant::now();
        while rmap_items() < 256 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // ...then KSM stopped and the memory gone, as a backend leaves it.
        drop(sysfs);
        // SAFETY: exactly the test's own mapping, which it no longer uses.
        unsafe { pagefold_dedup::mm::unmap(p, len) };
        assert!(rmap_items() >= 256, "{:?}", self_ksm_stat());
        drain_ksm_items();
        assert_eq!(rmap_items(), 0);
        assert_eq!(unrestored_tunables(root, &before), Vec::<String>::new());
    }

    #[test]
    fn names_the_rows_host_once_or_says_they_differ() {
        assert_eq!(host_line([]), None);
        let same = [("pvm", "6.18.0"), ("pvm", "6.18.0")];
        assert_eq!(host_line(same).as_deref(), Some("host pvm (Linux 6.18.0)"));
        let mixed = [("pvm", "6.18.0"), ("hardware", "6.1.0"), ("pvm", "6.18.0")];
        assert_eq!(
            host_line(mixed).as_deref(),
            Some("hosts differ: pvm (Linux 6.18.0), hardware (Linux 6.1.0)")
        );
        // Rows from before the host was recorded name none.
        assert_eq!(host_line([("", ""), ("", "")]), None);
        let partly = [("", ""), ("pvm", "6.18.0")];
        assert_eq!(
            host_line(partly).as_deref(),
            Some("host pvm (Linux 6.18.0)")
        );
        let h = HostId::current();
        assert!(
            ["hardware", "pvm", "emulated-svm", "other"].contains(&h.kind.as_str()),
            "{h:?}"
        );
        assert_eq!(h.kernel, kernel_release());
    }

    #[test]
    fn reads_this_hosts_load_and_memory() {
        assert!(load_avg().iter().all(|&a| a >= 0.0));
        assert!(mem_available().is_some_and(|m| m > 0));
        // e.g. 6.1.0-28-cloud-amd64: digits first, no newline.
        let r = kernel_release();
        assert!(r.starts_with(|c: char| c.is_ascii_digit()), "{r:?}");
        assert_eq!(r.trim(), r);
    }

    #[test]
    fn sums_shootdowns_and_reschedules_over_cpus() {
        let text = "           CPU0       CPU1\n  0:         40          0   IO-APIC   2-edge      timer\n\
                    RES:       1200         34   Rescheduling interrupts\n\
                    CAL:         10         11   Function call interrupts\n\
                    TLB:        500          7   TLB shootdowns\n";
        let i = parse_ipis(text).unwrap();
        assert_eq!((i.tlb_shootdowns, i.reschedules), (507, 1234));
        let later = Ipis {
            tlb_shootdowns: 600,
            reschedules: 1234,
        };
        assert_eq!(later.since(i).tlb_shootdowns, 93);
        assert_eq!(parse_ipis("CPU0\nRES: 5 Rescheduling\n"), None);
    }
}
