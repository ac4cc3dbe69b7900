//! The guest side of the workload control device: port I/O and the mailbox.

use core::arch::asm;
use core::cell::UnsafeCell;
use core::ptr::{addr_of, addr_of_mut};
use pagefold_guest_abi::mailbox::{op, status, Mailbox, PhaseReport, ABI_VERSION, LOG_CAPACITY};
use pagefold_guest_abi::pause::PauseHistogram;
use pagefold_guest_abi::{ports, WorkloadParams};

/// The one mailbox, in .bss (GPA == VA: its address is what the host uses).
struct MailboxCell(UnsafeCell<Mailbox>);

// SAFETY: the guest has one vCPU and no interrupts; only this module touches
// the cell, never re-entrantly (the host runs while the guest is stopped).
unsafe impl Sync for MailboxCell {}

static MAILBOX: MailboxCell = MailboxCell(UnsafeCell::new(Mailbox::ZERO));

fn mailbox() -> *mut Mailbox {
    MAILBOX.0.get()
}

fn out32(port: u16, value: u32) {
    // SAFETY: RFLAGS.IOPL = 3 lets CPL3 do port I/O; the access exits to the
    // VMM. No `nomem`: the host reads the mailbox, so writes before this
    // instruction must be in memory.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nostack, preserves_flags))
    };
}

fn in32(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as out32; the host may have written the mailbox (no `nomem`).
    unsafe { asm!("in eax, dx", out("eax") v, in("dx") port, options(nostack, preserves_flags)) };
    v
}

/// Registers the mailbox with the device (once, at start).
pub fn register() {
    let addr = mailbox() as u64;
    out32(ports::MAILBOX_LO, addr as u32);
    out32(ports::MAILBOX_HI, (addr >> 32) as u32);
}

/// Runs `op` with `args`; returns the status register.
fn call(opcode: u32, args: [u64; 4]) -> u32 {
    // SAFETY: the mailbox is only accessed here, single-threaded; volatile so
    // that the stores are not elided (the host reads them through the exit).
    unsafe { addr_of_mut!((*mailbox()).args).write_volatile(args) };
    out32(ports::DOORBELL, opcode);
    in32(ports::STATUS)
}

/// Fetches the parameters.
pub fn get_params() -> WorkloadParams {
    call(op::GET_PARAMS, [0; 4]);
    // SAFETY: the host wrote the params during the exit; volatile read.
    unsafe { addr_of!((*mailbox()).params).read_volatile() }
}

pub fn hello() -> u32 {
    call(op::HELLO, [ABI_VERSION, 0, 0, 0])
}

pub fn phase_begin(phase: u32, slot: usize, arg: u64) -> u32 {
    call(op::PHASE_BEGIN, [u64::from(phase), slot as u64, arg, 0])
}

pub fn phase_end(report: &PhaseReport) -> u32 {
    // SAFETY: as in `call`.
    unsafe { addr_of_mut!((*mailbox()).report).write_volatile(*report) };
    call(op::PHASE_END, [0; 4])
}

/// Puts a LATENCY phase's histogram in the mailbox (before its PHASE_END).
pub fn set_pauses(h: &PauseHistogram) {
    // SAFETY: as in `call`.
    unsafe { addr_of_mut!((*mailbox()).pauses).write_volatile(*h) };
}

pub fn progress(phase: u32, done: u64, total: u64) -> u32 {
    call(op::PROGRESS, [u64::from(phase), done, total, 0])
}

pub fn sleep_ms(ms: u64) -> u32 {
    call(op::SLEEP, [ms, 0, 0, 0])
}

pub fn wait_host(max_ms: u64) -> u32 {
    call(op::WAIT_HOST, [max_ms, 0, 0, 0])
}

/// Host monotonic time in ns (a VM exit; for when there is no TSC rate).
pub fn clock_ns() -> u64 {
    call(op::CLOCK, [0; 4]);
    // SAFETY: the host wrote args[0] during the exit.
    unsafe { addr_of!((*mailbox()).args[0]).read_volatile() }
}

/// Sends a log line (truncated to LOG_CAPACITY bytes).
pub fn log_bytes(text: &[u8]) {
    let n = text.len().min(LOG_CAPACITY);
    // SAFETY: as in `call`; n <= LOG_CAPACITY.
    unsafe {
        let log = addr_of_mut!((*mailbox()).log) as *mut u8;
        for (i, &b) in text[..n].iter().enumerate() {
            log.add(i).write_volatile(b);
        }
        addr_of_mut!((*mailbox()).log_len).write_volatile(n as u64);
    }
    call(op::LOG, [0; 4]);
}

/// Tells the host we are done. The VMM stops the vCPU; if it ever resumes
/// us, ask again, then fault (which the VMM reports as a triple fault).
pub fn exit(code: u32) -> ! {
    for _ in 0..3 {
        call(op::EXIT, [u64::from(code), 0, 0, 0]);
    }
    // SAFETY: ud2 only raises #UD; with no IDT that ends the VM.
    unsafe { asm!("ud2", options(noreturn)) }
}

/// True if a status asks the guest to stop.
pub fn stopped(st: u32) -> bool {
    st == status::STOPPED || st == status::ERROR
}

/// A fixed buffer for formatting log lines.
pub struct LogBuf {
    buf: [u8; LOG_CAPACITY],
    len: usize,
}

impl LogBuf {
    pub const fn new() -> Self {
        Self {
            buf: [0; LOG_CAPACITY],
            len: 0,
        }
    }

    pub fn send(&self) {
        log_bytes(&self.buf[..self.len]);
    }
}

impl core::fmt::Write for LogBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(LOG_CAPACITY - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Formats and sends a log line.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {{
        let mut b = $crate::host::LogBuf::new();
        let _ = core::fmt::Write::write_fmt(&mut b, format_args!($($arg)*));
        b.send();
    }};
}
