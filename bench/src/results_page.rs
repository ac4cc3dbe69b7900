//! docs/results/results.md: one page with the latest kept run of each
//! benchmark, rendered from the JSON rows the runs wrote.
//!
//! `runs.toml` in the results directory lists the runs the page shows:
//! for each, the benchmark, the JSON file, the plot the run drew, the
//! command that reproduces it and when it was measured. The tables and
//! goal checks come from the benchmarks' own renderers, so the page shows
//! what the benchmark printed; the goals table at the top gathers every
//! run's checks. A new run replaces its JSON (and plot) and its entry's
//! `measured`; scripts/results-page.sh then writes the page again.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::auto_bench::{AutoReport, AutoRow};
use crate::auto_report::{auto_goals, auto_markdown};
use crate::build_bench::BuildReport;
use crate::build_linux::LinuxBuildReport;
use crate::build_linux_report::{linux_build_goals, linux_build_markdown};
use crate::build_report::{build_goals, build_markdown};
use crate::linux_free::LinuxFreeReport;
use crate::linux_free_report::{linux_free_goals, linux_free_markdown};
use crate::linux_read::LinuxReadReport;
use crate::linux_read_report::{linux_read_goals, linux_read_markdown};
use crate::ratio::Goal;
use crate::report::{seed_goals, seed_markdown};
use crate::seed::{SeedReport, SeedRow};

/// The file in the results directory that lists the runs.
pub const RUNS_FILE: &str = "runs.toml";
/// The page, in the results directory.
pub const PAGE_FILE: &str = "results.md";
/// The most lines the page may have: a page a reader reads whole (six
/// benchmarks, about 60 lines each at most, and the goals' table).
pub const MAX_PAGE_LINES: usize = 380;
/// The most files the results directory may hold: the current runs only;
/// earlier runs stay in git's history.
pub const MAX_RESULT_FILES: usize = 22;

/// What can go wrong rendering the page.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Runs {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: not rows of the {bench} benchmark: {source}")]
    Json {
        path: PathBuf,
        bench: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: the plot named in {RUNS_FILE} is missing")]
    MissingPlot { path: PathBuf },
    #[error("{file}: a run's files must be plain names in the results directory")]
    NotAName { file: String },
}

/// The benchmarks the page knows how to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PageBench {
    KsmSeed,
    Auto,
    Build,
    BuildLinux,
    LinuxRead,
    LinuxFree,
}

impl PageBench {
    const ALL: [PageBench; 6] = [
        PageBench::KsmSeed,
        PageBench::Auto,
        PageBench::Build,
        PageBench::BuildLinux,
        PageBench::LinuxRead,
        PageBench::LinuxFree,
    ];

    fn name(self) -> &'static str {
        match self {
            PageBench::KsmSeed => "ksm-seed",
            PageBench::Auto => "auto",
            PageBench::Build => "build",
            PageBench::BuildLinux => "build-linux",
            PageBench::LinuxRead => "linux-read",
            PageBench::LinuxFree => "linux-free",
        }
    }

    /// What the benchmark measures, said once above its runs.
    fn measures(self) -> &'static str {
        match self {
            PageBench::KsmSeed => {
                "Time and CPU for pagefold and kernel KSM, each at its defaults and at maximum \
                 effort, to merge memory that is already filled: the 2022 KSM auto-mode test's \
                 300 MiB region (`full`: every page identical; `sparse`: all distinct but 43), \
                 two regions holding the same pages in random order (`scattered`), or two \
                 workload VMs with identical content (`vms`). CPU includes ksmd's."
            }
            PageBench::Auto => {
                "Auto mode: two identical workload VMs, and free memory drops below the \
                 threshold at a known time. How soon each system reaches 90 % of the possible \
                 saving after the drop, and what watching costs before it."
            }
            PageBench::Build => {
                "Two workload VMs build the same source tree side by side, several runs per \
                 system: build time, process and engine CPU, and the pages merged during and \
                 at the end of the builds."
            }
            PageBench::BuildLinux => {
                "Two Linux guests build the same kernel tree side by side (`bench build \
                 --guest linux`): build time, process and engine CPU, and the pages merged \
                 during and at the end of the builds. Under the emulated host, page counts \
                 are real and times compare only within one run."
            }
            PageBench::LinuxRead => {
                "Two Linux guests read the same files from identical disks: how many pages \
                 each system merges, how soon, and at what CPU. Under the emulated host, page \
                 counts are real and times compare only within one run."
            }
            PageBench::LinuxFree => {
                "Two Linux guests do the same work, then free most of it: the host memory \
                 they use with dedup and free page reporting each on or off, and with kernel \
                 KSM and reporting; how soon freed memory is back on the host, and whether the \
                 data they kept is intact. Under the emulated host, page counts are real and \
                 times compare only within one run."
            }
        }
    }
}

/// One run the page shows (an entry of `runs.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageRun {
    pub bench: PageBench,
    /// What distinguishes this run from the benchmark's others (e.g. the
    /// shape).
    pub title: String,
    /// The rows the run wrote (`--json-file`), in the results directory.
    pub json: String,
    /// The SVG chart the run drew (`--plot`), when it drew one.
    pub plot: Option<String>,
    /// The command that reproduces the run, from the repository root.
    pub command: String,
    /// When, at which commit and on what kind of host it was measured.
    pub measured: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Runs {
    run: Vec<PageRun>,
}

/// A run's table and goal checks, as its benchmark renders them.
struct Rendered {
    markdown: String,
    goals: Vec<Goal>,
    host_recorded: bool,
}

fn read(path: &Path) -> Result<String, PageError> {
    std::fs::read_to_string(path).map_err(|source| PageError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// `file` inside `dir`, refusing anything but a plain file name: the page
/// links its files relative to itself.
fn inside(dir: &Path, file: &str) -> Result<PathBuf, PageError> {
    let plain = !file.is_empty() && !file.contains('/') && file != "." && file != "..";
    if !plain {
        return Err(PageError::NotAName { file: file.into() });
    }
    Ok(dir.join(file))
}

fn parse<T: DeserializeOwned>(path: &Path, bench: PageBench) -> Result<T, PageError> {
    serde_json::from_str(&read(path)?).map_err(|source| PageError::Json {
        path: path.to_path_buf(),
        bench: bench.name(),
        source,
    })
}

/// Reads `runs.toml` in `dir`.
pub fn read_runs(dir: &Path) -> Result<Vec<PageRun>, PageError> {
    let path = dir.join(RUNS_FILE);
    let runs: Runs = toml::from_str(&read(&path)?).map_err(|source| PageError::Runs {
        path: path.clone(),
        source,
    })?;
    Ok(runs.run)
}

/// Loads one run's JSON and renders it with its benchmark's own report.
fn render(dir: &Path, run: &PageRun) -> Result<Rendered, PageError> {
    let path = inside(dir, &run.json)?;
    Ok(match run.bench {
        PageBench::KsmSeed => {
            let rows: Vec<SeedRow> = parse(&path, run.bench)?;
            let host_recorded = rows.iter().any(|r| !r.host_kind.is_empty());
            let report = SeedReport {
                rows,
                series: Vec::new(),
                unrestored: Vec::new(),
            };
            Rendered {
                markdown: seed_markdown(&report),
                goals: seed_goals(&report),
                host_recorded,
            }
        }
        PageBench::Auto => {
            let rows: Vec<AutoRow> = parse(&path, run.bench)?;
            let host_recorded = rows.iter().any(|r| !r.host_kind.is_empty());
            let report = AutoReport {
                rows,
                series: Vec::new(),
                total_bytes: 0,
                threshold_bytes: 0,
                unrestored: Vec::new(),
            };
            Rendered {
                markdown: auto_markdown(&report),
                goals: auto_goals(&report),
                host_recorded,
            }
        }
        PageBench::Build => {
            let report: BuildReport = parse(&path, run.bench)?;
            Rendered {
                markdown: build_markdown(&report),
                goals: build_goals(&report),
                host_recorded: report.rows.iter().any(|r| !r.host_kind.is_empty()),
            }
        }
        PageBench::BuildLinux => {
            let report: LinuxBuildReport = parse(&path, run.bench)?;
            Rendered {
                markdown: linux_build_markdown(&report),
                goals: linux_build_goals(&report),
                host_recorded: report.rows.iter().any(|r| !r.host_kind.is_empty()),
            }
        }
        PageBench::LinuxRead => {
            let report: LinuxReadReport = parse(&path, run.bench)?;
            Rendered {
                markdown: linux_read_markdown(&report),
                goals: linux_read_goals(&report),
                host_recorded: !report.host_kind.is_empty(),
            }
        }
        PageBench::LinuxFree => {
            let report: LinuxFreeReport = parse(&path, run.bench)?;
            Rendered {
                markdown: linux_free_markdown(&report),
                goals: linux_free_goals(&report),
                host_recorded: !report.host_kind.is_empty(),
            }
        }
    })
}

fn status(g: &Goal) -> &'static str {
    match g.met {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "not measured",
    }
}

fn figure(g: &Goal) -> String {
    g.value.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

const HEADER: &str = "\
# Benchmark results

<!-- Written by scripts/results-page.sh from runs.toml and the JSON files it
names; edit those and run the script, not this page. -->

The latest kept run of each benchmark: its command, the host it ran on,
its table and chart as the benchmark printed and drew them, and the
project's goals judged from its rows. What each benchmark does and what
its figures mean: [docs/benchmarks.md](../benchmarks.md). Earlier runs
are in git's history (`git log --follow -- docs/results/<file>`).

The commands run from the repository root with the binary of
`cargo build --release --features bench`. The benchmarks run every
system side by side in one process and take the KSM lock; times compare
only between rows of one run (load and host differ between runs).
";

/// The page for the runs listed in `dir`'s `runs.toml`.
pub fn results_page(dir: &Path) -> Result<String, PageError> {
    let runs = read_runs(dir)?;
    let mut rendered = Vec::with_capacity(runs.len());
    for run in &runs {
        if let Some(plot) = &run.plot {
            let path = inside(dir, plot)?;
            if !path.is_file() {
                return Err(PageError::MissingPlot { path });
            }
        }
        rendered.push(render(dir, run)?);
    }
    let mut out = String::from(HEADER);
    out.push_str("\n## Goals\n\n| run | goal | figure | status |\n|---|---|---|---|\n");
    for (run, r) in runs.iter().zip(&rendered) {
        for g in &r.goals {
            let _ = writeln!(
                out,
                "| {} {} | {} | {} ({}) | {} |",
                run.bench.name(),
                run.title,
                g.name,
                figure(g),
                g.target,
                status(g)
            );
        }
    }
    for bench in PageBench::ALL {
        let mine: Vec<_> = runs
            .iter()
            .zip(&rendered)
            .filter(|(run, _)| run.bench == bench)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let _ = write!(out, "\n## {}\n\n{}\n", bench.name(), bench.measures());
        for (run, r) in mine {
            let _ = write!(
                out,
                "\n### {} {}\n\nMeasured {}; rows: [{}]({}).\n\n```\n{}\n```\n\n",
                bench.name(),
                run.title,
                run.measured,
                run.json,
                run.json,
                run.command.trim()
            );
            if !r.host_recorded {
                out.push_str("The rows do not record their host.\n\n");
            }
            out.push_str(r.markdown.trim_end());
            out.push('\n');
            if let Some(plot) = &run.plot {
                let _ = write!(out, "\n![{} {}]({plot})\n", bench.name(), run.title);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results")
    }

    /// The goals table's line for `bench`'s goal starting with `name`.
    fn goal<'a>(page: &'a str, bench: &str, name: &str) -> &'a str {
        page.lines()
            .find(|l| l.starts_with(&format!("| {bench} ")) && l.contains(&format!(" | {name}")))
            .unwrap_or_else(|| panic!("no goal {bench} / {name} in\n{page}"))
    }

    #[test]
    fn the_kept_runs_render_within_the_limits_and_match_the_committed_page() {
        let dir = results_dir();
        let page = results_page(&dir).unwrap();
        let lines = page.lines().count();
        assert!(lines <= MAX_PAGE_LINES, "{lines} lines");
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert!(files <= MAX_RESULT_FILES, "{files} files in {dir:?}");
        // Every run the page lists shows up with its command and table.
        for run in read_runs(&dir).unwrap() {
            let head = format!("### {} {}", run.bench.name(), run.title);
            assert!(page.contains(&head), "{head}");
            assert!(page.contains(run.command.trim()), "{}", run.command);
        }
        let committed = std::fs::read_to_string(dir.join(PAGE_FILE)).unwrap();
        assert!(
            committed == page,
            "docs/results/results.md is stale: run scripts/results-page.sh"
        );
    }

    #[test]
    fn goals_come_from_the_rows() {
        let page = results_page(&results_dir()).unwrap();
        // The build's 5-run table: pagefold-on took 3.55 s against off's
        // 2.98 s (1.191x, over 1.01x) and used 0.500 s of engine CPU
        // against ksm-10000's 0.964 s (0.518x, over 0.5x).
        let slower = goal(&page, "build", "pagefold-on build time");
        assert!(
            slower.contains("| 1.191 (<= 1.01) | **not met** |"),
            "{slower}"
        );
        let cpu = goal(&page, "build", "pagefold-on engine CPU");
        assert!(cpu.contains("| 0.518 (<= 0.5) | **not met** |"), "{cpu}");
        // linux-read: 49,459 pages against KSM's 49,871 (0.992x), 33.9 s
        // against 29.3 s (1.154x), wake-ups' p99 13.0 ms against 16.4 ms
        // (0.793x).
        let saved = goal(&page, "linux-read", "pagefold-on saves");
        assert!(saved.contains("| 0.992 (>= 1) | **not met** |"), "{saved}");
        let later = goal(&page, "linux-read", "pagefold-on reaches");
        assert!(later.contains("| 1.154 (<= 1) | **not met** |"), "{later}");
        let p99 = goal(&page, "linux-read", "pagefold-on guests' cyclictest p99");
        assert!(p99.contains("| 0.793 (<= 1) | met |"), "{p99}");
        // linux-free: both on ended at 110 MiB against 228 - 129 = 99
        // (1.115x); fpr had 82.8 % of what its guests freed back within
        // 5 s, pagefold-fpr 91.4 %, ksm-fpr 95.0 %; every guest's kept
        // data intact.
        let both = goal(&page, "linux-free", "pagefold-fpr host memory");
        assert!(both.contains("| 1.115 (<= 1) | **not met** |"), "{both}");
        for (system, figure, status) in [
            ("fpr", "0.828", "**not met**"),
            ("pagefold-fpr", "0.914", "met"),
            ("ksm-fpr", "0.950", "met"),
        ] {
            let g = goal(
                &page,
                "linux-free",
                &format!("{system}: share of the freed"),
            );
            assert!(
                g.contains(&format!("| {figure} (>= 0.9) | {status} |")),
                "{g}"
            );
        }
        let kept = goal(&page, "linux-free", "every system's guests' kept data");
        assert!(kept.contains("| 1.000 (>= 1) | met |"), "{kept}");
    }

    #[test]
    fn bad_runs_say_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let write = |name: &str, text: &str| std::fs::write(p.join(name), text).unwrap();
        let entry = |json: &str, plot: &str| {
            format!(
                "[[run]]\nbench = \"auto\"\ntitle = \"t\"\njson = \"{json}\"\n{plot}\
                 command = \"pagefold bench auto\"\nmeasured = \"now\"\n"
            )
        };
        write(RUNS_FILE, &entry("../x.json", ""));
        let e = results_page(p).unwrap_err();
        assert!(matches!(e, PageError::NotAName { .. }), "{e}");
        write(RUNS_FILE, &entry("auto.json", ""));
        let e = results_page(p).unwrap_err();
        assert!(matches!(e, PageError::Read { .. }), "{e}");
        write("auto.json", "{\"rows\": []}");
        let e = results_page(p).unwrap_err().to_string();
        assert!(e.contains("not rows of the auto benchmark"), "{e}");
        write("auto.json", "[]");
        write(RUNS_FILE, &entry("auto.json", "plot = \"auto.svg\"\n"));
        let e = results_page(p).unwrap_err();
        assert!(matches!(e, PageError::MissingPlot { .. }), "{e}");
        write(RUNS_FILE, "[[run]]\nbench = \"nope\"\n");
        let e = results_page(p).unwrap_err();
        assert!(matches!(e, PageError::Runs { .. }), "{e}");
        write(RUNS_FILE, &entry("auto.json", ""));
        let page = results_page(p).unwrap();
        assert!(page.contains("### auto t\n"), "{page}");
        assert!(
            page.contains("The rows do not record their host."),
            "{page}"
        );
    }
}
