//! The API's Unix socket file: created with mode 0600 (bound under a
//! temporary name, restricted, then renamed into place, so it is never
//! reachable with a wider mode), never clobbering a socket another live
//! process answers on, replacing a stale one, and removed on exit if it is
//! still ours. With a group (`--api-sock-group`), the socket is 0660 and
//! owned by that group, and a directory created for it is 0750 with the
//! same group, so that the group's members can use the API.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Errors creating the socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("API socket {0}: another process is serving on it (stop it, or choose another path with --api-sock)")]
    InUse(PathBuf),
    #[error("API socket {0}: the path exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("API socket {0}: path too long for a Unix socket (at most 100 bytes)")]
    TooLong(PathBuf),
    #[error("--api-sock-group {0}: no such group")]
    NoGroup(String),
    #[error("API socket {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Removes the socket file at drop if it is still the one we created.
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    /// Identity of the file we created: inode numbers are reused at once
    /// on tmpfs, so the change time is part of it.
    id: (u64, u64, i64, i64),
}

fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

impl SocketGuard {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if identity(&m) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io { path, what, source }
}

/// The id of group `name` (a name from the group database, or a number).
pub fn group_id(name: &str) -> Result<u32, SocketError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name).map_err(|_| SocketError::NoGroup(name.to_string()))?;
    let mut grp: libc::group = unsafe_zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is to a live local of the size passed; the
    // result points into `grp` (or is null) and is read before they go.
    let rc = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(SocketError::NoGroup(name.to_string()));
    }
    Ok(grp.gr_gid)
}

fn unsafe_zeroed_group() -> libc::group {
    // SAFETY: libc::group is plain data (integers and pointers), for which
    // all-zero bytes are a valid value; getgrnam_r fills it in.
    unsafe { std::mem::zeroed() }
}

/// Gives `path` to group `gid` (owner unchanged).
fn chgrp(path: &Path, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Binds the API socket at `path` (see the module doc), for the owner
/// only, or also for the members of group `group`.
pub fn bind(path: &Path, group: Option<u32>) -> Result<(UnixListener, SocketGuard), SocketError> {
    // sun_path is 108 bytes; leave room for the temporary name's suffix.
    if path.as_os_str().len() > 100 {
        return Err(SocketError::TooLong(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(if group.is_some() { 0o750 } else { 0o700 })
            .create(&dir)
            .map_err(io(&dir, "creating its directory"))?;
        if let Some(g) = group {
            chgrp(&dir, g).map_err(io(&dir, "giving its directory to the group"))?;
        }
    } else if let Some(g) = group {
        // An existing directory is the operator's: say if it keeps the
        // group out rather than change it.
        if let Ok(m) = std::fs::metadata(&dir) {
            let searchable = m.mode() & 0o001 != 0 || (m.gid() == g && m.mode() & 0o010 != 0);
            if !searchable {
                log::warn!(
                    "API socket {}: group {g} cannot reach it: {} is not searchable by the group",
                    path.display(),
                    dir.display()
                );
            }
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(SocketError::NotASocket(path.to_path_buf()))
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => return Err(SocketError::InUse(path.to_path_buf())),
            Err(e)
                if e.kind() == ErrorKind::ConnectionRefused || e.kind() == ErrorKind::NotFound =>
            {
                log::info!("removing stale API socket {}", path.display());
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != ErrorKind::NotFound => {
                        return Err(io(path, "removing the stale socket")(e))
                    }
                    _ => {}
                }
            }
            Err(e) => return Err(io(path, "probing the existing socket")(e)),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io(path, "inspecting the path")(e)),
    }
    let tmp = dir.join(format!(".pf{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(io(&tmp, "binding"))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(io(&tmp, "setting mode 0600"))
        .and_then(|_| match group {
            Some(g) => chgrp(&tmp, g).map_err(io(&tmp, "giving it to the group")),
            None => Ok(()),
        })
        .and_then(|_| {
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                .map_err(io(&tmp, "setting its mode"))
        })
        .and_then(|_| std::fs::rename(&tmp, path).map_err(io(path, "moving into place")));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let m = std::fs::symlink_metadata(path).map_err(io(path, "inspecting the new socket"))?;
    Ok((
        listener,
        SocketGuard {
            path: path.to_path_buf(),
            id: identity(&m),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh scratch directory (short name: socket paths are limited).
    fn scratch(tag: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("pf-sock-{tag}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn creates_0600_socket_in_new_0700_dir_and_cleans_up() {
        let d = scratch("mode");
        let p = d.path().join("sub").join("api.sock");
        let (l, g) = bind(&p, None).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(p.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        UnixStream::connect(&p).unwrap();
        drop(l);
        drop(g);
        assert!(!p.exists());
    }

    #[test]
    fn refuses_live_socket_and_replaces_stale_one() {
        let d = scratch("live");
        let p = d.path().join("api.sock");
        let (l, g) = bind(&p, None).unwrap();
        assert!(matches!(bind(&p, None), Err(SocketError::InUse(_))));
        // Stale: the listener is gone but the file stays.
        drop(l);
        std::mem::forget(g);
        assert!(p.exists());
        let (_l2, g2) = bind(&p, None).unwrap();
        UnixStream::connect(&p).unwrap();
        drop(g2);
        assert!(!p.exists());
    }

    #[test]
    fn refuses_to_replace_a_regular_file() {
        let d = scratch("file");
        let p = d.path().join("api.sock");
        std::fs::write(&p, b"precious").unwrap();
        assert!(matches!(bind(&p, None), Err(SocketError::NotASocket(_))));
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
    }

    #[test]
    fn guard_leaves_a_replaced_socket_alone() {
        let d = scratch("replaced");
        let p = d.path().join("api.sock");
        let (l, g) = bind(&p, None).unwrap();
        drop(l);
        // Someone else replaced the (stale) socket with theirs.
        let (_l2, g2) = bind(&p, None).unwrap();
        drop(g);
        assert!(p.exists(), "the other server's socket must survive");
        drop(g2);
    }

    /// With a group: the socket is 0660 and the group's, the directory
    /// made for it 0750 and the group's; a group name resolves.
    #[test]
    fn a_group_socket_is_the_groups() {
        let d = scratch("group");
        let p = d.path().join("sub").join("api.sock");
        let gid = group_id("nogroup").or_else(|_| group_id("65534")).unwrap();
        assert_eq!(group_id("0").unwrap(), 0);
        assert!(matches!(
            group_id("no-such-group-here"),
            Err(SocketError::NoGroup(_))
        ));
        let (_l, g) = bind(&p, Some(gid)).unwrap();
        let m = std::fs::metadata(g.path()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        let dm = std::fs::metadata(p.parent().unwrap()).unwrap();
        assert_eq!(dm.permissions().mode() & 0o777, 0o750);
        assert_eq!(dm.gid(), gid);
    }

    #[test]
    fn long_paths_are_refused() {
        let p = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        assert!(matches!(bind(&p, None), Err(SocketError::TooLong(_))));
    }
}
