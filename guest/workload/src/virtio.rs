//! A minimal virtio-mmio (version 2) block driver: one split virtqueue in
//! `.bss`, a few read requests in flight, completions found by polling the
//! used ring.
//!
//! The guest runs at CPL3 with no IDT, so it cannot take the device's
//! interrupt; it asks the device not to send one (`VRING_AVAIL_F_NO_INTERRUPT`)
//! and polls. Register accesses are 32-bit volatile loads and stores to the
//! identity-mapped MMIO window (each one exits to the VMM); the queue notify
//! usually ends in the VMM's ioeventfd, so the device works on the requests
//! on another host thread while the guest checks the pages that are done.

use core::cell::UnsafeCell;
use core::fmt;
use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{fence, Ordering};

use pagefold_guest_abi::virtio::status::{
    ACKNOWLEDGE as S_ACKNOWLEDGE, DRIVER as S_DRIVER, DRIVER_OK as S_DRIVER_OK,
    FAILED as S_FAILED, FEATURES_OK as S_FEATURES_OK, NEEDS_RESET as S_NEEDS_RESET,
};
use pagefold_guest_abi::virtio::{
    reg, BlkReqHeader as ReqHeader, AVAIL_F_NO_INTERRUPT, BLK_S_OK, BLK_T_IN, DESC_F_NEXT,
    DESC_F_WRITE, DEVICE_ID_BLOCK, F_VERSION_1, MMIO_MAGIC, MMIO_VERSION,
};

/// VIRTIO_F_VERSION_1 in feature word 1 (bits 32..64).
const F_VERSION_1_WORD1: u32 = 1 << (F_VERSION_1 - 32);

/// Descriptors in the queue (a power of two, at most the device's maximum).
pub const QUEUE_SIZE: u16 = 16;
/// Requests in flight; each uses three descriptors (header, data, status).
pub const DEPTH: usize = 4;
/// Largest data buffer of one request: the device's SIZE_MAX (1 MiB).
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

#[repr(C)]
struct Avail {
    flags: u16,
    idx: u16,
    ring: [u16; QUEUE_SIZE as usize],
    used_event: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UsedElem {
    id: u32,
    len: u32,
}

#[repr(C)]
struct Used {
    flags: u16,
    idx: u16,
    ring: [UsedElem; QUEUE_SIZE as usize],
    avail_event: u16,
}

/// Everything the device reads or writes besides the data pages. `repr(C)`
/// with page alignment gives every ring its required alignment (descriptors
/// 16, used ring 4).
#[repr(C, align(4096))]
struct Rings {
    desc: [Desc; QUEUE_SIZE as usize],
    avail: Avail,
    used: Used,
    headers: [ReqHeader; DEPTH],
    status: [u8; DEPTH],
}

struct RingsCell(UnsafeCell<Rings>);

// SAFETY: one vCPU, no interrupts: only `BlockDev` touches the rings, and
// at most one `BlockDev` exists at a time (DISK_READ makes and drops it).
unsafe impl Sync for RingsCell {}

const NO_DESC: Desc = Desc {
    addr: 0,
    len: 0,
    flags: 0,
    next: 0,
};

static RINGS: RingsCell = RingsCell(UnsafeCell::new(Rings {
    desc: [NO_DESC; QUEUE_SIZE as usize],
    avail: Avail {
        flags: 0,
        idx: 0,
        ring: [0; QUEUE_SIZE as usize],
        used_event: 0,
    },
    used: Used {
        flags: 0,
        idx: 0,
        ring: [UsedElem { id: 0, len: 0 }; QUEUE_SIZE as usize],
        avail_event: 0,
    },
    headers: [ReqHeader {
        type_: 0,
        reserved: 0,
        sector: 0,
    }; DEPTH],
    status: [0xff; DEPTH],
}));

/// Why the disk could not be used.
#[derive(Clone, Copy, Debug)]
pub enum DiskError {
    /// Nothing (or not a virtio-mmio v2 block device) at the address.
    NoDevice {
        base: u64,
        magic: u32,
        version: u32,
        device: u32,
    },
    /// The device does not offer VIRTIO_F_VERSION_1, or refused FEATURES_OK.
    Features { base: u64, offered_hi: u32 },
    /// The queue cannot hold our descriptors.
    QueueTooSmall { max: u32 },
    /// The device set NEEDS_RESET or FAILED, or refused DRIVER_OK.
    DeviceStatus { status: u32 },
    /// The disk is smaller than what the phase reads.
    TooSmall { sectors: u64, needed: u64 },
    /// A request completed with a status other than OK.
    Io { sector: u64, status: u8 },
    /// No request completed for this long.
    Timeout { sector: u64, ms: u64 },
}

impl fmt::Display for DiskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NoDevice {
                base,
                magic,
                version,
                device,
            } => write!(
                f,
                "no virtio-mmio v2 block device at {base:#x} (magic {magic:#x}, version {version}, device id {device})"
            ),
            Self::Features { base, offered_hi } => write!(
                f,
                "device at {base:#x} refused VIRTIO_F_VERSION_1 (feature word 1 {offered_hi:#x})"
            ),
            Self::QueueTooSmall { max } => {
                write!(f, "queue 0 holds {max} descriptors, need {QUEUE_SIZE}")
            }
            Self::DeviceStatus { status } => write!(f, "device status {status:#x}"),
            Self::TooSmall { sectors, needed } => {
                write!(f, "disk has {sectors} sectors, the phase reads {needed}")
            }
            Self::Io { sector, status } => {
                write!(f, "read at sector {sector} failed with status {status}")
            }
            Self::Timeout { sector, ms } => {
                write!(f, "read at sector {sector} did not complete in {ms} ms")
            }
        }
    }
}

fn rings() -> *mut Rings {
    RINGS.0.get()
}

/// A driven virtio-blk device.
pub struct BlockDev {
    base: u64,
    sectors: u64,
    /// Our copy of `avail.idx` (the next free avail-ring entry).
    avail_idx: u16,
    /// Used-ring entries consumed so far.
    used_idx: u16,
}

/// A completion: the request slot and its status byte.
pub struct Completion {
    pub slot: usize,
    pub status: u8,
}

impl BlockDev {
    fn read(&self, off: u64) -> u32 {
        // SAFETY: `base` is the device's MMIO window, identity-mapped by the
        // VMM (DataLayout::new checked it is page aligned and not RAM); the
        // access exits to the VMM, which emulates the register.
        unsafe { ((self.base + off) as *const u32).read_volatile() }
    }

    fn write(&self, off: u64, v: u32) {
        // SAFETY: as `read`.
        unsafe { ((self.base + off) as *mut u32).write_volatile(v) }
    }

    fn set_status(&self, bits: u32) -> u32 {
        let s = self.read(reg::STATUS);
        self.write(reg::STATUS, s | bits);
        self.read(reg::STATUS)
    }

    /// Resets the device at `base` and brings it up (virtio 1.x 3.1.1):
    /// VERSION_1 only, queue 0 with our rings, DRIVER_OK.
    pub fn init(base: u64) -> Result<Self, DiskError> {
        let mut d = Self {
            base,
            sectors: 0,
            avail_idx: 0,
            used_idx: 0,
        };
        let (magic, version, device) = (
            d.read(reg::MAGIC),
            d.read(reg::VERSION),
            d.read(reg::DEVICE_ID),
        );
        if magic != MMIO_MAGIC || version != MMIO_VERSION || device != DEVICE_ID_BLOCK {
            return Err(DiskError::NoDevice {
                base,
                magic,
                version,
                device,
            });
        }
        d.write(reg::STATUS, 0);
        d.set_status(S_ACKNOWLEDGE);
        d.set_status(S_DRIVER);
        d.write(reg::DEVICE_FEATURES_SEL, 1);
        let offered_hi = d.read(reg::DEVICE_FEATURES);
        if offered_hi & F_VERSION_1_WORD1 == 0 {
            d.write(reg::STATUS, S_FAILED);
            return Err(DiskError::Features { base, offered_hi });
        }
        // Nothing but VERSION_1: no EVENT_IDX (we poll), no flush (we only read).
        d.write(reg::DRIVER_FEATURES_SEL, 0);
        d.write(reg::DRIVER_FEATURES, 0);
        d.write(reg::DRIVER_FEATURES_SEL, 1);
        d.write(reg::DRIVER_FEATURES, F_VERSION_1_WORD1);
        if d.set_status(S_FEATURES_OK) & S_FEATURES_OK == 0 {
            d.write(reg::STATUS, S_FAILED);
            return Err(DiskError::Features { base, offered_hi });
        }
        d.write(reg::QUEUE_SEL, 0);
        let max = d.read(reg::QUEUE_NUM_MAX);
        if max < u32::from(QUEUE_SIZE) {
            d.write(reg::STATUS, S_FAILED);
            return Err(DiskError::QueueTooSmall { max });
        }
        let r = rings();
        // SAFETY: the rings are ours (see RingsCell); the device is reset, so
        // it does not access them while we clear them.
        unsafe {
            r.write_bytes(0, 1);
            addr_of_mut!((*r).avail.flags).write_volatile(AVAIL_F_NO_INTERRUPT);
        }
        // SAFETY: only the addresses are taken.
        let (desc, avail, used) = unsafe {
            (
                addr_of!((*r).desc) as u64,
                addr_of!((*r).avail) as u64,
                addr_of!((*r).used) as u64,
            )
        };
        d.write(reg::QUEUE_NUM, u32::from(QUEUE_SIZE));
        for (lo, v) in [
            (reg::QUEUE_DESC_LOW, desc),
            (reg::QUEUE_DRIVER_LOW, avail),
            (reg::QUEUE_DEVICE_LOW, used),
        ] {
            d.write(lo, v as u32);
            d.write(lo + 4, (v >> 32) as u32);
        }
        const _: () = assert!(reg::QUEUE_DESC_HIGH == reg::QUEUE_DESC_LOW + 4);
        const _: () = assert!(reg::QUEUE_DRIVER_HIGH == reg::QUEUE_DRIVER_LOW + 4);
        const _: () = assert!(reg::QUEUE_DEVICE_HIGH == reg::QUEUE_DEVICE_LOW + 4);
        d.write(reg::QUEUE_READY, 1);
        let status = d.set_status(S_DRIVER_OK);
        if status & S_DRIVER_OK == 0 || status & (S_NEEDS_RESET | S_FAILED) != 0 {
            return Err(DiskError::DeviceStatus { status });
        }
        let lo = u64::from(d.read(reg::CONFIG));
        let hi = u64::from(d.read(reg::CONFIG + 4));
        d.sectors = lo | (hi << 32);
        Ok(d)
    }

    /// Disk size in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    /// Queues a read of `len` bytes at `sector` into guest-physical `gpa`
    /// using request slot `slot` (< DEPTH, not in flight). Call `notify`
    /// after a batch.
    pub fn submit_read(&mut self, slot: usize, sector: u64, gpa: u64, len: u32) {
        let r = rings();
        let head = (slot * 3) as u16;
        // SAFETY: the rings are ours; slot `slot` is not in flight, so the
        // device does not read its descriptors, header or status now. The
        // header and status live in `.bss`, identity-mapped: their
        // addresses are guest-physical addresses.
        unsafe {
            addr_of_mut!((*r).headers[slot]).write_volatile(ReqHeader {
                type_: BLK_T_IN,
                reserved: 0,
                sector,
            });
            addr_of_mut!((*r).status[slot]).write_volatile(0xff);
            let descs = [
                Desc {
                    addr: addr_of!((*r).headers[slot]) as u64,
                    len: 16,
                    flags: DESC_F_NEXT,
                    next: head + 1,
                },
                Desc {
                    addr: gpa,
                    len,
                    flags: DESC_F_WRITE | DESC_F_NEXT,
                    next: head + 2,
                },
                Desc {
                    addr: addr_of!((*r).status[slot]) as u64,
                    len: 1,
                    flags: DESC_F_WRITE,
                    next: 0,
                },
            ];
            for (i, d) in descs.iter().enumerate() {
                addr_of_mut!((*r).desc[usize::from(head) + i]).write_volatile(*d);
            }
            let entry = usize::from(self.avail_idx % QUEUE_SIZE);
            addr_of_mut!((*r).avail.ring[entry]).write_volatile(head);
            // The descriptors and the ring entry before the index (2.7.13).
            fence(Ordering::Release);
            self.avail_idx = self.avail_idx.wrapping_add(1);
            addr_of_mut!((*r).avail.idx).write_volatile(self.avail_idx);
        }
    }

    /// Tells the device that queue 0 has new requests.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        self.write(reg::QUEUE_NOTIFY, 0);
    }

    /// The next completed request, if any.
    pub fn poll(&mut self) -> Option<Completion> {
        let r = rings();
        // SAFETY: the used ring is written by the device; volatile reads see
        // its updates. The entry and the status byte are read after the
        // index (acquire), as the device writes them before it.
        unsafe {
            let idx = addr_of!((*r).used.idx).read_volatile();
            if idx == self.used_idx {
                return None;
            }
            fence(Ordering::Acquire);
            let e =
                addr_of!((*r).used.ring[usize::from(self.used_idx % QUEUE_SIZE)]).read_volatile();
            self.used_idx = self.used_idx.wrapping_add(1);
            let slot = (e.id / 3) as usize;
            let status = if slot < DEPTH && e.id % 3 == 0 {
                addr_of!((*r).status[slot]).read_volatile()
            } else {
                // Not a head we made: report it as an I/O error of slot 0.
                0xfe
            };
            Some(Completion {
                slot: slot.min(DEPTH - 1),
                status,
            })
        }
    }

    /// The device status register (NEEDS_RESET shows a broken queue).
    pub fn device_status(&self) -> u32 {
        self.read(reg::STATUS)
    }

    /// Acknowledges whatever interrupt the device raised anyway (tidy: the
    /// guest never takes it).
    pub fn ack_interrupts(&self) {
        let s = self.read(reg::INTERRUPT_STATUS);
        if s != 0 {
            self.write(reg::INTERRUPT_ACK, s);
        }
    }

    /// Resets the device: it forgets the rings (they stay in `.bss`).
    pub fn reset(self) {
        self.write(reg::STATUS, 0);
    }
}

/// `BLK_S_OK`, for callers checking a completion.
pub const STATUS_OK: u8 = BLK_S_OK;
