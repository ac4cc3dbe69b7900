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
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a transfer's peer may take to connect, and to send or take
/// each read's worth of bytes.
const PATIENCE: Duration = Duration::from_secs(180);

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

/// Accepts one connection on `port` (all addresses) in a thread and
/// reads exactly `len` bytes from it, then closes it; the thread returns
/// their md5. Exactly `len`: busybox's `nc` ends when the host closes,
/// whether or not it half-closed first.
pub fn receive(port: u16, len: u64) -> JoinHandle<String> {
    let listener = listen(port);
    std::thread::spawn(move || {
        let mut conn = accept(&listener);
        let peer = conn.peer_addr().unwrap();
        let sum = md5sum_of(|out| {
            let mut left = len;
            let mut buf = vec![0u8; 1 << 16];
            while left > 0 {
                let n = buf.len().min(left as usize);
                let got = conn.read(&mut buf[..n]).expect("read from the guest");
                assert!(got > 0, "{peer} closed after {} of {len} bytes", len - left);
                out.write_all(&buf[..got]).unwrap();
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
pub fn send(port: u16, len: u64, seed: u64) -> JoinHandle<String> {
    let listener = listen(port);
    std::thread::spawn(move || {
        let mut conn = accept(&listener);
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
