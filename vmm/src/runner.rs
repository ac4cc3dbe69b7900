//! The process: several VMs, one event loop (event-manager), one dedup
//! backend. It starts the VMs, prints what their guests report, stops every
//! VM on a signal, and exits once all VMs have stopped.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::Kvm;
use pagefold_dedup::DedupBackend;
use pagefold_devices::workload::WorkloadSummary;
use serde::Serialize;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{Config, VmConfig};
use crate::control::{self, Request, RequestError, Response};
use crate::pause::GuestPauses;
use crate::state::{Outcome, RunState};
use crate::vm::{self, Vm, VmInfo, VmResources};
use crate::{signals, workload, x86};

/// A request that holds the control thread this long is logged: every
/// other API call waits for it.
const SLOW_REQUEST: Duration = Duration::from_millis(500);

/// Errors of the process runner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open /dev/kvm: {0} (pagefold needs KVM: run as root or as a member of the kvm group, on a host with /dev/kvm)")]
    Kvm(kvm_ioctls::Error),
    #[error("KVM API version {0} is not supported (need 12)")]
    KvmVersion(i32),
    #[error(transparent)]
    Cpuid(#[from] x86::Error),
    #[error("event loop: {0}")]
    EventLoop(String),
    #[error("VM {name:?}: {source}")]
    Vm {
        name: String,
        #[source]
        source: vm::Error,
    },
}

static PROCESS_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Prints a line of progress to stdout. Unlike `println!`, a closed stdout
/// (`pagefold run | head -1`) does not panic the event loop: the VMs run on
/// and the output is dropped.
fn out(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Records when the process started (call first thing in `main`), so that
/// start-up latency is measured from there.
pub fn mark_process_start() {
    let _ = PROCESS_START.set(Instant::now());
}

/// Wakes the event loop whenever one of its eventfds fires; the loop then
/// looks at every VM's state (cheap: a handful of VMs).
struct Waker(Vec<RawFd>);

impl MutEventSubscriber for Waker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer from an
        // eventfd registered by this subscriber; errors (EAGAIN) are fine.
        unsafe {
            libc::read(events.fd(), buf.as_mut_ptr() as *mut libc::c_void, 8);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        for fd in &self.0 {
            if let Err(e) = ops.add(Events::new_raw(*fd, EventSet::IN)) {
                log::error!("event loop: cannot watch fd {fd}: {e}");
            }
        }
    }
}

/// One finished workload phase, for reports.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRow {
    pub phase: String,
    pub pages: u64,
    pub bytes: u64,
    pub zero_pages: u64,
    pub dup_pages: u64,
    pub mismatches: u64,
    pub churn_writes_total: u64,
    /// Checksum of the pages a disk-read phase read, or of a build's
    /// output (0 otherwise).
    pub checksum: u64,
    /// Build: pages written, heap pages reused, guest CPU-bound ms.
    pub pages_written: u64,
    pub pages_reused: u64,
    pub cpu_ms: f64,
    /// Host-measured duration.
    pub ms: f64,
    pub gbps: f64,
    /// LATENCY phases: the probe's pauses (absent for other phases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pauses: Option<crate::workload::pauses::PauseRow>,
    /// PROBE_MERGE phases: the write-timing probe's classification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::workload::merge_probe::ProbeRow>,
}

/// Final report of one VM.
#[derive(Debug, Clone, Serialize)]
pub struct VmReport {
    pub name: String,
    pub outcome: Outcome,
    pub exit_status: Option<u32>,
    pub mismatches: u64,
    pub phases: Vec<PhaseRow>,
    pub wall_s: f64,
    /// The windows in which the dedup engine held its vCPUs.
    pub guest_pauses: GuestPauses,
    /// Everything the guest reported.
    #[serde(skip)]
    pub summary: WorkloadSummary,
}

impl VmReport {
    /// The report of the VM that `info` describes as it ended.
    fn new(info: &VmInfo, outcome: Outcome, summary: WorkloadSummary) -> Self {
        let phases = summary
            .phases
            .iter()
            .map(|p| PhaseRow {
                phase: pagefold_guest_abi::phase::name(p.report.phase).to_string(),
                pages: p.report.pages,
                bytes: p.report.bytes,
                zero_pages: p.report.zero_pages,
                dup_pages: p.report.dup_pages,
                mismatches: p.report.mismatches,
                churn_writes_total: p.report.churn_writes_total,
                checksum: p.report.checksum,
                pages_written: p.report.pages_written,
                pages_reused: p.report.pages_reused,
                cpu_ms: p.report.cpu_us as f64 / 1e3,
                ms: p.elapsed.as_secs_f64() * 1e3,
                gbps: p.gbps(),
                pauses: crate::workload::pauses::pause_row(&summary, p),
                probe: crate::workload::merge_probe::probe_row(p),
            })
            .collect();
        VmReport {
            name: info.name.clone(),
            outcome,
            exit_status: summary.exit_status,
            mismatches: summary.mismatches(),
            phases,
            wall_s: info.uptime_s,
            guest_pauses: info.guest_pauses,
            summary,
        }
    }
}

/// Final report of the process.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub vms: Vec<VmReport>,
    pub signal: Option<&'static str>,
    pub dedup: Option<pagefold_dedup::Stats>,
    /// The dedup figures when the saving was largest while VMs ran (the
    /// final ones come after the VMs released their memory).
    pub dedup_peak: Option<pagefold_dedup::Stats>,
    /// Time from process start (see [`mark_process_start`]) to the first
    /// guest report.
    pub first_report_ms: Option<f64>,
}

impl RunReport {
    /// The process exit code: 0 all VMs succeeded; 1 a guest reported
    /// failure; 3 a VM failed (guest crash or VMM error); 128+N on signal N.
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.signal {
            return signals::exit_code(signals::number(sig));
        }
        let mut code = 0;
        for v in &self.vms {
            match &v.outcome {
                o if o.is_success() => {}
                Outcome::GuestExit { .. } => code = code.max(1),
                _ => code = 3,
            }
        }
        code
    }
}

/// Owns the VMs of one process.
pub struct Runner {
    res: VmResources,
    vms: Vec<Vm>,
    events: crossbeam_channel::Receiver<workload::Event>,
    summaries: BTreeMap<String, WorkloadSummary>,
    ended: BTreeMap<String, VmReport>,
    /// VMs that finished on their own (or were stopped), as the API shows
    /// them: listed with state `stopped` and their outcome until deleted.
    finished: BTreeMap<String, VmInfo>,
    /// The dedup engine was last seen overdue (the watchdog warns once per
    /// stall).
    engine_stalled: bool,
    started: Instant,
    first_report: Option<f64>,
    em: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>>,
    handle: control::Handle,
    inbox: control::Inbox,
    shutdown_requested: bool,
    dedup_peak: Option<pagefold_dedup::Stats>,
    last_sample: Instant,
    /// Event-loop subscribers of each live VM, removed when it ends.
    subscriber_ids: BTreeMap<String, Vec<event_manager::SubscriberId>>,
    /// Where the request being served spent its time, for the slow-request
    /// log line (one line per slow request, not one per part).
    request_parts: Option<String>,
    /// The process's backend (shared with the API's handles); `res.dedup`
    /// is the same backend, for the VMs.
    dedup: control::DedupSlot,
    /// The dedup configuration a backend started at run time gets
    /// ([`Runner::allow_late_dedup`]); none: the API cannot start one.
    late_dedup: Option<Config>,
    /// Print guest reports as they arrive.
    pub echo: bool,
    /// Keep running with no VM (daemon mode) until a shutdown request or a
    /// signal.
    pub keep_alive: bool,
}

impl Runner {
    /// Opens KVM and prepares the process-wide resources.
    pub fn new(dedup: Option<Arc<dyn DedupBackend>>, prefix_output: bool) -> Result<Runner, Error> {
        Self::with_dedup(
            dedup.map(|backend| crate::dedup::Dedup {
                backend,
                auto: None,
            }),
            prefix_output,
        )
    }

    /// As [`Runner::new`], with the backend's auto-mode handle (for status).
    pub fn with_dedup(
        dedup: Option<crate::dedup::Dedup>,
        prefix_output: bool,
    ) -> Result<Runner, Error> {
        let backend = dedup.as_ref().map(|d| d.backend.clone());
        let dedup = control::dedup_slot(dedup);
        let started = *PROCESS_START.get_or_init(Instant::now);
        let kvm = Kvm::new().map_err(Error::Kvm)?;
        let v = kvm.get_api_version();
        if v != 12 {
            return Err(Error::KvmVersion(v));
        }
        let cpuid = x86::cpuid::supported(&kvm)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let (handle, inbox) =
            control::channel(dedup.clone()).map_err(|e| Error::EventLoop(e.to_string()))?;
        let mut em: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
            EventManager::new().map_err(|e| Error::EventLoop(format!("{e:?}")))?;
        let report_wake = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::EventLoop(e.to_string()))?,
        );
        let waker: Arc<Mutex<dyn MutEventSubscriber + Send>> = Arc::new(Mutex::new(Waker(vec![
            inbox.wake.as_raw_fd(),
            report_wake.as_raw_fd(),
        ])));
        em.add_subscriber(waker);
        Ok(Runner {
            res: VmResources {
                kvm: Arc::new(kvm),
                cpuid,
                dedup: backend,
                events: tx,
                report_wake,
                prefix_output,
            },
            vms: Vec::new(),
            events: rx,
            summaries: BTreeMap::new(),
            ended: BTreeMap::new(),
            finished: BTreeMap::new(),
            engine_stalled: false,
            started,
            first_report: None,
            em,
            handle,
            inbox,
            shutdown_requested: false,
            dedup_peak: None,
            last_sample: started,
            subscriber_ids: BTreeMap::new(),
            request_parts: None,
            dedup,
            late_dedup: None,
            echo: true,
            keep_alive: false,
        })
    }

    /// Lets the API start a dedup backend at run time (`PATCH /dedup` in a
    /// process started without one), configured by `cfg`'s `[dedup]`
    /// (its VMs are ignored), with [`crate::dedup::create`] as at start-up.
    pub fn allow_late_dedup(&mut self, cfg: &Config) {
        self.late_dedup = Some(Config {
            dedup: cfg.dedup.clone(),
            vms: Vec::new(),
            stdin: None,
            seccomp: cfg.seccomp,
        });
    }

    /// Creates the dedup backend if the process has none, and registers
    /// every live VM that wants dedup with it (VMs created later register
    /// as they are created). The backend starts with its mode off and gets
    /// the configured settings once every VM is registered, so no merge
    /// runs before each VM can have its vCPUs parked. Any failure leaves
    /// the process as it was: no backend, no VM registered.
    fn start_dedup(&mut self) -> Result<Response, RequestError> {
        if self.dedup.get().is_some() {
            return Ok(Response::Done);
        }
        let Some(cfg) = &self.late_dedup else {
            return Err(RequestError::Conflict(
                "this process cannot start a dedup backend at run time".into(),
            ));
        };
        let settings = cfg.dedup.settings;
        let mut quiet = cfg.clone();
        quiet.dedup.settings =
            pagefold_dedup::CheckedSettings::from(pagefold_dedup::Mode::Off).or(settings);
        let refused =
            |e: String| RequestError::Conflict(format!("cannot start deduplication: {e}"));
        let d = crate::dedup::create(&quiet, true)
            .map_err(|e| refused(e.to_string()))?
            .ok_or_else(|| refused("no backend was created".into()))?;
        let mut failed = None;
        for vm in &mut self.vms {
            if let Err(e) = vm.attach_dedup(d.backend.clone()) {
                failed = Some(format!("VM {:?}: {e}", vm.name()));
                break;
            }
        }
        if failed.is_none() {
            if let Err(e) = d.backend.apply(&settings) {
                failed = Some(e.to_string());
            }
        }
        if let Some(e) = failed {
            for vm in &mut self.vms {
                vm.detach_dedup();
            }
            d.backend.shutdown();
            return Err(refused(e));
        }
        log::info!(
            "dedup backend {} started with {} VM(s) registered",
            d.backend.name(),
            self.vms.len()
        );
        self.res.dedup = Some(d.backend.clone());
        // Only this thread sets the slot, and it was empty above.
        let _ = self.dedup.set(d);
        Ok(Response::Done)
    }

    /// A handle for other threads (the API) to send requests.
    pub fn handle(&self) -> control::Handle {
        self.handle.clone()
    }

    /// Sends host stdin to VM `name`'s serial port (by default the first
    /// Linux VM; workload guests read no input). Raw terminal mode lasts as
    /// long as the returned guard.
    pub fn attach_stdin(&mut self, name: Option<&str>) -> Option<crate::stdin::RawTerminal> {
        if !crate::stdin::stdin_is_pollable() {
            return None;
        }
        let vm = match name {
            Some(n) => self.vms.iter().find(|v| v.name() == n)?,
            None => self.vms.iter().find(|v| v.is_linux())?,
        };
        let fwd = crate::stdin::StdinForwarder::new(vm.name(), vm.serial_device());
        let sub: Arc<Mutex<dyn MutEventSubscriber + Send>> = Arc::new(Mutex::new(fwd));
        self.em.add_subscriber(sub);
        Some(crate::stdin::RawTerminal::enable())
    }

    /// Creates and starts one VM.
    pub fn add_vm(&mut self, vc: &VmConfig) -> Result<(), Error> {
        if let Some(note) = vc.memory_note() {
            log::warn!("{note}");
        }
        let index = self.vms.len() + self.ended.len();
        let t = Instant::now();
        let mut vm = Vm::create(&self.res, vc, index).map_err(|source| Error::Vm {
            name: vc.name.clone(),
            source,
        })?;
        if t.elapsed() >= SLOW_REQUEST {
            log::info!("VM {}: creating it took {:?}", vc.name, t.elapsed());
        }
        let waker: Arc<Mutex<dyn MutEventSubscriber + Send>> =
            Arc::new(Mutex::new(Waker(vec![vm.shared().exit_evt.as_raw_fd()])));
        let mut ids = vec![self.em.add_subscriber(waker)];
        for sub in vm.take_subscribers() {
            ids.push(self.em.add_subscriber(sub));
        }
        if let Err(source) = vm.start() {
            for id in ids {
                let _ = self.em.remove_subscriber(id);
            }
            return Err(Error::Vm {
                name: vc.name.clone(),
                source,
            });
        }
        self.subscriber_ids.insert(vc.name.clone(), ids);
        self.summaries
            .insert(vc.name.clone(), WorkloadSummary::new(vc.name.clone()));
        self.vms.push(vm);
        Ok(())
    }

    fn find(&self, name: &str) -> Result<&Vm, RequestError> {
        match self.vms.iter().find(|v| v.name() == name) {
            Some(v) => Ok(v),
            None if self.finished.contains_key(name) => Err(RequestError::Conflict(format!(
                "VM {name:?} has finished (delete it to remove it)"
            ))),
            None => Err(RequestError::NotFound(name.to_string())),
        }
    }

    /// Every VM the API shows, live and finished, by name.
    fn infos(&self) -> Vec<VmInfo> {
        let mut all: Vec<VmInfo> = self.vms.iter().map(|v| v.info()).collect();
        all.extend(self.finished.values().cloned());
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Executes one API request.
    fn serve_request(&mut self, req: Request) -> Result<Response, RequestError> {
        match req {
            Request::ListVms => Ok(Response::Vms(self.infos())),
            Request::GetVm(n) => match self.finished.get(&n) {
                Some(info) => Ok(Response::Vm(Box::new(info.clone()))),
                None => Ok(Response::Vm(Box::new(self.find(&n)?.info()))),
            },
            Request::CreateVm(vc) => {
                if self.shutdown_requested {
                    return Err(RequestError::Gone);
                }
                if self.vms.iter().any(|v| v.name() == vc.name) {
                    return Err(RequestError::Conflict(format!(
                        "a VM named {:?} already exists",
                        vc.name
                    )));
                }
                if self.finished.contains_key(&vc.name) {
                    return Err(RequestError::Conflict(format!(
                        "a VM named {:?} already exists (finished: delete it first)",
                        vc.name
                    )));
                }
                let mut total = vc.memory_bytes();
                for v in &self.vms {
                    total = total.saturating_add(v.config.memory_bytes());
                }
                let cfg = Config {
                    dedup: Default::default(),
                    vms: vec![(*vc).clone()],
                    stdin: None,
                    seccomp: None,
                };
                let host = crate::memory::host_mem_total();
                cfg.validate(host).map_err(|e| match e {
                    // Not enough host memory is the state of the host,
                    // not bad input: 409 as docs/api.md says.
                    crate::config::Error::HostMemory { .. } => {
                        RequestError::Conflict(e.to_string())
                    }
                    e => RequestError::BadRequest(e.to_string()),
                })?;
                if let Some(host) = host {
                    if total > host {
                        return Err(RequestError::Conflict(format!(
                            "the VMs would need {} in all, more than this host has ({})",
                            crate::config::fmt_size_exact(total),
                            crate::config::fmt_size_exact_about(host)
                        )));
                    }
                }
                match self.add_vm(&vc) {
                    Ok(()) => Ok(Response::Vm(Box::new(self.find(&vc.name)?.info()))),
                    Err(Error::Vm { source: e, .. }) if e.is_bad_input() => {
                        Err(RequestError::BadRequest(e.to_string()))
                    }
                    Err(e) if matches!(&e, Error::Vm { source, .. } if source.is_conflict()) => {
                        Err(RequestError::Conflict(e.to_string()))
                    }
                    Err(e) => Err(RequestError::Internal(e.to_string())),
                }
            }
            Request::Pause(n) => {
                let vm = self.find(&n)?;
                vm.pause()
                    .map_err(|e| RequestError::Conflict(e.to_string()))?;
                Ok(Response::Vm(Box::new(vm.info())))
            }
            Request::SetBalloon { vm, target_mib } => {
                let vm = self.find(&vm)?;
                vm.set_balloon_target(target_mib).map_err(|e| match e {
                    crate::vm::Error::NoBalloon(_) => RequestError::Conflict(e.to_string()),
                    e => RequestError::BadRequest(e.to_string()),
                })?;
                Ok(Response::Vm(Box::new(vm.info())))
            }
            Request::Resume(n) => {
                let vm = self.find(&n)?;
                vm.resume()
                    .map_err(|e| RequestError::Conflict(e.to_string()))?;
                Ok(Response::Vm(Box::new(vm.info())))
            }
            Request::DeleteVm(n) => {
                if self.finished.remove(&n).is_some() {
                    return Ok(Response::Done);
                }
                self.find(&n)?;
                let i = self.vms.iter().position(|v| v.name() == n).unwrap_or(0);
                let mut vm = self.vms.remove(i);
                let t = Instant::now();
                let outcome = vm.finish(Outcome::Deleted);
                let finished = t.elapsed();
                let info = vm.info();
                self.forget_subscribers(&n);
                drop(vm);
                self.request_parts = Some(format!(
                    "stopping and releasing its dedup regions {finished:?}, freeing it {:?}",
                    t.elapsed() - finished
                ));
                self.drain_events();
                let summary = self
                    .summaries
                    .remove(&n)
                    .unwrap_or_else(|| WorkloadSummary::new(n.clone()));
                self.ended.insert(n, VmReport::new(&info, outcome, summary));
                Ok(Response::Done)
            }
            Request::StartDedup => {
                if self.shutdown_requested {
                    return Err(RequestError::Gone);
                }
                self.start_dedup()
            }
            Request::Shutdown => {
                self.shutdown_requested = true;
                self.stop_all("shutdown requested through the API");
                Ok(Response::Done)
            }
        }
    }

    /// Keeps the dedup figures of the largest saving seen (every 250 ms).
    fn sample_dedup(&mut self) {
        if self.vms.is_empty() || self.last_sample.elapsed() < std::time::Duration::from_millis(250)
        {
            return;
        }
        self.last_sample = Instant::now();
        if let Some(d) = &self.res.dedup {
            let s = d.stats();
            // The watchdog: say so once when the engine's own judgement
            // is that a wake-up is overdue (GET /health answers 503 then).
            if s.wakeup_overdue != self.engine_stalled {
                self.engine_stalled = s.wakeup_overdue;
                if s.wakeup_overdue {
                    log::warn!(
                        "dedup engine stalled: its scanner last woke up {} ms ago",
                        s.last_wakeup_age_ms
                    );
                } else {
                    log::warn!("dedup engine woke up again");
                }
            }
            if self
                .dedup_peak
                .as_ref()
                .is_none_or(|p| s.bytes_saved >= p.bytes_saved)
            {
                self.dedup_peak = Some(s);
            }
        }
    }

    fn forget_subscribers(&mut self, name: &str) {
        for id in self.subscriber_ids.remove(name).unwrap_or_default() {
            let _ = self.em.remove_subscriber(id);
        }
    }

    fn serve_requests(&mut self) {
        while let Some((req, reply)) = self.inbox.try_next() {
            let what = match &req {
                Request::CreateVm(vc) => format!("CreateVm({})", vc.name),
                other => format!("{other:?}"),
            };
            let t = Instant::now();
            let r = self.serve_request(req);
            let parts = self.request_parts.take();
            if t.elapsed() >= SLOW_REQUEST {
                // Every other API call waits for this thread meanwhile.
                let parts = parts.map(|p| format!(" ({p})")).unwrap_or_default();
                log::info!("slow VMM request: {what} took {:?}{parts}", t.elapsed());
            }
            let _ = reply.send(r);
        }
    }

    /// Creates and starts every VM of `config`. On failure, VMs already
    /// started are stopped again (none is left half-running).
    pub fn start_all(&mut self, config: &Config) -> Result<(), Error> {
        for vc in &config.vms {
            if let Err(e) = self.add_vm(vc) {
                self.stop_all("another VM failed to start");
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    /// What VM `name`'s guest reported so far (events are taken in by
    /// [`Runner::run`] or [`Runner::poll_events`]).
    pub fn summary(&self, name: &str) -> Option<&WorkloadSummary> {
        self.summaries.get(name)
    }

    /// Takes in pending guest reports without running the event loop (for
    /// callers that drive VMs step by step, such as tests and benchmarks).
    pub fn poll_events(&mut self) {
        // Device work (virtio notifications) runs on the event loop: give it
        // a non-blocking turn too.
        if let Err(e) = self.em.run_with_timeout(0) {
            log::warn!("event loop: {e:?}");
        }
        self.drain_events();
    }

    pub fn dedup(&self) -> Option<&Arc<dyn DedupBackend>> {
        self.res.dedup.as_ref()
    }

    /// Starts stopping every VM.
    pub fn stop_all(&mut self, reason: &str) {
        for vm in &self.vms {
            vm.shared().request_stop(Outcome::Stopped {
                reason: reason.to_string(),
            });
            if let Some(w) = vm.workload_control() {
                w.stop();
            }
        }
    }

    fn drain_events(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            if self.first_report.is_none() {
                self.first_report = Some(self.started.elapsed().as_secs_f64() * 1e3);
            }
            if self.echo {
                if self.res.prefix_output {
                    out(format_args!("[{}] {}", ev.vm, ev.kind));
                } else {
                    out(format_args!("{}", ev.kind));
                }
            }
            self.summaries
                .entry(ev.vm.clone())
                .or_insert_with(|| WorkloadSummary::new(ev.vm.clone()))
                .record(&ev.kind);
        }
    }

    /// Joins VMs that stopped, recording their reports.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.vms.len() {
            if self.vms[i].is_stopping() {
                let mut vm = self.vms.remove(i);
                let outcome = vm.finish(Outcome::Stopped {
                    reason: "stopped".into(),
                });
                let mut info = vm.info();
                self.drain_events();
                let name = vm.name().to_string();
                self.forget_subscribers(&name);
                drop(vm);
                info.state = RunState::Stopped;
                info.outcome = Some(outcome.clone());
                let summary = self.summaries.remove(&name).unwrap_or_default();
                if self.echo {
                    out(format_args!("[{name}] {outcome}"));
                }
                let report = VmReport::new(&info, outcome, summary);
                self.finished.insert(name.clone(), info);
                self.ended.insert(name, report);
            } else {
                i += 1;
            }
        }
    }

    /// Runs the event loop until every VM has stopped (or a signal stops
    /// them), then returns the report. `tick` runs about every 100 ms (the
    /// API and progress output hook in there).
    pub fn run(&mut self, mut tick: impl FnMut(&mut Runner)) -> Result<RunReport, Error> {
        let sig_evt = signals::install().map_err(|e| Error::EventLoop(e.to_string()))?;
        let waker: Arc<Mutex<dyn MutEventSubscriber + Send>> =
            Arc::new(Mutex::new(Waker(vec![sig_evt.as_raw_fd()])));
        self.em.add_subscriber(waker);
        let mut signal = None;
        loop {
            self.em
                .run_with_timeout(100)
                .map_err(|e| Error::EventLoop(format!("{e:?}")))?;
            self.drain_events();
            self.serve_requests();
            let mut sig = signals::received();
            if signals::take_hangup() {
                let reopened = signals::run_hangup_hook();
                if self.keep_alive {
                    // A daemon has no terminal to lose and no configuration
                    // to reload: SIGHUP only reopens the log file, if any
                    // (logrotate's convention).
                    if !reopened {
                        log::warn!("SIGHUP ignored: pagefold serve stops on SIGTERM or SIGINT");
                    }
                } else if sig == 0 {
                    // The terminal went away: stop as on SIGTERM, cleanly.
                    sig = libc::SIGHUP;
                }
            }
            if sig != 0 && signal.is_none() {
                signal = Some(signals::name(sig));
                log::warn!("{} received, stopping all VMs", signals::name(sig));
                self.stop_all(&format!("{} received", signals::name(sig)));
            }
            self.sample_dedup();
            self.reap();
            tick(self);
            let idle_ok = self.keep_alive && !self.shutdown_requested && signal.is_none();
            if self.vms.is_empty() && !idle_ok {
                break;
            }
        }
        self.drain_events();
        // Answer whatever arrived during the last round, then refuse more.
        self.shutdown_requested = true;
        self.serve_requests();
        Ok(RunReport {
            vms: std::mem::take(&mut self.ended).into_values().collect(),
            signal,
            dedup: self.dedup().map(|d| d.stats()),
            dedup_peak: self.dedup_peak.take(),
            first_report_ms: self.first_report,
        })
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.stop_all("pagefold is exiting");
        for vm in &mut self.vms {
            vm.finish(Outcome::Stopped {
                reason: "pagefold is exiting".into(),
            });
        }
        if let Some(d) = &self.res.dedup {
            d.shutdown();
        }
    }
}
