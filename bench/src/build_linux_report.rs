//! Outputs of the real-Linux `build` benchmark: the workload form's table,
//! JSON rows, markdown and chart, under a header that says which kernel,
//! image and VM size were run.

use std::fmt::Write as _;

use crate::build_linux::LinuxBuildReport;
use crate::build_report::{json_rows, rows_chart, rows_markdown, rows_table};
use crate::chart::Chart;
use crate::error::BenchError;

fn header(r: &LinuxBuildReport) -> String {
    let g = &r.guest;
    format!(
        "build (Linux guests, make defconfig && make -j{}): kernel {}, disk {} ({:.0} MiB), 2 x {} RAM; reference vmlinux sha256 {}",
        g.vcpus,
        g.kernel,
        g.disk,
        g.disk_bytes as f64 / (1 << 20) as f64,
        g.memory,
        g.reference_sha256.as_deref().unwrap_or("-")
    )
}

/// A plain-text table for stdout.
pub fn linux_build_table(r: &LinuxBuildReport) -> String {
    rows_table(&header(r), &r.rows, &r.unrestored)
}

/// A markdown table with the header line.
pub fn linux_build_markdown(r: &LinuxBuildReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}.\n", header(r));
    out.push_str(&rows_markdown(&r.rows));
    out
}

/// `{"guest": {...}, "rows": [...], "results": [...], "unrestored": [...]}`.
pub fn linux_build_json(r: &LinuxBuildReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "guest": r.guest,
        "rows": json_rows(&r.rows),
        "results": r.results,
        "unrestored": r.unrestored,
    }))?)
}

/// npages over build time, first run of each system.
pub fn linux_build_chart(r: &LinuxBuildReport) -> Chart {
    rows_chart(
        "build: merged pages during two concurrent Linux kernel builds".into(),
        &r.rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_bench::{BuildRow, BuildRun};
    use crate::build_linux::{LinuxGuestInfo, LinuxVmResult};
    use crate::linux_result::parse_result_line;

    #[test]
    fn fills_the_workload_forms_table() {
        let hash = "ab".repeat(32);
        let line =
            format!("PAGEFOLD-BUILD-RESULT real=600.5 user=1100 sys=90 status=0 sha256={hash}");
        let result = parse_result_line(&line).unwrap();
        let run = BuildRun {
            real_s: 600.5,
            user_s: 1300.0,
            sys_s: 40.0,
            guest_cpu_s: 1190.0,
            engine_cpu_s: 3.5,
            npages: 120_000,
            pages_sharing: 120_000,
            zero_pages: 0,
            peak_npages: 150_000,
            t_final_npages_s: Some(500.0),
            cow_breaks: 9,
            merges: 0,
            hint_merges: 0,
            hint_merge_delay_ms: None,
            pages_read: 0,
            pages_written: 0,
            pages_reused: 0,
            checksums: vec![result.checksum(); 2],
            trigger_s: None,
            samples: Vec::new(),
        };
        let host = crate::host::HostId {
            kind: "hardware".into(),
            kernel: "6.1.0-28-amd64".into(),
        };
        let row = crate::build_bench::row(
            "ksm-10000",
            vec![run],
            result.checksum(),
            &host,
            [1.0; 3],
            vec![],
        );
        let r = LinuxBuildReport {
            guest: LinuxGuestInfo {
                kernel: "/pf/vmlinux".into(),
                initrd: None,
                disk: "/pf/build.ext4".into(),
                disk_bytes: 8 << 30,
                memory: "2G".into(),
                vcpus: 2,
                cmdline: String::new(),
                console_dir: "/pf".into(),
                reference_sha256: Some(hash.clone()),
            },
            rows: vec![row],
            results: vec![LinuxVmResult {
                system: "ksm-10000".into(),
                run: 1,
                vm: "linux-a".into(),
                result,
            }],
            unrestored: vec![],
        };
        let BuildRow {
            checksums_agree, ..
        } = r.rows[0].clone();
        assert!(checksums_agree);
        let t = linux_build_table(&r);
        assert!(t.starts_with("build (Linux guests, make defconfig && make -j2): kernel /pf/vmlinux, disk /pf/build.ext4 (8192 MiB)"), "{t}");
        assert!(t.contains(&hash), "{t}");
        assert_eq!(
            t.lines().nth(1),
            Some("host hardware (Linux 6.1.0-28-amd64)"),
            "{t}"
        );
        assert!(
            t.contains("600.50 ± 0.00") && t.contains("120000 ± 0"),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&linux_build_json(&r).unwrap()).unwrap();
        assert_eq!(v["rows"][0]["real_mean_s"], 600.5);
        assert_eq!(v["rows"][0]["host_kind"], "hardware");
        assert_eq!(v["rows"][0]["host_kernel"], "6.1.0-28-amd64");
        assert_eq!(v["results"][0]["result"]["sha256"], hash.as_str());
        let md = linux_build_markdown(&r);
        assert!(md.contains("| ksm-10000 | 1 | 600.50 ± 0.00 |"), "{md}");
        assert!(
            md.contains(".\n\nhost hardware (Linux 6.1.0-28-amd64)\n\n| system |"),
            "{md}"
        );
    }
}
