//! virtio-blk requests: descriptor chains in guest memory built from the
//! input, run by `request::handle` (with fuzzed or the device's limits) or
//! by the device's own queue processing, against a small memfd disk.
//!
//! Input: flags, disk size, limits, queue size, then guest memory content
//! from address 0 (the descriptor table, rings and buffers are all in it).
//! Guest RAM is two regions with a hole between them, so chains can point
//! into the hole and across region ends.

#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use pagefold_devices::virtio::block::request::{self, Limits};
use pagefold_devices::virtio::block::{Block, Disk, QUEUE_SIZE, SEG_MAX, SIZE_MAX};
use pagefold_devices::virtio::VirtioDevice;
use pagefold_fuzz::{guest_memory, Input, ScratchFile};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemory};

/// Guest RAM: 64 KiB at 0, 16 KiB at 128 KiB.
const RAM: &[(u64, usize)] = &[(0, 0x1_0000), (0x2_0000, 0x4000)];
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// Chains handled per input (bounded time).
const MAX_CHAINS: usize = 32;

fn disk_file() -> &'static ScratchFile {
    static F: OnceLock<ScratchFile> = OnceLock::new();
    F.get_or_init(|| ScratchFile::new(c"pagefold-fuzz-disk"))
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let read_only = flags & 1 != 0;
    let via_device = flags & 2 != 0;
    let event_idx = flags & 4 != 0;
    let fuzzed_limits = flags & 8 != 0;
    // At most 64 KiB of disk, a trailing partial sector sometimes.
    let disk_len = u64::from(input.u16());
    let limits = if fuzzed_limits {
        Limits {
            seg_max: u32::from(input.u8()),
            size_max: input.u32(),
        }
    } else {
        Limits {
            seg_max: SEG_MAX,
            size_max: SIZE_MAX,
        }
    };
    let qsize = 1u16 << (input.u8() % 5);
    let mem = guest_memory(RAM, input.rest());

    let f = disk_file();
    f.zeroed(disk_len);
    let disk = Disk::from_file(f.reopen(!read_only), disk_len, read_only);

    let mut queue = Queue::new(QUEUE_SIZE).unwrap();
    queue.set_size(qsize);
    queue
        .try_set_desc_table_address(GuestAddress(DESC))
        .unwrap();
    queue
        .try_set_avail_ring_address(GuestAddress(AVAIL))
        .unwrap();
    queue.try_set_used_ring_address(GuestAddress(USED)).unwrap();
    queue.set_ready(true);
    queue.set_event_idx(event_idx);
    assert!(queue.is_valid(&mem));

    if via_device {
        let mut blk = Block::new(disk, "fuzz-serial").unwrap();
        let _ = blk.process_queue(0, &mut queue, &mem);
        return;
    }

    let filled = Mutex::new(Vec::new());
    let hook = |addr: u64, len: usize| filled.lock().unwrap().push((addr, len));
    for _ in 0..MAX_CHAINS {
        let Some(chain) = queue.iter(&mem).ok().and_then(|mut it| it.next()) else {
            break;
        };
        let head = chain.head_index();
        let writable: u64 = chain
            .clone()
            .filter(|d| d.is_write_only())
            .map(|d| u64::from(d.len()))
            .sum();
        filled.lock().unwrap().clear();
        let done = request::handle(chain, &mem, &disk, b"fuzz-serial", limits, Some(&hook));
        // The used length counts bytes the device wrote: never more than
        // the chain's writable bytes, and 0 when no status was written.
        assert!(
            u64::from(done.used_len) <= writable,
            "{done:?} > {writable}"
        );
        if done.status.is_none() {
            assert_eq!(done.used_len, 0);
        }
        // Ranges reported to the dedup engine are guest RAM the read filled.
        let mut hinted = 0u64;
        for &(addr, len) in filled.lock().unwrap().iter() {
            assert!(
                mem.check_range(GuestAddress(addr), len, vm_memory::Permissions::Write),
                "hint {addr:#x}+{len:#x} outside guest RAM"
            );
            hinted += len as u64;
        }
        if done.status == Some(0) {
            assert_eq!(
                hinted + 1,
                u64::from(done.used_len),
                "hints != data written"
            );
        } else {
            assert_eq!(hinted, 0, "a failed request reported filled ranges");
        }
        if queue.add_used(&mem, head, done.used_len).is_err() {
            break;
        }
    }
});
