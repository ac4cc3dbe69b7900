//! One private copy of a disk image per VM and run. The Linux build writes
//! gigabytes to its disk, so both VMs of a run must start from the same
//! image without sharing it, and the copy must be cheap: a reflink (copy
//! on write, instant) where the filesystem can, else a sparse copy of the
//! image's data extents only (mkfs.ext4 -d images are mostly holes).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;

/// How a copy was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Shares the source's blocks copy-on-write (FICLONE).
    Reflink,
    /// The data extents copied, holes kept.
    Sparse,
}

/// `lseek(fd, off, whence)`, None when the filesystem does not know
/// holes (EINVAL) or there is no more data (ENXIO).
fn seek_data_or_hole(f: &File, off: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
    // SAFETY: lseek on a file descriptor `f` owns and keeps open; it only
    // moves the file offset, no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) | Some(libc::EINVAL) => Ok(None),
        _ => Err(e),
    }
}

/// Copies `src` to `dst` (created or truncated).
pub fn copy_disk(src: &Path, dst: &Path) -> std::io::Result<CopyKind> {
    let s = File::open(src)?;
    let mut d = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)?;
    // SAFETY: FICLONE takes the source descriptor as its argument; both
    // descriptors are open files owned here. On failure nothing changed.
    if unsafe { libc::ioctl(d.as_raw_fd(), libc::FICLONE, s.as_raw_fd()) } == 0 {
        return Ok(CopyKind::Reflink);
    }
    let len = s.metadata()?.len();
    d.set_len(len)?;
    let mut off = 0;
    while off < len {
        let Some(data) = seek_data_or_hole(&s, off, libc::SEEK_DATA)? else {
            if off == 0 && seek_data_or_hole(&s, 0, libc::SEEK_HOLE)?.is_none() {
                // No hole support: copy everything.
                copy_range(&s, &mut d, 0, len)?;
            }
            break;
        };
        let end = seek_data_or_hole(&s, data, libc::SEEK_HOLE)?.unwrap_or(len);
        copy_range(&s, &mut d, data, end)?;
        off = end;
    }
    d.sync_all()?;
    Ok(CopyKind::Sparse)
}

fn copy_range(s: &File, d: &mut File, from: u64, to: u64) -> std::io::Result<()> {
    let mut s = s;
    s.seek(SeekFrom::Start(from))?;
    d.seek(SeekFrom::Start(from))?;
    let n = std::io::copy(&mut s.take(to - from), d)?;
    if n != to - from {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "disk image shrank while copying ({n} of {} bytes)",
                to - from
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn copies_content_and_keeps_holes() {
        let dir = std::env::temp_dir();
        let id = std::process::id();
        let (src, dst) = (
            dir.join(format!("pagefold-disk-src-{id}")),
            dir.join(format!("pagefold-disk-dst-{id}")),
        );
        // 64 MiB with data at 0, 32 MiB and at the very end.
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        for (at, byte) in [(0u64, 1u8), (32 << 20, 2), ((64 << 20) - 4096, 3)] {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(&[byte; 4096]).unwrap();
        }
        drop(f);
        let kind = copy_disk(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let m = std::fs::metadata(&dst).unwrap();
        assert_eq!(m.len(), 64 << 20);
        if kind == CopyKind::Sparse {
            // Three data pages (filesystem blocks may round up), not 64 MiB.
            assert!(
                m.blocks() * 512 < 4 << 20,
                "{} blocks: holes filled",
                m.blocks()
            );
        }
        // A second copy over the first replaces it.
        std::fs::write(&src, b"small").unwrap();
        copy_disk(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"small");
        let _ = std::fs::remove_file(src);
        let _ = std::fs::remove_file(dst);
    }
}
