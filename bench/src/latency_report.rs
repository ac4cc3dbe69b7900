//! Printing and saving `latency` results: table, goal checks, markdown,
//! JSON rows, and the chart of each system's pause spectrum.

use std::fmt::Write as _;

use crate::chart::{Chart, Line, Panel};
use crate::error::BenchError;
use crate::host::host_line;
use crate::latency::{LatencyReport, LatencyRow, LatencyShape, ProbePhase};
use crate::ratio::{ratio, Goal};
use crate::table::{Column, Table};

/// Where the rows ran, said once above the table.
fn host(r: &LatencyReport) -> Option<String> {
    host_line(
        r.rows
            .iter()
            .map(|x| (x.host_kind.as_str(), x.host_kernel.as_str())),
    )
}

fn find<'a>(
    r: &'a LatencyReport,
    system: &str,
    shape: LatencyShape,
    phase: ProbePhase,
) -> Option<&'a LatencyRow> {
    r.rows
        .iter()
        .find(|x| x.system == system && x.shape == shape && x.phase == phase)
}

/// Shapes present in the report, in run order.
fn shapes(r: &LatencyReport) -> Vec<LatencyShape> {
    let mut out: Vec<LatencyShape> = Vec::new();
    for row in &r.rows {
        if !out.contains(&row.shape) {
            out.push(row.shape);
        }
    }
    out
}

/// The goals for pauses while merging, per shape.
pub fn latency_goals(r: &LatencyReport) -> Vec<Goal> {
    let mut out = Vec::new();
    for shape in shapes(r) {
        let s = shape.name();
        let get = |sys| find(r, sys, shape, ProbePhase::Merging);
        if let Some(on) = get("pagefold-on") {
            if let Some(k) = get("ksm-max") {
                out.push(Goal::at_most(
                    format!("{s}: pagefold-on p99.9 / ksm-max p99.9"),
                    ratio(Some(on.p999_us), Some(k.p999_us)),
                    1.0,
                    String::new(),
                ));
            }
            if let Some(off) = get("off") {
                out.push(Goal::at_most(
                    format!("{s}: pagefold-on p99.9 / off p99.9"),
                    ratio(Some(on.p999_us), Some(off.p999_us)),
                    1.2,
                    String::new(),
                ));
            }
            out.push(Goal::at_most(
                format!("{s}: pagefold-on max pause (us)"),
                Some(on.max_us),
                1000.0,
                String::new(),
            ));
            out.push(Goal::at_most(
                format!("{s}: pagefold-on stopped time (ms/s)"),
                Some(on.stopped_ms_per_s),
                1.0,
                "includes the host's own noise: see off".into(),
            ));
        }
        if let Some(max) = get("pagefold-max") {
            out.push(Goal::at_most(
                format!("{s}: pagefold-max max pause (us)"),
                Some(max.max_us),
                2000.0,
                String::new(),
            ));
        }
    }
    out
}

fn cow(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |c| c.to_string())
}

/// Every row, as cells under the report's columns.
fn latency_cells(r: &LatencyReport) -> Table {
    const fn col(short: &'static str, long: &'static str) -> Column {
        Column { short, long }
    }
    let mut t = Table::new(
        &[
            col("system", "system"),
            col("shape", "shape"),
            col("phase", "probe"),
            col("gaps", "gaps"),
            col("p50_us", "p50 (µs)"),
            col("p99_us", "p99 (µs)"),
            col("p99.9_us", "p99.9 (µs)"),
            col("max_us", "max (µs)"),
            col("stop_ms/s", "stopped (ms/s)"),
            col("merged/possible", "merged pages"),
            col("cow_brk", "COW breaks"),
            col("written", "pages written"),
            col("parks", "parks"),
            col("park_p99/max", "park p99 / max (µs)"),
            col("parked_ms/s", "parked (ms/s)"),
            col("load1", "load avg 1m"),
        ],
        3,
    );
    for x in &r.rows {
        t.row(vec![
            x.system.clone(),
            x.shape.name().to_string(),
            x.phase.name().to_string(),
            x.gaps.to_string(),
            format!("{:.0}", x.p50_us),
            format!("{:.0}", x.p99_us),
            format!("{:.0}", x.p999_us),
            format!("{:.0}", x.max_us),
            format!("{:.2}", x.stopped_ms_per_s),
            format!("{} / {}", x.merged_pages, x.possible_pages),
            cow(x.cow_breaks),
            x.pages_written.to_string(),
            x.parks.to_string(),
            format!("{:.0} / {:.0}", x.park_p99_us, x.park_max_us),
            format!("{:.2}", x.parked_ms_per_s),
            format!("{:.2}", x.load_avg[0]),
        ]);
    }
    t
}

/// The plain-text table under the host line, then goals and warnings.
pub fn latency_table(r: &LatencyReport) -> String {
    let mut out = host(r).map_or_else(String::new, |h| format!("{h}\n"));
    out.push_str(&latency_cells(r).text());
    for g in latency_goals(r) {
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
pub fn latency_markdown(r: &LatencyReport) -> String {
    let mut out = host(r).map_or_else(String::new, |h| format!("{h}\n\n"));
    out.push_str(&latency_cells(r).markdown());
    out.push('\n');
    for g in latency_goals(r) {
        let _ = writeln!(out, "- {}", g.line());
    }
    out
}

pub fn latency_json(r: &LatencyReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&r.rows)?)
}

/// One panel per (shape, probe): each system's pause spectrum, the pause
/// at p50, p90, p99, p99.9 and p99.99, on log axes (1/(1-q) across, µs
/// up): the pauses span from the probe's 1 µs floor to tens of ms.
pub fn latency_chart(r: &LatencyReport) -> Chart {
    let mut panels = Vec::new();
    for shape in shapes(r) {
        for phase in [ProbePhase::Merging, ProbePhase::Cow] {
            let lines: Vec<Line> = r
                .rows
                .iter()
                .filter(|x| x.shape == shape && x.phase == phase)
                .map(|x| Line {
                    name: x.system.clone(),
                    points: x.spectrum.clone(),
                })
                .collect();
            if lines.is_empty() {
                continue;
            }
            panels.push(Panel {
                title: format!(
                    "latency, {} shape, {} probe: guest pauses by percentile",
                    shape.name(),
                    phase.name()
                ),
                x_label: "1/(1-q): 2 = p50, 100 = p99, 1000 = p99.9, 10000 = p99.99".into(),
                y_label: "pause (us)".into(),
                log_x: true,
                log_y: true,
                lines,
            });
        }
    }
    Chart::new(panels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, phase: ProbePhase, p999: f64, max: f64) -> LatencyRow {
        LatencyRow {
            system: system.into(),
            shape: LatencyShape::Full,
            phase,
            gaps: 100,
            p50_us: 2.0,
            p99_us: 20.0,
            p999_us: p999,
            max_us: max,
            stopped_ms_per_s: 0.5,
            probe_ms: 2000.0,
            merged_pages: 1000,
            possible_pages: 1100,
            cow_breaks: if system == "ksm-max" { None } else { Some(7) },
            pages_written: 0,
            engine_cpu_s: 0.1,
            parks: if system.starts_with("pagefold") {
                12
            } else {
                0
            },
            park_p99_us: 480.0,
            park_max_us: 610.0,
            parked_ms_per_s: 1.5,
            spectrum: vec![(2.0, 2.0), (100.0, 20.0), (1000.0, p999)],
            host_kind: "pvm".into(),
            host_kernel: "6.18.0".into(),
            load_avg: [0.5; 3],
            warnings: Vec::new(),
        }
    }

    fn report() -> LatencyReport {
        LatencyReport {
            rows: vec![
                row("off", ProbePhase::Merging, 50.0, 400.0),
                row("off", ProbePhase::Cow, 60.0, 500.0),
                row("pagefold-on", ProbePhase::Merging, 55.0, 900.0),
                row("pagefold-on", ProbePhase::Cow, 80.0, 700.0),
                row("ksm-max", ProbePhase::Merging, 110.0, 3000.0),
            ],
            unrestored: Vec::new(),
        }
    }

    #[test]
    fn goals_compare_the_merging_probe_with_off_and_ksm_max() {
        let g = latency_goals(&report());
        let by = |n: &str| g.iter().find(|g| g.name == n).unwrap().clone();
        let vs_ksm = by("full: pagefold-on p99.9 / ksm-max p99.9");
        assert_eq!(vs_ksm.value, Some(0.5));
        assert_eq!(vs_ksm.met, Some(true));
        let vs_off = by("full: pagefold-on p99.9 / off p99.9");
        assert_eq!(vs_off.value, Some(1.1));
        assert_eq!(by("full: pagefold-on max pause (us)").met, Some(true));
        assert_eq!(by("full: pagefold-on stopped time (ms/s)").met, Some(true));
        // No pagefold-max row: no goal about it.
        assert!(!g.iter().any(|g| g.name.contains("pagefold-max")));
    }

    #[test]
    fn table_markdown_json_and_chart_carry_every_row() {
        let r = report();
        let t = latency_table(&r);
        assert!(t.starts_with("host pvm"), "{t}");
        assert_eq!(
            t.lines().filter(|l| l.starts_with("pagefold-on ")).count(),
            2
        );
        // KSM without a COW counter shows "-", not 0.
        let ksm = t.lines().find(|l| l.starts_with("ksm-max")).unwrap();
        assert!(ksm.contains(" - "), "{ksm}");
        // The engine's parks: count, p99, max, parked time.
        let on = t.lines().find(|l| l.starts_with("pagefold-on")).unwrap();
        let cells: Vec<&str> = on.split_whitespace().collect();
        assert!(
            cells
                .windows(5)
                .any(|w| w == ["12", "480", "/", "610", "1.50"]),
            "{on}"
        );
        let md = latency_markdown(&r);
        assert_eq!(md.lines().filter(|l| l.starts_with("| off |")).count(), 2);
        assert!(md.contains("| 1000 / 1100 |"), "{md}");
        assert!(md.contains("| 12 | 480 / 610 | 1.50 |"), "{md}");
        let j: serde_json::Value = serde_json::from_str(&latency_json(&r).unwrap()).unwrap();
        let rows = j.as_array().unwrap();
        assert_eq!(rows.len(), 5);
        for k in [
            "system",
            "shape",
            "p99_us",
            "p999_us",
            "max_us",
            "stopped_ms_per_s",
            "merged_pages",
            "cow_breaks",
            "parks",
            "park_p99_us",
            "park_max_us",
            "parked_ms_per_s",
        ] {
            assert!(rows.iter().all(|x| x.get(k).is_some()), "{k}");
        }
        assert!(rows[4]["cow_breaks"].is_null());
        let c = latency_chart(&r);
        assert_eq!(c.panels.len(), 2);
        assert_eq!(c.panels[0].lines.len(), 3);
        assert_eq!(c.panels[1].lines.len(), 2);
        assert!(c.svg().unwrap().contains("pagefold-on"));
    }
}
