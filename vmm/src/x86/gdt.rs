//! Global descriptor table for 64-bit guests, in the Linux layout so that
//! selectors mean the same thing to a workload guest and to a kernel.

use kvm_bindings::kvm_segment;

/// Kernel 64-bit code selector.
pub const KERNEL_CS: u16 = 0x08;
/// Kernel data selector.
pub const KERNEL_DS: u16 = 0x10;
/// User data selector (RPL 3).
pub const USER_DS: u16 = 0x28 | 3;
/// User 64-bit code selector (RPL 3).
pub const USER_CS: u16 = 0x30 | 3;
/// Task state segment selector (a 16-byte system descriptor).
pub const TSS_SEL: u16 = 0x38;
/// Limit of the TSS the table points at: the 104-byte TSS, an 8 KiB I/O
/// permission bitmap and its terminating byte.
pub const TSS_LIMIT: u32 = 0x68 + 0x2000;

/// Builds a code/data descriptor from access byte and flags.
const fn descriptor(flags: u64, access: u64) -> u64 {
    // base 0, limit 0xfffff with 4 KiB granularity.
    (flags << 52) | (access << 40) | (0xf << 48) | 0xffff
}

const KERNEL_CODE64: u64 = descriptor(0xa, 0x9b); // G, L; P, DPL0, code, R, A
const KERNEL_DATA: u64 = descriptor(0xc, 0x93); // G, DB; P, DPL0, data, W, A
const USER_DATA: u64 = descriptor(0xc, 0xf3); // DPL3
const USER_CODE64: u64 = descriptor(0xa, 0xfb); // DPL3, L

/// The table: null, kernel code/data, two unused slots, user data/code, TSS.
pub fn table(tss_base: u64) -> [u64; 9] {
    let tss_low = (u64::from(TSS_LIMIT) & 0xffff)
        | ((u64::from(TSS_LIMIT) >> 16) << 48)
        | ((tss_base & 0xff_ffff) << 16)
        | (0x89 << 40) // P, available 64-bit TSS
        | (((tss_base >> 24) & 0xff) << 56);
    let tss_high = tss_base >> 32;
    [
        0,
        KERNEL_CODE64,
        KERNEL_DATA,
        0,
        0,
        USER_DATA,
        USER_CODE64,
        tss_low,
        tss_high,
    ]
}

/// The KVM view of the descriptor at `sel` in [`table`].
pub fn segment(sel: u16, tss_base: u64) -> kvm_segment {
    let t = table(tss_base);
    let d = t[usize::from(sel >> 3)];
    let access = (d >> 40) & 0xff;
    let flags = (d >> 52) & 0xf;
    if sel == TSS_SEL {
        return kvm_segment {
            base: tss_base,
            limit: TSS_LIMIT,
            selector: sel,
            type_: 11, // busy 64-bit TSS, as VM entry requires
            present: 1,
            s: 0,
            ..Default::default()
        };
    }
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: sel,
        type_: (access & 0xf) as u8,
        present: ((access >> 7) & 1) as u8,
        dpl: ((access >> 5) & 3) as u8,
        s: ((access >> 4) & 1) as u8,
        l: ((flags >> 1) & 1) as u8,
        db: ((flags >> 2) & 1) as u8,
        g: ((flags >> 3) & 1) as u8,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_decode_as_intended() {
        let cs = segment(USER_CS, 0);
        assert_eq!(
            (cs.dpl, cs.l, cs.db, cs.type_, cs.present, cs.s),
            (3, 1, 0, 11, 1, 1)
        );
        let ds = segment(USER_DS, 0);
        assert_eq!((ds.dpl, ds.l, ds.db, ds.type_), (3, 0, 1, 3));
        let kcs = segment(KERNEL_CS, 0);
        assert_eq!((kcs.dpl, kcs.l, kcs.type_), (0, 1, 11));
        assert_eq!(KERNEL_CODE64, 0x00af_9b00_0000_ffff);
        assert_eq!(KERNEL_DATA, 0x00cf_9300_0000_ffff);
        let t = table(0x1234_5678_9abc);
        // TSS base scattered over the descriptor, high half in the next slot.
        assert_eq!((t[7] >> 16) & 0xff_ffff, 0x789abc);
        assert_eq!((t[7] >> 56) & 0xff, 0x56);
        assert_eq!(t[8], 0x1234);
        let tr = segment(TSS_SEL, 0x2000);
        assert_eq!((tr.base, tr.type_, tr.s), (0x2000, 11, 0));
    }
}
