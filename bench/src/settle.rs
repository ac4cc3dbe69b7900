//! When has a run converged? When `pages_sharing` first
//! reached the value it then held for N full scans. Zero pages are counted
//! apart (pagefold's `zero_pages`, KSM's `ksm_zero_pages`), so the settled
//! value is the pair (`pages_sharing`, `zero_pages`).

use serde::Serialize;

/// One observation of a backend during a run (times relative to its start).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub pages_sharing: u64,
    pub pages_shared: u64,
    /// Pages dropped to the zero page (not in `pages_sharing`).
    pub zero_pages: u64,
    /// Full scans completed since the run started.
    pub full_scans: u64,
    /// Merging-side CPU seconds since the run started.
    pub cpu_s: f64,
}

/// The settled state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Settled {
    pub pages_sharing: u64,
    pub zero_pages: u64,
    /// First time the final value was seen.
    pub converge_s: f64,
    /// CPU used up to `converge_s`.
    pub cpu_s: f64,
    pub full_scans_to_converge: u64,
    /// When the value had been held for N full scans (end of the run).
    pub settled_s: f64,
    pub cpu_at_settled_s: f64,
}

impl Settled {
    /// Merging-side CPU per wall second while holding the final value.
    pub fn steady_cpu_per_s(&self) -> Option<f64> {
        let wall = self.settled_s - self.converge_s;
        (wall > 0.0).then(|| (self.cpu_at_settled_s - self.cpu_s) / wall)
    }
}

/// Feeds samples in time order; reports once the value held for `scans`
/// full scans.
#[derive(Debug)]
pub struct Settler {
    scans: u64,
    since: Option<Sample>,
}

impl Settler {
    pub fn new(scans: u64) -> Self {
        Self {
            scans: scans.max(1),
            since: None,
        }
    }

    pub fn push(&mut self, s: Sample) -> Option<Settled> {
        let since = match self.since {
            Some(p) if (p.pages_sharing, p.zero_pages) == (s.pages_sharing, s.zero_pages) => p,
            _ => {
                self.since = Some(s);
                s
            }
        };
        (s.full_scans >= since.full_scans + self.scans).then_some(Settled {
            pages_sharing: since.pages_sharing,
            zero_pages: since.zero_pages,
            converge_s: since.t_s,
            cpu_s: since.cpu_s,
            full_scans_to_converge: since.full_scans,
            settled_s: s.t_s,
            cpu_at_settled_s: s.cpu_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t_s: f64, pages_sharing: u64, full_scans: u64, cpu_s: f64) -> Sample {
        Sample {
            t_s,
            pages_sharing,
            pages_shared: 0,
            zero_pages: 0,
            full_scans,
            cpu_s,
        }
    }

    #[test]
    fn settles_on_the_first_time_the_held_value_was_reached() {
        let mut st = Settler::new(3);
        assert_eq!(st.push(s(0.0, 0, 0, 0.0)), None);
        assert_eq!(st.push(s(1.0, 0, 1, 0.1)), None);
        assert_eq!(st.push(s(2.0, 500, 1, 0.2)), None);
        assert_eq!(st.push(s(3.0, 900, 2, 0.3)), None);
        assert_eq!(st.push(s(4.0, 900, 3, 0.35)), None);
        assert_eq!(st.push(s(5.0, 900, 4, 0.4)), None);
        let d = st.push(s(6.0, 900, 5, 0.5)).unwrap();
        assert_eq!(d.pages_sharing, 900);
        assert_eq!(d.converge_s, 3.0);
        assert_eq!(d.cpu_s, 0.3);
        assert_eq!(d.full_scans_to_converge, 2);
        assert_eq!(d.settled_s, 6.0);
        assert!((d.steady_cpu_per_s().unwrap() - 0.2 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_change_restarts_the_count() {
        let mut st = Settler::new(2);
        st.push(s(0.0, 10, 0, 0.0));
        st.push(s(1.0, 10, 1, 0.0));
        st.push(s(2.0, 11, 1, 0.0));
        assert_eq!(st.push(s(3.0, 11, 2, 0.0)), None);
        assert_eq!(st.push(s(4.0, 11, 3, 0.0)).unwrap().converge_s, 2.0);
    }

    #[test]
    fn zero_pages_still_changing_is_not_settled() {
        let mut st = Settler::new(2);
        let z = |t: f64, zero: u64, scans: u64| Sample {
            zero_pages: zero,
            ..s(t, 100, scans, 0.0)
        };
        st.push(z(0.0, 0, 0));
        st.push(z(1.0, 5, 1));
        // pages_sharing held for 2 scans, but zero pages changed at t=1.
        assert_eq!(st.push(z(2.0, 5, 2)), None);
        let d = st.push(z(3.0, 5, 3)).unwrap();
        assert_eq!((d.converge_s, d.zero_pages, d.pages_sharing), (1.0, 5, 100));
    }

    #[test]
    fn never_settles_without_full_scans() {
        let mut st = Settler::new(3);
        for i in 0..100 {
            assert_eq!(st.push(s(i as f64, 7, 0, 0.0)), None);
        }
    }
}
