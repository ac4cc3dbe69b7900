use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use crate::GuestMemoryMmap;
use proptest::prelude::*;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::tempfile::TempFile;

use super::request::{self, Completion};
use super::*;
use crate::virtio::testutil::*;

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
const HDR: u64 = DATA_ADDR;
const BUF: u64 = DATA_ADDR + 0x1000;
const STATUS: u64 = DATA_ADDR + 0x8000;

/// A Block device with its queue set up as a driver would (size 16).
struct Rig {
    mem: GuestMemoryMmap,
    q: DriverQueue,
    queue: Queue,
    blk: Block,
    file: TempFile,
}

impl Rig {
    fn new(read_only: bool) -> Self {
        let mem = guest_mem();
        let (disk, file) = test_disk(8, read_only);
        let q = DriverQueue::new(16);
        let queue = q.device_queue(QUEUE_SIZE);
        let blk = Block::new(disk, "serial-0123456789abc").unwrap();
        Self {
            mem,
            q,
            queue,
            blk,
            file,
        }
    }

    /// Submits one chain and runs the queue; returns (status byte at the
    /// last byte of the last buffer, used length).
    fn run(&mut self, bufs: &[Buf]) -> (u8, u32) {
        let before = DriverQueue::used_idx(&self.mem);
        self.q.push(&self.mem, bufs);
        self.blk
            .process_queue(0, &mut self.queue, &self.mem)
            .unwrap();
        assert_eq!(DriverQueue::used_idx(&self.mem), before.wrapping_add(1));
        let (_, len) = self.q.used_elem(&self.mem, before);
        let last = bufs.last().unwrap();
        let status = self
            .mem
            .read_obj(GuestAddress(last.addr + u64::from(last.len) - 1))
            .unwrap_or(0xee);
        (status, len)
    }

    fn header(&self, t: u32, sector: u64) {
        self.mem
            .write_slice(&blk_header(t, sector), GuestAddress(HDR))
            .unwrap();
    }

    fn file_bytes(&self) -> Vec<u8> {
        let mut f = File::open(self.file.as_path()).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    fn read_guest(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

#[test]
fn read_sectors() {
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_IN, 2);
    let (st, len) = rig.run(&[rd(HDR, 16), wr(BUF, 1024), wr(STATUS, 1)]);
    assert_eq!((st, len), (OK, 1025));
    assert_eq!(rig.read_guest(BUF, 512), vec![2u8; 512]);
    assert_eq!(rig.read_guest(BUF + 512, 512), vec![3u8; 512]);
}

#[test]
fn any_layout_is_accepted() {
    let mut rig = Rig::new(false);
    // Read: data split over odd-sized buffers, status in the data's last buffer.
    rig.header(VIRTIO_BLK_T_IN, 5);
    let (st, len) = rig.run(&[rd(HDR, 16), wr(BUF, 300), wr(BUF + 0x1000, 213)]);
    assert_eq!((st, len), (OK, 513));
    assert_eq!(rig.read_guest(BUF, 300), vec![5u8; 300]);
    assert_eq!(rig.read_guest(BUF + 0x1000, 212), vec![5u8; 212]);
    // Write: header and data in one readable buffer.
    rig.header(VIRTIO_BLK_T_OUT, 1);
    rig.mem
        .write_slice(&[0xabu8; 512], GuestAddress(HDR + 16))
        .unwrap();
    let (st, len) = rig.run(&[rd(HDR, 16 + 512), wr(STATUS, 1)]);
    assert_eq!((st, len), (OK, 1));
    let f = rig.file_bytes();
    assert_eq!(&f[512..1024], &[0xab; 512][..]);
    assert_eq!(&f[1024..1536], &[2u8; 512][..], "neighbour untouched");
}

#[test]
fn write_then_read_back_and_flush() {
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_OUT, 7);
    rig.mem
        .write_slice(&[0x5au8; 512], GuestAddress(BUF))
        .unwrap();
    assert_eq!(
        rig.run(&[rd(HDR, 16), rd(BUF, 512), wr(STATUS, 1)]),
        (OK, 1)
    );
    rig.header(VIRTIO_BLK_T_IN, 7);
    assert_eq!(
        rig.run(&[rd(HDR, 16), wr(BUF + 0x1000, 512), wr(STATUS, 1)]),
        (OK, 513)
    );
    assert_eq!(rig.read_guest(BUF + 0x1000, 512), vec![0x5au8; 512]);
    rig.header(VIRTIO_BLK_T_FLUSH, 0);
    assert_eq!(rig.run(&[rd(HDR, 16), wr(STATUS, 1)]), (OK, 1));
}

#[test]
fn read_only_disk_refuses_writes() {
    let mut rig = Rig::new(true);
    let before = rig.file_bytes();
    rig.header(VIRTIO_BLK_T_OUT, 0);
    rig.mem
        .write_slice(&[0x77u8; 512], GuestAddress(BUF))
        .unwrap();
    assert_eq!(
        rig.run(&[rd(HDR, 16), rd(BUF, 512), wr(STATUS, 1)]),
        (IOERR, 1)
    );
    assert_eq!(rig.file_bytes(), before);
    // Reads and flushes still work.
    rig.header(VIRTIO_BLK_T_IN, 0);
    assert_eq!(
        rig.run(&[rd(HDR, 16), wr(BUF, 512), wr(STATUS, 1)]),
        (OK, 513)
    );
    rig.header(VIRTIO_BLK_T_FLUSH, 0);
    assert_eq!(rig.run(&[rd(HDR, 16), wr(STATUS, 1)]), (OK, 1));
    assert_ne!(rig.blk.avail_features() & (1 << VIRTIO_BLK_F_RO), 0);
}

#[test]
fn out_of_range_and_unaligned_requests_fail() {
    let mut rig = Rig::new(false);
    let before = rig.file_bytes();
    for (t, sector, len) in [
        (VIRTIO_BLK_T_IN, 7, 1024u32),
        (VIRTIO_BLK_T_IN, 8, 512),
        (VIRTIO_BLK_T_IN, u64::MAX, 512),
        (VIRTIO_BLK_T_IN, 0, 100),
        (VIRTIO_BLK_T_OUT, 7, 1024),
        (VIRTIO_BLK_T_OUT, u64::MAX / 256, 512),
    ] {
        rig.header(t, sector);
        let data = if t == VIRTIO_BLK_T_IN {
            wr(BUF, len)
        } else {
            rd(BUF, len)
        };
        assert_eq!(
            rig.run(&[rd(HDR, 16), data, wr(STATUS, 1)]),
            (IOERR, 1),
            "{t} {sector} {len}"
        );
    }
    assert_eq!(rig.file_bytes(), before);
}

#[test]
fn get_id_and_unsupported_types() {
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_GET_ID, 0);
    assert_eq!(
        rig.run(&[rd(HDR, 16), wr(BUF, 20), wr(STATUS, 1)]),
        (OK, 21)
    );
    assert_eq!(rig.read_guest(BUF, 20), b"serial-0123456789abc");
    // A short buffer gets a prefix.
    rig.mem.write_slice(&[0u8; 20], GuestAddress(BUF)).unwrap();
    assert_eq!(rig.run(&[rd(HDR, 16), wr(BUF, 6), wr(STATUS, 1)]), (OK, 7));
    assert_eq!(rig.read_guest(BUF, 8), b"serial\0\0");
    rig.header(99, 0);
    assert_eq!(rig.run(&[rd(HDR, 16), wr(STATUS, 1)]), (UNSUPP, 1));
    assert!(Block::new(test_disk(1, false).0, "a-serial-that-is-far-too-long").is_err());
}

#[test]
fn malformed_chains_get_errors_or_are_dropped() {
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_IN, 0);
    let oob = MEM_SIZE as u64 - 0x100;
    // Short header.
    assert_eq!(
        rig.run(&[rd(HDR, 8), wr(BUF, 512), wr(STATUS, 1)]),
        (IOERR, 1)
    );
    // Data buffer running past the end of guest RAM: error, nothing written.
    let (st, len) = rig.run(&[rd(HDR, 16), wr(oob, 0x200), wr(STATUS, 1)]);
    assert_eq!((st, len), (IOERR, 1));
    assert_eq!(rig.read_guest(oob, 0x100), vec![0u8; 0x100]);
    // Readable after writable.
    assert_eq!(
        rig.run(&[
            rd(HDR, 16),
            wr(BUF, 512),
            rd(BUF + 0x1000, 16),
            wr(STATUS, 1)
        ]),
        (IOERR, 1)
    );
    // No writable status at the end: dropped with length 0.
    assert_eq!(rig.run(&[rd(HDR, 16), wr(BUF, 512), rd(STATUS, 1)]).1, 0);
    assert_eq!(rig.run(&[rd(HDR, 16), wr(STATUS, 0)]).1, 0);
    // Status outside guest memory: dropped.
    assert_eq!(rig.run(&[rd(HDR, 16), wr(MEM_SIZE as u64 + 0x10, 1)]).1, 0);
    // Header outside guest memory: error.
    assert_eq!(
        rig.run(&[rd(MEM_SIZE as u64, 16), wr(STATUS, 1)]),
        (IOERR, 1)
    );
    // A descriptor whose address + length wraps around u64.
    assert_eq!(
        rig.run(&[rd(HDR, 16), wr(u64::MAX - 10, 512), wr(STATUS, 1)]),
        (IOERR, 1)
    );
}

#[test]
fn descriptor_loop_terminates() {
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_IN, 0);
    // Descriptor 0 -> 1 -> 0 -> ... (NEXT everywhere).
    rig.q.write_desc(&rig.mem, 0, HDR, 16, 1, 1);
    rig.q.write_desc(&rig.mem, 1, STATUS, 1, 1 | 2, 0);
    rig.q.publish(&rig.mem, 0);
    rig.blk.process_queue(0, &mut rig.queue, &rig.mem).unwrap();
    assert_eq!(DriverQueue::used_idx(&rig.mem), 1);
}

/// Every page the device writes through guest memory is in its dirty
/// bitmap (what the VMM gives the dedup engine beside KVM's log): the read's
/// data, the status byte and the used ring; a page it only read is not.
#[test]
fn the_device_marks_every_page_it_writes() {
    use vm_memory::GuestMemoryBackend;
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_IN, 1);
    rig.q
        .push(&rig.mem, &[rd(HDR, 16), wr(BUF, 512), wr(STATUS, 1)]);
    let bitmap = vm_memory::MmapRegion::bitmap(rig.mem.iter().next().unwrap());
    bitmap.reset();
    rig.blk.process_queue(0, &mut rig.queue, &rig.mem).unwrap();
    let page = |a: u64| (a / 4096) as usize;
    let dirty: Vec<usize> = (0..MEM_SIZE / 4096)
        .filter(|&p| bitmap.is_bit_set(p))
        .collect();
    assert_eq!(dirty, vec![page(USED_ADDR), page(BUF), page(STATUS)]);
    assert_ne!(page(HDR), page(BUF));
}

#[test]
fn reads_report_the_guest_ranges_they_filled() {
    use std::sync::{Arc, Mutex};
    let mut rig = Rig::new(false);
    let seen: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let s2 = seen.clone();
    rig.blk.set_write_hook(Arc::new(move |gpa, len| {
        s2.lock().unwrap().push((gpa, len))
    }));
    // A two-segment read of 3 sectors: both data ranges, not the status.
    rig.header(VIRTIO_BLK_T_IN, 1);
    let (status, _) = rig.run(&[
        rd(HDR, 16),
        wr(BUF, 1024),
        wr(BUF + 0x2000, 512),
        wr(STATUS, 1),
    ]);
    assert_eq!(status, OK);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(BUF, 1024), (BUF + 0x2000, 512)]
    );
    // Writes, flushes and failed reads fill nothing.
    seen.lock().unwrap().clear();
    rig.header(VIRTIO_BLK_T_OUT, 0);
    assert_eq!(rig.run(&[rd(HDR, 16), rd(BUF, 512), wr(STATUS, 1)]).0, OK);
    rig.header(VIRTIO_BLK_T_IN, 1 << 40);
    assert_eq!(
        rig.run(&[rd(HDR, 16), wr(BUF, 512), wr(STATUS, 1)]).0,
        IOERR
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

#[test]
fn limits_are_enforced() {
    let limits = Limits {
        seg_max: 2,
        size_max: 4096,
    };
    let mut rig = Rig::new(false);
    rig.header(VIRTIO_BLK_T_IN, 0);
    let disk = test_disk(8, false).0;
    let mut handle = |bufs: &[Buf]| -> Completion {
        rig.q.push(&rig.mem, bufs);
        let chain = rig.queue.iter(&rig.mem).unwrap().next().unwrap();
        request::handle(chain, &rig.mem, &disk, b"", limits, None)
    };
    let ok = handle(&[rd(HDR, 16), wr(BUF, 512), wr(BUF + 512, 512), wr(STATUS, 1)]);
    assert_eq!(
        ok,
        Completion {
            status: Some(OK),
            used_len: 1025
        }
    );
    let many = handle(&[
        rd(HDR, 16),
        wr(BUF, 512),
        wr(BUF + 512, 512),
        wr(BUF + 1024, 512),
        wr(STATUS, 1),
    ]);
    assert_eq!(many.status, Some(IOERR));
    let big = handle(&[rd(HDR, 16), wr(BUF, 8192), wr(STATUS, 1)]);
    assert_eq!(big.status, Some(IOERR));
}

#[test]
fn event_idx_suppresses_interrupts() {
    let mut rig = Rig::new(false);
    rig.queue.set_event_idx(true);
    rig.header(VIRTIO_BLK_T_GET_ID, 0);
    // used_event (after the avail ring) = 5: no interrupt wanted for the first.
    rig.mem
        .write_obj(5u16, GuestAddress(AVAIL_ADDR + 4 + 2 * 16))
        .unwrap();
    rig.q
        .push(&rig.mem, &[rd(HDR, 16), wr(BUF, 20), wr(STATUS, 1)]);
    assert!(!rig.blk.process_queue(0, &mut rig.queue, &rig.mem).unwrap());
    // used_event = 1: the driver wants to hear about the second.
    rig.mem
        .write_obj(1u16, GuestAddress(AVAIL_ADDR + 4 + 2 * 16))
        .unwrap();
    rig.q
        .push(&rig.mem, &[rd(HDR, 16), wr(BUF, 20), wr(STATUS, 1)]);
    assert!(rig.blk.process_queue(0, &mut rig.queue, &rig.mem).unwrap());
}

#[test]
fn broken_avail_index_is_reported() {
    let mut rig = Rig::new(false);
    // avail idx 100 ahead of a queue of 16: the driver is broken.
    rig.mem
        .write_obj(100u16, GuestAddress(AVAIL_ADDR + 2))
        .unwrap();
    assert!(matches!(
        rig.blk.process_queue(0, &mut rig.queue, &rig.mem),
        Err(crate::virtio::Error::BrokenQueue(0, _))
    ));
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

    /// Random chains and headers: the device never panics, never writes
    /// guest memory outside the chain's writable buffers and the used ring,
    /// never grows the disk, and reports a used length within the writable
    /// bytes of the chain.
    #[test]
    fn random_chains_stay_in_bounds(
        bufs in proptest::collection::vec(arb_buf(), 1..6),
        t in prop_oneof![Just(0u32), Just(1), Just(4), Just(8), Just(11), any::<u32>()],
        sector in prop_oneof![0u64..10, any::<u64>()],
        read_only in any::<bool>(),
    ) {
        let mut rig = Rig::new(read_only);
        // Headers are placed where a readable buffer may point.
        for a in (0x1_0000u64..0x2_0000).step_by(0x1000) {
            rig.mem.write_slice(&blk_header(t, sector), GuestAddress(a)).unwrap();
        }
        rig.q.push(&rig.mem, &bufs);
        let before = rig.read_guest(0, MEM_SIZE);
        let disk_len = rig.file_bytes().len();
        rig.blk.process_queue(0, &mut rig.queue, &rig.mem).unwrap();
        prop_assert_eq!(DriverQueue::used_idx(&rig.mem), 1);
        let (_, used_len) = rig.q.used_elem(&rig.mem, 0);
        let writable: u64 = bufs.iter().filter(|b| b.write).map(|b| u64::from(b.len)).sum();
        prop_assert!(u64::from(used_len) <= writable);
        let after = rig.read_guest(0, MEM_SIZE);
        let in_writable = |a: u64| bufs.iter().any(|b| b.write && a >= b.addr && a - b.addr < u64::from(b.len));
        let in_rings = |a: u64| (USED_ADDR..USED_ADDR + 0x100).contains(&a);
        for (a, (x, y)) in before.iter().zip(&after).enumerate() {
            if x != y {
                prop_assert!(in_writable(a as u64) || in_rings(a as u64), "write at {:#x}", a);
            }
        }
        prop_assert_eq!(rig.file_bytes().len(), disk_len);
    }
}

/// The workload guest builds its requests from pagefold-guest-abi's
/// numbers and header (virtio-bindings needs std): the same bytes this
/// device parses with virtio-bindings' `virtio_blk_outhdr`.
#[test]
fn guest_abi_request_matches_virtio_bindings() {
    use pagefold_guest_abi::virtio as abi;
    use virtio_bindings::virtio_blk::virtio_blk_outhdr;
    assert_eq!(abi::BLK_T_IN, VIRTIO_BLK_T_IN);
    assert_eq!(u32::from(abi::BLK_S_OK), VIRTIO_BLK_S_OK);
    assert_eq!(
        std::mem::size_of::<abi::BlkReqHeader>(),
        std::mem::size_of::<virtio_blk_outhdr>()
    );
    assert_eq!(
        std::mem::offset_of!(abi::BlkReqHeader, type_),
        std::mem::offset_of!(virtio_blk_outhdr, type_)
    );
    assert_eq!(
        std::mem::offset_of!(abi::BlkReqHeader, reserved),
        std::mem::offset_of!(virtio_blk_outhdr, ioprio)
    );
    assert_eq!(
        std::mem::offset_of!(abi::BlkReqHeader, sector),
        std::mem::offset_of!(virtio_blk_outhdr, sector)
    );
}
