//! virtio-balloon: its four queues (inflate, deflate, statistics,
//! reporting) in guest memory built from the input, processed in an order
//! the input gives, statistics asked for in between. The discard hook
//! checks what the device gives back: page-aligned ranges inside guest
//! RAM, sorted and apart, and only while the chain is not yet returned.
//!
//! Input: flags (which features the driver acks, EVENT_IDX-free), queue
//! size, up to 16 queue operations (one byte each: the queue number, or
//! 0xff to ask for statistics), then guest memory content from address 0
//! (every queue's descriptor table, rings and buffers are in it). Guest
//! RAM is two regions with a hole between them, so chains, PFNs and
//! reported ranges can point into the hole and across region ends.

#![no_main]

use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use pagefold_devices::virtio::balloon::{
    Balloon, DiscardHook, Features, BALLOON_PAGE, QUEUE_SIZE, VIRTIO_BALLOON_F_REPORTING,
    VIRTIO_BALLOON_F_STATS_VQ,
};
use pagefold_devices::virtio::{VirtioDevice, VIRTIO_F_VERSION_1};
use pagefold_fuzz::{guest_memory, Input};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend};
use pagefold_devices::GuestMemoryMmap;

/// Guest RAM: 64 KiB at 0, 16 KiB at 128 KiB.
const RAM: &[(u64, usize)] = &[(0, 0x1_0000), (0x2_0000, 0x4000)];
/// Queue k's rings: descriptors, driver area, device area.
fn rings(k: u64) -> (u64, u64, u64) {
    (k * 0x400, 0x1000 + k * 0x400, 0x2000 + k * 0x400)
}
/// Queue operations per input (bounded time).
const MAX_OPS: usize = 16;

fn queue(mem: &GuestMemoryMmap, (d, a, u): (u64, u64, u64), size: u16) -> Queue {
    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(size);
    q.try_set_desc_table_address(GuestAddress(d)).unwrap();
    q.try_set_avail_ring_address(GuestAddress(a)).unwrap();
    q.try_set_used_ring_address(GuestAddress(u)).unwrap();
    q.set_ready(true);
    assert!(q.is_valid(mem));
    q
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let qsize = 1u16 << (input.u8() % 5);
    let nops = (input.u8() as usize) % (MAX_OPS + 1);
    let ops: Vec<u8> = (0..nops).map(|_| input.u8()).collect();
    let mem = guest_memory(RAM, input.rest());

    let given = Arc::new(Mutex::new(0u64));
    let (g, m) = (given.clone(), mem.clone());
    let hook: DiscardHook = Arc::new(move |ranges: &[(u64, u64)]| {
        let mut end = 0;
        for &(a, l) in ranges {
            assert!(l > 0 && a % BALLOON_PAGE == 0 && l % BALLOON_PAGE == 0, "{ranges:x?}");
            assert!(a >= end || end == 0, "ranges overlap or touch: {ranges:x?}");
            assert!(m.check_range(GuestAddress(a), l as usize), "{a:#x}+{l:#x} not in RAM");
            end = a + l + 1;
        }
        let pages: u64 = ranges.iter().map(|&(_, l)| l / BALLOON_PAGE).sum();
        *g.lock().unwrap() += pages;
        pages
    });
    let features = Features {
        stats: true,
        deflate_on_oom: true,
        free_page_reporting: true,
    };
    let mut dev = Balloon::new(features, hook);
    let mut acked = 1u64 << VIRTIO_F_VERSION_1;
    if flags & 1 != 0 {
        acked |= 1 << VIRTIO_BALLOON_F_STATS_VQ;
    }
    if flags & 2 != 0 {
        acked |= 1 << VIRTIO_BALLOON_F_REPORTING;
    }
    let n = dev.queues_in_use(acked);
    dev.activate(acked, &mut [], &mem).unwrap();
    let mut queues: Vec<Queue> = (0..n as u64).map(|k| queue(&mem, rings(k), qsize)).collect();
    let state = dev.state();
    for op in ops {
        if op == 0xff {
            state.want_stats();
            continue;
        }
        let k = op as usize % n;
        let _ = dev.process_queue(k, &mut queues[k], &mem);
    }
    // What the hook gave back is what the device counted, and no more
    // than it was handed.
    let c = state.counters();
    assert_eq!(c.returned_pages, *given.lock().unwrap(), "{c:?}");
    assert!(c.returned_pages <= c.inflated_pages + c.reported_pages, "{c:?}");
});
