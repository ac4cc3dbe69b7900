//! KSM assist: the kernel's KSM merges what the engine's VMA budget cannot.
//!
//! The engine merges by mapping pool pages over guest pages, so a merge
//! costs a VMA unless it extends a run of consecutive pool slots. When
//! identical pages sit at unrelated addresses (two guests caching the same
//! file in frames their allocators chose), every merge is its own VMA and
//! `vm.max_map_count` caps the saving at a fraction of what KSM reaches. KSM
//! shares anonymous pages at any address without a VMA each, so once the
//! engine sees that a group's duplicates are scattered (many new VMAs for
//! few pages) or out of VMA budget, it hands that group's regions to KSM:
//!
//! * **Never both on one page** (docs/merge-races.md §16): KSM drops
//!   the uffd-wp bit of a page it merges, so a page the engine holds
//!   write-protected could lose its protection and a guest write be lost.
//!   A region is therefore either the engine's or KSM's: the engine stops
//!   merging in it (between spans, when no page is protected) *before* it
//!   becomes `MADV_MERGEABLE`, and it is made `MADV_UNMERGEABLE` (which
//!   waits for ksmd through the mmap lock) before the engine protects any
//!   of its pages again (unmerge, unregister).
//! * **One group at a time**: KSM has no notion of groups and would merge
//!   across them, so only one group (the first that needs it) is assisted.
//! * **One driver of KSM per host**: the engine takes the cooperative KSM
//!   lock (`ksm::try_ksm_flock`), or its creator says it holds it for the
//!   engine (`AssistConfig::lock_held`); if another pagefold process or
//!   test drives KSM, the assist stays off and says why.
//! * **KSM runs at the engine's pace, then idles**: `pages_to_scan` and
//!   `sleep_millisecs` follow the engine's knobs (times the auto factor);
//!   each KSM full scan that merges nothing more doubles the sleep, up to
//!   1 s; while the engine's scan is settled (its guests undo merges),
//!   KSM runs without the boost and a full scan of the group takes at
//!   least the settle time, as the engine's passes do;
//!   `run` goes back to its original value whenever the engine does not
//!   merge (mode off, auto untriggered). Every knob is restored when the
//!   assist ends, and every change is journaled first (`ksm::journal`), so
//!   a `kill -9` is undone by the next pagefold that uses KSM.
//! * **No smart scan while assisting**: KSM keeps a process's rmap items,
//!   with their smart-scan ages, after the memory is unmapped, until ksmd
//!   next scans the process, and memory mapped at the same address (the
//!   next VM's RAM, where the kernel hands out a freed range again)
//!   inherits them: KSM skipped such pages for many full scans
//!   (scripts/probes/ksm_stale_rmap.c). `smart_scan` is 0 while the assist
//!   drives KSM, restored with the other knobs.
//! * **Honest figures**: the engine counts the KSM sharing of its own
//!   regions from their PFNs (a frame mapped k times in our regions saves
//!   k - 1 pages), KSM's metadata (`ksm_rmap_items` x 64 B) against the
//!   profit, and ksmd's CPU while assisting in the engine's CPU.

use std::fmt;
use std::fs::File;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ksm::{self, KsmSysfs};

/// Size of the kernel's `struct ksm_rmap_item` on 64-bit (KSM's own profit
/// figure uses it): one per page KSM scans.
pub const RMAP_ITEM_BYTES: u64 = 64;

/// KSM's pace while converging, in multiples of the engine's.
pub const CONVERGE_BOOST: u64 = 4;

/// How long after a failed attempt the assist tries again.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest sleep KSM backs off to while it finds nothing more.
pub const MAX_IDLE_SLEEP_MS: u64 = 1000;

/// KSM full scans in a row without new merges after which it counts as
/// idle. KSM merges a new page in its second whole scan of it (the first
/// records its checksum), and the first full scan counted after new work
/// may have begun before it, covering only part of the new pages: three
/// counts without merges are two whole scans. (With two, KSM went idle
/// between a partial scan and its checksum scan in one start of four, and
/// merged a 1 GiB group at the idle pace: 65 s instead of 5.)
pub const IDLE_SCANS: u32 = 3;

/// A KSM sysfs or procfs access in [`KsmAssist::drive`] this long is
/// logged: the engine holds its core through it, and VM creation and
/// deletion wait meanwhile.
const SLOW_KSM_ACCESS: std::time::Duration = std::time::Duration::from_millis(50);

/// Most pages ksmd is asked to scan per batch. ksmd holds its thread mutex
/// through a whole batch, and writing `run` (pausing KSM, restoring its
/// knobs) waits for that mutex while the engine holds its core, with VM
/// creation and deletion waiting behind it: a batch must stay short enough
/// that such a write waits tens of milliseconds, not seconds, whatever the
/// engine's pace (its pages per wake-up times `CONVERGE_BOOST` would be one
/// batch otherwise). This is below KSM's own "max effort" batch of 10,000
/// pages.
pub const KSM_BATCH_MAX: u64 = 8192;

/// KSM's `pages_to_scan` and `sleep_millisecs` for a pace of `pages` every
/// `sleep_ms`: at most `KSM_BATCH_MAX` pages a batch, the sleep cut in
/// proportion (rounded down: never slower than asked).
pub fn ksm_pace(pages: u64, sleep_ms: u64) -> (u64, u64) {
    if pages <= KSM_BATCH_MAX {
        return (pages, sleep_ms);
    }
    (
        KSM_BATCH_MAX,
        sleep_ms.saturating_mul(KSM_BATCH_MAX) / pages,
    )
}

/// KSM's `pages_to_scan` and `sleep_millisecs` while it assists, after
/// `idle_scans` full scans in a row that merged nothing more, at the
/// engine's pace of `pages` every `sleep_ms`:
/// * while it still finds work (its first scans of a handed-over group),
///   `CONVERGE_BOOST` times the engine's pace: its work is the
///   same either way (two scans of the group), only sooner. Not while the
///   engine is settled: the guests undo merges, and KSM's passes then keep
///   to the settle time as the engine's do (in a Linux build handed over,
///   KSM at the boosted pace took a whole CPU for the build's length);
/// * once `IDLE_SCANS` scans in a row merged nothing, the pace of an idle
///   engine at once:
///   `pages` every `MAX_IDLE_SLEEP_MS`. KSM's own work on unique pages is
///   what costs CPU once everything is merged, and doubling the sleep per
///   idle full scan instead kept it scanning a 1 GiB group at up to six
///   times the idle pace for about 80 s, above what KSM at its defaults
///   spends on the same memory.
///
/// New work (`KsmAssist::new_work`) or a scan that merges brings back the
/// converging pace.
pub fn assist_pace(
    idle_scans: u32,
    pages: u64,
    sleep_ms: u64,
    settle: std::time::Duration,
    group_pages: u64,
) -> (u64, u64) {
    let idle = idle_scans >= IDLE_SCANS;
    let sleep = if idle {
        MAX_IDLE_SLEEP_MS.max(sleep_ms)
    } else {
        sleep_ms
    };
    let pages = if !idle && settle.is_zero() {
        pages.saturating_mul(CONVERGE_BOOST)
    } else {
        pages
    };
    let sleep = sleep.max(settled_sleep_ms(pages, settle, group_pages));
    ksm_pace(pages.clamp(1, u32::MAX as u64), sleep)
}

/// The least sleep between KSM batches of `pages` for a full scan of
/// `group_pages` to take `settle` (0 when it is 0): while the engine's scan
/// is settled (its guests undo its merges), KSM, like the engine's passes,
/// looks at each page no more often than once per settle time, so its
/// checksum rule merges only pages unchanged that long.
pub fn settled_sleep_ms(pages: u64, settle: std::time::Duration, group_pages: u64) -> u64 {
    let batches = group_pages.div_ceil(pages.max(1)).max(1);
    let settle_ms = u64::try_from(settle.as_millis()).unwrap_or(u64::MAX);
    settle_ms.div_ceil(batches)
}

/// Runs `f`, logging it as `what` when it took `SLOW_KSM_ACCESS` or more.
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let v = f();
    if t.elapsed() >= SLOW_KSM_ACCESS {
        log::info!("KSM assist: {what} took {:?}", t.elapsed());
    }
    v
}

/// Whether the engine may hand scattered groups to kernel KSM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssistMode {
    /// Never: scattered merges stop at the VMA budget.
    #[default]
    Off,
    /// When a group's layout is scattered or out of VMA budget.
    Auto,
}

impl fmt::Display for AssistMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AssistMode::Off => "off",
            AssistMode::Auto => "auto",
        })
    }
}

/// An unknown assist mode.
#[derive(Debug, thiserror::Error)]
#[error("unknown ksm_assist {0:?} (expected off or auto)")]
pub struct ParseAssistModeError(pub String);

impl FromStr for AssistMode {
    type Err = ParseAssistModeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(AssistMode::Off),
            "auto" => Ok(AssistMode::Auto),
            other => Err(ParseAssistModeError(other.to_string())),
        }
    }
}

/// When a group counts as scattered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssistConfig {
    /// Whether the assist may engage at all.
    pub mode: AssistMode,
    /// New VMAs the engine's merges created in one group during one pass
    /// before the layout is judged (at least this many, and at least the
    /// group's pages / `flip_group_den` when that is non-zero, but never
    /// more than `vm.max_map_count` / `JUDGE_MAP_DEN`: see
    /// [`AssistConfig::judge_at`])...
    pub flip_vmas: u64,
    /// Divisor of the group's pages in the judging threshold (0: not used).
    pub flip_group_den: u64,
    /// ...scattered: fewer than this many merged pages per new run (a run
    /// of consecutive pool slots, two VMAs).
    pub flip_run_pages: u64,
    /// Merges with a known partner that the VMA budget refused in one pass
    /// that hand the group over regardless of layout.
    pub flip_deferred: u64,
    /// A group judged scattered goes to KSM only if the VMAs its merges
    /// would take in the pass, as a sample of the pages still ahead
    /// projects them, are at least this many. `None` (the default): the
    /// pass's runs so far and all the VMA budget has left, so that a group
    /// whose duplicates all fit stays the engine's. `Some(0)`: judged
    /// scattered is enough (tests whose groups are far smaller than the
    /// budget).
    pub flip_pass_vmas: Option<u64>,
    /// The caller holds the cooperative KSM lock for the engine's whole
    /// life (a benchmark or test that serialised itself against every other
    /// KSM user): the assist then uses KSM without taking the lock. Without
    /// it the assist takes the lock itself, non-blocking, and stays off if
    /// anyone else (another process, or another test in this one) has it.
    pub lock_held: bool,
}

/// A group's layout is judged by the time its new VMAs in a pass reach this
/// fraction of `vm.max_map_count`, however large the group: the limit is
/// the process's, so a threshold that grows with the group (2 x 2 GiB:
/// 65,536 new VMAs at 1/16 of its pages) would never be reached before the
/// VMA budget ran out, and the engine's own merges, each a pool mapping
/// plus a split of the guest mapping, would take the whole budget first.
pub const JUDGE_MAP_DEN: u64 = 16;

impl AssistConfig {
    /// New VMAs in one pass after which a group of `group_pages` pages is
    /// judged, in a process limited to `max_map_count` VMAs.
    pub fn judge_at(&self, group_pages: u64, max_map_count: u64) -> u64 {
        let by_group = group_pages
            .checked_div(self.flip_group_den)
            .unwrap_or(0)
            .min(max_map_count / JUDGE_MAP_DEN);
        self.flip_vmas.max(by_group)
    }
}

impl Default for AssistConfig {
    fn default() -> Self {
        AssistConfig {
            mode: AssistMode::Off,
            // A one-page VMA per merged page costs more mmap time and
            // kernel memory than a KSM merge, but KSM pays CPU and an rmap
            // item for *every* page of the group it scans
            // (dedup/benches/vma_cost.rs measures both), so KSM wins only
            // once a good part of the group's pages are scattered merges.
            // Tens of thousands of VMAs also slow every pagemap walk and
            // maps read of the process, so a group is judged early: at 1/16
            // of the group's pages in a pass (or when the VMA budget refuses
            // merges). Judged scattered, it goes to KSM only if its pass
            // would outgrow the budget (`flip_pass_vmas`): a group whose
            // duplicates fit costs nothing more once merged, while KSM
            // would go on scanning all of it. A layout counts as
            // scattered below 3 pages per new run. A run costs two VMAs, so
            // the budget (half of `vm.max_map_count`, 32,765 VMAs by
            // default) holds about 16,000 runs: at 2 pages a run (the
            // synthetic scattered shape, `bench ksm-seed --shape
            // scattered`) that is 32,000 pages of a 2 x 512 MiB group whose
            // duplicates are 131,072, so KSM should take it early; at the
            // 4-5 pages a run of two Linux guests' page caches (`bench
            // linux-read`) it is 70,000 pages, more than all their
            // duplicates. Judged scattered at 8, those guests' group went
            // to KSM after 19,000 merges, and ksmd, scanning all 196,608
            // pages at the assist's pace, left 166-978 duplicate pages
            // unshared at the run's end; kept by the engine, the group
            // merged within its budget and left 12-40.
            flip_vmas: 4096,
            flip_group_den: 16,
            flip_run_pages: 3,
            flip_deferred: 64,
            flip_pass_vmas: None,
            lock_held: false,
        }
    }
}

/// The assist's state, owned by the engine's core.
#[derive(Debug, Default)]
pub struct KsmAssist {
    /// The settings the assist was built with.
    pub cfg: AssistConfig,
    engaged: Option<Engaged>,
    /// Why the last attempt to engage failed (shown in stats), and when.
    pub unavailable: Option<String>,
    failed_at: Option<std::time::Instant>,
    /// ksmd CPU of earlier engagements.
    cpu_prior: f64,
    /// Times a group was handed to KSM.
    pub engagements: u64,
    /// An ended engagement whose knobs are not back yet ([`Retired`]).
    retired: Option<Engaged>,
}

/// An ended engagement, its knobs not yet put back (the cooperative lock
/// still held). Writing `run` waits for ksmd's mutex, which ksmd holds
/// through a whole batch, and the assist ends under the engine's core,
/// which VM creation and deletion wait for. The engine takes it out of the core
/// ([`KsmAssist::take_retired`]) and restores after releasing the core;
/// dropped unrestored, `KsmSysfs` still puts the knobs back.
#[derive(Debug)]
pub struct Retired(Engaged);

impl Retired {
    /// Puts every knob back, then releases the lock.
    pub fn restore(self) {
        for err in timed("restoring KSM's knobs", || self.0.sysfs.restore()) {
            log::error!("KSM assist: restoring knobs: {err}");
        }
    }
}

#[derive(Debug)]
struct Engaged {
    group: u32,
    sysfs: KsmSysfs,
    /// The cooperative lock, when we took it ourselves.
    _lock: Option<File>,
    ksmd: Option<u32>,
    cpu_start: f64,
    orig_run: u64,
    /// KSM's `run` is 1 (ours or as found).
    run_on: bool,
    /// KSM scans for us: `run` 1 and our `pages_to_scan` (not paused).
    running: bool,
    pages: u64,
    sleep: u64,
    last_full_scans: u64,
    /// KSM's `full_scans` when the engine last counted a pass.
    counted_scans: u64,
    last_merging: u64,
    idle_scans: u32,
}

fn ksmd_cpu(pid: Option<u32>) -> f64 {
    pid.and_then(|p| ksm::cpu_seconds(p).ok()).unwrap_or(0.0)
}

impl KsmAssist {
    /// An assist with the given settings, not engaged.
    pub fn new(cfg: AssistConfig) -> Self {
        KsmAssist {
            cfg,
            engaged: None,
            unavailable: None,
            failed_at: None,
            cpu_prior: 0.0,
            engagements: 0,
            retired: None,
        }
    }

    /// The group KSM works for, if any.
    pub fn group(&self) -> Option<u32> {
        self.engaged.as_ref().map(|e| e.group)
    }

    /// The assist may engage (its mode is `auto`).
    pub fn enabled(&self) -> bool {
        self.cfg.mode == AssistMode::Auto
    }

    /// Worth trying to engage now: enabled, not engaged, and no failure in
    /// the last [`RETRY_AFTER`] (another KSM user may have finished).
    pub fn can_try(&self) -> bool {
        self.enabled()
            && self.engaged.is_none()
            && self.failed_at.is_none_or(|t| t.elapsed() >= RETRY_AFTER)
    }

    /// Records a failed attempt.
    pub fn failed(&mut self, why: String) {
        if self.unavailable.as_deref() != Some(why.as_str()) {
            log::warn!("KSM assist unavailable: {why}");
        }
        self.unavailable = Some(why);
        self.failed_at = Some(std::time::Instant::now());
    }

    /// Takes over KSM for `group`: the lock, the original knob values (put
    /// back by [`KsmAssist::disengage`]). Regions are madvised by the caller.
    pub fn engage(&mut self, group: u32) -> Result<(), String> {
        if let Some(e) = &self.engaged {
            return if e.group == group {
                Ok(())
            } else {
                Err("KSM already assists another group (KSM merges across groups)".into())
            };
        }
        // An engagement that ended under the core moments ago: its knobs
        // first, so "original" below means as found, and its lock is free.
        if let Some(r) = self.take_retired() {
            r.restore();
        }
        let lock = if self.cfg.lock_held {
            None
        } else {
            Some(ksm::try_ksm_flock().ok_or_else(|| {
                format!(
                    "another process drives KSM (lock {} held)",
                    ksm::KSM_LOCK_PATH
                )
            })?)
        };
        // A pagefold killed while it drove KSM left knobs behind: put them
        // back before reading what is "original" (docs/global-state.md).
        ksm::journal::recover();
        let sysfs = KsmSysfs::open().map_err(|e| e.to_string())?;
        let orig_run = sysfs.read_u64("run").map_err(|e| e.to_string())?;
        if orig_run == 2 {
            return Err("KSM is unmerging (run = 2); not assisting".into());
        }
        // Smart scan skips pages by their history, and a region at a freed
        // region's address inherits that history (module doc). Kernels
        // before 6.7 have no smart scan and nothing to inherit.
        if sysfs.read_u64("smart_scan").is_ok_and(|v| v != 0) {
            sysfs.write("smart_scan", 0).map_err(|e| e.to_string())?;
        }
        let ksmd = ksm::find_by_comm(std::path::Path::new("/proc"), "ksmd");
        let last_full_scans = sysfs.read_u64("full_scans").unwrap_or(0);
        self.engaged = Some(Engaged {
            group,
            sysfs,
            _lock: lock,
            ksmd,
            cpu_start: ksmd_cpu(ksmd),
            orig_run,
            run_on: orig_run == 1,
            running: orig_run == 1,
            pages: 0,
            sleep: u64::MAX,
            last_full_scans,
            counted_scans: last_full_scans,
            last_merging: 0,
            idle_scans: 0,
        });
        self.unavailable = None;
        self.failed_at = None;
        self.engagements += 1;
        Ok(())
    }

    /// Steers KSM for one engine wake-up: `merge` says whether the engine
    /// merges now (mode on, or auto triggered); `pages` and `sleep_ms` are
    /// the engine's pace for this wake-up; `settle` is the engine's settle
    /// time, and `group_pages` the pages of the regions KSM has.
    pub fn drive(
        &mut self,
        merge: bool,
        pages: u64,
        sleep_ms: u64,
        settle: std::time::Duration,
        group_pages: u64,
    ) {
        let Some(e) = self.engaged.as_mut() else {
            return;
        };
        let write = |name: &str, v: u64| {
            if let Err(err) = timed(&format!("writing {name} {v}"), || e.sysfs.write(name, v)) {
                log::warn!("KSM assist: {err}");
                false
            } else {
                true
            }
        };
        if !merge {
            if e.running && e.orig_run == 0 {
                // Paused by scanning no pages per batch, not by `run` 0:
                // writing `run` waits for ksmd's mutex, which it holds
                // through a whole batch, and the engine's core is held
                // meanwhile (seconds under load, even with batches capped
                // at `KSM_BATCH_MAX`). ksmd reads `pages_to_scan` at its next
                // batch; the long sleep keeps it from waking for nothing.
                if write("pages_to_scan", 0) {
                    e.running = false;
                    e.pages = 0;
                }
                if e.sleep != MAX_IDLE_SLEEP_MS && write("sleep_millisecs", MAX_IDLE_SLEEP_MS) {
                    e.sleep = MAX_IDLE_SLEEP_MS;
                }
            }
            return;
        }
        // Back off while full scans bring nothing more (KSM's own work on
        // unique pages is what costs CPU once everything is merged).
        let scans = timed("reading full_scans", || e.sysfs.read_u64("full_scans"))
            .unwrap_or(e.last_full_scans);
        if scans != e.last_full_scans {
            let merging = timed("reading /proc/self/ksm_stat", ksm::self_ksm_stat)
                .and_then(|s| s.merging_pages)
                .unwrap_or(0);
            if merging > e.last_merging {
                e.idle_scans = 0;
            } else {
                e.idle_scans = e.idle_scans.saturating_add(1);
            }
            e.last_merging = merging;
            e.last_full_scans = scans;
        }
        let (pages, sleep) = assist_pace(e.idle_scans, pages, sleep_ms, settle, group_pages);
        if pages != e.pages && write("pages_to_scan", pages) {
            e.pages = pages;
        }
        if sleep != e.sleep && write("sleep_millisecs", sleep) {
            e.sleep = sleep;
        }
        if !e.run_on && write("run", 1) {
            e.run_on = true;
        }
        e.running = e.run_on && e.pages > 0;
    }

    /// New memory became KSM's (a region handed over, or registered later
    /// into the assisted group): KSM goes back to its converging pace
    /// (`CONVERGE_BOOST` times the engine's pages, the engine's sleep) at
    /// the engine's next wake-up, instead of finding the new VM at the pace
    /// it had backed off to (up to 1 s between rounds) and speeding up only
    /// once it has merged some of it.
    pub fn new_work(&mut self) {
        if let Some(e) = self.engaged.as_mut() {
            e.idle_scans = 0;
        }
    }

    /// True (once) when KSM has finished a full scan since the last call
    /// that returned true; KSM paused counts as finished (nothing pending).
    pub fn ksm_scanned_since_last_look(&mut self) -> bool {
        let Some(e) = self.engaged.as_mut() else {
            return true;
        };
        if !e.running {
            return true;
        }
        if e.last_full_scans != e.counted_scans {
            e.counted_scans = e.last_full_scans;
            true
        } else {
            false
        }
    }

    /// KSM has finished a full scan since the engine last counted a pass
    /// (i.e. since the last census); unlike
    /// [`KsmAssist::ksm_scanned_since_last_look`], only looks.
    pub fn ksm_scan_uncounted(&self) -> bool {
        self.engaged
            .as_ref()
            .is_some_and(|e| e.running && e.last_full_scans != e.counted_scans)
    }

    /// KSM is scanning for us and has not yet had `IDLE_SCANS` full scans
    /// in a row without new merges (it may still be between checksum and
    /// merge).
    pub fn ksm_busy(&self) -> bool {
        self.engaged
            .as_ref()
            .is_some_and(|e| e.running && e.idle_scans < IDLE_SCANS)
    }

    /// Ends the engagement: KSM is no longer driven, and its knobs go back
    /// to their original values once the engine restores the [`Retired`]
    /// engagement, after releasing its core. Pages KSM merged stay merged
    /// (KSM keeps them with `run` 0).
    pub fn disengage(&mut self) {
        if let Some(e) = self.engaged.take() {
            self.cpu_prior += (ksmd_cpu(e.ksmd) - e.cpu_start).max(0.0);
            if let Some(older) = self.retired.replace(e) {
                Retired(older).restore();
            }
        }
    }

    /// The ended engagement whose knobs the caller is to put back
    /// ([`Retired::restore`]), if any.
    pub fn take_retired(&mut self) -> Option<Retired> {
        self.retired.take().map(Retired)
    }

    /// ksmd CPU seconds spent while assisting (all engagements).
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_prior
            + self
                .engaged
                .as_ref()
                .map(|e| (ksmd_cpu(e.ksmd) - e.cpu_start).max(0.0))
                .unwrap_or(0.0)
    }

    /// One line for stats: off, idle, engaged or unavailable (and why).
    pub fn status(&self, group_name: Option<&str>) -> String {
        match (&self.engaged, &self.unavailable) {
            _ if !self.enabled() => "off".into(),
            (Some(e), _) => format!(
                "engaged: group {} ({})",
                group_name.unwrap_or("?"),
                if e.running { "scanning" } else { "paused" }
            ),
            (None, Some(why)) => format!("unavailable: {why}"),
            (None, None) => "standby".into(),
        }
    }
}

impl Drop for KsmAssist {
    fn drop(&mut self) {
        self.disengage();
        if let Some(r) = self.take_retired() {
            r.restore();
        }
    }
}

/// KSM sharing among our own pages, from the PFNs of present anonymous
/// pages of assisted regions: a frame mapped k >= 2 times in them can only
/// be a KSM page (this process never forks guest memory), and saves k - 1.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Census {
    /// Frames mapped at least twice.
    pub shared: u64,
    /// Sum of (mappers - 1) over those frames.
    pub sharing: u64,
    /// Per region key: (pages on a shared frame, pages saved = sum 1 - 1/k).
    pub per_region: Vec<(u32, u64, f64)>,
}

impl Census {
    /// Counts from `(pfn, region key)` pairs (sorted in place).
    pub fn count(pages: &mut [(u64, u32)]) -> Census {
        pages.sort_unstable();
        let mut c = Census::default();
        let mut per: std::collections::BTreeMap<u32, (u64, f64)> = Default::default();
        let mut i = 0;
        while i < pages.len() {
            let pfn = pages[i].0;
            let mut j = i + 1;
            while j < pages.len() && pages[j].0 == pfn {
                j += 1;
            }
            let k = (j - i) as u64;
            if k >= 2 {
                c.shared += 1;
                c.sharing += k - 1;
                for &(_, key) in &pages[i..j] {
                    let e = per.entry(key).or_default();
                    e.0 += 1;
                    e.1 += 1.0 - 1.0 / k as f64;
                }
            }
            i = j;
        }
        c.per_region = per.into_iter().map(|(k, (n, s))| (k, n, s)).collect();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settled_engine_spreads_ksm_full_scans_over_the_settle_time() {
        use std::time::Duration;
        let s16 = Duration::from_secs(16);
        // 262,144 pages at 4,096 a batch: 64 batches in 16 s.
        assert_eq!(settled_sleep_ms(4096, s16, 262_144), 250);
        // A group smaller than a batch: one batch per settle time.
        assert_eq!(settled_sleep_ms(4096, s16, 100), 16_000);
        assert_eq!(settled_sleep_ms(4096, Duration::ZERO, 262_144), 0);
        assert_eq!(settled_sleep_ms(0, s16, 0), 16_000);
    }

    #[test]
    fn an_idle_ksm_scans_at_an_idle_engines_pace_at_once() {
        use std::time::Duration;
        let group = 262_144;
        // Converging: four times the engine's pages, the engine's sleep.
        for idle in 0..IDLE_SCANS {
            assert_eq!(
                assist_pace(idle, 4096, 20, Duration::ZERO, group),
                (8192, 10)
            );
        }
        // Two whole scans in a row merged nothing: the engine's pages once
        // a second, not a ladder of doublings per full scan.
        for idle in [IDLE_SCANS, IDLE_SCANS + 1, 7, 40] {
            assert_eq!(
                assist_pace(idle, 4096, 20, Duration::ZERO, group),
                (4096, 1000)
            );
        }
        // An engine slower than that keeps its own sleep.
        assert_eq!(
            assist_pace(IDLE_SCANS, 100, 5000, Duration::ZERO, group),
            (100, 5000)
        );
        // Settled: no boost, and a full scan takes at least the settle time.
        let s64 = Duration::from_secs(64);
        assert_eq!(assist_pace(0, 4096, 20, s64, group), (4096, 1000));
        assert_eq!(assist_pace(IDLE_SCANS, 4096, 20, s64, group), (4096, 1000));
        let s128 = Duration::from_secs(128);
        assert_eq!(assist_pace(IDLE_SCANS, 4096, 20, s128, group), (4096, 2000));
    }

    #[test]
    fn ksm_batches_stay_short_at_the_same_pace() {
        // Small batches as asked.
        assert_eq!(ksm_pace(100, 20), (100, 20));
        assert_eq!(ksm_pace(KSM_BATCH_MAX, 0), (KSM_BATCH_MAX, 0));
        // Large ones are cut, the sleep with them: 4 x 65,536 pages every
        // 20 ms is 8,192 every 0.625 ms, i.e. no sleep at all.
        assert_eq!(ksm_pace(262_144, 20), (KSM_BATCH_MAX, 0));
        // 32,768 pages a second: 8,192 every 250 ms.
        assert_eq!(ksm_pace(32_768, 1000), (KSM_BATCH_MAX, 250));
        // Never slower than asked (rounded down).
        for (p, s) in [(10_000u64, 7u64), (50_000, 333), (1 << 20, 1000)] {
            let (bp, bs) = ksm_pace(p, s);
            assert!(bp <= KSM_BATCH_MAX);
            // bp pages every bs ms at least as fast as p every s ms.
            assert!(bp * s >= p * bs, "{p}/{s} -> {bp}/{bs}");
        }
    }

    #[test]
    fn census_counts_frames_mapped_twice_or_more() {
        // Frame 7 mapped by regions 1 and 2, frame 9 three times in region 1,
        // frames 3 and 5 once each (not shared).
        let mut pages = vec![(7, 1), (3, 1), (9, 1), (7, 2), (9, 1), (5, 2), (9, 1)];
        let c = Census::count(&mut pages);
        assert_eq!(c.shared, 2);
        assert_eq!(c.sharing, 1 + 2);
        let r1 = c.per_region.iter().find(|r| r.0 == 1).unwrap();
        assert_eq!(r1.1, 4);
        assert!((r1.2 - (0.5 + 3.0 * (2.0 / 3.0))).abs() < 1e-9);
        let r2 = c.per_region.iter().find(|r| r.0 == 2).unwrap();
        assert_eq!((r2.1, r2.2), (1, 0.5));
    }

    #[test]
    fn a_large_group_is_judged_within_a_sixteenth_of_the_map_limit() {
        let c = AssistConfig::default();
        // 2 x 64 MiB: the fixed minimum.
        assert_eq!(c.judge_at(2 * 16_384, 65_530), 4096);
        // 2 x 512 MiB: 1/16 of the group's pages would be 16,384.
        assert_eq!(c.judge_at(2 * 131_072, 65_530), 4096);
        // 2 x 2 GiB: 65,536, more than the whole budget, before the cap.
        assert_eq!(c.judge_at(2 * 524_288, 65_530), 4096);
        // A raised limit lets large groups keep more of their merges.
        assert_eq!(c.judge_at(2 * 524_288, 1 << 20), 65_536);
        assert_eq!(c.judge_at(2 * 524_288, 1 << 18), 16_384);
        let no_den = AssistConfig {
            flip_vmas: 256,
            flip_group_den: 0,
            ..c
        };
        assert_eq!(no_den.judge_at(1 << 30, 65_530), 256);
    }

    #[test]
    fn modes_parse_and_print() {
        assert_eq!("auto".parse::<AssistMode>().unwrap(), AssistMode::Auto);
        assert_eq!("off".parse::<AssistMode>().unwrap(), AssistMode::Off);
        assert!("on".parse::<AssistMode>().is_err());
        assert_eq!(AssistMode::Auto.to_string(), "auto");
    }

    #[test]
    fn status_says_off_when_disabled() {
        let a = KsmAssist::new(AssistConfig::default());
        assert_eq!(a.status(None), "off");
        let mut b = KsmAssist::new(AssistConfig {
            mode: AssistMode::Auto,
            ..AssistConfig::default()
        });
        assert_eq!(b.status(None), "standby");
        b.unavailable = Some("x".into());
        assert_eq!(b.status(None), "unavailable: x");
    }
}
