//! The map-count budget: how many VMAs merges may still create.
//!
//! A scattered merge costs VMAs (one per run of consecutive pool slots),
//! and a process has only `vm.max_map_count` of them. [`Vmas`] keeps the
//! running estimate the merge path spends ([`MapBudget`]) and re-reads the
//! real count from /proc/self/maps when it matters.

use std::time::{Duration, Instant};

use crate::merge::MapBudget;

/// VMAs left, beyond the reserve, for the rest of the process to create
/// between two reads of /proc/self/maps: a thread's stack and guard page,
/// an allocator arena's heap and its unmapped tail, for a few dozen
/// threads.
const GROWTH_SLACK: u64 = 128;

/// The process's VMA count, its limit, and what merges may still spend.
#[derive(Debug)]
pub(super) struct Vmas {
    /// `vm.max_map_count` at the last read.
    max_map_count: u64,
    /// The process's VMAs at the last read.
    count: u64,
    /// `max_map_count - count` at the last read (reported).
    headroom: u64,
    /// When /proc/self/maps was last read.
    checked: Option<Instant>,
    /// What merges may still create, charged per new VMA between reads.
    budget: MapBudget,
    /// `budget.headroom` right after the last read.
    headroom_at_check: i64,
    /// `budget.limited` as of the last wake-up's end (reported).
    limited: bool,
}

impl Vmas {
    /// The budget as of now; `keep_half` as for [`Vmas::refresh`].
    pub(super) fn new(keep_half: bool) -> Self {
        let mut v = Vmas {
            max_map_count: crate::mm::max_map_count(),
            count: 0,
            headroom: 0,
            checked: None,
            budget: MapBudget::default(),
            headroom_at_check: i64::MIN,
            limited: false,
        };
        v.refresh(true, keep_half);
        v
    }

    /// Re-reads the VMA count: at most every 10 s unless `force` or the
    /// running estimate (decremented per VMA we create) gets low. Reading
    /// /proc/self/maps costs kernel time for every VMA. With `keep_half`
    /// (KSM takes over scattered merges) the engine keeps to half the
    /// limit.
    pub(super) fn refresh(&mut self, force: bool, keep_half: bool) {
        // "Low" re-reads (at most every second) only matter near the end of
        // the budget while the engine is still making VMAs. The running
        // estimate charges each new run the two VMAs a scattered merge
        // really costs, so a re-read far from the end finds the headroom
        // it already had, at a cost per VMA that is a visible part of the
        // engine's CPU at tens of thousands of VMAs.
        let low = self.budget.headroom < (self.max_map_count / 64).max(256) as i64
            && self.budget.headroom != self.headroom_at_check;
        let fresh_within = |d| self.checked.is_some_and(|t| t.elapsed() < d);
        if !force && !low && fresh_within(Duration::from_secs(10)) {
            return;
        }
        if !force && low && fresh_within(Duration::from_secs(1)) {
            return;
        }
        self.checked = Some(Instant::now());
        if let Ok(n) = crate::mm::vma_count() {
            self.count = n;
        }
        self.max_map_count = crate::mm::max_map_count();
        self.headroom = self.max_map_count.saturating_sub(self.count);
        self.set_reserve(keep_half);
    }

    /// The budget from the last maps read and the reserve: 1/16 of the
    /// limit is kept for everything else in the process, half of it with
    /// `keep_half`. Either way [`GROWTH_SLACK`] more is kept for what the
    /// rest of the process creates between two reads, which the running
    /// estimate cannot see: with the estimate spent to the last VMA, one
    /// new thread stack was enough to cross half the limit.
    pub(super) fn set_reserve(&mut self, keep_half: bool) {
        let reserve = GROWTH_SLACK
            + if keep_half {
                self.max_map_count / 2
            } else {
                self.max_map_count / 16
            };
        self.budget.headroom = self.headroom as i64 - reserve as i64;
        self.budget.limited = self.budget.headroom < 2;
        self.headroom_at_check = self.budget.headroom;
        self.limited = self.budget.limited;
    }

    /// The running budget, for the merge path to spend.
    pub(super) fn budget_mut(&mut self) -> &mut MapBudget {
        &mut self.budget
    }

    /// A merge was refused or failed for lack of VMAs since the last read.
    pub(super) fn short(&self) -> bool {
        self.budget.limited
    }

    /// VMAs merges may still create (the running estimate; negative when
    /// spent beyond the reserve).
    pub(super) fn spendable(&self) -> i64 {
        self.budget.headroom
    }

    /// Less than a quarter of the limit left to spend.
    pub(super) fn below_quarter(&self) -> bool {
        self.budget.headroom < (self.max_map_count / 4) as i64
    }

    /// `vm.max_map_count` at the last read.
    pub(super) fn max_map_count(&self) -> u64 {
        self.max_map_count
    }

    /// Publishes [`Vmas::short`] for the statistics (at a wake-up's end).
    pub(super) fn publish(&mut self) {
        self.limited = self.budget.limited;
    }

    /// VMAs left under the limit at the last read.
    pub(super) fn headroom(&self) -> u64 {
        self.headroom
    }

    /// Whether merges were short of VMAs at the last publication.
    pub(super) fn limited(&self) -> bool {
        self.limited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_sixteenth_or_half_of_the_limit_and_the_slack() {
        let mut v = Vmas::new(false);
        v.max_map_count = 65_536;
        v.headroom = 65_536 - 1_000;
        v.set_reserve(false);
        assert_eq!(v.budget.headroom, 64_536 - 4_096 - GROWTH_SLACK as i64);
        assert!(!v.short() && !v.limited());
        v.set_reserve(true);
        assert_eq!(v.budget.headroom, 64_536 - 32_768 - GROWTH_SLACK as i64);
        assert!(!v.below_quarter());
        v.headroom = 32_769 + GROWTH_SLACK;
        v.set_reserve(true);
        assert!(v.short() && v.limited(), "one VMA left is no budget");
        assert!(v.below_quarter());
    }
}
