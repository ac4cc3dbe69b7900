//! The workload control device: the host side of `pagefold_guest_abi`'s
//! mailbox protocol. The VMM forwards the guest's port I/O at
//! `ports::BASE..BASE+LEN` to [`WorkloadDevice`], which serves the guest's
//! requests from guest memory and turns them into [`WorkloadEvent`]s.
//! [`WorkloadControl`] lets other threads release WAIT_HOST gates and stop a
//! guest; [`WorkloadSummary`] folds a VM's events into its final report.

mod control;
mod device;
mod event;
mod guest_io;
mod summary;

pub use control::WorkloadControl;
pub use device::{DeviceAction, Error, WorkloadDevice};
pub use event::{EventKind, WorkloadEvent};
pub use summary::{PhaseRecord, WorkloadSummary};
