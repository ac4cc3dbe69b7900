//! What the KSM backend and its auto-mode thread share ([`Inner`]): the
//! sysfs knobs, the backend's state and the auto-mode controller. Its own
//! module so that the backend and the driver both import it and neither
//! imports the other's internals (the driver knows nothing of the backend).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::error::KsmError;
use super::procstat;
use super::sysfs::KsmSysfs;
use crate::auto::AutoController;
use crate::backend::{Knobs, Mode, RegionId, RegionSpec};

/// The backend's bookkeeping, behind [`Inner`]'s mutex.
pub(super) struct State {
    pub regions: BTreeMap<RegionId, RegionSpec>,
    pub next_id: u64,
    pub mode: Mode,
    pub knobs: Knobs,
    pub shut_down: bool,
    /// Pages given back (`DedupBackend::discard`) per region, and in all
    /// since the start (regions gone included).
    pub reported: BTreeMap<RegionId, u64>,
    pub reported_total: u64,
}

/// What the auto-mode thread shares with the backend.
pub(super) struct Inner {
    pub sysfs: KsmSysfs,
    state: Mutex<State>,
    auto: Mutex<AutoController>,
    ksmd: Option<u32>,
    ksmd_cpu_at_start: f64,
    /// `cow_ksm` when the backend started.
    cow_ksm_at_start: Option<u64>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves consistent data even when it panics.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Mode off, no regions, `knobs` as read from the host: nothing is
    /// written to sysfs until the caller changes a mode or a knob.
    pub fn new(
        sysfs: KsmSysfs,
        knobs: Knobs,
        auto: AutoController,
        ksmd: Option<u32>,
        ksmd_cpu_at_start: f64,
    ) -> Self {
        Self {
            sysfs,
            state: Mutex::new(State {
                regions: BTreeMap::new(),
                next_id: 1,
                mode: Mode::Off,
                knobs,
                shut_down: false,
                reported: BTreeMap::new(),
                reported_total: 0,
            }),
            auto: Mutex::new(auto),
            ksmd,
            ksmd_cpu_at_start,
            cow_ksm_at_start: procstat::cow_ksm(),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn knobs(&self) -> Knobs {
        self.state().knobs
    }

    pub fn auto(&self) -> MutexGuard<'_, AutoController> {
        lock(&self.auto)
    }

    /// Writes `pages_to_scan`, explaining the EINVAL the kernel returns while
    /// its own scan-time advisor is in charge of that knob.
    pub fn write_pages_to_scan(&self, pages: u64) -> std::result::Result<(), KsmError> {
        match self.sysfs.write("pages_to_scan", pages) {
            Err(KsmError::Sysfs { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                let advisor = self.sysfs.read("advisor_mode").unwrap_or_default();
                Err(KsmError::AdvisorActive(advisor))
            }
            other => other,
        }
    }

    pub fn ksmd_cpu(&self) -> f64 {
        self.ksmd
            .and_then(|pid| procstat::cpu_seconds(pid).ok())
            .map(|c| (c - self.ksmd_cpu_at_start).max(0.0))
            .unwrap_or(0.0)
    }

    /// Copy-on-write breaks of KSM pages since the backend started, host
    /// wide (the kernel counts no finer): other KSM users' count too. 0
    /// on kernels without the counter.
    pub fn cow_breaks(&self) -> u64 {
        match (self.cow_ksm_at_start, procstat::cow_ksm()) {
            (Some(start), Some(now)) => now.saturating_sub(start),
            _ => 0,
        }
    }

    /// Writes `max_page_sharing` if it differs from the kernel's value,
    /// refusing with a clear error while KSM pages exist.
    pub fn write_max_page_sharing(&self, requested: u64) -> std::result::Result<(), KsmError> {
        let current = self.sysfs.read_u64("max_page_sharing")?;
        if current == requested {
            return Ok(());
        }
        let busy = |pages_shared| KsmError::MaxPageSharingBusy {
            pages_shared,
            current,
            requested,
        };
        let pages_shared = self.sysfs.read_u64("pages_shared")?;
        if pages_shared > 0 {
            return Err(busy(pages_shared));
        }
        match self.sysfs.write("max_page_sharing", requested) {
            Err(KsmError::Sysfs { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                Err(busy(self.sysfs.read_u64("pages_shared").unwrap_or(0)))
            }
            other => other,
        }
    }
}
