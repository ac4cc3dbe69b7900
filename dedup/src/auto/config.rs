//! Auto-mode configuration and its validation.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::AutoError;
use super::source::{MemSample, Psi};
use crate::settings::{check_threshold, DedupSettings, MemorySignal};

/// Default `auto_threshold`: merge once less than 20 % of RAM is left (the
/// proposal's default).
pub const DEFAULT_THRESHOLD_PCT: u64 = 20;
/// Default cap on the scanning factor (the proposal's default).
pub const DEFAULT_MAX_SCANNING_FACTOR: u64 = 16;
/// Default minimum time between two memory samples.
pub const DEFAULT_SAMPLE_INTERVAL_MS: u64 = 200;

/// The host page size in bytes.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

impl MemorySignal {
    /// The bytes this signal reads from a sample.
    pub fn of(self, s: &MemSample) -> u64 {
        match self {
            MemorySignal::Free => s.free_bytes,
            MemorySignal::Available => s.available_bytes,
        }
    }
}

/// Which PSI average a [`PsiTrigger`] watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PsiMetric {
    /// `some avg10`: share of the last 10 s in which some task stalled on memory.
    #[default]
    SomeAvg10,
    /// `some avg60`: the same over 60 s.
    SomeAvg60,
    /// `full avg10`: share of the last 10 s in which every runnable task stalled.
    FullAvg10,
    /// `full avg60`: the same over 60 s.
    FullAvg60,
}

impl PsiMetric {
    /// This metric's value in a PSI sample.
    pub fn of(self, p: &Psi) -> f64 {
        match self {
            PsiMetric::SomeAvg10 => p.some_avg10,
            PsiMetric::SomeAvg60 => p.some_avg60,
            PsiMetric::FullAvg10 => p.full_avg10,
            PsiMetric::FullAvg60 => p.full_avg60,
        }
    }
}

impl FromStr for PsiMetric {
    type Err = AutoError;
    fn from_str(s: &str) -> Result<Self, AutoError> {
        match s {
            "some_avg10" => Ok(PsiMetric::SomeAvg10),
            "some_avg60" => Ok(PsiMetric::SomeAvg60),
            "full_avg10" => Ok(PsiMetric::FullAvg10),
            "full_avg60" => Ok(PsiMetric::FullAvg60),
            other => Err(AutoError::UnknownPsiMetric(other.to_string())),
        }
    }
}

/// Also trigger on sustained memory pressure, not only on low free memory:
/// reclaim stalls can hurt before free memory crosses the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PsiTrigger {
    /// The PSI average watched.
    pub metric: PsiMetric,
    /// Pressure counts once `metric >= trigger_pct` ...
    pub trigger_pct: f64,
    /// ... for this many consecutive samples (one noisy sample is not
    /// "sustained").
    pub sustain_samples: u32,
    /// Pressure counts as gone once `metric < release_pct` (hysteresis).
    pub release_pct: f64,
}

impl Default for PsiTrigger {
    fn default() -> Self {
        Self {
            metric: PsiMetric::SomeAvg10,
            trigger_pct: 10.0,
            sustain_samples: 5,
            release_pct: 5.0,
        }
    }
}

/// Auto-mode settings (the proposal's sysfs knobs plus pagefold's additions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoConfig {
    /// Percent of total RAM: merge while free memory is below it.
    pub threshold_pct: u64,
    /// Cap of the scanning factor while triggered.
    pub max_scanning_factor: u64,
    /// Which host figure the threshold is compared with: free or available memory.
    pub memory_signal: MemorySignal,
    /// Also merge under sustained memory pressure (`None`: free memory alone decides).
    pub psi_trigger: Option<PsiTrigger>,
    /// Memory is sampled at most this often (ms); `plan()` in between reuses
    /// the last sample. 0 samples on every call.
    pub sample_interval_ms: u64,
}

impl Default for AutoConfig {
    fn default() -> Self {
        Self {
            threshold_pct: DEFAULT_THRESHOLD_PCT,
            max_scanning_factor: DEFAULT_MAX_SCANNING_FACTOR,
            memory_signal: MemorySignal::default(),
            psi_trigger: None,
            sample_interval_ms: DEFAULT_SAMPLE_INTERVAL_MS,
        }
    }
}

/// The largest valid `max_scanning_factor`: one wake-up must not be asked to
/// scan more than all of RAM. At least 1, since `pages_to_scan` itself is the
/// user's own knob.
pub fn max_scanning_factor_limit(total_bytes: u64, pages_to_scan: u64) -> u64 {
    (total_bytes / page_size() / pages_to_scan.max(1)).max(1)
}

impl AutoConfig {
    /// This configuration with the auto-mode settings of `s` put over it.
    pub fn overlaid(self, s: &DedupSettings) -> AutoConfig {
        AutoConfig {
            threshold_pct: s.auto_threshold.unwrap_or(self.threshold_pct),
            max_scanning_factor: s.max_scanning_factor.unwrap_or(self.max_scanning_factor),
            memory_signal: s.memory_signal.unwrap_or(self.memory_signal),
            ..self
        }
    }

    /// Checks every field. `total_bytes` and `pages_to_scan` bound
    /// `max_scanning_factor` to `1..=total RAM pages / pages_to_scan`.
    pub fn validate(&self, total_bytes: u64, pages_to_scan: u64) -> Result<(), AutoError> {
        check_threshold(self.threshold_pct)?;
        let max = max_scanning_factor_limit(total_bytes, pages_to_scan);
        // The proposal tested `value < 1 && value > max`, which no value can
        // satisfy; both bounds are checked here.
        if self.max_scanning_factor < 1 || self.max_scanning_factor > max {
            return Err(AutoError::MaxScanningFactor {
                value: self.max_scanning_factor,
                max,
                total_pages: total_bytes / page_size(),
                pages_to_scan,
            });
        }
        if let Some(p) = &self.psi_trigger {
            let pct = |v: f64| (0.0..=100.0).contains(&v);
            if !pct(p.trigger_pct) || !pct(p.release_pct) {
                return Err(AutoError::PsiTrigger(format!(
                    "trigger_pct {} and release_pct {} must be in 0..=100",
                    p.trigger_pct, p.release_pct
                )));
            }
            if p.release_pct > p.trigger_pct {
                return Err(AutoError::PsiTrigger(format!(
                    "release_pct {} is above trigger_pct {}",
                    p.release_pct, p.trigger_pct
                )));
            }
            if p.sustain_samples == 0 {
                return Err(AutoError::PsiTrigger("sustain_samples must be >= 1".into()));
            }
        }
        Ok(())
    }

    /// Merging starts below this many bytes of free memory.
    pub fn trigger_bytes(&self, total_bytes: u64) -> u64 {
        (u128::from(total_bytes) * u128::from(self.threshold_pct) / 100) as u64
    }

    /// Merging stops above this many bytes: threshold + total/16.
    pub fn stop_bytes(&self, total_bytes: u64) -> u64 {
        self.trigger_bytes(total_bytes)
            .saturating_add(total_bytes / 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_validate() {
        AutoConfig::default().validate(24 * GIB, 100).unwrap();
        assert_eq!(AutoConfig::default().memory_signal, MemorySignal::Available);
    }

    #[test]
    fn threshold_over_100_is_rejected() {
        let c = AutoConfig {
            threshold_pct: 101,
            ..Default::default()
        };
        let e = c.validate(GIB, 100).unwrap_err();
        assert!(matches!(
            e,
            AutoError::Settings(crate::settings::SettingsError::Threshold(101))
        ));
        assert!(e.to_string().contains("0..=100"), "{e}");
        for pct in [0, 100] {
            AutoConfig {
                threshold_pct: pct,
                ..Default::default()
            }
            .validate(GIB, 100)
            .unwrap();
        }
    }

    #[test]
    fn max_scanning_factor_range_is_enforced_on_both_ends() {
        let pages = GIB / page_size(); // 262144 with 4 KiB pages
        let ok_max = pages / 100;
        let cfg = |v| AutoConfig {
            max_scanning_factor: v,
            ..Default::default()
        };
        let e = cfg(0).validate(GIB, 100).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("1..={ok_max}")), "{msg}");
        assert!(msg.contains("got 0"), "{msg}");
        cfg(1).validate(GIB, 100).unwrap();
        cfg(ok_max).validate(GIB, 100).unwrap();
        let e = cfg(ok_max + 1).validate(GIB, 100).unwrap_err();
        assert!(
            matches!(e, AutoError::MaxScanningFactor { value, max, .. } if value == ok_max + 1 && max == ok_max)
        );
        // pages_to_scan larger than RAM: factor 1 (the knob itself) stays valid.
        cfg(1).validate(GIB, pages * 2).unwrap();
        assert!(cfg(2).validate(GIB, pages * 2).is_err());
    }

    #[test]
    fn psi_trigger_is_validated() {
        let bad = |t: PsiTrigger| {
            AutoConfig {
                psi_trigger: Some(t),
                ..Default::default()
            }
            .validate(GIB, 100)
            .unwrap_err()
        };
        let d = PsiTrigger::default();
        assert!(matches!(
            bad(PsiTrigger {
                trigger_pct: 101.0,
                ..d
            }),
            AutoError::PsiTrigger(_)
        ));
        assert!(bad(PsiTrigger {
            release_pct: 20.0,
            ..d
        })
        .to_string()
        .contains("above trigger_pct"));
        assert!(bad(PsiTrigger {
            sustain_samples: 0,
            ..d
        })
        .to_string()
        .contains("sustain_samples"));
    }

    #[test]
    fn thresholds_in_bytes() {
        let c = AutoConfig::default();
        assert_eq!(c.trigger_bytes(1000), 200);
        assert_eq!(c.stop_bytes(1000), 200 + 62);
        // No overflow for huge totals.
        assert_eq!(c.trigger_bytes(u64::MAX), u64::MAX / 5);
    }

    #[test]
    fn names_parse() {
        assert_eq!(
            "full_avg60".parse::<PsiMetric>().unwrap(),
            PsiMetric::FullAvg60
        );
    }
}
