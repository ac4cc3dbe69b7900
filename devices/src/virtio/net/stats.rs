//! What a net device counted, in a form the VMM can read while the event
//! loop runs the device.
//!
//! The device keeps its [`Counters`] as plain numbers (only the event-loop
//! thread changes them, under the transport's lock) and copies them into
//! its [`NetStats`] after every queue it processes. The VMM reads that
//! copy without taking the transport's lock, so a scrape never waits for
//! a 64 KiB frame being copied, and a stalled device still answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What the device counted since it was created (frames and bytes
/// include the vnet header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames larger than every buffer the driver could post (or, without
    /// MRG_RXBUF, than the receive chain at hand): dropped.
    pub rx_oversize: u64,
    /// Receive chains the device could not write (no writable descriptor,
    /// outside guest memory): returned empty.
    pub rx_bad_chains: u64,
    /// Tap read errors other than "nothing to read".
    pub rx_errors: u64,
    /// Times a frame found too few receive buffers and the device asked
    /// the driver to notify it of more: how often reception waited on the
    /// guest (a stalled receive path shows a frame waiting, below).
    pub rx_waits: u64,
    /// Receive-queue runs that used buffers and interrupted the driver,
    /// and those whose interrupt the driver's `used_event` suppressed
    /// (EVENT_IDX: it was still polling).
    pub rx_interrupts: u64,
    pub rx_interrupts_suppressed: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Transmit chains that were malformed, shorter than the header or
    /// longer than [`super::MAX_FRAME_LEN`]: dropped.
    pub tx_bad_chains: u64,
    /// Tap write errors: the frame is dropped, as a NIC drops on a dead link.
    pub tx_errors: u64,
    /// As `rx_interrupts` and `rx_interrupts_suppressed`, for transmit
    /// completions.
    pub tx_interrupts: u64,
    pub tx_interrupts_suppressed: u64,
    /// Control-queue requests answered `VIRTIO_NET_OK`, answered
    /// `VIRTIO_NET_ERR` (unknown class or command, a pair count out of
    /// range), and chains returned unanswered (no writable status byte, a
    /// header cut short): see [`super::ctrl`].
    pub ctrl_ok: u64,
    pub ctrl_err: u64,
    pub ctrl_bad_chains: u64,
}

impl Counters {
    /// Adds `o`'s figures to these (a NIC's totals over its pairs).
    pub fn add(&mut self, o: &Counters) {
        let Counters {
            rx_frames,
            rx_bytes,
            rx_oversize,
            rx_bad_chains,
            rx_errors,
            rx_waits,
            rx_interrupts,
            rx_interrupts_suppressed,
            tx_frames,
            tx_bytes,
            tx_bad_chains,
            tx_errors,
            tx_interrupts,
            tx_interrupts_suppressed,
            ctrl_ok,
            ctrl_err,
            ctrl_bad_chains,
        } = *o;
        self.rx_frames += rx_frames;
        self.rx_bytes += rx_bytes;
        self.rx_oversize += rx_oversize;
        self.rx_bad_chains += rx_bad_chains;
        self.rx_errors += rx_errors;
        self.rx_waits += rx_waits;
        self.rx_interrupts += rx_interrupts;
        self.rx_interrupts_suppressed += rx_interrupts_suppressed;
        self.tx_frames += tx_frames;
        self.tx_bytes += tx_bytes;
        self.tx_bad_chains += tx_bad_chains;
        self.tx_errors += tx_errors;
        self.tx_interrupts += tx_interrupts;
        self.tx_interrupts_suppressed += tx_interrupts_suppressed;
        self.ctrl_ok += ctrl_ok;
        self.ctrl_err += ctrl_err;
        self.ctrl_bad_chains += ctrl_bad_chains;
    }
}

/// What one queue pair moved (frames and bytes include the vnet header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairCounters {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
}

impl From<&Counters> for PairCounters {
    fn from(c: &Counters) -> Self {
        Self {
            rx_frames: c.rx_frames,
            rx_bytes: c.rx_bytes,
            tx_frames: c.tx_frames,
            tx_bytes: c.tx_bytes,
        }
    }
}

/// What the device publishes after each queue it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Published {
    counters: Counters,
    pairs: Vec<PairCounters>,
    active_pairs: usize,
    rx_waiting: bool,
}

/// The device's counters as last published, plus what the tap watcher
/// counts, for the VMM (`Net::stats`).
#[derive(Debug, Default)]
pub struct NetStats {
    /// The counters (the NIC's totals and each pair's), the pairs in use
    /// and whether a received frame waits in the device for buffers.
    published: Mutex<Published>,
    /// Times the tap woke the event loop (it became readable).
    tap_wakeups: AtomicU64,
}

/// A copy of [`NetStats`] at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetSnapshot {
    /// The NIC's totals over its pairs and its control queue.
    pub counters: Counters,
    /// Each queue pair's frames and bytes (one entry without multiqueue).
    pub pairs: Vec<PairCounters>,
    /// The pairs the driver uses now (1 until it sets more).
    pub active_pairs: usize,
    pub rx_frame_waiting: bool,
    pub tap_wakeups: u64,
}

impl NetStats {
    /// Publishes the device's counters (`counters`: the NIC's totals;
    /// `pairs`: each pair's), the pairs in use and whether a frame waits.
    pub fn publish(
        &self,
        counters: &Counters,
        pairs: &[Counters],
        active_pairs: usize,
        rx_waiting: bool,
    ) {
        let mut p = self.published.lock().unwrap_or_else(|e| e.into_inner());
        p.counters = *counters;
        p.pairs.clear();
        p.pairs.extend(pairs.iter().map(PairCounters::from));
        p.active_pairs = active_pairs;
        p.rx_waiting = rx_waiting;
    }

    /// Counts one wake-up of the event loop by the tap.
    pub fn tap_woke(&self) {
        self.tap_wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures as last published.
    pub fn snapshot(&self) -> NetSnapshot {
        let p = self.published.lock().unwrap_or_else(|e| e.into_inner());
        NetSnapshot {
            counters: p.counters,
            pairs: p.pairs.clone(),
            active_pairs: p.active_pairs,
            rx_frame_waiting: p.rx_waiting,
            tap_wakeups: self.tap_wakeups.load(Ordering::Relaxed),
        }
    }
}
