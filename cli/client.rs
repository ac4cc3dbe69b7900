//! The CLI's API side: serving the API from `run`, `demo` and `serve`, and
//! the client commands (`status`, `vm ...`, `dedup set`) that talk to a
//! running pagefold over its socket.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use pagefold_api::client::{Client, Reply, Target};
use pagefold_api::{patch, ListenConfig, Server};
use pagefold_vmm::config::{fmt_size, validate_vm_name, Config, VmConfig};
use pagefold_vmm::runner::{RunReport, Runner};
use pagefold_vmm::state::Outcome;
use serde_json::Value;

use crate::error::Error;
use crate::output::{out, outln};
use crate::report;

/// Where `run`, `demo` and `serve` serve the API.
#[derive(Args, Debug, Default, Clone)]
pub struct ApiServeArgs {
    /// Serve the HTTP API on this Unix socket (mode 0600) while the VMs run
    /// (`serve`: default $XDG_RUNTIME_DIR/pagefold/api.sock, or /run/pagefold/api.sock as root).
    #[arg(long, help_heading = "API")]
    pub api_sock: Option<PathBuf>,
    /// Also serve the API on this TCP address (loopback only unless --api-tcp-allow-remote).
    #[arg(long, help_heading = "API")]
    pub api_tcp: Option<SocketAddr>,
    /// Allow a non-loopback --api-tcp address (the API has no authentication).
    #[arg(long, help_heading = "API", requires = "api_tcp")]
    pub api_tcp_allow_remote: bool,
}

/// The socket a client command talks to.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// The API socket of the pagefold to talk to (default $XDG_RUNTIME_DIR/pagefold/api.sock, or /run/pagefold/api.sock as root).
    #[arg(long)]
    pub api_sock: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the raw JSON (health, VMs, dedup) instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// List the VMs.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create and start the VMs of a config file (TOML `[[vm]]` tables, or one JSON VM object).
    Create {
        #[arg(long, short = 'c')]
        config: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause a VM.
    Pause {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused VM.
    Resume {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop a VM and release its memory.
    Delete {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum DedupCommand {
    /// Change the dedup mode or knobs: mode=off|on|unmerge|auto, pages_to_scan=N, sleep_millisecs=N,
    /// max_page_sharing=N, auto_threshold=PCT, max_scanning_factor=N, memory_signal=free|available.
    Set {
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// VMs to start right away (TOML, as for `run`); more can be created through the API.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Dedup settings (override the config's).
    #[command(flatten)]
    pub settings: pagefold_dedup::DedupSettings,
    #[command(flatten)]
    pub api: ApiServeArgs,
    #[command(flatten)]
    pub seccomp: SeccompArgs,
}

/// Starts the API server for `runner`, if asked to (always for `serve`).
pub fn start_api(runner: &Runner, a: &ApiServeArgs, daemon: bool) -> Result<Option<Server>, Error> {
    let unix = match (&a.api_sock, daemon) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(pagefold_api::default_socket_path()),
        (None, false) => None,
    };
    if unix.is_none() && a.api_tcp.is_none() {
        return Ok(None);
    }
    let listen = ListenConfig {
        unix,
        tcp: a.api_tcp,
        allow_remote: a.api_tcp_allow_remote,
    };
    let server =
        Server::start(runner.handle(), &listen, Default::default()).map_err(|e| match e {
            pagefold_api::ServerError::Listen(l) => Error::Usage(l.to_string()),
            other => Error::Io(other.to_string()),
        })?;
    if let Some(p) = server.socket_path() {
        eprintln!("pagefold: API on {}", p.display());
    }
    if let Some(t) = server.tcp_addr() {
        eprintln!("pagefold: API on http://{t}/api/v1");
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
    let mut cfg = match &a.config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    a.seccomp.apply(&mut cfg);
    pagefold_vmm::seccomp::configure(cfg.seccomp_enabled())?;
    crate::cli::settings_over(&a.settings, &mut cfg.dedup)?;
    if !cfg.vms.is_empty() {
        cfg.validate(pagefold_vmm::memory::host_mem_total())?;
    }
    // Always a backend (unless the mode is off): VMs created through the
    // API later may want dedup.
    let always = cfg.dedup.mode() != pagefold_dedup::Mode::Off;
    let dedup =
        pagefold_vmm::dedup::create(&cfg, always).map_err(|e| Error::Dedup(e.to_string()))?;
    let mut runner = Runner::with_dedup(dedup, true)?;
    runner.keep_alive = true;
    let api = start_api(&runner, &a.api, true)?;
    runner.start_all(&cfg)?;
    // VMs created through the API later are created on this thread.
    pagefold_vmm::seccomp::install(pagefold_vmm::seccomp::ThreadKind::main(api.is_some()))?;
    let report = runner.run(|_| {})?;
    drop(api);
    drop(runner);
    report::print(&report)?;
    Ok(serve_exit_code(&report))
}

/// Like [`RunReport::exit_code`], except that VMs stopped on request (API
/// delete or shutdown) are a normal end for a daemon.
fn serve_exit_code(r: &RunReport) -> i32 {
    if r.signal.is_some() {
        return r.exit_code();
    }
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

/// Sends a request; non-2xx answers become errors (4xx: the user's input,
/// exit 2; else exit 3).
fn call(c: &Client, method: &str, path: &str, body: Option<&Value>) -> Result<Reply, Error> {
    let r = c
        .call(method, path, body)
        .map_err(|e| Error::Io(e.to_string()))?;
    call_result(method, path, r)
}

/// A reply as [`call`] takes it: non-2xx answers become errors.
fn call_result(method: &str, path: &str, r: Reply) -> Result<Reply, Error> {
    if r.is_success() {
        return Ok(r);
    }
    let msg = format!("{method} {path}: {} ({})", r.error_message(), r.status);
    if (400..500).contains(&r.status) {
        Err(Error::Usage(msg))
    } else {
        Err(Error::Io(msg))
    }
}

fn json(r: &Reply) -> Result<Value, Error> {
    r.json()
        .map_err(|e| Error::Io(format!("the API sent invalid JSON: {e}")))
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn vm_table(vms: &[Value], dedup: Option<&Value>) -> String {
    let mut out = format!(
        "{:<16} {:<9} {:>5} {:>10} {:>9} {:<12} {:>9} {:>9} {:>7} {:>10}  {}\n",
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
        "OUTCOME"
    );
    for v in vms {
        let name = v["name"].as_str().unwrap_or("?");
        let owner = dedup.and_then(|d| d["per_owner"].get(name));
        let fig = |k: &str| owner.map_or("-".to_string(), |o| u(o, k).to_string());
        out += &format!(
            "{:<16} {:<9} {:>5} {:>10} {:>8.1}s {:<12} {:>9} {:>9} {:>7} {:>10}  {}\n",
            name,
            v["state"].as_str().unwrap_or("?"),
            u(v, "vcpus"),
            fmt_size(u(v, "memory_bytes")),
            v["uptime_s"].as_f64().unwrap_or(0.0),
            v["dedup_group"].as_str().unwrap_or("-"),
            fig("pages_tracked"),
            fig("pages_merged"),
            fig("zero_pages"),
            owner.map_or("-".to_string(), |o| fmt_size(u(o, "bytes_saved"))),
            outcome_text(&v["outcome"]),
        );
    }
    out
}

/// A VM's outcome in a table cell: `-` while it runs, else how it ended
/// (`exit 0`, `stopped: SIGTERM received`, `guest_error: triple fault`).
fn outcome_text(o: &Value) -> String {
    let Some(kind) = o["kind"].as_str() else {
        return "-".into();
    };
    if let Some(status) = o["status"].as_u64() {
        return format!("exit {status}");
    }
    match o["reason"].as_str().or(o["message"].as_str()) {
        Some(why) => format!("{kind}: {why}"),
        None => kind.to_string(),
    }
}

fn dedup_summary(d: &Value) -> String {
    let k = &d["knobs"];
    let mut s = format!(
        "dedup: backend {}, mode {}; pages_to_scan {}, sleep_millisecs {}, max_page_sharing {}\n",
        d["backend"].as_str().unwrap_or("?"),
        d["mode"].as_str().unwrap_or("?"),
        u(k, "pages_to_scan"),
        u(k, "sleep_millisecs"),
        u(k, "max_page_sharing"),
    );
    s += &format!(
        "  pages_shared {}  pages_sharing {}  zero_pages {}  pages_unshared {}  pages_volatile {}\n",
        u(d, "pages_shared"),
        u(d, "pages_sharing"),
        u(d, "zero_pages"),
        u(d, "pages_unshared"),
        u(d, "pages_volatile")
    );
    s += &format!(
        "  full_scans {}  merges {}  cow_breaks {}  saved {}  metadata {}  profit {} B  engine CPU {:.2} s\n",
        u(d, "full_scans"),
        u(d, "merges"),
        u(d, "cow_breaks"),
        fmt_size(u(d, "bytes_saved")),
        fmt_size(u(d, "metadata_bytes")),
        d["profit_bytes"].as_i64().unwrap_or(0),
        d["cpu_seconds"].as_f64().unwrap_or(0.0),
    );
    if let Some(ms) = d["last_wakeup_age_ms"].as_u64().filter(|&ms| ms > 0) {
        s += &format!(
            "  scanner last woke up {ms} ms ago{}\n",
            if d["wakeup_overdue"] == true {
                " (overdue: stalled)"
            } else {
                ""
            }
        );
    }
    if let Some(auto) = d.get("auto").filter(|a| a.is_object()) {
        s += &format!("  auto: {auto}\n");
    }
    s
}

/// `GET /dedup`, or `None` when the process has no dedup backend (404).
fn get_dedup(c: &Client) -> Result<Option<Value>, Error> {
    match c
        .call("GET", "/dedup", None)
        .map_err(|e| Error::Io(e.to_string()))?
    {
        r if r.status == 404 => Ok(None),
        r if r.is_success() => Ok(Some(json(&r)?)),
        r => Err(Error::Io(format!(
            "GET /dedup: {} ({})",
            r.error_message(),
            r.status
        ))),
    }
}

/// `GET /health`. A 503 that carries a health body (the dedup engine is
/// stalled) is an answer to show, not a failure of the command.
fn get_health(c: &Client) -> Result<Value, Error> {
    let r = c
        .call("GET", "/health", None)
        .map_err(|e| Error::Io(e.to_string()))?;
    if r.status == 503 {
        if let Ok(h) = r.json() {
            if h["status"] == "stalled" {
                return Ok(h);
            }
        }
    }
    let r = call_result("GET", "/health", r)?;
    json(&r)
}

/// A warning line when the health check says the dedup engine is stalled.
fn stall_line(health: &Value) -> String {
    if health["status"] != "stalled" {
        return String::new();
    }
    let e = &health["engine"];
    match e["last_wakeup_age_ms"].as_u64() {
        _ if e["responding"] == false => {
            "WARNING: the dedup engine is stalled: its statistics do not answer\n".into()
        }
        Some(ms) => format!(
            "WARNING: the dedup engine is stalled: its scanner last woke up {:.1} s ago\n",
            ms as f64 / 1000.0
        ),
        None => "WARNING: the dedup engine is stalled\n".into(),
    }
}

/// `pagefold status`.
pub fn status(a: StatusArgs) -> Result<i32, Error> {
    let c = client(&a.client)?;
    let health = get_health(&c)?;
    let vms = json(&call(&c, "GET", "/vms", None)?)?;
    let dedup = get_dedup(&c)?;
    if a.json {
        let all = serde_json::json!({"health": health, "vms": vms, "dedup": dedup});
        outln!("{}", pretty(&all))?;
        return Ok(0);
    }
    let list = vms.as_array().cloned().unwrap_or_default();
    let mut text = format!("pagefold at {}: {} VM(s)\n", c.target(), list.len());
    text += &stall_line(&health);
    match &dedup {
        Some(d) => text += &dedup_summary(d),
        None => text += "dedup: off (no backend)\n",
    }
    text += &vm_table(&list, dedup.as_ref());
    out!("{text}")?;
    Ok(0)
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
    | VmCommand::Delete { name, .. } = &cmd
    {
        // Such a name cannot exist, and as a URL path segment it might not
        // even reach the VM's resource (`..`).
        validate_vm_name(name).map_err(Error::Usage)?;
    }
    match cmd {
        VmCommand::List {
            json: raw,
            client: ca,
        } => {
            let c = client(&ca)?;
            let vms = json(&call(&c, "GET", "/vms", None)?)?;
            if raw {
                outln!("{}", pretty(&vms))?;
            } else {
                // The per-VM dedup figures come from the same source as
                // `status`'s: the backend's per-owner statistics.
                let dedup = get_dedup(&c)?;
                out!(
                    "{}",
                    vm_table(
                        vms.as_array().map(Vec::as_slice).unwrap_or(&[]),
                        dedup.as_ref()
                    )
                )?;
            }
        }
        VmCommand::Create { config, client: ca } => {
            let c = client(&ca)?;
            for vc in vms_from_file(&config)? {
                let body = serde_json::to_value(&vc).map_err(|e| Error::Io(e.to_string()))?;
                let info = json(&call(&c, "PUT", &format!("/vms/{}", vc.name), Some(&body))?)?;
                outln!(
                    "created {} ({})",
                    vc.name,
                    info["state"].as_str().unwrap_or("?")
                )?;
            }
        }
        VmCommand::Pause { name, client: ca } => set_state(&ca, &name, "paused")?,
        VmCommand::Resume { name, client: ca } => set_state(&ca, &name, "running")?,
        VmCommand::Delete { name, client: ca } => {
            let c = client(&ca)?;
            call(&c, "DELETE", &format!("/vms/{name}"), None)?;
            outln!("deleted {name}")?;
        }
    }
    Ok(0)
}

fn set_state(ca: &ClientArgs, name: &str, state: &str) -> Result<(), Error> {
    let c = client(ca)?;
    let body = serde_json::json!({ "state": state });
    let info = json(&call(&c, "PATCH", &format!("/vms/{name}"), Some(&body))?)?;
    outln!("{name}: {}", info["state"].as_str().unwrap_or("?"))?;
    Ok(())
}

/// `pagefold dedup set KEY=VALUE...`: parsed and checked locally first
/// (same rules as the server), then applied by the server.
pub fn dedup(cmd: DedupCommand) -> Result<i32, Error> {
    let DedupCommand::Set {
        settings,
        client: ca,
    } = cmd;
    let settings = patch::from_pairs(&settings).map_err(|e| Error::Usage(e.to_string()))?;
    let c = client(&ca)?;
    let body = serde_json::to_value(*settings).map_err(|e| Error::Io(e.to_string()))?;
    let d = json(&call(&c, "PATCH", "/dedup", Some(&body))?)?;
    out!("{}", dedup_summary(&d))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_vmm::runner::VmReport;

    #[test]
    fn vm_files_parse_in_all_forms() {
        let d = std::env::temp_dir().join(format!("pf-cli-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
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
        let _ = std::fs::remove_dir_all(&d);
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
        r.signal = Some("SIGTERM");
        assert_eq!(serve_exit_code(&r), 143);
    }

    #[test]
    fn a_stalled_engine_is_called_out() {
        let ok = serde_json::json!({"status": "ok", "engine": {"responding": true,
            "last_wakeup_age_ms": 20, "wakeup_overdue": false}});
        assert_eq!(stall_line(&ok), "");
        let stalled = serde_json::json!({"status": "stalled", "engine": {"responding": true,
            "last_wakeup_age_ms": 12500, "wakeup_overdue": true}});
        assert_eq!(
            stall_line(&stalled),
            "WARNING: the dedup engine is stalled: its scanner last woke up 12.5 s ago\n"
        );
        let silent = serde_json::json!({"status": "stalled", "engine": {"responding": false,
            "last_wakeup_age_ms": null, "wakeup_overdue": true}});
        assert!(stall_line(&silent).contains("do not answer"));
        let d =
            serde_json::json!({"knobs": {}, "last_wakeup_age_ms": 12500, "wakeup_overdue": true});
        assert!(
            dedup_summary(&d).contains("scanner last woke up 12500 ms ago (overdue: stalled)"),
            "{}",
            dedup_summary(&d)
        );
    }

    #[test]
    fn tables_show_per_vm_dedup_figures() {
        let vms = vec![
            serde_json::json!({"name": "vm0", "state": "paused", "vcpus": 1,
            "memory_bytes": 67108864, "uptime_s": 2.5, "dedup_group": "g"}),
        ];
        let d = serde_json::json!({"per_owner": {"vm0": {"pages_tracked": 9, "pages_merged": 4,
            "zero_pages": 1, "bytes_saved": 20480}}});
        let t = vm_table(&vms, Some(&d));
        let row = t.lines().nth(1).unwrap();
        for cell in ["vm0", "paused", "64 MiB", "2.5s", "g", "9", "4", "20 KiB"] {
            assert!(row.contains(cell), "{cell} missing in {row}");
        }
        assert!(vm_table(&vms, None).lines().nth(1).unwrap().contains(" - "));
        // A finished VM shows its state and how it ended.
        let done = vec![
            serde_json::json!({"name": "vm1", "state": "stopped", "vcpus": 1,
            "memory_bytes": 67108864, "uptime_s": 2.5, "dedup_group": "g",
            "outcome": {"kind": "guest_exit", "status": 3}}),
            serde_json::json!({"name": "vm2", "state": "stopped", "vcpus": 1,
            "memory_bytes": 67108864, "uptime_s": 2.5, "dedup_group": "g",
            "outcome": {"kind": "guest_error", "message": "triple fault"}}),
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
}
