//! Printing and saving `auto` results: table, goal checks, markdown, JSON
//! rows, and the chart of saving and free memory over time.

use std::fmt::Write as _;

use crate::auto_bench::{AutoReport, AutoRow};
use crate::chart::{Chart, Line, Panel};
use crate::error::BenchError;
use crate::host::host_line;
use crate::ratio::{fmt_ratio, ratio, Goal};

const MIB: f64 = 1048576.0;
const GIB: f64 = 1073741824.0;

fn num(v: Option<f64>, prec: usize) -> String {
    v.map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

/// Where the rows ran, said once above the table: their times compare
/// only with rows from the same host.
fn host(r: &AutoReport) -> Option<String> {
    host_line(
        r.rows
            .iter()
            .map(|x| (x.host_kind.as_str(), x.host_kernel.as_str())),
    )
}

fn find<'a>(r: &'a AutoReport, name: &str) -> Option<&'a AutoRow> {
    r.rows.iter().find(|x| x.system == name)
}

/// How many times sooner than ksm-default `row` reached 90 %.
pub fn speedup_vs_ksm_default(r: &AutoReport, row: &AutoRow) -> Option<f64> {
    ratio(
        find(r, "ksm-default")?.trigger_to_90pct_s,
        row.trigger_to_90pct_s,
    )
}

/// The project's goals for auto mode.
pub fn auto_goals(r: &AutoReport) -> Vec<Goal> {
    let mut out = Vec::new();
    if let (Some(p), Some(_)) = (find(r, "pagefold-auto"), find(r, "ksm-default")) {
        out.push(Goal::at_least(
            "pagefold-auto reaches 90 % of the saving >= 10x sooner than ksm-default".into(),
            speedup_vs_ksm_default(r, p),
            10.0,
            String::new(),
        ));
    }
    if let Some(p) = find(r, "pagefold-auto") {
        out.push(Goal::at_most(
            "pagefold-auto CPU while untriggered < 1 % of a core".into(),
            p.untriggered_cpu_pct,
            1.0,
            String::new(),
        ));
    }
    out
}

/// The plain-text table under the host line, then goals and warnings.
pub fn auto_table(r: &AutoReport) -> String {
    let mut out = String::new();
    if let Some(h) = host(r) {
        let _ = writeln!(out, "{h}");
    }
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>15} {:>14} {:>14} {:>11} {:>10} {:>11} {:>9}",
        "system",
        "to_90pct_s",
        "untriggered%",
        "triggered_cpu",
        "after90 cpu%",
        "saved_MiB",
        "of_MiB",
        "x ksm-df",
        "load(1m)"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:<14} {:>12} {:>15} {:>14.3} {:>14} {:>11.1} {:>10.1} {:>11} {:>9.2}",
            row.system,
            num(row.trigger_to_90pct_s, 3),
            num(row.untriggered_cpu_pct, 4),
            row.triggered_cpu_s,
            num(row.triggered_cpu_pct_after, 3),
            row.saved_bytes as f64 / MIB,
            row.possible_saved_bytes as f64 / MIB,
            fmt_ratio(speedup_vs_ksm_default(r, row)),
            row.load_avg[0]
        );
    }
    for g in auto_goals(r) {
        let _ = writeln!(out, "{}", g.line());
    }
    for row in &r.rows {
        for w in &row.warnings {
            let _ = writeln!(out, "warning [{}]: {w}", row.system);
        }
    }
    for u in &r.unrestored {
        let _ = writeln!(out, "warning: KSM tunable not restored: {u}");
    }
    out
}

/// The markdown table under the host line, then the goal checks.
pub fn auto_markdown(r: &AutoReport) -> String {
    let mut out = host(r).map_or_else(String::new, |h| format!("{h}\n\n"));
    out.push_str(
        "| system | trigger -> 90 % (s) | CPU untriggered (% core) | CPU trigger -> 90 % (s) | CPU after 90 % (% core) | saved (MiB) | possible (MiB) | speed-up vs ksm-default | load avg 1m |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.3} | {} | {:.1} | {:.1} | {} | {:.2} |",
            row.system,
            num(row.trigger_to_90pct_s, 3),
            num(row.untriggered_cpu_pct, 4),
            row.triggered_cpu_s,
            num(row.triggered_cpu_pct_after, 3),
            row.saved_bytes as f64 / MIB,
            row.possible_saved_bytes as f64 / MIB,
            fmt_ratio(speedup_vs_ksm_default(r, row)),
            row.load_avg[0]
        );
    }
    out.push('\n');
    for g in auto_goals(r) {
        let _ = writeln!(out, "- {}", g.line());
    }
    out
}

pub fn auto_json(r: &AutoReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&r.rows)?)
}

/// Two panels on one time axis (0 = the crossing): saved MiB per system;
/// the scripted free memory with the trigger line, and the host's real
/// MemAvailable during each run.
pub fn auto_chart(r: &AutoReport) -> Chart {
    let saving = Panel {
        title: "auto: memory saved over time (0 = free memory crosses the threshold)".into(),
        x_label: "time since the crossing / switching on (s)".into(),
        y_label: "saved (MiB)".into(),
        log_x: false,
        log_y: false,
        lines: r
            .series
            .iter()
            .map(|s| Line {
                name: s.system.clone(),
                points: s
                    .samples
                    .iter()
                    .map(|p| (p.t_s, p.saved_bytes as f64 / MIB))
                    .collect(),
            })
            .collect(),
    };
    let (t_lo, t_hi) = r
        .series
        .iter()
        .flat_map(|s| s.samples.iter().map(|p| p.t_s))
        .fold((0.0f64, 0.0f64), |(a, b), t| (a.min(t), b.max(t)));
    let script: Vec<(f64, f64)> = r
        .series
        .first()
        .map(|s| {
            s.samples
                .iter()
                .map(|p| (p.t_s, p.script_free_bytes as f64 / GIB))
                .collect()
        })
        .unwrap_or_default();
    let mut lines = vec![
        Line {
            name: "scripted free".into(),
            points: script,
        },
        Line {
            name: "threshold".into(),
            points: vec![
                (t_lo, r.threshold_bytes as f64 / GIB),
                (t_hi, r.threshold_bytes as f64 / GIB),
            ],
        },
    ];
    for s in &r.series {
        let pts: Vec<(f64, f64)> = s
            .samples
            .iter()
            .filter_map(|p| Some((p.t_s, p.host_available_bytes? as f64 / GIB)))
            .collect();
        if !pts.is_empty() {
            lines.push(Line {
                name: format!("host avail ({})", s.system),
                points: pts,
            });
        }
    }
    let free = Panel {
        title: "free memory: scripted signal (16 GiB host) and the real host's MemAvailable".into(),
        x_label: "time since the crossing / switching on (s)".into(),
        y_label: "GiB".into(),
        log_x: false,
        log_y: false,
        lines,
    };
    Chart::new(vec![saving, free])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auto_bench::{AutoSample, AutoSeries};

    fn row(name: &str, t: Option<f64>, untrig: Option<f64>) -> AutoRow {
        AutoRow {
            system: name.into(),
            trigger_to_90pct_s: t,
            untriggered_cpu_pct: untrig,
            triggered_cpu_s: 0.5,
            saved_bytes: 256 << 20,
            possible_saved_bytes: 260 << 20,
            triggered_cpu_pct_after: Some(1.0),
            host_kind: "emulated-svm".into(),
            host_kernel: "6.1.0-28-cloud-amd64".into(),
            load_avg: [0.5; 3],
            warnings: vec![],
        }
    }

    fn report() -> AutoReport {
        let samples = vec![
            AutoSample {
                t_s: -5.0,
                saved_bytes: 0,
                script_free_bytes: 8 << 30,
                host_available_bytes: Some(20 << 30),
                cpu_s: 0.0,
            },
            AutoSample {
                t_s: 2.0,
                saved_bytes: 256 << 20,
                script_free_bytes: 1 << 30,
                host_available_bytes: None,
                cpu_s: 0.2,
            },
        ];
        AutoReport {
            rows: vec![
                row("pagefold-auto", Some(1.5), Some(0.2)),
                row("ksm-default", Some(60.0), None),
                row("ksm-auto", None, Some(0.0)),
            ],
            series: vec![AutoSeries {
                system: "pagefold-auto".into(),
                samples,
            }],
            total_bytes: 16 << 30,
            threshold_bytes: (16 << 30) / 5,
            unrestored: vec![],
        }
    }

    #[test]
    fn goals_and_speedups() {
        let r = report();
        let g = auto_goals(&r);
        assert_eq!(g.len(), 2);
        // 60 / 1.5 = 40x >= 10x; 0.2 % < 1 %.
        assert_eq!(g[0].value, Some(40.0));
        assert_eq!(g[0].met, Some(true));
        assert_eq!(g[1].met, Some(true));
        let t = auto_table(&r);
        assert!(
            t.lines()
                .any(|l| l.starts_with("pagefold-auto") && l.contains("40.00x")),
            "{t}"
        );
        // ksm-auto never reached 90 %: no speed-up.
        assert!(
            t.lines()
                .any(|l| l.starts_with("ksm-auto") && l.contains(" - ")),
            "{t}"
        );
        let v: serde_json::Value = serde_json::from_str(&auto_json(&r).unwrap()).unwrap();
        for k in [
            "system",
            "trigger_to_90pct_s",
            "untriggered_cpu_pct",
            "triggered_cpu_s",
            "saved_bytes",
            "host_kind",
            "host_kernel",
        ] {
            assert!(v[0].get(k).is_some(), "{k}");
        }
        assert!(v[1]["untriggered_cpu_pct"].is_null());
        assert_eq!(v[2]["host_kind"], "emulated-svm");
        let md = auto_markdown(&r);
        assert!(md.contains("| pagefold-auto | 1.500 |"), "{md}");
        // The host once, above the table.
        let host = "host emulated-svm (Linux 6.1.0-28-cloud-amd64)";
        assert!(md.starts_with(&format!("{host}\n\n| system |")), "{md}");
        assert_eq!(t.lines().next(), Some(host), "{t}");
        assert_eq!(t.matches("emulated-svm").count(), 1, "{t}");
    }

    #[test]
    fn chart_has_both_panels() {
        let c = auto_chart(&report());
        assert_eq!(c.panels.len(), 2);
        let svg = c.svg().unwrap();
        let texts = crate::chart::tests::svg_texts(&svg);
        let has = |t: &str| texts.iter().any(|x| x == t);
        assert!(has("threshold") && has("pagefold-auto"), "{texts:?}");
        assert!(has("scripted free") && has("host avail (pagefold-auto)"));
        assert!(texts.iter().any(|t| t.starts_with("auto: memory saved")));
        // The saving line, scripted free, threshold (2 points each) and the
        // host line (1 point: the other sample has no MemAvailable).
        let lines = crate::chart::tests::svg_polylines(&svg);
        let lens: Vec<usize> = lines.iter().map(|l| l.len()).collect();
        assert_eq!(lens, [2, 2, 2, 1], "{lines:?}");
        assert!(!svg.contains("NaN"));
        let (w, h, _, _) = crate::chart::tests::decode_png(&c.png().unwrap());
        assert_eq!(
            (w, h),
            (crate::chart::WIDTH, 2 * crate::chart::PANEL_HEIGHT)
        );
    }
}
