//! Where the API listens. The Unix socket is the normal transport (access is
//! the socket file's mode, 0600: the owner only); TCP is for tools that
//! cannot speak to a Unix socket and is restricted to loopback addresses
//! unless the operator explicitly allows remote ones (there is no
//! authentication on the API).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors in a listen configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenError {
    #[error("--api-tcp {0}: not a loopback address; the API has no authentication, so it listens on 127.0.0.0/8 or ::1 only unless --api-tcp-allow-remote is given")]
    NotLoopback(SocketAddr),
    #[error("nothing to listen on: give a Unix socket path, a TCP address or a metrics address")]
    Nothing,
}

/// Where to serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenConfig {
    pub unix: Option<PathBuf>,
    /// A group whose members may use the Unix socket too (mode 0660).
    pub unix_group: Option<u32>,
    pub tcp: Option<SocketAddr>,
    /// Allow a non-loopback TCP address.
    pub allow_remote: bool,
    /// A TCP address that serves `GET /metrics` and nothing else, so that
    /// Prometheus can scrape from another host without reaching the
    /// control API. Any address is allowed: it exposes no control.
    pub metrics: Option<SocketAddr>,
}

impl ListenConfig {
    pub fn validate(&self) -> Result<(), ListenError> {
        if self.unix.is_none() && self.tcp.is_none() && self.metrics.is_none() {
            return Err(ListenError::Nothing);
        }
        if let Some(a) = self.tcp {
            if !a.ip().is_loopback() && !self.allow_remote {
                return Err(ListenError::NotLoopback(a));
            }
        }
        Ok(())
    }
}

/// The default socket: `$XDG_RUNTIME_DIR/pagefold/api.sock` when the runtime
/// dir is set (a per-user tmpfs), else `/run/pagefold/api.sock` for root,
/// else `/tmp/pagefold-$UID/api.sock`. The server and the CLI agree on it.
pub fn default_socket_path() -> PathBuf {
    default_from(
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() },
    )
}

fn default_from(xdg: Option<PathBuf>, euid: u32) -> PathBuf {
    match xdg {
        Some(d) if d.is_absolute() => d.join("pagefold").join("api.sock"),
        _ if euid == 0 => PathBuf::from("/run/pagefold/api.sock"),
        _ => PathBuf::from(format!("/tmp/pagefold-{euid}/api.sock")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths() {
        assert_eq!(
            default_from(Some("/run/user/1000".into()), 1000),
            PathBuf::from("/run/user/1000/pagefold/api.sock")
        );
        assert_eq!(
            default_from(None, 0),
            PathBuf::from("/run/pagefold/api.sock")
        );
        assert_eq!(
            default_from(Some("rel".into()), 5),
            PathBuf::from("/tmp/pagefold-5/api.sock")
        );
    }

    #[test]
    fn tcp_must_be_loopback_unless_allowed() {
        let mut c = ListenConfig {
            tcp: Some("0.0.0.0:8080".parse().unwrap()),
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(ListenError::NotLoopback(_))));
        c.allow_remote = true;
        c.validate().unwrap();
        c.tcp = Some("[::1]:1".parse().unwrap());
        c.allow_remote = false;
        c.validate().unwrap();
        c.tcp = Some("127.0.0.2:1".parse().unwrap());
        c.validate().unwrap();
        assert_eq!(
            ListenConfig::default().validate(),
            Err(ListenError::Nothing)
        );
    }
}
