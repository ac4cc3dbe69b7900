//! ACPI tables for Linux guests: RSDP, XSDT, FADT (hardware-reduced), MADT
//! and a DSDT describing COM1 and the virtio-mmio devices.
//!
//! Built with the `acpi_tables` crate and written to guest RAM at
//! [`ACPI_START`], RSDP first so a legacy scan of 0xe0000-0xfffff finds it
//! even without `acpi_rsdp_addr` in the zero page.

use acpi_tables::aml;
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use pagefold_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::layout::{
    ACPI_END, ACPI_PM_PORT, ACPI_START, IOAPIC_ADDR, LAPIC_ADDR, SERIAL_IRQ, SERIAL_PORT,
};
use super::pm::{PM_RESET_VALUE, SLP_TYP_S5};
use super::VirtioMmioDevice;

pub const OEM_ID: [u8; 6] = *b"PGFOLD";
const OEM_REVISION: u32 = 1;
/// FADT IAPC_BOOT_ARCH: no VGA, no CMOS RTC (nothing emulates them).
const IAPC_BOOT_ARCH_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
/// MADT flag: the platform also has dual 8259 PICs (KVM's irqchip does).
const MADT_PCAT_COMPAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ACPI tables need {0} bytes, more than the {1} reserved for them")]
    TooLarge(u64, u64),
    #[error("cannot write ACPI tables to guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("{0} vCPUs: the MADT takes 1 to 255")]
    VcpuCount(usize),
    #[error("virtio-mmio device at {0:#x} is not below 4 GiB")]
    DeviceAddress(u64),
}

/// Where the tables went.
#[derive(Clone, Copy, Debug)]
pub struct AcpiLayout {
    pub rsdp: GuestAddress,
    pub xsdt: GuestAddress,
    pub fadt: GuestAddress,
    pub madt: GuestAddress,
    pub dsdt: GuestAddress,
    pub end: GuestAddress,
}

fn to_bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

/// The DSDT: `\_SB.COM1` (PNP0501) and `\_SB.VRnn` (LNRO0005) for each
/// virtio-mmio device, plus `\_S5_` so a hardware-reduced guest can power
/// off through the FADT sleep registers.
pub fn dsdt(virtio: &[VirtioMmioDevice]) -> Result<Vec<u8>, Error> {
    let com1_io = aml::IO::new(SERIAL_PORT, SERIAL_PORT, 1, 8);
    let com1_irq = aml::Interrupt::new(true, true, false, false, SERIAL_IRQ);
    let com1_crs = aml::ResourceTemplate::new(vec![&com1_io, &com1_irq]);
    let com1_hid = aml::EISAName::new("PNP0501");
    let com1_uid = 0u8;
    let com1_names = [
        aml::Name::new("_HID".into(), &com1_hid),
        aml::Name::new("_UID".into(), &com1_uid),
        aml::Name::new("_CRS".into(), &com1_crs),
    ];
    let com1 = aml::Device::new(
        "COM1".into(),
        com1_names.iter().map(|n| n as &dyn Aml).collect(),
    );

    let mut devs = Vec::with_capacity(virtio.len());
    for (i, d) in virtio.iter().enumerate() {
        let base = u32::try_from(d.addr).map_err(|_| Error::DeviceAddress(d.addr))?;
        let size = u32::try_from(d.size).map_err(|_| Error::DeviceAddress(d.addr))?;
        devs.push((format!("VR{:02X}", i & 0xff), i as u32, base, size, d.irq));
    }
    let hid: aml::AmlStr = "LNRO0005";
    let crs: Vec<_> = devs
        .iter()
        .map(|&(_, _, base, size, irq)| {
            (
                aml::Memory32Fixed::new(true, base, size),
                aml::Interrupt::new(true, true, false, false, irq),
            )
        })
        .collect();
    let templates: Vec<_> = crs
        .iter()
        .map(|(m, i)| aml::ResourceTemplate::new(vec![m, i]))
        .collect();
    let names: Vec<_> = devs
        .iter()
        .zip(&templates)
        .map(|((_, uid, ..), t)| {
            (
                aml::Name::new("_HID".into(), &hid),
                aml::Name::new("_UID".into(), uid),
                aml::Name::new("_CRS".into(), t),
            )
        })
        .collect();
    let devices: Vec<_> = devs
        .iter()
        .zip(&names)
        .map(|((path, ..), (h, u, c))| aml::Device::new(path.as_str().into(), vec![h, u, c]))
        .collect();

    let mut sb_children: Vec<&dyn Aml> = vec![&com1];
    sb_children.extend(devices.iter().map(|d| d as &dyn Aml));
    let sb = aml::Scope::new("_SB_".into(), sb_children);
    let s5_typ = SLP_TYP_S5;
    let s5 = aml::Name::new("_S5_".into(), &aml::Package::new(vec![&s5_typ, &s5_typ]));

    let mut table = Sdt::new(*b"DSDT", 36, 6, OEM_ID, *b"PGFDDSDT", OEM_REVISION);
    table.append_slice(&to_bytes(&sb));
    table.append_slice(&to_bytes(&s5));
    Ok(table.as_slice().to_vec())
}

/// The MADT: one enabled local APIC per vCPU (APIC ID = processor UID =
/// vCPU index) and the IOAPIC at GSI base 0.
pub fn madt(vcpus: usize) -> Result<Vec<u8>, Error> {
    if vcpus == 0 || vcpus > 255 {
        return Err(Error::VcpuCount(vcpus));
    }
    let mut madt = MADT::new(
        OEM_ID,
        *b"PGFDMADT",
        OEM_REVISION,
        LocalInterruptController::Address(LAPIC_ADDR as u32),
    );
    for i in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(
            i as u8,
            i as u8,
            EnabledStatus::Enabled,
        ));
    }
    madt.add_structure(IoApic::new(0, IOAPIC_ADDR as u32, 0));
    let mut bytes = to_bytes(&madt);
    set_madt_flags(&mut bytes, MADT_PCAT_COMPAT);
    Ok(bytes)
}

/// The crate has no setter for the MADT flags (offset 40); patch them and
/// fix the checksum.
fn set_madt_flags(bytes: &mut [u8], flags: u32) {
    bytes[40..44].copy_from_slice(&flags.to_le_bytes());
    fix_checksum(bytes, 9);
}

fn fix_checksum(bytes: &mut [u8], at: usize) {
    bytes[at] = 0;
    let sum = bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    bytes[at] = 0u8.wrapping_sub(sum);
}

/// The FADT: hardware-reduced ACPI, DSDT pointer, reset register and
/// sleep control/status registers on the I/O port of [`super::pm`].
pub fn fadt(dsdt_addr: u64) -> Vec<u8> {
    let pm_reg = GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(ACPI_PM_PORT),
    );
    let mut b = FADTBuilder::new(OEM_ID, *b"PGFDFACP", OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    b.reset_reg = pm_reg;
    b.reset_value = PM_RESET_VALUE;
    b.sleep_control_reg = pm_reg;
    b.sleep_status_reg = pm_reg;
    b.iapc_boot_arch =
        (IAPC_BOOT_ARCH_VGA_NOT_PRESENT | IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT).into();
    to_bytes(&b.finalize())
}

/// Builds all tables and writes them to guest memory at [`ACPI_START`].
/// `virtio` lists the devices to describe in the DSDT (empty when they
/// are passed on the command line instead).
pub fn write_tables(
    mem: &GuestMemoryMmap,
    vcpus: usize,
    virtio: &[VirtioMmioDevice],
) -> Result<AcpiLayout, Error> {
    let align = |a: u64| (a + 15) & !15;
    let rsdp_addr = ACPI_START;
    let xsdt_addr = align(rsdp_addr + Rsdp::len() as u64);
    // XSDT with two entries: header + 2 * 8.
    let fadt_addr = align(xsdt_addr + 36 + 16);
    let fadt_bytes_probe = fadt(0).len() as u64;
    let madt_addr = align(fadt_addr + fadt_bytes_probe);
    let madt_bytes = madt(vcpus)?;
    let dsdt_addr = align(madt_addr + madt_bytes.len() as u64);
    let dsdt_bytes = dsdt(virtio)?;
    let end = dsdt_addr + dsdt_bytes.len() as u64;
    if end > ACPI_END {
        return Err(Error::TooLarge(end - ACPI_START, ACPI_END - ACPI_START));
    }
    let fadt_bytes = fadt(dsdt_addr);
    let mut xsdt = XSDT::new(OEM_ID, *b"PGFDXSDT", OEM_REVISION);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let rsdp = Rsdp::new(OEM_ID, xsdt_addr);

    mem.write_slice(&to_bytes(&rsdp), GuestAddress(rsdp_addr))?;
    mem.write_slice(&to_bytes(&xsdt), GuestAddress(xsdt_addr))?;
    mem.write_slice(&fadt_bytes, GuestAddress(fadt_addr))?;
    mem.write_slice(&madt_bytes, GuestAddress(madt_addr))?;
    mem.write_slice(&dsdt_bytes, GuestAddress(dsdt_addr))?;
    Ok(AcpiLayout {
        rsdp: GuestAddress(rsdp_addr),
        xsdt: GuestAddress(xsdt_addr),
        fadt: GuestAddress(fadt_addr),
        madt: GuestAddress(madt_addr),
        dsdt: GuestAddress(dsdt_addr),
        end: GuestAddress(end),
    })
}

#[cfg(test)]
mod tests;
