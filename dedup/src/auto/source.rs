//! Where auto mode learns how much memory the host has left: a trait, the
//! real `/proc` reader, and the parsers it uses (tested on fixed text).

use std::path::{Path, PathBuf};

use procfs::FromBufRead;
use serde::Serialize;

use super::error::AutoError;

/// Memory pressure stall information from `/proc/pressure/memory`, in percent
/// of wall time during which some (or all) runnable tasks stalled on memory.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Psi {
    /// `some avg10`, percent.
    pub some_avg10: f64,
    /// `some avg60`, percent.
    pub some_avg60: f64,
    /// `full avg10`, percent.
    pub full_avg10: f64,
    /// `full avg60`, percent.
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
    /// One sample of host memory (and pressure, where the kernel has PSI).
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
    /// A source on the real `/proc` files.
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

/// Parses `MemTotal`, `MemFree` and `MemAvailable` out of the text of
/// `/proc/meminfo` with the procfs crate's parser (which wants the fields
/// every kernel prints, and converts the kB unit to bytes).
pub fn parse_meminfo(text: &str) -> Result<MemSample, AutoError> {
    let parse_err = |detail: String| AutoError::Parse {
        what: "/proc/meminfo",
        detail,
    };
    let m =
        procfs::Meminfo::from_buf_read(text.as_bytes()).map_err(|e| parse_err(e.to_string()))?;
    if m.mem_total == 0 {
        return Err(AutoError::ZeroTotal);
    }
    // procfs keeps MemAvailable optional (kernels before 3.14 lack it);
    // auto mode's triggers are defined on it, so it is required here.
    let available_bytes = m
        .mem_available
        .ok_or_else(|| parse_err("no MemAvailable line".into()))?;
    Ok(MemSample {
        total_bytes: m.mem_total,
        free_bytes: m.mem_free,
        available_bytes,
        psi: None,
    })
}

/// Parses the `some` and `full` lines of `/proc/pressure/memory` with the
/// procfs crate's parser.
pub fn parse_psi(text: &str) -> Result<Psi, AutoError> {
    let p =
        procfs::MemoryPressure::from_buf_read(text.as_bytes()).map_err(|e| AutoError::Parse {
            what: "/proc/pressure/memory",
            detail: e.to_string(),
        })?;
    Ok(Psi {
        some_avg10: percent(p.some.avg10),
        some_avg60: percent(p.some.avg60),
        full_avg10: percent(p.full.avg10),
        full_avg60: percent(p.full.avg60),
    })
}

/// procfs reads the averages as `f32`; the kernel prints them with two
/// decimals, so rounding to two decimals gives back the printed value
/// exactly as an `f64` (1.10, not 1.100000023841858, in status JSON).
fn percent(avg: f32) -> f64 {
    (f64::from(avg) * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of a real `/proc/meminfo`: every field procfs requires.
    const MEMINFO: &str = "MemTotal:       24683656 kB\nMemFree:        24226904 kB\n\
                           MemAvailable:   24386920 kB\nBuffers:            1652 kB\n\
                           Cached:           112040 kB\nSwapCached:            0 kB\n\
                           Active:            75412 kB\nInactive:          98088 kB\n\
                           SwapTotal:             0 kB\nSwapFree:              0 kB\n\
                           Dirty:                 8 kB\nWriteback:             0 kB\n\
                           Mapped:            54360 kB\nSlab:              46272 kB\n\
                           Committed_AS:     191684 kB\nVmallocTotal:   34359738367 kB\n\
                           VmallocUsed:       10832 kB\nVmallocChunk:          0 kB\n";

    /// MEMINFO with the `name` line replaced by `line` (removed if "").
    fn meminfo_with(name: &str, line: &str) -> String {
        MEMINFO
            .lines()
            .filter_map(|l| match l.split(':').next() == Some(name) {
                true => (!line.is_empty()).then_some(line),
                false => Some(l),
            })
            .map(|l| format!("{l}\n"))
            .collect()
    }

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
        let err = parse_meminfo(&meminfo_with("MemAvailable", "")).unwrap_err();
        assert!(err.to_string().contains("MemAvailable"), "{err}");
        assert!(parse_meminfo(&meminfo_with("MemFree", "")).is_err());
        assert!(parse_meminfo(&meminfo_with("MemFree", "MemFree: x kB")).is_err());
        assert!(matches!(
            parse_meminfo(&meminfo_with("MemTotal", "MemTotal: 0 kB")),
            Err(AutoError::ZeroTotal)
        ));
    }

    #[test]
    fn meminfo_does_not_confuse_prefixed_names() {
        // "MemFreeX" must not be read as MemFree.
        let text = meminfo_with("MemFree", "MemFreeX: 1 kB\nMemFree: 7 kB");
        assert_eq!(parse_meminfo(&text).unwrap().free_bytes, 7 * 1024);
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
        let dir = tempfile::tempdir().unwrap();
        let meminfo = dir.path().join("meminfo");
        std::fs::write(&meminfo, MEMINFO).unwrap();
        let s = ProcMemSource::with_paths(&meminfo, dir.path().join("absent"))
            .sample()
            .unwrap();
        assert_eq!(s.psi, None);
        assert_eq!(s.total_bytes, 24683656 * 1024);
    }
}
