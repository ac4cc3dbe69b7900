//! Requests from other threads (the HTTP API) to the process that owns the
//! VMs. The runner's event loop executes them between its other duties, so
//! VM state is only ever changed by one thread. A request carries its own
//! reply channel; an eventfd wakes the loop.

use std::sync::Arc;
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
    /// Stop a VM and release its memory and dedup regions.
    DeleteVm(String),
    /// Stop every VM and end the process (`serve` mode too).
    Shutdown,
}

/// Replies to [`Request`]s.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Response {
    Vms(Vec<VmInfo>),
    Vm(VmInfo),
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

/// A cloneable handle for other threads.
#[derive(Clone)]
pub struct Handle {
    tx: crossbeam_channel::Sender<Envelope>,
    wake: Arc<EventFd>,
    dedup: Option<Arc<dyn DedupBackend>>,
    auto: Option<AutoHandle>,
}

/// The runner's end.
pub struct Inbox {
    pub(crate) rx: crossbeam_channel::Receiver<Envelope>,
    pub(crate) wake: Arc<EventFd>,
}

/// Makes a connected handle and inbox.
pub fn channel(
    dedup: Option<Arc<dyn DedupBackend>>,
    auto: Option<AutoHandle>,
) -> std::io::Result<(Handle, Inbox)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
    Ok((
        Handle {
            tx,
            wake: wake.clone(),
            dedup,
            auto,
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
        self.dedup.as_ref()
    }

    /// The auto-mode controller's handle (status, thresholds), if any.
    pub fn auto(&self) -> Option<&AutoHandle> {
        self.auto.as_ref()
    }
}

impl Inbox {
    /// The next pending request, if any.
    pub fn try_next(&self) -> Option<Envelope> {
        let _ = self.wake.read();
        self.rx.try_recv().ok()
    }
}
