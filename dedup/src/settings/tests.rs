//! Parsing and validation of the settings types.

use super::*;
use crate::auto::AutoConfig;

#[test]
fn names_parse_print_and_refuse_alike() {
    for m in [Mode::Off, Mode::On, Mode::Unmerge, Mode::Auto] {
        assert_eq!(m.to_string().parse::<Mode>().unwrap(), m);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, format!("\"{m}\""));
        assert_eq!(serde_json::from_str::<Mode>(&json).unwrap(), m);
    }
    for s in [MemorySignal::Free, MemorySignal::Available] {
        assert_eq!(s.as_str().parse::<MemorySignal>().unwrap(), s);
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    for b in [BackendKind::Pagefold, BackendKind::Ksm] {
        assert_eq!(b.as_str().parse::<BackendKind>().unwrap(), b);
    }
    assert_eq!(
        "sometimes".parse::<Mode>().unwrap_err().to_string(),
        "unknown dedup mode \"sometimes\" (expected off, on, unmerge or auto)"
    );
    assert_eq!(
        "cache".parse::<MemorySignal>().unwrap_err(),
        SettingsError::UnknownMemorySignal("cache".into())
    );
    assert_eq!(
        "zfs".parse::<BackendKind>().unwrap_err().to_string(),
        "unknown backend \"zfs\" (expected pagefold or ksm)"
    );
    // serde says what FromStr says, not serde's generic "unknown variant".
    let e = serde_json::from_str::<Mode>("\"On\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown dedup mode \"On\""), "{e}");
    assert_eq!(Mode::default(), Mode::Off);
    assert_eq!(MemorySignal::default(), MemorySignal::Available);
    assert_eq!(BackendKind::default(), BackendKind::Pagefold);
}

#[test]
fn validate_checks_each_given_knob_and_the_threshold() {
    let s = |f: fn(&mut DedupSettings)| {
        let mut s = DedupSettings::default();
        f(&mut s);
        s.validate()
    };
    assert_eq!(
        s(|s| s.pages_to_scan = Some(0)).unwrap_err().to_string(),
        "invalid value for pages_to_scan: 0 (valid range 1..=16777216)"
    );
    assert!(s(|s| s.pages_to_scan = Some(1 << 24)).is_ok());
    assert!(s(|s| s.pages_to_scan = Some((1 << 24) + 1)).is_err());
    assert_eq!(
        s(|s| s.sleep_millisecs = Some(60_001)).unwrap_err(),
        SettingsError::OutOfRange {
            name: "sleep_millisecs",
            value: 60_001,
            min: 0,
            max: 60_000
        }
    );
    assert!(s(|s| s.sleep_millisecs = Some(0)).is_ok());
    assert!(s(|s| s.max_page_sharing = Some(1)).is_err());
    assert!(s(|s| s.max_page_sharing = Some(2)).is_ok());
    assert_eq!(
        s(|s| s.auto_threshold = Some(101)).unwrap_err().to_string(),
        "auto_threshold must be a percentage in 0..=100, got 101"
    );
    assert!(s(|s| s.auto_threshold = Some(100)).is_ok());
    // The factor's bound needs the host's RAM: the controller checks it.
    assert!(s(|s| s.max_scanning_factor = Some(1 << 40)).is_ok());
    assert!(DedupSettings::default().validate().is_ok());
}

#[test]
fn knobs_validate_by_the_same_ranges() {
    let k = Knobs {
        pages_to_scan: 100,
        sleep_millisecs: 20,
        max_page_sharing: 256,
    };
    k.validate().unwrap();
    let e = Knobs {
        max_page_sharing: 1,
        ..k
    }
    .validate()
    .unwrap_err();
    assert!(e
        .to_string()
        .contains("max_page_sharing: 1 (valid range 2..=65536)"));
    assert_eq!(Knobs::RANGES[0], ("pages_to_scan", Knobs::PAGES_TO_SCAN));
}

#[test]
fn json_body_form() {
    let s: DedupSettings =
        serde_json::from_str(r#"{"mode": "auto", "pages_to_scan": 500, "memory_signal": "free"}"#)
            .unwrap();
    assert_eq!(s.mode, Some(Mode::Auto));
    assert_eq!(s.pages_to_scan, Some(500));
    assert_eq!(s.memory_signal, Some(MemorySignal::Free));
    assert_eq!(s.sleep_millisecs, None);
    // What a client sends for it: only the fields given.
    assert_eq!(
        serde_json::to_value(s).unwrap(),
        serde_json::json!({"mode": "auto", "pages_to_scan": 500, "memory_signal": "free"})
    );
    let e = serde_json::from_str::<DedupSettings>(r#"{"pages_to_scann": 3}"#).unwrap_err();
    assert!(
        e.to_string().contains("unknown field `pages_to_scann`"),
        "{e}"
    );
    let e = serde_json::from_str::<DedupSettings>(r#"{"pages_to_scan": "5"}"#).unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
    let e = serde_json::from_str::<DedupSettings>(r#"{"memory_signal": "cached"}"#).unwrap_err();
    assert!(
        e.to_string().contains("unknown memory signal \"cached\""),
        "{e}"
    );
}

/// `settle` from the config file's `[dedup]` and the `PATCH /dedup`
/// body: a boolean, nothing else, absent unless given; file settings under
/// flags like every other setting.
#[test]
fn settle_is_a_boolean_from_the_file_and_the_body() {
    let file: CheckedSettings = toml::from_str("mode = \"on\"\nsettle = false\n").unwrap();
    assert_eq!((file.mode(), file.settle), (Mode::On, Some(false)));
    let body: CheckedSettings = serde_json::from_str(r#"{"settle": true}"#).unwrap();
    assert_eq!(body.settle, Some(true));
    assert_eq!(
        serde_json::to_value(*file).unwrap(),
        serde_json::json!({"mode": "on", "settle": false})
    );
    assert_eq!(body.or(file).settle, Some(true));
    assert_eq!(CheckedSettings::default().or(file).settle, Some(false));
    assert_eq!(DedupSettings::default().settle, None);
    assert_eq!(DedupSettings::NONE, DedupSettings::default());
    // Not a boolean's spelling: refused as the type, in either form.
    for bad in [r#"{"settle": "false"}"#, r#"{"settle": 0}"#] {
        let e = serde_json::from_str::<DedupSettings>(bad).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{bad}: {e}");
    }
    let e = toml::from_str::<DedupSettings>("settle = \"no\"").unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
    // Nor a knob: it touches neither the knobs nor auto mode.
    let base = Knobs {
        pages_to_scan: 100,
        sleep_millisecs: 20,
        max_page_sharing: 256,
    };
    assert_eq!(body.knobs_over(base), base);
    assert!(!body.touches_auto());
}

#[test]
fn checked_form_validates_as_it_parses() {
    let c: CheckedSettings = serde_json::from_str(r#"{"sleep_millisecs": 5}"#).unwrap();
    assert_eq!(c.sleep_millisecs, Some(5));
    let e = serde_json::from_str::<CheckedSettings>(r#"{"pages_to_scan": 0}"#).unwrap_err();
    assert!(
        e.to_string().contains("pages_to_scan: 0 (valid range"),
        "{e}"
    );
}

#[test]
fn settings_put_over_a_base() {
    let base = Knobs {
        pages_to_scan: 100,
        sleep_millisecs: 20,
        max_page_sharing: 256,
    };
    let s = DedupSettings {
        sleep_millisecs: Some(7),
        auto_threshold: Some(30),
        memory_signal: Some(MemorySignal::Free),
        ..Default::default()
    };
    assert_eq!(
        s.knobs_over(base),
        Knobs {
            sleep_millisecs: 7,
            ..base
        }
    );
    let a = AutoConfig::default().overlaid(&s);
    assert_eq!(a.threshold_pct, 30);
    assert_eq!(a.memory_signal, MemorySignal::Free);
    assert_eq!(
        a.max_scanning_factor,
        AutoConfig::default().max_scanning_factor
    );
    assert!(s.touches_auto());
    assert!(!DedupSettings {
        pages_to_scan: Some(5),
        mode: Some(Mode::On),
        ..Default::default()
    }
    .touches_auto());
}

#[test]
fn flags_override_what_they_give() {
    let file = DedupSettings {
        mode: Some(Mode::On),
        pages_to_scan: Some(100),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let flags = DedupSettings {
        pages_to_scan: Some(200),
        memory_signal: Some(MemorySignal::Free),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let both = flags.or(file);
    assert_eq!(both.mode(), Mode::On);
    assert_eq!(both.pages_to_scan, Some(200));
    assert_eq!(both.memory_signal, Some(MemorySignal::Free));
    assert_eq!(CheckedSettings::default().mode(), Mode::Off);
    assert_eq!(CheckedSettings::from(Mode::Auto).mode(), Mode::Auto);
}

#[cfg(feature = "clap")]
mod flags {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        settings: DedupSettings,
    }

    fn parse(args: &[&str]) -> Result<DedupSettings, clap::Error> {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|c| c.settings)
    }

    #[test]
    fn flags_parse_into_the_same_type() {
        let s = parse(&[
            "--dedup",
            "auto",
            "--pages-to-scan",
            "500",
            "--auto-threshold",
            "30",
            "--max-scanning-factor",
            "4",
            "--memory-signal",
            "free",
        ])
        .unwrap();
        assert_eq!(s.mode, Some(Mode::Auto));
        assert_eq!(s.pages_to_scan, Some(500));
        assert_eq!(s.auto_threshold, Some(30));
        assert_eq!(s.max_scanning_factor, Some(4));
        assert_eq!(s.memory_signal, Some(MemorySignal::Free));
        assert_eq!(parse(&[]).unwrap(), DedupSettings::default());
    }

    /// `--settle` takes the config's and the body's words, true or false,
    /// and nothing else (the flag alone would be a third spelling).
    #[test]
    fn settle_flag_takes_true_or_false() {
        assert_eq!(parse(&["--settle", "false"]).unwrap().settle, Some(false));
        assert_eq!(parse(&["--settle=true"]).unwrap().settle, Some(true));
        assert_eq!(parse(&[]).unwrap().settle, None);
        let e = parse(&["--settle", "no"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        assert!(e.to_string().contains("--settle"), "{e}");
        assert!(parse(&["--settle"]).is_err());
    }

    #[test]
    fn bad_names_say_what_the_config_says() {
        let e = parse(&["--dedup", "sometimes"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        let text = e.to_string();
        assert!(
            text.contains("--dedup: unknown dedup mode \"sometimes\""),
            "{text}"
        );
        let e = parse(&["--memory-signal", "cached"]).unwrap_err();
        assert!(e.to_string().contains("unknown memory signal"), "{e}");
        let e = parse(&["--auto-threshold", "-1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }
}
