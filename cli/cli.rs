//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};
use pagefold_dedup::flag;
use pagefold_dedup::{BackendKind, CheckedSettings, DedupSettings, Mode};
use pagefold_vmm::config::{
    self, Config, DedupConfig, DiskConfig, KernelConfig, NetConfig, SerialOutput, SizeValue,
    VmConfig, VmDedup, WorkloadConfig,
};
use pagefold_vmm::runner::Runner;

use crate::bench;
use crate::ksm;
use crate::output::write_out_or_drop;
use crate::report;

#[path = "client.rs"]
mod client;

pub use crate::error::Error;

// The `bench` feature, in words, for `VERSION` (`concat!` takes literals).
#[cfg(feature = "bench")]
macro_rules! benchmarks_built_in {
    () => {
        "benchmarks built in"
    };
}
#[cfg(not(feature = "bench"))]
macro_rules! benchmarks_built_in {
    () => {
        "without benchmarks: build with --features bench"
    };
}

/// `pagefold --version`: the crate version, the git commit it was built
/// from (build.rs; "unknown" without git), and whether the benchmarks are
/// built in (the `bench` feature).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PAGEFOLD_GIT_COMMIT"),
    "; ",
    benchmarks_built_in!(),
    ")"
);

/// This build's identity for the `pagefold_build_info` metric.
pub fn build_info() -> pagefold_api::metrics::BuildInfo {
    pagefold_api::metrics::BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("PAGEFOLD_GIT_COMMIT").to_string(),
        features: if cfg!(feature = "bench") { "bench" } else { "" }.to_string(),
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "pagefold",
    version = VERSION,
    about = "A KVM VMM with a userspace guest-memory deduplication engine",
    long_about = "pagefold runs KVM virtual machines — small built-in workload guests or Linux kernels — \
several per process, and merges identical guest pages copy-on-write, in the VMM, \
faster than the kernel's KSM and only when memory is short (auto mode)."
)]
pub struct Cli {
    /// Level of the diagnostics on stderr (default: from RUST_LOG, e.g.
    /// `info,pagefold_dedup=debug`, else warn).
    #[arg(long, global = true, value_enum, value_name = "LEVEL")]
    pub log: Option<crate::logging::Level>,
    /// Format of the diagnostics: text lines, or one JSON object per line.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value_t
    )]
    pub log_format: crate::logging::Format,
    /// Write the diagnostics to this file (appended; reopened on SIGHUP)
    /// instead of stderr.
    #[arg(long, global = true, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Command,
}

// Parsed once per process: the size difference of the variants is harmless.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run VMs until they all stop: one VM from flags, or several from --config.
    Run(RunArgs),
    /// The built-in demo: two 256 MiB workload VMs with identical content,
    /// deduplicated, with each guest's report and the savings.
    Demo(DemoArgs),
    /// Run as a daemon serving the HTTP API: start the config's VMs, if any,
    /// and keep serving until SIGTERM or PUT /api/v1/shutdown.
    Serve(client::ServeArgs),
    /// Show a running pagefold's dedup engine and VMs (over its API socket).
    Status(client::StatusArgs),
    /// Manage the VMs of a running pagefold.
    #[command(subcommand)]
    Vm(client::VmCommand),
    /// Change a running pagefold's dedup mode and knobs (in a daemon
    /// started without dedup, `dedup set mode=on` starts it).
    #[command(subcommand)]
    Dedup(client::DedupCommand),
    /// Stop a running pagefold daemon: every VM stops and it exits.
    Shutdown(client::ShutdownArgs),
    /// Benchmarks: pagefold against the kernel's KSM, side by side.
    // Hidden in builds without the `bench` feature, where it only says so.
    #[cfg_attr(not(feature = "bench"), command(hide = true))]
    Bench(bench::BenchArgs),
    /// The host-global state pagefold changes (KSM knobs, sysctls): show
    /// it, or restore what a killed pagefold left changed.
    #[command(subcommand)]
    Ksm(ksm::KsmCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(crate::docs_gen::CompletionsArgs),
    /// Write the man pages (pagefold.1 and one per subcommand).
    Man(crate::docs_gen::ManArgs),
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Dedup mode for the demo.
    #[arg(long, default_value = "on", value_parser = flag::named::<Mode>())]
    pub dedup: Mode,
    /// Memory per VM.
    #[arg(long, default_value = "256M")]
    pub memory: String,
    /// Write the final report as JSON to this file (`--json` is the old
    /// spelling, still accepted).
    #[arg(long = "json-file", alias = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub api: client::ApiServeArgs,
    #[command(flatten)]
    pub seccomp: client::SeccompArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML file describing the VMs (see examples/); excludes the per-VM flags.
    #[arg(long, short = 'c', conflicts_with_all = ["name", "vcpus", "memory", "kernel", "seed", "shared", "private", "phases", "placement", "extent_pages", "placement_seed", "vcpu_affinity"])]
    pub config: Option<PathBuf>,

    /// VM name (used in output prefixes, stats and the API).
    #[arg(long)]
    pub name: Option<String>,
    /// Number of vCPUs.
    #[arg(long)]
    pub vcpus: Option<u8>,
    /// Host CPUs the vCPU threads may run on, e.g. 0,1 (default: any).
    #[arg(long, value_delimiter = ',')]
    pub vcpu_affinity: Option<Vec<usize>>,
    /// Guest RAM, e.g. 256M or 1G (a bare number means MiB); at least 16 MiB, a
    /// whole number of MiB, rounded up to the next 2 MiB.
    #[arg(long)]
    pub memory: Option<String>,
    /// Where serial output goes: stdout, null, or a file path.
    #[arg(long, default_value = "stdout")]
    pub serial: String,

    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub dedup: DedupArgs,

    /// The VM that gets this terminal's input on its serial port (default:
    /// the first VM that boots a kernel).
    #[arg(long)]
    pub stdin_vm: Option<String>,
    /// Write the final report as JSON to this file (`--json` is the old
    /// spelling, still accepted).
    #[arg(long = "json-file", alias = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub api: client::ApiServeArgs,
    #[command(flatten)]
    pub seccomp: client::SeccompArgs,
}

/// The built-in workload guest (used when no --kernel is given).
#[derive(Args, Debug, Default)]
pub struct WorkloadArgs {
    /// Seed of the shared part: VMs with the same seed hold identical pages.
    #[arg(long, help_heading = "Workload guest")]
    pub seed: Option<u64>,
    /// Size of the shared, read-mostly part (default: half the usable RAM).
    #[arg(long, help_heading = "Workload guest")]
    pub shared: Option<String>,
    /// Size of the private, changing part (default: a quarter of the usable RAM).
    #[arg(long, help_heading = "Workload guest")]
    pub private: Option<String>,
    /// Per mille of pages that are all zeros.
    #[arg(long, help_heading = "Workload guest")]
    pub zero_permille: Option<u32>,
    /// Per mille of pages that duplicate another page of the same guest.
    #[arg(long, help_heading = "Workload guest")]
    pub dup_permille: Option<u32>,
    /// Per mille of private pages the churn phase rewrites.
    #[arg(long, help_heading = "Workload guest")]
    pub churn_permille: Option<u32>,
    /// Churn rate, pages per second (0: as fast as possible).
    #[arg(long, help_heading = "Workload guest")]
    pub churn_rate: Option<u32>,
    /// Churn duration in milliseconds (`--churn-ms` is the old spelling,
    /// still accepted).
    #[arg(
        long = "churn-millisecs",
        alias = "churn-ms",
        help_heading = "Workload guest"
    )]
    pub churn_ms: Option<u64>,
    /// Phases, comma-separated: fill, churn[:MS], verify, rewrite, sleep:MS, wait[:MS], disk-read[:PAGES], latency:MS, latency-write:MS, probe-merge[:MS].
    #[arg(long, help_heading = "Workload guest")]
    pub phases: Option<String>,
    /// Disk 0 is a test image made with this seed: disk-read checks every byte.
    #[arg(long, help_heading = "Workload guest")]
    pub disk_seed: Option<u64>,
    /// Layout of the guest's pages: linear (same address in every VM) or
    /// scattered (extents placed by a VM-specific permutation).
    #[arg(long, help_heading = "Workload guest")]
    pub placement: Option<String>,
    /// Scattered placement: pages per extent (default 1; 4-32 resembles readahead).
    #[arg(long, help_heading = "Workload guest")]
    pub extent_pages: Option<u32>,
    /// Scattered placement: seed of the permutation (default: from the VM name).
    #[arg(long, help_heading = "Workload guest")]
    pub placement_seed: Option<u64>,
}

/// A Linux guest instead of the workload guest.
#[derive(Args, Debug, Default)]
pub struct KernelArgs {
    /// Kernel image: ELF vmlinux or bzImage.
    #[arg(long, help_heading = "Linux guest")]
    pub kernel: Option<PathBuf>,
    /// Initial ramdisk.
    #[arg(long, help_heading = "Linux guest", requires = "kernel")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    #[arg(long, help_heading = "Linux guest", requires = "kernel")]
    pub cmdline: Option<String>,
    /// Disk image (raw), PATH or PATH,ro; repeatable. A virtio-blk disk for
    /// a Linux guest, or for the workload guest (its disk-read phase reads
    /// disk 0).
    #[arg(long, help_heading = "Linux guest")]
    pub disk: Vec<String>,
    /// Network interface: tap=NAME[,mac=52:54:00:XX:XX:XX][,queue_pairs=N];
    /// repeatable. A virtio-net device of a Linux guest on the host tap
    /// NAME (made beforehand, e.g. `ip tuntap add NAME mode tap
    /// multi_queue`); the MAC defaults to one derived from the VM name;
    /// one queue pair per vCPU, at most N (1-16, default 4).
    #[arg(
        long,
        help_heading = "Linux guest",
        requires = "kernel",
        value_name = "tap=NAME[,mac=MAC][,queue_pairs=N]"
    )]
    pub net: Vec<String>,
    /// Memory balloon of a Linux guest with free page reporting: `on` for
    /// the defaults, or reporting=on|off,stats=SECONDS,deflate_on_oom=on|off.
    /// Its target is set with `pagefold vm balloon`.
    #[arg(
        long,
        help_heading = "Linux guest",
        requires = "kernel",
        value_name = "on|reporting=..,stats=..,deflate_on_oom=.."
    )]
    pub balloon: Option<String>,
}

/// The process's dedup flags, one definition flattened into `run` and
/// `serve`: the settings the config file's `[dedup]` has (the same type,
/// flattened) and the backend's construction options.
#[derive(Args, Debug, Default)]
pub struct DedupFlags {
    #[command(flatten)]
    pub settings: DedupSettings,
    /// Dedup backend: pagefold's userspace engine or the kernel's KSM.
    #[arg(long, help_heading = "Deduplication", value_parser = flag::named::<BackendKind>())]
    pub dedup_backend: Option<BackendKind>,
    /// Let kernel KSM merge the duplicates of a group whose layout is
    /// scattered (pagefold backend): auto or off.
    #[arg(long, help_heading = "Deduplication")]
    pub ksm_assist: Option<pagefold_dedup::AssistMode>,
    /// Do not feed virtio-blk reads to the engine as I/O hints.
    #[arg(long, help_heading = "Deduplication")]
    pub no_io_hints: bool,
    /// Do not read KVM's dirty log of guest RAM (every visit then reads
    /// pagemap).
    #[arg(long, help_heading = "Deduplication")]
    pub no_write_log: bool,
}

/// `run`'s dedup flags: the process's ([`DedupFlags`]) and the one VM's
/// group.
#[derive(Args, Debug, Default)]
pub struct DedupArgs {
    #[command(flatten)]
    pub flags: DedupFlags,
    /// Dedup group of the VM (pages are shared only within a group).
    #[arg(long, help_heading = "Deduplication")]
    pub dedup_group: Option<String>,
    /// The group's security: default, or hardened (the guest cannot tell
    /// merged pages by timing its writes; pagefold backend only;
    /// docs/security.md).
    #[arg(long, value_name = "default|hardened", help_heading = "Deduplication")]
    pub dedup_security: Option<pagefold_dedup::Security>,
}

fn parse_disk(s: &str) -> Result<DiskConfig, Error> {
    let (path, ro) = match s.rsplit_once(',') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        Some((_, opt)) => {
            return Err(Error::Usage(format!(
                "--disk {s}: unknown option {opt:?} (expected ro or rw)"
            )))
        }
        None => (s, false),
    };
    Ok(DiskConfig {
        path: PathBuf::from(path),
        readonly: ro,
    })
}

fn parse_net(s: &str) -> Result<NetConfig, Error> {
    let usage = |m: String| Error::Usage(format!("--net {s}: {m}"));
    let (mut tap, mut mac, mut queue_pairs) = (None, None, None);
    for part in s.split(',') {
        match part.split_once('=') {
            Some(("tap", v)) if tap.is_none() => tap = Some(v.to_string()),
            Some(("mac", v)) if mac.is_none() => {
                mac = Some(config::Mac::try_from(v.to_string()).map_err(usage)?)
            }
            Some(("queue_pairs", v)) if queue_pairs.is_none() => {
                queue_pairs = Some(v.parse::<u16>().map_err(|_| {
                    usage(format!("queue_pairs {v:?}: expected a number from 1 to 16"))
                })?)
            }
            Some((k @ ("tap" | "mac" | "queue_pairs"), _)) => {
                return Err(usage(format!("{k} is given twice")))
            }
            _ => {
                return Err(usage(format!(
                    "unknown option {part:?} (expected tap=NAME, mac=MAC or queue_pairs=N)"
                )))
            }
        }
    }
    let tap = tap.ok_or_else(|| usage("tap=NAME is missing".into()))?;
    Ok(NetConfig {
        tap,
        mac,
        queue_pairs,
    })
}

fn serial_output(s: &str) -> SerialOutput {
    match s {
        "stdout" | "-" => SerialOutput::Stdout,
        "null" | "none" => SerialOutput::Null,
        p => SerialOutput::File(PathBuf::from(p)),
    }
}

/// Checks the dedup settings given as flags (their one check) and puts
/// them over those of the config file.
fn settings_over(flags: &DedupSettings, d: &mut DedupConfig) -> Result<(), Error> {
    let flags = flags.validate().map_err(|e| Error::Usage(e.to_string()))?;
    d.settings = flags.or(d.settings);
    Ok(())
}

impl DedupFlags {
    /// Checks the flags and puts them over the config file's `[dedup]`.
    pub fn apply(&self, d: &mut DedupConfig) -> Result<(), Error> {
        settings_over(&self.settings, d)?;
        if let Some(b) = self.dedup_backend {
            d.backend = b;
        }
        if let Some(a) = self.ksm_assist {
            d.ksm_assist = a;
        }
        if self.no_io_hints {
            d.io_hints = false;
        }
        if self.no_write_log {
            d.write_log = false;
        }
        Ok(())
    }
}

/// Builds the config for `pagefold run`.
pub fn run_config(a: &RunArgs) -> Result<Config, Error> {
    let mut cfg = match &a.config {
        Some(path) => Config::from_file(path)?,
        None => {
            let w = &a.workload;
            let workload = if a.kernel.kernel.is_some() {
                None
            } else {
                let mut wc = WorkloadConfig::default();
                if let Some(s) = w.seed {
                    wc.seed = s;
                }
                wc.shared = w.shared.clone().map(SizeValue::Text);
                wc.private = w.private.clone().map(SizeValue::Text);
                wc.zero_permille = w.zero_permille.unwrap_or(0);
                wc.dup_permille = w.dup_permille.unwrap_or(0);
                wc.churn_permille = w.churn_permille.unwrap_or(0);
                wc.churn_rate = w.churn_rate.unwrap_or(0);
                wc.churn_ms = w.churn_ms.unwrap_or(0);
                if let Some(p) = &w.phases {
                    wc.phases = p.split(',').map(|s| s.trim().to_string()).collect();
                }
                wc.disks = a
                    .kernel
                    .disk
                    .iter()
                    .map(|d| parse_disk(d))
                    .collect::<Result<_, _>>()?;
                wc.disk_seed = w.disk_seed;
                if let Some(pl) = &w.placement {
                    wc.placement = pl
                        .parse()
                        .map_err(|e: String| Error::Usage(format!("--placement: {e}")))?;
                }
                wc.extent_pages = w.extent_pages;
                wc.placement_seed = w.placement_seed;
                Some(wc)
            };
            let kernel = match &a.kernel.kernel {
                Some(path) => Some(KernelConfig {
                    path: path.clone(),
                    initrd: a.kernel.initrd.clone(),
                    cmdline: a
                        .kernel
                        .cmdline
                        .clone()
                        .unwrap_or_else(config::default_cmdline),
                    disks: a
                        .kernel
                        .disk
                        .iter()
                        .map(|d| parse_disk(d))
                        .collect::<Result<_, _>>()?,
                    net: a
                        .kernel
                        .net
                        .iter()
                        .map(|n| parse_net(n))
                        .collect::<Result<_, _>>()?,
                    balloon: a
                        .kernel
                        .balloon
                        .as_deref()
                        .map(config::BalloonConfig::parse_flag)
                        .transpose()
                        .map_err(Error::Usage)?,
                }),
                None => None,
            };
            Config {
                dedup: DedupConfig::default(),
                stdin: None,
                seccomp: None,
                vms: vec![VmConfig {
                    name: a.name.clone().unwrap_or_else(|| "vm0".to_string()),
                    vcpus: a.vcpus.unwrap_or(1),
                    memory: SizeValue::Text(a.memory.clone().unwrap_or_else(|| "256M".to_string())),
                    serial: serial_output(&a.serial),
                    dedup: VmDedup {
                        enabled: true,
                        group: a.dedup.dedup_group.clone(),
                        security: a.dedup.dedup_security.unwrap_or_default(),
                    },
                    workload,
                    kernel,
                    vcpu_affinity: a.vcpu_affinity.clone(),
                }],
            }
        }
    };
    a.dedup.flags.apply(&mut cfg.dedup)?;
    if a.stdin_vm.is_some() {
        cfg.stdin = a.stdin_vm.clone();
    }
    Ok(cfg)
}

/// The demo's configuration: two identical workload VMs in one dedup group.
pub fn demo_config(a: &DemoArgs) -> Result<Config, Error> {
    let text = include_str!("../examples/two-workload-vms.toml");
    let mut cfg: Config =
        toml::from_str(text).map_err(|e| Error::Usage(format!("built-in demo config: {e}")))?;
    cfg.dedup.settings = CheckedSettings::from(a.dedup).or(cfg.dedup.settings);
    for vm in &mut cfg.vms {
        vm.memory = SizeValue::Text(a.memory.clone());
    }
    Ok(cfg)
}

/// Runs the VMs of `cfg` to completion and prints the report.
fn run_vms(
    cfg: Config,
    json: Option<PathBuf>,
    api: &client::ApiServeArgs,
    status_after: Option<std::time::Duration>,
) -> Result<i32, Error> {
    cfg.validate(pagefold_vmm::memory::host_mem_total())?;
    // Before any thread starts: the engine and API threads filter
    // themselves as they start.
    pagefold_vmm::seccomp::configure(cfg.seccomp_enabled())?;
    let dedup =
        pagefold_vmm::dedup::create(&cfg, false).map_err(|e| Error::Dedup(e.to_string()))?;
    let mut runner = Runner::with_dedup(dedup, cfg.vms.len() > 1)?;
    runner.allow_late_dedup(&cfg);
    let status_sock = api.api_sock.clone();
    let api = client::start_api(&runner, api, false)?;
    runner.start_all(&cfg)?;
    let _terminal = runner.attach_stdin(cfg.stdin.as_deref());
    // The demo shows what `pagefold status` says while its VMs run, asking
    // its own API like any client would.
    if let (Some(after), Some(sock)) = (status_after, status_sock) {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            let _ = write_out_or_drop(&format!(
                "\n$ pagefold status --api-sock {}\n",
                sock.display()
            ));
            let args = client::StatusArgs {
                output: Default::default(),
                client: client::ClientArgs {
                    api_sock: Some(sock),
                },
            };
            match client::status(args) {
                Ok(_) | Err(Error::StdoutClosed) => {}
                Err(e) => log::warn!("demo: pagefold status: {e}"),
            }
            let _ = write_out_or_drop("\n");
        });
    }
    // Set-up is done: from here the main thread only runs the event loop
    // (and what the API asks of it: VM creation only if the API is on).
    pagefold_vmm::seccomp::install(pagefold_vmm::seccomp::ThreadKind::main(api.is_some()))?;
    let mut last = std::time::Instant::now();
    let report = runner.run(|r| {
        // Long runs show progress: the dedup figures once a second.
        if last.elapsed() >= std::time::Duration::from_secs(1) && !r.vms().is_empty() {
            last = std::time::Instant::now();
            if let Some(d) = r.dedup() {
                let _ = write_out_or_drop(&format!("{}\n", report::progress(&d.stats())));
            }
        }
    })?;
    drop(api);
    drop(runner);
    report::print(&report)?;
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Error::Io(e.to_string()))?;
        std::fs::write(&path, text)
            .map_err(|e| Error::Io(format!("writing {}: {e}", path.display())))?;
    }
    Ok(report.exit_code())
}

pub fn dispatch(cli: Cli) -> Result<i32, Error> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = crate::logging::filter(cli.log, rust_log.as_deref())
        .map_err(|e| Error::Usage(e.to_string()))?;
    crate::logging::init(filter, cli.log_format, cli.log_file.as_deref())
        .map_err(|e| Error::Usage(e.to_string()))?;
    match cli.cmd {
        Command::Run(a) => {
            let json = a.json.clone();
            let mut cfg = run_config(&a)?;
            a.seccomp.apply(&mut cfg);
            run_vms(cfg, json, &a.api, None)
        }
        Command::Demo(a) => {
            let json = a.json.clone();
            let mut api = a.api.clone();
            if api.api_sock.is_none() {
                api.api_sock = Some(
                    std::env::temp_dir().join(format!("pagefold-demo-{}.sock", std::process::id())),
                );
            }
            let mut cfg = demo_config(&a)?;
            a.seccomp.apply(&mut cfg);
            run_vms(cfg, json, &api, Some(std::time::Duration::from_secs(4)))
        }
        Command::Serve(a) => client::serve(a),
        Command::Status(a) => client::status(a),
        Command::Vm(c) => client::vm(c),
        Command::Dedup(c) => client::dedup(c),
        Command::Shutdown(a) => client::shutdown(a),
        Command::Bench(c) => bench::run(c),
        Command::Ksm(c) => ksm::run(c),
        Command::Completions(a) => crate::docs_gen::completions(a, Cli::command()),
        Command::Man(a) => crate::docs_gen::man(a, Cli::command()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_parse() {
        assert_eq!(
            parse_disk("a.img,ro").unwrap(),
            DiskConfig {
                path: "a.img".into(),
                readonly: true
            }
        );
        assert_eq!(
            parse_disk("a.img").unwrap(),
            DiskConfig {
                path: "a.img".into(),
                readonly: false
            }
        );
        assert!(parse_disk("a.img,x").is_err());
    }

    #[test]
    fn nets_parse() {
        let n = parse_net("tap=tap0,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(n.tap, "tap0");
        assert_eq!(n.mac.unwrap().0.to_string(), "52:54:00:00:00:01");
        let n = parse_net("tap=tap1").unwrap();
        assert_eq!((n.tap.as_str(), n.mac, n.queue_pairs), ("tap1", None, None));
        let n = parse_net("tap=tap2,queue_pairs=2").unwrap();
        assert_eq!(n.queue_pairs, Some(2));
        for bad in [
            "tap=a,queue_pairs=x",
            "tap=a,queue_pairs=-1",
            "tap=a,queue_pairs=1,queue_pairs=2",
            "tap0",
            "mac=52:54:00:00:00:01",
            "tap=a,tap=b",
            "tap=a,mac=52:54:00:00:00",
            "tap=a,mac=01:00:5e:00:00:01",
            "tap=a,speed=10",
        ] {
            assert!(parse_net(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scattered_example_is_valid() {
        let c: Config = toml::from_str(include_str!("../examples/two-scattered-vms.toml")).unwrap();
        c.validate(None).unwrap();
        let w: Vec<_> = c
            .vms
            .iter()
            .map(|v| v.workload.as_ref().unwrap().placement(&v.name))
            .collect();
        assert!(matches!(
            w[0],
            pagefold_guest_abi::Placement::Scattered {
                extent_pages: 8,
                ..
            }
        ));
        assert_ne!(w[0], w[1]);
    }

    #[test]
    fn side_channel_example_puts_attacker_and_victim_in_one_group() {
        let c: Config = toml::from_str(include_str!("../examples/side-channel.toml")).unwrap();
        c.validate(None).unwrap();
        let groups: Vec<_> = c.vms.iter().map(|v| v.dedup_group()).collect();
        assert_eq!(groups, ["shared", "shared"]);
        let a = c.vms[1].workload.as_ref().unwrap();
        assert!(a.phases.iter().any(|p| p.starts_with("probe-merge")));
        assert_eq!(a.seed, c.vms[0].workload.as_ref().unwrap().seed);
    }

    #[test]
    fn placement_flags_reach_the_config() {
        let config_of = |placement: &str| {
            let cli = Cli::try_parse_from([
                "pagefold",
                "run",
                "--placement",
                placement,
                "--extent-pages",
                "16",
                "--placement-seed",
                "7",
            ])
            .unwrap();
            let Command::Run(a) = cli.cmd else {
                panic!("not a run command")
            };
            run_config(&a)
        };
        let c = config_of("scattered").unwrap();
        let w = c.vms[0].workload.as_ref().unwrap();
        assert_eq!(w.placement, config::PlacementKind::Scattered);
        assert_eq!((w.extent_pages, w.placement_seed), (Some(16), Some(7)));
        let e = config_of("diagonal").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("--placement: unknown placement"),
            "{e}"
        );
    }

    fn run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let cli = Cli::try_parse_from(["pagefold", "run"].iter().chain(args))?;
        let Command::Run(a) = cli.cmd else {
            panic!("not a run command")
        };
        Ok(a)
    }

    #[test]
    fn run_takes_every_dedup_setting_as_a_flag() {
        let a = run_args(&[
            "--dedup",
            "auto",
            "--dedup-backend",
            "ksm",
            "--pages-to-scan",
            "500",
            "--sleep-millisecs",
            "5",
            "--max-page-sharing",
            "64",
            "--auto-threshold",
            "30",
            "--max-scanning-factor",
            "4",
            "--memory-signal",
            "free",
            "--max-guest-pause-us",
            "250",
            "--settle",
            "false",
        ])
        .unwrap();
        let d = run_config(&a).unwrap().dedup;
        assert_eq!(d.backend, BackendKind::Ksm);
        assert_eq!(d.mode(), Mode::Auto);
        let want = DedupSettings {
            mode: Some(Mode::Auto),
            pages_to_scan: Some(500),
            sleep_millisecs: Some(5),
            max_page_sharing: Some(64),
            auto_threshold: Some(30),
            max_scanning_factor: Some(4),
            memory_signal: Some(pagefold_dedup::MemorySignal::Free),
            max_guest_pause_us: Some(250),
            settle: Some(false),
        };
        assert_eq!(*d.settings, want);
        // Without flags the config's (here: the defaults) stay.
        let d = run_config(&run_args(&[]).unwrap()).unwrap().dedup;
        assert_eq!(*d.settings, DedupSettings::default());
        assert_eq!(d.backend, BackendKind::Pagefold);
    }

    #[test]
    fn setting_flags_go_over_the_config_file() {
        let dir = std::env::temp_dir().join(format!("pf-cli-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "[dedup]\nmode = \"on\"\npages_to_scan = 100\nauto_threshold = 10\nsettle = false\n\
             [[vm]]\nname = \"a\"\nmemory = 64\n",
        )
        .unwrap();
        let config = path.to_str().unwrap();
        let a = run_args(&["--config", config, "--auto-threshold", "30"]).unwrap();
        let d = run_config(&a).unwrap().dedup;
        let settled = run_config(&run_args(&["--config", config, "--settle", "true"]).unwrap())
            .unwrap()
            .dedup;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(d.mode(), Mode::On);
        assert_eq!(d.settings.pages_to_scan, Some(100));
        assert_eq!(d.settings.auto_threshold, Some(30));
        assert_eq!(d.settings.settle, Some(false));
        assert_eq!(settled.settings.settle, Some(true));
        // Out of range as a flag: a usage error (exit 2), the config's words.
        let e = run_config(&run_args(&["--auto-threshold", "101"]).unwrap()).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "auto_threshold must be a percentage in 0..=100, got 101"
        );
        let e = run_args(&["--memory-signal", "cached"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("unknown memory signal"), "{e}");
    }

    /// `serve` and `run` share one definition of the dedup flags: every
    /// one `run` takes, `serve` takes and applies the same way.
    #[test]
    fn serve_takes_every_dedup_flag_run_takes() {
        let flags = [
            "--dedup",
            "auto",
            "--auto-threshold",
            "30",
            "--max-scanning-factor",
            "4",
            "--memory-signal",
            "available",
            "--dedup-backend",
            "ksm",
            "--ksm-assist",
            "off",
            "--no-io-hints",
            "--no-write-log",
            "--settle",
            "false",
        ];
        let cli = Cli::try_parse_from(["pagefold", "serve"].iter().chain(&flags)).unwrap();
        let Command::Serve(a) = cli.cmd else {
            panic!("not a serve command")
        };
        let mut served = DedupConfig::default();
        a.dedup.apply(&mut served).unwrap();
        let ran = run_config(&run_args(&flags).unwrap()).unwrap().dedup;
        assert_eq!(served, ran);
        assert_eq!(served.backend, BackendKind::Ksm);
        assert_eq!(served.ksm_assist, pagefold_dedup::AssistMode::Off);
        assert!(!served.io_hints && !served.write_log);
        assert_eq!(served.settings.settle, Some(false));
        assert_eq!(served.mode(), Mode::Auto);
        assert_eq!(served.settings.auto_threshold, Some(30));
        assert_eq!(
            served.settings.memory_signal,
            Some(pagefold_dedup::MemorySignal::Available)
        );
        let e =
            Cli::try_parse_from(["pagefold", "serve", "--max-scanning-factor", "x"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        // The VM's group is `run`'s alone (serve's VMs come from a config
        // or the API).
        assert!(Cli::try_parse_from(["pagefold", "serve", "--dedup-group", "g"]).is_err());
    }

    /// Every subcommand and argument a user sees says what it is for.
    #[test]
    fn no_help_text_is_empty() {
        fn walk(cmd: &clap::Command, path: &str, empty: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    empty.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.is_hide_set() || sub.get_name() == "help" {
                    continue;
                }
                let p = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    empty.push(p.clone());
                }
                walk(sub, &p, empty);
            }
        }
        let mut empty = Vec::new();
        walk(
            &<Cli as clap::CommandFactory>::command(),
            "pagefold",
            &mut empty,
        );
        assert!(empty.is_empty(), "without help text: {empty:?}");
    }

    /// One spelling per unit in flag names: `-millisecs` (KSM's
    /// `sleep_millisecs`) and `-secs`, never `-ms`, `-seconds`, `-sec`,
    /// `-millis`; the old spellings stay as hidden aliases that parse.
    #[test]
    fn one_spelling_per_unit() {
        fn walk(cmd: &clap::Command, bad: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let Some(long) = a.get_long() else { continue };
                for suffix in ["-ms", "-seconds", "-sec", "-millis", "-msec", "-s"] {
                    if long.ends_with(suffix) {
                        bad.push(format!("{} --{long}", cmd.get_name()));
                    }
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, bad);
            }
        }
        let mut bad = Vec::new();
        walk(&<Cli as clap::CommandFactory>::command(), &mut bad);
        assert!(bad.is_empty(), "{bad:?}");
        let old = Cli::try_parse_from(["pagefold", "run", "--churn-ms", "5"]).unwrap();
        let Command::Run(a) = old.cmd else {
            panic!("not run")
        };
        assert_eq!(a.workload.churn_ms, Some(5));
    }

    /// Every subcommand gets a man page, and a page lists its flags.
    #[test]
    fn a_man_page_per_command() {
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), dir.path()).unwrap();
        let page = |name: &str| {
            std::fs::read_to_string(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert!(page("pagefold.1").contains(".TH pagefold 1"));
        let serve = page("pagefold-serve.1");
        assert!(serve.contains("\\-\\-metrics\\-addr"), "{serve}");
        assert!(serve.contains("\\-\\-dedup\\-backend"), "{serve}");
        for sub in [
            "run",
            "demo",
            "status",
            "vm-create",
            "dedup-set",
            "ksm-restore",
            "completions",
        ] {
            page(&format!("pagefold-{sub}.1"));
        }
    }

    #[test]
    fn version_names_the_commit_and_the_benchmarks() {
        let v = <Cli as clap::CommandFactory>::command().render_version();
        assert!(v.starts_with("pagefold 0."), "{v}");
        let commit = env!("PAGEFOLD_GIT_COMMIT");
        assert!(
            commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{commit}"
        );
        assert!(v.contains(&format!("(commit {commit}; ")), "{v}");
        assert_eq!(
            v.contains("benchmarks built in"),
            cfg!(feature = "bench"),
            "{v}"
        );
        // The metrics' build_info says the same.
        let b = build_info();
        assert_eq!(b.commit, commit);
        assert!(v.starts_with(&format!("pagefold {} ", b.version)), "{v}");
        assert_eq!(b.features == "bench", cfg!(feature = "bench"), "{b:?}");
    }

    /// Report files: `--json-file`, with the old `--json FILE` still taken.
    #[test]
    fn report_files_are_json_file_and_json_still_works() {
        for flag in ["--json-file", "--json"] {
            let a = run_args(&[flag, "r.json"]).unwrap();
            assert_eq!(a.json.as_deref(), Some(std::path::Path::new("r.json")));
        }
    }

    #[test]
    fn demo_config_is_valid() {
        let c = demo_config(&DemoArgs {
            dedup: Mode::On,
            memory: "256M".into(),
            json: None,
            api: Default::default(),
            seccomp: Default::default(),
        })
        .unwrap();
        c.validate(None).unwrap();
        assert_eq!(c.vms.len(), 2);
    }
}
