//! Per-process KSM figures (`/proc/<pid>/ksm_stat`) and ksmd's CPU time
//! (`/proc/<ksmd>/stat`). `stat` and the process list come from the procfs
//! crate; it has no `ksm_stat` reader, so that small parser stays here.

use std::path::Path;

use procfs::process::{Process, Stat};
use procfs::{FromRead, ProcError};

use super::error::KsmError;

/// `/proc/<pid>/ksm_stat`. Fields are `None` on kernels that lack them
/// (the file itself needs 6.1+, its ksm_merging_pages line 6.6+,
/// ksm_zero_pages 6.10+; [`self_ksm_stat`] reads the merging pages from
/// `/proc/<pid>/ksm_merging_pages`, 5.19+, where the line is missing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessKsmStat {
    /// `ksm_rmap_items`: pages KSM tracks in this process.
    pub rmap_items: Option<u64>,
    /// `ksm_zero_pages`: pages merged with the kernel's zero page.
    pub zero_pages: Option<u64>,
    /// `ksm_merging_pages`: pages merged with KSM pages.
    pub merging_pages: Option<u64>,
    /// `ksm_process_profit`: bytes saved minus KSM's metadata, may be negative.
    pub process_profit: Option<i64>,
}

/// `cow_ksm` of `/proc/vmstat`: copy-on-write breaks of KSM pages, host
/// wide, since boot; `None` where the kernel lacks it (before 5.19, or
/// without CONFIG_KSM).
pub fn cow_ksm() -> Option<u64> {
    let v = procfs::vmstat().ok()?;
    v.get("cow_ksm").and_then(|&n| u64::try_from(n).ok())
}

/// Parses the `name value` lines of `ksm_stat`; unknown lines are ignored
/// (newer kernels add `ksm_merge_any: no` and the like).
pub fn parse_ksm_stat(text: &str) -> ProcessKsmStat {
    let mut s = ProcessKsmStat::default();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(k), Some(v)) = (w.next(), w.next()) else {
            continue;
        };
        match k {
            "ksm_rmap_items" => s.rmap_items = v.parse().ok(),
            "ksm_zero_pages" => s.zero_pages = v.parse().ok(),
            "ksm_merging_pages" => s.merging_pages = v.parse().ok(),
            "ksm_process_profit" => s.process_profit = v.parse().ok(),
            _ => {}
        }
    }
    s
}

/// This process's KSM figures; `None` if the kernel has no `ksm_stat`.
/// Debian 12's 6.1 has the file without its `ksm_merging_pages` line: the
/// count then comes from `/proc/self/ksm_merging_pages`, which it has.
pub fn self_ksm_stat() -> Option<ProcessKsmStat> {
    let mut s = parse_ksm_stat(&std::fs::read_to_string("/proc/self/ksm_stat").ok()?);
    if s.merging_pages.is_none() {
        s.merging_pages = std::fs::read_to_string("/proc/self/ksm_merging_pages")
            .ok()
            .and_then(|t| t.trim().parse().ok());
    }
    Some(s)
}

/// Minor page faults of this whole process so far (`/proc/self/stat`,
/// every thread's, exited ones included). A write that breaks a shared
/// page's copy-on-write in our memory is one, whether a vCPU (through
/// KVM), a device thread or the engine wrote; `None` if unreadable.
pub fn self_minor_faults() -> Option<u64> {
    // A plain read (open, read, close), as the engine thread's seccomp
    // filter allows for the other procfs files it reads.
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    Stat::from_read(text.as_bytes()).ok().map(|s| s.minflt)
}

/// Finds the kernel thread whose comm is exactly `name`.
pub fn find_by_comm(proc_root: &Path, name: &str) -> Option<u32> {
    procfs::process::all_processes_with_root(proc_root)
        .ok()?
        .filter_map(Result::ok)
        .find(|p| p.stat().is_ok_and(|s| s.comm == name))
        .and_then(|p| u32::try_from(p.pid).ok())
}

/// utime + stime in clock ticks from the text of `/proc/<pid>/stat`
/// (procfs's parser: the comm field may contain spaces and parentheses).
pub fn parse_stat_ticks(text: &str) -> Result<u64, KsmError> {
    let stat = Stat::from_read(text.as_bytes()).map_err(|e| KsmError::Parse {
        what: "/proc/<pid>/stat".into(),
        detail: e.to_string(),
    })?;
    Ok(stat.utime + stat.stime)
}

/// Clock ticks per second for `/proc/<pid>/stat` times.
pub fn clock_ticks() -> f64 {
    procfs::ticks_per_second() as f64
}

/// CPU seconds (user + system) `pid` has used.
pub fn cpu_seconds(pid: u32) -> Result<f64, KsmError> {
    let path = format!("/proc/{pid}/stat");
    let stat = i32::try_from(pid)
        .map_err(|_| ProcError::NotFound(None))
        .and_then(Process::new)
        .and_then(|p| p.stat())
        .map_err(|e| KsmError::Sysfs {
            op: "reading",
            path: path.into(),
            source: io_error(e),
        })?;
    Ok((stat.utime + stat.stime) as f64 / clock_ticks())
}

/// A procfs error as the `io::Error` our error enum carries, keeping the
/// kind callers may test (not found: the process exited).
fn io_error(e: ProcError) -> std::io::Error {
    use std::io::{Error, ErrorKind};
    match e {
        ProcError::Io(inner, _) => inner,
        ProcError::NotFound(_) => Error::new(ErrorKind::NotFound, e),
        ProcError::PermissionDenied(_) => Error::new(ErrorKind::PermissionDenied, e),
        other => Error::new(ErrorKind::InvalidData, other),
    }
}

/// `KPF_KSM` in `/proc/kpageflags`.
const KPF_KSM: u64 = 1 << 21;

/// Counts the pages of `addr..addr+len` (this process) that are KSM pages
/// right now, from `/proc/self/pagemap` and `/proc/kpageflags` (root only).
/// Exact, unlike `ksm_merging_pages`, which lags after an unmerge or
/// unregister until ksmd's next pass; but it costs one `pread` per present
/// page (tens of ms for 300 MiB): for tests and end-of-run checks.
///
/// Hand-written rather than procfs's `KPageFlags`: that one reads through
/// an 8 KiB `BufReader` that every seek discards, so the kernel computes the
/// flags of 1024 PFNs per lookup, hundreds of times the work of these
/// 8-byte `pread`s on scattered pages.
pub fn count_ksm_pages(addr: usize, len: usize) -> Result<u64, KsmError> {
    use std::os::unix::fs::FileExt;
    let open = |p: &str| {
        std::fs::File::open(p).map_err(|source| KsmError::Sysfs {
            op: "opening",
            path: p.into(),
            source,
        })
    };
    let read_err = |p: &str| {
        let p = p.to_string();
        move |source| KsmError::Sysfs {
            op: "reading",
            path: p.into(),
            source,
        }
    };
    let page = crate::auto::page_size() as usize;
    let pagemap = open("/proc/self/pagemap")?;
    let kflags = open("/proc/kpageflags")?;
    let pages = len / page;
    let mut entries = vec![0u8; pages * 8];
    pagemap
        .read_exact_at(&mut entries, (addr / page * 8) as u64)
        .map_err(read_err("/proc/self/pagemap"))?;
    let mut n = 0;
    for e in entries.chunks_exact(8) {
        let e = u64::from_ne_bytes(e.try_into().expect("8-byte chunk"));
        if e & (1 << 63) == 0 {
            continue;
        }
        let pfn = e & ((1 << 55) - 1);
        let mut f = [0u8; 8];
        kflags
            .read_exact_at(&mut f, pfn * 8)
            .map_err(read_err("/proc/kpageflags"))?;
        if u64::from_ne_bytes(f) & KPF_KSM != 0 {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cow_ksm_is_read_where_the_kernel_has_it() {
        let text = std::fs::read_to_string("/proc/vmstat").unwrap();
        let line = text.lines().find_map(|l| l.strip_prefix("cow_ksm "));
        match (line, cow_ksm()) {
            (Some(v), Some(n)) => assert!(n >= v.trim().parse::<u64>().unwrap()),
            (None, None) => {}
            other => panic!("/proc/vmstat and cow_ksm() disagree: {other:?}"),
        }
    }

    #[test]
    fn merging_pages_are_known_on_every_kernel_with_ksm_stat() {
        // 6.1 lacks the line but has the file beside it: one of the two
        // answers wherever ksm_stat exists.
        if std::path::Path::new("/proc/self/ksm_stat").exists() {
            assert!(self_ksm_stat().unwrap().merging_pages.is_some());
        }
    }

    #[test]
    fn parses_ksm_stat() {
        let t = "ksm_rmap_items 7\nksm_zero_pages 2\nksm_merging_pages 5\n\
                 ksm_process_profit -12\nksm_merge_any: no\nksm_mergeable: yes\n";
        assert_eq!(
            parse_ksm_stat(t),
            ProcessKsmStat {
                rmap_items: Some(7),
                zero_pages: Some(2),
                merging_pages: Some(5),
                process_profit: Some(-12)
            }
        );
        assert_eq!(parse_ksm_stat("ksm_rmap_items 3\n").merging_pages, None);
    }

    #[test]
    fn stat_ticks_survive_odd_comm() {
        let t = "37 (ksm d) (x)) S 2 0 0 0 -1 2129984 0 0 0 0 150 270 0 0 25 5 1 0 7 0 0 \
                 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_stat_ticks(t).unwrap(), 420);
        assert!(parse_stat_ticks("37 ksmd S").is_err());
    }

    #[test]
    fn finds_ksmd_and_reads_its_cpu() {
        // Every kernel with KSM has a ksmd thread.
        if !Path::new("/sys/kernel/mm/ksm").exists() {
            return;
        }
        let pid = find_by_comm(Path::new("/proc"), "ksmd").expect("ksmd thread");
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
        assert_eq!(find_by_comm(Path::new("/proc"), "no-such-thread-xyz"), None);
    }

    #[test]
    fn own_cpu_grows() {
        let me = std::process::id();
        let a = cpu_seconds(me).unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 120 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_seconds(me).unwrap() > a);
    }
}
