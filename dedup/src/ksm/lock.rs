//! Serialises everything that drives the host's real KSM: tests in this
//! binary (a process-wide mutex) and in other binaries of the workspace,
//! the benchmark included (an `flock` on a shared lock file). KSM's knobs
//! are global, so two users at once would measure and restore each other's
//! settings.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use super::error::KsmError;

/// The lock file every KSM-touching test and benchmark takes.
pub const KSM_LOCK_PATH: &str = "/tmp/pagefold-ksm-tests.lock";

static IN_PROCESS: Mutex<()> = Mutex::new(());

/// Takes the lock file's `flock` without waiting, for a long-lived holder
/// (the engine's KSM assist); `None` if another open file description (in
/// practice, another process or a test in this one) holds it.
pub fn try_ksm_flock() -> Option<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(KSM_LOCK_PATH)
        .ok()?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    (r == 0).then_some(file)
}

/// Held while using KSM; released on drop (the kernel also drops the
/// `flock` if the process dies).
#[derive(Debug)]
pub struct KsmExclusive {
    _file: File,
    _guard: MutexGuard<'static, ()>,
}

/// Blocks until this thread is the only KSM user among the cooperating
/// processes. Not re-entrant: taking it twice on one thread deadlocks.
pub fn ksm_exclusive() -> Result<KsmExclusive, KsmError> {
    ksm_exclusive_at(Path::new(KSM_LOCK_PATH))
}

/// Same, with another lock file (tests of the lock itself).
pub fn ksm_exclusive_at(path: &Path) -> Result<KsmExclusive, KsmError> {
    // A test that panicked while holding the lock poisons the mutex; the
    // next test must still run (its knobs were restored by Drop).
    let guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let lock_err = |source| KsmError::Lock {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(lock_err)?;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(lock_err(e));
        }
    }
    Ok(KsmExclusive {
        _file: file,
        _guard: guard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_other_open_file_descriptions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ksm.lock");
        let held = ksm_exclusive_at(&path).unwrap();
        // Another open file description (as another process would have)
        // cannot take the flock while we hold it.
        let other = File::open(&path).unwrap();
        // SAFETY: flock on a descriptor we own.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EWOULDBLOCK)
        );
        drop(held);
        // Free once dropped. Another test of this binary that spawns a
        // process forks it with every descriptor, ours included, until its
        // exec closes them (close-on-exec): such a child holds the lock
        // for that moment, long on an emulated CPU. So the lock must come
        // free, not at once; held on by the drop, it never would.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let r = loop {
            // SAFETY: as above.
            let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 || std::time::Instant::now() >= deadline {
                break r;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        drop(other);
        std::fs::remove_file(path).unwrap();
    }
}
