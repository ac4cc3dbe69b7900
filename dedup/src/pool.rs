//! The pool: a memfd holding one copy of each merged content. Guest pages are
//! merged by mapping pool pages privately over them, so the kernel does
//! copy-on-write when they are written.
//!
//! Rules (docs/merge-races.md §11, §12): a slot is written once, before any guest maps it,
//! and never again; it is hole-punched only when the engine's own count says
//! nothing maps it (pagemap cannot tell: untouched merged pages read "not
//! present"), after it left the stable index; a freed slot is reused only
//! after the punch.
//!
//! Where a slot lies decides how many VMAs merges cost: see
//! [`crate::slots`] (each region's window of slots).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::slots::SlotAlloc;
use crate::PAGE_SIZE;

/// Errors of the pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("memfd_create: {0}")]
    Create(#[source] io::Error),
    #[error("mapping the pool view: {0}")]
    View(#[source] io::Error),
    #[error("pool full ({0} pages)")]
    Full(u64),
    #[error("growing the pool file: {0}")]
    Grow(#[source] io::Error),
    #[error("punching pool slot {slot}: {source}")]
    Punch {
        slot: u32,
        #[source]
        source: io::Error,
    },
}

/// Lifecycle of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum SlotState {
    #[default]
    Free,
    /// Allocated for a merge planned in this batch, content not yet written.
    Reserved,
    /// Content written (from a write-protected guest page); immutable now.
    Written,
    /// The creating page could not be merged before writing: never usable.
    Failed,
}

/// Per-slot metadata (16 bytes + 1 state byte).
#[derive(Debug, Clone, Copy, Default)]
pub struct SlotMeta {
    pub hash: u32,
    /// The other half of the content's 64-bit hash: lets planning skip a
    /// memcmp pre-check (the final compare under protection still decides).
    pub hash_hi: u32,
    pub group: u32,
    /// Guest pages mapping this slot, including merges planned in the
    /// current batch (the batch settles them before stats are published).
    pub mappers: u32,
}

/// The pool memfd, its allocator, and a shared view used to write and
/// compare slots.
#[derive(Debug)]
pub struct Pool {
    fd: OwnedFd,
    view: *mut u8,
    max_pages: u64,
    file_pages: u64,
    alloc: SlotAlloc,
    meta: Vec<SlotMeta>,
    state: Vec<SlotState>,
    /// Slots with at least one mapper.
    pub live: u64,
    /// Slots with at least two mappers.
    pub shared: u64,
    /// Sum of mappers.
    pub mappers: u64,
    /// Mapper-count underflows seen (bookkeeping errors; should stay 0).
    pub underflows: u64,
}

// SAFETY: the view pointer is only dereferenced by the owner of the Pool,
// which lives inside the engine's core mutex.
unsafe impl Send for Pool {}

impl Pool {
    /// Creates an empty pool that can grow to `max_bytes`.
    pub fn new(max_bytes: u64) -> Result<Self, PoolError> {
        // SAFETY: the name is NUL-terminated.
        let raw = unsafe { libc::memfd_create(c"pagefold-pool".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(PoolError::Create(io::Error::last_os_error()));
        }
        // SAFETY: raw is a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let max_pages = max_bytes / PAGE_SIZE as u64;
        // SAFETY: a new shared mapping of our memfd at a kernel-chosen
        // address; MAP_NORESERVE: only written slots use memory.
        let view = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                (max_pages as usize) * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if view == libc::MAP_FAILED {
            return Err(PoolError::View(io::Error::last_os_error()));
        }
        Ok(Pool {
            fd,
            view: view as *mut u8,
            max_pages,
            file_pages: 0,
            alloc: SlotAlloc::new(max_pages.min(u32::MAX as u64) as u32),
            meta: Vec::new(),
            state: Vec::new(),
            underflows: 0,
            live: 0,
            shared: 0,
            mappers: 0,
        })
    }

    /// The memfd (what merges map).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Allocated slots (written or reserved).
    pub fn slots_in_use(&self) -> u64 {
        self.alloc.in_use()
    }

    /// True if `s` can be allocated.
    pub fn is_free(&self, s: u32) -> bool {
        self.alloc.is_free(s)
    }

    /// Opens a window of `pages` slots for a region's pages (see
    /// [`crate::slots`]); None when the pool has no room for it (merges of
    /// the region then take spare slots).
    pub fn open_window(&mut self, pages: usize) -> Option<u32> {
        self.alloc.open_window(u32::try_from(pages).ok()?)
    }

    /// Closes the window that starts at `base` (its region is gone).
    pub fn close_window(&mut self, base: u32) {
        self.alloc.close_window(base);
    }

    /// Metadata of slot `s` (default for slots never allocated).
    pub fn meta(&self, s: u32) -> SlotMeta {
        self.meta.get(s as usize).copied().unwrap_or_default()
    }

    /// Starts loading slot `s`'s metadata into the cache. A scan walks
    /// merged pages in guest order, and on scattered layouts their slots
    /// are in no order at all: without a prefetch the metadata read (a
    /// stripe's content hash, `Core::note_run`) is a cache miss per page,
    /// the largest part of the scan loop's own CPU. Harmless for any `s`.
    #[inline]
    pub fn prefetch_meta(&self, s: u32) {
        #[cfg(target_arch = "x86_64")]
        if (s as usize) < self.meta.len() {
            let p = self.meta.as_ptr().wrapping_add(s as usize) as *const i8;
            // SAFETY: a prefetch hint reads nothing architecturally and
            // cannot fault; `p` is inside `meta` anyway.
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = s;
    }

    /// State of slot `s`.
    pub fn state(&self, s: u32) -> SlotState {
        self.state.get(s as usize).copied().unwrap_or_default()
    }

    /// Reserves a slot for content `hash` of `group` (at `hint` if free).
    pub fn reserve(
        &mut self,
        hint: Option<u32>,
        hash: u32,
        hash_hi: u32,
        group: u32,
    ) -> Result<u32, PoolError> {
        let s = self
            .alloc
            .alloc(hint)
            .ok_or(PoolError::Full(self.max_pages))?;
        if (s as u64) >= self.file_pages {
            let want = ((s as u64 + 1) * 2).max(16384).min(self.max_pages);
            // SAFETY: ftruncate on our memfd.
            if unsafe {
                libc::ftruncate(
                    self.fd.as_raw_fd(),
                    (want as usize * PAGE_SIZE) as libc::off_t,
                )
            } != 0
            {
                let e = io::Error::last_os_error();
                self.alloc.free(s);
                return Err(PoolError::Grow(e));
            }
            self.file_pages = want;
        }
        if self.meta.len() <= s as usize {
            self.meta.resize(s as usize + 1, SlotMeta::default());
            self.state.resize(s as usize + 1, SlotState::Free);
        }
        self.meta[s as usize] = SlotMeta {
            hash,
            hash_hi,
            group,
            mappers: 0,
        };
        self.state[s as usize] = SlotState::Reserved;
        Ok(s)
    }

    /// Pointer to slot `s` in the shared view.
    pub fn page_ptr(&self, s: u32) -> *mut u8 {
        debug_assert!((s as u64) < self.file_pages);
        // SAFETY: s is below file_pages <= max_pages, inside the view.
        unsafe { self.view.add(s as usize * PAGE_SIZE) }
    }

    /// Slot `s` content as a slice (only for Written slots).
    pub fn page(&self, s: u32) -> &[u8] {
        debug_assert_eq!(self.state(s), SlotState::Written);
        // SAFETY: written slots are inside the file and immutable. Unlike
        // guest memory (`region::GuestPage`), a slice is sound here: only
        // the engine writes the pool file (`write`, once, before the slot
        // is Written), guests map it privately so their writes copy the
        // page instead of reaching the file, and a slot is punched out only
        // through `&mut self`, which this slice's borrow of `self` rules
        // out while it lives.
        unsafe { std::slice::from_raw_parts(self.page_ptr(s), PAGE_SIZE) }
    }

    /// Writes a Reserved slot once from `src` (a write-protected page).
    ///
    /// # Safety
    /// `src` must be readable for a page.
    pub unsafe fn write(&mut self, s: u32, src: *const u8) {
        assert_eq!(
            self.state(s),
            SlotState::Reserved,
            "pool slot {s} written twice"
        );
        // Written through the file, not the view: a store through the view
        // takes a page fault that allocates and zeroes a shmem page before
        // the copy, and leaves a view mapping that every later hole punch must zap. A
        // full-page write allocates the page without zeroing it.
        // SAFETY: src is readable for a page (contract); pwrite reads it.
        let n = unsafe {
            libc::pwrite(
                self.fd.as_raw_fd(),
                src.cast(),
                PAGE_SIZE,
                (s as usize * PAGE_SIZE) as libc::off_t,
            )
        };
        if n != PAGE_SIZE as isize {
            // SAFETY: src readable per contract; the slot is inside the file
            // and not yet mapped by anyone (Reserved), so writing it is
            // invisible.
            unsafe { std::ptr::copy_nonoverlapping(src, self.page_ptr(s), PAGE_SIZE) };
        }
        self.state[s as usize] = SlotState::Written;
    }

    /// Marks a Reserved slot as never written.
    pub fn fail(&mut self, s: u32) {
        if self.state(s) == SlotState::Reserved {
            self.state[s as usize] = SlotState::Failed;
        }
    }

    /// Counts one more mapper of `s`.
    pub fn add_mapper(&mut self, s: u32) {
        let m = &mut self.meta[s as usize].mappers;
        *m += 1;
        self.mappers += 1;
        match *m {
            1 => self.live += 1,
            2 => self.shared += 1,
            _ => {}
        }
    }

    /// Counts one mapper less of `s`; returns the mappers left.
    pub fn remove_mapper(&mut self, s: u32) -> u32 {
        let m = &mut self.meta[s as usize].mappers;
        if *m == 0 {
            // A bookkeeping error must never take the VMM (and its guests)
            // down: count it (stats, tests check it is 0) and carry on. The
            // slot is then freed only once nothing claims it.
            debug_assert!(false, "pool slot {s} mapper count underflow");
            log::error!("pool slot {s} mapper count underflow (bookkeeping error)");
            self.underflows += 1;
            return 0;
        }
        *m -= 1;
        self.mappers -= 1;
        match *m {
            0 => self.live -= 1,
            1 => self.shared -= 1,
            _ => {}
        }
        *m
    }

    /// Frees a slot nothing maps (the caller removed it from the stable
    /// index first): punches the hole, then returns the offset.
    #[cfg(test)]
    pub fn release(&mut self, s: u32) -> Result<(), PoolError> {
        self.release_many(&mut vec![s])
            .into_iter()
            .next()
            .map_or(Ok(()), Err)
    }

    /// [`Pool::release`] for many slots (sorted here): one hole punch per
    /// run of consecutive written slots instead of one per slot. A VM that
    /// leaves frees the slots of its region's window, mostly consecutive,
    /// and one punch per slot would hold the engine's core (and the VM's
    /// deletion) for thousands of punches. Returns the punches that failed;
    /// their slots stay allocated (leaked, still correct).
    pub fn release_many(&mut self, slots: &mut Vec<u32>) -> Vec<PoolError> {
        slots.sort_unstable();
        slots.dedup();
        let mut errors = Vec::new();
        let mut i = 0;
        while i < slots.len() {
            let s = slots[i];
            assert_eq!(self.meta(s).mappers, 0, "releasing mapped pool slot {s}");
            let mut j = i + 1;
            if self.state(s) == SlotState::Written {
                while j < slots.len()
                    && slots[j] == slots[j - 1] + 1
                    && self.state(slots[j]) == SlotState::Written
                {
                    assert_eq!(self.meta(slots[j]).mappers, 0, "releasing mapped pool slot");
                    j += 1;
                }
                if let Err(source) = self.punch(s as u64, (j - i) as u64) {
                    errors.push(PoolError::Punch { slot: s, source });
                    i = j;
                    continue;
                }
            }
            for &x in &slots[i..j] {
                if self.state(x) == SlotState::Free {
                    continue;
                }
                self.state[x as usize] = SlotState::Free;
                self.meta[x as usize] = SlotMeta::default();
                self.alloc.free(x);
            }
            i = j;
        }
        // Metadata is dense up to the highest slot in use: give back the
        // tail once it is mostly unused.
        let high = self.alloc.high_water() as usize;
        if high < self.meta.len() / 2 {
            self.meta.truncate(high);
            self.meta.shrink_to_fit();
            self.state.truncate(high);
            self.state.shrink_to_fit();
        }
        errors
    }

    /// Frees every slot at once when nothing maps any (the engine's own
    /// count, as for [`Pool::release`]): one hole punch over the whole file
    /// instead of one per slot, which the VMM's thread would otherwise make
    /// when the last VM of a group leaves.
    /// Returns false (nothing changed) if a page is still counted as mapped
    /// or a slot is reserved for a merge in flight.
    pub fn release_all(&mut self) -> bool {
        if self.mappers != 0 || self.state.contains(&SlotState::Reserved) {
            return false;
        }
        if self.punch(0, self.file_pages).is_err() {
            return false;
        }
        self.forget_slots();
        true
    }

    /// Frees the pages of slots `first..first + n` (`FALLOC_FL_PUNCH_HOLE`,
    /// the file keeps its size).
    ///
    /// The file never shrinks: `ftruncate` to a smaller size unmaps the
    /// range past the new end from every mapping of the file, private
    /// copy-on-write copies included (shmem's `unmap_mapping_range` with
    /// `even_cows`). A guest page merged once and written since is such a
    /// copy, still inside its pool VMA: truncating the pool when no slot
    /// has a mapper left would destroy those pages, and the guest would
    /// read zeros (once the file grows again) or its KVM_RUN fail with
    /// EFAULT (past the end of the file). A hole punch spares private
    /// copies (docs/merge-races.md §12).
    fn punch(&self, first: u64, n: u64) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: fallocate on our memfd; the caller frees only slots that
        // no page maps (private copies of them are kept by the kernel).
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (first as usize * PAGE_SIZE) as libc::off_t,
                (n as usize * PAGE_SIZE) as libc::off_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The bookkeeping of an empty pool, once its pages are punched out.
    /// The file keeps its size (see [`Pool::punch`]).
    fn forget_slots(&mut self) {
        self.meta = Vec::new();
        self.state = Vec::new();
        self.alloc.clear();
        self.live = 0;
        self.shared = 0;
    }

    /// Approximate metadata bytes.
    pub fn metadata_bytes(&self) -> u64 {
        (self.meta.capacity() * std::mem::size_of::<SlotMeta>() + self.state.capacity()) as u64
            + self.alloc.heap_bytes()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the view is our own mapping; merged guest pages keep their
        // own references to the memfd, so unmapping the view is harmless.
        unsafe {
            libc::munmap(
                self.view as *mut libc::c_void,
                self.max_pages as usize * PAGE_SIZE,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releasing_many_slots_punches_only_their_pages() {
        let mut p = Pool::new(1 << 30).unwrap();
        for i in 0..8u32 {
            let s = p.reserve(Some(i), i, 0, 0).unwrap();
            assert_eq!(s, i);
            if i != 6 {
                let src = [i as u8 + 1; PAGE_SIZE];
                // SAFETY: src is a page-sized buffer.
                unsafe { p.write(s, src.as_ptr()) };
            }
        }
        // Unsorted, a duplicate, a run (0-2), a lone slot (4) and a slot
        // only reserved (6).
        let page = |p: &Pool, s: u32| {
            // SAFETY: slots 0..8 lie inside the file (written once).
            unsafe { *p.page_ptr(s).add(100) }
        };
        assert!(p.release_many(&mut vec![4, 0, 1, 2, 6, 0]).is_empty());
        for s in [0, 1, 2, 4, 6] {
            assert!(p.is_free(s), "slot {s}");
            assert_eq!(page(&p, s), 0, "slot {s} not punched");
        }
        for s in [3, 5, 7] {
            assert_eq!(p.state(s), SlotState::Written);
            assert_eq!(page(&p, s), s as u8 + 1, "slot {s} lost its page");
        }
        assert_eq!(p.slots_in_use(), 3);
    }

    #[test]
    fn write_release_counts() {
        let mut p = Pool::new(1 << 30).unwrap();
        let s = p.reserve(None, 7, 0, 0).unwrap();
        let src = [5u8; PAGE_SIZE];
        // SAFETY: src is a page-sized buffer.
        unsafe { p.write(s, src.as_ptr()) };
        assert_eq!(p.page(s)[100], 5);
        p.add_mapper(s);
        p.add_mapper(s);
        assert_eq!((p.live, p.shared, p.mappers), (1, 1, 2));
        p.remove_mapper(s);
        p.remove_mapper(s);
        assert_eq!((p.live, p.shared, p.mappers), (0, 0, 0));
        p.release(s).unwrap();
        assert!(p.is_free(s));
        assert_eq!(p.slots_in_use(), 0);
    }

    #[test]
    fn release_all_only_when_nothing_is_mapped_or_reserved() {
        let mut p = Pool::new(1 << 30).unwrap();
        let src = [9u8; PAGE_SIZE];
        let a = p.reserve(None, 1, 0, 0).unwrap();
        // SAFETY: src is a page-sized buffer.
        unsafe { p.write(a, src.as_ptr()) };
        p.add_mapper(a);
        assert!(!p.release_all(), "slot a is mapped");
        p.remove_mapper(a);
        let b = p.reserve(None, 2, 0, 0).unwrap();
        assert!(!p.release_all(), "slot b is reserved");
        p.fail(b);
        assert!(p.release_all());
        assert_eq!(p.slots_in_use(), 0);
        assert!(p.is_free(a) && p.is_free(b));
        // The file holds no page any more but keeps its size: shrinking it
        // would unmap private copies of its pages (see `Pool::punch`).
        // SAFETY: fstat on our memfd into a zeroed struct.
        let stat = |p: &Pool| unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(p.raw_fd(), &mut st), 0);
            (st.st_size, st.st_blocks)
        };
        let (size, blocks) = stat(&p);
        assert!(size > 0);
        assert_eq!(blocks, 0, "pool pages left after release_all");
        let c = p.reserve(None, 3, 0, 0).unwrap();
        // SAFETY: src is a page-sized buffer.
        unsafe { p.write(c, src.as_ptr()) };
        assert_eq!(p.page(c)[0], 9);
        assert_eq!(stat(&p), (size, (PAGE_SIZE / 512) as i64));
    }
}
