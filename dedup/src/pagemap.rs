//! Reads `/proc/self/pagemap`: one `u64` per virtual page, telling whether the
//! page is present, whether it maps a file (our pool) or anonymous memory, and
//! whether it is userfaultfd write-protected. The engine reads it in batches
//! (one `pread` per span) because per-page reads cost a syscall each.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::PAGE_SIZE;

/// Errors of the pagemap reader.
#[derive(Debug, thiserror::Error)]
pub enum PagemapError {
    /// `/proc/self/pagemap` could not be opened.
    #[error("open /proc/self/pagemap: {0}")]
    Open(#[source] std::io::Error),
    /// Reading the entries of a range failed.
    #[error("read /proc/self/pagemap at {addr:#x}: {source}")]
    Read {
        /// The first address of the range.
        addr: usize,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// Bit 63: page present in RAM.
pub const PM_PRESENT: u64 = 1 << 63;
/// Bit 62: the PTE is a swap-format entry: the page is in swap or under
/// migration, or the PTE is a marker with no page (userfaultfd's
/// write-protect marker on an empty PTE). Bits 0-4 then hold the entry's
/// type (with CAP_SYS_ADMIN; zero without).
pub const PM_SWAP: u64 = 1 << 62;
/// A swap entry's type: bits 0-4 of its pagemap entry (the kernel's
/// `MAX_SWAPFILES_SHIFT` is 5).
pub(crate) const SWP_TYPE_MASK: u64 = (1 << 5) - 1;
/// The swap-entry type of PTE markers: the highest type there is
/// (`SWP_PTE_MARKER` in the kernel's `swap.h`).
pub(crate) const SWP_PTE_MARKER: u64 = SWP_TYPE_MASK;
/// Bit 61: page is file-backed or shared-anonymous (for us: a pool page).
pub const PM_FILE: u64 = 1 << 61;
/// Bit 57: the PTE carries the userfaultfd write-protect bit.
pub const PM_UFFD_WP: u64 = 1 << 57;
/// Bits 0-54: page frame number (zero unless CAP_SYS_ADMIN).
pub const PM_PFN_MASK: u64 = (1 << 55) - 1;

/// One decoded pagemap entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Entry(pub u64);

impl Entry {
    /// A page is mapped (PM_PRESENT).
    pub fn present(self) -> bool {
        self.0 & PM_PRESENT != 0
    }
    /// The page is file-backed or shared anonymous (PM_FILE): for a pool
    /// mapping, still the pool's page.
    pub fn file(self) -> bool {
        self.0 & PM_FILE != 0
    }
    /// The PTE is write-protected by userfaultfd.
    pub fn uffd_wp(self) -> bool {
        self.0 & PM_UFFD_WP != 0
    }
    /// A swap-format entry: swapped out, migrating, or a PTE marker.
    pub fn swap(self) -> bool {
        self.0 & PM_SWAP != 0
    }
    /// No page behind the PTE at all: it is empty or a PTE marker, so a read
    /// finds what the VMA's file holds there. A page in swap or under
    /// migration is a page of its own (for a pool VMA: a copy-on-write copy
    /// holding a guest's write), and so is any entry whose type is hidden
    /// (no CAP_SYS_ADMIN): this errs towards "a page of its own".
    pub fn no_page(self) -> bool {
        !self.present() && (!self.swap() || self.0 & SWP_TYPE_MASK == SWP_PTE_MARKER)
    }
    /// The page frame number (0 unless present and readable: needs CAP_SYS_ADMIN).
    pub fn pfn(self) -> u64 {
        if self.present() {
            self.0 & PM_PFN_MASK
        } else {
            0
        }
    }
}

/// An open handle on this process's pagemap.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
    /// `pread`s made: each walks every VMA it covers, which made pagemap
    /// a large part of the engine's CPU on scattered layouts.
    reads: AtomicU64,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<Self, PagemapError> {
        let file = File::open("/proc/self/pagemap").map_err(PagemapError::Open)?;
        Ok(Pagemap {
            file,
            reads: AtomicU64::new(0),
        })
    }

    /// Reads made so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Fills `out` with the entries of `out.len()` pages starting at `addr`.
    /// Reading pagemap never faults the pages in, so it is safe on any range.
    pub fn read(&self, addr: usize, out: &mut [Entry]) -> Result<(), PagemapError> {
        let nbytes = out.len() * 8;
        // SAFETY: `Entry` is `repr(transparent)` over u64, so viewing the
        // slice as bytes is sound; the slice outlives this call.
        let buf = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, nbytes) };
        let off = (addr / PAGE_SIZE) as u64 * 8;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.file
            .read_exact_at(buf, off)
            .map_err(|source| PagemapError::Read { addr, source })
    }

    /// Reads a single entry.
    pub fn entry(&self, addr: usize) -> Result<Entry, PagemapError> {
        let mut e = [Entry(0)];
        self.read(addr, &mut e)?;
        Ok(e[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_and_absent_pages() {
        let pm = Pagemap::open().unwrap();
        let map = crate::mm::map_anon(4 * PAGE_SIZE).unwrap();
        // SAFETY: `map` is a fresh 4-page private anonymous mapping we own.
        unsafe { *map = 1 };
        let mut e = [Entry(0); 4];
        pm.read(map as usize, &mut e).unwrap();
        assert!(e[0].present());
        assert!(!e[0].file());
        assert!(!e[1].present());
        // SAFETY: exactly the test's own mapping, used no more.
        unsafe { crate::mm::unmap(map, 4 * PAGE_SIZE) };
    }
}
