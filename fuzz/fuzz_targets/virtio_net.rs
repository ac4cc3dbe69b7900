//! virtio-net: receive and transmit queues in guest memory built from the
//! input, frames arriving from the "tap" (a socket pair, as the device's
//! unit tests use) built from the input too, then the device's own queue
//! processing: receive, transmit, receive again. With flag 8 the device
//! has two queue pairs (multiqueue) and its control queue runs first:
//! requests built from the input too, which may set the pair count.
//!
//! Input: flags, queue size, number of frames, each frame (u16 length,
//! then its bytes), then guest memory content from address 0 (the
//! queues' descriptor tables, rings and buffers are in it). Guest RAM is
//! two regions with a hole between them, so chains can point into the
//! hole and across region ends.

#![no_main]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use libfuzzer_sys::fuzz_target;
use pagefold_devices::virtio::net::{MacAddr, Net, Tap, MAX_FRAME_LEN, QUEUE_SIZE, RX_QUEUE, TX_QUEUE, VNET_HDR_LEN};
use pagefold_devices::virtio::VirtioDevice;
use pagefold_fuzz::{guest_memory, Input};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use pagefold_devices::GuestMemoryMmap;

/// Guest RAM: 64 KiB at 0, 16 KiB at 128 KiB.
const RAM: &[(u64, usize)] = &[(0, 0x1_0000), (0x2_0000, 0x4000)];
/// Receive queue rings, then transmit queue rings.
const RX_RINGS: (u64, u64, u64) = (0x0, 0x1000, 0x2000);
const TX_RINGS: (u64, u64, u64) = (0x400, 0x1400, 0x2400);
/// Control queue rings (flag 8).
const CTRL_RINGS: (u64, u64, u64) = (0x800, 0x1800, 0x2800);
/// Frames the "network" sends per input (bounded time).
const MAX_FRAMES: u8 = 8;

fn queue(mem: &GuestMemoryMmap, (d, a, u): (u64, u64, u64), size: u16, event_idx: bool) -> Queue {
    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(size);
    q.try_set_desc_table_address(GuestAddress(d)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(a)).unwrap();
    q.try_set_used_ring_address(GuestAddress(u)).unwrap();
    q.set_ready(true);
    q.set_event_idx(event_idx);
    assert!(q.is_valid(mem));
    q
}

fn socket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array it is given.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let qsize = 1u16 << (input.u8() % 5);
    let nframes = input.u8() % (MAX_FRAMES + 1);
    let frames: Vec<&[u8]> = (0..nframes).map(|_| input.chunk(9000)).collect();
    let mem = guest_memory(RAM, input.rest());

    let (ours, peer) = socket_pair();
    let mut taps = vec![Tap::from_socket(ours, "fuzz").unwrap()];
    let mut peers = Vec::new();
    if flags & 8 != 0 {
        let (ours, other) = socket_pair();
        taps.push(Tap::from_socket(ours, "fuzz1").unwrap());
        peers.push(other);
    }
    let mut net = Net::with_taps(taps, MacAddr::default_for("fuzz", 0)).unwrap();
    let mut acked = net.avail_features();
    if flags & 1 == 0 {
        acked &= !(1 << virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF);
    }
    net.activate(acked, &mut [], &mem).unwrap();
    let mut rx = queue(&mem, RX_RINGS, qsize, flags & 2 != 0);
    let mut tx = queue(&mem, TX_RINGS, qsize, flags & 4 != 0);
    if flags & 8 != 0 {
        let mut ctrl = queue(&mem, CTRL_RINGS, qsize, flags & 2 != 0);
        let _ = net.process_queue(4, &mut ctrl, &mem);
        // Whatever the requests were, the pair count is one the device
        // has, and exactly those pairs' tap queues are attached.
        let active = net.active_pairs();
        assert!((1..=2).contains(&active), "{active} pairs");
        for (i, t) in net.taps().iter().enumerate() {
            assert_eq!(t.is_attached(), i < active, "pair {i} of {active}");
        }
        let c = net.counters();
        assert!(c.ctrl_ok + c.ctrl_err + c.ctrl_bad_chains <= u64::from(qsize), "{c:?}");
    }

    let mut sent = 0u64;
    for f in &frames {
        // SAFETY: send reads `f.len()` bytes from a live slice.
        if unsafe { libc::send(peer.as_raw_fd(), f.as_ptr().cast(), f.len(), libc::MSG_DONTWAIT) } >= 0 {
            sent += 1;
        }
    }
    let _ = net.process_queue(RX_QUEUE, &mut rx, &mem);
    let _ = net.process_queue(TX_QUEUE, &mut tx, &mem);
    let _ = net.process_queue(RX_QUEUE, &mut rx, &mem);

    // Every frame the device took was delivered, dropped or refused as a
    // runt; none twice.
    let c = net.counters();
    assert!(c.rx_frames + c.rx_oversize + c.rx_errors <= sent, "{c:?} of {sent}");
    // What reached the network is what the device counted, each frame
    // with its header and no longer than a frame may be.
    let mut got = 0u64;
    let mut buf = vec![0u8; MAX_FRAME_LEN + 1];
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(peer.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            break;
        }
        let n = n as usize;
        assert!((VNET_HDR_LEN..=MAX_FRAME_LEN).contains(&n), "sent a {n}-byte frame");
        got += 1;
    }
    assert_eq!(got, c.tx_frames, "{c:?}");
});
