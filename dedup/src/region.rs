//! A registered region and its per-page metadata: 6 bytes per page, and
//! two bits (in a pool VMA, given back by the owner).
//!
//! * `word[i]`: the page's last folded hash while it is unmerged, its pool
//!   slot while merged (a merged page is never re-hashed: pool pages are
//!   immutable, so only pagemap is checked for copy-on-write).
//! * `state[i]`: kind (2 bits), smart-scan level (2 bits), rehash flag
//!   (1 bit), merge origin (2 bits, [`Origin`]), volatile flag (1 bit).
//!   Which passes a page at level L is hashed on is not stored per page:
//!   see [`due`].
//! * `epoch[i]`: for a MERGED or ZERO page, the number of the settle time
//!   it merged under (`scanner::settle`), which its break is counted
//!   against.

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;

use crate::backend::{RegionId, Security};
use crate::PAGE_SIZE;

/// Errors about regions.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The range is not page aligned, is empty, or wraps the address space.
    #[error("region {addr:#x}+{len:#x} is not page aligned or is empty")]
    Bad {
        /// Host address of the range.
        addr: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// The engine's 32-bit page ids are used up.
    #[error("too many pages tracked (page ids exhausted)")]
    TooManyPages,
}

/// Never hashed, or its hash is no longer valid.
pub const NEW: u8 = 0;
/// Hashed; `word` is the hash.
pub const HASHED: u8 = 1;
/// Mapped to pool slot `word`.
pub const MERGED: u8 = 2;
/// Dropped to the zero page by the engine.
pub const ZERO: u8 = 3;

const KIND_MASK: u8 = 0b11;
const LEVEL_SHIFT: u8 = 2;
const LEVEL_MASK: u8 = 0b11 << LEVEL_SHIFT;
const VOLATILE: u8 = 1 << 7;
/// A HASHED page whose last join-without-hashing (see `Core::visit`) failed,
/// or whose 32-bit hash names a stable slot of other content (a collision
/// the 64-bit hash tells apart): its stored hash may be stale or
/// ambiguous, so its next visit hashes it. On a NEW
/// page: a guess without a hash failed, or its share copy-on-write broke;
/// its next visit hashes it and does not seed a run (`SEED_RUN`).
pub const REHASH: u8 = 1 << 4;

const ORIGIN_SHIFT: u8 = 5;
const ORIGIN_MASK: u8 = 0b11 << ORIGIN_SHIFT;

/// Which rule let a MERGED or ZERO page merge, kept in its state until it
/// merges again: copy-on-write breaks are counted by it
/// (`backend::MergeOrigins`), which tells the merges the guests undo
/// from those that last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Unchanged since its previous visit a pass earlier (KSM's rule), by
    /// its hash or by the write log. A pair merges by the rule of the
    /// visit that found it.
    Steady = 0,
    /// Changed at its visit, then unwritten for a whole `LOG_INTERVAL`
    /// by the write log (`run_rechecks`).
    SecondLook = 1,
    /// At first sight, with no check that it stays unchanged: a join of
    /// an existing slot, a run of one pattern (`SEED_RUN`), a run
    /// continued without hashing.
    FirstSight = 2,
    /// Filled by a device just before (an I/O hint).
    Hinted = 3,
}

impl Origin {
    /// Its index in `backend::ByOrigin`'s order.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A page state's merge origin (meaningful for MERGED and ZERO pages).
pub fn origin(s: u8) -> Origin {
    match (s & ORIGIN_MASK) >> ORIGIN_SHIFT {
        0 => Origin::Steady,
        1 => Origin::SecondLook,
        2 => Origin::FirstSight,
        _ => Origin::Hinted,
    }
}

/// The state with merge origin `o`, the rest kept.
pub fn with_origin(s: u8, o: Origin) -> u8 {
    (s & !ORIGIN_MASK) | ((o as u8) << ORIGIN_SHIFT)
}

/// Highest smart-scan level: a page unique for 3+ passes is looked at once
/// every 8 passes (KSM's smart_scan idea, bounded).
pub const MAX_LEVEL: u8 = 3;

/// Is a HASHED page at smart-scan level `level`, whose stored hash is
/// `hash`, to be hashed on pass number `pass`? Level L means once every
/// 2^L passes, on the passes where `(pass + phase(hash)) % 2^L == 0`.
///
/// Why pass-aligned rather than a per-page countdown: the unstable index
/// only holds pages hashed in the current pass, so two identical unique
/// pages can pair only in a pass that hashes both. With countdowns started
/// whenever each page happened to become stable, two pages could stay out of
/// phase forever (page i of two VMs that filled memory at different times
/// never merged). Aligned to the pass number, pages at levels `la` and `lb`
/// are both hashed on every pass where `(pass + phase) % 2^max(la, lb) ==
/// 0`, so they meet at least every `2^MAX_LEVEL` passes.
///
/// The phase comes from the content hash, so identical pages (equal stored
/// hashes) share it while different contents spread the hashing evenly over
/// the passes instead of hashing every top-level page on one pass in 8. A
/// stale stored hash (content changed while skipped) only shifts that page's
/// next visit; the visit then sees the change and resets it to level 0.
pub fn due(pass: u64, level: u8, hash: u32) -> bool {
    let period_mask = (1u64 << level) - 1;
    // Top MAX_LEVEL bits of a multiplicative mix: good spread even for weak
    // or clustered hashes.
    let phase = (hash.wrapping_mul(0x9E37_79B9) >> (32 - MAX_LEVEL)) as u64;
    pass.wrapping_add(phase) & period_mask == 0
}

/// A page state's kind: [`NEW`], [`HASHED`], [`MERGED`] or [`ZERO`].
pub fn kind(s: u8) -> u8 {
    s & KIND_MASK
}
/// A page state's smart-scan level (0 to [`MAX_LEVEL`]).
pub fn level(s: u8) -> u8 {
    (s & LEVEL_MASK) >> LEVEL_SHIFT
}
/// The page's hash changed at its last visit.
pub fn is_volatile(s: u8) -> bool {
    s & VOLATILE != 0
}
/// The page's next visit hashes it (see [`REHASH`]).
pub fn needs_rehash(s: u8) -> bool {
    s & REHASH != 0
}
/// The state with kind `k`, the rest kept.
pub fn with_kind(s: u8, k: u8) -> u8 {
    (s & !KIND_MASK) | k
}
/// The state at smart-scan level `level` (capped at [`MAX_LEVEL`]).
pub fn with_level(s: u8, level: u8) -> u8 {
    (s & !LEVEL_MASK) | (level.min(MAX_LEVEL) << LEVEL_SHIFT)
}

/// A registered region.
#[derive(Debug)]
pub struct Region {
    /// The id the backend gave the region.
    pub id: RegionId,
    /// Host address of its first page.
    pub addr: usize,
    /// Its length in pages.
    pub npages: usize,
    /// The owner (VM) it belongs to.
    pub owner: String,
    /// Its dedup group's name.
    pub group_name: String,
    /// The engine's number for `group_name`.
    pub group: u32,
    /// Global id of page 0 (unstable-index entries are global ids).
    pub gid_base: u32,
    /// Per page: its content hash (HASHED) or its pool slot (MERGED).
    pub word: Vec<u32>,
    /// Per page: kind, smart-scan level, volatile and rehash bits.
    pub state: Vec<u8>,
    /// Per MERGED or ZERO page: the settle time's number when it merged
    /// (wrapping; a page merged 256 changes ago may be miscounted once).
    pub epoch: Vec<u8>,
    /// Bit per page: the page lies in a VMA mapping the pool (merged, or
    /// merged once and copied-on-write since). `MADV_DONTNEED` there would
    /// reveal pool content, not zeros, so such pages are handled apart.
    pub in_pool: Vec<u64>,
    /// Pages merged onto pool slots, per pass.
    pub merged: u64,
    /// Pages dropped to the zero page, per pass.
    pub zero: u64,
    /// Pages hashed and not merged, per pass.
    pub hashed: u64,
    /// Of `hashed`, those whose hash changed at their last visit.
    pub volatile: u64,
    /// Pages saved by this region's merges (sum of 1 - 1/mappers), per pass.
    pub saved_pages: f64,
    /// Estimated pool-mapping VMAs in this region, per pass.
    pub vmas: u64,
    /// Handed to kernel KSM (`crate::assist`): `MADV_MERGEABLE`, and the
    /// engine no longer hashes, protects or merges its unmerged pages.
    pub assisted: bool,
    /// Bytes from the region's start already given back from KSM by a
    /// take-back that stopped half-way for a waiter (`Core::take_from_ksm`);
    /// 0 when none is under way.
    pub taken_back: usize,
    /// Pages of this region on a KSM frame shared within our regions, per
    /// pass (`assist::Census`).
    pub ksm_merged: u64,
    /// The pages `ksm_merged` saves (sum of 1 - 1/k over its frames).
    pub ksm_saved: f64,
    /// Merges of this region's pages the guest broke by writing them
    /// (copy-on-write of a pool page or of the zero page), as the scan
    /// found them.
    pub cow_breaks: u64,
    /// Pages written since the engine last examined them, when the VMM
    /// gave a write log for the region (`crate::writelog`).
    pub written: Option<crate::writelog::Written>,
    /// First pool slot of this region's window (`crate::slots`): page `p`'s
    /// own slot is `slot_base + p`. None if the pool had no room.
    pub slot_base: Option<u32>,
    /// Its group's security. A hardened group's pages
    /// ([`Region::hardened`]) merge only when unchanged over two visits,
    /// every such page moves onto a pool page (its own when it has no
    /// twin), zero pages included, and KSM never takes the region.
    pub security: Security,
    /// The kernel may back the region with transparent huge pages
    /// (`mm::thp_possible` at registration): merges first split the huge
    /// page under a page they replace (`mm::split_huge_page_at`), so that
    /// the page they save is freed at once.
    pub huge: bool,
    /// Bit per page: the owner gave the page back (`Core::discard`, a
    /// balloon or free page reporting) and the engine has not seen it
    /// mapped since. Cleared when the page takes any kind but NEW.
    pub discarded: Vec<u64>,
    /// Pages the owner gave back since registration (each discard counts
    /// every page it dropped, a page given back twice twice).
    pub reported: u64,
}

/// A page of guest memory as the scanner reads it: never through a Rust
/// reference. vCPUs and device threads write guest pages at any moment,
/// and a `&[u8]` over memory that changes under it is undefined behaviour.
/// Like rust-vmm's `VolatileSlice`, the page is read with volatile loads
/// (the writers are the guest, outside the Rust abstract machine, and the
/// VMM's devices, which write through vm-memory's volatile accesses): once,
/// into a snapshot of its own, the first time its bytes are needed
/// ([`GuestPage::bytes`]). Hashing and the compares that pick a merge
/// target then read the snapshot, which may be stale by the time the merge
/// runs: the merge path's compare under write-protection decides every
/// merge (`merge::exec_chunk`, step 3).
pub struct GuestPage {
    addr: usize,
    /// The snapshot holds the page's bytes (set once, never cleared).
    filled: Cell<bool>,
    snap: UnsafeCell<MaybeUninit<PageBuf>>,
}

/// A page-sized, cache-line-aligned buffer.
#[repr(C, align(64))]
struct PageBuf([u8; PAGE_SIZE]);

impl GuestPage {
    /// The page at `addr`; nothing is read yet.
    ///
    /// # Safety
    /// `addr` is page-aligned, and `addr..addr + PAGE_SIZE` stays mapped and
    /// readable while the value is used.
    pub unsafe fn new(addr: usize) -> Self {
        debug_assert_eq!(addr % PAGE_SIZE, 0);
        GuestPage {
            addr,
            filled: Cell::new(false),
            snap: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The page's bytes as of the first call (a snapshot, not the page).
    pub fn bytes(&self) -> &[u8] {
        let snap = self.snap.get() as *mut u8;
        if !self.filled.get() {
            // SAFETY: the page is mapped and readable (the contract of
            // `new`); the snapshot is this value's own buffer of
            // PAGE_SIZE bytes, 64-byte aligned, and nothing refers to it
            // yet: references to it are only handed out below, after
            // `filled` is set, and `GuestPage` is not `Sync`.
            unsafe { copy_volatile(self.addr as *const u8, snap, PAGE_SIZE) };
            self.filled.set(true);
        }
        // SAFETY: every byte of the snapshot is initialised (`filled`) and
        // never written again.
        unsafe { std::slice::from_raw_parts(snap, PAGE_SIZE) }
    }

    /// Does the page hold `other`'s bytes? Compares the snapshot (taken
    /// now if it is not yet): a wide copy and a compare within the cache
    /// cost less than comparing the page in place word by word.
    pub fn equals(&self, other: &[u8]) -> bool {
        self.bytes() == other
    }

    /// Is the page all zeros? As [`GuestPage::equals`], on the snapshot.
    pub fn is_zero(&self) -> bool {
        crate::hash::is_zero(self.bytes())
    }

    /// Do the page and `other` (a pool page) agree on the sampled cache
    /// lines of `hash::sampled_lines_agree`? Reads only those
    /// lines of the page, unless its snapshot is already taken.
    pub fn sampled_lines_agree(&self, other: &[u8]) -> bool {
        if self.filled.get() {
            return crate::hash::sampled_lines_agree(self.bytes(), other);
        }
        crate::hash::SAMPLED_LINES.iter().all(|&o| {
            let mut line = Line([0; 64]);
            // SAFETY: `o..o + 64` lies inside the page (a sampled line), which
            // is mapped and readable (the contract of `new`); `line` is a
            // 64-byte aligned buffer of our own.
            unsafe { copy_volatile((self.addr + o) as *const u8, line.0.as_mut_ptr(), 64) };
            line.0[..] == other[o..o + 64]
        })
    }
}

/// One cache line's buffer.
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Copies `len` bytes (a multiple of 32) from `src` to `dst` with volatile
/// loads, as wide as the CPU allows: 32 bytes with AVX2, else 16 (SSE2 is
/// part of x86-64), 8 on other targets. The width is most of the
/// snapshot's cost, which every hashed page pays. Plain stores: `dst` is
/// the caller's own buffer.
///
/// # Safety
/// `src..src + len` is readable and 32-byte aligned; `dst..dst + len` is
/// writable, 32-byte aligned, and no reference into it is live.
unsafe fn copy_volatile(src: *const u8, dst: *mut u8, len: usize) {
    debug_assert!(len % 32 == 0 && src as usize % 32 == 0 && dst as usize % 32 == 0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked); the ranges as the
            // contract says.
            unsafe { copy_volatile_avx2(src, dst, len) };
            return;
        }
        // SAFETY: the contract, passed on.
        unsafe { copy_volatile_words::<std::arch::x86_64::__m128i>(src, dst, len) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the contract, passed on.
    unsafe {
        copy_volatile_words::<u64>(src, dst, len)
    };
}

/// [`copy_volatile`] with 32-byte loads.
///
/// # Safety
/// As [`copy_volatile`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_volatile_avx2(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the contract, passed on; with AVX2 enabled here, the 32-byte
    // words are single loads.
    unsafe { copy_volatile_words::<std::arch::x86_64::__m256i>(src, dst, len) }
}

/// [`copy_volatile`] in words of type `W` (plain data whose size divides
/// 32).
///
/// # Safety
/// As [`copy_volatile`].
#[inline(always)]
unsafe fn copy_volatile_words<W: Copy>(src: *const u8, dst: *mut u8, len: usize) {
    let (s, d) = (src as *const W, dst as *mut W);
    for k in 0..len / std::mem::size_of::<W>() {
        // SAFETY: word k lies inside both ranges, aligned (the contract).
        unsafe { d.add(k).write(s.add(k).read_volatile()) };
    }
}

/// Checks that `addr..addr + len` is a non-empty, page-aligned range that
/// does not wrap around.
pub fn check_bounds(addr: usize, len: usize) -> Result<(), RegionError> {
    if len == 0 || addr % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 || addr.checked_add(len).is_none()
    {
        return Err(RegionError::Bad { addr, len });
    }
    Ok(())
}

impl Region {
    /// Its group is hardened (`Security::Hardened`).
    pub fn hardened(&self) -> bool {
        self.security == Security::Hardened
    }

    /// A region of `len` bytes at `addr`, all pages NEW.
    pub fn new(
        id: RegionId,
        addr: usize,
        len: usize,
        owner: String,
        group_name: String,
        group: u32,
        gid_base: u32,
    ) -> Result<Self, RegionError> {
        check_bounds(addr, len)?;
        let npages = len / PAGE_SIZE;
        if gid_base as u64 + npages as u64 >= u32::MAX as u64 {
            return Err(RegionError::TooManyPages);
        }
        Ok(Region {
            id,
            addr,
            npages,
            owner,
            group_name,
            group,
            gid_base,
            word: vec![0; npages],
            state: vec![0; npages],
            epoch: vec![0; npages],
            in_pool: vec![0; npages.div_ceil(64)],
            merged: 0,
            zero: 0,
            hashed: 0,
            volatile: 0,
            saved_pages: 0.0,
            vmas: 0,
            assisted: false,
            taken_back: 0,
            ksm_merged: 0,
            ksm_saved: 0.0,
            cow_breaks: 0,
            slot_base: None,
            huge: false,
            security: Security::Default,
            written: None,
            discarded: vec![0; npages.div_ceil(64)],
            reported: 0,
        })
    }

    /// Byte length.
    pub fn len(&self) -> usize {
        self.npages * PAGE_SIZE
    }

    /// Host address of page `i`.
    pub fn page_addr(&self, i: usize) -> usize {
        self.addr + i * PAGE_SIZE
    }

    /// True if `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.addr && addr < self.addr + self.len()
    }

    /// Pages `first..end` of this region that host range `addr..+len`
    /// touches (`addr` inside the region; the end clipped to it).
    pub fn pages_of(&self, addr: usize, len: usize) -> (usize, usize) {
        let first = (addr - self.addr) / PAGE_SIZE;
        let end =
            (addr.saturating_add(len).min(self.addr + self.len()) - self.addr).div_ceil(PAGE_SIZE);
        (first, end)
    }

    /// True if page `i` lies in a pool VMA.
    pub fn in_pool(&self, i: usize) -> bool {
        self.in_pool[i / 64] & (1 << (i % 64)) != 0
    }

    /// Records whether page `i` lies in a pool VMA.
    pub fn set_in_pool(&mut self, i: usize, v: bool) {
        if v {
            self.in_pool[i / 64] |= 1 << (i % 64);
        } else {
            self.in_pool[i / 64] &= !(1 << (i % 64));
        }
    }

    /// True if the owner gave page `i` back and it was not seen mapped
    /// since (see [`Region::discarded`]).
    pub fn is_discarded(&self, i: usize) -> bool {
        self.discarded[i / 64] & (1 << (i % 64)) != 0
    }

    /// Records whether the owner's give-back of page `i` still holds.
    pub fn set_discarded(&mut self, i: usize, v: bool) {
        if v {
            self.discarded[i / 64] |= 1 << (i % 64);
        } else {
            self.discarded[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Pages given back and not seen mapped since: discarded and still NEW
    /// (a page that was hashed, merged or dropped since is counted there,
    /// never twice).
    pub fn returned(&self) -> u64 {
        let mut n = 0;
        for (w, &bits) in self.discarded.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                let i = w * 64 + b.trailing_zeros() as usize;
                if kind(self.state[i]) == NEW {
                    n += 1;
                }
                b &= b - 1;
            }
        }
        n
    }

    /// Changes page `i`'s kind, keeping the counters exact.
    pub fn set_kind(&mut self, i: usize, k: u8) {
        if k != NEW && self.is_discarded(i) {
            // Seen mapped: no longer given back.
            self.set_discarded(i, false);
        }
        let s = self.state[i];
        let old = kind(s);
        if old == k {
            return;
        }
        match old {
            HASHED => {
                self.hashed -= 1;
                if is_volatile(s) {
                    self.volatile -= 1;
                }
            }
            MERGED => self.merged -= 1,
            ZERO => self.zero -= 1,
            _ => {}
        }
        let mut ns = with_kind(s, k) & !(VOLATILE | REHASH);
        match k {
            HASHED => self.hashed += 1,
            MERGED => self.merged += 1,
            ZERO => self.zero += 1,
            _ => {}
        }
        if k != HASHED {
            ns = with_level(ns, 0);
        }
        self.state[i] = ns;
    }

    /// Sets or clears the volatile flag of a HASHED page.
    pub fn set_volatile(&mut self, i: usize, v: bool) {
        let s = self.state[i];
        debug_assert_eq!(kind(s), HASHED);
        if is_volatile(s) != v {
            if v {
                self.volatile += 1;
                self.state[i] = s | VOLATILE;
            } else {
                self.volatile -= 1;
                self.state[i] = s & !VOLATILE;
            }
        }
    }

    /// Page `i`, to be read without a reference into guest memory (see
    /// [`GuestPage`]); not tied to a borrow of the region (the engine
    /// mutates the region's metadata while looking at the page).
    ///
    /// # Safety
    /// The region must stay mapped while the returned value is used
    /// (guaranteed by the register contract while the region is in the
    /// engine's table).
    pub unsafe fn guest_page(&self, i: usize) -> GuestPage {
        debug_assert!(i < self.npages);
        // SAFETY: the page is page-aligned (regions are) and stays mapped
        // while the value is used (this function's contract).
        unsafe { GuestPage::new(self.page_addr(i)) }
    }

    /// Metadata bytes.
    pub fn metadata_bytes(&self) -> u64 {
        (self.word.capacity() * 4
            + self.state.capacity()
            + self.in_pool.capacity() * 8
            + self.discarded.capacity() * 8
            + std::mem::size_of::<Self>()
            + self.owner.len()
            + self.group_name.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_kinds() {
        let mut r = Region::new(
            RegionId(1),
            0x10000,
            4 * PAGE_SIZE,
            "o".into(),
            "g".into(),
            0,
            0,
        )
        .unwrap();
        r.set_kind(0, HASHED);
        r.set_volatile(0, true);
        r.set_kind(1, MERGED);
        r.set_kind(2, ZERO);
        assert_eq!((r.hashed, r.volatile, r.merged, r.zero), (1, 1, 1, 1));
        r.set_kind(0, MERGED);
        assert_eq!((r.hashed, r.volatile, r.merged), (0, 0, 2));
        r.set_kind(1, NEW);
        assert_eq!(r.merged, 1);
        let s = with_level(with_kind(0, HASHED) | VOLATILE, 3);
        assert_eq!((kind(s), level(s), is_volatile(s)), (HASHED, 3, true));
        assert_eq!(level(with_level(s, 1)), 1);
    }

    #[test]
    fn pages_given_back_count_until_they_take_another_kind() {
        let mut r = Region::new(
            RegionId(1),
            0x10000,
            130 * PAGE_SIZE,
            "o".into(),
            "g".into(),
            0,
            0,
        )
        .unwrap();
        for i in [0, 63, 64, 129] {
            r.set_discarded(i, true);
        }
        assert_eq!(r.returned(), 4);
        // Hashed (seen mapped): no longer given back, even once NEW again.
        r.set_kind(64, HASHED);
        r.set_kind(64, NEW);
        assert!(!r.is_discarded(64));
        assert_eq!(r.returned(), 3);
        // A kind set again to what it is still clears the mark.
        r.set_kind(1, MERGED);
        r.set_discarded(1, true);
        r.set_kind(1, MERGED);
        assert!(!r.is_discarded(1));
        assert_eq!(r.returned(), 3);
    }

    #[test]
    fn the_origin_bits_leave_the_other_fields_alone() {
        let s = with_level(with_kind(0, MERGED) | VOLATILE | REHASH, 2);
        for o in [
            Origin::Steady,
            Origin::SecondLook,
            Origin::FirstSight,
            Origin::Hinted,
        ] {
            let t = with_origin(s, o);
            assert_eq!(origin(t), o);
            assert_eq!(
                (kind(t), level(t), is_volatile(t), needs_rehash(t)),
                (MERGED, 2, true, true)
            );
            assert_eq!(with_origin(t, Origin::Steady) & !ORIGIN_MASK, s);
        }
    }

    #[test]
    fn due_visits_each_level_once_per_period() {
        for h in [0u32, 1, 7, 0xdead_beef, u32::MAX] {
            assert!((0..20).all(|p| due(p, 0, h)));
            for l in 1..=MAX_LEVEL {
                let period = 1u64 << l;
                for start in 0..period {
                    let hits = (start..start + period).filter(|&p| due(p, l, h)).count();
                    assert_eq!(hits, 1, "hash {h:#x} level {l}");
                }
            }
        }
    }

    #[test]
    fn equal_hashes_meet_at_every_level_pair() {
        // Two pages with the same stored hash, at any levels, are both due
        // on some pass of every window of 2^MAX_LEVEL passes.
        for h in [3u32, 0x1234_5678, 0xffff_0000] {
            for la in 0..=MAX_LEVEL {
                for lb in 0..=MAX_LEVEL {
                    for start in 0..16u64 {
                        let w = start..start + (1 << MAX_LEVEL);
                        assert!(
                            w.clone().any(|p| due(p, la, h) && due(p, lb, h)),
                            "levels {la},{lb} hash {h:#x} from pass {start}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn phases_spread_over_passes() {
        // Top-level pages of distinct contents are not all due on one pass.
        let due_per_pass: Vec<usize> = (0..8u64)
            .map(|p| {
                (0..8000u32)
                    .filter(|&h| due(p, MAX_LEVEL, h.wrapping_mul(2_654_435_761)))
                    .count()
            })
            .collect();
        assert!(
            due_per_pass.iter().all(|&n| (700..1300).contains(&n)),
            "{due_per_pass:?}"
        );
    }

    #[test]
    fn a_guest_page_answers_from_its_snapshot_once_taken() {
        let a = crate::mm::map_anon(PAGE_SIZE).unwrap();
        let write = |o: usize, b: u8| {
            // SAFETY: byte o of our own one-page mapping; no reference into
            // it is live.
            unsafe { a.add(o).write_volatile(b) }
        };
        // SAFETY: `a` is our page-aligned mapping, unmapped at the end.
        let page = unsafe { GuestPage::new(a as usize) };
        let zero = vec![0u8; PAGE_SIZE];
        // Before the snapshot, the sampled lines are read as they are now.
        write(PAGE_SIZE / 2 + 5, 9);
        assert!(!page.sampled_lines_agree(&zero));
        let mut want = zero.clone();
        want[PAGE_SIZE / 2 + 5] = 9;
        assert!(page.sampled_lines_agree(&want));
        // A byte outside the sampled lines is not sampled.
        write(100, 1);
        assert!(page.sampled_lines_agree(&want));
        want[100] = 1;
        assert_eq!(page.bytes(), &want[..]);
        // From the snapshot on, the answers are the snapshot's.
        write(PAGE_SIZE - 1, 3);
        assert_eq!(page.bytes(), &want[..]);
        assert!(page.equals(&want) && page.sampled_lines_agree(&want) && !page.is_zero());
        // SAFETY: our own mapping; `page` is not used any more.
        unsafe { crate::mm::unmap(a, PAGE_SIZE) };
    }

    #[test]
    fn rejects_bad_regions() {
        assert!(Region::new(
            RegionId(1),
            0x10001,
            PAGE_SIZE,
            "o".into(),
            "g".into(),
            0,
            0
        )
        .is_err());
        assert!(Region::new(RegionId(1), 0x10000, 0, "o".into(), "g".into(), 0, 0).is_err());
    }
}
