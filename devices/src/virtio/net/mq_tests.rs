//! Multiqueue: the queue layout and features per pair count, the control
//! queue's answers (malformed requests included), and tap queues
//! attached and detached as the driver sets its pair count.

use std::os::fd::{AsRawFd, OwnedFd};

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_CTRL_RX, VIRTIO_NET_ERR,
    VIRTIO_NET_OK,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::tests::socket_pair;
use super::*;
use crate::virtio::mmio::reg;
use crate::virtio::mmio::tests::{r, setup_queue_at, w};
use crate::virtio::testutil::*;
use crate::virtio::MmioTransport;

/// Where the control queue's request bytes and status byte go.
const REQ: u64 = 0x2_0000;
const STATUS: u64 = 0x2_1000;
/// Second pair's rings and buffers.
const RX1_DESC: u64 = 0x4000;
const RX1_AVAIL: u64 = 0x5000;
const RX1_USED: u64 = 0x6000;
const TX1_DESC: u64 = 0x7000;
const TX1_AVAIL: u64 = 0x8000;
const TX1_USED: u64 = 0x9000;
const BUF: u64 = 0x3_0000;

/// A device with `pairs` pairs on socket pairs, activated with every
/// feature it offers, and the network ends of its tap queues.
fn device(pairs: usize) -> (Net, Vec<OwnedFd>, GuestMemoryMmap) {
    let (mut taps, mut peers) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (ours, peer) = socket_pair();
        taps.push(Tap::from_socket(ours, &format!("q{i}")).unwrap());
        peers.push(peer);
    }
    let mut net = Net::with_taps(taps, MacAddr::default_for("vm", 0)).unwrap();
    let mem = guest_mem();
    net.activate(net.avail_features(), &mut [], &mem).unwrap();
    (net, peers, mem)
}

fn attached(net: &Net) -> Vec<bool> {
    net.taps().iter().map(Tap::is_attached).collect()
}

/// A control queue over the default test rings.
fn ctrl_queue() -> (DriverQueue, Queue) {
    let d = DriverQueue::new(16);
    let mut q = d.device_queue(CTRL_QUEUE_SIZE);
    q.set_event_idx(false);
    (d, q)
}

/// Sends the control request `req` (header and data) with a status byte
/// and runs the control queue; returns (used length, status byte).
fn request(
    net: &mut Net,
    mem: &GuestMemoryMmap,
    d: &mut DriverQueue,
    q: &mut Queue,
    req: &[u8],
) -> (u32, u8) {
    mem.write_slice(req, GuestAddress(REQ)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let n = d.used_index(mem);
    d.push(mem, &[rd(REQ, req.len() as u32), wr(STATUS, 1)]);
    let ctrl = 2 * net.max_pairs();
    net.process_queue(ctrl, q, mem).unwrap();
    assert_eq!(d.used_index(mem), n.wrapping_add(1));
    let (_, len) = d.used_elem(mem, n);
    (len, mem.read_obj(GuestAddress(STATUS)).unwrap())
}

fn set_pairs(n: u16) -> Vec<u8> {
    let mut r = vec![
        VIRTIO_NET_CTRL_MQ as u8,
        VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8,
    ];
    r.extend_from_slice(&n.to_le_bytes());
    r
}

const OK: (u32, u8) = (1, VIRTIO_NET_OK as u8);
const ERR: (u32, u8) = (1, VIRTIO_NET_ERR as u8);

fn config_pairs(net: &Net) -> u16 {
    let mut b = [0u8; 2];
    net.read_config(8, &mut b);
    u16::from_le_bytes(b)
}

/// One pair is the device as before multiqueue: two queues, neither MQ
/// nor CTRL_VQ, `max_virtqueue_pairs` 1, and no tap queue is touched.
#[test]
fn one_pair_is_the_device_without_multiqueue() {
    let (net, _peers, _mem) = device(1);
    assert_eq!(net.queue_max_sizes(), &[QUEUE_SIZE, QUEUE_SIZE]);
    let f = net.avail_features();
    assert_eq!(f & (1 << VIRTIO_NET_F_MQ), 0);
    assert_eq!(f & (1 << VIRTIO_NET_F_CTRL_VQ), 0);
    assert_eq!(net.queues_in_use(f), 2);
    assert_eq!(config_pairs(&net), 1);
    assert_eq!(attached(&net), [true]);
    // Net::new is that device.
    let (ours, _peer) = socket_pair();
    let single = Net::new(
        Tap::from_socket(ours, "t").unwrap(),
        MacAddr::default_for("vm", 0),
    )
    .unwrap();
    assert_eq!(single.queue_max_sizes(), net.queue_max_sizes());
    assert_eq!(single.avail_features(), f);
    assert_eq!(single.stats().snapshot().pairs.len(), 1);
}

/// N pairs: MQ and CTRL_VQ, rx0, tx0, ..., then the control queue; the
/// queues the driver must set up follow what it acked (5.1.2).
#[test]
fn pairs_lay_out_their_queues_then_the_control_queue() {
    let (net, _peers, _mem) = device(3);
    let mut sizes = vec![QUEUE_SIZE; 6];
    sizes.push(CTRL_QUEUE_SIZE);
    assert_eq!(net.queue_max_sizes(), sizes.as_slice());
    let f = net.avail_features();
    assert_ne!(f & (1 << VIRTIO_NET_F_MQ), 0);
    assert_ne!(f & (1 << VIRTIO_NET_F_CTRL_VQ), 0);
    assert_eq!(config_pairs(&net), 3);
    assert_eq!(net.queues_in_use(f), 7);
    assert_eq!(net.queues_in_use(f & !(1 << VIRTIO_NET_F_MQ)), 3);
    assert_eq!(
        net.queues_in_use(f & !(1 << VIRTIO_NET_F_MQ) & !(1 << VIRTIO_NET_F_CTRL_VQ)),
        2
    );
    // The driver starts on the first pair: the others' tap queues are
    // detached from creation on.
    assert_eq!(net.active_pairs(), 1);
    assert_eq!(attached(&net), [true, false, false]);
    assert!(matches!(
        Net::with_taps(Vec::new(), MacAddr::default_for("vm", 0)),
        Err(Error::Pairs(0))
    ));
}

/// VQ_PAIRS_SET with 1..=N is answered OK and attaches exactly the first
/// N tap queues; 0, N+1, other classes and commands are answered ERR and
/// change nothing.
#[test]
fn the_control_queue_sets_the_pairs_and_refuses_the_rest() {
    let (mut net, _peers, mem) = device(3);
    let (mut d, mut q) = ctrl_queue();
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(3)), OK);
    assert_eq!((net.active_pairs(), attached(&net)), (3, vec![true; 3]));
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(2)), OK);
    assert_eq!(attached(&net), [true, true, false]);
    for bad in [0, 4, 0x8000] {
        assert_eq!(
            request(&mut net, &mem, &mut d, &mut q, &set_pairs(bad)),
            ERR,
            "{bad}"
        );
    }
    assert_eq!(attached(&net), [true, true, false]);
    // CTRL_RX (promiscuous mode) is not offered; an unknown MQ command,
    // and a pairs command without its count, are not understood.
    let rx_promisc = [VIRTIO_NET_CTRL_RX as u8, 0, 1];
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &rx_promisc), ERR);
    assert_eq!(
        request(
            &mut net,
            &mem,
            &mut d,
            &mut q,
            &[VIRTIO_NET_CTRL_MQ as u8, 1, 0, 0]
        ),
        ERR
    );
    assert_eq!(
        request(&mut net, &mem, &mut d, &mut q, &set_pairs(1)[..3]),
        ERR
    );
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(1)), OK);
    assert_eq!(
        (net.active_pairs(), attached(&net)),
        (1, vec![true, false, false])
    );
    let c = net.counters();
    assert_eq!((c.ctrl_ok, c.ctrl_err, c.ctrl_bad_chains), (3, 6, 0));
    let s = net.stats().snapshot();
    assert_eq!((s.counters.ctrl_ok, s.active_pairs), (3, 1));
}

/// A control chain that cannot be answered (no writable status byte, a
/// header cut short, a descriptor outside guest RAM) is returned with
/// nothing written and counted; the queue serves the next request.
#[test]
fn malformed_control_chains_are_returned_empty_and_counted() {
    let (mut net, _peers, mem) = device(2);
    let (mut d, mut q) = ctrl_queue();
    let ctrl = 2 * net.max_pairs();
    mem.write_slice(&set_pairs(2), GuestAddress(REQ)).unwrap();
    let chains: [&[Buf]; 5] = [
        &[rd(REQ, 4)],
        &[rd(REQ, 1), wr(STATUS, 1)],
        &[wr(STATUS, 1)],
        &[rd(REQ, 4), wr(MEM_SIZE as u64, 1)],
        &[rd(MEM_SIZE as u64 - 2, 4), wr(STATUS, 1)],
    ];
    for (i, bufs) in chains.iter().enumerate() {
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        d.push(&mem, bufs);
        net.process_queue(ctrl, &mut q, &mem).unwrap();
        assert_eq!(d.used_index(&mem), i as u16 + 1);
        assert_eq!(d.used_elem(&mem, i as u16).1, 0, "chain {i}");
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
            0xff,
            "chain {i}"
        );
    }
    assert_eq!(net.counters().ctrl_bad_chains, 5);
    assert_eq!(net.active_pairs(), 1);
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(2)), OK);
    assert_eq!(net.active_pairs(), 2);
}

/// Without MQ acked, the pairs command is refused, and a CTRL_VQ-only
/// driver finds the control queue at index 2.
#[test]
fn without_mq_the_control_queue_follows_the_first_pair() {
    let (mut net, _peers, mem) = device(2);
    net.reset();
    let f = net.avail_features() & !(1 << VIRTIO_NET_F_MQ);
    net.activate(f, &mut [], &mem).unwrap();
    let (mut d, mut q) = ctrl_queue();
    mem.write_slice(&set_pairs(2), GuestAddress(REQ)).unwrap();
    d.push(&mem, &[rd(REQ, 4), wr(STATUS, 1)]);
    net.process_queue(2, &mut q, &mem).unwrap();
    assert_eq!(d.used_elem(&mem, 0).1, 1);
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_NET_ERR as u8
    );
    assert_eq!(net.active_pairs(), 1);
}

/// Each pair moves frames on its own tap queue, counted per pair and in
/// the totals; a detached pair's receive queue is not run.
#[test]
fn each_pair_has_its_own_tap_queue_and_counters() {
    let (mut net, peers, mem) = device(2);
    let (mut d, mut q) = ctrl_queue();
    // Receive on pair 1 before the driver uses it: not read.
    let rxd = DriverQueue::at(16, RX1_DESC, RX1_AVAIL, RX1_USED);
    let mut rx1 = rxd.device_queue(QUEUE_SIZE);
    rx1.set_event_idx(false);
    let mut rxd = rxd;
    rxd.push(&mem, &[wr(BUF, 4096)]);
    let frame = [7u8; VNET_HDR_LEN + 60];
    // SAFETY: send reads `frame.len()` bytes from a live array.
    let n = unsafe { libc::send(peers[1].as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n as usize, frame.len());
    assert!(!net.process_queue(2, &mut rx1, &mem).unwrap());
    assert_eq!(rxd.used_index(&mem), 0);
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(2)), OK);
    assert!(net.process_queue(2, &mut rx1, &mem).unwrap());
    assert_eq!(rxd.used_index(&mem), 1);
    // Transmit on pair 1 goes out on its tap queue, not the first.
    let mut txd = DriverQueue::at(16, TX1_DESC, TX1_AVAIL, TX1_USED);
    let mut tx1 = txd.device_queue(QUEUE_SIZE);
    tx1.set_event_idx(false);
    mem.write_slice(&frame, GuestAddress(BUF + 0x2000)).unwrap();
    txd.push(&mem, &[rd(BUF + 0x2000, frame.len() as u32)]);
    net.process_queue(3, &mut tx1, &mem).unwrap();
    let mut buf = [0u8; 256];
    let recv = |fd: &OwnedFd, buf: &mut [u8]| {
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        }
    };
    assert_eq!(recv(&peers[1], &mut buf), frame.len() as isize);
    assert!(recv(&peers[0], &mut buf) < 0);
    let (p0, p1) = (net.pair_counters(0), net.pair_counters(1));
    assert_eq!((p0.rx_frames, p0.tx_frames), (0, 0));
    assert_eq!((p1.rx_frames, p1.tx_frames), (1, 1));
    let s = net.stats().snapshot();
    assert_eq!((s.counters.rx_frames, s.counters.tx_frames), (1, 1));
    assert_eq!(s.pairs[1].rx_bytes, frame.len() as u64);
    assert_eq!(s.active_pairs, 2);
}

/// A frame waiting for receive buffers in a pair the driver stops using
/// is dropped with it, so no frame shows as waiting for ever.
#[test]
fn a_pair_taken_out_of_use_drops_its_waiting_frame() {
    let (mut net, peers, mem) = device(2);
    let (mut d, mut q) = ctrl_queue();
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(2)), OK);
    let mut rx1 = DriverQueue::at(16, RX1_DESC, RX1_AVAIL, RX1_USED).device_queue(QUEUE_SIZE);
    rx1.set_event_idx(false);
    let frame = [1u8; VNET_HDR_LEN + 60];
    // SAFETY: send reads `frame.len()` bytes from a live array.
    let n = unsafe { libc::send(peers[1].as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n as usize, frame.len());
    // No receive buffers: the frame waits.
    net.process_queue(2, &mut rx1, &mem).unwrap();
    assert!(net.stats().snapshot().rx_frame_waiting);
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(1)), OK);
    assert!(!net.stats().snapshot().rx_frame_waiting);
}

/// A reset (and a new activation) goes back to the first pair only.
#[test]
fn reset_goes_back_to_one_pair() {
    let (mut net, _peers, mem) = device(2);
    let (mut d, mut q) = ctrl_queue();
    assert_eq!(request(&mut net, &mem, &mut d, &mut q, &set_pairs(2)), OK);
    net.reset();
    assert_eq!((net.active_pairs(), attached(&net)), (1, vec![true, false]));
    assert_eq!(net.stats().snapshot().active_pairs, 1);
    net.activate(net.avail_features(), &mut [], &mem).unwrap();
    assert_eq!(net.active_pairs(), 1);
}

/// Queue `k`'s rings for the transport test: 16 entries each, apart.
fn rings(k: u64) -> (u64, u64, u64) {
    let base = 0x4_0000 + k * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}

/// Through virtio-mmio: with MQ acked, DRIVER_OK needs every pair's
/// queues and the control queue set up; then a control request written
/// to QueueNotify is answered at once and interrupts the driver.
#[test]
fn a_driver_sets_the_pairs_through_the_transport() {
    let (mut taps, mut peers) = (Vec::new(), Vec::new());
    for i in 0..2 {
        let (ours, peer) = socket_pair();
        taps.push(Tap::from_socket(ours, &format!("q{i}")).unwrap());
        peers.push(peer);
    }
    let net = Net::with_taps(taps, MacAddr::default_for("vm", 0)).unwrap();
    let stats = net.stats();
    let mem = guest_mem();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), Box::new(net), irq.try_clone().unwrap()).unwrap();
    let init = |t: &mut MmioTransport, queues: u32| {
        w(t, reg::STATUS, 0);
        w(t, reg::STATUS, 1);
        w(t, reg::STATUS, 3);
        for sel in 0..2 {
            w(t, reg::DEVICE_FEATURES_SEL, sel);
            let f = r(t, reg::DEVICE_FEATURES);
            w(t, reg::DRIVER_FEATURES_SEL, sel);
            w(t, reg::DRIVER_FEATURES, f);
        }
        w(t, reg::STATUS, 0xb);
        for k in 0..queues {
            setup_queue_at(t, k, 16, rings(u64::from(k)));
        }
        w(t, reg::STATUS, 0xf);
    };
    // The fifth queue (control) missing: the device needs a reset.
    w(&mut t, reg::QUEUE_SEL, 4);
    assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), u32::from(CTRL_QUEUE_SIZE));
    init(&mut t, 4);
    assert!(!t.is_activated());
    init(&mut t, 5);
    assert!(t.is_activated());
    assert_eq!(stats.snapshot().active_pairs, 1);
    // The failed activation's configuration interrupt.
    let _ = irq.read();
    let (desc, avail, used) = rings(4);
    let mut d = DriverQueue::at(16, desc, avail, used);
    mem.write_slice(&set_pairs(2), GuestAddress(REQ)).unwrap();
    d.push(&mem, &[rd(REQ, 4), wr(STATUS, 1)]);
    w(&mut t, reg::QUEUE_NOTIFY, 4);
    assert_eq!(d.used_index(&mem), 1);
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        VIRTIO_NET_OK as u8
    );
    assert_eq!(irq.read().unwrap(), 1);
    assert_eq!(stats.snapshot().active_pairs, 2);
    // A reset goes back to one pair.
    w(&mut t, reg::STATUS, 0);
    assert_eq!(stats.snapshot().active_pairs, 1);
}
