//! Thin wrappers over the memory-management syscalls the engine needs
//! (mmap/mremap/madvise/munmap) and the map-count figures that limit how many
//! VMAs merging may create.

use std::io;
use std::os::fd::RawFd;

/// `MADV_POPULATE_READ` (Linux 5.14), not in every libc release.
pub(crate) const MADV_POPULATE_READ: libc::c_int = 22;

/// Errors of the mm helpers.
#[derive(Debug, thiserror::Error)]
pub enum MmError {
    /// A memory-management syscall failed.
    #[error("{op} at {addr:#x}+{len:#x}: {source}")]
    Syscall {
        /// The syscall (`mmap`, `munmap`, `madvise`, ...).
        op: &'static str,
        /// Start of the range.
        addr: usize,
        /// Length of the range, bytes.
        len: usize,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

impl MmError {
    /// The errno behind the error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            MmError::Syscall { source, .. } => source.raw_os_error(),
        }
    }
}

/// A call that changes the address space at least this long is logged
/// (`SlowCall`), at info level: a region's teardown maps hundreds of
/// megabytes in one call and takes this long in normal runs.
const SLOW_CALL: std::time::Duration = std::time::Duration::from_millis(100);

/// Times one memory-management call of the merge path and logs it when
/// it took [`SLOW_CALL`] or longer. These calls take the process's mmap
/// lock for writing (`mmap`, `mremap`, userfaultfd registration) or
/// reading (write-protection), and every guest page fault that needs
/// the host's page tables (a vCPU's first touch of a page, a copy on
/// write) waits for a writer: a slow one stops every guest of the
/// process, which is what the log line is for.
pub(crate) struct SlowCall {
    op: &'static str,
    addr: usize,
    len: usize,
    started: std::time::Instant,
}

impl SlowCall {
    pub(crate) fn start(op: &'static str, addr: usize, len: usize) -> SlowCall {
        SlowCall {
            op,
            addr,
            len,
            started: std::time::Instant::now(),
        }
    }
}

impl Drop for SlowCall {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        if took >= SLOW_CALL {
            log::info!(
                "{} at {:#x}+{:#x} took {} ms, with {} VMAs in the process \
                 (guest page faults wait for it)",
                self.op,
                self.addr,
                self.len,
                took.as_millis(),
                vma_count().map_or_else(|e| e.to_string(), |n| n.to_string())
            );
        }
    }
}

fn err(op: &'static str, addr: usize, len: usize) -> MmError {
    MmError::Syscall {
        op,
        addr,
        len,
        source: io::Error::last_os_error(),
    }
}

/// Maps `len` bytes of the pool file at `off` privately over `addr`
/// (`MAP_FIXED`): the merge primitive. Never `MAP_POPULATE`: on a writable
/// private mapping it copies every page at once (docs/merge-races.md §2).
///
/// # Safety
/// `MAP_FIXED` silently replaces whatever is mapped at `addr..addr + len`.
/// The caller guarantees that:
/// * `addr` and `len` are page-aligned and the range lies inside a private
///   mapping the caller owns (a registered region), which nothing relies on
///   for more than its bytes (no pinned pages, no shared mapping);
/// * every page of the range holds, and cannot change before the call
///   returns, the same bytes as the pool page that replaces it (for
///   example: write-protected, then compared), so every reader, a Rust
///   reference included, sees the same bytes before and after; or no Rust
///   reference into the range is live and nothing relies on its old
///   content (a measurement that reads the range only as the pool's).
pub unsafe fn map_pool_fixed(addr: usize, len: usize, fd: RawFd, off: u64) -> Result<(), MmError> {
    let _slow = SlowCall::start("mmap(MAP_FIXED pool)", addr, len);
    // SAFETY: MAP_FIXED replaces addr..+len; the caller's contract makes the
    // replacement invisible to the memory's users.
    let r = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            fd,
            off as libc::off_t,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(err("mmap(MAP_FIXED pool)", addr, len));
    }
    Ok(())
}

/// Maps fresh anonymous zero memory over `addr..+len` (`MAP_FIXED`): the
/// zero-page drop for pages that lie in a pool VMA, where `MADV_DONTNEED`
/// would reveal the pool page instead of zeros; and a region's teardown,
/// where one mapping replaces a VMA per scattered merge.
///
/// # Safety
/// `MAP_FIXED` silently replaces whatever is mapped at `addr..addr + len`
/// with zeros. The caller guarantees that `addr` and `len` are
/// page-aligned, that the range lies inside a private mapping the caller
/// owns, and either that every page of the range is all-zero and cannot
/// change before the call returns (write-protected and checked), so every
/// reader sees the same bytes; or that nothing reads or writes the range
/// again, through a reference or a pointer (a region whose owner unmaps it
/// next); or that the range's owner gave its content up and expects zeros
/// (`Core::discard`: a balloon's page, a reported free page).
pub(crate) unsafe fn map_anon_fixed(addr: usize, len: usize) -> Result<(), MmError> {
    let _slow = SlowCall::start("mmap(MAP_FIXED anon)", addr, len);
    // SAFETY: MAP_FIXED replaces addr..+len; the caller's contract makes the
    // lost content either zeros already or never read again.
    let r = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(err("mmap(MAP_FIXED anon)", addr, len));
    }
    Ok(())
}

/// Maps a fresh private anonymous area of `len` bytes with every page
/// allocated up front (`MAP_POPULATE`): one kernel call allocates and zeroes
/// them all, instead of one page fault per page when first written.
pub fn map_anon_populated(len: usize) -> Result<*mut u8, MmError> {
    // SAFETY: a new mapping at a kernel-chosen address touches nothing else.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(err("mmap(anon, populate)", 0, len));
    }
    Ok(r as *mut u8)
}

/// Maps a fresh private anonymous area of `len` bytes.
pub fn map_anon(len: usize) -> Result<*mut u8, MmError> {
    // SAFETY: a new mapping at a kernel-chosen address touches nothing else.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(err("mmap(anon)", 0, len));
    }
    Ok(r as *mut u8)
}

/// Unmaps a range (errors are ignored: for a range the caller mapped,
/// munmap cannot fail).
///
/// # Safety
/// `addr..addr + len` is page-aligned and lies inside a mapping the caller
/// created (for example with [`map_anon`]) and owns; nothing uses the range
/// afterwards: no Rust reference or pointer into it is dereferenced again.
pub unsafe fn unmap(addr: *mut u8, len: usize) {
    // SAFETY: the caller owns the range and never touches it again.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Moves the pages of `src..+len` over `dst..+len` atomically (the unmerge
/// primitive: the old mapping at `dst` is discarded in the same step).
///
/// # Safety
/// The caller guarantees that:
/// * `src`, `dst` and `len` are page-aligned; `src..src + len` is a private
///   mapping the caller owns and uses no more after the call (on success
///   it is gone);
/// * `dst..dst + len` lies inside a private mapping the caller owns;
/// * `src` already holds the bytes `dst` holds, and `dst` cannot change
///   before the call returns (write-protected), so every reader sees the
///   same bytes before and after.
pub(crate) unsafe fn mremap_fixed(src: *mut u8, len: usize, dst: usize) -> Result<(), MmError> {
    let _slow = SlowCall::start("mremap(MREMAP_FIXED)", dst, len);
    // SAFETY: per the caller's contract both ranges are the caller's and the
    // move leaves the content users see at `dst` unchanged.
    let r = unsafe {
        libc::mremap(
            src as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst as *mut libc::c_void,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(err("mremap(MREMAP_FIXED)", dst, len));
    }
    Ok(())
}

/// `madvise(addr, len, advice)`.
///
/// # Safety
/// `addr` and `len` are page-aligned and the range lies inside mappings the
/// caller owns. Some advice changes content: `MADV_DONTNEED` on a private
/// anonymous page makes it read as zeros, and on a private file mapping
/// (a pool VMA) as the file's page. For such advice the caller guarantees
/// that the bytes every reader sees do not change: the pages are all-zero
/// private anonymous pages and cannot be written before the call returns
/// (write-protected), or the range's owner gave its content up and
/// expects zeros (`Core::discard`), and no page of it lies in a pool VMA.
/// Advice that preserves content
/// (`MADV_POPULATE_READ`, `MADV_NOHUGEPAGE`, `MADV_MERGEABLE`,
/// `MADV_UNMERGEABLE`) needs only the range to be the caller's.
pub unsafe fn madvise(addr: usize, len: usize, advice: libc::c_int) -> Result<(), MmError> {
    // SAFETY: the range is the caller's, and the caller's contract makes the
    // advice preserve the content users see.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r != 0 {
        return Err(err("madvise", addr, len));
    }
    Ok(())
}

/// Size of a transparent huge page on x86-64 (a PMD's reach).
pub(crate) const HUGE_PAGE_SIZE: usize = 2 << 20;

/// `MADV_COLD` (Linux 5.4), not in every libc release.
const MADV_COLD: libc::c_int = 20;

/// Whether the kernel may back this process's anonymous memory with
/// transparent huge pages: the system setting is not `never` and the
/// process has not turned them off (`PR_SET_THP_DISABLE`). With
/// `madvise`, only `MADV_HUGEPAGE` mappings get them; this answers `true`
/// there too, at the price of a needless split call per 2 MiB frame of the
/// others (see [`split_huge_page_at`]).
///
/// Why not the VMA's own `THPeligible` from `/proc/self/smaps`: the kernel
/// formats smaps by walking the page tables of every VMA before the one
/// asked for, under the mmap lock, and merged guest RAM is split into
/// thousands of VMAs, so one registration would stall the engine's remaps
/// and the guests' faults for as long as that walk takes.
pub(crate) fn thp_possible() -> bool {
    let setting =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if setting.is_empty() || setting.contains("[never]") {
        return false;
    }
    // SAFETY: PR_GET_THP_DISABLE takes no pointers; it returns 0 or 1.
    let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
    disabled == 0
}

/// Splits the transparent huge page that maps `addr`, if one does and
/// this process alone maps it, into 4 KiB pages, keeping every byte.
///
/// Why: replacing or dropping one 4 KiB page of a huge page (a merge, a
/// zero-page drop) unmaps it, but the memory stays allocated with the rest
/// of the huge page until the kernel's deferred split, which runs only
/// under memory pressure; the saving would be counted and not made. KSM
/// splits the huge page before merging a part of it, for the same reason.
/// Userspace has no call that only splits, but `MADV_COLD` on part of an
/// exclusively mapped huge page splits it first (since Linux 5.4, PMD- or
/// PTE-mapped), so that the advice applies to the part alone; after the
/// split, the unmapped parts of an already partly unmapped huge page are
/// freed at once.
///
/// The advice itself only ages the 4 KiB page at `addr` on the LRU
/// (content untouched), so callers pass a page they are about to replace.
/// Best effort: the split can fail (a page pinned for I/O), and then the
/// memory comes back at the deferred split, as without this call.
pub(crate) fn split_huge_page_at(addr: usize) -> Result<(), MmError> {
    let page = addr & !(crate::PAGE_SIZE - 1);
    // SAFETY: MADV_COLD changes no content and no mapping's bytes (it
    // splits a huge page into small pages holding the same bytes and
    // deactivates one); on a range that is not mapped it fails with
    // ENOMEM and does nothing.
    let r = unsafe { libc::madvise(page as *mut libc::c_void, crate::PAGE_SIZE, MADV_COLD) };
    if r != 0 {
        return Err(err("madvise(MADV_COLD)", page, crate::PAGE_SIZE));
    }
    Ok(())
}

/// Number of VMAs of this process: newline count of `/proc/self/maps`.
/// Costs about a microsecond per VMA in the kernel, so callers rate-limit it.
///
/// Hand-written rather than procfs's `Process::maps().len()`, which parses
/// every line into a struct only to count them: counting newlines costs
/// about half as much at the tens of thousands of VMAs where the scanner's
/// headroom check runs.
pub fn vma_count() -> io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/self/maps")?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n += buf[..k].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

/// `vm.max_map_count` (65530 when unreadable, the kernel default).
pub fn max_map_count() -> u64 {
    procfs::sys::vm::max_map_count().unwrap_or(65530)
}

/// The PFN of the shared zero page (0 when PFNs are hidden from us).
pub fn zero_pfn(pm: &crate::pagemap::Pagemap) -> u64 {
    let Ok(p) = map_anon(crate::PAGE_SIZE) else {
        return 0;
    };
    // SAFETY: p is our fresh one-page anonymous mapping; a volatile read
    // faults in the shared zero page.
    let _ = unsafe { std::ptr::read_volatile(p) };
    let pfn = pm.entry(p as usize).map(|e| e.pfn()).unwrap_or(0);
    // SAFETY: p is our own one-page mapping, used no more.
    unsafe { unmap(p, crate::PAGE_SIZE) };
    pfn
}

/// CPU time of the calling thread's clock `clk`, in seconds (0 on error).
pub(crate) fn clock_seconds(clk: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The CPU clock of the calling thread (usable from other threads).
pub(crate) fn current_thread_clock() -> Option<libc::clockid_t> {
    let mut clk: libc::clockid_t = 0;
    // SAFETY: pthread_self is always valid; clk is a valid out-pointer.
    let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clk) };
    (r == 0).then_some(clk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_count_is_sane() {
        let n = vma_count().unwrap();
        assert!(n > 5 && n < max_map_count());
        // Every line is a mapping: the count matches the file's lines that
        // start with an address range (other tests map and unmap
        // concurrently, so compare with a second reading loosely).
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let ranges = text
            .lines()
            .filter(|l| l.split(' ').next().is_some_and(|r| r.contains('-')))
            .count() as u64;
        assert!(ranges.abs_diff(n) < 1000, "{n} vs {ranges}");
    }

    /// Resident bytes of the 2 MiB at `addr` that a huge page maps, from
    /// this VMA's `AnonHugePages`.
    fn anon_huge_bytes(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split(' ').next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .unwrap()
                        * 1024;
                }
            }
        }
        0
    }

    #[test]
    fn a_huge_page_splits_keeping_its_bytes() {
        /// Tries over about a second: a lock held by compaction or
        /// khugepaged is held for milliseconds.
        const SPLIT_TRIES: u32 = 20;
        // Two huge pages' worth, aligned, asking for huge pages.
        let len = 2 * HUGE_PAGE_SIZE;
        let raw = map_anon(len + HUGE_PAGE_SIZE).unwrap() as usize;
        let base = (raw + HUGE_PAGE_SIZE - 1) & !(HUGE_PAGE_SIZE - 1);
        // SAFETY: inside our fresh mapping; MADV_HUGEPAGE changes no content.
        unsafe { madvise(base, len, libc::MADV_HUGEPAGE) }.unwrap();
        let thp_setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        assert_eq!(
            thp_possible(),
            !thp_setting.contains("[never]"),
            "against the system setting {thp_setting:?}"
        );
        for i in (0..len).step_by(crate::PAGE_SIZE) {
            // SAFETY: inside our mapping.
            unsafe { std::ptr::write_volatile((base + i) as *mut u64, i as u64 | 1) };
        }
        let huge = anon_huge_bytes(base);
        // The kernel splits only when it can take the huge page's lock and
        // account for every reference at once; compaction or khugepaged
        // holding it for a moment makes MADV_COLD skip the split (it still
        // returns 0), as the engine's callers accept. The engine meets the
        // same huge page again on its next pass; the test tries again a
        // bounded number of times likewise, and every try must keep the
        // bytes.
        let mut tries = 0;
        // What smaps said right after the last try: khugepaged may collapse
        // the range again at any later moment (it is `MADV_HUGEPAGE`), so a
        // second reading could see a new huge page, not a failed split.
        let left = loop {
            tries += 1;
            split_huge_page_at(base + 5 * crate::PAGE_SIZE).unwrap();
            split_huge_page_at(base + HUGE_PAGE_SIZE + 7 * crate::PAGE_SIZE).unwrap();
            // Splitting must keep every byte whether a huge page was there
            // or not.
            for i in (0..len).step_by(crate::PAGE_SIZE) {
                // SAFETY: inside our mapping.
                let v = unsafe { std::ptr::read_volatile((base + i) as *const u64) };
                assert_eq!(v, i as u64 | 1, "page {}", i / crate::PAGE_SIZE);
            }
            let left = anon_huge_bytes(base);
            if huge == 0 || left == 0 || tries == SPLIT_TRIES {
                break left;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        if huge > 0 {
            assert_eq!(left, 0, "the huge pages were not split in {tries} tries");
            if tries > 1 {
                eprintln!("the huge pages split at try {tries}");
            }
        }
        // SAFETY: exactly our mapping.
        unsafe { unmap(raw as *mut u8, len + HUGE_PAGE_SIZE) };
    }

    /// Splitting where no huge page can be (`MADV_NOHUGEPAGE`) changes
    /// nothing: the engine may call it on any guest page it replaces.
    #[test]
    fn a_split_where_no_huge_page_is_keeps_the_bytes() {
        let p = map_anon(HUGE_PAGE_SIZE).unwrap() as usize;
        // SAFETY: our fresh mapping; MADV_NOHUGEPAGE changes no content.
        unsafe { madvise(p, HUGE_PAGE_SIZE, libc::MADV_NOHUGEPAGE) }.unwrap();
        for i in (0..HUGE_PAGE_SIZE).step_by(crate::PAGE_SIZE) {
            // SAFETY: inside our mapping.
            unsafe { std::ptr::write_volatile((p + i) as *mut u64, i as u64 | 3) };
        }
        split_huge_page_at(p + 3 * crate::PAGE_SIZE).unwrap();
        for i in (0..HUGE_PAGE_SIZE).step_by(crate::PAGE_SIZE) {
            // SAFETY: inside our mapping.
            let v = unsafe { std::ptr::read_volatile((p + i) as *const u64) };
            assert_eq!(v, i as u64 | 3);
        }
        // SAFETY: exactly our mapping.
        unsafe { unmap(p as *mut u8, HUGE_PAGE_SIZE) };
    }

    #[test]
    fn zero_pfn_found_as_root() {
        let pm = crate::pagemap::Pagemap::open().unwrap();
        // PFNs are visible to root; elsewhere zero_pfn is 0 and that's allowed.
        let _ = zero_pfn(&pm);
    }
}
