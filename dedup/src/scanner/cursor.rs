//! Where the scan goes on, and the numbering of regions, groups and pages
//! that regions joining the core take.

use std::collections::HashMap;

use crate::backend::RegionId;
use crate::region::RegionError;

/// The scan's position: a region's index in the core and a page in it. A
/// pass runs from (0, 0) to the end of the last region.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    region: usize,
    page: usize,
}

impl Cursor {
    /// At the start of a pass.
    pub(super) fn at_pass_start(&self) -> bool {
        self.region == 0 && self.page == 0
    }

    /// The region index and page the scan has reached.
    pub(super) fn position(&self) -> (usize, usize) {
        (self.region, self.page)
    }

    /// Where the next span starts, among `regions` regions (back to the
    /// start if regions left behind it).
    pub(super) fn next(&mut self, regions: usize) -> (usize, usize) {
        if self.region >= regions {
            *self = Cursor::default();
        }
        (self.region, self.page)
    }

    /// A span consumed `used` pages of the current region, which has
    /// `npages`, among `regions`. Returns true when that ended the pass.
    pub(super) fn advance(&mut self, used: usize, npages: usize, regions: usize) -> bool {
        self.page += used;
        if self.page < npages {
            return false;
        }
        self.region += 1;
        self.page = 0;
        if self.region < regions {
            return false;
        }
        self.region = 0;
        true
    }

    /// Region `ri` left; `left` regions remain. The regions after it move
    /// down one index, and a scan inside it goes on at the next region.
    pub(super) fn region_removed(&mut self, ri: usize, left: usize) {
        if ri < self.region {
            self.region -= 1;
        } else if ri == self.region {
            self.page = 0;
        }
        if self.region >= left {
            self.region = 0;
        }
    }
}

/// The ids regions, groups and pages take as regions join: a region id
/// never reused, a group number per group name, and a global page id
/// (`gid`) range per region.
#[derive(Debug)]
pub(super) struct Ids {
    groups: HashMap<String, u32>,
    next_gid: u64,
    next_region: u64,
}

impl Default for Ids {
    fn default() -> Self {
        Ids {
            groups: HashMap::new(),
            next_gid: 0,
            next_region: 1,
        }
    }
}

impl Ids {
    /// The number of group `name`, numbered on first sight.
    pub(super) fn group(&mut self, name: &str) -> u32 {
        let next = self.groups.len() as u32;
        *self.groups.entry(name.to_string()).or_insert(next)
    }

    /// The name of group `g`.
    pub(super) fn group_name(&self, g: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|(_, &id)| id == g)
            .map(|(n, _)| n.as_str())
    }

    /// The id and first page id the next region takes; taken by
    /// [`Ids::take`] once it has joined.
    pub(super) fn peek(&self) -> Result<(RegionId, u32), RegionError> {
        let base = u32::try_from(self.next_gid).map_err(|_| RegionError::TooManyPages)?;
        Ok((RegionId(self.next_region), base))
    }

    /// A region of `npages` pages joined with the ids of [`Ids::peek`].
    pub(super) fn take(&mut self, npages: usize) {
        self.next_region += 1;
        self.next_gid += npages as u64;
    }

    /// Regions that ever joined (changes whenever one joins).
    pub(super) fn regions_joined(&self) -> u64 {
        self.next_region - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_walks_every_region_and_ends_at_the_start() {
        let mut c = Cursor::default();
        assert!(c.at_pass_start());
        assert_eq!(c.next(2), (0, 0));
        assert!(!c.advance(3, 4, 2));
        assert_eq!(c.next(2), (0, 3));
        assert!(!c.advance(1, 4, 2));
        assert_eq!(c.next(2), (1, 0));
        assert!(c.advance(5, 5, 2));
        assert!(c.at_pass_start());
    }

    #[test]
    fn removing_a_region_keeps_the_cursor_on_the_same_pages() {
        let mut c = Cursor::default();
        c.advance(4, 4, 3);
        c.advance(2, 8, 3);
        assert_eq!(c.next(3), (1, 2));
        // One before it: the same region, one index lower.
        c.region_removed(0, 2);
        assert_eq!(c.next(2), (0, 2));
        // Its own: the next region's start, which takes its index.
        c.region_removed(0, 1);
        assert_eq!(c.next(1), (0, 0));
        // One after it: unchanged.
        c.advance(1, 8, 1);
        c.region_removed(1, 1);
        assert_eq!(c.next(1), (0, 1));
    }

    #[test]
    fn a_cursor_past_the_last_region_starts_over() {
        let mut c = Cursor::default();
        c.advance(4, 4, 2);
        assert_eq!(c.next(1), (0, 0));
    }

    #[test]
    fn ids_are_never_reused_and_groups_keep_their_number() {
        let mut ids = Ids::default();
        assert_eq!(ids.group("a"), 0);
        assert_eq!(ids.group("b"), 1);
        assert_eq!(ids.group("a"), 0);
        assert_eq!(ids.group_name(1), Some("b"));
        assert_eq!(ids.group_name(2), None);
        let (r1, b1) = ids.peek().unwrap();
        assert_eq!(ids.peek().unwrap(), (r1, b1));
        ids.take(10);
        let (r2, b2) = ids.peek().unwrap();
        assert_ne!(r1, r2);
        assert_eq!(b2, b1 + 10);
        assert_eq!(ids.regions_joined(), 1);
    }

    #[test]
    fn page_ids_beyond_u32_are_refused() {
        let mut ids = Ids::default();
        ids.take(u32::MAX as usize + 1);
        assert!(matches!(ids.peek(), Err(RegionError::TooManyPages)));
    }
}
