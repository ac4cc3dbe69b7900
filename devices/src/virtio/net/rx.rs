//! Receive: frames from the tap into the guest's receive buffers
//! (virtio 1.x, 5.1.6.3-4).
//!
//! A frame is read from the tap only when the previous one was delivered
//! or dropped; one that does not fit the buffers at hand waits in
//! [`Rx`] until the driver adds more (the device asks to be notified of
//! that), so no frame is lost to a momentarily empty queue. Without
//! MRG_RXBUF a frame must fit one descriptor chain; with it, it spans as
//! many chains as it needs, all published in the used ring at once
//! (`num_buffers` tells the driver how many). A frame larger than every
//! buffer the driver could post is dropped and counted. Every write goes
//! through vm-memory into the chain's own writable descriptors.

use std::io::{ErrorKind, Write};
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use crate::GuestMemoryMmap;
use log::{debug, warn};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT, Writer};
use vm_memory::{Bytes, GuestAddress};

use super::tap::Tap;
use super::{Counters, MAX_FRAME_LEN, NUM_BUFFERS_OFFSET, RX_QUEUE, VNET_HDR_LEN};
use crate::virtio::{Error, WriteHook};

/// Receive state: the frame waiting for buffers, if any.
pub struct Rx {
    buf: Vec<u8>,
    /// Length of the frame in `buf` not yet delivered (0: none).
    pending: usize,
    mergeable: bool,
    /// Told of every guest range a frame was written to.
    write_hook: Option<WriteHook>,
}

/// What became of the pending frame.
enum Delivery {
    /// Written to the guest and published.
    Delivered,
    /// Dropped (too large for any buffers the driver could post).
    Dropped,
    /// The buffers available now are too small; `seen` is the avail
    /// index they were counted at.
    Wait { seen: Wrapping<u16> },
}

fn broken(e: virtio_queue::Error) -> Error {
    Error::BrokenQueue(RX_QUEUE, e)
}

impl Default for Rx {
    fn default() -> Self {
        Self::new()
    }
}

impl Rx {
    pub fn new() -> Self {
        Self {
            // One byte more than a frame may be: a read that fills it was
            // cut short by the tap and is dropped, never delivered cut.
            buf: vec![0; MAX_FRAME_LEN + 1],
            pending: 0,
            mergeable: false,
            write_hook: None,
        }
    }

    /// Forgets the waiting frame and the negotiated features (device
    /// reset); the write hook stays, as the VMM set it once.
    pub fn reset(&mut self) {
        self.pending = 0;
        self.mergeable = false;
    }

    /// Drops the frame waiting for buffers, if any: its pair was taken
    /// out of use, and the tap dropped what its detached queue held too.
    pub fn discard_pending(&mut self) {
        self.pending = 0;
    }

    /// Reports every guest range a frame is written to.
    pub fn set_write_hook(&mut self, hook: WriteHook) {
        self.write_hook = Some(hook);
    }

    /// Whether the driver acked MRG_RXBUF.
    pub fn set_mergeable(&mut self, on: bool) {
        self.mergeable = on;
    }

    /// Whether a frame waits for receive buffers.
    pub fn has_pending(&self) -> bool {
        self.pending != 0
    }

    /// Moves frames from `tap` into `queue` until the tap has none or the
    /// buffers run out. Returns whether the driver needs an interrupt.
    pub fn process(
        &mut self,
        tap: &Tap,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        counters: &mut Counters,
    ) -> Result<bool, Error> {
        let mut used_any = false;
        let old_used = Wrapping(queue.next_used());
        loop {
            if self.pending == 0 {
                match tap.read_frame(&mut self.buf) {
                    // End of file: only the socket backend has one.
                    Ok(0) => break,
                    Ok(n) if n < VNET_HDR_LEN => {
                        counters.rx_errors += 1;
                        continue;
                    }
                    Ok(n) if n > MAX_FRAME_LEN => {
                        counters.rx_oversize += 1;
                        continue;
                    }
                    Ok(n) => self.pending = n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // A tap that fails once (deleted under the VM)
                        // fails at every wake-up: warn once.
                        if counters.rx_errors == 0 {
                            warn!("virtio-net: read from {}: {e}", tap.name());
                        } else {
                            debug!("virtio-net: read from {}: {e}", tap.name());
                        }
                        counters.rx_errors += 1;
                        break;
                    }
                }
            }
            match self.deliver(queue, mem, counters, &mut used_any)? {
                Delivery::Delivered => {
                    used_any = true;
                    self.pending = 0;
                }
                Delivery::Dropped => {
                    counters.rx_oversize += 1;
                    self.pending = 0;
                }
                Delivery::Wait { seen } => {
                    if !arm_notification(queue, mem, seen)? {
                        counters.rx_waits += 1;
                        break;
                    }
                }
            }
        }
        if !used_any {
            return Ok(false);
        }
        needs_interrupt(queue, mem, old_used)
    }

    /// Delivers the pending frame if the available buffers hold it.
    fn deliver(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        counters: &mut Counters,
        used_any: &mut bool,
    ) -> Result<Delivery, Error> {
        let len = self.pending;
        let seen = queue.avail_idx(mem, Ordering::Acquire).map_err(broken)?;
        // First pass: count the room the available chains offer, without
        // consuming them, up to what the frame needs.
        let start = queue.next_avail();
        let mut chains = 0usize;
        let mut good = 0usize;
        let mut room = 0usize;
        let mut leading_bad = Vec::new();
        {
            let mut iter = queue.iter(mem).map_err(broken)?;
            for chain in iter.by_ref() {
                let head = chain.head_index();
                let cap = match Writer::new(mem, chain) {
                    Ok(w) => w.available_bytes(),
                    Err(e) => {
                        debug!("virtio-net: bad receive chain {head}: {e}");
                        0
                    }
                };
                chains += 1;
                if cap == 0 {
                    if good == 0 {
                        // Nothing precedes it: return it at once.
                        leading_bad.push(head);
                    }
                    continue;
                }
                good += 1;
                room = room.saturating_add(cap);
                if room >= len || !self.mergeable {
                    break;
                }
            }
        }
        queue.set_next_avail(start);
        if !leading_bad.is_empty() {
            for _ in &leading_bad {
                queue.iter(mem).map_err(broken)?.next();
            }
            let used: Vec<_> = leading_bad.iter().map(|&h| (h, 0)).collect();
            publish_used(queue, mem, &used)?;
            *used_any = true;
            chains -= leading_bad.len();
            counters.rx_bad_chains += leading_bad.len() as u64;
        }
        if room < len {
            let available = usize::from((seen - Wrapping(start)).0);
            let all_posted = available >= usize::from(queue.size());
            if good > 0 && (!self.mergeable || all_posted) {
                debug!("virtio-net: dropping a {len}-byte frame: {room} bytes of receive buffers");
                return Ok(Delivery::Dropped);
            }
            return Ok(Delivery::Wait { seen });
        }
        // Second pass: consume the chains and write the frame.
        let frame = &mut self.buf[..len];
        frame[NUM_BUFFERS_OFFSET..VNET_HDR_LEN].copy_from_slice(&(good as u16).to_le_bytes());
        let mut used = Vec::with_capacity(chains);
        // Chains between the frame's buffers that the device cannot write
        // go back empty after the frame's last buffer, not among them:
        // `num_buffers` counts the used entries that follow the header,
        // and the driver drops an empty entry as a short frame.
        let mut empty = Vec::new();
        let mut off = 0usize;
        for _ in 0..chains {
            let Some(chain) = queue.iter(mem).map_err(broken)?.next() else {
                break;
            };
            let head = chain.head_index();
            let written_to = self.write_hook.as_ref().map(|_| chain.clone());
            let mut w = match Writer::new(mem, chain) {
                Ok(w) if w.available_bytes() > 0 => w,
                _ => {
                    counters.rx_bad_chains += 1;
                    empty.push((head, 0));
                    continue;
                }
            };
            let n = w.available_bytes().min(len - off);
            let written = match w.write_all(&frame[off..off + n]) {
                Ok(()) => n,
                Err(e) => {
                    debug!("virtio-net: receive chain {head}: {e}");
                    w.bytes_written()
                }
            };
            off += n;
            if let (Some(hook), Some(c)) = (&self.write_hook, written_to) {
                report_written(c, written, hook);
            }
            used.push((head, written as u32));
        }
        used.extend(empty);
        publish_used(queue, mem, &used)?;
        counters.rx_frames += 1;
        counters.rx_bytes += len as u64;
        Ok(Delivery::Delivered)
    }
}

/// Calls `hook` for the writable descriptors of `chain` that hold its
/// first `len` bytes: what a frame of that length filled.
fn report_written<M>(chain: DescriptorChain<M>, mut len: usize, hook: &WriteHook)
where
    M: std::ops::Deref + Clone,
    M::Target: vm_memory::GuestMemory + Sized,
{
    for d in chain.filter(|d| d.is_write_only()) {
        if len == 0 {
            break;
        }
        let n = (d.len() as usize).min(len);
        hook(d.addr().0, n);
        len -= n;
    }
}

/// Writes `used` (head, length) into the used ring and publishes them
/// with one index update, so the driver never sees part of a
/// multi-buffer frame (virtio-queue's `add_used` publishes each).
fn publish_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    used: &[(u16, u32)],
) -> Result<(), Error> {
    if used.is_empty() {
        return Ok(());
    }
    let size = queue.size();
    let ring = GuestAddress(queue.used_ring());
    let next = Wrapping(queue.next_used());
    for (k, &(head, len)) in used.iter().enumerate() {
        if head >= size {
            return Err(broken(virtio_queue::Error::InvalidDescriptorIndex));
        }
        let slot = u64::from((next + Wrapping(k as u16)).0 % size);
        let addr = ring.0 + 4 + 8 * slot;
        mem.write_obj(u32::from(head).to_le(), GuestAddress(addr))
            .and_then(|()| mem.write_obj(len.to_le(), GuestAddress(addr + 4)))
            .map_err(|e| broken(virtio_queue::Error::GuestMemory(e)))?;
    }
    let new = next + Wrapping(used.len() as u16);
    queue.set_next_used(new.0);
    mem.store(new.0.to_le(), GuestAddress(ring.0 + 2), Ordering::Release)
        .map_err(|e| broken(virtio_queue::Error::GuestMemory(e)))
}

/// Whether the driver wants an interrupt for the used entries from
/// `old` on: with EVENT_IDX, when its `used_event` lies among them (as
/// virtio-queue's `needs_notification`, whose count of added entries
/// [`publish_used`] cannot update); without, always (virtio-queue does not
/// honour VRING_AVAIL_F_NO_INTERRUPT either).
fn needs_interrupt(
    queue: &Queue,
    mem: &GuestMemoryMmap,
    old: Wrapping<u16>,
) -> Result<bool, Error> {
    let new = Wrapping(queue.next_used());
    if !queue.event_idx_enabled() {
        return Ok(new != old);
    }
    // Complete the used-ring writes before reading the driver's wish.
    fence(Ordering::SeqCst);
    let addr = queue.avail_ring() + 4 + 2 * u64::from(queue.size());
    let used_event: u16 = mem
        .load(GuestAddress(addr), Ordering::Relaxed)
        .map_err(|e| broken(virtio_queue::Error::GuestMemory(e)))?;
    let used_event = Wrapping(u16::from_le(used_event));
    Ok(new - used_event - Wrapping(1) < new - old)
}

/// Asks the driver to notify the device when it adds a buffer beyond
/// avail index `seen`, then checks whether it already did; returns
/// whether the buffers changed (so delivery should be tried again).
///
/// With EVENT_IDX, virtio-queue's `enable_notification` would ask for a
/// notification at the first chain not consumed, which the driver has
/// already passed when chains wait unconsumed: `avail_event` is set to
/// `seen` here instead.
fn arm_notification(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    seen: Wrapping<u16>,
) -> Result<bool, Error> {
    if queue.event_idx_enabled() {
        let addr = queue.used_ring() + 4 + 8 * u64::from(queue.size());
        mem.store(seen.0.to_le(), GuestAddress(addr), Ordering::Relaxed)
            .map_err(|e| broken(virtio_queue::Error::GuestMemory(e)))?;
    } else {
        queue.enable_notification(mem).map_err(broken)?;
    }
    // The driver reads avail_event after publishing its index; order our
    // store before the re-read, as virtio-queue does.
    fence(Ordering::SeqCst);
    let now = queue.avail_idx(mem, Ordering::Acquire).map_err(broken)?;
    Ok(now != seen)
}
