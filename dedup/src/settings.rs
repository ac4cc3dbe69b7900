//! The dedup settings, typed once for every way in.
//!
//! [`Mode`], [`MemorySignal`] and [`BackendKind`] are parsed by name here
//! (serde, `FromStr`, and clap behind the `clap` feature, all with the same
//! messages). [`DedupSettings`] is the one partial set of settings (mode,
//! knobs, auto mode) that the config file's `[dedup]` (flattened), the CLI's
//! flags (flattened) and the API's `PATCH /dedup` body all parse into.
//! [`DedupSettings::validate`] is the one range check, run where the input
//! is parsed; it yields [`CheckedSettings`], the only form a backend's
//! `apply` takes, so nothing downstream checks (or can forget to check)
//! again.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A setting that is out of range or not a known name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// A knob outside its valid range.
    #[error("invalid value for {name}: {value} (valid range {min}..={max})")]
    OutOfRange {
        /// The knob.
        name: &'static str,
        /// The value asked for.
        value: u64,
        /// Smallest valid value.
        min: u64,
        /// Largest valid value.
        max: u64,
    },
    /// `auto_threshold` is a percentage of total RAM.
    #[error("auto_threshold must be a percentage in 0..=100, got {0}")]
    Threshold(u64),
    /// A mode name that is not one of off, on, unmerge, auto.
    #[error("unknown dedup mode {0:?} (expected off, on, unmerge or auto)")]
    UnknownMode(String),
    /// A memory signal that is not free or available.
    #[error("unknown memory signal {0:?} (expected free or available)")]
    UnknownMemorySignal(String),
    /// A backend name that is not pagefold or ksm.
    #[error("unknown backend {0:?} (expected pagefold or ksm)")]
    UnknownBackend(String),
}

/// Gives a unit enum its one spelling: `Display`, `FromStr` and serde all
/// use the same names (the API and the config file show what they accept).
macro_rules! named {
    ($t:ident, $unknown:ident, { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            /// The one spelling of this value.
            pub fn as_str(self) -> &'static str {
                match self { $($t::$v => $s),+ }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $t {
            type Err = SettingsError;
            fn from_str(s: &str) -> Result<Self, SettingsError> {
                match s {
                    $($s => Ok($t::$v),)+
                    other => Err(SettingsError::$unknown(other.to_string())),
                }
            }
        }
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Run mode, as KSM's `run` plus the auto mode of the 2022 proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(
    feature = "utoipa",
    derive(utoipa::ToSchema),
    schema(rename_all = "lowercase")
)]
pub enum Mode {
    /// No scanning, merged pages stay merged.
    #[default]
    Off,
    /// Scan and merge continuously.
    On,
    /// Give every merged page back its own private copy, then stop.
    Unmerge,
    /// Merge only while host free memory is low (see `auto`).
    Auto,
}
named!(Mode, UnknownMode, { Off => "off", On => "on", Unmerge => "unmerge", Auto => "auto" });

/// Which `/proc/meminfo` figure counts as "free memory" in auto mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[cfg_attr(
    feature = "utoipa",
    derive(utoipa::ToSchema),
    schema(rename_all = "lowercase")
)]
pub enum MemorySignal {
    /// `MemFree`, what the 2022 proposal used (NR_FREE_PAGES). On a host that
    /// has done file I/O, page cache keeps it low although the memory is
    /// reclaimable, so auto mode would merge (and pay COW latency) for nothing.
    Free,
    /// `MemAvailable` (default): the kernel's own estimate of what can be
    /// allocated without swapping, i.e. free plus reclaimable cache.
    #[default]
    Available,
}
named!(MemorySignal, UnknownMemorySignal, { Free => "free", Available => "available" });

/// Which backend deduplicates: chosen once, at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum BackendKind {
    /// pagefold's userspace engine.
    #[default]
    Pagefold,
    /// The kernel's KSM.
    Ksm,
}
named!(BackendKind, UnknownBackend, { Pagefold => "pagefold", Ksm => "ksm" });

/// Tunables shared by the backends (KSM names), all of them set: what a
/// backend runs with. [`DedupSettings`] is the partial form that input
/// parses into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Knobs {
    // The schema's ranges are `RANGES` (pagefold-api's spec test checks).
    /// Pages scanned per wake-up.
    #[cfg_attr(feature = "utoipa", schema(minimum = 1, maximum = 16777216))]
    pub pages_to_scan: u64,
    /// Sleep between wake-ups, ms.
    #[cfg_attr(feature = "utoipa", schema(maximum = 60000))]
    pub sleep_millisecs: u64,
    /// Most pages that may share one merged page.
    #[cfg_attr(feature = "utoipa", schema(minimum = 2, maximum = 65536))]
    pub max_page_sharing: u64,
}

impl Knobs {
    /// Valid range of `pages_to_scan`.
    pub const PAGES_TO_SCAN: (u64, u64) = (1, 1 << 24);
    /// Valid range of `sleep_millisecs`.
    pub const SLEEP_MILLISECS: (u64, u64) = (0, 60_000);
    /// Valid range of `max_page_sharing`.
    pub const MAX_PAGE_SHARING: (u64, u64) = (2, 1 << 16);
    /// Every knob's name and valid range (inclusive), for clients.
    pub const RANGES: [(&'static str, (u64, u64)); 3] = [
        ("pages_to_scan", Self::PAGES_TO_SCAN),
        ("sleep_millisecs", Self::SLEEP_MILLISECS),
        ("max_page_sharing", Self::MAX_PAGE_SHARING),
    ];

    fn values(&self) -> [u64; 3] {
        [
            self.pages_to_scan,
            self.sleep_millisecs,
            self.max_page_sharing,
        ]
    }

    /// Checks every knob against its valid range (knobs built in code, such
    /// as an `EngineConfig`'s; parsed input goes through
    /// [`DedupSettings::validate`]).
    pub fn validate(&self) -> Result<(), SettingsError> {
        for ((name, range), v) in Self::RANGES.into_iter().zip(self.values()) {
            check(name, v, range)?;
        }
        Ok(())
    }
}

/// Checks `value` against an inclusive range, naming the setting.
fn check(name: &'static str, value: u64, (min, max): (u64, u64)) -> Result<(), SettingsError> {
    if value < min || value > max {
        return Err(SettingsError::OutOfRange {
            name,
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// Checks an `auto_threshold` (a percentage of total RAM).
pub fn check_threshold(pct: u64) -> Result<(), SettingsError> {
    if pct > 100 {
        return Err(SettingsError::Threshold(pct));
    }
    Ok(())
}

/// Default longest park of the guests at once, in microseconds
/// ([`DedupSettings::max_guest_pause_us`]): below a millisecond, the stop
/// that latency-sensitive guests start to notice, with room for the one
/// merge window that may run past it.
pub const DEFAULT_MAX_GUEST_PAUSE_US: u64 = 500;

/// Valid range of [`DedupSettings::max_guest_pause_us`]: up to a second.
pub const MAX_GUEST_PAUSE_US: (u64, u64) = (0, 1_000_000);

/// Where `--help` lists the settings' flags.
#[cfg(feature = "clap")]
const HEADING: &str = "Deduplication";

/// A partial change of the dedup settings; absent fields stay as they are.
/// The config file's `[dedup]`, the CLI's flags and the `PATCH /dedup` body
/// are all this type (the field docs are the flags' help).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct DedupSettings {
    /// Dedup mode (auto: merge only while host memory is short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "clap",
        arg(long = "dedup", value_name = "MODE", help_heading = HEADING, value_parser = flag::named::<Mode>())
    )]
    pub mode: Option<Mode>,
    /// Pages scanned per wake-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(minimum = 1, maximum = 16777216))]
    pub pages_to_scan: Option<u64>,
    /// Sleep between wake-ups, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "MS", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(maximum = 60000))]
    pub sleep_millisecs: Option<u64>,
    /// Most sites that may map one shared page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(minimum = 2, maximum = 65536))]
    pub max_page_sharing: Option<u64>,
    /// Auto mode: merge while free memory is below this percent of RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "PCT", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(maximum = 100))]
    pub auto_threshold: Option<u64>,
    /// Auto mode: cap of the scanning factor (x pages_to_scan) while triggered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(minimum = 1))]
    pub max_scanning_factor: Option<u64>,
    /// Auto mode: which memory figure (MemFree or MemAvailable) is compared to the threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "SIGNAL", help_heading = HEADING, value_parser = flag::named::<MemorySignal>())
    )]
    pub memory_signal: Option<MemorySignal>,
    /// pagefold backend: longest stop of a VM's vCPUs for a merge batch, in
    /// microseconds (0: never stop them, and let each merge's TLB flushes
    /// reach the running vCPUs). Default 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "US", help_heading = HEADING))]
    #[cfg_attr(feature = "utoipa", schema(maximum = 1000000))]
    pub max_guest_pause_us: Option<u64>,
    /// pagefold backend: slow the scan while the guests undo its merges
    /// (default true); false keeps its full pace whatever they do.
    // Run-time, unlike the engine's construction options: whether settling
    // pays depends on the guests of the moment, so an operator may turn it
    // off (or back on) while they run. The KSM backend takes it and has
    // nothing to settle, as with `max_guest_pause_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "BOOL", help_heading = HEADING))]
    pub settle: Option<bool>,
}

impl DedupSettings {
    /// No setting given (a `const` [`Default`]).
    pub const NONE: DedupSettings = DedupSettings {
        mode: None,
        pages_to_scan: None,
        sleep_millisecs: None,
        max_page_sharing: None,
        auto_threshold: None,
        max_scanning_factor: None,
        memory_signal: None,
        max_guest_pause_us: None,
        settle: None,
    };

    /// The one range check of parsed settings: every knob given within its
    /// range, `auto_threshold` a percentage. (`max_scanning_factor` is
    /// bounded by the host's RAM and the knob in force: the auto
    /// controller checks it when it takes the settings; `settle` is valid
    /// either way.)
    pub fn validate(self) -> Result<CheckedSettings, SettingsError> {
        let knobs = [
            self.pages_to_scan,
            self.sleep_millisecs,
            self.max_page_sharing,
        ];
        for ((name, range), v) in Knobs::RANGES.into_iter().zip(knobs) {
            if let Some(v) = v {
                check(name, v, range)?;
            }
        }
        if let Some(t) = self.auto_threshold {
            check_threshold(t)?;
        }
        if let Some(us) = self.max_guest_pause_us {
            check("max_guest_pause_us", us, MAX_GUEST_PAUSE_US)?;
        }
        Ok(CheckedSettings(self))
    }

    /// The knobs of `base` with the ones given here put over them.
    pub fn knobs_over(&self, base: Knobs) -> Knobs {
        Knobs {
            pages_to_scan: self.pages_to_scan.unwrap_or(base.pages_to_scan),
            sleep_millisecs: self.sleep_millisecs.unwrap_or(base.sleep_millisecs),
            max_page_sharing: self.max_page_sharing.unwrap_or(base.max_page_sharing),
        }
    }

    /// True if any auto-mode setting is given (`auto::AutoConfig::overlaid`
    /// puts them over a configuration).
    pub fn touches_auto(&self) -> bool {
        self.auto_threshold.is_some()
            || self.max_scanning_factor.is_some()
            || self.memory_signal.is_some()
    }
}

/// [`DedupSettings`] that passed [`DedupSettings::validate`]: what the
/// config file holds (checked as it is parsed) and what backends apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "DedupSettings", into = "DedupSettings")]
pub struct CheckedSettings(DedupSettings);

impl CheckedSettings {
    /// These settings, with those of `under` wherever these have none
    /// (command-line flags over a config file's settings).
    pub fn or(self, under: CheckedSettings) -> CheckedSettings {
        let (a, b) = (self.0, under.0);
        CheckedSettings(DedupSettings {
            mode: a.mode.or(b.mode),
            pages_to_scan: a.pages_to_scan.or(b.pages_to_scan),
            sleep_millisecs: a.sleep_millisecs.or(b.sleep_millisecs),
            max_page_sharing: a.max_page_sharing.or(b.max_page_sharing),
            auto_threshold: a.auto_threshold.or(b.auto_threshold),
            max_scanning_factor: a.max_scanning_factor.or(b.max_scanning_factor),
            memory_signal: a.memory_signal.or(b.memory_signal),
            max_guest_pause_us: a.max_guest_pause_us.or(b.max_guest_pause_us),
            settle: a.settle.or(b.settle),
        })
    }

    /// The mode, `off` when none is given.
    pub fn mode(&self) -> Mode {
        self.0.mode.unwrap_or_default()
    }
}

impl Deref for CheckedSettings {
    type Target = DedupSettings;
    fn deref(&self) -> &DedupSettings {
        &self.0
    }
}

impl TryFrom<DedupSettings> for CheckedSettings {
    type Error = SettingsError;
    fn try_from(s: DedupSettings) -> Result<Self, SettingsError> {
        s.validate()
    }
}

impl From<CheckedSettings> for DedupSettings {
    fn from(c: CheckedSettings) -> Self {
        c.0
    }
}

/// A mode alone is always valid.
impl From<Mode> for CheckedSettings {
    fn from(mode: Mode) -> Self {
        CheckedSettings(DedupSettings {
            mode: Some(mode),
            ..DedupSettings::default()
        })
    }
}

/// Command-line flags of the named types: parsed by `FromStr` (so the CLI
/// says what the config file and the API say), with the names listed in
/// `--help` and completions.
#[cfg(feature = "clap")]
pub mod flag {
    use std::ffi::OsStr;
    use std::marker::PhantomData;
    use std::str::FromStr;

    use clap::builder::{PossibleValue, Resettable, TypedValueParser};
    use clap::error::ErrorKind;
    use clap::ValueEnum;

    use super::SettingsError;

    /// The value parser of a flag of type `T`.
    pub struct Named<T>(PhantomData<fn() -> T>);

    impl<T> Clone for Named<T> {
        fn clone(&self) -> Self {
            Named(PhantomData)
        }
    }

    /// A clap value parser for the named unit enum `T`.
    pub fn named<T>() -> Named<T> {
        Named(PhantomData)
    }

    impl<T> TypedValueParser for Named<T>
    where
        T: ValueEnum + FromStr<Err = SettingsError> + Clone + Send + Sync + 'static,
    {
        type Value = T;

        fn parse_ref(
            &self,
            cmd: &clap::Command,
            arg: Option<&clap::Arg>,
            value: &OsStr,
        ) -> Result<T, clap::Error> {
            value.to_string_lossy().parse().map_err(|e: SettingsError| {
                let flag = arg
                    .and_then(|a| a.get_long())
                    .map(|l| format!("--{l}: "))
                    .unwrap_or_default();
                cmd.clone()
                    .error(ErrorKind::InvalidValue, format!("{flag}{e}"))
            })
        }

        fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
            // Names only: the variants' docs are for readers of the code.
            Some(Box::new(
                T::value_variants()
                    .iter()
                    .filter_map(ValueEnum::to_possible_value)
                    .map(|v| v.help(Resettable::Reset)),
            ))
        }
    }
}

#[cfg(test)]
mod tests;
