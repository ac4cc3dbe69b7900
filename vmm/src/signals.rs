//! SIGINT/SIGTERM: recorded by an async-signal-safe handler that also wakes
//! the event loop through an eventfd; the loop then stops every VM.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    RECEIVED.store(sig, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; the buffer is a live local.
        unsafe {
            libc::write(fd, &one as *const u64 as *const libc::c_void, 8);
        }
    }
}

/// Installs the handlers; returns the eventfd they write to. The eventfd is
/// kept alive for the rest of the process (the handler may fire any time).
pub fn install() -> std::io::Result<Arc<EventFd>> {
    let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
    WAKE_FD.store(evt.as_raw_fd(), Ordering::SeqCst);
    std::mem::forget(evt.clone());
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(evt)
}

/// The signal received, if any (0 = none).
pub fn received() -> i32 {
    RECEIVED.load(Ordering::SeqCst)
}

/// The conventional exit code for death by `sig`.
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}

pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}
