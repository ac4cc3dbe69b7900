//! Transmit: the guest's frames to the tap (virtio 1.x, 5.1.6.2).
//!
//! Each descriptor chain is one frame: the 12-byte header, then the
//! Ethernet frame, in any layout over the chain's device-readable
//! descriptors. The chain is gathered through vm-memory into one buffer
//! and written to the tap in one `write`, header included, which the tap
//! takes as its vnet header (checksum and GSO requests pass through). A
//! chain that is malformed, shorter than the header or longer than
//! [`MAX_FRAME_LEN`] is returned unsent and counted; a tap write error
//! drops the frame, as a NIC drops frames on a dead link.

use std::io::{ErrorKind, Read};

use crate::virtio::ChainReader;
use crate::GuestMemoryMmap;
use log::debug;
use virtio_queue::{Queue, Reader};

use super::tap::Tap;
use super::{Counters, MAX_FRAME_LEN, TX_QUEUE, VNET_HDR_LEN};
use crate::virtio::Error;

/// Transmit state: the gather buffer, kept between frames.
pub struct Tx {
    buf: Vec<u8>,
}

impl Default for Tx {
    fn default() -> Self {
        Self::new()
    }
}

impl Tx {
    pub fn new() -> Self {
        Self {
            buf: vec![0; MAX_FRAME_LEN],
        }
    }

    /// Sends every frame the driver made available. Returns whether the
    /// driver needs an interrupt.
    pub fn process(
        &mut self,
        tap: &Tap,
        queue: &mut Queue,
        mem: &GuestMemoryMmap,
        counters: &mut Counters,
    ) -> Result<bool, Error> {
        crate::virtio::process_chains(TX_QUEUE, queue, mem, |chain| {
            match self.gather(chain, mem) {
                Some(len) => self.send(tap, len, counters),
                None => counters.tx_bad_chains += 1,
            }
            0
        })
    }

    /// Copies the chain's readable bytes into `buf`; the frame's length,
    /// or None for a chain that cannot be sent.
    fn gather<M>(
        &mut self,
        chain: virtio_queue::DescriptorChain<M>,
        mem: &GuestMemoryMmap,
    ) -> Option<usize>
    where
        M: std::ops::Deref + Clone,
        M::Target: vm_memory::GuestMemory + Sized,
    {
        let mut reader: ChainReader<'_> = match Reader::new(mem, chain) {
            Ok(r) => r,
            Err(e) => {
                debug!("virtio-net: bad transmit chain: {e}");
                return None;
            }
        };
        let len = reader.available_bytes();
        if !(VNET_HDR_LEN..=MAX_FRAME_LEN).contains(&len) {
            debug!("virtio-net: transmit chain of {len} bytes dropped");
            return None;
        }
        match reader.read_exact(&mut self.buf[..len]) {
            Ok(()) => Some(len),
            Err(e) => {
                debug!("virtio-net: transmit chain unreadable: {e}");
                None
            }
        }
    }

    fn send(&self, tap: &Tap, len: usize, counters: &mut Counters) {
        loop {
            match tap.write_frame(&self.buf[..len]) {
                Ok(_) => {
                    counters.tx_frames += 1;
                    counters.tx_bytes += len as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!("virtio-net: write to {}: {e}", tap.name());
                    counters.tx_errors += 1;
                }
            }
            return;
        }
    }
}
