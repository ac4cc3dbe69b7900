//! The receive path against a driver that behaves as Linux's virtio_net
//! does, each on its own thread: the device on an event loop (tap watcher
//! and ioeventfd, as the VMM runs it), the driver polling as NAPI does
//! (EVENT_IDX on both sides, refills only when more than half a budget of
//! buffers is free, kicks only when `avail_event` says so, re-enables its
//! interrupt and polls once more before it sleeps). A lost wake-up on
//! either side stops the stream: the driver waits for an interrupt that
//! does not come while the device waits for a kick that does not come.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::GuestMemoryMmap;
use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::tests::socket_pair;
use super::*;
use crate::virtio::mmio::reg;
use crate::virtio::mmio::tests::{r, setup_queue_at, w};
use crate::virtio::testutil::*;
use crate::virtio::{MmioNotifier, MmioTransport};

const SIZE: u16 = 256;
const BUF_LEN: u32 = 1536;
const TX_RINGS: (u64, u64, u64) = (0x4000, 0x5000, 0x6000);
/// A small transmit queue, so that the driver fills it and stops it
/// often (Linux's is 256, but its frames take several descriptors).
const TX_SIZE: u16 = 16;
/// Where receive buffer `i` lies.
const RX_BUF: u64 = DATA_ADDR;
/// NAPI's budget: frames per poll.
const BUDGET: usize = 64;

/// The driver's side of the receive queue.
struct Driver {
    mem: GuestMemoryMmap,
    shadow: u16,
    /// Buffers added since the last kick check.
    added: u16,
    last_used: u16,
    free: Vec<u16>,
}

/// virtio's `vring_need_event`: whether moving an index from `old` to
/// `new` passes `event`.
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Driver {
    fn load(&self, addr: u64) -> u16 {
        self.mem
            .load(GuestAddress(addr), Ordering::Acquire)
            .unwrap()
    }

    fn store(&self, addr: u64, v: u16) {
        self.mem
            .store(v, GuestAddress(addr), Ordering::Release)
            .unwrap();
    }

    /// Posts every free buffer, publishing the index after each, as
    /// `virtqueue_add` does; then `virtqueue_kick_prepare`.
    fn refill(&mut self) -> bool {
        while let Some(id) = self.free.pop() {
            let d = DESC_ADDR + 16 * u64::from(id);
            let m = &self.mem;
            m.write_obj(RX_BUF + u64::from(id) * u64::from(BUF_LEN), GuestAddress(d))
                .unwrap();
            m.write_obj(BUF_LEN, GuestAddress(d + 8)).unwrap();
            m.write_obj(VRING_DESC_F_WRITE as u16, GuestAddress(d + 12))
                .unwrap();
            let slot = u64::from(self.shadow % SIZE);
            m.write_obj(id, GuestAddress(AVAIL_ADDR + 4 + 2 * slot))
                .unwrap();
            self.shadow = self.shadow.wrapping_add(1);
            self.added = self.added.wrapping_add(1);
            self.store(AVAIL_ADDR + 2, self.shadow);
            // A guest is preempted anywhere: let the device run between
            // buffers, where it reads an index the driver then moves on.
            if id % 4 == 0 {
                std::thread::yield_now();
            }
        }
        fence(Ordering::SeqCst);
        let (new, old) = (self.shadow, self.shadow.wrapping_sub(self.added));
        self.added = 0;
        let avail_event = self.load(USED_ADDR + 4 + 8 * u64::from(SIZE));
        need_event(avail_event, new, old)
    }

    fn get_buf(&mut self) -> Option<(u16, u32)> {
        if self.load(USED_ADDR + 2) == self.last_used {
            return None;
        }
        let e = USED_ADDR + 4 + 8 * u64::from(self.last_used % SIZE);
        let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
        self.last_used = self.last_used.wrapping_add(1);
        Some((id as u16, len))
    }

    /// `virtqueue_enable_cb_prepare` and `virtqueue_poll`: asks for an
    /// interrupt at the next used entry, then whether one came already.
    fn enable_cb_and_poll(&mut self) -> bool {
        self.store(AVAIL_ADDR + 4 + 2 * u64::from(SIZE), self.last_used);
        fence(Ordering::SeqCst);
        self.load(USED_ADDR + 2) != self.last_used
    }

    /// One received frame: its payload (header stripped), gathered over
    /// `num_buffers` used buffers.
    fn receive(&mut self) -> Option<Vec<u8>> {
        let (id, len) = self.get_buf()?;
        let mem = self.mem.clone();
        let read = |id: u16, len: u32| {
            let mut v = vec![0u8; len as usize];
            let at = RX_BUF + u64::from(id) * u64::from(BUF_LEN);
            mem.read_slice(&mut v, GuestAddress(at)).unwrap();
            v
        };
        let mut frame = read(id, len);
        self.free.push(id);
        let n = u16::from_le_bytes([frame[NUM_BUFFERS_OFFSET], frame[NUM_BUFFERS_OFFSET + 1]]);
        for k in 1..n {
            let (id, len) = self
                .get_buf()
                .unwrap_or_else(|| panic!("buffer {k} of {n} of a frame not published with it"));
            frame.extend(read(id, len));
            self.free.push(id);
        }
        Some(frame.split_off(VNET_HDR_LEN))
    }
}

/// Frame `seq` of the stream: its number, then bytes made from it, of a
/// length from a small frame to one that needs 42 buffers (a 64 KiB TCP
/// segment with GSO).
fn payload(seq: u32) -> Vec<u8> {
    let len = 60 + (seq as usize * 7919) % 64000;
    let mut p = seq.to_le_bytes().to_vec();
    p.extend((4..len).map(|i| (i as u32).wrapping_mul(seq | 1) as u8));
    p
}

/// A transport with `net`, both queues set up by a
/// driver that acked every feature (EVENT_IDX and MRG_RXBUF among them).
fn activated(mem: &GuestMemoryMmap, net: Net, irq: &EventFd) -> MmioTransport {
    let mut t = MmioTransport::new(mem.clone(), Box::new(net), irq.try_clone().unwrap()).unwrap();
    w(&mut t, reg::STATUS, 1);
    w(&mut t, reg::STATUS, 3);
    for sel in 0..2 {
        w(&mut t, reg::DEVICE_FEATURES_SEL, sel);
        let f = r(&mut t, reg::DEVICE_FEATURES);
        w(&mut t, reg::DRIVER_FEATURES_SEL, sel);
        w(&mut t, reg::DRIVER_FEATURES, f);
    }
    w(&mut t, reg::STATUS, 0xb);
    setup_queue_at(&mut t, 0, SIZE, (DESC_ADDR, AVAIL_ADDR, USED_ADDR));
    setup_queue_at(&mut t, 1, TX_SIZE, TX_RINGS);
    w(&mut t, reg::STATUS, 0xf);
    assert!(t.is_activated());
    t
}

/// Where transmit buffer `i` lies, and its size.
const TX_BUF: u64 = 0x8_0000;
const TX_BUF_LEN: u64 = 0x800;
/// Linux stops its transmit queue when fewer descriptors than a frame
/// may need (2 + MAX_SKB_FRAGS) are free; here a frame needs one.
const TX_STOP_BELOW: usize = 2;

/// The driver's side of the transmit queue, as `start_xmit` and the
/// transmit NAPI of Linux's virtio_net use it.
struct TxDriver {
    mem: GuestMemoryMmap,
    shadow: u16,
    added: u16,
    last_used: u16,
    free: Vec<u16>,
    stopped: bool,
}

impl TxDriver {
    fn load(&self, addr: u64) -> u16 {
        self.mem
            .load(GuestAddress(addr), Ordering::Acquire)
            .unwrap()
    }

    /// `free_old_xmit_skbs`.
    fn reclaim(&mut self) {
        let (_, _, used) = TX_RINGS;
        while self.load(used + 2) != self.last_used {
            let e = used + 4 + 8 * u64::from(self.last_used % TX_SIZE);
            let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
            self.free.push(id as u16);
            self.last_used = self.last_used.wrapping_add(1);
        }
    }

    /// `virtqueue_enable_cb_delayed`: an interrupt once three quarters of
    /// the frames in flight are sent; false if they are already.
    fn enable_cb_delayed(&mut self) -> bool {
        let (_, avail, used) = TX_RINGS;
        let bufs = self.shadow.wrapping_sub(self.last_used) * 3 / 4;
        let event = self.last_used.wrapping_add(bufs);
        self.mem
            .store(
                event,
                GuestAddress(avail + 4 + 2 * u64::from(TX_SIZE)),
                Ordering::Release,
            )
            .unwrap();
        fence(Ordering::SeqCst);
        self.load(used + 2).wrapping_sub(self.last_used) <= bufs
    }

    /// `start_xmit` of one frame; whether to kick.
    fn xmit(&mut self, frame: &[u8]) -> bool {
        let (desc, avail, used) = TX_RINGS;
        self.reclaim();
        let id = self.free.pop().expect("xmit on a stopped queue");
        let at = TX_BUF + u64::from(id) * TX_BUF_LEN;
        self.mem.write_slice(frame, GuestAddress(at)).unwrap();
        let d = desc + 16 * u64::from(id);
        self.mem.write_obj(at, GuestAddress(d)).unwrap();
        self.mem
            .write_obj(frame.len() as u32, GuestAddress(d + 8))
            .unwrap();
        self.mem.write_obj(0u16, GuestAddress(d + 12)).unwrap();
        let slot = u64::from(self.shadow % TX_SIZE);
        self.mem
            .write_obj(id, GuestAddress(avail + 4 + 2 * slot))
            .unwrap();
        self.shadow = self.shadow.wrapping_add(1);
        self.added = self.added.wrapping_add(1);
        self.mem
            .store(self.shadow, GuestAddress(avail + 2), Ordering::Release)
            .unwrap();
        if self.free.len() < TX_STOP_BELOW {
            self.stopped = true;
            if !self.enable_cb_delayed() {
                self.reclaim();
                self.stopped = self.free.len() < TX_STOP_BELOW;
            }
        }
        fence(Ordering::SeqCst);
        let (new, old) = (self.shadow, self.shadow.wrapping_sub(self.added));
        self.added = 0;
        let avail_event = self.load(used + 4 + 8 * u64::from(TX_SIZE));
        need_event(avail_event, new, old)
    }
}

/// Waits up to `ms` for the interrupt line (the irqfd); consumes it.
fn wait_irq(irq: &EventFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: irq.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n > 0 && irq.read().is_ok()
}

/// Frames of every size stream from the tap into a driver that polls as
/// Linux's NAPI does, on their own threads: every frame arrives, whole
/// and in order, and the stream never stops for want of a wake-up.
#[test]
fn a_linux_like_driver_receives_a_stream_without_stalling() {
    const FRAMES: u32 = 2500;
    /// Longest the stream may stand still (it moves in microseconds).
    const STALL: Duration = Duration::from_secs(10);
    let mem = guest_mem();
    let (ours, peer) = socket_pair();
    let tap = Tap::from_socket(ours, "race").unwrap();
    let watched = tap.try_clone().unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let net = Net::new(tap, MacAddr::default_for("vm", 0)).unwrap();
    let stats = net.stats();
    let t = Arc::new(Mutex::new(activated(&mem, net, &irq)));
    let kick = t.lock().unwrap().queue_evts()[RX_QUEUE]
        .try_clone()
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let device = {
        let (t, stop) = (t.clone(), stop.clone());
        let notifier = MmioNotifier::new(t.clone()).unwrap();
        let watcher = TapWatcher::new(t, watched, "race", stats.clone());
        std::thread::spawn(move || {
            let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
            em.add_subscriber(Box::new(notifier));
            em.add_subscriber(Box::new(watcher));
            while !stop.load(Ordering::Relaxed) {
                em.run_with_timeout(20).unwrap();
            }
        })
    };
    let network = std::thread::spawn(move || {
        for seq in 0..FRAMES {
            let mut f = vec![0u8; VNET_HDR_LEN];
            f.extend(payload(seq));
            // Blocking: a full socket holds the sender back, so no frame
            // is lost before the device.
            // SAFETY: send reads `f.len()` bytes from a live slice.
            let n = unsafe { libc::send(peer.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
            assert_eq!(n as usize, f.len(), "{}", std::io::Error::last_os_error());
        }
        peer
    });

    let mut d = Driver {
        mem: mem.clone(),
        shadow: 0,
        added: 0,
        last_used: 0,
        free: (0..SIZE).rev().collect(),
    };
    // virtnet_open: fill the ring, kick.
    if d.refill() {
        kick.write(1).unwrap();
    }
    let mut next = 0u32;
    let mut progress = Instant::now();
    while next < FRAMES {
        if !wait_irq(&irq, 100) {
            let state = t.lock().unwrap().queue_states()[RX_QUEUE];
            assert!(
                progress.elapsed() < STALL,
                "the stream stopped at frame {next} of {FRAMES}: driver avail {} last_used {} free {}; queue {state:?}",
                d.shadow,
                d.last_used,
                d.free.len()
            );
            continue;
        }
        // NAPI, until a poll finds less than its budget and nothing came
        // after the interrupt was re-enabled.
        loop {
            let mut got = 0;
            while got < BUDGET {
                let Some(p) = d.receive() else { break };
                assert_eq!(p, payload(next), "frame {next}");
                next += 1;
                got += 1;
                progress = Instant::now();
            }
            if d.free.len() > BUDGET / 2 && d.refill() {
                kick.write(1).unwrap();
            }
            if got == BUDGET || d.enable_cb_and_poll() {
                continue;
            }
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    device.join().unwrap();
    drop(network.join().unwrap());
    let s = stats.snapshot();
    assert_eq!(s.counters.rx_frames, u64::from(FRAMES), "{s:?}");
    assert!(
        s.counters.rx_waits > 0,
        "the device never waited for buffers: {s:?}"
    );
}

/// Frame `seq` the guest sends: its number, then bytes made from it, of
/// a length up to a full Ethernet frame (a TCP ACK is the short end).
fn tx_payload(seq: u32) -> Vec<u8> {
    let len = 54 + (seq as usize * 613) % 1460;
    let mut p = seq.to_le_bytes().to_vec();
    p.extend((4..len).map(|i| (i as u32).wrapping_add(seq) as u8));
    p
}

/// Both ways at once over one interrupt line, as a TCP transfer runs:
/// the stream into the guest as above while the driver sends frames of
/// its own, stopping its transmit queue whenever it fills and waiting
/// for the delayed interrupt (`virtqueue_enable_cb_delayed`) that frees
/// it. Every frame arrives each way, in order; neither direction stops.
#[test]
fn both_directions_share_the_interrupt_without_stalling() {
    const FRAMES: u32 = 1500;
    const TX_FRAMES: u32 = 4000;
    const STALL: Duration = Duration::from_secs(10);
    let mem = guest_mem();
    let (ours, peer) = socket_pair();
    let tap = Tap::from_socket(ours, "race").unwrap();
    let watched = tap.try_clone().unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let net = Net::new(tap, MacAddr::default_for("vm", 0)).unwrap();
    let stats = net.stats();
    let t = Arc::new(Mutex::new(activated(&mem, net, &irq)));
    let (rx_kick, tx_kick) = {
        let t = t.lock().unwrap();
        let e = t.queue_evts();
        (
            e[RX_QUEUE].try_clone().unwrap(),
            e[TX_QUEUE].try_clone().unwrap(),
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let device = {
        let (t, stop) = (t.clone(), stop.clone());
        let notifier = MmioNotifier::new(t.clone()).unwrap();
        let watcher = TapWatcher::new(t, watched, "race", stats.clone());
        std::thread::spawn(move || {
            let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
            em.add_subscriber(Box::new(notifier));
            em.add_subscriber(Box::new(watcher));
            while !stop.load(Ordering::Relaxed) {
                em.run_with_timeout(20).unwrap();
            }
        })
    };
    // SAFETY: dup of a live fd; the new fd is owned by nothing else.
    let reader = unsafe { OwnedFd::from_raw_fd(libc::dup(peer.as_raw_fd())) };
    let network_in = std::thread::spawn(move || {
        for seq in 0..FRAMES {
            let mut f = vec![0u8; VNET_HDR_LEN];
            f.extend(payload(seq));
            // SAFETY: send reads `f.len()` bytes from a live slice.
            let n = unsafe { libc::send(peer.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
            assert_eq!(n as usize, f.len(), "{}", std::io::Error::last_os_error());
        }
        peer
    });
    // The socket pair queues few datagrams (net.unix.max_dgram_qlen) and
    // the device's end does not block, so a frame sent while the queue
    // is full is dropped and counted as a tap write error, which a real
    // tap never returns. The frames that arrive must be whole and in
    // order; with the errors they must make up every frame sent.
    let out_done = Arc::new(AtomicBool::new(false));
    let network_out = {
        let done = out_done.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            let (mut count, mut next) = (0u64, 0u32);
            loop {
                // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
                let n = unsafe {
                    libc::recv(
                        reader.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n <= 0 {
                    if done.load(Ordering::Relaxed) {
                        return count;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                    continue;
                }
                let f = &buf[VNET_HDR_LEN..n as usize];
                let seq = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
                assert!(seq >= next, "sent frame {seq} after {next}");
                assert_eq!(f, &tx_payload(seq)[..], "sent frame {seq}");
                next = seq + 1;
                count += 1;
            }
        })
    };

    let mut rx = Driver {
        mem: mem.clone(),
        shadow: 0,
        added: 0,
        last_used: 0,
        free: (0..SIZE).rev().collect(),
    };
    let mut tx = TxDriver {
        mem: mem.clone(),
        shadow: 0,
        added: 0,
        last_used: 0,
        free: (0..TX_SIZE).rev().collect(),
        stopped: false,
    };
    if rx.refill() {
        rx_kick.write(1).unwrap();
    }
    let (mut next, mut sent) = (0u32, 0u32);
    let mut progress = Instant::now();
    while next < FRAMES || sent < TX_FRAMES {
        // The stack hands the driver a few frames to send, unless the
        // queue is stopped.
        for _ in 0..8 {
            if sent == TX_FRAMES || tx.stopped {
                break;
            }
            let mut f = vec![0u8; VNET_HDR_LEN];
            f.extend(tx_payload(sent));
            if tx.xmit(&f) {
                tx_kick.write(1).unwrap();
            }
            sent += 1;
            progress = Instant::now();
        }
        let busy = sent < TX_FRAMES && !tx.stopped;
        if !wait_irq(&irq, if busy { 0 } else { 100 }) {
            let state = t.lock().unwrap().queue_states();
            assert!(
                progress.elapsed() < STALL,
                "stopped at received {next}/{FRAMES}, sent {sent}/{TX_FRAMES} (queue stopped: {}): rx {:?}, tx {:?}; {:?}",
                tx.stopped,
                state[RX_QUEUE],
                state[TX_QUEUE],
                stats.snapshot()
            );
            continue;
        }
        // The interrupt: the receive NAPI, and transmit completions.
        loop {
            let mut got = 0;
            while got < BUDGET {
                let Some(p) = rx.receive() else { break };
                assert_eq!(p, payload(next), "frame {next}");
                next += 1;
                got += 1;
                progress = Instant::now();
            }
            if rx.free.len() > BUDGET / 2 && rx.refill() {
                rx_kick.write(1).unwrap();
            }
            if got == BUDGET || rx.enable_cb_and_poll() {
                continue;
            }
            break;
        }
        tx.reclaim();
        if tx.stopped && tx.free.len() >= TX_STOP_BELOW {
            tx.stopped = false;
        }
    }
    // The last frames sent: the device takes them all (it writes, or
    // drops, each before it puts it on the used ring).
    let (_, _, tx_used) = TX_RINGS;
    let start = Instant::now();
    while tx.load(tx_used + 2) != tx.shadow {
        assert!(
            start.elapsed() < STALL,
            "the device left sent frames in the queue: {:?}",
            t.lock().unwrap().queue_states()[TX_QUEUE]
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    device.join().unwrap();
    out_done.store(true, Ordering::Relaxed);
    let arrived = network_out.join().unwrap();
    drop(network_in.join().unwrap());
    let s = stats.snapshot();
    let c = s.counters;
    assert_eq!(c.rx_frames, u64::from(FRAMES), "{s:?}");
    assert_eq!(c.tx_frames + c.tx_errors, u64::from(TX_FRAMES), "{s:?}");
    assert_eq!(arrived, c.tx_frames, "{s:?}");
    assert!(c.tx_interrupts > 0 && c.rx_waits > 0, "{s:?}");
}
