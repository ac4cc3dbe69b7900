//! Boots real workload VMs with the `pagefold` binary and checks what the
//! guests report.

mod common;

use std::time::Duration;

use common::*;
use pagefold_guest_abi::classes::class_counts;
use pagefold_guest_abi::{WorkloadParams, PARAMS_MAGIC};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn one_vm_fills_and_verifies() {
    require_kvm();
    let dir = TempDir::new("one");
    let json = dir.path("report.json");
    let o = run(
        &[
            "run",
            "--name",
            "solo",
            "--memory",
            "64M",
            "--shared",
            "24M",
            "--private",
            "8M",
            "--zero-permille",
            "100",
            "--dup-permille",
            "50",
            "--phases",
            "fill,rewrite,verify",
            "--json-file",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    let v = vm(&r, "solo");
    assert_eq!(v["outcome"]["kind"], "guest_exit", "{v}");
    assert_eq!(v["exit_status"], 0);
    assert_eq!(v["mismatches"], 0);
    let pages = (24 + 8) * 256;
    let fill = phases(v, "fill");
    assert_eq!(fill.len(), 1);
    assert_eq!(fill[0]["pages"], pages);
    // The guest's own class counts match the shared ABI's arithmetic.
    let p = WorkloadParams {
        magic: PARAMS_MAGIC,
        shared_pages: 24 * 256,
        private_pages: 8 * 256,
        zero_permille: 100,
        dup_permille: 50,
        ..Default::default()
    };
    let c = class_counts(&p);
    assert_eq!(fill[0]["zero_pages"], c.zero, "{v}");
    assert_eq!(fill[0]["dup_pages"], c.dup, "{v}");
    let verify = phases(v, "verify");
    assert_eq!(verify[0]["pages"], pages);
    assert_eq!(phases(v, "rewrite")[0]["pages"], pages);
    // Stdout carried the guest's reports as they happened.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("fill:"), "{out}");
    assert!(out.contains("guest finished (exit status 0)"), "{out}");
}

/// Every phase that touches pages (fill, churn, rewrite, verify) goes
/// through a scattered placement, set from the command line.
#[test]
fn one_scattered_vm_fills_churns_rewrites_and_verifies() {
    require_kvm();
    let dir = TempDir::new("scattered");
    let json = dir.path("report.json");
    let o = run(
        &[
            "run",
            "--name",
            "spread",
            "--memory",
            "64M",
            "--shared",
            "16M",
            "--private",
            "8M",
            "--zero-permille",
            "100",
            "--dup-permille",
            "50",
            "--churn-permille",
            "300",
            "--placement",
            "scattered",
            "--extent-pages",
            "4",
            "--phases",
            "fill,churn:300,verify,rewrite,verify",
            "--json-file",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    let v = vm(&r, "spread");
    assert_eq!(v["exit_status"], 0, "{v}");
    assert_eq!(v["mismatches"], 0, "{v}");
    let pages = (16 + 8) * 256;
    assert_eq!(phases(v, "fill")[0]["pages"], pages);
    assert_eq!(phases(v, "rewrite")[0]["pages"], pages);
    for ver in phases(v, "verify") {
        assert_eq!(ver["pages"], pages, "{v}");
        assert_eq!(ver["mismatches"], 0, "{v}");
    }
    assert!(
        phases(v, "churn")[0]["churn_writes_total"]
            .as_u64()
            .unwrap()
            > 0,
        "{v}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("scattered placement, extents of 4 pages"),
        "{out}"
    );
}

#[test]
fn two_vms_same_seed_in_one_process() {
    require_kvm();
    let dir = TempDir::new("two");
    let cfg = dir.path("two.toml");
    std::fs::write(
        &cfg,
        r#"
        [[vm]]
        name = "left"
        memory = "64M"
        [vm.workload]
        seed = 9
        shared = "16M"
        private = "8M"
        churn_permille = 500
        churn_ms = 200
        phases = ["fill", "churn", "verify"]
        [[vm]]
        name = "right"
        memory = "64M"
        [vm.workload]
        seed = 9
        shared = "16M"
        private = "8M"
        phases = ["fill", "verify"]
        "#,
    )
    .unwrap();
    let json = dir.path("r.json");
    let o = run_config(&cfg, &json, LIMIT);
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    for name in ["left", "right"] {
        let v = vm(&r, name);
        assert_eq!(v["exit_status"], 0, "{v}");
        assert_eq!(v["mismatches"], 0, "{v}");
        assert_eq!(phases(v, "fill")[0]["pages"], 24 * 256);
    }
    assert!(
        phases(vm(&r, "left"), "churn")[0]["churn_writes_total"]
            .as_u64()
            .unwrap()
            > 0
    );
    // Output of two VMs is told apart by a prefix.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("[left] fill:") && out.contains("[right] fill:"),
        "{out}"
    );
}

#[test]
fn sigterm_stops_every_vm_promptly() {
    require_kvm();
    let child = pagefold()
        .args([
            "run",
            "--memory",
            "32M",
            "--shared",
            "4M",
            "--private",
            "4M",
            "--phases",
            "fill,sleep:60000,verify",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let start = std::time::Instant::now();
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let o = wait_bounded(child, Duration::from_secs(20));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        start.elapsed()
    );
    assert_eq!(o.status.code(), Some(143), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("SIGTERM received"), "{out}");
    assert!(out.contains("stopped: SIGTERM received"), "{out}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = TempDir::new("bad");
    let check = |args: &[&str], want: &str| {
        let o = run(args, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(want),
            "{args:?}: stderr should mention {want:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    };
    check(&["run", "--memory", "0"], "larger than zero");
    check(
        &[
            "run",
            "--memory",
            "64M",
            "--log-file",
            "/nonexistent/dir/x.log",
        ],
        "--log-file /nonexistent/dir/x.log: No such file or directory",
    );
    check(&["run", "--log-format", "xml"], "invalid value 'xml'");
    check(&["run", "--memory", "lots"], "invalid size");
    check(&["run", "--memory", "100T"], "more than this host has");
    check(
        &["run", "--config", "/nonexistent/x.toml"],
        "reading config file",
    );
    check(
        &["run", "--kernel", "/nonexistent/vmlinux"],
        "file not found",
    );
    check(
        &["run", "--memory", "64M", "--phases", "fill,dance"],
        "unknown phase",
    );
    check(
        &["run", "--memory", "64M", "--dedup", "sometimes"],
        "unknown dedup mode",
    );
    check(
        &["run", "--memory", "64M", "--pages-to-scan", "0"],
        "valid range",
    );
    check(
        &["run", "--memory", "64M", "--placement", "random"],
        "--placement: unknown placement \"random\" (expected linear or scattered)",
    );
    check(
        &[
            "run",
            "--memory",
            "64M",
            "--placement",
            "scattered",
            "--extent-pages",
            "0",
        ],
        "workload.extent_pages = 0 (valid range 1..=65536)",
    );
    check(
        &["run", "--memory", "64M", "--extent-pages", "8"],
        "workload.extent_pages applies only to placement = \"scattered\"",
    );
    let cfg = dir.path("bad.toml");
    std::fs::write(&cfg, "[[vm]]\nname = \"a\"\nmemory = \"64M\"\nwheels = 4\n").unwrap();
    check(
        &["run", "--config", cfg.to_str().unwrap()],
        "unknown field `wheels`",
    );
    // Too big a workload for the VM is refused before it starts.
    require_kvm();
    let o = run(
        &["run", "--memory", "32M", "--shared", "64M"],
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("workload needs"),
        "{}",
        text(&o)
    );
}

/// Paths that exist but are no kernel or disk, sizes that are no sizes, and
/// names no VM may have: exit 2 with a message that says what is wrong
/// (not "not found", not "untagged enum", not a rounded size).
#[test]
fn misleading_input_gets_accurate_messages() {
    let dir = TempDir::new("accurate");
    let check = |args: &[&str], want: &str| {
        let o = run(args, Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(want),
            "{args:?}: stderr should mention {want:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        err.into_owned()
    };
    let garbage = dir.path("garbage.img");
    std::fs::write(&garbage, vec![0x42u8; 64 << 10]).unwrap();
    check(
        &[
            "run",
            "--memory",
            "64M",
            "--kernel",
            garbage.to_str().unwrap(),
        ],
        "is not an ELF vmlinux or bzImage kernel",
    );
    // ELF magic, then nothing a loader can use: still bad input (exit 2),
    // not a VM failure (exit 3).
    require_kvm();
    let bad_elf = dir.path("bad.elf");
    let mut bytes = b"\x7fELF".to_vec();
    bytes.resize(8192, 0);
    std::fs::write(&bad_elf, bytes).unwrap();
    check(
        &[
            "run",
            "--memory",
            "64M",
            "--kernel",
            bad_elf.to_str().unwrap(),
        ],
        "loading the kernel failed",
    );
    let err = check(
        &["run", "--memory", "64M", "--kernel", "/dev/null"],
        "/dev/null is not a regular file",
    );
    assert!(!err.contains("not found"), "{err}");
    let empty = dir.path("empty");
    std::fs::write(&empty, b"").unwrap();
    check(
        &[
            "run",
            "--memory",
            "64M",
            "--kernel",
            empty.to_str().unwrap(),
        ],
        "is empty",
    );
    let tmp = dir.0.to_str().unwrap();
    let err = check(
        &["run", "--memory", "64M", "--kernel", tmp],
        "is a directory",
    );
    assert!(!err.contains("not found"), "{err}");
    let err = check(
        &[
            "run",
            "--memory",
            "64M",
            "--phases",
            "fill,disk-read",
            "--disk",
            tmp,
        ],
        "is a directory",
    );
    assert!(!err.contains("not found"), "{err}");
    // Exact sizes in messages.
    check(&["run", "--memory", "15"], "at least 16 MiB, got 15 MiB");
    check(
        &["run", "--memory", "100000M"],
        "ask for 100000 MiB of memory in all, more than this host has",
    );
    // A size that is no size says what a size looks like.
    let cfg = dir.path("float.toml");
    std::fs::write(&cfg, "[[vm]]\nname = \"a\"\nmemory = 1.5\n").unwrap();
    let err = check(
        &["run", "--config", cfg.to_str().unwrap()],
        "integer number of MiB",
    );
    assert!(!err.contains("untagged"), "{err}");
    // Names outside the pattern, from flags and from config files.
    for bad in [".", "..", "-rf"] {
        let arg = format!("--name={bad}");
        check(&["run", "--memory", "64M", &arg], "invalid VM name");
        let cfg = dir.path("name.toml");
        std::fs::write(&cfg, format!("[[vm]]\nname = {bad:?}\nmemory = 64\n")).unwrap();
        check(
            &["run", "--config", cfg.to_str().unwrap()],
            "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}",
        );
    }
}

/// Memory that is a whole number of MiB but not of 2 MiB is rounded up to
/// the next 2 MiB, with a note, and the VM runs.
#[test]
fn odd_mib_memory_is_rounded_up_with_a_note() {
    require_kvm();
    let dir = TempDir::new("odd-mib");
    let json = dir.path("r.json");
    let o = run(
        &[
            "run",
            "--memory",
            "33",
            "--shared",
            "8M",
            "--private",
            "4M",
            "--json-file",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("memory 33 MiB rounded up to 34 MiB"), "{err}");
    assert_eq!(vm(&read_json(&json), "vm0")["exit_status"], 0);
}

/// A guest that crashes (triple fault) or pokes an unknown port gets a clear
/// per-VM error while the other VM finishes its work.
#[test]
fn a_crashing_guest_does_not_take_down_the_other_vm() {
    require_kvm();
    for (bad_phase, want) in [
        ("fault", "triple fault"),
        ("badport", "unexpected port write at 0x1234"),
    ] {
        let dir = TempDir::new("crash");
        let cfg = dir.path("c.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"
                [[vm]]
                name = "bad"
                memory = "32M"
                [vm.workload]
                shared = "4M"
                private = "4M"
                phases = ["fill", "{bad_phase}", "verify"]
                [[vm]]
                name = "good"
                memory = "32M"
                [vm.workload]
                shared = "4M"
                private = "4M"
                phases = ["fill", "sleep:300", "verify"]
                "#
            ),
        )
        .unwrap();
        let json = dir.path("r.json");
        let o = run_config(&cfg, &json, LIMIT);
        assert_eq!(o.status.code(), Some(3), "{}", text(&o));
        let r = read_json(&json);
        let bad = vm(&r, "bad");
        assert_eq!(bad["outcome"]["kind"], "guest_error", "{bad}");
        assert!(
            bad["outcome"]["message"].as_str().unwrap().contains(want),
            "{bad}"
        );
        assert!(phases(bad, "verify").is_empty(), "{bad}");
        let good = vm(&r, "good");
        assert_eq!(good["exit_status"], 0, "{good}");
        assert_eq!(phases(good, "verify")[0]["mismatches"], 0, "{good}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("[bad] guest error: {want}")),
            "{}",
            text(&o)
        );
    }
}

/// `vcpu_affinity` keeps a VM's vCPU threads on the host CPUs given (the
/// rest of the process is not restricted).
#[test]
fn vcpu_threads_run_on_the_cpus_given() {
    let allowed = pagefold_vmm::affinity::allowed_cpus().unwrap();
    let cpu = *allowed.last().unwrap();
    let mut r = common::dedup::start(&format!(
        "[[vm]]\nname = \"pinned\"\nmemory = \"32M\"\nserial = \"null\"\n\
         vcpu_affinity = [{cpu}]\n[vm.workload]\nshared = \"4M\"\nprivate = \"4M\"\n\
         phases = [\"fill\", \"wait\", \"verify\"]\n"
    ));
    common::dedup::wait_phases(&mut r, 1, LIMIT);
    let thread_cpus = |name: &str| -> Option<String> {
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let status = std::fs::read_to_string(t.path().join("status")).ok()?;
                return status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_string());
            }
        }
        None
    };
    assert_eq!(thread_cpus("pinned-vcpu0"), Some(cpu.to_string()));
    assert_eq!(
        pagefold_vmm::affinity::allowed_cpus().unwrap(),
        allowed,
        "the test thread's own CPUs changed"
    );
    common::dedup::finish_ok(r);
}

/// The pause probe: two 200 ms runs, the second rewriting a shared page
/// every millisecond. What the guest measured must be consistent with the
/// host's clock and with itself.
#[test]
fn the_latency_probe_reports_consistent_pauses() {
    require_kvm();
    let dir = TempDir::new("latency");
    let json = dir.path("report.json");
    let o = run(
        &[
            "run",
            "--name",
            "probe",
            "--memory",
            "64M",
            "--shared",
            "8M",
            "--private",
            "0M",
            "--phases",
            "fill,latency:200,latency-write:200,verify",
            "--json-file",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(o.status.success(), "{}", text(&o));
    let r = read_json(&json);
    let v = vm(&r, "probe");
    assert_eq!(v["exit_status"], 0, "{v}");
    // The rewrites kept every page's content: verify still matches.
    assert_eq!(v["mismatches"], 0, "{v}");
    for name in ["latency", "latency-write"] {
        let ph = phases(v, name);
        assert_eq!(ph.len(), 1, "{v}");
        let host_ms = ph[0]["ms"].as_f64().unwrap();
        let p = &ph[0]["pauses"];
        let f = |k: &str| {
            p[k].as_f64()
                .unwrap_or_else(|| panic!("{name}: no {k} in {p}"))
        };
        // The guest ran for its 200 ms of TSC time (plus at most the last
        // gap); the host saw at least that long and not absurdly longer.
        let run_ms = f("run_ms");
        assert!(
            (200.0..200.0 + f("max_us") / 1e3 + 1.0).contains(&run_ms),
            "{name}: {p}"
        );
        assert!(
            (run_ms - 1.0..10_000.0).contains(&host_ms),
            "{name}: host {host_ms} ms, {p}"
        );
        // A vCPU on a host with timer ticks is stopped now and then.
        let gaps = p["gaps"].as_u64().unwrap();
        assert!(gaps > 0, "{name}: {p}");
        let (p50, p99, p999, max) = (f("p50_us"), f("p99_us"), f("p999_us"), f("max_us"));
        assert!(
            1.0 <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max,
            "{name}: {p}"
        );
        // Stopped time is at most the run time, and at least the longest gap.
        let stopped_ms = f("stopped_ms_per_s") * run_ms / 1e3;
        assert!(stopped_ms <= run_ms, "{name}: {p}");
        assert!(stopped_ms * 1e3 >= max * 0.999, "{name}: {p}");
        assert!(
            stopped_ms * 1e3 >= gaps as f64,
            "{name}: each gap is over 1 us: {p}"
        );
    }
    // One shared page rewritten per millisecond of the write probe, but
    // for those due during its last gap (the run ends before them).
    let w = &phases(v, "latency-write")[0];
    let pages = w["pages"].as_u64().unwrap();
    let max_ms = (w["pauses"]["max_us"].as_f64().unwrap() / 1e3).ceil() as u64;
    let least = (200 - max_ms.min(200)).saturating_sub(2);
    assert!((least..=201).contains(&pages), "{pages} pages written: {w}");
    assert_eq!(phases(v, "latency")[0]["pages"], 0);
    // The end-of-run report shows each probe's pauses.
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<_> = out.lines().filter(|l| l.contains(" pauses ")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.contains("p99.9")), "{out}");
}

/// The write-timing probe through the CLI, one VM whose probe pages are
/// half zero, half unique: with dedup off the attack is at chance; with
/// pagefold's engine dropping the zero pages during the probe's own wait,
/// it tells them apart. The probe writes each page's own value: verify
/// still matches.
#[test]
fn the_merge_probe_reads_zero_page_drops_and_nothing_with_dedup_off() {
    require_kvm();
    let dir = TempDir::new("merge-probe");
    for (mode, wait) in [("off", "probe-merge"), ("on", "probe-merge:2000")] {
        let json = dir.path(&format!("{mode}.json"));
        let program = format!("fill,{wait},verify");
        let o = run(
            &[
                "run",
                "--name",
                "attacker",
                "--memory",
                "32M",
                "--shared",
                "0M",
                "--private",
                "8000K",
                "--zero-permille",
                "500",
                "--dedup",
                mode,
                "--phases",
                &program,
                "--json-file",
                json.to_str().unwrap(),
            ],
            LIMIT,
        );
        assert!(o.status.success(), "{mode}: {}", text(&o));
        let r = read_json(&json);
        let v = vm(&r, "attacker");
        assert_eq!(v["exit_status"], 0, "{v}");
        assert_eq!(v["mismatches"], 0, "{v}");
        let ph = phases(v, "probe-merge");
        assert_eq!(ph.len(), 1, "{v}");
        let p = &ph[0]["probe"];
        // 2000 pages, 1000 zero: all of them probed, half tested.
        assert_eq!(ph[0]["pages"], 2000, "{p}");
        assert_eq!(
            (p["pages"].as_u64(), p["shared_pages"].as_u64()),
            (Some(2000), Some(1000)),
            "{p}"
        );
        assert_eq!(p["tested"], 1000, "{p}");
        let acc = p["accuracy"].as_f64().unwrap();
        let read_acc = p["read_accuracy"].as_f64().unwrap();
        if mode == "off" {
            assert!(acc <= 0.65 && read_acc <= 0.65, "{mode}: {p}");
        } else {
            assert!(acc >= 0.9 && read_acc >= 0.9, "{mode}: {p}");
            let (z, u) = (
                p["shared_median_us"].as_f64().unwrap(),
                p["unique_median_us"].as_f64().unwrap(),
            );
            assert!(z > u, "{mode}: {p}");
        }
        // The end-of-run report shows it.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.lines()
                .any(|l| l.contains("probe-merge") && l.contains("accuracy")),
            "{out}"
        );
    }
}
