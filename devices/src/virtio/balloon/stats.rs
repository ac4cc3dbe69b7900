//! The guest's memory statistics: the statistics queue's buffer holds
//! `virtio_balloon_stat` entries (le16 tag, le64 value, packed: 10 bytes).

use std::collections::BTreeMap;
use std::io::Read;

use crate::virtio::ChainReader;
use crate::GuestMemoryMmap;
use virtio_queue::{DescriptorChain, Reader};

/// One entry's length.
const STAT_LEN: usize = 10;
/// Most entries read from one buffer: Linux sends 16 tags or fewer; more
/// is a malformed buffer.
pub const MAX_STATS: usize = 64;

/// The tags virtio 1.x and Linux define, by name (bytes for memory
/// figures, counts for the rest, as the guest sends them).
pub const TAGS: &[(u16, &str)] = &[
    (0, "swap_in"),
    (1, "swap_out"),
    (2, "major_faults"),
    (3, "minor_faults"),
    (4, "free_memory"),
    (5, "total_memory"),
    (6, "available_memory"),
    (7, "disk_caches"),
    (8, "hugetlb_allocations"),
    (9, "hugetlb_failures"),
    (10, "oom_kills"),
    (11, "alloc_stalls"),
    (12, "async_scans"),
    (13, "direct_scans"),
    (14, "async_reclaims"),
    (15, "direct_reclaims"),
];

/// The name of `tag`, if the spec or Linux defines it.
pub fn tag_name(tag: u16) -> Option<&'static str> {
    TAGS.iter().find(|(t, _)| *t == tag).map(|(_, n)| *n)
}

/// Errors of a statistics buffer (it is returned and not read).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the statistics buffer is device-writable")]
    Writable,
    #[error("the statistics buffer points outside guest memory: {0}")]
    Memory(virtio_queue::Error),
    #[error("{0} bytes of statistics is not a whole number of 10-byte entries")]
    Partial(usize),
    #[error("{0} statistics in one buffer, more than {MAX_STATS}")]
    TooMany(usize),
    #[error("reading the statistics failed: {0}")]
    Read(std::io::Error),
}

/// The statistics of one buffer, by known tag name; unknown tags are
/// kept by number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestStats {
    /// Known tags' values, by [`TAGS`] name.
    pub values: BTreeMap<&'static str, u64>,
    /// Tags this device does not know, by number.
    pub other: BTreeMap<u16, u64>,
    /// When the buffer was read.
    pub at: Option<std::time::SystemTime>,
}

impl GuestStats {
    /// The value of the tag named `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }
}

/// Reads a statistics buffer (driver-readable).
pub fn read(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Result<GuestStats, Error> {
    if chain.clone().any(|d| d.is_write_only()) {
        return Err(Error::Writable);
    }
    let mut reader: ChainReader<'_> = Reader::new(mem, chain).map_err(Error::Memory)?;
    let n = reader.available_bytes();
    if n % STAT_LEN != 0 {
        return Err(Error::Partial(n));
    }
    if n / STAT_LEN > MAX_STATS {
        return Err(Error::TooMany(n / STAT_LEN));
    }
    let mut bytes = vec![0u8; n];
    reader.read_exact(&mut bytes).map_err(Error::Read)?;
    let mut s = GuestStats {
        at: Some(std::time::SystemTime::now()),
        ..GuestStats::default()
    };
    for e in bytes.chunks_exact(STAT_LEN) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&e[2..10]);
        let val = u64::from_le_bytes(v);
        match tag_name(tag) {
            Some(name) => {
                s.values.insert(name, val);
            }
            None => {
                s.other.insert(tag, val);
            }
        }
    }
    Ok(s)
}
