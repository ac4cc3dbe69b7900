//! What a VM's NICs report: each virtio-net device's counters and both
//! its queues' indices, for `GET /vms/NAME` and `/metrics`.
//!
//! The counters come from the device's published copy
//! (`pagefold_devices::virtio::net::NetStats`), read without the
//! transport's lock. The queue indices need that lock for a moment: they
//! are what tells a stalled receive path waiting on the guest (a frame
//! waiting, `avail_event` not yet passed) from a guest waiting on the
//! device (`used_event` passed, no interrupt).

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pagefold_devices::virtio::net::{NetStats, RX_QUEUE, TX_QUEUE};
use pagefold_devices::virtio::{MmioTransport, QueueState};
use serde::{Deserialize, Serialize};

/// A NIC of a running VM: where to read its figures.
pub struct NicDevice {
    pub tap: String,
    pub mac: String,
    pub stats: Arc<NetStats>,
    pub transport: Arc<Mutex<MmioTransport>>,
}

/// One virtqueue's indices (free-running 16-bit counters; see
/// `pagefold_devices::virtio::QueueState`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    pub size: u16,
    /// The driver's available index and the device's next entry to take.
    pub avail_idx: u16,
    pub next_avail: u16,
    /// The used index the driver sees.
    pub used_idx: u16,
    /// EVENT_IDX: the driver wants an interrupt once the used index
    /// passes `used_event`; the device a notification once the available
    /// index passes `avail_event`.
    pub used_event: u16,
    pub avail_event: u16,
}

impl From<QueueState> for QueueStatus {
    fn from(q: QueueState) -> Self {
        Self {
            size: q.size,
            avail_idx: q.avail_idx,
            next_avail: q.next_avail,
            used_idx: q.used_idx,
            used_event: q.used_event,
            avail_event: q.avail_event,
        }
    }
}

/// What one queue pair of a NIC moved (frames and bytes include the
/// 12-byte vnet header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairStatus {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
}

/// A NIC's figures since the VM started (frames and bytes include the
/// 12-byte vnet header).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicStatus {
    pub tap: String,
    pub mac: String,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames dropped: too large for any buffers (receive), malformed
    /// (transmit).
    pub rx_oversize: u64,
    pub tx_bad_chains: u64,
    /// Receive buffers the device could not write (returned empty).
    pub rx_bad_chains: u64,
    /// Tap read and write errors.
    pub rx_errors: u64,
    pub tx_errors: u64,
    /// Times a received frame waited for the guest's receive buffers.
    pub rx_waits: u64,
    /// Whether a received frame waits for them now.
    pub rx_frame_waiting: bool,
    /// Times the tap woke the device (it became readable).
    pub tap_wakeups: u64,
    /// Queue runs that published used buffers and interrupted the guest,
    /// and those whose interrupt its EVENT_IDX `used_event` suppressed.
    pub rx_interrupts: u64,
    pub rx_interrupts_suppressed: u64,
    pub tx_interrupts: u64,
    pub tx_interrupts_suppressed: u64,
    /// The queue pairs the NIC has (`max_virtqueue_pairs`: one per vCPU,
    /// at most its `queue_pairs`) and those the driver uses now.
    #[serde(default)]
    pub queue_pairs: u16,
    #[serde(default)]
    pub active_pairs: u16,
    /// Each pair's frames and bytes, in pair order (their sums are the
    /// totals above).
    #[serde(default)]
    pub pairs: Vec<PairStatus>,
    /// Control-queue requests answered OK and with an error (multiqueue
    /// NICs only), and control chains returned unanswered (malformed).
    #[serde(default)]
    pub ctrl_ok: u64,
    #[serde(default)]
    pub ctrl_err: u64,
    #[serde(default)]
    pub ctrl_bad_chains: u64,
    /// The first pair's receive and transmit queues' indices now (absent
    /// before the driver set the device up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_queue: Option<QueueStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_queue: Option<QueueStatus>,
}

/// How long a status waits for the transport's lock before it leaves
/// the queues out: a device stuck with the lock held must not hang the
/// API that reports on it.
const LOCK_PATIENCE: Duration = Duration::from_millis(50);

impl NicDevice {
    fn lock_briefly(&self) -> Option<MutexGuard<'_, MmioTransport>> {
        let start = Instant::now();
        loop {
            match self.transport.try_lock() {
                Ok(t) => return Some(t),
                Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(TryLockError::WouldBlock) if start.elapsed() < LOCK_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// The NIC's figures now.
    pub fn status(&self) -> NicStatus {
        let s = self.stats.snapshot();
        let c = s.counters;
        let (rx_queue, tx_queue) = match self.lock_briefly() {
            Some(t) if t.is_activated() => {
                let q = t.queue_states();
                let at = |i: usize| q.get(i).copied().map(QueueStatus::from);
                (at(RX_QUEUE), at(TX_QUEUE))
            }
            _ => (None, None),
        };
        NicStatus {
            tap: self.tap.clone(),
            mac: self.mac.clone(),
            rx_frames: c.rx_frames,
            rx_bytes: c.rx_bytes,
            tx_frames: c.tx_frames,
            tx_bytes: c.tx_bytes,
            rx_oversize: c.rx_oversize,
            tx_bad_chains: c.tx_bad_chains,
            rx_bad_chains: c.rx_bad_chains,
            rx_errors: c.rx_errors,
            tx_errors: c.tx_errors,
            rx_waits: c.rx_waits,
            rx_frame_waiting: s.rx_frame_waiting,
            tap_wakeups: s.tap_wakeups,
            rx_interrupts: c.rx_interrupts,
            rx_interrupts_suppressed: c.rx_interrupts_suppressed,
            tx_interrupts: c.tx_interrupts,
            tx_interrupts_suppressed: c.tx_interrupts_suppressed,
            queue_pairs: s.pairs.len() as u16,
            active_pairs: s.active_pairs as u16,
            pairs: s
                .pairs
                .iter()
                .map(|p| PairStatus {
                    rx_frames: p.rx_frames,
                    rx_bytes: p.rx_bytes,
                    tx_frames: p.tx_frames,
                    tx_bytes: p.tx_bytes,
                })
                .collect(),
            ctrl_ok: c.ctrl_ok,
            ctrl_err: c.ctrl_err,
            ctrl_bad_chains: c.ctrl_bad_chains,
            rx_queue,
            tx_queue,
        }
    }
}
