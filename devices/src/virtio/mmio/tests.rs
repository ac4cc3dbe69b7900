use std::cell::RefCell;

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::tempfile::TempFile;

use super::*;
use crate::virtio::block::Block;
use crate::virtio::testutil::*;

const STATUS_ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const STATUS_DRV: u32 = VIRTIO_CONFIG_S_DRIVER;
const STATUS_FOK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const STATUS_DOK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;

pub(crate) fn r(t: &mut MmioTransport, off: u64) -> u32 {
    let mut d = [0u8; 4];
    t.read(off, &mut d);
    u32::from_le_bytes(d)
}

pub(crate) fn w(t: &mut MmioTransport, off: u64, v: u32) {
    t.write(off, &v.to_le_bytes());
}

/// A guest with one virtio-blk device (8 sectors) and its driver queue.
pub(crate) struct Harness {
    pub mem: GuestMemoryMmap,
    pub irq: EventFd,
    pub q: RefCell<DriverQueue>,
    _files: RefCell<Vec<TempFile>>,
}

impl Harness {
    pub fn new() -> Self {
        Self {
            mem: guest_mem(),
            irq: EventFd::new(EFD_NONBLOCK).unwrap(),
            q: RefCell::new(DriverQueue::new(16)),
            _files: RefCell::new(Vec::new()),
        }
    }

    pub fn transport_with(&self, read_only: bool) -> MmioTransport {
        let (disk, f) = test_disk(8, read_only);
        self._files.borrow_mut().push(f);
        let blk = Block::new(disk, "pagefold-serial").unwrap();
        MmioTransport::new(
            self.mem.clone(),
            Box::new(blk),
            self.irq.try_clone().unwrap(),
        )
        .unwrap()
    }

    pub fn transport(&self) -> MmioTransport {
        self.transport_with(false)
    }

    /// Queues a GET_ID request: header at DATA, id buffer, status.
    pub fn push_get_id(&self) -> u16 {
        self.mem
            .write_slice(&blk_header(8, 0), GuestAddress(DATA_ADDR))
            .unwrap();
        self.q.borrow_mut().push(
            &self.mem,
            &[
                rd(DATA_ADDR, 16),
                wr(DATA_ADDR + 0x100, 20),
                wr(DATA_ADDR + 0x200, 1),
            ],
        )
    }

    pub fn used_idx(&self) -> u16 {
        DriverQueue::used_idx(&self.mem)
    }

    /// Number of irqfd signals since the last call.
    pub fn irq_count(&self) -> u64 {
        self.irq.read().unwrap_or(0)
    }
}

/// The driver initialisation sequence of virtio 1.x 3.1.1, with queue 0
/// at the test addresses.
pub(crate) fn driver_init(t: &mut MmioTransport, h: &Harness) {
    w(t, reg::STATUS, STATUS_ACK);
    w(t, reg::STATUS, STATUS_ACK | STATUS_DRV);
    w(t, reg::DEVICE_FEATURES_SEL, 1);
    let hi = r(t, reg::DEVICE_FEATURES);
    w(t, reg::DEVICE_FEATURES_SEL, 0);
    let lo = r(t, reg::DEVICE_FEATURES);
    w(t, reg::DRIVER_FEATURES_SEL, 1);
    w(t, reg::DRIVER_FEATURES, hi);
    w(t, reg::DRIVER_FEATURES_SEL, 0);
    w(t, reg::DRIVER_FEATURES, lo);
    w(t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    assert_eq!(r(t, reg::STATUS) & STATUS_FOK, STATUS_FOK);
    setup_queue(t, h.q.borrow().size);
    w(
        t,
        reg::STATUS,
        STATUS_ACK | STATUS_DRV | STATUS_FOK | STATUS_DOK,
    );
}

fn setup_queue(t: &mut MmioTransport, size: u16) {
    setup_queue_at(t, 0, size, (DESC_ADDR, AVAIL_ADDR, USED_ADDR));
}

/// Sets up queue `sel` of `size` with its rings at `(desc, driver area,
/// device area)`, as a driver does between FEATURES_OK and DRIVER_OK.
pub(crate) fn setup_queue_at(t: &mut MmioTransport, sel: u32, size: u16, rings: (u64, u64, u64)) {
    let (d, a, u) = rings;
    w(t, reg::QUEUE_SEL, sel);
    w(t, reg::QUEUE_NUM, u32::from(size));
    w(t, reg::QUEUE_DESC_LOW, d as u32);
    w(t, reg::QUEUE_DESC_HIGH, (d >> 32) as u32);
    w(t, reg::QUEUE_DRIVER_LOW, a as u32);
    w(t, reg::QUEUE_DRIVER_HIGH, (a >> 32) as u32);
    w(t, reg::QUEUE_DEVICE_LOW, u as u32);
    w(t, reg::QUEUE_DEVICE_HIGH, (u >> 32) as u32);
    w(t, reg::QUEUE_READY, 1);
}

#[test]
fn identity_registers() {
    let h = Harness::new();
    let mut t = h.transport();
    assert_eq!(r(&mut t, reg::MAGIC), 0x7472_6976);
    assert_eq!(r(&mut t, reg::VERSION), 2);
    assert_eq!(r(&mut t, reg::DEVICE_ID), 2);
    assert_eq!(r(&mut t, reg::VENDOR_ID), VENDOR_ID);
    assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 256);
    w(&mut t, reg::QUEUE_SEL, 1);
    assert_eq!(r(&mut t, reg::QUEUE_NUM_MAX), 0, "queue 1 does not exist");
    assert_eq!(r(&mut t, reg::SHM_LEN_LOW), u32::MAX);
    // Narrow or misaligned register reads return zeros.
    let mut b = [0xffu8; 2];
    t.read(reg::MAGIC, &mut b);
    assert_eq!(b, [0, 0]);
    let mut b = [0xffu8; 4];
    t.read(reg::MAGIC + 1, &mut b);
    assert_eq!(b, [0; 4]);
}

#[test]
fn feature_words_and_version_1() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::DEVICE_FEATURES_SEL, 1);
    assert_eq!(
        r(&mut t, reg::DEVICE_FEATURES) & 1,
        1,
        "VERSION_1 is bit 32"
    );
    w(&mut t, reg::DEVICE_FEATURES_SEL, 2);
    assert_eq!(r(&mut t, reg::DEVICE_FEATURES), 0);
    w(&mut t, reg::DEVICE_FEATURES_SEL, 0);
    let lo = r(&mut t, reg::DEVICE_FEATURES);
    assert_ne!(lo & (1 << 29), 0, "EVENT_IDX offered");
    assert_eq!(lo & (1 << 5), 0, "RO not offered for a writable disk");
    let ro = h.transport_with(true);
    assert_ne!(
        ro.device.avail_features() & (1 << 5),
        0,
        "RO offered for a read-only disk"
    );
}

#[test]
fn features_ok_refused_without_version_1_or_with_unknown_bits() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::STATUS, STATUS_ACK);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV);
    // Legacy driver: acks only low bits, no VERSION_1.
    w(&mut t, reg::DRIVER_FEATURES_SEL, 0);
    w(&mut t, reg::DRIVER_FEATURES, 1 << 9);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    assert_eq!(r(&mut t, reg::STATUS) & STATUS_FOK, 0);
    // VERSION_1 plus a bit the device never offered.
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut t, reg::DRIVER_FEATURES, 1 | (1 << 20));
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    assert_eq!(r(&mut t, reg::STATUS) & STATUS_FOK, 0);
    // Correct set.
    w(&mut t, reg::DRIVER_FEATURES, 1);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    assert_eq!(r(&mut t, reg::STATUS), STATUS_ACK | STATUS_DRV | STATUS_FOK);
    assert_eq!(t.acked_features(), (1 << 32) | (1 << 9));
    // Features are frozen after FEATURES_OK.
    w(&mut t, reg::DRIVER_FEATURES, 0);
    assert_eq!(t.acked_features(), (1 << 32) | (1 << 9));
}

#[test]
fn status_order_is_enforced() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::STATUS, STATUS_DRV);
    assert_eq!(r(&mut t, reg::STATUS), 0, "DRIVER before ACKNOWLEDGE");
    w(&mut t, reg::STATUS, STATUS_ACK);
    w(
        &mut t,
        reg::STATUS,
        STATUS_ACK | STATUS_DRV | STATUS_FOK | STATUS_DOK,
    );
    assert_eq!(r(&mut t, reg::STATUS), STATUS_ACK, "two steps at once");
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV);
    w(&mut t, reg::STATUS, STATUS_ACK);
    assert_eq!(
        r(&mut t, reg::STATUS),
        STATUS_ACK | STATUS_DRV,
        "clearing a bit"
    );
    w(
        &mut t,
        reg::STATUS,
        STATUS_ACK | STATUS_DRV | VIRTIO_CONFIG_S_FAILED,
    );
    assert_ne!(r(&mut t, reg::STATUS) & VIRTIO_CONFIG_S_FAILED, 0);
}

#[test]
fn queue_registers_only_between_features_ok_and_driver_ok() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::QUEUE_NUM, 16);
    w(&mut t, reg::QUEUE_DESC_LOW, 0x1000);
    assert_eq!(t.queues()[0].size(), 256, "ignored before FEATURES_OK");
    assert_eq!(r(&mut t, reg::QUEUE_DESC_LOW), 0);
    driver_init(&mut t, &h);
    assert!(t.is_activated());
    assert_eq!(t.queues()[0].size(), 16);
    assert_eq!(r(&mut t, reg::QUEUE_DESC_LOW), DESC_ADDR as u32);
    assert_eq!(r(&mut t, reg::QUEUE_DRIVER_LOW), AVAIL_ADDR as u32);
    assert_eq!(r(&mut t, reg::QUEUE_DEVICE_LOW), USED_ADDR as u32);
    assert_eq!(r(&mut t, reg::QUEUE_READY), 1);
    // Frozen after DRIVER_OK.
    w(&mut t, reg::QUEUE_DESC_LOW, 0x8000);
    w(&mut t, reg::QUEUE_READY, 0);
    assert_eq!(r(&mut t, reg::QUEUE_DESC_LOW), DESC_ADDR as u32);
    assert_eq!(r(&mut t, reg::QUEUE_READY), 1);
}

#[test]
fn high_address_words_compose() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::STATUS, STATUS_ACK);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut t, reg::DRIVER_FEATURES, 1);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    w(&mut t, reg::QUEUE_DEVICE_LOW, 0x2000);
    w(&mut t, reg::QUEUE_DEVICE_HIGH, 0x1);
    assert_eq!(t.queues()[0].used_ring(), 0x1_0000_2000);
    assert_eq!(r(&mut t, reg::QUEUE_DEVICE_HIGH), 1);
}

#[test]
fn bad_queue_size_or_alignment_needs_reset() {
    for bad in [
        (reg::QUEUE_NUM, 300u32),        // above the maximum
        (reg::QUEUE_NUM, 12),            // not a power of two
        (reg::QUEUE_DESC_LOW, 0x1008),   // descriptor table needs 16-byte alignment
        (reg::QUEUE_DEVICE_LOW, 0x3002), // used ring needs 4-byte alignment
    ] {
        let h = Harness::new();
        let mut t = h.transport();
        w(&mut t, reg::STATUS, STATUS_ACK);
        w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV);
        w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
        w(&mut t, reg::DRIVER_FEATURES, 1);
        w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
        setup_queue(&mut t, 16);
        w(&mut t, reg::QUEUE_READY, 0);
        w(&mut t, bad.0, bad.1);
        w(&mut t, reg::QUEUE_READY, 1);
        w(
            &mut t,
            reg::STATUS,
            STATUS_ACK | STATUS_DRV | STATUS_FOK | STATUS_DOK,
        );
        assert!(!t.is_activated(), "{bad:?}");
        assert_ne!(
            r(&mut t, reg::STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET,
            0,
            "{bad:?}"
        );
        assert_eq!(
            r(&mut t, reg::INTERRUPT_STATUS),
            VIRTIO_MMIO_INT_CONFIG,
            "{bad:?}"
        );
    }
}

#[test]
fn queue_outside_guest_memory_needs_reset() {
    let h = Harness::new();
    let mut t = h.transport();
    w(&mut t, reg::STATUS, STATUS_ACK);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV);
    w(&mut t, reg::DRIVER_FEATURES_SEL, 1);
    w(&mut t, reg::DRIVER_FEATURES, 1);
    w(&mut t, reg::STATUS, STATUS_ACK | STATUS_DRV | STATUS_FOK);
    setup_queue(&mut t, 16);
    w(&mut t, reg::QUEUE_READY, 0);
    w(&mut t, reg::QUEUE_DEVICE_LOW, MEM_SIZE as u32);
    w(&mut t, reg::QUEUE_READY, 1);
    w(
        &mut t,
        reg::STATUS,
        STATUS_ACK | STATUS_DRV | STATUS_FOK | STATUS_DOK,
    );
    assert!(!t.is_activated());
    assert_ne!(t.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    // Notifies are ignored, nothing is written.
    h.push_get_id();
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(h.used_idx(), 0);
}

#[test]
fn mmio_notify_runs_queue_and_raises_interrupt() {
    let h = Harness::new();
    let mut t = h.transport();
    driver_init(&mut t, &h);
    let head = h.push_get_id();
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(h.used_idx(), 1);
    assert_eq!(h.q.borrow().used_elem(&h.mem, 0), (u32::from(head), 21));
    let mut id = [0u8; 20];
    h.mem
        .read_slice(&mut id, GuestAddress(DATA_ADDR + 0x100))
        .unwrap();
    assert_eq!(&id[..15], b"pagefold-serial");
    assert_eq!(id[15..], [0; 5]);
    assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
    assert_eq!(h.irq_count(), 1);
    w(&mut t, reg::INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
    assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), 0);
    // A notify with nothing new raises no interrupt.
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(h.irq_count(), 0);
    // Notify of a queue that does not exist is ignored.
    w(&mut t, reg::QUEUE_NOTIFY, 7);
}

#[test]
fn reset_returns_to_initial_state() {
    let h = Harness::new();
    let mut t = h.transport();
    driver_init(&mut t, &h);
    h.push_get_id();
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert!(t.is_activated());
    w(&mut t, reg::STATUS, 0);
    assert_eq!(r(&mut t, reg::STATUS), 0);
    assert!(!t.is_activated());
    assert_eq!(t.acked_features(), 0);
    assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), 0);
    assert_eq!(r(&mut t, reg::QUEUE_READY), 0);
    assert_eq!(r(&mut t, reg::QUEUE_DESC_LOW), 0);
    assert_eq!(t.queues()[0].size(), 256);
    // Notifies after reset do nothing.
    h.push_get_id();
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(h.used_idx(), 1);
    // The device works again after a fresh init (used ring restarts at 0).
    h.mem.write_obj(0u16, GuestAddress(USED_ADDR + 2)).unwrap();
    *h.q.borrow_mut() = DriverQueue::new(16);
    h.mem.write_obj(0u16, GuestAddress(AVAIL_ADDR + 2)).unwrap();
    driver_init(&mut t, &h);
    h.push_get_id();
    w(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(h.used_idx(), 1);
}

#[test]
fn config_space_and_generation() {
    let h = Harness::new();
    let mut t = h.transport();
    let mut cap = [0u8; 8];
    t.read(reg::CONFIG, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8);
    assert_eq!(r(&mut t, reg::CONFIG + 12), crate::virtio::block::SEG_MAX);
    let mut b = [0xffu8; 1];
    t.read(reg::CONFIG + 0x800, &mut b);
    assert_eq!(b, [0], "beyond the config space reads zero");
    t.write(reg::CONFIG, &[1, 2, 3, 4]);
    t.read(reg::CONFIG, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8, "capacity is read-only");
    let g = r(&mut t, reg::CONFIG_GENERATION);
    driver_init(&mut t, &h);
    t.notify_config_change();
    assert_eq!(r(&mut t, reg::CONFIG_GENERATION), g.wrapping_add(1));
    assert_eq!(r(&mut t, reg::INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
}

/// The workload guest's driver takes its numbers from pagefold-guest-abi
/// (virtio-bindings needs std); they must be the ones this transport
/// decodes, which come from virtio-bindings.
#[test]
fn guest_abi_table_matches_virtio_bindings() {
    use pagefold_guest_abi::virtio as abi;
    use virtio_bindings::virtio_ring::{
        VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    let regs = [
        (abi::reg::MAGIC, reg::MAGIC),
        (abi::reg::VERSION, reg::VERSION),
        (abi::reg::DEVICE_ID, reg::DEVICE_ID),
        (abi::reg::VENDOR_ID, reg::VENDOR_ID),
        (abi::reg::DEVICE_FEATURES, reg::DEVICE_FEATURES),
        (abi::reg::DEVICE_FEATURES_SEL, reg::DEVICE_FEATURES_SEL),
        (abi::reg::DRIVER_FEATURES, reg::DRIVER_FEATURES),
        (abi::reg::DRIVER_FEATURES_SEL, reg::DRIVER_FEATURES_SEL),
        (abi::reg::QUEUE_SEL, reg::QUEUE_SEL),
        (abi::reg::QUEUE_NUM_MAX, reg::QUEUE_NUM_MAX),
        (abi::reg::QUEUE_NUM, reg::QUEUE_NUM),
        (abi::reg::QUEUE_READY, reg::QUEUE_READY),
        (abi::reg::QUEUE_NOTIFY, reg::QUEUE_NOTIFY),
        (abi::reg::INTERRUPT_STATUS, reg::INTERRUPT_STATUS),
        (abi::reg::INTERRUPT_ACK, reg::INTERRUPT_ACK),
        (abi::reg::STATUS, reg::STATUS),
        (abi::reg::QUEUE_DESC_LOW, reg::QUEUE_DESC_LOW),
        (abi::reg::QUEUE_DESC_HIGH, reg::QUEUE_DESC_HIGH),
        (abi::reg::QUEUE_DRIVER_LOW, reg::QUEUE_DRIVER_LOW),
        (abi::reg::QUEUE_DRIVER_HIGH, reg::QUEUE_DRIVER_HIGH),
        (abi::reg::QUEUE_DEVICE_LOW, reg::QUEUE_DEVICE_LOW),
        (abi::reg::QUEUE_DEVICE_HIGH, reg::QUEUE_DEVICE_HIGH),
        (abi::reg::SHM_LEN_LOW, reg::SHM_LEN_LOW),
        (abi::reg::SHM_LEN_HIGH, reg::SHM_LEN_HIGH),
        (abi::reg::CONFIG_GENERATION, reg::CONFIG_GENERATION),
        (abi::reg::CONFIG, reg::CONFIG),
    ];
    for (i, (guest, device)) in regs.into_iter().enumerate() {
        assert_eq!(guest, device, "register #{i}");
    }
    let status = [
        (abi::status::ACKNOWLEDGE, VIRTIO_CONFIG_S_ACKNOWLEDGE),
        (abi::status::DRIVER, VIRTIO_CONFIG_S_DRIVER),
        (abi::status::DRIVER_OK, VIRTIO_CONFIG_S_DRIVER_OK),
        (abi::status::FEATURES_OK, VIRTIO_CONFIG_S_FEATURES_OK),
        (abi::status::NEEDS_RESET, VIRTIO_CONFIG_S_NEEDS_RESET),
        (abi::status::FAILED, VIRTIO_CONFIG_S_FAILED),
    ];
    for (guest, device) in status {
        assert_eq!(guest, device);
    }
    assert_eq!(abi::F_VERSION_1, VIRTIO_F_VERSION_1);
    assert_eq!(u32::from(abi::DESC_F_NEXT), VRING_DESC_F_NEXT);
    assert_eq!(u32::from(abi::DESC_F_WRITE), VRING_DESC_F_WRITE);
    assert_eq!(
        u32::from(abi::AVAIL_F_NO_INTERRUPT),
        VRING_AVAIL_F_NO_INTERRUPT
    );
    assert_eq!(
        abi::DEVICE_ID_BLOCK,
        virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK
    );
}
