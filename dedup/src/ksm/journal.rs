//! A journal of the host-global knobs pagefold changes (KSM sysfs files,
//! sysctls such as `vm.max_map_count`), so that they survive `kill -9`.
//!
//! In-memory restore-on-drop cannot run when the process is killed: a
//! `pagefold bench` killed with SIGKILL left KSM `run=1`, and the next
//! pagefold took that as the host's original value. So *before* a knob is
//! first changed, its value is written to a state file under the runtime
//! directory together with who holds it (pid plus the start time from
//! `/proc/PID/stat`, so a recycled pid is not mistaken for the holder).
//! The next start of anything that uses KSM or changes a sysctl calls
//! [`recover`]: knobs whose holders are all dead are put back and each
//! restore is logged as a warning.
//!
//! Several pagefold processes may coexist: the journal is one file under an
//! `flock`, each knob keeps the value from *before the first* holder changed
//! it, and the set of holders; a later holder never records the first one's
//! value as original. A knob is restored only when its last holder releases
//! it (normal shutdown, drop, panic unwinding) or is found dead.
//!
//! Layout (`runtime_dir()`): `global-state.json` (the journal, replaced
//! atomically: temp file, fsync, rename, fsync of the directory),
//! `global-state.lock` (the flock; a separate file because the journal's
//! inode changes on every rename).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Overrides the runtime directory (tests; several installations).
pub const RUNTIME_DIR_ENV: &str = "PAGEFOLD_RUNTIME_DIR";
/// The runtime directory as root.
pub const ROOT_RUNTIME_DIR: &str = "/run/pagefold";
/// The journal's file name inside the runtime directory.
pub const JOURNAL_FILE: &str = "global-state.json";
const LOCK_FILE: &str = "global-state.lock";
const VERSION: u32 = 1;

/// Errors of the state journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Not root, `XDG_RUNTIME_DIR` unset and no override.
    #[error(
        "no runtime directory for pagefold's state journal: not root and XDG_RUNTIME_DIR \
         is unset (set {RUNTIME_DIR_ENV})"
    )]
    NoRuntimeDir,
    /// Reading, writing or locking the journal itself failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`reading`, `writing`, `locking`).
        op: &'static str,
        /// The journal file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing a recorded knob (a sysfs or sysctl file) failed.
    #[error("{op} {path}: {source}")]
    Knob {
        /// What was being done (`reading`, `writing`, `locking`).
        op: &'static str,
        /// The knob's file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The journal does not parse; it was moved aside so pagefold can go on
    /// with a fresh one, and its originals must be checked by hand.
    #[error(
        "state journal {path} is corrupt ({detail}); moved it to {kept}: the knob values \
         it recorded were not restored, check them by hand"
    )]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Where the corrupt journal was moved.
        kept: PathBuf,
        /// What does not parse.
        detail: String,
    },
    /// The journal does not parse (read-only access: left in place).
    #[error("state journal {path} is corrupt: {detail}")]
    Unreadable {
        /// The journal file.
        path: PathBuf,
        /// What does not parse.
        detail: String,
    },
    /// A journal in another format version (another pagefold release):
    /// left alone, as its holders may still run.
    #[error(
        "state journal {path} has format version {found}, this pagefold knows version \
         {VERSION}: left alone (use the pagefold that wrote it)"
    )]
    Version {
        /// The journal file.
        path: PathBuf,
        /// The version it has.
        found: u32,
    },
    /// Someone else's journal would make us write their values as root.
    #[error(
        "state journal {path} belongs to uid {owner}, not to this user (uid {uid}): not trusted"
    )]
    Untrusted {
        /// The journal file.
        path: PathBuf,
        /// The uid that owns it.
        owner: u32,
        /// This process's uid.
        uid: u32,
    },
    /// A journal entry (or a caller) names a file that is not a KSM knob or
    /// a sysctl: the journal tells root what to write where, so only those.
    #[error("refusing to record or restore {0}: not a KSM sysfs file or a sysctl")]
    ForeignPath(PathBuf),
    /// A knob's contents are not what the caller expected.
    #[error("{path}: {detail}")]
    Parse {
        /// The knob's file.
        path: PathBuf,
        /// What was expected and found.
        detail: String,
    },
}

type Result<T> = std::result::Result<T, JournalError>;

mod holder;

#[cfg(test)]
use holder::parse_stat;
pub use holder::{proc_stat, Holder};

/// One knob's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The knob's file (`/sys/kernel/mm/ksm/run`, `/proc/sys/vm/max_map_count`).
    pub path: PathBuf,
    /// Its value before the first holder changed it.
    pub original: String,
    /// The processes that hold the knob changed; the original goes back
    /// when the last one releases it or dies.
    pub holders: Vec<Holder>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Contents {
    version: u32,
    entries: Vec<Entry>,
}

/// A hold on one knob: released by [`Journal::release`].
#[derive(Debug, Clone)]
pub struct Hold {
    /// The knob's file.
    pub path: PathBuf,
    /// This process's record in the journal.
    pub holder: Holder,
    /// The knob's original (the journal's, which may predate this hold).
    pub original: String,
}

/// A knob put back to its original by recovery.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The knob's file.
    pub path: PathBuf,
    /// The value written back.
    pub value: String,
    /// What it was before (`None`: it already had the original value).
    pub was: Option<String>,
    /// The holders it was left by.
    pub holders: Vec<Holder>,
    /// Some holder was alive (restored by `--force`).
    pub forced: bool,
}

impl std::fmt::Display for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "restored {}={}", label(&self.path), self.value)?;
        match &self.was {
            Some(was) => write!(f, " (was {was})")?,
            None => write!(f, " (unchanged)")?,
        }
        let pids: Vec<String> = self.holders.iter().map(|h| h.pid.to_string()).collect();
        let s = if pids.len() == 1 { "" } else { "s" };
        match (pids.is_empty(), self.forced) {
            (true, _) => write!(f, " (no holder recorded)"),
            (false, false) => write!(f, " left by pid{s} {} (killed?)", pids.join(", ")),
            (false, true) => write!(f, " held by pid{s} {} (--force)", pids.join(", ")),
        }
    }
}

/// What one recovery did.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The knobs put back.
    pub restored: Vec<Restored>,
    /// Knobs whose restore failed: they stay recorded for the next attempt.
    pub failed: Vec<(PathBuf, JournalError)>,
}

/// One entry as `ksm status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EntryStatus {
    /// The knob's short name (`run`, `max_map_count`).
    pub knob: String,
    /// The knob's file.
    pub path: PathBuf,
    /// Its value before the first holder changed it.
    pub original: String,
    /// `None` if it cannot be read.
    pub current: Option<String>,
    /// The processes recorded as holding it.
    pub holders: Vec<HolderStatus>,
}

/// One holder as `ksm status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct HolderStatus {
    /// The holder's record.
    #[serde(flatten)]
    pub holder: Holder,
    /// The process is still running (same pid and start time).
    pub alive: bool,
}

/// Human name of a knob file: `KSM run`, `vm.max_map_count`, else the path.
pub fn label(path: &Path) -> String {
    if let Ok(rest) = path.strip_prefix("/proc/sys") {
        return rest.to_string_lossy().replace('/', ".");
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let parent = path.parent().and_then(|p| p.file_name());
    match (name, parent) {
        (Some(n), Some(p)) if p == "ksm" => format!("KSM {n}"),
        _ => path.display().to_string(),
    }
}

/// Restore order: `run` after the scan knobs, `max_page_sharing` at the very
/// end (the kernel refuses it while KSM pages exist).
fn restore_rank(path: &Path) -> u8 {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("run") => 1,
        Some("max_page_sharing") => 2,
        _ => 0,
    }
}

/// Reads a knob, trimmed; a choice file such as `advisor_mode`
/// (`[none] scan-time`) reads as its selected word.
pub fn read_knob(path: &Path) -> Result<String> {
    let s = std::fs::read_to_string(path).map_err(|source| JournalError::Knob {
        op: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let s = s.trim();
    if let (Some(a), Some(b)) = (s.find('['), s.find(']')) {
        if a < b {
            return Ok(s[a + 1..b].to_string());
        }
    }
    Ok(s.to_string())
}

fn write_knob(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|source| JournalError::Knob {
        op: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `original` unless the knob already has it; returns what it was.
fn put_back(path: &Path, original: &str) -> Result<Option<String>> {
    let current = read_knob(path).ok();
    if current.as_deref() == Some(original) {
        return Ok(None);
    }
    write_knob(path, original)?;
    Ok(current)
}

/// The runtime directory: `$PAGEFOLD_RUNTIME_DIR`, else `/run/pagefold` as
/// root, else `$XDG_RUNTIME_DIR/pagefold`.
pub fn runtime_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(RUNTIME_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(PathBuf::from(ROOT_RUNTIME_DIR));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("pagefold"))
        .ok_or(JournalError::NoRuntimeDir)
}

/// The journal in one directory. Cheap to clone; every operation opens,
/// locks, reads and (if it changes anything) replaces the file.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    /// Accept any knob path (tests with fake sysfs directories).
    any_path: bool,
}

/// The journal's flock; released on drop (and by the kernel at exit).
struct Locked {
    _file: File,
}

impl Journal {
    /// The journal in [`runtime_dir`].
    pub fn open_default() -> Result<Self> {
        Ok(Self {
            dir: runtime_dir()?,
            any_path: false,
        })
    }

    /// A journal in `dir` that records only KSM sysfs files and sysctls.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            any_path: false,
        }
    }

    /// A journal in `dir` that records any file (tests on fake sysfs trees).
    pub fn at_any_path(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            any_path: true,
        }
    }

    /// The directory the journal lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The journal file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    fn check_path(&self, path: &Path) -> Result<()> {
        if self.any_path {
            return Ok(());
        }
        let clean = path.is_absolute()
            && path
                .components()
                .all(|c| !matches!(c, Component::ParentDir))
            && (path.starts_with(super::KSM_SYSFS) || path.starts_with("/proc/sys"));
        if clean {
            Ok(())
        } else {
            Err(JournalError::ForeignPath(path.to_path_buf()))
        }
    }

    fn io<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> JournalError + 'a {
        move |source| JournalError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    fn lock(&self) -> Result<Locked> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.dir)
            .map_err(Self::io("creating", &self.dir))?;
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(&path)
            .map_err(Self::io("opening", &path))?;
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Locked { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Self::io("locking", &path)(e));
            }
        }
    }

    /// Reads the journal (empty if absent). With `move_corrupt`, a journal
    /// that does not parse is renamed aside (`…corrupt-SECS-PID`) and the
    /// error names the copy; without, it is left in place.
    fn load(&self, move_corrupt: bool) -> Result<Contents> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contents::default()),
            Err(e) => return Err(Self::io("reading", &path)(e)),
        };
        let meta = std::fs::metadata(&path).map_err(Self::io("reading", &path))?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid {
            return Err(JournalError::Untrusted {
                path,
                owner: meta.uid(),
                uid,
            });
        }
        match serde_json::from_slice::<Contents>(&bytes).map_err(|e| e.to_string()) {
            // Another pagefold's format: not ours to rewrite or move.
            Ok(c) if c.version != VERSION => Err(JournalError::Version {
                path,
                found: c.version,
            }),
            Ok(c) => Ok(c),
            Err(detail) if move_corrupt => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let kept = self.dir.join(format!(
                    "{JOURNAL_FILE}.corrupt-{secs}-{}",
                    std::process::id()
                ));
                std::fs::rename(&path, &kept).map_err(Self::io("moving aside", &path))?;
                Err(JournalError::Corrupt { path, kept, detail })
            }
            Err(detail) => Err(JournalError::Unreadable { path, detail }),
        }
    }

    /// Replaces the journal atomically (or removes it when empty): a crash
    /// leaves either the old or the new journal, never a torn one.
    fn save(&self, c: &Contents) -> Result<()> {
        let path = self.path();
        if c.entries.is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Self::io("removing", &path)(e))
                }
                _ => Ok(()),
            };
        }
        let tmp = self
            .dir
            .join(format!("{JOURNAL_FILE}.tmp-{}", std::process::id()));
        let text = serde_json::to_vec_pretty(c).map_err(|e| JournalError::Parse {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(Self::io("creating", &tmp))?;
        f.write_all(&text).map_err(Self::io("writing", &tmp))?;
        f.write_all(b"\n").map_err(Self::io("writing", &tmp))?;
        f.sync_all().map_err(Self::io("syncing", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(Self::io("renaming into place", &path))?;
        // The rename itself is durable only once the directory is synced.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(Self::io("syncing", &self.dir))
    }

    /// Records that this process is about to change `path`: the first
    /// holder's call stores the knob's current value as its original; later
    /// holders (this or another process) only join the holder set. Call it
    /// *before* writing the knob.
    pub fn hold(&self, path: &Path) -> Result<Hold> {
        self.check_path(path)?;
        let holder = Holder::me()?;
        let _lock = self.lock()?;
        let mut c = self.load(true)?;
        c.version = VERSION;
        let original = match c.entries.iter_mut().find(|e| e.path == path) {
            Some(e) => {
                e.holders.push(holder.clone());
                e.original.clone()
            }
            None => {
                let original = read_knob(path)?;
                c.entries.push(Entry {
                    path: path.to_path_buf(),
                    original: original.clone(),
                    holders: vec![holder.clone()],
                });
                original
            }
        };
        self.save(&c)?;
        Ok(Hold {
            path: path.to_path_buf(),
            holder,
            original,
        })
    }

    /// Gives up a hold. If it was the last live holder, the knob goes back
    /// to its original and the record is cleared; `Ok(true)` then. If the
    /// write fails, the hold stays recorded (retry, or recovery after we
    /// die). A record that is gone (`ksm restore --force`) is put back to
    /// the hold's original if nobody has recorded the knob since.
    pub fn release(&self, hold: &Hold) -> Result<bool> {
        let _lock = self.lock()?;
        let mut c = self.load(true)?;
        c.version = VERSION;
        let Some(i) = c.entries.iter().position(|e| e.path == hold.path) else {
            put_back(&hold.path, &hold.original)?;
            return Ok(true);
        };
        let e = &mut c.entries[i];
        // Dead holders go too: they cannot need the knob any more.
        e.holders.retain(|h| !h.same(&hold.holder) && h.alive());
        if !e.holders.is_empty() {
            self.save(&c)?;
            return Ok(false);
        }
        match put_back(&e.path, &e.original) {
            Ok(_) => {
                c.entries.remove(i);
                self.save(&c)?;
                Ok(true)
            }
            Err(err) => {
                e.holders.push(hold.holder.clone());
                self.save(&c)?;
                Err(err)
            }
        }
    }

    /// Puts back every knob whose holders are all dead (with `force`, every
    /// knob) and clears their records; dead holders of knobs that a live
    /// process still holds are dropped. Failed restores stay recorded.
    pub fn recover(&self, force: bool) -> Result<Recovery> {
        let mut out = Recovery::default();
        if !self.path().exists() {
            return Ok(out);
        }
        let _lock = self.lock()?;
        let mut c = self.load(true)?;
        c.version = VERSION;
        c.entries.sort_by_key(|e| restore_rank(&e.path));
        let mut keep = Vec::new();
        for mut e in std::mem::take(&mut c.entries) {
            let (live, dead): (Vec<Holder>, Vec<Holder>) =
                e.holders.iter().cloned().partition(Holder::alive);
            if !live.is_empty() && !force {
                e.holders = live;
                keep.push(e);
                continue;
            }
            let restored = self
                .check_path(&e.path)
                .and_then(|()| put_back(&e.path, &e.original));
            match restored {
                Ok(was) => out.restored.push(Restored {
                    path: e.path.clone(),
                    value: e.original.clone(),
                    was,
                    holders: live.iter().chain(&dead).cloned().collect(),
                    forced: !live.is_empty(),
                }),
                Err(err) => {
                    out.failed.push((e.path.clone(), err));
                    keep.push(e);
                }
            }
        }
        c.entries = keep;
        self.save(&c)?;
        Ok(out)
    }

    /// The journal's entries with current values and holder liveness
    /// (read-only: a corrupt journal is reported, not moved).
    pub fn status(&self) -> Result<Vec<EntryStatus>> {
        if !self.path().exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock()?;
        let c = self.load(false)?;
        Ok(c.entries
            .into_iter()
            .map(|e| EntryStatus {
                knob: label(&e.path),
                current: read_knob(&e.path).ok(),
                holders: e
                    .holders
                    .iter()
                    .map(|h| HolderStatus {
                        holder: h.clone(),
                        alive: h.alive(),
                    })
                    .collect(),
                original: e.original,
                path: e.path,
            })
            .collect())
    }

    /// Sets `path` to `value` under a hold; the guard restores on drop.
    pub fn set(&self, path: &Path, value: &str) -> Result<KnobGuard> {
        let hold = self.hold(path)?;
        let guard = KnobGuard {
            journal: self.clone(),
            hold: Some(hold),
        };
        write_knob(path, value)?;
        Ok(guard)
    }

    /// Raises a numeric knob to at least `at_least` under a hold (also when
    /// it is already high enough: another holder's higher value must then
    /// stay while this process runs). The guard restores on drop.
    pub fn raise(&self, path: &Path, at_least: u64) -> Result<KnobGuard> {
        let hold = self.hold(path)?;
        let guard = KnobGuard {
            journal: self.clone(),
            hold: Some(hold),
        };
        let cur = read_knob(path)?;
        let cur: u64 = cur.parse().map_err(|_| JournalError::Parse {
            path: path.to_path_buf(),
            detail: format!("{cur:?} is not an unsigned integer"),
        })?;
        if cur < at_least {
            write_knob(path, &at_least.to_string())?;
        }
        Ok(guard)
    }
}

/// A knob changed through the journal; restored (if this was its last
/// holder) on [`KnobGuard::restore`] or drop.
#[derive(Debug)]
pub struct KnobGuard {
    journal: Journal,
    hold: Option<Hold>,
}

impl KnobGuard {
    /// The knob this guard holds.
    pub fn path(&self) -> &Path {
        &self.hold.as_ref().expect("hold until restored").path
    }

    /// The knob's value before pagefold first changed it.
    pub fn original(&self) -> &str {
        &self.hold.as_ref().expect("hold until restored").original
    }

    /// Restores now, reporting failure (drop only logs it).
    pub fn restore(mut self) -> Result<()> {
        match self.hold.take() {
            Some(h) => self.journal.release(&h).map(|_| ()),
            None => Ok(()),
        }
    }
}

impl Drop for KnobGuard {
    fn drop(&mut self) {
        if let Some(h) = self.hold.take() {
            if let Err(e) = self.journal.release(&h) {
                log::error!("could not restore {}: {e}", label(&h.path));
            }
        }
    }
}

/// `/proc/sys/<name>` for `vm/max_map_count` or `vm.max_map_count` (a name
/// with a `/` is taken as a path: components such as `eth0.1` keep dots).
pub fn sysctl_path(name: &str) -> Result<PathBuf> {
    let rel = if name.contains('/') {
        name.to_string()
    } else {
        name.replace('.', "/")
    };
    let p = Path::new("/proc/sys").join(rel.trim_start_matches('/'));
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(JournalError::ForeignPath(p));
    }
    Ok(p)
}

/// Sets a sysctl (`"vm/max_map_count"`) through the default journal, after
/// recovering dead holders' records. The guard restores it on drop.
pub fn set_sysctl(name: &str, value: &str) -> Result<KnobGuard> {
    let j = Journal::open_default()?;
    report(&j, j.recover(false));
    j.set(&sysctl_path(name)?, value)
}

/// Raises a numeric sysctl to at least `at_least` (see [`Journal::raise`]).
pub fn raise_sysctl(name: &str, at_least: u64) -> Result<KnobGuard> {
    let j = Journal::open_default()?;
    report(&j, j.recover(false));
    j.raise(&sysctl_path(name)?, at_least)
}

/// Logs (as warnings: a pagefold was killed) what a recovery did; returns
/// the restores.
pub fn report(journal: &Journal, r: Result<Recovery>) -> Vec<Restored> {
    match r {
        Ok(rec) => {
            for (path, e) in &rec.failed {
                log::warn!(
                    "could not restore {} (journal {}): {e}",
                    label(path),
                    journal.path().display()
                );
            }
            for r in &rec.restored {
                log::warn!("{r}");
            }
            rec.restored
        }
        Err(e) => {
            log::warn!("recovering global state: {e}");
            Vec::new()
        }
    }
}

/// Serialises [`recover`] within one process: the journal's flock already
/// does across processes; this only keeps the log lines of two threads
/// recovering at once from interleaving.
static RECOVER: Mutex<()> = Mutex::new(());

/// Restores what dead pagefold processes left changed, logging each
/// restore. Everything that uses KSM or changes a sysctl calls this at
/// start (the KSM backend does on construction). Errors are logged, never
/// fatal: a damaged journal must not stop VMs from running.
pub fn recover() -> Vec<Restored> {
    let _g = RECOVER.lock().unwrap_or_else(|e| e.into_inner());
    match Journal::open_default() {
        Ok(j) => {
            let r = j.recover(false);
            report(&j, r)
        }
        // Nowhere to record means nothing was recorded by this user.
        Err(JournalError::NoRuntimeDir) => Vec::new(),
        Err(e) => {
            log::warn!("recovering global state: {e}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests;
