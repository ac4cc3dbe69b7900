//! The Linux guests' latency probe: `cyclictest` (Debian's rt-tests, on
//! the data disk of scripts/guest-image.sh under `/data/rt`) runs in each
//! guest of `bench linux-read` from before the read until the idle window
//! ends, one SCHED_FIFO thread waking every 5 ms, and its histogram says
//! how late the wake-ups came: what a tenant's timer-driven work feels of
//! the host's merging (parks, copy-on-write faults, the merger's CPU).
//! It is the Linux counterpart of the workload guests' TSC-gap probe
//! (`bench latency`): both time a guest that wants to run and cannot.

use serde::{Deserialize, Serialize};

/// Started in the background by the read script, before the read:
/// memory locked, priority 95, one thread, a 5 ms interval (200 wake-ups
/// a second: enough samples for a p99.9 in a minute, few enough exits for
/// an emulated host), a histogram of 1 µs buckets up to 100 ms written to
/// /tmp/cyc.hist when it is stopped. The initramfs has no C library, so
/// the probe's own loader runs it. It must still run a second later
/// (a probe that cannot start fails the read, not the end of the run).
pub const PROBE_START: &str = "rt=/data/rt; \
     $rt/ld-linux-x86-64.so.2 --library-path $rt $rt/cyclictest -q -m -t1 -p95 -i5000 \
     -h100000 --histfile=/tmp/cyc.hist </dev/null >/tmp/cyc.out 2>&1 & \
     echo $! >/tmp/cyc.pid && sleep 1 && kill -0 $(cat /tmp/cyc.pid)";

/// Posted when the idle window ends: stops the probe (SIGTERM: it writes
/// its histogram and exits), waits up to 20 s for the histogram's last
/// line, and prints its summary lines and non-empty buckets after a
/// marker line.
pub const PROBE_END: &str = "kill -TERM $(cat /tmp/cyc.pid) && i=0 && \
     while ! grep -q 'Overflow at cycle' /tmp/cyc.hist 2>/dev/null && [ $i -lt 200 ]; do \
     sleep 0.1; i=$((i + 1)); done && grep -q 'Overflow at cycle' /tmp/cyc.hist && \
     echo CYCLICTEST-HISTOGRAM && awk '!/^[0-9]/ || $2 + 0 > 0' /tmp/cyc.hist";

/// One guest's wake-up latencies over the probe's run, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GuestLatency {
    /// Wake-ups measured (the buckets' counts and the overflows).
    pub samples: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Wake-ups later than the histogram's last bucket (100 ms): a
    /// percentile among them is given as `max_us`.
    pub overflows: u64,
}

impl GuestLatency {
    /// The larger of each figure of `a` and `b` (the row of a system is
    /// its worse guest's).
    pub fn worse(a: &GuestLatency, b: &GuestLatency) -> GuestLatency {
        GuestLatency {
            samples: a.samples + b.samples,
            p50_us: a.p50_us.max(b.p50_us),
            p99_us: a.p99_us.max(b.p99_us),
            p999_us: a.p999_us.max(b.p999_us),
            max_us: a.max_us.max(b.max_us),
            overflows: a.overflows + b.overflows,
        }
    }
}

/// The figures of [`PROBE_END`]'s output: cyclictest's histogram file
/// after the `CYCLICTEST-HISTOGRAM` marker (`# Max Latencies: 00051`,
/// `# Histogram Overflows: 00000`, and `LATENCY COUNT` lines, zero counts
/// left out). Bucket `n` holds the wake-ups `n` to `n + 1` µs late; a
/// percentile is the first bucket at which the count reaches its share.
pub fn parse_cyclictest(output: &str) -> Result<GuestLatency, String> {
    let body = output
        .split_once("CYCLICTEST-HISTOGRAM")
        .map(|(_, b)| b)
        .ok_or("no CYCLICTEST-HISTOGRAM line (the probe did not stop cleanly)")?;
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    let (mut max_us, mut overflows) = (None, 0u64);
    let field = |line: &str, key: &str| -> Option<Result<u64, String>> {
        let rest = line.strip_prefix(key)?;
        Some(
            rest.split_whitespace()
                .next()
                .unwrap_or("")
                .parse::<u64>()
                .map_err(|e| format!("{line:?}: {e}")),
        )
    };
    for line in body.lines().map(str::trim) {
        if let Some(v) = field(line, "# Max Latencies:") {
            max_us = Some(v?);
        } else if let Some(v) = field(line, "# Histogram Overflows:") {
            overflows = v?;
        } else if line.starts_with(|c: char| c.is_ascii_digit()) {
            let mut w = line.split_whitespace();
            let (Some(lat), Some(n)) = (w.next(), w.next()) else {
                return Err(format!("bucket line {line:?}"));
            };
            let lat = lat.parse().map_err(|e| format!("{line:?}: {e}"))?;
            let n = n.parse().map_err(|e| format!("{line:?}: {e}"))?;
            buckets.push((lat, n));
        }
    }
    let max_us = max_us.ok_or("no '# Max Latencies:' line")? as f64;
    buckets.sort_unstable();
    let samples = buckets.iter().map(|b| b.1).sum::<u64>() + overflows;
    if samples == 0 {
        return Err("the histogram is empty (the probe never woke)".into());
    }
    let pct = |q: f64| {
        let want = (q * samples as f64).ceil() as u64;
        let mut seen = 0;
        for &(lat, n) in &buckets {
            seen += n;
            if seen >= want {
                return lat as f64;
            }
        }
        max_us
    };
    Ok(GuestLatency {
        samples,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        max_us,
        overflows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cyclictest 2.4's histogram file as PROBE_END prints it.
    fn output(buckets: &[(u64, u64)], max: u64, overflows: u64) -> String {
        let mut s =
            String::from("# /dev/cpu_dma_latency set to 0us\nCYCLICTEST-HISTOGRAM\n# Histogram\n");
        for (l, n) in buckets {
            s += &format!("{l:06} {n:06}\n");
        }
        let total: u64 = buckets.iter().map(|b| b.1).sum();
        s += &format!(
            "# Total: {total:09}\n# Min Latencies: 00005\n# Avg Latencies: 00010\n\
             # Max Latencies: {max:05}\n# Histogram Overflows: {overflows:05}\n\
             # Histogram Overflow at cycle number:\n# Thread 0:\n"
        );
        s
    }

    #[test]
    fn percentiles_are_the_buckets_where_the_count_reaches_its_share() {
        // 1,000 wake-ups: 900 at 10 µs, 95 at 20, 4 at 300, 1 at 4000:
        // the 990th is at 20, the 999th at 300.
        let l = parse_cyclictest(&output(
            &[(10, 900), (20, 95), (300, 4), (4000, 1)],
            4000,
            0,
        ))
        .unwrap();
        assert_eq!(l.samples, 1000);
        assert_eq!(
            (l.p50_us, l.p99_us, l.p999_us, l.max_us),
            (10.0, 20.0, 300.0, 4000.0)
        );
        // Out of order and with a zero bucket: the same.
        let m = parse_cyclictest(&output(
            &[(300, 4), (4000, 1), (10, 900), (5, 0), (20, 95)],
            4000,
            0,
        ))
        .unwrap();
        assert_eq!(l, m);
    }

    #[test]
    fn a_percentile_among_the_overflows_is_the_maximum() {
        // 100 samples, 2 beyond the histogram: p99 is among them.
        let l = parse_cyclictest(&output(&[(10, 98)], 250_000, 2)).unwrap();
        assert_eq!((l.samples, l.overflows), (100, 2));
        assert_eq!((l.p50_us, l.p99_us, l.max_us), (10.0, 250_000.0, 250_000.0));
    }

    #[test]
    fn a_probe_that_did_not_stop_or_never_woke_is_an_error() {
        let e = parse_cyclictest("kill: no such process\n").unwrap_err();
        assert!(e.contains("CYCLICTEST-HISTOGRAM"), "{e}");
        let e = parse_cyclictest(&output(&[], 0, 0)).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e =
            parse_cyclictest("CYCLICTEST-HISTOGRAM\n000010 x\n# Max Latencies: 1\n").unwrap_err();
        assert!(e.contains("000010 x"), "{e}");
    }

    #[test]
    fn a_system_is_judged_by_its_worse_guest() {
        let a = GuestLatency {
            samples: 10,
            p50_us: 5.0,
            p99_us: 50.0,
            p999_us: 60.0,
            max_us: 70.0,
            overflows: 0,
        };
        let b = GuestLatency {
            samples: 20,
            p50_us: 6.0,
            p99_us: 40.0,
            p999_us: 90.0,
            max_us: 95.0,
            overflows: 1,
        };
        let w = GuestLatency::worse(&a, &b);
        assert_eq!((w.samples, w.overflows), (30, 1));
        assert_eq!(
            (w.p50_us, w.p99_us, w.p999_us, w.max_us),
            (6.0, 50.0, 90.0, 95.0)
        );
    }
}
