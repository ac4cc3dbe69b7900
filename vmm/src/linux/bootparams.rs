//! The zero page (`struct boot_params`, Documentation/arch/x86/boot.rst).

use linux_loader::bootparam::{boot_e820_entry, boot_params, setup_header};

use super::e820::E820Entry;

/// "HdrS".
pub const HDRS_MAGIC: u32 = 0x5372_6448;
pub const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// "Undefined" boot loader ID: we are not a registered loader.
pub const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// Kernel alignment to report when the image brings no header (ELF): 16 MiB.
pub const DEFAULT_KERNEL_ALIGNMENT: u32 = 0x100_0000;
/// `loadflags`: the protected-mode kernel is loaded at 1 MiB.
const LOADED_HIGH: u8 = 1 << 0;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0} e820 entries do not fit in the zero page")]
    TooManyE820Entries(usize),
}

/// What the zero page must tell the kernel.
pub struct BootParamsInput<'a> {
    /// The bzImage's setup header, copied as the base (None for ELF).
    pub setup_header: Option<setup_header>,
    pub e820: &'a [E820Entry],
    pub cmdline_addr: u64,
    /// Length of the command line without its NUL.
    pub cmdline_len: u32,
    pub initrd: Option<(u64, u64)>,
    pub rsdp_addr: u64,
}

/// Builds the zero page.
pub fn build(input: &BootParamsInput<'_>) -> Result<boot_params, Error> {
    let mut p = boot_params::default();
    let table_len = p.e820_table.len();
    if input.e820.len() > table_len {
        return Err(Error::TooManyE820Entries(input.e820.len()));
    }
    if let Some(hdr) = input.setup_header {
        p.hdr = hdr;
    } else {
        p.hdr.kernel_alignment = DEFAULT_KERNEL_ALIGNMENT;
    }
    p.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    p.hdr.boot_flag = BOOT_FLAG_MAGIC;
    p.hdr.header = HDRS_MAGIC;
    p.hdr.loadflags |= LOADED_HIGH;
    p.hdr.cmd_line_ptr = input.cmdline_addr as u32;
    p.ext_cmd_line_ptr = (input.cmdline_addr >> 32) as u32;
    p.hdr.cmdline_size = input.cmdline_len;
    if let Some((addr, size)) = input.initrd {
        p.hdr.ramdisk_image = addr as u32;
        p.ext_ramdisk_image = (addr >> 32) as u32;
        p.hdr.ramdisk_size = size as u32;
        p.ext_ramdisk_size = (size >> 32) as u32;
    }
    p.acpi_rsdp_addr = input.rsdp_addr;
    for (slot, e) in p.e820_table.iter_mut().zip(input.e820) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind as u32,
        };
    }
    p.e820_entries = input.e820.len() as u8;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::e820::{self, E820Type};
    use vm_memory::{ByteValued, GuestAddress};

    fn input(e820: &[E820Entry]) -> BootParamsInput<'_> {
        BootParamsInput {
            setup_header: None,
            e820,
            cmdline_addr: 0x2_0000,
            cmdline_len: 11,
            initrd: Some((0x1_2345_6000, 0x1_0000_0010)),
            rsdp_addr: 0xe_0000,
        }
    }

    #[test]
    fn elf_zero_page_fields() {
        let map = e820::build(&[(GuestAddress(0), 256 << 20)]).unwrap();
        let p = build(&input(&map)).unwrap();
        let bytes = p.as_slice();
        assert_eq!(bytes.len(), 4096);
        // Offsets from Documentation/arch/x86/zero-page.rst and boot.rst.
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(u16_at(0x1fe), 0xaa55);
        assert_eq!(u32_at(0x202), 0x5372_6448);
        assert_eq!(bytes[0x210], 0xff, "type_of_loader");
        assert_eq!(bytes[0x211] & 1, 1, "LOADED_HIGH");
        assert_eq!(u32_at(0x228), 0x2_0000, "cmd_line_ptr");
        assert_eq!(u32_at(0x238), 11, "cmdline_size");
        assert_eq!(u32_at(0x230), 0x100_0000, "kernel_alignment");
        assert_eq!(u32_at(0x218), 0x2345_6000, "ramdisk_image");
        assert_eq!(u32_at(0x0c0), 1, "ext_ramdisk_image");
        assert_eq!(u32_at(0x21c), 0x10, "ramdisk_size");
        assert_eq!(u32_at(0x0c4), 1, "ext_ramdisk_size");
        assert_eq!(u64_at(0x070), 0xe_0000, "acpi_rsdp_addr");
        assert_eq!(bytes[0x1e8] as usize, map.len(), "e820_entries");
        for (i, e) in map.iter().enumerate() {
            let o = 0x2d0 + 20 * i;
            assert_eq!(
                (u64_at(o), u64_at(o + 8), u32_at(o + 16)),
                (e.addr, e.size, e.kind as u32)
            );
        }
        assert_eq!(u32_at(0x2d0 + 16), E820Type::Ram as u32);
    }

    #[test]
    fn bzimage_header_is_kept() {
        let map = e820::build(&[(GuestAddress(0), 256 << 20)]).unwrap();
        let hdr = setup_header {
            version: 0x020f,
            kernel_alignment: 0x20_0000,
            init_size: 0x1234_5000,
            ..Default::default()
        };
        let mut i = input(&map);
        i.setup_header = Some(hdr);
        let p = build(&i).unwrap();
        assert_eq!({ p.hdr.version }, 0x020f);
        assert_eq!({ p.hdr.kernel_alignment }, 0x20_0000);
        assert_eq!({ p.hdr.init_size }, 0x1234_5000);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
    }

    #[test]
    fn too_many_entries() {
        let many = vec![
            E820Entry {
                addr: 0,
                size: 1,
                kind: E820Type::Ram
            };
            129
        ];
        assert_eq!(
            build(&input(&many)).unwrap_err(),
            Error::TooManyE820Entries(129)
        );
    }
}
