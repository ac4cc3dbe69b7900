//! Driver-side helpers for the virtio unit tests: a split virtqueue laid
//! out in guest memory, filled the way a guest driver fills it.

use std::fs::File;
use std::io::Write;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::tempfile::TempFile;

use super::block::Disk;

/// Guest RAM of the tests: 1 MiB at 0.
pub const MEM_SIZE: usize = 0x10_0000;
pub const DESC_ADDR: u64 = 0x1000;
pub const AVAIL_ADDR: u64 = 0x2000;
pub const USED_ADDR: u64 = 0x3000;
/// Data buffers of the tests start here.
pub const DATA_ADDR: u64 = 0x1_0000;

pub fn guest_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// A raw disk of `sectors` sectors; sector `i` is filled with byte `i`.
pub fn test_disk(sectors: u64, read_only: bool) -> (Disk, TempFile) {
    let tmp = TempFile::new().unwrap();
    let mut f: &File = tmp.as_file();
    for i in 0..sectors {
        f.write_all(&[i as u8; 512]).unwrap();
    }
    let file = File::options()
        .read(true)
        .write(!read_only)
        .open(tmp.as_path())
        .unwrap();
    (Disk::from_file(file, sectors * 512, read_only), tmp)
}

/// One buffer of a chain: address, length, device-writable.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

pub fn rd(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: false,
    }
}

pub fn wr(addr: u64, len: u32) -> Buf {
    Buf {
        addr,
        len,
        write: true,
    }
}

/// The driver's view of one split queue.
pub struct DriverQueue {
    pub size: u16,
    next_desc: u16,
    avail_idx: u16,
    desc: u64,
    avail: u64,
    used: u64,
}

impl DriverQueue {
    /// A queue at the default test addresses (DESC_ADDR, AVAIL_ADDR, USED_ADDR).
    pub fn new(size: u16) -> Self {
        Self::at(size, DESC_ADDR, AVAIL_ADDR, USED_ADDR)
    }

    /// A queue with its rings at the given addresses (devices with
    /// several queues).
    pub fn at(size: u16, desc: u64, avail: u64, used: u64) -> Self {
        Self {
            size,
            next_desc: 0,
            avail_idx: 0,
            desc,
            avail,
            used,
        }
    }

    /// A device-side queue over this driver queue's rings, ready.
    pub fn device_queue(&self, max_size: u16) -> virtio_queue::Queue {
        use virtio_queue::QueueT;
        let mut q = virtio_queue::Queue::new(max_size).unwrap();
        q.set_size(self.size);
        q.try_set_desc_table_address(GuestAddress(self.desc))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(self.avail))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(self.used))
            .unwrap();
        q.set_ready(true);
        q
    }

    /// The used ring's index, as the driver reads it.
    pub fn used_index(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// The avail ring's `used_event` and the used ring's `avail_event`
    /// (EVENT_IDX), as (address of used_event, address of avail_event).
    pub fn event_addrs(&self) -> (u64, u64) {
        (
            self.avail + 4 + 2 * u64::from(self.size),
            self.used + 4 + 8 * u64::from(self.size),
        )
    }

    /// Writes one raw descriptor at table index `i`.
    pub fn write_desc(
        &self,
        mem: &GuestMemoryMmap,
        i: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let base = GuestAddress(self.desc + 16 * u64::from(i));
        mem.write_obj(addr, base).unwrap();
        mem.write_obj(len, GuestAddress(base.0 + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(base.0 + 12)).unwrap();
        mem.write_obj(next, GuestAddress(base.0 + 14)).unwrap();
    }

    /// Makes descriptor `head` available.
    pub fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        mem.write_obj(head, GuestAddress(self.avail + 4 + 2 * slot))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2))
            .unwrap();
    }

    /// Writes `bufs` as one chain and publishes it; returns the head index.
    pub fn push(&mut self, mem: &GuestMemoryMmap, bufs: &[Buf]) -> u16 {
        let head = self.next_desc;
        for (k, b) in bufs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let last = k + 1 == bufs.len();
            let mut flags = 0u16;
            if !last {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            if b.write {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            self.write_desc(mem, i, b.addr, b.len, flags, (i + 1) % self.size);
        }
        self.next_desc = (head + bufs.len().max(1) as u16) % self.size;
        self.publish(mem, head);
        head
    }

    pub fn used_idx(mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(USED_ADDR + 2)).unwrap()
    }

    /// The used-ring element `i`: (descriptor head, length).
    pub fn used_elem(&self, mem: &GuestMemoryMmap, i: u16) -> (u32, u32) {
        let base = self.used + 4 + 8 * u64::from(i % self.size);
        (
            mem.read_obj(GuestAddress(base)).unwrap(),
            mem.read_obj(GuestAddress(base + 4)).unwrap(),
        )
    }
}

/// A virtio-blk request header as bytes.
pub fn blk_header(request_type: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&request_type.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}
