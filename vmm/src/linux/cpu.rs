//! The 64-bit CPL0 entry state of the Linux boot protocol
//! (Documentation/arch/x86/boot.rst, "64-bit Boot Protocol"): long mode
//! with paging on an identity map, flat `__BOOT_CS` (0x10) and `__BOOT_DS`
//! (0x18) segments, interrupts off, RSI = boot params.

use kvm_bindings::{kvm_mp_state, kvm_segment, KVM_MP_STATE_UNINITIALIZED};
use kvm_ioctls::VcpuFd;
use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::layout::{
    BOOT_STACK_TOP, GDT_ADDR, IDENTITY_MAP_GIB, IDT_ADDR, PDPT_ADDR, PD_ADDR, PML4_ADDR,
    ZERO_PAGE_ADDR,
};

pub const BOOT_CS: u16 = 0x10;
pub const BOOT_DS: u16 = 0x18;
pub const BOOT_TSS: u16 = 0x20;

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const PTE_PRESENT_RW: u64 = 0b11;
const PDE_PS: u64 = 1 << 7;

/// The GDT: null, null, 64-bit code (0x10), data (0x18), TSS (0x20).
pub const GDT: [u64; 5] = [
    0,
    0,
    gdt_entry(0xa09b, 0, 0xfffff), // code: P, DPL0, S, exec/read, accessed; L, G
    gdt_entry(0xc093, 0, 0xfffff), // data: P, DPL0, S, read/write, accessed; D/B, G
    gdt_entry(0x808b, 0, 0xfffff), // busy 64-bit TSS
];

/// Packs a segment descriptor from flags (access byte + high nibble), base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The KVM view of GDT entry `index`.
pub fn segment(index: usize) -> kvm_segment {
    let e = GDT[index];
    let flags = (e >> 40) as u16;
    let g = ((flags >> 15) & 1) as u8;
    let raw_limit = ((e & 0xffff) | ((e >> 32) & 0xf_0000)) as u32;
    kvm_segment {
        base: ((e >> 16) & 0xff_ffff) | ((e >> 32) & 0xff00_0000),
        limit: if g == 1 {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector: (index * 8) as u16,
        type_: (flags & 0xf) as u8,
        present: ((flags >> 7) & 1) as u8,
        dpl: ((flags >> 5) & 3) as u8,
        db: ((flags >> 14) & 1) as u8,
        s: ((flags >> 4) & 1) as u8,
        l: ((flags >> 13) & 1) as u8,
        g,
        avl: ((flags >> 12) & 1) as u8,
        unusable: u8::from((flags >> 7) & 1 == 0),
        padding: 0,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write boot structures to guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("KVM_GET_SREGS failed: {0}")]
    GetSregs(kvm_ioctls::Error),
    #[error("KVM_SET_SREGS failed: {0}")]
    SetSregs(kvm_ioctls::Error),
    #[error("KVM_SET_REGS failed: {0}")]
    SetRegs(kvm_ioctls::Error),
    #[error("KVM_SET_MP_STATE failed: {0}")]
    SetMpState(kvm_ioctls::Error),
}

/// Writes the GDT, the (empty) IDT and the identity page tables that the
/// entry state refers to. Called once per VM by `load_linux`.
pub fn write_boot_structures(mem: &GuestMemoryMmap) -> Result<(), Error> {
    for (i, e) in GDT.iter().enumerate() {
        mem.write_obj(*e, GuestAddress(GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_ADDR))?;
    // PML4[0] -> PDPT; PDPT[i] -> PD i; PD i maps GiB i with 2 MiB pages.
    mem.write_obj(PDPT_ADDR | PTE_PRESENT_RW, GuestAddress(PML4_ADDR))?;
    for gib in 0..IDENTITY_MAP_GIB {
        let pd = PD_ADDR + gib * 0x1000;
        mem.write_obj(pd | PTE_PRESENT_RW, GuestAddress(PDPT_ADDR + 8 * gib))?;
        for j in 0..512u64 {
            let addr = (gib << 30) | (j << 21);
            mem.write_obj(addr | PTE_PRESENT_RW | PDE_PS, GuestAddress(pd + 8 * j))?;
        }
    }
    Ok(())
}

/// Puts vCPU `cpu_index` into its boot state.
///
/// The boot CPU (index 0) gets the 64-bit entry state: long mode, paging
/// on the identity map, RIP = `entry`, RSI = zero page. Application
/// processors stay in the wait-for-SIPI state: Linux starts them itself
/// through the in-kernel LAPIC (INIT/SIPI into its real-mode trampoline).
pub fn setup_cpl0_long_mode(
    vcpu: &VcpuFd,
    entry: GuestAddress,
    cpu_index: u8,
) -> Result<(), Error> {
    if cpu_index != 0 {
        return vcpu
            .set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_UNINITIALIZED,
            })
            .map_err(Error::SetMpState);
    }
    let mut sregs = vcpu.get_sregs().map_err(Error::GetSregs)?;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 0;
    sregs.cs = segment(usize::from(BOOT_CS / 8));
    let data = segment(usize::from(BOOT_DS / 8));
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(usize::from(BOOT_TSS / 8));
    sregs.cr0 = X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 = X86_CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(Error::SetSregs)?;

    let regs = kvm_bindings::kvm_regs {
        rip: entry.0,
        rsi: ZERO_PAGE_ADDR,
        rsp: BOOT_STACK_TOP,
        rbp: BOOT_STACK_TOP,
        rflags: 0x2,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(Error::SetRegs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode() {
        assert_eq!(GDT[2], 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[3], 0x00cf_9300_0000_ffff);
        let cs = segment(2);
        assert_eq!(
            (cs.selector, cs.l, cs.db, cs.type_, cs.s, cs.dpl, cs.present),
            (0x10, 1, 0, 0xb, 1, 0, 1)
        );
        assert_eq!((cs.base, cs.limit, cs.g), (0, 0xffff_ffff, 1));
        let ds = segment(3);
        assert_eq!(
            (ds.selector, ds.l, ds.db, ds.type_, ds.s),
            (0x18, 0, 1, 3, 1)
        );
        let tr = segment(4);
        assert_eq!((tr.selector, tr.type_, tr.s, tr.present), (0x20, 0xb, 0, 1));
        assert_eq!(segment(0).unusable, 1);
    }

    #[test]
    fn identity_map_covers_4_gib() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_boot_structures(&mem).unwrap();
        // Walk the tables for a few addresses.
        for addr in [0u64, 0x1234_5678, 0xfee0_0000, 0xffff_ffff] {
            let pml4e: u64 = mem
                .read_obj(GuestAddress(PML4_ADDR + 8 * ((addr >> 39) & 511)))
                .unwrap();
            assert_eq!(pml4e & 1, 1);
            let pdpte: u64 = mem
                .read_obj(GuestAddress((pml4e & !0xfff) + 8 * ((addr >> 30) & 511)))
                .unwrap();
            assert_eq!(pdpte & 1, 1);
            let pde: u64 = mem
                .read_obj(GuestAddress((pdpte & !0xfff) + 8 * ((addr >> 21) & 511)))
                .unwrap();
            assert_eq!(pde & (PDE_PS | PTE_PRESENT_RW), PDE_PS | PTE_PRESENT_RW);
            assert_eq!(
                (pde & !0x1f_ffff) | (addr & 0x1f_ffff),
                addr,
                "identity at {addr:#x}"
            );
        }
        let gdt2: u64 = mem.read_obj(GuestAddress(GDT_ADDR + 16)).unwrap();
        assert_eq!(gdt2, GDT[2]);
    }
}
