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
//!   means still merged (merge-races 4). Never re-hashed.
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
//! Merges are planned during the span and executed at its end in chunks
//! (`merge.rs`): first the pages that create pool slots, then those that join
//! them. Planned pages are provisionally marked merged so no other page plans
//! with them; failures restore them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::assist::{AssistConfig, Census, KsmAssist};
use crate::backend::{Knobs, RegionId};
use crate::fault::ProtState;
use crate::hash::{fold, is_zero, sampled_lines_agree, HashFn};
use crate::index::{StableIndex, UnstableIndex};
use crate::merge::{self, Ctx, MapBudget, Op, OpKind, CHUNK_PAGES};
use crate::pagemap::{Entry, Pagemap, PM_PRESENT};
use crate::pool::{Pool, SlotState};
use crate::quiesce::{Parked, Quiesce};
use crate::region::{self, Region, HASHED, MAX_LEVEL, MERGED, NEW, ZERO};
use crate::uffd::Uffd;
use crate::writelog::{WriteLog, Written, VERIFY_BLOCK, VERIFY_PASSES};

/// Pages per pagemap read.
pub const SPAN_PAGES: usize = 4096;
/// Visit units: a hashed page costs `HASH_COST`, a pagemap-only visit 1
/// (a wake-up of N page visits has N x `HASH_COST` units to spend).
const HASH_COST: u64 = 4;
/// Longest a batch walks KSM's regions for the census (the core lock is
/// held meanwhile): a census of 2 x 2 GiB takes ~150 ms, so it is done in
/// slices, on consecutive wake-ups (see [`BatchReport::census_pending`]).
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
    pub pages_hashed: u64,
    /// Due visits that the write log answered: no pagemap read, no hash.
    pub clean_visits: u64,
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
}

/// How long after the last census the next one is due, given what the last
/// one cost. When KSM has finished a full scan since (what it merged in it
/// is counted at once: the figure a converging group settles on), at most
/// 5 % of a core (20x the cost apart, and 1 s); in between, while KSM
/// works, at most 2 % (50x apart: progress shows); once it idles, every
/// 2 s at most 0.5 % (200x apart: 2 x 512 MiB take ~36 ms, so ~7 s apart,
/// and the engine's share of an idle assisted group then costs about what
/// idle KSM at its defaults does).
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
/// every batch. Two-VM build benchmark, engine CPU: 2.38 s never parking,
/// 1.76 s from 4 ops, 1.67 s from 16, 1.00 s from 1 (and the build 18 %
/// faster than never parking): one merge's flushes, while a vCPU runs on
/// the other CPU, cost more than a park and resume.
/// `PAGEFOLD_QUIESCE_MIN_OPS` overrides it (0 turns it off), for
/// side-by-side measurements.
fn quiesce_min_ops() -> usize {
    std::env::var("PAGEFOLD_QUIESCE_MIN_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

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
            quiesce_min_ops: quiesce_min_ops(),
            cur_hi: 0,
            assist: KsmAssist::new(AssistConfig::default()),
            pass_groups: HashMap::new(),
            last_pass_groups: HashMap::new(),
            census_pages: Vec::new(),
            census: Census::default(),
            census_due: true,
            census_at: None,
            headroom_at_check: i64::MIN,
            census_spans: Duration::ZERO,
            census_cost: Duration::ZERO,
            census_slice: Duration::ZERO,
            recount_key: (u64::MAX, 0, 0, 0),
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

    /// The name of dedup group `g`.
    pub fn group_name(&self, g: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|(_, &id)| id == g)
            .map(|(n, _)| n.as_str())
    }

    /// Pages tracked in all regions.
    pub fn tracked_pages(&self) -> u64 {
        self.regions.iter().map(|r| r.npages as u64).sum()
    }

    /// Adds a region and registers it with the uffd.
    pub fn register(
        &mut self,
        addr: usize,
        len: usize,
        owner: String,
        group: String,
    ) -> Result<RegionId, ScanError> {
        if len == 0
            || addr % crate::PAGE_SIZE != 0
            || len % crate::PAGE_SIZE != 0
            || addr.checked_add(len).is_none()
        {
            return Err(region::RegionError::Bad { addr, len }.into());
        }
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
        let r = Region::new(id, addr, len, owner, group, gid, base)?;
        self.uffd.register_wp(addr, len)?;
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

    /// Makes region `ri` KSM's: `MADV_MERGEABLE`, after which the engine only
    /// watches its own earlier merges there. Called between spans, when the
    /// engine holds no page of it write-protected (assist.rs).
    fn hand_to_ksm(&mut self, ri: usize) {
        let r = &mut self.regions[ri];
        match crate::mm::madvise(r.addr, r.len(), libc::MADV_MERGEABLE) {
            Ok(()) => r.assisted = true,
            Err(e) => log::warn!("pagefold: KSM assist: {e}"),
        }
    }

    /// Takes region `ri` back from KSM: `MADV_UNMERGEABLE` gives every KSM
    /// page of it a private copy and, holding the mmap lock, waits out any
    /// merge ksmd has in flight there, so the engine may protect its pages
    /// again afterwards. Returns false (region stays KSM's) on failure.
    fn take_from_ksm(&mut self, ri: usize) -> bool {
        let r = &mut self.regions[ri];
        if !r.assisted {
            return true;
        }
        match crate::mm::madvise(r.addr, r.len(), libc::MADV_UNMERGEABLE) {
            Ok(()) => {
                r.assisted = false;
                r.ksm_merged = 0;
                r.ksm_saved = 0.0;
                // Unmerged pages keep stale hashes and levels: revisit them.
                for i in 0..r.npages {
                    if region::kind(r.state[i]) == HASHED {
                        r.set_kind(i, NEW);
                        r.state[i] = region::with_level(r.state[i], 0);
                    }
                }
                true
            }
            Err(e) => {
                log::warn!("pagefold: KSM assist: giving region back: {e}");
                false
            }
        }
    }

    /// Ends the assist once no region is KSM's any more.
    fn release_assist_if_unused(&mut self) {
        if self.assist.group().is_some() && !self.regions.iter().any(|r| r.assisted) {
            self.assist.disengage();
            self.census = Census::default();
        }
    }

    /// Takes every region back from KSM and ends the assist (unmerge mode).
    pub fn end_assist(&mut self) {
        for ri in 0..self.regions.len() {
            self.take_from_ksm(ri);
        }
        self.release_assist_if_unused();
    }

    /// Counts merges planned this pass in `group`: pages and the new VMAs
    /// they start (those that do not extend the left neighbour's run).
    fn note_planned(&mut self, group: u32, pages: u64, new_vmas: u64) {
        let g = self.pass_groups.entry(group).or_default();
        g.merged += pages;
        g.new_vmas += new_vmas;
    }

    /// Does `group` merge scattered pages (at least one new VMA per two
    /// pages merged, over at least 16 merges in this pass or the last)?
    fn merges_scattered(&self, group: u32) -> bool {
        let scattered = |g: &GroupPass| g.merged >= 16 && g.new_vmas * 2 >= g.merged;
        self.pass_groups.get(&group).is_some_and(scattered)
            || self.last_pass_groups.get(&group).is_some_and(scattered)
    }

    /// The group's merges this pass are scattered (many new VMAs, few pages
    /// each) and KSM could take them: the engine makes no more new VMAs.
    fn scattered_now(&self, group: u32) -> bool {
        if !self.assist.can_try() {
            return false;
        }
        let cfg = self.assist.cfg;
        let g = self.pass_groups.get(&group).copied().unwrap_or_default();
        if g.new_vmas < cfg.flip_vmas {
            return false;
        }
        let pages: u64 = self
            .regions
            .iter()
            .filter(|r| r.group == group)
            .map(|r| r.npages as u64)
            .sum();
        if g.new_vmas < cfg.judge_at(pages, self.max_map_count) {
            return false;
        }
        g.merged < cfg.flip_run_pages.saturating_mul(g.new_vmas)
    }

    /// Hands `group` to KSM if its merges this pass look scattered (many new
    /// VMAs for few pages) or the VMA budget refused merges with partners.
    fn maybe_assist(&mut self, group: u32) {
        if !self.assist.can_try() {
            return;
        }
        let g = self.pass_groups.get(&group).copied().unwrap_or_default();
        let cfg = self.assist.cfg;
        if !self.scattered_now(group) && g.deferred < cfg.flip_deferred {
            return;
        }
        if let Err(why) = self.assist.engage(group) {
            self.assist.failed(why);
            return;
        }
        log::info!(
            "pagefold: handing group {group} to kernel KSM ({} new VMAs for {} merged pages, {} deferred this pass)",
            g.new_vmas,
            g.merged,
            g.deferred
        );
        for ri in 0..self.regions.len() {
            if self.regions[ri].group == group {
                self.hand_to_ksm(ri);
            }
        }
        self.release_assist_if_unused();
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
    /// to unmap it right away, so its pool references are simply dropped.
    pub fn unregister(&mut self, id: RegionId, unmerge: bool) -> Result<(), ScanError> {
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
        let mut freed = Vec::new();
        if unmerge {
            // Retry a few times: a page that cannot be protected right now
            // (e.g. a concurrent discard) is rare and transient.
            for _ in 0..3 {
                if self.unmerge_region(ri, &mut freed) == 0 {
                    break;
                }
            }
        }
        {
            let r = &mut self.regions[ri];
            for i in 0..r.npages {
                if region::kind(r.state[i]) == MERGED {
                    let s = r.word[i];
                    if self.pool.remove_mapper(s) == 0 {
                        freed.push(s);
                    }
                    r.set_kind(i, NEW);
                }
            }
        }
        let r = self.regions.remove(ri);
        let _ = self.uffd.unregister(r.addr, r.len());
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
        self.pool.trim_if_empty();
        Ok(())
    }

    /// Frees the slots in `slots` that nothing maps any more: out of the
    /// stable index first, then the hole punch (merge-races 5).
    fn release_slots(&mut self, slots: &[u32]) {
        for &s in slots {
            let st = self.pool.state(s);
            if st == SlotState::Free || self.pool.meta(s).mappers != 0 {
                continue;
            }
            let m = self.pool.meta(s);
            self.stable.remove(m.group, m.hash, s);
            if let Err(e) = self.pool.release(s) {
                log::warn!("pagefold: {e}");
            }
        }
    }

    /// [`Core::release_slots`] for slots freed in bulk (a region leaving,
    /// an unmerge): when no page maps any slot any more, every slot goes
    /// in one truncate (`Pool::release_all`), not a hole punch each.
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

    /// Gives every page of region `ri` that lies in a pool VMA (merged, or
    /// merged and copied-on-write since) a private anonymous mapping again;
    /// returns the pages left in pool VMAs. Slots nothing maps any more are
    /// added to `freed`, for the caller to release (`release_unmapped`):
    /// they stay in the stable index until then, which is safe because
    /// nothing merges while the core is held here.
    pub fn unmerge_region(&mut self, ri: usize, freed: &mut Vec<u32>) -> u64 {
        let npages = self.regions[ri].npages;
        let mut left = 0;
        let mut i = 0;
        while i < npages {
            if !self.regions[ri].in_pool(i) {
                i += if i % 64 == 0 && self.regions[ri].in_pool[i / 64] == 0 {
                    64
                } else {
                    1
                };
                continue;
            }
            let s = i;
            while i < npages && i - s < merge::UNMERGE_CHUNK_PAGES && self.regions[ri].in_pool(i) {
                i += 1;
            }
            let addr = self.regions[ri].page_addr(s);
            let r = &self.regions[ri];
            let slots: Vec<Option<*const u8>> = (s..i)
                .map(|p| {
                    (region::kind(r.state[p]) == MERGED)
                        .then(|| self.pool.page_ptr(r.word[p]) as *const u8)
                })
                .collect();
            let ok = {
                let ctx = self.ctx();
                merge::unmerge_chunk(&ctx, addr, i - s, &slots)
            };
            match ok {
                Ok(true) => {
                    for p in s..i {
                        let r = &mut self.regions[ri];
                        r.set_in_pool(p, false);
                        if region::kind(r.state[p]) != MERGED {
                            continue;
                        }
                        let slot = r.word[p];
                        r.set_kind(p, NEW);
                        if self.pool.remove_mapper(slot) == 0 {
                            freed.push(slot);
                        }
                    }
                }
                Ok(false) => left += (i - s) as u64,
                Err(e) => {
                    log::warn!("pagefold: unmerge: {e}");
                    left += (i - s) as u64;
                }
            }
        }
        left
    }

    /// Unmerges every region (mode `unmerge`); returns pages left merged.
    pub fn unmerge_all(&mut self) -> u64 {
        // KSM first: no engine protection may meet a KSM merge.
        self.end_assist();
        let mut left = 0;
        let mut freed = Vec::new();
        for ri in 0..self.regions.len() {
            left += self.unmerge_region(ri, &mut freed);
        }
        self.release_unmapped(&freed);
        if left == 0 {
            self.pool.trim_if_empty();
        }
        self.unstable.reset(0);
        left
    }

    /// Installs the KSM assist's configuration, before any merge. The VMA
    /// budget depends on it (with KSM to take over, the engine keeps to half
    /// of the process's limit), so the budget is recomputed at once from
    /// `new`'s maps read (nothing has used it since): a budget left from
    /// before would hold until the next read, 10 s later, and let the
    /// engine's first pass of a large scattered group fill the whole limit.
    pub(crate) fn set_assist(&mut self, cfg: AssistConfig) {
        self.assist = KsmAssist::new(cfg);
        self.set_budget();
    }

    /// Re-reads the VMA count: at most every 10 s unless `force` or the
    /// running estimate (decremented per VMA we create) gets low. Reading
    /// /proc/self/maps costs about 1 us per VMA.
    pub fn refresh_map_count(&mut self, force: bool) {
        // "Low" re-reads (at most every second) only matter near the end of
        // the budget while the engine is still making VMAs. The running
        // estimate charges each new run the two VMAs a scattered merge
        // really costs, so a re-read far from the end finds the headroom
        // it already had, at ~1.5 us per VMA: two reads at 20k VMAs were
        // 65 ms of a 580 ms engine in `bench build`.
        let low = self.map_budget.headroom < (self.max_map_count / 64).max(256) as i64
            && self.map_budget.headroom != self.headroom_at_check;
        if !force
            && !low
            && self
                .map_checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        if !force
            && low
            && self
                .map_checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.map_checked = Some(Instant::now());
        if let Ok(n) = crate::mm::vma_count() {
            self.map_vmas = n;
        }
        self.max_map_count = crate::mm::max_map_count();
        self.map_headroom = self.max_map_count.saturating_sub(self.map_vmas);
        self.set_budget();
    }

    /// The VMA budget from the last maps read and the reserve.
    fn set_budget(&mut self) {
        // Keep 1/16 of the limit for everything else in the process; with
        // KSM to take over scattered merges, the engine keeps to half of it.
        let reserve = if self.assist.enabled() {
            self.max_map_count / 2
        } else {
            self.max_map_count / 16
        };
        self.map_budget.headroom = self.map_headroom as i64 - reserve as i64;
        self.map_budget.limited = self.map_budget.headroom < 2;
        self.headroom_at_check = self.map_budget.headroom;
        self.map_limited = self.map_budget.limited;
    }

    fn locate(&self, gid: u32) -> Option<(usize, usize)> {
        locate_in(&self.regions, gid)
    }

    /// Runs one wake-up over at most `pages_to_visit` page visits; `merge`
    /// false means checksum only (auto mode's idle rounds).
    pub fn run_batch(&mut self, pages_to_visit: u64, merge: bool) -> BatchReport {
        let mut rep = BatchReport::default();
        if self.regions.is_empty() {
            return rep;
        }
        self.refresh_map_count(false);
        self.collect_write_logs();
        if merge {
            self.run_rechecks();
        }
        let before = self.merges_done();
        let fresh_before = self.fresh_hashed;
        let mut visit_units = pages_to_visit.saturating_mul(HASH_COST);
        let units0 = visit_units;
        self.census_slice = Duration::ZERO;
        if self.unstable.is_empty() && self.cursor_region == 0 && self.cursor_page == 0 {
            self.unstable.reset(self.tracked_pages() as usize);
        }
        while visit_units > 0 {
            if self.cursor_region >= self.regions.len() {
                self.cursor_region = 0;
                self.cursor_page = 0;
            }
            let (ri, start) = (self.cursor_region, self.cursor_page);
            // Read pagemap only for pages this wake-up can visit: every visit
            // costs at least one visit unit, so a small wake-up (auto mode's
            // untriggered rounds scan ~5 pages) must not pay for a whole span.
            // (KSM's regions are not paced by visits: whole spans.)
            let mut n = (self.regions[ri].npages - start).min(SPAN_PAGES);
            if !self.regions[ri].assisted {
                n = n.min(usize::try_from(visit_units).unwrap_or(usize::MAX).max(1));
            }
            let used = self.scan_span(ri, start, n, &mut visit_units, merge);
            self.cursor_page += used;
            if self.cursor_page >= self.regions[ri].npages {
                self.cursor_region += 1;
                self.cursor_page = 0;
                if self.cursor_region >= self.regions.len() {
                    self.cursor_region = 0;
                    self.end_pass();
                    rep.pass_completed = true;
                    break;
                }
            }
            if self.census_slice >= CENSUS_SLICE {
                rep.census_pending = true;
                break;
            }
        }
        rep.merges = self.merges_done() - before;
        rep.spent = units0 - visit_units;
        rep.fresh = self.fresh_hashed - fresh_before;
        if rep.merges > 0 {
            self.idle_passes = 0;
        }
        self.map_limited = self.map_budget.limited;
        rep
    }

    /// Visits device-filled ranges first (I/O hints), within `pages_to_visit` page
    /// visits, from the front of `hints`; what the visits did not reach is
    /// left in `hints` (the rest of a range included). Ranges outside the
    /// regions (or in KSM's) are dropped.
    ///
    /// Returns what the visit did (merges and first-time hashes), which
    /// counts towards the wake-up's pace like the scan's own.
    pub fn run_hints(&mut self, hints: &mut Vec<Hint>, pages_to_visit: u64) -> BatchReport {
        let before = self.merges_done();
        let fresh_before = self.fresh_hashed;
        let mut visit_units = pages_to_visit.saturating_mul(HASH_COST);
        let mut done = 0;
        // The merges of every range are planned first and executed together
        // (`deferred`): each batch parks the VMs' vCPUs, and a wake-up's
        // hints are many small ranges (one per virtio request). Executed one
        // range at a time, the two-VM build spent more engine CPU with hints
        // than without (0.73 vs 0.58 s) and merged fewer pages.
        self.deferred = Some(Vec::new());
        let mut visited: Vec<HintVisit> = Vec::new();
        while done < hints.len() && visit_units > 0 {
            let h = hints[done];
            let Some(ri) = self.regions.iter().position(|r| r.contains(h.addr)) else {
                done += 1;
                continue;
            };
            let r = &self.regions[ri];
            if r.assisted {
                done += 1;
                continue;
            }
            let (first, end) = r.pages_of(h.addr, h.len);
            // The device wrote them (KVM's log sees guest writes only): if
            // this visit does not reach them all, the scan's will.
            if let Some(w) = self.regions[ri].written.as_mut() {
                w.mark(first, end);
            }
            if visited
                .iter()
                .any(|v| v.region == ri && v.first < end && first < v.end)
            {
                // A page read again in this wake-up: what is planned for it
                // runs first, so the page is seen as it then is.
                self.flush_hint_ops(&mut visited);
            }
            let planned = self.deferred.as_ref().map_or(0, Vec::len);
            let mut p = first;
            self.trusted = true;
            while p < end && visit_units > 0 {
                let n = (end - p).min(SPAN_PAGES);
                p += self.scan_span(ri, p, n, &mut visit_units, true);
            }
            self.trusted = false;
            let planned = self.deferred.as_ref().map_or(0, Vec::len) - planned;
            visited.push(HintVisit {
                region: ri,
                first,
                end: p,
                planned,
                at: h.at,
            });
            if p < end {
                let addr = self.regions[ri].page_addr(p);
                hints[done].len = h.addr + h.len - addr;
                hints[done].addr = addr;
                break;
            }
            done += 1;
        }
        self.flush_hint_ops(&mut visited);
        self.deferred = None;
        hints.drain(..done);
        BatchReport {
            merges: self.merges_done() - before,
            fresh: self.fresh_hashed - fresh_before,
            ..BatchReport::default()
        }
    }

    /// Merges made so far, zero-page drops included (what a batch reports).
    fn merges_done(&self) -> u64 {
        self.counters.merges + self.counters.zero_merges
    }

    /// Executes the merges planned by hint visits so far, counts them (and
    /// their delay since the device filled the pages: the ranges' planned
    /// ops weigh their ages), and judges the groups for the KSM assist.
    fn flush_hint_ops(&mut self, visited: &mut Vec<HintVisit>) {
        let ops = self.deferred.replace(Vec::new()).unwrap_or_default();
        let before = self.merges_done();
        self.execute_planned(ops);
        let merged = self.merges_done() - before;
        let planned: usize = visited.iter().map(|v| v.planned).sum();
        if merged > 0 && planned > 0 {
            let age: f64 = visited
                .iter()
                .map(|v| v.planned as f64 * v.at.elapsed().as_secs_f64())
                .sum::<f64>()
                / planned as f64;
            self.hint_merges += merged;
            self.hint_delay_sum += merged as f64 * age;
        }
        let groups = visited
            .iter()
            .map(|v| self.regions[v.region].group)
            .collect();
        self.judge_groups(groups);
        visited.clear();
    }

    /// Remembers a hinted page that found no partner.
    fn remember_hinted(&mut self, group: u32, h: u32, gid: u32) {
        let key = (group as u64) << 32 | h as u64;
        if self.hint_index.insert(key, gid).is_none() {
            self.hint_fifo.push_back(key);
            while self.hint_fifo.len() > HINT_INDEX_CAP {
                if let Some(old) = self.hint_fifo.pop_front() {
                    self.hint_index.remove(&old);
                }
            }
        }
    }

    /// A hinted page from an earlier pass with this content, still HASHED
    /// with the same hash (its content is compared here too).
    fn hinted_partner(&self, ri: usize, p: usize, h: u32, group: u32, page: &[u8]) -> Option<u32> {
        let key = (group as u64) << 32 | h as u64;
        let gid = *self.hint_index.get(&key)?;
        let me = self.regions[ri].gid_base + p as u32;
        let (r, pp) = self.locate(gid)?;
        let rg = &self.regions[r];
        let ok = gid != me
            && !rg.assisted
            && rg.group == group
            && region::kind(rg.state[pp]) == HASHED
            && rg.word[pp] == h
            // SAFETY: registered regions are mapped.
            && unsafe { rg.page(pp) } == page;
        ok.then_some(gid)
    }

    /// Gives region `id` a write log (`None` takes it away). Every page
    /// starts as written: the first visits examine them in full.
    pub fn set_write_log(&mut self, id: RegionId, log: Option<Arc<dyn WriteLog>>) {
        if let Some(r) = self.regions.iter_mut().find(|r| r.id == id) {
            r.written = log.map(|l| Written::new(l, r.npages));
        }
    }

    /// Marks host ranges written by a device (hints the engine did not
    /// visit: dropped, or received while not merging).
    pub fn mark_written(&mut self, hints: &[Hint]) {
        for h in hints {
            if let Some(r) = self.regions.iter_mut().find(|r| r.contains(h.addr)) {
                let (first, end) = r.pages_of(h.addr, h.len);
                if let Some(w) = r.written.as_mut() {
                    w.mark(first, end);
                }
            }
        }
    }

    /// Marks every page of every logged region written (device writes
    /// whose ranges were lost).
    pub fn mark_all_written(&mut self) {
        for r in &mut self.regions {
            if let Some(w) = r.written.as_mut() {
                w.mark_all();
            }
        }
    }

    /// Adds what each region's write log recorded since the last wake-up;
    /// a log that fails is dropped (the region is then read in full).
    fn collect_write_logs(&mut self) {
        for r in &mut self.regions {
            if let Some(w) = r.written.as_mut() {
                if let Err(e) = w.collect() {
                    log::warn!(
                        "pagefold: {} ({:?}): {e}; reading pagemap instead",
                        r.owner,
                        r.id
                    );
                    r.written = None;
                }
            }
        }
    }

    /// Does region `ri`'s write log say page `p` needs a full look (written
    /// since it was last examined, or its periodic check is due)? False
    /// without a log (the smart-scan schedule alone decides then).
    fn log_marks(&self, ri: usize, p: usize) -> bool {
        self.regions[ri].written.as_ref().is_some_and(|w| {
            w.get(p) || (self.counters.passes + (p / VERIFY_BLOCK) as u64) % VERIFY_PASSES == 0
        })
    }

    /// Can the write log answer this due visit of page `p` (kind MERGED,
    /// ZERO or HASHED without `REHASH`) without pagemap or hashing?
    fn log_clean(&self, ri: usize, p: usize, st: u8) -> bool {
        let r = &self.regions[ri];
        r.written.is_some()
            && !self.trusted
            && !r.assisted
            && !self.log_marks(ri, p)
            && match region::kind(st) {
                MERGED | ZERO => true,
                HASHED => !region::needs_rehash(st),
                // Level > 0: found absent at its last visit (`visit`).
                _ => region::level(st) > 0 && !region::needs_rehash(st),
            }
    }

    /// Gives the pages queued in `recheck` their second look now: a page
    /// whose content had changed when it was last hashed waits, under
    /// KSM's volatility rule, until a later visit finds it unchanged, which
    /// the scan brings a whole pass later. With a write log the engine knows
    /// at the next wake-up whether anyone wrote it since: if not, it is
    /// visited now as unchanged (`visit_clean`, or in full when it may
    /// pair), so content a guest has just written merges within two
    /// wake-ups. Written pages are left to the scan (due at its next pass).
    /// The merges run as one batch before the scan's (no provisional merge
    /// state is left for a span to meet).
    fn run_rechecks(&mut self) {
        if self.recheck.is_empty() {
            return;
        }
        let queue = std::mem::take(&mut self.recheck);
        let run = (self.run_hash, self.run_len);
        let mut ops: Vec<Op> = Vec::new();
        let mut units = u64::MAX;
        let mut groups: Vec<u32> = Vec::new();
        for gid in queue {
            let Some((ri, p)) = self.locate(gid) else {
                continue;
            };
            let r = &self.regions[ri];
            let st = r.state[p];
            // Planned as a partner by an earlier recheck (MERGED now),
            // hashed since, or written since: nothing to do here.
            if r.assisted || region::kind(st) != HASHED || !self.log_clean(ri, p, st) {
                continue;
            }
            let prev = (p > 0 && region::kind(r.state[p - 1]) == MERGED).then(|| r.word[p - 1]);
            groups.push(r.group);
            self.note_run(None);
            self.visit(ri, p, Entry(0), st, prev, &mut units, true, &mut ops);
        }
        (self.run_hash, self.run_len) = run;
        self.execute_planned(ops);
        self.judge_groups(groups);
    }

    /// Executes merge ops planned outside a scan span (hint visits,
    /// rechecks) and frees the slots that ended up unused.
    fn execute_planned(&mut self, ops: Vec<Op>) {
        if !ops.is_empty() {
            let mut freed = Vec::new();
            self.execute(ops, &mut freed);
            self.release_slots(&freed);
        }
    }

    /// Judges each group visited for the KSM assist, once, after its
    /// planned merges ran (`maybe_assist` must not meet planned ops).
    fn judge_groups(&mut self, mut groups: Vec<u32>) {
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            self.maybe_assist(g);
        }
    }

    /// Runs whole passes synchronously (tests, benchmarks).
    pub fn run_passes(&mut self, passes: u64) {
        for _ in 0..passes {
            if self.regions.is_empty() {
                return;
            }
            while !self.run_batch(1 << 30, true).pass_completed {}
        }
    }

    fn end_pass(&mut self) {
        self.counters.passes += 1;
        // While KSM assists, a pass counts when it took a census after KSM
        // finished a full scan (so the figure it reports includes that scan).
        if self.assist.group().is_none()
            || (self.census_due && self.assist.ksm_scanned_since_last_look())
        {
            self.counters.full_scans += 1;
        }
        // KSM merging in assisted regions is progress too: keep the pace
        // (and the census fresh) while it works.
        let ksm_before = self.census.sharing;
        if self.census_due {
            let t = Instant::now();
            self.count_census();
            // The census pass cost (pagemap walks over the assisted
            // regions' VMAs, the sort): keep it under ~2 % of a core.
            self.census_cost = std::mem::take(&mut self.census_spans) + t.elapsed();
            self.census_at = Some(Instant::now());
            if self.census.sharing != ksm_before {
                self.pass_progress += 1;
            }
        }
        if self.assist.ksm_busy() {
            // KSM works for us (maybe between its checksum and merge scans):
            // not idle, keep the census on time.
            self.pass_progress += 1;
        }
        let every = census_interval(
            self.census_cost,
            self.assist.ksm_scan_uncounted(),
            self.assist.ksm_busy(),
        );
        self.census_due = self.census_at.is_none_or(|t| t.elapsed() >= every);
        if self.pass_progress == 0 {
            self.idle_passes = self.idle_passes.saturating_add(1);
        } else {
            self.idle_passes = 0;
        }
        self.pass_progress = 0;
        self.last_pass_groups = std::mem::take(&mut self.pass_groups);
        self.unstable.reset(self.tracked_pages() as usize);
        // Per-region savings and VMA estimate (O(pages), once per pass in
        // which merges, copy-on-write breaks or registrations happened:
        // passes over KSM-assisted regions come every wake-up).
        let key = (
            self.counters.merges,
            self.counters.cow_breaks,
            self.regions.len() as u64,
            self.next_region_id,
        );
        let recount = key != self.recount_key;
        self.recount_key = key;
        for r in self.regions.iter_mut().filter(|_| recount) {
            let mut saved = 0.0;
            let mut vmas = 0;
            let mut prev: Option<u32> = None;
            for i in 0..r.npages {
                if region::kind(r.state[i]) == MERGED {
                    let s = r.word[i];
                    let m = self.pool.meta(s).mappers.max(1);
                    saved += 1.0 - 1.0 / m as f64;
                    if prev != Some(s.wrapping_sub(1)) {
                        vmas += 1;
                    }
                    prev = Some(s);
                } else {
                    prev = None;
                }
            }
            r.saved_pages = saved;
            r.vmas = vmas;
        }
        self.refresh_map_count(false);
    }

    /// Turns this pass's PFNs of assisted pages into the KSM figures.
    fn count_census(&mut self) {
        if self.census_pages.is_empty() && self.census.shared == 0 {
            return;
        }
        let mut pages = std::mem::take(&mut self.census_pages);
        let c = Census::count(&mut pages);
        pages.clear();
        self.census_pages = pages;
        for r in &mut self.regions {
            let (n, saved) = c
                .per_region
                .iter()
                .find(|x| x.0 == r.gid_base)
                .map(|x| (x.1, x.2))
                .unwrap_or((0, 0.0));
            r.ksm_merged = n;
            r.ksm_saved = saved;
        }
        self.census = c;
    }

    /// Scans pages `start..start+n` of region `ri`; returns pages consumed.
    fn scan_span(
        &mut self,
        ri: usize,
        start: usize,
        n: usize,
        visit_units: &mut u64,
        merge: bool,
    ) -> usize {
        if self.regions[ri].assisted && !self.census_due {
            // KSM's region: the engine only counts KSM's sharing and notices
            // copy-on-write breaks of its own earlier merges there, both on
            // census passes (pagemap walks of 100k+ VMAs are not free).
            return n;
        }
        if !self.regions[ri].assisted {
            return self.scan_span_inner(ri, start, n, visit_units, merge);
        }
        // A census span is a pagemap read and a frame list, not a scan: it
        // is paced by time (`CENSUS_SLICE` per batch, a pass every second
        // or two), not by `pages_to_scan`. Charged by visit units, a census
        // of 2 x 512 MiB at an idle engine's 1 s wake-ups took 18 s, and
        // the sharing KSM had reached went unreported all that while.
        let t = Instant::now();
        let mut units = n as u64 * HASH_COST;
        let used = self.scan_span_inner(ri, start, n, &mut units, merge);
        let spent = t.elapsed();
        self.census_spans += spent;
        self.census_slice += spent;
        used
    }

    fn scan_span_inner(
        &mut self,
        ri: usize,
        start: usize,
        n: usize,
        visit_units: &mut u64,
        merge: bool,
    ) -> usize {
        let mut entries = std::mem::take(&mut self.scratch);
        if entries.len() < n {
            entries.resize(n, Entry(0));
        }
        if let Err(e) = self.read_needed(ri, start, &mut entries[..n]) {
            log::warn!("pagefold: {e}");
            self.scratch = entries;
            return n;
        }
        let mut ops: Vec<Op> = Vec::new();
        let mut freed: Vec<u32> = Vec::new();
        let mut prev: Option<u32> =
            if start > 0 && region::kind(self.regions[ri].state[start - 1]) == MERGED {
                Some(self.regions[ri].word[start - 1])
            } else {
                None
            };
        let mut used = 0;
        if start == 0 {
            self.run_len = 0;
        }
        while used < n && *visit_units > 0 {
            let p = start + used;
            let e = entries[used];
            used += 1;
            if let Some(&ahead) = self.regions[ri].state.get(p + PREFETCH_AHEAD) {
                if region::kind(ahead) == MERGED {
                    self.pool
                        .prefetch_meta(self.regions[ri].word[p + PREFETCH_AHEAD]);
                }
            }
            let st = self.regions[ri].state[p];
            match region::kind(st) {
                MERGED => {
                    *visit_units -= 1;
                    if e.0 & NOT_DUE != 0 {
                        // Checked on its own smart-scan schedule; its
                        // pagemap entry was not read.
                        let s = self.regions[ri].word[p];
                        prev = Some(s);
                        self.note_run(Some(self.pool.meta(s).hash));
                        continue;
                    }
                    // Not written since it was merged or last checked
                    // (`log_clean`): still merged, its entry was not read.
                    let clean = e.0 & CLEAN != 0;
                    if !clean && e.present() && !e.file() {
                        // Copy-on-write broke the share: hashed at the next
                        // visit (level 0).
                        let r = &mut self.regions[ri];
                        let s = r.word[p];
                        r.set_kind(p, NEW);
                        r.state[p] = region::with_level(r.state[p], 0);
                        if self.pool.remove_mapper(s) == 0 {
                            freed.push(s);
                        }
                        self.counters.cow_breaks += 1;
                        prev = None;
                        self.note_run(None);
                        if self.trusted && !self.regions[ri].assisted {
                            // A device refilled it: a candidate right away.
                            let st = self.regions[ri].state[p];
                            prev = self.visit(ri, p, e, st, prev, visit_units, merge, &mut ops);
                        }
                    } else {
                        self.counters.clean_visits += u64::from(clean);
                        let r = &mut self.regions[ri];
                        let s = r.word[p];
                        r.state[p] = region::with_level(st, region::level(st) + 1);
                        prev = Some(s);
                        self.note_run(Some(self.pool.meta(s).hash));
                    }
                    continue;
                }
                ZERO => {
                    *visit_units -= 1;
                    prev = None;
                    self.note_run(None);
                    if e.0 & CLEAN != 0 {
                        self.counters.clean_visits += 1;
                    } else if e.present() && (self.zero_pfn == 0 || e.pfn() != self.zero_pfn) {
                        let r = &mut self.regions[ri];
                        r.set_kind(p, NEW);
                        r.state[p] = region::with_level(r.state[p], 0);
                        self.counters.cow_breaks += 1;
                    }
                    continue;
                }
                _ => {}
            }
            if self.regions[ri].assisted {
                // KSM's page: pagemap only, and its frame for the census.
                *visit_units -= 1;
                prev = None;
                self.note_run(None);
                if self.census_due
                    && e.present()
                    && !e.file()
                    && e.pfn() != 0
                    && e.pfn() != self.zero_pfn
                {
                    let key = self.regions[ri].gid_base;
                    self.census_pages.push((e.pfn(), key));
                }
                continue;
            }
            prev = self.visit(ri, p, e, st, prev, visit_units, merge, &mut ops);
        }
        // Every page visited here that its write log marked was examined
        // (marked pages are due and not `log_clean`): its mark is spent. A
        // census span of KSM's region examines no content: its marks stay
        // for when the engine takes the region back.
        let census = self.regions[ri].assisted;
        if let Some(w) = self.regions[ri].written.as_mut().filter(|_| !census) {
            w.clear_range(start, start + used);
        }
        self.scratch = entries;
        // A hint visit executes its ops (and judges the group for the KSM
        // assist, which must not meet planned ops) at its end.
        let deferring = self.deferred.is_some();
        if let Some(d) = self.deferred.as_mut() {
            d.append(&mut ops);
        } else if !ops.is_empty() {
            self.execute(ops, &mut freed);
        }
        self.release_slots(&freed);
        if merge && !deferring {
            let group = self.regions[ri].group;
            self.maybe_assist(group);
        }
        used
    }

    /// Is an unmerged page due for a visit on this pass (smart scan)? A
    /// HASHED page at level L is hashed once every 2^L passes; a NEW page
    /// that keeps being absent (guest RAM never touched) rises a level per
    /// absent visit the same way, so untouched memory costs a pagemap
    /// entry once every 2^MAX_LEVEL passes. ZERO pages, and every page of
    /// a hinted visit, are always due.
    fn visit_due(&self, ri: usize, p: usize, st: u8) -> bool {
        !matches!(region::kind(st), HASHED | NEW)
            || self.trusted
            || self.log_marks(ri, p)
            || region::due(
                self.counters.passes,
                region::level(st),
                self.regions[ri].word[p],
            )
    }

    /// Is a MERGED page due for its copy-on-write check on this pass? A
    /// share that stays intact is checked less often (level L: once every
    /// 2^L passes, L up to `MAX_LEVEL`), as unique pages are hashed less
    /// often: each check is a pagemap walk over the page's own VMA (one per
    /// scattered merge), which was most of the engine's CPU while two
    /// guests built (issue 10). A broken share is noticed at most
    /// 2^MAX_LEVEL passes late; until then the pool keeps the page's
    /// reference (the guest's new copy is already its own).
    fn merged_due(&self, ri: usize, p: usize, st: u8) -> bool {
        self.trusted
            || self.regions[ri].assisted
            || self.log_marks(ri, p)
            || region::due(
                self.counters.passes,
                region::level(st),
                self.regions[ri].word[p],
            )
    }

    /// Fills `out` with the pagemap entries of pages `start..` of region
    /// `ri` that this pass needs (zero pages, new and hashed pages due for
    /// a visit, merged pages due for their copy-on-write check), each
    /// marked `DUE` or `NOT_DUE`; a page not due, or due but answered by
    /// its write log, gets no entry (absent) and is not looked at. Reads
    /// runs of needed pages, bridging gaps of up to `READ_GAP` pages: a
    /// pagemap read walks every VMA it covers, and a scattered merge is a
    /// VMA.
    fn read_needed(
        &self,
        ri: usize,
        start: usize,
        out: &mut [Entry],
    ) -> Result<(), crate::pagemap::PagemapError> {
        const READ_GAP: usize = 8;
        let r = &self.regions[ri];
        if r.assisted {
            // A census pass: every frame counts.
            return self.pagemap.read(r.page_addr(start), out);
        }
        let n = out.len();
        debug_assert!(n <= SPAN_PAGES);
        // Each page is judged once (smart-scan schedule, write log); the
        // span's loop and `visit` take the verdict from the entry's marker
        // instead of judging again (twice, with the checks of the log,
        // it was a sixth of the engine's CPU over two building guests).
        let mut read = [0u64; SPAN_PAGES / 64];
        let mut not_due = [0u64; SPAN_PAGES / 64];
        let mut clean = [0u64; SPAN_PAGES / 64];
        for (i, e) in out.iter_mut().enumerate() {
            let p = start + i;
            let st = r.state[p];
            let due = match region::kind(st) {
                MERGED => self.merged_due(ri, p, st),
                HASHED | NEW => self.visit_due(ri, p, st),
                _ => true,
            };
            *e = if !due {
                not_due[i / 64] |= 1 << (i % 64);
                Entry(NOT_DUE)
            } else if !self.trusted
                && matches!(region::kind(st), HASHED | NEW)
                && r.written.as_ref().is_some_and(|w| w.recorded(p))
            {
                // An unmerged page its log saw written is mapped, private
                // and anonymous (`Written::recorded`): the visit only needs
                // to hash it. Written pages of a guest are scattered, so
                // each was a pagemap read of its own: 16k of the engine's
                // 25k reads per `bench build` run. A merged or zero page
                // still gets its entry read: a write recorded before its
                // merge does not mean the share broke, and the slot's
                // mapper count depends on knowing that.
                Entry(PM_PRESENT | DUE)
            } else if self.log_clean(ri, p, st) {
                // Nobody wrote it since it was last examined: the visit
                // knows its entry (see `log_clean`).
                clean[i / 64] |= 1 << (i % 64);
                Entry(DUE | CLEAN)
            } else {
                read[i / 64] |= 1 << (i % 64);
                Entry(DUE)
            };
        }
        let bit = |m: &[u64], i: usize| m[i / 64] & (1 << (i % 64)) != 0;
        let mut i = 0;
        while i < n {
            if !bit(&read, i) {
                i += 1;
                continue;
            }
            // A run from i: extend while a page to read follows within
            // READ_GAP pages.
            let mut end = i + 1;
            let mut gap = 0;
            let mut j = end;
            while j < n && gap <= READ_GAP {
                if bit(&read, j) {
                    end = j + 1;
                    gap = 0;
                } else {
                    gap += 1;
                }
                j += 1;
            }
            self.pagemap
                .read(r.page_addr(start + i), &mut out[i..end])?;
            // The read replaced the verdicts of the pages it covered.
            for (k, e) in out[i..end].iter_mut().enumerate() {
                e.0 |= if bit(&not_due, i + k) {
                    NOT_DUE
                } else if bit(&clean, i + k) {
                    DUE | CLEAN
                } else {
                    DUE
                };
            }
            i = end;
        }
        Ok(())
    }

    /// Visits an unmerged page; returns the slot it is planned onto, if any.
    #[allow(clippy::too_many_arguments)]
    fn visit(
        &mut self,
        ri: usize,
        p: usize,
        e: Entry,
        st: u8,
        prev: Option<u32>,
        visit_units: &mut u64,
        merge: bool,
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let kind = region::kind(st);
        // A span's entry carries `read_needed`'s verdict; for other callers
        // (rechecks) it is judged here.
        let judged = e.0 & DUE != 0;
        let due = e.0 & NOT_DUE == 0 && (judged || self.visit_due(ri, p, st));
        if !due {
            // Smart scan, pass-aligned (see `region::due`): identical pages
            // are hashed on the same passes, so they always meet. Its
            // pagemap entry was not read (`read_needed`).
            *visit_units -= 1;
            self.note_run((kind == HASHED).then(|| self.regions[ri].word[p]));
            return None;
        }
        let mut e = e;
        let clean = if judged {
            e.0 & CLEAN != 0
        } else {
            self.log_clean(ri, p, st)
        };
        if clean && kind == NEW {
            // Found absent (or the zero page) when last examined and not
            // written since: still so. Its entry was not read (`Entry(0)`
            // below: absent).
            self.counters.clean_visits += 1;
        }
        if clean && kind == HASHED {
            if let Some(planned) = self.visit_clean(ri, p, st, prev, visit_units, merge, ops) {
                return planned;
            }
            // A pair or a new slot needs a fresh hash: read the entry the
            // span skipped, and visit in full.
            let mut one = [Entry(0)];
            if let Err(err) = self.pagemap.read(self.regions[ri].page_addr(p), &mut one) {
                log::warn!("pagefold: {err}");
                return None;
            }
            e = one[0];
        }
        if !e.present() || e.file() || (self.zero_pfn != 0 && e.pfn() == self.zero_pfn) {
            *visit_units -= 1;
            self.note_run(None);
            let r = &mut self.regions[ri];
            r.state[p] = if kind == HASHED {
                region::with_level(region::with_kind(st, NEW), 0)
            } else {
                // Still absent: looked at less often (`visit_due`).
                region::with_level(st, region::level(st) + 1)
            };
            return None;
        }
        *visit_units = visit_units.saturating_sub(HASH_COST);
        // SAFETY: the region is registered, hence mapped (register contract),
        // and stays so while we hold the core (unregister needs it).
        let page = unsafe { self.regions[ri].page_detached(p) };
        // A hinted page was just rewritten: its stored hash is stale.
        if kind == HASHED && merge && !self.trusted && !region::needs_rehash(st) {
            if let Some(s) = self.join_unhashed(ri, p, prev, page, ops) {
                return Some(s);
            }
        }
        if kind == NEW && merge && !self.trusted && !region::needs_rehash(st) {
            if let Some(s) = self.continue_run_unhashed(ri, p, prev, page, ops) {
                return Some(s);
            }
        }
        self.counters.pages_hashed += 1;
        let h64 = (self.hash_fn)(page);
        let h = fold(h64);
        self.cur_hi = (h64 >> 32) as u32;
        self.note_run(Some(h));
        // KSM's volatility rule: only a page whose hash is unchanged since its
        // previous visit is a candidate. A page seen for the first time may
        // still join an existing pool slot at once (see `join_first_seen`).
        let first_sight = kind == NEW && h != self.zero_hash;
        let unchanged = (kind == HASHED && self.regions[ri].word[p] == h) || self.trusted;
        let group = self.regions[ri].group;
        {
            let r = &mut self.regions[ri];
            r.word[p] = h;
            r.state[p] &= !region::REHASH;
            if kind == NEW {
                r.set_kind(p, HASHED);
                self.pass_progress += 1;
                self.fresh_hashed += 1;
            }
            if !unchanged {
                r.set_volatile(p, true);
                r.state[p] = region::with_level(r.state[p], 0);
            } else {
                r.set_volatile(p, false);
            }
        }
        if !unchanged {
            if merge
                && (!first_sight || self.merges_scattered(group))
                && !self.trusted
                && self.regions[ri].written.is_some()
                && self.recheck.len() < RECHECK_CAP
            {
                // Its second look (KSM's rule) can come at the next wake-up:
                // the write log tells whether it changed since. For a page
                // seen for the first time only where the group's merges
                // are scattered anyway: pairing first-sight pages a wake-up
                // later paired two filling guests' pages in the order
                // their fill fronts met the scan, a VMA each where the
                // scan's order would have made runs (two 512 MiB VMs,
                // `bench ksm-seed --vms-only`: 11,783 VMAs against 618, and
                // 4x the time to converge). Where every merge is a VMA of
                // its own whatever the order (guests that place pages as
                // real ones do), it only brings the merge a pass sooner:
                // the pages a build writes last waited for that pass while
                // the build ended.
                self.recheck.push(self.regions[ri].gid_base + p as u32);
            }
            if first_sight && merge {
                return self.join_first_seen(ri, p, h, prev, page, ops);
            }
            return None;
        }
        if !merge {
            return None;
        }
        let st = self.regions[ri].state[p];
        if h == self.zero_hash && is_zero(page) {
            let in_pool = self.regions[ri].in_pool(p);
            ops.push(Op {
                region: ri,
                page: p,
                slot: 0,
                kind: OpKind::Zero,
                hash: h,
                old_state: st,
                in_pool,
            });
            self.regions[ri].state[p] = region::with_kind(st, ZERO);
            return None;
        }
        let target = self.choose(ri, p, h, group, prev, page);
        let mut plan =
            |core: &mut Core, r: usize, pg: usize, slot: u32, kind: OpKind, hash: u32| {
                let old = core.regions[r].state[pg];
                core.plan(r, pg, slot, kind, hash, old, ops);
            };
        let extends = |s: u32| prev.is_some_and(|x| x.wrapping_add(1) == s);
        match target {
            Some(Target::Existing(s)) => {
                self.note_planned(group, 1, u64::from(!extends(s)));
                plan(self, ri, p, s, OpKind::Existing, h);
                Some(s)
            }
            Some(Target::New(s)) => {
                self.note_planned(group, 1, u64::from(!extends(s)));
                self.stable.insert(group, h, s);
                plan(self, ri, p, s, OpKind::New, h);
                Some(s)
            }
            Some(Target::Pair(s, cr, cp)) => {
                let partner_extends = cp > 0
                    && region::kind(self.regions[cr].state[cp - 1]) == MERGED
                    && self.regions[cr].word[cp - 1].wrapping_add(1) == s;
                self.note_planned(
                    group,
                    2,
                    u64::from(!extends(s)) + u64::from(!partner_extends),
                );
                self.stable.insert(group, h, s);
                plan(self, ri, p, s, OpKind::New, h);
                plan(self, cr, cp, s, OpKind::Existing, h);
                Some(s)
            }
            None => {
                let gid = self.file_unique(ri, p, st, h);
                if self.trusted {
                    self.remember_hinted(group, h, gid);
                }
                None
            }
        }
    }

    /// A due visit of a HASHED page that nobody wrote since its last hash
    /// (its write log says so): its stored hash is its hash now, so it is
    /// "unchanged since the previous scan" without hashing or a pagemap
    /// read. Takes what `visit` would with that hash when no fresh hash is
    /// needed: a plain join of an existing slot (`join_unhashed`), or no
    /// partner at all (into the unstable index, a level up). Returns None
    /// when `choose` might pair it, grow a stripe or find a stable slot
    /// `join_unhashed` would not take: those file a slot under the hash,
    /// which must then be fresh, so the caller visits in full.
    #[allow(clippy::too_many_arguments)]
    fn visit_clean(
        &mut self,
        ri: usize,
        p: usize,
        st: u8,
        prev: Option<u32>,
        visit_units: &mut u64,
        merge: bool,
        ops: &mut Vec<Op>,
    ) -> Option<Option<u32>> {
        let h = self.regions[ri].word[p];
        if merge && h == self.zero_hash {
            return None;
        }
        let planned = if !merge {
            // Checksum-only round: nothing to learn from hashing it.
            self.regions[ri].set_volatile(p, false);
            self.note_run(Some(h));
            None
        } else {
            // SAFETY: the region is registered, hence mapped (register
            // contract), and stays so while we hold the core (unregister
            // needs it).
            let page = unsafe { self.regions[ri].page_detached(p) };
            if let Some(s) = self.join_unhashed(ri, p, prev, page, ops) {
                Some(s)
            } else {
                let group = self.regions[ri].group;
                // Any stripe `choose` might grow (whatever its length: the
                // check is conservative), a stable slot, a partner: a fresh
                // hash decides.
                if prev.is_some_and(|ps| self.stripe_continues(ps, h, group))
                    || !self.stable.get(group, h).is_empty()
                    || self.unstable_partner(ri, p, h, group, page).is_some()
                    || self.hinted_partner(ri, p, h, group, page).is_some()
                {
                    return None;
                }
                self.note_run(Some(h));
                self.regions[ri].set_volatile(p, false);
                self.file_unique(ri, p, st, h);
                None
            }
        };
        *visit_units -= 1;
        self.counters.clean_visits += 1;
        Some(planned)
    }

    /// A candidate page with no partner this time (state `st` before the
    /// visit, content hash `h`): into the unstable index, a smart-scan
    /// level up (leaving level 0 counts as pass progress: the page just
    /// became stable). Returns its page id.
    fn file_unique(&mut self, ri: usize, p: usize, st: u8, h: u32) -> u32 {
        let r = &mut self.regions[ri];
        let lvl = region::level(st);
        if lvl == 0 {
            self.pass_progress += 1;
        }
        r.state[p] = region::with_level(r.state[p], (lvl + 1).min(MAX_LEVEL));
        let gid = r.gid_base + p as u32;
        let _ = self.unstable.insert(h, gid);
        gid
    }

    /// Joins an existing pool slot without hashing the page: its stored hash
    /// (from its previous visit) looks the slot up exactly as `choose` would
    /// (the left neighbour's next slot, then the stable index), and only a
    /// plain join is taken; anything else (a new slot, a pair, no target)
    /// returns None and the page is hashed as usual. Sound because the final
    /// compare under write-protection decides every merge; if the page
    /// changed, that compare fails and the page gets `REHASH`, so its next
    /// visit hashes it (a stale hash is never retried). Skips KSM's
    /// "unchanged since the previous scan" check for these pages: a page
    /// equal to a pool page now is merged now. New pool slots are always
    /// made from a fresh hash (the stable index never files a slot under a
    /// wrong hash).
    fn join_unhashed(
        &mut self,
        ri: usize,
        p: usize,
        prev: Option<u32>,
        page: &[u8],
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let h = self.regions[ri].word[p];
        if h == self.zero_hash {
            return None;
        }
        let group = self.regions[ri].group;
        let run = (self.run_hash, self.run_len);
        self.note_run(Some(h));
        let Some(s) = self.existing_target(h, group, prev, page) else {
            (self.run_hash, self.run_len) = run;
            return None;
        };
        // Kept in `old_state`: restored with it if the merge fails.
        let old = self.regions[ri].state[p] | region::REHASH;
        self.plan(ri, p, s, OpKind::Existing, h, old, ops);
        Some(s)
    }

    /// A page seen for the first time (just hashed) joins an existing pool
    /// slot at once, if `choose` would make it a plain join (the left
    /// neighbour's next slot, or a stable-index slot with room): a new VM
    /// whose content the pool already holds merges in its first pass
    /// instead of its second, and its first pass hashes each page once.
    /// Pairs and new slots still wait for a page seen unchanged (KSM's
    /// volatility rule): pairing pages at first sight while guests were
    /// still filling them formed pairs in whatever order the fill fronts
    /// met the scan, and each took a VMA (two 64 MiB workload VMs: 1,500
    /// to 3,600 VMAs against 430, and the KSM assist engaged for a layout
    /// that is linear). The final compare under write-protection decides
    /// the merge; a failed one leaves the page HASHED with this hash.
    #[allow(clippy::too_many_arguments)]
    fn join_first_seen(
        &mut self,
        ri: usize,
        p: usize,
        h: u32,
        prev: Option<u32>,
        page: &[u8],
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let group = self.regions[ri].group;
        let s = self.existing_target(h, group, prev, page)?;
        let extends = prev.is_some_and(|x| x.wrapping_add(1) == s);
        if !extends && self.scattered_now(group) {
            // As in `choose`: a page with a known partner that KSM can take.
            self.pass_groups.entry(group).or_default().deferred += 1;
            return None;
        }
        self.note_planned(group, 1, u64::from(!extends));
        let old = self.regions[ri].state[p];
        self.plan(ri, p, s, OpKind::Existing, h, old, ops);
        Some(s)
    }

    /// Continues a run of merges without hashing a first-seen page: when its
    /// two left neighbours are merged onto consecutive pool slots `ps - 1`
    /// and `ps`, the page is planned onto `ps + 1` (the slot `choose` tries
    /// first) if that slot can take a mapper and, when already written,
    /// agrees with the page on a few sampled cache lines. Identical guests
    /// and page-cache extents repeat runs of content, so most of a new VM's
    /// pages continue a run: this skips their hash (15 % of the engine's
    /// merge CPU, `converge -- identical max`). The final compare under
    /// write-protection decides the merge as always; a wrong guess costs
    /// that compare, and the page keeps `REHASH` and kind NEW, so its next
    /// visit hashes it (first sight makes it a candidate there).
    fn continue_run_unhashed(
        &mut self,
        ri: usize,
        p: usize,
        prev: Option<u32>,
        page: &[u8],
        ops: &mut Vec<Op>,
    ) -> Option<u32> {
        let ps = prev?;
        let r = &self.regions[ri];
        let group = r.group;
        if p < 2 || region::kind(r.state[p - 2]) != MERGED || r.word[p - 2].wrapping_add(1) != ps {
            return None;
        }
        let s1 = ps.wrapping_add(1);
        if s1 == 0 {
            return None;
        }
        if !self.has_room(s1, group)
            || (self.pool.state(s1) == SlotState::Written
                && !sampled_lines_agree(page, self.pool.page(s1)))
        {
            return None;
        }
        self.note_run(Some(self.pool.meta(s1).hash));
        self.note_planned(group, 1, 0);
        // Kept in `old_state`: restored with it if the merge fails.
        let old = self.regions[ri].state[p] | region::REHASH;
        self.plan(ri, p, s1, OpKind::Existing, 0, old, ops);
        Some(s1)
    }

    /// Plans page `p` of region `ri` onto `slot`: the op to execute, a pool
    /// reference taken, and the page provisionally MERGED (`commit` puts
    /// `old_state` back if the merge fails).
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        ri: usize,
        p: usize,
        slot: u32,
        kind: OpKind,
        hash: u32,
        old_state: u8,
        ops: &mut Vec<Op>,
    ) {
        self.pool.add_mapper(slot);
        let r = &mut self.regions[ri];
        ops.push(Op {
            region: ri,
            page: p,
            slot,
            kind,
            hash,
            old_state,
            in_pool: r.in_pool(p),
        });
        r.state[p] = region::with_kind(old_state, MERGED);
        r.word[p] = slot;
    }

    /// Slot `s` can take one more mapper from `group`: reserved or written,
    /// the group's, below `max_page_sharing`.
    fn has_room(&self, s: u32, group: u32) -> bool {
        let st = self.pool.state(s);
        let m = self.pool.meta(s);
        (st == SlotState::Reserved || st == SlotState::Written)
            && m.group == group
            && (m.mappers as u64) < self.knobs.max_page_sharing
    }

    /// `choose`'s answer when it is a plain join of an existing slot, by the
    /// stored hash only (no 64-bit check: the final compare decides).
    fn existing_target(&self, h: u32, group: u32, prev: Option<u32>, page: &[u8]) -> Option<u32> {
        let joinable = |s: u32| {
            let st = self.pool.state(s);
            self.has_room(s, group)
                && self.pool.meta(s).hash == h
                && (self.strong_hash || st == SlotState::Reserved || self.pool.page(s) == page)
        };
        if let Some(ps) = prev {
            let s1 = ps.wrapping_add(1);
            if s1 != 0 {
                if joinable(s1) {
                    return Some(s1);
                }
                if self.stripe_continues(ps, h, group)
                    && self.stripe_len(ps, h, group) < self.wanted_stripe()
                {
                    // `choose` grows the stripe: a new slot needs a fresh hash.
                    return None;
                }
            }
        }
        if self.map_budget.limited {
            return None;
        }
        let mut fallback = None;
        for &s in self.stable.get(group, h).iter().take(512) {
            if !joinable(s) {
                continue;
            }
            if joinable(s.wrapping_add(1)) {
                return Some(s);
            }
            fallback.get_or_insert(s);
        }
        fallback
    }

    fn note_run(&mut self, content: Option<u32>) {
        match content {
            Some(c) if self.run_len > 0 && c == self.run_hash => {
                self.run_len = self.run_len.saturating_add(1)
            }
            Some(c) => {
                self.run_hash = c;
                self.run_len = 1;
            }
            None => self.run_len = 0,
        }
    }

    /// Stripe length worth having for a same-content run of the current
    /// length r: a stripe of L pool pages turns the run into r/L VMAs. Pure
    /// memory would favour L = sqrt(r/8) (4 KiB per pool page vs ~512 B per
    /// VMA and split), but every VMA also costs a ~15 us mmap and one of
    /// only 65530 map slots, so L = sqrt(r): a run of 16 pages gets 4 pool
    /// pages, 4096 pages get 64. Under map-count pressure: the full stripe.
    fn wanted_stripe(&self) -> u32 {
        if self.map_budget.headroom < (self.max_map_count / 4) as i64 {
            return self.stripe_max;
        }
        let l = (self.run_len as f64).sqrt() as u32;
        l.clamp(1, self.stripe_max)
    }

    /// Is slot `s` usable for a page with hash `h` in `group`?
    fn usable(&self, s: u32, h: u32, group: u32, page: &[u8]) -> bool {
        let st = self.pool.state(s);
        let m = self.pool.meta(s);
        self.has_room(s, group)
            && m.hash == h
            && if self.strong_hash {
                m.hash_hi == self.cur_hi
            } else {
                st == SlotState::Reserved || self.pool.page(s) == page
            }
    }

    /// Could the stripe ending at slot `ps` grow by a slot for content `h`
    /// of `group`: the next slot is free and `ps` holds that content
    /// (`choose` then also wants the stripe shorter than `wanted_stripe`).
    fn stripe_continues(&self, ps: u32, h: u32, group: u32) -> bool {
        let s1 = ps.wrapping_add(1);
        let pm = self.pool.meta(ps);
        s1 != 0 && self.pool.is_free(s1) && pm.hash == h && pm.group == group
    }

    /// Length of the same-content stripe (slots with room) ending at `s`.
    fn stripe_len(&self, s: u32, h: u32, group: u32) -> u32 {
        let mut n = 1;
        let mut x = s;
        while x > 0 && n < self.stripe_max {
            let m = self.pool.meta(x - 1);
            let st = self.pool.state(x - 1);
            // Full slots (max_page_sharing) end the stripe: a new stripe may
            // start right after a full one and must be able to grow.
            if m.hash != h
                || m.group != group
                || st == SlotState::Free
                || st == SlotState::Failed
                || m.mappers as u64 >= self.knobs.max_page_sharing
            {
                break;
            }
            n += 1;
            x -= 1;
        }
        n
    }

    fn choose(
        &mut self,
        ri: usize,
        p: usize,
        h: u32,
        group: u32,
        prev: Option<u32>,
        page: &[u8],
    ) -> Option<Target> {
        // 1. Continue the left neighbour's run: no new VMA.
        if let Some(ps) = prev {
            let s1 = ps.wrapping_add(1);
            if s1 != 0 {
                if self.usable(s1, h, group, page) {
                    return Some(Target::Existing(s1));
                }
                if self.stripe_continues(ps, h, group)
                    && self.stripe_len(ps, h, group) < self.wanted_stripe()
                {
                    // Same content as the left neighbour: grow its stripe so
                    // the run stays one VMA.
                    if let Ok(s) = self.pool.reserve(Some(s1), h, self.cur_hi, group) {
                        return Some(Target::New(s));
                    }
                }
            }
        }
        if self.map_budget.limited || self.scattered_now(group) {
            // Out of map-count headroom, or the group's merges look
            // scattered and KSM is about to take them: only run-extending
            // merges. A page
            // with a known partner is counted: KSM can take those.
            if !self.stable.get(group, h).is_empty()
                || self.unstable_partner(ri, p, h, group, page).is_some()
            {
                self.pass_groups.entry(group).or_default().deferred += 1;
            }
            return None;
        }
        // 2. Stable index: a slot with room, preferably one whose successor
        //    has room too (the run then continues along the stripe instead
        //    of costing a VMA per page); lowest first.
        let mut fallback = None;
        for &s in self.stable.get(group, h).iter().take(512) {
            if !self.usable(s, h, group, page) {
                continue;
            }
            if self.usable(s.wrapping_add(1), h, group, page) {
                return Some(Target::Existing(s));
            }
            fallback.get_or_insert(s);
        }
        if let Some(s) = fallback {
            return Some(Target::Existing(s));
        }
        // 3. Unstable index: a page seen earlier this pass.
        let found = self
            .unstable_partner(ri, p, h, group, page)
            .or_else(|| self.hinted_partner(ri, p, h, group, page));
        let (cr, cp) = self.locate(found?)?;
        if cr == ri && cp > p {
            // The partner lies ahead in this region: it may be visited later
            // in this very span (hinted pages are visited out of cursor
            // order), where its provisional MERGED state would meet a
            // pagemap entry read before the merge and be taken for a
            // copy-on-write break (its pool reference dropped twice: the
            // soak's mapper-count underflow). It pairs with this page when
            // its own visit comes.
            return None;
        }
        let hint = prev
            .map(|x| x.wrapping_add(1))
            .filter(|&x| self.pool.is_free(x))
            .or_else(|| {
                (cp > 0 && region::kind(self.regions[cr].state[cp - 1]) == MERGED)
                    .then(|| self.regions[cr].word[cp - 1].wrapping_add(1))
                    .filter(|&x| self.pool.is_free(x))
            });
        let s = self.pool.reserve(hint, h, self.cur_hi, group).ok()?;
        Some(Target::Pair(s, cr, cp))
    }

    /// A page seen earlier this pass (unstable index) with this content.
    fn unstable_partner(
        &self,
        ri: usize,
        p: usize,
        h: u32,
        group: u32,
        page: &[u8],
    ) -> Option<u32> {
        let me = self.regions[ri].gid_base + p as u32;
        let regions = &self.regions;
        let locate = |gid: u32| locate_in(regions, gid);
        let key_of = |gid: u32| -> Option<u32> {
            let (r, pp) = locate(gid)?;
            let rg = &regions[r];
            let s = rg.state[pp];
            (gid != me && region::kind(s) == HASHED && !region::is_volatile(s) && rg.group == group)
                .then_some(rg.word[pp])
        };
        self.unstable.find(h, key_of, |gid| {
            let Some((r, pp)) = locate(gid) else {
                return false;
            };
            // SAFETY: registered regions are mapped.
            let other = unsafe { regions[r].page(pp) };
            other == page
        })
    }

    /// Executes the planned ops: slot creators first, then joiners.
    fn execute(&mut self, mut ops: Vec<Op>, freed: &mut Vec<u32>) {
        let _parked = (self.quiesce_min_ops > 0
            && ops.len() >= self.quiesce_min_ops
            && !self.quiescers.is_empty())
        .then(|| Parked::park(self.quiescers.values()));
        ops.sort_by_key(|o| (o.kind != OpKind::New, o.region, o.page));
        let mut new_slots: Vec<u32> = Vec::new();
        // Ops after this index join slots (phase 1), sorted by (region, page).
        let phase1 = ops.partition_point(|o| o.kind == OpKind::New);
        let mut i = 0;
        while i < ops.len() {
            let s = i;
            let phase = ops[i].kind == OpKind::New;
            i += 1;
            // One window: same phase and region, within CHUNK_PAGES pages
            // (gaps allowed, see `merge::exec_chunk`).
            while i < ops.len()
                && (ops[i].kind == OpKind::New) == phase
                && ops[i].region == ops[s].region
                && ops[i].page - ops[s].page < CHUNK_PAGES
            {
                i += 1;
            }
            let chunk = &ops[s..i];
            let gaps = chunk[chunk.len() - 1].page - chunk[0].page + 1 != chunk.len();
            let res = self.exec_window(chunk, &ops[phase1..], phase);
            if res.protect_failed && gaps {
                // Not protectable as a whole (a VMA in a gap is not
                // registered): each gapless part on its own.
                let mut j = 0;
                while j < chunk.len() {
                    let t = j;
                    j += 1;
                    while j < chunk.len() && chunk[j].page == chunk[j - 1].page + 1 {
                        j += 1;
                    }
                    let part = &chunk[t..j];
                    let res = self.exec_window(part, &ops[phase1..], phase);
                    self.commit_window(part, res, &mut new_slots, freed);
                }
            } else {
                self.commit_window(chunk, res, &mut new_slots, freed);
            }
        }
        // A created slot nobody ended up mapping is freed.
        freed.extend(new_slots);
    }

    /// Runs one window of ops (`merge::exec_chunk`). `joins`: the phase-1
    /// ops, sorted by (region, page); `phase`: this window creates slots.
    fn exec_window(&mut self, chunk: &[Op], joins: &[Op], phase: bool) -> merge::ChunkResult {
        let r = &self.regions[chunk[0].region];
        let first = chunk[0];
        let continues_left = first.kind != OpKind::Zero
            && first.page > 0
            && region::kind(r.state[first.page - 1]) == MERGED
            && r.word[first.page - 1].wrapping_add(1) == first.slot
            // A left neighbour still waiting in phase 1 is not mapped yet.
            && !(phase
                && joins
                    .binary_search_by_key(&(first.region, first.page - 1), |o| (o.region, o.page))
                    .is_ok());
        let base = r.addr;
        let ctx = Ctx {
            uffd: &self.uffd,
            prot: &self.prot,
            pagemap: &self.pagemap,
        };
        merge::exec_chunk(
            &ctx,
            &mut self.pool,
            base,
            chunk,
            continues_left,
            &mut self.map_budget,
        )
    }

    /// Commits a window's ops from its result.
    fn commit_window(
        &mut self,
        chunk: &[Op],
        res: merge::ChunkResult,
        new_slots: &mut Vec<u32>,
        freed: &mut Vec<u32>,
    ) {
        for (k, op) in chunk.iter().enumerate() {
            let done = res.done & (1 << k) != 0;
            if op.kind == OpKind::New {
                new_slots.push(op.slot);
                if res.written & (1 << k) == 0 {
                    self.pool.fail(op.slot);
                }
            }
            self.commit(op, done, freed);
        }
    }

    fn commit(&mut self, op: &Op, done: bool, freed: &mut Vec<u32>) {
        let r = &mut self.regions[op.region];
        r.state[op.page] = op.old_state;
        if done {
            match op.kind {
                OpKind::Zero => {
                    r.set_kind(op.page, ZERO);
                    r.set_in_pool(op.page, false);
                    self.counters.zero_merges += 1;
                }
                _ => {
                    r.set_in_pool(op.page, true);
                    r.set_kind(op.page, MERGED);
                    // Checked for copy-on-write every pass at first.
                    r.state[op.page] = region::with_level(r.state[op.page], 0);
                    r.word[op.page] = op.slot;
                    self.counters.merges += 1;
                }
            }
            self.pass_progress += 1;
        } else {
            r.word[op.page] = op.hash;
            r.state[op.page] = region::with_level(op.old_state, 0);
            self.counters.abandoned += 1;
            if op.kind != OpKind::Zero && self.pool.remove_mapper(op.slot) == 0 {
                freed.push(op.slot);
            }
        }
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
    pub fn check_consistency(&self) -> Result<(), String> {
        if self.pool.underflows > 0 {
            return Err(format!(
                "{} pool mapper-count underflows",
                self.pool.underflows
            ));
        }
        let mut count: HashMap<u32, u32> = HashMap::new();
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
