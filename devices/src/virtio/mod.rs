//! virtio-mmio transport, virtio-blk, virtio-net and virtio-balloon.
//!
//! The transport ([`mmio::MmioTransport`]) owns the register state and the
//! virtqueues (`virtio_queue::Queue`); a device model implements
//! [`VirtioDevice`] and is handed a queue whenever the driver notifies it,
//! either through an MMIO write to QueueNotify or through the ioeventfd the
//! VMM registered for it ([`notifier::MmioNotifier`]). Interrupts go out
//! through an irqfd `EventFd`. All guest memory access goes through
//! vm-memory; nothing keeps host pointers between requests.

pub mod balloon;
pub mod block;
pub mod mmio;
pub mod net;
pub mod notifier;
pub mod queue_state;
#[cfg(test)]
pub(crate) mod testutil;

use crate::GuestMemoryMmap;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};

pub use balloon::Balloon;
pub use block::Block;
pub use mmio::MmioTransport;
pub use net::Net;
pub use notifier::MmioNotifier;
pub use queue_state::QueueState;

/// Size of one virtio-mmio device window (register block + config space).
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;

/// Offset of the QueueNotify register; the VMM registers the ioeventfds here.
pub const NOTIFY_REG_OFFSET: u64 = 0x50;

/// Feature bit of virtio 1.x ("modern") devices; every pagefold device offers it.
pub const VIRTIO_F_VERSION_1: u32 = virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// The bitmap view under a [`ChainReader`]/[`ChainWriter`]: writes
/// through it mark [`GuestMemoryMmap`]'s dirty bitmap.
type DirtyBits<'a> = vm_memory::bitmap::BS<'a, vm_memory::bitmap::AtomicBitmap>;
/// The readable part of a descriptor chain over [`GuestMemoryMmap`].
pub type ChainReader<'a> = virtio_queue::Reader<'a, DirtyBits<'a>>;
/// The writable part of a descriptor chain over [`GuestMemoryMmap`].
pub type ChainWriter<'a> = virtio_queue::Writer<'a, DirtyBits<'a>>;

/// Called with each guest range (guest-physical address, length) a device
/// wrote into guest memory on its own, once the data is there: KVM's dirty
/// log sees only the guest's writes, so the VMM tells the dedup engine of
/// these (virtio-blk's reads as I/O hints, virtio-net's received frames as
/// write-log marks).
pub type WriteHook = std::sync::Arc<dyn Fn(u64, usize) + Send + Sync>;

/// Errors a device returns from activation or queue processing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver made the queue unusable (bad ring addresses, bad avail
    /// index): the device needs a reset (virtio 1.x 2.1.2, DEVICE_NEEDS_RESET).
    #[error("virtqueue {0} is broken: {1}")]
    BrokenQueue(usize, virtio_queue::Error),
    /// A queue the device needs was not set up when the driver set DRIVER_OK.
    #[error("virtqueue {0} is not ready or not valid")]
    QueueNotReady(usize),
}

/// A virtio device model behind a transport.
///
/// The transport calls these with its lock held, from a vCPU thread (MMIO)
/// or from the event-manager thread (ioeventfd); implementations do their
/// work synchronously.
pub trait VirtioDevice: Send {
    /// The virtio device ID (1 for net, 2 for block).
    fn device_type(&self) -> u32;

    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// The feature bits the device offers.
    fn avail_features(&self) -> u64;

    /// Reads `data.len()` bytes of the device config space at `offset`.
    /// Bytes beyond the config space read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes the device config space; read-only fields ignore writes.
    /// The default is a config space the driver may not write at all.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        log::debug!(
            "virtio device {}: ignored {}-byte config write at {offset:#x}",
            self.device_type(),
            data.len()
        );
    }

    /// How many of the device's queues (the first ones) the driver must
    /// set up for the features it acked: a queue that exists only with a
    /// feature (virtio-balloon's statistics and reporting queues) is not
    /// set up when the driver does not ack it. The default is every queue.
    fn queues_in_use(&self, _acked_features: u64) -> usize {
        self.queue_max_sizes().len()
    }

    /// Called once the driver set DRIVER_OK, with the negotiated features
    /// and the queues it set up (all ready and valid).
    fn activate(
        &mut self,
        acked_features: u64,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<(), Error>;

    /// Handles a notification for queue `index`: processes the available
    /// descriptor chains. Returns whether the driver needs an interrupt.
    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, Error>;

    /// Returns the device to its initial state (driver wrote status 0).
    fn reset(&mut self);
}

/// Reads `data.len()` bytes of the config space `config` at `offset`, the
/// bytes beyond its end as zero: what every device's
/// [`VirtioDevice::read_config`] does with its config bytes.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if start < config.len() {
        let n = data.len().min(config.len() - start);
        data[..n].copy_from_slice(&config[start..start + n]);
    }
}

/// Hands every available chain of queue `index` to `handle`, which does the
/// request and returns the bytes it wrote, and puts each on the used ring.
/// With EVENT_IDX, re-enabling notifications can race with the driver
/// adding more chains: `enable_notification` says so, and the loop goes
/// again. Returns whether the driver needs an interrupt.
pub fn process_chains<F>(
    index: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    mut handle: F,
) -> Result<bool, Error>
where
    F: FnMut(DescriptorChain<&GuestMemoryMmap>) -> u32,
{
    let broken = |e| Error::BrokenQueue(index, e);
    let mut used_any = false;
    loop {
        queue.disable_notification(mem).map_err(broken)?;
        while let Some(chain) = queue.iter(mem).map_err(broken)?.next() {
            let head = chain.head_index();
            let used_len = handle(chain);
            queue.add_used(mem, head, used_len).map_err(broken)?;
            used_any = true;
        }
        if !queue.enable_notification(mem).map_err(broken)? {
            break;
        }
    }
    if !used_any {
        return Ok(false);
    }
    queue.needs_notification(mem).map_err(broken)
}
