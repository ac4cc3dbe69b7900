//! End to end: the real `pagefold` binary serving its API while real
//! workload VMs run, driven with curl over the Unix socket and with the
//! `pagefold status|vm|dedup` client commands.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pagemap_audit::{wait_agreement, Claimed};
use common::{pagefold, require_kvm, text, wait_bounded, Daemon, TempDir};
use serde_json::Value;

fn require_curl() {
    let ok = Command::new("curl")
        .arg("--version")
        .output()
        .map(|o| o.status.success());
    assert!(
        matches!(ok, Ok(true)),
        "this test drives the API with curl, which is not installed"
    );
}

/// `curl` over the socket to `path` under `/api/v1`; returns (status, body).
fn curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    curl_at(sock, method, &format!("/api/v1{path}"), body)
}

/// `curl` over the socket to the absolute `path`; returns (status, body).
fn curl_at(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-m", "60", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(sock)
        .args(["-X", method])
        .arg(format!("http://localhost{path}"));
    if body.is_some() {
        c.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run curl");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        // The server may answer (413) before reading it all.
        let _ = stdin.write_all(body.unwrap_or("").as_bytes());
    }
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8(o.stdout).unwrap();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (
        code.trim()
            .parse()
            .unwrap_or_else(|_| panic!("curl {method} {path}: {out:?}")),
        body.to_string(),
    )
}

fn curl_json(sock: &Path, method: &str, path: &str, body: Option<&str>, want: u16) -> Value {
    let (code, text) = curl(sock, method, path, body);
    assert_eq!(code, want, "{method} {path}: {text}");
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"))
}

/// Runs a client command of the binary.
fn cli(args: &[&str], sock: &Path) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--api-sock");
    all.push(sock.to_str().unwrap());
    common::run(&all, Duration::from_secs(60))
}

fn wait_for_api(child: &mut Child, sock: &Path) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("pagefold exited early: {st}");
        }
        if sock.exists() && curl(sock, "GET", "/health", None).0 == 200 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "API did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn config(dir: &TempDir, phases: &str, mode: &str) -> PathBuf {
    let p = dir.path("vms.toml");
    let vm = |name: &str| {
        format!(
            "[[vm]]\nname = \"{name}\"\nmemory = \"64M\"\nserial = \"null\"\ndedup = {{ group = \"g\" }}\n\
             [vm.workload]\nseed = 7\nshared = \"24M\"\nprivate = \"8M\"\nphases = [{phases}]\n"
        )
    };
    let text = format!("[dedup]\nmode = \"{mode}\"\n\n{}\n{}", vm("vm0"), vm("vm1"));
    std::fs::write(&p, text).unwrap();
    p
}

fn spawn(args: &[&str]) -> Daemon {
    Daemon::new(
        pagefold()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pagefold"),
    )
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn serve_mode_vm_lifecycle_over_curl_and_cli() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-serve");
    let sock = dir.path("api.sock");
    let cfg = config(&dir, "\"fill\", \"wait\"", "off");
    let mut child = spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let h = curl_json(&sock, "GET", "/health", None, 200);
    assert_eq!(h["vms"], 2);
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["vm0", "vm1"]
    );

    // `pagefold status`: a table with both VMs, and JSON.
    let o = cli(&["status"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for vm in ["vm0", "vm1"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(vm) && l.contains("running")),
            "{out}"
        );
    }
    let o = cli(&["status", "-o", "json"], &sock);
    let s: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let up0 = s["vms"][0]["uptime_s"].as_f64().unwrap();

    // Pause with the CLI, check with curl and in the metrics; resume with curl.
    let o = cli(&["vm", "pause", "vm1"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        curl_json(&sock, "GET", "/vms/vm1", None, 200)["state"],
        "paused"
    );
    let (code, metrics) = curl(&sock, "GET", "/metrics", None);
    assert_eq!(code, 200);
    assert!(
        metrics.contains("pagefold_vm_state{vm=\"vm1\",state=\"paused\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("pagefold_vms 2\n"), "{metrics}");
    // The conventional scrape path answers the same text format.
    let (code, root) = curl_at(&sock, "GET", "/metrics", None);
    assert_eq!(code, 200);
    assert!(
        root.contains("# TYPE pagefold_vm_state gauge\n")
            && root.contains("pagefold_vm_state{vm=\"vm1\",state=\"paused\"} 1"),
        "{root}"
    );
    let v = curl_json(
        &sock,
        "PATCH",
        "/vms/vm1",
        Some(r#"{"state":"running"}"#),
        200,
    );
    assert_eq!(v["state"], "running");

    // Figures move.
    std::thread::sleep(Duration::from_millis(300));
    let up1 = curl_json(&sock, "GET", "/vms/vm0", None, 200)["uptime_s"]
        .as_f64()
        .unwrap();
    assert!(up1 > up0, "uptime did not move: {up0} -> {up1}");

    // Create a third VM with curl (JSON body, name from the path) ...
    let body = r#"{"memory": "32M", "serial": "null", "workload": {"shared": "8M", "private": "4M", "phases": ["fill", "wait"]}}"#;
    let v = curl_json(&sock, "PUT", "/vms/vm2", Some(body), 201);
    assert_eq!(v["name"], "vm2");
    assert_eq!(v["memory_bytes"], 32 << 20);
    // ... and the error paths.
    let e = curl_json(&sock, "PUT", "/vms/vm2", Some(body), 409);
    assert!(
        e["error"].as_str().unwrap().contains("already exists"),
        "{e}"
    );
    let e = curl_json(&sock, "PUT", "/vms/vm3", Some(r#"{"memory": "3M"}"#), 400);
    assert!(e["error"].as_str().unwrap().contains("memory"), "{e}");
    curl_json(&sock, "GET", "/vms/nope", None, 404);
    curl_json(&sock, "POST", "/vms", None, 405);
    // No backend (the mode is off): nothing to show; a PATCH would start one.
    curl_json(&sock, "GET", "/dedup", None, 404);
    let big = format!("{{\"memory\": 64, \"x\": \"{}\"}}", "y".repeat(200_000));
    curl_json(&sock, "PUT", "/vms/big", Some(&big), 413);
    let o = cli(&["vm", "pause", "ghost"], &sock);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no VM named \"ghost\""),
        "{}",
        text(&o)
    );

    // Delete with the CLI; it is gone everywhere.
    let o = cli(&["vm", "delete", "vm1"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    curl_json(&sock, "GET", "/vms/vm1", None, 404);
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["vm0", "vm2"]
    );
    let (_, metrics) = curl(&sock, "GET", "/metrics", None);
    assert!(!metrics.contains("vm=\"vm1\""), "{metrics}");
    let o = cli(&["vm", "list"], &sock);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("vm2"),
        "{}",
        text(&o)
    );

    // Shutdown through the API ends the daemon cleanly and removes the socket.
    let v = curl_json(&sock, "PUT", "/shutdown", None, 202);
    assert_eq!(v["status"], "shutting down");
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
}

#[test]
fn run_mode_serves_while_vms_run_then_exits() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-run");
    let sock = dir.path("api.sock");
    let cfg = config(&dir, "\"fill\", \"sleep:3000\", \"verify\"", "off");
    let json = dir.path("report.json");
    let mut child = spawn(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
        "--json-file",
        json.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["vm0", "vm1"]
    );
    // A second pagefold may not take over a live socket.
    let o = common::run(
        &["serve", "--api-sock", sock.to_str().unwrap()],
        Duration::from_secs(20),
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("another process is serving"),
        "{}",
        text(&o)
    );
    let o = wait_bounded(child.into_child(), Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
    let r = common::read_json(&json);
    assert_eq!(r["vms"].as_array().unwrap().len(), 2);
}

/// Needs the dedup engine behind `vmm::dedup::create_backend`.
#[test]
fn dedup_figures_and_knobs_over_the_api() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-dedup");
    let sock = dir.path("api.sock");
    // After the fill the guests spin in guest code (the latency probe,
    // which writes no shared page), so that every park, the unmerge's
    // below included, has a running vCPU to stop: waiting in the VMM
    // (`wait`), they were parked only if some batch happened to park
    // during their fill, and the pause check failed one run in four.
    let cfg = config(&dir, "\"fill\", \"latency:600000\"", "on");
    let mut child = spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);
    let d = curl_json(&sock, "GET", "/dedup", None, 200);
    assert_eq!(d["mode"], "on");

    // A knob out of range: the CLI refuses with the field and range.
    let o = cli(&["dedup", "set", "pages_to_scan=0"], &sock);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("pages_to_scan: 0 (valid range 1..="),
        "{}",
        text(&o)
    );
    let e = curl_json(
        &sock,
        "PATCH",
        "/dedup",
        Some(r#"{"sleep_millisecs": 99999}"#),
        400,
    );
    assert_eq!(
        e["error"],
        "invalid value for sleep_millisecs: 99999 (valid range 0..=60000)"
    );
    // A valid change sticks.
    let o = cli(
        &["dedup", "set", "pages_to_scan=4096", "sleep_millisecs=5"],
        &sock,
    );
    assert!(o.status.success(), "{}", text(&o));
    let d = curl_json(&sock, "GET", "/dedup", None, 200);
    assert_eq!(d["knobs"]["pages_to_scan"], 4096);
    assert_eq!(d["knobs"]["sleep_millisecs"], 5);

    // The two identical guests get merged: figures move, per VM too.
    wait_merged_vm0_vm1(&sock);
    // Once the guests are done filling, the engine's figures are the page
    // tables'.
    let (c, a) = wait_agreement(
        "two workload VMs",
        child.id(),
        || engine_claims(&sock),
        Duration::from_secs(60),
    );
    assert!(c.pages_sharing > 1000 && a.ksm_sharing == 0, "{c:?} {a:?}");
    let (_, metrics) = curl(&sock, "GET", "/metrics", None);
    assert!(
        metrics.contains("pagefold_dedup_vm_pages_merged{vm=\"vm0\""),
        "{metrics}"
    );
    let o = cli(&["status"], &sock);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("dedup: backend pagefold, mode on"), "{out}");

    // An unmerge parks the guests around its spans on every host (a merge
    // batch parks only where the host's measured costs favour it, and the
    // first batches may come before a VM's quiescer is attached): each VM
    // then shows its pause windows, consistent with themselves, and
    // /metrics the histogram.
    let o = cli(&["dedup", "set", "mode=unmerge"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    wait_dedup(&sock, "unmerge did not finish", |d| {
        d["pages_sharing"].as_u64().unwrap() == 0
    });
    let (_, metrics) = curl(&sock, "GET", "/metrics", None);
    for vm in ["vm0", "vm1"] {
        let v = curl_json(&sock, "GET", &format!("/vms/{vm}"), None, 200);
        let p = &v["guest_pauses"];
        let f = |k: &str| p[k].as_f64().unwrap();
        let count = p["count"].as_u64().unwrap();
        assert!(count > 0, "{vm} never parked: {v}");
        let buckets: u64 = p["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert_eq!(buckets, count, "{v}");
        assert!(
            f("max_s") > 0.0 && f("p99_s") <= f("max_s") && f("max_s") <= f("total_s"),
            "{v}"
        );
        let line = format!("pagefold_guest_pause_seconds_count{{vm=\"{vm}\"}} ");
        assert!(metrics.contains(&line), "{metrics}");
    }

    // SIGTERM ends the daemon cleanly (exit status 0); the socket goes.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
}

/// A pipe whose reading end is already closed: every write to it fails
/// with EPIPE, as when `| head -0` went away before pagefold wrote.
#[test]
fn a_groups_security_is_kept_over_the_api() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-security");
    let sock = dir.path("api.sock");
    let cfg = config(&dir, "\"fill\", \"wait\"", "on");
    let mut child = spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);
    let vm = |group: &str, security: &str| {
        format!(
            r#"{{"memory": "32M", "serial": "null", "dedup": {{"group": "{group}", "security": "{security}"}},
                "workload": {{"shared": "8M", "private": "4M", "phases": ["fill", "wait"]}}}}"#
        )
    };
    // A hardened group of its own, and a second member.
    curl_json(&sock, "PUT", "/vms/h0", Some(&vm("h", "hardened")), 201);
    curl_json(&sock, "PUT", "/vms/h1", Some(&vm("h", "hardened")), 201);
    // A default VM may not join it, nor may a hardened one join the
    // config's default group g: clear errors, nothing created.
    for (name, group, security) in [("d0", "h", "default"), ("d1", "g", "hardened")] {
        let (code, body) = curl(
            &sock,
            "PUT",
            &format!("/vms/{name}"),
            Some(&vm(group, security)),
        );
        assert_eq!(code, 409, "{name}: {body}");
        assert!(body.contains("hardened") && body.contains(group), "{body}");
        curl_json(&sock, "GET", &format!("/vms/{name}"), None, 404);
    }
    // An unknown security is a bad request naming it.
    let (code, body) = curl(&sock, "PUT", "/vms/x", Some(&vm("h", "paranoid")));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("paranoid"), "{body}");
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["h0", "h1", "vm0", "vm1"]
    );
    curl_json(&sock, "PUT", "/shutdown", None, 202);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

fn closed_pipe() -> Stdio {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills in the two-element array we own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh from pipe2 and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    Stdio::from(w)
}

#[test]
fn client_output_to_a_closed_pipe_ends_quietly() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-epipe");
    let sock = dir.path("api.sock");
    let cfg = config(&dir, "\"fill\", \"wait\"", "on");
    let mut child = spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);
    let s = sock.to_str().unwrap();
    for args in [
        &["vm", "list", "--api-sock", s][..],
        &["vm", "list", "-o", "json", "--api-sock", s],
        &["status", "--api-sock", s],
        &["status", "--output=json", "--api-sock", s],
        &["dedup", "set", "pages_to_scan=200", "--api-sock", s],
    ] {
        let c = pagefold()
            .args(args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = wait_bounded(c, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    curl_json(&sock, "PUT", "/shutdown", None, 202);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// The row of VM `name` in a `vm list` / `status` table, split into cells.
fn row(table: &str, name: &str) -> Vec<String> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{table}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn finished_vms_stay_listed_and_input_errors_are_accurate() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-finished");
    let sock = dir.path("api.sock");
    let cfg = config(&dir, "\"fill\", \"wait\"", "on");
    let mut child = spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
    ]);
    wait_for_api(&mut child, &sock);

    // Health carries the engine's liveness; /dedup and the metrics its age.
    let h = curl_json(&sock, "GET", "/health", None, 200);
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["engine"]["backend"], "pagefold", "{h}");
    assert_eq!(h["engine"]["responding"], true, "{h}");
    assert_eq!(h["engine"]["wakeup_overdue"], false, "{h}");
    assert!(h["engine"]["last_wakeup_age_ms"].is_u64(), "{h}");
    let d = curl_json(&sock, "GET", "/dedup", None, 200);
    assert!(d["last_wakeup_age_ms"].is_u64(), "{d}");
    assert_eq!(d["wakeup_overdue"], false, "{d}");
    let (_, metrics) = curl(&sock, "GET", "/metrics", None);
    assert!(
        metrics.contains("\npagefold_dedup_last_wakeup_age_seconds "),
        "{metrics}"
    );
    assert!(
        metrics.contains("\npagefold_dedup_wakeup_overdue 0\n"),
        "{metrics}"
    );

    // `vm list` fills TRACKED/MERGED from the same figures as `status`.
    let o = cli(&["vm", "list"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let list = String::from_utf8_lossy(&o.stdout).into_owned();
    let cells = row(&list, "vm0");
    // VM STATE VCPUS MEMORY(2) UPTIME GROUP TRACKED MERGED ZERO SAVED(2) OUTCOME
    assert_eq!(cells[1], "running", "{list}");
    let tracked: u64 = cells[7]
        .parse()
        .unwrap_or_else(|_| panic!("TRACKED is not a number:\n{list}"));
    assert_eq!(tracked, 64 * 256, "{list}");
    cells[8]
        .parse::<u64>()
        .unwrap_or_else(|_| panic!("MERGED is not a number:\n{list}"));
    assert_eq!(cells.last().unwrap(), "-", "{list}");

    // A VM that finishes stays listed, with its outcome, until deleted.
    let body = r#"{"memory": "32M", "serial": "null", "dedup": {"enabled": false},
                   "workload": {"shared": "8M", "private": "4M", "phases": ["fill", "verify"]}}"#;
    curl_json(&sock, "PUT", "/vms/done", Some(body), 201);
    let start = Instant::now();
    let v = loop {
        let v = curl_json(&sock, "GET", "/vms/done", None, 200);
        if v["state"] == "stopped" {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["outcome"]["kind"], "guest_exit", "{v}");
    assert_eq!(v["outcome"]["status"], 0, "{v}");
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["done", "vm0", "vm1"]
    );
    let (_, metrics) = curl(&sock, "GET", "/metrics", None);
    assert!(
        metrics.contains("pagefold_vm_state{vm=\"done\",state=\"stopped\"} 1"),
        "{metrics}"
    );
    let o = cli(&["vm", "list"], &sock);
    let list = String::from_utf8_lossy(&o.stdout).into_owned();
    let cells = row(&list, "done");
    assert_eq!(cells[1], "stopped", "{list}");
    assert!(
        list.lines()
            .any(|l| l.starts_with("done") && l.ends_with("exit 0")),
        "{list}"
    );
    let e = curl_json(
        &sock,
        "PATCH",
        "/vms/done",
        Some(r#"{"state":"paused"}"#),
        409,
    );
    assert!(e["error"].as_str().unwrap().contains("finished"), "{e}");
    let e = curl_json(&sock, "PUT", "/vms/done", Some(body), 409);
    assert!(
        e["error"].as_str().unwrap().contains("delete it first"),
        "{e}"
    );
    let o = cli(&["vm", "delete", "done"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    curl_json(&sock, "GET", "/vms/done", None, 404);
    assert_eq!(
        names(&curl_json(&sock, "GET", "/vms", None, 200)),
        ["vm0", "vm1"]
    );

    // Input errors: duplicate keys, host memory (409 as documented), names.
    let e = curl_json(
        &sock,
        "PUT",
        "/vms/dup",
        Some(r#"{"memory": "32M", "memory": "64G"}"#),
        400,
    );
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("duplicate key \"memory\""),
        "{e}"
    );
    curl_json(&sock, "GET", "/vms/dup", None, 404);
    let e = curl_json(&sock, "PUT", "/vms/huge", Some(r#"{"memory": "1T"}"#), 409);
    let msg = e["error"].as_str().unwrap();
    assert!(
        msg.contains("more than this host has") && msg.contains("1 TiB"),
        "{e}"
    );
    let e = curl_json(&sock, "PUT", "/vms/-rf", Some(r#"{"memory": 32}"#), 400);
    assert!(
        e["error"].as_str().unwrap().contains("invalid VM name"),
        "{e}"
    );
    let e = curl_json(&sock, "PUT", "/vms/a", Some(r#"{"memory": 1.5}"#), 400);
    let msg = e["error"].as_str().unwrap();
    assert!(
        msg.contains("integer number of MiB") && !msg.contains("untagged"),
        "{e}"
    );
    let o = common::run(
        &[
            "vm",
            "delete",
            "--api-sock",
            sock.to_str().unwrap(),
            "--",
            "-rf",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid VM name \"-rf\""),
        "{}",
        text(&o)
    );

    curl_json(&sock, "PUT", "/shutdown", None, 202);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// 300 idle connections (past the server's cap of 256) do not stall the
/// next request for a header timeout: it is answered well under a second.
#[test]
fn idle_connections_do_not_stall_the_api() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-idle");
    let sock = dir.path("api.sock");
    let mut child = spawn(&["serve", "--api-sock", sock.to_str().unwrap()]);
    wait_for_api(&mut child, &sock);
    let idle: Vec<std::os::unix::net::UnixStream> = (0..300)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    let c = pagefold_api::Client::new(pagefold_api::client::Target::Unix(sock.clone())).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let r = c.call("GET", "/health", None).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "a request behind 300 idle connections took {:?}",
            t.elapsed()
        );
    }
    drop(idle);
    curl_json(&sock, "PUT", "/shutdown", None, 202);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// `pagefold run | head -1`: with nobody reading, the VMs still run to
/// their end, the JSON report is written, and the exit status is theirs.
#[test]
fn run_with_a_closed_stdout_still_runs_its_vms() {
    require_kvm();
    let dir = TempDir::new("run-epipe");
    let json = dir.path("r.json");
    let c = pagefold()
        .args([
            "run",
            "--memory",
            "32M",
            "--shared",
            "8M",
            "--private",
            "4M",
            "--json-file",
            json.to_str().unwrap(),
        ])
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
    let r = common::read_json(&json);
    assert_eq!(common::vm(&r, "vm0")["exit_status"], 0, "{r}");
}

/// Waits (up to 60 s) until the engine shares over 1000 pages and has
/// merged pages of both `vm0` and `vm1`.
fn wait_merged_vm0_vm1(sock: &Path) {
    wait_dedup(sock, "no merging seen", |d| {
        let merged = |vm: &str| d["per_owner"][vm]["pages_merged"].as_u64().unwrap_or(0);
        d["pages_sharing"].as_u64().unwrap() > 1000 && merged("vm0") > 0 && merged("vm1") > 0
    });
}

/// Polls `GET /dedup` every 200 ms until `done` holds of it; fails with
/// `what` and the last view after 60 s.
fn wait_dedup(sock: &Path, what: &str, done: impl Fn(&Value) -> bool) {
    let start = Instant::now();
    loop {
        let d = curl_json(sock, "GET", "/dedup", None, 200);
        if done(&d) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: {d}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pagefold engine's figures from `GET /dedup`, for the page-table
/// audit.
fn engine_claims(sock: &Path) -> Claimed {
    let d = curl_json(sock, "GET", "/dedup", None, 200);
    let n = |k: &str| d[k].as_u64().unwrap();
    Claimed {
        pages_sharing: n("pages_sharing"),
        pages_shared: Some(n("pages_shared")),
        pool_pages: Some(n("pool_pages")),
    }
}

/// A daemon started without `--dedup` turns it on through the API, without
/// a restart: the running VMs' memory is registered with the new backend
/// and merged, and a VM created afterwards is registered too.
#[test]
fn a_daemon_started_without_dedup_turns_it_on() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-late-dedup");
    let sock = dir.path("api.sock");
    let mut child = spawn(&["serve", "--api-sock", sock.to_str().unwrap()]);
    wait_for_api(&mut child, &sock);
    let body = r#"{"memory": "64M", "serial": "null", "dedup": {"group": "g"}, "workload": {"seed": 7, "shared": "24M", "private": "8M", "phases": ["fill", "wait"]}}"#;
    for vm in ["vm0", "vm1"] {
        curl_json(&sock, "PUT", &format!("/vms/{vm}"), Some(body), 201);
    }
    let e = curl_json(&sock, "GET", "/dedup", None, 404);
    assert!(
        e["error"].as_str().unwrap().contains("no dedup backend"),
        "{e}"
    );
    // Let both guests fill their memory before the backend exists.
    std::thread::sleep(Duration::from_secs(1));
    let d = curl_json(&sock, "PATCH", "/dedup", Some(r#"{"mode": "on"}"#), 200);
    assert_eq!(d["backend"], "pagefold");
    assert_eq!(d["mode"], "on");
    let h = curl_json(&sock, "GET", "/health", None, 200);
    assert_eq!(h["dedup_backend"], "pagefold", "{h}");
    // The two identical guests get merged.
    wait_merged_vm0_vm1(&sock);
    // A VM created now registers with the backend as it is created.
    curl_json(&sock, "PUT", "/vms/vm2", Some(body), 201);
    let d = curl_json(&sock, "GET", "/dedup", None, 200);
    assert!(
        d["per_owner"]["vm2"]["pages_tracked"].as_u64().unwrap() > 0,
        "{d}"
    );
    // The engine's figures are the page tables' (nothing claimed that is
    // not mapped so).
    let (c, _) = wait_agreement(
        "three workload VMs, dedup started late",
        child.id(),
        || engine_claims(&sock),
        Duration::from_secs(60),
    );
    assert!(c.pages_sharing > 1000, "{c:?}");
    curl_json(&sock, "PUT", "/shutdown", None, 202);
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// Runs a client command with the socket from `PAGEFOLD_API_SOCK`.
fn cli_env(args: &[&str], sock: &Path) -> std::process::Output {
    let child = pagefold()
        .args(args)
        .env("PAGEFOLD_API_SOCK", sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pagefold");
    wait_bounded(child, Duration::from_secs(60))
}

/// `serve` and the client commands find the socket in
/// `PAGEFOLD_API_SOCK`; `vm info` shows one VM; `dedup set -o json` prints
/// the new state as JSON; `shutdown` ends the daemon.
#[test]
fn vm_info_shutdown_and_the_socket_variable() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-env");
    let sock = dir.path("api.sock");
    let mut child = Daemon::new(
        pagefold()
            .arg("serve")
            .env("PAGEFOLD_API_SOCK", &sock)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pagefold serve"),
    );
    wait_for_api(&mut child, &sock);
    let body = r#"{"memory": "32M", "serial": "null", "workload": {"shared": "8M", "private": "4M", "phases": ["fill", "wait"]}}"#;
    curl_json(&sock, "PUT", "/vms/vm0", Some(body), 201);

    let o = cli_env(&["status"], &sock);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = cli_env(&["vm", "info", "vm0"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for line in [
        "name         vm0",
        "state        running",
        "memory       32 MiB",
    ] {
        assert!(out.contains(line), "{line:?} missing in {out}");
    }
    assert!(out.contains("not registered with a dedup backend"), "{out}");
    let o = cli_env(&["vm", "info", "ghost"], &sock);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let o = cli_env(&["dedup", "set", "mode=on", "-o", "json"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let d: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(d["mode"], "on");
    let o = cli_env(&["vm", "info", "vm0", "-o", "json"], &sock);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(v["vm"]["name"], "vm0");
    assert!(v["dedup"]["pages_tracked"].as_u64().unwrap() > 0, "{v}");

    // `-o json` on the commands that change VMs prints the VMs they left.
    let cfg = dir.path("vm1.toml");
    std::fs::write(
        &cfg,
        "name = \"vm1\"\nmemory = \"32M\"\nserial = \"null\"\n[workload]\nshared = \"8M\"\nprivate = \"4M\"\nphases = [\"fill\", \"wait\"]\n",
    )
    .unwrap();
    let o = cli_env(
        &["vm", "create", "-c", cfg.to_str().unwrap(), "-o", "json"],
        &sock,
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(v[0]["name"], "vm1", "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    for (cmd, state) in [("pause", "paused"), ("resume", "running")] {
        let o = cli_env(&["vm", cmd, "vm1", "-o", "json"], &sock);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        assert_eq!(v["state"], state, "{cmd}: {v}");
    }
    let o = cli_env(&["vm", "list", "-o", "text"], &sock);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("vm0") && out.contains("vm1"), "{out}");
    assert!(serde_json::from_slice::<Value>(&o.stdout).is_err(), "{out}");

    let o = cli_env(&["shutdown"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "socket left behind");
}

/// A free TCP port on loopback (bound and released: another process could
/// take it in between, which a test would report as a bind error).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// promtool, from PATH or Debian's `prometheus` package
/// (scripts/promtool.sh fetches it once into target/tools).
fn promtool() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new(root.join("scripts/promtool.sh"))
        .output()
        .expect("run scripts/promtool.sh");
    assert!(o.status.success(), "scripts/promtool.sh: {}", text(&o));
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

/// Runs promtool with `input` on stdin; its output, and whether it passed.
fn run_promtool(args: &[&str], dir: &Path, input: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), out)
}

/// As a new operator would: a daemon started without dedup flags, with a
/// metrics-only listener; dedup turned on and two VMs created with the
/// CLI; the metrics-only listener scraped and its exposition checked with
/// promtool, which must report nothing; no control route reachable
/// there; SIGTERM ends it with status 0 and no socket left. The example
/// rules file passes `promtool check rules` and its unit tests.
#[test]
fn a_live_daemon_passes_promtool_from_the_metrics_listener() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-promtool");
    let sock = dir.path("api.sock");
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let mut child = spawn(&[
        "serve",
        "--api-sock",
        sock.to_str().unwrap(),
        "--metrics-addr",
        &metrics_addr,
    ]);
    wait_for_api(&mut child, &sock);
    let o = cli(&["dedup", "set", "mode=on"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let vms = dir.path("vms.toml");
    let vm = |name: &str| {
        format!(
            "[[vm]]\nname = \"{name}\"\nmemory = \"64M\"\nserial = \"null\"\ndedup = {{ group = \"g\" }}\n\
             [vm.workload]\nseed = 7\nshared = \"24M\"\nprivate = \"8M\"\nphases = [\"fill\", \"wait\"]\n"
        )
    };
    std::fs::write(&vms, format!("{}\n{}", vm("vm0"), vm("vm1"))).unwrap();
    let o = cli(&["vm", "create", "--config", vms.to_str().unwrap()], &sock);
    assert!(o.status.success(), "{}", text(&o));
    wait_merged_vm0_vm1(&sock);

    let scrape = |path: &str| -> (u16, String) {
        let o = Command::new("curl")
            .args(["-s", "-m", "30", "-w", "\n%{http_code}"])
            .arg(format!("http://{metrics_addr}{path}"))
            .output()
            .expect("run curl");
        let out = String::from_utf8(o.stdout).unwrap();
        let (body, code) = out.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), body.to_string())
    };
    let (code, metrics) = scrape("/metrics");
    assert_eq!(code, 200, "{metrics}");
    let value = |needle: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no {needle} in:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("pagefold_dedup_pages_sharing ") > 1000.0, "{metrics}");
    assert!(value("pagefold_dedup_vm_pages_merged{vm=\"vm1\"") > 0.0);
    assert_eq!(value("pagefold_dedup_enabled "), 1.0);
    assert_eq!(value("pagefold_dedup_mode{mode=\"on\"} "), 1.0);
    assert_eq!(value("pagefold_vms "), 2.0);
    // Two guests filled 24 MiB of the same content and 8 MiB of their own
    // each: merged, at least one copy of the first and both of the second
    // stay resident (less the zero pages among them).
    assert!(value("process_resident_memory_bytes ") > (32 << 20) as f64);
    assert!(value("process_cpu_seconds_total ") > 0.0);
    assert!(
        metrics.contains("\npagefold_build_info{version=\""),
        "{metrics}"
    );
    let (ok, out) = run_promtool(&["check", "metrics"], &dir.0, &metrics);
    assert!(
        ok && out.trim().is_empty(),
        "promtool check metrics (passed: {ok}):\n{out}"
    );
    // Control stays out of reach of the metrics listener.
    for path in ["/api/v1/vms", "/api/v1/dedup", "/api/v1/health"] {
        assert_eq!(scrape(path).0, 404, "{path}");
    }

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/prometheus");
    let (ok, out) = run_promtool(&["check", "rules", "pagefold.rules.yml"], &rules, "");
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = run_promtool(&["test", "rules", "pagefold.rules.test.yml"], &rules, "");
    assert!(ok, "promtool test rules:\n{out}");

    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!sock.exists(), "the socket outlived the daemon");
}

/// A stand-in Linux kernel for a VM that must stay up: an ELF64 image
/// loaded at 1 MiB whose entry runs `cli; hlt` in a loop, so the VM runs
/// (its vCPU halted in KVM) however slowly the host runs kernel code.
/// The VM's devices are the real ones; no guest driver talks to them.
fn halting_kernel(dir: &TempDir) -> PathBuf {
    const LOAD: u64 = 0x10_0000;
    let code: [u8; 4] = [0xfa, 0xf4, 0xeb, 0xfc]; // cli; hlt; jmp hlt
    let (ehsize, phsize) = (64u16, 56u16);
    let off = u64::from(ehsize + phsize);
    let mut f = Vec::new();
    f.extend(b"\x7fELF\x02\x01\x01\x00");
    f.extend([0u8; 8]);
    f.extend(2u16.to_le_bytes()); // ET_EXEC
    f.extend(62u16.to_le_bytes()); // EM_X86_64
    f.extend(1u32.to_le_bytes());
    f.extend(LOAD.to_le_bytes()); // e_entry
    f.extend(u64::from(ehsize).to_le_bytes()); // e_phoff
    f.extend(0u64.to_le_bytes()); // e_shoff
    f.extend(0u32.to_le_bytes());
    f.extend(ehsize.to_le_bytes());
    f.extend(phsize.to_le_bytes());
    f.extend(1u16.to_le_bytes()); // e_phnum
    f.extend([0u8; 6]); // e_shentsize, e_shnum, e_shstrndx
    f.extend(1u32.to_le_bytes()); // PT_LOAD
    f.extend(5u32.to_le_bytes()); // R+X
    f.extend(off.to_le_bytes()); // p_offset
    f.extend(LOAD.to_le_bytes()); // p_vaddr
    f.extend(LOAD.to_le_bytes()); // p_paddr
    f.extend((code.len() as u64).to_le_bytes()); // p_filesz
    f.extend((code.len() as u64).to_le_bytes()); // p_memsz
    f.extend(0x1000u64.to_le_bytes()); // p_align
    f.extend(code);
    let p = dir.path("halt.elf");
    std::fs::write(&p, f).unwrap();
    p
}

/// The balloon over the API and the CLI: a Linux VM created with
/// `"balloon": {}` shows it in its view, takes a target within its memory
/// (and refuses one above it, or a malformed body), a VM without a balloon
/// answers 409, and the target is on `/metrics`.
#[test]
fn a_vms_balloon_target_over_the_api_and_the_cli() {
    require_kvm();
    require_curl();
    let dir = TempDir::new("api-balloon");
    let sock = dir.path("api.sock");
    let kernel = halting_kernel(&dir);
    let mut child = spawn(&["serve", "--api-sock", sock.to_str().unwrap()]);
    wait_for_api(&mut child, &sock);
    let body = format!(
        r#"{{"memory": "64M", "serial": "null", "kernel": {{"path": {:?}, "balloon": {{"stats_interval_s": 1}}}}}}"#,
        kernel.to_str().unwrap()
    );
    let v = curl_json(&sock, "PUT", "/vms/lin", Some(&body), 201);
    let b = &v["balloon"];
    assert_eq!(b["target_mib"], 0, "{v}");
    assert_eq!(b["free_page_reporting"], true, "{v}");
    assert_eq!(b["deflate_on_oom"], true, "{v}");
    assert_eq!(b["stats_interval_s"], 1, "{v}");

    let v = curl_json(
        &sock,
        "PUT",
        "/vms/lin/balloon",
        Some(r#"{"target_mib": 48}"#),
        200,
    );
    assert_eq!(v["balloon"]["target_mib"], 48, "{v}");
    assert_eq!(v["state"], "running", "{v}");
    let v = curl_json(&sock, "GET", "/vms/lin", None, 200);
    assert_eq!(v["balloon"]["target_mib"], 48, "{v}");

    // Bad input: above the VM's memory, not a number, an unknown field.
    for (body, want) in [
        (r#"{"target_mib": 65}"#, "64 MiB"),
        (r#"{"target_mib": "x"}"#, "expected u64"),
        (r#"{"target_mib": 1, "size": 2}"#, "size"),
        (r#"{}"#, "target_mib"),
    ] {
        let (code, answer) = curl(&sock, "PUT", "/vms/lin/balloon", Some(body));
        assert_eq!(code, 400, "{body}: {answer}");
        assert!(answer.contains(want), "{body}: {answer}");
    }
    let (code, answer) = curl(
        &sock,
        "PUT",
        "/vms/ghost/balloon",
        Some(r#"{"target_mib": 1}"#),
    );
    assert_eq!(code, 404, "{answer}");
    let wl = r#"{"memory": "32M", "serial": "null", "workload": {"shared": "8M", "private": "4M", "phases": ["fill", "wait"]}}"#;
    curl_json(&sock, "PUT", "/vms/wl", Some(wl), 201);
    let (code, answer) = curl(
        &sock,
        "PUT",
        "/vms/wl/balloon",
        Some(r#"{"target_mib": 1}"#),
    );
    assert_eq!(code, 409, "{answer}");
    assert!(answer.contains("no balloon"), "{answer}");
    let v = curl_json(&sock, "GET", "/vms/wl", None, 200);
    assert!(v.get("balloon").is_none(), "{v}");

    // The CLI: set, read back, refuse.
    let o = cli(&["vm", "balloon", "lin", "--target-mib", "16"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("balloon target 16 MiB"),
        "{}",
        text(&o)
    );
    let o = cli(&["vm", "info", "lin"], &sock);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("balloon      target 16 MiB, actual 0 MiB"),
        "{}",
        text(&o)
    );
    let o = cli(&["vm", "balloon", "lin", "--target-mib", "1000"], &sock);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let (code, m) = curl_at(&sock, "GET", "/metrics", None);
    assert_eq!(code, 200);
    assert!(
        m.contains(&format!(
            "pagefold_balloon_target_bytes{{vm=\"lin\"}} {}",
            16u64 << 20
        )),
        "{m}"
    );
    assert!(
        m.contains("pagefold_balloon_actual_bytes{vm=\"lin\"} 0"),
        "{m}"
    );

    let o = cli(&["shutdown"], &sock);
    assert!(o.status.success(), "{}", text(&o));
    let o = wait_bounded(child.into_child(), Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
