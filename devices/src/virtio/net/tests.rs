use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::GuestMemoryMmap;
use proptest::prelude::*;
use virtio_bindings::virtio_net::VIRTIO_NET_HDR_F_NEEDS_CSUM;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::virtio::testutil::*;

/// Queue rings: RX at the default test addresses, TX after them.
const TX_DESC: u64 = 0x4000;
const TX_AVAIL: u64 = 0x5000;
const TX_USED: u64 = 0x6000;
/// Receive buffers go here, transmit frames at TX_BUF.
const RX_BUF: u64 = DATA_ADDR;
const TX_BUF: u64 = 0x8_0000;

/// A socket pair of datagrams standing in for a tap: the device's end and
/// the "network" end (the multiqueue and race tests use it too).
pub(super) fn socket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array it is given.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A Net device on a socket pair with both queues set up (size 16).
struct Rig {
    mem: GuestMemoryMmap,
    rxq: DriverQueue,
    txq: DriverQueue,
    rx: Queue,
    tx: Queue,
    net: Net,
    peer: OwnedFd,
}

impl Rig {
    fn new(mergeable: bool) -> Self {
        Self::with_size(16, mergeable)
    }

    fn with_size(size: u16, mergeable: bool) -> Self {
        let mem = guest_mem();
        let (ours, peer) = socket_pair();
        let tap = Tap::from_socket(ours, "test").unwrap();
        let mac = "52:54:00:01:02:03".parse().unwrap();
        let mut net = Net::new(tap, mac).unwrap();
        let rxq = DriverQueue::new(size);
        let txq = DriverQueue::at(size, TX_DESC, TX_AVAIL, TX_USED);
        let mut rx = rxq.device_queue(QUEUE_SIZE);
        let mut tx = txq.device_queue(QUEUE_SIZE);
        let mut acked = net.avail_features();
        if !mergeable {
            acked &= !(1 << VIRTIO_NET_F_MRG_RXBUF);
        }
        net.activate(acked, &mut [], &mem).unwrap();
        rx.set_event_idx(false);
        tx.set_event_idx(false);
        Self {
            mem,
            rxq,
            txq,
            rx,
            tx,
            net,
            peer,
        }
    }

    /// The network sends `frame` (header included) to the device.
    fn inject(&self, frame: &[u8]) {
        // SAFETY: send reads `frame.len()` bytes from a live slice.
        let n = unsafe { libc::send(self.peer.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n as usize,
            frame.len(),
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// What the device sent to the network, one frame per entry.
    fn sent(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut buf = vec![0u8; MAX_FRAME_LEN + 100];
            // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
            let n = unsafe {
                libc::recv(
                    self.peer.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                return out;
            }
            buf.truncate(n as usize);
            out.push(buf);
        }
    }

    fn run_rx(&mut self) -> bool {
        self.net
            .process_queue(RX_QUEUE, &mut self.rx, &self.mem)
            .unwrap()
    }

    fn run_tx(&mut self) -> bool {
        self.net
            .process_queue(TX_QUEUE, &mut self.tx, &self.mem)
            .unwrap()
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
    }
}

/// A frame with a vnet header: `flags` in the header, then `len` bytes
/// of Ethernet frame made from `seed`.
fn frame(flags: u8, len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; VNET_HDR_LEN];
    f[0] = flags;
    f.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    f
}

fn num_buffers(hdr: &[u8]) -> u16 {
    u16::from_le_bytes([hdr[NUM_BUFFERS_OFFSET], hdr[NUM_BUFFERS_OFFSET + 1]])
}

#[test]
fn identity_features_and_config_space() {
    let rig = Rig::new(true);
    assert_eq!(rig.net.device_type(), 1);
    assert_eq!(rig.net.queue_max_sizes(), &[QUEUE_SIZE, QUEUE_SIZE]);
    let f = rig.net.avail_features();
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_NET_F_MAC,
        VIRTIO_NET_F_STATUS,
        VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
    ] {
        assert_ne!(f & (1 << bit), 0, "feature bit {bit}");
    }
    let mut cfg = [0xffu8; 12];
    rig.net.read_config(0, &mut cfg);
    assert_eq!(&cfg[..6], &[0x52, 0x54, 0x00, 0x01, 0x02, 0x03]);
    assert_eq!(u16::from_le_bytes([cfg[6], cfg[7]]), 1, "link up");
    assert_eq!(&cfg[10..], &[0, 0], "beyond the config space reads zero");
    let mut status = [0u8; 2];
    rig.net.read_config(6, &mut status);
    assert_eq!(status, [1, 0]);
}

#[test]
fn guest_offloads_map_to_tap_offloads_only_with_checksums() {
    let all = (1u64 << VIRTIO_NET_F_GUEST_CSUM)
        | (1 << VIRTIO_NET_F_GUEST_TSO4)
        | (1 << VIRTIO_NET_F_GUEST_TSO6)
        | (1 << VIRTIO_NET_F_GUEST_ECN);
    assert_eq!(tap_offloads(all), tap::TAP_OFFLOADS);
    assert_eq!(tap_offloads(all & !(1 << VIRTIO_NET_F_GUEST_CSUM)), 0);
    assert_eq!(tap_offloads(1 << VIRTIO_NET_F_GUEST_CSUM), libc::TUN_F_CSUM);
}

#[test]
fn transmitted_frames_reach_the_tap_with_their_header() {
    let mut rig = Rig::new(true);
    // Header and frame in separate descriptors, the frame split in two.
    let f = frame(VIRTIO_NET_HDR_F_NEEDS_CSUM as u8, 1500, 7);
    rig.write(TX_BUF, &f[..VNET_HDR_LEN]);
    rig.write(TX_BUF + 0x1000, &f[VNET_HDR_LEN..700]);
    rig.write(TX_BUF + 0x2000, &f[700..]);
    rig.txq.push(
        &rig.mem,
        &[
            rd(TX_BUF, VNET_HDR_LEN as u32),
            rd(TX_BUF + 0x1000, 700 - VNET_HDR_LEN as u32),
            rd(TX_BUF + 0x2000, (f.len() - 700) as u32),
        ],
    );
    // Header and frame in one descriptor.
    let g = frame(0, 60, 9);
    rig.write(TX_BUF + 0x4000, &g);
    rig.txq
        .push(&rig.mem, &[rd(TX_BUF + 0x4000, g.len() as u32)]);
    assert!(rig.run_tx());
    assert_eq!(rig.sent(), vec![f.clone(), g.clone()]);
    assert_eq!(rig.txq.used_index(&rig.mem), 2);
    assert_eq!(
        rig.txq.used_elem(&rig.mem, 0).1,
        0,
        "TX buffers are read, not written"
    );
    let c = rig.net.counters();
    assert_eq!((c.tx_frames, c.tx_bytes), (2, (f.len() + g.len()) as u64));
}

#[test]
fn bad_transmit_chains_are_returned_unsent_and_counted() {
    let mut rig = Rig::new(true);
    let big = (MAX_FRAME_LEN + 1) as u32;
    for bufs in [
        // Shorter than the header.
        vec![rd(TX_BUF, 8)],
        // Longer than any frame.
        vec![rd(TX_BUF, big)],
        // Outside guest memory.
        vec![rd(MEM_SIZE as u64 - 16, 64)],
        // Only writable descriptors: nothing to send.
        vec![wr(TX_BUF, 64)],
    ] {
        rig.txq.push(&rig.mem, &bufs);
    }
    let good = frame(0, 100, 1);
    rig.write(TX_BUF + 0x3_0000, &good);
    rig.txq
        .push(&rig.mem, &[rd(TX_BUF + 0x3_0000, good.len() as u32)]);
    rig.run_tx();
    assert_eq!(rig.sent(), vec![good]);
    assert_eq!(rig.txq.used_index(&rig.mem), 5, "every chain comes back");
    let c = rig.net.counters();
    assert_eq!((c.tx_frames, c.tx_bad_chains), (1, 4));
}

#[test]
fn received_frame_lands_in_one_buffer_with_num_buffers_one() {
    let mut rig = Rig::new(false);
    rig.rxq.push(&rig.mem, &[wr(RX_BUF, 2048)]);
    let f = frame(2, 200, 3);
    rig.inject(&f);
    assert!(rig.run_rx());
    assert_eq!(rig.rxq.used_index(&rig.mem), 1);
    assert_eq!(rig.rxq.used_elem(&rig.mem, 0), (0, f.len() as u32));
    let got = rig.read(RX_BUF, f.len());
    assert_eq!(num_buffers(&got), 1);
    assert_eq!(got[0], 2, "flags from the tap's header are kept");
    assert_eq!(&got[NUM_BUFFERS_OFFSET + 2..], &f[VNET_HDR_LEN..]);
    assert_eq!(
        rig.read(RX_BUF + f.len() as u64, 16),
        vec![0; 16],
        "nothing beyond the frame"
    );
    let c = rig.net.counters();
    assert_eq!((c.rx_frames, c.rx_bytes), (1, f.len() as u64));
}

#[test]
fn large_frame_spans_merged_buffers_published_at_once() {
    let mut rig = Rig::new(true);
    for i in 0..8u64 {
        rig.rxq.push(&rig.mem, &[wr(RX_BUF + i * 0x1000, 1536)]);
    }
    let f = frame(0, 5000, 5);
    rig.inject(&f);
    assert!(rig.run_rx());
    let n = f.len().div_ceil(1536);
    assert_eq!(n, 4);
    assert_eq!(rig.rxq.used_index(&rig.mem), n as u16);
    let mut got = Vec::new();
    for i in 0..n as u16 {
        let (head, len) = rig.rxq.used_elem(&rig.mem, i);
        assert_eq!(head, u32::from(i));
        got.extend(rig.read(RX_BUF + u64::from(head) * 0x1000, len as usize));
    }
    assert_eq!(num_buffers(&got), n as u16);
    assert_eq!(&got[VNET_HDR_LEN..], &f[VNET_HDR_LEN..]);
    // The unused buffers stay with the device for the next frame.
    let g = frame(0, 100, 6);
    rig.inject(&g);
    rig.run_rx();
    assert_eq!(rig.rxq.used_index(&rig.mem), n as u16 + 1);
    assert_eq!(rig.rxq.used_elem(&rig.mem, n as u16).0, n as u32);
}

/// Every guest range a received frame was written to is reported (the
/// VMM marks those pages written for the dedup engine): the header and
/// frame over three merged buffers, the last one only in part, and
/// nothing of the buffers the frame did not reach.
#[test]
fn received_frames_report_the_ranges_they_were_written_to() {
    use std::sync::{Arc, Mutex};
    let mut rig = Rig::new(true);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    rig.net.set_write_hook(Arc::new(move |gpa, len| {
        log.lock().unwrap().push((gpa, len))
    }));
    for i in 0..4u64 {
        rig.rxq.push(&rig.mem, &[wr(RX_BUF + i * 0x1000, 1536)]);
    }
    let f = frame(0, 3500, 9);
    rig.inject(&f);
    assert!(rig.run_rx());
    let ranges = seen.lock().unwrap().clone();
    assert_eq!(
        ranges,
        vec![
            (RX_BUF, 1536),
            (RX_BUF + 0x1000, 1536),
            (RX_BUF + 0x2000, f.len() - 2 * 1536)
        ]
    );
    // A frame that waits for buffers has written nothing yet.
    seen.lock().unwrap().clear();
    rig.inject(&frame(0, 5000, 1));
    assert!(!rig.run_rx());
    assert_eq!(seen.lock().unwrap().len(), 0);
}

#[test]
fn frames_wait_for_buffers_and_the_device_asks_to_hear_of_them() {
    for event_idx in [false, true] {
        let mut rig = Rig::new(true);
        rig.rx.set_event_idx(event_idx);
        let f = frame(0, 3000, 8);
        rig.inject(&f);
        assert!(!rig.run_rx(), "no buffers: nothing delivered");
        assert!(rig.net.rx[0].has_pending());
        assert!(rig.net.stats().snapshot().rx_frame_waiting);
        // One 1536-byte buffer is not enough: still waiting, and asking
        // for a notification on the next buffer the driver adds.
        rig.rxq.push(&rig.mem, &[wr(RX_BUF, 1536)]);
        assert!(!rig.run_rx());
        assert_eq!(rig.rxq.used_index(&rig.mem), 0);
        if event_idx {
            let (_, avail_event) = rig.rxq.event_addrs();
            let v: u16 = rig.mem.read_obj(GuestAddress(avail_event)).unwrap();
            assert_eq!(v, 1, "notify when avail passes index 1");
        } else {
            let flags: u16 = rig.mem.read_obj(GuestAddress(USED_ADDR)).unwrap();
            assert_eq!(flags, 0, "notifications enabled");
        }
        rig.rxq.push(&rig.mem, &[wr(RX_BUF + 0x1000, 1536)]);
        assert!(rig.run_rx(), "the driver hears of the frame");
        assert_eq!(rig.rxq.used_index(&rig.mem), 2, "event_idx {event_idx}");
        assert!(!rig.net.rx[0].has_pending());
        let c = rig.net.counters();
        assert_eq!((c.rx_oversize, c.rx_waits), (0, 2), "event_idx {event_idx}");
        assert!(!rig.net.stats().snapshot().rx_frame_waiting);
    }
}

#[test]
fn event_idx_suppresses_receive_interrupts_until_used_event() {
    let mut rig = Rig::new(true);
    rig.rx.set_event_idx(true);
    let (used_event, _) = rig.rxq.event_addrs();
    for i in 0..4u64 {
        rig.rxq.push(&rig.mem, &[wr(RX_BUF + i * 0x1000, 2048)]);
    }
    // The driver wants to hear when entry 2 is used.
    rig.mem.write_obj(2u16, GuestAddress(used_event)).unwrap();
    rig.inject(&frame(0, 100, 0));
    assert!(!rig.run_rx());
    rig.inject(&frame(0, 100, 1));
    assert!(!rig.run_rx());
    // Two frames at once: the second used entry is index 2.
    rig.inject(&frame(0, 100, 2));
    rig.inject(&frame(0, 100, 3));
    assert!(rig.run_rx());
    assert_eq!(rig.rxq.used_index(&rig.mem), 4);
    let c = rig.net.counters();
    assert_eq!((c.rx_interrupts, c.rx_interrupts_suppressed), (1, 2));
    assert_eq!(rig.net.stats().snapshot().counters, c, "published");
}

#[test]
fn oversize_frames_are_dropped_without_writing_past_the_chain() {
    // Without MRG_RXBUF: a frame larger than the chain at hand.
    let mut rig = Rig::new(false);
    rig.rxq.push(&rig.mem, &[wr(RX_BUF, 100)]);
    rig.write(RX_BUF + 100, &[0xaa; 64]);
    rig.inject(&frame(0, 500, 1));
    let small = frame(0, 50, 2);
    rig.inject(&small);
    rig.run_rx();
    assert_eq!(rig.net.counters().rx_oversize, 1);
    assert_eq!(
        rig.rxq.used_index(&rig.mem),
        1,
        "the chain took the next frame"
    );
    assert_eq!(rig.rxq.used_elem(&rig.mem, 0).1, small.len() as u32);
    assert_eq!(&rig.read(RX_BUF + 12, 50)[..], &small[12..]);
    assert_eq!(rig.read(RX_BUF + 100, 64), vec![0xaa; 64]);

    // With MRG_RXBUF: larger than every buffer a full queue holds.
    let mut rig = Rig::with_size(4, true);
    for i in 0..4u64 {
        rig.rxq.push(&rig.mem, &[wr(RX_BUF + i * 0x1000, 64)]);
    }
    rig.inject(&frame(0, 1000, 1));
    let small = frame(0, 40, 2);
    rig.inject(&small);
    rig.run_rx();
    assert_eq!(rig.net.counters().rx_oversize, 1);
    assert_eq!(rig.rxq.used_index(&rig.mem), 1);
    assert_eq!(rig.rxq.used_elem(&rig.mem, 0), (0, small.len() as u32));
}

#[test]
fn frames_longer_than_any_frame_may_be_are_dropped_not_cut() {
    let mut rig = Rig::new(true);
    for i in 0..16u64 {
        rig.rxq
            .push(&rig.mem, &[wr(RX_BUF + i * 0x1_0000 / 2, 0x8000)]);
    }
    // One byte over: the device's read buffer fills, which a tap's cut
    // frame would do too.
    rig.inject(&frame(0, MAX_FRAME_LEN + 1 - VNET_HDR_LEN, 0));
    let fits = frame(0, MAX_FRAME_LEN - VNET_HDR_LEN, 1);
    rig.inject(&fits);
    rig.run_rx();
    assert_eq!(rig.net.counters().rx_oversize, 1);
    assert_eq!(rig.net.counters().rx_frames, 1);
    let used = rig.rxq.used_index(&rig.mem);
    let total: u32 = (0..used).map(|i| rig.rxq.used_elem(&rig.mem, i).1).sum();
    assert_eq!(
        total as usize,
        fits.len(),
        "the largest frame arrives whole"
    );
}

#[test]
fn broken_receive_chains_are_returned_empty() {
    let mut rig = Rig::new(true);
    // Outside guest memory, then readable only, then a good buffer.
    rig.rxq.push(&rig.mem, &[wr(MEM_SIZE as u64 - 8, 64)]);
    rig.rxq.push(&rig.mem, &[rd(RX_BUF, 64)]);
    rig.rxq.push(&rig.mem, &[wr(RX_BUF + 0x1000, 2048)]);
    let f = frame(0, 300, 4);
    rig.inject(&f);
    rig.run_rx();
    assert_eq!(rig.rxq.used_index(&rig.mem), 3);
    assert_eq!(rig.rxq.used_elem(&rig.mem, 0), (0, 0));
    assert_eq!(rig.rxq.used_elem(&rig.mem, 1), (1, 0));
    assert_eq!(rig.rxq.used_elem(&rig.mem, 2), (2, f.len() as u32));
    assert_eq!(rig.net.counters().rx_bad_chains, 2);
    assert_eq!(&rig.read(RX_BUF + 0x1000 + 12, 300)[..], &f[12..]);
}

/// A chain the device cannot write between the buffers a merged frame
/// spans goes back empty after the frame's buffers: the used entries
/// right after the header's are the `num_buffers` the frame has, so the
/// driver reassembles the frame and drops the empty entry as a short one.
#[test]
fn a_broken_chain_amid_a_merged_frame_is_returned_after_it() {
    let mut rig = Rig::new(true);
    rig.rxq.push(&rig.mem, &[wr(RX_BUF, 1536)]);
    rig.rxq.push(&rig.mem, &[rd(RX_BUF + 0x1000, 1536)]);
    rig.rxq.push(&rig.mem, &[wr(RX_BUF + 0x2000, 1536)]);
    let f = frame(0, 2500, 6);
    rig.inject(&f);
    assert!(rig.run_rx());
    assert_eq!(rig.rxq.used_index(&rig.mem), 3);
    let first = rig.rxq.used_elem(&rig.mem, 0);
    let second = rig.rxq.used_elem(&rig.mem, 1);
    assert_eq!(first, (0, 1536));
    assert_eq!(second, (2, (f.len() - 1536) as u32));
    assert_eq!(
        rig.rxq.used_elem(&rig.mem, 2),
        (1, 0),
        "the broken one, last"
    );
    let mut got = rig.read(RX_BUF, 1536);
    got.extend(rig.read(RX_BUF + 0x2000, f.len() - 1536));
    assert_eq!(num_buffers(&got), 2);
    assert_eq!(&got[VNET_HDR_LEN..], &f[VNET_HDR_LEN..]);
    assert_eq!(rig.net.counters().rx_bad_chains, 1);
}

#[test]
fn broken_avail_index_is_reported() {
    let mut rig = Rig::new(true);
    rig.mem
        .write_obj(100u16, GuestAddress(AVAIL_ADDR + 2))
        .unwrap();
    rig.inject(&frame(0, 60, 0));
    assert!(matches!(
        rig.net.process_queue(RX_QUEUE, &mut rig.rx, &rig.mem),
        Err(crate::virtio::Error::BrokenQueue(0, _))
    ));
    rig.mem
        .write_obj(100u16, GuestAddress(TX_AVAIL + 2))
        .unwrap();
    assert!(matches!(
        rig.net.process_queue(TX_QUEUE, &mut rig.tx, &rig.mem),
        Err(crate::virtio::Error::BrokenQueue(1, _))
    ));
}

#[test]
fn tap_names_are_checked_before_opening() {
    for bad in ["", "a/b", "with space", "sixteen-chars-xx"] {
        assert!(
            matches!(Tap::open(bad), Err(tap::Error::BadName(_))),
            "{bad:?}"
        );
    }
}

fn arb_buf() -> impl Strategy<Value = Buf> {
    let addr = prop_oneof![
        0x1_0000u64..0x2_0000,
        (MEM_SIZE as u64 - 0x1000)..(MEM_SIZE as u64 + 0x1000),
        Just(u64::MAX - 8),
    ];
    (addr, 0u32..0x1400, any::<bool>()).prop_map(|(addr, len, write)| Buf { addr, len, write })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, .. ProptestConfig::default() })]

    /// Random receive chains and frames: the device never panics, never
    /// writes guest memory outside the chains' writable buffers and the
    /// used ring, and reports used lengths within each chain.
    #[test]
    fn random_receive_chains_stay_in_bounds(
        chains in proptest::collection::vec(proptest::collection::vec(arb_buf(), 1..4), 1..6),
        lens in proptest::collection::vec(0usize..9000, 1..4),
        mergeable in any::<bool>(),
    ) {
        let mut rig = Rig::new(mergeable);
        for c in &chains {
            rig.rxq.push(&rig.mem, c);
        }
        for (i, &l) in lens.iter().enumerate() {
            rig.inject(&frame(0, l, i as u8));
        }
        let before = rig.read(0, MEM_SIZE);
        rig.run_rx();
        let after = rig.read(0, MEM_SIZE);
        let bufs: Vec<Buf> = chains.iter().flatten().copied().collect();
        let in_writable = |a: u64| bufs.iter().any(|b| b.write && a >= b.addr && a - b.addr < u64::from(b.len));
        let in_rings = |a: u64| (USED_ADDR..USED_ADDR + 0x200).contains(&a);
        for (a, (x, y)) in before.iter().zip(&after).enumerate() {
            if x != y {
                prop_assert!(in_writable(a as u64) || in_rings(a as u64), "write at {:#x}", a);
            }
        }
        let used = rig.rxq.used_index(&rig.mem);
        prop_assert!(usize::from(used) <= chains.len());
        for i in 0..used {
            let (head, len) = rig.rxq.used_elem(&rig.mem, i);
            // Heads are the first descriptor of each chain, in push order.
            let k = (0..chains.len()).find(|&k| chains[..k].iter().map(Vec::len).sum::<usize>() == head as usize);
            prop_assert!(k.is_some(), "head {}", head);
            let writable: u64 = chains[k.unwrap()].iter().filter(|b| b.write).map(|b| u64::from(b.len)).sum();
            prop_assert!(u64::from(len) <= writable);
        }
    }
}

/// Brings interface `name` up (SIOCSIFFLAGS), as `ip link set up` does.
fn set_up(name: &str) {
    // SAFETY: a plain socket call; the fd is wrapped at once.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(s >= 0);
    // SAFETY: `s` is a fresh fd owned by nothing else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain old data; all zeros is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write one ifreq.
    unsafe {
        assert_eq!(libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr), 0);
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as i16;
        assert_eq!(libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr), 0);
    }
}

/// A local experimental ethertype, so the test's frames are told apart
/// from what the kernel sends on a fresh interface (IPv6 solicitations).
const TEST_ETHERTYPE: u16 = 0x88b5;

/// An AF_PACKET socket on interface `ifindex` that sees frames of
/// [`TEST_ETHERTYPE`] arriving on it and can send frames out through it.
fn packet_socket(ifindex: u32) -> OwnedFd {
    let proto = TEST_ETHERTYPE.to_be() as i32;
    // SAFETY: a plain socket call; the fd is wrapped at once.
    let s = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    assert!(s >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: `s` is a fresh fd owned by nothing else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: sockaddr_ll is plain old data; all zeros is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = TEST_ETHERTYPE.to_be();
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: bind reads a sockaddr_ll of the size given.
    let r = unsafe {
        libc::bind(
            s.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    s
}

/// An Ethernet frame (broadcast, [`TEST_ETHERTYPE`]) of `len` bytes.
fn eth_frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x52, 0x54, 0x00, 0x0a, 0x0b, 0x0c]);
    f.extend(TEST_ETHERTYPE.to_be_bytes());
    f.extend((0..len - 14).map(|i| (i as u8) ^ seed));
    f
}

/// The real thing: a tap made for the test (non-persistent, so it goes
/// away with its last fd), with the receive offloads probed, a frame
/// the guest sends arriving on the host's interface, and a frame the
/// host sends landing in a guest buffer. Needs CAP_NET_ADMIN (the test
/// suite runs as root).
#[test]
fn frames_cross_a_real_tap_both_ways() {
    let name = format!("pft{}", std::process::id() % 1_000_000);
    let tap = Tap::open(&name).unwrap_or_else(|e| panic!("{e}"));
    let mac = "52:54:00:0a:0b:0c".parse().unwrap();
    let mut net = Net::new(tap, mac).unwrap();
    assert_ne!(
        net.avail_features() & (1 << VIRTIO_NET_F_GUEST_TSO4),
        0,
        "the tap takes TSO frames"
    );
    let mem = guest_mem();
    let rxq = DriverQueue::new(16);
    let txq = DriverQueue::at(16, TX_DESC, TX_AVAIL, TX_USED);
    let mut rx = rxq.device_queue(QUEUE_SIZE);
    let mut tx = txq.device_queue(QUEUE_SIZE);
    net.activate(net.avail_features(), &mut [], &mem).unwrap();
    set_up(&name);
    let cname = std::ffi::CString::new(name.clone()).unwrap();
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    assert_ne!(ifindex, 0);
    let sock = packet_socket(ifindex);

    // Guest -> host.
    let mut out = vec![0u8; VNET_HDR_LEN];
    let eth = eth_frame(300, 0x5a);
    out.extend(&eth);
    mem.write_slice(&out, GuestAddress(TX_BUF)).unwrap();
    let mut txq = txq;
    txq.push(&mem, &[rd(TX_BUF, out.len() as u32)]);
    net.process_queue(TX_QUEUE, &mut tx, &mem).unwrap();
    assert_eq!(net.counters().tx_frames, 1);
    let mut buf = vec![0u8; 2048];
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert_eq!(n as usize, eth.len(), "{}", std::io::Error::last_os_error());
    assert_eq!(&buf[..eth.len()], &eth[..]);

    // Host -> guest.
    let mut rxq = rxq;
    for i in 0..16u64 {
        rxq.push(&mem, &[wr(RX_BUF + i * 0x1000, 2048)]);
    }
    let eth = eth_frame(400, 0xa5);
    // SAFETY: sockaddr_ll is plain old data; all zeros is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_ifindex = ifindex as i32;
    sa.sll_halen = 6;
    sa.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    // SAFETY: sendto reads `eth.len()` bytes and a sockaddr_ll of the size given.
    let n = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            eth.as_ptr().cast(),
            eth.len(),
            0,
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(n as usize, eth.len(), "{}", std::io::Error::last_os_error());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let found = loop {
        net.process_queue(RX_QUEUE, &mut rx, &mem).unwrap();
        let used = rxq.used_index(&mem);
        let hit = (0..used).find(|&i| {
            let (head, len) = rxq.used_elem(&mem, i);
            let mut got = vec![0u8; len as usize];
            mem.read_slice(&mut got, GuestAddress(RX_BUF + u64::from(head) * 0x1000))
                .unwrap();
            got.len() == VNET_HDR_LEN + eth.len() && got[VNET_HDR_LEN..] == eth[..]
        });
        if hit.is_some() || std::time::Instant::now() > deadline {
            break hit;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(found.is_some(), "the host's frame reached no guest buffer");
}

/// The VMM's path: a frame arriving on the tap wakes the event loop
/// ([`TapWatcher`]), which runs the receive queue through the transport
/// and raises the interrupt.
#[test]
fn tap_watcher_delivers_frames_through_the_transport() {
    use crate::virtio::mmio::reg;
    use crate::virtio::mmio::tests::{r, setup_queue_at, w};
    use crate::virtio::MmioTransport;
    use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
    use std::sync::{Arc, Mutex};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    let mem = guest_mem();
    let (ours, peer) = socket_pair();
    let tap = Tap::from_socket(ours, "test").unwrap();
    let watched = tap.try_clone().unwrap();
    let net = Net::new(tap, MacAddr::default_for("vm", 0)).unwrap();
    let stats = net.stats();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), Box::new(net), irq.try_clone().unwrap()).unwrap();
    assert_eq!(r(&mut t, reg::DEVICE_ID), 1);
    w(&mut t, reg::STATUS, 1);
    w(&mut t, reg::STATUS, 3);
    w(&mut t, reg::DEVICE_FEATURES_SEL, 0);
    let lo = r(&mut t, reg::DEVICE_FEATURES);
    w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
    let hi = r(&mut t, reg::DEVICE_FEATURES);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
    w(&mut t, reg::DRIVER_FEATURES, lo);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut t, reg::DRIVER_FEATURES, hi);
    w(&mut t, reg::STATUS, 0xb);
    setup_queue_at(&mut t, 0, 16, (DESC_ADDR, AVAIL_ADDR, USED_ADDR));
    setup_queue_at(&mut t, 1, 16, (TX_DESC, TX_AVAIL, TX_USED));
    w(&mut t, reg::STATUS, 0xf);
    assert!(t.is_activated());
    let mut rxq = DriverQueue::new(16);
    rxq.push(&mem, &[wr(RX_BUF, 2048)]);

    let t = Arc::new(Mutex::new(t));
    let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
    em.add_subscriber(Box::new(TapWatcher::new(
        t.clone(),
        watched,
        "test",
        stats.clone(),
    )));
    let f = frame(0, 100, 1);
    // SAFETY: send reads `f.len()` bytes from a live slice.
    let n = unsafe { libc::send(peer.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(n as usize, f.len());
    assert!(em.run_with_timeout(1000).unwrap() >= 1);
    assert_eq!(rxq.used_index(&mem), 1);
    assert_eq!(rxq.used_elem(&mem, 0).1, f.len() as u32);
    assert_eq!(irq.read().unwrap(), 1);
    // What the VMM reads without the transport's lock.
    let snap = stats.snapshot();
    assert_eq!(snap.tap_wakeups, 1);
    assert_eq!(
        (snap.counters.rx_frames, snap.counters.rx_interrupts),
        (1, 1)
    );
    assert!(!snap.rx_frame_waiting);
    // Both sides' indices, as a stall report shows them.
    let q = t.lock().unwrap().queue_states()[RX_QUEUE];
    assert!(q.ready && q.event_idx);
    assert_eq!(
        (q.avail_idx, q.next_avail, q.next_used, q.used_idx),
        (1, 1, 1, 1)
    );
}
