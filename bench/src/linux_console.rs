//! Follows a Linux build guest's serial console (a file the VMM writes)
//! for the start marker and the result line, while the VM runs.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::linux_result::{
    parse_result_line, LinuxBuildResult, ResultLineError, RESULT_MARKER, START_MARKER,
};

/// The line Linux prints when it panics (then it reboots or hangs, and
/// never prints a result line).
const PANIC_MARKER: &str = "Kernel panic - not syncing";
/// Lines that open a kernel error report (the first one is kept).
const REPORT_MARKERS: [&str; 3] = ["BUG: ", "Oops", "general protection fault"];

/// Console lines kept for error messages.
const TAIL_LINES: usize = 20;
/// A console line longer than this is cut (the kernel's lines are short;
/// a guest writing without newlines must not grow the buffer for ever).
const MAX_LINE: usize = 4096;

/// What the console said so far.
#[derive(Debug)]
pub struct ConsoleWatch {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    tail: VecDeque<String>,
    /// The guest printed the start marker.
    pub started: bool,
    /// What the start line says the guest builds (`targets=a/ b/`, the
    /// rest of the line), when it says.
    pub targets: Option<String>,
    /// The guest printed its result line (parsed, or why not).
    pub result: Option<Result<LinuxBuildResult, ResultLineError>>,
    /// The guest kernel's panic line, once it printed one.
    pub panic: Option<String>,
    /// The first kernel error report's opening line (`BUG: ...`).
    pub first_report: Option<String>,
    /// When the console last grew (or the watch began).
    last_growth: Instant,
}

impl ConsoleWatch {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            offset: 0,
            partial: Vec::new(),
            tail: VecDeque::new(),
            started: false,
            targets: None,
            result: None,
            panic: None,
            first_report: None,
            last_growth: Instant::now(),
        }
    }

    /// How long the console has not grown: a build guest prints a
    /// progress line every minute, so minutes of silence before its
    /// result line mean it stopped.
    pub fn silent_for(&self) -> Duration {
        self.last_growth.elapsed()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what was written since the last call. A missing file is
    /// nothing written yet.
    pub fn poll(&mut self) -> std::io::Result<()> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.feed(&buf);
        Ok(())
    }

    /// Takes in console bytes (split into lines at '\n').
    pub fn feed(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.last_growth = Instant::now();
        }
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.partial.clear();
                self.line(line);
            } else if self.partial.len() < MAX_LINE {
                self.partial.push(b);
            }
        }
    }

    fn line(&mut self, line: String) {
        if let Some(at) = line.find(START_MARKER) {
            self.started = true;
            self.targets = line[at..]
                .split_once(" targets=")
                .map(|(_, t)| t.trim_end().to_string());
        }
        // The first result line counts; the guest prints one.
        if self.result.is_none() && line.contains(RESULT_MARKER) {
            self.result = Some(parse_result_line(&line));
        }
        if self.first_report.is_none() && REPORT_MARKERS.iter().any(|m| line.contains(m)) {
            self.first_report = Some(line.trim_end().to_string());
        }
        if self.panic.is_none() && line.contains(PANIC_MARKER) {
            self.panic = Some(line.trim_end().to_string());
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.trim_end().to_string());
    }

    /// The last console lines, for error messages.
    pub fn tail(&self) -> String {
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_a_growing_console_file() {
        let p = std::env::temp_dir().join(format!("pagefold-console-{}", std::process::id()));
        std::fs::write(&p, "Linux version 6.1\nPAGEFOLD-BUILD-ST").unwrap();
        let mut w = ConsoleWatch::new(&p);
        w.poll().unwrap();
        assert!(!w.started && w.result.is_none());
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str(
            "ART nproc=2\r\nPAGEFOLD-BUILD-RESULT real=1 user=2 sys=3 status=1 sha256=-\n",
        );
        std::fs::write(&p, text).unwrap();
        w.poll().unwrap();
        assert!(w.started);
        assert_eq!(w.targets, None);
        let r = w.result.clone().unwrap().unwrap();
        assert_eq!((r.status, r.real_s), (1, 1.0));
        assert!(w.tail().starts_with("Linux version 6.1\n"), "{}", w.tail());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn takes_the_targets_from_the_start_line() {
        let mut w = ConsoleWatch::new(Path::new("/nonexistent/console"));
        w.feed(b"[  3.1] x\r\nPAGEFOLD-BUILD-START nproc=1 targets=mm/ lib/\r\n");
        assert!(w.started);
        assert_eq!(w.targets.as_deref(), Some("mm/ lib/"));
    }

    #[test]
    fn keeps_the_first_result_and_reports_a_malformed_one() {
        let mut w = ConsoleWatch::new(Path::new("/nonexistent/console"));
        w.poll().unwrap();
        w.feed(b"PAGEFOLD-BUILD-RESULT real=x\nPAGEFOLD-BUILD-RESULT real=1 user=1 sys=1 status=1 sha256=-\n");
        assert!(matches!(
            w.result,
            Some(Err(ResultLineError::Malformed { key: "real", .. }))
        ));
    }

    #[test]
    fn measures_silence_from_the_last_growth() {
        let mut w = ConsoleWatch::new(Path::new("/nonexistent/console"));
        std::thread::sleep(Duration::from_millis(30));
        assert!(w.silent_for() >= Duration::from_millis(30));
        w.feed(b"");
        assert!(w.silent_for() >= Duration::from_millis(30), "nothing new");
        w.feed(b"x");
        assert!(w.silent_for() < Duration::from_millis(30));
    }

    #[test]
    fn notices_a_guest_kernel_panic_and_its_first_report() {
        let mut w = ConsoleWatch::new(Path::new("/nonexistent/console"));
        w.feed(b"pagefold-build: 6 objects compiled\n");
        assert!(w.panic.is_none() && w.first_report.is_none());
        w.feed(b"[  258.5] BUG: ENTRY_TRAMPOLINE stack guard page was hit at 0\n");
        w.feed(b"[  258.5] RIP: 0010:error_entry+0x10/0x130\n[  258.5] Oops: again\n");
        assert!(w.panic.is_none());
        w.feed(b"[  258.5] Kernel panic - not syncing: Fatal exception in interrupt\n");
        assert_eq!(
            w.first_report.as_deref(),
            Some("[  258.5] BUG: ENTRY_TRAMPOLINE stack guard page was hit at 0")
        );
        assert_eq!(
            w.panic.as_deref(),
            Some("[  258.5] Kernel panic - not syncing: Fatal exception in interrupt")
        );
    }
}
