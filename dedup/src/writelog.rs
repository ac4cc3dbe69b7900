//! Write logs: which pages of a region were written since the engine last
//! looked at them.
//!
//! A VMM knows what its guests write: KVM's dirty log records every guest
//! write to a memslot (exactly, on this host too: docs/engine.md), and
//! the VMM's own devices report what they fill (I/O hints). A page nobody
//! wrote since its last visit needs neither a pagemap read nor a new hash:
//! a merged page is still merged, a hashed page still has its hash, and
//! that hash is "unchanged since the previous scan" without being computed
//! again. A written page is visited at the next pass whatever its
//! smart-scan level, so a page rewritten late is not left waiting 8 passes.
//!
//! The log only steers the scan. Every merge still compares the page under
//! write-protection, so a write the log missed (a device write without a
//! hint) can cost a merge, never a guest's data; and every page is still
//! examined in full once every [`VERIFY_PASSES`] passes, which bounds how
//! long such a miss can leave the figures wrong.

use std::sync::Arc;

/// Errors of a write log.
#[derive(Debug, thiserror::Error)]
pub enum WriteLogError {
    /// The log could not be read (e.g. the VM is gone): the engine stops
    /// using it and falls back to reading pagemap for every visit.
    #[error("reading the write log: {0}")]
    Read(String),
}

/// A source of "pages written since the previous call" for one region
/// (the VMM's KVM dirty log of the memslot that maps it).
pub trait WriteLog: Send + Sync {
    /// ORs into `bits` (bit `i` of word `i / 64` = page `i` of the region)
    /// every page written since the previous call, and restarts the log.
    /// The first call reports every page written since the log started,
    /// which must be no later than the region's registration.
    fn collect(&self, bits: &mut [u64]) -> Result<(), WriteLogError>;
}

/// A write log its owner feeds by hand: for an embedder whose writers are
/// its own threads (and for tests). Record a page after writing it, as
/// KVM's log has it once the write is made.
#[derive(Debug, Default)]
pub struct RecordedWrites(std::sync::Mutex<Vec<usize>>);

impl RecordedWrites {
    /// Page `p` of the region was written.
    pub fn record(&self, p: usize) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(p);
    }
}

impl WriteLog for RecordedWrites {
    fn collect(&self, bits: &mut [u64]) -> Result<(), WriteLogError> {
        let mut pages = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for p in pages.drain(..) {
            if let Some(w) = bits.get_mut(p / 64) {
                *w |= 1 << (p % 64);
            }
        }
        Ok(())
    }
}

/// Every page is examined in full (pagemap, hash) at least once in this
/// many passes, written or not: the safety net for writes no log saw.
pub const VERIFY_PASSES: u64 = 64;

/// The periodic check takes pages in blocks of this many (2 MiB), a block
/// in every `VERIFY_PASSES` per pass: one pagemap read per block. One page
/// in every 64, spread evenly, cost a pagemap read each.
pub const VERIFY_BLOCK: usize = 512;

/// A region's log and the pages written since the engine last examined
/// them.
pub struct Written {
    log: Arc<dyn WriteLog>,
    bits: Vec<u64>,
    /// What the last collection brought, before it joined `bits`.
    fresh: Vec<u64>,
    /// Pages marked for want of knowledge rather than for a recorded write
    /// (a new log, device ranges that were lost): such a page may never
    /// have been touched, so nothing about its mapping can be presumed.
    unknown: Vec<u64>,
    npages: usize,
}

impl std::fmt::Debug for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Written")
            .field(
                "pages_marked",
                &self.bits.iter().map(|w| w.count_ones()).sum::<u32>(),
            )
            .finish()
    }
}

impl Written {
    /// Tracks a region of `npages` pages with `log`; every page starts as
    /// written (nothing is known about what happened before).
    pub fn new(log: Arc<dyn WriteLog>, npages: usize) -> Self {
        let mut bits = vec![0; npages.div_ceil(64)];
        for (w, mask) in word_masks(0, npages) {
            bits[w] = mask;
        }
        let unknown = bits.clone();
        Written {
            log,
            fresh: vec![0; bits.len()],
            bits,
            unknown,
            npages,
        }
    }

    /// Adds what the log recorded since the previous call.
    #[cfg(test)]
    fn collect(&mut self) -> Result<(), WriteLogError> {
        self.collect_with(|_| {})
    }

    /// Adds what the log recorded since the previous call, and calls
    /// `newly_written(p)` for each page it marks that was not marked
    /// before: a page written since the engine last examined it, seen for
    /// the first time.
    pub fn collect_with(
        &mut self,
        mut newly_written: impl FnMut(usize),
    ) -> Result<(), WriteLogError> {
        self.fresh.fill(0);
        self.log.collect(&mut self.fresh)?;
        // Pages past the region's end, in its last word, stay unmarked.
        if let (Some(last), tail @ 1..) = (self.fresh.last_mut(), self.npages % 64) {
            *last &= crate::low_bits(tail) as u64;
        }
        for (w, (b, f)) in self.bits.iter_mut().zip(&self.fresh).enumerate() {
            let mut new = *f & !*b;
            *b |= *f;
            while new != 0 {
                newly_written(w * 64 + new.trailing_zeros() as usize);
                new &= new - 1;
            }
        }
        Ok(())
    }

    /// Was page `p` written since the engine last examined it?
    pub fn get(&self, p: usize) -> bool {
        self.bits[p / 64] & (1 << (p % 64)) != 0
    }

    /// Was page `p` seen written (by its log, or a device's report) since
    /// the engine last examined it, as opposed to marked for want of
    /// knowledge? A written page is mapped: a write maps a private page,
    /// and nothing but the engine takes one away from guest RAM.
    pub fn recorded(&self, p: usize) -> bool {
        let bit = 1 << (p % 64);
        self.bits[p / 64] & bit != 0 && self.unknown[p / 64] & bit == 0
    }

    /// The engine examined pages `first..end` (read their pagemap entries,
    /// hashed them): neither kind of mark is left on them.
    pub fn clear_range(&mut self, first: usize, end: usize) {
        for (w, mask) in word_masks(first, end.min(self.npages)) {
            self.bits[w] &= !mask;
            self.unknown[w] &= !mask;
        }
    }

    /// Marks pages `first..end` written (a device wrote them).
    pub fn mark(&mut self, first: usize, end: usize) {
        for (w, mask) in word_masks(first, end.min(self.npages)) {
            self.bits[w] |= mask;
        }
    }

    /// Marks every page written, none of them as a recorded write (what
    /// was lost may be anywhere, including memory never touched).
    pub fn mark_all(&mut self) {
        self.mark(0, self.npages);
        self.unknown.copy_from_slice(&self.bits);
    }
}

/// The bitmap words that pages `first..end` fall in, each with the mask
/// of those pages' bits.
fn word_masks(first: usize, end: usize) -> impl Iterator<Item = (usize, u64)> {
    let mut p = first;
    std::iter::from_fn(move || {
        if p >= end {
            return None;
        }
        let (w, b) = (p / 64, p % 64);
        let n = (64 - b).min(end - p);
        p += n;
        // n <= 64 - b: the mask fits the word.
        Some((w, (crate::low_bits(n) as u64) << b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_start_written_and_stay_clean_until_the_log_says_otherwise() {
        let log = Arc::new(RecordedWrites::default());
        let mut w = Written::new(log.clone(), 70);
        assert!((0..70).all(|p| w.get(p) && !w.recorded(p)));
        // Bits past the region's end are never set.
        assert_eq!(w.bits[1], (1 << 6) - 1);
        w.clear_range(0, 3);
        assert!((0..3).all(|p| !w.get(p)) && w.get(3));
        w.clear_range(3, 70);
        w.collect().unwrap();
        assert!((0..70).all(|p| !w.get(p)));
        for p in [3, 64, 69] {
            log.record(p);
        }
        // A page past the region is ignored, not a panic.
        log.record(10_000);
        w.collect().unwrap();
        let marked: Vec<usize> = (0..70).filter(|&p| w.get(p)).collect();
        assert_eq!(marked, vec![3, 64, 69]);
        assert!([3, 64, 69].iter().all(|&p| w.recorded(p)));
        // Collecting again adds nothing new and keeps what is marked.
        w.collect().unwrap();
        assert_eq!((0..70).filter(|&p| w.get(p)).count(), 3);
        w.mark(10, 12);
        assert!(w.get(10) && w.get(11) && !w.get(12));
        assert!(w.recorded(10) && w.recorded(11) && !w.recorded(12));
        w.mark_all();
        assert!((0..70).all(|p| w.get(p) && !w.recorded(p)));
        // Examining a page forgets both kinds of mark; a later recorded
        // write is a recorded write again.
        w.clear_range(3, 4);
        assert!(!w.get(3) && !w.recorded(3));
        log.record(3);
        w.collect().unwrap();
        assert!(w.recorded(3));
        assert_eq!(w.bits[1], (1 << 6) - 1);
        // A range across a word boundary clears exactly its pages.
        w.clear_range(60, 66);
        let left: Vec<usize> = (55..70).filter(|&p| w.get(p)).collect();
        assert_eq!(left, [55, 56, 57, 58, 59, 66, 67, 68, 69]);
    }

    #[test]
    fn a_collection_names_only_the_pages_it_marks_for_the_first_time() {
        let log = Arc::new(RecordedWrites::default());
        let mut w = Written::new(log.clone(), 70);
        w.clear_range(0, 70);
        w.mark(5, 6);
        // 5 was marked already (by a device); 71 is past the region, in
        // its last word.
        for p in [5, 6, 64, 69, 71] {
            log.record(p);
        }
        let mut named = Vec::new();
        w.collect_with(|p| named.push(p)).unwrap();
        assert_eq!(named, [6, 64, 69]);
        assert_eq!(w.bits[1], (1 << 0) | (1 << 5));
        // Written again before the engine looked: nothing new.
        log.record(6);
        named.clear();
        w.collect_with(|p| named.push(p)).unwrap();
        assert!(named.is_empty());
        w.clear_range(6, 7);
        log.record(6);
        w.collect_with(|p| named.push(p)).unwrap();
        assert_eq!(named, [6]);
    }
}
