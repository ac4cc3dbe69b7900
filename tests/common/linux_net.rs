//! The host's side of Linux guests' networks: a bridge the guests' taps
//! join (pagefold creates each tap as it opens it, so it is attached once
//! its VM runs, and goes away with the VM), and TCP transfers whose bytes
//! are checked with `md5sum` at both ends.
//!
//! The bridge has an address in 198.18.0.0/15 (set aside for benchmark
//! networks, RFC 2544), so it clashes with no real network where the test
//! runs on a hardware host; it is deleted when dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a transfer's peer may take to connect, and to send or take
/// each read's worth of bytes.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// Binds `port` on every address of this host.
fn listen(port: u16) -> TcpListener {
    let l =
        TcpListener::bind(("0.0.0.0", port)).unwrap_or_else(|e| panic!("bind port {port}: {e}"));
    l.set_nonblocking(true).unwrap();
    l
}

/// The next connection on `l`, within [`PATIENCE`] (a guest whose script
/// failed never connects; the test then fails instead of hanging).
fn accept(l: &TcpListener) -> std::net::TcpStream {
    let start = Instant::now();
    loop {
        match l.accept() {
            Ok((c, _)) => {
                c.set_nonblocking(false).unwrap();
                c.set_read_timeout(Some(PATIENCE)).unwrap();
                c.set_write_timeout(Some(PATIENCE)).unwrap();
                return c;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    start.elapsed() < PATIENCE,
                    "no connection within {PATIENCE:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// The bridge's address, the host's end of the guests' network.
pub const HOST_ADDR: &str = "198.18.42.1";
/// The prefix length of the guests' network.
pub const PREFIX: u8 = 24;

/// Guest `n`'s address on the bridge's network.
pub fn guest_addr(n: u8) -> String {
    format!("198.18.42.{}", 10 + n)
}

fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .output()
        .expect("run ip (iproute2, or busybox's in the emulated host)");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A Linux bridge with [`HOST_ADDR`], deleted on drop.
pub struct Bridge {
    pub name: String,
}

impl Bridge {
    /// Creates bridge `name` (at most 15 bytes), up, with [`HOST_ADDR`].
    pub fn create(name: &str) -> Bridge {
        // A bridge left by a killed run of this test goes first.
        let _ = Command::new("ip")
            .args(["link", "del", name])
            .stderr(Stdio::null())
            .status();
        ip(&["link", "add", name, "type", "bridge"]);
        let b = Bridge {
            name: name.to_string(),
        };
        ip(&["addr", "add", &format!("{HOST_ADDR}/{PREFIX}"), "dev", name]);
        ip(&["link", "set", "dev", name, "up"]);
        b
    }

    /// Puts tap `tap` (opened by a running VM) on the bridge, up.
    pub fn attach(&self, tap: &str) {
        ip(&["link", "set", "dev", tap, "master", &self.name]);
        ip(&["link", "set", "dev", tap, "up"]);
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .status();
    }
}

/// The md5 of what a `md5sum` process read on its stdin, fed by `feed`.
fn md5sum_of(feed: impl FnOnce(&mut dyn Write)) -> String {
    let mut child = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run md5sum");
    feed(child.stdin.as_mut().unwrap());
    drop(child.stdin.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// How far a transfer of [`receive`] or [`send`] got, for a failure
/// message: a step that timed out then says whether the bytes stopped
/// (and when) or all moved and something after them was slow.
#[derive(Default)]
pub struct Progress {
    /// Milliseconds from the transfer's start to the connection, + 1
    /// (0: none yet).
    connected_ms: AtomicU64,
    bytes: AtomicU64,
    /// Milliseconds from the start to the last bytes moved.
    last_ms: AtomicU64,
    /// Milliseconds from the start to the end, + 1 (0: not ended).
    ended_ms: AtomicU64,
}

/// A transfer running in a thread: its md5 when joined, its [`Progress`]
/// meanwhile.
pub struct Transfer {
    what: String,
    len: u64,
    start: Instant,
    progress: Arc<Progress>,
    thread: JoinHandle<String>,
}

impl Transfer {
    fn spawn(
        what: String,
        len: u64,
        run: impl FnOnce(&Progress, Instant) -> String + Send + 'static,
    ) -> Transfer {
        let start = Instant::now();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        let thread = std::thread::spawn(move || {
            let sum = run(&p, start);
            p.ended_ms
                .store(start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
            sum
        });
        Transfer {
            what,
            len,
            start,
            progress,
            thread,
        }
    }

    /// The md5 of the bytes moved.
    pub fn join(self) -> std::thread::Result<String> {
        self.thread.join()
    }

    /// Where the transfer is, e.g. "host receiving on 5001: connected at
    /// 0.2 s, 67108864 of 67108864 bytes, the last at 31.0 s, ended at
    /// 31.0 s; now 200.1 s".
    pub fn describe(&self) -> String {
        let p = &self.progress;
        let s = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
        let connected = match p.connected_ms.load(Ordering::Relaxed) {
            0 => "not connected".to_string(),
            ms => format!("connected at {}", s(ms - 1)),
        };
        let ended = match p.ended_ms.load(Ordering::Relaxed) {
            0 => "not ended".to_string(),
            ms => format!("ended at {}", s(ms - 1)),
        };
        format!(
            "{}: {connected}, {} of {} bytes, the last at {}, {ended}; now {}",
            self.what,
            p.bytes.load(Ordering::Relaxed),
            self.len,
            s(p.last_ms.load(Ordering::Relaxed)),
            s(self.start.elapsed().as_millis() as u64)
        )
    }
}

impl Progress {
    fn connected(&self, start: Instant) {
        self.connected_ms
            .store(start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
    }

    fn moved(&self, n: usize, start: Instant) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.last_ms
            .store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Accepts one connection on `port` (all addresses) in a thread and
/// reads exactly `len` bytes from it, then closes it; the thread returns
/// their md5. Exactly `len`: busybox's `nc` ends when the host closes,
/// whether or not it half-closed first.
pub fn receive(port: u16, len: u64) -> Transfer {
    let listener = listen(port);
    Transfer::spawn(format!("host receiving on {port}"), len, move |p, start| {
        let mut conn = accept(&listener);
        p.connected(start);
        let peer = conn.peer_addr().unwrap();
        let sum = md5sum_of(|out| {
            let mut left = len;
            let mut buf = vec![0u8; 1 << 16];
            while left > 0 {
                let n = buf.len().min(left as usize);
                let got = conn.read(&mut buf[..n]).expect("read from the guest");
                assert!(got > 0, "{peer} closed after {} of {len} bytes", len - left);
                out.write_all(&buf[..got]).unwrap();
                p.moved(got, start);
                left -= got as u64;
            }
        });
        let _ = conn.shutdown(Shutdown::Both);
        sum
    })
}

/// Accepts one connection on `port` in a thread and sends it `len`
/// pseudo-random bytes (xorshift from `seed`), then closes it; the thread
/// returns their md5.
pub fn send(port: u16, len: u64, seed: u64) -> Transfer {
    let listener = listen(port);
    Transfer::spawn(format!("host sending on {port}"), len, move |p, start| {
        let mut conn = accept(&listener);
        p.connected(start);
        let mut x = seed | 1;
        let sum = md5sum_of(|out| {
            let mut left = len;
            let mut buf = vec![0u8; 1 << 16];
            while left > 0 {
                for w in buf.chunks_exact_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    w.copy_from_slice(&x.to_le_bytes());
                }
                let n = buf.len().min(left as usize);
                conn.write_all(&buf[..n]).expect("write to the guest");
                out.write_all(&buf[..n]).unwrap();
                p.moved(n, start);
                left -= n as u64;
            }
        });
        conn.shutdown(Shutdown::Write).expect("half-close");
        // Wait for the guest's end before closing: closing with its
        // unread half-close pending is fine, but a reset could cut the
        // last bytes short.
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        sum
    })
}
