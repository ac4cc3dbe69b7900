//! The human-readable end-of-run report.

use pagefold_vmm::config::fmt_size;
use pagefold_vmm::runner::RunReport;

/// Prints [`render`]'s report; a closed stdout drops it (the exit status
/// still says how the VMs ended).
pub fn print(r: &RunReport) -> Result<(), crate::error::Error> {
    crate::output::write_out_or_drop(&render(r))
}

/// The report as text.
pub fn render(r: &RunReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    s.push('\n');
    let _ = writeln!(s, "== pagefold report ==");
    for v in &r.vms {
        let _ = writeln!(
            s,
            "{:<12} {:<40} {:>8.2} s",
            v.name,
            v.outcome.to_string(),
            v.wall_s
        );
        let g = &v.guest_pauses;
        if g.count > 0 {
            let _ = writeln!(
                s,
                "    parked by the dedup engine {} times: p99 {:.0} µs, max {:.0} µs, {:.1} ms in all",
                g.count,
                g.p99_s * 1e6,
                g.max_s * 1e6,
                g.total_s * 1e3
            );
        }
        for p in &v.phases {
            let _ = write!(
                s,
                "    {:<8} {:>8} pages {:>10.1} ms {:>7.2} GB/s  mismatches {}",
                p.phase, p.pages, p.ms, p.gbps, p.mismatches
            );
            // The pause probe's figures, where the phase was one.
            if let Some(q) = &p.pauses {
                let _ = write!(
                    s,
                    "  pauses {} (p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us, max {:.0} us, stopped {:.2} ms/s)",
                    q.gaps, q.p50_us, q.p99_us, q.p999_us, q.max_us, q.stopped_ms_per_s
                );
            }
            // The write-timing probe's classification, where it was one.
            if let Some(q) = &p.probe {
                let _ = write!(
                    s,
                    "  accuracy {:.3} ({} of {}), median write shared {:.2} us, unique {:.2} us; read after write {:.3}",
                    q.accuracy,
                    q.correct,
                    q.tested,
                    q.shared_median_us,
                    q.unique_median_us,
                    q.read_accuracy
                );
            }
            s.push('\n');
        }
    }
    if let Some(d) = r.dedup_peak.as_ref().or(r.dedup.as_ref()) {
        let _ = writeln!(
            s,
            "dedup ({}, mode {}) at its peak: pages_shared {}, pages_sharing {}, zero pages {}, saved {} (profit {}), {} merges, {} COW breaks",
            d.backend,
            d.mode,
            d.pages_shared,
            d.pages_sharing,
            d.zero_pages,
            fmt_size(d.bytes_saved),
            fmt_signed(d.profit_bytes),
            d.merges,
            d.cow_breaks,
        );
        for (vm, o) in &d.per_owner {
            let _ = writeln!(
                s,
                "    {vm:<12} group {:<10} merged {:>7} pages, zero {:>6} pages, saved {}",
                o.group,
                o.pages_merged,
                o.zero_pages,
                fmt_size(o.bytes_saved)
            );
        }
    }
    if let Some(d) = &r.dedup {
        let _ = writeln!(s, "dedup engine CPU over the run: {:.2} s", d.cpu_seconds);
    }
    if let Some(ms) = r.first_report_ms {
        let _ = writeln!(s, "first guest report {ms:.1} ms after start");
    }
    s
}

fn fmt_signed(v: i64) -> String {
    if v < 0 {
        format!("-{}", fmt_size(v.unsigned_abs()))
    } else {
        fmt_size(v as u64)
    }
}

/// One progress line about dedup while VMs run.
pub fn progress(s: &pagefold_dedup::Stats) -> String {
    format!(
        "dedup: mode {}, pages_sharing {}, zero pages {}, saved {}, scans {}, CPU {:.2} s",
        s.mode,
        s.pages_sharing,
        s.zero_pages,
        fmt_size(s.bytes_saved),
        s.full_scans,
        s.cpu_seconds
    )
}
