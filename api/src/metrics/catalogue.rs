//! Every metric family pagefold exports, declared once: its name, type,
//! labels, help text, the `GET /api/v1/dedup` fields it comes from, the
//! node_exporter `ksmd` metric it matches, and how a scrape reads it.
//!
//! Names follow Prometheus' conventions: base units (`_seconds`, `_bytes`,
//! ratios from 0 to 1), counters end in `_total` (the name here is the
//! family's, without it; the encoder adds it), a figure that KSM also has
//! takes node_exporter's `node_ksmd_*` name with the `pagefold_dedup_`
//! prefix. docs/metrics.md's table is `doc_table::markdown_table` of this list; a
//! test keeps the two equal.

use super::rows::{
    auto, build, by_origin, dedup, dedup_some, ms_to_s, one, pagefold_only, per_balloon,
    per_guest_stat, per_nic, per_nic_by, per_nic_pair, per_owner, per_owner_some, per_vm, process,
};
use super::{Num, Scrape, MODES, STATES};

/// A family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

pub use super::rows::Rows;

/// The guest statistics `pagefold_balloon_guest_events` counts.
const GUEST_EVENTS: [&str; 10] = [
    "major_faults",
    "minor_faults",
    "hugetlb_allocations",
    "hugetlb_failures",
    "oom_kills",
    "alloc_stalls",
    "async_scans",
    "direct_scans",
    "async_reclaims",
    "direct_reclaims",
];

/// One metric family.
pub struct Family {
    /// The family's name; a counter's samples add `_total`.
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
    /// The fields of `GET /api/v1/dedup` (JSON paths) the family exports;
    /// empty for figures that are not dedup statistics.
    pub source: &'static [&'static str],
    /// node_exporter's name for the same figure of kernel KSM, if any.
    pub ksmd: Option<&'static str>,
    pub rows: fn(&Scrape) -> Rows,
}

impl Family {
    /// The name of the family's samples.
    pub fn sample_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.name),
            Kind::Gauge => self.name.to_string(),
            // Its samples are `_bucket`, `_sum` and `_count`.
            Kind::Histogram => self.name.to_string(),
        }
    }
}

/// The fields of the dedup view that no family exports, and why. With the
/// families' sources they cover every number and flag of the view (a
/// test checks), so a new statistic cannot be left out unnoticed.
pub const NOT_EXPORTED: &[(&str, &str)] = &[
    (
        "limits.*",
        "the knobs' valid ranges: constants of the build",
    ),
    (
        "auto.pages_to_scan",
        "the pages_to_scan knob as auto mode saw it: pagefold_dedup_pages_to_scan",
    ),
    (
        "auto_config.auto_threshold",
        "the same setting as pagefold_dedup_auto_threshold_ratio",
    ),
    (
        "auto_config.memory_signal",
        "the same setting as auto.memory_signal (a label value would add nothing)",
    ),
    (
        "auto_config.max_scanning_factor",
        "the same setting as pagefold_dedup_auto_max_scanning_factor",
    ),
];

/// Every family, in exposition order.
pub static FAMILIES: &[Family] = &[
    Family {
        name: "pagefold_build_info",
        kind: Kind::Gauge,
        labels: &["version", "commit", "features"],
        help: "Always 1; the labels say which build this is.",
        source: &[],
        ksmd: None,
        rows: |s| build(&s.build),
    },
    Family {
        name: "process_cpu_seconds",
        kind: Kind::Counter,
        labels: &[],
        help: "CPU time (user and system) of the whole process.",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| Some(Num::F(p.cpu_seconds))),
    },
    Family {
        name: "process_resident_memory_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Resident memory of the process (guest RAM included).",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| Some(Num::U(p.resident_bytes))),
    },
    Family {
        name: "process_virtual_memory_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Virtual memory size of the process.",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| Some(Num::U(p.virtual_bytes))),
    },
    Family {
        name: "process_start_time_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Start time of the process, in seconds since the Unix epoch.",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| Some(Num::F(p.start_time_seconds))),
    },
    Family {
        name: "process_open_fds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Open file descriptors of the process.",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| Some(Num::U(p.open_fds))),
    },
    Family {
        name: "process_max_fds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Limit on open file descriptors (absent when unlimited).",
        source: &[],
        ksmd: None,
        rows: |s| process(s, |p| p.max_fds.map(Num::U)),
    },
    Family {
        name: "pagefold_vms",
        kind: Kind::Gauge,
        labels: &[],
        help: "VMs in this process (finished ones until they are deleted).",
        source: &[],
        ksmd: None,
        rows: |s| one(s.vms.len() as u64),
    },
    Family {
        name: "pagefold_vm_state",
        kind: Kind::Gauge,
        labels: &["vm", "state"],
        help: "1 for the VM's run state, 0 for the others.",
        source: &[],
        ksmd: None,
        rows: |s| {
            Some(
                s.vms
                    .iter()
                    .flat_map(|v| {
                        let now = super::state_name(v);
                        STATES.iter().map(move |st| {
                            (
                                vec![v.name.clone(), st.to_string()],
                                Num::U((*st == now).into()),
                            )
                        })
                    })
                    .collect(),
            )
        },
    },
    Family {
        name: "pagefold_vm_vcpus",
        kind: Kind::Gauge,
        labels: &["vm"],
        help: "vCPUs of the VM.",
        source: &[],
        ksmd: None,
        rows: |s| per_vm(s, |v| Num::U(v.vcpus.into())),
    },
    Family {
        name: "pagefold_vm_memory_bytes",
        kind: Kind::Gauge,
        labels: &["vm"],
        help: "Guest RAM of the VM.",
        source: &[],
        ksmd: None,
        rows: |s| per_vm(s, |v| Num::U(v.memory_bytes)),
    },
    Family {
        name: "pagefold_vm_uptime_seconds",
        kind: Kind::Gauge,
        labels: &["vm"],
        help: "Time since the VM started.",
        source: &[],
        ksmd: None,
        rows: |s| per_vm(s, |v| Num::F(v.uptime_s)),
    },
    Family {
        name: "pagefold_guest_pause_seconds",
        kind: Kind::Histogram,
        labels: &["vm"],
        help: "Stops of the VM's vCPUs caused by the dedup engine's parks (one per vCPU kept waiting, as long as it waited).",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_vm(s, |v| Num::H {
                sum: v.guest_pauses.total_s,
                buckets: v.guest_pauses.buckets,
            })
        },
    },
    Family {
        name: "pagefold_balloon_target_bytes",
        kind: Kind::Gauge,
        labels: &["vm"],
        help: "The size the host asks the VM's balloon to be.",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.target_mib << 20)),
    },
    Family {
        name: "pagefold_balloon_actual_bytes",
        kind: Kind::Gauge,
        labels: &["vm"],
        help: "The size the guest says its balloon has.",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.actual_mib << 20)),
    },
    Family {
        name: "pagefold_balloon_reported_pages",
        kind: Kind::Counter,
        labels: &["vm"],
        help: "4 KiB pages in the ranges the guest's free page reporting reported.",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.reported_pages)),
    },
    Family {
        name: "pagefold_balloon_inflated_pages",
        kind: Kind::Counter,
        labels: &["vm"],
        help: "4 KiB pages the guest put into its balloon.",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.inflated_pages)),
    },
    Family {
        name: "pagefold_balloon_deflated_pages",
        kind: Kind::Counter,
        labels: &["vm"],
        help: "4 KiB pages the guest took out of its balloon.",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.deflated_pages)),
    },
    Family {
        name: "pagefold_balloon_returned_pages",
        kind: Kind::Counter,
        labels: &["vm"],
        help: "4 KiB pages the balloon gave back to the host (inflated and reported).",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.returned_pages)),
    },
    Family {
        name: "pagefold_balloon_bad_chains",
        kind: Kind::Counter,
        labels: &["vm"],
        help: "Malformed balloon buffers the guest posted (returned untouched).",
        source: &[],
        ksmd: None,
        rows: |s| per_balloon(s, |b| Num::U(b.bad_chains)),
    },
    Family {
        name: "pagefold_balloon_guest_memory_bytes",
        kind: Kind::Gauge,
        labels: &["vm", "kind"],
        help: "The guest's memory as its balloon reports it: total_memory, free_memory, available_memory, disk_caches.",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_guest_stat(s, |k| {
                ["total_memory", "free_memory", "available_memory", "disk_caches"]
                    .into_iter()
                    .find(|&m| m == k)
            })
        },
    },
    Family {
        name: "pagefold_balloon_guest_swapped_bytes",
        kind: Kind::Counter,
        labels: &["vm", "direction"],
        help: "Memory the guest swapped in and out, as its balloon reports it.",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_guest_stat(s, |k| match k {
                "swap_in" => Some("in"),
                "swap_out" => Some("out"),
                _ => None,
            })
        },
    },
    Family {
        name: "pagefold_balloon_guest_events",
        kind: Kind::Counter,
        labels: &["vm", "event"],
        help: "The guest's memory events as its balloon reports them: major_faults, minor_faults, oom_kills, alloc_stalls, hugetlb_allocations, ...",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_guest_stat(s, |k| {
                GUEST_EVENTS.into_iter().find(|&e| e == k)
            })
        },
    },
    Family {
        name: "pagefold_net_frames",
        kind: Kind::Counter,
        labels: &["vm", "tap", "direction"],
        help: "Frames the VM's NIC received (rx) and sent (tx).",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_by(s, |n| vec![("rx", n.rx_frames), ("tx", n.tx_frames)]),
    },
    Family {
        name: "pagefold_net_bytes",
        kind: Kind::Counter,
        labels: &["vm", "tap", "direction"],
        help: "Bytes of the frames the VM's NIC received (rx) and sent (tx), 12-byte vnet header included.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_by(s, |n| vec![("rx", n.rx_bytes), ("tx", n.tx_bytes)]),
    },
    Family {
        name: "pagefold_net_pair_frames",
        kind: Kind::Counter,
        labels: &["vm", "tap", "pair", "direction"],
        help: "Frames each queue pair of the VM's NIC received (rx) and sent (tx); pair 0 only without multiqueue.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_pair(s, |p| (p.rx_frames, p.tx_frames)),
    },
    Family {
        name: "pagefold_net_pair_bytes",
        kind: Kind::Counter,
        labels: &["vm", "tap", "pair", "direction"],
        help: "Bytes of the frames each queue pair of the VM's NIC received (rx) and sent (tx), vnet header included.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_pair(s, |p| (p.rx_bytes, p.tx_bytes)),
    },
    Family {
        name: "pagefold_net_queue_pairs",
        kind: Kind::Gauge,
        labels: &["vm", "tap", "state"],
        help: "Queue pairs of the VM's NIC: all it has (max) and those the guest's driver uses (active).",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_nic_by(s, |n| {
                vec![
                    ("max", u64::from(n.queue_pairs)),
                    ("active", u64::from(n.active_pairs)),
                ]
            })
        },
    },
    Family {
        name: "pagefold_net_ctrl_requests",
        kind: Kind::Counter,
        labels: &["vm", "tap", "result"],
        help: "Control-queue requests of a multiqueue NIC: answered ok, answered err (unsupported, out of range), bad_chain (malformed, returned unanswered).",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_nic_by(s, |n| {
                vec![
                    ("ok", n.ctrl_ok),
                    ("err", n.ctrl_err),
                    ("bad_chain", n.ctrl_bad_chains),
                ]
            })
        },
    },
    Family {
        name: "pagefold_net_dropped_frames",
        kind: Kind::Counter,
        labels: &["vm", "tap", "reason"],
        help: "Frames the NIC dropped: rx_oversize (larger than every receive buffer the guest could post), tx_bad_chain (malformed transmit buffers).",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_nic_by(s, |n| {
                vec![("rx_oversize", n.rx_oversize), ("tx_bad_chain", n.tx_bad_chains)]
            })
        },
    },
    Family {
        name: "pagefold_net_rx_bad_chains",
        kind: Kind::Counter,
        labels: &["vm", "tap"],
        help: "Receive buffers the NIC could not write (no writable part, outside guest RAM): returned empty.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic(s, |n| n.rx_bad_chains),
    },
    Family {
        name: "pagefold_net_tap_errors",
        kind: Kind::Counter,
        labels: &["vm", "tap", "direction"],
        help: "Tap read (rx) and write (tx) errors; the frame is lost.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_by(s, |n| vec![("rx", n.rx_errors), ("tx", n.tx_errors)]),
    },
    Family {
        name: "pagefold_net_rx_waits",
        kind: Kind::Counter,
        labels: &["vm", "tap"],
        help: "Times a received frame found too few receive buffers and waited for the guest to post more.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic(s, |n| n.rx_waits),
    },
    Family {
        name: "pagefold_net_rx_frame_waiting",
        kind: Kind::Gauge,
        labels: &["vm", "tap"],
        help: "1 while a received frame waits in the NIC for receive buffers.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic(s, |n| u64::from(n.rx_frame_waiting)),
    },
    Family {
        name: "pagefold_net_tap_wakeups",
        kind: Kind::Counter,
        labels: &["vm", "tap"],
        help: "Times the tap woke the NIC's receive path (it became readable).",
        source: &[],
        ksmd: None,
        rows: |s| per_nic(s, |n| n.tap_wakeups),
    },
    Family {
        name: "pagefold_net_interrupts",
        kind: Kind::Counter,
        labels: &["vm", "tap", "queue"],
        help: "Runs of the NIC's receive (rx) or transmit (tx) queue that used buffers and interrupted the guest.",
        source: &[],
        ksmd: None,
        rows: |s| per_nic_by(s, |n| vec![("rx", n.rx_interrupts), ("tx", n.tx_interrupts)]),
    },
    Family {
        name: "pagefold_net_interrupts_suppressed",
        kind: Kind::Counter,
        labels: &["vm", "tap", "queue"],
        help: "Runs of the NIC's receive (rx) or transmit (tx) queue that used buffers without an interrupt: the guest's EVENT_IDX used_event said it was still polling.",
        source: &[],
        ksmd: None,
        rows: |s| {
            per_nic_by(s, |n| {
                vec![
                    ("rx", n.rx_interrupts_suppressed),
                    ("tx", n.tx_interrupts_suppressed),
                ]
            })
        },
    },
    Family {
        name: "pagefold_dedup_enabled",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 if a dedup backend runs in this process (PATCH /api/v1/dedup starts one).",
        source: &[],
        ksmd: None,
        rows: |s| one(s.dedup.is_some()),
    },
    Family {
        name: "pagefold_dedup_backend_info",
        kind: Kind::Gauge,
        labels: &["backend"],
        help: "Always 1; the label names the dedup backend (pagefold or ksm).",
        source: &["backend"],
        ksmd: None,
        rows: |s| {
            s.dedup
                .as_ref()
                .map(|d| vec![(vec![d.backend.clone()], Num::U(1))])
        },
    },
    Family {
        name: "pagefold_dedup_mode",
        kind: Kind::Gauge,
        labels: &["mode"],
        help: "1 for the dedup mode in force, 0 for the others.",
        source: &["mode"],
        ksmd: Some("node_ksmd_run"),
        rows: |s| {
            s.dedup.as_ref().map(|d| {
                let now = d.mode.to_string();
                MODES
                    .iter()
                    .map(|m| (vec![m.to_string()], Num::U((*m == now).into())))
                    .collect()
            })
        },
    },
    Family {
        name: "pagefold_dedup_pages_shared",
        kind: Kind::Gauge,
        labels: &[],
        help: "Shared pages in use (each mapped at least twice).",
        source: &["pages_shared"],
        ksmd: Some("node_ksmd_pages_shared"),
        rows: |s| dedup(s, |d| d.pages_shared.into()),
    },
    Family {
        name: "pagefold_dedup_pages_sharing",
        kind: Kind::Gauge,
        labels: &[],
        help: "Extra sites mapping a shared page: the pages sharing saves.",
        source: &["pages_sharing"],
        ksmd: Some("node_ksmd_pages_sharing"),
        rows: |s| dedup(s, |d| d.pages_sharing.into()),
    },
    Family {
        name: "pagefold_dedup_pages_unshared",
        kind: Kind::Gauge,
        labels: &[],
        help: "Scanned pages, stable, with no identical partner.",
        source: &["pages_unshared"],
        ksmd: Some("node_ksmd_pages_unshared"),
        rows: |s| dedup(s, |d| d.pages_unshared.into()),
    },
    Family {
        name: "pagefold_dedup_pages_volatile",
        kind: Kind::Gauge,
        labels: &[],
        help: "Scanned pages that changed since their last visit.",
        source: &["pages_volatile"],
        ksmd: Some("node_ksmd_pages_volatile"),
        rows: |s| dedup(s, |d| d.pages_volatile.into()),
    },
    Family {
        name: "pagefold_dedup_full_scans",
        kind: Kind::Counter,
        labels: &[],
        help: "Completed passes over all registered memory.",
        source: &["full_scans"],
        ksmd: Some("node_ksmd_full_scans_total"),
        rows: |s| dedup(s, |d| d.full_scans.into()),
    },
    Family {
        name: "pagefold_dedup_pages_to_scan",
        kind: Kind::Gauge,
        labels: &[],
        help: "Knob: pages scanned per wake-up.",
        source: &["knobs.pages_to_scan"],
        ksmd: Some("node_ksmd_pages_to_scan"),
        rows: |s| dedup(s, |d| d.knobs.pages_to_scan.into()),
    },
    Family {
        name: "pagefold_dedup_sleep_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Knob: sleep between wake-ups.",
        source: &["knobs.sleep_millisecs"],
        ksmd: Some("node_ksmd_sleep_seconds"),
        rows: |s| dedup(s, |d| ms_to_s(d.knobs.sleep_millisecs as f64)),
    },
    Family {
        name: "pagefold_dedup_max_page_sharing",
        kind: Kind::Gauge,
        labels: &[],
        help: "Knob: most sites that may map one shared page.",
        source: &["knobs.max_page_sharing"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.knobs.max_page_sharing.into()),
    },
    Family {
        name: "pagefold_dedup_zero_pages",
        kind: Kind::Gauge,
        labels: &[],
        help: "Pages dropped to the zero page.",
        source: &["zero_pages"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.zero_pages.into()),
    },
    Family {
        name: "pagefold_dedup_merges",
        kind: Kind::Counter,
        labels: &[],
        help: "Pages merged onto a shared page.",
        source: &["merges"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.merges.into()),
    },
    Family {
        name: "pagefold_dedup_max_guest_pause_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Longest stop of the guests' vCPUs for a merge batch (0: never stopped); pagefold backend only.",
        source: &["max_guest_pause_us"],
        ksmd: None,
        rows: |s| {
            let us = s.dedup.as_ref()?.max_guest_pause_us?;
            one(Num::F(us as f64 / 1e6))
        },
    },
    Family {
        name: "pagefold_dedup_write_waits",
        kind: Kind::Counter,
        labels: &[],
        help: "Guest or device writes that waited for a merge in flight, once per merge window waited on; pagefold backend only.",
        source: &["write_waits"],
        ksmd: None,
        rows: |s| one(Num::U(s.dedup.as_ref()?.write_waits?)),
    },
    Family {
        name: "pagefold_dedup_write_wait_seconds",
        kind: Kind::Counter,
        labels: &[],
        help: "Time writers waited for merges in flight, in all; pagefold backend only.",
        source: &["write_wait_us"],
        ksmd: None,
        rows: |s| one(Num::F(s.dedup.as_ref()?.write_wait_us? as f64 / 1e6)),
    },
    Family {
        name: "pagefold_dedup_max_write_wait_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Longest wait of a writer for a merge in flight (0: none waited); pagefold backend only.",
        source: &["max_write_wait_us"],
        ksmd: None,
        rows: |s| one(Num::F(s.dedup.as_ref()?.max_write_wait_us? as f64 / 1e6)),
    },
    Family {
        name: "pagefold_dedup_cow_breaks",
        kind: Kind::Counter,
        labels: &[],
        help: "Merged pages given back a private copy on a write (KSM backend: host-wide, cow_ksm of /proc/vmstat).",
        source: &["cow_breaks"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.cow_breaks.into()),
    },
    Family {
        name: "pagefold_dedup_huge_pages_split",
        kind: Kind::Counter,
        labels: &[],
        help: "Transparent huge pages split before a merge replaced part of one.",
        source: &["huge_pages_split"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.huge_pages_split.into()),
    },
    Family {
        name: "pagefold_dedup_merges_by_origin",
        kind: Kind::Counter,
        labels: &["origin"],
        help: "pagefold engine: merges (zero drops included) by the rule that let each page merge: steady, second_look, first_sight, hinted.",
        source: &[
            "origins.merges.steady",
            "origins.merges.second_look",
            "origins.merges.first_sight",
            "origins.merges.hinted",
        ],
        ksmd: None,
        rows: |s| by_origin(s, |o| o.merges),
    },
    Family {
        name: "pagefold_dedup_cow_breaks_by_origin",
        kind: Kind::Counter,
        labels: &["origin"],
        help: "pagefold engine: copy-on-write breaks (zero-page refills included) by the rule that let the page merge.",
        source: &[
            "origins.cow_breaks.steady",
            "origins.cow_breaks.second_look",
            "origins.cow_breaks.first_sight",
            "origins.cow_breaks.hinted",
        ],
        ksmd: None,
        rows: |s| by_origin(s, |o| o.cow_breaks),
    },
    Family {
        name: "pagefold_dedup_zero_merges",
        kind: Kind::Counter,
        labels: &[],
        help: "pagefold engine: drops to the zero page (part of merges).",
        source: &["origins.zero_merges"],
        ksmd: None,
        rows: |s| pagefold_only(s, |d| d.origins.zero_merges.into()),
    },
    Family {
        name: "pagefold_dedup_zero_refills",
        kind: Kind::Counter,
        labels: &[],
        help: "pagefold engine: zero-dropped pages written again (part of cow_breaks).",
        source: &["origins.zero_refills"],
        ksmd: None,
        rows: |s| pagefold_only(s, |d| d.origins.zero_refills.into()),
    },
    Family {
        name: "pagefold_dedup_settle_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "pagefold engine: how long pages must stay unchanged before the scan merges them (0: one pass); follows how many merges the guests undo.",
        source: &["settle_ms"],
        ksmd: None,
        rows: |s| pagefold_only(s, |d| ms_to_s(d.settle_ms as f64)),
    },
    Family {
        name: "pagefold_dedup_settle_enabled",
        kind: Kind::Gauge,
        labels: &[],
        help: "pagefold engine: 1 while settling is on (the default), 0 while the scan keeps its full pace whatever the guests undo (setting settle).",
        source: &["settle"],
        ksmd: None,
        rows: |s| one(s.dedup.as_ref()?.settle?),
    },
    Family {
        name: "pagefold_dedup_merge_cpu_seconds",
        kind: Kind::Counter,
        labels: &[],
        help: "pagefold engine: of the engine's CPU, the time spent executing merges and zero drops.",
        source: &["merge_cpu_seconds"],
        ksmd: None,
        rows: |s| pagefold_only(s, |d| Num::F(d.merge_cpu_seconds)),
    },
    Family {
        name: "pagefold_dedup_pool_pages",
        kind: Kind::Gauge,
        labels: &[],
        help: "Pages of the shared pool in use.",
        source: &["pool_pages"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.pool_pages.into()),
    },
    Family {
        name: "pagefold_dedup_pool_vmas",
        kind: Kind::Gauge,
        labels: &[],
        help: "Kernel VMAs that pool mappings split guest RAM into.",
        source: &["vmas_created"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.vmas_created.into()),
    },
    Family {
        name: "pagefold_dedup_map_count_headroom",
        kind: Kind::Gauge,
        labels: &[],
        help: "Mappings left before vm.max_map_count.",
        source: &["map_count_headroom"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.map_count_headroom.into()),
    },
    Family {
        name: "pagefold_dedup_map_count_limited",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 while vm.max_map_count holds merging back.",
        source: &["map_count_limited"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.map_count_limited.into()),
    },
    Family {
        name: "pagefold_dedup_cpu_seconds",
        kind: Kind::Counter,
        labels: &[],
        help: "CPU time of the dedup threads (ksmd's while it assists included).",
        source: &["cpu_seconds"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.cpu_seconds.into()),
    },
    Family {
        name: "pagefold_dedup_saved_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Memory saved by sharing and by zero pages.",
        source: &["bytes_saved"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.bytes_saved.into()),
    },
    Family {
        name: "pagefold_dedup_metadata_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Memory the engine uses for its own metadata.",
        source: &["metadata_bytes"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.metadata_bytes.into()),
    },
    Family {
        name: "pagefold_dedup_profit_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Saved minus metadata and kernel VMA overhead (negative when dedup costs more than it saves).",
        source: &["profit_bytes"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.profit_bytes.into()),
    },
    Family {
        name: "pagefold_dedup_last_wakeup_age_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Time since the scanner last woke up (0: unknown or not yet).",
        source: &["last_wakeup_age_ms"],
        ksmd: None,
        rows: |s| dedup(s, |d| ms_to_s(d.last_wakeup_age_ms as f64)),
    },
    Family {
        name: "pagefold_dedup_wakeup_overdue",
        kind: Kind::Gauge,
        labels: &[],
        help: "1 while the engine judges a scanner wake-up overdue (stalled; GET /api/v1/health answers 503).",
        source: &["wakeup_overdue"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.wakeup_overdue.into()),
    },
    Family {
        name: "pagefold_dedup_ksm_assist_info",
        kind: Kind::Gauge,
        labels: &["state"],
        help: "Always 1; the label says what kernel KSM does for the engine (off, standby, engaged: ..., unavailable: ...).",
        source: &["ksm_assist"],
        ksmd: None,
        rows: |s| {
            s.dedup
                .as_ref()
                .filter(|d| !d.ksm_assist.is_empty())
                .map(|d| vec![(vec![d.ksm_assist.clone()], Num::U(1))])
        },
    },
    Family {
        name: "pagefold_dedup_ksm_assist_pages_sharing",
        kind: Kind::Gauge,
        labels: &[],
        help: "Of pages_sharing, the pages kernel KSM shares for the engine.",
        source: &["ksm_pages_sharing"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.ksm_pages_sharing.into()),
    },
    Family {
        name: "pagefold_dedup_ksm_assist_cpu_seconds",
        kind: Kind::Counter,
        labels: &[],
        help: "Of the dedup CPU time, ksmd's while it assisted the engine.",
        source: &["ksm_cpu_seconds"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.ksm_cpu_seconds.into()),
    },
    Family {
        name: "pagefold_dedup_io_hints",
        kind: Kind::Counter,
        labels: &[],
        help: "Disk reads reported to the engine as merge hints.",
        source: &["hints"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.hints.into()),
    },
    Family {
        name: "pagefold_dedup_io_hints_dropped",
        kind: Kind::Counter,
        labels: &[],
        help: "Hints dropped on a full queue (left to the regular scan).",
        source: &["hints_dropped"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.hints_dropped.into()),
    },
    Family {
        name: "pagefold_dedup_io_hint_merges",
        kind: Kind::Counter,
        labels: &[],
        help: "Merges made while visiting hinted pages.",
        source: &["hint_merges"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.hint_merges.into()),
    },
    Family {
        name: "pagefold_dedup_io_hint_merge_delay_seconds",
        kind: Kind::Gauge,
        labels: &[],
        help: "Mean delay from a hinted disk read to the merge it enabled.",
        source: &["hint_merge_delay_ms"],
        ksmd: None,
        rows: |s| dedup(s, |d| ms_to_s(d.hint_merge_delay_ms)),
    },
    Family {
        name: "pagefold_dedup_write_logged_regions",
        kind: Kind::Gauge,
        labels: &[],
        help: "Regions whose guest writes the engine reads from KVM's dirty log.",
        source: &["write_logged_regions"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.write_logged_regions.into()),
    },
    Family {
        name: "pagefold_dedup_clean_visits",
        kind: Kind::Counter,
        labels: &[],
        help: "Page visits the dirty log answered (no pagemap read, no hash).",
        source: &["clean_visits"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.clean_visits.into()),
    },
    Family {
        name: "pagefold_dedup_vm_pages_tracked",
        kind: Kind::Gauge,
        labels: &["vm", "group"],
        help: "Pages of the VM registered for deduplication.",
        source: &["per_owner.*.pages_tracked", "per_owner.*.group"],
        ksmd: None,
        rows: |s| per_owner(s, |o| o.pages_tracked),
    },
    Family {
        name: "pagefold_dedup_vm_pages_merged",
        kind: Kind::Gauge,
        labels: &["vm", "group"],
        help: "Pages of the VM mapped onto a shared page.",
        source: &["per_owner.*.pages_merged"],
        ksmd: None,
        rows: |s| per_owner(s, |o| o.pages_merged),
    },
    Family {
        name: "pagefold_dedup_vm_zero_pages",
        kind: Kind::Gauge,
        labels: &["vm", "group"],
        help: "Pages of the VM dropped to the zero page.",
        source: &["per_owner.*.zero_pages"],
        ksmd: None,
        rows: |s| per_owner(s, |o| o.zero_pages),
    },
    Family {
        name: "pagefold_dedup_vm_saved_bytes",
        kind: Kind::Gauge,
        labels: &["vm", "group"],
        help: "Memory saved in the VM.",
        source: &["per_owner.*.bytes_saved"],
        ksmd: None,
        rows: |s| per_owner(s, |o| o.bytes_saved),
    },
    Family {
        name: "pagefold_dedup_vm_cow_breaks",
        kind: Kind::Counter,
        labels: &["vm", "group"],
        help: "Merges of the VM's pages its writes broke (copy-on-write); pagefold backend only.",
        source: &["per_owner.*.cow_breaks"],
        ksmd: None,
        rows: |s| per_owner_some(s, |o| o.cow_breaks),
    },
    Family {
        name: "pagefold_dedup_vm_reported_pages",
        kind: Kind::Counter,
        labels: &["vm", "group"],
        help: "Pages the VM gave back to the host (balloon, free page reporting), every page of every report.",
        source: &["per_owner.*.pages_reported"],
        ksmd: None,
        rows: |s| per_owner(s, |o| o.pages_reported),
    },
    Family {
        name: "pagefold_dedup_vm_returned_pages",
        kind: Kind::Gauge,
        labels: &["vm", "group"],
        help: "Pages the VM gave back and has not used since (neither merged nor zero pages); pagefold backend only.",
        source: &["per_owner.*.pages_returned"],
        ksmd: None,
        rows: |s| per_owner_some(s, |o| o.pages_returned),
    },
    Family {
        name: "pagefold_dedup_reported_pages",
        kind: Kind::Counter,
        labels: &[],
        help: "Pages the VMs gave back to the host (balloon, free page reporting).",
        source: &["pages_reported"],
        ksmd: None,
        rows: |s| dedup(s, |d| d.pages_reported.into()),
    },
    Family {
        name: "pagefold_dedup_returned_pages",
        kind: Kind::Gauge,
        labels: &[],
        help: "Pages given back and not used since; pagefold backend only.",
        source: &["pages_returned"],
        ksmd: None,
        rows: |s| dedup_some(s, |d| d.pages_returned),
    },
    Family {
        name: "pagefold_dedup_auto_merging",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: 1 while merging (memory below the trigger line, or sustained pressure, until above the stop line).",
        source: &["auto.auto_triggered"],
        ksmd: None,
        rows: |s| auto(s, |a| a.auto_triggered.into()),
    },
    Family {
        name: "pagefold_dedup_auto_triggers",
        kind: Kind::Counter,
        labels: &[],
        help: "Auto mode: times merging started.",
        source: &["auto.triggered_times"],
        ksmd: None,
        rows: |s| auto(s, |a| a.triggered_times.into()),
    },
    Family {
        name: "pagefold_dedup_auto_threshold_ratio",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: the trigger line as a share of host memory.",
        source: &["auto.threshold_pct"],
        ksmd: None,
        rows: |s| auto(s, |a| Num::F(a.threshold_pct as f64 / 100.0)),
    },
    Family {
        name: "pagefold_dedup_auto_trigger_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: merging starts when the memory signal drops below this.",
        source: &["auto.trigger_bytes"],
        ksmd: None,
        rows: |s| auto(s, |a| a.trigger_bytes.into()),
    },
    Family {
        name: "pagefold_dedup_auto_stop_bytes",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: merging stops when the memory signal rises above this.",
        source: &["auto.stop_bytes"],
        ksmd: None,
        rows: |s| auto(s, |a| a.stop_bytes.into()),
    },
    Family {
        name: "pagefold_dedup_auto_host_memory_bytes",
        kind: Kind::Gauge,
        labels: &["kind"],
        help: "Auto mode: host memory at its last sample (total, free, available).",
        source: &["auto.total_bytes", "auto.free_bytes", "auto.available_bytes", "auto.memory_signal"],
        ksmd: None,
        rows: |s| {
            s.dedup.as_ref().and_then(|d| d.auto.as_ref()).map(|a| {
                [
                    ("total", a.total_bytes),
                    ("free", a.free_bytes),
                    ("available", a.available_bytes),
                ]
                .into_iter()
                .map(|(k, v)| (vec![k.to_string()], Num::U(v)))
                .collect()
            })
        },
    },
    Family {
        name: "pagefold_dedup_auto_memory_pressure_ratio",
        kind: Kind::Gauge,
        labels: &["kind", "window"],
        help: "Auto mode: memory pressure stall information (PSI), share of wall time; absent without PSI.",
        source: &["auto.psi.some_avg10", "auto.psi.some_avg60", "auto.psi.full_avg10", "auto.psi.full_avg60"],
        ksmd: None,
        rows: |s| {
            let p = s.dedup.as_ref()?.auto.as_ref()?.psi.as_ref()?;
            Some(
                [
                    ("some", "10s", p.some_avg10),
                    ("some", "60s", p.some_avg60),
                    ("full", "10s", p.full_avg10),
                    ("full", "60s", p.full_avg60),
                ]
                .into_iter()
                .map(|(k, w, v)| (vec![k.to_string(), w.to_string()], Num::F(v / 100.0)))
                .collect(),
            )
        },
    },
    Family {
        name: "pagefold_dedup_auto_psi_pressure",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: 1 while sustained memory pressure counts as a reason to merge.",
        source: &["auto.psi_pressure"],
        ksmd: None,
        rows: |s| auto(s, |a| a.psi_pressure.into()),
    },
    Family {
        name: "pagefold_dedup_auto_scanning_factor",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: multiplier of pages_to_scan for the next merging wake-up.",
        source: &["auto.scanning_factor"],
        ksmd: None,
        rows: |s| auto(s, |a| a.scanning_factor.into()),
    },
    Family {
        name: "pagefold_dedup_auto_max_scanning_factor",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: the configured cap of the scanning factor.",
        source: &["auto.max_scanning_factor"],
        ksmd: None,
        rows: |s| auto(s, |a| a.max_scanning_factor.into()),
    },
    Family {
        name: "pagefold_dedup_auto_effective_max_scanning_factor",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: the cap applied (also bounded by host pages / pages_to_scan).",
        source: &["auto.effective_max_scanning_factor"],
        ksmd: None,
        rows: |s| auto(s, |a| a.effective_max_scanning_factor.into()),
    },
    Family {
        name: "pagefold_dedup_auto_rounds",
        kind: Kind::Counter,
        labels: &[],
        help: "Auto mode: wake-ups planned.",
        source: &["auto.rounds"],
        ksmd: None,
        rows: |s| auto(s, |a| a.rounds.into()),
    },
    Family {
        name: "pagefold_dedup_auto_merge_rounds",
        kind: Kind::Counter,
        labels: &[],
        help: "Auto mode: wake-ups allowed to merge.",
        source: &["auto.triggered_rounds"],
        ksmd: None,
        rows: |s| auto(s, |a| a.triggered_rounds.into()),
    },
    Family {
        name: "pagefold_dedup_auto_last_plan_pages",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: pages its last plan allowed to scan.",
        source: &["auto.last_plan_pages"],
        ksmd: None,
        rows: |s| auto(s, |a| a.last_plan_pages.into()),
    },
    Family {
        name: "pagefold_dedup_auto_last_plan_merge",
        kind: Kind::Gauge,
        labels: &[],
        help: "Auto mode: 1 if its last plan allowed merging.",
        source: &["auto.last_plan_merge"],
        ksmd: None,
        rows: |s| auto(s, |a| a.last_plan_merge.into()),
    },
    Family {
        name: "pagefold_dedup_auto_sample_errors",
        kind: Kind::Counter,
        labels: &[],
        help: "Auto mode: failed memory samples (the previous one is reused).",
        source: &["auto.sample_errors", "auto.last_error"],
        ksmd: None,
        rows: |s| auto(s, |a| a.sample_errors.into()),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn repo_file(rel: &str) -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/..").to_string() + "/" + rel;
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// docs/metrics.md holds exactly the catalogue's table, between its
    /// markers: the documentation cannot drift from the code.
    #[test]
    fn docs_table_is_the_catalogue() {
        let doc = repo_file("docs/metrics.md");
        let (begin, end) = (
            "<!-- metrics-table:begin -->\n",
            "<!-- metrics-table:end -->",
        );
        let start = doc.find(begin).expect("begin marker") + begin.len();
        let stop = doc.find(end).expect("end marker");
        let want = super::super::doc_table::markdown_table();
        assert!(
            doc[start..stop] == want,
            "docs/metrics.md's table differs from api/src/metrics/catalogue.rs; it should be:\n{want}"
        );
    }

    /// Prometheus' naming rules: unique names with a known prefix, base
    /// units only, counters' samples end in `_total` and nothing else
    /// does, KSM figures under node_exporter's names.
    #[test]
    fn names_follow_the_conventions() {
        let mut seen = BTreeSet::new();
        for f in FAMILIES {
            let n = f.name;
            assert!(seen.insert(n), "{n} twice");
            assert!(
                n.starts_with("pagefold_") || n.starts_with("process_"),
                "{n}"
            );
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{n}"
            );
            assert!(!n.ends_with("_total"), "{n}: the encoder adds _total");
            for bad in ["_ms", "_millis", "_pct", "_percent", "_kb", "_mb", "_mib"] {
                assert!(
                    !n.contains(&format!("{bad}_")) && !n.ends_with(bad),
                    "{n}: not a base unit"
                );
            }
            assert!(
                !n.contains("bytes_") || n.ends_with("_bytes") || n.contains("bytes_per"),
                "{n}: the unit goes last"
            );
            assert!(
                !f.help.is_empty() && f.help.ends_with('.'),
                "{n}: {}",
                f.help
            );
            assert!(!f.help.contains("statistic"), "{n}: placeholder help");
            if let Some(k) = f.ksmd {
                let own = k.strip_prefix("node_ksmd_").unwrap();
                assert!(
                    f.sample_name() == format!("pagefold_dedup_{own}") || own == "run",
                    "{n} should be pagefold_dedup_{own}"
                );
            }
            // Repeated words (auto_auto_...) say nothing twice.
            let words: Vec<&str> = n.split('_').collect();
            assert!(words.windows(2).all(|w| w[0] != w[1]), "{n}");
        }
    }

    /// The example rules file uses only metrics that exist.
    #[test]
    fn rules_file_names_only_exported_metrics() {
        let rules = repo_file("scripts/prometheus/pagefold.rules.yml");
        let samples: BTreeSet<String> = FAMILIES.iter().map(Family::sample_name).collect();
        let mut used = 0;
        for line in rules.lines().filter(|l| !l.trim_start().starts_with('#')) {
            for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
                if word.starts_with("pagefold_") && !word.contains(':') {
                    assert!(
                        samples.contains(word),
                        "the rules use {word}, which is not exported"
                    );
                    used += 1;
                }
            }
        }
        assert!(used >= 8, "{used}");
    }
}
