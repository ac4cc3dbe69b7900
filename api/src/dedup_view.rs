//! The `GET /dedup` body as a type: every statistic of the backend (the
//! engine's [`Stats`], KSM's names where KSM has the figure), the knobs and
//! their valid ranges, and auto mode's status and settings when the backend
//! has a controller. The handlers serialize it, the CLI reads it, the
//! metrics are built from it and the OpenAPI spec describes it.
//!
//! It copies the engine's types field by field rather than wrapping them:
//! the engine crate stays free of API concerns (serde shapes, schemas), and
//! a test fails when `Stats` gains a field this view lacks.

use std::collections::BTreeMap;

use pagefold_dedup::auto::{AutoConfig, AutoStatus, MemorySignal, Psi};
use pagefold_dedup::OwnerStats;
use pagefold_dedup::{Knobs, Mode, Stats};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every statistic of the backend (KSM's names where KSM has the figure;
/// see docs/api.md), its knobs and their ranges, and auto mode's status and
/// settings when the backend has an auto-mode controller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = DedupStatus)]
pub struct DedupView {
    pub backend: String,
    pub mode: Mode,
    pub knobs: Knobs,
    pub limits: KnobLimits,
    /// Shared pages in use (mapped at least twice).
    pub pages_shared: u64,
    /// Extra sites mapping a shared page: pages saved by sharing.
    pub pages_sharing: u64,
    pub pages_unshared: u64,
    pub pages_volatile: u64,
    pub zero_pages: u64,
    pub full_scans: u64,
    pub merges: u64,
    pub cow_breaks: u64,
    /// pagefold engine: longest stop of the guests' vCPUs for a merge
    /// batch, microseconds (0: never stopped). Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_guest_pause_us: Option<u64>,
    /// pagefold engine: guest or device writes that waited for a merge in
    /// flight (once per merge window waited on); a waiting vCPU takes no
    /// interrupt. Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub write_waits: Option<u64>,
    /// pagefold engine: those waits in all, microseconds. Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub write_wait_us: Option<u64>,
    /// pagefold engine: the longest of those waits, microseconds. Absent
    /// for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_write_wait_us: Option<u64>,
    pub pool_pages: u64,
    pub vmas_created: u64,
    pub map_count_headroom: u64,
    pub map_count_limited: bool,
    #[schema(minimum = 0)]
    pub cpu_seconds: f64,
    pub bytes_saved: u64,
    pub metadata_bytes: u64,
    /// Saved minus engine metadata and kernel VMA overhead (may be negative).
    pub profit_bytes: i64,
    /// Milliseconds since the scanner last woke up (0 when the backend does
    /// not know, e.g. KSM, or has not woken yet).
    pub last_wakeup_age_ms: u64,
    /// The engine's own judgement that a scanner wake-up is overdue
    /// (GET /health then answers 503).
    pub wakeup_overdue: bool,
    /// pagefold engine: kernel KSM assisting a group whose duplicates are
    /// scattered: off, standby, engaged: group G (scanning|paused), or
    /// unavailable: reason (docs/engine.md). Empty for KSM.
    pub ksm_assist: String,
    /// Of pages_sharing, pages shared by kernel KSM for the engine (counted
    /// from frames).
    pub ksm_pages_sharing: u64,
    /// Of cpu_seconds, ksmd's CPU while it assisted.
    #[schema(minimum = 0)]
    pub ksm_cpu_seconds: f64,
    /// I/O hints received (virtio-blk reads reported to the engine).
    pub hints: u64,
    /// Hints dropped because the queue was full (left to the regular scan).
    pub hints_dropped: u64,
    /// Merges made while visiting hinted pages.
    pub hint_merges: u64,
    /// Mean delay from a hint (the device fill) to the merge it enabled.
    #[schema(minimum = 0)]
    pub hint_merge_delay_ms: f64,
    /// Regions whose guest writes the engine reads from KVM's dirty log.
    #[serde(default)]
    pub write_logged_regions: u64,
    /// Due page visits the dirty log answered (no pagemap read, no hash).
    #[serde(default)]
    pub clean_visits: u64,
    /// Transparent huge pages of guest RAM split before a merge replaced
    /// part of one (so that the merged part is freed at once).
    #[serde(default)]
    pub huge_pages_split: u64,
    /// pagefold engine: merges and copy-on-write breaks by the rule that
    /// let each page merge (docs/engine.md, "Settling"). Zero for KSM.
    #[serde(default)]
    pub origins: OriginsView,
    /// pagefold engine: how long pages must stay unchanged before the scan
    /// merges them, in milliseconds (0: one pass); follows how many of its
    /// merges the guests undo.
    #[serde(default)]
    pub settle_ms: u64,
    /// pagefold engine: settling on (the default) or off (`PATCH /dedup
    /// {"settle": false}`: full pace whatever the guests undo, `settle_ms`
    /// 0). Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub settle: Option<bool>,
    /// pagefold engine: of `cpu_seconds`, the time spent executing merges
    /// and zero drops.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub merge_cpu_seconds: f64,
    /// Pages the VMs gave back (a balloon's inflated pages, free page
    /// reporting) since the backend started, every page of every report.
    #[serde(default)]
    pub pages_reported: u64,
    /// pagefold engine: pages given back and not seen mapped since (absent:
    /// neither merged nor zero pages). Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pages_returned: Option<u64>,
    /// Per-VM figures, by VM name.
    pub per_owner: BTreeMap<String, OwnerView>,
    /// Auto mode's controller status (when the backend has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub auto: Option<AutoView>,
    /// Auto mode's settings (when the backend has a controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub auto_config: Option<AutoConfigView>,
}

/// An inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl From<(u64, u64)> for Range {
    fn from((min, max): (u64, u64)) -> Range {
        Range { min, max }
    }
}

/// Each knob's valid range, for clients to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KnobLimits {
    pub pages_to_scan: Range,
    pub sleep_millisecs: Range,
    pub max_page_sharing: Range,
}

impl KnobLimits {
    pub fn new() -> KnobLimits {
        KnobLimits {
            pages_to_scan: Knobs::PAGES_TO_SCAN.into(),
            sleep_millisecs: Knobs::SLEEP_MILLISECS.into(),
            max_page_sharing: Knobs::MAX_PAGE_SHARING.into(),
        }
    }
}

impl Default for KnobLimits {
    fn default() -> Self {
        KnobLimits::new()
    }
}

/// One VM's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = OwnerStats)]
pub struct OwnerView {
    pub group: String,
    pub pages_tracked: u64,
    /// Pages of the VM mapped onto a shared page.
    pub pages_merged: u64,
    /// Pages of the VM dropped to the zero page.
    pub zero_pages: u64,
    pub bytes_saved: u64,
    /// Merges of the VM's pages its writes broke (copy-on-write); absent
    /// for the KSM backend, which counts them host-wide only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cow_breaks: Option<u64>,
    /// Pages the VM gave back (balloon, free page reporting) since it
    /// registered.
    #[serde(default)]
    pub pages_reported: u64,
    /// pagefold engine: the VM's pages given back and not seen mapped
    /// since. Absent for KSM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pages_returned: Option<u64>,
}

/// Memory pressure stall information, percent of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PsiView {
    pub some_avg10: f64,
    pub some_avg60: f64,
    pub full_avg10: f64,
    pub full_avg60: f64,
}

/// Auto mode's controller, as of its last plan (dedup/src/auto/status.rs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = AutoStatus)]
pub struct AutoView {
    /// Merging is on (memory below the trigger line, or sustained PSI
    /// pressure) until memory is above the stop line.
    pub auto_triggered: bool,
    /// Multiplier of `pages_to_scan` for the next triggered wake-up.
    pub scanning_factor: u64,
    /// Times auto mode went from untriggered to triggered.
    pub triggered_times: u64,
    pub threshold_pct: u64,
    /// Configured cap of the factor.
    pub max_scanning_factor: u64,
    /// Cap applied: also bounded by total RAM pages / pages_to_scan.
    pub effective_max_scanning_factor: u64,
    /// Merging starts when the memory signal drops below this.
    pub trigger_bytes: u64,
    /// Merging stops when the memory signal rises above this.
    pub stop_bytes: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub available_bytes: u64,
    pub memory_signal: MemorySignal,
    /// Null when the kernel offers no PSI.
    #[schema(required = true)]
    pub psi: Option<PsiView>,
    /// Sustained PSI pressure counts as a reason to merge.
    pub psi_pressure: bool,
    /// Wake-ups planned so far.
    pub rounds: u64,
    /// Of those, wake-ups allowed to merge.
    pub triggered_rounds: u64,
    /// `pages_to_scan` seen in the last plan.
    pub pages_to_scan: u64,
    pub last_plan_pages: u64,
    pub last_plan_merge: bool,
    /// Failed memory samples (the previous sample is then reused).
    pub sample_errors: u64,
    #[schema(required = true)]
    pub last_error: Option<String>,
}

/// Auto mode's settings, as `PATCH /dedup` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = AutoConfig)]
pub struct AutoConfigView {
    #[schema(maximum = 100)]
    pub auto_threshold: u64,
    #[schema(minimum = 1)]
    pub max_scanning_factor: u64,
    pub memory_signal: MemorySignal,
}

impl From<&OwnerStats> for OwnerView {
    fn from(o: &OwnerStats) -> OwnerView {
        OwnerView {
            group: o.group.clone(),
            pages_tracked: o.pages_tracked,
            pages_merged: o.pages_merged,
            zero_pages: o.zero_pages,
            bytes_saved: o.bytes_saved,
            cow_breaks: o.cow_breaks,
            pages_reported: o.pages_reported,
            pages_returned: o.pages_returned,
        }
    }
}

impl From<Psi> for PsiView {
    fn from(p: Psi) -> PsiView {
        PsiView {
            some_avg10: p.some_avg10,
            some_avg60: p.some_avg60,
            full_avg10: p.full_avg10,
            full_avg60: p.full_avg60,
        }
    }
}

impl From<AutoStatus> for AutoView {
    fn from(s: AutoStatus) -> AutoView {
        AutoView {
            auto_triggered: s.auto_triggered,
            scanning_factor: s.scanning_factor,
            triggered_times: s.triggered_times,
            threshold_pct: s.threshold_pct,
            max_scanning_factor: s.max_scanning_factor,
            effective_max_scanning_factor: s.effective_max_scanning_factor,
            trigger_bytes: s.trigger_bytes,
            stop_bytes: s.stop_bytes,
            total_bytes: s.total_bytes,
            free_bytes: s.free_bytes,
            available_bytes: s.available_bytes,
            memory_signal: s.memory_signal,
            psi: s.psi.map(PsiView::from),
            psi_pressure: s.psi_pressure,
            rounds: s.rounds,
            triggered_rounds: s.triggered_rounds,
            pages_to_scan: s.pages_to_scan,
            last_plan_pages: s.last_plan_pages,
            last_plan_merge: s.last_plan_merge,
            sample_errors: s.sample_errors,
            last_error: s.last_error,
        }
    }
}

impl From<AutoConfig> for AutoConfigView {
    fn from(c: AutoConfig) -> AutoConfigView {
        AutoConfigView {
            auto_threshold: c.threshold_pct,
            max_scanning_factor: c.max_scanning_factor,
            memory_signal: c.memory_signal,
        }
    }
}

impl DedupView {
    /// The view of `stats`; `knobs` fills in when the statistics carry
    /// none, `auto` is the controller's status and settings if there is one.
    pub fn new(stats: Stats, knobs: Knobs, auto: Option<(AutoStatus, AutoConfig)>) -> DedupView {
        let (auto, auto_config) = match auto {
            Some((s, c)) => (Some(s.into()), Some(c.into())),
            None => (None, None),
        };
        DedupView {
            backend: stats.backend,
            mode: stats.mode,
            knobs: stats.knobs.unwrap_or(knobs),
            limits: KnobLimits::new(),
            pages_shared: stats.pages_shared,
            pages_sharing: stats.pages_sharing,
            pages_unshared: stats.pages_unshared,
            pages_volatile: stats.pages_volatile,
            zero_pages: stats.zero_pages,
            full_scans: stats.full_scans,
            merges: stats.merges,
            cow_breaks: stats.cow_breaks,
            max_guest_pause_us: stats.max_guest_pause_us,
            write_waits: stats.write_waits,
            write_wait_us: stats.write_wait_us,
            max_write_wait_us: stats.max_write_wait_us,
            pool_pages: stats.pool_pages,
            vmas_created: stats.vmas_created,
            map_count_headroom: stats.map_count_headroom,
            map_count_limited: stats.map_count_limited,
            cpu_seconds: stats.cpu_seconds,
            bytes_saved: stats.bytes_saved,
            metadata_bytes: stats.metadata_bytes,
            profit_bytes: stats.profit_bytes,
            last_wakeup_age_ms: stats.last_wakeup_age_ms,
            wakeup_overdue: stats.wakeup_overdue,
            ksm_assist: stats.ksm_assist,
            ksm_pages_sharing: stats.ksm_pages_sharing,
            ksm_cpu_seconds: stats.ksm_cpu_seconds,
            hints: stats.hints,
            hints_dropped: stats.hints_dropped,
            hint_merges: stats.hint_merges,
            hint_merge_delay_ms: stats.hint_merge_delay_ms,
            write_logged_regions: stats.write_logged_regions,
            clean_visits: stats.clean_visits,
            huge_pages_split: stats.huge_pages_split,
            origins: stats.origins.into(),
            settle_ms: stats.settle_ms,
            settle: stats.settle,
            merge_cpu_seconds: stats.merge_cpu_seconds,
            pages_reported: stats.pages_reported,
            pages_returned: stats.pages_returned,
            per_owner: stats
                .per_owner
                .iter()
                .map(|(k, v)| (k.clone(), v.into()))
                .collect(),
            auto,
            auto_config,
        }
    }
}

/// Counts by the rule that let a page merge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ByOriginView {
    /// Unchanged since its previous visit a pass earlier.
    pub steady: u64,
    /// Changed at its visit, then unwritten for the settle time (at least
    /// one write-log interval).
    pub second_look: u64,
    /// At first sight: a join of an existing slot, a run of one pattern.
    pub first_sight: u64,
    /// Filled by a device just before (I/O hints).
    pub hinted: u64,
}

impl From<pagefold_dedup::ByOrigin> for ByOriginView {
    fn from(b: pagefold_dedup::ByOrigin) -> Self {
        ByOriginView {
            steady: b.steady,
            second_look: b.second_look,
            first_sight: b.first_sight,
            hinted: b.hinted,
        }
    }
}

/// The engine's merges and the copy-on-write breaks that undid them, by
/// the rule that let each page merge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OriginsView {
    /// Merges since the start (zero drops included).
    pub merges: ByOriginView,
    /// Copy-on-write breaks since the start, by the origin of the merge
    /// they undid (zero-page refills included).
    pub cow_breaks: ByOriginView,
    /// Of `merges`, drops to the zero page.
    pub zero_merges: u64,
    /// Of `cow_breaks`, zero-dropped pages written again.
    pub zero_refills: u64,
}

impl From<pagefold_dedup::MergeOrigins> for OriginsView {
    fn from(o: pagefold_dedup::MergeOrigins) -> Self {
        OriginsView {
            merges: o.merges.into(),
            cow_breaks: o.cow_breaks.into(),
            zero_merges: o.zero_merges,
            zero_refills: o.zero_refills,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::auto_status;
    use serde_json::Value;

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    /// Every field of the engine's statistics (and of auto mode's status)
    /// reaches the view: a field added there and not here fails this.
    #[test]
    fn the_view_has_every_engine_field() {
        let knobs = pagefold_dedup::DEFAULT_KNOBS;
        let view = serde_json::to_value(DedupView::new(Stats::default(), knobs, None)).unwrap();
        for k in keys(&serde_json::to_value(Stats::default()).unwrap()) {
            assert!(
                view.get(&k).is_some(),
                "Stats field {k} missing in the view"
            );
        }
        let owner = serde_json::to_value(OwnerStats::default()).unwrap();
        let owner_view = serde_json::to_value(OwnerView::from(&OwnerStats::default())).unwrap();
        assert_eq!(keys(&owner), keys(&owner_view));
        let status = auto_status();
        let auto = serde_json::to_value(&status).unwrap();
        let auto_view = serde_json::to_value(AutoView::from(status)).unwrap();
        assert_eq!(auto, auto_view, "AutoView must serialize like AutoStatus");
    }

    #[test]
    fn knobs_and_auto_are_filled_in() {
        let knobs = pagefold_dedup::DEFAULT_KNOBS;
        let v = DedupView::new(Stats::default(), knobs, None);
        assert_eq!(v.knobs, knobs);
        assert_eq!(v.limits.pages_to_scan.max, 1 << 24);
        let json = serde_json::to_value(&v).unwrap();
        assert!(json.get("auto").is_none() && json.get("auto_config").is_none());
        let cfg = AutoConfig::default();
        let status = auto_status();
        let v = DedupView::new(Stats::default(), knobs, Some((status, cfg)));
        let c = v.auto_config.unwrap();
        assert_eq!(c.auto_threshold, cfg.threshold_pct);
        assert_eq!(c.memory_signal, cfg.memory_signal);
        // Shown under the names `PATCH /dedup` takes.
        let patch = pagefold_dedup::DedupSettings {
            auto_threshold: Some(c.auto_threshold),
            max_scanning_factor: Some(c.max_scanning_factor),
            memory_signal: Some(c.memory_signal),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            serde_json::to_value(patch).unwrap()
        );
        let back: DedupView = serde_json::from_value(serde_json::to_value(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }
}
