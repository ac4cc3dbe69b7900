//! Prometheus metrics: every family declared once in [`catalogue`] (name,
//! type, unit, help, source), encoded with prometheus-client from the
//! typed answers ([`VmInfo`], the [`DedupView`] that `GET /dedup` serves),
//! this process's `/proc` figures ([`process`]) and the build's identity,
//! one scrape at a time.
//!
//! Two encodings: OpenMetrics 1.0 (what prometheus-client writes, and what
//! Prometheus asks for first), and the classic text format 0.0.4 for
//! everyone else (curl, older scrapers). They differ in the counters'
//! `# HELP`/`# TYPE` lines only: OpenMetrics names the family without its
//! `_total` suffix, the text format names the sample (see [`classic`]);
//! the samples are the same.

pub mod catalogue;
pub mod doc_table;
pub mod process;
mod rows;

use std::fmt::{self, Write};
use std::sync::OnceLock;

use pagefold_vmm::pause::{PAUSE_BOUNDS_S, PAUSE_BUCKETS};
use pagefold_vmm::vm::VmInfo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::NoLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::dedup_view::DedupView;
use catalogue::{Kind, FAMILIES};

const MODES: [&str; 4] = ["off", "on", "unmerge", "auto"];
const STATES: [&str; 4] = ["running", "paused", "stopping", "stopped"];

/// Which build this is, for `pagefold_build_info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildInfo {
    pub version: String,
    /// The git commit, or "unknown".
    pub commit: String,
    /// Compiled-in features, comma-separated ("" for none).
    pub features: String,
}

static BUILD: OnceLock<BuildInfo> = OnceLock::new();

/// Records the binary's identity for `pagefold_build_info` (the binary
/// knows its commit and features; this crate does not). The first call
/// wins; without one, the version is this crate's and the commit unknown.
pub fn set_build_info(info: BuildInfo) {
    let _ = BUILD.set(info);
}

fn build_info() -> BuildInfo {
    BUILD.get().cloned().unwrap_or_else(|| BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: "unknown".to_string(),
        features: String::new(),
    })
}

/// A figure's value, in the type it has in the view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    U(u64),
    I(i64),
    F(f64),
    /// A histogram over [`PAUSE_BOUNDS_S`] (the one kind of histogram
    /// exported): its sum and its windows per bucket.
    H {
        sum: f64,
        buckets: [u64; PAUSE_BUCKETS],
    },
}

/// A histogram sample as prometheus-client encodes it (it has no constant
/// histogram of its own): `_sum`, `_count` and the cumulative buckets.
struct ConstHistogram {
    sum: f64,
    buckets: [u64; PAUSE_BUCKETS],
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut e: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        let bounds = PAUSE_BOUNDS_S.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(self.buckets).collect();
        let count = self.buckets.iter().sum();
        e.encode_histogram::<NoLabelSet>(self.sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
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

/// What one scrape reports: the families of [`catalogue`] read from it.
#[derive(Debug)]
pub struct Scrape {
    pub dedup: Option<DedupView>,
    pub vms: Vec<VmInfo>,
    pub process: Option<process::ProcessFigures>,
    pub build: BuildInfo,
}

/// Writes one sample of a family already declared.
fn sample(e: prometheus_client::encoding::MetricEncoder, kind: Kind, v: Num) -> fmt::Result {
    match (kind, v) {
        (Kind::Counter, Num::U(x)) => ConstCounter::new(x).encode(e),
        (Kind::Counter, Num::F(x)) => ConstCounter::new(x).encode(e),
        // Counters are never negative; no signed figure is one.
        (Kind::Counter, Num::I(x)) => ConstCounter::new(u64::try_from(x).unwrap_or(0)).encode(e),
        (Kind::Gauge, Num::U(x)) => ConstGauge::new(x).encode(e),
        (Kind::Gauge, Num::I(x)) => ConstGauge::new(x).encode(e),
        (Kind::Gauge, Num::F(x)) => ConstGauge::new(x).encode(e),
        (Kind::Histogram, Num::H { sum, buckets }) => ConstHistogram { sum, buckets }.encode(e),
        // A family declared with one kind and read as another: a bug the
        // catalogue's tests catch (every family is rendered there).
        (Kind::Histogram, _) | (_, Num::H { .. }) => Err(fmt::Error),
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        for f in FAMILIES {
            let Some(rows) = (f.rows)(self) else {
                continue;
            };
            let t = match f.kind {
                Kind::Gauge => MetricType::Gauge,
                Kind::Counter => MetricType::Counter,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut m = e.encode_descriptor(f.name, f.help, None, t)?;
            for (values, v) in rows {
                if f.labels.is_empty() {
                    sample(m, f.kind, v)?;
                    // An unlabelled family has one sample.
                    break;
                }
                let labels: Vec<(&str, String)> = f.labels.iter().copied().zip(values).collect();
                sample(m.encode_family(&labels)?, f.kind, v)?;
            }
        }
        Ok(())
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
    encode(
        Scrape {
            dedup: dedup_view.cloned(),
            vms: vm_list.to_vec(),
            process: process::sample(),
            build: build_info(),
        },
        format,
    )
}

/// The exposition of one scrape's figures.
pub fn encode(scrape: Scrape, format: Format) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
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
    use pagefold_dedup::OwnerStats;
    use pagefold_dedup::{Knobs, Mode, Stats};
    use pagefold_vmm::state::RunState;
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};

    use catalogue::NOT_EXPORTED;

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
                cow_breaks: Some(3),
                pages_reported: 6,
                pages_returned: Some(2),
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
            ksm_assist: "standby".into(),
            max_guest_pause_us: Some(500),
            write_waits: Some(3),
            write_wait_us: Some(4200),
            max_write_wait_us: Some(2500),
            settle: Some(false),
            pages_reported: 9,
            pages_returned: Some(4),
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
            guest_pauses: pauses(),
            balloon: None,
            nics: Vec::new(),
        }
    }

    /// Three windows: 40 µs, 40 µs and 3 ms.
    fn pauses() -> pagefold_vmm::pause::GuestPauses {
        let log = pagefold_vmm::pause::PauseLog::default();
        log.record(std::time::Duration::from_micros(40));
        log.record(std::time::Duration::from_micros(40));
        log.record(std::time::Duration::from_millis(3));
        log.snapshot()
    }

    fn three_vms() -> Vec<VmInfo> {
        let mut a = vm("a", RunState::Running);
        a.balloon = Some(pagefold_vmm::balloon::BalloonStatus {
            target_mib: 16,
            actual_mib: 12,
            reported_pages: 300,
            returned_pages: 3372,
            guest_stats: [
                ("free_memory", 5u64 << 20),
                ("swap_in", 8192),
                ("major_faults", 7),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            ..Default::default()
        });
        a.nics = vec![pagefold_vmm::nic::NicStatus {
            tap: "tap-a".into(),
            rx_frames: 5,
            tx_bytes: 900,
            rx_waits: 3,
            rx_frame_waiting: true,
            rx_interrupts_suppressed: 2,
            queue_pairs: 2,
            active_pairs: 2,
            pairs: vec![
                pagefold_vmm::nic::PairStatus {
                    rx_frames: 2,
                    ..Default::default()
                },
                pagefold_vmm::nic::PairStatus {
                    rx_frames: 3,
                    tx_bytes: 900,
                    ..Default::default()
                },
            ],
            ctrl_ok: 1,
            ..Default::default()
        }];
        vec![a, vm("b", RunState::Paused), vm("c", RunState::Stopped)]
    }

    /// The numbers, flags and strings under `v` (objects recursively), by
    /// JSON path; map keys (VM names) become `*`.
    fn leaves(path: &str, v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let k = if path == "per_owner" { "*" } else { k.as_str() };
                    let p = if path.is_empty() {
                        k.to_string()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(&p, child, out);
                }
            }
            Value::Array(_) => {}
            _ => {
                out.insert(path.to_string());
            }
        }
    }

    fn scrape() -> Scrape {
        Scrape {
            dedup: Some(view()),
            vms: three_vms(),
            process: Some(process::ProcessFigures {
                cpu_seconds: 2.5,
                resident_bytes: 1 << 20,
                virtual_bytes: 1 << 30,
                start_time_seconds: 1.7e9,
                open_fds: 12,
                max_fds: Some(1024),
            }),
            build: BuildInfo {
                version: "0.1.0".into(),
                commit: "abcdef012345".into(),
                features: "bench".into(),
            },
        }
    }

    /// Every sample line belongs to a family declared right before with
    /// HELP and TYPE, no family is declared twice, and each family of the
    /// catalogue shows up with the values of the view in base units.
    #[test]
    fn exposition_is_well_formed_and_complete() {
        let text = encode(scrape(), Format::Text).unwrap();
        let mut declared = BTreeSet::new();
        let mut current = String::new();
        let mut histogram = false;
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
                let kind = it.next().unwrap();
                assert!(matches!(kind, "gauge" | "counter" | "histogram"));
                histogram = kind == "histogram";
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = match histogram {
                    true => ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|s| name.strip_suffix(s))
                        .unwrap_or(name),
                    false => name,
                };
                assert_eq!(family, current, "sample outside its family: {line}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok() || value == "NaN", "{line}");
                assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            }
        }
        for f in FAMILIES {
            assert!(
                declared.contains(&f.sample_name()),
                "{} missing:\n{text}",
                f.name
            );
        }
        for needle in [
            "pagefold_dedup_full_scans_total 3\n",
            "pagefold_dedup_cpu_seconds_total 1.5\n",
            "pagefold_dedup_map_count_limited 1\n",
            "pagefold_dedup_profit_bytes -4096\n",
            "pagefold_dedup_pages_to_scan 100\n",
            "pagefold_dedup_max_guest_pause_seconds 0.0005\n",
            "pagefold_dedup_settle_enabled 0\n",
            "pagefold_dedup_sleep_seconds 0.02\n",
            "pagefold_dedup_io_hint_merge_delay_seconds 0.0025\n",
            "pagefold_dedup_last_wakeup_age_seconds 1.234\n",
            "pagefold_dedup_mode{mode=\"on\"} 1\n",
            "pagefold_dedup_mode{mode=\"off\"} 0\n",
            "pagefold_dedup_backend_info{backend=\"pagefold\"} 1\n",
            "pagefold_dedup_vm_pages_merged{vm=\"vm\\\"0\",group=\"g\"} 4\n",
            "pagefold_dedup_vm_saved_bytes{vm=\"vm\\\"0\",group=\"g\"} 8192\n",
            "pagefold_vm_state{vm=\"b\",state=\"paused\"} 1\n",
            "pagefold_vm_state{vm=\"b\",state=\"running\"} 0\n",
            "pagefold_vm_memory_bytes{vm=\"a\"} 67108864\n",
            "pagefold_vm_uptime_seconds{vm=\"a\"} 1.25\n",
            // Cumulative buckets, in seconds.
            "pagefold_guest_pause_seconds_bucket{le=\"0.000025\",vm=\"a\"} 0\n",
            "pagefold_guest_pause_seconds_bucket{le=\"0.00005\",vm=\"a\"} 2\n",
            "pagefold_guest_pause_seconds_bucket{le=\"0.0025\",vm=\"a\"} 2\n",
            "pagefold_guest_pause_seconds_bucket{le=\"0.005\",vm=\"a\"} 3\n",
            "pagefold_guest_pause_seconds_bucket{le=\"+Inf\",vm=\"a\"} 3\n",
            "pagefold_guest_pause_seconds_count{vm=\"a\"} 3\n",
            "pagefold_guest_pause_seconds_sum{vm=\"a\"} 0.00308\n",
            "pagefold_vm_vcpus{vm=\"c\"} 2\n",
            "pagefold_vms 3\n",
            "pagefold_vm_state{vm=\"c\",state=\"stopped\"} 1\n",
            "pagefold_dedup_enabled 1\n",
            "# TYPE pagefold_dedup_wakeup_overdue gauge\npagefold_dedup_wakeup_overdue 1\n",
            "# HELP pagefold_dedup_merges_total Pages merged onto a shared page.\n# TYPE pagefold_dedup_merges_total counter\npagefold_dedup_merges_total 0\n",
            "pagefold_dedup_auto_host_memory_bytes{kind=\"free\"} 104857600\n",
            "pagefold_dedup_auto_rounds_total 40\n",
            "pagefold_dedup_auto_merging 1\n",
            "pagefold_dedup_auto_memory_pressure_ratio{kind=\"some\",window=\"10s\"} 0.015\n",
            "pagefold_dedup_auto_threshold_ratio 0.",
            "pagefold_build_info{version=\"0.1.0\",commit=\"abcdef012345\",features=\"bench\"} 1\n",
            "process_cpu_seconds_total 2.5\n",
            "process_resident_memory_bytes 1048576\n",
            "process_max_fds 1024\n",
            "pagefold_dedup_reported_pages_total 9\n",
            "pagefold_dedup_returned_pages 4\n",
            "pagefold_dedup_vm_returned_pages{vm=\"vm\\\"0\",group=\"g\"} 2\n",
            "pagefold_balloon_target_bytes{vm=\"a\"} 16777216\n",
            "pagefold_balloon_actual_bytes{vm=\"a\"} 12582912\n",
            "pagefold_balloon_reported_pages_total{vm=\"a\"} 300\n",
            "pagefold_balloon_returned_pages_total{vm=\"a\"} 3372\n",
            "pagefold_balloon_guest_memory_bytes{vm=\"a\",kind=\"free_memory\"} 5242880\n",
            "pagefold_balloon_guest_swapped_bytes_total{vm=\"a\",direction=\"in\"} 8192\n",
            "pagefold_balloon_guest_events_total{vm=\"a\",event=\"major_faults\"} 7\n",
            "pagefold_net_frames_total{vm=\"a\",tap=\"tap-a\",direction=\"rx\"} 5\n",
            "pagefold_net_bytes_total{vm=\"a\",tap=\"tap-a\",direction=\"tx\"} 900\n",
            "pagefold_net_rx_waits_total{vm=\"a\",tap=\"tap-a\"} 3\n",
            "pagefold_net_rx_frame_waiting{vm=\"a\",tap=\"tap-a\"} 1\n",
            "pagefold_net_interrupts_suppressed_total{vm=\"a\",tap=\"tap-a\",queue=\"rx\"} 2\n",
            "pagefold_net_pair_frames_total{vm=\"a\",tap=\"tap-a\",pair=\"0\",direction=\"rx\"} 2\n",
            "pagefold_net_pair_frames_total{vm=\"a\",tap=\"tap-a\",pair=\"1\",direction=\"rx\"} 3\n",
            "pagefold_net_pair_bytes_total{vm=\"a\",tap=\"tap-a\",pair=\"1\",direction=\"tx\"} 900\n",
            "pagefold_net_queue_pairs{vm=\"a\",tap=\"tap-a\",state=\"active\"} 2\n",
            "pagefold_net_ctrl_requests_total{vm=\"a\",tap=\"tap-a\",result=\"ok\"} 1\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
    }

    /// Each field of the dedup view is exported by a family or listed as
    /// not exported, with the reason: a statistic added to the view and
    /// to neither fails here.
    #[test]
    fn every_statistic_is_exported_or_says_why_not() {
        let mut paths = BTreeSet::new();
        leaves("", &serde_json::to_value(view()).unwrap(), &mut paths);
        assert!(paths.contains("auto.psi.some_avg10"), "{paths:?}");
        assert!(paths.contains("per_owner.*.pages_merged"), "{paths:?}");
        let covered = |p: &str| {
            FAMILIES.iter().any(|f| f.source.contains(&p))
                || NOT_EXPORTED.iter().any(|(q, _)| match q.strip_suffix('*') {
                    Some(prefix) => p.starts_with(prefix),
                    None => *q == p,
                })
        };
        let missing: Vec<&String> = paths.iter().filter(|p| !covered(p)).collect();
        assert!(
            missing.is_empty(),
            "not exported and not explained: {missing:?}"
        );
        // And no family names a source the view does not have.
        for f in FAMILIES {
            for s in f.source {
                assert!(paths.contains(*s), "{}: no field {s}", f.name);
            }
        }
    }

    /// Prometheus asks for OpenMetrics and gets it: counter families named
    /// without `_total`, samples with it, `# EOF` at the end; the samples
    /// are the text format's.
    #[test]
    fn openmetrics_differs_only_in_counter_families() {
        let om = encode(scrape(), Format::OpenMetrics).unwrap();
        let text = encode(scrape(), Format::Text).unwrap();
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(
            om.contains("# HELP pagefold_dedup_merges Pages merged onto a shared page.\n# TYPE pagefold_dedup_merges counter\npagefold_dedup_merges_total 0\n"),
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
    fn without_backend_only_vm_process_and_disabled_flag() {
        let text = render(None, &[], Format::Text).unwrap();
        assert!(text.contains("pagefold_dedup_enabled 0\n"), "{text}");
        assert!(text.contains("pagefold_vms 0\n"), "{text}");
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
        assert!(text.contains("\npagefold_build_info{version=\""), "{text}");
        assert!(!text.contains("pagefold_dedup_pages_shared"), "{text}");
        assert!(!text.contains("pagefold_dedup_vm_"), "{text}");
    }
}
