//! Helpers shared by pagefold's fuzz targets: a reader that turns the fuzz
//! input into numbers and byte strings (running out of input reads zeros,
//! so every input is valid), guest memory filled from the input, and
//! memfd-backed files for the code that wants a path or a `File`.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use vm_memory::{Bytes, GuestAddress};
use pagefold_devices::GuestMemoryMmap;

/// A cursor over the fuzz input.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.bytes(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A byte string of at most `max` bytes, its length taken from a u16.
    pub fn chunk(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u16()).min(max);
        self.bytes(n)
    }
}

/// Guest memory of `ranges` (start, size), filled in address order with
/// `content` (the rest stays zero).
pub fn guest_memory(ranges: &[(u64, usize)], content: &[u8]) -> GuestMemoryMmap {
    let r: Vec<_> = ranges.iter().map(|&(a, s)| (GuestAddress(a), s)).collect();
    let mem = GuestMemoryMmap::from_ranges(&r).expect("fuzz guest memory");
    let mut left = content;
    for &(start, size) in ranges {
        if left.is_empty() {
            break;
        }
        let n = size.min(left.len());
        mem.write_slice(&left[..n], GuestAddress(start))
            .expect("fuzz guest memory write");
        left = &left[n..];
    }
    mem
}

/// An anonymous in-memory file (no disk I/O, nothing left behind).
pub fn memfd(name: &std::ffi::CStr) -> File {
    // SAFETY: `name` is a valid NUL-terminated string; memfd_create has no
    // other memory-safety preconditions.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody
    // else; the File takes sole ownership and closes it.
    unsafe { File::from_raw_fd(fd) }
}

/// A memfd reused across fuzz iterations, refilled each time, that code
/// under test can open by path (`/proc/self/fd/N`).
pub struct ScratchFile {
    file: File,
}

impl ScratchFile {
    pub fn new(name: &std::ffi::CStr) -> Self {
        Self { file: memfd(name) }
    }

    /// Makes the file hold exactly `data`.
    pub fn fill(&self, data: &[u8]) -> &File {
        self.file.set_len(0).expect("memfd truncate");
        self.file.write_all_at(data, 0).expect("memfd write");
        &self.file
    }

    /// Makes the file `len` zero bytes long.
    pub fn zeroed(&self, len: u64) -> &File {
        self.file.set_len(0).expect("memfd truncate");
        self.file.set_len(len).expect("memfd extend");
        &self.file
    }

    /// A path that opens this file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Another open file description of this file, with the access asked
    /// for (its offset is independent of ours).
    pub fn reopen(&self, write: bool) -> File {
        File::options()
            .read(true)
            .write(write)
            .open(self.path())
            .expect("reopen memfd")
    }
}
