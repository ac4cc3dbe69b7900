//! Per-thread seccomp filters (seccompiler, Firecracker's compiler).
//!
//! Each kind of thread installs its own allow-list once its set-up is done
//! ([`install`]): vCPU threads, the API server thread, the dedup engine's
//! scanner and userfaultfd handler, the KSM backend's auto-mode driver, and
//! the main (event loop) thread. A
//! syscall outside the list traps (`SECCOMP_RET_TRAP`): the SIGSYS handler
//! writes `pagefold: seccomp: thread <name> made forbidden syscall <nr>
//! (<syscall>)` to stderr and ends the **whole process** with exit status
//! [`EXIT_CODE`] (128 + SIGSYS). Killing only the thread would leave its VM
//! or the engine in an undefined state (a lock held forever, a vCPU that
//! never reports its exit), so the process goes, and says why.
//!
//! Filters stack: a thread spawned by a filtered thread (a vCPU of a VM
//! created through the API after the main thread's filter is in place, the
//! API's blocking-call threads, a KSM driver started by an API request)
//! inherits its parent's filter and adds its own, so a parent's filter
//! allows everything such children need (unit tests check each pair).
//!
//! The main thread has two filters. VM creation (KVM's ioctls, guest memory
//! memfds, new threads, `seccomp` for their own filters: [`VM_CREATE`])
//! happens on it, but only while it sets up, unless the API is on (a
//! `PUT /vms/NAME` is served on the main thread at any time). So a main
//! thread with no API installs [`ThreadKind::Main`], the event loop and
//! teardown only; one with the API installs [`ThreadKind::MainCreatesVms`],
//! which adds [`VM_CREATE`].
//!
//! The process-wide switch ([`configure`]) is set once by the CLI before any
//! thread starts; the library default is off (unit tests, benchmarks).
//! Debugging: `--no-seccomp` (or `seccomp = false` in the config) turns the
//! filters off; `PAGEFOLD_SECCOMP_LOG=<file>` keeps them on but makes a
//! forbidden syscall fail with `ENOSYS` after logging it to `<file>` (and
//! stderr) instead of ending the process, to collect what is missing.
//! `PAGEFOLD_SECCOMP_SELFTEST=vcpu|api|engine|fault|ksm|main` (tests) makes
//! that thread issue a forbidden syscall right after installing its filter.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Errors building or installing a filter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("seccomp: building the {thread} filter: {source}")]
    Build {
        thread: &'static str,
        source: seccompiler::BackendError,
    },
    #[error("seccomp: installing the {thread} filter: {source}")]
    Install {
        thread: &'static str,
        source: seccompiler::Error,
    },
    #[error("seccomp: installing the SIGSYS handler: {0}")]
    Handler(std::io::Error),
    #[error("seccomp: opening the log file {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
}

/// Exit status of a process that made a forbidden syscall: 128 + SIGSYS,
/// as a shell reports a process killed by SIGSYS.
pub const EXIT_CODE: i32 = 128 + libc::SIGSYS;

/// The kinds of threads with a filter of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// `KVM_RUN` and exit dispatch (devices run here).
    Vcpu,
    /// The HTTP API server (tokio) and its blocking-call threads.
    Api,
    /// The dedup engine's scanner (scans, merges, KSM assist, auto mode).
    Engine,
    /// The dedup engine's userfaultfd handler.
    Fault,
    /// The KSM backend's auto-mode driver (KSM's sysfs knobs, `/proc`).
    Ksm,
    /// The main thread's event loop and VM teardown, in a process that
    /// creates no VM after set-up (no API).
    Main,
    /// The main thread's event loop when the API may ask it to create VMs
    /// at any time: [`ThreadKind::Main`] plus [`VM_CREATE`].
    MainCreatesVms,
}

/// Every kind, for the self-test's name lookup and the unit tests.
const ALL_KINDS: [ThreadKind; 7] = [
    ThreadKind::Vcpu,
    ThreadKind::Api,
    ThreadKind::Engine,
    ThreadKind::Fault,
    ThreadKind::Ksm,
    ThreadKind::Main,
    ThreadKind::MainCreatesVms,
];

impl ThreadKind {
    /// The thread's role, as `PAGEFOLD_SECCOMP_SELFTEST` and errors name
    /// it (both main filters are the "main" thread).
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Api => "api",
            ThreadKind::Engine => "engine",
            ThreadKind::Fault => "fault",
            ThreadKind::Ksm => "ksm",
            ThreadKind::Main | ThreadKind::MainCreatesVms => "main",
        }
    }

    /// The main thread's filter: with [`VM_CREATE`] if VMs may be created
    /// after set-up (the API is on).
    pub fn main(creates_vms: bool) -> ThreadKind {
        if creates_vms {
            ThreadKind::MainCreatesVms
        } else {
            ThreadKind::Main
        }
    }

    fn from_name(s: &str) -> Option<ThreadKind> {
        ALL_KINDS.into_iter().find(|k| k.name() == s)
    }

    /// The self-test's key: one per name (1-based; 0 is "none").
    fn id(self) -> u8 {
        ThreadKind::from_name(self.name()).map_or(0, |k| k as u8 + 1)
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The log file's fd in log mode, -1 otherwise.
static LOG_FD: AtomicI32 = AtomicI32::new(-1);
/// `ThreadKind::id()` of the self-test thread, 0 for none.
static SELFTEST: AtomicU8 = AtomicU8::new(0);

thread_local! {
    /// The filtered thread's name, for the SIGSYS handler (no allocation
    /// there: a fixed buffer, NUL-padded).
    static THREAD_NAME: Cell<[u8; 32]> = const { Cell::new([0; 32]) };
}

/// Turns the filters on or off for the whole process (before any thread
/// starts) and installs the SIGSYS handler. Reads `PAGEFOLD_SECCOMP_LOG`
/// and `PAGEFOLD_SECCOMP_SELFTEST`.
pub fn configure(enabled: bool) -> Result<(), Error> {
    ENABLED.store(enabled, Ordering::SeqCst);
    if !enabled {
        return Ok(());
    }
    if let Some(path) = std::env::var_os("PAGEFOLD_SECCOMP_LOG").filter(|p| !p.is_empty()) {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| Error::Log {
                path: path.to_string_lossy().into_owned(),
                source,
            })?;
        LOG_FD.store(f.into_raw_fd(), Ordering::SeqCst);
    }
    if let Some(k) = std::env::var("PAGEFOLD_SECCOMP_SELFTEST")
        .ok()
        .as_deref()
        .and_then(ThreadKind::from_name)
    {
        SELFTEST.store(k.id(), Ordering::SeqCst);
    }
    install_handler()
}

/// Whether filters are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Installs `kind`'s filter on the calling thread (no-op when filters are
/// off), then runs the self-test if it names `kind`.
pub fn install(kind: ThreadKind) -> Result<(), Error> {
    if !enabled() {
        return Ok(());
    }
    let prog = program(kind)?;
    let name = std::thread::current()
        .name()
        .map(str::to_string)
        .unwrap_or_else(|| kind.name().to_string());
    let mut buf = [0u8; 32];
    let n = name.len().min(31);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    THREAD_NAME.with(|c| c.set(buf));
    seccompiler::apply_filter(&prog).map_err(|source| Error::Install {
        thread: kind.name(),
        source,
    })?;
    if SELFTEST.load(Ordering::SeqCst) == kind.id() {
        selftest(kind);
    }
    Ok(())
}

/// Makes a syscall `kind`'s filter forbids: `socket` on a vCPU thread,
/// `ptrace` elsewhere (both harmless were they allowed).
fn selftest(kind: ThreadKind) {
    let _ = std::io::stderr().write_all(
        format!(
            "pagefold: seccomp self-test: forbidden syscall on the {} thread\n",
            kind.name()
        )
        .as_bytes(),
    );
    if kind == ThreadKind::Vcpu {
        // SAFETY: socket() takes no pointers; a returned fd is closed.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        if fd >= 0 {
            // SAFETY: we own fd.
            unsafe { libc::close(fd) };
        }
    } else {
        // SAFETY: PTRACE_PEEKDATA of pid 0 reads nothing (ESRCH).
        unsafe { libc::ptrace(libc::PTRACE_PEEKDATA, 0, 0usize, 0usize) };
    }
}

/// SIGSYS handler: say which thread made which syscall, then end the
/// process (or, in log mode, make the syscall fail with ENOSYS).
extern "C" fn sigsys_handler(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // siginfo_t's _sigsys member: { void *call_addr; int syscall; u32 arch }
    // right after the three-int header and its padding (offset 16).
    // SAFETY: the kernel passes a valid siginfo_t for SIGSYS (SA_SIGINFO).
    let nr = unsafe { *(info as *const u8).add(24).cast::<i32>() };
    let name = THREAD_NAME.with(|c| c.get());
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let log_fd = LOG_FD.load(Ordering::Relaxed);
    let mut buf = [0u8; 160];
    let mut w = Buf {
        buf: &mut buf,
        len: 0,
    };
    w.put(b"pagefold: seccomp: thread ");
    w.put(if name_len == 0 {
        b"?"
    } else {
        &name[..name_len]
    });
    w.put(b" made forbidden syscall ");
    w.num(nr);
    if let Some(s) = syscall_name(nr) {
        w.put(b" (");
        w.put(s.as_bytes());
        w.put(b")");
    }
    if log_fd >= 0 {
        w.put(b"; log mode: it fails with ENOSYS");
    }
    w.put(b"\n");
    let len = w.len;
    // SAFETY: writing our own stack buffer to stderr / the log fd.
    unsafe { libc::write(2, buf.as_ptr().cast(), len) };
    if log_fd >= 0 {
        // SAFETY: as above; the log fd stays open for the process's life.
        unsafe { libc::write(log_fd, buf.as_ptr().cast(), len) };
        // SAFETY: ctx is the ucontext_t of the trapped syscall; RAX is its
        // return value once the handler returns.
        unsafe {
            let uc = ctx.cast::<libc::ucontext_t>();
            (*uc).uc_mcontext.gregs[libc::REG_RAX as usize] = -(libc::ENOSYS as i64);
        }
        return;
    }
    // SAFETY: _exit is async-signal-safe (exit_group is in every filter).
    unsafe { libc::_exit(EXIT_CODE) };
}

/// A fixed buffer writer (the handler must not allocate).
struct Buf<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Buf<'_> {
    fn put(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    fn num(&mut self, v: i32) {
        let mut digits = [0u8; 12];
        let mut i = digits.len();
        let mut x = i64::from(v).unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + (x % 10) as u8;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        if v < 0 {
            self.put(b"-");
        }
        self.put(&digits[i..]);
    }
}

fn install_handler() -> Result<(), Error> {
    // SAFETY: a zeroed sigaction is valid; we set the handler, flags and an
    // empty mask before passing it to sigaction.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = sigsys_handler as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut())
    };
    if r != 0 {
        return Err(Error::Handler(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Names of syscalls the message is likely to show.
fn syscall_name(nr: i32) -> Option<&'static str> {
    let names: &[(i64, &str)] = &[
        (libc::SYS_socket, "socket"),
        (libc::SYS_connect, "connect"),
        (libc::SYS_bind, "bind"),
        (libc::SYS_ptrace, "ptrace"),
        (libc::SYS_execve, "execve"),
        (libc::SYS_execveat, "execveat"),
        (libc::SYS_fork, "fork"),
        (libc::SYS_vfork, "vfork"),
        (libc::SYS_openat, "openat"),
        (libc::SYS_ioctl, "ioctl"),
        (libc::SYS_mount, "mount"),
        (libc::SYS_clone, "clone"),
        (libc::SYS_clone3, "clone3"),
        (libc::SYS_kill, "kill"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == i64::from(nr))
        .map(|(_, s)| *s)
}

/// Every thread: memory, futexes, signals, thread start and exit, time,
/// stderr.
const COMMON: &[i64] = &[
    libc::SYS_futex,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_getrandom,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    libc::SYS_getrusage,
];

/// vCPU threads: KVM ioctls (type 0xAE only), device I/O on files opened
/// before (disk images, serial files), eventfd writes.
const VCPU: &[i64] = &[
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_fcntl,
];

/// Files: open/read/stat, locks, journal renames (KSM knobs, /proc, /sys).
const FILES: &[i64] = &[
    // /proc through the procfs crate: rustix asks `prctl(PR_GET_DUMPABLE)`
    // before it trusts /proc/self (the scanner's auto-mode memory source,
    // the KSM figures, map counts).
    libc::SYS_prctl,
    libc::SYS_openat,
    libc::SYS_open,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_getdents64,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ftruncate,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getppid,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_poll,
    libc::SYS_ppoll,
    // The KSM journal checks whether the pid that wrote it still lives
    // (signal 0).
    libc::SYS_kill,
];

/// The engine's scanner: [`FILES`] (the KSM assist's knobs through the
/// journal and its `flock`, /proc, pagemap, kpageflags), `madvise` (in
/// [`COMMON`]: the assist's `MADV_MERGEABLE`/`MADV_UNMERGEABLE`), the pool
/// memfd (slots written with `pwrite`, in [`FILES`]) and its hole
/// punching, userfaultfd ioctls (type 0xAA), and `KVM_GET_DIRTY_LOG` (the
/// write log; no other KVM ioctl).
const ENGINE: &[i64] = &[libc::SYS_memfd_create, libc::SYS_fallocate];

/// The userfaultfd handler: reads and polls its uffd and stop eventfd.
const FAULT: &[i64] = &[
    // It opens /proc/self/pagemap once, as it starts.
    libc::SYS_openat,
    libc::SYS_pread64,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_read,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_fcntl,
];

/// The API thread: tokio's epoll loop on listeners bound before, accepted
/// connections, eventfd wake-ups, its blocking-call threads; the backend
/// calls it makes (KSM knobs through the journal, /proc for /system).
const API: &[i64] = &[
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_prctl,
];

/// The main thread after set-up: its event loop (epoll on eventfds, the
/// signal eventfd and handlers `Runner::run` installs, stdin), stopping
/// and pausing vCPUs (`tkill`), VM teardown (munmap, the engine's region
/// removal: userfaultfd ioctls, pool hole punching), the KSM backend's
/// knob restore and the JSON report ([`FILES`]). Not: sockets, threads,
/// KVM, ptrace, exec, fork.
const MAIN: &[i64] = &[
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_rt_sigaction,
    libc::SYS_tkill,
    libc::SYS_fallocate,
];

/// VM creation, on a main thread that may create VMs after set-up: KVM's
/// ioctls (type 0xAE; the filter adds the rule), guest memory memfds and
/// their sizing, the vCPU threads (`clone3`, their names, affinity and
/// their own filter: `seccomp`; they start under this filter, so it holds
/// [`VCPU`] too), the VM's eventfds and timers, kernel and disk images
/// ([`FILES`]).
pub const VM_CREATE: &[i64] = &[
    libc::SYS_memfd_create,
    libc::SYS_fallocate,
    libc::SYS_eventfd2,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_sched_setaffinity,
    libc::SYS_seccomp,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_pipe2,
];

/// Starting the dedup backend on a main thread that serves the API (the
/// API turning dedup on in a process started without it): the engine's
/// userfaultfd (the syscall; `/dev/userfaultfd` is [`FILES`] and an ioctl
/// of type 0xAA). Its pool memfd, threads and their filters are
/// [`VM_CREATE`]'s; its threads start under this filter, so it holds
/// theirs too (the write log's `KVM_GET_DIRTY_LOG` is a KVM ioctl).
const DEDUP_START: &[i64] = &[libc::SYS_userfaultfd];

/// The KSM backend's auto-mode driver: [`FILES`] only (KSM's sysfs knobs
/// through the journal, `/proc/self/ksm_stat`, `/proc/meminfo`).
const KSM: &[i64] = &[];

/// `ioctl` restricted to one ioctl type (bits 8-15 of the request).
fn ioctl_type(t: u64) -> Vec<SeccompRule> {
    let cond = SeccompCondition::new(
        1,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(0xff00),
        t << 8,
    )
    .expect("valid condition");
    vec![SeccompRule::new(vec![cond]).expect("non-empty rule")]
}

/// `ioctl` restricted to these requests.
fn ioctl_requests(reqs: &[u64]) -> Vec<SeccompRule> {
    reqs.iter()
        .map(|&r| {
            let c = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, r)
                .expect("valid condition");
            SeccompRule::new(vec![c]).expect("non-empty rule")
        })
        .collect()
}

/// `setpriority(PRIO_PROCESS, _, SCANNER_NICE)` only: the engine's
/// scanner lowers its own priority to ksmd's as it starts
/// (`pagefold_dedup::SCANNER_NICE`), before its start hook installs its
/// filter, so under the filter of the thread that started it.
fn renice_scanner() -> Vec<SeccompRule> {
    let arg = |i, v: i32| {
        SeccompCondition::new(i, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v as u64)
            .expect("valid condition")
    };
    let rule = vec![
        arg(0, libc::PRIO_PROCESS as i32),
        arg(2, pagefold_dedup::SCANNER_NICE),
    ];
    vec![SeccompRule::new(rule).expect("non-empty rule")]
}

/// The main thread's ioctls after set-up: userfaultfd (regions leave the
/// engine as their VM ends), the terminal (raw mode for stdin forwarding is
/// undone at exit), non-blocking and close-on-exec flags.
fn main_ioctls() -> Vec<SeccompRule> {
    let mut r = ioctl_type(UFFDIO);
    r.extend(ioctl_requests(&[
        libc::TCGETS,
        libc::TCSETS,
        libc::TCSETSW,
        libc::TCSETSF,
        libc::FIONBIO,
        libc::FIOCLEX,
    ]));
    r
}

/// The tap ioctls a vCPU makes: a virtio-net device sets the tap's
/// receive offloads when the driver activates or resets it, which it
/// does by MMIO writes on a vCPU thread, and a multiqueue NIC goes back
/// to one pair then (`TUNSETQUEUE` detaches the other tap queues).
const TAP_VCPU_IOCTLS: &[u64] = &[libc::TUNSETOFFLOAD, libc::TUNSETQUEUE];

/// The tap ioctls of the event loop: a multiqueue NIC's control queue,
/// notified through its ioeventfd and so run there, attaches and detaches
/// tap queues as the driver sets its pair count.
const TAP_EVENT_LOOP_IOCTLS: &[u64] = &[libc::TUNSETQUEUE];

/// The tap ioctls of VM creation: attaching to the tap and setting its
/// vnet header size (`pagefold_devices::virtio::net::Tap::open`),
/// probing its offloads, and detaching a multiqueue NIC's queues beyond
/// the first.
const TAP_CREATE_IOCTLS: &[u64] = &[
    libc::TUNSETIFF,
    libc::TUNSETVNETHDRSZ,
    libc::TUNSETOFFLOAD,
    libc::TUNSETQUEUE,
];

/// `KVM_GET_DIRTY_LOG`: `_IOW(KVMIO, 0x42, struct kvm_dirty_log)` (16 bytes).
const KVM_GET_DIRTY_LOG: u64 = 0x4010_ae42;

/// KVM's ioctl type.
const KVMIO: u64 = 0xAE;
/// userfaultfd's ioctl type.
const UFFDIO: u64 = 0xAA;

/// The allow-list of `kind`: syscall number -> rules (empty = always).
pub fn rules(kind: ThreadKind) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut m: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut add = |list: &[i64]| {
        for &nr in list {
            m.insert(nr, vec![]);
        }
    };
    add(COMMON);
    match kind {
        ThreadKind::Vcpu => add(VCPU),
        ThreadKind::Api => {
            add(FILES);
            add(API);
        }
        ThreadKind::Engine => {
            add(FILES);
            add(ENGINE);
        }
        ThreadKind::Fault => add(FAULT),
        ThreadKind::Ksm => {
            add(FILES);
            add(KSM);
        }
        ThreadKind::Main => {
            add(FILES);
            add(MAIN);
        }
        ThreadKind::MainCreatesVms => {
            add(FILES);
            add(MAIN);
            add(VCPU);
            add(VM_CREATE);
            add(DEDUP_START);
        }
    }
    match kind {
        ThreadKind::Vcpu => {
            let mut r = ioctl_type(KVMIO);
            r.extend(ioctl_requests(TAP_VCPU_IOCTLS));
            m.insert(libc::SYS_ioctl, r);
        }
        ThreadKind::Engine => {
            // The write log: KVM's dirty log of guest RAM (`crate::dirty_log`).
            let mut r = ioctl_type(UFFDIO);
            r.extend(ioctl_requests(&[KVM_GET_DIRTY_LOG]));
            m.insert(libc::SYS_ioctl, r);
        }
        ThreadKind::Fault => {
            m.insert(libc::SYS_ioctl, ioctl_type(UFFDIO));
        }
        ThreadKind::Api => {
            m.insert(
                libc::SYS_ioctl,
                ioctl_requests(&[libc::FIONBIO, libc::FIOCLEX, libc::TCGETS]),
            );
        }
        ThreadKind::Ksm => {}
        ThreadKind::Main => {
            let mut r = main_ioctls();
            r.extend(ioctl_requests(TAP_EVENT_LOOP_IOCTLS));
            m.insert(libc::SYS_ioctl, r);
        }
        ThreadKind::MainCreatesVms => {
            // The engine's scanner, started here, renices itself.
            m.insert(libc::SYS_setpriority, renice_scanner());
            let mut r = main_ioctls();
            r.extend(ioctl_type(KVMIO));
            // Covered by the KVM type above; listed as the engine's
            // filter lists it, so that the engine's threads started here
            // are seen to keep working (the unit test compares rules).
            r.extend(ioctl_requests(&[KVM_GET_DIRTY_LOG]));
            // NICs: the vCPU's offload ioctl is among these.
            r.extend(ioctl_requests(TAP_CREATE_IOCTLS));
            m.insert(libc::SYS_ioctl, r);
        }
    }
    m
}

/// Compiles `kind`'s filter: allowed syscalls pass, anything else traps.
pub fn program(kind: ThreadKind) -> Result<BpfProgram, Error> {
    let build = |source| Error::Build {
        thread: kind.name(),
        source,
    };
    let filter = SeccompFilter::new(
        rules(kind),
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(build)?;
    filter.try_into().map_err(build)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filter_compiles() {
        for k in ALL_KINDS {
            let p = program(k).unwrap();
            assert!(!p.is_empty());
            assert_eq!(
                ThreadKind::from_name(k.name()).map(|f| f.id()),
                Some(k.id())
            );
        }
        assert_eq!(ThreadKind::Main.id(), ThreadKind::MainCreatesVms.id());
        assert_ne!(ThreadKind::Main.id(), ThreadKind::Ksm.id());
    }

    /// Whether `parent`'s filter lets through every call `child`'s does
    /// (same syscall, and the parent's rules unconditional or holding each
    /// of the child's).
    fn allows_all(parent: ThreadKind, child: ThreadKind) -> Result<(), String> {
        let p = rules(parent);
        for (nr, rs) in rules(child) {
            let Some(prs) = p.get(&nr) else {
                return Err(format!("{parent:?} lacks {nr} ({child:?} needs it)"));
            };
            let covered = prs.is_empty() || (!rs.is_empty() && rs.iter().all(|r| prs.contains(r)));
            if !covered {
                return Err(format!("{parent:?} narrows {nr} more than {child:?}"));
            }
        }
        Ok(())
    }

    #[test]
    fn threads_started_under_a_filter_keep_working() {
        // vCPUs of VMs the API creates start on the main thread's filter;
        // a KSM driver started by `PATCH /dedup` on an API thread's.
        for (parent, child) in [
            (ThreadKind::MainCreatesVms, ThreadKind::Vcpu),
            (ThreadKind::Api, ThreadKind::Ksm),
            (ThreadKind::Main, ThreadKind::Ksm),
            (ThreadKind::MainCreatesVms, ThreadKind::Ksm),
            // A dedup backend started through the API.
            (ThreadKind::MainCreatesVms, ThreadKind::Engine),
            (ThreadKind::MainCreatesVms, ThreadKind::Fault),
        ] {
            allows_all(parent, child).unwrap();
        }
        // The engine's scanner renices itself before its own filter is
        // installed: under its parent's, which allows that and only that
        // of setpriority; its own filter does not need it.
        let host = rules(ThreadKind::MainCreatesVms);
        assert_eq!(host.get(&libc::SYS_setpriority), Some(&renice_scanner()));
        assert!(!rules(ThreadKind::Engine).contains_key(&libc::SYS_setpriority));
        // The check itself sees a missing syscall and a narrower ioctl.
        assert!(allows_all(ThreadKind::Vcpu, ThreadKind::Api).is_err());
        assert!(allows_all(ThreadKind::Main, ThreadKind::Vcpu).is_err());
    }

    #[test]
    fn main_after_set_up_creates_nothing() {
        let main = rules(ThreadKind::Main);
        let host = rules(ThreadKind::MainCreatesVms);
        for nr in [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_seccomp,
            libc::SYS_memfd_create,
        ] {
            assert!(!main.contains_key(&nr), "{nr}");
            assert!(host.contains_key(&nr), "{nr}");
        }
        // KVM's ioctls only where VMs may be created.
        let kvm = ioctl_type(KVMIO);
        assert!(!main[&libc::SYS_ioctl].contains(&kvm[0]));
        assert!(host[&libc::SYS_ioctl].contains(&kvm[0]));
        allows_all(ThreadKind::MainCreatesVms, ThreadKind::Main).unwrap();
        for k in ALL_KINDS {
            let r = rules(k);
            for nr in [libc::SYS_socket, libc::SYS_ptrace, libc::SYS_execve] {
                assert!(!r.contains_key(&nr), "{k:?}: {nr}");
            }
        }
        assert!(!rules(ThreadKind::Vcpu).contains_key(&libc::SYS_openat));
    }

    #[test]
    fn taps_are_attached_only_where_vms_are_created() {
        let has = |k: ThreadKind, req: u64| {
            rules(k)[&libc::SYS_ioctl].contains(&ioctl_requests(&[req])[0])
        };
        let offload = libc::TUNSETOFFLOAD;
        let attach = libc::TUNSETIFF;
        assert!(has(ThreadKind::Vcpu, offload));
        assert!(!has(ThreadKind::Vcpu, attach));
        assert!(has(ThreadKind::MainCreatesVms, attach));
        assert!(has(ThreadKind::MainCreatesVms, libc::TUNSETVNETHDRSZ));
        assert!(!has(ThreadKind::Main, attach));
        assert!(!has(ThreadKind::Main, offload));
        // Multiqueue: tap queues are attached and detached at creation,
        // activation and reset (vCPU) and by the control queue (event
        // loop), and by nobody else.
        let queue = libc::TUNSETQUEUE;
        for k in [
            ThreadKind::Vcpu,
            ThreadKind::Main,
            ThreadKind::MainCreatesVms,
        ] {
            assert!(has(k, queue), "{}", k.name());
        }
        assert!(!has(ThreadKind::Api, queue));
        for k in [ThreadKind::Engine, ThreadKind::Fault] {
            assert!(!has(k, queue), "{}", k.name());
        }
    }

    #[test]
    fn the_engine_reads_the_dirty_log_and_no_other_kvm_ioctl() {
        let engine = &rules(ThreadKind::Engine)[&libc::SYS_ioctl];
        assert!(engine.contains(&ioctl_requests(&[KVM_GET_DIRTY_LOG])[0]));
        assert!(!engine.contains(&ioctl_type(KVMIO)[0]));
        let fault = &rules(ThreadKind::Fault)[&libc::SYS_ioctl];
        assert!(!fault.contains(&ioctl_requests(&[KVM_GET_DIRTY_LOG])[0]));
    }

    #[test]
    fn the_ksm_driver_gets_files_and_no_more() {
        let ksm = rules(ThreadKind::Ksm);
        assert!(ksm.contains_key(&libc::SYS_openat));
        assert!(ksm.contains_key(&libc::SYS_renameat));
        assert!(!ksm.contains_key(&libc::SYS_ioctl));
        assert!(!ksm.contains_key(&libc::SYS_clone3));
        assert!(!ksm.contains_key(&libc::SYS_memfd_create));
    }

    #[test]
    fn message_numbers() {
        let mut b = [0u8; 16];
        let mut w = Buf {
            buf: &mut b,
            len: 0,
        };
        w.num(41);
        w.put(b" ");
        w.num(-7);
        w.put(b" ");
        w.num(0);
        let len = w.len;
        assert_eq!(&b[..len], b"41 -7 0");
    }
}
