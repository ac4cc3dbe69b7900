//! The workload control device: port writes and reads (mailbox address,
//! doorbell opcodes, status) served from guest memory filled from the
//! input, with parameters that are either valid or fuzzed (decoded by the
//! guest ABI's `DataLayout`, whose guest/host contract is checked too).
//!
//! Input: flags, parameters (fuzzed mode), a u16 length of the op section,
//! the ops (kind byte, then its operands), then guest memory content.

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pagefold_devices::workload::{WorkloadControl, WorkloadDevice};
use pagefold_fuzz::{guest_memory, Input};
use pagefold_guest_abi::classes::{self, DataLayout, SlotUse};
use pagefold_guest_abi::mailbox::op;
use pagefold_guest_abi::{phase, ports, WorkloadParams, PAGE_SIZE, PARAMS_MAGIC};
use vm_memory::{Bytes, GuestAddress};

/// Guest RAM: 64 KiB at 0, 16 KiB at 128 KiB.
const RAM: &[(u64, usize)] = &[(0, 0x1_0000), (0x2_0000, 0x4000)];
const MAX_OPS: usize = 256;

fn valid_params() -> WorkloadParams {
    let mut program = [0; 16];
    program[0] = phase::FILL;
    program[1] = phase::VERIFY;
    WorkloadParams {
        magic: PARAMS_MAGIC,
        seed: 5,
        private_seed: 6,
        shared_pages: 100,
        private_pages: 50,
        data_start: 0x40_0000,
        data_end: 0x40_0000 + 200 * PAGE_SIZE,
        program,
        ..WorkloadParams::default()
    }
}

fn fuzzed_params(i: &mut Input) -> WorkloadParams {
    let mut p = valid_params();
    let mask = i.u32();
    let pick = |bit: u32, v: u64, i: &mut Input| if mask & (1 << bit) != 0 { i.u64() } else { v };
    p.magic = pick(0, p.magic, i);
    p.shared_pages = pick(1, p.shared_pages, i);
    p.private_pages = pick(2, p.private_pages, i);
    p.data_start = pick(3, p.data_start, i);
    p.data_end = pick(4, p.data_end, i);
    p.high_start = pick(5, p.high_start, i);
    p.high_end = pick(6, p.high_end, i);
    p.disk_count = pick(7, p.disk_count, i);
    p.disk_pages = pick(8, p.disk_pages, i);
    p.disk_seed = pick(9, p.disk_seed, i);
    p.placement_seed = pick(10, p.placement_seed, i);
    p.churn_ms = pick(11, p.churn_ms, i);
    if mask & (1 << 12) != 0 {
        p.zero_permille = i.u32() % 1200;
        p.dup_permille = i.u32() % 1200;
        p.churn_permille = i.u32() % 1200;
    }
    if mask & (1 << 13) != 0 {
        p.placement = i.u32() % 3;
        p.extent_pages = i.u32() % 70000;
    }
    if mask & (1 << 14) != 0 {
        for k in 0..16 {
            p.program[k] = u32::from(i.u8()) % (phase::LAST + 1);
            p.program_args[k] = u64::from(i.u16());
        }
    }
    if mask & (1 << 15) != 0 {
        for a in &mut p.disk_mmio {
            *a = i.u64();
        }
    }
    p
}

/// The guest/host contract of a valid layout, at a few points.
fn check_layout(p: &WorkloadParams, probes: &mut Input) {
    let Ok(l) = DataLayout::new(p) else {
        return;
    };
    for _ in 0..4 {
        let x = probes.u64();
        if l.pages > 0 {
            let i = x % l.pages;
            let slot = l.page_slot(i);
            assert!(slot < l.slots(), "page {i} in slot {slot} of {}", l.slots());
            assert_eq!(l.slot_use(slot), SlotUse::Page(i));
            assert_eq!(l.gpa_slot(l.page_gpa(i)), Some(slot));
            let _ = classes::page_class(p, i);
            let _ = classes::version_after_churn(p, i, x);
            let len = classes::churn_len(p);
            if len > 0 {
                let k = x % len;
                assert_eq!(classes::churn_rank(p, classes::churn_member(p, k)), Some(k));
            }
        }
        if l.disk_pages > 0 {
            let k = x % l.disk_pages;
            let slot = l.disk_slot(k);
            assert!(slot < l.slots());
            assert_eq!(l.slot_use(slot), SlotUse::Disk(k));
            assert!(l.disk_run(k) >= 1);
        }
        if l.slots() > 0 {
            let s = x % l.slots();
            let _ = classes::slot_content(p, &l, s, x);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let params = if flags & 1 != 0 {
        fuzzed_params(&mut input)
    } else {
        valid_params()
    };
    check_layout(&params, &mut Input::new(input.bytes(32)));
    let ops = input.chunk(4096);
    let mem = guest_memory(RAM, input.rest());
    let (tx, _rx) = crossbeam_channel::unbounded();
    let control = Arc::new(WorkloadControl::new());
    if flags & 2 != 0 {
        control.stop();
    }
    let mut dev = WorkloadDevice::new("fuzz".into(), params, mem.clone(), tx, control.clone());
    let mut mailbox = None;
    let mut lo = 0u32;
    let mut ops = Input::new(ops);
    for _ in 0..MAX_OPS {
        if ops.is_empty() {
            break;
        }
        let kind = ops.u8();
        let port = ports::BASE + u16::from(kind & 0xf);
        match kind >> 4 {
            // A 4-byte write to a device port.
            0..=9 => {
                let mut value = ops.u32();
                if port == ports::MAILBOX_LO {
                    lo = value;
                }
                if port == ports::DOORBELL {
                    // Never block: SLEEP sleeps 0 ms, WAIT_HOST finds its
                    // gate released (or the control stopped).
                    if value == op::SLEEP || value == op::WAIT_HOST {
                        if let Some(mb) = mailbox {
                            let _ = mem.write_obj(0u64, GuestAddress(mb));
                        }
                        control.release_gate();
                        if value == op::WAIT_HOST && mailbox.is_none() {
                            value = op::CLOCK;
                        }
                    }
                }
                let r = dev.pio_write(port, &value.to_le_bytes());
                if port == ports::MAILBOX_HI {
                    mailbox = r.is_ok().then(|| (u64::from(value) << 32) | u64::from(lo));
                }
            }
            // A write of another width.
            10..=11 => {
                // 4-byte writes are the branch above (which keeps SLEEP
                // and WAIT_HOST from blocking).
                let n = usize::from(ops.u8() % 9);
                let n = if n == 4 { 3 } else { n };
                let b = ops.bytes(n);
                let _ = dev.pio_write(port, b);
            }
            // A read.
            _ => {
                let n = usize::from(ops.u8() % 9);
                let mut b = [0u8; 8];
                dev.pio_read(port, &mut b[..n]);
            }
        }
    }
});
