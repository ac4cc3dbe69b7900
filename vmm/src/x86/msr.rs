//! Boot-time MSR values: syscall MSRs cleared, fast strings on, TSC at 0.

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use super::Error;

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

/// The MSRs every vCPU starts with.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect()
}

/// Installs [`boot_msrs`]; every one of them must be accepted.
pub fn configure(vcpu: &VcpuFd) -> Result<(), Error> {
    let entries = boot_msrs();
    let msrs = Msrs::from_entries(&entries).map_err(|e| Error::MsrList(format!("{e:?}")))?;
    let set = vcpu.set_msrs(&msrs).map_err(Error::SetMsrs)?;
    if set != entries.len() {
        return Err(Error::PartialMsrs {
            set,
            wanted: entries.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_msrs_are_unique_and_enable_fast_strings() {
        let m = boot_msrs();
        let mut idx: Vec<u32> = m.iter().map(|e| e.index).collect();
        idx.sort();
        idx.dedup();
        assert_eq!(idx.len(), m.len());
        let misc = m.iter().find(|e| e.index == MSR_IA32_MISC_ENABLE).unwrap();
        assert_eq!(misc.data & MISC_ENABLE_FAST_STRING, 1);
    }
}
