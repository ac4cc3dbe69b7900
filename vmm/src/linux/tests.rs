//! End-to-end tests of `load_linux`: a synthetic bzImage always, the real
//! Debian kernel from scripts/guest-image.sh when present, and the entry
//! state on a real vCPU when /dev/kvm exists.

use std::path::{Path, PathBuf};

use kvm_ioctls::{Kvm, VcpuExit};
use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::tempfile::TempFile;

use super::e820::E820Type;
use super::layout::*;
use super::*;

const MIB: u64 = 1 << 20;

/// Code at the 64-bit entry: `mov dx, 0x3f8; mov al, [rsi + 0x210]; out
/// dx, al; mov al, [0x20000]; out dx, al; hlt`. It reads type_of_loader
/// through RSI and the first command-line byte through the page tables.
/// (The test VM has no in-kernel irqchip, so `hlt` exits to userspace.)
const ENTRY_CODE: &[u8] = &[
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0x8a, 0x86, 0x10, 0x02, 0x00, 0x00, // mov al, [rsi+0x210]
    0xee, // out dx, al
    0x8a, 0x04, 0x25, 0x00, 0x00, 0x02, 0x00, // mov al, [0x20000]
    0xee, // out dx, al
    0xf4, // hlt
];

/// A minimal bzImage: one setup sector, boot protocol 2.15 with a 64-bit
/// entry, and [`ENTRY_CODE`] at offset 0x200 of the protected-mode part.
fn synthetic_bzimage() -> TempFile {
    let mut img = vec![0u8; 1024 + 0x1000];
    img[0x1f1] = 1; // setup_sects
    img[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    img[0x211] = 1; // loadflags: LOADED_HIGH
    img[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
    img[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    img[0x230..0x234].copy_from_slice(&0x20_0000u32.to_le_bytes()); // kernel_alignment
    img[0x236..0x238].copy_from_slice(&1u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    img[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes()); // cmdline_size
    img[0x260..0x264].copy_from_slice(&(4 * MIB as u32).to_le_bytes()); // init_size
    img[1024 + 0x200..1024 + 0x200 + ENTRY_CODE.len()].copy_from_slice(ENTRY_CODE);
    let f = TempFile::new().unwrap();
    std::fs::write(f.as_path(), &img).unwrap();
    f
}

fn config(kernel: &Path, initrd: Option<PathBuf>, mem_size: u64) -> LinuxBootConfig {
    LinuxBootConfig {
        kernel: kernel.to_path_buf(),
        initrd,
        cmdline: "console=ttyS0 earlyprintk=serial,ttyS0".into(),
        ram: vec![(GuestAddress(0), mem_size)],
        vcpus: 2,
        virtio_devices: vec![VirtioMmioDevice::slot(0), VirtioMmioDevice::slot(1)],
        discovery: DeviceDiscovery::Acpi,
    }
}

fn mem(size: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
}

/// Found by the kernel_loader fuzz target: a bzImage whose header puts
/// `pref_address + init_size` past 2^64 overflowed while reserving the
/// decompressor's area; it must only leave no room for the initrd.
#[test]
fn bzimage_with_pref_address_near_the_top_is_refused_not_a_panic() {
    let k = synthetic_bzimage();
    let mut img = std::fs::read(k.as_path()).unwrap();
    img[0x258..0x260].copy_from_slice(&(u64::MAX - 0x1000).to_le_bytes()); // pref_address
    std::fs::write(k.as_path(), &img).unwrap();
    let initrd = TempFile::new().unwrap();
    std::fs::write(initrd.as_path(), b"initrd").unwrap();
    let m = mem(64 * MIB);
    let e = load_linux(
        &m,
        &config(k.as_path(), Some(initrd.as_path().to_path_buf()), 64 * MIB),
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Initrd(initrd::Error::NoRoom { .. })),
        "{e}"
    );
    // Without an initrd there is nothing to place: it loads.
    load_linux(&m, &config(k.as_path(), None, 64 * MIB)).unwrap();
}

#[test]
fn synthetic_bzimage_loads() {
    let k = synthetic_bzimage();
    let initrd = TempFile::new().unwrap();
    std::fs::write(initrd.as_path(), vec![0x5a; 10_000]).unwrap();
    let m = mem(64 * MIB);
    let info = load_linux(
        &m,
        &config(k.as_path(), Some(initrd.as_path().to_path_buf()), 64 * MIB),
    )
    .unwrap();
    assert_eq!(info.kernel_format, KernelFormat::BzImage);
    assert_eq!(info.entry, GuestAddress(0x10_0200));
    let (ia, is) = info.initrd.unwrap();
    assert_eq!(is, 10_000);
    assert_eq!(ia.0 % 4096, 0);
    assert!(
        ia.0 + is <= 64 * MIB && ia.0 >= MIB + 4 * MIB,
        "above kernel + init_size"
    );
    let p: linux_loader::bootparam::boot_params = m.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    assert_eq!(
        { p.hdr.version },
        0x020f,
        "setup header taken from the image"
    );
    assert_eq!({ p.hdr.type_of_loader }, 0xff);
    assert_eq!({ p.hdr.ramdisk_image }, ia.0 as u32);
    assert_eq!({ p.acpi_rsdp_addr }, ACPI_START);
    assert_eq!({ p.hdr.cmdline_size } as usize, info.cmdline.len());
    let mut cl = vec![0u8; info.cmdline.len() + 1];
    m.read_slice(&mut cl, GuestAddress(CMDLINE_ADDR)).unwrap();
    assert_eq!(&cl[..info.cmdline.len()], info.cmdline.as_bytes());
    assert_eq!(cl[info.cmdline.len()], 0);
    assert!(
        !info.cmdline.contains("virtio_mmio"),
        "ACPI discovery adds no cmdline entries"
    );
    assert_eq!(p.e820_entries as usize, info.e820.len());
    assert!(info
        .e820
        .iter()
        .any(|e| e.kind == E820Type::Reserved && e.addr == MMIO_HOLE_START));
}

#[test]
fn cmdline_discovery_adds_device_entries() {
    let k = synthetic_bzimage();
    let m = mem(64 * MIB);
    let mut cfg = config(k.as_path(), None, 64 * MIB);
    cfg.discovery = DeviceDiscovery::Cmdline;
    let info = load_linux(&m, &cfg).unwrap();
    assert!(
        info.cmdline
            .ends_with("virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"),
        "{}",
        info.cmdline
    );
    assert!(info.initrd.is_none());
}

#[test]
fn bad_configs_are_refused() {
    let k = synthetic_bzimage();
    let m = mem(64 * MIB);
    let mut cfg = config(k.as_path(), None, 64 * MIB);
    cfg.virtio_devices = vec![VirtioMmioDevice {
        addr: 0x1000,
        size: 0x1000,
        irq: 5,
    }];
    assert!(matches!(load_linux(&m, &cfg), Err(Error::BadDevice(_))));
    cfg.virtio_devices = vec![VirtioMmioDevice {
        irq: 24,
        ..VirtioMmioDevice::slot(0)
    }];
    assert!(matches!(load_linux(&m, &cfg), Err(Error::BadDevice(_))));
    let mut cfg = config(k.as_path(), None, 64 * MIB);
    cfg.vcpus = 0;
    assert!(matches!(load_linux(&m, &cfg), Err(Error::VcpuCount)));
    let mut cfg = config(k.as_path(), None, 64 * MIB);
    cfg.cmdline = "x".repeat(3000);
    assert!(matches!(load_linux(&m, &cfg), Err(Error::Cmdline(_))));
    let mut cfg = config(Path::new("/nonexistent"), None, 64 * MIB);
    cfg.ram = vec![(GuestAddress(0), 64 * MIB)];
    assert!(matches!(load_linux(&m, &cfg), Err(Error::Kernel(_))));
}

/// Runs the synthetic kernel's entry code on a real vCPU: proves the GDT,
/// paging, EFER/CR state, RIP and RSI that `setup_cpl0_long_mode` sets.
#[test]
fn entry_state_runs_on_kvm() {
    let Ok(kvm) = Kvm::new() else {
        eprintln!("skipped: /dev/kvm not available");
        return;
    };
    let k = synthetic_bzimage();
    let size = 64 * MIB;
    let m = mem(size);
    let mut cfg = config(k.as_path(), None, size);
    cfg.cmdline = "Zcmdline".into();
    let info = load_linux(&m, &cfg).unwrap();
    let vm = kvm.create_vm().unwrap();
    let region = m.find_region(GuestAddress(0)).unwrap();
    let host = m.get_host_address(GuestAddress(0)).unwrap();
    let slot = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: region.len(),
        userspace_addr: host as u64,
        flags: 0,
    };
    // SAFETY: the region is a live mapping of `region.len()` bytes owned by
    // `m`, which outlives the VM in this test.
    unsafe { vm.set_user_memory_region(slot).unwrap() };
    let mut vcpu = vm.create_vcpu(0).unwrap();
    setup_cpl0_long_mode(&vcpu, &m, &info, 0).unwrap();
    let mut out = Vec::new();
    for _ in 0..10 {
        match vcpu.run().unwrap() {
            VcpuExit::IoOut(0x3f8, data) => out.push(data[0]),
            VcpuExit::Hlt => break,
            other => panic!("unexpected exit {other:?}"),
        }
    }
    assert_eq!(
        out,
        vec![0xff, b'Z'],
        "type_of_loader via RSI, cmdline via the identity map"
    );

    // An application processor is parked for INIT/SIPI (needs the
    // in-kernel LAPIC, so in a VM of its own).
    let vm2 = kvm.create_vm().unwrap();
    vm2.create_irq_chip().unwrap();
    let _bsp = vm2.create_vcpu(0).unwrap();
    let ap = vm2.create_vcpu(1).unwrap();
    setup_cpl0_long_mode(&ap, &m, &info, 1).unwrap();
    assert_eq!(
        ap.get_mp_state().unwrap().mp_state,
        kvm_bindings::KVM_MP_STATE_UNINITIALIZED
    );
}

/// The directory scripts/guest-image.sh wrote, from PAGEFOLD_GUEST_DIR.
fn guest_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("PAGEFOLD_GUEST_DIR")?);
    dir.join("vmlinux").exists().then_some(dir)
}

#[test]
fn debian_kernel_images_load() {
    let Some(dir) = guest_dir() else {
        eprintln!("skipped: set PAGEFOLD_GUEST_DIR to the output of scripts/guest-image.sh");
        return;
    };
    let size = 512 * MIB;
    for (name, format) in [
        ("vmlinux", KernelFormat::Elf),
        ("bzImage", KernelFormat::BzImage),
    ] {
        let m = mem(size);
        let cfg = config(&dir.join(name), Some(dir.join("initrd.img")), size);
        let info = load_linux(&m, &cfg).unwrap();
        assert_eq!(info.kernel_format, format);
        let (ia, is) = info.initrd.unwrap();
        assert!(ia.0 >= info.kernel_end && ia.0 + is <= size);
        match format {
            // vmlinux: startup_64 at its physical load address (16 MiB).
            KernelFormat::Elf => assert_eq!(info.entry, GuestAddress(0x100_0000)),
            KernelFormat::BzImage => assert_eq!(info.entry, GuestAddress(0x10_0200)),
        }
        // The initrd is a gzip'd cpio.
        let mut magic = [0u8; 2];
        m.read_slice(&mut magic, ia).unwrap();
        assert_eq!(magic, [0x1f, 0x8b]);
    }
}

/// Boots the Debian vmlinux on the vCPU until it stops and checks that its
/// early console shows our e820 map, command line and ACPI tables. On PVM
/// the kernel ends in KVM_EXIT_INTERNAL_ERROR after those lines (see
/// docs/linux-guests.md); with VMX/SVM it gets further. Bounded by exits.
#[test]
fn debian_vmlinux_reads_our_boot_data() {
    let (Some(dir), Ok(kvm)) = (guest_dir(), Kvm::new()) else {
        eprintln!("skipped: needs /dev/kvm and PAGEFOLD_GUEST_DIR");
        return;
    };
    let size = 512 * MIB;
    let m = mem(size);
    let mut cfg = config(&dir.join("vmlinux"), Some(dir.join("initrd.img")), size);
    cfg.vcpus = 1;
    cfg.cmdline = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 noapictimer".into();
    let info = load_linux(&m, &cfg).unwrap();
    let vm = kvm.create_vm().unwrap();
    vm.set_tss_address(0xfffb_d000).unwrap();
    vm.create_irq_chip().unwrap();
    let host = m.get_host_address(GuestAddress(0)).unwrap();
    let slot = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: host as u64,
        flags: 0,
    };
    // SAFETY: `m` maps `size` bytes at `host` and outlives the VM.
    unsafe { vm.set_user_memory_region(slot).unwrap() };
    let mut vcpu = vm.create_vcpu(0).unwrap();
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .unwrap();
    vcpu.set_cpuid2(&cpuid).unwrap();
    setup_cpl0_long_mode(&vcpu, &m, &info, 0).unwrap();
    let mut console = Vec::new();
    let started = std::time::Instant::now();
    for _ in 0..5_000_000 {
        if started.elapsed().as_secs() > 90 {
            break;
        }
        match vcpu.run() {
            Ok(VcpuExit::IoOut(0x3f8, data)) => {
                console.extend_from_slice(data);
                // The MADT has been parsed once the IOAPIC line is out.
                if data == b"\n" && console.windows(9).any(|w| w == b"IOAPIC[0]") {
                    break;
                }
            }
            // 8250 LSR: transmitter empty, so the kernel keeps writing.
            Ok(VcpuExit::IoIn(0x3fd, data)) => data.fill(0x60),
            Ok(VcpuExit::IoIn(_, data)) => data.fill(0xff),
            Ok(VcpuExit::IoOut(..)) | Ok(VcpuExit::MmioRead(..)) | Ok(VcpuExit::MmioWrite(..)) => {}
            Ok(VcpuExit::Hlt) | Ok(VcpuExit::Shutdown) | Ok(VcpuExit::InternalError) => break,
            Ok(_) => {}
            Err(e) => {
                eprintln!("KVM_RUN: {e}");
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&console);
    eprintln!("--- guest console ---\n{text}\n---");
    assert!(text.contains("Linux version"), "kernel started");
    assert!(
        text.contains("Command line: console=ttyS0"),
        "command line read"
    );
    assert!(
        text.contains("BIOS-e820: [mem 0x00000000c0000000-0x00000000ffffffff] reserved"),
        "e820 read"
    );
    assert!(text.contains("ACPI: RSDP 0x00000000000E0000"), "RSDP found");
    assert!(text.contains("ACPI: APIC"), "MADT found");
    assert!(text.contains("ACPI: DSDT"), "DSDT found");
}
