//! Watching a tap for received frames on the VMM's event loop.
//!
//! The tap's fd is registered edge-triggered: the kernel reports each
//! frame that arrives, and the device reads until the tap is empty or the
//! guest's receive buffers run out. In the latter case the frames stay in
//! the tap (whose queue drops beyond its length, as a full NIC does)
//! until the driver adds buffers and notifies the receive queue, which
//! reads them then; a level-triggered watch would instead wake the loop
//! over and over while the guest has no buffers.
//!
//! With multiqueue each pair's tap queue has a watcher of its own, which
//! runs that pair's receive queue. A queue detached from the tap (a pair
//! the driver does not use) polls as an error; its watcher ignores that
//! while the queue is detached, and the watch goes on for when it is
//! attached again.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use log::error;

use super::{NetStats, RX_QUEUE};
use crate::virtio::MmioTransport;

/// Event-manager subscriber that runs a net device's receive path when
/// its tap becomes readable.
pub struct TapWatcher {
    transport: Arc<Mutex<MmioTransport>>,
    tap: File,
    name: String,
    stats: Arc<NetStats>,
    /// The receive queue this tap queue feeds (pair `p`: `2 * p`).
    rx_queue: usize,
    /// Whether the tap queue is attached ([`super::Tap::attached_flag`]).
    attached: Arc<AtomicBool>,
}

impl TapWatcher {
    /// `tap` is a duplicate of the device's tap fd ([`super::Tap::try_clone`]);
    /// `stats` the device's ([`super::Net::stats`]), where wake-ups are
    /// counted. The watcher runs the first pair's receive queue; see
    /// [`TapWatcher::for_pair`].
    pub fn new(
        transport: Arc<Mutex<MmioTransport>>,
        tap: File,
        name: &str,
        stats: Arc<NetStats>,
    ) -> Self {
        Self {
            transport,
            tap,
            name: name.to_string(),
            stats,
            rx_queue: RX_QUEUE,
            attached: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The same watcher for the tap queue of pair `pair`, whose
    /// attachment `attached` tells.
    pub fn for_pair(mut self, pair: usize, attached: Arc<AtomicBool>) -> Self {
        self.rx_queue = RX_QUEUE + 2 * pair;
        self.attached = attached;
        self
    }
}

impl MutEventSubscriber for TapWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        let set = EventSet::IN | EventSet::EDGE_TRIGGERED;
        if let Err(e) = ops.add(Events::new_raw(self.tap.as_raw_fd(), set)) {
            error!("virtio-net: cannot watch tap {}: {e}", self.name);
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events
            .event_set()
            .intersects(EventSet::ERROR | EventSet::HANG_UP)
        {
            if !self.attached.load(Ordering::Acquire) {
                // A detached queue polls EPOLLERR (tun's poll finds no
                // interface); edge-triggered, this comes once per change.
                return;
            }
            error!("virtio-net: tap {} failed; no longer watched", self.name);
            let _ = ops.remove(events);
            return;
        }
        self.stats.tap_woke();
        // Before DRIVER_OK this is a no-op: the frames wait in the tap
        // until the driver's first receive-queue notification.
        self.transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notify_queue(self.rx_queue);
    }
}
