//! CPUID: what KVM supports, filtered into what a guest vCPU should see.

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};

use super::Error;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_POWER: u32 = 0x6;
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;
const LEAF_EXT_TOPOLOGY: u32 = 0x8000_001e;

const ECX_HYPERVISOR_BIT: u32 = 1 << 31;
/// Leaf 1 ECX: monitor/mwait would let the guest idle on a host-invisible
/// wait; KVM does not emulate it usefully.
const ECX_MONITOR_BIT: u32 = 1 << 3;
/// Leaf 1 EDX: HTT (several logical processors per package).
const EDX_HTT_BIT: u32 = 1 << 28;

/// Reads the CPUID entries KVM can offer on this host.
pub fn supported(kvm: &Kvm) -> Result<CpuId, Error> {
    kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::GetSupportedCpuid)
}

/// Adapts the host's supported CPUID for vCPU `index` of `count`: APIC IDs,
/// topology (one package, one thread per core), the hypervisor bit, and no
/// power-management or mwait leaves the guest cannot use.
pub fn filter(cpuid: &mut CpuId, index: u8, count: u8) {
    let count = count.max(1);
    for e in cpuid.as_mut_slice().iter_mut() {
        match e.function {
            LEAF_FEATURES => {
                // EBX[31:24] initial APIC ID, [23:16] logical processors,
                // [15:8] CLFLUSH line size in 8-byte units.
                e.ebx = (u32::from(index) << 24) | (u32::from(count) << 16) | (8 << 8);
                e.ecx |= ECX_HYPERVISOR_BIT;
                e.ecx &= !ECX_MONITOR_BIT;
                if count > 1 {
                    e.edx |= EDX_HTT_BIT;
                } else {
                    e.edx &= !EDX_HTT_BIT;
                }
            }
            LEAF_CACHE_PARAMS => {
                // EAX[31:26]: cores per package - 1.
                e.eax &= 0x03ff_ffff;
                e.eax |= (u32::from(count) - 1) << 26;
            }
            LEAF_POWER => {
                // No thermal/power management, no turbo, no HWP.
                e.eax = 0;
                e.ecx &= !0x8; // ENERGY_PERF_BIAS
            }
            LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => {
                // x2APIC ID in EDX; level 0 = SMT (1 thread), level 1 = core.
                e.edx = u32::from(index);
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = bits_for(count);
                        e.ebx = u32::from(count);
                        e.ecx = (2 << 8) | 1;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
            }
            LEAF_EXT_TOPOLOGY => {
                e.eax = u32::from(index);
            }
            _ => {}
        }
    }
}

/// Bits needed to hold APIC IDs 0..count (x2APIC topology shift).
fn bits_for(count: u8) -> u32 {
    if count <= 1 {
        0
    } else {
        32 - (u32::from(count) - 1).leading_zeros()
    }
}

/// Filters `base` for vCPU `index` and installs it.
pub fn configure(vcpu: &VcpuFd, base: &CpuId, index: u8, count: u8) -> Result<(), Error> {
    let mut cpuid = base.clone();
    filter(&mut cpuid, index, count);
    vcpu.set_cpuid2(&cpuid).map_err(Error::SetCpuid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: 0xffff_ffff,
            ebx: 0xffff_ffff,
            ecx: !ECX_HYPERVISOR_BIT,
            edx: 0xffff_ffff,
            ..Default::default()
        }
    }

    #[test]
    fn apic_ids_topology_and_hypervisor_bit() {
        let mut c = CpuId::from_entries(&[
            entry(LEAF_FEATURES, 0),
            entry(LEAF_CACHE_PARAMS, 0),
            entry(LEAF_POWER, 0),
            entry(LEAF_TOPOLOGY, 0),
            entry(LEAF_TOPOLOGY, 1),
            entry(LEAF_TOPOLOGY, 2),
            entry(7, 0),
        ])
        .unwrap();
        filter(&mut c, 3, 4);
        let s = c.as_slice();
        assert_eq!(s[0].ebx >> 24, 3);
        assert_eq!((s[0].ebx >> 16) & 0xff, 4);
        assert_ne!(s[0].ecx & ECX_HYPERVISOR_BIT, 0);
        assert_eq!(s[0].ecx & ECX_MONITOR_BIT, 0);
        assert_ne!(s[0].edx & EDX_HTT_BIT, 0);
        assert_eq!(s[1].eax >> 26, 3);
        assert_eq!(s[2].eax, 0);
        assert_eq!((s[3].edx, s[3].ebx, s[3].ecx), (3, 1, 1 << 8));
        assert_eq!((s[4].eax, s[4].ebx, s[4].ecx), (2, 4, (2 << 8) | 1));
        assert_eq!((s[5].ebx, s[5].ecx), (0, 2));
        // Leaves we don't touch pass through unchanged.
        assert_eq!(s[6].eax, 0xffff_ffff);
    }

    #[test]
    fn single_vcpu_has_no_htt() {
        let mut c = CpuId::from_entries(&[entry(LEAF_FEATURES, 0)]).unwrap();
        filter(&mut c, 0, 1);
        assert_eq!(c.as_slice()[0].edx & EDX_HTT_BIT, 0);
        assert_eq!(c.as_slice()[0].ebx >> 24, 0);
        assert_eq!(bits_for(1), 0);
        assert_eq!(bits_for(2), 1);
        assert_eq!(bits_for(5), 3);
    }
}
