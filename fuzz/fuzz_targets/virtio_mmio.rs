//! The virtio-mmio transport's register state machine, with a virtio-blk
//! device behind it: a sequence of reads and writes (any width, any offset
//! in the 4 KiB window) and ioeventfd-style queue notifications, against
//! guest memory filled from the input.
//!
//! Input: flags, a u16 length of the op section, the ops, then guest memory
//! content from address 0. Op: a kind byte (bit 7 write, bit 6 offset is a
//! register index byte (x4) rather than a raw u16, bit 5 notify queue
//! instead, bits 0-2 access width), the offset, and for writes the value.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pagefold_devices::bus::BusDevice;
use pagefold_devices::virtio::block::{Block, Disk};
use pagefold_devices::virtio::{MmioTransport, MMIO_WINDOW_SIZE};
use pagefold_fuzz::{guest_memory, Input, ScratchFile};
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest RAM: 64 KiB at 0, 16 KiB at 128 KiB.
const RAM: &[(u64, usize)] = &[(0, 0x1_0000), (0x2_0000, 0x4000)];
const WIDTHS: [usize; 8] = [1, 2, 4, 8, 4, 4, 4, 3];
const MAX_OPS: usize = 512;

fn disk_file() -> &'static ScratchFile {
    static F: OnceLock<ScratchFile> = OnceLock::new();
    F.get_or_init(|| ScratchFile::new(c"pagefold-fuzz-mmio-disk"))
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let read_only = flags & 1 != 0;
    let ops = input.chunk(8192);
    let mem = guest_memory(RAM, input.rest());

    let f = disk_file();
    let disk_len = 16 * 512;
    f.zeroed(disk_len);
    let disk = Disk::from_file(f.reopen(!read_only), disk_len, read_only);
    let blk = Block::new(disk, "fuzz").unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut t = MmioTransport::new(mem.clone(), Box::new(blk), irq).unwrap();

    let mut ops = Input::new(ops);
    for _ in 0..MAX_OPS {
        if ops.is_empty() {
            break;
        }
        let kind = ops.u8();
        if kind & 0x20 != 0 {
            t.notify_queue(usize::from(ops.u8() % 4));
            continue;
        }
        let offset = if kind & 0x40 != 0 {
            u64::from(ops.u8()) * 4
        } else {
            u64::from(ops.u16()) % MMIO_WINDOW_SIZE
        };
        let width = WIDTHS[usize::from(kind & 7)];
        if kind & 0x80 != 0 {
            let value = ops.bytes(width);
            let mut buf = [0u8; 8];
            buf[..value.len()].copy_from_slice(value);
            t.write(offset, &buf[..width]);
        } else {
            let mut buf = [0xa5u8; 8];
            t.read(offset, &mut buf[..width]);
        }
        // An active device has usable queues.
        if t.is_activated() {
            for q in t.queues() {
                assert!(q.ready(), "activated with a queue not ready");
            }
        }
    }
});
