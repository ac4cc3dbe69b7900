//! The built-in workload guest image (built from guest/workload by build.rs).

/// The workload guest: a static ELF64 `EXEC` image linked at
/// [`pagefold_guest_abi::layout::IMAGE_BASE`], to be loaded with
/// linux-loader's `Elf` loader and entered at CPL3 (see
/// docs/workload-guest.md). Embedded so that the `pagefold` binary needs no
/// file beside it.
pub static WORKLOAD_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pagefold-workload.elf"));

#[cfg(test)]
mod tests {
    use super::WORKLOAD_ELF;
    use pagefold_guest_abi::classes::MIN_DATA_START;
    use pagefold_guest_abi::layout::IMAGE_BASE;

    fn u16_at(off: usize) -> u16 {
        u16::from_le_bytes(WORKLOAD_ELF[off..off + 2].try_into().unwrap())
    }
    fn u32_at(off: usize) -> u32 {
        u32::from_le_bytes(WORKLOAD_ELF[off..off + 4].try_into().unwrap())
    }
    fn u64_at(off: usize) -> u64 {
        u64::from_le_bytes(WORKLOAD_ELF[off..off + 8].try_into().unwrap())
    }

    /// (type, vaddr, paddr, memsz) of every program header.
    fn program_headers() -> Vec<(u32, u64, u64, u64)> {
        let phoff = u64_at(0x20) as usize;
        let phentsize = u16_at(0x36) as usize;
        let phnum = u16_at(0x38) as usize;
        (0..phnum)
            .map(|i| {
                let p = phoff + i * phentsize;
                (
                    u32_at(p),
                    u64_at(p + 0x10),
                    u64_at(p + 0x18),
                    u64_at(p + 0x28),
                )
            })
            .collect()
    }

    #[test]
    fn is_an_elf64_x86_64_exec_image() {
        assert_eq!(&WORKLOAD_ELF[..4], b"\x7fELF");
        assert_eq!(WORKLOAD_ELF[4], 2, "ELFCLASS64");
        assert_eq!(WORKLOAD_ELF[5], 1, "little endian");
        assert_eq!(u16_at(0x10), 2, "ET_EXEC (static, not PIE)");
        assert_eq!(u16_at(0x12), 62, "EM_X86_64");
    }

    #[test]
    fn entry_is_inside_the_loaded_image_below_the_data_area() {
        const PT_LOAD: u32 = 1;
        const PT_INTERP: u32 = 3;
        const PT_DYNAMIC: u32 = 2;
        let phdrs = program_headers();
        assert!(
            phdrs
                .iter()
                .all(|&(t, ..)| t != PT_INTERP && t != PT_DYNAMIC),
            "must be static"
        );
        let loads: Vec<_> = phdrs.iter().filter(|&&(t, ..)| t == PT_LOAD).collect();
        assert!(!loads.is_empty());
        let start = loads.iter().map(|&&(_, v, ..)| v).min().unwrap();
        let end = loads.iter().map(|&&(_, v, _, m)| v + m).max().unwrap();
        assert_eq!(start, IMAGE_BASE);
        // linux-loader loads at p_paddr: identity mapping needs paddr == vaddr.
        assert!(loads.iter().all(|&&(_, v, p, _)| v == p));
        assert!(
            end <= MIN_DATA_START,
            "image (to {end:#x}) overlaps the data area"
        );
        let entry = u64_at(0x18);
        assert!((IMAGE_BASE..end).contains(&entry), "entry {entry:#x}");
    }

    #[test]
    fn linux_loader_loads_it_at_image_base() {
        use linux_loader::loader::{elf::Elf, KernelLoader};
        use pagefold_devices::GuestMemoryMmap;
        use vm_memory::{Bytes, GuestAddress};
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        let mut image = std::io::Cursor::new(WORKLOAD_ELF);
        let r = Elf::load(&mem, None, &mut image, Some(GuestAddress(IMAGE_BASE))).unwrap();
        assert_eq!(r.kernel_load, GuestAddress(u64_at(0x18)));
        // The entry's first instructions landed where the image says.
        let mut code = [0u8; 16];
        mem.read_slice(&mut code, r.kernel_load).unwrap();
        let off = (u64_at(0x18) - IMAGE_BASE) as usize + 0x1000; // .text at file offset 0x1000
        assert_eq!(&code[..], &WORKLOAD_ELF[off..off + 16]);
    }
}
