use std::sync::{Arc, Mutex};

use crate::GuestMemoryMmap;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::bus::BusDevice;
use crate::virtio::mmio::tests::{r, setup_queue_at, w};
use crate::virtio::mmio::{reg, MmioTransport};
use crate::virtio::testutil::*;

/// Queue `k`'s rings (inflate, deflate, statistics, reporting), below the
/// data buffers.
fn rings(k: u64) -> (u64, u64, u64) {
    let base = 0x1000 + k * 0x3000;
    (base, base + 0x1000, base + 0x2000)
}

/// Every feature acked, as Linux with free page reporting does.
const ALL: Features = Features {
    stats: true,
    deflate_on_oom: true,
    free_page_reporting: true,
};

/// What the hook saw: each call's ranges, and the inflate queue's used
/// index at that moment (the chain must not be returned yet).
type Seen = Arc<Mutex<Vec<(Vec<(u64, u64)>, u16)>>>;

/// A balloon with all its queues set up (size 16) and a hook that records
/// its calls and gives every page back.
struct Rig {
    mem: GuestMemoryMmap,
    dq: Vec<DriverQueue>,
    q: Vec<Queue>,
    dev: Balloon,
    seen: Seen,
}

impl Rig {
    fn new(features: Features) -> Self {
        let mem = guest_mem();
        let seen: Seen = Arc::default();
        let (s, m) = (seen.clone(), mem.clone());
        let report_used = DriverQueue::at(16, rings(3).0, rings(3).1, rings(3).2);
        let inflate_used = DriverQueue::at(16, rings(0).0, rings(0).1, rings(0).2);
        let hook: DiscardHook = Arc::new(move |ranges: &[(u64, u64)]| {
            // The used index of whichever queue the chain came from is
            // checked by the tests; record both by their sum.
            let u = inflate_used
                .used_index(&m)
                .wrapping_add(report_used.used_index(&m));
            s.lock().unwrap().push((ranges.to_vec(), u));
            ranges.iter().map(|&(_, l)| l / BALLOON_PAGE).sum()
        });
        let mut dev = Balloon::new(features, hook);
        let n = dev.queue_max_sizes().len();
        let dq: Vec<DriverQueue> = (0..n as u64)
            .map(|k| {
                let (d, a, u) = rings(k);
                DriverQueue::at(16, d, a, u)
            })
            .collect();
        let q = dq.iter().map(|d| d.device_queue(QUEUE_SIZE)).collect();
        dev.activate(dev.avail_features(), &mut [], &mem).unwrap();
        Self {
            mem,
            dq,
            q,
            dev,
            seen,
        }
    }

    fn run(&mut self, k: usize) -> bool {
        self.dev
            .process_queue(k, &mut self.q[k], &self.mem)
            .unwrap()
    }

    fn used(&self, k: usize) -> u16 {
        self.dq[k].used_index(&self.mem)
    }

    /// Writes little-endian PFNs at `addr`.
    fn pfns(&self, addr: u64, pfns: &[u32]) -> u32 {
        let b: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.mem.write_slice(&b, GuestAddress(addr)).unwrap();
        b.len() as u32
    }
}

#[test]
fn inflated_pages_are_given_back_before_the_chain_returns() {
    let mut rig = Rig::new(ALL);
    let len = rig.pfns(DATA_ADDR, &[16, 18, 17, 40, 17]);
    rig.dq[0].push(&rig.mem, &[rd(DATA_ADDR, len)]);
    assert!(rig.run(0), "the driver is told the chain is back");
    assert_eq!(rig.used(0), 1);
    let seen = rig.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(vec![(16 << 12, 3 << 12), (40 << 12, 1 << 12)], 0)],
        "one call, sorted and merged ranges, made before the chain was returned"
    );
    let c = rig.dev.state().counters();
    assert_eq!(
        (c.inflated_pages, c.returned_pages, c.bad_ranges),
        (4, 4, 0)
    );
}

#[test]
fn pfns_outside_guest_ram_are_skipped_and_counted() {
    let mut rig = Rig::new(ALL);
    // 1 MiB of RAM: PFN 256 is its end, PFN 2^20 far beyond.
    let len = rig.pfns(DATA_ADDR, &[255, 256, 1 << 20, u32::MAX]);
    rig.dq[0].push(&rig.mem, &[rd(DATA_ADDR, len)]);
    rig.run(0);
    assert_eq!(rig.used(0), 1);
    let c = rig.dev.state().counters();
    assert_eq!((c.inflated_pages, c.bad_ranges), (1, 3));
    assert_eq!(rig.seen.lock().unwrap()[0].0, vec![(255 << 12, 1 << 12)]);
}

#[test]
fn malformed_chains_are_counted_and_returned_untouched() {
    let mut rig = Rig::new(ALL);
    rig.pfns(DATA_ADDR, &[20, 21]);
    // A writable PFN buffer, a partial PFN, a buffer outside RAM, too many
    // PFNs.
    rig.dq[0].push(&rig.mem, &[wr(DATA_ADDR, 8)]);
    rig.dq[0].push(&rig.mem, &[rd(DATA_ADDR, 6)]);
    rig.dq[0].push(&rig.mem, &[rd(MEM_SIZE as u64 - 4, 8)]);
    rig.dq[0].push(&rig.mem, &[rd(DATA_ADDR, 4 * (pages::MAX_PFNS as u32 + 1))]);
    rig.run(0);
    assert_eq!(rig.used(0), 4, "every chain goes back");
    assert!(rig.seen.lock().unwrap().is_empty(), "nothing given back");
    let c = rig.dev.state().counters();
    assert_eq!((c.bad_chains, c.inflated_pages), (4, 0));
    // The deflate queue takes the same checks.
    rig.dq[1].push(&rig.mem, &[wr(DATA_ADDR, 8)]);
    rig.run(1);
    assert_eq!(rig.used(1), 1);
    assert_eq!(rig.dev.state().counters().bad_chains, 5);
}

#[test]
fn deflated_pages_are_counted_and_not_given_back() {
    let mut rig = Rig::new(ALL);
    let len = rig.pfns(DATA_ADDR, &[30, 31, 32]);
    rig.dq[1].push(&rig.mem, &[rd(DATA_ADDR, len)]);
    assert!(rig.run(1));
    assert_eq!(rig.used(1), 1);
    assert!(rig.seen.lock().unwrap().is_empty());
    assert_eq!(rig.dev.state().counters().deflated_pages, 3);
}

#[test]
fn a_free_page_report_is_given_back_before_its_buffers_return() {
    let mut rig = Rig::new(ALL);
    // Two 2 MiB-style ranges (scaled to this RAM), one unaligned, one past
    // the end of RAM.
    rig.dq[3].push(
        &rig.mem,
        &[
            wr(0x4_0000, 0x2_0000),
            wr(0x8_0000, 0x1_0000),
            wr(0x9_0800, 0x1000),
            wr(0xf_0000, 0x2_0000),
        ],
    );
    assert!(rig.run(3));
    assert_eq!(rig.used(3), 1);
    let seen = rig.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(vec![(0x4_0000, 0x2_0000), (0x8_0000, 0x1_0000)], 0)]
    );
    let c = rig.dev.state().counters();
    assert_eq!(
        (c.reports, c.reported_pages, c.returned_pages, c.bad_ranges),
        (1, 48, 48, 2)
    );
}

#[test]
fn statistics_are_read_and_their_buffer_held_until_fresh_ones_are_wanted() {
    let mut rig = Rig::new(ALL);
    let mut b = Vec::new();
    for (tag, val) in [(4u16, 100u64 << 20), (5, 512 << 20), (99, 7)] {
        b.extend(tag.to_le_bytes());
        b.extend(val.to_le_bytes());
    }
    rig.mem.write_slice(&b, GuestAddress(DATA_ADDR)).unwrap();
    rig.dq[2].push(&rig.mem, &[rd(DATA_ADDR, b.len() as u32)]);
    assert!(!rig.run(2), "the buffer is held");
    assert_eq!(rig.used(2), 0);
    let s = rig.dev.state().stats().unwrap();
    assert_eq!(s.get("free_memory"), Some(100 << 20));
    assert_eq!(s.get("total_memory"), Some(512 << 20));
    assert_eq!(s.other.get(&99), Some(&7));
    rig.dev.state().want_stats();
    assert!(rig.run(2), "asked for fresh ones: the buffer goes back");
    assert_eq!(rig.used(2), 1);
    assert!(!rig.run(2), "nothing held, nothing to return");
    // A malformed buffer (a partial entry) is held like any, and counted.
    rig.dq[2].push(&rig.mem, &[rd(DATA_ADDR, 15)]);
    rig.run(2);
    assert_eq!(rig.dev.state().counters().bad_chains, 1);
    assert_eq!(rig.dev.state().counters().stats_updates, 1);
}

#[test]
fn queue_numbers_follow_the_acked_features() {
    let v1 = 1u64 << VIRTIO_F_VERSION_1;
    let stats = 1 << VIRTIO_BALLOON_F_STATS_VQ;
    let rep = 1 << VIRTIO_BALLOON_F_REPORTING;
    assert_eq!(Balloon::role(v1 | stats | rep, 2), Some(Role::Stats));
    assert_eq!(Balloon::role(v1 | stats | rep, 3), Some(Role::Reporting));
    assert_eq!(Balloon::role(v1 | rep, 2), Some(Role::Reporting));
    assert_eq!(Balloon::role(v1 | rep, 3), None);
    assert_eq!(Balloon::role(v1, 2), None);
    assert_eq!(Balloon::stats_queue(v1 | rep), None);
    let dev = Balloon::new(ALL, Arc::new(|_: &[(u64, u64)]| 0));
    assert_eq!(dev.queue_max_sizes().len(), 4);
    assert_eq!(dev.queues_in_use(v1 | stats | rep), 4);
    assert_eq!(dev.queues_in_use(v1 | rep), 3);
    assert_eq!(dev.queues_in_use(v1), 2);
    let plain = Balloon::new(Features::default(), Arc::new(|_: &[(u64, u64)]| 0));
    assert_eq!(plain.queue_max_sizes().len(), 2);
    assert_eq!(plain.avail_features(), v1);
}

#[test]
fn the_config_space_has_the_target_and_the_guests_answer() {
    let mut dev = Balloon::new(ALL, Arc::new(|_: &[(u64, u64)]| 0));
    let st = dev.state();
    st.set_target_pages(0x1234);
    let mut c = [0u8; 8];
    dev.read_config(0, &mut c);
    assert_eq!(c, [0x34, 0x12, 0, 0, 0, 0, 0, 0]);
    dev.write_config(4, &0x1000u32.to_le_bytes());
    assert_eq!(st.actual_pages(), 0x1000);
    // num_pages is the host's; a partial write of actual is ignored.
    dev.write_config(0, &7u32.to_le_bytes());
    dev.write_config(4, &[1, 2]);
    assert_eq!((st.target_pages(), st.actual_pages()), (0x1234, 0x1000));
    let mut tail = [0xffu8; 8];
    dev.read_config(12, &mut tail);
    assert_eq!(tail, [0; 8], "poison_val and beyond read zero");
    dev.reset();
    assert_eq!(st.actual_pages(), 0);
}

/// Through the transport: a driver that acks reporting but not statistics
/// sets up three queues, and the device activates with them (the
/// reporting queue is then queue 2).
#[test]
fn a_driver_without_statistics_activates_with_three_queues() {
    let mem = guest_mem();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let hook: DiscardHook = Arc::new(move |r: &[(u64, u64)]| {
        s.lock().unwrap().push((r.to_vec(), 0));
        0
    });
    let dev = Balloon::new(ALL, hook);
    let mut t = MmioTransport::new(mem.clone(), Box::new(dev), irq).unwrap();
    assert_eq!(r(&mut t, reg::DEVICE_ID), VIRTIO_ID_BALLOON);
    w(&mut t, reg::STATUS, 1);
    w(&mut t, reg::STATUS, 3);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
    w(
        &mut t,
        reg::DRIVER_FEATURES,
        1 << VIRTIO_BALLOON_F_REPORTING,
    );
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut t, reg::DRIVER_FEATURES, 1);
    w(&mut t, reg::STATUS, 0xb);
    for k in 0..3u64 {
        setup_queue_at(&mut t, k as u32, 16, rings(k));
    }
    w(&mut t, reg::STATUS, 0xf);
    assert!(t.is_activated(), "status {:#x}", r(&mut t, reg::STATUS));
    let (d, a, u) = rings(2);
    let mut q = DriverQueue::at(16, d, a, u);
    q.push(&mem, &[wr(0x4_0000, 0x1000)]);
    t.notify_queue(2);
    assert_eq!(q.used_index(&mem), 1);
    assert_eq!(seen.lock().unwrap()[0].0, vec![(0x4_0000, 0x1000)]);
    // The config-change interrupt a new target raises.
    t.notify_config_change();
    let mut b = [0u8; 4];
    t.read(reg::INTERRUPT_STATUS, &mut b);
    assert_ne!(u32::from_le_bytes(b) & 2, 0);
}
