//! Who holds a knob: a process, told apart from a later one with its pid
//! by its start time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{JournalError, Result};

/// A process that holds a knob: `pid` is alive *and* started at
/// `start_time` (clock ticks after boot, `/proc/PID/stat` field 22).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The process id.
    pub pid: u32,
    /// The process's start time, so a reused pid is not taken for it.
    pub start_time: u64,
    /// Distinguishes the holds of one process (two backends, two knobs).
    pub token: u64,
    /// The process's name when it took the hold, for `ksm status`.
    #[serde(default)]
    pub comm: String,
}

impl Holder {
    /// A new holder for this process.
    pub(super) fn me() -> Result<Self> {
        static TOKEN: AtomicU64 = AtomicU64::new(1);
        let pid = std::process::id();
        let (_, start_time) = proc_stat(pid)
            .map_err(|source| JournalError::Io {
                op: "reading",
                path: PathBuf::from(format!("/proc/{pid}/stat")),
                source,
            })?
            .ok_or_else(|| JournalError::Parse {
                path: PathBuf::from(format!("/proc/{pid}/stat")),
                detail: "own stat file missing".into(),
            })?;
        let comm = std::fs::read_to_string("/proc/self/comm")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Ok(Self {
            pid,
            start_time,
            token: TOKEN.fetch_add(1, Ordering::Relaxed),
            comm,
        })
    }

    /// Whether the holding process still runs. A zombie (killed, not yet
    /// reaped) is dead; a pid with another start time is someone else; an
    /// unreadable stat file other than "missing" counts as alive, so a
    /// doubt never restores a knob from under a running holder.
    pub fn alive(&self) -> bool {
        match proc_stat(self.pid) {
            Ok(Some((state, start))) => start == self.start_time && !matches!(state, 'Z' | 'X'),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    pub(super) fn same(&self, other: &Holder) -> bool {
        self.pid == other.pid && self.start_time == other.start_time && self.token == other.token
    }
}

/// State (field 3) and start time (field 22) of `/proc/PID/stat`;
/// `Ok(None)` if there is no such process.
pub fn proc_stat(pid: u32) -> std::io::Result<Option<(char, u64)>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_stat(&text)
        .map(Some)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad stat line"))
}

/// Parses state and start time out of a stat line; `comm` may hold spaces
/// and parentheses, so fields are counted after the last `)`.
pub(super) fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field 22 is fields[19].
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}
