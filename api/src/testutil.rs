//! Test doubles for route and server tests: a VMM event loop that keeps a
//! table of pretend VMs (the real runner needs KVM; the end-to-end test in
//! tests/api_e2e.rs uses it), and a dedup backend holding just mode, knobs
//! and fixed figures (the real engines need userfaultfd or KSM; the
//! end-to-end test uses the real one).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pagefold_dedup::auto::{AutoConfig, AutoController, ScriptedSource};
use pagefold_dedup::OwnerStats;
use pagefold_dedup::{
    CheckedSettings, DedupBackend, Error, Knobs, Mode, RegionId, RegionSpec, Stats,
};
use pagefold_vmm::control::{self, Handle, Request, RequestError, Response};
use pagefold_vmm::dedup::Dedup;
use pagefold_vmm::state::RunState;
use pagefold_vmm::vm::VmInfo;

pub struct TestBackend {
    state: Mutex<(Mode, Knobs)>,
    /// `DedupSettings::settle` as applied (on at first, as the engine's).
    settle: AtomicBool,
    /// Pretend the scanner's wake-up is overdue (a stalled engine).
    pub overdue: AtomicBool,
}

impl TestBackend {
    pub fn new() -> TestBackend {
        TestBackend {
            state: Mutex::new((
                Mode::On,
                Knobs {
                    pages_to_scan: 100,
                    sleep_millisecs: 20,
                    max_page_sharing: 256,
                },
            )),
            settle: AtomicBool::new(true),
            overdue: AtomicBool::new(false),
        }
    }
}

impl DedupBackend for TestBackend {
    fn name(&self) -> &'static str {
        "test"
    }
    unsafe fn register(&self, _spec: RegionSpec) -> pagefold_dedup::Result<RegionId> {
        Err(Error::Unsupported("test backend".into()))
    }
    fn unregister(&self, id: RegionId) -> pagefold_dedup::Result<()> {
        Err(Error::UnknownRegion(id.0))
    }
    unsafe fn discard(&self, addr: usize, len: usize) -> pagefold_dedup::Result<u64> {
        Err(Error::BadRegion { addr, len })
    }
    fn apply(&self, settings: &CheckedSettings) -> pagefold_dedup::Result<Knobs> {
        if settings.mode == Some(Mode::Unmerge) {
            return Err(Error::Unsupported("the test backend cannot unmerge".into()));
        }
        if let Some(on) = settings.settle {
            self.settle.store(on, Ordering::Relaxed);
        }
        let mut s = self.state.lock().unwrap();
        s.1 = settings.knobs_over(s.1);
        s.0 = settings.mode.unwrap_or(s.0);
        Ok(s.1)
    }
    fn mode(&self) -> Mode {
        self.state.lock().unwrap().0
    }
    fn knobs(&self) -> Knobs {
        self.state.lock().unwrap().1
    }
    fn stats(&self) -> Stats {
        let (mode, knobs) = *self.state.lock().unwrap();
        let mut per_owner = BTreeMap::new();
        per_owner.insert(
            "vm0".to_string(),
            OwnerStats {
                group: "g".into(),
                pages_tracked: 100,
                pages_merged: 40,
                zero_pages: 2,
                bytes_saved: 42 * 4096,
                cow_breaks: Some(3),
                pages_reported: 7,
                pages_returned: Some(5),
            },
        );
        Stats {
            backend: "test".into(),
            mode,
            knobs: Some(knobs),
            pages_shared: 10,
            pages_sharing: 30,
            zero_pages: 2,
            full_scans: 4,
            merges: 40,
            bytes_saved: 32 * 4096,
            last_wakeup_age_ms: if self.overdue.load(Ordering::Relaxed) {
                60_000
            } else {
                15
            },
            wakeup_overdue: self.overdue.load(Ordering::Relaxed),
            settle: Some(self.settle.load(Ordering::Relaxed)),
            per_owner,
            ..Stats::default()
        }
    }
    fn shutdown(&self) {}
}

/// A pretend VMM loop on its own thread.
pub struct FakeVmm {
    pub handle: Handle,
    /// The test backend (when started with one), to steer from tests.
    pub backend: Option<Arc<TestBackend>>,
    late: Arc<Mutex<Option<Arc<TestBackend>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn serve(vms: &mut BTreeMap<String, VmInfo>, req: Request) -> Result<Response, RequestError> {
    let find = |vms: &mut BTreeMap<String, VmInfo>, n: &str| {
        vms.get(n)
            .cloned()
            .ok_or_else(|| RequestError::NotFound(n.to_string()))
    };
    match req {
        Request::ListVms => Ok(Response::Vms(vms.values().cloned().collect())),
        Request::GetVm(n) => Ok(Response::Vm(Box::new(find(vms, &n)?))),
        Request::CreateVm(vc) => {
            if vms.contains_key(&vc.name) {
                return Err(RequestError::Conflict(format!(
                    "a VM named {:?} already exists",
                    vc.name
                )));
            }
            vc.validate()
                .map_err(|e| RequestError::BadRequest(e.to_string()))?;
            let info = VmInfo {
                name: vc.name.clone(),
                state: RunState::Running,
                vcpus: vc.vcpus,
                memory_bytes: vc.memory_bytes(),
                dedup_group: Some(vc.dedup_group()),
                outcome: None,
                uptime_s: 0.0,
                guest_pauses: Default::default(),
                balloon: vc
                    .kernel
                    .as_ref()
                    .and_then(|k| k.balloon.as_ref())
                    .map(|b| pagefold_vmm::balloon::BalloonStatus {
                        free_page_reporting: b.free_page_reporting,
                        deflate_on_oom: b.deflate_on_oom,
                        stats_interval_s: b.stats_interval_s,
                        ..Default::default()
                    }),
                nics: Vec::new(),
            };
            vms.insert(vc.name.clone(), info.clone());
            Ok(Response::Vm(Box::new(info)))
        }
        Request::Pause(n) | Request::Resume(n) if n == "stopping" => {
            Err(RequestError::Conflict(format!("VM {n:?} is stopping")))
        }
        Request::Pause(n) => {
            find(vms, &n)?;
            let v = vms.get_mut(&n).unwrap();
            v.state = RunState::Paused;
            Ok(Response::Vm(Box::new(v.clone())))
        }
        Request::Resume(n) => {
            find(vms, &n)?;
            let v = vms.get_mut(&n).unwrap();
            v.state = RunState::Running;
            Ok(Response::Vm(Box::new(v.clone())))
        }
        Request::SetBalloon { vm, target_mib } => {
            find(vms, &vm)?;
            let v = vms.get_mut(&vm).unwrap();
            let memory_mib = v.memory_bytes >> 20;
            let Some(b) = v.balloon.as_mut() else {
                return Err(RequestError::Conflict(format!("VM {vm:?} has no balloon")));
            };
            if target_mib > memory_mib {
                return Err(RequestError::BadRequest(format!(
                    "balloon target {target_mib} MiB is more than the VM's {memory_mib} MiB of RAM"
                )));
            }
            b.target_mib = target_mib;
            Ok(Response::Vm(Box::new(v.clone())))
        }
        Request::DeleteVm(n) => {
            vms.remove(&n).ok_or(RequestError::NotFound(n))?;
            Ok(Response::Done)
        }
        Request::Shutdown => Ok(Response::Done),
        // Answered by the loop, which holds the backend slot.
        Request::StartDedup => Err(RequestError::Internal("unreachable".into())),
    }
}

impl FakeVmm {
    /// Starts the loop; `vm_names` are VMs that exist from the start.
    /// Without a backend, it refuses to start one (as a host without
    /// userfaultfd permission would).
    pub fn start(with_backend: bool, vm_names: &[&str]) -> FakeVmm {
        Self::start_with(with_backend, false, vm_names)
    }

    /// Starts the loop without a backend; `PATCH /dedup` starts one (a
    /// [`TestBackend`], found in [`FakeVmm::late_backend`]).
    pub fn start_late(vm_names: &[&str]) -> FakeVmm {
        Self::start_with(false, true, vm_names)
    }

    /// The backend started through the API, once there is one.
    pub fn late_backend(&self) -> Option<Arc<TestBackend>> {
        self.late.lock().unwrap().clone()
    }

    fn start_with(with_backend: bool, can_start: bool, vm_names: &[&str]) -> FakeVmm {
        let test_backend = with_backend.then(|| Arc::new(TestBackend::new()));
        let backend: Option<Arc<dyn DedupBackend>> =
            test_backend.clone().map(|b| b as Arc<dyn DedupBackend>);
        // A real auto-mode controller over a scripted 1 GiB host (the
        // backend does not run it; only its handle's status and settings
        // are used here).
        let auto = with_backend.then(|| {
            let src = ScriptedSource::new(ScriptedSource::sample(1 << 30, 512 << 20));
            AutoController::new(AutoConfig::default(), Box::new(src), 100)
                .unwrap()
                .handle()
        });
        let slot = control::dedup_slot(backend.map(|backend| Dedup { backend, auto }));
        let (handle, inbox) = control::channel(slot.clone()).unwrap();
        let late = Arc::new(Mutex::new(None));
        let late2 = late.clone();
        let mut vms = BTreeMap::new();
        for n in vm_names
            .iter()
            .copied()
            .chain(["stopping"].into_iter().filter(|_| !vm_names.is_empty()))
        {
            vms.insert(
                n.to_string(),
                VmInfo {
                    name: n.to_string(),
                    state: if n == "stopping" {
                        RunState::Stopping
                    } else {
                        RunState::Running
                    },
                    vcpus: 1,
                    memory_bytes: 64 << 20,
                    dedup_group: Some("g".into()),
                    outcome: None,
                    uptime_s: 1.0,
                    guest_pauses: Default::default(),
                    balloon: None,
                    nics: Vec::new(),
                },
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                while let Some((req, reply)) = inbox.try_next() {
                    let shutdown = matches!(req, Request::Shutdown);
                    let r = match req {
                        Request::StartDedup if slot.get().is_some() => Ok(Response::Done),
                        Request::StartDedup if can_start => {
                            let b = Arc::new(TestBackend::new());
                            *late2.lock().unwrap() = Some(b.clone());
                            let _ = slot.set(Dedup {
                                backend: b,
                                auto: None,
                            });
                            Ok(Response::Done)
                        }
                        Request::StartDedup => Err(RequestError::Conflict(
                            "cannot start deduplication: dedup backend pagefold: userfaultfd: Operation not permitted".into(),
                        )),
                        req => serve(&mut vms, req),
                    };
                    let _ = reply.send(r);
                    if shutdown {
                        // Like the runner: once it is done, the channel closes.
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        FakeVmm {
            handle,
            backend: test_backend,
            late,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeVmm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An auto-mode status with every field set (PSI too), so that tests see
/// every figure: built field by field, so a field added to `AutoStatus`
/// fails to compile here until the tests (and the view) know it.
pub fn auto_status() -> pagefold_dedup::auto::AutoStatus {
    pagefold_dedup::auto::AutoStatus {
        auto_triggered: true,
        scanning_factor: 4,
        triggered_times: 2,
        threshold_pct: 20,
        max_scanning_factor: 16,
        effective_max_scanning_factor: 8,
        trigger_bytes: 200 << 20,
        stop_bytes: 300 << 20,
        total_bytes: 1 << 30,
        free_bytes: 100 << 20,
        available_bytes: 150 << 20,
        memory_signal: pagefold_dedup::auto::MemorySignal::Available,
        psi: Some(pagefold_dedup::auto::Psi {
            some_avg10: 1.5,
            some_avg60: 0.5,
            full_avg10: 0.25,
            full_avg60: 0.0,
        }),
        psi_pressure: false,
        rounds: 40,
        triggered_rounds: 12,
        pages_to_scan: 100,
        last_plan_pages: 400,
        last_plan_merge: true,
        sample_errors: 1,
        last_error: Some("reading /proc/meminfo: interrupted".into()),
    }
}
