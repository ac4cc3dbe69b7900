//! Host-side prediction of what a set of workload VMs holds in their data
//! pages, so dedup tests can assert exact numbers (feature `std`).
//!
//! Identity of a page's content is its generator base (see `generator`), so
//! grouping pages by base is exact, not probabilistic. Record pages (the
//! guest's version table) are unique per VM by construction and are counted
//! apart; the guest's image, stack and page tables are outside the data area
//! and not counted at all. Disk-area pages (DISK_READ's page cache) are data
//! pages too: predicted exactly for test images (`disk_seed != 0`), counted
//! in `unpredicted_pages` otherwise.

extern crate std;

use crate::classes::{
    disk_page_content, page_content, version_after_churn, Content, DataLayout, ParamsError,
};
use crate::WorkloadParams;
use std::collections::HashMap;

/// One VM's state: its parameters and the total churn writes it reported
/// (`PhaseReport::churn_writes_total` of its last CHURN, 0 if none), after a
/// FILL.
#[derive(Clone, Copy, Debug)]
pub struct VmState<'a> {
    pub params: &'a WorkloadParams,
    pub churn_writes: u64,
}

/// Predicted page counts over the data pages of a set of VMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expectation {
    /// Data pages of all VMs: logical pages plus disk-area pages.
    pub data_pages: u64,
    /// Of those, all-zero pages.
    pub zero_pages: u64,
    /// Non-zero data pages of known content.
    pub nonzero_pages: u64,
    /// Distinct non-zero contents.
    pub distinct_contents: u64,
    /// Non-zero contents held by two or more pages (KSM's `pages_shared`
    /// when zero pages are handled apart).
    pub shared_contents: u64,
    /// Pages that a perfect dedup of non-zero contents frees: pages beyond
    /// the first of each content (KSM's `pages_sharing`), i.e.
    /// `nonzero_pages - distinct_contents`.
    pub sharing_pages: u64,
    /// Record pages of all VMs (always unique: never shared).
    pub record_pages: u64,
    /// Of `data_pages`, disk-area pages read from disks of unknown content
    /// (`disk_seed == 0`): left out of every other count.
    pub unpredicted_pages: u64,
    /// Of `data_pages`, disk-area pages (read or not).
    pub disk_pages: u64,
}

impl Expectation {
    /// Predicts the data pages of `vms` (each after FILL and its churn).
    pub fn compute(vms: &[VmState<'_>]) -> Result<Self, ParamsError> {
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut e = Self::default();
        for vm in vms {
            let layout = DataLayout::new(vm.params)?;
            e.record_pages += layout.record_pages;
            for i in 0..layout.pages {
                e.data_pages += 1;
                let v = version_after_churn(vm.params, i, vm.churn_writes);
                match page_content(vm.params, i, v) {
                    Content::Zero => e.zero_pages += 1,
                    Content::Pattern(base) => *counts.entry(base).or_default() += 1,
                }
            }
            for k in 0..layout.disk_pages {
                e.data_pages += 1;
                e.disk_pages += 1;
                match disk_page_content(vm.params, k) {
                    Some(Content::Zero) => e.zero_pages += 1,
                    Some(Content::Pattern(base)) => *counts.entry(base).or_default() += 1,
                    None => e.unpredicted_pages += 1,
                }
            }
        }
        e.nonzero_pages = e.data_pages - e.zero_pages - e.unpredicted_pages;
        e.distinct_contents = counts.len() as u64;
        e.shared_contents = counts.values().filter(|&&n| n > 1).count() as u64;
        e.sharing_pages = e.nonzero_pages - e.distinct_contents;
        Ok(e)
    }

    /// `sharing_pages` for an engine that merges all zero pages into one
    /// shared page like any other content (instead of a zero-page path).
    pub fn sharing_pages_with_zero_merged(&self) -> u64 {
        self.sharing_pages + self.zero_pages.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PAGE_SIZE, PARAMS_MAGIC};

    fn vm(seed: u64, private_seed: u64, shared: u64, private: u64) -> WorkloadParams {
        WorkloadParams {
            magic: PARAMS_MAGIC,
            seed,
            private_seed,
            shared_pages: shared,
            private_pages: private,
            zero_permille: 100,
            dup_permille: 50,
            churn_permille: 200,
            data_start: 0x40_0000,
            data_end: 0x40_0000 + (shared + private + 16) * PAGE_SIZE,
            ..WorkloadParams::default()
        }
    }

    #[test]
    fn one_vm_shares_only_its_duplicates() {
        let p = vm(1, 2, 10_000, 5_000);
        let e = Expectation::compute(&[VmState {
            params: &p,
            churn_writes: 0,
        }])
        .unwrap();
        assert_eq!(e.data_pages, 15_000);
        assert_eq!(e.zero_pages, 1_500);
        // 50 duplicates per block, each of a distinct unique page.
        assert_eq!(e.sharing_pages, 750);
        assert_eq!(e.shared_contents, 750);
        assert_eq!(e.distinct_contents, 15_000 - 1_500 - 750);
        assert_eq!(e.record_pages, 15);
    }

    #[test]
    fn two_vms_share_the_shared_part() {
        let a = vm(1, 2, 10_000, 5_000);
        let b = vm(1, 3, 10_000, 5_000);
        let e = Expectation::compute(&[
            VmState {
                params: &a,
                churn_writes: 0,
            },
            VmState {
                params: &b,
                churn_writes: 0,
            },
        ])
        .unwrap();
        // Shared part: 9000 non-zero pages per VM (8500 unique + 500 dup)
        // over 8500 distinct contents in both VMs together.
        // Private: 4500 non-zero per VM (4250 unique + 250 dup) over 4250 each.
        assert_eq!(e.zero_pages, 3_000);
        assert_eq!(e.distinct_contents, 8_500 + 2 * 4_250);
        assert_eq!(e.sharing_pages, 2 * 9_000 - 8_500 + 2 * (4_500 - 4_250));
        assert_eq!(e.sharing_pages_with_zero_merged(), e.sharing_pages + 2_999);
        // A different shared seed shares nothing across VMs.
        let c = vm(9, 3, 10_000, 5_000);
        let e2 = Expectation::compute(&[
            VmState {
                params: &a,
                churn_writes: 0,
            },
            VmState {
                params: &c,
                churn_writes: 0,
            },
        ])
        .unwrap();
        assert_eq!(e2.sharing_pages, 2 * 750);
    }

    fn with_disk(
        mut p: WorkloadParams,
        disk_seed: u64,
        disk_pages: u64,
        read: u64,
    ) -> WorkloadParams {
        p.disk_count = 1;
        p.disk_mmio[0] = 0xd000_0000;
        p.disk_pages = disk_pages;
        p.disk_seed = disk_seed;
        p.data_end += disk_pages * PAGE_SIZE;
        p.program[0] = crate::phase::FILL;
        p.program[1] = crate::phase::DISK_READ;
        p.program_args[1] = read;
        p
    }

    #[test]
    fn vms_reading_one_test_image_share_their_disk_pages() {
        let a = with_disk(vm(1, 2, 0, 1_000), 5, 300, 0);
        let b = with_disk(vm(1, 3, 0, 1_000), 5, 300, 0);
        let st = |p| VmState {
            params: p,
            churn_writes: 0,
        };
        let one = Expectation::compute(&[st(&a)]).unwrap();
        assert_eq!(one.disk_pages, 300);
        assert_eq!(one.data_pages, 1_300);
        assert_eq!(one.unpredicted_pages, 0);
        assert_eq!(one.distinct_contents, 850 + 300);
        let two = Expectation::compute(&[st(&a), st(&b)]).unwrap();
        // Private pages (different private seeds) share only their dups; the
        // disk pages of the second VM all share with the first's.
        assert_eq!(two.sharing_pages, 2 * 50 + 300);
        assert_eq!(two.shared_contents, 2 * 50 + 300);
        // Another image shares nothing.
        let c = with_disk(vm(1, 3, 0, 1_000), 6, 300, 0);
        let e = Expectation::compute(&[st(&a), st(&c)]).unwrap();
        assert_eq!(e.sharing_pages, 2 * 50);
        // Reading part of the area leaves the rest zero.
        let d = with_disk(vm(1, 3, 0, 1_000), 5, 300, 100);
        let e = Expectation::compute(&[st(&a), st(&d)]).unwrap();
        assert_eq!(e.sharing_pages, 2 * 50 + 100);
        assert_eq!(e.zero_pages, 2 * 100 + 200);
        // Unknown content is set apart, never guessed.
        let u = with_disk(vm(1, 3, 0, 1_000), 0, 300, 0);
        let e = Expectation::compute(&[st(&u)]).unwrap();
        assert_eq!(e.unpredicted_pages, 300);
        assert_eq!(e.nonzero_pages, 900);
    }

    #[test]
    fn placement_moves_pages_but_not_the_expectation() {
        // Content is a function of the logical index: a scattered VM holds
        // the same pages as a linear one, so the prediction is the same.
        let a = vm(1, 2, 3_000, 1_000);
        let b = vm(1, 3, 3_000, 1_000);
        let mut c = b;
        let st = |p| VmState {
            params: p,
            churn_writes: 0,
        };
        let linear = Expectation::compute(&[st(&a), st(&b)]).unwrap();
        crate::Placement::Scattered {
            extent_pages: 4,
            seed: 77,
        }
        .write_params(&mut c);
        let scattered = Expectation::compute(&[st(&a), st(&c)]).unwrap();
        assert_eq!(linear, scattered);
        let (la, lb) = (DataLayout::new(&b).unwrap(), DataLayout::new(&c).unwrap());
        assert!((0..la.pages).any(|i| la.page_gpa(i) != lb.page_gpa(i)));
    }

    #[test]
    fn churn_breaks_duplicates_of_churned_targets() {
        // churn tail = positions 800..1000 of each private block; dup targets
        // are 150..200, so churn touches no duplicate pair: sharing is kept.
        let a = vm(1, 2, 0, 2_000);
        let e0 = Expectation::compute(&[VmState {
            params: &a,
            churn_writes: 0,
        }])
        .unwrap();
        let e1 = Expectation::compute(&[VmState {
            params: &a,
            churn_writes: 1234,
        }])
        .unwrap();
        assert_eq!(e0, e1);
        // With a churn tail reaching the targets, churned targets lose their dups.
        let mut b = a;
        b.churn_permille = 850; // positions 150..1000: targets 150..200 churned
        let full = crate::classes::churn_len(&b);
        assert_eq!(full, 2 * 850);
        let e = Expectation::compute(&[VmState {
            params: &b,
            churn_writes: full,
        }])
        .unwrap();
        assert_eq!(e.sharing_pages, 0);
        let e = Expectation::compute(&[VmState {
            params: &b,
            churn_writes: 25,
        }])
        .unwrap();
        assert_eq!(e.sharing_pages, 100 - 25);
    }
}
