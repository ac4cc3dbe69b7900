//! `pagefold ksm ...`: the host-global state pagefold changes (KSM knobs,
//! sysctls), as recorded in the state journal
//! (`pagefold_dedup::ksm::journal`, docs/global-state.md).

use std::collections::BTreeMap;
use std::path::Path;

use clap::{Args, Subcommand};
use pagefold_dedup::ksm::journal::{self, EntryStatus, Journal};
use pagefold_dedup::ksm::{snapshot_tunables, KSM_SYSFS};
use serde::Serialize;

use crate::error::Error;
use crate::output::{outln, OutputArg};

#[derive(Subcommand, Debug)]
pub enum KsmCommand {
    /// Show the state journal (knobs pagefold changed, their originals and
    /// holders) and the current KSM knobs and vm.max_map_count.
    Status(StatusArgs),
    /// Put back the knobs that dead pagefold processes left changed (what
    /// every pagefold that uses KSM also does when it starts).
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// `-o json`: the journal's records, the KSM knobs and the sysctls.
    #[command(flatten)]
    pub output: OutputArg,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Also restore knobs whose holder still runs (it may change them
    /// again; it restores them once more when it ends).
    #[arg(long)]
    pub force: bool,
}

pub fn run(c: KsmCommand) -> Result<i32, Error> {
    let j = Journal::open_default().map_err(|e| Error::Io(e.to_string()))?;
    match c {
        KsmCommand::Status(a) => status(&j, a.output.json()),
        KsmCommand::Restore(a) => restore(&j, a.force),
    }
}

/// What `pagefold ksm status -o json` prints.
#[derive(Serialize)]
struct StatusJson<'a> {
    journal: &'a Path,
    records: &'a [EntryStatus],
    ksm: &'a BTreeMap<String, String>,
    sysctl: Sysctls,
}

#[derive(Serialize)]
struct Sysctls {
    #[serde(rename = "vm.max_map_count")]
    max_map_count: Option<String>,
}

fn status(j: &Journal, json: bool) -> Result<i32, Error> {
    let entries = j.status().map_err(|e| Error::Io(e.to_string()))?;
    let ksm = snapshot_tunables(Path::new(KSM_SYSFS));
    let max_map_count = journal::sysctl_path("vm.max_map_count")
        .ok()
        .and_then(|p| journal::read_knob(&p).ok());
    if json {
        let path = j.path();
        let v = StatusJson {
            journal: &path,
            records: &entries,
            ksm: &ksm,
            sysctl: Sysctls { max_map_count },
        };
        let text = serde_json::to_string_pretty(&v).map_err(|e| Error::Io(e.to_string()))?;
        outln!("{text}")?;
        return Ok(0);
    }
    outln!("journal: {}", j.path().display())?;
    if entries.is_empty() {
        outln!("  no knob is recorded: pagefold holds nothing changed")?;
    }
    for e in &entries {
        let holders: Vec<String> = e
            .holders
            .iter()
            .map(|h| {
                let state = if h.alive { "running" } else { "dead" };
                format!("pid {} ({}, {state})", h.holder.pid, h.holder.comm)
            })
            .collect();
        outln!(
            "  {}: original {}, now {}, held by {}",
            e.knob,
            e.original,
            e.current.as_deref().unwrap_or("unreadable"),
            if holders.is_empty() {
                "nobody".to_string()
            } else {
                holders.join(", ")
            }
        )?;
    }
    if ksm.is_empty() {
        outln!("KSM: not available ({KSM_SYSFS} missing)")?;
    } else {
        let knobs: Vec<String> = ksm.iter().map(|(k, v)| format!("{k}={v}")).collect();
        outln!("KSM now: {}", knobs.join(" "))?;
    }
    if let Some(m) = max_map_count {
        outln!("vm.max_map_count now: {m}")?;
    }
    Ok(0)
}

fn restore(j: &Journal, force: bool) -> Result<i32, Error> {
    let rec = j.recover(force).map_err(|e| Error::Io(e.to_string()))?;
    for r in &rec.restored {
        outln!("{r}")?;
    }
    for e in j.status().map_err(|e| Error::Io(e.to_string()))? {
        let live: Vec<String> = e
            .holders
            .iter()
            .filter(|h| h.alive)
            .map(|h| h.holder.pid.to_string())
            .collect();
        if !live.is_empty() && !rec.failed.iter().any(|(p, _)| *p == e.path) {
            outln!(
                "{} left as is: held by running pid {} (--force restores it anyway)",
                e.knob,
                live.join(", ")
            )?;
        }
    }
    if !rec.failed.is_empty() {
        let msgs: Vec<String> = rec
            .failed
            .iter()
            .map(|(p, e)| format!("{}: {e}", journal::label(p)))
            .collect();
        return Err(Error::Io(format!(
            "could not restore {} (still recorded in {}; retry later)",
            msgs.join("; "),
            j.path().display()
        )));
    }
    if rec.restored.is_empty() {
        outln!("nothing to restore ({})", j.path().display())?;
    }
    Ok(0)
}
