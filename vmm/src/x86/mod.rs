//! x86_64 vCPU set-up shared by every kind of guest: CPUID, MSRs, FPU,
//! LAPIC, GDT and identity page tables.

pub mod cpuid;
pub mod gdt;
pub mod lapic;
pub mod msr;
pub mod paging;

/// Errors of vCPU set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("KVM_GET_SUPPORTED_CPUID: {0}")]
    GetSupportedCpuid(kvm_ioctls::Error),
    #[error("KVM_SET_CPUID2: {0}")]
    SetCpuid(kvm_ioctls::Error),
    #[error("KVM_SET_MSRS: {0}")]
    SetMsrs(kvm_ioctls::Error),
    #[error("KVM_SET_MSRS set only {set} of {wanted} MSRs")]
    PartialMsrs { set: usize, wanted: usize },
    #[error("building the MSR list: {0}")]
    MsrList(String),
    #[error("KVM_SET_FPU: {0}")]
    SetFpu(kvm_ioctls::Error),
    #[error("KVM_GET_LAPIC/KVM_SET_LAPIC: {0}")]
    Lapic(kvm_ioctls::Error),
    #[error("KVM_GET_SREGS/KVM_SET_SREGS: {0}")]
    Sregs(kvm_ioctls::Error),
    #[error("KVM_SET_REGS: {0}")]
    Regs(kvm_ioctls::Error),
    #[error("writing {what} to guest memory: {source}")]
    GuestMemory {
        what: &'static str,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("guest RAM of {0} GiB needs more page tables than the reserved area holds")]
    TooMuchMemory(u64),
}
