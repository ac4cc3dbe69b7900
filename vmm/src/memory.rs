//! Guest RAM: anonymous private mappings (the kind the dedup engine can
//! remap), laid out around a 1 GiB MMIO hole below 4 GiB.

use pagefold_devices::GuestMemoryMmap;
use vm_memory::GuestAddress;

/// Start of the MMIO hole (virtio-mmio devices, IOAPIC, LAPIC live here).
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
/// End of the MMIO hole; RAM beyond the hole continues here.
pub const MMIO_HOLE_END: u64 = 1 << 32;
/// Guest RAM must be a multiple of this.
pub const RAM_ALIGN: u64 = 2 << 20;

/// Errors of guest memory set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("guest memory size must be a non-zero multiple of 2 MiB, got {0} bytes")]
    BadSize(u64),
    #[error("mapping {size} bytes of guest memory: {source}")]
    Mmap {
        size: u64,
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
}

/// RAM ranges (guest address, length) for `size` bytes of guest memory.
pub fn ram_ranges(size: u64) -> Result<Vec<(u64, u64)>, Error> {
    if size == 0 || size % RAM_ALIGN != 0 {
        return Err(Error::BadSize(size));
    }
    if size <= MMIO_HOLE_START {
        return Ok(vec![(0, size)]);
    }
    Ok(vec![
        (0, MMIO_HOLE_START),
        (MMIO_HOLE_END, size - MMIO_HOLE_START),
    ])
}

/// Highest guest address + 1 of RAM.
pub fn ram_top(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(a, l)| a + l).max().unwrap_or(0)
}

/// The host's total RAM (`MemTotal`), read with the same `/proc/meminfo`
/// parser as auto mode; `None` if it cannot be read.
pub fn host_mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    pagefold_dedup::auto::parse_meminfo(&text)
        .ok()
        .map(|s| s.total_bytes)
}

/// Maps guest RAM: `MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE` regions (vm-memory's
/// default), never populated up front — untouched RAM costs nothing and
/// stays mergeable.
pub fn create(size: u64) -> Result<GuestMemoryMmap, Error> {
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(size)?
        .into_iter()
        .map(|(a, l)| (GuestAddress(a), l as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|source| Error::Mmap { size, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

    #[test]
    fn layout_leaves_a_hole_when_large() {
        assert_eq!(ram_ranges(256 << 20).unwrap(), vec![(0, 256 << 20)]);
        assert_eq!(
            ram_ranges(MMIO_HOLE_START).unwrap(),
            vec![(0, MMIO_HOLE_START)]
        );
        let r = ram_ranges(4 << 30).unwrap();
        assert_eq!(r, vec![(0, 3 << 30), (4 << 30, 1 << 30)]);
        assert_eq!(ram_top(&r), 5 << 30);
        assert!(matches!(ram_ranges(0), Err(Error::BadSize(0))));
        assert!(matches!(ram_ranges(4097), Err(Error::BadSize(4097))));
    }

    #[test]
    fn reads_host_total_memory() {
        let total = host_mem_total().expect("/proc/meminfo readable");
        // Every KVM host has more than 64 MiB of RAM.
        assert!(total > 64 << 20, "{total}");
        assert_eq!(total % 1024, 0, "MemTotal is given in KiB");
    }

    #[test]
    fn creates_private_anonymous_regions() {
        let m = create(8 << 20).unwrap();
        assert_eq!(m.num_regions(), 1);
        let r = m.iter().next().unwrap();
        assert_eq!(r.len(), 8 << 20);
        assert_eq!(r.start_addr(), GuestAddress(0));
    }
}
