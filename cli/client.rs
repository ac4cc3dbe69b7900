//! The CLI's API side: serving the API from `run`, `demo` and `serve`, and
//! the client commands (`status`, `vm ...`, `dedup set`) that talk to a
//! running pagefold over its socket.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use pagefold_api::client::{Client, ClientError, Target};
use pagefold_api::dedup_view::OwnerView;
use pagefold_api::view::{EngineHealth, Health, HealthStatus};
use pagefold_api::vms::Target as VmTarget;
use pagefold_api::{patch, DedupView, ListenConfig, Server};
use pagefold_vmm::config::{fmt_size, validate_vm_name, Config, VmConfig};
use pagefold_vmm::pause::GuestPauses;
use pagefold_vmm::runner::{RunReport, Runner};
use pagefold_vmm::state::{Outcome, RunState};
use pagefold_vmm::vm::VmInfo;
use serde::Serialize;

use crate::error::Error;
use crate::output::{out, outln, OutputArg};
use crate::report;

/// Where `run`, `demo` and `serve` serve the API.
#[derive(Args, Debug, Default, Clone)]
pub struct ApiServeArgs {
    /// Serve the HTTP API on this Unix socket (mode 0600) while the VMs run
    /// (`serve`: default $XDG_RUNTIME_DIR/pagefold/api.sock, or /run/pagefold/api.sock as root).
    #[arg(long, help_heading = "API")]
    pub api_sock: Option<PathBuf>,
    /// Let this group's members use the API socket too (mode 0660; a name
    /// or a gid).
    #[arg(long, help_heading = "API", value_name = "GROUP")]
    pub api_sock_group: Option<String>,
    /// Also serve the API on this TCP address (loopback only unless --api-tcp-allow-remote).
    #[arg(long, help_heading = "API")]
    pub api_tcp: Option<SocketAddr>,
    /// Allow a non-loopback --api-tcp address (the API has no authentication).
    #[arg(long, help_heading = "API", requires = "api_tcp")]
    pub api_tcp_allow_remote: bool,
    /// Serve GET /metrics, and nothing else, on this TCP address (any
    /// address: it exposes no control), for Prometheus on another host.
    #[arg(long, help_heading = "API", value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

/// The environment variable naming the API socket, for the client
/// commands and `serve` alike (`--api-sock` wins over it).
pub const SOCKET_ENV: &str = "PAGEFOLD_API_SOCK";

/// The socket a client command talks to.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The API socket of the pagefold to talk to (default $XDG_RUNTIME_DIR/pagefold/api.sock, or /run/pagefold/api.sock as root).
    #[arg(long, env = SOCKET_ENV)]
    pub api_sock: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// `-o json`: health, VMs and dedup as the API has them.
    #[command(flatten)]
    pub output: OutputArg,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `pagefold shutdown`.
#[derive(Args, Debug)]
pub struct ShutdownArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// List the VMs.
    List {
        /// `-o json`: the VMs as `GET /api/v1/vms` has them.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One VM: its state, size, group, uptime, outcome and dedup figures.
    Info {
        /// The VM's name.
        name: String,
        /// `-o json`: the VM and its dedup figures.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create and start the VMs of a config file (TOML `[[vm]]` tables, or one JSON VM object).
    Create {
        /// The file: TOML with `[[vm]]` tables or one VM's keys, or a .json file with one VM object.
        #[arg(long, short = 'c')]
        config: PathBuf,
        /// `-o json`: the created VMs, as a JSON array.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause a VM.
    Pause {
        /// The VM's name.
        name: String,
        /// `-o json`: the VM after the change.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused VM.
    Resume {
        /// The VM's name.
        name: String,
        /// `-o json`: the VM after the change.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set a VM's balloon target: the guest gives that much memory back to the host.
    Balloon {
        /// The VM's name.
        name: String,
        /// MiB the guest should give up into its balloon (0: take it all back).
        #[arg(long)]
        target_mib: u64,
        /// `-o json`: the VM after the change.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop a VM and release its memory.
    Delete {
        /// The VM's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum DedupCommand {
    /// Change the dedup mode or knobs: mode=off|on|unmerge|auto, pages_to_scan=N, sleep_millisecs=N,
    /// max_page_sharing=N, auto_threshold=PCT, max_scanning_factor=N, memory_signal=free|available,
    /// max_guest_pause_us=US, settle=true|false.
    Set {
        /// The settings to change, e.g. mode=on pages_to_scan=4096.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
        /// `-o json`: the new state, as `GET /api/v1/dedup` has it.
        #[command(flatten)]
        output: OutputArg,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// VMs to start right away (TOML, as for `run`); more can be created through the API.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Dedup flags, as `run` takes them (override the config's).
    #[command(flatten)]
    pub dedup: crate::cli::DedupFlags,
    #[command(flatten)]
    pub api: ApiServeArgs,
    #[command(flatten)]
    pub seccomp: SeccompArgs,
}

/// Starts the API server for `runner`, if asked to (always for `serve`).
pub fn start_api(runner: &Runner, a: &ApiServeArgs, daemon: bool) -> Result<Option<Server>, Error> {
    let from_env = || {
        std::env::var_os(SOCKET_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    };
    let unix = match (&a.api_sock, daemon) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(from_env().unwrap_or_else(pagefold_api::default_socket_path)),
        (None, false) => None,
    };
    if unix.is_none() && a.api_tcp.is_none() && a.metrics_addr.is_none() {
        return Ok(None);
    }
    let unix_group = a
        .api_sock_group
        .as_deref()
        .map(pagefold_api::socket::group_id)
        .transpose()
        .map_err(|e| Error::Usage(e.to_string()))?;
    let listen = ListenConfig {
        unix,
        unix_group,
        tcp: a.api_tcp,
        allow_remote: a.api_tcp_allow_remote,
        metrics: a.metrics_addr,
    };
    let server =
        Server::start(runner.handle(), &listen, Default::default()).map_err(|e| match e {
            pagefold_api::ServerError::Listen(l) => Error::Usage(l.to_string()),
            other => Error::Io(other.to_string()),
        })?;
    if let Some(p) = server.socket_path() {
        log::info!("API on {}", p.display());
    }
    if let Some(t) = server.tcp_addr() {
        log::info!("API on http://{t}/api/v1");
    }
    if let Some(m) = server.metrics_addr() {
        log::info!("metrics only on http://{m}/metrics");
    }
    Ok(Some(server))
}

/// Seccomp: on unless turned off here or in the config.
#[derive(Args, Debug, Clone, Default)]
pub struct SeccompArgs {
    /// Run without the per-thread seccomp filters (debugging; also
    /// `seccomp = false` in the config). See docs/architecture.md.
    #[arg(long)]
    pub no_seccomp: bool,
}

impl SeccompArgs {
    /// Applies the flag to `cfg`.
    pub fn apply(&self, cfg: &mut Config) {
        if self.no_seccomp {
            cfg.seccomp = Some(false);
        }
    }
}

/// `pagefold serve`: a daemon that runs VMs until SIGTERM or an API shutdown.
pub fn serve(a: ServeArgs) -> Result<i32, Error> {
    // First: a SIGTERM while the daemon sets up stops it cleanly once its
    // loop runs, rather than killing it half set up.
    pagefold_vmm::signals::install().map_err(|e| Error::Io(format!("signal handlers: {e}")))?;
    let mut cfg = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    a.seccomp.apply(&mut cfg);
    pagefold_vmm::seccomp::configure(cfg.seccomp_enabled())?;
    a.dedup.apply(&mut cfg.dedup)?;
    if !cfg.vms.is_empty() {
        cfg.validate(pagefold_vmm::memory::host_mem_total())?;
    }
    // A backend now unless the mode is off (VMs created through the API
    // later may want dedup); with the mode off, the first `PATCH /dedup`
    // starts it.
    let always = cfg.dedup.mode() != pagefold_dedup::Mode::Off;
    let dedup =
        pagefold_vmm::dedup::create(&cfg, always).map_err(|e| Error::Dedup(e.to_string()))?;
    let mut runner = Runner::with_dedup(dedup, true)?;
    runner.allow_late_dedup(&cfg);
    runner.keep_alive = true;
    let api = start_api(&runner, &a.api, true)?;
    runner.start_all(&cfg)?;
    // Ready: the API answers and the config's VMs run. Before the seccomp
    // filter, which allows no new socket.
    let status = api
        .as_ref()
        .and_then(|s| s.socket_path())
        .map(|p| format!("STATUS=API on {}\n", p.display()))
        .unwrap_or_default();
    if let Err(e) = crate::notify::notify(&format!("READY=1\n{status}")) {
        log::warn!("telling the service manager: {e}");
    }
    // VMs created through the API later are created on this thread.
    pagefold_vmm::seccomp::install(pagefold_vmm::seccomp::ThreadKind::main(api.is_some()))?;
    let report = runner.run(|_| {})?;
    drop(api);
    drop(runner);
    report::print(&report)?;
    Ok(serve_exit_code(&report))
}

/// Like [`RunReport::exit_code`], except that VMs stopped on request (API
/// delete or shutdown, SIGTERM or SIGINT) are a normal end for a daemon:
/// a supervisor that stops it (`systemctl stop`) sees exit status 0.
fn serve_exit_code(r: &RunReport) -> i32 {
    r.vms
        .iter()
        .map(|v| match &v.outcome {
            Outcome::Stopped { .. } => 0,
            o if o.is_success() => 0,
            Outcome::GuestExit { .. } => 1,
            _ => 3,
        })
        .max()
        .unwrap_or(0)
}

fn client(a: &ClientArgs) -> Result<Client, Error> {
    let path = a
        .api_sock
        .clone()
        .unwrap_or_else(pagefold_api::default_socket_path);
    Client::new(Target::Unix(path)).map_err(|e| Error::Io(e.to_string()))
}

/// A failed API call as the CLI reports it: refusals of the user's input
/// (4xx) exit 2, anything else 3.
fn api_err(e: ClientError) -> Error {
    if e.is_client_fault() {
        Error::Usage(e.to_string())
    } else {
        Error::Io(e.to_string())
    }
}

fn pretty<T: Serialize>(v: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(v).map_err(|e| Error::Io(e.to_string()))
}

/// A VM's run state as the API names it.
fn state_name(s: RunState) -> &'static str {
    match s {
        RunState::Running => "running",
        RunState::Paused => "paused",
        RunState::Stopping => "stopping",
        RunState::Stopped => "stopped",
    }
}

fn vm_table(vms: &[VmInfo], dedup: Option<&DedupView>) -> String {
    let mut out = format!(
        "{:<16} {:<9} {:>5} {:>10} {:>9} {:<12} {:>9} {:>9} {:>7} {:>10} {:>15}  {}\n",
        "VM",
        "STATE",
        "VCPUS",
        "MEMORY",
        "UPTIME",
        "GROUP",
        "TRACKED",
        "MERGED",
        "ZERO",
        "SAVED",
        "PAUSE P99/MAX",
        "OUTCOME"
    );
    for v in vms {
        let owner = dedup.and_then(|d| d.per_owner.get(&v.name));
        let fig = |f: fn(&OwnerView) -> u64| owner.map_or("-".to_string(), |o| f(o).to_string());
        out += &format!(
            "{:<16} {:<9} {:>5} {:>10} {:>8.1}s {:<12} {:>9} {:>9} {:>7} {:>10} {:>15}  {}\n",
            v.name,
            state_name(v.state),
            v.vcpus,
            fmt_size(v.memory_bytes),
            v.uptime_s,
            v.dedup_group.as_deref().unwrap_or("-"),
            fig(|o| o.pages_tracked),
            fig(|o| o.pages_merged),
            fig(|o| o.zero_pages),
            owner.map_or("-".to_string(), |o| fmt_size(o.bytes_saved)),
            pause_cell(&v.guest_pauses),
            outcome_text(v.outcome.as_ref()),
        );
    }
    out
}

/// A VM's engine-imposed pauses in a table cell: `p99/max`, or `-` when
/// the engine never parked it.
fn pause_cell(p: &GuestPauses) -> String {
    if p.count == 0 {
        return "-".into();
    }
    format!("{}/{}", fmt_secs(p.p99_s), fmt_secs(p.max_s))
}

/// A short duration with its unit: `40µs`, `2.5ms`, `1.20s`.
fn fmt_secs(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0}µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

/// A VM's outcome in a table cell: `-` while it runs, else how it ended
/// (`exit 0`, `stopped: SIGTERM received`, `guest_error: triple fault`).
fn outcome_text(o: Option<&Outcome>) -> String {
    let Some(o) = o else {
        return "-".into();
    };
    match o {
        Outcome::GuestExit { status } => format!("exit {status}"),
        Outcome::GuestReset => "guest_reset".into(),
        Outcome::GuestPowerOff => "guest_power_off".into(),
        Outcome::GuestError { message } => format!("guest_error: {message}"),
        Outcome::VmmError { message } => format!("vmm_error: {message}"),
        Outcome::Stopped { reason } => format!("stopped: {reason}"),
        Outcome::Deleted => "deleted".into(),
    }
}

fn dedup_summary(d: &DedupView) -> Result<String, Error> {
    let k = &d.knobs;
    let mut s = format!(
        "dedup: backend {}, mode {}; pages_to_scan {}, sleep_millisecs {}, max_page_sharing {}\n",
        d.backend, d.mode, k.pages_to_scan, k.sleep_millisecs, k.max_page_sharing,
    );
    s += &format!(
        "  pages_shared {}  pages_sharing {}  zero_pages {}  pages_unshared {}  pages_volatile {}\n",
        d.pages_shared, d.pages_sharing, d.zero_pages, d.pages_unshared, d.pages_volatile
    );
    s += &format!(
        "  full_scans {}  merges {}  cow_breaks {}  saved {}  metadata {}  profit {} B  engine CPU {:.2} s\n",
        d.full_scans,
        d.merges,
        d.cow_breaks,
        fmt_size(d.bytes_saved),
        fmt_size(d.metadata_bytes),
        d.profit_bytes,
        d.cpu_seconds,
    );
    if d.last_wakeup_age_ms > 0 {
        s += &format!(
            "  scanner last woke up {} ms ago{}\n",
            d.last_wakeup_age_ms,
            if d.wakeup_overdue {
                " (overdue: stalled)"
            } else {
                ""
            }
        );
    }
    if let Some(auto) = &d.auto {
        let compact = serde_json::to_string(auto).map_err(|e| Error::Io(e.to_string()))?;
        s += &format!("  auto: {compact}\n");
    }
    Ok(s)
}

/// A warning line when the health check says the dedup engine is stalled.
fn stall_line(health: &Health) -> String {
    if health.status != HealthStatus::Stalled {
        return String::new();
    }
    match &health.engine {
        Some(e) if !e.responding => {
            "WARNING: the dedup engine is stalled: its statistics do not answer\n".into()
        }
        Some(EngineHealth {
            last_wakeup_age_ms: Some(ms),
            ..
        }) => format!(
            "WARNING: the dedup engine is stalled: its scanner last woke up {:.1} s ago\n",
            *ms as f64 / 1000.0
        ),
        _ => "WARNING: the dedup engine is stalled\n".into(),
    }
}

/// What `pagefold status -o json` prints.
#[derive(Serialize)]
struct StatusJson<'a> {
    health: &'a Health,
    vms: &'a [VmInfo],
    dedup: Option<&'a DedupView>,
}

/// `pagefold status`.
pub fn status(a: StatusArgs) -> Result<i32, Error> {
    let c = client(&a.client)?;
    let health = c.health().map_err(api_err)?;
    let vms = c.vms().map_err(api_err)?;
    let dedup = c.dedup().map_err(api_err)?;
    if a.output.json() {
        let all = StatusJson {
            health: &health,
            vms: &vms,
            dedup: dedup.as_ref(),
        };
        outln!("{}", pretty(&all)?)?;
        return Ok(health_exit_code(&health));
    }
    let mut text = format!("pagefold at {}: {} VM(s)\n", c.target(), vms.len());
    text += &stall_line(&health);
    match &dedup {
        Some(d) => text += &dedup_summary(d)?,
        None => text += "dedup: off (no backend)\n",
    }
    text += &vm_table(&vms, dedup.as_ref());
    out!("{text}")?;
    Ok(health_exit_code(&health))
}

/// `status`'s exit status: 0 when the daemon reports itself healthy, 1
/// when not (the dedup engine stalled), so that scripts and monitors can
/// test it.
fn health_exit_code(h: &Health) -> i32 {
    match h.status {
        HealthStatus::Ok => 0,
        _ => 1,
    }
}

/// `pagefold shutdown`: the daemon stops every VM and exits.
pub fn shutdown(a: ShutdownArgs) -> Result<i32, Error> {
    let c = client(&a.client)?;
    c.shutdown().map_err(api_err)?;
    outln!("shutting down pagefold at {}", c.target())?;
    Ok(0)
}

/// What `pagefold vm info -o json` prints: the VM as `GET /vms/NAME` has
/// it, and its dedup figures (null without a backend or registration).
#[derive(Serialize)]
struct VmInfoJson<'a> {
    vm: &'a VmInfo,
    dedup: Option<&'a OwnerView>,
}

/// `pagefold vm info NAME`: one VM, as a list of fields.
fn vm_info_text(v: &VmInfo, owner: Option<&OwnerView>) -> String {
    let mut s = format!("name         {}\n", v.name);
    s += &format!("state        {}\n", state_name(v.state));
    s += &format!("vcpus        {}\n", v.vcpus);
    s += &format!("memory       {}\n", fmt_size(v.memory_bytes));
    s += &format!("uptime       {:.1} s\n", v.uptime_s);
    s += &format!(
        "dedup group  {}\n",
        v.dedup_group.as_deref().unwrap_or("- (dedup disabled)")
    );
    s += &format!("outcome      {}\n", outcome_text(v.outcome.as_ref()));
    let p = &v.guest_pauses;
    if p.count > 0 {
        s += &format!(
            "pauses       {} by the dedup engine: p99 {}, max {}, {} in all\n",
            p.count,
            fmt_secs(p.p99_s),
            fmt_secs(p.max_s),
            fmt_secs(p.total_s)
        );
    } else {
        s += "pauses       none by the dedup engine\n";
    }
    match owner {
        Some(o) => {
            s += &format!("tracked      {} pages\n", o.pages_tracked);
            s += &format!("merged       {} pages\n", o.pages_merged);
            s += &format!("zero         {} pages\n", o.zero_pages);
            s += &format!("saved        {}\n", fmt_size(o.bytes_saved));
            if let Some(n) = o.cow_breaks {
                s += &format!("cow breaks   {n} merges broken by writes\n");
            }
            if o.pages_reported > 0 {
                s += &format!("given back   {} pages", o.pages_reported);
                if let Some(r) = o.pages_returned {
                    s += &format!(" ({r} still unused)");
                }
                s += "\n";
            }
        }
        None => s += "dedup        - (not registered with a dedup backend)\n",
    }
    if let Some(b) = &v.balloon {
        s += &format!(
            "balloon      target {} MiB, actual {} MiB, {} pages given back ({} reported free)\n",
            b.target_mib, b.actual_mib, b.returned_pages, b.reported_pages
        );
        let stat = |k: &str| {
            b.guest_stats
                .get(k)
                .map_or("-".to_string(), |&v| fmt_size(v))
        };
        if !b.guest_stats.is_empty() {
            s += &format!(
                "guest memory total {}, free {}, available {}\n",
                stat("total_memory"),
                stat("free_memory"),
                stat("available_memory")
            );
        }
    }
    s
}

/// Reads VMs from a TOML config (`[[vm]]` tables or one VM's keys) or JSON.
fn vms_from_file(path: &Path) -> Result<Vec<VmConfig>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())))?;
    let bad = |m: String| Error::Usage(format!("{}: {m}", path.display()));
    if path.extension().is_some_and(|e| e == "json") {
        return Ok(vec![
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?
        ]);
    }
    match toml::from_str::<Config>(&text) {
        Ok(c) if !c.vms.is_empty() => Ok(c.vms),
        first => match toml::from_str::<VmConfig>(&text) {
            Ok(v) => Ok(vec![v]),
            Err(e) => Err(bad(match first {
                Err(e1) => e1.to_string(),
                Ok(_) => format!("no [[vm]] table, and not one VM either: {e}"),
            })),
        },
    }
}

/// `pagefold vm ...`.
pub fn vm(cmd: VmCommand) -> Result<i32, Error> {
    if let VmCommand::Pause { name, .. }
    | VmCommand::Resume { name, .. }
    | VmCommand::Balloon { name, .. }
    | VmCommand::Delete { name, .. }
    | VmCommand::Info { name, .. } = &cmd
    {
        // Such a name cannot exist, and as a URL path segment it might not
        // even reach the VM's resource (`..`).
        validate_vm_name(name).map_err(Error::Usage)?;
    }
    match cmd {
        VmCommand::List { output, client: ca } => {
            let c = client(&ca)?;
            let vms = c.vms().map_err(api_err)?;
            if output.json() {
                outln!("{}", pretty(&vms)?)?;
            } else {
                // The per-VM dedup figures come from the same source as
                // `status`'s: the backend's per-owner statistics.
                let dedup = c.dedup().map_err(api_err)?;
                out!("{}", vm_table(&vms, dedup.as_ref()))?;
            }
        }
        VmCommand::Info {
            name,
            output,
            client: ca,
        } => {
            let c = client(&ca)?;
            let info = c.vm(&name).map_err(api_err)?;
            let dedup = c.dedup().map_err(api_err)?;
            let owner = dedup.as_ref().and_then(|d| d.per_owner.get(&name));
            if output.json() {
                outln!(
                    "{}",
                    pretty(&VmInfoJson {
                        vm: &info,
                        dedup: owner
                    })?
                )?;
            } else {
                out!("{}", vm_info_text(&info, owner))?;
            }
        }
        VmCommand::Create {
            config,
            output,
            client: ca,
        } => {
            let c = client(&ca)?;
            let mut created = Vec::new();
            for vc in vms_from_file(&config)? {
                // A VM the server refused ends the command; the ones created
                // before it are reported first, so none is left unmentioned.
                match c.create_vm(&vc) {
                    Ok(info) => created.push(info),
                    Err(e) => {
                        print_created(&created, output)?;
                        return Err(api_err(e));
                    }
                }
            }
            print_created(&created, output)?;
        }
        VmCommand::Pause {
            name,
            output,
            client: ca,
        } => set_state(&ca, &name, VmTarget::Paused, output)?,
        VmCommand::Resume {
            name,
            output,
            client: ca,
        } => set_state(&ca, &name, VmTarget::Running, output)?,
        VmCommand::Balloon {
            name,
            target_mib,
            output,
            client: ca,
        } => {
            let c = client(&ca)?;
            let info = c.set_balloon(&name, target_mib).map_err(api_err)?;
            if output.json() {
                outln!("{}", pretty(&info)?)?;
            } else {
                let actual = info.balloon.as_ref().map_or(0, |b| b.actual_mib);
                outln!("{name}: balloon target {target_mib} MiB (now {actual} MiB)")?;
            }
        }
        VmCommand::Delete { name, client: ca } => {
            let c = client(&ca)?;
            c.delete_vm(&name).map_err(api_err)?;
            outln!("deleted {name}")?;
        }
    }
    Ok(0)
}

fn print_created(created: &[VmInfo], output: OutputArg) -> Result<(), Error> {
    if output.json() {
        return outln!("{}", pretty(&created)?);
    }
    for info in created {
        outln!("created {} ({})", info.name, state_name(info.state))?;
    }
    Ok(())
}

fn set_state(ca: &ClientArgs, name: &str, state: VmTarget, output: OutputArg) -> Result<(), Error> {
    let c = client(ca)?;
    let info = c.set_vm_state(name, state).map_err(api_err)?;
    if output.json() {
        return outln!("{}", pretty(&info)?);
    }
    outln!("{name}: {}", state_name(info.state))
}

/// `pagefold dedup set KEY=VALUE...`: parsed and checked locally first
/// (same rules as the server), then applied by the server.
pub fn dedup(cmd: DedupCommand) -> Result<i32, Error> {
    let DedupCommand::Set {
        settings,
        output,
        client: ca,
    } = cmd;
    let settings = patch::from_pairs(&settings).map_err(|e| Error::Usage(e.to_string()))?;
    let c = client(&ca)?;
    let d = c.patch_dedup(&settings).map_err(api_err)?;
    if output.json() {
        outln!("{}", pretty(&d)?)?;
    } else {
        out!("{}", dedup_summary(&d)?)?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_vmm::runner::VmReport;

    #[test]
    fn vm_files_parse_in_all_forms() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let many = d.join("many.toml");
        std::fs::write(
            &many,
            "[[vm]]\nname = \"a\"\nmemory = 64\n[[vm]]\nname = \"b\"\nmemory = \"32M\"\n",
        )
        .unwrap();
        let names: Vec<_> = vms_from_file(&many)
            .unwrap()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        let one = d.join("one.toml");
        std::fs::write(&one, "name = \"c\"\nmemory = 64\n").unwrap();
        assert_eq!(vms_from_file(&one).unwrap()[0].name, "c");
        let js = d.join("one.json");
        std::fs::write(&js, r#"{"name": "j", "memory": 64}"#).unwrap();
        assert_eq!(vms_from_file(&js).unwrap()[0].name, "j");
        let bad = d.join("bad.toml");
        std::fs::write(&bad, "nme = 1\n").unwrap();
        assert!(matches!(vms_from_file(&bad), Err(Error::Usage(_))));
    }

    #[test]
    fn serve_exit_code_accepts_requested_stops() {
        let rep = |o: Outcome| VmReport {
            name: "a".into(),
            outcome: o,
            exit_status: None,
            mismatches: 0,
            phases: vec![],
            wall_s: 0.0,
            guest_pauses: Default::default(),
            summary: Default::default(),
        };
        let mut r = RunReport {
            vms: vec![rep(Outcome::Stopped {
                reason: "api".into(),
            })],
            signal: None,
            dedup: None,
            dedup_peak: None,
            first_report_ms: None,
        };
        assert_eq!(serve_exit_code(&r), 0);
        r.vms.push(rep(Outcome::GuestExit { status: 2 }));
        assert_eq!(serve_exit_code(&r), 1);
        r.vms.push(rep(Outcome::VmmError {
            message: "x".into(),
        }));
        assert_eq!(serve_exit_code(&r), 3);
        // Stopped by a signal: a requested end too.
        let stopped = RunReport {
            vms: vec![rep(Outcome::Stopped {
                reason: "SIGTERM received".into(),
            })],
            signal: Some("SIGTERM"),
            ..r
        };
        assert_eq!(serve_exit_code(&stopped), 0);
        assert_eq!(stopped.exit_code(), 143, "run keeps the signal's status");
    }

    fn health(status: HealthStatus, responding: bool, age: Option<u64>) -> Health {
        Health {
            status,
            vms: 1,
            dedup_backend: Some("pagefold".into()),
            engine: Some(EngineHealth {
                backend: "pagefold".into(),
                responding,
                last_wakeup_age_ms: age,
                wakeup_overdue: status == HealthStatus::Stalled,
            }),
        }
    }

    fn dedup_view(owners: &[(&str, OwnerView)]) -> DedupView {
        let mut stats = pagefold_dedup::Stats::default();
        for (name, o) in owners {
            stats.per_owner.insert(
                name.to_string(),
                pagefold_dedup::OwnerStats {
                    group: o.group.clone(),
                    pages_tracked: o.pages_tracked,
                    pages_merged: o.pages_merged,
                    zero_pages: o.zero_pages,
                    bytes_saved: o.bytes_saved,
                    cow_breaks: o.cow_breaks,
                    pages_reported: o.pages_reported,
                    pages_returned: o.pages_returned,
                },
            );
        }
        DedupView::new(stats, pagefold_dedup::DEFAULT_KNOBS, None)
    }

    #[test]
    fn status_fails_when_the_daemon_is_unhealthy() {
        assert_eq!(
            health_exit_code(&health(HealthStatus::Ok, true, Some(20))),
            0
        );
        assert_eq!(
            health_exit_code(&health(HealthStatus::Stalled, true, Some(12500))),
            1
        );
    }

    #[test]
    fn a_stalled_engine_is_called_out() {
        let ok = health(HealthStatus::Ok, true, Some(20));
        assert_eq!(stall_line(&ok), "");
        let stalled = health(HealthStatus::Stalled, true, Some(12500));
        assert_eq!(
            stall_line(&stalled),
            "WARNING: the dedup engine is stalled: its scanner last woke up 12.5 s ago\n"
        );
        let silent = health(HealthStatus::Stalled, false, None);
        assert!(stall_line(&silent).contains("do not answer"));
        let mut d = dedup_view(&[]);
        d.last_wakeup_age_ms = 12500;
        d.wakeup_overdue = true;
        let text = dedup_summary(&d).unwrap();
        assert!(
            text.contains("scanner last woke up 12500 ms ago (overdue: stalled)"),
            "{text}"
        );
    }

    fn vm_info(name: &str, state: RunState, outcome: Option<Outcome>) -> VmInfo {
        VmInfo {
            name: name.into(),
            state,
            vcpus: 1,
            memory_bytes: 67108864,
            dedup_group: Some("g".into()),
            outcome,
            uptime_s: 2.5,
            guest_pauses: Default::default(),
            balloon: None,
            nics: Vec::new(),
        }
    }

    #[test]
    fn engine_pauses_show_as_p99_and_max() {
        let mut v = vm_info("vm0", RunState::Running, None);
        assert!(vm_table(&[v.clone()], None)
            .lines()
            .nth(1)
            .unwrap()
            .contains(" - "));
        assert!(vm_info_text(&v, None).contains("pauses       none by the dedup engine"));
        let log = pagefold_vmm::pause::PauseLog::default();
        for _ in 0..99 {
            log.record(std::time::Duration::from_micros(40));
        }
        log.record(std::time::Duration::from_micros(2500));
        v.guest_pauses = log.snapshot();
        let row = vm_table(&[v.clone()], None);
        assert!(row.contains("50µs/2.5ms"), "{row}");
        let text = vm_info_text(&v, None);
        assert!(
            text.contains(
                "pauses       100 by the dedup engine: p99 50µs, max 2.5ms, 6.5ms in all"
            ),
            "{text}"
        );
    }

    #[test]
    fn tables_show_per_vm_dedup_figures() {
        let vms = vec![vm_info("vm0", RunState::Paused, None)];
        let d = dedup_view(&[(
            "vm0",
            OwnerView {
                group: "g".into(),
                pages_tracked: 9,
                pages_merged: 4,
                zero_pages: 1,
                bytes_saved: 20480,
                cow_breaks: Some(7),
                pages_reported: 30,
                pages_returned: Some(12),
            },
        )]);
        let info = vm_info_text(&vms[0], d.per_owner.get("vm0"));
        assert!(
            info.contains("cow breaks   7 merges broken by writes\n"),
            "{info}"
        );
        assert!(
            info.contains("given back   30 pages (12 still unused)\n"),
            "{info}"
        );
        let t = vm_table(&vms, Some(&d));
        let row = t.lines().nth(1).unwrap();
        for cell in ["vm0", "paused", "64 MiB", "2.5s", "g", "9", "4", "20 KiB"] {
            assert!(row.contains(cell), "{cell} missing in {row}");
        }
        assert!(vm_table(&vms, None).lines().nth(1).unwrap().contains(" - "));
        // A finished VM shows its state and how it ended.
        let done = vec![
            vm_info(
                "vm1",
                RunState::Stopped,
                Some(Outcome::GuestExit { status: 3 }),
            ),
            vm_info(
                "vm2",
                RunState::Stopped,
                Some(Outcome::GuestError {
                    message: "triple fault".into(),
                }),
            ),
        ];
        let t = vm_table(&done, None);
        let rows: Vec<&str> = t.lines().collect();
        assert!(rows[0].ends_with("OUTCOME"), "{t}");
        assert!(
            rows[1].contains("stopped") && rows[1].ends_with("exit 3"),
            "{t}"
        );
        assert!(rows[2].ends_with("guest_error: triple fault"), "{t}");
        assert!(t.lines().nth(1).unwrap().contains("stopped"));
    }

    /// The table names outcomes as the API does (`kind`).
    #[test]
    fn outcome_cells_use_the_api_kinds() {
        for o in [
            Outcome::GuestReset,
            Outcome::GuestPowerOff,
            Outcome::Deleted,
            Outcome::Stopped { reason: "x".into() },
            Outcome::VmmError {
                message: "x".into(),
            },
        ] {
            let kind = serde_json::to_value(&o).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(outcome_text(Some(&o)).starts_with(&kind), "{o:?}");
        }
        assert_eq!(outcome_text(None), "-");
        for s in [
            RunState::Running,
            RunState::Paused,
            RunState::Stopping,
            RunState::Stopped,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), state_name(s));
        }
    }
}
