//! Where auto mode learns how much memory the host has left: a trait, the
//! real `/proc` reader, and the parsers it uses (tested on fixed text).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::AutoError;

/// Memory pressure stall information from `/proc/pressure/memory`, in percent
/// of wall time during which some (or all) runnable tasks stalled on memory.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Psi {
    pub some_avg10: f64,
    pub some_avg60: f64,
    pub full_avg10: f64,
    pub full_avg60: f64,
}

/// One reading of the host's memory state.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct MemSample {
    /// `MemTotal`, bytes.
    pub total_bytes: u64,
    /// `MemFree`, bytes: pages on the free lists only.
    pub free_bytes: u64,
    /// `MemAvailable`, bytes: the kernel's estimate of what new allocations can
    /// get without swapping (free + reclaimable cache - reserves).
    pub available_bytes: u64,
    /// `None` when the kernel has no PSI (CONFIG_PSI off or `psi=0`).
    pub psi: Option<Psi>,
}

/// A source of [`MemSample`]s. The controller owns it on the scanner thread.
pub trait MemorySource: Send {
    fn sample(&mut self) -> Result<MemSample, AutoError>;
}

/// Reads `/proc/meminfo` and `/proc/pressure/memory`.
#[derive(Debug, Clone)]
pub struct ProcMemSource {
    meminfo: PathBuf,
    pressure: PathBuf,
}

impl Default for ProcMemSource {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcMemSource {
    pub fn new() -> Self {
        Self::with_paths("/proc/meminfo", "/proc/pressure/memory")
    }

    /// Reads other files (tests, or a container's view of `/proc`).
    pub fn with_paths(meminfo: impl Into<PathBuf>, pressure: impl Into<PathBuf>) -> Self {
        Self {
            meminfo: meminfo.into(),
            pressure: pressure.into(),
        }
    }
}

fn read(path: &Path) -> Result<String, AutoError> {
    std::fs::read_to_string(path).map_err(|source| AutoError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl MemorySource for ProcMemSource {
    fn sample(&mut self) -> Result<MemSample, AutoError> {
        let mut s = parse_meminfo(&read(&self.meminfo)?)?;
        // A missing pressure file means "no PSI on this kernel", not an error:
        // the PSI trigger then never fires and status shows psi = null.
        s.psi = match std::fs::read_to_string(&self.pressure) {
            Ok(text) => Some(parse_psi(&text)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            // EOPNOTSUPP: PSI compiled in but disabled at boot.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => None,
            Err(source) => {
                return Err(AutoError::Read {
                    path: self.pressure.clone(),
                    source,
                })
            }
        };
        Ok(s)
    }
}

/// Parses `MemTotal`, `MemFree` and `MemAvailable` (kB) out of `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Result<MemSample, AutoError> {
    let field = |name: &'static str| -> Result<u64, AutoError> {
        let line = text
            .lines()
            .find(|l| l.split(':').next() == Some(name))
            .ok_or_else(|| AutoError::Parse {
                what: "/proc/meminfo",
                detail: format!("no {name} line"),
            })?;
        let mut words = line[name.len() + 1..].split_whitespace();
        let value = words
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| AutoError::Parse {
                what: "/proc/meminfo",
                detail: format!("bad {name} line {line:?}"),
            })?;
        match words.next() {
            Some("kB") => Ok(value.saturating_mul(1024)),
            other => Err(AutoError::Parse {
                what: "/proc/meminfo",
                detail: format!("{name}: unit {other:?}, expected kB"),
            }),
        }
    };
    let total_bytes = field("MemTotal")?;
    if total_bytes == 0 {
        return Err(AutoError::ZeroTotal);
    }
    Ok(MemSample {
        total_bytes,
        free_bytes: field("MemFree")?,
        available_bytes: field("MemAvailable")?,
        psi: None,
    })
}

/// Parses the `some` and `full` lines of `/proc/pressure/memory`.
pub fn parse_psi(text: &str) -> Result<Psi, AutoError> {
    let avgs = |kind: &str| -> Result<(f64, f64), AutoError> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .ok_or_else(|| AutoError::Parse {
                what: "/proc/pressure/memory",
                detail: format!("no {kind:?} line"),
            })?;
        let get = |key: &str| -> Result<f64, AutoError> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| AutoError::Parse {
                    what: "/proc/pressure/memory",
                    detail: format!("no {key} in {line:?}"),
                })
        };
        Ok((get("avg10")?, get("avg60")?))
    };
    let (some_avg10, some_avg60) = avgs("some")?;
    let (full_avg10, full_avg60) = avgs("full")?;
    Ok(Psi {
        some_avg10,
        some_avg60,
        full_avg10,
        full_avg60,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24683656 kB\nMemFree:        24226904 kB\n\
                           MemAvailable:   24386920 kB\nBuffers:            1652 kB\n";

    #[test]
    fn parses_meminfo_in_bytes() {
        let s = parse_meminfo(MEMINFO).unwrap();
        assert_eq!(s.total_bytes, 24683656 * 1024);
        assert_eq!(s.free_bytes, 24226904 * 1024);
        assert_eq!(s.available_bytes, 24386920 * 1024);
        assert_eq!(s.psi, None);
    }

    #[test]
    fn meminfo_missing_field_is_an_error() {
        let err = parse_meminfo("MemTotal: 10 kB\nMemFree: 5 kB\n").unwrap_err();
        assert!(err.to_string().contains("MemAvailable"), "{err}");
        assert!(matches!(
            parse_meminfo("MemTotal: 0 kB\nMemFree: 0 kB\nMemAvailable: 0 kB\n"),
            Err(AutoError::ZeroTotal)
        ));
    }

    #[test]
    fn meminfo_does_not_confuse_prefixed_names() {
        // "MemFreeX" must not be read as MemFree.
        let text = "MemTotal: 10 kB\nMemFreeX: 1 kB\nMemFree: 7 kB\nMemAvailable: 8 kB\n";
        assert_eq!(parse_meminfo(text).unwrap().free_bytes, 7 * 1024);
    }

    #[test]
    fn parses_psi() {
        let text = "some avg10=1.50 avg60=0.25 avg300=0.00 total=123\n\
                    full avg10=0.75 avg60=0.10 avg300=0.00 total=45\n";
        let p = parse_psi(text).unwrap();
        assert_eq!(
            p,
            Psi {
                some_avg10: 1.5,
                some_avg60: 0.25,
                full_avg10: 0.75,
                full_avg60: 0.1
            }
        );
        assert!(parse_psi("some avg10=1.0 avg60=2.0\n").is_err());
    }

    #[test]
    fn proc_source_reads_this_host() {
        let s = ProcMemSource::new().sample().unwrap();
        assert!(s.total_bytes > 0);
        assert!(s.free_bytes <= s.total_bytes);
        assert!(s.available_bytes <= s.total_bytes);
    }

    #[test]
    fn proc_source_without_psi_file_reports_none() {
        let dir = std::env::temp_dir().join(format!("pagefold-auto-src-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let meminfo = dir.join("meminfo");
        std::fs::write(&meminfo, MEMINFO).unwrap();
        let s = ProcMemSource::with_paths(&meminfo, dir.join("absent"))
            .sample()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(s.psi, None);
        assert_eq!(s.total_bytes, 24683656 * 1024);
    }
}
