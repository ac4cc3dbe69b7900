//! Loading the kernel image: ELF vmlinux or bzImage, both entered at their
//! 64-bit entry point.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::bootparam::setup_header;
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use pagefold_devices::GuestMemoryMmap;
use vm_memory::GuestAddress;

use super::layout::HIMEM_START;

/// `xloadflags` bit: the kernel has a 64-bit entry point at load + 0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// Offset of `startup_64` from the start of the protected-mode code.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// Boot protocol version that introduced `xloadflags` (2.12).
const BOOT_PROTOCOL_2_12: u16 = 0x020c;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    Elf,
    BzImage,
}

/// Where the kernel landed and how to enter it.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    pub format: KernelFormat,
    /// 64-bit entry point (RIP at boot).
    pub entry: GuestAddress,
    /// First guest address after the loaded image.
    pub end: u64,
    /// The bzImage's setup header, to be copied into the zero page.
    pub setup_header: Option<setup_header>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open kernel {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read kernel image header: {0}")]
    Read(std::io::Error),
    #[error("kernel image is neither an ELF file nor a bzImage")]
    UnknownFormat,
    #[error("loading the kernel failed: {0}")]
    Load(#[from] linux_loader::loader::Error),
    #[error("bzImage has no 64-bit entry point (boot protocol {version:#x}, xloadflags {xloadflags:#x})")]
    No64BitEntry { version: u16, xloadflags: u16 },
}

/// Loads the kernel at `path` into `mem` and returns its entry point.
///
/// ELF: segments go to their physical addresses, entry is `e_entry`
/// (`startup_64` for an x86-64 vmlinux). bzImage: the protected-mode part
/// goes to `code32_start` (1 MiB), entry is that + 0x200, which needs
/// `XLF_KERNEL_64`.
pub fn load(mem: &GuestMemoryMmap, path: &Path) -> Result<LoadedKernel, Error> {
    let mut file = File::open(path).map_err(|source| Error::Open {
        path: path.display().to_string(),
        source,
    })?;
    match detect(&mut file)? {
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))?;
            Ok(LoadedKernel {
                format: KernelFormat::Elf,
                entry: r.kernel_load,
                end: r.kernel_end,
                setup_header: None,
            })
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))?;
            let hdr = r.setup_header.ok_or(Error::UnknownFormat)?;
            let (version, xloadflags) = (hdr.version, hdr.xloadflags);
            if version < BOOT_PROTOCOL_2_12 || xloadflags & XLF_KERNEL_64 == 0 {
                return Err(Error::No64BitEntry {
                    version,
                    xloadflags,
                });
            }
            Ok(LoadedKernel {
                format: KernelFormat::BzImage,
                entry: GuestAddress(r.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET),
                end: r.kernel_end,
                setup_header: Some(hdr),
            })
        }
    }
}

/// Tells ELF from bzImage by their magics ("\x7fELF"; "HdrS" at 0x202).
pub fn detect<F: Read + Seek>(f: &mut F) -> Result<KernelFormat, Error> {
    let mut head = [0u8; 0x206];
    f.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    let n = read_up_to(f, &mut head).map_err(Error::Read)?;
    f.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    if n >= 4 && head[..4] == *b"\x7fELF" {
        Ok(KernelFormat::Elf)
    } else if n >= 0x206 && head[0x202..0x206] == *b"HdrS" {
        Ok(KernelFormat::BzImage)
    } else {
        Err(Error::UnknownFormat)
    }
}

fn read_up_to<F: Read>(f: &mut F, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn detects_formats() {
        let mut elf = Cursor::new(b"\x7fELF\x02\x01\x01".to_vec());
        assert_eq!(detect(&mut elf).unwrap(), KernelFormat::Elf);
        let mut bz = vec![0u8; 0x300];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(detect(&mut Cursor::new(bz)).unwrap(), KernelFormat::BzImage);
        assert!(matches!(
            detect(&mut Cursor::new(vec![0u8; 16])),
            Err(Error::UnknownFormat)
        ));
        assert!(matches!(
            detect(&mut Cursor::new(vec![0u8; 0x300])),
            Err(Error::UnknownFormat)
        ));
    }

    #[test]
    fn missing_file_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        assert!(matches!(
            load(&mem, Path::new("/nonexistent/vmlinux")),
            Err(Error::Open { .. })
        ));
    }
}
