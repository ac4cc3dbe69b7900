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
//! budget) and `unmerge.rs`; this file holds the state, the constants and
//! region registration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::assist::{AssistConfig, Census, KsmAssist};
use crate::backend::{Knobs, RegionId};
use crate::fault::ProtState;
use crate::hash::{fold, HashFn};
use crate::index::{StableIndex, UnstableIndex};
use crate::merge::{self, Ctx, MapBudget, Op, OpKind, CHUNK_PAGES, GAPPED_WINDOW_PAGES};
use crate::mm;
use crate::pagemap::{Entry, Pagemap, PM_PRESENT};
use crate::pool::{Pool, SlotState};
use crate::quiesce::{Parked, Quiesce};
use crate::region::{self, GuestPage, Region, HASHED, MAX_LEVEL, MERGED, NEW, ZERO};
use crate::uffd::Uffd;
use crate::writelog::{WriteLog, Written, VERIFY_BLOCK, VERIFY_PASSES};

mod batch;
mod budget;
mod choose;
mod execute;
mod handover;
mod hints;
mod logs;
mod span;
mod unmerge;
mod visit;

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
/// waiting for the core (VM creation or deletion). A span of scattered
/// pages can plan thousands of merges, and a VM's creation would wait for
/// all of them; this many keep that wait to tens of milliseconds on a
/// loaded machine. Planning checks for a waiter as it goes, and so does the
/// execution (a waiter who came after the plan: the planned merges left are
/// abandoned, see `Core::execute`). Without a waiter spans run whole (one
/// pagemap read and one vCPU park each).
const OPS_BEFORE_YIELD: usize = 512;
/// Visit units: a hashed page costs `HASH_COST`, a pagemap-only visit 1
/// (a wake-up of N page visits has N x `HASH_COST` units to spend).
const HASH_COST: u64 = 4;
/// Longest a batch walks KSM's regions for the census (the core lock is
/// held meanwhile): a census of gigabytes of KSM regions takes far longer
/// than a wake-up should, so it is done in slices, on consecutive wake-ups
/// (see [`BatchReport::census_pending`]).
const CENSUS_SLICE: Duration = Duration::from_millis(20);
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
    #[error(transparent)]
    Pagemap(#[from] crate::pagemap::PagemapError),
    #[error(transparent)]
    Pool(#[from] crate::pool::PoolError),
    #[error(transparent)]
    Uffd(#[from] crate::uffd::UffdError),
    #[error(transparent)]
    Region(#[from] crate::region::RegionError),
    #[error("region {addr:#x}+{len:#x} overlaps a registered region")]
    Overlap { addr: usize, len: usize },
    #[error("unknown region id {0}")]
    Unknown(u64),
    #[error("KSM assist: {0}")]
    Assist(String),
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
    pub merges: u64,
    pub zero_merges: u64,
    pub cow_breaks: u64,
    pub abandoned: u64,
    /// Of `abandoned`: planned merges left unexecuted for a thread waiting
    /// for the core (`Core::execute`).
    pub left_for_waiters: u64,
    pub pages_hashed: u64,
    /// Due visits that the write log answered: no pagemap read, no hash.
    pub clean_visits: u64,
    /// Transparent huge pages split before a merge replaced part of them
    /// (`mm::split_huge_page_at` calls).
    pub huge_pages_split: u64,
}

/// What one wake-up did.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchReport {
    pub merges: u64,
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
    /// waited for the core (see [`Core::waiters`]).
    pub yielded: bool,
}

/// How long after the last census the next one is due, given what the last
/// one cost. When KSM has finished a full scan since (what it merged in it
/// is counted at once: the figure a converging group settles on), at most
/// 5 % of a core (20x the cost apart, and 1 s); in between, while KSM
/// works, at most 2 % (50x apart: progress shows); once it idles, every
/// 2 s at most 0.5 % (200x apart, so that the engine's share of an idle
/// assisted group costs about what idle KSM at its defaults does).
fn census_interval(cost: Duration, ksm_scanned: bool, ksm_busy: bool) -> Duration {
    let floor = Duration::from_secs(1).max(cost * 20);
    if ksm_scanned {
        floor
    } else if ksm_busy {
        floor.max(cost * 50)
    } else {
        Duration::from_secs(2).max(cost * 200)
    }
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
}

/// A device-filled range waiting for the scanner (see `Core::run_hints`).
#[derive(Debug, Clone, Copy)]
pub struct Hint {
    pub addr: usize,
    pub len: usize,
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
    pub regions: Vec<Region>,
    /// Per region, how to park the threads running guest code in it around
    /// a batch of merges (`crate::quiesce`).
    pub quiescers: HashMap<RegionId, Arc<dyn Quiesce>>,
    /// Batches of at least this many ops park them (0: never).
    pub quiesce_min_ops: usize,
    pub pool: Pool,
    pub stable: StableIndex,
    pub unstable: UnstableIndex,
    pub pagemap: Pagemap,
    pub uffd: Arc<Uffd>,
    pub prot: Arc<Mutex<ProtState>>,
    pub hash_fn: HashFn,
    pub zero_hash: u32,
    pub zero_pfn: u64,
    pub knobs: Knobs,
    pub stripe_max: u32,
    pub counters: Counters,
    /// Passes in a row that made no progress (drives the adaptive sleep).
    pub idle_passes: u32,
    pub map_limited: bool,
    pub map_headroom: u64,
    pub max_map_count: u64,
    groups: HashMap<String, u32>,
    next_gid: u64,
    next_region_id: u64,
    cursor_region: usize,
    cursor_page: usize,
    pass_progress: u64,
    /// Pages hashed for the first time, ever (see `BatchReport::fresh`).
    fresh_hashed: u64,
    map_checked: Option<Instant>,
    map_vmas: u64,
    /// VMAs the engine may still create (the process map-count limit).
    map_budget: MapBudget,
    scratch: Vec<Entry>,
    /// Content hash and length of the same-content run ending at the last
    /// visited page (sizes stripes).
    run_hash: u32,
    run_len: u32,
    /// The hash is xxh3 (64-bit equality then stands in for a content
    /// pre-check when planning); false with a test hash override.
    pub strong_hash: bool,
    /// High half of the current page's 64-bit hash (set by `visit`).
    cur_hi: u32,
    /// Kernel KSM for scattered groups (see `assist.rs`).
    pub assist: KsmAssist,
    /// This pass's merges per group.
    pass_groups: HashMap<u32, GroupPass>,
    /// `pass_groups` of the last completed pass.
    last_pass_groups: HashMap<u32, GroupPass>,
    /// (PFN, region `gid_base`) of present anonymous pages of assisted
    /// regions seen this pass; counted at the pass end.
    census_pages: Vec<(u64, u32)>,
    /// KSM sharing among our assisted regions, as of the last pass.
    pub census: Census,
    /// This pass collects the census (at most one a second: sorting a
    /// frame list per pass would cost more than the pass itself).
    census_due: bool,
    /// Threads other than the scanner waiting for the core (VM creation and
    /// deletion through the engine's API): a batch ends at its next span
    /// boundary when this is non-zero, so they wait for one span, not for a
    /// whole batch (seconds at high `pages_to_scan` on scattered regions).
    /// Shared with the engine, which counts.
    pub waiters: Arc<std::sync::atomic::AtomicUsize>,
    census_at: Option<Instant>,
    /// `map_budget.headroom` right after the last maps read.
    headroom_at_check: i64,
    /// Time spent on assisted spans in this census pass, and what the last
    /// census pass cost in all.
    census_spans: Duration,
    census_cost: Duration,
    /// Time spent on assisted census spans in the current batch.
    census_slice: Duration,
    /// Counters at the last per-region recount (see `end_pass`).
    recount_key: (u64, u64, u64, u64),
    /// Slot references of pages that still mapped their slot when their
    /// region left after a failed unmerge (one entry per page). The owner
    /// keeps using that memory, so those slots are never freed.
    orphans: Vec<u32>,
    /// Set while visiting hinted pages: they were just filled by a device,
    /// so they are merge candidates on their first visit (no "unchanged
    /// since the previous scan" wait, no smart-scan skip).
    trusted: bool,
    /// Hinted pages without a partner yet, `(group << 32 | hash) -> page
    /// id`, kept across passes (the unstable index forgets every pass) so a
    /// second VM's read of the same file finds the first's pages; FIFO.
    hint_index: HashMap<u64, u32>,
    hint_fifo: std::collections::VecDeque<u64>,
    /// Merges made on hinted visits and the sum of their delays (seconds).
    pub hint_merges: u64,
    pub hint_delay_sum: f64,
    /// While visiting hinted ranges: the merge ops planned so far, executed
    /// once at the end of the visit (one vCPU park for all ranges of a
    /// wake-up instead of one per range).
    deferred: Option<Vec<Op>>,
    /// Page ids whose hash changed at their last visit in a logged region:
    /// looked at again at the next wake-up (`run_rechecks`), not the next
    /// pass.
    recheck: Vec<u32>,
}

/// Most pages queued for a second look (`Core::recheck`); more wait for
/// the next pass as without a write log.
const RECHECK_CAP: usize = 1 << 16;

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
        let mut c = Core {
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
            map_limited: false,
            map_headroom: 0,
            max_map_count: crate::mm::max_map_count(),
            groups: HashMap::new(),
            next_gid: 0,
            next_region_id: 1,
            cursor_region: 0,
            cursor_page: 0,
            pass_progress: 0,
            fresh_hashed: 0,
            map_checked: None,
            map_vmas: 0,
            map_budget: MapBudget::default(),
            scratch: Vec::new(),
            run_hash: 0,
            run_len: 0,
            strong_hash,
            quiescers: HashMap::new(),
            quiesce_min_ops: DEFAULT_QUIESCE_MIN_OPS,
            cur_hi: 0,
            assist: KsmAssist::new(AssistConfig::default()),
            pass_groups: HashMap::new(),
            last_pass_groups: HashMap::new(),
            census_pages: Vec::new(),
            census: Census::default(),
            census_due: true,
            waiters: Arc::default(),
            census_at: None,
            headroom_at_check: i64::MIN,
            census_spans: Duration::ZERO,
            census_cost: Duration::ZERO,
            census_slice: Duration::ZERO,
            recount_key: (u64::MAX, 0, 0, 0),
            orphans: Vec::new(),
            trusted: false,
            hint_index: HashMap::new(),
            hint_fifo: std::collections::VecDeque::new(),
            hint_merges: 0,
            hint_delay_sum: 0.0,
            deferred: None,
            recheck: Vec::new(),
        };
        c.refresh_map_count(true);
        Ok(c)
    }

    /// A core with no engine thread and no regions, at max effort
    /// (`max_page_sharing` 256, xxh3, 64-bit hash checks): what tests
    /// drive pass by pass.
    #[cfg(any(test, feature = "testing"))]
    pub fn driven(pool_max_bytes: u64) -> Result<Self, ScanError> {
        Core::new(
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
        )
    }

    /// The name of dedup group `g`.
    pub fn group_name(&self, g: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|(_, &id)| id == g)
            .map(|(n, _)| n.as_str())
    }

    /// Does a thread other than the scanner wait for the core
    /// ([`Core::waiters`])? Long work under the core stops at its next
    /// step boundary when one does.
    pub(super) fn someone_waits(&self) -> bool {
        self.waiters.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// Pages tracked in all regions.
    pub fn tracked_pages(&self) -> u64 {
        self.regions.iter().map(|r| r.npages as u64).sum()
    }

    /// Adds a region and registers it with the uffd.
    ///
    /// # Safety
    /// `addr..addr + len` must be a private anonymous mapping of this
    /// process that stays mapped while the region is registered: until
    /// [`Core::unregister`] for the returned id has returned, or the core
    /// is dropped. Until then the engine reads it, write-protects it,
    /// and replaces its pages with mappings that hold the same bytes
    /// (`mm::map_pool_fixed` and the other primitives of the merge path).
    pub unsafe fn register(
        &mut self,
        addr: usize,
        len: usize,
        owner: String,
        group: String,
    ) -> Result<RegionId, ScanError> {
        // Before the overlap check, which needs `addr + len`.
        region::check_bounds(addr, len)?;
        let end = addr + len;
        if self
            .regions
            .iter()
            .any(|r| addr < r.addr + r.len() && r.addr < end)
        {
            return Err(ScanError::Overlap { addr, len });
        }
        let gnext = self.groups.len() as u32;
        let gid = *self.groups.entry(group.clone()).or_insert(gnext);
        let id = RegionId(self.next_region_id);
        let base = u32::try_from(self.next_gid).map_err(|_| region::RegionError::TooManyPages)?;
        let mut r = Region::new(id, addr, len, owner, group, gid, base)?;
        r.huge = mm::thp_possible();
        self.uffd.register_wp(addr, len)?;
        r.slot_base = self.pool.open_window(r.npages);
        self.next_region_id += 1;
        self.next_gid += r.npages as u64;
        self.prot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .regions
            .push((addr, end));
        self.regions.push(r);
        self.grow_unstable();
        if self.assist.group() == Some(gid) {
            let ri = self.regions.len() - 1;
            self.hand_to_ksm(ri);
        }
        Ok(id)
    }

    /// Sizes the unstable index for every tracked page, keeping this pass's
    /// entries (their key is the stored hash of a still-HASHED page).
    fn grow_unstable(&mut self) {
        let pages = self.tracked_pages() as usize;
        let regions = &self.regions;
        // A stale id of a removed region is dropped by `locate_in` (its
        // bounds check), never read past a region's end.
        let key_of = |gid: u32| -> Option<u32> {
            let (ri, p) = locate_in(regions, gid)?;
            let r = &regions[ri];
            (region::kind(r.state[p]) == HASHED).then(|| r.word[p])
        };
        self.unstable.grow(pages, key_of);
    }

    /// Removes a region. With `unmerge`, its merged pages first get private
    /// copies back (the memory stays usable); without, the caller promised
    /// to unmap it right away, so its pool references are simply dropped,
    /// and the region's mappings are first replaced by one fresh anonymous
    /// mapping (see [`Core::drop_mappings`]).
    ///
    /// # Safety
    /// Without `unmerge`, the region's memory reads as zeros afterwards: the
    /// caller never reads or writes it again (it is about to unmap it).
    /// With `unmerge` there is nothing to guarantee.
    pub unsafe fn unregister(&mut self, id: RegionId, unmerge: bool) -> Result<(), ScanError> {
        self.quiescers.remove(&id);
        let ri = self
            .regions
            .iter()
            .position(|r| r.id == id)
            .ok_or(ScanError::Unknown(id.0))?;
        if unmerge && !self.take_from_ksm(ri) {
            return Err(ScanError::Assist(
                "could not take the region back from KSM".into(),
            ));
        }
        // SAFETY: without `unmerge`, this function's caller never touches
        // the region again (its contract).
        let dropped = !unmerge && unsafe { self.drop_mappings(ri) };
        let mut freed = Vec::new();
        if unmerge {
            // Retry a few times: a page that cannot be protected right now
            // (e.g. a concurrent discard) is rare and transient.
            for _ in 0..3 {
                if self.unmerge_region(ri, &mut freed, false) == Some(0) {
                    break;
                }
            }
        }
        {
            let r = &mut self.regions[ri];
            let orphans_before = self.orphans.len();
            for i in 0..r.npages {
                if region::kind(r.state[i]) == MERGED {
                    let s = r.word[i];
                    if unmerge {
                        // The unmerge failed here, so the page still maps
                        // its slot, and the owner goes on using the memory.
                        // Freeing the slot would make the page read zeros,
                        // and later another page's content: its reference
                        // stays, and the slot is kept (docs/merge-races.md
                        // §14).
                        self.orphans.push(s);
                    } else if drop_mapper(&mut self.pool, &mut self.stable, s) == 0 {
                        freed.push(s);
                    }
                    r.set_kind(i, NEW);
                }
            }
            let kept = self.orphans.len() - orphans_before;
            if kept > 0 {
                log::warn!(
                    "region {} left with {kept} pages it could not unmerge; \
                     their pool pages stay allocated while this process runs",
                    id.0
                );
            }
        }
        let r = self.regions.remove(ri);
        if let Some(b) = r.slot_base {
            self.pool.close_window(b);
        }
        if !dropped {
            let _ = self.uffd.unregister(r.addr, r.len());
        }
        {
            let mut p = self.prot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(pos) = p
                .regions
                .iter()
                .position(|&x| x == (r.addr, r.addr + r.len()))
            {
                p.regions.swap_remove(pos);
            }
        }
        self.release_unmapped(&freed);
        self.release_assist_if_unused();
        if ri < self.cursor_region {
            self.cursor_region -= 1;
        } else if ri == self.cursor_region {
            self.cursor_page = 0;
        }
        if self.cursor_region >= self.regions.len() {
            self.cursor_region = 0;
        }
        Ok(())
    }

    /// Replaces region `ri`'s mappings (one VMA per scattered merge) with
    /// one fresh anonymous mapping, for a region its owner unmaps right
    /// after: one unmap of every VMA, one batch of TLB flushes. Without it,
    /// the uffd unregistration (a write-protect clear and TLB flush per VMA)
    /// and the hole punches of the freed slots (a zap and flush per VMA still
    /// mapping them) would each interrupt the CPUs running the other VMs'
    /// vCPUs, once per VMA. The new mapping is not registered with
    /// userfaultfd, and nothing maps the freed slots any more when they are
    /// punched. False (nothing changed) when the mmap fails.
    ///
    /// # Safety
    /// The region's owner never reads or writes it again (it is about to
    /// unmap it).
    unsafe fn drop_mappings(&self, ri: usize) -> bool {
        let r = &self.regions[ri];
        // SAFETY: the region is a page-aligned private mapping of this
        // process (register contract) that nothing reads or writes again
        // (this function's contract).
        match unsafe { crate::mm::map_anon_fixed(r.addr, r.len()) } {
            Ok(()) => true,
            Err(e) => {
                log::warn!("dropping the mappings of region {}: {e}", r.id.0);
                false
            }
        }
    }

    /// Parks the threads running guest code (every registered VM's vCPUs)
    /// for a batch of `pages` page-table changes, when the batch is large
    /// enough (`quiesce_min_ops`): the batch's TLB flushes then stay on
    /// this CPU (`crate::quiesce`). Merges, unmerges and take-backs from
    /// KSM all flush per page or per VMA.
    pub(super) fn park_guests(&self, pages: usize) -> Option<Parked> {
        (self.quiesce_min_ops > 0 && pages >= self.quiesce_min_ops && !self.quiescers.is_empty())
            .then(|| Parked::park(self.quiescers.values()))
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
        for r in &self.regions {
            let mut e = vec![Entry(0); r.npages];
            self.pagemap
                .read(r.addr, &mut e)
                .map_err(|e| e.to_string())?;
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
        if self.pool.slots_in_use() != live {
            return Err(format!(
                "pool has {} slots allocated but {live} mapped",
                self.pool.slots_in_use()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn census_pace_keeps_each_state_within_its_share_of_a_core() {
        let ms = Duration::from_millis;
        // Cheap censuses: the time floors rule.
        assert_eq!(census_interval(ms(2), true, true), ms(1000));
        assert_eq!(census_interval(ms(2), false, true), ms(1000));
        assert_eq!(census_interval(ms(2), false, false), ms(2000));
        // 2 x 2 GiB (~150 ms a census): 5 %, 2 %, 0.5 % of a core.
        let c = ms(150);
        for (scanned, busy, share) in [
            (true, true, 0.05),
            (false, true, 0.02),
            (false, false, 0.005),
        ] {
            let every = census_interval(c, scanned, busy);
            let got = c.as_secs_f64() / every.as_secs_f64();
            assert!((got - share).abs() < 1e-9, "{scanned} {busy}: {got}");
        }
        // A finished KSM scan is counted sooner than anything else.
        assert!(census_interval(c, true, false) < census_interval(c, false, true));
    }
}
