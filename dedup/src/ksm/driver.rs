//! Auto mode for kernel KSM: ksmd cannot be asked to "checksum only", so a
//! thread of ours plays the role of the proposal's in-kernel logic. Once per
//! sleep interval (one "round") it feeds the controller the new merges of
//! this process and applies the plan: triggered -> `run` 1 with
//! `pages_to_scan` = knob x factor; untriggered -> `run` 0.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::KsmError;
use super::procstat::self_ksm_stat;
use super::shared::Inner;
use crate::policy::RoundPolicy;
use crate::thread_init::{DedupThread, ThreadInit};

/// Shortest round: ksmd's own wake-up period is about 20 ms at best
/// (HZ-rounded), so deciding faster than that would only read noise.
pub const MIN_ROUND: Duration = Duration::from_millis(20);

/// The running auto-mode thread.
pub(super) struct Driver {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Driver {
    /// Starts the thread; it runs `init` first (the VMM's seccomp filter).
    pub fn start(inner: Arc<Inner>, init: Option<ThreadInit>) -> Result<Self, KsmError> {
        let (stop, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ksm-auto".into())
            .spawn(move || {
                ThreadInit::run(init.as_ref(), DedupThread::KsmDriver);
                run(&inner, &rx)
            })
            .map_err(KsmError::Thread)?;
        Ok(Self { stop, thread })
    }

    /// Stops the thread and waits for it; it writes nothing after this.
    pub fn stop(self) {
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            log::error!("KSM auto-mode thread panicked");
        }
    }
}

/// Merged pages to diff between rounds: this process's `ksm_merging_pages`
/// when the kernel has it (other processes' merges do not count), else the
/// global `pages_sharing`.
fn merged_now(inner: &Inner) -> u64 {
    if let Some(m) = self_ksm_stat().and_then(|s| s.merging_pages) {
        return m;
    }
    inner.sysfs.read_u64("pages_sharing").unwrap_or(0)
}

fn run(inner: &Inner, stop: &mpsc::Receiver<()>) {
    let mut last_merged = merged_now(inner);
    let mut applied_run: Option<u64> = None;
    let mut applied_pages: Option<u64> = None;
    loop {
        let knobs = inner.knobs();
        let merged = merged_now(inner);
        // COW breaks can lower the count: that is not negative merging.
        let new_merges = merged.saturating_sub(last_merged);
        last_merged = merged;
        let plan = inner.auto().plan(new_merges, knobs.pages_to_scan);
        let result = if plan.merge {
            let pages = plan.pages_to_visit.min(u64::from(u32::MAX));
            let mut r = Ok(());
            if applied_pages != Some(pages) {
                r = inner.write_pages_to_scan(pages);
                if r.is_ok() {
                    applied_pages = Some(pages);
                }
            }
            if r.is_ok() && applied_run != Some(1) {
                r = inner.sysfs.write("run", 1);
                if r.is_ok() {
                    applied_run = Some(1);
                }
            }
            r
        } else if applied_run != Some(0) {
            let r = inner.sysfs.write("run", 0);
            if r.is_ok() {
                applied_run = Some(0);
            }
            r
        } else {
            Ok(())
        };
        if let Err(e) = result {
            log::warn!("KSM auto mode: {e}");
        }
        let round = Duration::from_millis(knobs.sleep_millisecs).max(MIN_ROUND);
        match stop.recv_timeout(round) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
