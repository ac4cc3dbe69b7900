//! Host stdin to one VM's serial port: the event loop reads stdin and queues
//! the bytes in the guest's UART. When stdin is a terminal it is put in raw
//! mode (so keys reach the guest as typed) and restored when the guard drops.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use pagefold_devices::serial::SerialDevice;
use vmm_sys_util::epoll::EventSet;

const STDIN: RawFd = 0;

/// Forwards stdin to a serial device.
pub struct StdinForwarder {
    serial: Arc<Mutex<SerialDevice>>,
    vm: String,
}

impl StdinForwarder {
    pub fn new(vm: &str, serial: Arc<Mutex<SerialDevice>>) -> Self {
        Self {
            serial,
            vm: vm.to_string(),
        }
    }
}

impl MutEventSubscriber for StdinForwarder {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let mut buf = [0u8; 256];
        // SAFETY: reads into a live local buffer of the stated length.
        let n = unsafe { libc::read(STDIN, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 || events.event_set().contains(EventSet::HANG_UP) {
            // End of input (or an error): stop watching stdin.
            let _ = ops.remove(Events::empty_raw(STDIN));
            return;
        }
        let n = n as usize;
        let queued = self
            .serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .enqueue_input(&buf[..n]);
        if queued < n {
            log::debug!(
                "VM {}: serial input FIFO full, {} bytes dropped",
                self.vm,
                n - queued
            );
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new_raw(STDIN, EventSet::IN)) {
            // Regular files and /dev/null cannot be polled: no input then.
            log::debug!(
                "stdin is not pollable ({e}); no serial input for VM {}",
                self.vm
            );
        }
    }
}

/// True when stdin can be polled for input (a terminal, pipe or socket).
pub fn stdin_is_pollable() -> bool {
    // SAFETY: libc::stat is plain old data, for which all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on fd 0 writes only into the valid local struct.
    if unsafe { libc::fstat(STDIN, &mut st) } != 0 {
        return false;
    }
    let fmt = st.st_mode & libc::S_IFMT;
    // SAFETY: isatty has no memory-safety preconditions.
    let tty = unsafe { libc::isatty(STDIN) } == 1;
    tty || fmt == libc::S_IFIFO || fmt == libc::S_IFSOCK
}

/// Puts a terminal stdin in raw mode; restores it on drop.
pub struct RawTerminal(Option<libc::termios>);

impl RawTerminal {
    pub fn enable() -> Self {
        // SAFETY: isatty has no memory-safety preconditions.
        if unsafe { libc::isatty(STDIN) } != 1 {
            return RawTerminal(None);
        }
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a valid termios struct.
        unsafe {
            let mut old: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(STDIN, &mut old) != 0 {
                return RawTerminal(None);
            }
            let mut raw = old;
            libc::cfmakeraw(&mut raw);
            // Keep output processing so host-side lines still end properly,
            // and keep ^C as SIGINT: it stops pagefold cleanly.
            raw.c_oflag = old.c_oflag;
            raw.c_lflag |= libc::ISIG;
            if libc::tcsetattr(STDIN, libc::TCSANOW, &raw) != 0 {
                return RawTerminal(None);
            }
            RawTerminal(Some(old))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: restores the attributes read in `enable`.
            unsafe {
                libc::tcsetattr(STDIN, libc::TCSANOW, old);
            }
        }
    }
}
