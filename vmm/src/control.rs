//! Requests from other threads (the HTTP API) to the process that owns the
//! VMs. The runner's event loop executes them between its other duties, so
//! VM state is only ever changed by one thread. A request carries its own
//! reply channel; an eventfd wakes the loop.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pagefold_dedup::auto::AutoHandle;
use pagefold_dedup::DedupBackend;
use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::config::VmConfig;
use crate::vm::VmInfo;

/// What the API may ask of the VMM.
#[derive(Debug, Clone)]
pub enum Request {
    ListVms,
    GetVm(String),
    /// Create and start a VM (its name must be new).
    CreateVm(Box<VmConfig>),
    Pause(String),
    Resume(String),
    /// Ask a VM's balloon for `target_mib` MiB (0: deflate it all).
    SetBalloon {
        vm: String,
        target_mib: u64,
    },
    /// Stop a VM and release its memory and dedup regions.
    DeleteVm(String),
    /// Stop every VM and end the process (`serve` mode too).
    Shutdown,
    /// Create the process's dedup backend if it has none yet, and register
    /// the running VMs' memory with it (the API turning dedup on in a
    /// process started without it). Done when a backend exists.
    StartDedup,
}

/// Replies to [`Request`]s.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Response {
    Vms(Vec<VmInfo>),
    Vm(Box<VmInfo>),
    Done,
}

/// Why a request failed; each maps to an HTTP status.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("{0}")]
    BadRequest(String),
    #[error("no VM named {0:?}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Internal(String),
    #[error("the VMM is shutting down")]
    Gone,
}

type Envelope = (
    Request,
    crossbeam_channel::Sender<Result<Response, RequestError>>,
);

/// The process's dedup backend, shared by the runner (which sets it, once:
/// at start, or when the API turns dedup on) and every [`Handle`]. Once
/// set it stays for the life of the process; "off" is a mode of it.
pub type DedupSlot = Arc<OnceLock<crate::dedup::Dedup>>;

/// A slot holding `dedup`, if given.
pub fn dedup_slot(dedup: Option<crate::dedup::Dedup>) -> DedupSlot {
    let slot = DedupSlot::default();
    if let Some(d) = dedup {
        // A new slot is empty: this cannot fail.
        let _ = slot.set(d);
    }
    slot
}

/// A cloneable handle for other threads.
#[derive(Clone)]
pub struct Handle {
    tx: crossbeam_channel::Sender<Envelope>,
    wake: Arc<EventFd>,
    dedup: DedupSlot,
}

/// The runner's end.
pub struct Inbox {
    pub(crate) rx: crossbeam_channel::Receiver<Envelope>,
    pub(crate) wake: Arc<EventFd>,
}

/// Makes a connected handle and inbox sharing the backend slot `dedup`.
pub fn channel(dedup: DedupSlot) -> std::io::Result<(Handle, Inbox)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
    Ok((
        Handle {
            tx,
            wake: wake.clone(),
            dedup,
        },
        Inbox { rx, wake },
    ))
}

impl Handle {
    /// Sends `req` and waits for the reply (bounded: VM creation maps
    /// memory and loads an image; stopping a VM waits for its vCPUs).
    pub fn call(&self, req: Request) -> Result<Response, RequestError> {
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        self.tx.send((req, rtx)).map_err(|_| RequestError::Gone)?;
        let _ = self.wake.write(1);
        rrx.recv_timeout(Duration::from_secs(30))
            .map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => {
                    RequestError::Internal("the VMM did not answer within 30 s".into())
                }
                crossbeam_channel::RecvTimeoutError::Disconnected => RequestError::Gone,
            })?
    }

    /// The dedup backend, for status and knob changes (thread-safe itself).
    pub fn dedup(&self) -> Option<&Arc<dyn DedupBackend>> {
        self.dedup.get().map(|d| &d.backend)
    }

    /// The auto-mode controller's handle (status, thresholds), if any.
    pub fn auto(&self) -> Option<&AutoHandle> {
        self.dedup.get().and_then(|d| d.auto.as_ref())
    }
}

impl Inbox {
    /// The next pending request, if any.
    pub fn try_next(&self) -> Option<Envelope> {
        let _ = self.wake.read();
        self.rx.try_recv().ok()
    }
}
