//! The map-count budget: how many VMAs merges may still create.

use super::*;

impl Core {
    /// Re-reads the VMA count: at most every 10 s unless `force` or the
    /// running estimate (decremented per VMA we create) gets low. Reading
    /// /proc/self/maps costs kernel time for every VMA.
    pub fn refresh_map_count(&mut self, force: bool) {
        // "Low" re-reads (at most every second) only matter near the end of
        // the budget while the engine is still making VMAs. The running
        // estimate charges each new run the two VMAs a scattered merge
        // really costs, so a re-read far from the end finds the headroom
        // it already had, at a cost per VMA that is a visible part of the
        // engine's CPU at tens of thousands of VMAs.
        let low = self.map_budget.headroom < (self.max_map_count / 64).max(256) as i64
            && self.map_budget.headroom != self.headroom_at_check;
        if !force
            && !low
            && self
                .map_checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        if !force
            && low
            && self
                .map_checked
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.map_checked = Some(Instant::now());
        if let Ok(n) = crate::mm::vma_count() {
            self.map_vmas = n;
        }
        self.max_map_count = crate::mm::max_map_count();
        self.map_headroom = self.max_map_count.saturating_sub(self.map_vmas);
        self.set_budget();
    }

    /// The VMA budget from the last maps read and the reserve.
    pub(super) fn set_budget(&mut self) {
        // Keep 1/16 of the limit for everything else in the process; with
        // KSM to take over scattered merges, the engine keeps to half of it.
        let reserve = if self.assist.enabled() {
            self.max_map_count / 2
        } else {
            self.max_map_count / 16
        };
        self.map_budget.headroom = self.map_headroom as i64 - reserve as i64;
        self.map_budget.limited = self.map_budget.headroom < 2;
        self.headroom_at_check = self.map_budget.headroom;
        self.map_limited = self.map_budget.limited;
    }
}
