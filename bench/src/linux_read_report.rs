//! Outputs of the `linux-read` benchmark: a markdown table (stdout and
//! `--markdown`), the JSON report with every system's samples, and the
//! chart of `npages` over time since the read.

use std::fmt::Write as _;

use crate::chart::{simplify, Chart, Line, Panel};
use crate::error::BenchError;
use crate::linux_read::{LinuxReadReport, LinuxReadRow, RATIO_BASE, T_FINAL_SHARE};
use crate::ratio::{fmt_ratio, ratio, Goal};

const HEADERS: [&str; 26] = [
    "system",
    "npages",
    "pages_sharing",
    "zero_pages",
    "peak npages",
    "saved vs ksm-4096",
    "t final (s)",
    "t final vs ksm-4096",
    "duplicates left",
    "engine cpu (s)",
    "COW breaks",
    "merges",
    "KSM assist",
    "TLB shootdowns",
    "boot a (s)",
    "boot b (s)",
    "read (s)",
    "md5s agree",
    "wake-up p99 (µs)",
    "p99.9 (µs)",
    "max (µs)",
    "parked (ms)",
    "longest park (µs)",
    "write waits",
    "longest write wait (µs)",
    "load 1m",
];

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// `row`'s saved pages and t_final against the ratio base's (None where
/// either is unknown or the base's is 0).
fn ratios(row: &LinuxReadRow, base: Option<&LinuxReadRow>) -> (Option<f64>, Option<f64>) {
    let Some(b) = base else { return (None, None) };
    (
        ratio(Some(row.npages as f64), Some(b.npages as f64)),
        ratio(row.t_final_s, b.t_final_s),
    )
}

fn base(r: &LinuxReadReport) -> Option<&LinuxReadRow> {
    r.rows.iter().find(|x| x.system == RATIO_BASE)
}

/// The columns of one row.
fn cells(row: &LinuxReadRow, base: Option<&LinuxReadRow>) -> Vec<String> {
    let (saved, t_final) = ratios(row, base);
    let assist = match (row.ksm_assist.as_str(), row.ksm_pages_sharing) {
        ("", _) => "-".to_string(),
        (a, 0) => a.to_string(),
        (a, n) => format!("{a} ({n} pages)"),
    };
    vec![
        row.system.clone(),
        row.npages.to_string(),
        row.pages_sharing.to_string(),
        row.zero_pages.to_string(),
        row.peak_npages.to_string(),
        fmt_ratio(saved),
        fmt_opt(row.t_final_s, 1),
        fmt_ratio(t_final),
        row.census.map_or("-".into(), |c| c.left().to_string()),
        format!("{:.2}", row.engine_cpu_s),
        row.cow_breaks.to_string(),
        row.merges.to_string(),
        assist,
        row.ipis
            .map_or("-".into(), |i| i.tlb_shootdowns.to_string()),
        format!("{:.1}", row.boot_a_s),
        format!("{:.1}", row.boot_b_s),
        format!("{:.1}", row.read_s),
        if row.md5s_agree { "yes" } else { "NO" }.into(),
        fmt_opt(row.p99_us, 0),
        fmt_opt(row.p999_us, 0),
        fmt_opt(row.max_us, 0),
        fmt_opt(row.parked_s.map(|s| s * 1e3), 1),
        fmt_opt(row.park_max_us, 0),
        row.write_waits.map_or("-".into(), |n| n.to_string()),
        fmt_opt(row.write_wait_max_us, 0),
        format!("{:.2}", row.load_avg[0]),
    ]
}

/// The line above the table: what ran where.
fn header(r: &LinuxReadReport) -> String {
    let g = &r.guest;
    format!(
        "linux-read: two Linux guests ({} each, 1 vCPU) read the same files; host {} (Linux {}{}); \
         npages = pages_sharing + zero_pages sampled every {} s from the read (t = 0) to {} s \
         after both replies; t final = first sample at {:.0} % of the final npages",
        g.memory,
        r.host_kind,
        r.host_kernel,
        if r.max_map_count > 0 {
            format!(", vm.max_map_count {}", r.max_map_count)
        } else {
            String::new()
        },
        g.sample_interval_s,
        g.idle_s,
        T_FINAL_SHARE * 100.0
    )
}

/// The pagefold-on vs ksm-4096 summary line, when both ran.
fn comparison(r: &LinuxReadReport) -> Option<String> {
    let on = r.rows.iter().find(|x| x.system == "pagefold-on")?;
    let (saved, t_final) = ratios(on, base(r));
    let b = base(r)?;
    let frames = match (on.census, b.census) {
        (Some(x), Some(y)) if x.frames > 0 && y.frames > 0 => format!(
            ", frames holding the guests' RAM {}",
            fmt_ratio(Some(x.frames as f64 / y.frames as f64))
        ),
        _ => String::new(),
    };
    Some(format!(
        "pagefold-on vs {RATIO_BASE}: saved pages {}, t final {}{frames}",
        fmt_ratio(saved),
        fmt_ratio(t_final)
    ))
}

/// The project's goals for two Linux guests reading the same files:
/// pagefold-on saves at least what KSM saves at the same knobs
/// (ksm-4096), reaches it no later, its guests' timer wake-ups come no
/// later at the 99th percentile (cyclictest, the worse guest of each),
/// and every guest reads intact data.
pub fn linux_read_goals(r: &LinuxReadReport) -> Vec<Goal> {
    let mut out = Vec::new();
    let on = r.rows.iter().find(|x| x.system == "pagefold-on");
    if let (Some(on), Some(b)) = (on, base(r)) {
        let (saved, t_final) = ratios(on, Some(b));
        out.push(Goal::at_least(
            format!("pagefold-on saves >= {RATIO_BASE}'s pages (ratio)"),
            saved,
            1.0,
            format!("{} against {} pages", on.npages, b.npages),
        ));
        out.push(Goal::at_most(
            format!("pagefold-on reaches its saving no later than {RATIO_BASE} (t final ratio)"),
            t_final,
            1.0,
            format!(
                "{} s against {} s",
                fmt_opt(on.t_final_s, 1),
                fmt_opt(b.t_final_s, 1)
            ),
        ));
        if let (Some(x), Some(y)) = (on.p99_us, b.p99_us) {
            out.push(Goal::at_most(
                format!("pagefold-on guests' cyclictest p99 <= {RATIO_BASE}'s (ratio)"),
                ratio(Some(x), Some(y)),
                1.0,
                format!("{x:.0} µs against {y:.0} µs"),
            ));
        }
    }
    // Issue 34's bar for a hardened group, on real guests.
    let hardened = r.rows.iter().find(|x| x.system == "pagefold-hardened");
    if let (Some(h), Some(on)) = (hardened, on) {
        out.push(Goal::at_least(
            "pagefold-hardened saves >= 0.8x pagefold-on's pages (ratio)".into(),
            ratio(Some(h.npages as f64), Some(on.npages as f64)),
            0.8,
            format!("{} against {} pages", h.npages, on.npages),
        ));
    }
    out.extend(Goal::every_system(
        "guests read intact data",
        &r.rows,
        |x| x.md5s_agree,
    ));
    out
}

/// The markdown table, under its header line, with the comparison,
/// warnings, data-integrity failures and unrestored KSM tunables after it.
pub fn linux_read_markdown(r: &LinuxReadReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}.\n", header(r));
    let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
    for row in &r.rows {
        let _ = writeln!(out, "| {} |", cells(row, base(r)).join(" | "));
    }
    let mut notes = Vec::new();
    notes.extend(comparison(r));
    if r.host_kind == pagefold_vmm::host_kind::EMULATED_SVM {
        notes.push(
            "under the emulated host page counts are real; times compare only within this run"
                .into(),
        );
    }
    for row in &r.rows {
        // `off` merges nothing: its census would only repeat the copies
        // the other rows' census counts.
        if let Some(c) = row.census.filter(|_| row.system != "off") {
            notes.push(format!(
                "{}: guest RAM at the end, paused: {} pages present ({} zero); {} non-zero \
                 copies of another page, {} of them left unshared; {} zero pages left on \
                 frames of their own{}",
                row.system,
                c.present,
                c.zero,
                c.nonzero_copies,
                c.nonzero_left,
                c.zero_left,
                if c.frames > 0 {
                    format!(
                        "; {} frames ({} MiB) hold all of it, every page read",
                        c.frames,
                        c.frames / 256
                    )
                } else {
                    String::new()
                }
            ));
        }
        notes.extend(row.warnings.iter().map(|w| format!("{}: {w}", row.system)));
        if !row.md5s_agree {
            notes.push(format!(
                "{}: GUEST DATA DIFFERS: a read {:?}, b read {:?}",
                row.system, row.md5_a, row.md5_b
            ));
        }
    }
    notes.extend(
        r.unrestored
            .iter()
            .map(|u| format!("KSM tunable not restored: {u}")),
    );
    notes.extend(linux_read_goals(r).iter().map(Goal::line));
    if !notes.is_empty() {
        out.push('\n');
    }
    for n in notes {
        let _ = writeln!(out, "- {n}");
    }
    out
}

/// `{"host_kind", "host_kernel", "guest": {...}, "rows": [...],
/// "unrestored": [...]}`; each row carries its samples.
pub fn linux_read_json(r: &LinuxReadReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(r)?)
}

/// `npages` over time since the read, one line per system.
pub fn linux_read_chart(r: &LinuxReadReport) -> Chart {
    let lines = r
        .rows
        .iter()
        .map(|row| {
            let pts: Vec<(f64, f64)> = row
                .samples
                .iter()
                .map(|s| (s.t_s, s.npages as f64))
                .collect();
            Line {
                name: row.system.clone(),
                points: simplify(&pts),
            }
        })
        .collect();
    Chart::new(vec![Panel {
        title: format!(
            "linux-read: merged pages after two Linux guests read the same files (host {})",
            r.host_kind
        ),
        x_label: "time since the read was posted (s)".into(),
        y_label: "npages (pages_sharing + zero_pages)".into(),
        log_x: false,
        log_y: false,
        lines,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::Ipis;
    use crate::linux_read::{LinuxReadGuest, LinuxReadSample, Md5s};

    fn md5() -> Md5s {
        Md5s {
            random_64m: "a".repeat(32),
            random_16m: "b".repeat(32),
            copy16: "b".repeat(32),
        }
    }

    fn row(system: &str, npages: u64, t_final_s: Option<f64>) -> LinuxReadRow {
        let samples = vec![
            LinuxReadSample {
                t_s: 0.0,
                npages: 0,
                pages_sharing: 0,
                zero_pages: 0,
            },
            LinuxReadSample {
                t_s: 1.0,
                npages,
                pages_sharing: npages - npages / 10,
                zero_pages: npages / 10,
            },
        ];
        LinuxReadRow {
            system: system.into(),
            host_kind: "emulated-svm".into(),
            host_kernel: "6.1.0-28-cloud-amd64".into(),
            npages,
            pages_sharing: npages - npages / 10,
            zero_pages: npages / 10,
            peak_npages: npages,
            t_final_s,
            engine_cpu_s: 1.25,
            engine_cpu_total_s: 2.5,
            cow_breaks: 3,
            merges: 0,
            ksm_assist: String::new(),
            ksm_pages_sharing: 0,
            boot_a_s: 15.04,
            boot_b_s: 16.0,
            read_a_s: 4.0,
            read_b_s: 4.5,
            read_s: 4.5,
            md5s_agree: true,
            md5_a: md5(),
            md5_b: md5(),
            ipis: Some(Ipis {
                tlb_shootdowns: 1234,
                reschedules: 99,
            }),
            census: None,
            latency_a: None,
            latency_b: None,
            p99_us: Some(120.0),
            p999_us: Some(900.0),
            max_us: Some(2500.0),
            parks: Some(12),
            parked_s: Some(0.0042),
            park_max_us: Some(800.0),
            write_waits: Some(12),
            write_wait_max_us: Some(3100.0),
            load_avg: [1.5, 1.0, 0.5],
            warnings: vec![],
            samples,
        }
    }

    fn report(rows: Vec<LinuxReadRow>) -> LinuxReadReport {
        LinuxReadReport {
            host_kind: "emulated-svm".into(),
            host_kernel: "6.1.0-28-cloud-amd64".into(),
            max_map_count: 65530,
            guest: LinuxReadGuest {
                kernel: "/guest/vmlinux".into(),
                initrd: "/guest/initrd.img".into(),
                data_disk: "/guest/data.ext4".into(),
                memory: "384M".into(),
                cmdline: crate::linux_read::AGENT_CMDLINE.into(),
                script: crate::linux_read::READ_SCRIPT.into(),
                sample_interval_s: 1.0,
                idle_s: 120.0,
                vm_cpus: [Some(0), Some(1)],
                console_dir: "/tmp/lr".into(),
            },
            rows,
            unrestored: vec![],
        }
    }

    #[test]
    fn the_table_compares_every_system_with_ksm_4096() {
        let mut on = row("pagefold-on", 30_000, Some(2.0));
        on.merges = 29_000;
        on.ksm_assist = "standby".into();
        on.p99_us = Some(150.0);
        on.census = Some(crate::page_census::PageCensus {
            present: 90_000,
            zero: 5_000,
            nonzero_copies: 26_000,
            nonzero_left: 10,
            zero_left: 2,
            frames: 40_000,
        });
        let mut ksm_default = row("ksm-default", 15_000, None);
        ksm_default.md5s_agree = false;
        let mut ksm = row("ksm-4096", 20_000, Some(8.0));
        ksm.census = Some(crate::page_census::PageCensus {
            frames: 50_000,
            ..crate::page_census::PageCensus::default()
        });
        let mut off = row("off", 0, None);
        off.census = Some(crate::page_census::PageCensus {
            present: 77_000,
            ..crate::page_census::PageCensus::default()
        });
        let r = report(vec![off, on, ksm, ksm_default]);
        let md = linux_read_markdown(&r);
        let lines: Vec<&str> = md.lines().collect();
        assert!(lines[0].starts_with("linux-read: two Linux guests (384M each, 1 vCPU)"));
        assert!(lines[0]
            .contains("host emulated-svm (Linux 6.1.0-28-cloud-amd64, vm.max_map_count 65530)"));
        assert_eq!(lines[2], format!("| {} |", HEADERS.join(" | ")));
        assert_eq!(lines[3].matches("---|").count(), HEADERS.len());
        assert_eq!(
            lines[4],
            "| off | 0 | 0 | 0 | 0 | 0.00x | - | - | 0 | 1.25 | 3 | 0 | - | 1234 | 15.0 | 16.0 | 4.5 | yes | 120 | 900 | 2500 | 4.2 | 800 | 12 | 3100 | 1.50 |"
        );
        assert_eq!(
            lines[5],
            "| pagefold-on | 30000 | 27000 | 3000 | 30000 | 1.50x | 2.0 | 0.25x | 12 | 1.25 | 3 | 29000 | standby | 1234 | 15.0 | 16.0 | 4.5 | yes | 150 | 900 | 2500 | 4.2 | 800 | 12 | 3100 | 1.50 |"
        );
        assert!(lines[6]
            .starts_with("| ksm-4096 | 20000 | 18000 | 2000 | 20000 | 1.00x | 8.0 | 1.00x |"));
        assert!(
            lines[7].starts_with("| ksm-default | 15000 |")
                && lines[7].contains("| 0.75x | - | - |")
        );
        assert!(lines[7].contains("| NO |"), "{}", lines[7]);
        assert!(md.contains(
            "- pagefold-on vs ksm-4096: saved pages 1.50x, t final 0.25x, frames holding the \
             guests' RAM 0.80x\n"
        ));
        assert!(
            md.contains(
                "- pagefold-on: guest RAM at the end, paused: 90000 pages present (5000 zero); \
                 26000 non-zero copies of another page, 10 of them left unshared; 2 zero pages \
                 left on frames of their own; 40000 frames (156 MiB) hold all of it, every page \
                 read\n"
            ),
            "{md}"
        );
        assert!(md.contains("- under the emulated host page counts are real"));
        assert!(!md.contains("- off: guest RAM"), "{md}");
        assert!(md.contains("- ksm-default: GUEST DATA DIFFERS"));
        assert!(!r.md5s_agree());
        // 1.5x KSM's pages, a quarter of its time, wake-ups 1.25x later
        // at the p99; one system of four read damaged data.
        let g = linux_read_goals(&r);
        let met: Vec<Option<bool>> = g.iter().map(|g| g.met).collect();
        assert_eq!(
            met,
            [Some(true), Some(true), Some(false), Some(false)],
            "{g:?}"
        );
        assert!(
            md.contains("- [MISSED] pagefold-on guests' cyclictest p99 <= ksm-4096's (ratio): 1.250 (goal <= 1); 150 µs against 120 µs"),
            "{md}"
        );
        assert!(md.contains("- [met] pagefold-on saves >= ksm-4096's pages (ratio): 1.500"));
        assert!(md.contains("(share of systems): 0.750 (goal >= 1)"), "{md}");
    }

    #[test]
    fn a_hardened_group_is_held_to_four_fifths_of_pagefold_ons_saving() {
        let goal = |hardened: u64| {
            let r = report(vec![
                row("pagefold-on", 30_000, Some(2.0)),
                row("pagefold-hardened", hardened, Some(9.0)),
            ]);
            linux_read_goals(&r)
                .into_iter()
                .find(|g| g.name.starts_with("pagefold-hardened saves"))
                .unwrap()
        };
        assert_eq!(goal(24_000).met, Some(true));
        let short = goal(23_000);
        assert_eq!(short.met, Some(false));
        assert_eq!(short.note, "23000 against 30000 pages");
        // Without pagefold-on there is nothing to hold it to.
        let alone = report(vec![row("pagefold-hardened", 1, None)]);
        assert!(!linux_read_goals(&alone)
            .iter()
            .any(|g| g.name.starts_with("pagefold-hardened")));
    }

    #[test]
    fn without_ksm_4096_the_ratios_are_blank() {
        let mut on = row("pagefold-on", 30_000, Some(2.0));
        on.ksm_assist = "engaged".into();
        on.ksm_pages_sharing = 700;
        let mut r = report(vec![on]);
        r.host_kind = "hardware".into();
        r.unrestored = vec!["pages_to_scan: 100 -> 4096".into()];
        let md = linux_read_markdown(&r);
        assert!(
            md.contains("| pagefold-on | 30000 | 27000 | 3000 | 30000 | - | 2.0 | - |"),
            "{md}"
        );
        assert!(md.contains("| engaged (700 pages) |"), "{md}");
        assert!(!md.contains("vs ksm-4096: saved"), "{md}");
        assert!(!md.contains("emulated host"), "{md}");
        assert!(md.contains("- KSM tunable not restored: pages_to_scan: 100 -> 4096"));
        assert!(r.md5s_agree());
        // Nothing to compare with: only the data goal is judged.
        let g = linux_read_goals(&r);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].met, Some(true));
    }

    #[test]
    fn json_has_every_row_with_its_samples_and_the_chart_a_line_per_system() {
        let r = report(vec![
            row("pagefold-on", 30_000, Some(2.0)),
            row("ksm-4096", 20_000, Some(8.0)),
        ]);
        let v: serde_json::Value = serde_json::from_str(&linux_read_json(&r).unwrap()).unwrap();
        assert_eq!(v["host_kind"], "emulated-svm");
        assert_eq!(v["guest"]["vm_cpus"], serde_json::json!([0, 1]));
        let row0 = &v["rows"][0];
        for key in [
            "system",
            "host_kind",
            "host_kernel",
            "npages",
            "pages_sharing",
            "zero_pages",
            "peak_npages",
            "t_final_s",
            "engine_cpu_s",
            "engine_cpu_total_s",
            "cow_breaks",
            "merges",
            "ksm_assist",
            "ksm_pages_sharing",
            "boot_a_s",
            "boot_b_s",
            "read_a_s",
            "read_b_s",
            "read_s",
            "md5s_agree",
            "md5_a",
            "md5_b",
            "ipis",
            "load_avg",
            "warnings",
        ] {
            assert!(row0.get(key).is_some(), "{key} missing: {row0}");
        }
        assert_eq!(row0["samples"][1]["npages"], 30_000);
        assert_eq!(row0["md5_a"]["copy16"], "b".repeat(32));
        let c = linux_read_chart(&r);
        assert_eq!(c.panels.len(), 1);
        let names: Vec<&str> = c.panels[0].lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["pagefold-on", "ksm-4096"]);
        assert!(c.svg().unwrap().contains("<svg"));
    }
}
