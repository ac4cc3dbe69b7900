use super::*;
use crate::linux::layout::ACPI_START;

fn sum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v
}

/// Reads the SDT at `addr`, checking signature, length and checksum.
fn sdt(mem: &GuestMemoryMmap, addr: u64, sig: &[u8; 4]) -> Vec<u8> {
    let head = read(mem, addr, 36);
    assert_eq!(&head[0..4], sig);
    let len = u32_at(&head, 4) as usize;
    let t = read(mem, addr, len);
    assert_eq!(sum(&t), 0, "{} checksum", String::from_utf8_lossy(sig));
    t
}

fn devs(n: u32) -> Vec<VirtioMmioDevice> {
    (0..n).map(VirtioMmioDevice::slot).collect()
}

/// Follows RSDP -> XSDT -> FADT/MADT -> DSDT the way a guest does.
#[test]
fn table_chain_checksums_and_contents() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let layout = write_tables(&mem, 4, &devs(2)).unwrap();
    assert_eq!(layout.rsdp.0, ACPI_START);

    let rsdp = read(&mem, ACPI_START, 36);
    assert_eq!(&rsdp[0..8], b"RSD PTR ");
    assert_eq!(sum(&rsdp[0..20]), 0, "ACPI 1.0 checksum");
    assert_eq!(sum(&rsdp), 0, "extended checksum");
    assert_eq!(rsdp[15], 2, "revision");
    assert_eq!(u32_at(&rsdp, 20), 36);
    let xsdt_addr = u64_at(&rsdp, 24);

    let xsdt = sdt(&mem, xsdt_addr, b"XSDT");
    assert_eq!(xsdt.len(), 36 + 16);
    let entries: Vec<u64> = (0..2).map(|i| u64_at(&xsdt, 36 + 8 * i)).collect();

    let fadt = sdt(&mem, entries[0], b"FACP");
    assert_eq!(fadt.len(), 276, "ACPI 6.x FADT");
    assert_ne!(u32_at(&fadt, 112) & (1 << 20), 0, "HW_REDUCED_ACPI");
    assert_ne!(u32_at(&fadt, 112) & (1 << 10), 0, "RESET_REG_SUP");
    // RESET_REG: system I/O, 8 bits, at the PM port; RESET_VALUE.
    assert_eq!(fadt[116], 1);
    assert_eq!(fadt[117], 8);
    assert_eq!(u64_at(&fadt, 120), u64::from(ACPI_PM_PORT));
    assert_eq!(fadt[128], PM_RESET_VALUE);
    // SLEEP_CONTROL_REG / SLEEP_STATUS_REG at the PM port.
    assert_eq!(u64_at(&fadt, 244 + 4), u64::from(ACPI_PM_PORT));
    assert_eq!(u64_at(&fadt, 256 + 4), u64::from(ACPI_PM_PORT));
    let dsdt_addr = u64_at(&fadt, 140);
    assert_eq!(dsdt_addr, layout.dsdt.0);

    let madt = sdt(&mem, entries[1], b"APIC");
    assert_eq!(u32_at(&madt, 36), LAPIC_ADDR as u32);
    assert_eq!(u32_at(&madt, 40), 1, "PCAT_COMPAT");
    let mut off = 44;
    let mut apic_ids = vec![];
    let mut ioapics = vec![];
    while off < madt.len() {
        let (t, l) = (madt[off], madt[off + 1] as usize);
        match t {
            0 => {
                assert_eq!(l, 8);
                assert_eq!(u32_at(&madt, off + 4), 1, "enabled");
                apic_ids.push((madt[off + 2], madt[off + 3]));
            }
            1 => {
                assert_eq!(l, 12);
                ioapics.push((u32_at(&madt, off + 4), u32_at(&madt, off + 8)));
            }
            _ => panic!("unexpected MADT entry {t}"),
        }
        off += l;
    }
    assert_eq!(off, madt.len());
    assert_eq!(apic_ids, vec![(0, 0), (1, 1), (2, 2), (3, 3)]);
    assert_eq!(ioapics, vec![(IOAPIC_ADDR as u32, 0)]);

    let dsdt = sdt(&mem, dsdt_addr, b"DSDT");
    let has = |needle: &[u8]| dsdt.windows(needle.len()).any(|w| w == needle);
    assert!(has(b"_SB_"));
    assert!(has(b"COM1"));
    assert!(has(b"VR00") && has(b"VR01") && !has(b"VR02"));
    assert!(has(b"LNRO0005\0"));
    assert!(has(b"_S5_"));
    // PNP0501 as an EISA ID dword.
    assert!(has(&[0x0c, 0x41, 0xd0, 0x05, 0x01]));
    // Memory32Fixed(ReadWrite, 0xd0001000, 0x1000).
    assert!(has(&[
        0x86, 0x09, 0x00, 0x01, 0x00, 0x10, 0x00, 0xd0, 0x00, 0x10, 0x00, 0x00
    ]));
    // Extended interrupt descriptor: consumer, edge, active high, exclusive, GSI 6.
    assert!(has(&[0x89, 0x06, 0x00, 0x03, 0x01, 0x06, 0x00, 0x00, 0x00]));
    // IO(Decode16, 0x3f8, 0x3f8, 1, 8).
    assert!(has(&[0x47, 0x01, 0xf8, 0x03, 0xf8, 0x03, 0x01, 0x08]));
    assert!(layout.end.0 <= ACPI_END);
}

#[test]
fn madt_scales_with_vcpus_and_rejects_bad_counts() {
    for n in [1usize, 2, 64, 255] {
        let m = madt(n).unwrap();
        assert_eq!(m.len(), 44 + 8 * n + 12);
        assert_eq!(sum(&m), 0);
    }
    assert!(matches!(madt(0), Err(Error::VcpuCount(0))));
    assert!(matches!(madt(256), Err(Error::VcpuCount(256))));
}

#[test]
fn dsdt_without_virtio_devices_and_size_limit() {
    let d = dsdt(&[]).unwrap();
    assert_eq!(sum(&d), 0);
    assert!(!d.windows(8).any(|w| w == b"LNRO0005"));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    // 255 vCPUs and 19 devices still fit below 1 MiB.
    write_tables(&mem, 255, &devs(19)).unwrap();
    let far = VirtioMmioDevice {
        addr: 1 << 33,
        size: 0x1000,
        irq: 5,
    };
    assert!(matches!(dsdt(&[far]), Err(Error::DeviceAddress(_))));
}
