//! The human-readable end-of-run report.

use pagefold_vmm::config::fmt_size;
use pagefold_vmm::runner::RunReport;

pub fn print(r: &RunReport) {
    println!();
    println!("== pagefold report ==");
    for v in &r.vms {
        println!(
            "{:<12} {:<40} {:>8.2} s",
            v.name,
            v.outcome.to_string(),
            v.wall_s
        );
        for p in &v.phases {
            println!(
                "    {:<8} {:>8} pages {:>10.1} ms {:>7.2} GB/s  mismatches {}",
                p.phase, p.pages, p.ms, p.gbps, p.mismatches
            );
        }
    }
    if let Some(d) = &r.dedup {
        println!(
            "dedup ({}, mode {}): pages_shared {}, pages_sharing {}, zero pages {}, saved {}, engine CPU {:.2} s",
            d.backend,
            d.mode,
            d.pages_shared,
            d.pages_sharing,
            d.zero_pages,
            fmt_size(d.bytes_saved),
            d.cpu_seconds
        );
    }
    if let Some(ms) = r.first_report_ms {
        println!("first guest report {ms:.1} ms after start");
    }
}
