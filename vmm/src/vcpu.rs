//! vCPU threads: create and configure a vCPU, then run it and dispatch its
//! exits to the VM's buses until the VM stops.

use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;

use kvm_ioctls::{VcpuExit, VcpuFd};
use pagefold_devices::bus::Bus;

use crate::state::{Outcome, VmShared};

/// Errors of vCPU threads.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("spawning vCPU thread: {0}")]
    Spawn(std::io::Error),
    #[error("registering the vCPU kick signal: {0}")]
    Signal(vmm_sys_util::errno::Error),
}

/// A device reached through port I/O that can end the VM (the workload
/// control device): `write` returns `Some(status)` when the guest exits.
pub trait ControlPort: Send {
    fn write(&mut self, port: u16, data: &[u8]) -> Result<Option<u32>, String>;
    fn read(&mut self, port: u16, data: &mut [u8]) -> Result<(), String>;
}

/// A control device on the port bus: (first port, number of ports, device).
pub type ControlPortRange = (u16, u16, Arc<Mutex<dyn ControlPort>>);

/// Everything a vCPU thread dispatches exits to.
#[derive(Clone)]
pub struct ExitContext {
    pub shared: Arc<VmShared>,
    pub pio: Bus,
    pub mmio: Bus,
    pub control: Option<ControlPortRange>,
    /// Treat accesses to unclaimed ports/addresses as guest errors (workload
    /// guests) instead of ignoring them (Linux probes legacy hardware).
    pub strict_io: bool,
}

/// The signal used to kick vCPU threads out of KVM_RUN.
pub fn kick_signal() -> i32 {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn noop_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) kick handler once per process: its only job is to
/// make KVM_RUN return EINTR.
pub fn install_kick_handler() -> Result<(), Error> {
    static ONCE: Once = Once::new();
    let mut res = Ok(());
    ONCE.call_once(|| {
        res = vmm_sys_util::signal::register_signal_handler(kick_signal(), noop_handler);
    });
    res.map_err(Error::Signal)
}

/// What the exit loop should do next.
enum Next {
    Continue,
    Stop(Outcome),
    /// A guest error whose message should name the vCPU's RIP (read once
    /// the exit no longer borrows the vCPU).
    StopAtRip(&'static str),
}

fn describe_io(dir: &str, port: u64, data: &[u8]) -> String {
    let mut v = [0u8; 8];
    let n = data.len().min(8);
    v[..n].copy_from_slice(&data[..n]);
    format!(
        "unexpected {dir} at {port:#x} ({} bytes, value {:#x})",
        data.len(),
        u64::from_le_bytes(v)
    )
}

fn handle_exit(ctx: &ExitContext, exit: VcpuExit<'_>) -> Next {
    match exit {
        VcpuExit::IoOut(port, data) => {
            if let Some((base, len, dev)) = &ctx.control {
                if port >= *base && port < base + len {
                    let r = dev
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .write(port, data);
                    return match r {
                        Ok(None) => Next::Continue,
                        Ok(Some(status)) => Next::Stop(Outcome::GuestExit { status }),
                        Err(message) => Next::Stop(Outcome::GuestError { message }),
                    };
                }
            }
            if !ctx.pio.write(u64::from(port), data) && ctx.strict_io {
                return Next::Stop(Outcome::GuestError {
                    message: describe_io("port write", u64::from(port), data),
                });
            }
            Next::Continue
        }
        VcpuExit::IoIn(port, data) => {
            if let Some((base, len, dev)) = &ctx.control {
                if port >= *base && port < base + len {
                    let r = dev
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .read(port, data);
                    return match r {
                        Ok(()) => Next::Continue,
                        Err(message) => Next::Stop(Outcome::GuestError { message }),
                    };
                }
            }
            if !ctx.pio.read(u64::from(port), data) {
                data.fill(0xff);
                if ctx.strict_io {
                    return Next::Stop(Outcome::GuestError {
                        message: describe_io("port read", u64::from(port), data),
                    });
                }
            }
            Next::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            if !ctx.mmio.read(addr, data) {
                data.fill(0xff);
                if ctx.strict_io {
                    return Next::Stop(Outcome::GuestError {
                        message: describe_io("MMIO read", addr, data),
                    });
                }
            }
            Next::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !ctx.mmio.write(addr, data) && ctx.strict_io {
                return Next::Stop(Outcome::GuestError {
                    message: describe_io("MMIO write", addr, data),
                });
            }
            Next::Continue
        }
        VcpuExit::Hlt => Next::Stop(Outcome::GuestPowerOff),
        VcpuExit::Shutdown => Next::StopAtRip("triple fault (KVM_EXIT_SHUTDOWN)"),
        VcpuExit::SystemEvent(kind, _) => match kind {
            kvm_bindings::KVM_SYSTEM_EVENT_RESET => Next::Stop(Outcome::GuestReset),
            kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => Next::Stop(Outcome::GuestPowerOff),
            other => Next::Stop(Outcome::GuestError {
                message: format!("system event {other}"),
            }),
        },
        VcpuExit::FailEntry(reason, cpu) => Next::Stop(Outcome::VmmError {
            message: format!(
                "KVM_EXIT_FAIL_ENTRY: hardware entry failure reason {reason:#x} on CPU {cpu}"
            ),
        }),
        VcpuExit::InternalError => Next::StopAtRip(INTERNAL_ERROR),
        VcpuExit::Intr => Next::Continue,
        other => Next::Stop(Outcome::GuestError {
            message: format!("unhandled vCPU exit {other:?}"),
        }),
    }
}

/// Describes KVM_EXIT_INTERNAL_ERROR. On hosts without VMX/SVM (PVM), KVM's
/// instruction emulator runs CPL0 guest code and gives up on instructions it
/// does not know: that is this exit's usual cause here.
const INTERNAL_ERROR: &str = "KVM internal error (KVM_EXIT_INTERNAL_ERROR): KVM could not \
     run or emulate the guest's instruction (on a host without VMX/SVM, such as PVM, kernel-mode \
     guest code is emulated and such a stop is expected)";

/// What KVM said about a failed KVM_RUN (EFAULT or EHWPOISON): since
/// Linux 6.8 it describes an unresolvable guest memory access in
/// `kvm_run` (`KVM_EXIT_MEMORY_FAULT`); with the RIP, that says which guest
/// page and access the VM stopped on. Empty for other errors, whose
/// `exit_reason` is stale.
fn memory_fault(vcpu: &mut VcpuFd, errno: i32) -> String {
    if errno != libc::EFAULT && errno != libc::EHWPOISON {
        return String::new();
    }
    let run = vcpu.get_kvm_run();
    let fault = (run.exit_reason == kvm_bindings::KVM_EXIT_MEMORY_FAULT).then(|| {
        // SAFETY: KVM filled the `memory_fault` member of the exit union,
        // as `exit_reason` says; it is plain integers.
        let m = unsafe { run.__bindgen_anon_1.memory_fault };
        format!(
            " (memory fault at guest-physical {:#x}, {} bytes, flags {:#x})",
            m.gpa, m.size, m.flags
        )
    });
    let rip = vcpu
        .get_regs()
        .map(|r| format!(" at RIP {:#x}", r.rip))
        .unwrap_or_default();
    format!("{}{rip}", fault.unwrap_or_default())
}

/// Runs `vcpu` until the VM stops. Never panics the process on guest or KVM
/// trouble: every failure becomes the VM's outcome.
fn run_loop(mut vcpu: VcpuFd, ctx: ExitContext) {
    while ctx.shared.vcpu_checkpoint() {
        if !ctx.shared.enter_guest() {
            continue;
        }
        let run = vcpu.run();
        ctx.shared.leave_guest();
        let next = match run {
            Ok(exit) => handle_exit(&ctx, exit),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Next::Continue,
            Err(e) => Next::Stop(Outcome::VmmError {
                message: format!("KVM_RUN failed: {e}{}", memory_fault(&mut vcpu, e.errno())),
            }),
        };
        match next {
            Next::Continue => {}
            Next::Stop(why) => {
                ctx.shared.request_stop(why);
                break;
            }
            Next::StopAtRip(what) => {
                let (rip, rsp, rflags) = vcpu
                    .get_regs()
                    .map(|r| (r.rip, r.rsp, r.rflags))
                    .unwrap_or_default();
                let cpl = vcpu.get_sregs().map(|s| s.cs.selector & 3).unwrap_or(0);
                ctx.shared.request_stop(Outcome::GuestError {
                    message: format!(
                        "{what}, at RIP {rip:#x} (RSP {rsp:#x}, RFLAGS {rflags:#x}, CPL {cpl})"
                    ),
                });
                break;
            }
        }
    }
}

/// Spawns a thread running `vcpu`.
pub fn spawn(
    name: String,
    vcpu: VcpuFd,
    ctx: ExitContext,
    affinity: Option<Vec<usize>>,
) -> Result<JoinHandle<()>, Error> {
    let shared = ctx.shared.clone();
    shared.vcpu_started();
    let r = std::thread::Builder::new().name(name).spawn(move || {
        let shared = ctx.shared.clone();
        // The thread's own set-up: its CPUs, then its filter.
        let set_up = || -> Result<(), String> {
            if let Some(cpus) = &affinity {
                crate::affinity::pin_current_thread(cpus)
                    .map_err(|e| format!("vCPU affinity: {e}"))?;
            }
            crate::seccomp::install(crate::seccomp::ThreadKind::Vcpu).map_err(|e| e.to_string())
        };
        if let Err(message) = set_up() {
            shared.request_stop(Outcome::VmmError { message });
            shared.vcpu_exited();
            return;
        }
        // Nothing below should panic, but if it does, the VM must still stop
        // and the process must learn about it.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_loop(vcpu, ctx)));
        if r.is_err() {
            shared.request_stop(Outcome::VmmError {
                message: "vCPU thread panicked".into(),
            });
        }
        shared.vcpu_exited();
    });
    r.map_err(|e| {
        shared.vcpu_exited();
        Error::Spawn(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_descriptions_are_readable() {
        assert_eq!(
            describe_io("port write", 0x1234, &[0x78, 0x56]),
            "unexpected port write at 0x1234 (2 bytes, value 0x5678)"
        );
    }
}
