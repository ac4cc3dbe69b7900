//! Journal tests on temporary directories and fake knob files: no global
//! state is touched, so they run in parallel with everything.

use std::process::{Child, Command};

use super::*;

/// A scratch directory with a `journal/` and a fake knob tree, removed on drop.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(knobs: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ksm")).unwrap();
        for (n, v) in knobs {
            std::fs::write(dir.path().join("ksm").join(n), format!("{v}\n")).unwrap();
        }
        Self { dir }
    }

    fn journal(&self) -> Journal {
        Journal::at_any_path(self.dir.path().join("journal"))
    }

    fn knob(&self, name: &str) -> PathBuf {
        self.dir.path().join("ksm").join(name)
    }

    fn read(&self, name: &str) -> String {
        read_knob(&self.knob(name)).unwrap()
    }

    fn set(&self, name: &str, v: &str) {
        std::fs::write(self.knob(name), v).unwrap();
    }
}

/// A live process that is not us (killed and reaped on drop).
struct Other(Child);

impl Other {
    fn spawn() -> Self {
        Self(Command::new("sleep").arg("300").spawn().unwrap())
    }

    fn holder(&self) -> Holder {
        let pid = self.0.id();
        let (_, start_time) = proc_stat(pid).unwrap().unwrap();
        Holder {
            pid,
            start_time,
            token: 1,
            comm: "sleep".into(),
        }
    }

    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes a journal as another process would have left it.
fn forge(j: &Journal, entries: Vec<Entry>) {
    std::fs::create_dir_all(j.dir()).unwrap();
    j.save(&Contents {
        version: VERSION,
        entries,
    })
    .unwrap();
}

fn entries(j: &Journal) -> Vec<Entry> {
    j.load(false).unwrap().entries
}

#[test]
fn hold_records_the_original_atomically_and_release_restores_it() {
    let s = Scratch::new(&[("pages_to_scan", "100")]);
    let j = s.journal();
    let knob = s.knob("pages_to_scan");
    let hold = j.hold(&knob).unwrap();
    assert_eq!(hold.original, "100");
    s.set("pages_to_scan", "777");
    let e = entries(&j);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, knob);
    assert_eq!(e[0].original, "100");
    assert_eq!(e[0].holders, std::slice::from_ref(&hold.holder));
    assert_eq!(e[0].holders[0].pid, std::process::id());
    // Replaced by rename: no temp file is left behind, and a second save
    // puts a new inode in place (never rewritten in place, so never torn).
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(j.dir()), [JOURNAL_FILE, LOCK_FILE]);
    let ino = std::fs::metadata(j.path()).unwrap().ino();
    let second = j.hold(&knob).unwrap();
    assert_ne!(std::fs::metadata(j.path()).unwrap().ino(), ino);
    assert_eq!(names(j.dir()), [JOURNAL_FILE, LOCK_FILE]);
    // The second hold (same process, another backend) keeps the original.
    assert_eq!(second.original, "100");
    assert!(!j.release(&second).unwrap(), "a holder is left");
    assert_eq!(s.read("pages_to_scan"), "777");
    assert!(j.release(&hold).unwrap());
    assert_eq!(s.read("pages_to_scan"), "100");
    // The last release clears the record: the journal file is gone.
    assert!(!j.path().exists());
}

#[test]
fn stat_parsing_and_liveness_tell_a_recycled_pid_from_its_owner() {
    let line = "37 (ksm d) (x)) S 2 0 0 0 -1 2129984 0 0 0 0 150 270 0 0 25 5 1 0 4242 0 0";
    assert_eq!(parse_stat(line), Some(('S', 4242)));
    assert_eq!(parse_stat("37 (x) S 1 2"), None);

    let me = Holder::me().unwrap();
    assert!(me.alive());
    // Same pid, another start time: the pid was recycled, the holder is dead.
    let recycled = Holder {
        start_time: me.start_time + 1,
        ..me.clone()
    };
    assert!(!recycled.alive());
    // An exited, reaped process.
    let other = Other::spawn();
    let gone = other.holder();
    assert!(gone.alive());
    other.kill();
    assert!(!gone.alive());
    // A killed but unreaped process (a zombie) is dead too.
    let mut child = Command::new("sleep").arg("300").spawn().unwrap();
    let (_, start_time) = proc_stat(child.id()).unwrap().unwrap();
    let zombie = Holder {
        pid: child.id(),
        start_time,
        token: 1,
        comm: String::new(),
    };
    // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    let t = std::time::Instant::now();
    while zombie.alive() && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!zombie.alive());
    assert!(matches!(proc_stat(child.id()).unwrap(), Some(('Z', _))));
    child.wait().unwrap();
}

#[test]
fn recover_restores_dead_holders_knobs_in_order_and_keeps_live_ones() {
    let s = Scratch::new(&[
        ("run", "1"),
        ("pages_to_scan", "777"),
        ("sleep_millisecs", "5"),
    ]);
    let j = s.journal();
    let me = Holder::me().unwrap();
    let dead = Holder {
        start_time: me.start_time + 1,
        ..me.clone()
    };
    let live = Other::spawn();
    forge(
        &j,
        vec![
            Entry {
                path: s.knob("run"),
                original: "0".into(),
                holders: vec![dead.clone()],
            },
            Entry {
                path: s.knob("pages_to_scan"),
                original: "100".into(),
                holders: vec![dead.clone()],
            },
            Entry {
                path: s.knob("sleep_millisecs"),
                original: "20".into(),
                holders: vec![dead.clone(), live.holder()],
            },
        ],
    );
    let rec = j.recover(false).unwrap();
    assert!(rec.failed.is_empty(), "{:?}", rec.failed);
    // `run` goes back after the scan knobs.
    let paths: Vec<&Path> = rec.restored.iter().map(|r| r.path.as_path()).collect();
    assert_eq!(paths, [s.knob("pages_to_scan"), s.knob("run")]);
    assert_eq!(s.read("run"), "0");
    assert_eq!(s.read("pages_to_scan"), "100");
    assert_eq!(
        rec.restored[1].to_string(),
        format!(
            "restored KSM run=0 (was 1) left by pid {} (killed?)",
            me.pid
        )
    );
    // Held by a live process: untouched, its dead co-holder dropped.
    assert_eq!(s.read("sleep_millisecs"), "5");
    assert_eq!(
        entries(&j),
        [Entry {
            path: s.knob("sleep_millisecs"),
            original: "20".into(),
            holders: vec![live.holder()],
        }]
    );
    let st = j.status().unwrap();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].knob, "KSM sleep_millisecs");
    assert_eq!(st[0].current.as_deref(), Some("5"));
    assert!(st[0].holders[0].alive);
    // Once it dies, the next recovery restores it.
    let pid = live.holder().pid;
    live.kill();
    let rec = j.recover(false).unwrap();
    assert_eq!(rec.restored.len(), 1);
    assert!(
        rec.restored[0]
            .to_string()
            .ends_with(&format!("left by pid {pid} (killed?)")),
        "{}",
        rec.restored[0]
    );
    assert_eq!(s.read("sleep_millisecs"), "20");
    assert!(!j.path().exists());
}

#[test]
fn a_second_live_owner_never_records_the_first_ones_value_as_original() {
    let s = Scratch::new(&[("run", "0")]);
    let j = s.journal();
    let first = Other::spawn();
    // The first owner recorded run=0 and then set run=1.
    forge(
        &j,
        vec![Entry {
            path: s.knob("run"),
            original: "0".into(),
            holders: vec![first.holder()],
        }],
    );
    s.set("run", "1");
    let hold = j.hold(&s.knob("run")).unwrap();
    assert_eq!(hold.original, "0");
    // We finish first: the first owner still runs, so run stays 1.
    assert!(!j.release(&hold).unwrap());
    assert_eq!(s.read("run"), "1");
    assert!(j.recover(false).unwrap().restored.is_empty());
    assert_eq!(s.read("run"), "1");
    assert_eq!(entries(&j)[0].holders, [first.holder()]);
    // With --force it goes back even though the owner lives.
    let pid = first.holder().pid;
    let rec = j.recover(true).unwrap();
    assert_eq!(rec.restored.len(), 1);
    assert!(rec.restored[0].forced);
    assert_eq!(
        rec.restored[0].to_string(),
        format!("restored KSM run=0 (was 1) held by pid {pid} (--force)")
    );
    assert_eq!(s.read("run"), "0");
    assert!(!j.path().exists());
}

#[test]
fn release_after_a_forced_restore_puts_the_original_back_again() {
    let s = Scratch::new(&[("pages_to_scan", "100")]);
    let j = s.journal();
    let hold = j.hold(&s.knob("pages_to_scan")).unwrap();
    s.set("pages_to_scan", "500");
    j.recover(true).unwrap();
    assert_eq!(s.read("pages_to_scan"), "100");
    // The live holder changed it again after the forced restore.
    s.set("pages_to_scan", "600");
    assert!(j.release(&hold).unwrap());
    assert_eq!(s.read("pages_to_scan"), "100");
}

#[test]
fn a_failed_restore_stays_recorded_for_a_retry() {
    let s = Scratch::new(&[("max_page_sharing", "256")]);
    let j = s.journal();
    let knob = s.knob("max_page_sharing");
    let hold = j.hold(&knob).unwrap();
    s.set("max_page_sharing", "16");
    // Unwritable: a directory in its place.
    std::fs::remove_file(&knob).unwrap();
    std::fs::create_dir(&knob).unwrap();
    let e = j.release(&hold).unwrap_err();
    assert!(matches!(e, JournalError::Knob { .. }), "{e}");
    assert_eq!(entries(&j)[0].holders, std::slice::from_ref(&hold.holder));
    std::fs::remove_dir(&knob).unwrap();
    s.set("max_page_sharing", "16");
    assert!(j.release(&hold).unwrap());
    assert_eq!(s.read("max_page_sharing"), "256");
}

#[test]
fn a_corrupt_journal_is_a_clear_error_and_is_kept_aside() {
    let s = Scratch::new(&[("run", "0")]);
    let j = s.journal();
    std::fs::create_dir_all(j.dir()).unwrap();
    let garbage = b"{\"version\": 1, \"entries\": [ {\"path\": tru";
    std::fs::write(j.path(), garbage).unwrap();
    // Read-only status reports it and leaves it in place.
    let e = j.status().unwrap_err();
    assert!(matches!(e, JournalError::Unreadable { .. }), "{e}");
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert_eq!(std::fs::read(j.path()).unwrap(), garbage);
    // Recovery moves it aside and says where.
    let e = j.recover(false).unwrap_err();
    let JournalError::Corrupt { kept, path, .. } = &e else {
        panic!("expected Corrupt, got {e}");
    };
    assert_eq!(path, &j.path());
    assert_eq!(std::fs::read(kept).unwrap(), garbage);
    assert!(!j.path().exists());
    let msg = e.to_string();
    assert!(msg.contains(&kept.display().to_string()), "{msg}");
    assert!(msg.contains("check them by hand"), "{msg}");
    // pagefold goes on with a fresh journal.
    let hold = j.hold(&s.knob("run")).unwrap();
    assert_eq!(hold.original, "0");
    assert!(j.release(&hold).unwrap());
    // A journal of another version is not guessed at, nor moved: its
    // holders may still run.
    let other = "{\"version\": 99, \"entries\": []}";
    std::fs::write(j.path(), other).unwrap();
    let e = j.recover(false).unwrap_err();
    assert!(matches!(e, JournalError::Version { found: 99, .. }), "{e}");
    assert!(e.to_string().contains("version 99"), "{e}");
    assert!(j.hold(&s.knob("run")).is_err());
    assert_eq!(std::fs::read_to_string(j.path()).unwrap(), other);
}

#[test]
fn only_ksm_files_and_sysctls_are_recorded_by_a_default_journal() {
    let s = Scratch::new(&[("run", "0")]);
    let j = Journal::at(s.dir.path().join("journal"));
    let e = j.hold(&s.knob("run")).unwrap_err();
    assert!(matches!(e, JournalError::ForeignPath(_)), "{e}");
    let e = j.hold(Path::new("/sys/kernel/mm/ksm/../../../../etc/passwd"));
    assert!(matches!(e, Err(JournalError::ForeignPath(_))));
    // A forged entry pointing elsewhere is refused at recovery, and kept.
    forge(
        &j,
        vec![Entry {
            path: PathBuf::from("/etc/hostname"),
            original: "x".into(),
            holders: vec![],
        }],
    );
    let rec = j.recover(false).unwrap();
    assert!(rec.restored.is_empty());
    assert!(matches!(rec.failed[0].1, JournalError::ForeignPath(_)));
    assert_eq!(
        sysctl_path("vm.max_map_count").unwrap(),
        Path::new("/proc/sys/vm/max_map_count")
    );
    assert_eq!(
        sysctl_path("vm/max_map_count").unwrap(),
        Path::new("/proc/sys/vm/max_map_count")
    );
    assert!(sysctl_path("vm/../../etc/passwd").is_err());
    assert_eq!(
        label(Path::new("/proc/sys/vm/max_map_count")),
        "vm.max_map_count"
    );
    assert_eq!(label(Path::new("/sys/kernel/mm/ksm/run")), "KSM run");
}

#[test]
fn raise_only_raises_and_its_guard_restores() {
    let s = Scratch::new(&[
        ("max_map_count", "65530"),
        ("advisor_mode", "[none] scan-time"),
    ]);
    let j = s.journal();
    let knob = s.knob("max_map_count");
    let low = j.raise(&knob, 1000).unwrap();
    assert_eq!(s.read("max_map_count"), "65530");
    let high = j.raise(&knob, 262_144).unwrap();
    assert_eq!(high.original(), "65530");
    assert_eq!(s.read("max_map_count"), "262144");
    // The first guard goes: the other still holds, the value stays.
    drop(low);
    assert_eq!(s.read("max_map_count"), "262144");
    high.restore().unwrap();
    assert_eq!(s.read("max_map_count"), "65530");
    // Choice files record their selected word.
    let g = j.set(&s.knob("advisor_mode"), "scan-time").unwrap();
    assert_eq!(g.original(), "none");
}

/// The real `vm.max_map_count` (root), with a private journal: raised while
/// the guard lives, back as found after it. Takes the KSM lock, the lock of
/// every test that changes global state; puts the value back even if the
/// test fails.
#[test]
fn raises_and_restores_the_real_max_map_count() {
    let _lock = crate::ksm::ksm_exclusive().unwrap();
    let path = sysctl_path("vm.max_map_count").unwrap();
    let found = read_knob(&path).unwrap();
    let s = Scratch::new(&[]);
    let j = Journal::at(s.dir.path().join("journal"));
    let r = std::panic::catch_unwind(|| {
        let n: u64 = found.parse().unwrap();
        let g = j.raise(&path, n + 4096).unwrap();
        assert_eq!(g.original(), found);
        assert_eq!(read_knob(&path).unwrap(), (n + 4096).to_string());
        assert_eq!(entries(&j)[0].original, found);
        drop(g);
        assert_eq!(read_knob(&path).unwrap(), found);
        assert!(!j.path().exists());
    });
    if read_knob(&path).unwrap() != found {
        std::fs::write(&path, &found).unwrap();
    }
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}
