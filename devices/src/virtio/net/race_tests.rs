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

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::bus::BusDevice;
use crate::virtio::mmio::reg;
use crate::virtio::mmio::tests::setup_queue_at;
use crate::virtio::testutil::*;
use crate::virtio::{MmioNotifier, MmioTransport};

const SIZE: u16 = 256;
const BUF_LEN: u32 = 1536;
const TX_RINGS: (u64, u64, u64) = (0x4000, 0x5000, 0x6000);
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

fn socket_pair() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array it is given.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    // SAFETY: both fds were just created and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A transport with `net`, both queues set up by a
/// driver that acked every feature (EVENT_IDX and MRG_RXBUF among them).
fn activated(mem: &GuestMemoryMmap, net: Net, irq: &EventFd) -> MmioTransport {
    let mut t = MmioTransport::new(mem.clone(), Box::new(net), irq.try_clone().unwrap()).unwrap();
    let w = |t: &mut MmioTransport, off: u64, v: u32| t.write(off, &v.to_le_bytes());
    let r = |t: &mut MmioTransport, off: u64| {
        let mut d = [0u8; 4];
        t.read(off, &mut d);
        u32::from_le_bytes(d)
    };
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
    setup_queue_at(&mut t, 1, SIZE, TX_RINGS);
    w(&mut t, reg::STATUS, 0xf);
    assert!(t.is_activated());
    t
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
