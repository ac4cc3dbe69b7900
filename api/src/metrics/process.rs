//! The standard `process_*` figures of Prometheus' client libraries, read
//! from /proc/self at each scrape (the API threads' seccomp filter allows
//! reading /proc).

use procfs::process::{LimitValue, Process};

/// The process's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessFigures {
    /// User plus system CPU time of every thread.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    /// Seconds since the Unix epoch.
    pub start_time_seconds: f64,
    pub open_fds: u64,
    /// None when unlimited.
    pub max_fds: Option<u64>,
}

/// The figures of this process; None if /proc cannot be read (the
/// families are then left out of the scrape rather than reported as 0).
pub fn sample() -> Option<ProcessFigures> {
    let me = Process::myself().ok()?;
    let stat = me.stat().ok()?;
    let ticks = procfs::ticks_per_second() as f64;
    let boot = procfs::boot_time_secs().ok()? as f64;
    let max_fds = match me.limits().ok()?.max_open_files.soft_limit {
        LimitValue::Value(n) => Some(n),
        LimitValue::Unlimited => None,
    };
    Some(ProcessFigures {
        cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
        resident_bytes: stat.rss * procfs::page_size(),
        virtual_bytes: stat.vsize,
        start_time_seconds: boot + stat.starttime as f64 / ticks,
        open_fds: me.fd_count().ok()? as u64,
        max_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures agree with what this test process can check by other
    /// means: it started before now and after boot, it has open files,
    /// and its resident memory grows by what it touches.
    #[test]
    fn figures_of_this_process_are_plausible() {
        let before = sample().expect("/proc/self");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(before.start_time_seconds <= now + 1.0, "{before:?}");
        assert!(before.start_time_seconds > now - 3600.0, "{before:?}");
        assert!(before.open_fds >= 3, "{before:?}");
        assert!(before.virtual_bytes > before.resident_bytes, "{before:?}");
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = sample().unwrap();
        assert!(
            after.resident_bytes >= before.resident_bytes + (48 << 20),
            "{before:?} {after:?}"
        );
        assert!(after.cpu_seconds >= before.cpu_seconds);
        drop(touched);
    }
}
