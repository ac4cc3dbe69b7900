//! Prometheus text exposition (format 0.0.4) of every VM figure and every
//! dedup statistic. The dedup part walks the statistics' JSON form rather
//! than naming fields, so a figure a backend adds later (auto mode's, say)
//! is exported without a change here; known figures get a specific help text
//! and counters their `_total` name.

use std::fmt::Write;

use pagefold_vmm::vm::VmInfo;
use serde_json::Value;

/// Help texts and kinds of known figures, by JSON path.
const KNOWN: &[(&str, &str, Kind)] = &[
    (
        "pages_shared",
        "Shared pages in use (mapped at least twice).",
        Kind::Gauge,
    ),
    (
        "pages_sharing",
        "Extra sites mapping a shared page: pages saved by sharing.",
        Kind::Gauge,
    ),
    (
        "pages_unshared",
        "Scanned pages, stable, with no identical partner.",
        Kind::Gauge,
    ),
    (
        "pages_volatile",
        "Scanned pages that changed since their last visit.",
        Kind::Gauge,
    ),
    ("zero_pages", "Pages dropped to the zero page.", Kind::Gauge),
    (
        "full_scans",
        "Completed passes over all registered memory.",
        Kind::Counter,
    ),
    ("merges", "Pages merged.", Kind::Counter),
    (
        "cow_breaks",
        "Merged pages given back a private copy on write.",
        Kind::Counter,
    ),
    (
        "pool_pages",
        "Pages of the shared pool in use.",
        Kind::Gauge,
    ),
    (
        "vmas_created",
        "Kernel VMAs created by pool mappings.",
        Kind::Gauge,
    ),
    (
        "map_count_headroom",
        "Mappings left before vm.max_map_count.",
        Kind::Gauge,
    ),
    (
        "map_count_limited",
        "1 if merging is held back by vm.max_map_count.",
        Kind::Gauge,
    ),
    (
        "cpu_seconds",
        "CPU time of the dedup threads.",
        Kind::Counter,
    ),
    (
        "bytes_saved",
        "Memory saved by sharing and zero pages, in bytes.",
        Kind::Gauge,
    ),
    (
        "metadata_bytes",
        "Memory used by the engine's own metadata, in bytes.",
        Kind::Gauge,
    ),
    (
        "profit_bytes",
        "Saved minus metadata and kernel VMA overhead, in bytes.",
        Kind::Gauge,
    ),
    (
        "last_wakeup_age_ms",
        "Milliseconds since the dedup scanner last woke up (0: unknown).",
        Kind::Gauge,
    ),
    (
        "wakeup_overdue",
        "1 while the engine judges a scanner wake-up overdue (stalled; GET /health answers 503).",
        Kind::Gauge,
    ),
    (
        "knobs.pages_to_scan",
        "Knob: pages scanned per wake-up.",
        Kind::Gauge,
    ),
    (
        "knobs.sleep_millisecs",
        "Knob: sleep between wake-ups, in milliseconds.",
        Kind::Gauge,
    ),
    (
        "knobs.max_page_sharing",
        "Knob: most sites that may map one shared page.",
        Kind::Gauge,
    ),
    (
        "auto.triggered_times",
        "Times auto mode started merging.",
        Kind::Counter,
    ),
    (
        "auto.rounds",
        "Wake-ups planned by auto mode.",
        Kind::Counter,
    ),
    (
        "auto.triggered_rounds",
        "Wake-ups auto mode allowed to merge.",
        Kind::Counter,
    ),
    (
        "auto.sample_errors",
        "Failed memory samples of auto mode.",
        Kind::Counter,
    ),
    (
        "auto.auto_triggered",
        "1 while auto mode is merging.",
        Kind::Gauge,
    ),
];

/// Per-VM dedup figures.
const OWNER: &[(&str, &str)] = &[
    (
        "pages_tracked",
        "Pages of the VM registered for deduplication.",
    ),
    ("pages_merged", "Pages of the VM mapped onto a shared page."),
    ("zero_pages", "Pages of the VM dropped to the zero page."),
    ("bytes_saved", "Memory saved in the VM, in bytes."),
];

const MODES: [&str; 4] = ["off", "on", "unmerge", "auto"];
const STATES: [&str; 4] = ["running", "paused", "stopping", "stopped"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

#[derive(Default)]
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, help: &str, kind: Kind) {
        let k = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(self.0, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.0, "# TYPE {name} {k}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(v));
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Keeps `[a-zA-Z0-9_]`, replacing anything else with `_`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn scalar(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// Exports the numbers and booleans under `v` (objects recursively).
fn walk(out: &mut Out, path: &str, v: &Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if path.is_empty()
                    && matches!(k.as_str(), "per_owner" | "mode" | "backend" | "limits")
                {
                    continue;
                }
                walk(out, &p, child);
            }
        }
        other => {
            let Some(x) = scalar(other) else { return };
            let known = KNOWN.iter().find(|(p, _, _)| *p == path);
            let kind = known.map_or(Kind::Gauge, |k| k.2);
            let base = format!("pagefold_dedup_{}", sanitize(&path.replace('.', "_")));
            let name = if kind == Kind::Counter {
                format!("{base}_total")
            } else {
                base
            };
            let help =
                known.map_or_else(|| format!("Dedup statistic {path}."), |k| k.1.to_string());
            out.family(&name, &help, kind);
            out.sample(&name, &[], x);
        }
    }
}

fn dedup(out: &mut Out, v: &Value) {
    let backend = v["backend"].as_str().unwrap_or("");
    let mode = v["mode"].as_str().unwrap_or("");
    out.family(
        "pagefold_dedup_enabled",
        "1 if a dedup backend runs in this process.",
        Kind::Gauge,
    );
    out.sample("pagefold_dedup_enabled", &[], 1.0);
    out.family(
        "pagefold_dedup_backend_info",
        "The dedup backend in use.",
        Kind::Gauge,
    );
    out.sample("pagefold_dedup_backend_info", &[("backend", backend)], 1.0);
    out.family(
        "pagefold_dedup_mode",
        "1 for the dedup mode in force, 0 for the others.",
        Kind::Gauge,
    );
    for m in MODES {
        out.sample(
            "pagefold_dedup_mode",
            &[("mode", m)],
            if m == mode { 1.0 } else { 0.0 },
        );
    }
    walk(out, "", v);
    let owners = v["per_owner"].as_object();
    for (field, help) in OWNER {
        let name = format!("pagefold_dedup_vm_{field}");
        out.family(&name, help, Kind::Gauge);
        for (vm, o) in owners.into_iter().flatten() {
            let group = o["group"].as_str().unwrap_or("");
            if let Some(x) = scalar(&o[*field]) {
                out.sample(&name, &[("vm", vm), ("group", group)], x);
            }
        }
    }
}

fn vms(out: &mut Out, vms: &[VmInfo]) {
    out.family("pagefold_vms", "VMs in this process.", Kind::Gauge);
    out.sample("pagefold_vms", &[], vms.len() as f64);
    out.family(
        "pagefold_vm_state",
        "1 for the VM's run state, 0 for the others.",
        Kind::Gauge,
    );
    for v in vms {
        let state = serde_json::to_value(v.state).ok();
        let state = state.as_ref().and_then(Value::as_str).unwrap_or("");
        for s in STATES {
            out.sample(
                "pagefold_vm_state",
                &[("vm", &v.name), ("state", s)],
                if s == state { 1.0 } else { 0.0 },
            );
        }
    }
    type Field = fn(&VmInfo) -> f64;
    let fields: [(&str, &str, Field); 3] = [
        ("pagefold_vm_vcpus", "vCPUs of the VM.", |v| v.vcpus as f64),
        (
            "pagefold_vm_memory_bytes",
            "Guest RAM of the VM, in bytes.",
            |v| v.memory_bytes as f64,
        ),
        (
            "pagefold_vm_uptime_seconds",
            "Time since the VM started.",
            |v| v.uptime_s,
        ),
    ];
    for (name, help, f) in fields {
        out.family(name, help, Kind::Gauge);
        for v in vms {
            out.sample(name, &[("vm", &v.name)], f(v));
        }
    }
}

/// The whole exposition, from the VM list and the `GET /dedup` view (see
/// [`crate::dedup::view`]), if the process has a backend.
pub fn render(dedup_view: Option<&Value>, vm_list: &[VmInfo]) -> String {
    let mut out = Out::default();
    vms(&mut out, vm_list);
    match dedup_view {
        Some(v) => dedup(&mut out, v),
        None => {
            out.family(
                "pagefold_dedup_enabled",
                "1 if a dedup backend runs in this process.",
                Kind::Gauge,
            );
            out.sample("pagefold_dedup_enabled", &[], 0.0);
        }
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_dedup::backend::OwnerStats;
    use pagefold_dedup::{Knobs, Mode, Stats};
    use pagefold_vmm::state::RunState;
    use std::collections::{BTreeMap, BTreeSet};

    fn stats() -> Stats {
        let mut per_owner = BTreeMap::new();
        per_owner.insert(
            "vm\"0".to_string(),
            OwnerStats {
                group: "g".into(),
                pages_tracked: 10,
                pages_merged: 4,
                zero_pages: 1,
                bytes_saved: 8192,
            },
        );
        Stats {
            backend: "pagefold".into(),
            mode: Mode::On,
            knobs: Some(Knobs {
                pages_to_scan: 100,
                sleep_millisecs: 20,
                max_page_sharing: 256,
            }),
            pages_sharing: 7,
            full_scans: 3,
            cpu_seconds: 1.5,
            map_count_limited: true,
            profit_bytes: -4096,
            last_wakeup_age_ms: 1234,
            wakeup_overdue: true,
            per_owner,
            ..Stats::default()
        }
    }

    fn vm(name: &str, state: RunState) -> VmInfo {
        VmInfo {
            name: name.into(),
            state,
            vcpus: 2,
            memory_bytes: 64 << 20,
            dedup_group: Some("g".into()),
            outcome: None,
            uptime_s: 1.25,
        }
    }

    /// Every sample line belongs to a family declared right before with
    /// HELP and TYPE, no family is declared twice, every field of `Stats`
    /// with a number shows up.
    #[test]
    fn exposition_is_well_formed_and_complete() {
        let view = serde_json::to_value(stats()).unwrap();
        let text = render(
            Some(&view),
            &[
                vm("a", RunState::Running),
                vm("b", RunState::Paused),
                vm("c", RunState::Stopped),
            ],
        );
        let mut declared = BTreeSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(
                    declared.insert(name.clone()),
                    "family {name} declared twice"
                );
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next().unwrap(), current);
                assert!(matches!(it.next().unwrap(), "gauge" | "counter"));
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "sample outside its family: {line}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok() || value == "NaN", "{line}");
                assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            }
        }
        let v = serde_json::to_value(stats()).unwrap();
        for (k, val) in v.as_object().unwrap() {
            if scalar(val).is_some() {
                let plain = format!("pagefold_dedup_{k} ");
                let counter = format!("pagefold_dedup_{k}_total ");
                assert!(
                    text.contains(&plain) || text.contains(&counter),
                    "stat {k} missing:\n{text}"
                );
            }
        }
        for needle in [
            "pagefold_dedup_full_scans_total 3\n",
            "pagefold_dedup_cpu_seconds_total 1.5\n",
            "pagefold_dedup_map_count_limited 1\n",
            "pagefold_dedup_profit_bytes -4096\n",
            "pagefold_dedup_knobs_pages_to_scan 100\n",
            "pagefold_dedup_mode{mode=\"on\"} 1\n",
            "pagefold_dedup_mode{mode=\"off\"} 0\n",
            "pagefold_dedup_vm_pages_merged{vm=\"vm\\\"0\",group=\"g\"} 4\n",
            "pagefold_vm_state{vm=\"b\",state=\"paused\"} 1\n",
            "pagefold_vm_state{vm=\"b\",state=\"running\"} 0\n",
            "pagefold_vm_memory_bytes{vm=\"a\"} 67108864\n",
            "pagefold_vm_uptime_seconds{vm=\"a\"} 1.25\n",
            "pagefold_vms 3\n",
            "pagefold_vm_state{vm=\"c\",state=\"stopped\"} 1\n",
            "pagefold_dedup_enabled 1\n",
            "# HELP pagefold_dedup_last_wakeup_age_ms Milliseconds since",
            "pagefold_dedup_last_wakeup_age_ms 1234\n",
            "# TYPE pagefold_dedup_wakeup_overdue gauge\npagefold_dedup_wakeup_overdue 1\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn unknown_nested_figures_are_exported() {
        let mut out = Out::default();
        walk(
            &mut out,
            "",
            &serde_json::json!({"auto": {"free_bytes": 5, "rounds": 2, "memory_signal": "free"}}),
        );
        assert!(
            out.0.contains(
                "# TYPE pagefold_dedup_auto_free_bytes gauge\npagefold_dedup_auto_free_bytes 5\n"
            ),
            "{}",
            out.0
        );
        assert!(
            out.0.contains("pagefold_dedup_auto_rounds_total 2\n"),
            "{}",
            out.0
        );
        assert!(!out.0.contains("memory_signal"));
    }

    #[test]
    fn without_backend_only_vm_figures_and_disabled_flag() {
        let text = render(None, &[]);
        assert!(text.contains("pagefold_dedup_enabled 0\n"));
        assert!(text.contains("pagefold_vms 0\n"));
        assert!(!text.contains("pagefold_dedup_pages_shared"));
    }

    #[test]
    fn numbers_format() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(-2.0), "-2");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
