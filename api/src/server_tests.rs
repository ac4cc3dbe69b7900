//! Server tests over real sockets: transports, socket life cycle, and that
//! slow or idle clients are cut off without holding anyone else up.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{Client, Target};
use crate::listen::ListenConfig;
use crate::server::{Limits, Server, ServerError};
use crate::socket::SocketError;
use crate::testutil::FakeVmm;

/// A socket path in a fresh scratch directory, which lives as long as the
/// returned guard.
fn sock(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::Builder::new()
        .prefix(&format!("pf-api-{tag}-"))
        .tempdir()
        .unwrap();
    let p = d.path().join("api.sock");
    (d, p)
}

fn unix(path: &std::path::Path) -> ListenConfig {
    ListenConfig {
        unix: Some(path.to_path_buf()),
        ..Default::default()
    }
}

/// One HTTP/1.1 request over a fresh TCP connection: the status code and
/// the body.
fn tcp_get(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

/// The metrics-only listener answers `GET /metrics` and nothing else: no
/// control route is reachable through it, whatever the method.
#[test]
fn the_metrics_listener_serves_metrics_only() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let listen = ListenConfig {
        metrics: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let server = Server::start(vmm.handle.clone(), &listen, Limits::default()).unwrap();
    assert!(server.socket_path().is_none() && server.tcp_addr().is_none());
    let addr = server.metrics_addr().unwrap();
    let (status, body) = tcp_get(addr, "GET", "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\npagefold_vms 2\n"), "{body}");
    assert!(body.contains("pagefold_dedup_pages_sharing "), "{body}");
    for (method, path) in [
        ("GET", "/api/v1/vms"),
        ("GET", "/api/v1/metrics"),
        ("PUT", "/api/v1/shutdown"),
        ("PATCH", "/api/v1/dedup"),
        ("DELETE", "/api/v1/vms/vm0"),
        ("GET", "/"),
    ] {
        let (status, body) = tcp_get(addr, method, path);
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let (status, _) = tcp_get(addr, "POST", "/metrics");
    assert_eq!(status, 405);
    // Nothing was stopped or deleted through it.
    assert_eq!(
        tcp_get(addr, "GET", "/metrics")
            .1
            .matches("pagefold_vm_vcpus{")
            .count(),
        2
    );
}

#[test]
fn serves_unix_and_tcp_and_cleans_up() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("both");
    let listen = ListenConfig {
        unix: Some(p.clone()),
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let server = Server::start(vmm.handle.clone(), &listen, Limits::default()).unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let addr = server.tcp_addr().unwrap();
    assert_ne!(addr.port(), 0);
    for target in [Target::Unix(p.clone()), Target::Tcp(addr)] {
        let c = Client::new(target).unwrap();
        let r = c.call("GET", "/health", None).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json().unwrap()["vms"], 2);
        let r = c.call("GET", "/vms/none", None).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.error_message(), "no VM named \"none\"");
    }
    // A second server on the same socket is refused while the first lives.
    match Server::start(vmm.handle.clone(), &unix(&p), Limits::default()) {
        Err(ServerError::Socket(SocketError::InUse(_))) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("second server started on a live socket"),
    }
    server.stop();
    assert!(!p.exists(), "socket not removed");
}

#[test]
fn remote_tcp_needs_explicit_permission() {
    let vmm = FakeVmm::start(false, &[]);
    let listen = ListenConfig {
        tcp: Some("0.0.0.0:0".parse().unwrap()),
        ..Default::default()
    };
    assert!(matches!(
        Server::start(vmm.handle.clone(), &listen, Limits::default()),
        Err(ServerError::Listen(_))
    ));
}

fn short_limits() -> Limits {
    Limits {
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
        ..Limits::default()
    }
}

/// Reads until EOF; returns what came and how long it took.
fn read_to_close(s: &mut UnixStream) -> (String, Duration) {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), t.elapsed())
}

#[test]
fn slow_headers_are_cut_off_without_stalling_others() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("slow");
    let server = Server::start(vmm.handle.clone(), &unix(&p), short_limits()).unwrap();
    let mut slow = UnixStream::connect(&p).unwrap();
    slow.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // Meanwhile, a normal client is answered at once.
    let c = Client::new(Target::Unix(p.clone())).unwrap();
    let t = Instant::now();
    assert_eq!(c.call("GET", "/dedup", None).unwrap().status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let (_, took) = read_to_close(&mut slow);
    assert!(
        took < Duration::from_secs(2),
        "slow client held for {took:?}"
    );
    drop(server);
}

#[test]
fn idle_keepalive_connections_are_closed() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("idle");
    let server = Server::start(vmm.handle.clone(), &unix(&p), short_limits()).unwrap();
    let mut s = UnixStream::connect(&p).unwrap();
    s.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (text, took) = read_to_close(&mut s);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        took < Duration::from_secs(2),
        "idle connection kept {took:?}"
    );
    drop(server);
}

#[test]
fn slow_bodies_get_408() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("body");
    let server = Server::start(vmm.handle.clone(), &unix(&p), short_limits()).unwrap();
    let mut s = UnixStream::connect(&p).unwrap();
    s.write_all(b"PATCH /api/v1/dedup HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"mode\"")
        .unwrap();
    let (text, took) = read_to_close(&mut s);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"error\""), "{text}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(server);
}

#[test]
fn oversized_content_length_is_refused_before_reading() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("big");
    let server = Server::start(vmm.handle.clone(), &unix(&p), Limits::default()).unwrap();
    let mut s = UnixStream::connect(&p).unwrap();
    s.write_all(b"PUT /api/v1/vms/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (text, _) = read_to_close(&mut s);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    drop(server);
}

#[test]
fn many_concurrent_clients() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("many");
    let server = Server::start(vmm.handle.clone(), &unix(&p), Limits::default()).unwrap();
    let threads: Vec<_> = (0..32)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || {
                let c = Client::new(Target::Unix(p)).unwrap();
                for _ in 0..10 {
                    assert_eq!(c.call("GET", "/metrics", None).unwrap().status, 200);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(server);
}

/// 300 idle connections (more than the cap of 256), some of them keep-alive
/// connections that already made a request: a new client is still answered
/// at once (the idlest connections are closed to make room), not after a
/// header timeout.
#[test]
fn idle_connections_past_the_cap_do_not_stall_new_requests() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("cap");
    let limits = Limits::default();
    assert_eq!(limits.max_connections, 256);
    assert!(limits.header_timeout >= Duration::from_secs(10));
    let server = Server::start(vmm.handle.clone(), &unix(&p), limits).unwrap();
    let mut idle = Vec::new();
    for i in 0..300 {
        let mut s = UnixStream::connect(&p).unwrap();
        if i < 50 {
            // A keep-alive client: one request, then silence.
            s.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        }
        idle.push(s);
    }
    let c = Client::new(Target::Unix(p.clone())).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let r = c.call("GET", "/health", None).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "a request behind 300 idle connections took {:?}",
            t.elapsed()
        );
    }
    drop(idle);
    drop(server);
}

/// A connection with a request in flight is never closed to make room:
/// at the cap with every connection busy, a new client waits for a slot.
#[test]
fn busy_connections_are_not_shed() {
    let vmm = FakeVmm::start(true, &["vm0"]);
    let (_dir, p) = sock("busy");
    let limits = Limits {
        max_connections: 2,
        body_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let server = Server::start(vmm.handle.clone(), &unix(&p), limits).unwrap();
    // Two requests in flight: their bodies are late.
    let mut busy: Vec<UnixStream> = (0..2)
        .map(|_| {
            let mut s = UnixStream::connect(&p).unwrap();
            s.write_all(b"PATCH /api/v1/dedup HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n{")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let c = Client::new(Target::Unix(p.clone())).unwrap();
    let t = Instant::now();
    assert_eq!(c.call("GET", "/health", None).unwrap().status, 200);
    // Served only once a busy connection got its 408 (after ~800 ms).
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    for s in &mut busy {
        let (text, _) = read_to_close(s);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    }
    drop(server);
}
