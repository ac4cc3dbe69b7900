//! `pagefold bench ...`: benchmarks against the kernel's KSM, side by side
//! in one process (see docs/benchmarks.md). The work is in the
//! `pagefold-bench` library; this file parses flags and writes outputs.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use pagefold_bench::{
    auto_chart, auto_json, auto_markdown, auto_table, png_path, rows_json, run_auto_all,
    run_ksm_seed, seed_chart, seed_markdown, select_auto_systems, select_systems, table,
    write_file, AutoOptions, BenchError, Case, Chart, Placement, SeedOptions, Shape, VmOptions,
};
use pagefold_bench::{
    latency_chart, latency_json, latency_markdown, latency_table, run_latency_bench,
    select_latency_systems, LatencyOptions, LatencyShape,
};
use pagefold_bench::{
    linux_build_chart, linux_build_json, linux_build_markdown, linux_build_table,
    run_linux_build_bench, BuildSystem, LinuxBuildOptions,
};
use pagefold_bench::{
    linux_read_chart, linux_read_json, linux_read_markdown, run_linux_read_bench,
    select_linux_read_systems, LinuxReadOptions,
};
use pagefold_bench::{
    run_side_channel_bench, select_side_channel_systems, side_channel_chart, side_channel_json,
    side_channel_markdown, side_channel_table, SideChannelOptions, Variant,
};

use crate::error::Error;

mod linux_free;

/// `pagefold bench <benchmark>`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The 2022 KSM auto-mode test (300 MiB, shapes full and sparse), the
    /// scattered shape (2 x 512 MiB, same pages in random order), for
    /// kernel KSM and pagefold at their defaults and at maximum effort.
    KsmSeed(SeedArgs),
    /// Auto mode: two identical workload VMs, free memory drops below the
    /// threshold at a known time; how soon is 90 % of the saving reached?
    Auto(AutoArgs),
    /// Two workload VMs build the same source tree side by side, --runs
    /// times per system (off, pagefold-on, pagefold-auto, ksm-default,
    /// ksm-10000): build time, process and engine CPU, merged pages.
    Build(BuildArgs),
    /// Two Linux guests read the same files (off, pagefold-on, ksm-4096,
    /// ksm-default, one after the other): merged pages over time, how soon
    /// the saving was reached, engine CPU. Needs VMX/SVM, or the emulated
    /// host (scripts/emulated-host.sh).
    LinuxRead(LinuxReadArgs),
    /// Two Linux guests do the same work, then free most of it (off,
    /// pagefold-on, fpr, pagefold-fpr, ksm-fpr): the host memory they use
    /// with dedup and free page reporting each on or off, how soon freed
    /// memory is back, and whether the data they kept is intact. Needs
    /// VMX/SVM, or the emulated host (scripts/emulated-host.sh).
    LinuxFree(linux_free::LinuxFreeArgs),
    /// What merging costs a running guest: two identical workload VMs run
    /// a TSC pause probe while each system (off, pagefold-on, pagefold-max,
    /// ksm-default, ksm-max) merges them, then while rewriting merged
    /// pages; pause percentiles, stopped time, COW breaks.
    Latency(LatencyArgs),
    /// The write-timing side channel: a workload guest times one write to
    /// each of its probe pages (and a read right after it), half of them
    /// content another VM holds (or zero pages), and tells merged from
    /// unmerged pages; its accuracy against each system (off, pagefold-on,
    /// pagefold-groups, pagefold-hardened, ksm-default, ksm-max), the
    /// saving and the engine CPU.
    SideChannel(SideChannelArgs),
}

/// `bench side-channel --variant`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum VariantArg {
    /// The attacker's shared probe pages hold content the victim VM holds.
    Shared,
    /// They are all-zero pages.
    Zero,
    /// shared, then zero (the default).
    Both,
}

#[derive(Args, Debug)]
pub struct SideChannelArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, pagefold-groups,
    /// pagefold-hardened, ksm-default, ksm-max (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Which probe pages the attacker expects merged.
    #[arg(long, value_enum, default_value = "both")]
    pub variant: VariantArg,
    /// Probe pages of each label (the attacker writes twice as many).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=2048))]
    pub probe_pages: u64,
    /// RAM per VM.
    #[arg(long, default_value = "32M")]
    pub memory: String,
    /// Wait at most this long for the system to merge the probe pages.
    #[arg(long, default_value_t = 120)]
    pub merge_timeout_secs: u64,
}

/// `bench latency --shape`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LatencyShapeArg {
    /// Identical content at the same guest addresses (linear placement).
    Full,
    /// Identical content in a VM-specific random page order.
    Scattered,
    /// full, then scattered (the default).
    Both,
}

#[derive(Args, Debug)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, pagefold-max,
    /// ksm-default, ksm-max (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Which placements of the identical content to run.
    #[arg(long, value_enum, default_value = "both")]
    pub shape: LatencyShapeArg,
    /// RAM per VM.
    #[arg(long, default_value = "512M")]
    pub memory: String,
    /// Identical data per VM.
    #[arg(long, default_value = "256M")]
    pub shared: String,
    /// Length of each of the two probes, in milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub probe_millisecs: u64,
    /// Between the probes, wait at most this long for 90 % of the saving.
    #[arg(long, default_value_t = 60)]
    pub merge_timeout_secs: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ShapeArg {
    /// 300 MiB, every page identical.
    Full,
    /// 300 MiB, every page distinct but 43.
    Sparse,
    /// Two regions (--scattered-mib each): B holds A's distinct pages in a
    /// seeded random order.
    Scattered,
    /// full and sparse: the 2022 test (the default).
    Both,
    /// Every shape: full, sparse, scattered.
    All,
}

impl ShapeArg {
    fn shapes(self) -> Vec<Shape> {
        match self {
            ShapeArg::Full => vec![Shape::Full],
            ShapeArg::Sparse => vec![Shape::Sparse],
            ShapeArg::Scattered => vec![Shape::Scattered],
            ShapeArg::Both => Shape::TEST_2022.to_vec(),
            ShapeArg::All => Shape::ALL.to_vec(),
        }
    }
}

/// Which guests `bench build` runs.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum GuestArg {
    /// The workload guest's modelled build (runs on every KVM host).
    Workload,
    /// Linux guests running `make defconfig && make -j` on a kernel tree
    /// (hosts with VMX/SVM only; disk from scripts/linux-build-bench.sh).
    Linux,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PlacementArg {
    Linear,
    Scattered,
}

/// Output files shared by both benchmarks.
#[derive(Args, Debug)]
pub struct Outputs {
    /// Write the rows as a JSON array to this file (`--json` is the old
    /// spelling, still accepted).
    #[arg(long = "json-file", alias = "json", value_name = "FILE")]
    pub json: Option<String>,
    /// Write an SVG chart here, and the same chart as PNG beside it (X.svg -> X.png).
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
    /// Which memory shapes to run.
    #[arg(long, value_enum, default_value = "both")]
    pub shape: ShapeArg,
    /// Size of each of the two regions of the scattered shape, in MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub scattered_mib: u64,
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
    /// Where the workload guests place their data pages (`placement` of
    /// `[vm.workload]`): linear, or a seeded random order of extents.
    #[arg(long, value_enum, default_value = "linear")]
    pub placement: PlacementArg,
    /// Pages per extent of the scattered placement (`extent_pages` of
    /// `[vm.workload]`; default: the guest's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub extent_pages: Option<u32>,
    /// Seconds of steady state measured after convergence (default systems).
    #[arg(long, default_value_t = 30)]
    pub steady_secs: u64,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 400)]
    pub timeout_secs: u64,
    /// Milliseconds between samples of each system's counters. A system's
    /// CPU to converge is read at the first sample that sees its final
    /// saving, so it includes up to one interval of scanning after it
    /// converged (at max effort, a whole interval of CPU).
    /// (`--sample-ms` is the old spelling, still accepted.)
    #[arg(long = "sample-millisecs", alias = "sample-ms", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub sample_ms: u64,
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
    /// Seconds after the trigger a system may take to reach 90 % of the
    /// saving; its run then ends without it.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, pagefold-on-nohints,
    /// pagefold-on-nolog, pagefold-on-noassist, pagefold-auto,
    /// ksm-default, ksm-10000 (default: all).
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Runs per system (mean and stdev over them).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Source files in the tree (about 2.5 pages each).
    #[arg(long, default_value_t = 2000)]
    pub files: u32,
    /// Compile rounds per token: CPU per file (200: about 5 ms).
    #[arg(long, default_value_t = 200)]
    pub rounds: u32,
    /// Seed of the tree's content.
    #[arg(long, default_value_t = 0x6b65_726e)]
    pub seed: u64,
    /// pagefold-auto: free memory drops below the threshold once a VM has
    /// compiled this fraction of its files.
    #[arg(long, default_value_t = 0.25)]
    pub auto_trigger: f64,
    /// Give up on one run after this many seconds (default: 300, or
    /// 10800 with --guest linux).
    #[arg(long)]
    pub timeout_secs: Option<u64>,
    /// Host CPUs the VMs' vCPUs run on, e.g. 0 (default: any): leaves the
    /// other CPUs to the merger, as on a host with CPUs to spare.
    #[arg(long, value_delimiter = ',')]
    pub vcpu_cpus: Option<Vec<usize>>,
    /// workload (default) or linux.
    #[arg(long, value_enum, default_value = "workload")]
    pub guest: GuestArg,
    /// --guest linux: the kernel (vmlinux or bzImage).
    #[arg(long)]
    pub kernel: Option<std::path::PathBuf>,
    /// --guest linux: the initrd that loads the virtio modules and
    /// switches to root=/dev/vda (scripts/guest-image.sh's).
    #[arg(long)]
    pub initrd: Option<std::path::PathBuf>,
    /// --guest linux: the build image (scripts/linux-build-bench.sh); each
    /// VM runs on its own copy.
    #[arg(long)]
    pub disk: Option<std::path::PathBuf>,
    /// --guest linux: RAM per VM.
    #[arg(long, default_value = "2G")]
    pub memory: String,
    /// --guest linux: vCPUs per VM (make -j this many).
    #[arg(long, default_value_t = 2)]
    pub vcpus: u8,
    /// --guest linux: where the VMs' disk copies and console logs go
    /// (default: the disk image's directory, so a copy can be a reflink).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// --guest linux: what the guests build, comma-separated kbuild targets
    /// of the image's tinyconfig kernel tree (e.g. mm/,kernel/ or vmlinux;
    /// default: the image's, init/).
    #[arg(long, value_delimiter = ',', value_name = "TARGETS")]
    pub make_targets: Vec<String>,
    /// --guest linux: give each VM a balloon with free page reporting
    /// (every system of the run, KSM's too): what the guests free goes
    /// back to the host.
    #[arg(long)]
    pub free_page_reporting: bool,
}

#[derive(Args, Debug)]
pub struct LinuxReadArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, pagefold-on-nohints,
    /// pagefold-on-nolog, pagefold-on-nopark, pagefold-hardened, ksm-4096,
    /// ksm-default, run in that order (default: off, pagefold-on,
    /// ksm-4096, ksm-default). The engine without its I/O hints, its write
    /// log or its parks tells what each costs the guests;
    /// pagefold-hardened puts the guests in a hardened group.
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// The guest image directory of scripts/guest-image.sh (vmlinux,
    /// initrd.img, data.ext4).
    #[arg(long, value_name = "DIR", default_value = "target/guest-img")]
    pub guest: std::path::PathBuf,
    /// RAM per VM.
    #[arg(long, default_value = "384M")]
    pub memory: String,
    /// Seconds to keep sampling after both guests replied.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub idle: u64,
    /// Seconds between samples of the backend's counters (0.05 to 60).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub sample_interval: f64,
    /// Give up on one system after this many seconds (boots, read, idle).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout: u64,
    /// Where the mailboxes and console logs go (default: a new directory
    /// under the temporary directory; the console logs are kept).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
}

pub(crate) fn bench_err(e: BenchError) -> Error {
    match e {
        BenchError::UnknownSystem { .. } | BenchError::NoSystems | BenchError::InvalidInput(_) => {
            Error::Usage(e.to_string())
        }
        BenchError::HostUnsupported(m) => Error::HostUnsupported(m),
        other => Error::Dedup(other.to_string()),
    }
}

/// Writes whichever outputs were asked for.
pub(crate) fn write_outputs(
    out: &Outputs,
    json: String,
    chart: Chart,
    md: String,
) -> Result<(), Error> {
    let write = |p: &str, t: &str| write_file(p, t).map_err(bench_err);
    if let Some(p) = &out.json {
        write(p, &json)?;
        eprintln!("wrote {p}");
    }
    if let Some(p) = &out.plot {
        let svg = chart.svg().map_err(|e| bench_err(e.into()))?;
        write(p, &svg)?;
        eprintln!("wrote {p}");
        let png = chart.png().map_err(|e| bench_err(e.into()))?;
        let png_p = png_path(p);
        std::fs::write(&png_p, png).map_err(|source| {
            bench_err(BenchError::Write {
                path: png_p.clone(),
                source,
            })
        })?;
        eprintln!("wrote {png_p}");
    }
    if let Some(p) = &out.markdown {
        write(p, &md)?;
        eprintln!("wrote {p}");
    }
    Ok(())
}

/// The run the flags ask for.
fn seed_options(a: &SeedArgs) -> SeedOptions {
    let mut cases: Vec<Case> = if a.vms_only {
        Vec::new()
    } else {
        a.shape.shapes().into_iter().map(Case::Region).collect()
    };
    if a.vms || a.vms_only {
        cases.push(Case::Vms);
    }
    let defaults = SeedOptions::default();
    SeedOptions {
        cases,
        scattered_bytes: (a.scattered_mib << 20) as usize,
        vm: VmOptions {
            placement: match a.placement {
                PlacementArg::Linear => Placement::Linear,
                PlacementArg::Scattered => Placement::Scattered,
            },
            extent_pages: a.extent_pages,
            ..defaults.vm.clone()
        },
        steady: Duration::from_secs(a.steady_secs),
        timeout: Duration::from_secs(a.timeout_secs),
        sample_interval: Duration::from_millis(a.sample_ms),
        ..defaults
    }
}

fn ksm_seed(a: SeedArgs) -> Result<i32, Error> {
    let systems = select_systems(&a.systems).map_err(bench_err)?;
    let opts = seed_options(&a);
    let report = run_ksm_seed(&systems, &opts).map_err(bench_err)?;
    crate::output::write_out_or_drop(&table(&report))?;
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
    crate::output::write_out_or_drop(&auto_table(&report))?;
    let json = auto_json(&report).map_err(bench_err)?;
    write_outputs(&a.out, json, auto_chart(&report), auto_markdown(&report))?;
    Ok(if report.unrestored.is_empty() { 0 } else { 1 })
}

fn build(a: BuildArgs) -> Result<i32, Error> {
    use pagefold_bench::{build_chart, build_json, build_markdown, build_table};
    let systems = pagefold_bench::select_build_systems(&a.systems).map_err(bench_err)?;
    if a.guest == GuestArg::Linux {
        return build_linux(a, systems);
    }
    if a.kernel.is_some()
        || a.initrd.is_some()
        || a.disk.is_some()
        || a.work_dir.is_some()
        || !a.make_targets.is_empty()
        || a.free_page_reporting
    {
        return Err(Error::Usage(
            "--kernel, --initrd, --disk, --work-dir, --make-targets and --free-page-reporting are for --guest linux"
                .into(),
        ));
    }
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
        timeout: Duration::from_secs(a.timeout_secs.unwrap_or(300)),
        vcpu_affinity: a.vcpu_cpus.clone(),
        ..pagefold_bench::BuildOptions::default()
    };
    if let Some(cpus) = &opts.vcpu_affinity {
        pagefold_vmm::affinity::check(cpus)
            .map_err(|e| Error::Usage(format!("--vcpu-cpus: {e}")))?;
    }
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

pub fn run(args: BenchArgs) -> Result<i32, Error> {
    match args.cmd {
        BenchCommand::KsmSeed(a) => ksm_seed(a),
        BenchCommand::Auto(a) => auto(a),
        BenchCommand::Build(a) => build(a),
        BenchCommand::LinuxRead(a) => linux_read(a),
        BenchCommand::LinuxFree(a) => linux_free::linux_free(a),
        BenchCommand::Latency(a) => latency(a),
        BenchCommand::SideChannel(a) => side_channel(a),
    }
}

/// The options `bench side-channel`'s flags ask for.
fn side_channel_options(a: &SideChannelArgs) -> SideChannelOptions {
    SideChannelOptions {
        variants: match a.variant {
            VariantArg::Shared => vec![Variant::Shared],
            VariantArg::Zero => vec![Variant::Zero],
            VariantArg::Both => Variant::ALL.to_vec(),
        },
        probe_pages: a.probe_pages,
        memory: a.memory.clone(),
        merge_timeout: Duration::from_secs(a.merge_timeout_secs),
        ..SideChannelOptions::default()
    }
}

/// `pagefold bench side-channel` (docs/benchmarks.md). Exit code 1 when a
/// KSM tunable was not restored.
fn side_channel(a: SideChannelArgs) -> Result<i32, Error> {
    let systems = select_side_channel_systems(&a.systems).map_err(bench_err)?;
    let report = run_side_channel_bench(&systems, &side_channel_options(&a)).map_err(bench_err)?;
    crate::output::write_out_or_drop(&side_channel_table(&report))?;
    let json = side_channel_json(&report).map_err(bench_err)?;
    write_outputs(
        &a.out,
        json,
        side_channel_chart(&report),
        side_channel_markdown(&report),
    )?;
    Ok(if report.unrestored.is_empty() { 0 } else { 1 })
}

/// The options `bench latency`'s flags ask for.
fn latency_options(a: &LatencyArgs) -> LatencyOptions {
    let defaults = LatencyOptions::default();
    LatencyOptions {
        shapes: match a.shape {
            LatencyShapeArg::Full => vec![LatencyShape::Full],
            LatencyShapeArg::Scattered => vec![LatencyShape::Scattered],
            LatencyShapeArg::Both => LatencyShape::ALL.to_vec(),
        },
        vm: VmOptions {
            memory: a.memory.clone(),
            shared: a.shared.clone(),
            ..defaults.vm.clone()
        },
        probe: Duration::from_millis(a.probe_millisecs),
        merge_timeout: Duration::from_secs(a.merge_timeout_secs),
        ..defaults
    }
}

/// `pagefold bench latency` (docs/benchmarks.md). Exit code 1 when a KSM
/// tunable was not restored.
fn latency(a: LatencyArgs) -> Result<i32, Error> {
    let systems = select_latency_systems(&a.systems).map_err(bench_err)?;
    let report = run_latency_bench(&systems, &latency_options(&a)).map_err(bench_err)?;
    crate::output::write_out_or_drop(&latency_table(&report))?;
    let json = latency_json(&report).map_err(bench_err)?;
    write_outputs(
        &a.out,
        json,
        latency_chart(&report),
        latency_markdown(&report),
    )?;
    Ok(if report.unrestored.is_empty() { 0 } else { 1 })
}

/// The sampling and timeout flags of the Linux-guest benchmarks.
pub(crate) fn check_linux_timing(sample_interval: f64, timeout: u64) -> Result<(), Error> {
    if !(0.05..=60.0).contains(&sample_interval) {
        return Err(Error::Usage(
            "--sample-interval must be 0.05 to 60 seconds".into(),
        ));
    }
    if timeout == 0 {
        return Err(Error::Usage("--timeout must be above 0".into()));
    }
    Ok(())
}

/// The options `bench linux-read`'s flags ask for.
fn linux_read_options(a: &LinuxReadArgs) -> Result<LinuxReadOptions, Error> {
    check_linux_timing(a.sample_interval, a.timeout)?;
    Ok(LinuxReadOptions {
        guest_dir: a.guest.clone(),
        memory: a.memory.clone(),
        sample_interval: Duration::from_secs_f64(a.sample_interval),
        idle: Duration::from_secs(a.idle),
        timeout: Duration::from_secs(a.timeout),
        work_dir: a.work_dir.clone(),
        progress: true,
    })
}

/// `pagefold bench linux-read` (docs/benchmarks.md): flag checks and
/// outputs; the work is `pagefold_bench::run_linux_read_bench`, which
/// refuses at once on a host without VMX/SVM outside the emulated host
/// (exit code 4). Exit code 1 when the guests' data differed or a KSM
/// tunable was not restored.
fn linux_read(a: LinuxReadArgs) -> Result<i32, Error> {
    let systems = select_linux_read_systems(&a.systems).map_err(bench_err)?;
    let opts = linux_read_options(&a)?;
    let report = run_linux_read_bench(&systems, &opts).map_err(bench_err)?;
    let md = linux_read_markdown(&report);
    crate::output::write_out_or_drop(&md)?;
    let json = linux_read_json(&report).map_err(bench_err)?;
    write_outputs(&a.out, json, linux_read_chart(&report), md)?;
    let agree = report.md5s_agree();
    if !agree {
        eprintln!("guest data integrity: the guests' md5 sums differ (see the table)");
    }
    Ok(if report.unrestored.is_empty() && agree {
        0
    } else {
        1
    })
}

/// `pagefold bench build --guest linux`: the real-Linux form of the build
/// benchmark (docs/benchmarks.md). Flag checks and outputs only; the work
/// is `pagefold_bench::run_linux_build_bench`, which refuses at once on a
/// host without VMX/SVM (exit code 4).
fn build_linux(a: BuildArgs, systems: Vec<BuildSystem>) -> Result<i32, Error> {
    let (Some(kernel), Some(disk)) = (a.kernel.clone(), a.disk.clone()) else {
        return Err(Error::Usage(
            "--guest linux needs --kernel and --disk (see scripts/linux-build-bench.sh)".into(),
        ));
    };
    if a.runs == 0 {
        return Err(Error::Usage("--runs must be above 0".into()));
    }
    let defaults = LinuxBuildOptions::new(kernel, disk);
    let opts = LinuxBuildOptions {
        initrd: a.initrd.clone(),
        memory: a.memory.clone(),
        vcpus: a.vcpus,
        runs: a.runs,
        timeout: a.timeout_secs.map_or(defaults.timeout, Duration::from_secs),
        work_dir: a.work_dir.clone(),
        targets: a.make_targets.clone(),
        free_page_reporting: a.free_page_reporting,
        ..defaults
    };
    let report = run_linux_build_bench(&systems, &opts).map_err(bench_err)?;
    crate::output::write_out_or_drop(&linux_build_table(&report))?;
    let json = linux_build_json(&report).map_err(bench_err)?;
    write_outputs(
        &a.out,
        json,
        linux_build_chart(&report),
        linux_build_markdown(&report),
    )?;
    let agree = report.rows.iter().all(|r| r.checksums_agree);
    if !agree {
        eprintln!("the guests' build hashes differ between builds");
    }
    Ok(if report.unrestored.is_empty() && agree {
        0
    } else {
        1
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    /// `pagefold bench NAME ARGS...` parsed (a benchmark's own tests in
    /// its own file use it).
    pub(crate) fn parse(name: &str, args: &[&str]) -> BenchCommand {
        let head = ["bench", name];
        Bench::try_parse_from(head.iter().chain(args))
            .unwrap()
            .args
            .cmd
    }

    /// Whether `argv` (from "bench") parses.
    pub(crate) fn try_parse(argv: &[&str]) -> Result<(), clap::Error> {
        Bench::try_parse_from(argv).map(|_| ())
    }

    /// `pagefold bench` alone, so these tests need not import the CLI that
    /// imports this module.
    #[derive(Parser, Debug)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn seed_args(args: &[&str]) -> SeedArgs {
        let argv = ["bench", "ksm-seed"].iter().chain(args);
        match Bench::try_parse_from(argv).unwrap().args.cmd {
            BenchCommand::KsmSeed(a) => a,
            other => panic!("{other:?}"),
        }
    }

    fn linux_read_args(args: &[&str]) -> LinuxReadArgs {
        let argv = ["bench", "linux-read"].iter().chain(args);
        match Bench::try_parse_from(argv).unwrap().args.cmd {
            BenchCommand::LinuxRead(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn latency_flags() {
        let parse = |args: &[&str]| {
            let argv = ["bench", "latency"].iter().chain(args);
            match Bench::try_parse_from(argv).unwrap().args.cmd {
                BenchCommand::Latency(a) => a,
                other => panic!("{other:?}"),
            }
        };
        let a = parse(&[]);
        let o = latency_options(&a);
        assert_eq!(o.shapes, LatencyShape::ALL);
        assert_eq!(
            (o.vm.memory.as_str(), o.vm.shared.as_str()),
            ("512M", "256M")
        );
        assert_eq!(o.probe, Duration::from_secs(5));
        assert_eq!(select_latency_systems(&a.systems).unwrap().len(), 5);
        let a = parse(&[
            "--shape",
            "scattered",
            "--memory",
            "128M",
            "--shared",
            "32M",
            "--probe-millisecs",
            "250",
            "--merge-timeout-secs",
            "9",
            "--systems",
            "off,ksm-max",
            "--json-file",
            "/out/l.json",
        ]);
        let o = latency_options(&a);
        assert_eq!(o.shapes, [LatencyShape::Scattered]);
        assert_eq!(
            (o.vm.memory.as_str(), o.vm.shared.as_str()),
            ("128M", "32M")
        );
        assert_eq!(o.probe, Duration::from_millis(250));
        assert_eq!(o.merge_timeout, Duration::from_secs(9));
        assert_eq!(a.out.json.as_deref(), Some("/out/l.json"));
        assert_eq!(select_latency_systems(&a.systems).unwrap().len(), 2);
        for bad in [&["--probe-millisecs", "0"][..], &["--shape", "sparse"]] {
            let argv = ["bench", "latency"].iter().chain(bad);
            assert!(Bench::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn side_channel_flags() {
        let parse = |args: &[&str]| {
            let argv = ["bench", "side-channel"].iter().chain(args);
            match Bench::try_parse_from(argv).unwrap().args.cmd {
                BenchCommand::SideChannel(a) => a,
                other => panic!("{other:?}"),
            }
        };
        let a = parse(&[]);
        let o = side_channel_options(&a);
        assert_eq!(o.variants, Variant::ALL);
        assert_eq!((o.probe_pages, o.memory.as_str()), (1000, "32M"));
        assert_eq!(o.merge_timeout, Duration::from_secs(120));
        assert_eq!(select_side_channel_systems(&a.systems).unwrap().len(), 6);
        let a = parse(&[
            "--variant",
            "zero",
            "--probe-pages",
            "512",
            "--memory",
            "64M",
            "--merge-timeout-secs",
            "9",
            "--systems",
            "off,ksm-max",
            "--plot",
            "/out/s.svg",
        ]);
        let o = side_channel_options(&a);
        assert_eq!(o.variants, [Variant::Zero]);
        assert_eq!((o.probe_pages, o.memory.as_str()), (512, "64M"));
        assert_eq!(o.merge_timeout, Duration::from_secs(9));
        assert_eq!(a.out.plot.as_deref(), Some("/out/s.svg"));
        assert_eq!(select_side_channel_systems(&a.systems).unwrap().len(), 2);
        for bad in [
            &["--probe-pages", "0"][..],
            &["--probe-pages", "2049"],
            &["--variant", "dup"],
        ] {
            let argv = ["bench", "side-channel"].iter().chain(bad);
            assert!(Bench::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn linux_read_flags() {
        let a = linux_read_args(&[]);
        let o = linux_read_options(&a).unwrap();
        let d = LinuxReadOptions::default();
        assert_eq!(o.guest_dir, d.guest_dir);
        assert_eq!(
            (o.memory.as_str(), o.sample_interval, o.idle, o.timeout),
            ("384M", Duration::from_secs(1), d.idle, d.timeout)
        );
        assert_eq!(o.idle, Duration::from_secs(120));
        assert_eq!(o.timeout, Duration::from_secs(900));
        let names: Vec<_> = select_linux_read_systems(&a.systems)
            .unwrap()
            .iter()
            .map(|s| s.name())
            .collect();
        assert_eq!(names, ["off", "pagefold-on", "ksm-4096", "ksm-default"]);
        let a = linux_read_args(&[
            "--guest",
            "/guest",
            "--memory",
            "512M",
            "--systems",
            "ksm-4096,pagefold-on",
            "--idle",
            "30",
            "--sample-interval",
            "0.5",
            "--timeout",
            "600",
            "--json",
            "/out/lr.json",
            "--plot",
            "/out/lr.svg",
        ]);
        let o = linux_read_options(&a).unwrap();
        assert_eq!(o.guest_dir, std::path::PathBuf::from("/guest"));
        assert_eq!(o.kernel(), std::path::PathBuf::from("/guest/vmlinux"));
        assert_eq!(o.memory, "512M");
        assert_eq!(o.sample_interval, Duration::from_millis(500));
        assert_eq!(
            (o.idle, o.timeout),
            (Duration::from_secs(30), Duration::from_secs(600))
        );
        assert_eq!(a.out.json.as_deref(), Some("/out/lr.json"));
        assert_eq!(a.out.plot.as_deref(), Some("/out/lr.svg"));
        assert_eq!(select_linux_read_systems(&a.systems).unwrap().len(), 2);
        for bad in ["0", "61", "0.01"] {
            let a = linux_read_args(&["--sample-interval", bad]);
            assert!(linux_read_options(&a).is_err(), "{bad}");
        }
        assert!(linux_read_options(&linux_read_args(&["--timeout", "0"])).is_err());
        let a = linux_read_args(&["--systems", "ksm-max"]);
        assert!(select_linux_read_systems(&a.systems).is_err());
    }

    #[test]
    fn default_shapes_stay_the_2022_test() {
        let o = seed_options(&seed_args(&[]));
        let full = Case::Region(Shape::Full);
        assert_eq!(o.cases, [full, Case::Region(Shape::Sparse)]);
        assert_eq!(o.scattered_bytes, 512 << 20);
        assert_eq!(o.vm.placement, Placement::Linear);
        assert_eq!(o.vm.extent_pages, None);
        let o = seed_options(&seed_args(&["--shape", "full", "--vms"]));
        assert_eq!(o.cases, [full, Case::Vms]);
        assert_eq!(o.sample_interval, SeedOptions::default().sample_interval);
    }

    #[test]
    fn sample_interval_flag() {
        let o = seed_options(&seed_args(&["--sample-millisecs", "2"]));
        assert_eq!(o.sample_interval, Duration::from_millis(2));
        for bad in ["0", "1001", "-1", "2.5"] {
            let argv = ["bench", "ksm-seed", "--sample-ms", bad];
            assert!(Bench::try_parse_from(argv).is_err(), "{bad}");
        }
    }

    #[test]
    fn scattered_shape_all_and_vm_placement_flags() {
        let o = seed_options(&seed_args(&[
            "--shape",
            "scattered",
            "--scattered-mib",
            "32",
        ]));
        assert_eq!(o.cases, [Case::Region(Shape::Scattered)]);
        assert_eq!(o.scattered_bytes, 32 << 20);
        let o = seed_options(&seed_args(&["--shape", "all"]));
        let all: Vec<Case> = Shape::ALL.iter().map(|&s| Case::Region(s)).collect();
        assert_eq!(o.cases, all);
        let o = seed_options(&seed_args(&[
            "--vms-only",
            "--placement",
            "scattered",
            "--extent-pages",
            "4",
        ]));
        assert_eq!(o.cases, [Case::Vms]);
        assert_eq!(o.vm.placement, Placement::Scattered);
        assert_eq!(o.vm.extent_pages, Some(4));
        // The VM pair itself is otherwise the default one.
        assert_eq!(o.vm.memory, VmOptions::default().memory);
        let toml = o.vm.config_toml().unwrap();
        assert!(toml.contains("placement = \"scattered\""), "{toml}");
        assert!(toml.contains("extent_pages = 4"), "{toml}");
        for bad in [
            &["--shape", "diagonal"][..],
            &["--extent-pages", "0"],
            &["--scattered-mib", "0"],
            &["--placement", "random"],
        ] {
            let argv = ["bench", "ksm-seed"].iter().chain(bad);
            assert!(Bench::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}
