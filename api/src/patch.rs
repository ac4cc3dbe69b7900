//! `pagefold dedup set KEY=VALUE...`: the CLI's spelling of a `PATCH
//! /api/v1/dedup` body. The words parse into the same [`DedupSettings`] as
//! the JSON body and are checked by the same [`DedupSettings::validate`], so
//! the API and the CLI accept and refuse the same things with the same
//! messages.

use pagefold_dedup::{CheckedSettings, DedupSettings, SettingsError};

/// Errors in `KEY=VALUE` words.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("{0:?}: expected KEY=VALUE")]
    Syntax(String),
    #[error("unknown setting {0:?} (expected mode, pages_to_scan, sleep_millisecs, max_page_sharing, auto_threshold, max_scanning_factor, memory_signal, max_guest_pause_us or settle)")]
    UnknownKey(String),
    #[error("invalid value for {key}: {value:?} is not a non-negative integer")]
    NotANumber { key: String, value: String },
    /// The JSON body's `true` and `false`, spelled as its words: a switch
    /// that took `1`, `yes` or `off` too would read differently here and
    /// in the body.
    #[error("invalid value for {key}: {value:?} is not true or false")]
    NotABool { key: String, value: String },
    #[error(transparent)]
    Invalid(#[from] SettingsError),
}

/// Parses and checks `KEY=VALUE` words (later words win).
pub fn from_pairs<S: AsRef<str>>(pairs: &[S]) -> Result<CheckedSettings, PatchError> {
    let mut s = DedupSettings::default();
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
            "mode" => s.mode = Some(v.parse()?),
            "pages_to_scan" => s.pages_to_scan = Some(num()?),
            "sleep_millisecs" => s.sleep_millisecs = Some(num()?),
            "max_page_sharing" => s.max_page_sharing = Some(num()?),
            "auto_threshold" => s.auto_threshold = Some(num()?),
            "max_scanning_factor" => s.max_scanning_factor = Some(num()?),
            "memory_signal" => s.memory_signal = Some(v.parse()?),
            "max_guest_pause_us" => s.max_guest_pause_us = Some(num()?),
            "settle" => {
                s.settle = Some(v.parse().map_err(|_| PatchError::NotABool {
                    key: k.to_string(),
                    value: v.to_string(),
                })?)
            }
            other => return Err(PatchError::UnknownKey(other.to_string())),
        }
    }
    Ok(s.validate()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagefold_dedup::{MemorySignal, Mode};

    #[test]
    fn pairs_parse() {
        let s = from_pairs(&["mode=auto", "pages_to_scan=500", " sleep_millisecs = 5"]).unwrap();
        assert_eq!(s.mode, Some(Mode::Auto));
        assert_eq!(s.pages_to_scan, Some(500));
        assert_eq!(s.sleep_millisecs, Some(5));
        assert_eq!(s.max_page_sharing, None);
        assert!(matches!(from_pairs(&["mode"]), Err(PatchError::Syntax(_))));
        assert!(matches!(
            from_pairs(&["foo=1"]),
            Err(PatchError::UnknownKey(_))
        ));
        let e = from_pairs(&["pages_to_scan=-1"]).unwrap_err();
        assert!(e.to_string().contains("pages_to_scan"), "{e}");
    }

    #[test]
    fn pairs_are_checked_like_the_json_body() {
        let e = from_pairs(&["pages_to_scan=0"]).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid value for pages_to_scan: 0 (valid range 1..=16777216)"
        );
        let e = from_pairs(&["max_page_sharing=1"]).unwrap_err();
        assert!(e.to_string().contains("max_page_sharing"), "{e}");
        let e = from_pairs(&["mode=sometimes"]).unwrap_err();
        assert!(e.to_string().contains("unknown dedup mode"), "{e}");
        let e = from_pairs(&["auto_threshold=101"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "auto_threshold must be a percentage in 0..=100, got 101"
        );
    }

    #[test]
    fn auto_settings_parse() {
        let s = from_pairs(&[
            "auto_threshold=30",
            "max_scanning_factor=4",
            "memory_signal=available",
        ])
        .unwrap();
        assert!(s.touches_auto());
        assert_eq!(s.auto_threshold, Some(30));
        assert_eq!(s.max_scanning_factor, Some(4));
        assert_eq!(s.memory_signal, Some(MemorySignal::Available));
        let e = from_pairs(&["memory_signal=cached"]).unwrap_err();
        assert!(e.to_string().contains("cached"), "{e}");
        assert!(!from_pairs(&["mode=on"]).unwrap().touches_auto());
    }

    #[test]
    fn settle_takes_the_json_bodys_words() {
        let s = from_pairs(&["settle=false"]).unwrap();
        assert_eq!(s.settle, Some(false));
        assert_eq!(
            serde_json::to_value(*s).unwrap(),
            serde_json::json!({"settle": false})
        );
        assert_eq!(from_pairs(&["settle = true"]).unwrap().settle, Some(true));
        for bad in ["settle=no", "settle=0", "settle=False", "settle="] {
            let e = from_pairs(&[bad]).unwrap_err();
            assert!(matches!(e, PatchError::NotABool { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("is not true or false"), "{e}");
        }
        let e = from_pairs(&["setle=false"]).unwrap_err().to_string();
        assert!(e.contains("max_guest_pause_us or settle)"), "{e}");
    }

    #[test]
    fn pairs_send_as_the_json_body() {
        let s = from_pairs(&["mode=on", "memory_signal=free"]).unwrap();
        assert_eq!(
            serde_json::to_value(*s).unwrap(),
            serde_json::json!({"mode": "on", "memory_signal": "free"})
        );
    }
}
