//! Linux guests: kernel loading, boot parameters, e820, ACPI, and the
//! 64-bit entry state.
//!
//! [`load_linux`] fills guest memory (kernel, initrd, command line, zero
//! page, ACPI tables, GDT, page tables); [`setup_cpl0_long_mode`] puts a
//! vCPU into the boot protocol's 64-bit entry state. The layout is in
//! [`layout`] and docs/linux-guests.md.

pub mod acpi;
pub mod agent;
pub mod bootparams;
pub mod cpu;
pub mod e820;
pub mod initrd;
pub mod kernel;
pub mod layout;
pub mod pm;
pub mod vm;

use std::path::PathBuf;

use kvm_ioctls::VcpuFd;
use linux_loader::cmdline::Cmdline;
use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

pub use crate::virtio_mmio::VirtioMmioDevice;
pub use kernel::KernelFormat;
use layout::{
    CMDLINE_ADDR, CMDLINE_MAX, DEFAULT_INITRD_ADDR_MAX, MAX_GSI, VIRTIO_IRQ_BASE, ZERO_PAGE_ADDR,
};

/// How the guest learns about the virtio-mmio devices. Using both would
/// make Linux probe each device twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceDiscovery {
    /// DSDT devices with `_HID` "LNRO0005" (needs CONFIG_ACPI).
    #[default]
    Acpi,
    /// `virtio_mmio.device=<size>@<addr>:<irq>` command-line entries.
    Cmdline,
}

/// Everything needed to boot a Linux kernel.
#[derive(Clone, Debug)]
pub struct LinuxBootConfig {
    /// ELF vmlinux or bzImage.
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// The user's command line; device entries are appended as needed.
    pub cmdline: String,
    /// Guest RAM ranges (must match the memory regions; must cover
    /// [0, 1 MiB) and stay out of [3 GiB, 4 GiB)).
    pub ram: Vec<(GuestAddress, u64)>,
    pub vcpus: u8,
    pub virtio_devices: Vec<VirtioMmioDevice>,
    pub discovery: DeviceDiscovery,
}

/// What was loaded where; input to [`setup_cpl0_long_mode`].
#[derive(Clone, Debug)]
pub struct LinuxBootInfo {
    pub kernel_format: KernelFormat,
    /// 64-bit entry point.
    pub entry: GuestAddress,
    pub kernel_end: u64,
    pub boot_params: GuestAddress,
    pub cmdline: String,
    pub initrd: Option<(GuestAddress, u64)>,
    pub rsdp: GuestAddress,
    pub e820: Vec<e820::E820Entry>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    E820(#[from] e820::Error),
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error(transparent)]
    Initrd(#[from] initrd::Error),
    #[error(transparent)]
    Acpi(#[from] acpi::Error),
    #[error(transparent)]
    BootParams(#[from] bootparams::Error),
    #[error(transparent)]
    Cpu(#[from] cpu::Error),
    #[error("kernel command line: {0}")]
    Cmdline(#[from] linux_loader::cmdline::Error),
    #[error("writing the command line: {0}")]
    LoadCmdline(linux_loader::loader::Error),
    #[error("writing the zero page: {0}")]
    ZeroPage(vm_memory::GuestMemoryError),
    #[error("vCPU count must be 1 to 255")]
    VcpuCount,
    #[error("virtio-mmio device {0:?}: window must lie in the MMIO hole and its GSI in {VIRTIO_IRQ_BASE}..={MAX_GSI}")]
    BadDevice(VirtioMmioDevice),
}

/// The command line the kernel gets: the user's, plus virtio-mmio entries
/// when devices are discovered through it.
pub fn build_cmdline(cfg: &LinuxBootConfig, max_len: usize) -> Result<Cmdline, Error> {
    let mut cmdline = Cmdline::new(max_len)?;
    if !cfg.cmdline.trim().is_empty() {
        cmdline.insert_str(cfg.cmdline.trim())?;
    }
    if cfg.discovery == DeviceDiscovery::Cmdline {
        for d in &cfg.virtio_devices {
            cmdline.add_virtio_mmio_device(d.size, GuestAddress(d.addr), d.irq, None)?;
        }
    }
    Ok(cmdline)
}

fn check_devices(devs: &[VirtioMmioDevice]) -> Result<(), Error> {
    for d in devs {
        let in_hole = d.addr >= layout::MMIO_HOLE_START
            && d.addr
                .checked_add(d.size)
                .is_some_and(|e| e <= layout::IOAPIC_ADDR)
            && d.size > 0;
        if !in_hole || d.irq < VIRTIO_IRQ_BASE || d.irq > MAX_GSI {
            return Err(Error::BadDevice(*d));
        }
    }
    Ok(())
}

/// Loads kernel, initrd, command line, ACPI tables, zero page and the
/// boot-time GDT and page tables into `mem`.
pub fn load_linux(mem: &GuestMemoryMmap, cfg: &LinuxBootConfig) -> Result<LinuxBootInfo, Error> {
    if cfg.vcpus == 0 || cfg.vcpus == 255 {
        return Err(Error::VcpuCount);
    }
    check_devices(&cfg.virtio_devices)?;
    let map = e820::build(&cfg.ram)?;
    let kernel = kernel::load(mem, &cfg.kernel)?;

    let hdr = kernel.setup_header;
    let initrd_addr_max = hdr.map_or(DEFAULT_INITRD_ADDR_MAX, |h| u64::from(h.initrd_addr_max));
    // Keep the initrd clear of the kernel and, for a bzImage, of the
    // area its decompressor works in (init_size from the load address).
    // Both come from the image: a pref_address near 2^64 leaves no room
    // for an initrd rather than overflowing.
    let kernel_reserve_end = match hdr {
        Some(h) => kernel.end.max(
            { h.pref_address }
                .max(layout::HIMEM_START)
                .saturating_add(u64::from(h.init_size)),
        ),
        None => kernel.end,
    };
    let initrd = match &cfg.initrd {
        Some(path) => Some(initrd::load(
            mem,
            &map,
            path,
            initrd_addr_max,
            kernel_reserve_end,
        )?),
        None => None,
    };

    // cmdline_size in the header excludes the NUL (boot protocol 2.06+).
    let max_len = hdr.map_or(CMDLINE_MAX, |h| {
        (h.cmdline_size as usize + 1).clamp(256, CMDLINE_MAX)
    });
    let cmdline = build_cmdline(cfg, max_len)?;
    linux_loader::loader::load_cmdline(mem, GuestAddress(CMDLINE_ADDR), &cmdline)
        .map_err(Error::LoadCmdline)?;
    let cmdline_str = cmdline
        .as_cstring()
        .map_err(Error::Cmdline)?
        .into_string()
        .unwrap_or_default();

    let acpi_devs: &[VirtioMmioDevice] = match cfg.discovery {
        DeviceDiscovery::Acpi => &cfg.virtio_devices,
        DeviceDiscovery::Cmdline => &[],
    };
    let tables = acpi::write_tables(mem, usize::from(cfg.vcpus), acpi_devs)?;

    let params = bootparams::build(&bootparams::BootParamsInput {
        setup_header: hdr,
        e820: &map,
        cmdline_addr: CMDLINE_ADDR,
        cmdline_len: cmdline_str.len() as u32,
        initrd: initrd.map(|(a, s)| (a.0, s)),
        rsdp_addr: tables.rsdp.0,
    })?;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_ADDR))
        .map_err(Error::ZeroPage)?;
    cpu::write_boot_structures(mem)?;

    Ok(LinuxBootInfo {
        kernel_format: kernel.format,
        entry: kernel.entry,
        kernel_end: kernel.end,
        boot_params: GuestAddress(ZERO_PAGE_ADDR),
        cmdline: cmdline_str,
        initrd,
        rsdp: tables.rsdp,
        e820: map,
    })
}

/// Puts vCPU `cpu_index` into its boot state: the 64-bit CPL0 entry state
/// for the boot CPU (index 0), wait-for-SIPI for the others. Call after
/// the VMM's generic CPUID/MSR/FPU/LAPIC set-up. `mem` must be the memory
/// [`load_linux`] filled (the GDT and page tables it refers to are there).
pub fn setup_cpl0_long_mode(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    info: &LinuxBootInfo,
    cpu_index: u8,
) -> Result<(), Error> {
    // The entry state is only meaningful with the boot structures in place.
    let gdt_code: u64 = mem
        .read_obj(GuestAddress(layout::GDT_ADDR + 0x10))
        .map_err(cpu::Error::Memory)?;
    if gdt_code != cpu::GDT[2] {
        cpu::write_boot_structures(mem)?;
    }
    cpu::setup_cpl0_long_mode(vcpu, info.entry, cpu_index)?;
    Ok(())
}

#[cfg(test)]
mod tests;
