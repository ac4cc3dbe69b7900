//! Outputs of the `linux-free` benchmark: the table (plain text for the
//! terminal, markdown for docs/results, from one set of cells), the goal
//! checks, the JSON report with every system's samples, and the chart of
//! host memory over time.

use std::fmt::Write as _;

use crate::chart::{simplify, Chart, Line, Panel};
use crate::error::BenchError;
use crate::linux_free::{
    mib, LinuxFreeReport, LinuxFreeRow, BACK_SHARE, BACK_WITHIN_S, DUPLICATE_FREED_MIB,
};
use crate::ratio::Goal;
use crate::table::{Column, Table};

fn row<'a>(r: &'a LinuxFreeReport, system: &str) -> Option<&'a LinuxFreeRow> {
    r.rows.iter().find(|x| x.system == system)
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// Every row, as cells under the report's columns.
fn cells(r: &LinuxFreeReport) -> Table {
    const fn col(short: &'static str, long: &'static str) -> Column {
        Column { short, long }
    }
    let mut t = Table::new(
        &[
            col("system", "system"),
            col("host_mib_end", "host MiB at the end"),
            col("pre_free", "host MiB before the free"),
            col("peak", "host MiB peak"),
            col("pss_mib", "process PSS MiB"),
            col("freed_mib", "guests freed (MiB)"),
            col("freed_host", "freed, as dedup alone holds it (MiB)"),
            col("saved_pages", "saved pages"),
            col("reported_pages", "reported pages"),
            col("returned", "engine's returned pages"),
            col("back_90_s", "90 % back after (s)"),
            col("back_5s", "back within 5 s"),
            col("engine_s", "engine CPU (s)"),
            col("md5_ok", "kept data intact"),
        ],
        1,
    );
    for x in &r.rows {
        t.row(vec![
            x.system.clone(),
            format!("{:.0}", x.host_mib_end),
            format!("{:.0}", x.host_mib_pre_free),
            format!("{:.0}", x.host_mib_peak),
            format!("{:.0}", x.pss_mib_end),
            format!("{:.0}", x.freed_mib),
            format!("{:.0}", x.freed_host_mib),
            x.saved_pages.to_string(),
            x.reported_pages.to_string(),
            x.engine_pages_returned
                .map_or("-".into(), |n| n.to_string()),
            fmt_opt(x.back_90_s, 1),
            x.back_5s_share
                .map_or("-".into(), |s| format!("{:.1} %", s * 100.0)),
            format!("{:.2}", x.engine_cpu_s),
            if x.md5_ok { "yes" } else { "NO" }.into(),
        ]);
    }
    t
}

/// The line above the table: what ran where.
fn header(r: &LinuxFreeReport) -> String {
    let g = &r.guest;
    format!(
        "linux-free: two Linux guests ({} each, 1 vCPU, one dedup group) do the same work, \
         hold it {} s, free most of it and idle {} s; host {} (Linux {}); host MiB = distinct \
         frames of the guests' RAM and the dedup pool (pagemap, the zero page not counted), \
         sampled every {} s{}",
        g.memory,
        g.hold_s,
        g.idle_s,
        r.host_kind,
        r.host_kernel,
        g.sample_interval_s,
        g.reporting_order.map_or(String::new(), |o| format!(
            "; the guests report free blocks of 2^{o} pages and up (page_reporting_order)"
        ))
    )
}

/// Issue 37's goals: with dedup and reporting both on, the guests cost
/// at most what dedup alone costs minus what they freed (as dedup alone
/// held it); every reporting system has 90 % of what was freed back
/// within 5 s; every system's guests kept intact data.
pub fn linux_free_goals(r: &LinuxFreeReport) -> Vec<Goal> {
    let mut out = Vec::new();
    if let (Some(both), Some(on)) = (row(r, "pagefold-fpr"), row(r, "pagefold-on")) {
        let bound = on.host_mib_end - both.freed_host_mib;
        out.push(Goal::at_most(
            "pagefold-fpr host memory <= pagefold-on's minus what the guests freed (ratio)".into(),
            (bound > 0.0).then(|| both.host_mib_end / bound),
            1.0,
            format!(
                "{:.0} MiB against {:.0} - {:.0} = {:.0} MiB",
                both.host_mib_end, on.host_mib_end, both.freed_host_mib, bound
            ),
        ));
    }
    for x in r.rows.iter().filter(|x| x.reporting) {
        out.push(Goal::at_least(
            format!(
                "{}: share of the freed memory back on the host within {BACK_WITHIN_S} s",
                x.system
            ),
            x.back_5s_share,
            BACK_SHARE,
            format!("90 % after {} s", fmt_opt(x.back_90_s, 1)),
        ));
    }
    out.extend(Goal::every_system(
        "guests' kept data intact (md5)",
        &r.rows,
        |x| x.md5_ok,
    ));
    out
}

/// Notes under the table: how the bound is counted, the comparisons,
/// warnings, damaged data and unrestored KSM tunables.
fn notes(r: &LinuxFreeReport) -> Vec<String> {
    let mut notes = vec![format!(
        "freed, as dedup alone holds it = what both guests freed (the rise of their free memory) less \
         the {DUPLICATE_FREED_MIB} MiB of it that were copies of content dedup holds once \
         (four copies of the 64 MiB file, page caches and tmpfs, and the page caches of the \
         16 MiB file, which the kept copies still hold)"
    )];
    if let (Some(both), Some(ksm)) = (row(r, "pagefold-fpr"), row(r, "ksm-fpr")) {
        if ksm.host_mib_end > 0.0 {
            notes.push(format!(
                "pagefold-fpr vs ksm-fpr: host memory at the end {:.2}x ({:.0} against {:.0} MiB)",
                both.host_mib_end / ksm.host_mib_end,
                both.host_mib_end,
                ksm.host_mib_end
            ));
        }
    }
    if r.host_kind == pagefold_vmm::host_kind::EMULATED_SVM {
        notes.push(
            "under the emulated host page counts are real; times compare only within this run"
                .into(),
        );
    }
    for x in &r.rows {
        notes.extend(x.warnings.iter().map(|w| format!("{}: {w}", x.system)));
        if !x.md5_ok {
            notes.push(format!(
                "{}: KEPT DATA DIFFERS: a {:?}, b {:?}",
                x.system, x.kept_a, x.kept_b
            ));
        }
    }
    notes.extend(
        r.unrestored
            .iter()
            .map(|u| format!("KSM tunable not restored: {u}")),
    );
    notes
}

/// The plain-text table under the header, then notes and goal checks.
pub fn linux_free_table(r: &LinuxFreeReport) -> String {
    let mut out = format!("{}\n", header(r));
    out.push_str(&cells(r).text());
    for n in notes(r) {
        let _ = writeln!(out, "note: {n}");
    }
    for g in linux_free_goals(r) {
        let _ = writeln!(out, "{}", g.line());
    }
    out
}

/// The markdown table under the header, then notes and goal checks.
pub fn linux_free_markdown(r: &LinuxFreeReport) -> String {
    let mut out = format!("{}.\n\n", header(r));
    out.push_str(&cells(r).markdown());
    out.push('\n');
    for n in notes(r) {
        let _ = writeln!(out, "- {n}");
    }
    for g in linux_free_goals(r) {
        let _ = writeln!(out, "- {}", g.line());
    }
    out
}

/// `{"host_kind", "host_kernel", "guest": {...}, "rows": [...],
/// "unrestored": [...]}`; each row carries its samples.
pub fn linux_free_json(r: &LinuxFreeReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(r)?)
}

/// Host memory over time since the work was posted, one line per system.
pub fn linux_free_chart(r: &LinuxFreeReport) -> Chart {
    let lines = r
        .rows
        .iter()
        .map(|x| {
            let pts: Vec<(f64, f64)> = x
                .samples
                .iter()
                .filter(|s| s.host_pages > 0)
                .map(|s| (s.t_s, mib(s.host_pages)))
                .collect();
            Line {
                name: x.system.clone(),
                points: simplify(&pts),
            }
        })
        .collect();
    Chart::new(vec![Panel {
        title: format!(
            "linux-free: host memory of two Linux guests (host {})",
            r.host_kind
        ),
        x_label: "time since the work was posted (s)".into(),
        y_label: "host MiB (guest RAM and pool frames)".into(),
        log_x: false,
        log_y: false,
        lines,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux_free::tests::{H1, H2};
    use crate::linux_free::{FreeSample, Kept, LinuxFreeGuest};

    fn kept() -> Kept {
        Kept {
            keep: H1.into(),
            keepown: H2.into(),
            data16: H1.into(),
        }
    }

    fn r(system: &str, reporting: bool, host_mib_end: f64, freed_host_mib: f64) -> LinuxFreeRow {
        LinuxFreeRow {
            system: system.into(),
            reporting,
            host_mib_end,
            host_mib_pre_free: 600.0,
            host_mib_peak: 650.0,
            pss_mib_end: host_mib_end + 20.0,
            freed_mib: freed_host_mib + 224.0,
            freed_a_mib: 176.0,
            freed_b_mib: 176.0,
            freed_host_mib,
            saved_pages: 40_000,
            pages_sharing: 30_000,
            zero_pages: 10_000,
            reported_pages: 50_000,
            returned_pages: 50_000,
            engine_pages_returned: Some(45_000),
            back_90_s: reporting.then_some(3.5),
            back_5s_share: reporting.then_some(0.93),
            t_free_posted_s: 50.0,
            t_freed_s: 51.0,
            work_s: 8.0,
            engine_cpu_s: 1.5,
            boot_a_s: 15.0,
            boot_b_s: 16.0,
            md5_ok: true,
            kept_a: kept(),
            kept_b: kept(),
            load_avg: [1.0, 1.0, 1.0],
            warnings: vec![],
            samples: vec![
                FreeSample {
                    t_s: 0.0,
                    host_pages: 0,
                    saved_pages: 0,
                    reported_pages: 0,
                },
                FreeSample {
                    t_s: 1.0,
                    host_pages: (host_mib_end * 256.0) as u64,
                    saved_pages: 40_000,
                    reported_pages: 50_000,
                },
            ],
        }
    }

    fn report(rows: Vec<LinuxFreeRow>) -> LinuxFreeReport {
        LinuxFreeReport {
            host_kind: "emulated-svm".into(),
            host_kernel: "6.1.0-28-cloud-amd64".into(),
            guest: LinuxFreeGuest {
                kernel: "/guest/vmlinux".into(),
                memory: "512M".into(),
                reporting_order: None,
                work_script: crate::linux_free::work_script(None),
                free_script: crate::linux_free::free_script(),
                sample_interval_s: 0.5,
                hold_s: 40.0,
                idle_s: 40.0,
                vm_cpus: [Some(1), Some(2)],
                console_dir: "/out/consoles".into(),
            },
            rows,
            unrestored: vec![],
        }
    }

    fn goal<'a>(g: &'a [Goal], prefix: &str) -> &'a Goal {
        g.iter()
            .find(|g| g.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no goal {prefix}: {g:?}"))
    }

    #[test]
    fn both_on_is_held_to_dedup_alone_minus_what_was_freed() {
        // pagefold-on 500 MiB, 208 MiB freed as it held them: both must
        // end at 292 MiB or less.
        let judge = |both_end: f64| {
            let rep = report(vec![
                r("pagefold-on", false, 500.0, 208.0),
                r("pagefold-fpr", true, both_end, 208.0),
            ]);
            goal(&linux_free_goals(&rep), "pagefold-fpr host memory").clone()
        };
        let met = judge(290.0);
        assert_eq!(met.met, Some(true), "{met:?}");
        assert_eq!(met.note, "290 MiB against 500 - 208 = 292 MiB");
        let missed = judge(300.0);
        assert_eq!(missed.met, Some(false));
        assert!((missed.value.unwrap() - 300.0 / 292.0).abs() < 1e-9);
        // Without pagefold-on nothing to hold it to.
        let alone = report(vec![r("pagefold-fpr", true, 290.0, 208.0)]);
        assert!(!linux_free_goals(&alone)
            .iter()
            .any(|g| g.name.starts_with("pagefold-fpr host memory")));
    }

    #[test]
    fn every_reporting_system_must_have_90_percent_back_within_5_s() {
        let mut fpr = r("fpr", true, 400.0, 0.0);
        fpr.back_5s_share = Some(0.6);
        fpr.back_90_s = Some(9.0);
        let mut ksm = r("ksm-fpr", true, 300.0, 208.0);
        ksm.md5_ok = false;
        let rep = report(vec![r("off", false, 700.0, 0.0), fpr, ksm]);
        let g = linux_free_goals(&rep);
        // off has no reporting: no goal of its own.
        assert!(!g.iter().any(|g| g.name.starts_with("off:")), "{g:?}");
        let f = goal(&g, "fpr: share of the freed memory back");
        assert_eq!((f.met, f.note.as_str()), (Some(false), "90 % after 9.0 s"));
        assert_eq!(goal(&g, "ksm-fpr: share").met, Some(true));
        let d = goal(&g, "every system's guests' kept data intact");
        assert_eq!(d.met, Some(false));
        assert!((d.value.unwrap() - 2.0 / 3.0).abs() < 1e-9);
        let md = linux_free_markdown(&rep);
        assert!(md.contains("- ksm-fpr: KEPT DATA DIFFERS"), "{md}");
        assert!(md.contains("- [MISSED] fpr: share of the freed memory back on the host within 5 s: 0.600 (goal >= 0.9)"), "{md}");
    }

    #[test]
    fn the_table_has_a_row_per_system_in_both_renderings() {
        let rep = report(vec![
            r("pagefold-on", false, 500.0, 208.0),
            r("pagefold-fpr", true, 290.0, 208.0),
            r("ksm-fpr", true, 300.0, 208.0),
        ]);
        let md = linux_free_markdown(&rep);
        let lines: Vec<&str> = md.lines().collect();
        assert!(
            lines[0].starts_with("linux-free: two Linux guests (512M each"),
            "{md}"
        );
        assert!(
            lines[2].starts_with("| system | host MiB at the end |"),
            "{md}"
        );
        assert_eq!(
            lines[5],
            "| pagefold-fpr | 290 | 600 | 650 | 310 | 432 | 208 | 40000 | 50000 | 45000 | 3.5 | 93.0 % | 1.50 | yes |"
        );
        assert!(lines[4].contains("| - | - | 1.50 | yes |"), "{}", lines[4]);
        assert!(
            md.contains(
                "- pagefold-fpr vs ksm-fpr: host memory at the end 0.97x (290 against 300 MiB)"
            ),
            "{md}"
        );
        assert!(md.contains("- under the emulated host"), "{md}");
        let text = linux_free_table(&rep);
        assert!(text.lines().nth(1).unwrap().starts_with("system"), "{text}");
        assert!(text.contains("\npagefold-fpr "), "{text}");
        assert!(text.contains("[met] pagefold-fpr host memory"), "{text}");
    }

    #[test]
    fn json_rows_carry_the_issue_fields_and_the_chart_a_line_per_system() {
        let rep = report(vec![
            r("off", false, 700.0, 0.0),
            r("pagefold-fpr", true, 290.0, 208.0),
        ]);
        let v: serde_json::Value = serde_json::from_str(&linux_free_json(&rep).unwrap()).unwrap();
        let row1 = &v["rows"][1];
        for key in [
            "system",
            "host_mib_end",
            "freed_mib",
            "saved_pages",
            "reported_pages",
            "back_90_s",
            "md5_ok",
            "samples",
        ] {
            assert!(row1.get(key).is_some(), "{key} missing: {row1}");
        }
        assert_eq!(row1["back_90_s"], 3.5);
        assert!(v["rows"][0]["back_90_s"].is_null());
        let back: LinuxFreeReport = serde_json::from_value(v).unwrap();
        assert_eq!(back.rows.len(), 2);
        let c = linux_free_chart(&rep);
        let names: Vec<&str> = c.panels[0].lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["off", "pagefold-fpr"]);
        // The sample without frames is left out.
        assert!(c.panels[0].lines[0].points.iter().all(|p| p.1 > 0.0));
        assert!(c.svg().unwrap().contains("<svg"));
    }
}
