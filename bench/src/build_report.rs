//! Outputs of the `build` benchmark: the table (as in the LKML reference:
//! mean and stdev per system), JSON rows, markdown, and the chart of
//! npages over build time.

use std::fmt::Write as _;

use serde::Serialize;

use crate::build_bench::{BuildReport, BuildRow};
use crate::chart::{simplify, Chart, Line, Panel};
use crate::error::BenchError;
use crate::host::host_line;
use crate::ratio::{ratio, Goal};

const MIB: f64 = (1 << 20) as f64;

/// Where the rows ran, said once with the table: build times compare
/// only with rows from the same host.
fn host(rows: &[BuildRow]) -> Option<String> {
    host_line(
        rows.iter()
            .map(|r| (r.host_kind.as_str(), r.host_kernel.as_str())),
    )
}

/// The columns as text rows (shared by the table and markdown).
fn cells(r: &BuildRow) -> Vec<String> {
    vec![
        r.system.clone(),
        r.runs.to_string(),
        format!("{:.2} ± {:.2}", r.real_mean_s, r.real_stdev_s),
        format!("{:.2} ± {:.2}", r.user_mean_s, r.user_stdev_s),
        format!("{:.2} ± {:.2}", r.sys_mean_s, r.sys_stdev_s),
        format!("{:.3} ± {:.3}", r.engine_cpu_mean_s, r.engine_cpu_stdev_s),
        r.engine_us_per_merge
            .map_or("-".into(), |u| format!("{u:.1}")),
        format!("{:.0} ± {:.0}", r.npages_mean, r.npages_stdev),
        format!("{:.0}", r.npages_area_mean),
        format!("{:.0}", r.npages_time_mean),
        format!("{:.1}", r.peak_saving_mean_bytes / MIB),
        format!("{:.0}", r.cow_breaks_mean),
        r.hint_merge_delay_mean_ms
            .map_or("-".into(), |d| format!("{d:.0}")),
        r.t_final_npages_s.map_or("-".into(), |t| format!("{t:.2}")),
        if r.checksums_agree { "yes" } else { "NO" }.into(),
    ]
}

const HEADERS: [&str; 15] = [
    "system",
    "runs",
    "real (s)",
    "user (s)",
    "sys (s)",
    "engine cpu (s)",
    "engine us/merge",
    "npages",
    "npages area (page s)",
    "npages mean over build",
    "peak saving (MiB)",
    "COW breaks",
    "hint delay (ms)",
    "t final npages (s)",
    "checksums agree",
];

/// The row of `system`, if it ran (shared with the Linux form).
pub(crate) fn find<'a>(rows: &'a [BuildRow], system: &str) -> Option<&'a BuildRow> {
    rows.iter().find(|x| x.system == system)
}

/// The goals both forms of the build benchmark share: pagefold-on's build
/// within 1 % of off's, and at least ksm-10000's npages at the end for at
/// most half its engine CPU.
pub(crate) fn against_off_and_ksm(rows: &[BuildRow]) -> Vec<Goal> {
    let mut out = Vec::new();
    let on = find(rows, "pagefold-on");
    if let (Some(on), Some(off)) = (on, find(rows, "off")) {
        out.push(Goal::at_most(
            "pagefold-on build time <= 1.01x off's".into(),
            ratio(Some(on.real_mean_s), Some(off.real_mean_s)),
            1.01,
            format!("{:.2} s against {:.2} s", on.real_mean_s, off.real_mean_s),
        ));
    }
    if let (Some(on), Some(k)) = (on, find(rows, "ksm-10000")) {
        out.push(Goal::at_least(
            "pagefold-on npages at the end >= ksm-10000's (ratio)".into(),
            ratio(Some(on.npages_mean), Some(k.npages_mean)),
            1.0,
            format!(
                "{:.0} ± {:.0} against {:.0} ± {:.0}",
                on.npages_mean, on.npages_stdev, k.npages_mean, k.npages_stdev
            ),
        ));
        out.push(Goal::at_most(
            "pagefold-on engine CPU <= 0.5x ksm-10000's".into(),
            ratio(Some(on.engine_cpu_mean_s), Some(k.engine_cpu_mean_s)),
            0.5,
            format!(
                "{:.3} s against {:.3} s",
                on.engine_cpu_mean_s, k.engine_cpu_mean_s
            ),
        ));
    }
    out
}

/// The project's goals for the build benchmark: merging costs the build
/// (almost) nothing, saves as much as KSM scanning 10,000 pages a wake-up
/// for half its CPU, merges what a device read soon after the read, and
/// I/O hints merge more over the build than no hints. Each goal needs the
/// systems it compares; the checksums are judged whatever ran.
pub fn build_goals(r: &BuildReport) -> Vec<Goal> {
    let mut out = against_off_and_ksm(&r.rows);
    let on = find(&r.rows, "pagefold-on");
    if let Some(on) = on {
        out.push(Goal::at_most(
            "pagefold-on merges hinted pages within 1 s of the read (mean ms)".into(),
            on.hint_merge_delay_mean_ms,
            1000.0,
            String::new(),
        ));
    }
    if let (Some(on), Some(no)) = (on, find(&r.rows, "pagefold-on-nohints")) {
        out.push(Goal::at_least(
            "pagefold-on npages mean over the build >= pagefold-on-nohints' (ratio)".into(),
            ratio(Some(on.npages_time_mean), Some(no.npages_time_mean)),
            1.0,
            String::new(),
        ));
    }
    out.extend(Goal::every_system(
        "guests write the expected checksums",
        &r.rows,
        |x| x.checksums_agree,
    ));
    out
}

/// A plain-text table for stdout, then the goal checks.
pub fn build_table(r: &BuildReport) -> String {
    let header = format!(
        "build: {} files, {} pages, {} rounds; expected output checksum {:#018x}; possible npages {}",
        r.tree.files, r.tree.tree_pages, r.tree.rounds, r.tree.expected_checksum, r.tree.possible_npages
    );
    let mut out = rows_table(&header, &r.rows, &r.unrestored);
    for g in build_goals(r) {
        let _ = writeln!(out, "{}", g.line());
    }
    out
}

/// The table's text under a first line saying what was built and a
/// second naming the host (shared with the Linux form,
/// `crate::build_linux_report`).
pub(crate) fn rows_table(header: &str, rows: &[BuildRow], unrestored: &[String]) -> String {
    let texts: Vec<Vec<String>> = rows.iter().map(cells).collect();
    let widths: Vec<usize> = (0..HEADERS.len())
        .map(|i| {
            texts
                .iter()
                .map(|c| c[i].chars().count())
                .chain([HEADERS[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, c: &[String]| {
        for (i, s) in c.iter().enumerate() {
            let _ = write!(out, "{s:>w$}  ", w = widths[i]);
        }
        out.push('\n');
    };
    let _ = writeln!(out, "{header}");
    if let Some(h) = host(rows) {
        let _ = writeln!(out, "{h}");
    }
    line(
        &mut out,
        &HEADERS.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    );
    for c in &texts {
        line(&mut out, c);
    }
    for row in rows {
        for w in &row.warnings {
            let _ = writeln!(out, "warning: {}: {w}", row.system);
        }
    }
    for u in unrestored {
        let _ = writeln!(out, "KSM tunable not restored: {u}");
    }
    out
}

/// A markdown table plus the tree, notes and the goal checks.
pub fn build_markdown(r: &BuildReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Tree: {} files, {} pages ({:.1} MiB), {} rounds, seed {:#x}; expected output checksum `{:#018x}`; a perfect merger's npages at the end of the builds: {}.\n",
        r.tree.files,
        r.tree.tree_pages,
        r.tree.tree_pages as f64 * 4096.0 / MIB,
        r.tree.rounds,
        r.tree.seed,
        r.tree.expected_checksum,
        r.tree.possible_npages
    );
    out.push_str(&rows_markdown(&r.rows));
    let goals = build_goals(r);
    if !goals.is_empty() {
        out.push('\n');
    }
    for g in goals {
        let _ = writeln!(out, "- {}", g.line());
    }
    out
}

/// The host line, the markdown table and the rows' warnings (shared with
/// the Linux form).
pub(crate) fn rows_markdown(rows: &[BuildRow]) -> String {
    let mut out = String::new();
    if let Some(h) = host(rows) {
        let _ = writeln!(out, "{h}\n");
    }
    let _ = writeln!(out, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(HEADERS.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", cells(row).join(" | "));
    }
    // One list under the table: a blank line before it, none between its
    // items (a run the assist took over in each of five runs is five lines,
    // not ten).
    let mut first = true;
    for row in rows {
        for w in &row.warnings {
            if std::mem::take(&mut first) {
                out.push('\n');
            }
            let _ = writeln!(out, "- {}: {w}", row.system);
        }
    }
    out
}

#[derive(Serialize)]
pub(crate) struct JsonRow<'a> {
    system: &'a str,
    runs: usize,
    real_mean_s: f64,
    real_stdev_s: f64,
    user_mean_s: f64,
    user_stdev_s: f64,
    sys_mean_s: f64,
    sys_stdev_s: f64,
    guest_cpu_mean_s: f64,
    engine_cpu_mean_s: f64,
    engine_cpu_stdev_s: f64,
    npages_mean: f64,
    npages_stdev: f64,
    npages_area_mean: f64,
    npages_time_mean: f64,
    peak_saving_mean_bytes: f64,
    cow_breaks_mean: f64,
    merges_mean: f64,
    engine_us_per_merge: Option<f64>,
    hint_merge_delay_mean_ms: Option<f64>,
    t_final_npages_s: Option<f64>,
    checksums_agree: bool,
    host_kind: &'a str,
    host_kernel: &'a str,
    max_map_count: u64,
    load_avg: [f64; 3],
    warnings: &'a [String],
    per_run: &'a [crate::build_bench::BuildRun],
}

/// `{"tree": {...}, "rows": [one per system], "unrestored": [...]}`.
pub fn build_json(r: &BuildReport) -> Result<String, BenchError> {
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "tree": r.tree,
        "rows": json_rows(&r.rows),
        "unrestored": r.unrestored,
    }))?)
}

/// The rows as JSON objects (shared with the Linux form).
pub(crate) fn json_rows(rows: &[BuildRow]) -> Vec<JsonRow<'_>> {
    rows.iter()
        .map(|x| JsonRow {
            system: &x.system,
            runs: x.runs,
            real_mean_s: x.real_mean_s,
            real_stdev_s: x.real_stdev_s,
            user_mean_s: x.user_mean_s,
            user_stdev_s: x.user_stdev_s,
            sys_mean_s: x.sys_mean_s,
            sys_stdev_s: x.sys_stdev_s,
            guest_cpu_mean_s: x.guest_cpu_mean_s,
            engine_cpu_mean_s: x.engine_cpu_mean_s,
            engine_cpu_stdev_s: x.engine_cpu_stdev_s,
            npages_mean: x.npages_mean,
            npages_stdev: x.npages_stdev,
            npages_area_mean: x.npages_area_mean,
            npages_time_mean: x.npages_time_mean,
            peak_saving_mean_bytes: x.peak_saving_mean_bytes,
            cow_breaks_mean: x.cow_breaks_mean,
            merges_mean: x.merges_mean,
            engine_us_per_merge: x.engine_us_per_merge,
            hint_merge_delay_mean_ms: x.hint_merge_delay_mean_ms,
            t_final_npages_s: x.t_final_npages_s,
            checksums_agree: x.checksums_agree,
            host_kind: &x.host_kind,
            host_kernel: &x.host_kernel,
            max_map_count: x.max_map_count,
            load_avg: x.load_avg,
            warnings: &x.warnings,
            per_run: &x.per_run,
        })
        .collect()
}

/// npages over build time, first run of each system.
pub fn build_chart(r: &BuildReport) -> Chart {
    rows_chart(
        format!(
            "build: merged pages during two concurrent builds ({} files)",
            r.tree.files
        ),
        &r.rows,
    )
}

/// The chart of `rows` under `title` (shared with the Linux form).
pub(crate) fn rows_chart(title: String, rows: &[BuildRow]) -> Chart {
    let lines = rows
        .iter()
        .filter_map(|row| {
            let run = row.per_run.first()?;
            let pts: Vec<(f64, f64)> = run
                .samples
                .iter()
                .map(|s| (s.t_s, s.npages as f64))
                .collect();
            Some(Line {
                name: row.system.clone(),
                points: simplify(&pts),
            })
        })
        .collect();
    Chart::new(vec![Panel {
        title,
        x_label: "time since the builds started (s)".into(),
        y_label: "npages (pages_sharing + zero_pages)".into(),
        log_x: false,
        log_y: false,
        lines,
    }])
}
