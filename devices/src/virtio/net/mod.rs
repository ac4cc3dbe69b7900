//! virtio-net (virtio 1.x, 5.1) over a Linux tap interface.
//!
//! One receive and one transmit queue (no multiqueue, no control queue).
//! Frames keep the 12-byte `virtio_net_hdr_v1` the tap reads and writes
//! ([`tap`]), so checksum and segmentation offloads pass through: the
//! guest may send partially checksummed frames and TCP segments of up to
//! 64 KiB (CSUM, HOST_TSO4/6, HOST_ECN), and receive them (GUEST_CSUM,
//! GUEST_TSO4/6, GUEST_ECN) where the tap accepts those offloads. With
//! MRG_RXBUF a received frame spans as many receive buffers as it needs.
//!
//! Transmission runs when the driver notifies the transmit queue;
//! reception when the tap becomes readable ([`watch::TapWatcher`]) or the
//! driver adds receive buffers, until either runs dry.

pub mod mac;
pub mod rx;
pub mod stats;
pub mod tap;
pub mod tx;
pub mod watch;

use std::sync::Arc;

use log::warn;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

pub use mac::MacAddr;
pub use stats::{Counters, NetSnapshot, NetStats};
pub use tap::Tap;
pub use watch::TapWatcher;

use super::{VirtioDevice, VIRTIO_F_VERSION_1};

/// Length of the header before every frame: `virtio_net_hdr_v1` (flags,
/// gso_type, hdr_len, gso_size, csum_start, csum_offset, num_buffers).
pub const VNET_HDR_LEN: usize = 12;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFFSET: usize = 10;
/// The largest frame a tap hands over or the device sends: a 64 KiB IP
/// packet, an Ethernet header with a VLAN tag, and the vnet header. A
/// longer transmit chain is dropped; a receive buffer this size never
/// cuts a frame.
pub const MAX_FRAME_LEN: usize = VNET_HDR_LEN + 65535 + 18;

/// Index of the receive queue.
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue.
pub const TX_QUEUE: usize = 1;
/// Size of each queue: Linux posts this many receive buffers.
pub const QUEUE_SIZE: u16 = 256;

/// Config space: mac (6 bytes), status (u16), max_virtqueue_pairs (u16).
const CONFIG_LEN: usize = 10;

/// Features that need the tap to accept the matching `TUN_F_*` offload.
const GUEST_OFFLOADS: u64 = (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_ECN);

/// Errors creating a net device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Tap(#[from] tap::Error),
}

/// Maps the guest's acked receive offloads to the tap's `TUN_F_*` bits.
pub fn tap_offloads(acked: u64) -> u32 {
    let has = |f: u32| acked & (1 << f) != 0;
    let mut flags = 0;
    if has(VIRTIO_NET_F_GUEST_CSUM) {
        flags |= libc::TUN_F_CSUM;
        // The tap segments nothing for a guest that cannot fix checksums.
        if has(VIRTIO_NET_F_GUEST_TSO4) {
            flags |= libc::TUN_F_TSO4;
        }
        if has(VIRTIO_NET_F_GUEST_TSO6) {
            flags |= libc::TUN_F_TSO6;
        }
        if has(VIRTIO_NET_F_GUEST_ECN) {
            flags |= libc::TUN_F_TSO_ECN;
        }
    }
    flags
}

/// A virtio-net device model.
pub struct Net {
    tap: Tap,
    mac: MacAddr,
    queue_sizes: [u16; 2],
    avail_features: u64,
    acked_features: u64,
    rx: rx::Rx,
    tx: tx::Tx,
    counters: Counters,
    stats: Arc<NetStats>,
}

impl Net {
    /// A device on `tap` with address `mac`. Receive offloads are offered
    /// only if the tap accepts them (checked here, then turned off until
    /// a driver acks them).
    pub fn new(tap: Tap, mac: MacAddr) -> Result<Self, Error> {
        let mut avail_features = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_NET_F_MAC)
            | (1 << VIRTIO_NET_F_STATUS)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
            | (1 << VIRTIO_NET_F_CSUM)
            | (1 << VIRTIO_NET_F_HOST_TSO4)
            | (1 << VIRTIO_NET_F_HOST_TSO6)
            | (1 << VIRTIO_NET_F_HOST_ECN);
        match tap.set_offload(tap::TAP_OFFLOADS) {
            Ok(()) => avail_features |= GUEST_OFFLOADS,
            Err(e) => warn!("virtio-net: receive offloads not offered: {e}"),
        }
        tap.set_offload(0)?;
        Ok(Self {
            tap,
            mac,
            queue_sizes: [QUEUE_SIZE, QUEUE_SIZE],
            avail_features,
            acked_features: 0,
            rx: rx::Rx::new(),
            tx: tx::Tx::new(),
            counters: Counters::default(),
            stats: Arc::default(),
        })
    }

    /// The tap (for the VMM to watch a duplicate of its fd).
    pub fn tap(&self) -> &Tap {
        &self.tap
    }

    /// The device's MAC address, as in its config space.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Features the driver acknowledged at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Frame and error counts so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Where the device publishes its counters after each queue it
    /// processes (for the VMM, which must not take the transport's lock
    /// to read them; the tap watcher counts its wake-ups there too).
    pub fn stats(&self) -> Arc<NetStats> {
        self.stats.clone()
    }

    /// Reports each guest range a received frame was written to: the VMM
    /// marks those pages written for the dedup engine, whose write log
    /// (KVM's dirty log) does not see the device's writes.
    pub fn set_write_hook(&mut self, hook: super::WriteHook) {
        self.rx.set_write_hook(hook);
    }

    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..6].copy_from_slice(&self.mac.bytes());
        c[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        c[8..10].copy_from_slice(&1u16.to_le_bytes());
        c
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        super::read_config_bytes(&self.config(), offset, data);
    }

    // `write_config`: the default. The MAC is writable only for legacy
    // drivers (VERSION_1 makes it read-only; CTRL_MAC_ADDR is not
    // offered); nothing else is.

    fn activate(
        &mut self,
        acked_features: u64,
        _queues: &mut [Queue],
        _mem: &GuestMemoryMmap,
    ) -> Result<(), super::Error> {
        self.acked_features = acked_features;
        self.rx
            .set_mergeable(acked_features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0);
        if let Err(e) = self.tap.set_offload(tap_offloads(acked_features)) {
            // Only offloads the probe in `new` accepted were offered, so
            // this does not happen; without them the tap finishes every
            // frame in software, which the guest handles too.
            warn!("virtio-net: {e}");
        }
        Ok(())
    }

    fn process_queue(
        &mut self,
        index: usize,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, super::Error> {
        let used_before = queue.next_used();
        let result = match index {
            RX_QUEUE => self.rx.process(&self.tap, queue, mem, &mut self.counters),
            TX_QUEUE => self.tx.process(&self.tap, queue, mem, &mut self.counters),
            _ => Ok(false),
        };
        if let Ok(interrupt) = result {
            if queue.next_used() != used_before {
                let c = &mut self.counters;
                let (sent, suppressed) = match index {
                    RX_QUEUE => (&mut c.rx_interrupts, &mut c.rx_interrupts_suppressed),
                    _ => (&mut c.tx_interrupts, &mut c.tx_interrupts_suppressed),
                };
                *if interrupt { sent } else { suppressed } += 1;
            }
        }
        self.stats.publish(&self.counters, self.rx.has_pending());
        result
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        self.rx.reset();
        self.stats.publish(&self.counters, false);
        if let Err(e) = self.tap.set_offload(0) {
            warn!("virtio-net: {e}");
        }
    }
}

#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod tests;
