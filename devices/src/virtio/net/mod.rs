//! virtio-net (virtio 1.x, 5.1) over a Linux tap interface.
//!
//! One receive and one transmit queue per queue pair; with more than one
//! pair, MQ and a control queue ([`ctrl`]) through which the driver says
//! how many it uses, each pair on a queue of its own of a multiqueue tap.
//! Frames keep the 12-byte `virtio_net_hdr_v1` the tap reads and writes
//! ([`tap`]), so checksum and segmentation offloads pass through: the
//! guest may send partially checksummed frames and TCP segments of up to
//! 64 KiB (CSUM, HOST_TSO4/6, HOST_ECN), and receive them (GUEST_CSUM,
//! GUEST_TSO4/6, GUEST_ECN) where the tap accepts those offloads. With
//! MRG_RXBUF a received frame spans as many receive buffers as it needs.
//!
//! Transmission runs when the driver notifies a transmit queue;
//! reception when a pair's tap queue becomes readable
//! ([`watch::TapWatcher`]) or the driver adds receive buffers, until
//! either runs dry. Every queue of every pair runs on the VMM's one event
//! loop (docs/devices.md says why, and what per-pair threads would take).

pub mod ctrl;
pub mod mac;
pub mod rx;
pub mod stats;
pub mod tap;
pub mod tx;
pub mod watch;

use std::sync::Arc;

use crate::GuestMemoryMmap;
use log::warn;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN,
    VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ,
    VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};

pub use mac::MacAddr;
pub use stats::{Counters, NetSnapshot, NetStats, PairCounters};
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

/// Index of the (first pair's) receive queue; pair `p`'s is `2 * p`.
pub const RX_QUEUE: usize = 0;
/// Index of the (first pair's) transmit queue; pair `p`'s is `2 * p + 1`.
pub const TX_QUEUE: usize = 1;
/// The most queue pairs a NIC may be configured with.
pub const MAX_QUEUE_PAIRS: usize = 16;
/// The most pairs a NIC gets unless configured otherwise (it gets at
/// most one per vCPU): every pair is served on the one event loop, so
/// more pairs spread the guest's work over more of its CPUs, not the
/// host's; four keeps the queues' memory and the tap's fds few.
pub const DEFAULT_QUEUE_PAIRS: usize = 4;
/// Size of the control queue: the driver waits for each request's answer.
pub const CTRL_QUEUE_SIZE: u16 = 64;
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
    #[error("{0} queue pairs: a NIC has 1 to {MAX_QUEUE_PAIRS}")]
    Pairs(usize),
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
    /// One tap queue per queue pair (one fd of a multiqueue tap each, or
    /// the one fd of a single-queue tap).
    taps: Vec<Tap>,
    mac: MacAddr,
    queue_sizes: Vec<u16>,
    avail_features: u64,
    acked_features: u64,
    /// Pairs the driver uses: 1 until it sets more through the control
    /// queue; the taps of the others are detached.
    active_pairs: usize,
    rx: Vec<rx::Rx>,
    tx: Vec<tx::Tx>,
    /// Per pair; the control queue's counts are in the first.
    counters: Vec<Counters>,
    stats: Arc<NetStats>,
}

impl Net {
    /// A device with one queue pair on `tap` and address `mac`: the
    /// device as it was before multiqueue (two queues, neither MQ nor
    /// CTRL_VQ offered).
    pub fn new(tap: Tap, mac: MacAddr) -> Result<Self, Error> {
        Self::with_taps(vec![tap], mac)
    }

    /// A device with one queue pair per tap queue of `taps` (all queues
    /// of one tap: [`Tap::open_queues`]). With more than one, MQ and
    /// CTRL_VQ are offered, `max_virtqueue_pairs` is their number, the
    /// queues are rx0, tx0, ..., rxN-1, txN-1 and the control queue; all
    /// but the first pair's tap queue are detached until the driver sets
    /// more pairs. Receive offloads are offered only if the tap accepts
    /// them (checked here, then turned off until a driver acks them).
    pub fn with_taps(taps: Vec<Tap>, mac: MacAddr) -> Result<Self, Error> {
        let pairs = taps.len();
        if !(1..=MAX_QUEUE_PAIRS).contains(&pairs) {
            return Err(Error::Pairs(pairs));
        }
        let mut avail_features = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_NET_F_MAC)
            | (1 << VIRTIO_NET_F_STATUS)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
            | (1 << VIRTIO_NET_F_CSUM)
            | (1 << VIRTIO_NET_F_HOST_TSO4)
            | (1 << VIRTIO_NET_F_HOST_TSO6)
            | (1 << VIRTIO_NET_F_HOST_ECN);
        // Offloads are set per tap, not per queue: the first fd speaks
        // for all.
        match taps[0].set_offload(tap::TAP_OFFLOADS) {
            Ok(()) => avail_features |= GUEST_OFFLOADS,
            Err(e) => warn!("virtio-net: receive offloads not offered: {e}"),
        }
        taps[0].set_offload(0)?;
        let mut queue_sizes = vec![QUEUE_SIZE; 2 * pairs];
        if pairs > 1 {
            avail_features |= (1 << VIRTIO_NET_F_MQ) | (1 << VIRTIO_NET_F_CTRL_VQ);
            queue_sizes.push(CTRL_QUEUE_SIZE);
        }
        let mut net = Self {
            taps,
            mac,
            queue_sizes,
            avail_features,
            acked_features: 0,
            active_pairs: pairs,
            rx: (0..pairs).map(|_| rx::Rx::new()).collect(),
            tx: (0..pairs).map(|_| tx::Tx::new()).collect(),
            counters: vec![Counters::default(); pairs],
            stats: Arc::default(),
        };
        net.set_active_pairs(1)?;
        net.publish();
        Ok(net)
    }

    /// Uses the first `n` pairs: their tap queues attached, the others'
    /// detached (so the kernel hashes no flow to a queue nobody reads).
    /// On an error the pairs attached so far stay so and the count is
    /// what they make.
    fn set_active_pairs(&mut self, n: usize) -> Result<(), tap::Error> {
        // Attach first, so that the tap never has no queue at all.
        for (i, tap) in self.taps.iter().enumerate().take(n) {
            if let Err(e) = tap.set_attached(true) {
                self.active_pairs = i.max(1);
                return Err(e);
            }
        }
        self.active_pairs = n;
        for (tap, rx) in self.taps.iter().zip(&mut self.rx).skip(n) {
            // A frame waiting in a pair the driver no longer reads would
            // wait for ever (and show as waiting).
            rx.discard_pending();
            tap.set_attached(false)?;
        }
        Ok(())
    }

    /// The pairs the driver uses now.
    pub fn active_pairs(&self) -> usize {
        self.active_pairs
    }

    /// The device's queue pairs (`max_virtqueue_pairs`).
    pub fn max_pairs(&self) -> usize {
        self.taps.len()
    }

    /// The index of the control queue, when the driver acked CTRL_VQ:
    /// after every pair with MQ, after the first pair without (5.1.2).
    fn ctrl_queue(&self) -> Option<usize> {
        let has = |f: u32| self.acked_features & (1 << f) != 0;
        if !has(VIRTIO_NET_F_CTRL_VQ) {
            return None;
        }
        Some(if has(VIRTIO_NET_F_MQ) {
            2 * self.max_pairs()
        } else {
            2
        })
    }

    fn publish(&self) {
        let total = self.counters();
        let waiting = self.rx.iter().any(rx::Rx::has_pending);
        self.stats
            .publish(&total, &self.counters, self.active_pairs, waiting);
    }

    /// The first pair's tap queue.
    pub fn tap(&self) -> &Tap {
        &self.taps[0]
    }

    /// Every pair's tap queue, in pair order (for the VMM to watch a
    /// duplicate of each fd).
    pub fn taps(&self) -> &[Tap] {
        &self.taps
    }

    /// The device's MAC address, as in its config space.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Features the driver acknowledged at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Frame and error counts so far, over every pair.
    pub fn counters(&self) -> Counters {
        let mut total = Counters::default();
        for c in &self.counters {
            total.add(c);
        }
        total
    }

    /// Pair `pair`'s counts so far.
    pub fn pair_counters(&self, pair: usize) -> Counters {
        self.counters[pair]
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
        for rx in &mut self.rx {
            rx.set_write_hook(hook.clone());
        }
    }

    fn config(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        c[0..6].copy_from_slice(&self.mac.bytes());
        c[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        c[8..10].copy_from_slice(&(self.max_pairs() as u16).to_le_bytes());
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

    /// Every pair and the control queue with MQ; without, the first pair
    /// and, with CTRL_VQ, the control queue after it.
    fn queues_in_use(&self, acked_features: u64) -> usize {
        let has = |f: u32| acked_features & (1 << f) != 0;
        let pairs = if has(VIRTIO_NET_F_MQ) {
            self.max_pairs()
        } else {
            1
        };
        2 * pairs + usize::from(has(VIRTIO_NET_F_CTRL_VQ))
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
        for rx in &mut self.rx {
            rx.set_mergeable(acked_features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0);
        }
        // The driver starts on the first pair (5.1.6.5.5).
        if let Err(e) = self.set_active_pairs(1) {
            warn!("virtio-net: {e}");
        }
        if let Err(e) = self.taps[0].set_offload(tap_offloads(acked_features)) {
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
        if Some(index) == self.ctrl_queue() {
            let mq = self.acked_features & (1 << VIRTIO_NET_F_MQ) != 0;
            let max = self.max_pairs();
            let mut counters = self.counters[0];
            let mut set = |n: usize| match self.set_active_pairs(n) {
                Ok(()) => true,
                Err(e) => {
                    warn!("virtio-net: {e}");
                    false
                }
            };
            let result = ctrl::process(index, queue, mem, mq, max, &mut counters, &mut set);
            self.counters[0] = counters;
            self.publish();
            return result;
        }
        let pair = index / 2;
        let is_rx = index % 2 == 0;
        // Queues beyond the pairs the driver negotiated are not ours to
        // run; a detached pair's tap cannot be read (its frames went to
        // the attached ones).
        let negotiated = if self.acked_features & (1 << VIRTIO_NET_F_MQ) != 0 {
            self.max_pairs()
        } else {
            1
        };
        if pair >= negotiated || (is_rx && pair >= self.active_pairs) {
            return Ok(false);
        }
        let used_before = queue.next_used();
        let tap = &self.taps[pair];
        let c = &mut self.counters[pair];
        let result = if is_rx {
            self.rx[pair].process(tap, queue, mem, c)
        } else {
            self.tx[pair].process(tap, queue, mem, c)
        };
        if let Ok(interrupt) = result {
            if queue.next_used() != used_before {
                let (sent, suppressed) = if is_rx {
                    (&mut c.rx_interrupts, &mut c.rx_interrupts_suppressed)
                } else {
                    (&mut c.tx_interrupts, &mut c.tx_interrupts_suppressed)
                };
                *if interrupt { sent } else { suppressed } += 1;
            }
        }
        self.publish();
        result
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        for rx in &mut self.rx {
            rx.reset();
        }
        // Back to the first pair only, as after creation and activation.
        if let Err(e) = self.set_active_pairs(1) {
            warn!("virtio-net: {e}");
        }
        self.publish();
        if let Err(e) = self.taps[0].set_offload(0) {
            warn!("virtio-net: {e}");
        }
    }
}

#[cfg(test)]
mod mq_tests;
#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod tests;
