//! The same-content run ending at the last visited page: how many pages in a
//! row held one content. Its length sizes stripes (`Core::wanted_stripe`)
//! and lets a long run of one pattern seed merges (`SEED_RUN`).

/// A run's content hash and length. `Copy`, so a visit that looks ahead
/// (a join attempt, a recheck) saves it and puts it back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SameRun {
    hash: u32,
    len: u32,
}

impl SameRun {
    /// The next page held `content` (`None`: no content worth a run, such
    /// as a zero page or one not read): the run grows, starts anew or ends.
    pub(super) fn note(&mut self, content: Option<u32>) {
        match content {
            Some(c) if self.len > 0 && c == self.hash => self.len = self.len.saturating_add(1),
            Some(c) => *self = SameRun { hash: c, len: 1 },
            None => self.len = 0,
        }
    }

    /// Pages in the run (0: none).
    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// At least `min` pages of `hash` in a row.
    pub(super) fn is_long(&self, hash: u32, min: u32) -> bool {
        self.len >= min && self.hash == hash
    }
}

#[cfg(test)]
mod tests {
    use super::SameRun;

    #[test]
    fn a_run_grows_on_the_same_content_and_restarts_on_another() {
        let mut r = SameRun::default();
        assert_eq!(r.len(), 0);
        r.note(Some(7));
        r.note(Some(7));
        r.note(Some(7));
        assert_eq!(r.len(), 3);
        assert!(r.is_long(7, 3));
        assert!(!r.is_long(7, 4));
        assert!(!r.is_long(8, 1));
        r.note(Some(8));
        assert_eq!(r.len(), 1);
        assert!(r.is_long(8, 1));
    }

    #[test]
    fn no_content_ends_the_run_and_the_same_hash_after_it_starts_anew() {
        let mut r = SameRun::default();
        r.note(Some(5));
        r.note(Some(5));
        r.note(None);
        assert_eq!(r.len(), 0);
        assert!(!r.is_long(5, 1));
        r.note(Some(5));
        assert_eq!(r.len(), 1);
    }
}
