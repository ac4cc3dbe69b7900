//! The guest-physical ranges a balloon chain names: the PFN arrays of the
//! inflate and deflate queues, and the buffers of a free page report.

use std::io::Read;

use crate::virtio::ChainReader;
use crate::GuestMemoryMmap;
use virtio_queue::{DescriptorChain, Reader};
use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::{BALLOON_PAGE, PFN_SHIFT};

/// Most PFNs one inflate or deflate chain may carry: a queue's worth of
/// Linux's buffers (256 PFNs each). A longer chain is malformed.
pub const MAX_PFNS: usize = 256 * super::QUEUE_SIZE as usize;

/// Errors of a chain's shape (the chain is returned untouched).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a PFN buffer is device-writable")]
    Writable,
    #[error("the chain points outside guest memory: {0}")]
    Memory(virtio_queue::Error),
    #[error("{0} bytes of PFNs is not a whole number of 4-byte PFNs")]
    Partial(usize),
    #[error("{0} PFNs in one chain, more than {MAX_PFNS}")]
    TooMany(usize),
    #[error("reading the PFNs failed: {0}")]
    Read(std::io::Error),
    #[error("the report is empty")]
    Empty,
}

/// The ranges of one chain, sorted and merged where adjacent.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ranges {
    /// `(guest-physical address, length)`, page aligned, in guest RAM.
    pub ranges: Vec<(u64, u64)>,
    /// 4 KiB pages in them (a PFN named twice counts once).
    pub pages: u64,
    /// PFNs or ranges skipped: outside guest RAM, or not page aligned.
    pub bad: u64,
}

/// Sorts `ranges` and merges overlapping and adjacent ones.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, l) in ranges {
        match out.last_mut() {
            Some((pa, pl)) if a <= *pa + *pl => *pl = (*pl).max(a + l - *pa),
            _ => out.push((a, l)),
        }
    }
    out
}

/// Does guest RAM hold all of `addr..+len` (one or more regions)?
fn in_ram(mem: &GuestMemoryMmap, addr: u64, len: u64) -> bool {
    usize::try_from(len).is_ok_and(|l| l > 0 && mem.check_range(GuestAddress(addr), l))
}

fn finish(ranges: Vec<(u64, u64)>, bad: u64) -> Ranges {
    let ranges = merge(ranges);
    let pages = ranges.iter().map(|&(_, l)| l / BALLOON_PAGE).sum();
    Ranges { ranges, pages, bad }
}

/// The pages an inflate or deflate chain names: driver-readable buffers
/// holding little-endian 32-bit PFNs of 4 KiB pages.
pub fn pfn_ranges(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Result<Ranges, Error> {
    if chain.clone().any(|d| d.is_write_only()) {
        return Err(Error::Writable);
    }
    let mut reader: ChainReader<'_> = Reader::new(mem, chain).map_err(Error::Memory)?;
    let n = reader.available_bytes();
    if n % 4 != 0 {
        return Err(Error::Partial(n));
    }
    if n / 4 > MAX_PFNS {
        return Err(Error::TooMany(n / 4));
    }
    let mut bytes = vec![0u8; n];
    reader.read_exact(&mut bytes).map_err(Error::Read)?;
    let mut ranges = Vec::with_capacity(n / 4);
    let mut bad = 0;
    for pfn in bytes.chunks_exact(4) {
        let pfn = u32::from_le_bytes([pfn[0], pfn[1], pfn[2], pfn[3]]);
        let addr = u64::from(pfn) << PFN_SHIFT;
        if in_ram(mem, addr, BALLOON_PAGE) {
            ranges.push((addr, BALLOON_PAGE));
        } else {
            bad += 1;
        }
    }
    Ok(finish(ranges, bad))
}

/// The ranges of a free page report: each buffer of the chain is one free
/// range (Linux posts them device-writable; the device neither reads nor
/// writes them, so either direction is taken). Ranges not page aligned or
/// not in guest RAM are skipped.
pub fn reported_ranges(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Result<Ranges, Error> {
    let mut ranges = Vec::new();
    let mut bad = 0;
    let mut any = false;
    for d in chain {
        any = true;
        let (addr, len) = (d.addr().0, u64::from(d.len()));
        let aligned = addr % BALLOON_PAGE == 0 && len % BALLOON_PAGE == 0;
        if aligned && in_ram(mem, addr, len) {
            ranges.push((addr, len));
        } else {
            bad += 1;
        }
    }
    if !any {
        return Err(Error::Empty);
    }
    Ok(finish(ranges, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_when_they_touch_or_overlap() {
        let r = merge(vec![
            (0x3000, 0x1000),
            (0x1000, 0x1000),
            (0x2000, 0x1000),
            (0x2000, 0x1000),
            (0x8000, 0x2000),
            (0x9000, 0x1000),
        ]);
        assert_eq!(r, vec![(0x1000, 0x3000), (0x8000, 0x2000)]);
    }
}
