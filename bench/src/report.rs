//! Printing and saving `ksm-seed` results: a table with ratios against the
//! kernel baselines, and the JSON array of rows.

use std::fmt::Write as _;

use crate::error::BenchError;
use crate::seed::{SeedReport, SeedRow};

fn find<'a>(rows: &'a [SeedRow], system: &str, row: &SeedRow) -> Option<&'a SeedRow> {
    rows.iter()
        .find(|r| r.system == system && r.shape == row.shape)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}x", a / b),
        _ => "-".into(),
    }
}

fn num(v: Option<f64>, prec: usize) -> String {
    v.map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

/// The human-readable table: one line per run, then warnings.
pub fn table(report: &SeedReport) -> String {
    let rows = &report.rows;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<17} {:<6} {:>10} {:>8} {:>12} {:>13} {:>8} {:>11} {:>11} {:>11} {:>11}",
        "system",
        "shape",
        "converge_s",
        "cpu_s",
        "steady_cpu/s",
        "pages_sharing",
        "shared",
        "conv/ksm-df",
        "cpu/ksm-df",
        "conv/ksm-mx",
        "cpu/ksm-mx"
    );
    for r in rows {
        let df = find(rows, "ksm-default", r);
        let mx = find(rows, "ksm-max", r);
        let _ = writeln!(
            out,
            "{:<17} {:<6} {:>10} {:>8} {:>12} {:>13} {:>8} {:>11} {:>11} {:>11} {:>11}{}",
            r.system,
            r.shape.to_string(),
            num(r.converge_s, 2),
            num(r.cpu_s, 2),
            num(r.steady_cpu_per_s, 4),
            r.pages_sharing,
            r.pages_shared,
            ratio(r.converge_s, df.and_then(|d| d.converge_s)),
            ratio(r.cpu_s, df.and_then(|d| d.cpu_s)),
            ratio(r.converge_s, mx.and_then(|d| d.converge_s)),
            ratio(r.cpu_s, mx.and_then(|d| d.cpu_s)),
            if r.converged { "" } else { "  (not settled)" }
        );
    }
    for r in rows {
        for w in &r.warnings {
            let _ = writeln!(out, "warning [{} {}]: {w}", r.system, r.shape);
        }
    }
    for u in &report.unrestored {
        let _ = writeln!(out, "warning: KSM tunable not restored: {u}");
    }
    out
}

/// The rows as a JSON array.
pub fn rows_json(report: &SeedReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&report.rows)?)
}

/// Writes `text` to `path`, naming the path on failure.
pub fn write_file(path: &str, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|source| BenchError::Write {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::Shape;

    fn row(system: &str, shape: Shape, conv: f64, cpu: f64) -> SeedRow {
        SeedRow {
            system: system.into(),
            shape,
            converge_s: Some(conv),
            cpu_s: Some(cpu),
            pages_sharing: 76500,
            pages_shared: 300,
            converged: true,
            full_scans_to_converge: Some(1),
            steady_cpu_per_s: Some(0.004),
            run_s: conv * 2.0,
            own_ksm_pages: None,
            warnings: vec![],
        }
    }

    #[test]
    fn ratios_compare_within_a_shape() {
        let report = SeedReport {
            rows: vec![
                row("ksm-default", Shape::Full, 40.0, 0.8),
                row("ksm-max", Shape::Full, 0.5, 0.5),
                row("pagefold-max", Shape::Full, 0.25, 0.1),
                row("ksm-default", Shape::Sparse, 10.0, 1.0),
            ],
            series: vec![],
            unrestored: vec!["run: was \"0\", now Some(\"1\")".into()],
        };
        let t = table(&report);
        let pf = t.lines().find(|l| l.starts_with("pagefold-max")).unwrap();
        // 0.25 / 40 and 0.1 / 0.8 against ksm-default; 0.5x and 0.2x vs max.
        assert!(pf.contains("0.006x"), "{pf}");
        assert!(pf.contains("0.125x"), "{pf}");
        assert!(pf.contains("0.500x"), "{pf}");
        assert!(pf.contains("0.200x"), "{pf}");
        let sp = t.lines().find(|l| l.contains("sparse")).unwrap();
        assert!(
            sp.contains("1.000x") && sp.trim_end().ends_with('-'),
            "{sp}"
        );
        assert!(t.contains("not restored"));
        let v: serde_json::Value = serde_json::from_str(&rows_json(&report).unwrap()).unwrap();
        assert_eq!(v[2]["system"], "pagefold-max");
        assert_eq!(v[2]["shape"], "full");
        assert_eq!(v[2]["converge_s"], 0.25);
        assert_eq!(v[2]["cpu_s"], 0.1);
        assert_eq!(v[2]["pages_sharing"], 76500);
    }
}
