//! Load test of the API: runs `pagefold run` with workload VMs twice, once
//! alone and once with N concurrent keep-alive clients polling
//! `GET /api/v1/dedup` and `GET /api/v1/metrics` as fast as they can for up
//! to S seconds; prints the clients' latency percentiles and the VMs' phase
//! times with and without the load.
//!
//! ```sh
//! cargo build --release --bin pagefold
//! cargo run --release -p pagefold-api --example api_load -- target/release/pagefold [CLIENTS] [SECONDS]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pagefold_api::client::{Connection, Target};

const CONFIG: &str = r#"
[dedup]
mode = "on"

[[vm]]
name = "vm0"
memory = "128M"
serial = "null"
dedup = { group = "g" }
[vm.workload]
seed = 5
shared = "80M"
private = "24M"
churn_permille = 250
churn_ms = 25000
phases = ["fill", "verify", "rewrite", "verify", "churn", "verify", "rewrite", "verify", "fill", "verify"]

[[vm]]
name = "vm1"
memory = "128M"
serial = "null"
dedup = { group = "g" }
[vm.workload]
seed = 5
shared = "80M"
private = "24M"
churn_permille = 250
churn_ms = 25000
phases = ["fill", "verify", "rewrite", "verify", "churn", "verify", "rewrite", "verify", "fill", "verify"]
"#;

struct Run {
    child: Child,
    sock: PathBuf,
    json: PathBuf,
}

fn start(bin: &Path, dir: &Path, tag: &str) -> Run {
    let cfg = dir.join(format!("{tag}.toml"));
    std::fs::write(&cfg, CONFIG).unwrap();
    let sock = dir.join(format!("{tag}.sock"));
    let json = dir.join(format!("{tag}.json"));
    let mut child = Command::new(bin)
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--api-sock")
        .arg(&sock)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn pagefold");
    let t = Instant::now();
    while !sock.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("pagefold run exited early: {st}");
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "API socket did not appear"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Run { child, sock, json }
}

/// Churn writes per second, summed over the VMs.
fn churn_rate(json: &Path) -> f64 {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let mut rate = 0.0;
    for vm in v["vms"].as_array().unwrap() {
        for p in vm["phases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["phase"] == "churn")
        {
            rate += p["churn_writes_total"].as_f64().unwrap() / (p["ms"].as_f64().unwrap() / 1e3);
        }
    }
    rate
}

/// Mean host-measured ms per phase name, over both VMs and all iterations.
fn phase_means(json: &Path) -> BTreeMap<String, (f64, usize)> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let mut m: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for vm in v["vms"].as_array().unwrap() {
        for p in vm["phases"].as_array().unwrap() {
            let e = m
                .entry(p["phase"].as_str().unwrap().to_string())
                .or_default();
            e.0 += p["ms"].as_f64().unwrap();
            e.1 += 1;
        }
    }
    m.into_iter()
        .map(|(k, (sum, n))| (k, (sum / n as f64, n)))
        .collect()
}

async fn client(target: Target, deadline: Instant) -> (Vec<u32>, u64) {
    let mut lat = Vec::new();
    let mut errors = 0;
    let mut conn = match Connection::open(&target).await {
        Ok(c) => c,
        Err(_) => return (lat, 1),
    };
    let mut i = 0u64;
    while Instant::now() < deadline {
        let path = if i & 1 == 0 {
            "/api/v1/dedup"
        } else {
            "/api/v1/metrics"
        };
        i += 1;
        let t = Instant::now();
        match conn.request("GET", path, None).await {
            Ok(r) if r.status == 200 => lat.push(t.elapsed().as_micros() as u32),
            // The run ended: the server went away.
            Ok(_) | Err(_) => {
                errors += 1;
                match Connection::open(&target).await {
                    Ok(c) => conn = c,
                    Err(_) => break,
                }
            }
        }
    }
    (lat, errors)
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = PathBuf::from(
        args.get(1)
            .expect("usage: api_load PAGEFOLD_BIN [CLIENTS] [SECONDS]"),
    );
    let clients: usize = args.get(2).map_or(100, |s| s.parse().unwrap());
    let seconds: u64 = args.get(3).map_or(30, |s| s.parse().unwrap());
    let tmp = tempfile::Builder::new()
        .prefix("pagefold-api-load-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();

    // Baseline: the same VMs, no API clients.
    let mut base = start(&bin, &dir, "base");
    let t = Instant::now();
    assert!(base.child.wait().unwrap().success(), "baseline run failed");
    let base_wall = t.elapsed();

    let mut loaded = start(&bin, &dir, "load");
    let t = Instant::now();
    let deadline = t + Duration::from_secs(seconds);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let target = Target::Unix(loaded.sock.clone());
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..clients {
            set.spawn(client(target.clone(), deadline));
        }
        let mut all = Vec::new();
        while let Some(r) = set.join_next().await {
            all.push(r.unwrap());
        }
        all
    });
    let load_secs = t.elapsed().as_secs_f64();
    assert!(loaded.child.wait().unwrap().success(), "loaded run failed");
    let load_wall = t.elapsed();

    let mut lat: Vec<u32> = results
        .iter()
        .flat_map(|(l, _)| l.iter().copied())
        .collect();
    let errors: u64 = results.iter().map(|(_, e)| e).sum();
    lat.sort_unstable();
    println!(
        "{clients} clients for {load_secs:.1} s: {} requests ({:.0}/s), {errors} errors/reconnects",
        lat.len(),
        lat.len() as f64 / load_secs
    );
    println!(
        "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        pct(&lat, 0.5),
        pct(&lat, 0.9),
        pct(&lat, 0.99),
        pct(&lat, 1.0)
    );
    println!(
        "run wall time: {:.2} s alone, {:.2} s under load",
        base_wall.as_secs_f64(),
        load_wall.as_secs_f64()
    );
    let (b, l) = (phase_means(&base.json), phase_means(&loaded.json));
    println!(
        "{:<10} {:>12} {:>12} {:>8}",
        "phase", "alone ms", "loaded ms", "ratio"
    );
    for (name, (bm, n)) in &b {
        if let Some((lm, _)) = l.get(name) {
            println!("{name:<10} {bm:>12.2} {lm:>12.2} {:>8.2}  (n={n})", lm / bm);
        }
    }
    println!(
        "churn writes/s (both VMs): {:.0} alone, {:.0} loaded",
        churn_rate(&base.json),
        churn_rate(&loaded.json)
    );
    let _ = (&mut base, &mut loaded);
}
