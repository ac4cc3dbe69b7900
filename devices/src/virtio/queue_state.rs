//! A virtqueue's indices as the device and the driver hold them at one
//! moment: where a stalled queue stopped, and which side it waits for.
//!
//! With EVENT_IDX a queue stalls for good when each side waits for the
//! other: the device for a notification the driver's `avail_event` check
//! did not send, or the driver for an interrupt the device's `used_event`
//! check suppressed. These are the numbers that tell the two apart.

use std::sync::atomic::Ordering;

use crate::GuestMemoryMmap;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

/// One queue's indices (free-running 16-bit counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    pub ready: bool,
    pub size: u16,
    pub event_idx: bool,
    /// The next available entry the device will take, and the next used
    /// entry it will fill.
    pub next_avail: u16,
    pub next_used: u16,
    /// The driver's available index (entries it has offered).
    pub avail_idx: u16,
    /// The used index in guest memory (entries the device published).
    pub used_idx: u16,
    /// EVENT_IDX: the driver wants an interrupt once the used index
    /// passes `used_event`; the device wants a notification once the
    /// available index passes `avail_event`.
    pub used_event: u16,
    pub avail_event: u16,
}

impl QueueState {
    /// Reads `queue`'s state; fields in guest memory that cannot be read
    /// (a queue not set up) are 0.
    pub fn read(queue: &Queue, mem: &GuestMemoryMmap) -> Self {
        let load = |addr: u64| -> u16 {
            mem.load::<u16>(GuestAddress(addr), Ordering::Acquire)
                .map(u16::from_le)
                .unwrap_or(0)
        };
        let ready = queue.ready();
        let size = u64::from(queue.size());
        let (avail, used) = (queue.avail_ring(), queue.used_ring());
        Self {
            ready,
            size: queue.size(),
            event_idx: queue.event_idx_enabled(),
            next_avail: queue.next_avail(),
            next_used: queue.next_used(),
            avail_idx: if ready { load(avail + 2) } else { 0 },
            used_idx: if ready { load(used + 2) } else { 0 },
            used_event: if ready { load(avail + 4 + 2 * size) } else { 0 },
            avail_event: if ready { load(used + 4 + 8 * size) } else { 0 },
        }
    }
}
