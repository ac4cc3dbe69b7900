//! The e820 memory map handed to Linux in the zero page.
//!
//! Built from the RAM ranges the VMM mapped: RAM minus the legacy windows
//! below 1 MiB, plus reserved entries for those windows, the ACPI tables
//! and the MMIO hole, so the kernel never allocates device or firmware
//! addresses.

use vm_memory::GuestAddress;

use super::layout::{
    ACPI_END, ACPI_START, EBDA_START, HIMEM_START, MMIO_HOLE_END, MMIO_HOLE_START,
};

/// Maximum entries in the zero page's e820 table.
pub const E820_MAX: usize = 128;

/// e820 range types (ACPI spec, "Address Range Types").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum E820Type {
    Ram = 1,
    Reserved = 2,
    Acpi = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: E820Type,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("RAM range {0:#x}+{1:#x} is empty or wraps")]
    BadRange(u64, u64),
    #[error("RAM ranges overlap at {0:#x}")]
    Overlap(u64),
    #[error(
        "RAM range {0:#x}+{1:#x} overlaps the MMIO hole [{MMIO_HOLE_START:#x}, {MMIO_HOLE_END:#x})"
    )]
    InMmioHole(u64, u64),
    #[error("RAM must cover [0, {HIMEM_START:#x}) for the boot structures and ACPI tables")]
    NoLowMemory,
    #[error("the e820 map needs {0} entries, more than {E820_MAX}")]
    TooManyEntries(usize),
}

/// Builds the e820 map for `ram` (guest address, length) ranges.
pub fn build(ram: &[(GuestAddress, u64)]) -> Result<Vec<E820Entry>, Error> {
    let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(ram.len());
    for &(start, len) in ram {
        let end = start
            .0
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(Error::BadRange(start.0, len))?;
        if start.0 < MMIO_HOLE_END && end > MMIO_HOLE_START {
            return Err(Error::InMmioHole(start.0, len));
        }
        ranges.push((start.0, end));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::Overlap(w[1].0));
        }
    }
    if !covers(&ranges, 0, HIMEM_START) {
        return Err(Error::NoLowMemory);
    }

    let reserved = [
        (EBDA_START, ACPI_START, E820Type::Reserved),
        (ACPI_START, ACPI_END, E820Type::Acpi),
    ];
    let mut map = Vec::new();
    for &(start, end) in &ranges {
        // RAM minus the reserved windows below 1 MiB.
        let mut cur = start;
        for &(rs, re, _) in &reserved {
            if re <= cur || rs >= end {
                continue;
            }
            if rs > cur {
                push(&mut map, cur, rs.min(end), E820Type::Ram);
            }
            cur = cur.max(re);
        }
        if cur < end {
            push(&mut map, cur, end, E820Type::Ram);
        }
    }
    for &(rs, re, kind) in &reserved {
        push(&mut map, rs, re, kind);
    }
    push(&mut map, MMIO_HOLE_START, MMIO_HOLE_END, E820Type::Reserved);
    map.sort_unstable_by_key(|e| e.addr);
    merge_adjacent(&mut map);
    if map.len() > E820_MAX {
        return Err(Error::TooManyEntries(map.len()));
    }
    Ok(map)
}

fn push(map: &mut Vec<E820Entry>, start: u64, end: u64, kind: E820Type) {
    if end > start {
        map.push(E820Entry {
            addr: start,
            size: end - start,
            kind,
        });
    }
}

fn merge_adjacent(map: &mut Vec<E820Entry>) {
    let mut out: Vec<E820Entry> = Vec::with_capacity(map.len());
    for e in map.drain(..) {
        match out.last_mut() {
            Some(l) if l.kind == e.kind && l.addr + l.size == e.addr => l.size += e.size,
            _ => out.push(e),
        }
    }
    *map = out;
}

/// Whether sorted, non-overlapping `ranges` cover [start, end) entirely.
fn covers(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    let mut cur = start;
    for &(s, e) in ranges {
        if s > cur {
            break;
        }
        cur = cur.max(e);
        if cur >= end {
            return true;
        }
    }
    cur >= end
}

/// The RAM entries that start below `limit`, highest first, clipped to
/// `limit` (used to place the initrd as high as allowed).
pub fn ram_below(map: &[E820Entry], limit: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    map.iter()
        .rev()
        .filter(move |e| e.kind == E820Type::Ram && e.addr < limit)
        .map(move |e| (e.addr, (e.addr + e.size).min(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn e(addr: u64, end: u64, kind: E820Type) -> E820Entry {
        E820Entry {
            addr,
            size: end - addr,
            kind,
        }
    }

    #[test]
    fn small_guest() {
        let map = build(&[(GuestAddress(0), 512 << 20)]).unwrap();
        assert_eq!(
            map,
            vec![
                e(0, EBDA_START, E820Type::Ram),
                e(EBDA_START, ACPI_START, E820Type::Reserved),
                e(ACPI_START, ACPI_END, E820Type::Acpi),
                e(HIMEM_START, 512 << 20, E820Type::Ram),
                e(MMIO_HOLE_START, MMIO_HOLE_END, E820Type::Reserved),
            ]
        );
    }

    #[test]
    fn guest_split_around_the_hole() {
        let map = build(&[(GuestAddress(4 * GIB), 2 * GIB), (GuestAddress(0), 3 * GIB)]).unwrap();
        assert_eq!(map[3], e(HIMEM_START, 3 * GIB, E820Type::Ram));
        assert_eq!(map[4], e(3 * GIB, 4 * GIB, E820Type::Reserved));
        assert_eq!(map[5], e(4 * GIB, 6 * GIB, E820Type::Ram));
        assert_eq!(map.len(), 6);
        // Sorted and non-overlapping.
        for w in map.windows(2) {
            assert!(w[0].addr + w[0].size <= w[1].addr);
        }
    }

    #[test]
    fn adjacent_ram_ranges_merge() {
        let map = build(&[(GuestAddress(0), GIB), (GuestAddress(GIB), GIB)]).unwrap();
        assert_eq!(map[3], e(HIMEM_START, 2 * GIB, E820Type::Ram));
    }

    #[test]
    fn invalid_ram_ranges() {
        assert_eq!(build(&[(GuestAddress(0), 0)]), Err(Error::BadRange(0, 0)));
        assert_eq!(
            build(&[(GuestAddress(u64::MAX), 2)]),
            Err(Error::BadRange(u64::MAX, 2))
        );
        assert_eq!(
            build(&[(GuestAddress(0), 4 * GIB)]),
            Err(Error::InMmioHole(0, 4 * GIB))
        );
        assert_eq!(
            build(&[(GuestAddress(0), GIB), (GuestAddress(GIB - 4096), 8192)]),
            Err(Error::Overlap(GIB - 4096))
        );
        assert_eq!(
            build(&[(GuestAddress(0x1000), GIB)]),
            Err(Error::NoLowMemory)
        );
        assert_eq!(
            build(&[(GuestAddress(0), 0x8_0000)]),
            Err(Error::NoLowMemory)
        );
        let many: Vec<_> = (0..200u64)
            .map(|i| (GuestAddress(4 * GIB + i * 2 * 4096), 4096))
            .collect();
        let mut ram = vec![(GuestAddress(0), GIB)];
        ram.extend(many);
        assert!(matches!(build(&ram), Err(Error::TooManyEntries(_))));
    }

    #[test]
    fn ram_below_limit() {
        let map = build(&[(GuestAddress(0), 3 * GIB), (GuestAddress(4 * GIB), GIB)]).unwrap();
        let top: Vec<_> = ram_below(&map, 0x8000_0000).collect();
        assert_eq!(top[0], (HIMEM_START, 0x8000_0000));
        assert_eq!(top[1], (0, EBDA_START));
    }
}
