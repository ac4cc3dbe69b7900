//! systemd's readiness protocol (sd_notify(3)) for `pagefold serve` under
//! `Type=notify`: one datagram to the Unix socket named by
//! `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). No
//! libsystemd: the protocol is that one datagram.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Errors telling the service manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("NOTIFY_SOCKET {socket:?}: {source}")]
    Send {
        socket: String,
        source: std::io::Error,
    },
}

/// Sends `state` (`KEY=VALUE` lines, e.g. `READY=1`) to the service
/// manager; does nothing when pagefold was not started by one
/// (`$NOTIFY_SOCKET` unset or empty).
pub fn notify(state: &str) -> Result<(), Error> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    let name = socket.to_string_lossy().into_owned();
    let err = |source| Error::Send {
        socket: name.clone(),
        source,
    };
    let addr = match name.strip_prefix('@') {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
        None => SocketAddr::from_pathname(&socket),
    }
    .map_err(err)?;
    let sock = UnixDatagram::unbound().map_err(err)?;
    sock.send_to_addr(state.as_bytes(), &addr).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_datagram_reaches_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        // The one test in this binary that sets the variable.
        std::env::set_var("NOTIFY_SOCKET", &path);
        notify("READY=1\nSTATUS=up").unwrap();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");
        // Without the variable: nothing to do, no error.
        notify("READY=1").unwrap();
    }
}
