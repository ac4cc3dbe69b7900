//! `pagefold bench ...`: benchmarks against the kernel's KSM, side by side
//! in one process (see docs/benchmarks.md). The work is in the
//! `pagefold-bench` library; this file parses flags and writes outputs.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use pagefold_bench::{
    auto_chart, auto_json, auto_markdown, auto_table, rows_json, run_auto_all, run_ksm_seed,
    seed_chart, seed_markdown, select_auto_systems, select_systems, svg_to_png, table, write_file,
    AutoOptions, BenchError, Case, SeedOptions, Shape,
};

use crate::error::Error;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The 2022 KSM auto-mode test (300 MiB, shapes full and sparse), for
    /// kernel KSM and pagefold at their defaults and at maximum effort.
    KsmSeed(SeedArgs),
    /// Auto mode: two identical workload VMs, free memory drops below the
    /// threshold at a known time; how soon is 90 % of the saving reached?
    Auto(AutoArgs),
    /// Two workload VMs build the same source tree side by side, --runs
    /// times per system (off, pagefold-on, pagefold-auto, ksm-default,
    /// ksm-10000): build time, process and engine CPU, merged pages.
    Build(BuildArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ShapeArg {
    Full,
    Sparse,
    Both,
}

/// Output files shared by both benchmarks.
#[derive(Args, Debug)]
pub struct Outputs {
    /// Write the rows as a JSON array here.
    #[arg(long)]
    pub json: Option<String>,
    /// Write an SVG chart here (and a PNG beside it if rsvg-convert exists).
    #[arg(long)]
    pub plot: Option<String>,
    /// Write a markdown table with the goal checks here.
    #[arg(long)]
    pub markdown: Option<String>,
}

#[derive(Args, Debug)]
pub struct SeedArgs {
    #[command(flatten)]
    pub out: Outputs,
    #[arg(long, value_enum, default_value = "both")]
    pub shape: ShapeArg,
    /// Comma-separated subset of ksm-default, ksm-max, pagefold-default,
    /// pagefold-max (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Also run the test inside two 512 MiB workload VMs with identical
    /// content.
    #[arg(long)]
    pub vms: bool,
    /// Only the VM case (implies --vms).
    #[arg(long)]
    pub vms_only: bool,
    /// Seconds of steady state measured after convergence (default systems).
    #[arg(long, default_value_t = 30)]
    pub steady_secs: u64,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 400)]
    pub timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct AutoArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of pagefold-auto, ksm-auto, pagefold-on,
    /// ksm-default (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Seconds untriggered (content in place) before free memory drops.
    #[arg(long, default_value_t = 20)]
    pub untriggered_secs: u64,
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, pagefold-auto,
    /// ksm-default, ksm-10000 (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Runs per system (mean and stdev over them).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Source files in the tree (about 2.5 pages each).
    #[arg(long, default_value_t = 1500)]
    pub files: u32,
    /// Compile rounds per token: CPU per file (100: a few ms).
    #[arg(long, default_value_t = 100)]
    pub rounds: u32,
    /// Seed of the tree's content.
    #[arg(long, default_value_t = 0x6b65_726e)]
    pub seed: u64,
    /// pagefold-auto: free memory drops below the threshold once a VM has
    /// compiled this fraction of its files.
    #[arg(long, default_value_t = 0.25)]
    pub auto_trigger: f64,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

fn bench_err(e: BenchError) -> Error {
    match e {
        BenchError::UnknownSystem { .. } | BenchError::NoSystems => Error::Usage(e.to_string()),
        other => Error::Dedup(other.to_string()),
    }
}

/// Writes whichever outputs were asked for.
fn write_outputs(out: &Outputs, json: String, svg: String, md: String) -> Result<(), Error> {
    let write = |p: &str, t: &str| write_file(p, t).map_err(bench_err);
    if let Some(p) = &out.json {
        write(p, &json)?;
        eprintln!("wrote {p}");
    }
    if let Some(p) = &out.plot {
        write(p, &svg)?;
        eprintln!("wrote {p}");
        match svg_to_png(p) {
            Ok(Some(png)) => eprintln!("wrote {png}"),
            Ok(None) => eprintln!("rsvg-convert not installed: no PNG"),
            Err(e) => eprintln!("PNG: {e}"),
        }
    }
    if let Some(p) = &out.markdown {
        write(p, &md)?;
        eprintln!("wrote {p}");
    }
    Ok(())
}

fn ksm_seed(a: SeedArgs) -> Result<i32, Error> {
    let systems = select_systems(&a.systems).map_err(bench_err)?;
    let mut cases: Vec<Case> = if a.vms_only {
        Vec::new()
    } else {
        match a.shape {
            ShapeArg::Full => vec![Case::Region(Shape::Full)],
            ShapeArg::Sparse => vec![Case::Region(Shape::Sparse)],
            ShapeArg::Both => Shape::ALL.iter().map(|&s| Case::Region(s)).collect(),
        }
    };
    if a.vms || a.vms_only {
        cases.push(Case::Vms);
    }
    let opts = SeedOptions {
        cases,
        steady: Duration::from_secs(a.steady_secs),
        timeout: Duration::from_secs(a.timeout_secs),
        ..SeedOptions::default()
    };
    let report = run_ksm_seed(&systems, &opts).map_err(bench_err)?;
    print!("{}", table(&report));
    let json = rows_json(&report).map_err(bench_err)?;
    write_outputs(&a.out, json, seed_chart(&report), seed_markdown(&report))?;
    Ok(if report.unrestored.is_empty() { 0 } else { 1 })
}

fn auto(a: AutoArgs) -> Result<i32, Error> {
    let systems = select_auto_systems(&a.systems).map_err(bench_err)?;
    let opts = AutoOptions {
        untriggered: Duration::from_secs(a.untriggered_secs),
        timeout: Duration::from_secs(a.timeout_secs),
        ..AutoOptions::default()
    };
    let report = run_auto_all(&systems, &opts).map_err(bench_err)?;
    print!("{}", auto_table(&report));
    let json = auto_json(&report).map_err(bench_err)?;
    write_outputs(&a.out, json, auto_chart(&report), auto_markdown(&report))?;
    Ok(if report.unrestored.is_empty() { 0 } else { 1 })
}

fn build(a: BuildArgs) -> Result<i32, Error> {
    use pagefold_bench::{build_chart, build_json, build_markdown, build_table};
    let systems = pagefold_bench::select_build_systems(&a.systems).map_err(bench_err)?;
    if a.runs == 0 || a.files == 0 || !(0.0..=1.0).contains(&a.auto_trigger) {
        return Err(Error::Usage(
            "--runs and --files must be above 0, --auto-trigger in 0..=1".into(),
        ));
    }
    let opts = pagefold_bench::BuildOptions {
        tree: pagefold_bench::TreeSpec {
            seed: a.seed,
            files: a.files,
            rounds: a.rounds,
        },
        runs: a.runs,
        auto_trigger_fraction: a.auto_trigger,
        timeout: Duration::from_secs(a.timeout_secs),
        ..pagefold_bench::BuildOptions::default()
    };
    let report = pagefold_bench::run_build_bench(&systems, &opts).map_err(bench_err)?;
    print!("{}", build_table(&report));
    let json = build_json(&report).map_err(bench_err)?;
    write_outputs(&a.out, json, build_chart(&report), build_markdown(&report))?;
    let agree = report.rows.iter().all(|r| r.checksums_agree);
    if !agree {
        eprintln!("the guests' output checksums disagree with the host's prediction");
    }
    Ok(if report.unrestored.is_empty() && agree {
        0
    } else {
        1
    })
}

pub fn run(cmd: BenchCommand) -> Result<i32, Error> {
    match cmd {
        BenchCommand::KsmSeed(a) => ksm_seed(a),
        BenchCommand::Auto(a) => auto(a),
        BenchCommand::Build(a) => build(a),
    }
}
