//! What guest RAM holds at one moment, read from the VMM's own mappings
//! and `/proc/self/pagemap` alike for every backend: how many present
//! pages copy another's content (what a perfect merger would save), and
//! how many of those copies still sit on frames of their own. It tells
//! which duplicates a merger left, whatever it counts in its own
//! statistics (KSM and pagefold count zero pages differently).

use std::collections::HashMap;

use pagefold_dedup::pagemap::{Entry, Pagemap};
use pagefold_dedup::xxh3;
use pagefold_dedup::GuestPage;
use pagefold_dedup::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// The census of some host ranges of guest RAM.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCensus {
    /// Present pages (mapped to a frame, the kernel's zero page included).
    pub present: u64,
    /// Of those, all-zero.
    pub zero: u64,
    /// Present non-zero pages that copy another present page's content:
    /// what merging the non-zero duplicates could save.
    pub nonzero_copies: u64,
    /// Of `nonzero_copies`, those on a frame of their own: duplicates no
    /// merger shares (a content on F frames leaves F - 1).
    pub nonzero_left: u64,
    /// All-zero pages on a frame other than the kernel's zero page and
    /// not shared with another (a zero page a merger left).
    pub zero_left: u64,
    /// Distinct frames the ranges map once every page has been read (a
    /// read maps what this process had not mapped yet: a pool page, or
    /// the kernel's zero page for a page never written or dropped), the
    /// kernel's zero page not counted: the memory the guests' RAM costs
    /// the host, counted alike for every backend, whatever each counts in
    /// its statistics (a KSM page or a pool page once, however many guest
    /// pages map it). 0 in reports from before it was measured.
    #[serde(default)]
    pub frames: u64,
}

impl PageCensus {
    /// Duplicates left unshared, zero pages included: where a merger fell
    /// short of merging everything (read against its saving).
    pub fn left(&self) -> u64 {
        self.nonzero_left + self.zero_left
    }
}

/// Pages per pagemap read.
const CHUNK_PAGES: usize = 4096;

/// `ranges` (page-aligned host ranges) in pieces of at most
/// [`CHUNK_PAGES`] pages: (start address, pages).
fn chunks(ranges: &[(usize, usize)]) -> impl Iterator<Item = (usize, usize)> + '_ {
    ranges.iter().flat_map(|&(start, len)| {
        let npages = len / PAGE_SIZE;
        (0..npages)
            .step_by(CHUNK_PAGES)
            .map(move |done| (start + done * PAGE_SIZE, (npages - done).min(CHUNK_PAGES)))
    })
}

/// Counts what `ranges` (page-aligned host ranges of this process, mapped
/// for the whole call) hold. Pages are grouped by a 64-bit hash of their
/// content (a collision among a few hundred thousand pages is a chance of
/// about one in 10^9 and would only shift a count by one). Frames need
/// `CAP_SYS_ADMIN` (pagemap hides them otherwise): None without.
///
/// # Safety
/// Every range is readable memory of this process that stays mapped until
/// the call returns (guest RAM of a live VM); writers may run meanwhile
/// (each page is read once, through a volatile snapshot), though a census
/// of paused guests is exact.
pub unsafe fn census(ranges: &[(usize, usize)]) -> Option<PageCensus> {
    let pm = Pagemap::open().ok()?;
    let zero_pfn = pagefold_dedup::mm::zero_pfn(&pm);
    if zero_pfn == 0 {
        return None;
    }
    let mut c = PageCensus::default();
    // Content hash -> (pages, frames the pages map).
    let mut groups: HashMap<u64, (u64, Vec<u64>)> = HashMap::new();
    let mut zero_frames: HashMap<u64, u64> = HashMap::new();
    let mut entries = vec![Entry(0); CHUNK_PAGES];
    for (base, n) in chunks(ranges) {
        pm.read(base, &mut entries[..n]).ok()?;
        for (i, e) in entries[..n].iter().enumerate() {
            if !e.present() {
                continue;
            }
            c.present += 1;
            if e.pfn() == zero_pfn {
                c.zero += 1;
                continue;
            }
            // SAFETY: a page of a range this function's caller keeps
            // mapped (its contract); read once into a snapshot.
            let page = unsafe { GuestPage::new(base + i * PAGE_SIZE) };
            if page.is_zero() {
                c.zero += 1;
                *zero_frames.entry(e.pfn()).or_default() += 1;
                continue;
            }
            let g = groups.entry(xxh3(page.bytes())).or_default();
            g.0 += 1;
            g.1.push(e.pfn());
        }
    }
    for (_, (pages, mut frames)) in groups {
        frames.sort_unstable();
        frames.dedup();
        c.nonzero_copies += pages - 1;
        c.nonzero_left += frames.len() as u64 - 1;
    }
    // A zero page on a frame no other maps is one a merger left; a frame
    // several zero pages share (KSM's merged zero page) is one page kept
    // for all of them, as a merged content keeps one.
    c.zero_left = zero_frames.values().filter(|&&n| n == 1).count() as u64;
    // SAFETY: forwarded from this function's contract.
    c.frames = unsafe { frames(ranges, &pm, zero_pfn) }?;
    Some(c)
}

/// [`PageCensus::frames`]: reads a byte of every page, so that every page
/// maps a frame, then counts the distinct frames other than `zero_pfn`.
///
/// # Safety
/// As [`census`].
unsafe fn frames(ranges: &[(usize, usize)], pm: &Pagemap, zero_pfn: u64) -> Option<u64> {
    let mut pfns: Vec<u64> = Vec::new();
    let mut entries = vec![Entry(0); CHUNK_PAGES];
    for (base, n) in chunks(ranges) {
        for i in 0..n {
            // SAFETY: a page of a range the caller keeps mapped and
            // readable; a read changes no content.
            let _ = unsafe { std::ptr::read_volatile((base + i * PAGE_SIZE) as *const u8) };
        }
        pm.read(base, &mut entries[..n]).ok()?;
        pfns.extend(
            entries[..n]
                .iter()
                .filter(|e| e.present() && e.pfn() != zero_pfn)
                .map(|e| e.pfn()),
        );
    }
    pfns.sort_unstable();
    pfns.dedup();
    Some(pfns.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Anonymous memory of `pages` pages, unmapped on drop.
    struct Anon(*mut u8, usize);

    impl Anon {
        fn new(pages: usize) -> Self {
            let len = pages * PAGE_SIZE;
            Anon(pagefold_dedup::mm::map_anon(len).unwrap(), len)
        }

        fn fill(&self, page: usize, byte: u8) {
            // SAFETY: `page` lies inside the mapping (callers' indices).
            unsafe { std::ptr::write_bytes(self.0.add(page * PAGE_SIZE), byte, PAGE_SIZE) };
        }
    }

    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: our own mapping (`map_anon`), used no more.
            unsafe { pagefold_dedup::mm::unmap(self.0, self.1) };
        }
    }

    #[test]
    fn counts_copies_and_the_ones_left_on_frames_of_their_own() {
        if !Pagemap::open().is_ok_and(|pm| pagefold_dedup::mm::zero_pfn(&pm) != 0) {
            eprintln!("SKIPPED: pagemap frames need CAP_SYS_ADMIN");
            return;
        }
        let a = Anon::new(16);
        // Pages 0-2: content 1 (three copies, each on its own frame);
        // 3-4: content 2; 5: content 3; 6-7: written zeros (private
        // frames); 8: read only (the kernel's zero page); 9-15 never
        // touched (not present).
        for p in 0..3 {
            a.fill(p, 1);
        }
        a.fill(3, 2);
        a.fill(4, 2);
        a.fill(5, 3);
        a.fill(6, 0);
        a.fill(7, 0);
        // SAFETY: page 8 lies inside the mapping; a read maps the zero page.
        let _ = unsafe { std::ptr::read_volatile(a.0.add(8 * PAGE_SIZE)) };
        // SAFETY: `a` is mapped for the call.
        let c = unsafe { census(&[(a.0 as usize, a.1)]) }.unwrap();
        assert_eq!(
            c,
            PageCensus {
                present: 9,
                zero: 3,
                nonzero_copies: 3,
                nonzero_left: 3,
                zero_left: 2,
                // Pages 0-7 on frames of their own; 8-15 read as the zero
                // page.
                frames: 8,
            }
        );
        assert_eq!(c.left(), 5);
    }

    /// Pages that share a frame (as merged pages do) are copies, not left.
    #[test]
    fn pages_on_one_frame_are_merged_copies() {
        if !Pagemap::open().is_ok_and(|pm| pagefold_dedup::mm::zero_pfn(&pm) != 0) {
            eprintln!("SKIPPED: pagemap frames need CAP_SYS_ADMIN");
            return;
        }
        // SAFETY: a fresh memfd, owned below.
        let fd = unsafe { libc::memfd_create(c"census".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: our own fd.
        assert_eq!(unsafe { libc::ftruncate(fd, 2 * PAGE_SIZE as i64) }, 0);
        let map = || {
            // SAFETY: a shared mapping of our memfd's two pages.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    2 * PAGE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            p.cast::<u8>()
        };
        let (x, y) = (map(), map());
        // SAFETY: both mappings hold two pages: page 0 holds 9s, page 1
        // zeros, each written through `x` and read through `y`.
        unsafe {
            std::ptr::write_bytes(x, 9, PAGE_SIZE);
            std::ptr::write_bytes(x.add(PAGE_SIZE), 0, PAGE_SIZE);
            let _ = std::ptr::read_volatile(y);
            let _ = std::ptr::read_volatile(y.add(PAGE_SIZE));
        }
        let ranges = [(x as usize, 2 * PAGE_SIZE), (y as usize, 2 * PAGE_SIZE)];
        // SAFETY: both mappings stay until the unmaps below.
        let c = unsafe { census(&ranges) }.unwrap();
        // SAFETY: our own mappings and fd, used no more.
        unsafe {
            libc::munmap(x.cast(), 2 * PAGE_SIZE);
            libc::munmap(y.cast(), 2 * PAGE_SIZE);
            libc::close(fd);
        }
        assert_eq!(
            c,
            PageCensus {
                present: 4,
                zero: 2,
                nonzero_copies: 1,
                nonzero_left: 0,
                zero_left: 0,
                // The memfd's two pages, each mapped twice.
                frames: 2,
            }
        );
    }
}
