//! [`KsmBackend`]: the in-kernel KSM behind the [`DedupBackend`] interface,
//! so the VMM and the benchmarks drive it exactly like pagefold's engine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::driver::Driver;
use super::error::KsmError;
use super::journal::{self, Journal};
use super::procstat::{self, ProcessKsmStat};
use super::shared::{lock, Inner, State};
use super::sysfs::{KsmSysfs, KSM_SYSFS};
use crate::auto::{
    max_scanning_factor_limit, page_size, AutoConfig, AutoController, AutoHandle, MemorySource,
    ProcMemSource,
};
use crate::backend::{DedupBackend, Error, OwnerStats, RegionId, RegionSpec, Result, Stats};
use crate::settings::{CheckedSettings, Knobs, Mode};
use crate::thread_init::ThreadInit;

/// How to build a [`KsmBackend`].
pub struct KsmOptions {
    /// Where KSM's sysfs files are (default `/sys/kernel/mm/ksm`).
    pub sysfs_root: PathBuf,
    /// Auto-mode settings.
    pub auto: AutoConfig,
    /// Memory source for auto mode; `None` reads `/proc/meminfo`.
    pub memory_source: Option<Box<dyn MemorySource>>,
    /// Where knob originals are recorded (and recovered from at start);
    /// `None`: the default journal under the runtime directory.
    pub journal: Option<Journal>,
    /// Run first by the auto-mode driver thread, each time it starts.
    pub thread_init: Option<ThreadInit>,
}

impl Default for KsmOptions {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(KSM_SYSFS),
            auto: AutoConfig::default(),
            memory_source: None,
            journal: None,
            thread_init: None,
        }
    }
}

/// Kernel KSM as a dedup backend (name `"ksm"`).
///
/// KSM's `run` and knobs are host-wide: this backend changes them for every
/// KSM user on the host while it runs, and puts back every knob it wrote on
/// [`DedupBackend::shutdown`] or drop. Figures that exist per process
/// (`/proc/self/ksm_stat`) are reported per process; `pages_shared`,
/// `pages_sharing`, `pages_unshared`, `pages_volatile` and `full_scans` exist
/// only host-wide and include other processes' KSM use.
pub struct KsmBackend {
    inner: Arc<Inner>,
    auto_handle: AutoHandle,
    driver: Mutex<Option<Driver>>,
    thread_init: Option<ThreadInit>,
}

impl KsmBackend {
    /// KSM at `/sys/kernel/mm/ksm`, default auto mode on `/proc/meminfo`.
    pub fn new() -> std::result::Result<Self, KsmError> {
        Self::with_options(KsmOptions::default())
    }

    /// Before anything is read, knobs that a killed pagefold left changed
    /// are restored from the journal (said on stderr): otherwise this
    /// backend would take them for the host's settings.
    pub fn with_options(opts: KsmOptions) -> std::result::Result<Self, KsmError> {
        let journal = opts.journal.or_else(|| Journal::open_default().ok());
        if !opts.sysfs_root.join("run").exists() {
            return Err(KsmError::Absent {
                path: opts.sysfs_root,
            });
        }
        if let Some(j) = &journal {
            journal::report(j, j.recover(false));
        }
        let sysfs = KsmSysfs::with_journal(opts.sysfs_root, journal)?;
        let clamp = |v: u64, (lo, hi): (u64, u64)| v.clamp(lo, hi);
        // Start from the host's current settings: nothing is written until
        // the caller changes a mode or a knob.
        let knobs = Knobs {
            pages_to_scan: clamp(sysfs.read_u64("pages_to_scan")?, Knobs::PAGES_TO_SCAN),
            sleep_millisecs: clamp(sysfs.read_u64("sleep_millisecs")?, Knobs::SLEEP_MILLISECS),
            max_page_sharing: clamp(sysfs.read_u64("max_page_sharing")?, Knobs::MAX_PAGE_SHARING),
        };
        let source = opts
            .memory_source
            .unwrap_or_else(|| Box::new(ProcMemSource::new()));
        let mut auto_cfg = opts.auto;
        if auto_cfg == AutoConfig::default() {
            // A host whose pages_to_scan is so large that 16 x it exceeds RAM
            // must not make the KSM backend unusable when auto mode was never
            // configured: clamp the *default* factor. An explicit config is
            // validated as given.
            let limit = max_scanning_factor_limit(total_ram_bytes(), knobs.pages_to_scan);
            auto_cfg.max_scanning_factor = auto_cfg.max_scanning_factor.min(limit);
        }
        let auto = AutoController::new(auto_cfg, source, knobs.pages_to_scan)?;
        let auto_handle = auto.handle();
        let ksmd = procstat::find_by_comm(std::path::Path::new("/proc"), "ksmd");
        if ksmd.is_none() {
            log::warn!("KSM: no ksmd thread found; cpu_seconds will read 0");
        }
        let ksmd_cpu_at_start = ksmd
            .and_then(|p| procstat::cpu_seconds(p).ok())
            .unwrap_or(0.0);
        Ok(Self {
            inner: Arc::new(Inner::new(sysfs, knobs, auto, ksmd, ksmd_cpu_at_start)),
            auto_handle,
            driver: Mutex::new(None),
            thread_init: opts.thread_init,
        })
    }

    /// Reads auto-mode status (and changes its config) from any thread.
    pub fn auto_handle(&self) -> AutoHandle {
        self.auto_handle.clone()
    }

    /// This process's `/proc/self/ksm_stat` figures.
    pub fn process_stat(&self) -> Option<ProcessKsmStat> {
        procstat::self_ksm_stat()
    }

    /// KSM sysfs knobs this backend has written (restored on shutdown).
    pub fn touched_knobs(&self) -> Vec<String> {
        self.inner.sysfs.touched()
    }

    fn stop_driver(&self) {
        if let Some(d) = lock(&self.driver).take() {
            d.stop();
        }
    }

    fn apply_mode(&self, mode: Mode) -> std::result::Result<(), KsmError> {
        let inner = &self.inner;
        let knobs = inner.knobs();
        match mode {
            Mode::Off => inner.sysfs.write("run", 0)?,
            Mode::On => {
                inner.write_pages_to_scan(knobs.pages_to_scan)?;
                inner
                    .sysfs
                    .write("sleep_millisecs", knobs.sleep_millisecs)?;
                inner.sysfs.write("run", 1)?;
            }
            Mode::Unmerge => {
                // Returns once every KSM page is unmerged (host-wide: KSM has
                // no per-caller unmerge short of MADV_UNMERGEABLE).
                inner.sysfs.write("run", 2)?;
                inner.sysfs.write("run", 0)?;
            }
            Mode::Auto => {
                inner
                    .sysfs
                    .write("sleep_millisecs", knobs.sleep_millisecs)?;
                // Untriggered until the controller says otherwise.
                inner.sysfs.write("run", 0)?;
                *lock(&self.driver) =
                    Some(Driver::start(Arc::clone(inner), self.thread_init.clone())?);
            }
        }
        Ok(())
    }

    fn per_owner(&self, st: &State, proc: Option<ProcessKsmStat>) -> BTreeMap<String, OwnerStats> {
        let page = page_size();
        let mut out: BTreeMap<String, OwnerStats> = BTreeMap::new();
        for (id, spec) in &st.regions {
            let o = out.entry(spec.owner.clone()).or_default();
            o.group = spec.group.clone();
            o.pages_tracked += spec.len as u64 / page;
            o.pages_reported += st.reported.get(id).copied().unwrap_or(0);
        }
        // ksm_stat is per process: it can be attributed only when every
        // region belongs to one owner.
        if out.len() == 1 {
            if let (Some(o), Some(p)) = (out.values_mut().next(), proc) {
                o.pages_merged = p.merging_pages.unwrap_or(0);
                o.zero_pages = p.zero_pages.unwrap_or(0);
                o.bytes_saved = (o.pages_merged + o.zero_pages) * page;
            }
        }
        out
    }
}

impl DedupBackend for KsmBackend {
    fn name(&self) -> &'static str {
        "ksm"
    }

    unsafe fn register(&self, spec: RegionSpec) -> Result<RegionId> {
        let page = page_size() as usize;
        let bad = || Error::BadRegion {
            addr: spec.host_addr,
            len: spec.len,
        };
        if spec.len == 0 || spec.host_addr % page != 0 || spec.len % page != 0 {
            return Err(bad());
        }
        if spec.security == crate::backend::Security::Hardened {
            return Err(Error::Unsupported(format!(
                "dedup group {:?} is hardened, which kernel KSM cannot keep: use the pagefold backend",
                spec.group
            )));
        }
        let end = spec.host_addr.checked_add(spec.len).ok_or_else(bad)?;
        let mut st = self.inner.state();
        if st
            .regions
            .values()
            .any(|r| spec.host_addr < r.host_addr + r.len && r.host_addr < end)
        {
            return Err(Error::Overlap {
                addr: spec.host_addr,
                len: spec.len,
            });
        }
        madvise(
            spec.host_addr,
            spec.len,
            libc::MADV_MERGEABLE,
            "MADV_MERGEABLE",
        )?;
        let id = RegionId(st.next_id);
        st.next_id += 1;
        st.regions.insert(id, spec);
        Ok(id)
    }

    fn unregister(&self, id: RegionId) -> Result<()> {
        let mut st = self.inner.state();
        let spec = st.regions.get(&id).ok_or(Error::UnknownRegion(id.0))?;
        // Unmerges this region's pages (each gets a private copy) and takes
        // the range out of ksmd's scan: KSM no longer touches it afterwards.
        madvise(
            spec.host_addr,
            spec.len,
            libc::MADV_UNMERGEABLE,
            "MADV_UNMERGEABLE",
        )?;
        st.regions.remove(&id);
        st.reported.remove(&id);
        Ok(())
    }

    /// `MADV_DONTNEED`: the pages are freed, a KSM-merged one by dropping
    /// its mapping of the KSM page (no copy), and the range reads zeros.
    /// The range must lie inside one registered region. KSM does not say
    /// which pages stay absent, so `pages_returned` is not reported.
    unsafe fn discard(&self, host_addr: usize, len: usize) -> Result<u64> {
        let page = page_size() as usize;
        let bad = Error::BadRegion {
            addr: host_addr,
            len,
        };
        if len == 0 || host_addr % page != 0 || len % page != 0 {
            return Err(bad);
        }
        let end = host_addr.checked_add(len).ok_or(Error::BadRegion {
            addr: host_addr,
            len,
        })?;
        let mut st = self.inner.state();
        let Some(id) = st
            .regions
            .iter()
            .find(|(_, r)| r.host_addr <= host_addr && end <= r.host_addr + r.len)
            .map(|(&id, _)| id)
        else {
            return Err(bad);
        };
        // SAFETY: the range lies inside a registered region, a private
        // anonymous mapping of this process (the contract of `register`),
        // and the caller no longer needs its content (this function's
        // contract): it reads zeros from here on, which is what it asked.
        let r = unsafe { libc::madvise(host_addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if r != 0 {
            return Err(Error::Os {
                context: format!("MADV_DONTNEED {host_addr:#x}+{len:#x}"),
                source: std::io::Error::last_os_error(),
            });
        }
        let pages = (len / page) as u64;
        *st.reported.entry(id).or_default() += pages;
        st.reported_total += pages;
        Ok(pages)
    }

    /// The knobs given are written to sysfs first (`pages_to_scan` not in
    /// auto mode: the driver owns it there, as knob x factor), then the
    /// mode is applied.
    fn apply(&self, settings: &CheckedSettings) -> Result<Knobs> {
        let inner = &self.inner;
        let knobs = {
            let mut st = inner.state();
            if st.shut_down {
                return Err(KsmError::ShutDown.into());
            }
            let new = settings.knobs_over(st.knobs);
            if settings.max_page_sharing.is_some() {
                inner.write_max_page_sharing(new.max_page_sharing)?;
            }
            if settings.sleep_millisecs.is_some() {
                inner.sysfs.write("sleep_millisecs", new.sleep_millisecs)?;
            }
            if settings.pages_to_scan.is_some() && st.mode != Mode::Auto {
                inner.write_pages_to_scan(new.pages_to_scan)?;
            }
            st.knobs = new;
            new
        };
        if let Some(mode) = settings.mode {
            self.stop_driver();
            if inner.state().shut_down {
                return Err(KsmError::ShutDown.into());
            }
            self.apply_mode(mode)?;
            inner.state().mode = mode;
        }
        Ok(knobs)
    }

    fn mode(&self) -> Mode {
        self.inner.state().mode
    }

    fn knobs(&self) -> Knobs {
        self.inner.knobs()
    }

    /// Host-wide: pages_shared/sharing/unshared/volatile, full_scans.
    /// This process (`/proc/self/ksm_stat`): zero_pages, merges (pages of
    /// this process currently merged: KSM keeps no cumulative count),
    /// bytes_saved (merged + zero pages, the kernel's per-process profit
    /// accounting), metadata_bytes (rmap items), profit_bytes.
    /// cpu_seconds: ksmd's utime+stime since this backend started.
    /// cow_breaks and vmas_created: KSM counts neither; 0.
    /// The per-process counters lag after `unregister` (MADV_UNMERGEABLE)
    /// until ksmd's next pass removes the stale rmap items; `run` 2
    /// (`Mode::Unmerge`) clears them at once.
    fn stats(&self) -> Stats {
        let sys = &self.inner.sysfs;
        let g = |n: &str| sys.read_u64(n).unwrap_or(0);
        let proc = procstat::self_ksm_stat();
        let page = page_size();
        let st = self.inner.state();
        let merging = proc.and_then(|p| p.merging_pages).unwrap_or(0);
        let zero = proc
            .and_then(|p| p.zero_pages)
            .unwrap_or_else(|| g("ksm_zero_pages"));
        let saved = (merging + zero) * page;
        let profit = proc
            .and_then(|p| p.process_profit)
            .unwrap_or_else(|| sys.read_i64("general_profit").unwrap_or(0));
        let maps = crate::mm::vma_count().ok();
        let max_maps = Some(crate::mm::max_map_count());
        Stats {
            backend: "ksm".into(),
            mode: st.mode,
            knobs: Some(st.knobs),
            pages_shared: g("pages_shared"),
            pages_sharing: g("pages_sharing"),
            pages_unshared: g("pages_unshared"),
            pages_volatile: g("pages_volatile"),
            zero_pages: zero,
            full_scans: g("full_scans"),
            merges: merging,
            max_guest_pause_us: None,
            write_waits: None,
            write_wait_us: None,
            max_write_wait_us: None,
            cow_breaks: self.inner.cow_breaks(),
            pool_pages: g("pages_shared"),
            vmas_created: 0,
            map_count_headroom: match (maps, max_maps) {
                (Some(m), Some(x)) => x.saturating_sub(m),
                _ => 0,
            },
            map_count_limited: false,
            cpu_seconds: self.inner.ksmd_cpu(),
            bytes_saved: saved,
            metadata_bytes: (saved as i64 - profit).max(0) as u64,
            profit_bytes: profit,
            // ksmd's wake-ups are the kernel's; no watchdog here.
            last_wakeup_age_ms: 0,
            wakeup_overdue: false,
            ksm_assist: String::new(),
            ksm_pages_sharing: 0,
            ksm_cpu_seconds: 0.0,
            hints: 0,
            hints_dropped: 0,
            hint_merges: 0,
            hint_merge_delay_ms: 0.0,
            write_logged_regions: 0,
            clean_visits: 0,
            huge_pages_split: 0,
            origins: Default::default(),
            settle_ms: 0,
            settle: None,
            merge_cpu_seconds: 0.0,
            pages_reported: st.reported_total,
            pages_returned: None,
            per_owner: self.per_owner(&st, proc),
        }
    }

    fn shutdown(&self) {
        self.stop_driver();
        self.inner.state().shut_down = true;
        for e in self.inner.sysfs.restore() {
            log::error!("KSM backend shutdown: {e}");
        }
    }
}

impl Drop for KsmBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Physical RAM from sysconf (the default auto config's bound only).
fn total_ram_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    (pages.max(1) as u64).saturating_mul(page_size())
}

fn madvise(
    addr: usize,
    len: usize,
    advice: libc::c_int,
    name: &'static str,
) -> std::result::Result<(), KsmError> {
    // SAFETY: MADV_MERGEABLE/UNMERGEABLE change no page contents (unmerging
    // gives each page a private copy with the same bytes); the caller of
    // `register` guaranteed the range is a private anonymous mapping of this
    // process that stays mapped until `unregister` returns.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r != 0 {
        return Err(KsmError::Madvise {
            advice: name,
            addr,
            len,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
