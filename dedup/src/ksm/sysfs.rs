//! `/sys/kernel/mm/ksm` access through a guard that records the original
//! value of every file before it first writes it, in the global-state
//! journal ([`super::journal`]), and puts them all back on restore/drop:
//! KSM's knobs are global, so a VMM or a test that leaves them changed
//! changes the whole host, and the journal lets the next pagefold undo it
//! even if this one is killed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::error::KsmError;
use super::journal::{Hold, Journal, JournalError};

/// The standard location.
pub const KSM_SYSFS: &str = "/sys/kernel/mm/ksm";

/// Knobs restored last, in this order: `run` once the scan knobs are back,
/// and `max_page_sharing` at the very end because the kernel refuses to
/// change it while KSM pages exist.
const RESTORE_LAST: [&str; 2] = ["run", "max_page_sharing"];

/// Reads KSM sysfs files; writes through [`KsmSysfs::write`] are undone by
/// [`KsmSysfs::restore`] (also run on drop, so on panic paths too), and
/// recorded in the journal first, so a kill -9 is undone by the next start.
#[derive(Debug)]
pub struct KsmSysfs {
    root: PathBuf,
    /// Where originals are recorded; `None` if this user has no runtime
    /// directory (then every write fails with the reason).
    journal: Option<Journal>,
    /// (knob, its hold in the journal), first write first.
    held: Mutex<Vec<(String, Hold)>>,
}

impl KsmSysfs {
    /// Opens the standard location.
    pub fn open() -> Result<Self, KsmError> {
        Self::open_at(KSM_SYSFS)
    }

    /// Opens another directory laid out like `/sys/kernel/mm/ksm`, recording
    /// in the default journal ([`Journal::open_default`]).
    pub fn open_at(root: impl Into<PathBuf>) -> Result<Self, KsmError> {
        Self::with_journal(root, Journal::open_default().ok())
    }

    /// Opens `root`, recording in `journal`.
    pub fn with_journal(
        root: impl Into<PathBuf>,
        journal: Option<Journal>,
    ) -> Result<Self, KsmError> {
        let root = root.into();
        if !root.join("run").exists() {
            return Err(KsmError::Absent { path: root });
        }
        Ok(Self {
            root,
            journal,
            held: Mutex::new(Vec::new()),
        })
    }

    /// The journal this guard records in.
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// The KSM sysfs directory (`/sys/kernel/mm/ksm` unless a test points elsewhere).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<(String, Hold)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raw contents, trimmed.
    pub fn read(&self, name: &str) -> Result<String, KsmError> {
        let path = self.root.join(name);
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(|source| KsmError::Sysfs {
                op: "reading",
                path,
                source,
            })
    }

    /// A knob or counter as a number.
    pub fn read_u64(&self, name: &str) -> Result<u64, KsmError> {
        let s = self.read(name)?;
        s.parse().map_err(|_| KsmError::Parse {
            what: self.root.join(name).display().to_string(),
            detail: format!("{s:?} is not an unsigned integer"),
        })
    }

    /// Like [`KsmSysfs::read_u64`] but `general_profit` may be negative.
    pub fn read_i64(&self, name: &str) -> Result<i64, KsmError> {
        let s = self.read(name)?;
        s.parse().map_err(|_| KsmError::Parse {
            what: self.root.join(name).display().to_string(),
            detail: format!("{s:?} is not an integer"),
        })
    }

    /// Writes `value`, first recording the file's original contents in the
    /// journal (once per knob and guard).
    pub fn write(&self, name: &str, value: u64) -> Result<(), KsmError> {
        {
            let mut held = self.held();
            if !held.iter().any(|(n, _)| n == name) {
                let journal = self.journal.as_ref().ok_or(JournalError::NoRuntimeDir)?;
                let hold = journal.hold(&self.root.join(name))?;
                held.push((name.to_string(), hold));
            }
        }
        self.write_raw(name, &value.to_string())
    }

    fn write_raw(&self, name: &str, value: &str) -> Result<(), KsmError> {
        let path = self.root.join(name);
        std::fs::write(&path, value).map_err(|source| KsmError::Sysfs {
            op: "writing",
            path,
            source,
        })
    }

    /// Knobs written so far (their originals will be restored).
    pub fn touched(&self) -> Vec<String> {
        self.held().iter().map(|(n, _)| n.clone()).collect()
    }

    /// Releases every touched knob, `run` and then `max_page_sharing` last:
    /// each goes back to its original unless another live holder (another
    /// pagefold, another backend of this one) still holds it. Returns the
    /// failures (each also logged); knobs that failed stay held so a later
    /// call can retry them (and the journal keeps them for recovery).
    pub fn restore(&self) -> Vec<KsmError> {
        let mut held = self.held();
        let Some(journal) = &self.journal else {
            return Vec::new();
        };
        let mut order: Vec<(String, Hold)> = held
            .iter()
            .filter(|(n, _)| !RESTORE_LAST.contains(&n.as_str()))
            .cloned()
            .collect();
        for last in RESTORE_LAST {
            order.extend(held.iter().filter(|(n, _)| n == last).cloned());
        }
        let mut failed = Vec::new();
        let mut errors = Vec::new();
        for (name, hold) in order {
            if let Err(e) = journal.release(&hold) {
                let e = KsmError::from(e);
                log::error!("KSM: could not restore {name} to {}: {e}", hold.original);
                failed.push(name);
                errors.push(e);
            }
        }
        held.retain(|(n, _)| failed.contains(n));
        errors
    }
}

/// Every tunable KSM file, so callers can check that a run left them as found.
pub const TUNABLES: [&str; 13] = [
    "run",
    "pages_to_scan",
    "sleep_millisecs",
    "max_page_sharing",
    "merge_across_nodes",
    "use_zero_pages",
    "smart_scan",
    "stable_node_chains_prune_millisecs",
    "advisor_mode",
    "advisor_max_cpu",
    "advisor_min_pages_to_scan",
    "advisor_max_pages_to_scan",
    "advisor_target_scan_time",
];

/// Current contents of every tunable present under `root`.
pub fn snapshot_tunables(root: &Path) -> std::collections::BTreeMap<String, String> {
    TUNABLES
        .iter()
        .filter_map(|n| {
            let v = std::fs::read_to_string(root.join(n)).ok()?;
            Some((n.to_string(), v.trim().to_string()))
        })
        .collect()
}

impl Drop for KsmSysfs {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs directory (plain files behave like the knobs we use).
    /// Its journal is `journal/` inside it.
    fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (n, v) in files {
            std::fs::write(dir.path().join(n), format!("{v}\n")).unwrap();
        }
        dir
    }

    fn open(dir: &Path) -> KsmSysfs {
        KsmSysfs::with_journal(dir, Some(Journal::at_any_path(dir.join("journal")))).unwrap()
    }

    #[test]
    fn missing_ksm_is_a_clear_error() {
        let e = KsmSysfs::open_at("/nonexistent/ksm").unwrap_err();
        assert!(matches!(e, KsmError::Absent { .. }));
        assert!(e.to_string().contains("CONFIG_KSM"), "{e}");
    }

    #[test]
    fn restores_every_written_knob_on_drop_even_after_a_panic() {
        let tmp = fake(&[
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
        ]);
        let dir = tmp.path();
        let d2 = dir.to_path_buf();
        let r = std::panic::catch_unwind(move || {
            let s = open(&d2);
            s.write("pages_to_scan", 5000).unwrap();
            s.write("pages_to_scan", 7000).unwrap();
            s.write("run", 1).unwrap();
            assert_eq!(s.read_u64("pages_to_scan").unwrap(), 7000);
            assert_eq!(s.touched(), ["pages_to_scan", "run"]);
            panic!("test failure in the middle");
        });
        assert!(r.is_err());
        let s = open(dir);
        assert_eq!(s.read_u64("pages_to_scan").unwrap(), 100);
        assert_eq!(s.read_u64("run").unwrap(), 0);
        assert_eq!(s.read_u64("sleep_millisecs").unwrap(), 20);
        drop(s);
    }

    #[test]
    fn restore_reports_failures_and_keeps_them_for_retry() {
        let tmp = fake(&[("run", "0"), ("pages_to_scan", "100")]);
        let dir = tmp.path();
        let s = open(dir);
        s.write("pages_to_scan", 1).unwrap();
        s.write("run", 1).unwrap();
        // Make `run` unwritable: replace the file by a directory.
        std::fs::remove_file(dir.join("run")).unwrap();
        std::fs::create_dir(dir.join("run")).unwrap();
        let errs = s.restore();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].to_string().contains("run"), "{}", errs[0]);
        assert_eq!(s.read_u64("pages_to_scan").unwrap(), 100);
        assert_eq!(s.touched(), ["run"]);
        std::fs::remove_dir(dir.join("run")).unwrap();
        std::fs::write(dir.join("run"), "1").unwrap();
        assert!(s.restore().is_empty());
        assert_eq!(s.read_u64("run").unwrap(), 0);
        drop(s);
    }

    #[test]
    fn records_the_original_in_the_journal_before_writing() {
        let tmp = fake(&[("run", "0"), ("pages_to_scan", "100")]);
        let dir = tmp.path();
        let s = open(dir);
        s.write("pages_to_scan", 777).unwrap();
        s.write("pages_to_scan", 778).unwrap();
        let st = s.journal().unwrap().status().unwrap();
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].path, dir.join("pages_to_scan"));
        assert_eq!(st[0].original, "100");
        assert_eq!(st[0].current.as_deref(), Some("778"));
        assert_eq!(st[0].holders.len(), 1);
        assert_eq!(st[0].holders[0].holder.pid, std::process::id());
        // A second guard in this process (another backend) joins as a
        // holder: the first one's restore must not pull the knob from it.
        let other = open(dir);
        other.write("pages_to_scan", 900).unwrap();
        assert!(s.restore().is_empty());
        assert_eq!(s.read_u64("pages_to_scan").unwrap(), 900);
        assert!(other.restore().is_empty());
        assert_eq!(s.read_u64("pages_to_scan").unwrap(), 100);
        assert!(s.journal().unwrap().status().unwrap().is_empty());
        drop((s, other));
    }
}
