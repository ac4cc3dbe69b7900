//! The backing store of a virtio-blk device: a raw image file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Sector size of the virtio-blk protocol (fixed at 512 bytes by the spec).
pub const SECTOR_SIZE: u64 = 512;

/// Errors opening an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open disk image {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot stat disk image {path}: {source}")]
    Stat {
        path: String,
        source: std::io::Error,
    },
}

/// A raw disk image. Its size is fixed at open; a trailing partial sector
/// is not visible to the guest.
pub struct Disk {
    file: File,
    nsectors: u64,
    read_only: bool,
}

impl Disk {
    /// Opens `path` read-write, or read-only if `read_only`.
    pub fn open(path: &Path, read_only: bool) -> Result<Self, Error> {
        let name = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|source| Error::Open {
                path: name.clone(),
                source,
            })?;
        let len = file
            .metadata()
            .map_err(|source| Error::Stat { path: name, source })?
            .len();
        Ok(Self::from_file(file, len, read_only))
    }

    /// Wraps an open file of `len` bytes (tests use temporary files).
    pub fn from_file(file: File, len: u64, read_only: bool) -> Self {
        Self {
            file,
            nsectors: len / SECTOR_SIZE,
            read_only,
        }
    }

    /// Capacity in 512-byte sectors.
    pub fn nsectors(&self) -> u64 {
        self.nsectors
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Reads exactly `buf.len()` bytes at byte offset `off`.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.file.read_exact_at(buf, off)
    }

    /// Writes all of `buf` at byte offset `off`.
    pub fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.file.write_all_at(buf, off)
    }

    /// Makes written data durable.
    pub fn flush(&self) -> std::io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }
}
