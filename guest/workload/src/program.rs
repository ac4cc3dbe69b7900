//! Start-up handshake and the phase program.

use crate::build::BuildFailure;
use crate::host;
use crate::phases::{cycles_since, DiskFailure, Stopped, Workload};
use crate::store::Store;
use crate::{clock::rdtsc, log};
use pagefold_guest_abi::classes::DataLayout;
use pagefold_guest_abi::mailbox::{exit_code, status, PhaseReport, NO_MISMATCH};
use pagefold_guest_abi::pause::PauseHistogram;
use pagefold_guest_abi::{phase, Placement};

/// Runs the whole workload; returns the exit code.
pub fn run() -> u32 {
    host::register();
    let params = host::get_params();
    let layout = match DataLayout::new(&params) {
        Ok(l) => l,
        Err(e) => {
            log!("workload: rejecting params: {}", e);
            return exit_code::BAD_PARAMS;
        }
    };
    if host::stopped(host::hello()) {
        return exit_code::STOPPED;
    }
    if let Placement::Scattered { extent_pages, seed } = layout.placement {
        log!(
            "workload: scattered placement, extents of {} pages, seed {:#x}",
            extent_pages,
            seed
        );
    }
    let store = Store::init(&params, layout);
    let mut w = Workload::new(params, store);
    let mut mismatches = 0u64;
    for (slot, op, arg) in params.phases() {
        if host::stopped(host::phase_begin(op, slot, arg)) {
            return exit_code::STOPPED;
        }
        let start = rdtsc();
        let result = match op {
            phase::FILL => w.fill(slot),
            phase::CHURN => w.churn(slot, if arg == 0 { params.churn_ms } else { arg }),
            phase::VERIFY => w.verify(slot),
            phase::REWRITE => w.rewrite(slot),
            phase::SLEEP => idle(op, slot, host::sleep_ms(arg)),
            phase::WAIT_HOST => idle(op, slot, host::wait_host(arg)),
            phase::FAULT => fault(),
            phase::BAD_PORT_WRITE => bad_port(),
            phase::DISK_READ => match w.disk_read(slot, arg) {
                Ok(r) => Ok(r),
                Err(DiskFailure::Stopped) => Err(Stopped),
                Err(DiskFailure::Disk(e)) => {
                    log!("disk-read: {}", e);
                    return exit_code::DISK_ERROR;
                }
            },
            phase::LATENCY | phase::LATENCY_WRITE => {
                let mut hist = PauseHistogram::ZERO;
                let r = w.latency(slot, arg, op == phase::LATENCY_WRITE, &mut hist);
                if r.is_ok() {
                    host::set_pauses(&hist);
                }
                r
            }
            phase::PROBE_MERGE => w.probe_merge(slot, arg),
            phase::BUILD => match w.build(slot, arg) {
                Ok(r) => Ok(r),
                Err(BuildFailure::Stopped) => Err(Stopped),
                Err(e) => {
                    log!("build: {}", e);
                    return exit_code::DISK_ERROR;
                }
            },
            // DataLayout::new rejected every other opcode.
            _ => unreachable!(),
        };
        let mut r = match result {
            Ok(r) => r,
            Err(Stopped) => return exit_code::STOPPED,
        };
        r.tsc_cycles = cycles_since(start);
        mismatches += r.mismatches;
        if host::stopped(host::phase_end(&r)) {
            return exit_code::STOPPED;
        }
    }
    if mismatches == 0 {
        exit_code::OK
    } else {
        exit_code::MISMATCH
    }
}

/// FAULT: an invalid opcode with no IDT: a triple fault ends the VM.
fn fault() -> ! {
    // SAFETY: deliberately raises #UD; the VM stops (no handler exists).
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}

/// BAD_PORT_WRITE: a write to a port nothing decodes; the VMM stops the VM.
/// Should it return anyway, report the phase as done.
fn bad_port() -> Result<PhaseReport, Stopped> {
    // SAFETY: port I/O at CPL3 with IOPL 3 exits to the VMM; no memory is touched.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") phase::BAD_PORT, in("eax") 0xdead_u32, options(nomem, nostack));
    }
    Ok(PhaseReport {
        phase: phase::BAD_PORT_WRITE,
        first_mismatch: NO_MISMATCH,
        ..PhaseReport::default()
    })
}

/// Report of SLEEP/WAIT_HOST given the status of the host call.
fn idle(op: u32, slot: usize, st: u32) -> Result<PhaseReport, Stopped> {
    if host::stopped(st) {
        return Err(Stopped);
    }
    if st == status::TIMED_OUT {
        log!("{}: timed out", phase::name(op));
    }
    Ok(PhaseReport {
        phase: op,
        slot: slot as u32,
        first_mismatch: NO_MISMATCH,
        ..PhaseReport::default()
    })
}
