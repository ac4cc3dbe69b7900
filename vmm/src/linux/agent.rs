//! The host side of the guest agent: how tests and benchmarks make a Linux
//! guest run commands.
//!
//! scripts/guest-image.sh's initrd, booted with `pagefold.agent=DEV`, polls
//! the raw disk DEV (the *mailbox*, a file on the host attached as a
//! virtio-blk disk) with `O_DIRECT` reads, so each poll sees the file as
//! the host last wrote it. The first [`MAILBOX_BYTES`] of the disk hold
//!
//! ```text
//! PFAGENT <seq> <CRC-32 of the script, 8 hex digits>\n<script>\0\0...
//! ```
//!
//! A new sequence number whose checksum matches runs once, under `sh`, and
//! its output on the guest's console sits between `PAGEFOLD-AGENT-BEGIN
//! <seq>` and `PAGEFOLD-AGENT-END <seq> <status>`. The checksum rejects a
//! read torn by the host's write; the guest polls again.
//!
//! While a command runs, the agent prints `PAGEFOLD-AGENT-BUSY <seq>
//! <ticks>` every 10 s: the guest's busy CPU ticks so far (`/proc/stat`).
//! A guest slowed by its host (an emulated CPU, a busy engine) keeps
//! counting, as its clock runs on and charges the time to the task it
//! interrupted; a command stuck on I/O that never completes counts no
//! more. So [`wait_reply`] waits as long as the count grows, up to a cap.
//!
//! Nothing in the VMM depends on the agent: it is a guest program plus a
//! file protocol over a disk the VMM already serves, so the guest sees a
//! plain virtio-blk device and nothing else of the test.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The kernel command line of an agent VM whose first disk is the data
/// disk (mounted read-only at `/data`) and second the mailbox: what the
/// Linux-guest tests and `pagefold bench linux-read` boot.
pub const AGENT_CMDLINE: &str =
    "console=ttyS0 panic=-1 quiet pagefold.data=/dev/vda pagefold.agent=/dev/vdb";

/// Bytes of the mailbox the guest reads each poll (and the file's size).
pub const MAILBOX_BYTES: usize = 65536;
/// Printed by the agent once it polls.
pub const READY: &str = "PAGEFOLD-AGENT-READY";
const BEGIN: &str = "PAGEFOLD-AGENT-BEGIN";
const END: &str = "PAGEFOLD-AGENT-END";
const BUSY: &str = "PAGEFOLD-AGENT-BUSY";

/// Busy ticks (USER_HZ, 100 a second) between two of a command's
/// heartbeats that count as progress: a tenth of a CPU second in ten. An
/// idle guest's housekeeping stays below it; a command that runs, however
/// slowly its host lets it, goes far above.
const PROGRESS_TICKS: u64 = 10;

/// The longest a command may run while it shows progress, in multiples of
/// the wait's limit: a command that spins for ever still ends the wait.
const PROGRESS_CAP: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("mailbox {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("script of {len} bytes does not fit the {MAILBOX_BYTES}-byte mailbox")]
    TooLong { len: usize },
    #[error("a script must not contain NUL bytes (the mailbox's padding)")]
    Nul,
    #[error("console {path}: {source}")]
    Console {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no reply to command {seq} after {waited:?} ({progress}); console tail:\n{tail}")]
    Timeout {
        seq: u64,
        waited: Duration,
        /// What the command's heartbeats showed.
        progress: String,
        tail: String,
    },
    #[error("the guest stopped before replying to command {seq}: {why}")]
    Stopped { seq: u64, why: String },
}

/// A mailbox file: the host writes commands here.
#[derive(Debug)]
pub struct Mailbox {
    file: File,
    path: PathBuf,
    seq: u64,
}

impl Mailbox {
    /// Creates (or empties) the mailbox file at `path`, [`MAILBOX_BYTES`]
    /// of zeros: attach it to the VM as a writable raw disk.
    pub fn create(path: &Path) -> Result<Self, AgentError> {
        let io = |source| AgentError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(io)?;
        file.set_len(MAILBOX_BYTES as u64).map_err(io)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            seq: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `script` as the next command and returns its sequence
    /// number; the guest runs it at its next poll (0.3 s).
    pub fn post(&mut self, script: &str) -> Result<u64, AgentError> {
        if script.contains('\0') {
            return Err(AgentError::Nul);
        }
        let seq = self.seq + 1;
        let block = encode(seq, script)?;
        self.file
            .write_all_at(&block, 0)
            .map_err(|source| AgentError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.seq = seq;
        Ok(seq)
    }
}

/// The mailbox block for command `seq` (a script ends with a newline).
fn encode(seq: u64, script: &str) -> Result<Vec<u8>, AgentError> {
    let mut body = script.to_string();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    let header = format!("PFAGENT {seq} {:08x}\n", crc32fast::hash(body.as_bytes()));
    let len = header.len() + body.len();
    if len > MAILBOX_BYTES {
        return Err(AgentError::TooLong { len });
    }
    let mut block = vec![0u8; MAILBOX_BYTES];
    block[..header.len()].copy_from_slice(header.as_bytes());
    block[header.len()..len].copy_from_slice(body.as_bytes());
    Ok(block)
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: i32,
    /// The command's console lines (kernel messages printed meanwhile
    /// included, if the guest's log level lets them through).
    pub output: String,
}

impl Reply {
    /// The value of the first `KEY=VALUE` word named `key` in the output.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.output
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    }
}

/// The reply to command `seq` in console text, once the guest has
/// finished it.
pub fn find_reply(console: &str, seq: u64) -> Option<Reply> {
    let begin = format!("{BEGIN} {seq}");
    let end = format!("{END} {seq} ");
    let mut out = None::<String>;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        match &mut out {
            None if line.trim_end() == begin => out = Some(String::new()),
            None => {}
            Some(o) => {
                if let Some(status) = line.strip_prefix(&end) {
                    let status = status.trim().parse().ok()?;
                    return Some(Reply {
                        status,
                        output: std::mem::take(o),
                    });
                }
                // A heartbeat is the agent's, not the command's output. It
                // is written whole and ends its line, so one that landed in
                // the middle of a command's line leaves that line's start
                // before it and its rest on the next line: rejoin them.
                if let Some(at) = line.find(BUSY) {
                    o.push_str(&line[..at]);
                    continue;
                }
                o.push_str(line);
                o.push('\n');
            }
        }
    }
    None
}

/// The busy-tick counts of command `seq`'s heartbeats in console text, in
/// the order the guest printed them.
pub fn heartbeats(console: &str, seq: u64) -> Vec<u64> {
    let begin = format!("{BEGIN} {seq}");
    let mut started = false;
    let mut beats = Vec::new();
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if !started {
            started = line.trim_end() == begin;
            continue;
        }
        let Some(at) = line.find(BUSY) else { continue };
        let mut words = line[at + BUSY.len()..].split_whitespace();
        if words.next().and_then(|w| w.parse::<u64>().ok()) != Some(seq) {
            continue;
        }
        if let Some(ticks) = words.next().and_then(|w| w.parse().ok()) {
            beats.push(ticks);
        }
    }
    beats
}

/// Whether a wait goes on: when the command last showed progress, by the
/// host's clock (`PROGRESS_TICKS` more busy ticks than the heartbeat
/// before).
///
/// A count may read lower than the one before it: a kernel message can
/// cut a heartbeat's line on the serial console, and the kernel's
/// per-CPU sums are not strictly monotonic. Only growth between two
/// consecutive heartbeats counts, so such a reading costs the wait one
/// heartbeat's progress at most.
#[derive(Debug)]
struct Progress {
    start: Instant,
    beats_seen: usize,
    last: Instant,
    /// The busy ticks the heartbeats added up to so far.
    grown: u64,
}

impl Progress {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            beats_seen: 0,
            last: now,
            grown: 0,
        }
    }

    /// Takes in the heartbeats printed so far, at `now`.
    fn see(&mut self, beats: &[u64], now: Instant) {
        let from = self.beats_seen.saturating_sub(1).min(beats.len());
        for pair in beats[from..].windows(2) {
            let grew = pair[1].saturating_sub(pair[0]);
            self.grown += grew;
            if grew >= PROGRESS_TICKS {
                self.last = now;
            }
        }
        self.beats_seen = self.beats_seen.max(beats.len());
    }

    /// Why the wait ends at `now`, if it does: `limit` without progress,
    /// or `PROGRESS_CAP` times `limit` in all.
    fn expired(&self, limit: Duration, now: Instant) -> Option<String> {
        let quiet = now - self.last;
        let all = now - self.start;
        let seen = || match self.beats_seen {
            0 => "no heartbeat".to_string(),
            n => format!("{n} heartbeats, {} busy ticks between them", self.grown),
        };
        if quiet > limit {
            Some(format!("no progress for {quiet:.1?}: {}", seen()))
        } else if all > limit * PROGRESS_CAP {
            Some(format!(
                "still busy at the cap of {PROGRESS_CAP} x {limit:?}: {}",
                seen()
            ))
        } else {
            None
        }
    }
}

/// Waits until the console file at `console` holds the reply to `seq`.
/// `limit` is how long the command may go without progress (its
/// heartbeats' busy ticks standing still, or no heartbeats at all); a
/// command that keeps progressing gets up to `PROGRESS_CAP` times
/// `limit`. `stopped` is asked every poll whether the VM has stopped (its
/// reason), so a guest that dies fails the wait at once.
pub fn wait_reply(
    console: &Path,
    seq: u64,
    limit: Duration,
    mut stopped: impl FnMut() -> Option<String>,
) -> Result<Reply, AgentError> {
    let mut progress = Progress::new();
    loop {
        let text = read_console(console)?;
        if let Some(r) = find_reply(&text, seq) {
            return Ok(r);
        }
        if let Some(why) = stopped() {
            // It may have replied just before stopping.
            if let Some(r) = find_reply(&read_console(console)?, seq) {
                return Ok(r);
            }
            return Err(AgentError::Stopped { seq, why });
        }
        let now = Instant::now();
        progress.see(&heartbeats(&text, seq), now);
        if let Some(why) = progress.expired(limit, now) {
            return Err(AgentError::Timeout {
                seq,
                waited: now - progress.start,
                progress: why,
                tail: tail(&text, 30),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the agent has started polling (its ready line is on `console`).
pub fn is_ready(console: &Path) -> Result<bool, AgentError> {
    Ok(read_console(console)?.contains(READY))
}

fn read_console(console: &Path) -> Result<String, AgentError> {
    match std::fs::read(console) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        // Not created yet: the VM has not started.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(AgentError::Console {
            path: console.to_path_buf(),
            source,
        }),
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_carries_the_sequence_the_checksum_and_the_script() {
        let b = encode(7, "echo hi").unwrap();
        assert_eq!(b.len(), MAILBOX_BYTES);
        let text = String::from_utf8_lossy(&b);
        let text = text.trim_end_matches('\0');
        // CRC-32 of "echo hi\n", as busybox's crc32 prints it.
        let crc = crc32fast::hash(b"echo hi\n");
        assert_eq!(text, format!("PFAGENT 7 {crc:08x}\necho hi\n"));
        // The standard check value: what the guest's crc32 applet prints.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn scripts_that_do_not_fit_or_hold_nul_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Mailbox::create(&dir.path().join("mbox")).unwrap();
        assert!(matches!(
            m.post(&"x".repeat(MAILBOX_BYTES)),
            Err(AgentError::TooLong { .. })
        ));
        assert!(matches!(m.post("a\0b"), Err(AgentError::Nul)));
        // Refusals use no sequence number.
        assert_eq!(m.post("true").unwrap(), 1);
        let on_disk = std::fs::read(m.path()).unwrap();
        assert_eq!(on_disk.len(), MAILBOX_BYTES);
        assert!(on_disk.starts_with(b"PFAGENT 1 "));
    }

    #[test]
    fn a_reply_is_found_only_once_the_command_ended() {
        let console = "boot\nPAGEFOLD-AGENT-READY 6.1\nPAGEFOLD-AGENT-BEGIN 1\nsum=abc\n\
                       PAGEFOLD-AGENT-END 1 0\nPAGEFOLD-AGENT-BEGIN 2\nhalf";
        let r = find_reply(console, 1).unwrap();
        assert_eq!(r.status, 0);
        assert_eq!(r.output, "sum=abc\n");
        assert_eq!(r.value("sum"), Some("abc"));
        assert_eq!(r.value("su"), None);
        assert_eq!(find_reply(console, 2), None);
        // Command 1 is not command 11.
        let c = "PAGEFOLD-AGENT-BEGIN 11\nx\nPAGEFOLD-AGENT-END 11 3\n";
        assert_eq!(find_reply(c, 1), None);
        assert_eq!(find_reply(c, 11).unwrap().status, 3);
    }

    /// The instant `s` seconds after `start`.
    fn secs_after(start: Instant) -> impl Fn(u64) -> Instant {
        move |s| start + Duration::from_secs(s)
    }

    #[test]
    fn heartbeats_are_not_output_and_belong_to_their_command() {
        let console = "PAGEFOLD-AGENT-BEGIN 1\nPAGEFOLD-AGENT-BUSY 1 500\nsum=\
                       PAGEFOLD-AGENT-BUSY 1 620\nabc\nn=2\nPAGEFOLD-AGENT-END 1 0\n\
                       PAGEFOLD-AGENT-BEGIN 11\nPAGEFOLD-AGENT-BUSY 11 900\n";
        let r = find_reply(console, 1).unwrap();
        // The line the second heartbeat split is whole again.
        assert_eq!(r.output, "sum=abc\nn=2\n");
        assert_eq!(r.value("sum"), Some("abc"));
        assert_eq!(heartbeats(console, 1), vec![500, 620]);
        assert_eq!(heartbeats(console, 11), vec![900]);
        assert_eq!(heartbeats(console, 2), Vec::<u64>::new());
    }

    #[test]
    fn a_wait_goes_on_while_busy_ticks_grow_up_to_its_cap() {
        let limit = Duration::from_secs(100);
        let mut p = Progress::new();
        let t = secs_after(p.start);
        let mut beats = vec![1000];
        p.see(&beats, t(10));
        assert_eq!(p.expired(limit, t(99)), None);
        // Without a heartbeat that grew, the limit counts from the start.
        assert!(p.expired(limit, t(101)).is_some());
        // Every heartbeat grows by PROGRESS_TICKS: the wait goes on.
        for s in (20..=350).step_by(10) {
            beats.push(beats.last().unwrap() + PROGRESS_TICKS);
            p.see(&beats, t(s));
            assert_eq!(p.expired(limit, t(s + 5)), None, "at {s} s");
        }
        // Up to the cap, however busy the guest is.
        beats.push(beats.last().unwrap() + 1000);
        p.see(&beats, t(395));
        let why = p.expired(limit, t(401)).unwrap();
        assert!(why.starts_with("still busy at the cap"), "{why}");
    }

    #[test]
    fn a_wait_ends_once_busy_ticks_stand_still() {
        let limit = Duration::from_secs(100);
        let mut p = Progress::new();
        let t = secs_after(p.start);
        let mut beats = vec![1000, 1200];
        p.see(&beats, t(20));
        // An idle guest's few ticks are not progress.
        for s in (30..=120).step_by(10) {
            beats.push(beats.last().unwrap() + PROGRESS_TICKS - 1);
            p.see(&beats, t(s));
        }
        assert_eq!(p.expired(limit, t(119)), None);
        let why = p.expired(limit, t(121)).unwrap();
        assert!(why.starts_with("no progress for"), "{why}");
        assert!(why.contains("12 heartbeats"), "{why}");
    }

    #[test]
    fn a_count_that_reads_lower_costs_one_heartbeat_and_no_panic() {
        let limit = Duration::from_secs(100);
        let mut p = Progress::new();
        let t = secs_after(p.start);
        // The second count was cut short on the console ("1205" of 12050).
        p.see(&[12000, 1205], t(10));
        assert!(p.expired(limit, t(101)).is_some());
        // The next whole count is progress again.
        p.see(&[12000, 1205, 12100], t(20));
        assert_eq!(p.expired(limit, t(119)), None);
        let why = p.expired(limit, t(121)).unwrap();
        assert!(why.contains("3 heartbeats"), "{why}");
    }
}
