//! Thin wrappers over the memory-management syscalls the engine needs
//! (mmap/mremap/madvise/munmap) and the map-count figures that limit how many
//! VMAs merging may create.

use std::io;
use std::os::fd::RawFd;

/// `MADV_POPULATE_READ` (Linux 5.14), not in every libc release.
pub const MADV_POPULATE_READ: libc::c_int = 22;

/// Errors of the mm helpers.
#[derive(Debug, thiserror::Error)]
pub enum MmError {
    #[error("{op} at {addr:#x}+{len:#x}: {source}")]
    Syscall {
        op: &'static str,
        addr: usize,
        len: usize,
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
pub fn map_pool_fixed(addr: usize, len: usize, fd: RawFd, off: u64) -> Result<(), MmError> {
    // SAFETY: MAP_FIXED replaces whatever is mapped at addr..+len; callers
    // only pass ranges of a registered region whose pages are write-protected
    // and verified identical to the pool pages, so the replacement is
    // invisible to the memory's users.
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
pub fn map_anon_fixed(addr: usize, len: usize) -> Result<(), MmError> {
    // SAFETY: callers pass either a write-protected range verified
    // all-zero (the content users see is unchanged) or a region whose owner
    // unmaps it right after and never reads it again
    // (`DedupBackend::unregister_unmapping`); a stray access would find
    // zeros, never another mapping's memory.
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

/// Unmaps a range this crate mapped itself (errors are ignored: the range
/// was ours and munmap of it cannot fail for a valid range).
pub fn unmap(addr: *mut u8, len: usize) {
    // SAFETY: callers pass mappings they created and no longer use.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Moves the pages of `src..+len` over `dst..+len` atomically (the unmerge
/// primitive: the old mapping at `dst` is discarded in the same step).
pub fn mremap_fixed(src: *mut u8, len: usize, dst: usize) -> Result<(), MmError> {
    // SAFETY: src is a private mapping owned by the caller; dst is a range of
    // a registered region, write-protected, whose content src already holds.
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
pub fn madvise(addr: usize, len: usize, advice: libc::c_int) -> Result<(), MmError> {
    // SAFETY: madvise with DONTNEED/POPULATE_READ on a registered range is
    // only issued while the caller guarantees the content is preserved
    // (zero pages under write-protection) or unaffected (populate).
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r != 0 {
        return Err(err("madvise", addr, len));
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
    unmap(p, crate::PAGE_SIZE);
    pfn
}

/// CPU time of the calling thread's clock `clk`, in seconds (0 on error).
pub fn clock_seconds(clk: libc::clockid_t) -> f64 {
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
pub fn current_thread_clock() -> Option<libc::clockid_t> {
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

    #[test]
    fn zero_pfn_found_as_root() {
        let pm = crate::pagemap::Pagemap::open().unwrap();
        // PFNs are visible to root; elsewhere zero_pfn is 0 and that's allowed.
        let _ = zero_pfn(&pm);
    }
}
