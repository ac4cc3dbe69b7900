//! Identity page tables built by the VMM: 2 MiB pages over guest RAM, with
//! the user bit so that CPL3 workload code can touch all of it.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

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
    let flags = PRESENT | WRITABLE | if user { USER } else { 0 };
    let gibs = top.div_ceil(GIB).max(1);
    if gibs > 512 || base + (2 + gibs) * 4096 > limit {
        return Err(Error::TooMuchMemory(gibs));
    }
    let pml4 = base;
    let pdpt = base + 4096;
    let mut out = vec![(pml4, pdpt | flags)];
    for g in 0..gibs {
        let pd = base + (2 + g) * 4096;
        out.push((pdpt + g * 8, pd | flags));
        let first = g * GIB;
        let pages = ((top - first).min(GIB)).div_ceil(MIB2);
        for i in 0..pages {
            out.push((pd + i * 8, (first + i * MIB2) | flags | HUGE));
        }
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
    for (addr, val) in identity_map(base, limit, top, user)? {
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
        Some(((l2 & !0x1f_ffff & !(1 << 63)) + (va & 0x1f_ffff), l2 & USER != 0))
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
    fn refuses_more_than_the_area_holds() {
        assert!(matches!(
            identity_map(0x10000, 0x13000, 2 * GIB, true),
            Err(Error::TooMuchMemory(2))
        ));
        assert!(identity_map(0x10000, 0x13000, GIB, true).is_ok());
    }
}
