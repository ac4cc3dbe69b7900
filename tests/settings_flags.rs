//! The dedup settings as command-line flags: `run` and `serve` take the
//! auto-mode settings the config file has (`--auto-threshold`,
//! `--max-scanning-factor`, `--memory-signal`), refuse bad values with exit
//! status 2 and the config's own messages, and a daemon started with them
//! shows them over its API.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{api_client, pagefold, run, text, wait_bounded, TempDir};
use serde_json::{json, Value};

#[test]
fn bad_setting_flags_exit_2_with_the_configs_messages() {
    for cmd in ["run", "serve"] {
        for (flag, value, want) in [
            (
                "--auto-threshold",
                "101",
                "auto_threshold must be a percentage in 0..=100, got 101",
            ),
            ("--auto-threshold", "1.5", "invalid value '1.5'"),
            ("--max-scanning-factor", "many", "invalid value 'many'"),
            (
                "--memory-signal",
                "cached",
                "--memory-signal: unknown memory signal \"cached\" (expected free or available)",
            ),
            (
                "--dedup",
                "sometimes",
                "--dedup: unknown dedup mode \"sometimes\"",
            ),
            ("--pages-to-scan", "0", "pages_to_scan: 0 (valid range 1..="),
        ] {
            let o = run(&[cmd, flag, value], Duration::from_secs(30));
            assert_eq!(
                o.status.code(),
                Some(2),
                "{cmd} {flag} {value}: {}",
                text(&o)
            );
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(want), "{cmd} {flag} {value}: {err}");
        }
    }
}

#[test]
fn serve_takes_the_auto_flags() {
    let dir = TempDir::new("settings-flags");
    let sock = dir.path("api.sock");
    let child = pagefold()
        .args([
            "serve",
            "--dedup",
            "auto",
            "--auto-threshold",
            "30",
            "--max-scanning-factor",
            "4",
            "--memory-signal",
            "free",
            "--pages-to-scan",
            "500",
            "--api-sock",
        ])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pagefold serve");
    let client = api_client(&sock);
    let d: Value = client.call("GET", "/dedup", None).unwrap().json().unwrap();
    let r = client.call("PUT", "/shutdown", None).unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let o = wait_bounded(child, Duration::from_secs(20));
    assert_eq!(d["mode"], "auto", "{d}");
    assert_eq!(d["knobs"]["pages_to_scan"], 500, "{d}");
    assert_eq!(
        d["auto_config"],
        json!({"auto_threshold": 30, "max_scanning_factor": 4, "memory_signal": "free"}),
        "{d}"
    );
    assert_eq!(d["auto"]["memory_signal"], "free", "{d}");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
