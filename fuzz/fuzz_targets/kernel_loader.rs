//! The kernel loader: an ELF vmlinux or bzImage (and an initrd) from the
//! input, loaded by `load_linux` into guest memory with the command line,
//! zero page and ACPI tables; or the input as the workload guest's ELF
//! (`boot::load_image`, `boot::image_end`).
//!
//! Input: flags, vCPUs, a u16-length command line, a u16-length initrd,
//! then the kernel image. The files are memfds opened by path.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pagefold_fuzz::{Input, ScratchFile};
use pagefold_vmm::workload::boot;
use pagefold_vmm::linux::{self, DeviceDiscovery, LinuxBootConfig, VirtioMmioDevice};
use vm_memory::GuestAddress;
use pagefold_devices::GuestMemoryMmap;

/// Guest RAM: 64 MiB (mapped lazily: only what a load touches costs).
const RAM: u64 = 64 << 20;

struct Files {
    kernel: ScratchFile,
    initrd: ScratchFile,
}

fn files() -> &'static Files {
    static F: OnceLock<Files> = OnceLock::new();
    F.get_or_init(|| Files {
        kernel: ScratchFile::new(c"pagefold-fuzz-kernel"),
        initrd: ScratchFile::new(c"pagefold-fuzz-initrd"),
    })
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.u8();
    let vcpus = input.u8();
    let cmdline = String::from_utf8_lossy(input.chunk(4096)).into_owned();
    let initrd = input.chunk(64 << 10);
    let kernel = input.rest();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();

    if flags & 1 != 0 {
        let _ = boot::image_end(kernel);
        let _ = boot::load_image(&mem, kernel);
        return;
    }
    let f = files();
    f.kernel.fill(kernel);
    let initrd = (flags & 2 != 0).then(|| {
        f.initrd.fill(initrd);
        f.initrd.path()
    });
    let cfg = LinuxBootConfig {
        kernel: f.kernel.path(),
        initrd,
        cmdline,
        ram: vec![(GuestAddress(0), RAM)],
        vcpus,
        virtio_devices: (0..u32::from(flags >> 4) % 4)
            .map(VirtioMmioDevice::slot)
            .collect(),
        discovery: if flags & 4 != 0 {
            DeviceDiscovery::Cmdline
        } else {
            DeviceDiscovery::Acpi
        },
    };
    if let Ok(info) = linux::load_linux(&mem, &cfg) {
        if let Some((addr, size)) = info.initrd {
            assert!(addr.0 >= info.kernel_end.min(RAM) || size == 0 || addr.0 + size <= RAM);
        }
    }
});
