//! The host side of a virtio-net device: a Linux tap interface opened
//! through /dev/net/tun, or (for tests and fuzzing) any datagram socket.
//!
//! The tap is opened with `IFF_VNET_HDR` and a 12-byte vnet header, which
//! is exactly virtio 1.x's `virtio_net_hdr_v1`: frames pass between the
//! tap and the guest with their header unchanged (checksum and GSO
//! offloads included), and the device only fills in `num_buffers`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use log::warn;

use super::VNET_HDR_LEN;

/// Errors opening or configuring a tap.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "tap name {0:?} is invalid: 1-15 bytes, not '.' or '..', no '/', ':', NUL or whitespace"
    )]
    BadName(String),
    #[error("cannot open /dev/net/tun for tap {name:?}: {source}")]
    OpenTun { name: String, source: io::Error },
    #[error("cannot attach to tap {name:?} (TUNSETIFF; is it a tap, and free? a tun device or one in use by another process is refused): {source}")]
    SetIff { name: String, source: io::Error },
    #[error("tap {name:?}: cannot set the vnet header size (TUNSETVNETHDRSZ): {source}")]
    VnetHdrSize { name: String, source: io::Error },
    #[error("tap {name:?}: cannot set offloads {flags:#x} (TUNSETOFFLOAD): {source}")]
    Offload {
        name: String,
        flags: u32,
        source: io::Error,
    },
    #[error("cannot duplicate the fd of tap {name:?}: {source}")]
    Dup { name: String, source: io::Error },
    #[error("tap {name:?}: cannot {what} a queue (TUNSETQUEUE): {source}")]
    Queue {
        name: String,
        what: &'static str,
        source: io::Error,
    },
}

/// The receive offloads a tap can be asked for (`TUN_F_*`): what frames it
/// may hand the VMM, and so the guest (checksum left partial, TCP
/// segments up to 64 KiB).
pub const TAP_OFFLOADS: u32 =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;

/// Checks that `name` can name a network interface (what the kernel's
/// `dev_valid_name` accepts), so a config is refused before any tap is
/// opened.
pub fn check_name(name: &str) -> Result<(), Error> {
    let bad = name.is_empty()
        || name.len() >= libc::IFNAMSIZ
        || name == "."
        || name == ".."
        || name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace());
    if bad {
        return Err(Error::BadName(name.to_string()));
    }
    Ok(())
}

/// An open tap (or test socket) in non-blocking mode: one `read` is one
/// frame with its vnet header, one `write` sends one.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
    /// False for the socket backend of tests, which has no offload ioctls.
    is_tap: bool,
    /// Opened with `IFF_MULTI_QUEUE`: one queue of several, which can be
    /// detached from the interface and attached again.
    multi_queue: bool,
    /// Whether this queue takes the interface's frames now (a detached
    /// queue's fd reads `EBADFD` and polls `EPOLLERR`; its watcher reads
    /// this flag to tell that from a failed tap).
    attached: Arc<AtomicBool>,
}

impl Tap {
    /// Attaches to the tap interface `name` (created, non-persistent, if
    /// it does not exist; usually made beforehand with `ip tuntap add`
    /// and put on a bridge). Needs CAP_NET_ADMIN, or a tap owned by the
    /// caller's user.
    pub fn open(name: &str) -> Result<Self, Error> {
        Self::open_flags(name, false)
    }

    /// Opens `queues` queues of the tap `name`, one fd each, with
    /// `IFF_MULTI_QUEUE` (the kernel spreads flows over them by hash). A
    /// tap made beforehand without `multi_queue` refuses that flag
    /// (`EINVAL`): it gets one queue and a warning, and the device one
    /// queue pair. One queue is opened as [`Tap::open`] does, exactly as
    /// before multiqueue, or, on a tap made with `multi_queue` (which
    /// refuses a plain open the same way), as one queue of it.
    pub fn open_queues(name: &str, queues: usize) -> Result<Vec<Self>, Error> {
        let refused = |e: &Error| matches!(e, Error::SetIff { source, .. } if source.raw_os_error() == Some(libc::EINVAL));
        if queues <= 1 {
            return match Self::open(name) {
                Err(e) if refused(&e) => match Self::open_flags(name, true) {
                    Ok(t) => Ok(vec![t]),
                    // Neither kind of tap: the plain open's error.
                    Err(_) => Err(e),
                },
                r => Ok(vec![r?]),
            };
        }
        let first = match Self::open_flags(name, true) {
            Ok(t) => t,
            Err(e) if refused(&e) => {
                // Not a multiqueue tap (or no tap at all: then the plain
                // open fails too, with its own error).
                let tap = Self::open(name)?;
                warn!(
                    "virtio-net: tap {name:?} was made without multi_queue: one queue pair instead of {queues}"
                );
                return Ok(vec![tap]);
            }
            Err(e) => return Err(e),
        };
        let mut taps = vec![first];
        for _ in 1..queues {
            taps.push(Self::open_flags(name, true)?);
        }
        Ok(taps)
    }

    fn open_flags(name: &str, multi_queue: bool) -> Result<Self, Error> {
        check_name(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|source| Error::OpenTun {
                name: name.to_string(),
                source,
            })?;
        // SAFETY: ifreq is plain old data; all zeros is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        let mut flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        ifr.ifr_ifru.ifru_flags = flags as i16;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `ifr` is and
        // which outlives the call; the fd is the tun control device just
        // opened.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut ifr) } < 0 {
            return Err(Error::SetIff {
                name: name.to_string(),
                source: io::Error::last_os_error(),
            });
        }
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int, which `hdr_len` is.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(Error::VnetHdrSize {
                name: name.to_string(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(Self {
            file,
            name: name.to_string(),
            is_tap: true,
            multi_queue,
            attached: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Wraps one end of a datagram (or seqpacket) socket pair, made
    /// non-blocking here: each datagram is one frame with its 12-byte
    /// header, as a tap's reads and writes are. Unit tests and the fuzz
    /// target use it where a tap would need privileges.
    pub fn from_socket(fd: OwnedFd, name: &str) -> io::Result<Self> {
        // SAFETY: F_SETFL with an int argument on an fd we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            file: File::from(fd),
            name: name.to_string(),
            is_tap: false,
            multi_queue: false,
            attached: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Whether this queue takes the interface's frames now.
    pub fn is_attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    /// The flag [`Tap::is_attached`] reads, shared with the queue's
    /// watcher.
    pub fn attached_flag(&self) -> Arc<AtomicBool> {
        self.attached.clone()
    }

    /// Attaches this queue to the interface (`IFF_ATTACH_QUEUE`) or
    /// detaches it (`IFF_DETACH_QUEUE`), so that the kernel spreads
    /// flows over the queues the driver uses and none lands where nobody
    /// reads. A no-op when already so; on a single-queue tap only
    /// attaching is (and the socket backend just keeps the flag).
    pub fn set_attached(&self, on: bool) -> Result<(), Error> {
        if self.is_attached() == on {
            return Ok(());
        }
        if self.is_tap {
            if !self.multi_queue {
                return Err(Error::Queue {
                    name: self.name.clone(),
                    what: "detach",
                    source: io::Error::from_raw_os_error(libc::EINVAL),
                });
            }
            // SAFETY: ifreq is plain old data; all zeros is a valid value.
            let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
            ifr.ifr_ifru.ifru_flags = if on {
                libc::IFF_ATTACH_QUEUE
            } else {
                libc::IFF_DETACH_QUEUE
            } as i16;
            // SAFETY: TUNSETQUEUE reads one ifreq (only its flags), which
            // `ifr` is and which outlives the call; the fd is one queue of
            // a multiqueue tap.
            if unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETQUEUE, &mut ifr) } < 0 {
                return Err(Error::Queue {
                    name: self.name.clone(),
                    what: if on { "attach" } else { "detach" },
                    source: io::Error::last_os_error(),
                });
            }
        }
        self.attached.store(on, Ordering::Release);
        Ok(())
    }

    /// The interface name (or the test socket's label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tells the tap which offloads the guest takes on receive (`TUN_F_*`
    /// bits): frames the kernel would send with a partial checksum or as
    /// one large TCP segment are finished in software unless allowed here.
    /// A no-op on the socket backend.
    pub fn set_offload(&self, flags: u32) -> Result<(), Error> {
        if !self.is_tap {
            return Ok(());
        }
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned
        // int); the fd is an attached tap.
        if unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                flags as libc::c_ulong,
            )
        } < 0
        {
            return Err(Error::Offload {
                name: self.name.clone(),
                flags,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// A second fd for the same tap, for the event loop to watch.
    pub fn try_clone(&self) -> Result<File, Error> {
        self.file.try_clone().map_err(|source| Error::Dup {
            name: self.name.clone(),
            source,
        })
    }

    /// Reads one frame (header included) into `buf`; `WouldBlock` when
    /// none is waiting. A frame longer than `buf` is cut short by the
    /// kernel, which is why `buf` must hold the largest frame a tap sends.
    pub fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Sends one frame (header included).
    pub fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
