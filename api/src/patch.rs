//! Dedup updates (`PATCH /api/v1/dedup`, `pagefold dedup set KEY=VALUE`):
//! one type and one validation path, so the API and the CLI accept and
//! refuse exactly the same things with the same messages.

use pagefold_dedup::auto::{AutoConfig, MemorySignal};
use pagefold_dedup::{KnobUpdate, Knobs, Mode};
use serde::{Deserialize, Serialize};

/// Errors in a dedup update.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("{0:?}: expected KEY=VALUE")]
    Syntax(String),
    #[error("unknown setting {0:?} (expected mode, pages_to_scan, sleep_millisecs, max_page_sharing, auto_threshold, max_scanning_factor or memory_signal)")]
    UnknownKey(String),
    #[error("invalid value for {key}: {value:?} is not a non-negative integer")]
    NotANumber { key: String, value: String },
    #[error(transparent)]
    Invalid(#[from] pagefold_dedup::Error),
    #[error(transparent)]
    Auto(#[from] pagefold_dedup::auto::AutoError),
}

/// A partial change of the dedup mode and knobs; absent fields stay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages_to_scan: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_millisecs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_page_sharing: Option<u64>,
    /// Auto mode: merge while free memory is below this percent of RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_threshold: Option<u64>,
    /// Auto mode: cap of the scanning factor while triggered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_scanning_factor: Option<u64>,
    /// Auto mode: `free` or `available` memory is compared to the threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_signal: Option<String>,
}

/// A checked [`DedupPatch`], ready for the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    pub mode: Option<Mode>,
    pub knobs: KnobUpdate,
    /// The knobs as they will be once applied.
    pub result: Knobs,
}

impl DedupPatch {
    /// Builds a patch from `KEY=VALUE` words (the CLI's syntax).
    pub fn from_pairs<S: AsRef<str>>(pairs: &[S]) -> Result<DedupPatch, PatchError> {
        let mut p = DedupPatch::default();
        for pair in pairs {
            let pair = pair.as_ref();
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| PatchError::Syntax(pair.to_string()))?;
            let (k, v) = (k.trim(), v.trim());
            let num = || {
                v.parse::<u64>().map_err(|_| PatchError::NotANumber {
                    key: k.to_string(),
                    value: v.to_string(),
                })
            };
            match k {
                "mode" => p.mode = Some(v.to_string()),
                "pages_to_scan" => p.pages_to_scan = Some(num()?),
                "sleep_millisecs" => p.sleep_millisecs = Some(num()?),
                "max_page_sharing" => p.max_page_sharing = Some(num()?),
                "auto_threshold" => p.auto_threshold = Some(num()?),
                "max_scanning_factor" => p.max_scanning_factor = Some(num()?),
                "memory_signal" => p.memory_signal = Some(v.to_string()),
                other => return Err(PatchError::UnknownKey(other.to_string())),
            }
        }
        Ok(p)
    }

    /// Checks the patch against the current knobs: the mode must be known,
    /// and every knob, once applied, within its range.
    pub fn check(&self, current: &Knobs) -> Result<Checked, PatchError> {
        let mode = self.mode.as_deref().map(str::parse::<Mode>).transpose()?;
        let knobs = KnobUpdate {
            pages_to_scan: self.pages_to_scan,
            sleep_millisecs: self.sleep_millisecs,
            max_page_sharing: self.max_page_sharing,
        };
        let result = knobs.apply(current)?;
        Ok(Checked {
            mode,
            knobs,
            result,
        })
    }

    /// True if the patch changes auto-mode settings.
    pub fn touches_auto(&self) -> bool {
        self.auto_threshold.is_some()
            || self.max_scanning_factor.is_some()
            || self.memory_signal.is_some()
    }

    /// The auto-mode settings once the patch is applied to `current` (the
    /// range checks that need the host's RAM are the controller's, at
    /// `set_config`).
    pub fn auto_config(&self, current: AutoConfig) -> Result<AutoConfig, PatchError> {
        let mut c = current;
        if let Some(t) = self.auto_threshold {
            c.threshold_pct = t;
        }
        if let Some(f) = self.max_scanning_factor {
            c.max_scanning_factor = f;
        }
        if let Some(s) = &self.memory_signal {
            c.memory_signal = s.parse::<MemorySignal>()?;
        }
        Ok(c)
    }

    pub fn is_empty(&self) -> bool {
        *self == DedupPatch::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Knobs = Knobs {
        pages_to_scan: 100,
        sleep_millisecs: 20,
        max_page_sharing: 256,
    };

    #[test]
    fn pairs_parse() {
        let p = DedupPatch::from_pairs(&["mode=auto", "pages_to_scan=500", " sleep_millisecs = 5"])
            .unwrap();
        assert_eq!(p.mode.as_deref(), Some("auto"));
        assert_eq!(p.pages_to_scan, Some(500));
        assert_eq!(p.sleep_millisecs, Some(5));
        assert_eq!(p.max_page_sharing, None);
        assert!(matches!(
            DedupPatch::from_pairs(&["mode"]),
            Err(PatchError::Syntax(_))
        ));
        assert!(matches!(
            DedupPatch::from_pairs(&["foo=1"]),
            Err(PatchError::UnknownKey(_))
        ));
        let e = DedupPatch::from_pairs(&["pages_to_scan=-1"]).unwrap_err();
        assert!(e.to_string().contains("pages_to_scan"), "{e}");
    }

    #[test]
    fn check_names_the_field_and_range() {
        let p = DedupPatch {
            pages_to_scan: Some(0),
            ..Default::default()
        };
        let e = p.check(&K).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid value for pages_to_scan: 0 (valid range 1..=16777216)"
        );
        let p = DedupPatch {
            max_page_sharing: Some(1),
            ..Default::default()
        };
        assert!(p
            .check(&K)
            .unwrap_err()
            .to_string()
            .contains("max_page_sharing"));
        let p = DedupPatch {
            mode: Some("sometimes".into()),
            ..Default::default()
        };
        assert!(p
            .check(&K)
            .unwrap_err()
            .to_string()
            .contains("unknown dedup mode"));
    }

    #[test]
    fn check_applies_partial_updates() {
        let p = DedupPatch {
            mode: Some("on".into()),
            sleep_millisecs: Some(7),
            ..Default::default()
        };
        let c = p.check(&K).unwrap();
        assert_eq!(c.mode, Some(Mode::On));
        assert_eq!(
            c.result,
            Knobs {
                sleep_millisecs: 7,
                ..K
            }
        );
        assert!(DedupPatch::default().is_empty());
        assert!(!p.is_empty());
    }

    #[test]
    fn auto_settings_parse_and_apply() {
        let p = DedupPatch::from_pairs(&[
            "auto_threshold=30",
            "max_scanning_factor=4",
            "memory_signal=available",
        ])
        .unwrap();
        assert!(p.touches_auto());
        let c = p.auto_config(AutoConfig::default()).unwrap();
        assert_eq!(c.threshold_pct, 30);
        assert_eq!(c.max_scanning_factor, 4);
        assert_eq!(c.memory_signal, MemorySignal::Available);
        let bad = DedupPatch::from_pairs(&["memory_signal=cached"]).unwrap();
        assert!(bad
            .auto_config(AutoConfig::default())
            .unwrap_err()
            .to_string()
            .contains("cached"));
        assert!(!DedupPatch::from_pairs(&["mode=on"]).unwrap().touches_auto());
    }

    #[test]
    fn json_form_rejects_unknown_fields() {
        let e = serde_json::from_str::<DedupPatch>(r#"{"pages_to_scann": 3}"#).unwrap_err();
        assert!(e.to_string().contains("pages_to_scann"));
    }
}
