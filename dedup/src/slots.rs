//! Pool slot offsets: which page of the pool file a merge writes.
//!
//! Placement decides how many VMAs merges cost. The kernel keeps merged
//! guest pages in one VMA only when they map consecutive pool offsets, and a
//! process has only `vm.max_map_count` (65,530) of them. Giving each new
//! merge "the previous merge's slot + 1" works while pages merge in address
//! order, but two VMs that fill concurrently have their pages merged as both
//! sides appear, out of order, and the same 8,252 merges of a linear layout
//! made 14 to 3,384 VMAs.
//!
//! So each registered region gets a **window**: a range of slots as long as
//! the region, in which page `p` has its own slot `base + p`. A new shared
//! content that cannot continue its left neighbour's run is placed at the
//! slot of one of its pages (the engine picks the page of the
//! earlier-registered region), so that region's merged pages map
//! consecutive offsets whatever order they merged in, and so does every
//! region that holds the same content at the same layout. Slots outside
//! every open window ("spare" slots) serve the merges no window slot fits.
//!
//! The pool file is sparse and only written slots use memory; the engine's
//! per-slot metadata is dense up to the highest slot in use, which windows
//! keep near the sum of the registered regions' pages.

use std::collections::BTreeMap;

/// Slot allocator: one bit per slot, plus the open windows. Separate from
/// the memfd so it can be property-tested.
#[derive(Debug, Clone)]
pub struct SlotAlloc {
    /// One bit per slot, set while the slot is allocated.
    used: Vec<u64>,
    in_use: u64,
    /// One past the highest allocated slot.
    high: u32,
    /// No slot may be at or above this.
    limit: u32,
    /// Open windows: first slot -> length.
    windows: BTreeMap<u32, u32>,
    /// No free spare slot (outside every window) lies below this.
    spare_from: u32,
}

impl SlotAlloc {
    /// An empty allocator of slots `0..limit`.
    pub fn new(limit: u32) -> Self {
        SlotAlloc {
            used: Vec::new(),
            in_use: 0,
            high: 0,
            limit,
            windows: BTreeMap::new(),
            spare_from: 0,
        }
    }

    /// True if `s` is not allocated.
    pub fn is_free(&self, s: u32) -> bool {
        let w = (s / 64) as usize;
        w >= self.used.len() || self.used[w] & (1 << (s % 64)) == 0
    }

    /// Allocated slots.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// One past the highest allocated slot.
    pub fn high_water(&self) -> u32 {
        self.high
    }

    /// Allocates `hint` if it is free, else a spare slot.
    pub fn alloc(&mut self, hint: Option<u32>) -> Option<u32> {
        if let Some(h) = hint.filter(|&h| h < self.limit && self.is_free(h)) {
            self.take(h);
            return Some(h);
        }
        let s = self.find_spare()?;
        self.take(s);
        self.spare_from = s + 1;
        Some(s)
    }

    /// Returns `s` to the allocator.
    pub fn free(&mut self, s: u32) {
        debug_assert!(!self.is_free(s), "double free of slot {s}");
        if self.is_free(s) {
            return;
        }
        self.used[(s / 64) as usize] &= !(1 << (s % 64));
        self.in_use -= 1;
        if self.window_at(s).is_none() {
            self.spare_from = self.spare_from.min(s);
        }
        if s + 1 == self.high {
            self.high = self.highest_below(s).map_or(0, |x| x + 1);
            self.used.truncate(self.high.div_ceil(64) as usize);
        }
    }

    /// Frees every slot; the windows stay open.
    pub fn clear(&mut self) {
        self.used = Vec::new();
        self.in_use = 0;
        self.high = 0;
        self.spare_from = 0;
    }

    /// Opens a window of `len` slots over a range where no slot is
    /// allocated and no other window lies (the lowest such range); None
    /// when the slot space has no room.
    pub fn open_window(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let mut c: u32 = 0;
        loop {
            let end = c.checked_add(len).filter(|&e| e <= self.limit)?;
            if let Some((&b, &l)) = self.windows.range(..end).next_back() {
                if b + l > c {
                    c = b + l;
                    continue;
                }
            }
            if let Some(x) = self.highest_in(c, end) {
                c = x + 1;
                continue;
            }
            self.windows.insert(c, len);
            return Some(c);
        }
    }

    /// Closes the window that starts at `base`: its free slots become
    /// spare, its allocated ones stay until freed.
    pub fn close_window(&mut self, base: u32) {
        if self.windows.remove(&base).is_some() {
            self.spare_from = self.spare_from.min(base);
        }
    }

    /// Approximate heap bytes.
    pub fn heap_bytes(&self) -> u64 {
        (self.used.capacity() * 8 + self.windows.len() * 32) as u64
    }

    fn take(&mut self, s: u32) {
        let w = (s / 64) as usize;
        if w >= self.used.len() {
            self.used.resize(w + 1, 0);
        }
        self.used[w] |= 1 << (s % 64);
        self.in_use += 1;
        self.high = self.high.max(s + 1);
    }

    /// The open window holding `s`: (base, length).
    fn window_at(&self, s: u32) -> Option<(u32, u32)> {
        let (&b, &l) = self.windows.range(..=s).next_back()?;
        (s < b + l).then_some((b, l))
    }

    /// The lowest free slot at or above `spare_from` outside every window.
    fn find_spare(&self) -> Option<u32> {
        let mut s = self.spare_from;
        while s < self.limit {
            if let Some((b, l)) = self.window_at(s) {
                s = b + l;
                continue;
            }
            let w = (s / 64) as usize;
            if w >= self.used.len() {
                return Some(s);
            }
            let free = !self.used[w] & (u64::MAX << (s % 64));
            if free == 0 {
                s = (w as u32 + 1) * 64;
                continue;
            }
            let f = w as u32 * 64 + free.trailing_zeros();
            // The free bit may lie in a window that starts inside this word.
            match self.windows.range(s..=f).next() {
                Some((&b, &l)) => s = b + l,
                None => return (f < self.limit).then_some(f),
            }
        }
        None
    }

    /// The highest allocated slot in `lo..hi`.
    fn highest_in(&self, lo: u32, hi: u32) -> Option<u32> {
        let hi = hi.min(self.high);
        if lo >= hi {
            return None;
        }
        let x = self.highest_below(hi)?;
        (x >= lo).then_some(x)
    }

    /// The highest allocated slot below `hi`.
    fn highest_below(&self, hi: u32) -> Option<u32> {
        if hi == 0 {
            return None;
        }
        let last = hi - 1;
        let (mut w, mut bits) = if ((last / 64) as usize) < self.used.len() {
            let w = (last / 64) as usize;
            (w, self.used[w] & (u64::MAX >> (63 - last % 64)))
        } else {
            let w = self.used.len().checked_sub(1)?;
            (w, self.used[w])
        };
        loop {
            if bits != 0 {
                return Some(w as u32 * 64 + 63 - bits.leading_zeros());
            }
            w = w.checked_sub(1)?;
            bits = self.used[w];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn never_hands_out_a_slot_twice(
            ops in proptest::collection::vec((0u8..4, 0u32..300, any::<bool>()), 1..400)
        ) {
            let mut a = SlotAlloc::new(10_000);
            let mut live: BTreeSet<u32> = BTreeSet::new();
            let mut windows: Vec<(u32, u32)> = Vec::new();
            for (op, x, use_hint) in ops {
                match op {
                    0 | 1 => {
                        let hint = use_hint.then_some(x);
                        if let Some(s) = a.alloc(hint) {
                            prop_assert!(live.insert(s), "slot {} handed out twice", s);
                            if hint != Some(s) {
                                prop_assert!(
                                    windows.iter().all(|&(b, l)| s < b || s >= b + l),
                                    "spare slot {} inside a window", s
                                );
                            }
                        }
                    }
                    2 if !live.is_empty() => {
                        let s = *live.iter().nth(x as usize % live.len()).unwrap();
                        live.remove(&s);
                        a.free(s);
                    }
                    _ if use_hint && !windows.is_empty() => {
                        let (b, _) = windows.remove(x as usize % windows.len());
                        a.close_window(b);
                    }
                    _ => {
                        if let Some(b) = a.open_window(x % 100 + 1) {
                            let l = x % 100 + 1;
                            prop_assert!(
                                windows.iter().all(|&(wb, wl)| b + l <= wb || wb + wl <= b),
                                "window {}+{} overlaps another", b, l
                            );
                            prop_assert!(
                                live.range(b..b + l).next().is_none(),
                                "window {}+{} over an allocated slot", b, l
                            );
                            windows.push((b, l));
                        }
                    }
                }
                prop_assert_eq!(a.in_use(), live.len() as u64);
                prop_assert_eq!(a.high_water(), live.last().map_or(0, |&s| s + 1));
                for s in 0..a.high_water() + 70 {
                    prop_assert_eq!(a.is_free(s), !live.contains(&s));
                }
            }
        }

        #[test]
        fn hint_is_honoured_when_free(n in 1u32..50) {
            let mut a = SlotAlloc::new(1000);
            for i in 0..n {
                prop_assert_eq!(a.alloc(Some(i)), Some(i));
            }
            a.free(n / 2);
            prop_assert_eq!(a.alloc(Some(n / 2)), Some(n / 2));
        }
    }

    #[test]
    fn limit_respected() {
        let mut a = SlotAlloc::new(2);
        assert_eq!(a.alloc(None), Some(0));
        assert_eq!(a.alloc(Some(5)), Some(1));
        assert_eq!(a.alloc(None), None);
        a.free(0);
        assert_eq!(a.alloc(None), Some(0));
        assert_eq!(a.open_window(1), None);
    }

    #[test]
    fn spare_slots_avoid_windows_and_windows_avoid_allocated_slots() {
        let mut a = SlotAlloc::new(1 << 20);
        assert_eq!(a.open_window(100), Some(0));
        assert_eq!(a.alloc(None), Some(100), "spare slots lie past the window");
        // A window's own slots are taken by hint, in any order.
        assert_eq!(a.alloc(Some(42)), Some(42));
        assert_eq!(a.alloc(Some(7)), Some(7));
        assert_eq!(a.open_window(50), Some(101), "not over slot 100");
        a.close_window(0);
        // Slots 7 and 42 stay allocated: a new window does not cover them.
        assert_eq!(a.open_window(40), Some(43));
        assert_eq!(
            a.alloc(None),
            Some(0),
            "the closed window's slots are spare now"
        );
        a.free(7);
        a.free(42);
        a.free(0);
        assert_eq!(a.open_window(43), Some(0));
    }
}
