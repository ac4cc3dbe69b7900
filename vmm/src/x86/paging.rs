//! Identity page tables built by the VMM: 2 MiB pages over guest RAM, with
//! the user bit so that CPL3 workload code can touch all of it, plus any
//! device windows (virtio-mmio) the guest accesses directly. The mapping
//! attributes are write-back: under KVM an access to a guest-physical
//! address without a memslot exits as MMIO whatever the guest's cache type.

use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::Error;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const GIB: u64 = 1 << 30;
const MIB2: u64 = 2 << 20;

/// The entries of an identity map of `[0, top)` with 2 MiB pages, as
/// (guest address, value) pairs: PML4 at `base`, PDPT at `base + 4 KiB`,
/// then one PD per GiB.
pub fn identity_map(base: u64, limit: u64, top: u64, user: bool) -> Result<Vec<(u64, u64)>, Error> {
    identity_map_with(base, limit, top, &[], user)
}

/// As [`identity_map`], and also maps each `(start, len)` of `windows`
/// (rounded out to 2 MiB pages). The PD of GiB `g` is at `base + (2 + g) *
/// 4 KiB`, so a window above RAM (the virtio-mmio window at 3.25 GiB) costs
/// one more PD page, not the ones in between.
pub fn identity_map_with(
    base: u64,
    limit: u64,
    top: u64,
    windows: &[(u64, u64)],
    user: bool,
) -> Result<Vec<(u64, u64)>, Error> {
    let flags = PRESENT | WRITABLE | if user { USER } else { 0 };
    // Every 2 MiB page to map, in order, without repeats.
    let mut huge: Vec<u64> = (0..top.div_ceil(MIB2).max(1)).collect();
    for &(start, len) in windows {
        let end = start.saturating_add(len.max(1));
        huge.extend(start / MIB2..end.div_ceil(MIB2));
    }
    huge.sort_unstable();
    huge.dedup();
    let pages_per_gib = GIB / MIB2;
    let last_gib = huge.last().map_or(0, |p| p / pages_per_gib);
    if last_gib >= 512 || base + (3 + last_gib) * 4096 > limit {
        return Err(Error::TooMuchMemory(last_gib + 1));
    }
    let pml4 = base;
    let pdpt = base + 4096;
    let mut out = vec![(pml4, pdpt | flags)];
    let mut mapped_gib = None;
    for p in huge {
        let g = p / pages_per_gib;
        let pd = base + (2 + g) * 4096;
        if mapped_gib != Some(g) {
            out.push((pdpt + g * 8, pd | flags));
            mapped_gib = Some(g);
        }
        out.push((pd + (p % pages_per_gib) * 8, (p * MIB2) | flags | HUGE));
    }
    Ok(out)
}

/// Writes the identity map into guest memory; returns the CR3 value.
pub fn write_identity_map(
    mem: &GuestMemoryMmap,
    base: u64,
    limit: u64,
    top: u64,
    user: bool,
) -> Result<u64, Error> {
    write_identity_map_with(mem, base, limit, top, &[], user)
}

/// Writes [`identity_map_with`] into guest memory; returns the CR3 value.
/// The PD pages of GiBs without a mapping are not written: they may hold
/// anything, as nothing points to them.
pub fn write_identity_map_with(
    mem: &GuestMemoryMmap,
    base: u64,
    limit: u64,
    top: u64,
    windows: &[(u64, u64)],
    user: bool,
) -> Result<u64, Error> {
    for (addr, val) in identity_map_with(base, limit, top, windows, user)? {
        mem.write_obj(val, GuestAddress(addr))
            .map_err(|source| Error::GuestMemory {
                what: "page tables",
                source,
            })?;
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the generated tables like the MMU would.
    fn translate(entries: &[(u64, u64)], cr3: u64, va: u64) -> Option<(u64, bool)> {
        let get = |a: u64| entries.iter().find(|(x, _)| *x == a).map(|(_, v)| *v);
        let l4 = get(cr3 + ((va >> 39) & 511) * 8)?;
        let l3 = get((l4 & !0xfff) + ((va >> 30) & 511) * 8)?;
        let l2 = get((l3 & !0xfff) + ((va >> 21) & 511) * 8)?;
        assert_ne!(l2 & HUGE, 0);
        Some((
            (l2 & !0x1f_ffff & !(1 << 63)) + (va & 0x1f_ffff),
            l2 & USER != 0,
        ))
    }

    #[test]
    fn maps_identity_with_user_bit() {
        let top = 3 * GIB + 5 * MIB2 + 4096;
        let e = identity_map(0x10000, 0x80000, top, true).unwrap();
        for va in [0, 0x1234, 0x20_0000, GIB + 77, 3 * GIB + 5 * MIB2 + 100] {
            assert_eq!(translate(&e, 0x10000, va), Some((va, true)));
        }
        // Past the last (partial) 2 MiB page nothing is mapped.
        assert_eq!(translate(&e, 0x10000, 3 * GIB + 7 * MIB2), None);
        let k = identity_map(0x10000, 0x80000, GIB, false).unwrap();
        assert_eq!(translate(&k, 0x10000, 0x5000), Some((0x5000, false)));
    }

    #[test]
    fn maps_device_windows_beside_ram() {
        let mmio = 0xd000_0000;
        let e = identity_map_with(0x10000, 0x80000, 64 << 20, &[(mmio, 0x4000)], true).unwrap();
        // RAM and the window are mapped, with the user bit.
        assert_eq!(translate(&e, 0x10000, 0x30_0000), Some((0x30_0000, true)));
        assert_eq!(
            translate(&e, 0x10000, mmio + 0x70),
            Some((mmio + 0x70, true))
        );
        assert_eq!(
            translate(&e, 0x10000, mmio + 0x3ffc),
            Some((mmio + 0x3ffc, true))
        );
        // Nothing between RAM and the window, nor past the window's 2 MiB page.
        assert_eq!(translate(&e, 0x10000, 64 << 20), None);
        assert_eq!(translate(&e, 0x10000, GIB + 4096), None);
        assert_eq!(translate(&e, 0x10000, mmio + MIB2), None);
        // GiB 3's PD sits at its fixed place: one more page, not three.
        assert!(e.iter().all(|&(a, _)| a < 0x10000 + 6 * 4096), "{e:x?}");
        // Without windows it is the plain RAM map.
        assert_eq!(
            identity_map_with(0x10000, 0x80000, GIB, &[], true).unwrap(),
            identity_map(0x10000, 0x80000, GIB, true).unwrap()
        );
        // A window inside RAM adds nothing.
        assert_eq!(
            identity_map_with(0x10000, 0x80000, 2 * GIB, &[(0x1000, 4096)], true).unwrap(),
            identity_map(0x10000, 0x80000, 2 * GIB, true).unwrap()
        );
        // A window beyond what the table area can hold is refused.
        assert!(matches!(
            identity_map_with(0x10000, 0x13000, GIB, &[(mmio, 4096)], true),
            Err(Error::TooMuchMemory(4))
        ));
    }

    #[test]
    fn refuses_more_than_the_area_holds() {
        assert!(matches!(
            identity_map(0x10000, 0x13000, 2 * GIB, true),
            Err(Error::TooMuchMemory(2))
        ));
        assert!(identity_map(0x10000, 0x13000, GIB, true).is_ok());
    }
}
