//! Booting the built-in workload guest: load its ELF, build identity page
//! tables with the user bit, a GDT and TSS, and enter 64-bit long mode at
//! CPL3 — the mode that runs natively on every KVM host, PVM included.

use std::io::Cursor;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use pagefold_devices::GuestMemoryMmap;
use pagefold_guest_abi::layout;
use vm_memory::{Bytes, GuestAddress};

use crate::x86::{self, gdt, paging};

/// Errors of workload-guest boot.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the workload ELF: {0}")]
    Load(linux_loader::loader::Error),
    #[error("the workload ELF is malformed: {0}")]
    BadElf(&'static str),
    #[error(transparent)]
    X86(#[from] x86::Error),
}

/// Where the guest image ended up.
#[derive(Debug, Clone, Copy)]
pub struct Image {
    pub entry: u64,
    /// First byte after every loadable segment (incl. .bss).
    pub end: u64,
}

/// End of the highest PT_LOAD segment, by `p_memsz` (so .bss counts even
/// where the loader skips segments without file bytes).
pub fn image_end(elf: &[u8]) -> Result<u64, Error> {
    // Offsets come from the file: every sum is checked, so a header that
    // points past the end of the address space is "truncated", not a panic.
    fn field<const N: usize>(elf: &[u8], o: usize) -> Option<[u8; N]> {
        elf.get(o..o.checked_add(N)?)?.try_into().ok()
    }
    let rd16 = |o: usize| field(elf, o).map(u16::from_le_bytes);
    let rd32 = |o: usize| field(elf, o).map(u32::from_le_bytes);
    let rd64 = |o: usize| field(elf, o).map(u64::from_le_bytes);
    if elf.get(0..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) {
        return Err(Error::BadElf("not a 64-bit ELF"));
    }
    let truncated_header = Error::BadElf("truncated header");
    let truncated = || Error::BadElf("truncated program header");
    let phoff = usize::try_from(rd64(0x20).ok_or(truncated_header)?).map_err(|_| truncated())?;
    let phentsize = usize::from(rd16(0x36).ok_or(Error::BadElf("truncated header"))?);
    let phnum = usize::from(rd16(0x38).ok_or(Error::BadElf("truncated header"))?);
    let mut end = 0;
    for i in 0..phnum {
        let p = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or_else(truncated)?;
        let ty = rd32(p).ok_or_else(truncated)?;
        if ty != 1 {
            continue; // PT_LOAD only
        }
        let paddr = p.checked_add(0x18).and_then(rd64).ok_or_else(truncated)?;
        let memsz = p.checked_add(0x28).and_then(rd64).ok_or_else(truncated)?;
        end = end.max(paddr.saturating_add(memsz));
    }
    if end == 0 {
        return Err(Error::BadElf("no loadable segment"));
    }
    Ok(end)
}

/// Copies the ELF into guest memory.
pub fn load_image(mem: &GuestMemoryMmap, elf: &[u8]) -> Result<Image, Error> {
    let res = Elf::load(mem, None, &mut Cursor::new(elf), None).map_err(Error::Load)?;
    let end = image_end(elf)?.max(res.kernel_end);
    Ok(Image {
        entry: res.kernel_load.0,
        end,
    })
}

/// TSS location. The guest never takes an interrupt, but VM entry wants a
/// valid task register, and the TSS's I/O permission bitmap matters: PVM
/// checks it for CPL3 `in`/`out` (IOPL 3 alone is not enough there), so the
/// TSS carries a full bitmap that allows every port.
const TSS_ADDR: u64 = 0x2000;
/// Offset of the I/O bitmap in the TSS (right after the 104-byte TSS).
const IOMAP_OFFSET: u64 = 0x68;
/// One bit per port, 65536 ports.
const IOMAP_BYTES: u64 = 0x2000;

/// Writes the GDT and the page tables covering `[0, ram_top)`.
pub fn write_tables(mem: &GuestMemoryMmap, ram_top: u64) -> Result<u64, Error> {
    write_tables_with_mmio(mem, ram_top, &[])
}

/// Writes the GDT and the page tables covering `[0, ram_top)` and the device
/// windows `mmio` (`(start, len)`: the virtio-mmio windows of the VM's
/// disks, which the guest's driver accesses directly at CPL3).
pub fn write_tables_with_mmio(
    mem: &GuestMemoryMmap,
    ram_top: u64,
    mmio: &[(u64, u64)],
) -> Result<u64, Error> {
    let gm = |what, r: Result<(), vm_memory::GuestMemoryError>| {
        r.map_err(|source| x86::Error::GuestMemory { what, source })
    };
    // TSS: I/O bitmap base, an all-zero (all ports allowed) bitmap, and the
    // 0xff byte that must follow it.
    gm(
        "TSS",
        mem.write_obj(IOMAP_OFFSET as u16, GuestAddress(TSS_ADDR + 0x66)),
    )?;
    gm(
        "TSS",
        mem.write_slice(
            &[0u8; IOMAP_BYTES as usize],
            GuestAddress(TSS_ADDR + IOMAP_OFFSET),
        ),
    )?;
    gm(
        "TSS",
        mem.write_obj(0xffu8, GuestAddress(TSS_ADDR + IOMAP_OFFSET + IOMAP_BYTES)),
    )?;
    let table = gdt::table(TSS_ADDR);
    for (i, d) in table.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(layout::GDT_ADDR + i as u64 * 8))
            .map_err(|source| x86::Error::GuestMemory {
                what: "GDT",
                source,
            })?;
    }
    let cr3 = paging::write_identity_map_with(
        mem,
        layout::PAGE_TABLES_START,
        layout::PAGE_TABLES_END,
        ram_top,
        mmio,
        true,
    )?;
    Ok(cr3)
}

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_AM: u64 = 1 << 18;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS: reserved bit 1, IOPL 3 (so `in`/`out` at CPL3 exit to the VMM).
pub const RFLAGS_IOPL3: u64 = 0x3002;

/// The special registers of a CPL3 long-mode guest.
pub fn cpl3_sregs(mut s: kvm_sregs, cr3: u64) -> kvm_sregs {
    s.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_AM | CR0_PG;
    s.cr3 = cr3;
    s.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    s.efer = EFER_LME | EFER_LMA;
    s.cs = gdt::segment(gdt::USER_CS, TSS_ADDR);
    let ds = gdt::segment(gdt::USER_DS, TSS_ADDR);
    s.ds = ds;
    s.es = ds;
    s.fs = ds;
    s.gs = ds;
    s.ss = ds;
    s.tr = gdt::segment(gdt::TSS_SEL, TSS_ADDR);
    s.gdt.base = layout::GDT_ADDR;
    s.gdt.limit = (gdt::table(0).len() * 8 - 1) as u16;
    // No IDT: any exception is a triple fault, which the VMM reports.
    s.idt.base = 0;
    s.idt.limit = 0;
    s
}

/// Puts the boot vCPU at the workload's entry point.
pub fn setup_vcpu(vcpu: &VcpuFd, entry: u64, cr3: u64) -> Result<(), Error> {
    let s = vcpu.get_sregs().map_err(x86::Error::Sregs)?;
    vcpu.set_sregs(&cpl3_sregs(s, cr3))
        .map_err(x86::Error::Sregs)?;
    let regs = kvm_regs {
        rip: entry,
        rsp: layout::STACK_TOP,
        rflags: RFLAGS_IOPL3,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(x86::Error::Regs)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::image::WORKLOAD_ELF;

    /// Found by the kernel_loader fuzz target: a program-header offset
    /// near `usize::MAX` overflowed `phoff + i * phentsize` (and the field
    /// offsets after it) instead of being refused as truncated.
    #[test]
    fn image_end_refuses_headers_pointing_past_the_address_space() {
        let mut elf = vec![0u8; 64];
        elf[..5].copy_from_slice(b"\x7fELF\x02");
        for phoff in [u64::MAX, u64::MAX - 3, u64::MAX - 0x20] {
            elf[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
            elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
            elf[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
            assert!(
                matches!(
                    image_end(&elf),
                    Err(Error::BadElf("truncated program header"))
                ),
                "phoff {phoff:#x}"
            );
        }
        // A PT_LOAD whose fields would lie past usize::MAX.
        let phoff = (usize::MAX - 0x1f) as u64;
        elf[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        assert!(image_end(&elf).is_err());
        // Huge phentsize * phnum.
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&u16::MAX.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(image_end(&elf).is_err());
    }

    #[test]
    fn sregs_are_cpl3_long_mode() {
        let s = cpl3_sregs(kvm_sregs::default(), 0x10000);
        assert_eq!(s.cs.dpl, 3);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.ss.dpl, 3);
        assert_eq!(s.cs.selector & 3, 3);
        assert_ne!(s.cr0 & CR0_PG, 0);
        assert_ne!(s.efer & EFER_LMA, 0);
        assert_eq!(s.cr3, 0x10000);
        assert_eq!(s.tr.type_, 11);
        assert_eq!(s.gdt.limit, 71);
    }

    #[test]
    fn loads_the_workload_image() {
        let mem = crate::memory::create(16 << 20).unwrap();
        let img = load_image(&mem, WORKLOAD_ELF).unwrap();
        assert!(
            img.entry >= layout::IMAGE_BASE && img.entry < img.end,
            "{img:?}"
        );
        assert!(img.end < 8 << 20, "image unexpectedly large: {img:?}");
        // The entry point holds code, not zeros.
        let first: u64 = mem.read_obj(GuestAddress(img.entry)).unwrap();
        assert_ne!(first, 0);
        let cr3 = write_tables(&mem, 16 << 20).unwrap();
        assert_eq!(cr3, layout::PAGE_TABLES_START);
        let gdt1: u64 = mem.read_obj(GuestAddress(layout::GDT_ADDR + 8)).unwrap();
        assert_eq!(gdt1, 0x00af_9b00_0000_ffff);
    }

    #[test]
    fn tables_map_the_virtio_window() {
        let mem = crate::memory::create(16 << 20).unwrap();
        let pd3 = layout::PAGE_TABLES_START + (2 + 3) * 4096;
        let slot = 0xd000_0000u64;
        write_tables(&mem, 16 << 20).unwrap();
        let pdpt3: u64 = mem
            .read_obj(GuestAddress(layout::PAGE_TABLES_START + 4096 + 3 * 8))
            .unwrap();
        assert_eq!(pdpt3, 0, "GiB 3 is not mapped without windows");
        write_tables_with_mmio(&mem, 16 << 20, &[(slot, 0x1000)]).unwrap();
        let pdpt3: u64 = mem
            .read_obj(GuestAddress(layout::PAGE_TABLES_START + 4096 + 3 * 8))
            .unwrap();
        assert_eq!(pdpt3 & !0xfff, pd3);
        let pde: u64 = mem
            .read_obj(GuestAddress(pd3 + ((slot >> 21) & 511) * 8))
            .unwrap();
        // Present, writable, user, 2 MiB, identity.
        assert_eq!(pde, slot | 0x87);
    }

    #[test]
    fn rejects_bad_elves() {
        assert!(matches!(image_end(b"nope"), Err(Error::BadElf(_))));
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        assert!(matches!(
            image_end(&h),
            Err(Error::BadElf("no loadable segment"))
        ));
    }
}
