//! The race-free merge path, one chunk (at most [`CHUNK_PAGES`] consecutive
//! guest pages) at a time:
//!
//! 1. mark the range busy (the fault handler leaves its faults to us), then
//!    `UFFDIO_WRITEPROTECT` the range: from here every writer (vCPU through
//!    KVM, device thread, kernel copy_to_user) blocks in userfaultfd;
//! 2. read pagemap: only pages present, anonymous and carrying the uffd-wp
//!    bit are really protected; any other page drops out (docs/merge-races.md
//!    §5).
//!    Not needed where the uffd has `WP_UNPOPULATED` (Linux 6.4+): the
//!    protect then covers every page of the window, mapped or not;
//! 3. final compare: against the pool page, or for a new pool page copy the
//!    protected page into it (a snapshot no writer can race), or check zero;
//! 4. `mmap(MAP_FIXED|MAP_PRIVATE, pool_fd)` per run of consecutive slots
//!    (one call per run, far cheaper than one per page), or `MADV_DONTNEED`
//!    for zero pages; `ENOMEM` (map count) abandons the rest
//!    (docs/merge-races.md §13);
//! 5. re-register the new VMAs with the uffd (MAP_FIXED VMAs are not);
//! 6. always, even on error or panic ([`Busy`]'s `Drop`): unprotect the
//!    pages still on their original mapping, unmark the range, and wake it
//!    if the fault handler left a writer to us meanwhile
//!    ([`ProtState::deferred`]; otherwise the handler wakes any writer
//!    whose message it reads later).
//!
//! A blocked writer wakes up to a fresh private mapping of the pool page and
//! the kernel copies it on write: its write lands (docs/merge-races.md §4).

use std::sync::Mutex;

use crate::fault::{BusyRange, ProtState};
use crate::mm::{self, MmError};
use crate::pagemap::{Entry, Pagemap, PM_PRESENT, PM_UFFD_WP};
use crate::pool::{Pool, SlotState};
use crate::region::GuestPage;
use crate::uffd::{Uffd, UffdError};
use crate::{low_bits, PAGE_SIZE};

/// Most pages protected at once, for a gapless window (a run of pages of
/// one content): bounds how long a writer waits for a window. A window
/// with gaps spans at most [`GAPPED_WINDOW_PAGES`]. Longer windows make
/// each protect, pagemap read and register serve more pages (the `mmap`s
/// stay one per run of consecutive slots); beyond this length the
/// `mmap`s' per-page work (zapping, freeing) and the compare's read are
/// what remains, so longer windows would only make writers wait longer
/// (docs/engine.md).
pub const CHUNK_PAGES: usize = 128;
/// Longest window with gaps: a gap page is protected and released for
/// nothing, so scattered ops get shorter windows than runs.
pub const GAPPED_WINDOW_PAGES: usize = 64;

/// A window's page mask: bit i is window page i (or, in [`ChunkResult`],
/// op i); `low_bits(n)` is a window of n pages.
pub type Mask = crate::fault::OpMask;

/// `exec_chunk`'s mark for a window page without an op.
const NO_OP: u8 = u8::MAX;

/// Errors of the merge path (all are handled by abandoning the chunk).
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Uffd(#[from] UffdError),
    #[error(transparent)]
    Mm(#[from] MmError),
    #[error(transparent)]
    Pagemap(#[from] crate::pagemap::PagemapError),
}

/// What one planned page operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Copy this page into the (reserved) slot, then map it.
    New,
    /// Compare with the (written) slot, then map it.
    Existing,
    /// Check zero, then `MADV_DONTNEED`.
    Zero,
}

/// One planned page operation.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub region: usize,
    pub page: usize,
    pub slot: u32,
    pub kind: OpKind,
    /// The page's hash (to restore its state if the op fails).
    pub hash: u32,
    /// The page's state byte before planning.
    pub old_state: u8,
    /// The page lies in a pool VMA (see `Region::in_pool`).
    pub in_pool: bool,
    /// The rule that let the page merge, recorded in its state when the
    /// merge is made (the scanner's; the merge path ignores it).
    pub origin: crate::region::Origin,
}

impl Op {
    /// Does this op map the pool page after `prev`'s, on the page after
    /// `prev`'s: one `mmap` then covers both (`exec_chunk`), and a merge
    /// window is best not cut between them (`scanner::execute`).
    pub fn continues_run(&self, prev: &Op) -> bool {
        self.kind != OpKind::Zero
            && prev.kind != OpKind::Zero
            && self.region == prev.region
            && self.page == prev.page + 1
            && self.slot == prev.slot.wrapping_add(1)
    }
}

/// What the merge path needs from the engine.
pub struct Ctx<'a> {
    pub uffd: &'a Uffd,
    pub prot: &'a Mutex<ProtState>,
    pub pagemap: &'a Pagemap,
}

/// Map-count budget shared by the chunks of a batch.
#[derive(Debug, Default)]
pub struct MapBudget {
    /// VMAs we may still create before hitting the reserve.
    pub headroom: i64,
    /// Set when a merge was refused or failed for lack of VMAs.
    pub limited: bool,
}

/// A busy (write-protected) range; `Drop` releases it whatever happened.
struct Busy<'a> {
    ctx: &'a Ctx<'a>,
    addr: usize,
    n: usize,
    /// Bit i set: page i is still on its original mapping (to unprotect).
    original: Mask,
    /// `ProtState::deferred` when the range became busy.
    deferred_at: u64,
}

/// Marks `addr..end` busy, `ops` its pages that the merge changes (`None`:
/// all); returns `ProtState::deferred` at that moment.
fn mark_busy(prot: &Mutex<ProtState>, addr: usize, end: usize, ops: Option<Mask>) -> u64 {
    let mut p = prot.lock().unwrap_or_else(|e| e.into_inner());
    p.busy.push(BusyRange {
        start: addr,
        end,
        ops,
    });
    p.deferred
}

/// Unmarks `addr..end` and wakes its writers if the fault handler left one
/// to us while it was busy. Without a deferred fault there is no writer to
/// wake: a writer whose message the handler reads after the unmark is woken
/// by the handler (the page is not busy, and no longer protected), so an
/// unconditional wake would be one ioctl per window, nearly always for
/// nobody (docs/merge-races.md §6).
fn unmark_busy(ctx: &Ctx<'_>, addr: usize, end: usize, deferred_at: u64) {
    let deferred = {
        let mut p = ctx.prot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = p.busy.iter().position(|r| (r.start, r.end) == (addr, end)) {
            p.busy.swap_remove(pos);
        }
        let deferred = p.deferred != deferred_at;
        if deferred {
            p.woke();
        }
        deferred
    };
    if deferred {
        if let Err(e) = ctx.uffd.wake(addr, end - addr) {
            log::warn!("wake after merge: {e}");
        }
    }
}

impl<'a> Busy<'a> {
    /// Protects the `n` pages at `addr`, of which `ops` (bit i: page i)
    /// are the merge's.
    fn protect(ctx: &'a Ctx<'a>, addr: usize, n: usize, ops: Mask) -> Result<Self, MergeError> {
        debug_assert!(n > 0 && n <= CHUNK_PAGES);
        let busy = Busy {
            ctx,
            addr,
            n,
            original: low_bits(n),
            deferred_at: mark_busy(ctx.prot, addr, addr + n * PAGE_SIZE, Some(ops)),
        };
        // On error `busy` drops: unprotect + wake + unmark.
        ctx.uffd.protect(addr, n * PAGE_SIZE)?;
        Ok(busy)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let all = low_bits(self.n);
        // One ioctl (one TLB flush) for the whole range when pages were
        // remapped between original ones: the remapped pages are pool
        // mappings registered again (step 5) and carry no write-protection,
        // so clearing it there changes nothing. Per-run unprotects cost a
        // flush each, which on a host whose IPIs trap (nested, PVM) is most
        // of the engine's CPU. If the range has an unregistered VMA (a
        // failed re-register), this fails and the runs are done one by one.
        // A kernel whose ioctl stays within one VMA (before 6.5) would
        // split the range into its VMAs anyway: the runs, each within the
        // VMA it was protected in, are fewer calls.
        if self.original != 0
            && self.original != all
            && self.ctx.uffd.spans_vmas()
            && self
                .ctx
                .uffd
                .unprotect(self.addr, self.n * PAGE_SIZE)
                .is_ok()
        {
            self.original = 0;
        }
        let mut i = 0;
        while i < self.n {
            if self.original & (1 << i) == 0 {
                i += 1;
                continue;
            }
            let s = i;
            while i < self.n && self.original & (1 << i) != 0 {
                i += 1;
            }
            let (a, l) = (self.addr + s * PAGE_SIZE, (i - s) * PAGE_SIZE);
            if let Err(e) = self.ctx.uffd.unprotect(a, l) {
                log::warn!("unprotect after merge: {e}");
            }
        }
        unmark_busy(
            self.ctx,
            self.addr,
            self.addr + self.n * PAGE_SIZE,
            self.deferred_at,
        );
    }
}

/// Result of one chunk.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChunkResult {
    /// Bit i: op i succeeded (merged or dropped to zero).
    pub done: Mask,
    /// Bit i: for a `New` op, the slot was written (usable by others).
    pub written: Mask,
    /// The window could not be write-protected, so nothing was done (e.g.
    /// a VMA in it is not registered): the caller may retry its ops in
    /// windows without gaps.
    pub protect_failed: bool,
}

/// Executes `ops`: pages of the region at `base` in ascending order, all
/// within one window of at most [`CHUNK_PAGES`] pages (gaps allowed).
/// `continues_left`: the page before `ops[0]` maps slot `ops[0].slot - 1`
/// (the first run then extends that VMA instead of creating one).
///
/// The whole window is write-protected, checked and released with one
/// ioctl each, gap pages included (a guest write there faults, and the
/// fault handler releases that page at once: the window records which
/// pages are its ops): scattered merges then cost one
/// protect, one register and one unprotect per window (and one pagemap
/// read, without `WP_UNPOPULATED`) instead of per page; each protect and
/// unprotect is a TLB flush of every CPU running the VM.
pub fn exec_chunk(
    ctx: &Ctx<'_>,
    pool: &mut Pool,
    base: usize,
    ops: &[Op],
    continues_left: bool,
    budget: &mut MapBudget,
) -> ChunkResult {
    let mut res = ChunkResult::default();
    let Some(w) = Window::new(base, ops) else {
        return res;
    };
    // Step 1.
    let op_pages = ops
        .iter()
        .fold(0 as Mask, |m, op| m | 1 << (op.page - w.first));
    let mut busy = match Busy::protect(ctx, w.addr0, w.n, op_pages) {
        Ok(b) => b,
        Err(e) => {
            log::debug!("protect failed, chunk abandoned: {e}");
            res.protect_failed = true;
            return res;
        }
    };
    // Steps 2-3.
    let Some((ok, written)) = final_compare(ctx, pool, &w) else {
        return res;
    };
    // Step 4.
    let (done, remapped) = map_runs(pool, &w, ok, continues_left, budget, &mut busy);
    for (k, op) in ops.iter().enumerate() {
        let bit: Mask = 1 << (op.page - w.first);
        if done & bit != 0 {
            res.done |= 1 << k;
        }
        if written & bit != 0 {
            res.written |= 1 << k;
        }
    }
    // Step 5: the new VMAs are not registered; registering the whole range
    // skips the already-registered VMAs and merges neighbours back together.
    if remapped {
        if let Err(e) = ctx.uffd.register_wp(w.addr0, w.n * PAGE_SIZE) {
            // Those pages stay merged; later protects there fail with ENOENT
            // and abandon cleanly, so this is safe, only less efficient.
            log::warn!("re-register after merge: {e}");
        }
    }
    drop(busy); // Step 6.
    res
}

/// A merge window: the pages `first..first + n` of the region at `base`,
/// and its ops by window offset.
struct Window<'a> {
    ops: &'a [Op],
    /// at[o]: index in `ops` of the op at window offset o.
    at: [u8; CHUNK_PAGES],
    first: usize,
    n: usize,
    addr0: usize,
}

impl<'a> Window<'a> {
    /// None without ops.
    fn new(base: usize, ops: &'a [Op]) -> Option<Self> {
        let last = ops.last()?;
        let first = ops[0].page;
        let n = last.page - first + 1;
        debug_assert!(n <= CHUNK_PAGES);
        let mut at = [NO_OP; CHUNK_PAGES];
        for (k, op) in ops.iter().enumerate() {
            at[op.page - first] = k as u8;
        }
        Some(Window {
            ops,
            at,
            first,
            n,
            addr0: base + first * PAGE_SIZE,
        })
    }

    /// The op at window offset `o`, which has one.
    fn op_at(&self, o: usize) -> &Op {
        &self.ops[self.at[o] as usize]
    }
}

/// Steps 2-3 of a window whose pages are write-protected: which pages
/// the protect covered, then each op's final compare (a `New` op's slot
/// written from its page). Returns the masks, by window offset, of the
/// ops that passed and of the slots written; None when the pagemap read
/// of step 2 failed (nothing is merged).
fn final_compare(ctx: &Ctx<'_>, pool: &mut Pool, w: &Window<'_>) -> Option<(Mask, Mask)> {
    let n = w.n;
    // Step 2: which pages did the protect cover? With
    // `WP_UNPOPULATED`, all of them: present, swapped, migrating and
    // empty PTEs alike (an empty one gets a marker; the compare's read
    // maps the zero page write-protected), so nothing can write an op's
    // page until the window ends, and this pagemap read is not needed
    // (docs/merge-races.md §5). An op's page is private and
    // anonymous: only the engine maps pool pages, and it planned this op
    // from the page's state under the core lock it still holds.
    let verify = !ctx.uffd.protects_unpopulated();
    let mut pm = [Entry(PM_PRESENT | PM_UFFD_WP); CHUNK_PAGES];
    if verify && ctx.pagemap.read(w.addr0, &mut pm[..n]).is_err() {
        return None;
    }
    // Step 3: the final compare. Masks by window offset.
    let (mut ok, mut written): (Mask, Mask) = (0, 0);
    for (o, &k) in w.at[..n].iter().enumerate() {
        if k == NO_OP {
            continue;
        }
        let op = &w.ops[k as usize];
        let e = pm[o];
        if !(e.present() && e.uffd_wp() && !e.file()) {
            continue;
        }
        let addr = w.addr0 + o * PAGE_SIZE;
        // Read here, after the protect (step 1) and its check (step 2): no
        // writer can change the page until the window's `Busy` drops, so
        // what is compared or copied is what the merge maps. Compared
        // through a snapshot, never a slice over guest memory (`GuestPage`).
        // SAFETY: the page is page-aligned and mapped (register contract),
        // and stays so while the core is held: `exec_chunk`'s caller holds
        // it (it lends the core's pool).
        let page = unsafe { GuestPage::new(addr) };
        let good = match op.kind {
            OpKind::New => {
                if pool.state(op.slot) == SlotState::Reserved {
                    // SAFETY: `addr` is a readable page (above), protected.
                    unsafe { pool.write(op.slot, addr as *const u8) };
                    written |= 1 << o;
                    true
                } else {
                    false
                }
            }
            OpKind::Existing => {
                pool.state(op.slot) == SlotState::Written && page.equals(pool.page(op.slot))
            }
            OpKind::Zero => page.is_zero(),
        };
        if good {
            ok |= 1 << o;
        }
    }
    Some((ok, written))
}

/// How a run of passed ops is mapped.
#[derive(PartialEq, Eq, Clone, Copy)]
enum Class {
    /// Onto consecutive pool slots.
    Pool,
    /// Zero pages outside the pool: dropped with `MADV_DONTNEED`.
    ZeroDontneed,
    /// Zero pages inside a pool VMA: fresh anonymous memory over them.
    ZeroAnon,
}

impl Class {
    fn of(op: &Op) -> Self {
        match (op.kind, op.in_pool) {
            (OpKind::Zero, false) => Class::ZeroDontneed,
            (OpKind::Zero, true) => Class::ZeroAnon,
            _ => Class::Pool,
        }
    }
}

/// Step 4: remaps the runs of adjacent passed op pages (`ok`, by window
/// offset) onto the pool, or drops zero runs, within the VMA `budget`.
/// Returns the mask of pages done and whether anything was remapped (the
/// new VMAs need registering); a remapped page is no longer the window's
/// to unprotect (`busy.original`).
fn map_runs(
    pool: &Pool,
    w: &Window<'_>,
    ok: Mask,
    continues_left: bool,
    budget: &mut MapBudget,
    busy: &mut Busy<'_>,
) -> (Mask, bool) {
    let n = w.n;
    let mut done: Mask = 0;
    let mut remapped = false;
    let mut i = 0;
    let mut stop_mapping = false;
    while i < n {
        if ok & (1 << i) == 0 {
            i += 1;
            continue;
        }
        let s = i;
        let c = Class::of(w.op_at(i));
        i += 1;
        while i < n
            && ok & (1 << i) != 0
            && Class::of(w.op_at(i)) == c
            && (c != Class::Pool || w.op_at(i).continues_run(w.op_at(i - 1)))
        {
            i += 1;
        }
        let run_mask = low_bits(i - s) << s;
        let (a, l) = (w.addr0 + s * PAGE_SIZE, (i - s) * PAGE_SIZE);
        if c == Class::ZeroDontneed {
            // SAFETY: `a..+l` is a page-aligned run of this window's op
            // pages in a registered region (a private anonymous mapping by
            // the register contract), none in a pool VMA (class
            // ZeroDontneed), each verified all-zero in step 3 and still
            // write-protected (`busy` lives to step 6): the dropped pages
            // read as zeros, as before.
            match unsafe { mm::madvise(a, l, libc::MADV_DONTNEED) } {
                Ok(()) => done |= run_mask,
                Err(e) => log::warn!("zero-page drop: {e}"),
            }
            continue;
        }
        let extends = s == 0 && continues_left && c == Class::Pool;
        if stop_mapping || (!extends && budget.headroom < 2) {
            budget.limited = true;
            continue;
        }
        let r = if c == Class::Pool {
            // SAFETY: `a..+l` is a page-aligned run of this window's op
            // pages in a registered region (a private anonymous mapping by
            // the register contract); each page is
            // write-protected until `busy` drops (step 6) and in step 3
            // either compared equal to its written pool page or copied
            // into it (`continues_run`: the run's slots are consecutive
            // from `w.op_at(s).slot`), so the mapping shows the same bytes.
            unsafe {
                mm::map_pool_fixed(
                    a,
                    l,
                    pool.raw_fd(),
                    w.op_at(s).slot as u64 * PAGE_SIZE as u64,
                )
            }
        } else {
            // SAFETY: as above; class ZeroAnon: each page was verified
            // all-zero in step 3 under write-protection, so fresh zero
            // memory shows the same bytes.
            unsafe { mm::map_anon_fixed(a, l) }
        };
        match r {
            Ok(()) => {
                done |= run_mask;
                busy.original &= !run_mask;
                remapped = true;
                if !extends {
                    budget.headroom -= 2;
                }
            }
            Err(e) => {
                // The old page is intact after a failed MAP_FIXED (checked on
                // this kernel): abandon this run and the rest.
                if e.errno() == Some(libc::ENOMEM) {
                    budget.limited = true;
                    budget.headroom = 0;
                }
                log::debug!("merge mmap failed: {e}");
                stop_mapping = true;
            }
        }
    }
    (done, remapped)
}

/// Gives pages `addr..+n` (all mapped from the pool, possibly already COWed)
/// back their own private anonymous copies: protect, verify, copy into a
/// fresh anonymous area, `mremap` it over the range in one step,
/// re-register, wake. `slots[i]`, when known, is the pool page that page i
/// maps (a merged page's slot): a page not mapped in is read from there,
/// not faulted in. Returns false (nothing changed) if the range could not
/// be fully protected; retry later.
///
/// Pool VMAs are file-backed, so write-protecting a PTE that is not
/// populated leaves a uffd-wp marker: the protection covers every page
/// without populating the range first, which would cost a read fault per
/// never-touched merged page, PTEs that `mremap` then zaps again.
pub fn unmerge_chunk(
    ctx: &Ctx<'_>,
    addr: usize,
    n: usize,
    slots: &[Option<*const u8>],
) -> Result<bool, MergeError> {
    debug_assert!(n > 0 && n <= UNMERGE_CHUNK_PAGES && slots.len() == n);
    let len = n * PAGE_SIZE;
    let mut busy = RangeBusy::protect(ctx, addr, len)?;
    let mut pm = vec![Entry(0); n];
    ctx.pagemap.read(addr, &mut pm)?;
    if !pm.iter().all(|e| e.uffd_wp()) {
        // Some page took no marker (not a pool VMA after all?): make every
        // PTE present, protect again, and require it of every page.
        // SAFETY: `addr..+len` lies in a registered region (mapped, the
        // register contract); populating for read changes no content.
        let _ = unsafe { mm::madvise(addr, len, mm::MADV_POPULATE_READ) };
        ctx.uffd.protect(addr, len)?;
        ctx.pagemap.read(addr, &mut pm)?;
        if !pm.iter().all(|e| e.present() && e.uffd_wp()) {
            return Ok(false);
        }
    }
    // Populated up front: the copy below then writes into pages that exist
    // instead of taking a first-touch fault per page.
    let tmp = mm::map_anon_populated(len)?;
    let mut i = 0;
    while i < n {
        // A page with no page behind its PTE maps its slot's content: copied
        // from the slot, without faulting it in. Every other page is read in
        // place (mapped, or faulted in: a read fault keeps the marker's
        // protection), in runs of one copy each. That includes a page in
        // swap or under migration: it is the copy-on-write copy of a write
        // the scanner has not seen yet, and the slot no longer holds its
        // content (docs/merge-races.md §14).
        let from_slot = |k: usize| pm[k].no_page().then_some(slots[k]).flatten();
        if let Some(src) = from_slot(i) {
            // SAFETY: `src` is a written pool slot this page maps (immutable
            // while mapped); tmp has room for page i.
            unsafe { std::ptr::copy_nonoverlapping(src, tmp.add(i * PAGE_SIZE), PAGE_SIZE) };
            i += 1;
            continue;
        }
        let s = i;
        while i < n && from_slot(i).is_none() {
            i += 1;
        }
        let (off, l) = (s * PAGE_SIZE, (i - s) * PAGE_SIZE);
        // SAFETY: the range is mapped and write-protected (stable); tmp is
        // our fresh mapping of the same length.
        unsafe { std::ptr::copy_nonoverlapping((addr + off) as *const u8, tmp.add(off), l) };
    }
    // SAFETY: `tmp` is our fresh private mapping of `len` bytes, used no
    // more after this; `addr..+len` lies in a registered region (a private
    // mapping, the register contract), is write-protected until `busy`
    // drops, and `tmp` holds a copy of every page of it made under that
    // protection: readers see the same bytes.
    if let Err(e) = unsafe { mm::mremap_fixed(tmp, len, addr) } {
        // SAFETY: the move failed, so `tmp` is still our mapping; unused
        // from here.
        unsafe { mm::unmap(tmp, len) };
        return Err(e.into());
    }
    busy.replaced = true;
    if let Err(e) = ctx.uffd.register_wp(addr, len) {
        log::warn!("re-register after unmerge: {e}");
    }
    drop(busy);
    Ok(true)
}

/// Pages unmerged per protected chunk: writers to the chunk wait for one
/// 1 MiB copy and one `mremap`, short enough for a vCPU; shorter chunks
/// would spend most of the unmerge in the per-chunk syscalls (protect,
/// pagemap, mmap, mremap, register, wake).
pub const UNMERGE_CHUNK_PAGES: usize = 256;

/// A protected range of any length (the unmerge path), released like
/// [`Busy`]: unprotected unless replaced, woken, unmarked, on every path.
struct RangeBusy<'a> {
    ctx: &'a Ctx<'a>,
    addr: usize,
    len: usize,
    /// The range now holds a fresh mapping with no protection to remove.
    replaced: bool,
    /// `ProtState::deferred` when the range became busy.
    deferred_at: u64,
}

impl<'a> RangeBusy<'a> {
    fn protect(ctx: &'a Ctx<'a>, addr: usize, len: usize) -> Result<Self, MergeError> {
        let busy = RangeBusy {
            ctx,
            addr,
            len,
            replaced: false,
            deferred_at: mark_busy(ctx.prot, addr, addr + len, None),
        };
        // On error `busy` drops: unprotect + wake + unmark.
        ctx.uffd.protect(addr, len)?;
        Ok(busy)
    }
}

impl Drop for RangeBusy<'_> {
    fn drop(&mut self) {
        if !self.replaced {
            if let Err(e) = self.ctx.uffd.unprotect(self.addr, self.len) {
                log::warn!("unprotect after unmerge: {e}");
            }
        }
        unmark_busy(self.ctx, self.addr, self.addr + self.len, self.deferred_at);
    }
}
