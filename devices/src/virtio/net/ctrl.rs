//! The control queue (virtio 1.x, 5.1.6.5), offered with multiqueue only.
//!
//! Each request is one chain: a two-byte header (`class`, `command`),
//! the command's data, all device-readable, then one device-writable
//! status byte the device answers in. The only command served is
//! `VIRTIO_NET_CTRL_MQ` / `VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET` (how many
//! queue pairs the driver uses); any other class or command, and a pair
//! count out of range, is answered `VIRTIO_NET_ERR`, so a driver learns
//! that a feature it did not negotiate is not there. A chain without a
//! writable status byte or with a header cut short cannot be answered: it
//! is returned with nothing written and counted, and the queue goes on.

use std::io::{Read, Write};

use crate::virtio::ChainWriter;
use crate::GuestMemoryMmap;
use log::debug;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};
use virtio_queue::{DescriptorChain, Queue, Reader, Writer};

use super::Counters;
use crate::virtio::Error;

/// What a request asks for, as far as the device understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET` with this pair count.
    SetPairs(u16),
    /// Any other class and command (or a pairs command with its count
    /// cut short): answered `VIRTIO_NET_ERR`.
    Unsupported { class: u8, command: u8 },
}

/// Reads the request of `chain`: None when it cannot be answered (the
/// chain is malformed, has no writable status byte, or its header is
/// shorter than two bytes); else the request and the chain's writer,
/// positioned at the status byte.
fn parse<'a>(
    chain: DescriptorChain<&'a GuestMemoryMmap>,
    mem: &'a GuestMemoryMmap,
) -> Option<(Request, ChainWriter<'a>)> {
    let mut reader = Reader::new(mem, chain.clone())
        .map_err(|e| debug!("virtio-net: bad control chain: {e}"))
        .ok()?;
    let writer = Writer::new(mem, chain)
        .map_err(|e| debug!("virtio-net: bad control chain: {e}"))
        .ok()?;
    if writer.available_bytes() == 0 {
        debug!("virtio-net: control request without a status byte");
        return None;
    }
    let mut header = [0u8; 2];
    reader
        .read_exact(&mut header)
        .map_err(|e| debug!("virtio-net: control header: {e}"))
        .ok()?;
    let [class, command] = header;
    let request = if u32::from(class) == VIRTIO_NET_CTRL_MQ
        && u32::from(command) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET
    {
        let mut pairs = [0u8; 2];
        match reader.read_exact(&mut pairs) {
            Ok(()) => Request::SetPairs(u16::from_le_bytes(pairs)),
            Err(_) => Request::Unsupported { class, command },
        }
    } else {
        Request::Unsupported { class, command }
    };
    Some((request, writer))
}

/// Answers every request the driver made available. `set_pairs` is called
/// with a pair count in `1..=max_pairs` and says whether it took effect
/// (attaching or detaching tap queues can fail); with `mq` false (the
/// driver did not ack MQ) the pairs command is refused as well. Returns
/// whether the driver needs an interrupt.
pub fn process(
    index: usize,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    mq: bool,
    max_pairs: usize,
    counters: &mut Counters,
    mut set_pairs: impl FnMut(usize) -> bool,
) -> Result<bool, Error> {
    crate::virtio::process_chains(index, queue, mem, |chain| {
        let Some((request, mut status)) = parse(chain, mem) else {
            counters.ctrl_bad_chains += 1;
            return 0;
        };
        let ok = match request {
            Request::SetPairs(n) if mq && (1..=max_pairs).contains(&usize::from(n)) => {
                set_pairs(usize::from(n))
            }
            Request::SetPairs(n) => {
                debug!("virtio-net: {n} queue pairs refused (1..={max_pairs})");
                false
            }
            Request::Unsupported { class, command } => {
                debug!("virtio-net: control class {class} command {command} not supported");
                false
            }
        };
        let ack = if ok { VIRTIO_NET_OK } else { VIRTIO_NET_ERR } as u8;
        if ok {
            counters.ctrl_ok += 1;
        } else {
            counters.ctrl_err += 1;
        }
        match status.write_all(&[ack]) {
            Ok(()) => 1,
            Err(e) => {
                debug!("virtio-net: control status: {e}");
                0
            }
        }
    })
}
