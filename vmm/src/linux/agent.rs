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
    #[error("no reply to command {seq} within {waited:?}; console tail:\n{tail}")]
    Timeout {
        seq: u64,
        waited: Duration,
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
                o.push_str(line);
                o.push('\n');
            }
        }
    }
    None
}

/// Waits until the console file at `console` holds the reply to `seq`.
/// `stopped` is asked every poll whether the VM has stopped (its reason),
/// so a guest that dies fails the wait at once instead of at `limit`.
pub fn wait_reply(
    console: &Path,
    seq: u64,
    limit: Duration,
    mut stopped: impl FnMut() -> Option<String>,
) -> Result<Reply, AgentError> {
    let start = Instant::now();
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
        if start.elapsed() > limit {
            return Err(AgentError::Timeout {
                seq,
                waited: limit,
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
}
