//! Sizes in configs and flags: `256M`, `1G`, or a bare number of MiB, and
//! how sizes are printed.

use serde::{Deserialize, Serialize};

use super::Error;

/// Parses sizes such as `256M`, `1G`, `512MiB`, `4096K`; a bare number is MiB.
pub fn parse_size(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| Error::Size(s.to_string()))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => 20,
        "K" | "KB" | "KIB" => 10,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "B" => 0,
        _ => return Err(Error::Size(s.to_string())),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| Error::Size(s.to_string()))
}

/// Formats bytes for people (e.g. `256 MiB`).
pub fn fmt_size(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Formats bytes exactly, in the largest unit that divides them (e.g.
/// `4097 MiB`, `1536 KiB`, `1000 B`), for messages about a size the user
/// gave: [`fmt_size`] rounds (4097 MiB would read "4.0 GiB").
pub fn fmt_size_exact(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v != 0 && v % 1024 == 0 && i < U.len() - 1 {
        v /= 1024;
        i += 1;
    }
    format!("{v} {}", U[i])
}

/// [`fmt_size_exact`], with the rounded figure too when the exact one is
/// hard to read (`24684096 KiB, about 23.5 GiB`).
pub fn fmt_size_exact_about(b: u64) -> String {
    let exact = fmt_size_exact(b);
    let about = fmt_size(b);
    if about.contains('.') {
        format!("{exact}, about {about}")
    } else {
        exact
    }
}

/// What a size looks like, for messages.
const SIZE_FORMS: &str = "an integer number of MiB (e.g. 256) or a string with a K, M, G or T suffix (e.g. \"256M\", \"1G\")";

/// A size as written in the config (`"256M"` or a number of MiB).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SizeValue {
    Mib(u64),
    Text(String),
}

/// By hand rather than `#[serde(untagged)]`, whose error for `1.5` ("data
/// did not match any variant of untagged enum SizeValue") does not say what
/// a size looks like. Whole floats (`64.0`) are taken as integers, as the
/// API does for every number.
impl<'de> Deserialize<'de> for SizeValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = SizeValue;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a size: {SIZE_FORMS}")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SizeValue, E> {
                Ok(SizeValue::Mib(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SizeValue, E> {
                u64::try_from(v)
                    .map(SizeValue::Mib)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<SizeValue, E> {
                if v.fract() == 0.0 && (0.0..1.8e19).contains(&v) {
                    Ok(SizeValue::Mib(v as u64))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SizeValue, E> {
                Ok(SizeValue::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl SizeValue {
    pub fn bytes(&self) -> Result<u64, Error> {
        match self {
            SizeValue::Mib(m) => m
                .checked_mul(1 << 20)
                .ok_or_else(|| Error::Size(m.to_string())),
            SizeValue::Text(t) => parse_size(t),
        }
    }
}
