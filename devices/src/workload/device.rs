//! The workload control device: decodes the guest's port writes, serves
//! mailbox operations from guest memory, blocks the vCPU for SLEEP and
//! WAIT_HOST, and reports events.

use super::control::{WaitOutcome, WorkloadControl};
use super::event::{EventKind, WorkloadEvent};
use super::guest_io::Plain;
use crate::GuestMemoryMmap;
use crossbeam_channel::Sender;
use pagefold_guest_abi::classes::{DataLayout, ParamsError};
use pagefold_guest_abi::mailbox::{
    offset, op, status, Mailbox, PhaseReport, ABI_VERSION, LOG_CAPACITY,
};
use pagefold_guest_abi::pause::PauseHistogram;
use pagefold_guest_abi::{phase, ports, WorkloadParams};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError};

/// Errors of a guest's use of the device. Each is a guest (or parameter)
/// bug: the VMM should stop that VM and report the error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("port {0:#x} is not a writable workload device register")]
    BadPort(u16),
    #[error("{len}-byte write to workload port {port:#x}: the device takes 4-byte accesses")]
    BadAccess { port: u16, len: usize },
    #[error("workload doorbell rung before a mailbox was registered")]
    NoMailbox,
    #[error("workload mailbox at {0:#x} is not 8-byte aligned guest RAM")]
    BadMailbox(u64),
    #[error("workload mailbox access at {addr:#x}: {source}")]
    Memory { addr: u64, source: GuestMemoryError },
    #[error("unknown workload mailbox op {0}")]
    UnknownOp(u32),
    #[error("workload parameters rejected: {0}")]
    BadParams(ParamsError),
    #[error("guest speaks workload ABI version {0}, host {ABI_VERSION}")]
    AbiVersion(u64),
    #[error("guest LOG of {0} bytes (at most {LOG_CAPACITY})")]
    BadLog(u64),
    #[error("guest ended phase {ended} but phase {begun:?} was begun")]
    PhaseMismatch { begun: Option<u32>, ended: u32 },
}

/// What the VMM should do after a port write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAction {
    /// Resume the vCPU.
    Continue,
    /// The guest exited with this code (`mailbox::exit_code`): stop the VM.
    Exit(u32),
}

/// The device of one VM. `M` is the VM's guest memory (any vm-memory
/// `GuestMemory`, e.g. `GuestMemoryMmap` with or without a dirty bitmap).
pub struct WorkloadDevice<M: GuestMemory = GuestMemoryMmap> {
    vm: String,
    params: WorkloadParams,
    mem: M,
    events: Sender<WorkloadEvent>,
    control: Arc<WorkloadControl>,
    mailbox_lo: u32,
    mailbox: Option<u64>,
    status: u32,
    created: Instant,
    /// Phase opcode and host time of the last PHASE_BEGIN.
    phase_started: Option<(u32, Instant)>,
    /// WAIT_HOST gates this guest has passed (see `WorkloadControl`).
    gates_passed: u64,
}

impl<M: GuestMemory> WorkloadDevice<M> {
    pub fn new(
        vm_name: String,
        params: WorkloadParams,
        mem: M,
        events: Sender<WorkloadEvent>,
        control: Arc<WorkloadControl>,
    ) -> Self {
        Self {
            vm: vm_name,
            params,
            mem,
            events,
            control,
            mailbox_lo: 0,
            mailbox: None,
            status: status::OK,
            created: Instant::now(),
            phase_started: None,
            gates_passed: 0,
        }
    }

    /// Handles a guest `out`. `port` is absolute (`ports::BASE..+LEN`).
    /// Blocks for SLEEP and WAIT_HOST (bounded by `WorkloadControl::stop`).
    pub fn pio_write(&mut self, port: u16, data: &[u8]) -> Result<DeviceAction, Error> {
        let value: [u8; 4] = data.try_into().map_err(|_| Error::BadAccess {
            port,
            len: data.len(),
        })?;
        let value = u32::from_le_bytes(value);
        match port {
            ports::MAILBOX_LO => self.mailbox_lo = value,
            ports::MAILBOX_HI => {
                let addr = (u64::from(value) << 32) | u64::from(self.mailbox_lo);
                let fits = self.mem.check_range(
                    GuestAddress(addr),
                    std::mem::size_of::<Mailbox>(),
                    vm_memory::Permissions::ReadWrite,
                );
                if addr % 8 != 0 || !fits {
                    self.mailbox = None;
                    return Err(Error::BadMailbox(addr));
                }
                self.mailbox = Some(addr);
            }
            ports::DOORBELL => {
                self.status = status::ERROR;
                let action = self.doorbell(value)?;
                return Ok(action);
            }
            _ => return Err(Error::BadPort(port)),
        }
        Ok(DeviceAction::Continue)
    }

    /// Handles a guest `in`: STATUS gives the last operation's status; other
    /// ports read as zero.
    pub fn pio_read(&mut self, port: u16, data: &mut [u8]) {
        let value = if port == ports::STATUS {
            self.status
        } else {
            0
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = value.to_le_bytes().get(i).copied().unwrap_or(0);
        }
    }

    /// The VM's name.
    pub fn vm(&self) -> &str {
        &self.vm
    }

    fn emit(&self, kind: EventKind) {
        log::debug!("{}: {kind}", self.vm);
        // A dropped receiver means nobody listens any more: not the guest's fault.
        let _ = self.events.send(WorkloadEvent {
            vm: self.vm.clone(),
            kind,
        });
    }

    fn read_u64(&self, base: u64, off: usize) -> Result<u64, Error> {
        let addr = base + off as u64;
        self.mem
            .read_obj(GuestAddress(addr))
            .map_err(|source| Error::Memory { addr, source })
    }

    fn args(&self, base: u64) -> Result<[u64; 4], Error> {
        let mut a = [0u64; 4];
        for (i, v) in a.iter_mut().enumerate() {
            *v = self.read_u64(base, offset::ARGS + 8 * i)?;
        }
        Ok(a)
    }

    /// Runs operation `opcode`; sets `self.status` on success.
    fn doorbell(&mut self, opcode: u32) -> Result<DeviceAction, Error> {
        let mb = self.mailbox.ok_or(Error::NoMailbox)?;
        let stopped = self.control.is_stopped();
        let mut st = status::OK;
        match opcode {
            op::GET_PARAMS => {
                DataLayout::new(&self.params).map_err(Error::BadParams)?;
                let addr = mb + offset::PARAMS as u64;
                self.mem
                    .write_obj(Plain(self.params), GuestAddress(addr))
                    .map_err(|source| Error::Memory { addr, source })?;
            }
            op::HELLO => {
                let version = self.args(mb)?[0];
                if version != ABI_VERSION {
                    return Err(Error::AbiVersion(version));
                }
                self.emit(EventKind::Hello);
            }
            op::PHASE_BEGIN => {
                let [phase, slot, arg, _] = self.args(mb)?;
                self.phase_started = Some((phase as u32, Instant::now()));
                self.emit(EventKind::PhaseBegin {
                    phase: phase as u32,
                    slot: slot as u32,
                    arg,
                });
            }
            op::PHASE_END => {
                let addr = mb + offset::REPORT as u64;
                let Plain(report): Plain<PhaseReport> = self
                    .mem
                    .read_obj(GuestAddress(addr))
                    .map_err(|source| Error::Memory { addr, source })?;
                let (begun, start) = match self.phase_started.take() {
                    Some((p, t)) if p == report.phase => (p, t),
                    other => {
                        return Err(Error::PhaseMismatch {
                            begun: other.map(|o| o.0),
                            ended: report.phase,
                        })
                    }
                };
                let _ = begun;
                if matches!(report.phase, phase::LATENCY | phase::LATENCY_WRITE) {
                    let addr = mb + offset::PAUSES as u64;
                    let Plain(histogram): Plain<PauseHistogram> = self
                        .mem
                        .read_obj(GuestAddress(addr))
                        .map_err(|source| Error::Memory { addr, source })?;
                    self.emit(EventKind::Pauses {
                        slot: report.slot,
                        histogram: Box::new(histogram),
                    });
                }
                self.emit(EventKind::PhaseEnd {
                    report: Box::new(report),
                    elapsed: start.elapsed(),
                });
            }
            op::PROGRESS => {
                let [phase, done, total, _] = self.args(mb)?;
                self.emit(EventKind::Progress {
                    phase: phase as u32,
                    done,
                    total,
                });
            }
            op::LOG => {
                let len = self.read_u64(mb, offset::LOG_LEN)?;
                if len > LOG_CAPACITY as u64 {
                    return Err(Error::BadLog(len));
                }
                let mut buf = vec![0u8; len as usize];
                let addr = mb + offset::LOG as u64;
                self.mem
                    .read_slice(&mut buf, GuestAddress(addr))
                    .map_err(|source| Error::Memory { addr, source })?;
                self.emit(EventKind::Log(String::from_utf8_lossy(&buf).into_owned()));
            }
            op::SLEEP => {
                let ms = self.args(mb)?[0];
                if self.control.sleep(Duration::from_millis(ms)) {
                    st = status::STOPPED;
                }
            }
            op::WAIT_HOST => {
                let ms = self.args(mb)?[0];
                let limit = (ms > 0).then(|| Duration::from_millis(ms));
                let gate = self.gates_passed;
                self.gates_passed += 1;
                st = match self.control.wait_gate(gate, limit) {
                    WaitOutcome::Released => status::OK,
                    WaitOutcome::TimedOut => status::TIMED_OUT,
                    WaitOutcome::Stopped => status::STOPPED,
                };
            }
            op::CLOCK => {
                let ns = self.created.elapsed().as_nanos() as u64;
                let addr = mb + offset::ARGS as u64;
                self.mem
                    .write_obj(ns, GuestAddress(addr))
                    .map_err(|source| Error::Memory { addr, source })?;
            }
            op::EXIT => {
                let code = self.args(mb)?[0] as u32;
                self.emit(EventKind::Exit { status: code });
                self.status = status::OK;
                return Ok(DeviceAction::Exit(code));
            }
            other => return Err(Error::UnknownOp(other)),
        }
        self.status = if stopped || self.control.is_stopped() {
            status::STOPPED
        } else {
            st
        };
        Ok(DeviceAction::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{unbounded, Receiver};
    use pagefold_guest_abi::mailbox::{exit_code, NO_MISMATCH};
    use pagefold_guest_abi::{phase, PAGE_SIZE, PARAMS_MAGIC};
    use std::thread;

    const MB: u64 = 0x1000;

    fn params() -> WorkloadParams {
        WorkloadParams {
            magic: PARAMS_MAGIC,
            seed: 5,
            private_seed: 6,
            shared_pages: 100,
            private_pages: 50,
            data_start: 0x40_0000,
            data_end: 0x40_0000 + 200 * PAGE_SIZE,
            program: [
                phase::FILL,
                phase::VERIFY,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            ],
            ..WorkloadParams::default()
        }
    }

    struct Rig {
        dev: WorkloadDevice,
        mem: GuestMemoryMmap,
        rx: Receiver<WorkloadEvent>,
        control: Arc<WorkloadControl>,
    }

    fn rig(p: WorkloadParams) -> Rig {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let (tx, rx) = unbounded();
        let control = Arc::new(WorkloadControl::new());
        let dev = WorkloadDevice::new("vm0".into(), p, mem.clone(), tx, control.clone());
        Rig {
            dev,
            mem,
            rx,
            control,
        }
    }

    impl Rig {
        fn out(&mut self, port: u16, v: u32) -> Result<DeviceAction, Error> {
            self.dev.pio_write(port, &v.to_le_bytes())
        }
        fn status(&mut self) -> u32 {
            let mut b = [0u8; 4];
            self.dev.pio_read(ports::STATUS, &mut b);
            u32::from_le_bytes(b)
        }
        fn register(&mut self, addr: u64) -> Result<DeviceAction, Error> {
            self.out(ports::MAILBOX_LO, addr as u32)?;
            self.out(ports::MAILBOX_HI, (addr >> 32) as u32)
        }
        fn call(&mut self, opcode: u32, args: [u64; 4]) -> Result<DeviceAction, Error> {
            for (i, a) in args.iter().enumerate() {
                self.mem
                    .write_obj(*a, GuestAddress(MB + 8 * i as u64))
                    .unwrap();
            }
            self.out(ports::DOORBELL, opcode)
        }
        fn event(&self) -> EventKind {
            self.rx.try_recv().expect("an event").kind
        }
    }

    #[test]
    fn get_params_writes_them_into_the_mailbox() {
        let mut r = rig(params());
        r.register(MB).unwrap();
        assert_eq!(
            r.call(op::GET_PARAMS, [0; 4]).unwrap(),
            DeviceAction::Continue
        );
        assert_eq!(r.status(), status::OK);
        let Plain(got): Plain<WorkloadParams> = r
            .mem
            .read_obj(GuestAddress(MB + offset::PARAMS as u64))
            .unwrap();
        assert_eq!(got, params());
        assert!(r.rx.try_recv().is_err(), "GET_PARAMS is not an event");
    }

    #[test]
    fn a_latency_phase_end_sends_its_histogram_then_its_report() {
        let mut r = rig(params());
        r.register(MB).unwrap();
        r.call(op::PHASE_BEGIN, [u64::from(phase::LATENCY), 2, 200, 0])
            .unwrap();
        r.event();
        let mut hist = PauseHistogram::ZERO;
        hist.record_ns(3_000);
        hist.record_ns(450_000);
        let mut report = PhaseReport {
            phase: phase::LATENCY,
            slot: 2,
            first_mismatch: NO_MISMATCH,
            ..Default::default()
        };
        report.pauses.gaps = 2;
        report.pauses.max_gap_ns = 450_000;
        r.mem
            .write_obj(Plain(hist), GuestAddress(MB + offset::PAUSES as u64))
            .unwrap();
        r.mem
            .write_obj(Plain(report), GuestAddress(MB + offset::REPORT as u64))
            .unwrap();
        r.call(op::PHASE_END, [0; 4]).unwrap();
        assert_eq!(
            r.event(),
            EventKind::Pauses {
                slot: 2,
                histogram: Box::new(hist)
            }
        );
        match r.event() {
            EventKind::PhaseEnd { report: got, .. } => assert_eq!(*got, report),
            e => panic!("unexpected {e:?}"),
        }
        // Other phases send no histogram.
        r.call(op::PHASE_BEGIN, [u64::from(phase::FILL), 0, 0, 0])
            .unwrap();
        r.event();
        let fill = PhaseReport {
            phase: phase::FILL,
            ..Default::default()
        };
        r.mem
            .write_obj(Plain(fill), GuestAddress(MB + offset::REPORT as u64))
            .unwrap();
        r.call(op::PHASE_END, [0; 4]).unwrap();
        assert!(matches!(r.event(), EventKind::PhaseEnd { .. }));
    }

    #[test]
    fn a_whole_session_gives_events_in_order() {
        let mut r = rig(params());
        r.register(MB).unwrap();
        r.call(op::HELLO, [ABI_VERSION, 0, 0, 0]).unwrap();
        assert_eq!(r.event(), EventKind::Hello);
        r.call(op::PHASE_BEGIN, [u64::from(phase::FILL), 0, 0, 0])
            .unwrap();
        assert_eq!(
            r.event(),
            EventKind::PhaseBegin {
                phase: phase::FILL,
                slot: 0,
                arg: 0
            }
        );
        r.call(op::PROGRESS, [u64::from(phase::FILL), 10, 150, 0])
            .unwrap();
        assert_eq!(
            r.event(),
            EventKind::Progress {
                phase: phase::FILL,
                done: 10,
                total: 150
            }
        );
        thread::sleep(Duration::from_millis(5));
        let report = PhaseReport {
            phase: phase::FILL,
            pages: 150,
            bytes: 150 * 4096,
            zero_pages: 3,
            first_mismatch: NO_MISMATCH,
            ..Default::default()
        };
        r.mem
            .write_obj(Plain(report), GuestAddress(MB + offset::REPORT as u64))
            .unwrap();
        r.call(op::PHASE_END, [0; 4]).unwrap();
        match r.event() {
            EventKind::PhaseEnd {
                report: got,
                elapsed,
            } => {
                assert_eq!(*got, report);
                assert!(elapsed >= Duration::from_millis(5));
            }
            e => panic!("unexpected {e:?}"),
        }
        let text = "héllo";
        r.mem
            .write_slice(text.as_bytes(), GuestAddress(MB + offset::LOG as u64))
            .unwrap();
        r.mem
            .write_obj(text.len() as u64, GuestAddress(MB + offset::LOG_LEN as u64))
            .unwrap();
        r.call(op::LOG, [0; 4]).unwrap();
        assert_eq!(r.event(), EventKind::Log(text.into()));
        assert_eq!(
            r.call(op::EXIT, [u64::from(exit_code::MISMATCH), 0, 0, 0])
                .unwrap(),
            DeviceAction::Exit(1)
        );
        assert_eq!(r.event(), EventKind::Exit { status: 1 });
        assert_eq!(r.status(), status::OK);
    }

    #[test]
    fn clock_is_monotonic_host_time() {
        let mut r = rig(params());
        r.register(MB).unwrap();
        r.call(op::CLOCK, [0; 4]).unwrap();
        let a: u64 = r.mem.read_obj(GuestAddress(MB)).unwrap();
        thread::sleep(Duration::from_millis(2));
        r.call(op::CLOCK, [0; 4]).unwrap();
        let b: u64 = r.mem.read_obj(GuestAddress(MB)).unwrap();
        assert!(b >= a + 2_000_000);
    }

    #[test]
    fn sleep_and_wait_block_and_report_status() {
        let mut r = rig(params());
        r.register(MB).unwrap();
        let t = Instant::now();
        r.call(op::SLEEP, [20, 0, 0, 0]).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!(r.status(), status::OK);
        // Gate 0 not released: times out.
        r.call(op::WAIT_HOST, [10, 0, 0, 0]).unwrap();
        assert_eq!(r.status(), status::TIMED_OUT);
        // Gate 1: released from another thread while we block without limit.
        let c = r.control.clone();
        let releaser = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            c.release_gate();
            c.release_gate();
        });
        r.call(op::WAIT_HOST, [0; 4]).unwrap();
        assert_eq!(r.status(), status::OK);
        releaser.join().unwrap();
        // Stop wakes a long sleep and every later op says STOPPED.
        let c = r.control.clone();
        let stopper = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            c.stop();
        });
        let t = Instant::now();
        r.call(op::SLEEP, [60_000, 0, 0, 0]).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(r.status(), status::STOPPED);
        stopper.join().unwrap();
        r.call(op::PROGRESS, [1, 1, 1, 0]).unwrap();
        assert_eq!(r.status(), status::STOPPED);
    }

    #[test]
    fn guest_mistakes_are_errors_not_panics() {
        let mut r = rig(params());
        assert!(matches!(
            r.out(ports::DOORBELL, op::HELLO),
            Err(Error::NoMailbox)
        ));
        assert_eq!(r.status(), status::ERROR);
        assert!(matches!(r.register(MB + 4), Err(Error::BadMailbox(a)) if a == MB + 4));
        assert!(
            matches!(r.register(0xfff80), Err(Error::BadMailbox(_))),
            "mailbox must fit in RAM"
        );
        assert!(matches!(
            r.register(0x1_0000_1000),
            Err(Error::BadMailbox(_))
        ));
        assert!(matches!(
            r.dev.pio_write(ports::DOORBELL, &[1]),
            Err(Error::BadAccess { len: 1, .. })
        ));
        assert!(matches!(r.out(ports::STATUS, 0), Err(Error::BadPort(p)) if p == ports::STATUS));
        r.register(MB).unwrap();
        assert!(matches!(r.call(99, [0; 4]), Err(Error::UnknownOp(99))));
        assert!(matches!(
            r.call(op::HELLO, [7, 0, 0, 0]),
            Err(Error::AbiVersion(7))
        ));
        r.mem
            .write_obj(
                LOG_CAPACITY as u64 + 1,
                GuestAddress(MB + offset::LOG_LEN as u64),
            )
            .unwrap();
        assert!(matches!(r.call(op::LOG, [0; 4]), Err(Error::BadLog(_))));
        let report = PhaseReport {
            phase: phase::VERIFY,
            ..Default::default()
        };
        r.mem
            .write_obj(Plain(report), GuestAddress(MB + offset::REPORT as u64))
            .unwrap();
        assert!(matches!(
            r.call(op::PHASE_END, [0; 4]),
            Err(Error::PhaseMismatch {
                begun: None,
                ended: 3
            })
        ));

        let mut bad = params();
        bad.magic = 0;
        let mut r = rig(bad);
        r.register(MB).unwrap();
        let e = r.call(op::GET_PARAMS, [0; 4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "workload parameters rejected: bad params magic 0x0"
        );
    }
}
