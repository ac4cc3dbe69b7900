//! Outputs of the real-Linux `build` benchmark: the workload form's table,
//! JSON rows, markdown and chart, under a header that says which kernel,
//! image and VM size were run.

use std::fmt::Write as _;

use crate::build_bench::BuildRow;
use crate::build_linux::LinuxBuildReport;
use crate::build_report::{
    against_off_and_ksm, find, json_rows, rows_chart, rows_markdown, rows_table,
};
use crate::chart::Chart;
use crate::error::BenchError;
use crate::ratio::{ratio, Goal};

fn header(r: &LinuxBuildReport) -> String {
    let g = &r.guest;
    // The engine's VMA budget decides whether the guests' scattered
    // duplicates stay with it or go to kernel KSM (rows before it was
    // recorded say 0).
    let maps = r
        .rows
        .iter()
        .map(|x| x.max_map_count)
        .find(|&m| m > 0)
        .map_or_else(String::new, |m| format!("; vm.max_map_count {m}"));
    let fpr = if g.free_page_reporting {
        ", balloons with free page reporting"
    } else {
        ""
    };
    format!(
        "build (Linux guests, make -j{} {}): kernel {}, disk {} ({:.0} MiB), 2 x {} RAM{fpr}; reference objects sha256 {}{maps}",
        g.vcpus,
        g.targets.as_deref().unwrap_or("(targets not reported)"),
        g.kernel,
        g.disk,
        g.disk_bytes as f64 / (1 << 20) as f64,
        g.memory,
        g.reference_sha256.as_deref().unwrap_or("-")
    )
}

/// The project's goals for two Linux guests building the same tree
/// (issue: "Real build"): the workload form's against off and ksm-10000
/// (npages at the end at least ksm-10000's for at most half its CPU, a
/// build within 1 % of off's), a build no slower than under ksm-10000,
/// and the end value reached at least 10 times sooner than ksm-default
/// reaches its own. A system still merging when the builds ended has no
/// time to its end value ("not measured").
pub fn linux_build_goals(r: &LinuxBuildReport) -> Vec<Goal> {
    let mut out = against_off_and_ksm(&r.rows);
    let on = find(&r.rows, "pagefold-on");
    if let (Some(on), Some(k)) = (on, find(&r.rows, "ksm-10000")) {
        out.push(Goal::at_most(
            "pagefold-on build time <= ksm-10000's (ratio)".into(),
            ratio(Some(on.real_mean_s), Some(k.real_mean_s)),
            1.0,
            format!("{:.1} s against {:.1} s", on.real_mean_s, k.real_mean_s),
        ));
    }
    if let (Some(on), Some(k)) = (on, find(&r.rows, "ksm-10000")) {
        // Per page saved at the end rather than per merge: KSM counts no
        // merges, and both count what they saved and the breaks
        // (pagefold's own, KSM's `cow_ksm`).
        let per_saved =
            |x: &BuildRow| (x.npages_mean > 0.0).then(|| x.cow_breaks_mean / x.npages_mean);
        out.push(Goal::at_most(
            "pagefold-on COW breaks per page saved <= ksm-10000's (ratio)".into(),
            ratio(per_saved(on), per_saved(k)),
            1.0,
            format!(
                "{:.0} breaks for {:.0} pages against {:.0} for {:.0}",
                on.cow_breaks_mean, on.npages_mean, k.cow_breaks_mean, k.npages_mean
            ),
        ));
    }
    if let (Some(on), Some(d)) = (on, find(&r.rows, "ksm-default")) {
        out.push(Goal::at_least(
            "ksm-default's time to its end npages / pagefold-on's".into(),
            ratio(d.t_final_npages_s, on.t_final_npages_s),
            10.0,
            format!(
                "{} against {}",
                secs(d.t_final_npages_s),
                secs(on.t_final_npages_s)
            ),
        ));
    }
    out.extend(Goal::every_system(
        "builds give the reference objects",
        &r.rows,
        |x| x.checksums_agree,
    ));
    out
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(
        || "still merging at the end".into(),
        |v| format!("{v:.1} s"),
    )
}

/// A plain-text table for stdout, then the goal checks.
pub fn linux_build_table(r: &LinuxBuildReport) -> String {
    let mut out = rows_table(&header(r), &r.rows, &r.unrestored);
    for g in linux_build_goals(r) {
        let _ = writeln!(out, "{}", g.line());
    }
    out
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
        "build: merged pages while two Linux guests build the same kernel tree".into(),
        &r.rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build_bench::{BuildRow, BuildRun};
    use crate::build_linux::{LinuxGuestInfo, LinuxVmResult};
    use crate::linux_result::parse_result_line;

    /// Two 1 GiB guests with one vCPU each, built from /pf.
    fn guest_info() -> LinuxGuestInfo {
        LinuxGuestInfo {
            kernel: "/pf/vmlinux".into(),
            initrd: None,
            disk: "/pf/build.ext4".into(),
            disk_bytes: 1 << 30,
            memory: "1G".into(),
            vcpus: 1,
            cmdline: String::new(),
            console_dir: "/pf".into(),
            targets: None,
            reference_sha256: None,
            free_page_reporting: false,
        }
    }

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
            peak_npages: 150_000,
            t_final_npages_s: Some(500.0),
            checksums: vec![result.checksum(); 2],
            ..BuildRun::test_run(120_000, 9)
        };
        let host = crate::host::HostId {
            kind: "hardware".into(),
            kernel: "6.1.0-28-amd64".into(),
            max_map_count: 65530,
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
                disk_bytes: 8 << 30,
                memory: "2G".into(),
                vcpus: 2,
                targets: Some("mm/".into()),
                reference_sha256: Some(hash.clone()),
                ..guest_info()
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
        assert!(t.starts_with("build (Linux guests, make -j2 mm/): kernel /pf/vmlinux, disk /pf/build.ext4 (8192 MiB)"), "{t}");
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

    #[test]
    fn compares_cow_breaks_per_saved_page_with_ksm() {
        let host = crate::host::HostId {
            kind: "emulated-svm".into(),
            kernel: "6.1.0-57-cloud-amd64".into(),
            max_map_count: 1_048_576,
        };
        let row = |system: &str, npages: u64, cow_breaks: u64| {
            let run = BuildRun::test_run(npages, cow_breaks);
            crate::build_bench::row(system, vec![run], 0, &host, [0.0; 3], vec![])
        };
        let goal = |on_breaks: u64| {
            let rows = vec![
                row("pagefold-on", 40_000, on_breaks),
                row("ksm-10000", 20_000, 4_000),
            ];
            let r = LinuxBuildReport {
                guest: guest_info(),
                rows,
                results: vec![],
                unrestored: vec![],
            };
            linux_build_goals(&r)
                .into_iter()
                .find(|g| g.name.starts_with("pagefold-on COW breaks per page saved"))
                .unwrap()
        };
        // KSM: 0.2 breaks per saved page. pagefold 0.1, then 0.3.
        let g = goal(4_000);
        assert_eq!((g.value, g.met), (Some(0.5), Some(true)), "{g:?}");
        let g = goal(12_000);
        assert_eq!(g.met, Some(false), "{g:?}");
        assert!((g.value.unwrap() - 1.5).abs() < 1e-9, "{g:?}");
    }
}
