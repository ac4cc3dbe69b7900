//! pagefold's logger: every diagnostic of the binary and its libraries
//! (the `log` crate's macros) as one line on stderr,
//! `2026-01-31T12:00:00.123Z pagefold: warn: message`.
//!
//! - The level comes from `--log LEVEL`, else from `RUST_LOG` (the
//!   env_logger syntax: `info`, or `warn,pagefold_dedup=debug`: a default
//!   level and levels per module path prefix), else `warn`. An unknown
//!   level is a usage error, never a silent fallback.
//! - Timestamps are UTC with milliseconds; left out when stderr goes to the
//!   systemd journal (`$JOURNAL_STREAM`), which stamps every line itself.
//! - Libraries that put "pagefold: " in front of their own messages get it
//!   once: the logger already names the program.
//! - `--log-format json`: one JSON object per line (`ts`, `level`,
//!   `target`, `msg`), for log shippers; timestamps always.
//! - `--log-file PATH`: lines go to PATH (appended) instead of stderr. The
//!   main thread reopens it on SIGHUP (`logrotate`'s convention), through
//!   the hook `pagefold_vmm::signals` runs: other threads only write to the
//!   open file, which their seccomp filters allow.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use log::LevelFilter;

/// Errors setting up the logger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("RUST_LOG={spec:?}: unknown level {level:?} (expected off, error, warn, info, debug or trace)")]
    Level { spec: String, level: String },
    #[error("--log-file {}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `--log-format`'s formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `TIMESTAMP pagefold: LEVEL: MESSAGE`.
    #[default]
    Text,
    /// One JSON object per line: `ts`, `level`, `target`, `msg`.
    Json,
}

/// `--log`'s levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Level {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl From<Level> for LevelFilter {
    fn from(l: Level) -> LevelFilter {
        match l {
            Level::Off => LevelFilter::Off,
            Level::Error => LevelFilter::Error,
            Level::Warn => LevelFilter::Warn,
            Level::Info => LevelFilter::Info,
            Level::Debug => LevelFilter::Debug,
            Level::Trace => LevelFilter::Trace,
        }
    }
}

/// Which records pass: a default level and levels for module path
/// prefixes (the longest matching prefix wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    default: LevelFilter,
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// One level for everything.
    pub fn level(l: LevelFilter) -> Filter {
        Filter {
            default: l,
            targets: Vec::new(),
        }
    }

    /// Parses a `RUST_LOG` value: comma-separated `LEVEL`, `PATH=LEVEL` or
    /// `PATH` (everything from that module) entries. Module paths use
    /// crate names with underscores (`pagefold_dedup::merge`).
    pub fn parse(spec: &str) -> Result<Filter, Error> {
        let level = |s: &str| -> Result<LevelFilter, Error> {
            s.trim().parse().map_err(|_| Error::Level {
                spec: spec.to_string(),
                level: s.trim().to_string(),
            })
        };
        let mut f = Filter::level(LevelFilter::Warn);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some((target, l)) => f.targets.push((target.trim().to_string(), level(l)?)),
                None if part.parse::<LevelFilter>().is_ok() => f.default = level(part)?,
                None => f.targets.push((part.to_string(), LevelFilter::Trace)),
            }
        }
        // Longest prefix first: the most specific entry decides.
        f.targets.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        Ok(f)
    }

    /// The level that applies to records from module path `target`.
    fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .find(|(t, _)| {
                target == t
                    || (target.starts_with(t.as_str()) && target[t.len()..].starts_with("::"))
            })
            .map_or(self.default, |(_, l)| *l)
    }

    /// The most verbose level any record can pass at.
    fn max(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::max)
    }
}

/// The filter the command line and environment ask for: `--log` if given,
/// else `RUST_LOG` if set, else `warn`.
pub fn filter(flag: Option<Level>, rust_log: Option<&str>) -> Result<Filter, Error> {
    match (flag, rust_log.filter(|s| !s.trim().is_empty())) {
        (Some(l), _) => Ok(Filter::level(l.into())),
        (None, Some(spec)) => Filter::parse(spec),
        (None, None) => Ok(Filter::level(LevelFilter::Warn)),
    }
}

/// Where lines go.
enum Sink {
    Stderr,
    /// The open file and its path (to reopen).
    File(Mutex<File>, PathBuf),
}

struct Logger {
    filter: Filter,
    format: Format,
    timestamps: bool,
    sink: Sink,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.filter.level_for(m.target())
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        let line = match self.format {
            Format::Text => format_line(r.level(), &msg, self.timestamps.then(SystemTime::now)),
            Format::Json => json_line(r.level(), r.target(), &msg, SystemTime::now()),
        };
        // One write per line, so lines of different threads do not mix.
        match &self.sink {
            Sink::Stderr => {
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
            Sink::File(f, _) => {
                let _ = f
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}

/// One log line: `[TIMESTAMP ]pagefold: LEVEL: MESSAGE`, the program
/// named once even if the message names it too.
fn format_line(level: log::Level, msg: &str, now: Option<SystemTime>) -> String {
    let msg = msg.strip_prefix("pagefold: ").unwrap_or(msg);
    let level = level.as_str().to_ascii_lowercase();
    match now {
        Some(t) => format!("{} pagefold: {level}: {msg}\n", timestamp(t)),
        None => format!("pagefold: {level}: {msg}\n"),
    }
}

/// One JSON log line (a multi-line message stays one line: JSON escapes
/// its newlines).
fn json_line(level: log::Level, target: &str, msg: &str, now: SystemTime) -> String {
    let msg = msg.strip_prefix("pagefold: ").unwrap_or(msg);
    let v = serde_json::json!({
        "ts": timestamp(now),
        "level": level.as_str().to_ascii_lowercase(),
        "target": target,
        "msg": msg,
    });
    format!("{v}\n")
}

/// The logger installed by [`init`], for [`reopen`].
static LOGGER: std::sync::OnceLock<&'static Logger> = std::sync::OnceLock::new();

fn open_log(path: &Path) -> Result<File, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
        .map_err(|source| Error::File {
            path: path.to_path_buf(),
            source,
        })
}

/// Installs the logger for the process (once; later calls change nothing):
/// the filter, the line format, and stderr or `file` (created if missing,
/// appended to; an error if it cannot be opened).
pub fn init(filter: Filter, format: Format, file: Option<&Path>) -> Result<(), Error> {
    let max = filter.max();
    let sink = match file {
        Some(p) => Sink::File(Mutex::new(open_log(p)?), p.to_path_buf()),
        None => Sink::Stderr,
    };
    // The journal stamps every line of a service's stderr itself.
    let timestamps = file.is_some() || std::env::var_os("JOURNAL_STREAM").is_none();
    let logger: &'static Logger = Box::leak(Box::new(Logger {
        filter,
        format,
        timestamps,
        sink,
    }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(max);
        let _ = LOGGER.set(logger);
        if file.is_some() {
            pagefold_vmm::signals::set_hangup_hook(reopen);
        }
    }
    Ok(())
}

/// Reopens the log file (after `logrotate` moved it); true if there is a
/// log file. Runs on the main thread (the SIGHUP hook). If the path cannot
/// be opened, lines keep going to the file already open.
pub fn reopen() -> bool {
    let Some(Logger {
        sink: Sink::File(f, path),
        ..
    }) = LOGGER.get().copied()
    else {
        return false;
    };
    match open_log(path) {
        Ok(new) => {
            *f.lock().unwrap_or_else(|e| e.into_inner()) = new;
            log::info!("SIGHUP: reopened the log file {}", path.display());
        }
        Err(e) => log::warn!("SIGHUP: {e}; still writing to the file open before"),
    }
    true
}

/// `t` as RFC 3339 UTC with milliseconds (`2026-01-31T12:00:00.123Z`).
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// The proleptic Gregorian date of day `z` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T23:59:59.250Z (a leap day).
        let t = UNIX_EPOCH + Duration::from_millis(1_709_251_199_250);
        assert_eq!(timestamp(t), "2024-02-29T23:59:59.250Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_251_200);
        assert_eq!(timestamp(t), "2024-03-01T00:00:00.000Z");
    }

    #[test]
    fn lines_name_the_program_once() {
        let t = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(
            format_line(log::Level::Warn, "pagefold: zero-page drop: x", Some(t)),
            "1970-01-01T00:00:01.500Z pagefold: warn: zero-page drop: x\n"
        );
        assert_eq!(
            format_line(log::Level::Info, "API on /run/pagefold/api.sock", None),
            "pagefold: info: API on /run/pagefold/api.sock\n"
        );
    }

    /// A JSON line is one object with the four fields, whatever the
    /// message holds (quotes, newlines).
    #[test]
    fn json_lines_are_one_object_each() {
        let t = UNIX_EPOCH + Duration::from_millis(1_500);
        let line = json_line(
            log::Level::Warn,
            "pagefold_dedup::engine",
            "pagefold: a \"quoted\"\nsecond line",
            t,
        );
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "1970-01-01T00:00:01.500Z");
        assert_eq!(v["level"], "warn");
        assert_eq!(v["target"], "pagefold_dedup::engine");
        assert_eq!(v["msg"], "a \"quoted\"\nsecond line");
    }

    #[test]
    fn rust_log_sets_levels_per_module() {
        let f = Filter::parse("info,pagefold_dedup=debug,pagefold_dedup::merge=error").unwrap();
        assert_eq!(f.level_for("pagefold_vmm::runner"), LevelFilter::Info);
        assert_eq!(f.level_for("pagefold_dedup::engine"), LevelFilter::Debug);
        assert_eq!(f.level_for("pagefold_dedup"), LevelFilter::Debug);
        assert_eq!(f.level_for("pagefold_dedup::merge"), LevelFilter::Error);
        // A prefix matches whole path segments only.
        assert_eq!(f.level_for("pagefold_dedupx"), LevelFilter::Info);
        assert_eq!(f.max(), LevelFilter::Debug);
        // A bare module: everything from it.
        let f = Filter::parse("pagefold_api").unwrap();
        assert_eq!(f.level_for("pagefold_api::server"), LevelFilter::Trace);
        assert_eq!(f.level_for("pagefold_vmm"), LevelFilter::Warn);
        let e = Filter::parse("warn,pagefold_vmm=loud").unwrap_err();
        assert!(e.to_string().contains("unknown level \"loud\""), "{e}");
    }

    #[test]
    fn the_flag_wins_over_rust_log() {
        let f = filter(Some(Level::Debug), Some("error")).unwrap();
        assert_eq!(f, Filter::level(LevelFilter::Debug));
        let f = filter(None, Some("error")).unwrap();
        assert_eq!(f, Filter::level(LevelFilter::Error));
        assert_eq!(
            filter(None, Some(" ")).unwrap(),
            Filter::level(LevelFilter::Warn)
        );
        assert_eq!(
            filter(None, None).unwrap(),
            Filter::level(LevelFilter::Warn)
        );
    }
}
