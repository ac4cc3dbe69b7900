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
}

/// The device's counters as last published, plus what the tap watcher
/// counts, for the VMM (`Net::stats`).
#[derive(Debug, Default)]
pub struct NetStats {
    /// The counters, and whether a received frame waits in the device
    /// for buffers.
    published: Mutex<(Counters, bool)>,
    /// Times the tap woke the event loop (it became readable).
    tap_wakeups: AtomicU64,
}

/// A copy of [`NetStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetSnapshot {
    pub counters: Counters,
    pub rx_frame_waiting: bool,
    pub tap_wakeups: u64,
}

impl NetStats {
    /// Publishes the device's counters and whether a frame waits.
    pub fn publish(&self, counters: &Counters, rx_waiting: bool) {
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = (*counters, rx_waiting);
    }

    /// Counts one wake-up of the event loop by the tap.
    pub fn tap_woke(&self) {
        self.tap_wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures as last published.
    pub fn snapshot(&self) -> NetSnapshot {
        let (counters, rx_frame_waiting) =
            *self.published.lock().unwrap_or_else(|e| e.into_inner());
        NetSnapshot {
            counters,
            rx_frame_waiting,
            tap_wakeups: self.tap_wakeups.load(Ordering::Relaxed),
        }
    }
}
