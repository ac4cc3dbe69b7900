//! The hook through which auto mode steers a backend's scan loop.

/// What the scanner does in its next wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundPlan {
    /// Pages to visit in this wake-up: the `pages_to_scan` knob times auto
    /// mode's scanning factor, or fewer while it only checksums.
    pub pages_to_visit: u64,
    /// If false, only checksum pages (keep the volatility history warm):
    /// never compare, never merge.
    pub merge: bool,
}

/// Decides each round of the scanner. Implemented by the auto controller.
pub trait RoundPolicy: Send {
    /// Called before each wake-up's scan with the number of merges the
    /// previous wake-up made; `pages_to_scan` is the configured knob.
    fn plan(&mut self, last_round_merges: u64, pages_to_scan: u64) -> RoundPlan;
}
