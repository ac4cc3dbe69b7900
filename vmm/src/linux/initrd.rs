//! Placing the initrd: as high as possible below `initrd_addr_max` and the
//! top of RAM below 4 GiB, page aligned, above the kernel.

use std::fs::File;
use std::path::Path;

use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::e820::{ram_below, E820Entry};
use super::layout::MMIO_HOLE_START;

const PAGE_SIZE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open initrd {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("initrd of {size} bytes does not fit in RAM between {low:#x} and {high:#x}")]
    NoRoom { size: u64, low: u64, high: u64 },
    #[error("cannot copy the initrd into guest memory: {0}")]
    Copy(vm_memory::GuestMemoryError),
}

/// The highest page-aligned address where `size` bytes fit in one RAM
/// entry of `map`, ending at or below `addr_max + 1` and the MMIO hole, and
/// starting at or above `low` (the kernel's end).
pub fn place(map: &[E820Entry], size: u64, addr_max: u64, low: u64) -> Result<u64, Error> {
    let limit = addr_max.saturating_add(1).min(MMIO_HOLE_START);
    let no_room = Error::NoRoom {
        size,
        low,
        high: limit,
    };
    for (start, end) in ram_below(map, limit) {
        let Some(addr) = end.checked_sub(size).map(|a| a & !(PAGE_SIZE - 1)) else {
            continue;
        };
        if addr >= start && addr >= low {
            return Ok(addr);
        }
    }
    Err(no_room)
}

/// Loads the initrd file into guest memory; returns (address, size).
pub fn load(
    mem: &GuestMemoryMmap,
    map: &[E820Entry],
    path: &Path,
    addr_max: u64,
    low: u64,
) -> Result<(GuestAddress, u64), Error> {
    let open_err = |source| Error::Open {
        path: path.display().to_string(),
        source,
    };
    let mut file = File::open(path).map_err(open_err)?;
    let size = file.metadata().map_err(open_err)?.len();
    let addr = GuestAddress(place(map, size, addr_max, low)?);
    mem.read_exact_volatile_from(addr, &mut file, size as usize)
        .map_err(Error::Copy)?;
    Ok((addr, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::e820;
    use crate::linux::layout::HIMEM_START;

    #[test]
    fn placed_high_and_aligned() {
        let map = e820::build(&[(GuestAddress(0), 512 << 20)]).unwrap();
        let a = place(&map, 10_000, 0x7fff_ffff, 16 << 20).unwrap();
        assert_eq!(a % PAGE_SIZE, 0);
        assert!(a + 10_000 <= 512 << 20);
        assert!((512 << 20) - a < 10_000 + PAGE_SIZE);
    }

    #[test]
    fn respects_initrd_addr_max_and_hole() {
        let map =
            e820::build(&[(GuestAddress(0), 3 << 30), (GuestAddress(4 << 30), 4 << 30)]).unwrap();
        let a = place(&map, 1 << 20, 0x37ff_ffff, HIMEM_START).unwrap();
        assert_eq!(a, 0x3800_0000 - (1 << 20));
        let a = place(&map, 1 << 20, u64::MAX, HIMEM_START).unwrap();
        assert_eq!(a, MMIO_HOLE_START - (1 << 20), "never above 4 GiB");
    }

    #[test]
    fn too_big_or_below_kernel() {
        let map = e820::build(&[(GuestAddress(0), 64 << 20)]).unwrap();
        assert!(matches!(
            place(&map, 128 << 20, u64::MAX, 0),
            Err(Error::NoRoom { .. })
        ));
        assert!(matches!(
            place(&map, 8 << 20, u64::MAX, 60 << 20),
            Err(Error::NoRoom { .. })
        ));
        assert!(place(&map, 4 << 20, u64::MAX, 60 << 20).is_ok());
    }

    #[test]
    fn loads_file_contents() {
        let map = e820::build(&[(GuestAddress(0), 8 << 20)]).unwrap();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        let tmp = vmm_sys_util::tempfile::TempFile::new().unwrap();
        std::fs::write(tmp.as_path(), b"initrd-bytes").unwrap();
        let (addr, size) = load(&mem, &map, tmp.as_path(), u64::MAX, HIMEM_START).unwrap();
        assert_eq!(size, 12);
        let mut buf = [0u8; 12];
        mem.read_slice(&mut buf, addr).unwrap();
        assert_eq!(&buf, b"initrd-bytes");
    }
}
