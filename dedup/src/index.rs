//! The two content indices.
//!
//! * [`StableIndex`]: (group, hash) -> pool slots holding that content, in
//!   ascending slot order (so lookups prefer the start of a stripe and runs
//!   keep coalescing). Keyed by group, so a hit from another dedup group is
//!   impossible by construction (docs/merge-races.md §15).
//! * [`UnstableIndex`]: hash -> candidate guest pages seen this pass, rebuilt
//!   every pass (KSM's unstable tree). An open-addressing table of 4-byte
//!   page ids whose keys live in the engine's per-page array, so it costs
//!   8 bytes per tracked page. It is a multimap: pages with equal
//!   hashes but different content coexist and are told apart by comparing.
//!
//! A hash match never merges by itself: callers confirm every merge with a
//! full compare under write-protection (docs/merge-races.md §3).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for keys that already are hashes: one multiply, no SipHash.
#[derive(Default, Clone, Copy)]
pub struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 29;
    }
}

/// `BuildHasher` for [`PreHashed`].
pub type PreHashedBuild = BuildHasherDefault<PreHashed>;

/// Errors of the indices (none can occur today; kept for the module rule).
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("unstable index full ({0} entries)")]
    Full(usize),
}

/// (group, hash) -> ascending pool slots.
#[derive(Debug, Default)]
pub struct StableIndex {
    map: HashMap<u64, Slots, PreHashedBuild>,
    entries: usize,
    /// The `max_page_sharing` the `room_from` marks were found under.
    room_for: u64,
}

/// The slots of one (group, hash), and where the ones with room start.
#[derive(Debug, Default)]
struct Slots {
    slots: Vec<u32>,
    /// No slot below this one can take a mapper: each is full at
    /// `max_page_sharing` (KSM's chains of stable nodes keep full pages
    /// out of the way the same way). Lookups scan from here, so a
    /// content repeated past 512 full slots (a guest's memory poisoned
    /// with one pattern) still finds the slots with room.
    room_from: u32,
}

fn key(group: u32, hash: u32) -> u64 {
    ((group as u64) << 32) | hash as u64
}

impl StableIndex {
    /// Adds `slot` under (group, hash).
    pub fn insert(&mut self, group: u32, hash: u32, slot: u32) {
        let e = self.map.entry(key(group, hash)).or_default();
        if let Err(pos) = e.slots.binary_search(&slot) {
            e.slots.insert(pos, slot);
            self.entries += 1;
        }
        e.room_from = e.room_from.min(slot);
    }

    /// Removes `slot` from (group, hash); true if it was there.
    pub fn remove(&mut self, group: u32, hash: u32, slot: u32) -> bool {
        let k = key(group, hash);
        let Some(v) = self.map.get_mut(&k) else {
            return false;
        };
        let Ok(pos) = v.slots.binary_search(&slot) else {
            return false;
        };
        v.slots.remove(pos);
        self.entries -= 1;
        if v.slots.is_empty() {
            self.map.remove(&k);
        }
        true
    }

    /// Slots holding content with this hash in this group, ascending.
    pub fn get(&self, group: u32, hash: u32) -> &[u32] {
        self.map
            .get(&key(group, hash))
            .map(|v| v.slots.as_slice())
            .unwrap_or(&[])
    }

    /// The slots of (group, hash) from the first that may have room
    /// (`skip_full`), ascending.
    pub fn with_room(&self, group: u32, hash: u32) -> &[u32] {
        self.map.get(&key(group, hash)).map_or(&[], |v| {
            &v.slots[v.slots.partition_point(|&s| s < v.room_from)..]
        })
    }

    /// Moves the start of (group, hash)'s slots with room past the full
    /// ones (`full`: at `max_sharing` mappers). A new `max_sharing`
    /// starts every key over (a raised one gives full slots room).
    pub fn skip_full(
        &mut self,
        group: u32,
        hash: u32,
        max_sharing: u64,
        full: impl Fn(u32) -> bool,
    ) {
        if max_sharing != self.room_for {
            for v in self.map.values_mut() {
                v.room_from = 0;
            }
            self.room_for = max_sharing;
        }
        let Some(v) = self.map.get_mut(&key(group, hash)) else {
            return;
        };
        let mut i = v.slots.partition_point(|&s| s < v.room_from);
        while i < v.slots.len() && full(v.slots[i]) {
            i += 1;
        }
        v.room_from = v.slots.get(i).copied().unwrap_or(u32::MAX);
    }

    /// Slot `slot` of (group, hash) lost a mapper: it has room again.
    pub fn room_again(&mut self, group: u32, hash: u32, slot: u32) {
        if let Some(v) = self.map.get_mut(&key(group, hash)) {
            v.room_from = v.room_from.min(slot);
        }
    }

    /// Forgets every slot.
    pub fn clear(&mut self) {
        self.map = HashMap::default();
        self.entries = 0;
    }

    /// Number of (slot) entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Approximate heap bytes.
    pub fn heap_bytes(&self) -> u64 {
        (self.map.capacity() * (8 + 32 + 1)) as u64 + self.entries as u64 * 4
    }
}

const EMPTY: u32 = u32::MAX;

/// Open-addressing multimap hash -> page id, keys held by the caller.
#[derive(Debug, Default)]
pub struct UnstableIndex {
    table: Vec<u32>,
    len: usize,
}

/// Lookups stop after this many same-hash candidates (bounds the work a
/// flood of colliding pages can cause).
pub const MAX_CANDIDATES: usize = 16;

impl UnstableIndex {
    /// Empties the table and sizes it for `pages` entries (load <= 0.5:
    /// linear probing clusters badly above that). Not a power of two: slots
    /// are picked by multiply-shift, so the table costs 8 bytes per tracked
    /// page.
    pub fn reset(&mut self, pages: usize) {
        let want = (pages * 2).max(64);
        if self.table.len() != want {
            self.table = vec![EMPTY; want];
        } else if self.len > 0 {
            self.table.fill(EMPTY);
        }
        self.len = 0;
    }

    /// Makes room for `pages` entries without losing the ones inserted this
    /// pass (regions registered mid-pass would otherwise fill the table and
    /// lose every insert until the pass ends). `key_of` gives an entry's key
    /// (`None`: stale, dropped).
    pub fn grow(&mut self, pages: usize, key_of: impl Fn(u32) -> Option<u32>) {
        let want = (pages * 2).max(64);
        if want <= self.table.len() {
            return;
        }
        let old = std::mem::replace(&mut self.table, vec![EMPTY; want]);
        self.len = 0;
        for id in old.into_iter().filter(|&id| id != EMPTY) {
            if let Some(hash) = key_of(id) {
                // Cannot fail: the new table is at most a quarter full.
                let _ = self.insert(hash, id);
            }
        }
    }

    /// Entries inserted since the last reset.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing was inserted since the last reset.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn start(&self, hash: u32) -> usize {
        // Fibonacci hashing spreads weak or clustered hashes; multiply-shift
        // maps them onto any table length.
        let mixed = hash.wrapping_mul(0x9E37_79B9) as u64;
        ((mixed * self.table.len() as u64) >> 32) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.table.len() {
            0
        } else {
            i + 1
        }
    }

    /// Inserts page `id` with key `hash`.
    pub fn insert(&mut self, hash: u32, id: u32) -> Result<(), IndexError> {
        if self.table.is_empty() || (self.len + 1) * 10 > self.table.len() * 9 {
            return Err(IndexError::Full(self.len));
        }
        let mut i = self.start(hash);
        while self.table[i] != EMPTY {
            i = self.next(i);
        }
        self.table[i] = id;
        self.len += 1;
        Ok(())
    }

    /// Calls `f` for up to [`MAX_CANDIDATES`] entries whose current key (per
    /// `key_of`, `None` = stale) equals `hash`, until `f` returns true; then
    /// returns that id.
    pub fn find(
        &self,
        hash: u32,
        key_of: impl Fn(u32) -> Option<u32>,
        mut f: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        if self.table.is_empty() {
            return None;
        }
        let mut i = self.start(hash);
        let mut tried = 0;
        let mut steps = 0;
        while self.table[i] != EMPTY && steps < self.table.len() {
            let id = self.table[i];
            if key_of(id) == Some(hash) {
                if f(id) {
                    return Some(id);
                }
                tried += 1;
                if tried >= MAX_CANDIDATES {
                    return None;
                }
            }
            i = self.next(i);
            steps += 1;
        }
        None
    }

    /// Heap bytes.
    pub fn heap_bytes(&self) -> u64 {
        self.table.capacity() as u64 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    proptest! {
        #[test]
        fn stable_matches_model(ops in proptest::collection::vec((any::<bool>(), 0u32..3, 0u32..5, 0u32..40), 1..300)) {
            let mut ix = StableIndex::default();
            let mut model: BTreeMap<(u32, u32), BTreeSet<u32>> = BTreeMap::new();
            for (ins, g, h, s) in ops {
                if ins {
                    ix.insert(g, h, s);
                    model.entry((g, h)).or_default().insert(s);
                } else {
                    let was = model.get_mut(&(g, h)).map(|m| m.remove(&s)).unwrap_or(false);
                    prop_assert_eq!(ix.remove(g, h, s), was);
                }
                for g in 0..3 { for h in 0..5 {
                    let want: Vec<u32> = model.get(&(g, h)).map(|m| m.iter().copied().collect()).unwrap_or_default();
                    prop_assert_eq!(ix.get(g, h), want.as_slice());
                }}
            }
            prop_assert_eq!(ix.len(), model.values().map(|m| m.len()).sum::<usize>());
        }

        /// `with_room` after `skip_full` never leaves out a slot with room,
        /// whatever the order of inserts, removals, mappers coming and
        /// going (`room_again` on each loss) and `max_sharing` changes.
        #[test]
        fn skip_full_never_hides_a_slot_with_room(ops in proptest::collection::vec((0u8..5, 0u32..30), 1..400)) {
            let mut ix = StableIndex::default();
            let mut mappers = [0u32; 30];
            let mut max = 3u64;
            for (op, s) in ops {
                // A slot's content (its hash) is its own.
                let h = s % 2;
                match op {
                    0 => ix.insert(0, h, s),
                    1 => { ix.remove(0, h, s); }
                    2 => mappers[s as usize] += 1,
                    3 => if mappers[s as usize] > 0 {
                        mappers[s as usize] -= 1;
                        ix.room_again(0, h, s);
                    },
                    _ => max = 1 + u64::from(s % 5),
                }
                for h in 0..2 {
                    ix.skip_full(0, h, max, |x| u64::from(mappers[x as usize]) >= max);
                    let room: Vec<u32> = ix.get(0, h).iter().copied()
                        .filter(|&x| u64::from(mappers[x as usize]) < max).collect();
                    let seen = ix.with_room(0, h);
                    for x in room {
                        prop_assert!(seen.contains(&x), "slot {} has room but is skipped", x);
                    }
                }
            }
        }

        #[test]
        fn unstable_finds_every_live_entry(keys in proptest::collection::vec(0u32..8, 1..200), dead in proptest::collection::vec(any::<bool>(), 200)) {
            // Page id i has key keys[i] unless dead[i] (stale).
            let mut ix = UnstableIndex::default();
            ix.reset(keys.len());
            for (i, &k) in keys.iter().enumerate() {
                ix.insert(k, i as u32).unwrap();
            }
            let key_of = |id: u32| (!dead[id as usize]).then(|| keys[id as usize]);
            for (i, &k) in keys.iter().enumerate() {
                let mut seen = Vec::new();
                let got = ix.find(k, key_of, |id| { seen.push(id); id == i as u32 });
                let live_same = keys.iter().enumerate().filter(|(j, &kk)| kk == k && !dead[*j]).count();
                if dead[i] {
                    prop_assert_eq!(got, None);
                } else if seen.len() < MAX_CANDIDATES || got.is_some() {
                    // Reached within the candidate bound => found.
                    if live_same <= MAX_CANDIDATES { prop_assert_eq!(got, Some(i as u32)); }
                }
                for id in seen { prop_assert_eq!(keys[id as usize], k); prop_assert!(!dead[id as usize]); }
            }
        }
    }

    #[test]
    fn grow_keeps_entries_and_drops_stale_ones() {
        let mut u = UnstableIndex::default();
        u.reset(40);
        for id in 0..70u32 {
            u.insert(id % 7, id).unwrap();
        }
        // Entry 3 went stale (its page changed since it was inserted).
        u.grow(1000, |id| (id != 3).then_some(id % 7));
        assert_eq!(u.len(), 69);
        let mut seen = Vec::new();
        u.find(
            3,
            |id| (id != 3).then_some(id % 7),
            |id| {
                seen.push(id);
                false
            },
        );
        assert!(seen.contains(&10) && !seen.contains(&3), "{seen:?}");
        for id in 1000..1900u32 {
            u.insert(id, id).expect("room for the grown size");
        }
    }

    #[test]
    fn full_table_refuses() {
        let mut ix = UnstableIndex::default();
        ix.reset(10);
        let mut n = 0;
        while ix.insert(1, n).is_ok() {
            n += 1;
        }
        assert!(n >= 10);
        assert!(ix.find(1, |_| Some(1), |id| id == n - 1).is_none() || n <= MAX_CANDIDATES as u32);
    }
}
