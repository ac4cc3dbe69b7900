//! Guest-physical layout of a Linux guest (see docs/linux-guests.md).

/// GDT for the 64-bit entry (5 entries: null, null, code 0x10, data 0x18, TSS 0x20).
pub const GDT_ADDR: u64 = 0x500;
/// IDT (limit 0: the kernel installs its own before enabling interrupts).
pub const IDT_ADDR: u64 = 0x540;
/// Boot params ("zero page"); RSI points here at entry.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer of the boot CPU (grows down below the page tables).
pub const BOOT_STACK_TOP: u64 = 0x8ff0;
/// Identity page tables: PML4, one PDPT, four page directories of 2 MiB
/// pages covering [0, 4 GiB).
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xa000;
pub const PD_ADDR: u64 = 0xb000;
/// Number of 1 GiB slots identity-mapped with 2 MiB pages.
pub const IDENTITY_MAP_GIB: u64 = 4;
/// Kernel command line and its maximum size (with the NUL).
pub const CMDLINE_ADDR: u64 = 0x2_0000;
pub const CMDLINE_MAX: usize = 0x1000;
/// End of conventional low memory; [EBDA_START, 1 MiB) is reserved.
pub const EBDA_START: u64 = 0x9_fc00;
/// ACPI tables (RSDP first, so legacy scans of 0xe0000-0xfffff find it).
pub const ACPI_START: u64 = 0xe_0000;
pub const ACPI_END: u64 = 0x10_0000;
/// Start of high memory; bzImage protected-mode code is loaded here.
pub const HIMEM_START: u64 = 0x10_0000;
/// The MMIO hole below 4 GiB: no RAM, devices only.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// virtio-mmio device windows and their GSIs: the disks' slots, the same
/// for both guest kinds ([`crate::disk`]).
pub use crate::virtio_mmio::{VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE};
/// Highest GSI of the IOAPIC (24 pins).
pub const MAX_GSI: u32 = 23;
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub const LAPIC_ADDR: u64 = 0xfee0_0000;
/// COM1.
pub const SERIAL_PORT: u16 = 0x3f8;
pub const SERIAL_IRQ: u32 = 4;
/// The ACPI sleep control/status and reset register ([`super::pm`]).
pub const ACPI_PM_PORT: u16 = 0x600;
/// 32-bit kernels' default `initrd_addr_max` when the header gives none.
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;
