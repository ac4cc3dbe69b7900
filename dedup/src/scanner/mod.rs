//! The scanner: the engine's core state and one wake-up's work.
//!
//! A wake-up walks the regions from a cursor in spans (one pagemap `pread`
//! per span), spending the wake-up's `pages_to_visit` page visits (the
//! `pages_to_scan` knob, times auto mode's factor). A hashed page costs one
//! visit; a page only checked in pagemap (merged, zero, absent, skipped)
//! costs a quarter. Per page:
//!
//! * merged: present and anonymous means the kernel copied it on write (the
//!   share is broken): drop its pool reference. Not present or file-mapped
//!   means still merged (docs/merge-races.md §11). Never re-hashed.
//! * zero (dropped by us): present and not the zero page means written.
//! * otherwise, if present and anonymous: hash it. A changed hash marks the
//!   page volatile (KSM's rule: only pages unchanged since their previous
//!   scan are merge candidates). Unchanged: try, in order, the slot after the
//!   left neighbour's slot (keeps runs in one VMA), the stable index, the
//!   unstable index; else insert it into the unstable index and raise its
//!   smart-scan level (level L: hashed once every 2^L passes, on passes
//!   aligned to the pass number and the content hash, so identical pages are
//!   hashed on the same passes and meet: `region::due`).
//!
//! Merges are planned during the span and executed at its end in windows
//! (`merge.rs`), in address order; a join whose slot a later page creates
//! runs in a second sweep (`execute.rs`). Planned pages are provisionally
//! marked merged so no other page plans with them; failures restore them.
//!
//! The files of this module each add one part of [`Core`]'s work:
//! `batch.rs` (a wake-up, a pass, the rechecks), `span.rs` (a span's
//! pagemap read and loop), `visit.rs` (an unmerged page's visit),
//! `choose.rs` (where a page merges), `execute.rs` (running the planned
//! merges), `hints.rs` (I/O hints), `logs.rs` (write logs), `handover.rs`
//! (the KSM assist's judging and hand-over), `budget.rs` (the map-count
//! budget), `discard.rs` (pages their owner gives back), `unmerge.rs`, `register.rs` (regions joining and leaving)
//! and `report.rs` (the statistics); this file holds the state, the constants and
//! region registration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::assist::{AssistConfig, KsmAssist};
use crate::backend::{Knobs, RegionId};
use crate::fault::ProtState;
use crate::hash::{fold, HashFn};
use crate::index::{StableIndex, UnstableIndex};
use crate::merge::{self, Ctx, Op, OpKind, CHUNK_PAGES, GAPPED_WINDOW_PAGES};
use crate::mm;
use crate::pagemap::{Entry, Pagemap, PM_PRESENT};
use crate::pool::{Pool, SlotState};
use crate::quiesce::Quiesce;
use crate::region::{self, GuestPage, Origin, Region, HASHED, MAX_LEVEL, MERGED, NEW, ZERO};
use crate::uffd::Uffd;
use crate::writelog::{WriteLog, Written, VERIFY_BLOCK, VERIFY_PASSES};

mod batch;
mod budget;
mod census;
mod choose;
mod cursor;
mod discard;
mod execute;
mod halt_grace;
mod handover;
mod hints;
mod logs;
mod park_costs;
mod pause;
mod projection;
mod register;
mod report;
mod run;
mod settle;
mod span;
mod unmerge;
mod visit;

use choose::Plan;
use pause::BoundedPark;
use span::Planned;
use visit::{PageVisit, VisitMode};

/// Drops one page's reference to slot `s`; returns the mappers left. A
/// slot that keeps mappers has room again for its content's next joins
/// (`StableIndex::room_again`).
pub(super) fn drop_mapper(pool: &mut Pool, stable: &mut StableIndex, s: u32) -> u32 {
    let left = pool.remove_mapper(s);
    if left > 0 {
        let m = pool.meta(s);
        stable.room_again(m.group, m.hash, s);
    }
    left
}

/// Pages per pagemap read.
pub const SPAN_PAGES: usize = 4096;
/// Merges a span plans, or executes, before it ends early for a thread
/// waiting for the core (VM creation or deletion) or at the wake-up's
/// deadline (`Core::set_deadline`). A span of scattered
/// pages can plan thousands of merges, and a VM's creation would wait for
/// all of them; this many keep that wait to tens of milliseconds on a
/// loaded machine. Planning checks for a waiter as it goes, and so does the
/// execution (a waiter who came after the plan: the planned merges left are
/// abandoned, see `Core::execute`). Without either, spans run whole (one
/// pagemap read and one vCPU park each).
const OPS_BEFORE_YIELD: usize = 512;
/// How far past the wake-up's deadline an execution may run before it
/// stops short of [`OPS_BEFORE_YIELD`] ops (after one window at least):
/// where a merge costs milliseconds (an emulated CPU, guests to park),
/// that many ops take seconds, and a wake-up of hints and a scan span
/// each running them would outlast `WAKEUP_GRACE` and be reported as a
/// stalled engine. Long enough that a wake-up which starts on time
/// makes its `OPS_BEFORE_YIELD` on any host this runs on.
const DEADLINE_SLACK: Duration = Duration::from_secs(3);
/// Visit units: a hashed page costs `HASH_COST`, a pagemap-only visit 1
/// (a wake-up of N page visits has N x `HASH_COST` units to spend).
const HASH_COST: u64 = 4;
/// `read_needed`'s verdict on a span's page, in pagemap entry bits 58-60,
/// which the kernel leaves zero: not due on this pass, or due; a due page
/// may also be `CLEAN` (`Core::log_clean`: its write log answers the
/// visit).
const NOT_DUE: u64 = 1 << 58;
const DUE: u64 = 1 << 59;
const CLEAN: u64 = 1 << 60;

/// How many pages ahead the scan loop prefetches a merged page's slot
/// metadata (`Pool::prefetch_meta`).
const PREFETCH_AHEAD: usize = 32;

/// Default longest stripe of identical pool pages a same-content run maps.
pub const DEFAULT_STRIPE: u32 = 64;
/// A first-seen page whose visit continues a run of at least this many
/// pages of one content (its left neighbours, visited just before it) is
/// a candidate without waiting for its second visit (KSM's volatility
/// rule): a region filled with one pattern (a memset, free pages a guest
/// poisons) pairs, grows its stripe and joins it in its first pass, where
/// each page is then read once (its join's compare, right after its hash
/// or, continuing the stripe, unhashed and unsampled) instead of hashed in
/// one pass and compared in the next. Pages of distinct content never form
/// such runs, so two guests filling their memory still pair on a second
/// sight; a page whose share copy-on-write broke is not seeded (`REHASH`).
const SEED_RUN: u32 = 8;
/// Kernel memory per VMA we create (vm_area_struct, anon_vma_chain, maple
/// tree share): used for `profit_bytes`.
pub const VMA_COST: u64 = 256;

/// Errors of the scanner.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// `/proc/self/pagemap` could not be opened or read.
    #[error(transparent)]
    Pagemap(#[from] crate::pagemap::PagemapError),
    /// The pool (its memfd or a slot) failed.
    #[error(transparent)]
    Pool(#[from] crate::pool::PoolError),
    /// A userfaultfd operation failed.
    #[error(transparent)]
    Uffd(#[from] crate::uffd::UffdError),
    /// The region cannot be tracked (bounds, size).
    #[error(transparent)]
    Region(#[from] crate::region::RegionError),
    /// The range overlaps a registered region.
    #[error("region {addr:#x}+{len:#x} overlaps a registered region")]
    Overlap {
        /// Host address of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// No region has this id.
    #[error("unknown region id {0}")]
    Unknown(u64),
    /// The range to give back does not lie inside one registered region.
    #[error("{addr:#x}+{len:#x} does not lie inside one registered region")]
    NotRegistered {
        /// Host address of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// The KSM assist could not give a region back.
    #[error("KSM assist: {0}")]
    Assist(String),
    /// The region's group already has regions of the other security.
    #[error("dedup group {group:?} is {has}, not {asked}")]
    SecurityMismatch {
        /// The group.
        group: String,
        /// Its regions' security.
        has: crate::backend::Security,
        /// The new region's.
        asked: crate::backend::Security,
    },
}

/// Cumulative counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// Full scans as reported: while KSM assists, a pass counts only once
    /// KSM has also finished a full scan since the last counted one (its
    /// merges are part of the result), so "held for N full scans" keeps
    /// meaning "nothing more to find".
    pub full_scans: u64,
    /// Every pass of the engine's own cursor (drives smart-scan phases).
    pub passes: u64,
    /// Pages merged onto pool slots.
    pub merges: u64,
    /// Drops to the zero page (`origins.zero_merges`) and merged or dropped
    /// pages a write took back (`origins.cow_breaks`), by the rule that let
    /// each page merge (`region::Origin`).
    pub origins: crate::backend::MergeOrigins,
    /// The scanner's CPU time executing planned merges (`Core::execute`).
    pub merge_cpu_s: f64,
    /// Planned merges not made: the final compare failed, the VMA budget
    /// ran out, or a waiter came first.
    pub abandoned: u64,
    /// Of `abandoned`: planned merges left unexecuted for a thread waiting
    /// for the core or at the wake-up's deadline (`Core::execute`); their
    /// pages get a second look at the next wake-up.
    pub left_for_waiters: u64,
    /// Pages hashed (a visit that joined a slot by its stored hash is not
    /// one).
    pub pages_hashed: u64,
    /// Due visits that the write log answered: no pagemap read, no hash.
    pub clean_visits: u64,
    /// Transparent huge pages split before a merge replaced part of them
    /// (`mm::split_huge_page_at` calls).
    pub huge_pages_split: u64,
    /// Pages given back by their owners (`Core::discard`), regions gone
    /// included.
    pub reported: u64,
}

/// What one wake-up did.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchReport {
    /// Merges and zero drops made.
    pub merges: u64,
    /// The cursor went round: a pass ended in this wake-up.
    pub pass_completed: bool,
    /// Visit units spent: 0 when every page was KSM's (skipped).
    pub spent: u64,
    /// Pages hashed for the first time (new to the engine): a region that
    /// just arrived, or memory a guest just touched.
    pub fresh: u64,
    /// A census pass over KSM's regions stopped at its time slice: the
    /// next wake-up should come soon, whatever the idle back-off says.
    pub census_pending: bool,
    /// The batch ended early at a span boundary because another thread
    /// waited for the core (see [`Core::waiters`]) or the wake-up's time
    /// was up ([`Core::set_deadline`]).
    pub yielded: bool,
}

/// A hinted range visited in this wake-up, its merges maybe still planned.
struct HintVisit {
    region: usize,
    /// Pages `first..end` of the region were visited.
    first: usize,
    end: usize,
    /// Merge ops the visit planned.
    planned: usize,
    /// When the device filled the range.
    at: Instant,
}

/// The region index and page of page id `gid` (regions are sorted by
/// `gid_base`); None for an id past its region's end (a removed region's).
fn locate_in(regions: &[Region], gid: u32) -> Option<(usize, usize)> {
    let ri = regions
        .partition_point(|r| r.gid_base <= gid)
        .checked_sub(1)?;
    let r = &regions[ri];
    let p = (gid - r.gid_base) as usize;
    (p < r.npages).then_some((ri, p))
}

/// One group's merges in the current pass (drives the KSM assist).
#[derive(Debug, Default, Clone, Copy)]
struct GroupPass {
    /// Pages merged onto pool slots (zero drops excluded).
    merged: u64,
    /// Of those, merges that started a new VMA (did not extend a run).
    new_vmas: u64,
    /// Merges with a known partner refused for lack of VMA budget.
    deferred: u64,
    /// Whether the pass's merges would outgrow what the engine may spend
    /// on the group (`Core::outgrows_budget`), once judged this pass.
    outgrows: Option<bool>,
}

/// A device-filled range waiting for the scanner (see `Core::run_hints`).
#[derive(Debug, Clone, Copy)]
pub struct Hint {
    /// Host address of the range's first byte.
    pub addr: usize,
    /// Its length in bytes.
    pub len: usize,
    /// When the device filled it.
    pub at: Instant,
}

/// Most hinted pages remembered across passes for pairing.
pub const HINT_INDEX_CAP: usize = 1 << 18;

/// The planned target of a page.
enum Target {
    Existing(u32),
    New(u32),
    Pair(u32, usize, usize),
}

/// Default smallest batch that parks the VMs' vCPUs (`Core::quiesce_min_ops`):
/// every batch, because on a host whose IPIs trap (PVM) one merge's
/// flushes, while a vCPU runs on another CPU, cost more than a park and
/// resume (docs/engine.md, "Parking the vCPUs").
/// [`crate::EngineConfig::quiesce_min_ops`] sets it per engine (0 turns it
/// off); the VMM and the benchmarks read it from `PAGEFOLD_QUIESCE_MIN_OPS`
/// when set, for side-by-side measurements.
pub const DEFAULT_QUIESCE_MIN_OPS: usize = 1;

/// The engine's state, owned by one mutex.
pub struct Core {
    regions: Vec<Region>,
    /// Per region, how to park the threads running guest code in it around
    /// a batch of merges (`crate::quiesce`).
    quiescers: HashMap<RegionId, Arc<dyn Quiesce>>,
    /// Batches of at least this many ops park them (0: never).
    quiesce_min_ops: usize,
    /// Longest park of the guests at once (`None`: never park them).
    pause_budget: Option<Duration>,
    /// What parking costs and saves on this host, as measured so far
    /// (`park_costs.rs`): sizes parked merge windows and decides whether a
    /// merge batch parks.
    park_costs: park_costs::ParkCosts,
    pool: Pool,
    stable: StableIndex,
    unstable: UnstableIndex,
    pagemap: Pagemap,
    uffd: Arc<Uffd>,
    prot: Arc<Mutex<ProtState>>,
    hash_fn: HashFn,
    zero_hash: u32,
    zero_pfn: u64,
    knobs: Knobs,
    stripe_max: u32,
    counters: Counters,
    /// Passes in a row that made no progress (drives the adaptive sleep).
    idle_passes: u32,
    /// Region, group and page numbering.
    ids: cursor::Ids,
    /// Where the scan goes on.
    cursor: cursor::Cursor,
    /// Progress made in this pass (merges, first hashes, KSM's sharing).
    pass_progress: u64,
    /// Pages hashed for the first time, ever (see `BatchReport::fresh`).
    fresh_hashed: u64,
    /// VMAs the engine may still create (the process map-count limit).
    vmas: budget::Vmas,
    scratch: Vec<Entry>,
    /// The same-content run ending at the last visited page.
    run: run::SameRun,
    /// The hash is xxh3 (64-bit equality then stands in for a content
    /// pre-check when planning); false with a test hash override.
    strong_hash: bool,
    /// High half of the current page's 64-bit hash (set by `visit`).
    cur_hi: u32,
    /// Kernel KSM for scattered groups (see `assist.rs`).
    assist: KsmAssist,
    /// This pass's merges per group.
    pass_groups: HashMap<u32, GroupPass>,
    /// `pass_groups` of the last completed pass.
    last_pass_groups: HashMap<u32, GroupPass>,
    /// KSM's sharing among the assisted regions, and its pace.
    census: census::CensusRoom,
    /// Threads other than the scanner waiting for the core (VM creation and
    /// deletion through the engine's API): a batch ends at its next span
    /// boundary when this is non-zero, so they wait for one span, not for a
    /// whole batch (seconds at high `pages_to_scan` on scattered regions).
    /// Shared with the engine, which counts.
    waiters: Arc<std::sync::atomic::AtomicUsize>,
    /// When the current wake-up's work should end (`Core::set_deadline`):
    /// its scan, hints, rechecks and unmerge steps stop at their next step
    /// boundary past it, as for a waiter, and go on next wake-up.
    deadline: Option<Instant>,
    /// Counters at the last per-region recount (see `end_pass`).
    recount_key: (u64, u64, u64, u64),
    /// Slot references of pages that still mapped their slot when their
    /// region left after a failed unmerge (one entry per page). The owner
    /// keeps using that memory, so those slots are never freed.
    orphans: Vec<u32>,
    /// Hinted pages without a partner yet (`hints.rs`).
    hint_index: hints::HintIndex,
    /// Merges made on hinted visits, and their delays.
    hint_tally: hints::HintTally,
    /// Page ids whose hash changed at their last visit in a logged region,
    /// each with the collections of the write logs it has stayed unwritten
    /// for since: looked at again once that is the settle time's worth
    /// (`run_rechecks`), not at the next pass.
    recheck: Vec<(u32, u32)>,
    /// How long pages must stay unchanged before the scan merges them
    /// (`settle.rs`), and when the current pass started.
    settle: settle::Settle,
    pass_started: Option<Instant>,
    /// `run_passes` runs: passes start at once, whatever the settle time.
    passes_forced: bool,
    /// Queued pages whose collection came: looked at now.
    recheck_due: Vec<u32>,
    /// When the write logs were last collected, and the least time between
    /// two collections (`LOG_INTERVAL`; tests drive every wake-up).
    last_collect: Option<Instant>,
    log_interval: Duration,
    /// Ids of pages merged in logged regions since the last collection:
    /// a write it reports may be older than the merge (made after the
    /// page's visit, which the merge's compare saw), not a break
    /// (`take_back_written_shares`).
    merged_since_collect: Vec<u32>,
    /// Slots hardened groups' discards dropped the last reference to,
    /// freed at the scanner's next wake-up (`Core::release_deferred`).
    deferred_release: Vec<u32>,
}

/// Most pages queued for a second look (`Core::recheck`); more wait for
/// the next pass as without a write log.
const RECHECK_CAP: usize = 1 << 16;

/// Least time between two collections of the write logs. A collection
/// write-protects every page the guest wrote since the last one, so a page
/// the guest keeps writing costs it one fault per collection: at every
/// wake-up (20 ms) that was 50 faults a second for each page of a
/// compiler's working set, and a page quiet for one wake-up already
/// counted as settled, so merges landed on pages written again moments
/// later. Once a second, KSM's pace at `pages_to_scan` 10000 over a few
/// GiB, a page must stay unwritten for a whole second before its second
/// look merges it (`run_rechecks`), and the faults are 50 times fewer. The
/// log only steers the scan: a write not collected yet costs a merge
/// attempt, never data (docs/engine.md, "Write logs").
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

impl Core {
    /// A core with no regions.
    pub fn new(
        pool: Pool,
        uffd: Arc<Uffd>,
        prot: Arc<Mutex<ProtState>>,
        knobs: Knobs,
        hash_fn: HashFn,
        strong_hash: bool,
        stripe_max: u32,
    ) -> Result<Self, ScanError> {
        let pagemap = Pagemap::open()?;
        let zero_pfn = crate::mm::zero_pfn(&pagemap);
        let c = Core {
            regions: Vec::new(),
            pool,
            stable: StableIndex::default(),
            unstable: UnstableIndex::default(),
            pagemap,
            uffd,
            prot,
            hash_fn,
            zero_hash: crate::hash::zero_hash(hash_fn),
            zero_pfn,
            knobs,
            stripe_max: stripe_max.max(1),
            counters: Counters::default(),
            idle_passes: 0,
            ids: cursor::Ids::default(),
            cursor: cursor::Cursor::default(),
            pass_progress: 0,
            fresh_hashed: 0,
            vmas: budget::Vmas::new(false),
            scratch: Vec::new(),
            run: run::SameRun::default(),
            strong_hash,
            quiescers: HashMap::new(),
            quiesce_min_ops: DEFAULT_QUIESCE_MIN_OPS,
            pause_budget: Some(Duration::from_micros(
                crate::settings::DEFAULT_MAX_GUEST_PAUSE_US,
            )),
            park_costs: park_costs::ParkCosts::default(),
            cur_hi: 0,
            assist: KsmAssist::new(AssistConfig::default()),
            pass_groups: HashMap::new(),
            last_pass_groups: HashMap::new(),
            census: census::CensusRoom::default(),
            waiters: Arc::default(),
            deadline: None,
            recount_key: (u64::MAX, 0, 0, 0),
            orphans: Vec::new(),
            hint_index: hints::HintIndex::default(),
            hint_tally: hints::HintTally::default(),
            recheck: Vec::new(),
            settle: Default::default(),
            pass_started: None,
            passes_forced: false,
            recheck_due: Vec::new(),
            last_collect: None,
            log_interval: LOG_INTERVAL,
            merged_since_collect: Vec::new(),
            deferred_release: Vec::new(),
        };
        Ok(c)
    }

    /// A core with no engine thread and no regions, at max effort
    /// (`max_page_sharing` 256, xxh3, 64-bit hash checks): what tests
    /// drive pass by pass.
    #[cfg(any(test, feature = "testing"))]
    pub fn driven(pool_max_bytes: u64) -> Result<Self, ScanError> {
        let mut core = Core::new(
            Pool::new(pool_max_bytes)?,
            Arc::new(Uffd::new()?),
            Arc::new(Mutex::new(ProtState::default())),
            Knobs {
                pages_to_scan: 1 << 20,
                sleep_millisecs: 0,
                max_page_sharing: 256,
            },
            crate::hash::xxh3,
            true,
            DEFAULT_STRIPE,
        )?;
        // Tests drive wake-ups one by one: each collects the write logs.
        core.log_interval = Duration::ZERO;
        Ok(core)
    }

    /// Settles the scan while guests undo its merges (`settle.rs`), or
    /// keeps its full pace whatever they do.
    pub fn set_settle(&mut self, on: bool) {
        self.settle.set_enabled(on);
    }

    /// Least time between two collections of the write logs
    /// (`LOG_INTERVAL` unless set here).
    #[cfg(any(test, feature = "testing"))]
    pub fn set_log_interval(&mut self, d: Duration) {
        self.log_interval = d;
    }

    /// Re-reads the process's VMA count when due (`force`: now).
    pub fn refresh_map_count(&mut self, force: bool) {
        let keep_half = self.assist.enabled();
        self.vmas.refresh(force, keep_half);
    }

    /// Cumulative counters.
    #[cfg(any(test, feature = "testing"))]
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The registered regions, in page-id order.
    #[cfg(any(test, feature = "testing"))]
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Sets the knobs for the next wake-ups (the engine copies its
    /// control state's knobs in before each one).
    pub fn set_knobs(&mut self, knobs: Knobs) {
        self.knobs = knobs;
    }

    /// Passes in a row that made no progress (drives the adaptive sleep).
    pub fn idle_passes(&self) -> u32 {
        self.idle_passes
    }

    /// Starts the adaptive sleep over (the mode or knobs changed).
    pub fn reset_idle_passes(&mut self) {
        self.idle_passes = 0;
    }

    /// The KSM assist.
    pub fn assist_mut(&mut self) -> &mut KsmAssist {
        &mut self.assist
    }

    /// Steers KSM for this wake-up (`KsmAssist::drive`) at the engine's
    /// pace, its settle time, and the size of the regions KSM has.
    pub fn drive_assist(&mut self, merge: bool, pages: u64, sleep_ms: u64) {
        let group_pages = self
            .regions
            .iter()
            .filter(|r| r.assisted)
            .map(|r| r.npages as u64)
            .sum();
        let settle = self.settle.time();
        self.assist
            .drive(merge, pages, sleep_ms, settle, group_pages);
    }

    /// Batches of at least `ops` page-table changes park the VMs' vCPUs
    /// (0: never; see [`DEFAULT_QUIESCE_MIN_OPS`]).
    pub fn set_quiesce_min_ops(&mut self, ops: usize) {
        self.quiesce_min_ops = ops;
    }

    /// Parks of the guests last at most `us` microseconds at once (0:
    /// never park them; see [`pause::BoundedPark`]).
    pub fn set_max_guest_pause_us(&mut self, us: u64) {
        self.pause_budget = (us > 0).then(|| Duration::from_micros(us));
    }

    /// How to park the threads running guest code in region `id` (None:
    /// nothing to park). Ignored for a region that is not registered.
    pub fn set_quiescer(&mut self, id: RegionId, q: Option<Arc<dyn Quiesce>>) {
        match q {
            Some(q) if self.regions.iter().any(|r| r.id == id) => {
                self.quiescers.insert(id, q);
            }
            _ => {
                self.quiescers.remove(&id);
            }
        }
    }

    /// The count of threads waiting for the core ([`Core::someone_waits`]):
    /// the engine raises it around taking the core's lock.
    pub fn waiters(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.waiters.clone()
    }

    /// The pagemap reader (tests count its reads).
    #[cfg(any(test, feature = "testing"))]
    pub fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// The name of dedup group `g`.
    pub fn group_name(&self, g: u32) -> Option<&str> {
        self.ids.group_name(g)
    }

    /// Does a thread other than the scanner wait for the core
    /// ([`Core::waiters`])? Long work under the core stops at its next
    /// step boundary when one does.
    pub(super) fn someone_waits(&self) -> bool {
        self.waiters.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// Bounds the work of the wake-up that starts now (None: unbounded).
    /// A wake-up holds the core and sees the control state only when it
    /// starts: on a slow host (an emulated CPU, a loaded machine) a
    /// boosted batch of 65,536 pages can take tens of seconds, in which a
    /// mode change waits and the engine looks stalled.
    pub fn set_deadline(&mut self, at: Option<Instant>) {
        self.deadline = at;
    }

    /// Should long work under the core stop at this step boundary: a
    /// thread waits for the core, or the wake-up's time is up
    /// ([`Core::set_deadline`])?
    pub(super) fn should_stop(&self) -> bool {
        self.someone_waits() || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Is the wake-up's deadline more than [`DEADLINE_SLACK`] past?
    pub(super) fn overdue(&self) -> bool {
        self.deadline
            .is_some_and(|d| Instant::now() >= d + DEADLINE_SLACK)
    }

    /// Pages tracked in all regions.
    pub fn tracked_pages(&self) -> u64 {
        self.regions.iter().map(|r| r.npages as u64).sum()
    }

    /// Parks the threads running guest code (every registered VM's vCPUs)
    /// for a batch of `pages` page-table changes, when the batch is large
    /// enough (`quiesce_min_ops`): the batch's TLB flushes then stay on
    /// this CPU (`crate::quiesce`). Merges, unmerges and take-backs from
    /// KSM all flush per page or per VMA.
    /// A park lasts at most the pause budget at once: its owner calls
    /// [`pause::BoundedPark::checkpoint`] between the batch's steps.
    fn park_guests(&self, pages: usize) -> BoundedPark {
        self.park_guests_as(pages, park_costs::Way::Park)
    }

    /// [`Core::park_guests`], the way `way` says (a batch may run
    /// unparked, or park after a probe of its first pages).
    fn park_guests_as(&self, pages: usize, way: park_costs::Way) -> BoundedPark {
        let worth = self.quiesce_min_ops > 0 && pages >= self.quiesce_min_ops;
        match self.pause_budget {
            Some(budget) if worth && !self.quiescers.is_empty() => {
                let q = self.quiescers.values().cloned().collect();
                BoundedPark::start_as(q, Some(budget), self.park_costs, way)
            }
            _ => BoundedPark::none(self.park_costs),
        }
    }

    /// [`Core::park_guests`] for a batch of `ops` merges, which parks only
    /// when the host's measured costs say parking is cheaper for its size
    /// (`park_costs.rs`). The caller hands the costs back
    /// ([`pause::BoundedPark::finish`]).
    fn park_for_merges(&mut self, ops: usize) -> BoundedPark {
        let parks = !self.quiescers.is_empty() && self.pause_budget.is_some();
        if !parks {
            return self.park_guests(ops);
        }
        let way = self.park_costs.way(ops, self.pause_budget);
        self.park_guests_as(ops, way)
    }

    /// Frees the slots in `slots` that nothing maps any more: out of the
    /// stable index first, then the hole punch (docs/merge-races.md §12).
    fn release_slots(&mut self, slots: &[u32]) {
        let mut free = Vec::with_capacity(slots.len());
        for &s in slots {
            let st = self.pool.state(s);
            if st == SlotState::Free || self.pool.meta(s).mappers != 0 {
                continue;
            }
            let m = self.pool.meta(s);
            self.stable.remove(m.group, m.hash, s);
            free.push(s);
        }
        for e in self.pool.release_many(&mut free) {
            log::warn!("{e}");
        }
    }

    /// [`Core::release_slots`] for slots freed in bulk (a region leaving,
    /// an unmerge): when no page maps any slot any more, every slot goes
    /// in one hole punch over the file (`Pool::release_all`), not one each.
    fn release_unmapped(&mut self, freed: &[u32]) {
        if freed.is_empty() {
            return;
        }
        if self.pool.release_all() {
            self.stable.clear();
        } else {
            self.release_slots(freed);
        }
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            uffd: &self.uffd,
            prot: &self.prot,
            pagemap: &self.pagemap,
        }
    }

    fn locate(&self, gid: u32) -> Option<(usize, usize)> {
        locate_in(&self.regions, gid)
    }

    /// Heap bytes of engine metadata.
    pub fn metadata_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.metadata_bytes()).sum::<u64>()
            + self.pool.metadata_bytes()
            + self.stable.heap_bytes()
            + self.unstable.heap_bytes()
            + (self.scratch.capacity() * 8) as u64
    }

    /// Checks the engine's books against the kernel (tests): every pool
    /// slot's mapper count equals the pages whose state says they map it,
    /// and every page the engine believes merged is either not present or
    /// maps the pool (file bit); returns a description of the first problem.
    #[cfg(any(test, feature = "testing"))]
    pub fn check_consistency(&self) -> Result<(), String> {
        if self.pool.underflows > 0 {
            return Err(format!(
                "{} pool mapper-count underflows",
                self.pool.underflows
            ));
        }
        let mut count: HashMap<u32, u32> = HashMap::new();
        for &s in &self.orphans {
            *count.entry(s).or_default() += 1;
        }
        let vmas = pool_vmas(self.pool.raw_fd())?;
        for r in &self.regions {
            let mut e = vec![Entry(0); r.npages];
            self.pagemap
                .read(r.addr, &mut e)
                .map_err(|e| e.to_string())?;
            if !r.assisted {
                check_pool_mappings(r, &e, &vmas)?;
            }
            for (i, &ent) in e.iter().enumerate() {
                if region::kind(r.state[i]) == MERGED {
                    *count.entry(r.word[i]).or_default() += 1;
                    if ent.present() && !ent.file() {
                        // Broken share not yet noticed: allowed (next visit).
                        continue;
                    }
                    if self.pool.state(r.word[i]) != SlotState::Written {
                        return Err(format!(
                            "page {i} of {:?} maps slot {} in state {:?}",
                            r.id,
                            r.word[i],
                            self.pool.state(r.word[i])
                        ));
                    }
                }
            }
        }
        let mut live = 0;
        for (&s, &n) in &count {
            if self.pool.meta(s).mappers != n {
                return Err(format!(
                    "slot {s}: pool says {} mappers, pages say {n}",
                    self.pool.meta(s).mappers
                ));
            }
            live += 1;
        }
        if live != self.pool.live {
            return Err(format!(
                "pool live slots {} != mapped slots {live}",
                self.pool.live
            ));
        }
        // Slots a hardened group's discard left unmapped stay allocated
        // until the scanner's next wake-up (`Core::release_deferred`).
        let waiting: std::collections::HashSet<u32> = self
            .deferred_release
            .iter()
            .copied()
            .filter(|&s| self.pool.meta(s).mappers == 0 && self.pool.state(s) != SlotState::Free)
            .collect();
        if self.pool.slots_in_use() != live + waiting.len() as u64 {
            return Err(format!(
                "pool has {} slots allocated but {live} mapped and {} waiting to be freed",
                self.pool.slots_in_use(),
                waiting.len()
            ));
        }
        Ok(())
    }

    /// Sanity bound for tests: bytes per tracked page.
    #[cfg(any(test, feature = "testing"))]
    pub fn metadata_per_page(&self) -> f64 {
        let t = self.tracked_pages().max(1);
        let fixed = (self.scratch.capacity() * 8) as u64;
        (self.metadata_bytes() - fixed) as f64 / t as f64
    }
}

/// The private mappings of the pool memfd `fd` in this process (the pool
/// VMAs merges make), as (start, end, file offset), sorted by address.
#[cfg(any(test, feature = "testing"))]
fn pool_vmas(fd: std::os::fd::RawFd) -> Result<Vec<(usize, usize, u64)>, String> {
    // SAFETY: fstat writes into the zeroed struct it is given; `fd` is the
    // pool's open memfd.
    let inode = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(format!("fstat pool: {}", std::io::Error::last_os_error()));
        }
        st.st_ino
    };
    let maps = procfs::process::Process::myself()
        .and_then(|p| p.maps())
        .map_err(|e| format!("/proc/self/maps: {e}"))?;
    Ok(maps
        .into_iter()
        .filter(|m| m.inode == inode && m.perms.contains(procfs::process::MMPermissions::PRIVATE))
        .map(|m| (m.address.0 as usize, m.address.1 as usize, m.offset))
        .collect())
}

/// Region `r`'s pages against the pool VMAs (`vmas`, sorted) and their
/// pagemap entries `e`: a MERGED page lies in a pool VMA at its slot's
/// offset (where it reads its slot, or its copy-on-write copy not yet
/// noticed), and a page the books do not count as merged that lies in a
/// pool VMA has a page of its own there (a copy made on write), never the
/// pool page itself, which its slot's mapper count would then leave out.
/// These are what the host kernel's page tables count (the Linux-guest
/// tests' audit), beyond the books' own agreement.
#[cfg(any(test, feature = "testing"))]
fn check_pool_mappings(
    r: &Region,
    e: &[Entry],
    vmas: &[(usize, usize, u64)],
) -> Result<(), String> {
    let first = vmas.partition_point(|v| v.1 <= r.addr);
    let mut v = vmas[first..].iter().peekable();
    for (i, &ent) in e.iter().enumerate() {
        let a = r.page_addr(i);
        while v.peek().is_some_and(|x| x.1 <= a) {
            v.next();
        }
        let offset = v
            .peek()
            .filter(|x| x.0 <= a)
            .map(|x| x.2 + (a - x.0) as u64);
        let merged = region::kind(r.state[i]) == MERGED;
        match offset {
            None if merged => {
                return Err(format!(
                    "page {i} of {:?} is merged with slot {} but lies outside the pool VMAs",
                    r.id, r.word[i]
                ));
            }
            Some(o) if merged && o != r.word[i] as u64 * crate::PAGE_SIZE as u64 => {
                return Err(format!(
                    "page {i} of {:?} is merged with slot {} but maps pool offset {o:#x}",
                    r.id, r.word[i]
                ));
            }
            Some(o) if !merged && ent.no_page() => {
                return Err(format!(
                    "page {i} of {:?} (state {:#x}) reads pool offset {o:#x}, which its books do not count",
                    r.id, r.state[i]
                ));
            }
            _ => {}
        }
    }
    Ok(())
}
