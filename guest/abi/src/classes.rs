//! Which content every logical page of a workload guest holds: its region
//! (shared or private), its class (zero, unique, duplicate of which page),
//! the churn set, and the record table. Pure functions of [`WorkloadParams`],
//! shared by guest and host so that the host can predict the guest's memory
//! exactly.
//!
//! Assignment: each region (shared pages `[0, S)`, private pages
//! `[S, S + P)`) is cut into blocks of [`BLOCK`] pages by region-local index.
//! In a block, with `z = zero_permille`, `d = dup_permille`:
//! positions `[0, z)` are zero pages, `[z, z + d)` duplicate the unique pages
//! that follow them (`z + d + (pos - z) % u`, `u` = unique pages of the
//! block), the rest are unique. Runs, not scatter: real zero and duplicate
//! pages come in runs, and runs let the dedup engine map them with few VMAs.
//! A short last block keeps the same positions; if it has no unique page its
//! would-be duplicates are unique.

use crate::disk::{image_page_base, MAX_DISKS};
use crate::generator::{kind, page_base};
use crate::placement::{Placement, PlacementError, Scatter};
use crate::{phase, WorkloadParams, PAGE_SIZE, PARAMS_MAGIC};

/// Pages per class block (the unit of the per-mille fractions).
pub const BLOCK: u64 = 1000;

/// Version entries per record page (after a 16-byte header).
pub const RECORDS_PER_PAGE: u64 = (PAGE_SIZE - 16) / 4;

/// Magic of word 0 of a record page (xor `private_seed`).
pub const RECORD_MAGIC: u64 = 0x7265_636f_7264_7321;

/// The region of a logical page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// `[0, shared_pages)`: same content in VMs with the same `seed`.
    Shared,
    /// `[shared_pages, shared_pages + private_pages)`: per VM, churned.
    Private,
}

/// The class of a logical page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageClass {
    /// All zero.
    Zero,
    /// Content of its own.
    Unique,
    /// Same content as logical page `of` (a unique page of the same block)
    /// while both have the same version.
    Dup { of: u64 },
}

/// The content of a page at a version: what the guest writes and checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Content {
    /// All-zero page.
    Zero,
    /// The generator's sequence with this base (see `generator`).
    Pattern(u64),
}

/// Region and class of logical page `i` (`i < params.total_pages()`).
pub fn page_class(p: &WorkloadParams, i: u64) -> (Region, PageClass) {
    let (region, start, len) = region_of(p, i);
    let local = i - start;
    let block_start = local - local % BLOCK;
    let pos = local % BLOCK;
    let b = (len - block_start).min(BLOCK);
    let z = p.zero_permille as u64;
    let d = p.dup_permille as u64;
    let class = if pos < z {
        PageClass::Zero
    } else if pos < z + d && b > z + d {
        let u = b - z - d;
        PageClass::Dup {
            of: start + block_start + z + d + (pos - z) % u,
        }
    } else {
        PageClass::Unique
    };
    (region, class)
}

/// Region of page `i`, the region's first logical page and its length.
fn region_of(p: &WorkloadParams, i: u64) -> (Region, u64, u64) {
    if i < p.shared_pages {
        (Region::Shared, 0, p.shared_pages)
    } else {
        (Region::Private, p.shared_pages, p.private_pages)
    }
}

/// Content of logical page `i` when its record says `version`. Version 0
/// means never written: the page still reads as zero.
pub fn page_content(p: &WorkloadParams, i: u64, version: u32) -> Content {
    if version == 0 {
        return Content::Zero;
    }
    let (region, class) = page_class(p, i);
    let source = match class {
        PageClass::Zero => return Content::Zero,
        PageClass::Unique => i,
        PageClass::Dup { of } => of,
    };
    let (seed, k, start) = match region {
        Region::Shared => (p.seed, kind::SHARED, 0),
        Region::Private => (p.private_seed, kind::PRIVATE, p.shared_pages),
    };
    Content::Pattern(page_base(seed, k, source - start, version))
}

/// Class counts of one VM's logical pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    pub zero: u64,
    pub unique: u64,
    pub dup: u64,
}

/// Counts the classes of every logical page (O(pages); no allocation).
pub fn class_counts(p: &WorkloadParams) -> ClassCounts {
    let mut c = ClassCounts::default();
    for i in 0..p.total_pages() {
        match page_class(p, i).1 {
            PageClass::Zero => c.zero += 1,
            PageClass::Unique => c.unique += 1,
            PageClass::Dup { .. } => c.dup += 1,
        }
    }
    c
}

/// First block position of the churn set: the tail `churn_permille` of each
/// private block, minus zero pages (churn never makes a zero page non-zero).
fn churn_first_pos(p: &WorkloadParams) -> u64 {
    (BLOCK - (p.churn_permille as u64).min(BLOCK)).max(p.zero_permille as u64)
}

/// Number of private pages in the churn set.
pub fn churn_len(p: &WorkloadParams) -> u64 {
    let first = churn_first_pos(p);
    let full = p.private_pages / BLOCK;
    full * (BLOCK - first.min(BLOCK)) + (p.private_pages % BLOCK).saturating_sub(first)
}

/// Logical page index of member `k` (`k < churn_len`) of the churn set, in
/// increasing index order. The guest churns members round-robin from 0.
pub fn churn_member(p: &WorkloadParams, k: u64) -> u64 {
    let first = churn_first_pos(p);
    let per = BLOCK - first;
    p.shared_pages + (k / per) * BLOCK + first + k % per
}

/// Rank of logical page `i` in the churn set, if it is a member.
pub fn churn_rank(p: &WorkloadParams, i: u64) -> Option<u64> {
    if i < p.shared_pages || i >= p.total_pages() {
        return None;
    }
    let local = i - p.shared_pages;
    let first = churn_first_pos(p);
    let pos = local % BLOCK;
    (pos >= first).then(|| (local / BLOCK) * (BLOCK - first) + pos - first)
}

/// Version of page `i` after FILL (version 1 everywhere) followed by
/// `churn_writes` churn writes in total (over all CHURN phases).
pub fn version_after_churn(p: &WorkloadParams, i: u64, churn_writes: u64) -> u32 {
    let len = churn_len(p);
    match churn_rank(p, i) {
        Some(r) if len > 0 => {
            let bump = churn_writes / len + u64::from(r < churn_writes % len);
            1 + bump as u32
        }
        _ => 1,
    }
}

/// Invalid parameters (the guest exits with `exit_code::BAD_PARAMS`; the host
/// should refuse them before starting the VM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamsError {
    BadMagic(u64),
    /// A data-area bound is not page aligned or an area is reversed.
    BadArea {
        start: u64,
        end: u64,
    },
    /// The low data area overlaps the image/stack/tables below it.
    AreaTooLow(u64),
    /// zero/dup/churn per-mille out of range, or duplicates with no unique page.
    BadPermille,
    /// Records plus pages need more than the data areas hold.
    TooManyPages {
        needed: u64,
        available: u64,
    },
    /// Unknown opcode in `program`.
    BadOpcode {
        slot: usize,
        op: u32,
    },
    /// Inconsistent disk fields (count, MMIO addresses, DISK_READ without a
    /// disk or reading more than the disk area holds).
    BadDisk(&'static str),
    /// Invalid placement fields.
    BadPlacement(PlacementError),
}

impl core::fmt::Display for ParamsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::BadMagic(m) => write!(f, "bad params magic {m:#x}"),
            Self::BadArea { start, end } => {
                write!(f, "data area {start:#x}..{end:#x} is unaligned or reversed")
            }
            Self::AreaTooLow(s) => write!(f, "data area starts at {s:#x}, below the guest image"),
            Self::BadPermille => write!(f, "zero/dup/churn per-mille out of range"),
            Self::TooManyPages { needed, available } => {
                write!(
                    f,
                    "workload needs {needed} pages, data areas hold {available}"
                )
            }
            Self::BadOpcode { slot, op } => write!(f, "unknown phase opcode {op} in slot {slot}"),
            Self::BadDisk(why) => write!(f, "disk parameters: {why}"),
            Self::BadPlacement(e) => write!(f, "placement: {e}"),
        }
    }
}

/// Where records, logical pages and the disk area live in guest-physical
/// memory. Data slots are numbered over the low area then the high area;
/// record pages take the first slots. The slots after them hold the data
/// area's *items*: logical page `i` is item `i`, disk-area page `k` is item
/// `pages + k`, the remaining items are free slots. Item `j` is in slot
/// `record_pages + scatter.offset(j)`: with [`Placement::Linear`] that is
/// `record_pages + j` (logical page `i` in slot `record_pages + i`, disk
/// page `k` in slot `record_pages + pages + k`); with
/// [`Placement::Scattered`] extents of items go to slots a per-VM
/// permutation picks (see [`crate::placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataLayout {
    pub low_start: u64,
    pub low_pages: u64,
    pub high_start: u64,
    pub high_pages: u64,
    pub record_pages: u64,
    pub pages: u64,
    /// Pages of the disk area (`WorkloadParams::disk_pages`).
    pub disk_pages: u64,
    /// The placement of the items.
    pub placement: Placement,
    /// Item <-> slot offset map over every slot after the record pages.
    pub scatter: Scatter,
}

/// What a data slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotUse {
    /// Record page `k`.
    Record(u64),
    /// Logical page `i`.
    Page(u64),
    /// Disk-area page `k`.
    Disk(u64),
    /// Nothing: never written, reads as zero.
    Free,
}

/// Lowest allowed data address: above the image area (the image is small;
/// 2 MiB of room).
pub const MIN_DATA_START: u64 = crate::layout::IMAGE_BASE + 0x200000;

impl DataLayout {
    /// Validates `p` and computes the layout.
    pub fn new(p: &WorkloadParams) -> Result<Self, ParamsError> {
        if p.magic != PARAMS_MAGIC {
            return Err(ParamsError::BadMagic(p.magic));
        }
        let (z, d, c) = (
            p.zero_permille as u64,
            p.dup_permille as u64,
            p.churn_permille as u64,
        );
        if z + d > BLOCK || c > BLOCK || (d > 0 && z + d >= BLOCK) {
            return Err(ParamsError::BadPermille);
        }
        for (slot, &op) in p.program.iter().enumerate() {
            if op > phase::LAST {
                return Err(ParamsError::BadOpcode { slot, op });
            }
        }
        let area = |start: u64, end: u64| {
            if start % PAGE_SIZE != 0 || end % PAGE_SIZE != 0 || end < start {
                Err(ParamsError::BadArea { start, end })
            } else {
                Ok((end - start) / PAGE_SIZE)
            }
        };
        let low_pages = area(p.data_start, p.data_end)?;
        if low_pages > 0 && p.data_start < MIN_DATA_START {
            return Err(ParamsError::AreaTooLow(p.data_start));
        }
        let high_pages = area(p.high_start, p.high_end)?;
        if high_pages > 0 && p.high_start < p.data_end {
            return Err(ParamsError::BadArea {
                start: p.high_start,
                end: p.high_end,
            });
        }
        let in_data =
            |a: u64| (a >= p.data_start && a < p.data_end) || (a >= p.high_start && a < p.high_end);
        if p.disk_count > MAX_DISKS as u64 {
            return Err(ParamsError::BadDisk("more disks than disk_mmio holds"));
        }
        for (i, &a) in p.disk_mmio.iter().enumerate() {
            if (i as u64) < p.disk_count {
                if a == 0 || a % PAGE_SIZE != 0 || a < MIN_DATA_START || in_data(a) {
                    return Err(ParamsError::BadDisk(
                        "a disk's MMIO window is unaligned or inside RAM",
                    ));
                }
            } else if a != 0 {
                return Err(ParamsError::BadDisk(
                    "MMIO address for a disk past disk_count",
                ));
            }
        }
        let reads = p
            .phases()
            .any(|(_, op, _)| op == phase::DISK_READ || op == phase::BUILD);
        if reads && (p.disk_count == 0 || p.disk_pages == 0) {
            return Err(ParamsError::BadDisk(
                "disk-read and build need a disk and a non-empty disk area",
            ));
        }
        if p.disk_read_pages() > p.disk_pages {
            return Err(ParamsError::BadDisk(
                "disk-read reads more pages than the disk area holds",
            ));
        }
        let pages = p.total_pages();
        let record_pages = pages.div_ceil(RECORDS_PER_PAGE);
        let needed = record_pages
            .saturating_add(pages)
            .saturating_add(p.disk_pages);
        let available = low_pages + high_pages;
        if needed > available {
            return Err(ParamsError::TooManyPages { needed, available });
        }
        let placement = Placement::from_params(p).map_err(ParamsError::BadPlacement)?;
        Ok(Self {
            low_start: p.data_start,
            low_pages,
            high_start: p.high_start,
            high_pages,
            record_pages,
            pages,
            disk_pages: p.disk_pages,
            placement,
            scatter: placement.scatter(available - record_pages),
        })
    }

    /// Data slots in all (record pages, items).
    pub fn slots(&self) -> u64 {
        self.low_pages + self.high_pages
    }

    /// Data slot of item `j` (`j < scatter.items()`).
    pub fn item_slot(&self, j: u64) -> u64 {
        self.record_pages + self.scatter.offset(j)
    }

    /// Data slot of logical page `i`.
    pub fn page_slot(&self, i: u64) -> u64 {
        self.item_slot(i)
    }

    /// What data slot `slot` (`< slots()`) holds.
    pub fn slot_use(&self, slot: u64) -> SlotUse {
        if slot < self.record_pages {
            return SlotUse::Record(slot);
        }
        let j = self.scatter.item(slot - self.record_pages);
        if j < self.pages {
            SlotUse::Page(j)
        } else if j < self.pages + self.disk_pages {
            SlotUse::Disk(j - self.pages)
        } else {
            SlotUse::Free
        }
    }

    /// Data slot of guest-physical address `gpa`, if it is in a data area.
    pub fn gpa_slot(&self, gpa: u64) -> Option<u64> {
        let low_end = self.low_start + self.low_pages * PAGE_SIZE;
        let high_end = self.high_start + self.high_pages * PAGE_SIZE;
        if gpa >= self.low_start && gpa < low_end {
            Some((gpa - self.low_start) / PAGE_SIZE)
        } else if gpa >= self.high_start && gpa < high_end {
            Some(self.low_pages + (gpa - self.high_start) / PAGE_SIZE)
        } else {
            None
        }
    }

    /// Guest-physical address of data slot `slot`.
    pub fn slot_gpa(&self, slot: u64) -> u64 {
        if slot < self.low_pages {
            self.low_start + slot * PAGE_SIZE
        } else {
            self.high_start + (slot - self.low_pages) * PAGE_SIZE
        }
    }

    /// Guest-physical address of logical page `i`.
    pub fn page_gpa(&self, i: u64) -> u64 {
        self.slot_gpa(self.page_slot(i))
    }

    /// Guest-physical address of the u32 version record of logical page `i`.
    pub fn record_gpa(&self, i: u64) -> u64 {
        self.slot_gpa(i / RECORDS_PER_PAGE) + 16 + (i % RECORDS_PER_PAGE) * 4
    }

    /// Guest-physical address of record page `k`.
    pub fn record_page_gpa(&self, k: u64) -> u64 {
        self.slot_gpa(k)
    }

    /// Data slot of disk-area page `k`.
    pub fn disk_slot(&self, k: u64) -> u64 {
        self.item_slot(self.pages + k)
    }

    /// Guest-physical address of disk-area page `k` (where disk page `k`
    /// is read to).
    pub fn disk_page_gpa(&self, k: u64) -> u64 {
        self.slot_gpa(self.disk_slot(k))
    }

    /// Disk-area pages that follow page `k` contiguously in guest-physical
    /// memory (`k` included, up to the end of the disk area): the runs one
    /// virtio-blk data descriptor can cover. Scattered, a run ends at the
    /// end of its extent.
    pub fn disk_run(&self, k: u64) -> u64 {
        let slot = self.disk_slot(k);
        let left = (self.disk_pages - k).min(self.scatter.run(self.pages + k));
        if slot < self.low_pages {
            left.min(self.low_pages - slot)
        } else {
            left
        }
    }
}

/// Content of disk-area page `k` once the program's DISK_READ phases ran:
/// `None` when it is disk data of unknown content (`disk_seed == 0`, or a
/// BUILD's area: page cache, objects, heap); zero
/// when no DISK_READ reaches it (never written).
pub fn disk_page_content(p: &WorkloadParams, k: u64) -> Option<Content> {
    let builds = p.phases().any(|(_, op, _)| op == phase::BUILD);
    if k >= p.disk_read_pages() {
        Some(Content::Zero)
    } else if p.disk_seed == 0 || builds {
        None
    } else {
        Some(Content::Pattern(image_page_base(p.disk_seed, k)))
    }
}

/// Content of data slot `slot` of layout `l` (of `p`) after FILL, the
/// program's DISK_READ phases and `churn_writes` churn writes in total:
/// what the guest holds at that slot's guest-physical address, whatever the
/// placement. `None` for a record page (its header and version table are
/// not a generated page; see [`record_header`]) and for a disk-area page of
/// unknown content (`disk_seed == 0`).
pub fn slot_content(
    p: &WorkloadParams,
    l: &DataLayout,
    slot: u64,
    churn_writes: u64,
) -> Option<Content> {
    match l.slot_use(slot) {
        SlotUse::Record(_) => None,
        SlotUse::Page(i) => Some(page_content(p, i, version_after_churn(p, i, churn_writes))),
        SlotUse::Disk(k) => disk_page_content(p, k),
        SlotUse::Free => Some(Content::Zero),
    }
}

/// The 16-byte header of record page `k`: makes every record page unique
/// to its VM (given distinct `private_seed` or `vm_index`), so that record
/// pages never take part in dedup and the data pages' expectations are exact.
pub fn record_header(p: &WorkloadParams, k: u64) -> [u64; 2] {
    [RECORD_MAGIC ^ p.private_seed, (p.vm_index << 32) ^ k]
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    fn params(shared: u64, private: u64, z: u32, d: u32, c: u32) -> WorkloadParams {
        WorkloadParams {
            magic: PARAMS_MAGIC,
            seed: 11,
            private_seed: 22,
            shared_pages: shared,
            private_pages: private,
            zero_permille: z,
            dup_permille: d,
            churn_permille: c,
            data_start: 0x40_0000,
            data_end: 0x40_0000 + (shared + private + 64) * PAGE_SIZE,
            ..WorkloadParams::default()
        }
    }

    /// Found by the workload_mailbox fuzz target: page counts whose sum
    /// overflows u64 panicked in `total_pages` (debug builds) instead of
    /// being refused as more pages than the data areas hold.
    #[test]
    fn page_counts_that_overflow_are_too_many_pages() {
        let mut p = params(10, 10, 0, 0, 0);
        p.shared_pages = u64::MAX;
        p.private_pages = 2;
        assert_eq!(p.total_pages(), u64::MAX);
        assert!(matches!(
            DataLayout::new(&p),
            Err(ParamsError::TooManyPages { .. })
        ));
    }

    #[test]
    fn full_blocks_have_exact_fractions() {
        let p = params(3000, 2000, 100, 50, 0);
        let c = class_counts(&p);
        assert_eq!(
            c,
            ClassCounts {
                zero: 500,
                dup: 250,
                unique: 4250
            }
        );
    }

    #[test]
    fn positions_follow_the_documented_pattern() {
        let p = params(2000, 1000, 100, 50, 0);
        assert_eq!(page_class(&p, 0), (Region::Shared, PageClass::Zero));
        assert_eq!(page_class(&p, 99), (Region::Shared, PageClass::Zero));
        assert_eq!(
            page_class(&p, 100),
            (Region::Shared, PageClass::Dup { of: 150 })
        );
        assert_eq!(
            page_class(&p, 1149),
            (Region::Shared, PageClass::Dup { of: 1199 })
        );
        assert_eq!(page_class(&p, 150), (Region::Shared, PageClass::Unique));
        assert_eq!(page_class(&p, 2000), (Region::Private, PageClass::Zero));
        assert_eq!(
            page_class(&p, 2100),
            (Region::Private, PageClass::Dup { of: 2150 })
        );
    }

    #[test]
    fn short_last_block_wraps_dup_targets_or_drops_dups() {
        // Last shared block has 130 pages: z=100, d=50 > u=... no unique => unique.
        let p = params(1130, 0, 100, 50, 0);
        assert_eq!(page_class(&p, 1100), (Region::Shared, PageClass::Unique));
        // Last block of 160 pages: u = 10, targets wrap within 1150..1160.
        let p = params(1160, 0, 100, 50, 0);
        assert_eq!(
            page_class(&p, 1100),
            (Region::Shared, PageClass::Dup { of: 1150 })
        );
        assert_eq!(
            page_class(&p, 1112),
            (Region::Shared, PageClass::Dup { of: 1152 })
        );
        for i in 0..p.total_pages() {
            if let (_, PageClass::Dup { of }) = page_class(&p, i) {
                assert_eq!(page_class(&p, of).1, PageClass::Unique);
                assert_eq!(page_content(&p, i, 1), page_content(&p, of, 1));
            }
        }
    }

    #[test]
    fn content_depends_on_region_seed_and_version() {
        let p = params(1000, 1000, 0, 0, 0);
        let mut q = p;
        q.private_seed = 99;
        assert_eq!(page_content(&p, 5, 1), page_content(&q, 5, 1));
        assert_ne!(page_content(&p, 1005, 1), page_content(&q, 1005, 1));
        assert_ne!(page_content(&p, 1005, 1), page_content(&p, 1005, 2));
        assert_eq!(page_content(&p, 1005, 0), Content::Zero);
        // Same seeds in both regions still give different contents.
        q.private_seed = q.seed;
        assert_ne!(page_content(&q, 5, 1), page_content(&q, 1005, 1));
    }

    #[test]
    fn churn_set_is_the_tail_of_private_blocks_without_zero_pages() {
        let p = params(1000, 2500, 100, 50, 100);
        assert_eq!(churn_len(&p), 200);
        let p = params(1000, 2950, 100, 50, 100);
        assert_eq!(churn_len(&p), 250);
        for k in 0..churn_len(&p) {
            let i = churn_member(&p, k);
            assert_eq!(churn_rank(&p, i), Some(k));
            assert_ne!(page_class(&p, i).1, PageClass::Zero);
            assert_eq!(page_class(&p, i).0, Region::Private);
        }
        let members = (0..p.total_pages())
            .filter(|&i| churn_rank(&p, i).is_some())
            .count();
        assert_eq!(members as u64, churn_len(&p));
        // churn_permille above the non-zero share is capped at it.
        let p = params(0, 1000, 300, 0, 1000);
        assert_eq!(churn_len(&p), 700);
    }

    #[test]
    fn versions_after_churn_follow_round_robin() {
        let p = params(0, 1000, 0, 0, 10);
        assert_eq!(churn_len(&p), 10);
        let first = churn_member(&p, 0);
        assert_eq!(first, 990);
        assert_eq!(version_after_churn(&p, 990, 0), 1);
        assert_eq!(version_after_churn(&p, 990, 1), 2);
        assert_eq!(version_after_churn(&p, 991, 1), 1);
        assert_eq!(version_after_churn(&p, 991, 25), 4);
        assert_eq!(version_after_churn(&p, 995, 25), 3);
        assert_eq!(version_after_churn(&p, 5, 25), 1);
    }

    #[test]
    fn layout_places_records_then_pages_across_both_areas() {
        let mut p = params(1500, 500, 0, 0, 0);
        p.data_start = 0x40_0000;
        p.data_end = 0x40_0000 + 1000 * PAGE_SIZE;
        p.high_start = 0x1_0000_0000;
        p.high_end = 0x1_0000_0000 + 1100 * PAGE_SIZE;
        let l = DataLayout::new(&p).unwrap();
        assert_eq!(l.record_pages, 2);
        assert_eq!(l.record_page_gpa(1), 0x40_1000);
        assert_eq!(l.page_gpa(0), 0x40_2000);
        assert_eq!(l.page_gpa(997), 0x40_0000 + 999 * PAGE_SIZE);
        assert_eq!(l.page_gpa(998), 0x1_0000_0000);
        assert_eq!(l.record_gpa(0), 0x40_0010);
        assert_eq!(l.record_gpa(RECORDS_PER_PAGE + 1), 0x40_1014);
        p.high_end = 0x1_0000_0000 + 1000 * PAGE_SIZE;
        assert_eq!(
            DataLayout::new(&p),
            Err(ParamsError::TooManyPages {
                needed: 2002,
                available: 2000
            })
        );
    }

    #[test]
    fn layout_rejects_bad_params() {
        let good = params(10, 10, 0, 0, 0);
        assert!(DataLayout::new(&good).is_ok());
        let mut p = good;
        p.magic = 1;
        assert_eq!(DataLayout::new(&p), Err(ParamsError::BadMagic(1)));
        let mut p = good;
        p.zero_permille = 900;
        p.dup_permille = 100;
        assert_eq!(DataLayout::new(&p), Err(ParamsError::BadPermille));
        let mut p = good;
        p.data_start += 8;
        assert!(matches!(
            DataLayout::new(&p),
            Err(ParamsError::BadArea { .. })
        ));
        let mut p = good;
        p.data_start = 0x20_0000;
        assert_eq!(DataLayout::new(&p), Err(ParamsError::AreaTooLow(0x20_0000)));
        let mut p = good;
        p.program[3] = 77;
        assert_eq!(
            DataLayout::new(&p),
            Err(ParamsError::BadOpcode { slot: 3, op: 77 })
        );
    }

    fn disk_params() -> WorkloadParams {
        let mut p = params(100, 100, 0, 0, 0);
        p.disk_count = 1;
        p.disk_mmio[0] = 0xd000_0000;
        p.disk_pages = 50;
        p.disk_seed = 77;
        p.program[0] = phase::FILL;
        p.program[1] = phase::DISK_READ;
        p
    }

    #[test]
    fn disk_area_follows_the_logical_pages_and_may_span_both_areas() {
        let mut p = disk_params();
        p.data_end = p.data_start + (1 + 200 + 20) * PAGE_SIZE;
        p.high_start = 0x1_0000_0000;
        p.high_end = p.high_start + 30 * PAGE_SIZE;
        let l = DataLayout::new(&p).unwrap();
        assert_eq!(l.disk_pages, 50);
        assert_eq!(l.disk_page_gpa(0), l.page_gpa(199) + PAGE_SIZE);
        assert_eq!(l.disk_page_gpa(19), p.data_end - PAGE_SIZE);
        assert_eq!(l.disk_page_gpa(20), p.high_start);
        assert_eq!(l.disk_run(0), 20);
        assert_eq!(l.disk_run(19), 1);
        assert_eq!(l.disk_run(20), 30);
        assert_eq!(l.disk_run(49), 1);
        // One page short: refused.
        p.high_end -= PAGE_SIZE;
        assert_eq!(
            DataLayout::new(&p),
            Err(ParamsError::TooManyPages {
                needed: 251,
                available: 250
            })
        );
    }

    #[test]
    fn disk_fields_are_validated() {
        assert!(DataLayout::new(&disk_params()).is_ok());
        let bad = |f: &dyn Fn(&mut WorkloadParams)| {
            let mut p = disk_params();
            f(&mut p);
            assert!(
                matches!(DataLayout::new(&p), Err(ParamsError::BadDisk(_))),
                "{p:?}"
            );
        };
        bad(&|p| p.disk_count = 0);
        bad(&|p| p.disk_count = MAX_DISKS as u64 + 1);
        bad(&|p| p.disk_mmio[0] = 0xd000_0010);
        bad(&|p| p.disk_mmio[0] = p.data_start);
        bad(&|p| p.disk_mmio[1] = 0xd000_1000);
        bad(&|p| p.disk_pages = 0);
        bad(&|p| p.program_args[1] = 51);
        // Reading part of the area is fine; so is a disk nobody reads.
        let mut p = disk_params();
        p.program_args[1] = 10;
        assert!(DataLayout::new(&p).is_ok());
        assert_eq!(p.disk_read_pages(), 10);
        p.program[1] = phase::VERIFY;
        assert_eq!(p.disk_read_pages(), 0);
        assert!(DataLayout::new(&p).is_ok());
    }

    #[test]
    fn disk_pages_are_image_pages_up_to_the_read_length() {
        let mut p = disk_params();
        p.program_args[1] = 30;
        assert_eq!(
            disk_page_content(&p, 0),
            Some(Content::Pattern(image_page_base(77, 0)))
        );
        assert_eq!(
            disk_page_content(&p, 29),
            Some(Content::Pattern(image_page_base(77, 29)))
        );
        assert_eq!(disk_page_content(&p, 30), Some(Content::Zero));
        p.disk_seed = 0;
        assert_eq!(disk_page_content(&p, 0), None);
        assert_eq!(disk_page_content(&p, 30), Some(Content::Zero));
    }

    fn scattered(mut p: WorkloadParams, extent_pages: u32, seed: u64) -> WorkloadParams {
        Placement::Scattered { extent_pages, seed }.write_params(&mut p);
        p
    }

    #[test]
    fn linear_layout_is_unchanged() {
        // The historical formulas, slot by slot, with both areas and a disk.
        let mut p = disk_params();
        p.data_end = p.data_start + (1 + 200 + 20) * PAGE_SIZE;
        p.high_start = 0x1_0000_0000;
        p.high_end = p.high_start + 40 * PAGE_SIZE;
        let l = DataLayout::new(&p).unwrap();
        assert_eq!(l.placement, Placement::Linear);
        for i in 0..l.pages {
            assert_eq!(l.page_gpa(i), l.slot_gpa(l.record_pages + i));
            assert_eq!(l.slot_use(l.record_pages + i), SlotUse::Page(i));
        }
        for k in 0..l.disk_pages {
            assert_eq!(l.disk_slot(k), l.record_pages + l.pages + k);
        }
        for s in l.record_pages + l.pages + l.disk_pages..l.slots() {
            assert_eq!(l.slot_use(s), SlotUse::Free);
        }
        assert_eq!(l.disk_run(0), 20);
        assert_eq!(l.disk_run(20), 30);
    }

    #[test]
    fn scattered_layout_is_a_bijection_over_the_data_slots() {
        let mut p = scattered(disk_params(), 1, 5);
        p.data_end = p.data_start + (1 + 200 + 20) * PAGE_SIZE;
        p.high_start = 0x1_0000_0000;
        p.high_end = p.high_start + 40 * PAGE_SIZE;
        for extent in [1, 3, 8, 64] {
            p.extent_pages = extent;
            let l = DataLayout::new(&p).unwrap();
            let mut seen = [false; 261];
            for i in 0..l.pages {
                let s = l.page_slot(i);
                assert!(s >= l.record_pages && s < l.slots());
                assert!(!seen[s as usize]);
                seen[s as usize] = true;
                assert_eq!(l.slot_use(s), SlotUse::Page(i));
                assert_eq!(l.gpa_slot(l.page_gpa(i)), Some(s));
            }
            for k in 0..l.disk_pages {
                let s = l.disk_slot(k);
                assert!(!seen[s as usize]);
                seen[s as usize] = true;
                assert_eq!(l.slot_use(s), SlotUse::Disk(k));
                // A run is contiguous in guest-physical memory.
                let run = l.disk_run(k);
                assert!(run >= 1 && k + run <= l.disk_pages);
                for r in 0..run {
                    assert_eq!(l.disk_page_gpa(k + r), l.disk_page_gpa(k) + r * PAGE_SIZE);
                }
            }
            assert_eq!(l.slot_use(0), SlotUse::Record(0));
            assert_eq!(l.gpa_slot(p.data_start - PAGE_SIZE), None);
            assert_eq!(l.gpa_slot(p.high_end), None);
        }
    }

    #[test]
    fn scattered_vms_hold_the_same_contents_at_different_addresses() {
        let base = params(3000, 1000, 100, 50, 0);
        let (a, b) = (scattered(base, 1, 1), scattered(base, 1, 2));
        let (la, lb) = (DataLayout::new(&a).unwrap(), DataLayout::new(&b).unwrap());
        let lin = DataLayout::new(&base).unwrap();
        let same = (0..la.pages)
            .filter(|&i| la.page_gpa(i) == lb.page_gpa(i))
            .count();
        assert!(same < 20, "{same} pages at the same GPA");
        let moved = (0..la.pages)
            .filter(|&i| la.page_gpa(i) != lin.page_gpa(i))
            .count();
        assert!(moved > 3900, "only {moved} pages moved");
        // Same multiset of slot contents in every placement.
        let contents = |p: &WorkloadParams, l: &DataLayout| {
            let mut v: std::vec::Vec<_> =
                (0..l.slots()).map(|s| slot_content(p, l, s, 0)).collect();
            v.sort();
            v
        };
        assert_eq!(contents(&a, &la), contents(&b, &lb));
        assert_eq!(contents(&a, &la), contents(&base, &lin));
        // And each slot holds what its logical page holds.
        for i in 0..la.pages {
            assert_eq!(
                slot_content(&a, &la, la.page_slot(i), 0),
                Some(page_content(&a, i, 1))
            );
        }
    }

    #[test]
    fn bad_placement_is_refused() {
        let mut p = params(10, 10, 0, 0, 0);
        p.placement = 1;
        assert!(matches!(
            DataLayout::new(&p),
            Err(ParamsError::BadPlacement(_))
        ));
    }

    #[test]
    fn record_headers_differ_per_vm_and_page() {
        let p = params(10, 10, 0, 0, 0);
        let mut q = p;
        q.private_seed = 23;
        q.vm_index = 1;
        assert_ne!(record_header(&p, 0), record_header(&q, 0));
        assert_ne!(record_header(&p, 0), record_header(&p, 1));
    }
}
