//! [`Engine`]: pagefold's own dedup backend. One scanner thread does all
//! scanning and merging under the core mutex; one handler thread answers
//! userfaultfd write-protect faults and never touches the core. Control
//! (mode, knobs, round policy) lives in a separate small mutex so API calls
//! never wait for a scan.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::assist::AssistConfig;
use crate::backend::{self, DedupBackend, RegionId, RegionSpec, Stats};
use crate::fault::{self, FaultCounters, ProtState, StopFd};
use crate::hash::HashFn;
use crate::policy::{RoundPlan, RoundPolicy};
use crate::pool::Pool;
use crate::region::RegionError;
use crate::scanner::BatchReport;
use crate::scanner::{Core, Hint, ScanError, DEFAULT_QUIESCE_MIN_OPS, DEFAULT_STRIPE};
use crate::settings::{CheckedSettings, Knobs, Mode, DEFAULT_MAX_GUEST_PAUSE_US};
use crate::stats::Clocks;
use crate::thread_init::{DedupThread, ThreadInit};
use crate::uffd::Uffd;

mod wakeup;

use wakeup::scanner_loop;

/// Errors creating or driving the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Registering with or driving userfaultfd failed.
    #[error(transparent)]
    Uffd(#[from] crate::uffd::UffdError),
    /// The pool of merged pages failed.
    #[error(transparent)]
    Pool(#[from] crate::pool::PoolError),
    /// Registering or scanning a region failed.
    #[error(transparent)]
    Scan(#[from] ScanError),
    /// The fault handler failed.
    #[error(transparent)]
    Fault(#[from] crate::fault::FaultError),
    /// A backend-level error (settings, regions).
    #[error(transparent)]
    Config(#[from] backend::Error),
    /// A knob out of range.
    #[error(transparent)]
    Knobs(#[from] crate::settings::SettingsError),
    /// The scanner or fault thread could not be started.
    #[error("spawning an engine thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl From<ScanError> for backend::Error {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Overlap { addr, len } => backend::Error::Overlap { addr, len },
            ScanError::Region(RegionError::Bad { addr, len }) => {
                backend::Error::BadRegion { addr, len }
            }
            ScanError::Unknown(id) => backend::Error::UnknownRegion(id),
            ScanError::NotRegistered { addr, len } => backend::Error::BadRegion { addr, len },
            ScanError::SecurityMismatch { group, has, asked } => {
                backend::Error::SecurityMismatch { group, has, asked }
            }
            other => backend::Error::Os {
                context: "pagefold".into(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

impl From<EngineError> for backend::Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Config(e) => e,
            EngineError::Knobs(e) => e.into(),
            EngineError::Scan(e) => e.into(),
            other => backend::Error::Os {
                context: "pagefold engine".into(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

/// Default knobs (docs/engine.md): 4096 pages every 20 ms, 41 times KSM's
/// default rate of 100 pages every 20 ms, so that a VM of a few hundred MiB
/// is hashed within a second and merged in its second pass, while each
/// wake-up stays a few milliseconds of work. Idle passes then back the
/// sleep off.
pub const DEFAULT_KNOBS: Knobs = Knobs {
    pages_to_scan: 4096,
    sleep_millisecs: 20,
    max_page_sharing: 256,
};

/// Default [`EngineConfig::boost_max`]: the auto-mode proposal's default
/// `max_scanning_factor`.
pub const DEFAULT_BOOST_MAX: u64 = 16;

/// Engine construction parameters.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The knobs the engine starts with.
    pub knobs: Knobs,
    /// The mode the engine starts in.
    pub mode: Mode,
    /// Longest stripe of identical pool pages for a same-content run.
    pub stripe_pages: u32,
    /// Largest pool (bytes of merged content it can hold).
    pub pool_max_bytes: u64,
    /// Back the sleep off (doubling, up to `max_backoff_millis`) after full
    /// scans that found nothing to do; any merge resets it. Mode `on` only.
    pub adaptive: bool,
    /// The longest sleep the back-off reaches, ms.
    pub max_backoff_millis: u64,
    /// Mode `on`'s pace while merging pays off: a wake-up whose merges and
    /// first-time hashes (a VM that just started) were at least 1/8 of its
    /// pages doubles the next wake-up's pages, up to this factor of
    /// `pages_to_scan`; a wake-up that did neither halves it again. This is
    /// auto mode's scan-rate rule (x2 while merging pays off, /2 when it
    /// finds nothing) applied to mode `on`, so a new VM is merged in a few
    /// wake-ups instead of two full passes at the base rate, while a
    /// settled engine scans at `pages_to_scan` (and backs off). 1 = a fixed
    /// rate, as kernel KSM.
    pub boost_max: u64,
    /// Test hook: replace xxh3 (e.g. with a weak hash to force collisions).
    #[cfg(any(test, feature = "testing"))]
    pub hash_override: Option<HashFn>,
    /// Kernel KSM for groups whose duplicates sit at scattered addresses
    /// (off by default in the library; the VMM turns it on).
    pub assist: AssistConfig,
    /// Use I/O hints (`DedupBackend::hint`); off, they are counted and
    /// ignored (the benchmark's no-hints baseline).
    pub io_hints: bool,
    /// Use write logs (`DedupBackend::set_write_log`): the VMM then turns
    /// KVM's dirty log on for the guests' RAM.
    pub write_log: bool,
    /// Run by each engine thread before anything else.
    pub thread_init: Option<ThreadInit>,
    /// Smallest batch of page-table changes (merges, unmerges, take-backs
    /// from KSM) that parks the threads running guest code around it
    /// (`crate::quiesce`), so that its TLB flushes stay on the engine's
    /// CPU; 0 never parks them. Default [`DEFAULT_QUIESCE_MIN_OPS`].
    pub quiesce_min_ops: usize,
    /// Settle the scan while the guests undo its merges (docs/engine.md,
    /// "Settling"); off, it keeps its full pace whatever they do (the
    /// torture tests, which race writers against as many merges as they
    /// can). The start value: `DedupSettings::settle` changes it while
    /// the engine runs.
    pub settle: bool,
}

impl EngineConfig {
    /// The engine as the VMM runs it by default: the library default plus
    /// the KSM assist in `auto` (the library leaves it off, so that code
    /// embedding the engine never drives the host's KSM unasked).
    pub fn vmm_default() -> Self {
        EngineConfig {
            assist: AssistConfig {
                mode: crate::assist::AssistMode::Auto,
                ..AssistConfig::default()
            },
            ..EngineConfig::default()
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            knobs: DEFAULT_KNOBS,
            mode: Mode::Off,
            stripe_pages: DEFAULT_STRIPE,
            pool_max_bytes: 1 << 40,
            adaptive: true,
            max_backoff_millis: 1000,
            boost_max: DEFAULT_BOOST_MAX,
            #[cfg(any(test, feature = "testing"))]
            hash_override: None,
            assist: AssistConfig::default(),
            io_hints: true,
            write_log: true,
            thread_init: None,
            quiesce_min_ops: DEFAULT_QUIESCE_MIN_OPS,
            settle: true,
        }
    }
}

struct Ctl {
    mode: Mode,
    knobs: Knobs,
    /// `DedupSettings::max_guest_pause_us` in force.
    max_guest_pause_us: u64,
    /// `DedupSettings::settle` in force (from `EngineConfig::settle` until
    /// a setting changes it): the scanner hands it to the core at each
    /// wake-up, as the knobs, so that `apply` never waits for a scan.
    settle: bool,
    policy: Option<Box<dyn RoundPolicy>>,
    stop: bool,
    generation: u64,
    full_scans: u64,
    last_round_merges: u64,
    /// Set by anything that can make work appear (a new region, a mode or
    /// knob change, a new round policy): the scanner then drops its idle
    /// back-off before its next wake-up: back-off earned while nothing
    /// changed (many idle passes) would otherwise keep a freshly registered
    /// VM waiting the back-off's cap per wake-up.
    reset_backoff: bool,
    /// When the scanner last started a wake-up, and the sleep it planned
    /// after it (the watchdog's reference).
    last_wakeup: Option<Instant>,
    planned_sleep: Duration,
}

/// Most hinted ranges queued between two wake-ups; older ones are dropped
/// (the regular scan still finds their pages).
const HINT_QUEUE_CAP: usize = 8192;

/// How many of the latest device-written ranges a new one may join.
const RECENT_WRITES: usize = 8;

/// Hinted pages visited per wake-up at least (or `pages_to_scan` if more):
/// the device already paid for reading them, and the point is to merge them
/// within a wake-up or two.
const HINT_PAGES_PER_WAKEUP: u64 = 4096;

#[derive(Default)]
struct Hints {
    queue: Vec<Hint>,
    /// The ranges devices wrote that are only to be marked written in
    /// the regions' write logs (KVM does not log device writes), not
    /// visited first: hints while hints are off, and what
    /// [`DedupBackend::device_wrote`] reports.
    written: Vec<Hint>,
    received: u64,
    dropped: u64,
    /// A device-written range was neither queued nor kept for the write
    /// log since the last wake-up: every logged page needs a full look.
    lost: bool,
}

impl Hints {
    /// Keeps `addr..+len` for the write logs, or, with the list full,
    /// notes that a range was lost.
    fn keep_written(&mut self, addr: usize, len: usize) {
        if self.written.len() < HINT_QUEUE_CAP {
            self.written.push(Hint {
                addr,
                len,
                at: Instant::now(),
            });
        } else {
            self.lost = true;
        }
    }
}

struct Shared {
    core: Mutex<Core>,
    /// Callers other than the scanner waiting for `core` (the core's
    /// [`Core::waiters`]): see [`Shared::lock_core_yielding`].
    core_waiters: Arc<AtomicUsize>,
    hints: Mutex<Hints>,
    ctl: Mutex<Ctl>,
    cv: Condvar,
    snapshot: Mutex<Stats>,
    clocks: Mutex<Clocks>,
    stop: Arc<StopFd>,
    faults: Arc<FaultCounters>,
    adaptive: bool,
    max_backoff: u64,
    boost_max: u64,
    io_hints: bool,
    write_log: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn publish(&self, core: &Core) {
        let s = core.stats();
        let scans = s.full_scans;
        *lock(&self.snapshot) = s;
        let mut c = lock(&self.ctl);
        c.full_scans = scans;
        self.cv.notify_all();
    }

    /// The core for a caller other than the scanner (registering or
    /// unregistering a VM's memory, attaching its write log or vCPU hold):
    /// the scanner's batch ends at its next span boundary instead of holding
    /// the core for the whole batch, and the scanner lets such callers in
    /// before its next batch (`wakeup::let_waiters_in`).
    fn lock_core_yielding(&self) -> MutexGuard<'_, Core> {
        self.core_waiters.fetch_add(1, Ordering::AcqRel);
        let core = lock(&self.core);
        self.core_waiters.fetch_sub(1, Ordering::AcqRel);
        core
    }

    /// Wakes the scanner now and drops its idle back-off.
    fn kick(&self) {
        let mut c = lock(&self.ctl);
        c.generation += 1;
        c.reset_backoff = true;
        self.cv.notify_all();
    }
}

/// Releases the core; then, if the KSM assist ended under it, puts KSM's
/// knobs back ([`crate::assist::Retired`]): out of the core, so VM creation
/// and deletion do not wait for ksmd's batch.
fn unlock_core(mut core: MutexGuard<'_, Core>) {
    let retired = core.assist_mut().take_retired();
    drop(core);
    if let Some(r) = retired {
        r.restore();
    }
}

/// pagefold's userspace dedup engine.
pub struct Engine {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Engine {
    /// Creates the engine and starts its threads.
    pub fn new(cfg: EngineConfig) -> Result<Engine, EngineError> {
        cfg.knobs.validate()?;
        let uffd = Arc::new(Uffd::new()?);
        let prot = Arc::new(Mutex::new(ProtState::default()));
        let pool = Pool::new(cfg.pool_max_bytes)?;
        // xxh3 with 64-bit checks, unless a test plugs in its own hash.
        #[cfg(any(test, feature = "testing"))]
        let (hash_fn, strong_hash) = (
            cfg.hash_override.unwrap_or(crate::hash::xxh3),
            cfg.hash_override.is_none(),
        );
        #[cfg(not(any(test, feature = "testing")))]
        let (hash_fn, strong_hash): (HashFn, bool) = (crate::hash::xxh3, true);
        let mut core = Core::new(
            pool,
            uffd.clone(),
            prot.clone(),
            cfg.knobs,
            hash_fn,
            strong_hash,
            cfg.stripe_pages,
        )?;
        core.set_assist(cfg.assist);
        core.set_quiesce_min_ops(cfg.quiesce_min_ops);
        core.set_settle(cfg.settle);
        let core_waiters = core.waiters();
        let shared = Arc::new(Shared {
            snapshot: Mutex::new(core.stats()),
            core: Mutex::new(core),
            core_waiters,
            hints: Mutex::new(Hints::default()),
            ctl: Mutex::new(Ctl {
                mode: if cfg.mode == Mode::Unmerge {
                    Mode::Off
                } else {
                    cfg.mode
                },
                knobs: cfg.knobs,
                max_guest_pause_us: DEFAULT_MAX_GUEST_PAUSE_US,
                settle: cfg.settle,
                policy: None,
                stop: false,
                generation: 0,
                full_scans: 0,
                last_round_merges: 0,
                reset_backoff: false,
                last_wakeup: None,
                planned_sleep: Duration::ZERO,
            }),
            cv: Condvar::new(),
            clocks: Mutex::new(Clocks::default()),
            stop: Arc::new(StopFd::new()?),
            faults: Arc::new(FaultCounters::default()),
            adaptive: cfg.adaptive,
            max_backoff: cfg.max_backoff_millis,
            boost_max: cfg.boost_max.max(1),
            io_hints: cfg.io_hints,
            write_log: cfg.write_log,
        });
        let mut threads = Vec::new();
        {
            let sh = shared.clone();
            let init = cfg.thread_init.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("pagefold-uffd".into())
                    .spawn(move || {
                        ThreadInit::run(init.as_ref(), DedupThread::FaultHandler);
                        lock(&sh.clocks).enter();
                        fault::run(uffd, prot, sh.stop.clone(), sh.faults.clone());
                        lock(&sh.clocks).leave();
                    })
                    .map_err(EngineError::Thread)?,
            );
        }
        {
            let sh = shared.clone();
            let init = cfg.thread_init.clone();
            let t = std::thread::Builder::new()
                .name("pagefold-scan".into())
                .spawn(move || {
                    // Before the hook, which may install a seccomp filter.
                    crate::thread_init::renice_self(crate::thread_init::SCANNER_NICE);
                    ThreadInit::run(init.as_ref(), DedupThread::Scanner);
                    scanner_loop(&sh)
                });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    shared.stop.signal();
                    return Err(EngineError::Thread(e));
                }
            }
        }
        Ok(Engine {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Installs the auto-mode round policy (used while the mode is `auto`).
    pub fn set_round_policy(&self, policy: Box<dyn RoundPolicy>) {
        lock(&self.shared.ctl).policy = Some(policy);
        self.shared.kick();
    }

    /// Removes the round policy (auto mode then scans like `on`).
    pub fn clear_round_policy(&self) {
        lock(&self.shared.ctl).policy = None;
    }

    /// Waits until `n` more full scans have completed; false on timeout.
    pub fn wait_full_scans(&self, n: u64, timeout: Duration) -> bool {
        let target = lock(&self.shared.ctl).full_scans + n;
        self.wait_ctl(timeout, |c| c.full_scans >= target)
    }

    /// Waits until the mode is `mode` (e.g. `off` after `unmerge`).
    pub fn wait_mode(&self, mode: Mode, timeout: Duration) -> bool {
        self.wait_ctl(timeout, |c| c.mode == mode)
    }

    /// Waits on the control block's condition variable until `done` holds
    /// of it; false on timeout.
    fn wait_ctl(&self, timeout: Duration, done: impl Fn(&Ctl) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = lock(&self.shared.ctl);
        while !done(&c) {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            c = self
                .shared
                .cv
                .wait_timeout(c, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Runs `passes` full scans with merging on the calling thread, whatever
    /// the mode (tests and benchmarks).
    #[cfg(any(test, feature = "testing"))]
    pub fn scan_now(&self, passes: u64) {
        let mut core = lock(&self.shared.core);
        {
            let c = lock(&self.shared.ctl);
            core.set_knobs(c.knobs);
            core.set_settle(c.settle);
        }
        core.run_passes(passes);
        self.shared.publish(&core);
    }

    /// Verifies pool reference counts against page states and pagemap.
    #[cfg(any(test, feature = "testing"))]
    pub fn check_consistency(&self) -> Result<(), String> {
        lock(&self.shared.core).check_consistency()
    }

    /// Engine metadata bytes per tracked page (scaling part: per-page
    /// state, indices, pool metadata; fixed buffers excluded).
    #[cfg(any(test, feature = "testing"))]
    pub fn metadata_per_page(&self) -> f64 {
        lock(&self.shared.core).metadata_per_page()
    }

    /// Write faults that hit a page under merge, stray WP faults, and
    /// write faults on a merge window's gap pages (released at once).
    #[cfg(any(test, feature = "testing"))]
    pub fn fault_counts(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.shared.faults.in_merge.load(Relaxed),
            self.shared.faults.stray.load(Relaxed),
            self.shared.faults.in_gap.load(Relaxed),
        )
    }

    /// Merges abandoned at the final compare, for lack of VMAs, or left
    /// unexecuted for a thread waiting for the core.
    #[cfg(any(test, feature = "testing"))]
    pub fn abandoned(&self) -> u64 {
        lock(&self.shared.core).counters().abandoned
    }

    /// Of [`Engine::abandoned`]: planned merges left unexecuted because a
    /// thread (VM creation or deletion) waited for the core.
    #[cfg(any(test, feature = "testing"))]
    pub fn left_for_waiters(&self) -> u64 {
        lock(&self.shared.core).counters().left_for_waiters
    }

    /// Pages hashed so far.
    #[cfg(any(test, feature = "testing"))]
    pub fn pages_hashed(&self) -> u64 {
        lock(&self.shared.core).counters().pages_hashed
    }

    /// # Safety
    /// As [`Core::unregister`]: without `unmerge`, the caller unmaps the
    /// region right after this returns and never reads or writes it again.
    unsafe fn do_unregister(&self, id: RegionId, unmerge: bool) -> backend::Result<()> {
        let t0 = Instant::now();
        let mut core = self.shared.lock_core_yielding();
        let t1 = Instant::now();
        // SAFETY: forwarded from this function's contract.
        unsafe { core.unregister(id, unmerge) }?;
        self.shared.publish(&core);
        unlock_core(core);
        if t0.elapsed() >= SLOW_HOLD {
            log::info!(
                "unregistering region {} took {:?} (waiting for the core {:?}, the work {:?})",
                id.0,
                t0.elapsed(),
                t1 - t0,
                t1.elapsed()
            );
        }
        Ok(())
    }
}

/// A wake-up is overdue when the scanner has not started one for its
/// planned sleep plus this much: a wake-up's work ends at its next step
/// boundary after `WAKEUP_TIME` (1 s), and a step (a span of 4,096 pages,
/// 512 merges once the time is up, an unmerge chunk) takes milliseconds on
/// a hardware host and at most a few seconds on a loaded emulated CPU, so
/// the API's health check reports it as stalled.
pub const WAKEUP_GRACE: Duration = Duration::from_secs(10);

fn overdue_after(planned_sleep: Duration) -> Duration {
    planned_sleep + WAKEUP_GRACE
}

/// A hold of the core this long by the scanner is logged: VM creation and
/// deletion wait for it.
const SLOW_HOLD: Duration = Duration::from_millis(200);

impl DedupBackend for Engine {
    fn name(&self) -> &'static str {
        "pagefold"
    }

    unsafe fn register(&self, spec: RegionSpec) -> backend::Result<RegionId> {
        let mut core = self.shared.lock_core_yielding();
        // SAFETY: forwarded from this function's contract: the range is a
        // private anonymous mapping that stays mapped until the region's
        // unregister (or unregister_unmapping) has returned.
        let id = unsafe {
            core.register_in(
                spec.host_addr,
                spec.len,
                spec.owner,
                spec.group,
                spec.security,
            )
        }?;
        self.shared.publish(&core);
        drop(core);
        self.shared.kick();
        Ok(id)
    }

    fn unregister(&self, id: RegionId) -> backend::Result<()> {
        // SAFETY: with unmerge the region keeps its content.
        unsafe { self.do_unregister(id, true) }
    }

    unsafe fn unregister_unmapping(&self, id: RegionId) -> backend::Result<()> {
        // SAFETY: this function's caller unmaps the region right after and
        // never touches it again (its contract).
        unsafe { self.do_unregister(id, false) }
    }

    unsafe fn discard(&self, host_addr: usize, len: usize) -> backend::Result<u64> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.discard_ranges(&[(host_addr, len)]) }
    }

    /// Takes the core once for all the ranges (as a VM's creation does:
    /// the scan stops at its next span boundary), and publishes the
    /// figures once.
    unsafe fn discard_ranges(&self, ranges: &[(usize, usize)]) -> backend::Result<u64> {
        let mut core = self.shared.lock_core_yielding();
        let mut done = 0;
        let mut failed = None;
        for &(a, l) in ranges {
            // SAFETY: forwarded from this function's contract: the range's
            // owner no longer needs its content.
            match unsafe { core.discard(a, l) } {
                Ok(n) => done += n,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        self.shared.publish(&core);
        unlock_core(core);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(done),
        }
    }

    fn hint(&self, host_addr: usize, len: usize) {
        {
            let mut h = lock(&self.shared.hints);
            h.received += 1;
            if !self.shared.io_hints {
                // Ignored as a hint; still a device write the write log
                // must know of.
                h.dropped += 1;
                if self.shared.write_log {
                    h.keep_written(host_addr, len);
                } else {
                    h.lost = true;
                }
                return;
            }
            if h.queue.len() >= HINT_QUEUE_CAP {
                h.dropped += 1;
                h.lost = true;
                return;
            }
            // Coalesce with the previous range (a multi-segment read).
            if let Some(last) = h.queue.last_mut() {
                if last.addr + last.len == host_addr {
                    last.len += len;
                    return;
                }
            }
            h.queue.push(Hint {
                addr: host_addr,
                len,
                at: Instant::now(),
            });
        }
        let mut c = lock(&self.shared.ctl);
        c.generation += 1;
        self.shared.cv.notify_all();
    }

    fn device_wrote(&self, host_addr: usize, len: usize) {
        if !self.shared.write_log {
            // Without write logs every visit reads pagemap and hashes.
            return;
        }
        let mut h = lock(&self.shared.hints);
        // Receive buffers come back again and again, and a frame fills
        // neighbouring ones: a range next to or inside a recent one
        // joins it, so a busy NIC fills the queue slowly.
        let end = host_addr + len;
        for r in h.written.iter_mut().rev().take(RECENT_WRITES) {
            if r.addr + r.len == host_addr {
                r.len += len;
                return;
            }
            if r.addr <= host_addr && end <= r.addr + r.len {
                return;
            }
        }
        h.keep_written(host_addr, len);
    }

    fn wants_write_log(&self) -> bool {
        self.shared.write_log
    }

    fn set_write_log(&self, id: RegionId, log: Option<Arc<dyn crate::writelog::WriteLog>>) {
        if !self.shared.write_log && log.is_some() {
            return;
        }
        self.shared.lock_core_yielding().set_write_log(id, log);
    }

    fn detach_guest(&self, ids: &[RegionId]) {
        let mut core = self.shared.lock_core_yielding();
        for &id in ids {
            core.set_quiescer(id, None);
            core.set_write_log(id, None);
        }
    }

    fn set_quiesce(&self, id: RegionId, q: Option<Arc<dyn crate::quiesce::Quiesce>>) {
        self.shared.lock_core_yielding().set_quiescer(id, q);
    }

    fn apply(&self, settings: &CheckedSettings) -> backend::Result<Knobs> {
        let mut c = lock(&self.shared.ctl);
        c.knobs = settings.knobs_over(c.knobs);
        if let Some(us) = settings.max_guest_pause_us {
            c.max_guest_pause_us = us;
        }
        if let Some(on) = settings.settle {
            c.settle = on;
        }
        if let Some(mode) = settings.mode {
            c.mode = mode;
        }
        c.generation += 1;
        c.reset_backoff = true;
        self.shared.cv.notify_all();
        Ok(c.knobs)
    }

    fn mode(&self) -> Mode {
        lock(&self.shared.ctl).mode
    }

    fn knobs(&self) -> Knobs {
        lock(&self.shared.ctl).knobs
    }

    fn stats(&self) -> Stats {
        let mut s = lock(&self.shared.snapshot).clone();
        {
            let c = lock(&self.shared.ctl);
            s.mode = c.mode;
            s.knobs = Some(c.knobs);
            s.max_guest_pause_us = Some(c.max_guest_pause_us);
            s.settle = Some(c.settle);
            if let Some(t) = c.last_wakeup {
                let age = t.elapsed();
                s.last_wakeup_age_ms = age.as_millis() as u64;
                s.wakeup_overdue = c.mode != Mode::Off && age > overdue_after(c.planned_sleep);
            }
        }
        {
            let h = lock(&self.shared.hints);
            s.hints = h.received;
            s.hints_dropped = h.dropped;
        }
        // ksmd's CPU while it assisted is the engine's work too.
        s.cpu_seconds = lock(&self.shared.clocks).seconds() + s.ksm_cpu_seconds;
        s
    }

    fn shutdown(&self) {
        {
            let mut c = lock(&self.shared.ctl);
            c.stop = true;
            self.shared.cv.notify_all();
        }
        self.shared.stop.signal();
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        // KSM's knobs back as they were (merged pages stay merged).
        let mut core = lock(&self.shared.core);
        core.assist_mut().disengage();
        unlock_core(core);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
