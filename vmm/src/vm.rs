//! One VM: its KVM VM, guest RAM, devices, vCPU threads and dedup regions.
//! Several live in one process (cross-VM dedup works inside one process).

use std::fs::File;
use std::io::Write;
use std::os::unix::thread::JoinHandleExt;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use pagefold_dedup::{DedupBackend, RegionId, RegionSpec};
use pagefold_devices::bus::Bus;
use pagefold_devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use pagefold_devices::serial::{LinePrefixWriter, SerialDevice, COM1_BASE, COM1_IRQ, COM1_LEN};
use pagefold_devices::GuestMemoryMmap;
use serde::{Deserialize, Serialize};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{SerialOutput, VmConfig};
use crate::dirty_log::KvmDirtyLog;
use crate::pause::GuestPauses;
use crate::quiesce::VcpuQuiescer;
use crate::state::{Outcome, RunState, VmShared};
use crate::vcpu::{self, ExitContext};
use crate::vcpu_stats::VcpuBlocking;
use crate::workload::{self, boot};
use crate::{disk, linux, memory, x86};

/// Errors of VM creation and control.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("KVM_CREATE_VM: {0}")]
    CreateVm(kvm_ioctls::Error),
    #[error("setting up the VM ({what}): {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Memory(#[from] memory::Error),
    #[error("KVM_SET_USER_MEMORY_REGION: {0}")]
    Memslot(kvm_ioctls::Error),
    #[error("KVM_CREATE_VCPU {index}: {source}")]
    CreateVcpu {
        index: u8,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Vcpu(#[from] x86::Error),
    #[error(transparent)]
    Boot(#[from] boot::Error),
    #[error(transparent)]
    Workload(#[from] workload::Error),
    #[error(transparent)]
    Thread(#[from] vcpu::Error),
    #[error("device set-up: {0}")]
    Device(String),
    #[error("opening serial output {path}: {source}")]
    SerialFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering guest RAM with the dedup backend: {0}")]
    Dedup(pagefold_dedup::Error),
    #[error("VM {0:?} is stopping")]
    Stopping(String),
    #[error(transparent)]
    Disk(#[from] disk::Error),
    #[error(transparent)]
    Linux(#[from] linux::vm::Error),
    #[error("VM {0:?} has no balloon (a Linux guest's `balloon` in its kernel config)")]
    NoBalloon(String),
    #[error(transparent)]
    Balloon(crate::balloon::Error),
}

impl Error {
    /// The VM's description cannot work (a workload that does not fit the
    /// VM, a kernel image the loader cannot load): bad input (CLI exit 2,
    /// API 400) rather than a failure of the VMM.
    pub fn is_bad_input(&self) -> bool {
        use crate::linux::kernel::Error as K;
        matches!(
            self,
            Error::Workload(_)
                | Error::Linux(linux::vm::Error::Boot(linux::Error::Kernel(
                    K::UnknownFormat | K::Load(_) | K::No64BitEntry { .. }
                )))
        )
    }

    /// The VM asks for something the process's state refuses (its dedup
    /// group has the other security, or the backend cannot keep it): a
    /// conflict, not bad input and not a fault.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Dedup(
                pagefold_dedup::Error::SecurityMismatch { .. }
                    | pagefold_dedup::Error::Unsupported(_)
            )
        )
    }
}

/// Process-wide things every VM needs.
pub struct VmResources {
    pub kvm: Arc<Kvm>,
    pub cpuid: CpuId,
    pub dedup: Option<Arc<dyn DedupBackend>>,
    pub events: crossbeam_channel::Sender<workload::Event>,
    /// Written when a guest may have reported something.
    pub report_wake: Arc<EventFd>,
    /// Prefix serial lines with the VM name (several VMs share the terminal).
    pub prefix_output: bool,
}

/// A point-in-time view of a VM, for reports and the API (whose clients
/// read it back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    pub name: String,
    pub state: RunState,
    pub vcpus: u8,
    pub memory_bytes: u64,
    pub dedup_group: Option<String>,
    pub outcome: Option<Outcome>,
    pub uptime_s: f64,
    /// The stops of the VM's vCPUs that the dedup engine's parks caused
    /// (see [`crate::pause`]).
    #[serde(default)]
    pub guest_pauses: GuestPauses,
    /// The balloon's target, size and figures (Linux guests with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<crate::balloon::BalloonStatus>,
    /// The NICs' figures (Linux guests with NICs), in config order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<crate::nic::NicStatus>,
}

/// How long `pause` keeps kicking vCPUs before it returns anyway.
const PAUSE_KICK_WINDOW: Duration = Duration::from_millis(50);

/// How long a stop may take before the VMM gives up on a vCPU thread.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A dedup-backend call on the control thread this long is logged.
const SLOW_DEDUP_CALL: Duration = Duration::from_millis(200);

pub struct Vm {
    pub config: VmConfig,
    pub index: usize,
    // Field order matters for drop: threads and dedup regions are released
    // (in `Drop`) before the memory they use is unmapped.
    shared: Arc<VmShared>,
    threads: Vec<JoinHandle<()>>,
    regions: Vec<RegionId>,
    dedup: Option<Arc<dyn DedupBackend>>,
    /// Where the virtio-blk devices send their I/O hints and the balloon
    /// gives pages back: the backend while the VM's RAM is registered with
    /// one (held for writing while it registers and unregisters, so a
    /// discard never meets registered memory behind the backend's back).
    dedup_target: crate::balloon::DedupTarget,
    /// The balloon (Linux guests that ask for one).
    balloon: Option<crate::balloon::BalloonDevice>,
    /// The NICs (Linux guests), in config order.
    nics: Vec<crate::nic::NicDevice>,
    /// Given to the dedup backend for its regions once the vCPUs run.
    quiescer: Option<Arc<VcpuQuiescer>>,
    workload: Option<Arc<workload::Control>>,
    workload_params: Option<pagefold_guest_abi::WorkloadParams>,
    serial: Arc<Mutex<SerialDevice>>,
    vcpus: Vec<VcpuFd>,
    /// Each vCPU's `blocking` statistic (`crate::vcpu_stats`), where the
    /// kernel has one: parks leave halted vCPUs alone.
    blocking: Vec<Option<Arc<VcpuBlocking>>>,
    ctx: Option<ExitContext>,
    subscribers: Vec<crate::virtio_mmio::Subscriber>,
    started: Instant,
    finished: bool,
    mem: GuestMemoryMmap,
    vm_fd: Arc<VmFd>,
    /// Guest RAM's memslots log dirty pages for the dedup engine.
    dirty_logged: bool,
}

/// Maps guest RAM into the VM (memslot `i` = region `i` of `mem`), logging
/// guest writes if `dirty_logged`. Called again on a live VM, it changes
/// only the flags (KVM keeps the slot's pages mapped).
///
/// A dirty-logged slot also stops getting transparent huge pages
/// (`MADV_NOHUGEPAGE`; turning the log off leaves that as it is). KVM maps
/// such a slot with 4 KiB pages whatever backs it, so a huge page there
/// gives the guest nothing and costs three ways: its first touch clears
/// 2 MiB inside one page fault, holding the process's mmap lock for
/// reading, and an engine waiting to take it for writing then holds off
/// every other vCPU's faults (docs/linux-guests.md, "The guests' worst
/// wake-ups"); its untouched part is host memory the guest never used;
/// and each merge or zero drop inside it splits it.
fn set_memslots(vm_fd: &VmFd, mem: &GuestMemoryMmap, dirty_logged: bool) -> Result<(), Error> {
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            flags: if dirty_logged {
                kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES
            } else {
                0
            },
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which the VM
        // keeps until after the VM fd (and so the memslot) is gone.
        unsafe { vm_fd.set_user_memory_region(r) }.map_err(Error::Memslot)?;
        if dirty_logged {
            // SAFETY: the region is a live mapping owned by `mem`; this
            // advice changes no content, only how later faults fill it.
            let advised = unsafe {
                pagefold_dedup::mm::madvise(
                    region.as_ptr() as usize,
                    region.len() as usize,
                    libc::MADV_NOHUGEPAGE,
                )
            };
            if let Err(e) = advised {
                // Only a cost (see above), never a fault of the guest's.
                log::warn!("MADV_NOHUGEPAGE on guest RAM: {e}");
            }
        }
    }
    Ok(())
}

fn setup<T>(what: &'static str, r: Result<T, kvm_ioctls::Error>) -> Result<T, Error> {
    r.map_err(|source| Error::Setup { what, source })
}

impl Vm {
    /// Creates a VM ready to start: memory mapped, image loaded, vCPUs set up.
    pub fn create(res: &VmResources, config: &VmConfig, index: usize) -> Result<Vm, Error> {
        let name = config.name.clone();
        let shared = Arc::new(VmShared::new(&name).map_err(|e| Error::Device(e.to_string()))?);
        let vm_fd = res.kvm.create_vm().map_err(Error::CreateVm)?;
        setup("TSS address", vm_fd.set_tss_address(0xfffb_d000))?;
        setup("in-kernel irqchip", vm_fd.create_irq_chip())?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        setup("PIT", vm_fd.create_pit2(pit))?;

        let mem = memory::create(config.memory_bytes())?;
        let backend = res.dedup.clone();
        // The dedup engine reads KVM's dirty log of guest RAM (see
        // `crate::dirty_log`): logging starts with the memslot, so the
        // engine's first collection covers every write the guest made.
        let dirty_logged =
            config.dedup.enabled && backend.as_ref().is_some_and(|d| d.wants_write_log());
        set_memslots(&vm_fd, &mem, dirty_logged)?;

        // Devices on the port-I/O bus.
        let mut pio = Bus::new();
        let serial_irq =
            EventFd::new(libc::EFD_NONBLOCK).map_err(|e| Error::Device(e.to_string()))?;
        setup("serial irqfd", vm_fd.register_irqfd(&serial_irq, COM1_IRQ))?;
        let out = serial_writer(&config.serial, &name, res.prefix_output)?;
        let serial = Arc::new(Mutex::new(SerialDevice::new(serial_irq, out)));
        pio.insert(serial.clone(), COM1_BASE, COM1_LEN)
            .map_err(|e| Error::Device(e.to_string()))?;
        let reset_shared = shared.clone();
        let i8042 = Arc::new(Mutex::new(I8042::new(Box::new(move || {
            reset_shared.request_stop(Outcome::GuestReset);
        }))));
        pio.insert(i8042, I8042_BASE, I8042_LEN)
            .map_err(|e| Error::Device(e.to_string()))?;
        let mut mmio = Bus::new();

        // vCPUs, with the generic x86 state.
        let mut vcpus = Vec::new();
        for i in 0..config.vcpus {
            let v = vm_fd
                .create_vcpu(u64::from(i))
                .map_err(|source| Error::CreateVcpu { index: i, source })?;
            x86::cpuid::configure(&v, &res.cpuid, i, config.vcpus)?;
            x86::msr::configure(&v)?;
            x86::lapic::configure_fpu(&v)?;
            x86::lapic::configure_lint(&v)?;
            vcpus.push(v);
        }

        // I/O hints: ranges virtio-blk reads fill go to the dedup backend
        // (host addresses), which visits those pages first; the balloon
        // gives pages back through it. The hooks read the VM's dedup
        // target at each call, so a backend started after this VM
        // ([`Vm::attach_dedup`]) gets the hints and discards too.
        let dedup_target: crate::balloon::DedupTarget = Arc::new(RwLock::new(
            backend.clone().filter(|_| config.dedup.enabled),
        ));
        let filled = config
            .dedup
            .enabled
            .then(|| dedup_write_hook(&dedup_target, &mem, |d, h, len| d.hint(h, len)));
        // Received frames: written by the device, so KVM's dirty log misses
        // them; the engine marks them written (no merge candidates: a
        // frame is one VM's own data, in buffers the guest reuses).
        let received = config
            .dedup
            .enabled
            .then(|| dedup_write_hook(&dedup_target, &mem, |d, h, len| d.device_wrote(h, len)));
        // The guest: a Linux kernel, or the built-in workload.
        let ranges = memory::ram_ranges(config.memory_bytes())?;
        let subscribers;
        let mut balloon = None;
        let mut nics = Vec::new();
        let mut workload_params = None;
        let (workload, control_port, strict_io) = match &config.kernel {
            Some(kernel) => {
                let devs = linux::vm::setup(
                    &name,
                    kernel,
                    &vm_fd,
                    &mem,
                    &ranges,
                    &vcpus,
                    &mut pio,
                    &mut mmio,
                    &shared,
                    filled.as_ref(),
                    received.as_ref(),
                    &dedup_target,
                )?;
                subscribers = devs.subscribers;
                balloon = devs.balloon;
                nics = devs.nics;
                // Linux probes legacy ports and addresses nothing decodes.
                (None, None, false)
            }
            None => {
                let wl = config.workload.clone().unwrap_or_default();
                let image = boot::load_image(&mem, workload::image::WORKLOAD_ELF)?;
                // Disks: the same virtio-blk wiring as Linux guests; the
                // guest's driver reaches the windows through its page tables.
                let disks =
                    disk::attach_disks(&name, &wl.disks, &vm_fd, &mem, &mut mmio, filled.as_ref())?;
                let cr3 =
                    boot::write_tables_with_mmio(&mem, memory::ram_top(&ranges), &disks.windows())?;
                boot::setup_vcpu(&vcpus[0], image.entry, cr3)?;
                let tsc_khz = vcpus[0].get_tsc_khz().unwrap_or(0);
                let guest_disks = workload::GuestDisk::from_attached(&disks);
                subscribers = disks.subscribers;
                let params = workload::params_with_disks(
                    &wl,
                    &config.name,
                    index,
                    &ranges,
                    image.end,
                    u64::from(tsc_khz),
                    &guest_disks,
                )?;
                let (port, control) = workload::device(
                    &name,
                    params,
                    mem.clone(),
                    res.events.clone(),
                    res.report_wake.clone(),
                )?;
                let base = pagefold_guest_abi::ports::BASE;
                let len = pagefold_guest_abi::ports::LEN;
                workload_params = Some(params);
                (Some(control), Some((base, len, port)), true)
            }
        };

        let mut vm = Vm {
            config: config.clone(),
            index,
            shared: shared.clone(),
            threads: Vec::new(),
            regions: Vec::new(),
            quiescer: None,
            dedup: backend,
            dedup_target,
            balloon,
            nics,
            workload,
            workload_params,
            serial,
            vcpus,
            blocking: Vec::new(),
            ctx: Some(ExitContext {
                shared,
                pio,
                mmio,
                control: control_port,
                strict_io,
            }),
            subscribers,
            started: Instant::now(),
            finished: false,
            mem,
            vm_fd: Arc::new(vm_fd),
            dirty_logged,
        };
        vm.register_dedup()?;
        Ok(vm)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Guest RAM as host address ranges `(start, length)`, for what reads
    /// it from outside the guest (the benchmarks' page census). They stay
    /// mapped while this `Vm` lives.
    pub fn ram_host_ranges(&self) -> Vec<(usize, usize)> {
        self.mem
            .iter()
            .map(|r| (r.as_ptr() as usize, r.len() as usize))
            .collect()
    }

    /// The workload guest's parameters (None for Linux guests): tests and
    /// benchmarks predict page contents from them.
    pub fn workload_params(&self) -> Option<&pagefold_guest_abi::WorkloadParams> {
        self.workload_params.as_ref()
    }

    /// The workload gate/stop handle, for tests and benchmarks.
    pub fn workload_control(&self) -> Option<&Arc<workload::Control>> {
        self.workload.as_ref()
    }

    /// Offers guest RAM to the dedup backend (owner = VM name).
    fn register_dedup(&mut self) -> Result<(), Error> {
        let Some(dedup) = self.dedup.clone() else {
            return Ok(());
        };
        if !self.config.dedup.enabled {
            return Ok(());
        }
        for (slot, region) in self.mem.iter().enumerate() {
            let spec = RegionSpec {
                host_addr: region.as_ptr() as usize,
                len: region.len() as usize,
                owner: self.config.name.clone(),
                group: self.config.dedup_group(),
                security: self.config.dedup.security,
            };
            let t = Instant::now();
            // SAFETY: the region is a private anonymous mapping owned by
            // `self.mem`; `Drop`/`finish` unregister it before it is unmapped.
            let id = unsafe { dedup.register(spec) }.map_err(Error::Dedup)?;
            let registered = t.elapsed();
            self.regions.push(id);
            if self.dirty_logged {
                if let Some(log) = KvmDirtyLog::new(self.vm_fd.clone(), slot as u32, &self.mem) {
                    dedup.set_write_log(id, Some(Arc::new(log)));
                }
            }
            if t.elapsed() >= SLOW_DEDUP_CALL {
                // The VMM's control thread (and every API call) waits.
                log::info!(
                    "VM {}: registering {} MiB with the dedup backend took {registered:?}, its write log {:?}",
                    self.config.name,
                    region.len() >> 20,
                    t.elapsed() - registered
                );
            }
        }
        Ok(())
    }

    /// Starts the vCPU threads.
    pub fn start(&mut self) -> Result<(), Error> {
        vcpu::install_kick_handler()?;
        let ctx = self
            .ctx
            .take()
            .ok_or_else(|| Error::Stopping(self.config.name.clone()))?;
        self.started = Instant::now();
        self.blocking = self
            .vcpus
            .iter()
            .map(|v| match VcpuBlocking::open(v) {
                Ok(b) => Some(Arc::new(b)),
                Err(e) => {
                    log::debug!("VM {}: parks kick halted vCPUs too: {e}", self.config.name);
                    None
                }
            })
            .collect();
        for (i, v) in self.vcpus.drain(..).enumerate() {
            let t = vcpu::spawn(
                format!("{}-vcpu{i}", self.config.name),
                v,
                ctx.clone(),
                self.config.vcpu_affinity.clone(),
            )?;
            self.threads.push(t);
        }
        self.attach_quiescer();
        Ok(())
    }

    /// Gives the dedup backend a way to park this VM's vCPUs for its
    /// regions (once the vCPU threads exist).
    fn attach_quiescer(&mut self) {
        if let Some(d) = self.dedup.as_ref().filter(|_| !self.regions.is_empty()) {
            let q = Arc::new(VcpuQuiescer::new(
                self.shared.clone(),
                self.threads
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.as_pthread_t(), self.blocking.get(i).cloned().flatten()))
                    .collect(),
            ));
            let t = Instant::now();
            for &id in &self.regions {
                d.set_quiesce(id, Some(q.clone()));
            }
            if t.elapsed() >= SLOW_DEDUP_CALL {
                log::info!(
                    "VM {}: attaching its vCPU quiescer took {:?}",
                    self.config.name,
                    t.elapsed()
                );
            }
            self.quiescer = Some(q);
        }
    }

    /// Registers this running VM's RAM with a dedup backend the process
    /// started after the VM (the API turning dedup on): the same steps as
    /// for a VM created with the backend there (dirty logging of the
    /// memslots, [`Vm::register_dedup`], the vCPU quiescer). A VM without
    /// dedup enabled, or already registered, is left as it is. On failure
    /// nothing stays registered and the VM runs on as before.
    pub fn attach_dedup(&mut self, backend: Arc<dyn DedupBackend>) -> Result<(), Error> {
        if self.dedup.is_some() || !self.config.dedup.enabled || self.finished {
            return Ok(());
        }
        // Logging must start no later than registration (the engine's
        // first collection then covers every write since). A memslot whose
        // flags cannot change only costs the engine pagemap reads.
        if backend.wants_write_log() {
            match set_memslots(&self.vm_fd, &self.mem, true) {
                Ok(()) => self.dirty_logged = true,
                Err(e) => log::warn!(
                    "VM {}: no write log for the dedup engine (pagemap instead): {e}",
                    self.config.name
                ),
            }
        }
        self.dedup = Some(backend.clone());
        {
            // Balloon discards wait until the RAM is registered and the
            // target says so.
            let target = self.dedup_target.clone();
            let mut t = target.write().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = self.register_dedup() {
                drop(t);
                self.detach_dedup();
                return Err(e);
            }
            *t = Some(backend);
        }
        if self.ctx.is_none() {
            self.attach_quiescer();
        }
        Ok(())
    }

    /// Undoes [`Vm::attach_dedup`] (a later VM's registration failed): the
    /// regions leave the backend, each page given back privately.
    pub fn detach_dedup(&mut self) {
        let Some(d) = self.dedup.take() else {
            return;
        };
        // Held until the regions are gone: a balloon discard then frees the
        // pages itself, never registered memory behind the backend's back.
        let target = self.dedup_target.clone();
        let mut t = target.write().unwrap_or_else(|e| e.into_inner());
        *t = None;
        if self.quiescer.take().is_some() || self.dirty_logged {
            d.detach_guest(&self.regions);
        }
        for id in self.regions.drain(..) {
            if let Err(e) = d.unregister(id) {
                log::error!("VM {}: dedup unregister: {e}", self.config.name);
            }
        }
        if self.dirty_logged {
            self.dirty_logged = false;
            if let Err(e) = set_memslots(&self.vm_fd, &self.mem, false) {
                log::warn!("VM {}: dirty logging stays on: {e}", self.config.name);
            }
        }
    }

    /// Pauses the VM. Returns at once (the event loop must never wait on a
    /// guest): vCPUs running guest code are kicked out of KVM_RUN and park at
    /// their next checkpoint; a vCPU blocked in a device operation (a
    /// workload guest's SLEEP or WAIT_HOST) runs no guest code and parks as
    /// soon as that operation returns.
    pub fn pause(&self) -> Result<(), Error> {
        if !self.shared.pause() {
            return Err(Error::Stopping(self.config.name.clone()));
        }
        let n = self.threads.len();
        self.shared.wait_until(
            PAUSE_KICK_WINDOW,
            || self.kick(),
            || self.shared.parked_vcpus() >= n || self.shared.state() != RunState::Paused,
        );
        Ok(())
    }

    pub fn resume(&self) -> Result<(), Error> {
        if !self.shared.resume() {
            return Err(Error::Stopping(self.config.name.clone()));
        }
        Ok(())
    }

    fn kick(&self) {
        for t in &self.threads {
            // SAFETY: the thread handle is joinable (not yet joined), so its
            // pthread_t is valid; the signal has a no-op handler installed.
            unsafe {
                libc::pthread_kill(t.as_pthread_t(), vcpu::kick_signal());
            }
        }
    }

    /// True once the VM has started stopping (by itself or by request).
    pub fn is_stopping(&self) -> bool {
        self.shared.state() == RunState::Stopping
    }

    /// Stops the VM (if it is not stopping yet, for `why`), waits for its
    /// vCPUs (bounded), and releases its dedup regions. Idempotent; returns
    /// the outcome that ended the VM.
    pub fn finish(&mut self, why: Outcome) -> Outcome {
        if !self.finished {
            self.finished = true;
            self.shared.request_stop(why);
            let t0 = Instant::now();
            // The engine kicks these threads no more before they are joined,
            // and reads their dirty log no more: one call, since each waits
            // for the engine's scan to let go of its core.
            let q = self.quiescer.take();
            if let Some(d) = self
                .dedup
                .as_ref()
                .filter(|_| q.is_some() || self.dirty_logged)
            {
                d.detach_guest(&self.regions);
            }
            if let Some(q) = q {
                q.forget_threads();
            }
            if let Some(w) = &self.workload {
                w.stop();
            }
            let t1 = Instant::now();
            let all_out = self.shared.wait_until(
                STOP_TIMEOUT,
                || self.kick(),
                || self.shared.live_vcpus() == 0,
            );
            if all_out {
                for t in self.threads.drain(..) {
                    let _ = t.join();
                }
            } else {
                log::error!(
                    "VM {}: {} vCPU thread(s) did not stop within {:?}",
                    self.config.name,
                    self.shared.live_vcpus(),
                    STOP_TIMEOUT
                );
            }
            let t2 = Instant::now();
            // No discard reaches the backend once its regions go.
            let target = self.dedup_target.clone();
            let mut t = target.write().unwrap_or_else(|e| e.into_inner());
            *t = None;
            if let Some(d) = &self.dedup {
                for id in self.regions.drain(..) {
                    let r = if all_out {
                        // SAFETY: no vCPU runs any more and the VM's memory
                        // is unmapped right after this (when `self.mem`
                        // drops), so nothing will read the merged pages: the
                        // engine may drop its references without giving each
                        // page a private copy first.
                        unsafe { d.unregister_unmapping(id) }
                    } else {
                        d.unregister(id)
                    };
                    if let Err(e) = r {
                        log::error!("VM {}: dedup unregister: {e}", self.config.name);
                    }
                }
            }
            drop(t);
            if t0.elapsed() >= SLOW_DEDUP_CALL {
                // Which part a slow deletion waited for: the dedup calls
                // wait for the engine's core.
                log::info!(
                    "VM {}: stopping took {:?} (detaching from dedup {:?}, vCPUs out and joined {:?}, unregistering {:?})",
                    self.config.name,
                    t0.elapsed(),
                    t1 - t0,
                    t2 - t1,
                    t2.elapsed()
                );
            }
            self.serial
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .flush();
        }
        self.shared.outcome().unwrap_or(Outcome::Stopped {
            reason: "never started".into(),
        })
    }

    /// True when every vCPU thread has exited.
    pub fn vcpus_done(&self) -> bool {
        self.shared.live_vcpus() == 0
    }

    pub fn info(&self) -> VmInfo {
        VmInfo {
            name: self.config.name.clone(),
            state: self.shared.state(),
            vcpus: self.config.vcpus,
            memory_bytes: self.config.memory_bytes(),
            dedup_group: self.config.dedup.enabled.then(|| self.config.dedup_group()),
            outcome: self.shared.outcome(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            guest_pauses: self.shared.guest_pauses(),
            balloon: self.balloon.as_ref().map(|b| b.status()),
            nics: self.nics.iter().map(|n| n.status()).collect(),
        }
    }

    /// Asks the guest's balloon for `target_mib` MiB.
    pub fn set_balloon_target(&self, target_mib: u64) -> Result<(), Error> {
        let b = self
            .balloon
            .as_ref()
            .ok_or_else(|| Error::NoBalloon(self.config.name.clone()))?;
        b.set_target_mib(target_mib).map_err(Error::Balloon)
    }

    /// The serial device (stdin forwarding).
    pub fn serial_device(&self) -> Arc<Mutex<SerialDevice>> {
        self.serial.clone()
    }

    /// True for VMs that boot a Linux kernel.
    pub fn is_linux(&self) -> bool {
        self.config.kernel.is_some()
    }

    /// Queues host input for the guest's serial port.
    pub fn serial_input(&self, bytes: &[u8]) -> usize {
        self.serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .enqueue_input(bytes)
    }

    /// Event-loop subscribers of this VM's devices (taken once, by the runner).
    pub fn take_subscribers(&mut self) -> Vec<crate::virtio_mmio::Subscriber> {
        std::mem::take(&mut self.subscribers)
    }

    /// The KVM VM (for device wiring such as ioeventfds).
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm_fd
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.finish(Outcome::Stopped {
            reason: "VM released".into(),
        });
    }
}

/// A device's write hook (`WriteHook`: guest-physical address, length)
/// that tells the dedup backend tracking the VM's RAM, looked up at each
/// call so that a backend attached later gets the writes too, through
/// `tell` (an I/O hint, or a plain device write) at the host address.
fn dedup_write_hook(
    target: &crate::balloon::DedupTarget,
    mem: &GuestMemoryMmap,
    tell: fn(&dyn DedupBackend, usize, usize),
) -> pagefold_devices::virtio::WriteHook {
    let (target, m) = (target.clone(), mem.clone());
    Arc::new(move |gpa: u64, len: usize| {
        let d = target.read().unwrap_or_else(|e| e.into_inner());
        if let (Some(d), Ok(h)) = (d.as_ref(), m.get_host_address(vm_memory::GuestAddress(gpa))) {
            tell(d.as_ref(), h as usize, len);
        }
    })
}

/// The writer behind a VM's serial port.
fn serial_writer(
    out: &SerialOutput,
    name: &str,
    prefix: bool,
) -> Result<Box<dyn Write + Send>, Error> {
    Ok(match out {
        SerialOutput::Stdout if prefix => Box::new(LinePrefixWriter::new(
            &format!("[{name}] "),
            std::io::stdout(),
        )),
        SerialOutput::Stdout => Box::new(LinePrefixWriter::new("", std::io::stdout())),
        SerialOutput::Null => Box::new(std::io::sink()),
        SerialOutput::File(p) => Box::new(File::create(p).map_err(|source| Error::SerialFile {
            path: p.clone(),
            source,
        })?),
    })
}
