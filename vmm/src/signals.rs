//! SIGINT, SIGTERM and SIGHUP: recorded by an async-signal-safe handler
//! that also wakes the event loop through an eventfd; the loop then stops
//! every VM (SIGINT, SIGTERM; SIGHUP too unless the process is a daemon,
//! which ignores it: see `Runner::run`).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

use vmm_sys_util::eventfd::EventFd;

static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// A SIGHUP arrived since [`take_hangup`] last looked: kept apart from
/// [`RECEIVED`] so that a daemon ignoring it still sees a later SIGTERM.
static HANGUP: AtomicBool = AtomicBool::new(false);
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    if sig == libc::SIGHUP {
        HANGUP.store(true, Ordering::SeqCst);
    } else {
        RECEIVED.store(sig, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; the buffer is a live local.
        unsafe {
            libc::write(fd, &one as *const u64 as *const libc::c_void, 8);
        }
    }
}

/// The eventfd the handlers write to, once installed.
static WAKE: OnceLock<Arc<EventFd>> = OnceLock::new();

/// Installs the handlers (once per process: later calls return the same
/// eventfd); returns the eventfd they write to. A daemon installs them
/// first thing, so that a signal that arrives while it sets up is acted
/// on once its event loop runs. The eventfd lives for the rest of the
/// process (the handler may fire any time).
pub fn install() -> std::io::Result<Arc<EventFd>> {
    if let Some(evt) = WAKE.get() {
        return Ok(evt.clone());
    }
    let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
    let evt = WAKE.get_or_init(|| evt).clone();
    WAKE_FD.store(evt.as_raw_fd(), Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        vmm_sys_util::signal::register_signal_handler(sig, on_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    // One that arrived before the loop watches the eventfd: wake it.
    if received() != 0 || HANGUP.load(Ordering::SeqCst) {
        let _ = evt.write(1);
    }
    Ok(evt)
}

/// The stopping signal received (SIGINT or SIGTERM), if any (0 = none).
pub fn received() -> i32 {
    RECEIVED.load(Ordering::SeqCst)
}

/// Whether a SIGHUP arrived since the previous call.
pub fn take_hangup() -> bool {
    HANGUP.swap(false, Ordering::SeqCst)
}

/// What SIGHUP reopens (the binary's log file): run by the event loop on
/// the main thread, never in the signal handler. Returns whether it had
/// something to reopen.
static HANGUP_HOOK: OnceLock<fn() -> bool> = OnceLock::new();

/// Sets the SIGHUP hook (once per process).
pub fn set_hangup_hook(hook: fn() -> bool) {
    let _ = HANGUP_HOOK.set(hook);
}

/// Runs the SIGHUP hook, if any; whether it reopened something.
pub fn run_hangup_hook() -> bool {
    HANGUP_HOOK.get().is_some_and(|h| h())
}

/// The conventional exit code for death by `sig`.
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}

pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// The number of a signal [`name`] names (SIGTERM for any other).
pub fn number(name: &str) -> i32 {
    match name {
        "SIGINT" => libc::SIGINT,
        "SIGHUP" => libc::SIGHUP,
        _ => libc::SIGTERM,
    }
}
