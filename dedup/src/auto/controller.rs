//! The auto-mode controller: decides, before every scanner wake-up, whether
//! to merge and how many pages to visit (the 2022 KSM auto-mode algorithm).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::{max_scanning_factor_limit, AutoConfig};
use super::error::AutoError;
use super::source::{MemSample, MemorySource};
use super::status::{lock, AutoHandle, AutoStatus, Shared};
use crate::policy::{RoundPlan, RoundPolicy};

/// Pages visited per wake-up while untriggered: enough to keep checksums
/// (volatility history) warm, cheap enough to be noise.
pub const UNTRIGGERED_PAGES_PER_WAKEUP: u64 = 5;

/// Drives a scanner in auto mode. Owned by the scanner thread; the API reads
/// it through [`AutoController::handle`].
///
/// Per wake-up ("round"):
/// - untriggered: visit `min(5, pages_to_scan)` pages, checksum only;
/// - triggered: visit `pages_to_scan * scanning_factor` pages and merge.
///
/// The factor follows the merges of the previous triggered wake-up `new`
/// against the one before it `prev`: `new == 0` halves it (floor 1),
/// `new > prev / 2` doubles it (cap: `max_scanning_factor`, and never more
/// than total RAM pages / `pages_to_scan`), anything else keeps it.
///
/// First round after triggering: the factor starts at 1 and there is no
/// previous *triggered* round. The untriggered rounds before it made no
/// merges by construction, so `prev` is taken as 0: if the first triggered
/// wake-up merged anything the factor doubles to 2, otherwise it stays 1.
/// The `last_round_merges` passed to the `plan()` that triggers (it belongs
/// to a checksum-only round) is ignored. Stopping resets the factor to 1.
pub struct AutoController {
    config: AutoConfig,
    source: Box<dyn MemorySource>,
    shared: Arc<Mutex<Shared>>,
    sample: MemSample,
    sampled_at: Instant,
    triggered: bool,
    factor: u64,
    /// Merges of the last finished triggered wake-up (`None`: none yet in
    /// this triggered period).
    prev_merges: Option<u64>,
    /// The wake-up planned last time was allowed to merge.
    last_plan_merge: bool,
    psi_streak: u32,
    psi_pressure: bool,
    triggered_times: u64,
    rounds: u64,
    triggered_rounds: u64,
    sample_errors: u64,
    last_error: Option<String>,
}

impl AutoController {
    /// Samples `source` once (so status has real figures from the start) and
    /// validates `config` against that total and the `pages_to_scan` knob.
    pub fn new(
        config: AutoConfig,
        mut source: Box<dyn MemorySource>,
        pages_to_scan: u64,
    ) -> Result<Self, AutoError> {
        let sample = source.sample()?;
        if sample.total_bytes == 0 {
            return Err(AutoError::ZeroTotal);
        }
        config.validate(sample.total_bytes, pages_to_scan)?;
        let mut c = Self {
            config,
            source,
            shared: Arc::new(Mutex::new(Shared {
                status: placeholder_status(&config),
                config,
                pending: None,
            })),
            sample,
            sampled_at: Instant::now(),
            triggered: false,
            factor: 1,
            prev_merges: None,
            last_plan_merge: false,
            psi_streak: 0,
            psi_pressure: false,
            triggered_times: 0,
            rounds: 0,
            triggered_rounds: 0,
            sample_errors: 0,
            last_error: None,
        };
        c.update_psi();
        c.publish(pages_to_scan, 0);
        Ok(c)
    }

    /// A handle other threads read the status through.
    pub fn handle(&self) -> AutoHandle {
        AutoHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The status as of the last plan.
    pub fn status(&self) -> AutoStatus {
        lock(&self.shared).status.clone()
    }

    /// Merging is currently allowed.
    pub fn is_triggered(&self) -> bool {
        self.triggered
    }

    fn maybe_sample(&mut self) {
        let interval = Duration::from_millis(self.config.sample_interval_ms);
        if self.sampled_at.elapsed() < interval {
            return;
        }
        self.sampled_at = Instant::now();
        match self.source.sample() {
            Ok(s) if s.total_bytes > 0 => {
                self.sample = s;
                self.update_psi();
            }
            Ok(_) => self.record_error(AutoError::ZeroTotal),
            Err(e) => self.record_error(e),
        }
    }

    fn record_error(&mut self, e: AutoError) {
        // Keep deciding on the last good sample rather than flapping.
        log::warn!("auto mode: memory sample failed, reusing the last one: {e}");
        self.sample_errors += 1;
        self.last_error = Some(e.to_string());
    }

    /// Updates the sustained-pressure state from the current sample.
    fn update_psi(&mut self) {
        let (Some(t), Some(psi)) = (self.config.psi_trigger, self.sample.psi) else {
            self.psi_streak = 0;
            self.psi_pressure = false;
            return;
        };
        let v = t.metric.of(&psi);
        self.psi_streak = if v >= t.trigger_pct {
            self.psi_streak.saturating_add(1)
        } else {
            0
        };
        if !self.psi_pressure && self.psi_streak >= t.sustain_samples {
            self.psi_pressure = true;
        } else if self.psi_pressure && v < t.release_pct {
            self.psi_pressure = false;
        }
    }

    fn factor_cap(&self, pages_to_scan: u64) -> u64 {
        self.config
            .max_scanning_factor
            .min(max_scanning_factor_limit(
                self.sample.total_bytes,
                pages_to_scan,
            ))
            .max(1)
    }

    /// Applies the doubling/halving rule to the wake-up that just ended.
    fn adjust_factor(&mut self, new: u64, pages_to_scan: u64) {
        let prev = self.prev_merges.unwrap_or(0);
        if new == 0 {
            self.factor = (self.factor / 2).max(1);
        } else if new.saturating_mul(2) > prev {
            self.factor = self.factor.saturating_mul(2);
        }
        self.factor = self.factor.min(self.factor_cap(pages_to_scan));
        self.prev_merges = Some(new);
    }

    /// Trigger/stop with hysteresis: nothing changes between the two lines.
    fn update_trigger(&mut self) {
        let total = self.sample.total_bytes;
        let signal = self.config.memory_signal.of(&self.sample);
        if !self.triggered {
            if signal < self.config.trigger_bytes(total) || self.psi_pressure {
                self.triggered = true;
                self.triggered_times += 1;
                self.factor = 1;
                self.prev_merges = None;
            }
        } else if signal > self.config.stop_bytes(total) && !self.psi_pressure {
            self.triggered = false;
            self.factor = 1;
            self.prev_merges = None;
        }
    }

    fn apply_pending(&mut self) {
        let pending = lock(&self.shared).pending.take();
        if let Some(c) = pending {
            let psi_changed = c.psi_trigger != self.config.psi_trigger;
            self.config = c;
            if psi_changed {
                self.psi_streak = 0;
                self.psi_pressure = false;
                self.update_psi();
            }
        }
    }

    fn publish(&self, pages_to_scan: u64, plan_pages: u64) {
        let total = self.sample.total_bytes;
        let mut s = lock(&self.shared);
        s.config = self.config;
        s.status = AutoStatus {
            auto_triggered: self.triggered,
            scanning_factor: self.factor,
            triggered_times: self.triggered_times,
            threshold_pct: self.config.threshold_pct,
            max_scanning_factor: self.config.max_scanning_factor,
            effective_max_scanning_factor: self.factor_cap(pages_to_scan),
            trigger_bytes: self.config.trigger_bytes(total),
            stop_bytes: self.config.stop_bytes(total),
            total_bytes: total,
            free_bytes: self.sample.free_bytes,
            available_bytes: self.sample.available_bytes,
            memory_signal: self.config.memory_signal,
            psi: self.sample.psi,
            psi_pressure: self.psi_pressure,
            rounds: self.rounds,
            triggered_rounds: self.triggered_rounds,
            pages_to_scan,
            last_plan_pages: plan_pages,
            last_plan_merge: self.last_plan_merge,
            sample_errors: self.sample_errors,
            last_error: self.last_error.clone(),
        };
    }
}

fn placeholder_status(c: &AutoConfig) -> AutoStatus {
    AutoStatus {
        auto_triggered: false,
        scanning_factor: 1,
        triggered_times: 0,
        threshold_pct: c.threshold_pct,
        max_scanning_factor: c.max_scanning_factor,
        effective_max_scanning_factor: c.max_scanning_factor,
        trigger_bytes: 0,
        stop_bytes: 0,
        total_bytes: 0,
        free_bytes: 0,
        available_bytes: 0,
        memory_signal: c.memory_signal,
        psi: None,
        psi_pressure: false,
        rounds: 0,
        triggered_rounds: 0,
        pages_to_scan: 0,
        last_plan_pages: 0,
        last_plan_merge: false,
        sample_errors: 0,
        last_error: None,
    }
}

impl RoundPolicy for AutoController {
    fn plan(&mut self, last_round_merges: u64, pages_to_scan: u64) -> RoundPlan {
        let pages_to_scan = pages_to_scan.max(1);
        self.apply_pending();
        self.maybe_sample();
        if self.last_plan_merge && self.triggered {
            self.adjust_factor(last_round_merges, pages_to_scan);
        }
        self.update_trigger();
        let plan = if self.triggered {
            self.factor = self.factor.min(self.factor_cap(pages_to_scan));
            self.triggered_rounds += 1;
            RoundPlan {
                pages_to_visit: pages_to_scan.saturating_mul(self.factor),
                merge: true,
            }
        } else {
            RoundPlan {
                pages_to_visit: UNTRIGGERED_PAGES_PER_WAKEUP.min(pages_to_scan),
                merge: false,
            }
        };
        self.last_plan_merge = plan.merge;
        self.rounds += 1;
        self.publish(pages_to_scan, plan.pages_to_visit);
        plan
    }
}

#[cfg(test)]
mod tests;
