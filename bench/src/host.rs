//! Facts about the host that qualify a measurement: load from other work
//! (the machine is shared with builds), other KSM users, real free memory.
//! The `/proc` files are read with the procfs crate.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use pagefold_dedup::ksm::{self_ksm_stat, snapshot_tunables};
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
/// (`merging_pages` in /proc/self/ksm_stat): after a kernel-KSM run's memory
/// is gone, ksmd drops the stale rmap items on its next pass, and the next
/// run's counters must not start from them.
pub fn wait_ksm_released() {
    let t = Instant::now();
    while self_ksm_stat()
        .and_then(|s| s.merging_pages)
        .is_some_and(|m| m > 0)
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
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
    fn reads_this_hosts_load_and_memory() {
        assert!(load_avg().iter().all(|&a| a >= 0.0));
        assert!(mem_available().is_some_and(|m| m > 0));
    }
}
