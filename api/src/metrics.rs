//! Prometheus metrics of every VM figure and every dedup statistic, built
//! with prometheus-client from the typed answers ([`VmInfo`], the
//! [`DedupView`] that `GET /dedup` serves), one scrape at a time.
//!
//! Two encodings: OpenMetrics 1.0 (what prometheus-client writes, and what
//! Prometheus asks for first), and the classic text format 0.0.4 for
//! everyone else (curl, older scrapers). They differ in the counters'
//! `# HELP`/`# TYPE` lines only: OpenMetrics names the family without its
//! `_total` suffix, the text format names the sample (see [`classic`]);
//! the samples are the same.

use std::fmt::{self, Write};

use pagefold_vmm::vm::VmInfo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::dedup_view::{AutoView, DedupView};

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
        "huge_pages_split",
        "Transparent huge pages split before a merge replaced part of one.",
        Kind::Counter,
    ),
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

/// A figure's value, in the type it has in the view.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num::U(v)
    }
}

impl From<i64> for Num {
    fn from(v: i64) -> Num {
        Num::I(v)
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Num {
        Num::F(v)
    }
}

impl From<bool> for Num {
    fn from(v: bool) -> Num {
        Num::U(v.into())
    }
}

/// Every number (and flag, as 0/1) of the view, by its JSON path: what the
/// metrics export beyond the mode, the backend and the per-VM figures.
fn figures(v: &DedupView) -> Vec<(String, Num)> {
    let mut f: Vec<(String, Num)> = Vec::new();
    let mut add = |path: &str, n: Num| f.push((path.to_string(), n));
    add("pages_shared", v.pages_shared.into());
    add("pages_sharing", v.pages_sharing.into());
    add("pages_unshared", v.pages_unshared.into());
    add("pages_volatile", v.pages_volatile.into());
    add("zero_pages", v.zero_pages.into());
    add("full_scans", v.full_scans.into());
    add("merges", v.merges.into());
    add("cow_breaks", v.cow_breaks.into());
    add("pool_pages", v.pool_pages.into());
    add("vmas_created", v.vmas_created.into());
    add("map_count_headroom", v.map_count_headroom.into());
    add("map_count_limited", v.map_count_limited.into());
    add("cpu_seconds", v.cpu_seconds.into());
    add("bytes_saved", v.bytes_saved.into());
    add("metadata_bytes", v.metadata_bytes.into());
    add("profit_bytes", v.profit_bytes.into());
    add("last_wakeup_age_ms", v.last_wakeup_age_ms.into());
    add("wakeup_overdue", v.wakeup_overdue.into());
    add("ksm_pages_sharing", v.ksm_pages_sharing.into());
    add("ksm_cpu_seconds", v.ksm_cpu_seconds.into());
    add("hints", v.hints.into());
    add("hints_dropped", v.hints_dropped.into());
    add("hint_merges", v.hint_merges.into());
    add("hint_merge_delay_ms", v.hint_merge_delay_ms.into());
    add("write_logged_regions", v.write_logged_regions.into());
    add("clean_visits", v.clean_visits.into());
    add("huge_pages_split", v.huge_pages_split.into());
    add("knobs.pages_to_scan", v.knobs.pages_to_scan.into());
    add("knobs.sleep_millisecs", v.knobs.sleep_millisecs.into());
    add("knobs.max_page_sharing", v.knobs.max_page_sharing.into());
    if let Some(a) = &v.auto {
        auto_figures(a, &mut add);
    }
    if let Some(c) = &v.auto_config {
        add("auto_config.auto_threshold", c.auto_threshold.into());
        add(
            "auto_config.max_scanning_factor",
            c.max_scanning_factor.into(),
        );
    }
    f
}

fn auto_figures(a: &AutoView, add: &mut impl FnMut(&str, Num)) {
    add("auto.auto_triggered", a.auto_triggered.into());
    add("auto.scanning_factor", a.scanning_factor.into());
    add("auto.triggered_times", a.triggered_times.into());
    add("auto.threshold_pct", a.threshold_pct.into());
    add("auto.max_scanning_factor", a.max_scanning_factor.into());
    add(
        "auto.effective_max_scanning_factor",
        a.effective_max_scanning_factor.into(),
    );
    add("auto.trigger_bytes", a.trigger_bytes.into());
    add("auto.stop_bytes", a.stop_bytes.into());
    add("auto.total_bytes", a.total_bytes.into());
    add("auto.free_bytes", a.free_bytes.into());
    add("auto.available_bytes", a.available_bytes.into());
    if let Some(p) = &a.psi {
        add("auto.psi.some_avg10", p.some_avg10.into());
        add("auto.psi.some_avg60", p.some_avg60.into());
        add("auto.psi.full_avg10", p.full_avg10.into());
        add("auto.psi.full_avg60", p.full_avg60.into());
    }
    add("auto.psi_pressure", a.psi_pressure.into());
    add("auto.rounds", a.rounds.into());
    add("auto.triggered_rounds", a.triggered_rounds.into());
    add("auto.pages_to_scan", a.pages_to_scan.into());
    add("auto.last_plan_pages", a.last_plan_pages.into());
    add("auto.last_plan_merge", a.last_plan_merge.into());
    add("auto.sample_errors", a.sample_errors.into());
}

/// A metric family's name (counters without `_total`: the encoder adds
/// it), help text and kind, for the figure at `path`.
fn family(path: &str) -> (String, String, Kind) {
    let known = KNOWN.iter().find(|(p, _, _)| *p == path);
    let kind = known.map_or(Kind::Gauge, |k| k.2);
    let name = format!("pagefold_dedup_{}", path.replace('.', "_"));
    let help = known.map_or_else(|| format!("Dedup statistic {path}."), |k| k.1.to_string());
    (name, help, kind)
}

/// Writes one unlabelled sample.
fn single(e: &mut DescriptorEncoder, name: &str, help: &str, kind: Kind, v: Num) -> fmt::Result {
    match kind {
        Kind::Counter => {
            let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            match v {
                Num::U(x) => ConstCounter::new(x).encode(m),
                Num::F(x) => ConstCounter::new(x).encode(m),
                // Counters are never negative; no signed figure is one.
                Num::I(x) => ConstCounter::new(u64::try_from(x).unwrap_or(0)).encode(m),
            }
        }
        Kind::Gauge => {
            let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            match v {
                Num::U(x) => ConstGauge::new(x).encode(m),
                Num::I(x) => ConstGauge::new(x).encode(m),
                Num::F(x) => ConstGauge::new(x).encode(m),
            }
        }
    }
}

/// Writes a gauge family with one sample per label set.
fn gauges<L, N>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, N)>,
) -> fmt::Result
where
    L: EncodeLabelSet,
    ConstGauge<N>: EncodeMetric,
{
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

#[derive(Debug)]
struct Snapshot {
    dedup: Option<DedupView>,
    vms: Vec<VmInfo>,
}

impl Snapshot {
    fn vms(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        single(
            e,
            "pagefold_vms",
            "VMs in this process.",
            Kind::Gauge,
            Num::U(self.vms.len() as u64),
        )?;
        let states: Vec<(String, &str)> = self
            .vms
            .iter()
            .map(|v| (state_name(v), v.name.as_str()))
            .collect();
        gauges(
            e,
            "pagefold_vm_state",
            "1 for the VM's run state, 0 for the others.",
            states.iter().flat_map(|(state, vm)| {
                STATES
                    .iter()
                    .map(move |s| ([("vm", *vm), ("state", *s)], u64::from(s == state)))
            }),
        )?;
        let by_vm = |f: fn(&VmInfo) -> u64| {
            self.vms
                .iter()
                .map(move |v| ([("vm", v.name.as_str())], f(v)))
        };
        gauges(
            e,
            "pagefold_vm_vcpus",
            "vCPUs of the VM.",
            by_vm(|v| v.vcpus.into()),
        )?;
        gauges(
            e,
            "pagefold_vm_memory_bytes",
            "Guest RAM of the VM, in bytes.",
            by_vm(|v| v.memory_bytes),
        )?;
        gauges(
            e,
            "pagefold_vm_uptime_seconds",
            "Time since the VM started.",
            self.vms
                .iter()
                .map(|v| ([("vm", v.name.as_str())], v.uptime_s)),
        )
    }

    fn dedup(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let enabled = |on: bool| Num::U(on.into());
        let Some(d) = &self.dedup else {
            return single(
                e,
                "pagefold_dedup_enabled",
                "1 if a dedup backend runs in this process.",
                Kind::Gauge,
                enabled(false),
            );
        };
        single(
            e,
            "pagefold_dedup_enabled",
            "1 if a dedup backend runs in this process.",
            Kind::Gauge,
            enabled(true),
        )?;
        gauges(
            e,
            "pagefold_dedup_backend_info",
            "The dedup backend in use.",
            [([("backend", d.backend.as_str())], 1u64)],
        )?;
        let mode = d.mode.to_string();
        gauges(
            e,
            "pagefold_dedup_mode",
            "1 for the dedup mode in force, 0 for the others.",
            MODES
                .iter()
                .map(|m| ([("mode", *m)], u64::from(*m == mode))),
        )?;
        for (path, v) in figures(d) {
            let (name, help, kind) = family(&path);
            single(e, &name, &help, kind, v)?;
        }
        for (field, help) in OWNER {
            let rows = d.per_owner.iter().map(|(vm, o)| {
                let v = match *field {
                    "pages_tracked" => o.pages_tracked,
                    "pages_merged" => o.pages_merged,
                    "zero_pages" => o.zero_pages,
                    _ => o.bytes_saved,
                };
                ([("vm", vm.as_str()), ("group", o.group.as_str())], v)
            });
            gauges(e, &format!("pagefold_dedup_vm_{field}"), help, rows)?;
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.vms(&mut e)?;
        self.dedup(&mut e)
    }
}

/// A VM's run state as the API names it (`running`, ...).
fn state_name(v: &VmInfo) -> String {
    serde_json::to_value(v.state)
        .ok()
        .and_then(|s| s.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Which exposition a client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The classic text format, version 0.0.4.
    Text,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics if the client's `Accept` header names it (Prometheus'
    /// does), else the classic text format.
    pub fn for_accept(accept: &str) -> Format {
        if accept.contains("application/openmetrics-text") {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The whole exposition, from the VM list and the `GET /dedup` view (see
/// [`crate::dedup::view`]), if the process has a backend.
pub fn render(
    dedup_view: Option<&DedupView>,
    vm_list: &[VmInfo],
    format: Format,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot {
        dedup: dedup_view.cloned(),
        vms: vm_list.to_vec(),
    }));
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
        Format::Text => {
            prometheus_client::encoding::text::encode_registry(&mut out, &registry)?;
            out = classic(&out)?;
        }
    }
    Ok(out)
}

/// OpenMetrics text without `# EOF` to the text format 0.0.4: a counter's
/// `# HELP` and `# TYPE` lines name its samples (`x_total`), not its
/// family (`x`), as 0.0.4 parsers match them by name.
fn classic(openmetrics: &str) -> Result<String, fmt::Error> {
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut out = String::with_capacity(openmetrics.len() + 256);
    for (i, line) in lines.iter().enumerate() {
        let counter_of = |l: &str| {
            l.strip_prefix("# TYPE ")
                .and_then(|r| r.strip_suffix(" counter"))
                .map(str::to_string)
        };
        let help_of_counter = line
            .strip_prefix("# HELP ")
            .and_then(|r| r.split_once(' '))
            .filter(|(name, _)| {
                lines.get(i + 1).and_then(|n| counter_of(n)).as_deref() == Some(*name)
            });
        if let Some((name, help)) = help_of_counter {
            writeln!(out, "# HELP {name}_total {help}")?;
        } else if let Some(name) = counter_of(line) {
            writeln!(out, "# TYPE {name}_total counter")?;
        } else {
            writeln!(out, "{line}")?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::auto_status;
    use pagefold_dedup::auto::AutoConfig;
    use pagefold_dedup::backend::OwnerStats;
    use pagefold_dedup::{Knobs, Mode, Stats};
    use pagefold_vmm::state::RunState;
    use serde_json::Value;
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
            hint_merge_delay_ms: 2.5,
            per_owner,
            ..Stats::default()
        }
    }

    fn view() -> DedupView {
        let knobs = pagefold_dedup::DEFAULT_KNOBS;
        DedupView::new(stats(), knobs, Some((auto_status(), AutoConfig::default())))
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

    fn three_vms() -> Vec<VmInfo> {
        vec![
            vm("a", RunState::Running),
            vm("b", RunState::Paused),
            vm("c", RunState::Stopped),
        ]
    }

    /// The numbers and flags under `v` (objects recursively), by JSON path.
    fn leaves(path: &str, v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    if path.is_empty() && matches!(k.as_str(), "per_owner" | "limits") {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(&p, child, out);
                }
            }
            Value::Number(_) | Value::Bool(_) => out.push(path.to_string()),
            _ => {}
        }
    }

    /// Every sample line belongs to a family declared right before with
    /// HELP and TYPE, no family is declared twice, every number and flag of
    /// the dedup view (nested ones too: auto mode's, PSI's) shows up.
    #[test]
    fn exposition_is_well_formed_and_complete() {
        let text = render(Some(&view()), &three_vms(), Format::Text).unwrap();
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
        let mut paths = Vec::new();
        leaves("", &serde_json::to_value(view()).unwrap(), &mut paths);
        assert!(
            paths.iter().any(|p| p == "auto.psi.some_avg10"),
            "{paths:?}"
        );
        for p in paths {
            let base = format!("pagefold_dedup_{}", p.replace('.', "_"));
            assert!(
                text.contains(&format!("\n{base} ")) || text.contains(&format!("\n{base}_total ")),
                "stat {p} missing:\n{text}"
            );
        }
        for needle in [
            "pagefold_dedup_full_scans_total 3\n",
            "pagefold_dedup_cpu_seconds_total 1.5\n",
            "pagefold_dedup_map_count_limited 1\n",
            "pagefold_dedup_profit_bytes -4096\n",
            "pagefold_dedup_knobs_pages_to_scan 100\n",
            "pagefold_dedup_hint_merge_delay_ms 2.5\n",
            "pagefold_dedup_mode{mode=\"on\"} 1\n",
            "pagefold_dedup_mode{mode=\"off\"} 0\n",
            "pagefold_dedup_backend_info{backend=\"pagefold\"} 1\n",
            "pagefold_dedup_vm_pages_merged{vm=\"vm\\\"0\",group=\"g\"} 4\n",
            "pagefold_vm_state{vm=\"b\",state=\"paused\"} 1\n",
            "pagefold_vm_state{vm=\"b\",state=\"running\"} 0\n",
            "pagefold_vm_memory_bytes{vm=\"a\"} 67108864\n",
            "pagefold_vm_uptime_seconds{vm=\"a\"} 1.25\n",
            "pagefold_vm_vcpus{vm=\"c\"} 2\n",
            "pagefold_vms 3\n",
            "pagefold_vm_state{vm=\"c\",state=\"stopped\"} 1\n",
            "pagefold_dedup_enabled 1\n",
            "# HELP pagefold_dedup_last_wakeup_age_ms Milliseconds since",
            "pagefold_dedup_last_wakeup_age_ms 1234\n",
            "# TYPE pagefold_dedup_wakeup_overdue gauge\npagefold_dedup_wakeup_overdue 1\n",
            "# HELP pagefold_dedup_merges_total Pages merged.\n# TYPE pagefold_dedup_merges_total counter\npagefold_dedup_merges_total 0\n",
            "# TYPE pagefold_dedup_auto_free_bytes gauge\npagefold_dedup_auto_free_bytes 104857600\n",
            "# HELP pagefold_dedup_auto_free_bytes Dedup statistic auto.free_bytes.\n",
            "pagefold_dedup_auto_rounds_total 40\n",
            "pagefold_dedup_auto_auto_triggered 1\n",
            "pagefold_dedup_auto_psi_some_avg10 1.5\n",
            "pagefold_dedup_auto_config_auto_threshold ",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(!text.contains("memory_signal"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    /// Prometheus asks for OpenMetrics and gets it: counter families named
    /// without `_total`, samples with it, `# EOF` at the end; the samples
    /// are the text format's.
    #[test]
    fn openmetrics_differs_only_in_counter_families() {
        let om = render(Some(&view()), &three_vms(), Format::OpenMetrics).unwrap();
        let text = render(Some(&view()), &three_vms(), Format::Text).unwrap();
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(
            om.contains("# HELP pagefold_dedup_merges Pages merged.\n# TYPE pagefold_dedup_merges counter\npagefold_dedup_merges_total 0\n"),
            "{om}"
        );
        let samples = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(samples(&om), samples(&text));
        assert_eq!(
            Format::for_accept("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            Format::OpenMetrics
        );
        assert_eq!(Format::for_accept("*/*"), Format::Text);
        assert!(Format::Text
            .content_type()
            .starts_with("text/plain; version=0.0.4"));
    }

    #[test]
    fn without_backend_only_vm_figures_and_disabled_flag() {
        let text = render(None, &[], Format::Text).unwrap();
        assert!(text.contains("pagefold_dedup_enabled 0\n"));
        assert!(text.contains("pagefold_vms 0\n"));
        assert!(!text.contains("pagefold_dedup_pages_shared"));
    }
}
