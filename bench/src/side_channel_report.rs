//! Printing and saving `side-channel` results: table, goal checks,
//! markdown, JSON rows, and the chart of each label's write times.

use std::fmt::Write as _;

use crate::chart::{Chart, Line, Panel};
use crate::error::BenchError;
use crate::host::host_line;
use crate::ratio::Goal;
use crate::side_channel::{SideChannelReport, Variant};
use crate::table::{Column, Table};
use pagefold_guest_abi::merge_probe::QUANTILES_PERMILLE;

/// Where the rows ran, said once above the table.
fn host(r: &SideChannelReport) -> Option<String> {
    host_line(
        r.rows
            .iter()
            .map(|x| (x.host_kind.as_str(), x.host_kernel.as_str())),
    )
}

/// Variants present in the report, in run order.
fn variants(r: &SideChannelReport) -> Vec<Variant> {
    let mut out: Vec<Variant> = Vec::new();
    for row in &r.rows {
        if !out.contains(&row.variant) {
            out.push(row.variant);
        }
    }
    out
}

/// Issue 34's goals for the attack, by write time and by the read after
/// the write: accuracy at least 0.9 against kernel KSM and pagefold's
/// default (one-group) merging, on both variants; the sanity check that
/// with dedup off it is at chance (at most 0.6); and against a hardened
/// group at most 0.6, with at least 0.8 of the default group's saving, at
/// most twice its engine CPU, and a first write to a page with no twin at
/// most 1.25 times the same write in the default group (each measured by
/// the attacker's own timer, the median of its unique pages).
pub fn side_channel_goals(r: &SideChannelReport) -> Vec<Goal> {
    let mut out = Vec::new();
    for x in r.rows.iter().filter(|x| x.system == "pagefold-hardened") {
        let Some(d) = r
            .rows
            .iter()
            .find(|d| d.system == "pagefold-on" && d.variant == x.variant)
        else {
            continue;
        };
        let v = x.variant.name();
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        out.push(Goal::at_least(
            format!("{v} pagefold-hardened: saving vs pagefold-on"),
            ratio(x.pages_saved as f64, d.pages_saved as f64),
            0.8,
            format!("{} against {} pages", x.pages_saved, d.pages_saved),
        ));
        out.push(Goal::at_most(
            format!("{v} pagefold-hardened: engine CPU vs pagefold-on"),
            ratio(x.engine_cpu_s, d.engine_cpu_s),
            2.0,
            format!("{:.3} s against {:.3} s", x.engine_cpu_s, d.engine_cpu_s),
        ));
        out.push(Goal::at_most(
            format!("{v} pagefold-hardened: first write to a page with no twin vs pagefold-on"),
            ratio(x.unique_median_us, d.unique_median_us),
            1.25,
            format!(
                "median {:.2} us against {:.2} us",
                x.unique_median_us, d.unique_median_us
            ),
        ));
    }
    for x in &r.rows {
        for (what, acc) in [
            ("attack accuracy", x.accuracy),
            ("read-after-write accuracy", x.read_accuracy),
        ] {
            let name = format!("{} {}: {what}", x.variant.name(), x.system);
            match x.system.as_str() {
                "off" => out.push(Goal::at_most(
                    name,
                    Some(acc),
                    0.6,
                    "dedup off: chance is 0.5".into(),
                )),
                "pagefold-on" | "ksm-default" | "ksm-max" => {
                    out.push(Goal::at_least(name, Some(acc), 0.9, String::new()))
                }
                "pagefold-hardened" => out.push(Goal::at_most(
                    name,
                    Some(acc),
                    0.6,
                    "a hardened group: chance is 0.5".into(),
                )),
                _ => {}
            }
        }
    }
    out
}

/// Every row, as cells under the report's columns.
fn side_channel_cells(r: &SideChannelReport) -> Table {
    const fn col(short: &'static str, long: &'static str) -> Column {
        Column { short, long }
    }
    let mut t = Table::new(
        &[
            col("system", "system"),
            col("variant", "variant"),
            col("accuracy", "accuracy"),
            col("right/tested", "right / tested"),
            col("read_acc", "read after write: accuracy"),
            col("shared_us", "median write, shared (µs)"),
            col("unique_us", "median write, unique (µs)"),
            col("thresh_us", "threshold over baseline (µs)"),
            col("saved/target", "pages saved / target"),
            col("cpu_s", "engine CPU (s)"),
            col("wait_s", "merge wait (s)"),
            col("load1", "load avg 1m"),
        ],
        2,
    );
    for x in &r.rows {
        t.row(vec![
            x.system.clone(),
            x.variant.name().to_string(),
            format!("{:.3}", x.accuracy),
            format!("{} / {}", x.probe.correct, x.probe.tested),
            format!("{:.3}", x.read_accuracy),
            format!("{:.2}", x.shared_median_us),
            format!("{:.2}", x.unique_median_us),
            format!("{:.2}", x.threshold_us),
            format!("{} / {}", x.pages_saved, x.target_pages),
            format!("{:.3}", x.engine_cpu_s),
            format!(
                "{:.1}{}",
                x.merge_wait_s,
                if x.converged { "" } else { " (not converged)" }
            ),
            format!("{:.2}", x.load_avg[0]),
        ]);
    }
    t
}

/// The plain-text table under the host line, then goals and warnings.
pub fn side_channel_table(r: &SideChannelReport) -> String {
    let mut out = host(r).map_or_else(String::new, |h| format!("{h}\n"));
    out.push_str(&side_channel_cells(r).text());
    for g in side_channel_goals(r) {
        let _ = writeln!(out, "{}", g.line());
    }
    let mut seen = Vec::new();
    for x in &r.rows {
        for w in &x.warnings {
            if !seen.contains(&(&x.system, w)) {
                seen.push((&x.system, w));
                let _ = writeln!(out, "warning [{}]: {w}", x.system);
            }
        }
    }
    for u in &r.unrestored {
        let _ = writeln!(out, "warning: KSM tunable not restored: {u}");
    }
    out
}

/// The markdown table under the host line, then the goal checks.
pub fn side_channel_markdown(r: &SideChannelReport) -> String {
    let mut out = host(r).map_or_else(String::new, |h| format!("{h}\n\n"));
    out.push_str(&side_channel_cells(r).markdown());
    out.push('\n');
    for g in side_channel_goals(r) {
        let _ = writeln!(out, "- {}", g.line());
    }
    out
}

pub fn side_channel_json(r: &SideChannelReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&r.rows)?)
}

/// One panel per variant: each system's write times of the shared-labelled
/// and the unique-labelled probe pages at min, p10, p25, p50, p75 and p90
/// (a log axis: a COW fault is µs, a plain write a fraction of one; the
/// maximum, a preemption now and then of milliseconds, is left out so the
/// axis shows the gap the attack reads). Where a system's two lines lie
/// apart, the attacker tells its pages apart.
pub fn side_channel_chart(r: &SideChannelReport) -> Chart {
    let last = QUANTILES_PERMILLE.len() - 1;
    let q = |us: &[f64; 7]| -> Vec<(f64, f64)> {
        QUANTILES_PERMILLE[..last]
            .iter()
            .zip(us)
            .map(|(&p, &v)| (p as f64 / 10.0, v))
            .collect()
    };
    let panels = variants(r)
        .into_iter()
        .map(|v| Panel {
            title: format!(
                "side-channel, {} variant: attacker's write times by label",
                v.name()
            ),
            x_label: "quantile of the label's writes (%)".into(),
            y_label: "write time (us)".into(),
            log_x: false,
            log_y: true,
            lines: r
                .rows
                .iter()
                .filter(|x| x.variant == v)
                .flat_map(|x| {
                    [
                        Line {
                            name: format!("{} {}", x.system, v.name()),
                            points: q(&x.probe.shared_us),
                        },
                        Line {
                            name: format!("{} unique", x.system),
                            points: q(&x.probe.unique_us),
                        },
                    ]
                })
                .collect(),
        })
        .collect();
    Chart::new(panels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::side_channel::SideChannelRow;
    use pagefold_vmm::workload::merge_probe::ProbeRow;

    fn row(system: &str, variant: Variant, accuracy: f64) -> SideChannelRow {
        let probe = ProbeRow {
            accuracy,
            pages: 2000,
            shared_pages: 1000,
            tested: 1000,
            correct: (accuracy * 1000.0) as u64,
            threshold_us: 5.3,
            shared_median_us: 5.8,
            unique_median_us: 4.6,
            shared_us: [5.0, 5.5, 5.7, 5.8, 5.9, 6.1, 40.0],
            unique_us: [4.4, 4.5, 4.6, 4.6, 4.7, 4.8, 9.0],
            read_accuracy: if system == "off" { 0.5 } else { 0.999 },
            shared_read_median_us: 0.02,
            unique_read_median_us: 0.1,
        };
        SideChannelRow {
            system: system.into(),
            variant,
            accuracy,
            read_accuracy: probe.read_accuracy,
            pages_saved: if system == "off" { 0 } else { 1060 },
            target_pages: 1000,
            engine_cpu_s: 0.02,
            shared_median_us: probe.shared_median_us,
            unique_median_us: probe.unique_median_us,
            threshold_us: probe.threshold_us,
            probe,
            merge_wait_s: 1.5,
            converged: system != "ksm-default",
            host_kind: "pvm".into(),
            host_kernel: "6.18.0".into(),
            load_avg: [0.5; 3],
            warnings: Vec::new(),
        }
    }

    fn report() -> SideChannelReport {
        SideChannelReport {
            rows: vec![
                row("off", Variant::Shared, 0.5),
                row("pagefold-on", Variant::Shared, 0.99),
                row("pagefold-groups", Variant::Shared, 0.52),
                row("ksm-default", Variant::Shared, 0.85),
                row("off", Variant::Zero, 0.7),
                row("pagefold-on", Variant::Zero, 1.0),
                row("pagefold-hardened", Variant::Zero, 0.55),
            ],
            unrestored: Vec::new(),
        }
    }

    #[test]
    fn goals_ask_for_accuracy_against_mergers_and_chance_with_dedup_off() {
        let g = side_channel_goals(&report());
        let by = |n: &str| g.iter().find(|g| g.name == n).unwrap().clone();
        assert_eq!(by("shared off: attack accuracy").met, Some(true));
        assert_eq!(by("shared pagefold-on: attack accuracy").met, Some(true));
        assert_eq!(by("shared ksm-default: attack accuracy").met, Some(false));
        assert_eq!(by("zero off: attack accuracy").met, Some(false));
        // Separate groups promise nothing about the attack: no goal.
        assert!(!g.iter().any(|g| g.name.contains("pagefold-groups")));
        assert_eq!(
            by("zero pagefold-on: read-after-write accuracy").met,
            Some(true)
        );
        // A hardened group: the attack at chance, and its costs against
        // the default group's (the test rows: the same saving, CPU and
        // write times).
        assert_eq!(
            by("zero pagefold-hardened: attack accuracy").met,
            Some(true)
        );
        assert_eq!(
            by("zero pagefold-hardened: saving vs pagefold-on").value,
            Some(1.0)
        );
        assert_eq!(
            by("zero pagefold-hardened: first write to a page with no twin vs pagefold-on").met,
            Some(true)
        );
        assert_eq!(g.len(), 15);
    }

    #[test]
    fn table_markdown_json_and_chart_carry_every_row() {
        let r = report();
        let t = side_channel_table(&r);
        assert!(t.starts_with("host pvm"), "{t}");
        assert_eq!(t.lines().filter(|l| l.starts_with("off ")).count(), 2);
        let ksm = t.lines().find(|l| l.starts_with("ksm-default")).unwrap();
        assert!(ksm.contains("(not converged)"), "{ksm}");
        assert!(
            ksm.contains(" 0.850 ") && ksm.contains(" 850 / 1000 "),
            "{ksm}"
        );
        assert!(ksm.contains(" 0.999 "), "{ksm}");
        let md = side_channel_markdown(&r);
        assert_eq!(md.lines().filter(|l| l.starts_with("| off |")).count(), 2);
        assert!(
            md.contains("| 990 / 1000 | 0.999 | 5.80 | 4.60 | 5.30 | 1060 / 1000 |"),
            "{md}"
        );
        let j: serde_json::Value = serde_json::from_str(&side_channel_json(&r).unwrap()).unwrap();
        let rows = j.as_array().unwrap();
        assert_eq!(rows.len(), 7);
        for k in [
            "system",
            "variant",
            "accuracy",
            "pages_saved",
            "engine_cpu_s",
            "shared_median_us",
            "unique_median_us",
            "threshold_us",
            "read_accuracy",
            "probe",
        ] {
            assert!(rows.iter().all(|x| x.get(k).is_some()), "{k}");
        }
        assert_eq!(rows[4]["variant"], "zero");
        assert_eq!(rows[1]["probe"]["shared_us"].as_array().unwrap().len(), 7);
        let c = side_channel_chart(&r);
        assert_eq!(c.panels.len(), 2);
        assert_eq!(c.panels[0].lines.len(), 8);
        assert_eq!(c.panels[1].lines.len(), 6);
        assert_eq!(c.panels[0].lines[0].points.len(), 6);
        assert_eq!(c.panels[0].lines[0].name, "off shared");
        assert_eq!(c.panels[1].lines[1].name, "off unique");
        assert!(c.svg().unwrap().contains("pagefold-on"));
    }
}
