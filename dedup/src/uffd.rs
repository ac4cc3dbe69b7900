//! userfaultfd write-protection: the uffdio structs, ioctl numbers (from
//! vmm-sys-util's macros) and wrappers.
//!
//! Only `UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID` are asked
//! for, and `UFFD_FEATURE_WP_UNPOPULATED` where the kernel has it (Linux
//! 6.4+): a protect then covers unpopulated pages of anonymous memory too
//! (a uffd-wp marker), so a page protected is a page protected whatever its
//! PTE held, and the merge path need not read pagemap to find out
//! (`Uffd::protects_unpopulated`). `EVENT_UNMAP/REMOVE/REMAP` would make
//! every merge `mmap(MAP_FIXED)` and `MADV_DONTNEED` wait for the uffd
//! reader (deadlock if the merger reads), and `UFFD_USER_MODE_ONLY` makes
//! KVM's kernel-mode accesses fail, so `KVM_RUN` returns EFAULT instead of
//! waiting (docs/merge-races.md §7): neither is used.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Errors of the userfaultfd wrappers.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    #[error("cannot create a userfaultfd: {0}")]
    Create(#[source] io::Error),
    #[error("UFFDIO_API handshake: {0}")]
    Api(#[source] io::Error),
    #[error("the kernel lacks userfaultfd write-protect support")]
    NoWp,
    #[error("{op} {addr:#x}+{len:#x}: {source}")]
    Ioctl {
        op: &'static str,
        addr: usize,
        len: usize,
        #[source]
        source: io::Error,
    },
    #[error("read userfaultfd: {0}")]
    Read(#[source] io::Error),
    #[error("probing userfaultfd write-protection: {0}")]
    Probe(String),
}

// The `struct uffdio_*` layouts of <linux/userfaultfd.h>. The userfaultfd
// crate was not taken: its -sys crate runs bindgen (libclang) at build time,
// it opens /dev/userfaultfd before trying the syscall (we prefer the
// syscall), and its event reader decodes every message into an enum where
// the fault handler only needs the raw address and flags. vmm-sys-util's
// ioctl macros compute the request numbers from these types instead.

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// The ioctl request numbers (`_IOWR(UFFDIO, nr, struct)` and friends).
mod req {
    use super::{UffdioApi, UffdioRange, UffdioRegister, UffdioWriteprotect};
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iowr_nr};

    /// The ioctl type of userfaultfd (`UFFDIO`).
    const UFFDIO: u32 = 0xAA;
    ioctl_iowr_nr!(UFFDIO_API, UFFDIO, 0x3F, UffdioApi);
    ioctl_iowr_nr!(UFFDIO_REGISTER, UFFDIO, 0x00, UffdioRegister);
    ioctl_ior_nr!(UFFDIO_UNREGISTER, UFFDIO, 0x01, UffdioRange);
    ioctl_ior_nr!(UFFDIO_WAKE, UFFDIO, 0x02, UffdioRange);
    ioctl_iowr_nr!(UFFDIO_WRITEPROTECT, UFFDIO, 0x06, UffdioWriteprotect);
    // `/dev/userfaultfd`'s one ioctl: `_IO(UFFDIO, 0x00)`.
    ioctl_io_nr!(USERFAULTFD_IOC_NEW, UFFDIO, 0x00);
}

const UFFD_API: u64 = 0xAA;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// `_UFFDIO_WRITEPROTECT`: its bit in `uffdio_register.ioctls`.
const UFFDIO_WRITEPROTECT_NR: u64 = 0x06;

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// Page fault flag: write-protect fault.
pub const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// `struct uffd_msg` restricted to the page-fault view (32 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdMsg {
    pub event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    pub flags: u64,
    pub address: u64,
    pub ptid: u32,
    _pad: u32,
}

/// A userfaultfd used only for write-protection.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// `UFFD_FEATURE_WP_UNPOPULATED` is on.
    unpopulated: bool,
    /// One `UFFDIO_WRITEPROTECT` may cover several VMAs (Linux 6.5+).
    spans_vmas: bool,
}

impl Uffd {
    /// Creates a non-blocking userfaultfd (syscall, else `/dev/userfaultfd`)
    /// and negotiates WP fault reporting, with `WP_UNPOPULATED` where the
    /// kernel offers it.
    pub fn new() -> Result<Self, UffdError> {
        let base = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID;
        match Self::with_features(base | UFFD_FEATURE_WP_UNPOPULATED) {
            // A kernel before 6.4 refuses a feature it does not know.
            Err(UffdError::Api(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                Self::with_features(base)
            }
            r => r,
        }
    }

    /// Does a protect cover unpopulated pages of anonymous memory
    /// (`UFFD_FEATURE_WP_UNPOPULATED`)? Without it, a protect skips a page
    /// whose PTE is empty, and only pagemap tells which pages it covered.
    pub fn protects_unpopulated(&self) -> bool {
        self.unpopulated
    }

    /// Does one `UFFDIO_WRITEPROTECT` cover a range of several VMAs? Linux
    /// before 6.5 (Debian 12's 6.1 among them) requires the range to lie
    /// in one VMA and fails with `ENOENT`, changing nothing, when it does
    /// not; [`Uffd::protect`] and [`Uffd::unprotect`] then split the range
    /// (see `writeprotect`). Guest RAM is one VMA until merges map pool
    /// pages into it, so a merge window, an unmerge chunk and the pages
    /// left after a merge span several.
    pub fn spans_vmas(&self) -> bool {
        self.spans_vmas
    }

    fn with_features(features: u64) -> Result<Self, UffdError> {
        // SAFETY: plain syscall with flag arguments.
        let mut raw = unsafe {
            libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as RawFd
        };
        if raw < 0 {
            let first = io::Error::last_os_error();
            // SAFETY: the path is a valid NUL-terminated string.
            let dev =
                unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if dev < 0 {
                return Err(UffdError::Create(first));
            }
            // SAFETY: dev is an open fd; the ioctl takes flags by value.
            raw = unsafe {
                libc::ioctl(
                    dev,
                    req::USERFAULTFD_IOC_NEW() as _,
                    libc::O_CLOEXEC | libc::O_NONBLOCK,
                )
            };
            let e = io::Error::last_os_error();
            // SAFETY: dev is ours and no longer needed.
            unsafe { libc::close(dev) };
            if raw < 0 {
                return Err(UffdError::Create(e));
            }
        }
        // SAFETY: raw is a freshly created fd that we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: api is a valid, correctly sized uffdio_api.
        if unsafe { libc::ioctl(fd.as_raw_fd(), req::UFFDIO_API() as _, &mut api) } != 0 {
            return Err(UffdError::Api(io::Error::last_os_error()));
        }
        if api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP == 0 {
            return Err(UffdError::NoWp);
        }
        let mut uffd = Uffd {
            fd,
            unpopulated: features & UFFD_FEATURE_WP_UNPOPULATED != 0,
            spans_vmas: true,
        };
        uffd.spans_vmas = uffd.probe_spans_vmas()?;
        Ok(uffd)
    }

    /// Write-protects two pages that lie in two VMAs with one ioctl: a
    /// kernel that cannot says `ENOENT`. Detected, not inferred from the
    /// kernel version, so that backports count.
    fn probe_spans_vmas(&self) -> Result<bool, UffdError> {
        let len = 2 * crate::PAGE_SIZE;
        let p = crate::mm::map_anon(len).map_err(|e| UffdError::Probe(e.to_string()))?;
        let addr = p as usize;
        // A second VMA: the same anonymous mapping, split by protection.
        // SAFETY: the second page is part of our own fresh mapping.
        let split = unsafe {
            libc::mprotect(
                (addr + crate::PAGE_SIZE) as *mut libc::c_void,
                crate::PAGE_SIZE,
                libc::PROT_READ,
            )
        };
        let r = if split != 0 {
            Err(UffdError::Probe(format!(
                "mprotect: {}",
                io::Error::last_os_error()
            )))
        } else {
            self.register_wp(addr, len).and_then(|()| {
                match self.wp_ioctl(addr, len, UFFDIO_WRITEPROTECT_MODE_WP) {
                    Ok(()) => Ok(true),
                    Err(UffdError::Ioctl { source, .. })
                        if source.raw_os_error() == Some(libc::ENOENT) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            })
        };
        // SAFETY: p..+len is the probe's own mapping, used no more.
        unsafe { crate::mm::unmap(p, len) };
        r
    }

    /// The raw fd (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(
        &self,
        op: &'static str,
        request: libc::c_ulong,
        arg: &mut T,
        addr: usize,
        len: usize,
    ) -> Result<(), UffdError> {
        let _slow = crate::mm::SlowCall::start(op, addr, len);
        // SAFETY: arg is a valid, correctly sized struct for `request`.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, arg as *mut T) } != 0 {
            return Err(UffdError::Ioctl {
                op,
                addr,
                len,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Registers `addr..+len` for write-protect faults. Also used to
    /// re-register the VMAs that `mmap(MAP_FIXED)` creates during a merge.
    pub fn register_wp(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        self.ioctl("UFFDIO_REGISTER", req::UFFDIO_REGISTER(), &mut r, addr, len)?;
        if r.ioctls & (1 << UFFDIO_WRITEPROTECT_NR) == 0 {
            return Err(UffdError::NoWp);
        }
        Ok(())
    }

    /// Unregisters `addr..+len` (wakes any waiter in it).
    pub fn unregister(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.ioctl(
            "UFFDIO_UNREGISTER",
            req::UFFDIO_UNREGISTER(),
            &mut r,
            addr,
            len,
        )
    }

    /// Write-protects `addr..+len`: present PTEs, swap and migration
    /// entries, and with `protects_unpopulated` empty PTEs of anonymous
    /// memory too (without it, verify with pagemap). On an error, part of
    /// the range may be protected (as on Linux 6.5+, which stops at the
    /// first VMA it cannot protect): unprotect the whole range.
    pub fn protect(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        self.writeprotect(addr, len, UFFDIO_WRITEPROTECT_MODE_WP)
    }

    /// Removes write-protection from `addr..+len` and wakes its waiters.
    /// On an error, the parts of the range that could be were unprotected.
    pub fn unprotect(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        self.writeprotect(addr, len, 0)
    }

    /// One ioctl where it covers the range; on a kernel whose ioctl stays
    /// within one VMA (`spans_vmas` false), a range it refuses with
    /// `ENOENT` is halved until each part lies in one VMA. A refused
    /// ioctl changes nothing and costs a VMA lookup (no TLB flush), so
    /// the halving costs little beside the flushes of the parts, which
    /// such a kernel needs anyway. A part of one page that is still
    /// refused is a real error (an unregistered VMA or a hole): a protect
    /// stops there, an unprotect goes on with the rest and reports it.
    fn writeprotect(&self, addr: usize, len: usize, mode: u64) -> Result<(), UffdError> {
        match self.wp_ioctl(addr, len, mode) {
            Err(UffdError::Ioctl { source, .. })
                if !self.spans_vmas
                    && len > crate::PAGE_SIZE
                    && source.raw_os_error() == Some(libc::ENOENT) =>
            {
                let half = len / crate::PAGE_SIZE / 2 * crate::PAGE_SIZE;
                let first = self.writeprotect(addr, half, mode);
                if first.is_err() && mode != 0 {
                    return first;
                }
                let second = self.writeprotect(addr + half, len - half, mode);
                first.and(second)
            }
            r => r,
        }
    }

    fn wp_ioctl(&self, addr: usize, len: usize, mode: u64) -> Result<(), UffdError> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode,
        };
        let op = if mode == 0 {
            "UFFDIO_WRITEPROTECT(0)"
        } else {
            "UFFDIO_WRITEPROTECT(WP)"
        };
        self.ioctl(op, req::UFFDIO_WRITEPROTECT(), &mut w, addr, len)
    }

    /// Wakes every thread blocked on a fault in `addr..+len`.
    pub fn wake(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.ioctl("UFFDIO_WAKE", req::UFFDIO_WAKE(), &mut r, addr, len)
    }

    /// Reads pending messages into `buf`; returns how many (0 if none).
    pub fn read_msgs(&self, buf: &mut [UffdMsg]) -> Result<usize, UffdError> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: buf is valid for `bytes` bytes of writes; UffdMsg is POD.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                bytes,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(0);
            }
            return Err(UffdError::Read(e));
        }
        Ok(n as usize / std::mem::size_of::<UffdMsg>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PAGE_SIZE;

    #[test]
    fn msg_layout() {
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
        // The numbers of <linux/userfaultfd.h> on x86_64.
        assert_eq!(req::UFFDIO_API(), 0xc018aa3f);
        assert_eq!(req::UFFDIO_REGISTER(), 0xc020aa00);
        assert_eq!(req::UFFDIO_UNREGISTER(), 0x8010aa01);
        assert_eq!(req::UFFDIO_WAKE(), 0x8010aa02);
        assert_eq!(req::UFFDIO_WRITEPROTECT(), 0xc018aa06);
        assert_eq!(req::USERFAULTFD_IOC_NEW(), 0xaa00);
    }

    /// Starts a thread that writes `v` to `addr`, and checks that the
    /// write faults into `u` (one write-protect message for that page)
    /// and that the writer stays blocked. The caller unprotects and joins.
    fn blocked_writer(u: &Uffd, addr: usize, v: u8) -> std::thread::JoinHandle<()> {
        let t = std::thread::spawn(move || {
            // SAFETY: the caller keeps the mapping until after the join.
            unsafe { std::ptr::write_volatile(addr as *mut u8, v) };
        });
        let mut msgs = [UffdMsg::default(); 4];
        let mut got = 0;
        for _ in 0..200 {
            got = u.read_msgs(&mut msgs).unwrap();
            if got > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(got, 1, "the write did not fault");
        assert_eq!(msgs[0].event, EVENT_PAGEFAULT);
        assert!(msgs[0].flags & PAGEFAULT_FLAG_WP != 0);
        assert_eq!(msgs[0].address as usize & !(PAGE_SIZE - 1), addr);
        assert!(!t.is_finished());
        t
    }

    #[test]
    fn protect_sets_pagemap_bit_and_blocks_writer_until_unprotect() {
        let u = Uffd::new().unwrap();
        let len = 4 * PAGE_SIZE;
        let p = crate::mm::map_anon(len).unwrap();
        // SAFETY: p is our fresh mapping of `len` bytes.
        unsafe { std::ptr::write_bytes(p, 7, len) };
        u.register_wp(p as usize, len).unwrap();
        u.protect(p as usize, PAGE_SIZE).unwrap();
        let pm = crate::pagemap::Pagemap::open().unwrap();
        assert!(pm.entry(p as usize).unwrap().uffd_wp());
        assert!(!pm.entry(p as usize + PAGE_SIZE).unwrap().uffd_wp());
        let addr = p as usize;
        let t = blocked_writer(&u, addr, 9);
        u.unprotect(addr, PAGE_SIZE).unwrap();
        t.join().unwrap();
        // SAFETY: p is still mapped.
        assert_eq!(unsafe { *p }, 9);
        // SAFETY: the test's own mapping; the writer thread has ended.
        unsafe { crate::mm::unmap(p, len) };
    }

    /// A range over several VMAs is protected and released whole, on
    /// every kernel: in one ioctl where it spans VMAs (6.5+), in parts
    /// before. Three VMAs: anonymous, read-only (split by mprotect),
    /// anonymous again.
    #[test]
    fn protect_and_unprotect_cover_a_range_of_several_vmas() {
        let u = Uffd::new().unwrap();
        eprintln!("one ioctl spans VMAs: {}", u.spans_vmas());
        let len = 6 * PAGE_SIZE;
        let p = crate::mm::map_anon(len).unwrap();
        let addr = p as usize;
        // SAFETY: p is our fresh mapping of `len` bytes.
        unsafe { std::ptr::write_bytes(p, 1, len) };
        // SAFETY: pages 2 and 3 are part of our own mapping.
        let r = unsafe {
            libc::mprotect(
                (addr + 2 * PAGE_SIZE) as *mut libc::c_void,
                2 * PAGE_SIZE,
                libc::PROT_READ,
            )
        };
        assert_eq!(r, 0);
        u.register_wp(addr, len).unwrap();
        u.protect(addr, len).unwrap();
        let pm = crate::pagemap::Pagemap::open().unwrap();
        for i in 0..6 {
            assert!(
                pm.entry(addr + i * PAGE_SIZE).unwrap().uffd_wp(),
                "page {i}"
            );
        }
        // A writer to the last VMA blocks until the unprotect.
        let t = blocked_writer(&u, addr + 5 * PAGE_SIZE, 4);
        u.unprotect(addr, len).unwrap();
        t.join().unwrap();
        for i in 0..6 {
            assert!(
                !pm.entry(addr + i * PAGE_SIZE).unwrap().uffd_wp(),
                "page {i}"
            );
        }
        // An unregistered VMA is an error, not a split: map a fresh page
        // over page 1 (MAP_FIXED VMAs are not registered).
        // SAFETY: page 1 is part of the test's own mapping, and no
        // reference into it is live; its old content is not read again.
        unsafe { crate::mm::map_anon_fixed(addr + PAGE_SIZE, PAGE_SIZE) }.unwrap();
        assert!(u.protect(addr, len).is_err());
        assert!(u.unprotect(addr, len).is_err());
        // The unprotect went on past it: nothing stays protected.
        for i in [0, 2, 3, 4, 5] {
            assert!(
                !pm.entry(addr + i * PAGE_SIZE).unwrap().uffd_wp(),
                "page {i}"
            );
        }
        // SAFETY: the test's own mapping; the writer thread has ended.
        unsafe { crate::mm::unmap(p, len) };
    }

    /// The merge path trusts a protect to cover every page of its window
    /// when `protects_unpopulated` (it reads no pagemap then): a page never
    /// touched, or dropped since the scan saw it, must block a writer as a
    /// mapped one does, and read as zeros meanwhile.
    #[test]
    fn protect_covers_an_unpopulated_page_when_the_kernel_offers_it() {
        let u = Uffd::new().unwrap();
        if !u.protects_unpopulated() {
            // A kernel before 6.4: the merge path reads pagemap instead.
            eprintln!("skipped: no UFFD_FEATURE_WP_UNPOPULATED");
            return;
        }
        let len = 2 * PAGE_SIZE;
        let p = crate::mm::map_anon(len).unwrap();
        let addr = p as usize;
        u.register_wp(addr, len).unwrap();
        u.protect(addr, len).unwrap();
        let pm = crate::pagemap::Pagemap::open().unwrap();
        let e = pm.entry(addr).unwrap();
        assert!(!e.present() && e.uffd_wp(), "marker expected: {e:?}");
        // SAFETY: p is our mapping; reading an unpopulated page maps zeros.
        assert_eq!(unsafe { std::ptr::read_volatile(p) }, 0);
        let t = blocked_writer(&u, addr, 5);
        // SAFETY: p is still mapped; the writer is blocked.
        assert_eq!(unsafe { std::ptr::read_volatile(p) }, 0);
        u.unprotect(addr, len).unwrap();
        t.join().unwrap();
        // SAFETY: p is still mapped.
        assert_eq!(unsafe { *p }, 5);
        // SAFETY: the test's own mapping; the writer thread has ended.
        unsafe { crate::mm::unmap(p, len) };
    }
}
