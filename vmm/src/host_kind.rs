//! Which kind of KVM host this is: whether a Linux guest can run to user
//! space here, and what benchmark rows and test logs record as their host
//! (docs/linux-guests.md, "What works where"). A command that needs a
//! running Linux guest refuses at once on a host where Linux cannot boot,
//! instead of spending minutes in KVM's instruction emulator before
//! failing.
//!
//! PVM (`kvm_pvm`, where guest kernel-mode code is emulated) shows as
//! `/sys/module/kvm_pvm`; hardware virtualization as the `vmx` or `svm`
//! CPU flag; the emulated host of scripts/emulated-host.sh (whose CPU
//! shows `svm`) by the variable it sets.

use std::path::Path;

/// The KVM flavour of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmKind {
    /// KVM is PVM: only 64-bit CPL3 guest code runs natively.
    Pvm,
    /// Intel VT-x or AMD-V (the CPU flag's name).
    Hardware(&'static str),
    /// Neither PVM nor a vmx/svm flag (e.g. a VM without nested
    /// virtualization): KVM, if present at all, cannot run Linux natively.
    NoHardware,
}

/// Classifies a host from whether `kvm_pvm` is loaded and its
/// `/proc/cpuinfo`. PVM wins: with `kvm_pvm` loaded, `/dev/kvm` is PVM.
pub fn classify(pvm_module_loaded: bool, cpuinfo: &str) -> KvmKind {
    if pvm_module_loaded {
        return KvmKind::Pvm;
    }
    let flags = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace());
    for f in flags {
        match f {
            "vmx" => return KvmKind::Hardware("vmx"),
            "svm" => return KvmKind::Hardware("svm"),
            _ => {}
        }
    }
    KvmKind::NoHardware
}

/// This host's kind.
pub fn host_kvm_kind() -> KvmKind {
    classify(
        Path::new("/sys/module/kvm_pvm").exists(),
        &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
    )
}

/// The environment variable scripts/emulated-host.sh sets, and its value
/// there: the process runs inside the emulated SVM host.
pub const HOST_KIND_ENV: &str = "PAGEFOLD_HOST_KIND";
pub const EMULATED_SVM: &str = "emulated-svm";

/// What a benchmark row records and a test logs as its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// KVM with VMX or SVM: Linux guests run natively.
    Hardware,
    /// Inside scripts/emulated-host.sh: KVM on QEMU's emulated SVM CPU.
    /// Page counts are real; times compare only within one run.
    EmulatedSvm,
    /// KVM through PVM: only CPL3 guest code runs natively.
    Pvm,
    /// No usable KVM for Linux guests.
    Other,
}

impl HostKind {
    /// The kind of a host whose KVM is `kind`; `emulated` when the emulated
    /// host said so (its CPU shows `svm`, so the flags alone would read
    /// `hardware`, and its times are not a hardware host's).
    pub fn of(emulated: bool, kind: KvmKind) -> Self {
        match (emulated, kind) {
            (true, _) => Self::EmulatedSvm,
            (false, KvmKind::Pvm) => Self::Pvm,
            (false, KvmKind::Hardware(_)) => Self::Hardware,
            (false, KvmKind::NoHardware) => Self::Other,
        }
    }

    /// The name rows and logs record.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hardware => "hardware",
            Self::EmulatedSvm => EMULATED_SVM,
            Self::Pvm => "pvm",
            Self::Other => "other",
        }
    }

    /// Linux guests boot to user space here.
    pub fn runs_linux(self) -> bool {
        matches!(self, Self::Hardware | Self::EmulatedSvm)
    }
}

impl std::fmt::Display for HostKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this process runs inside scripts/emulated-host.sh.
pub fn emulated_host() -> bool {
    std::env::var(HOST_KIND_ENV).as_deref() == Ok(EMULATED_SVM)
}

/// This host's kind.
pub fn host_kind() -> HostKind {
    HostKind::of(emulated_host(), host_kvm_kind())
}

/// The host CPU the `n`-th Linux VM's vCPU is pinned to, None for no
/// pinning.
///
/// Under the emulated host (`emulated`), two VMs whose vCPU threads wander
/// between its CPUs sometimes crash its kernel (a reschedule IPI between a
/// guest's exit and KVM's reload of the host state; docs/linux-guests.md):
/// there each VM gets its own CPU. Every guest crash seen there hit the VM
/// on the first CPU, so with three CPUs or more the VMs keep off it.
/// Elsewhere the scheduler places them.
pub fn linux_vm_cpu(emulated: bool, n: usize, cpus: usize) -> Option<usize> {
    match cpus {
        0..=2 => emulated.then(|| n % cpus.max(1)),
        _ => emulated.then(|| 1 + n % (cpus - 1)),
    }
}

/// Why a Linux guest cannot run to user space on a host of `kind`, or
/// None when it can. `what` names the command in the message.
pub fn linux_guest_refusal(kind: KvmKind, what: &str) -> Option<String> {
    linux_guest_refusal_with(
        kind,
        what,
        "The workload form (--guest workload) runs on this host.",
    )
}

/// As [`linux_guest_refusal`], ending with `instead`: what the user can
/// do on this host instead.
pub fn linux_guest_refusal_with(kind: KvmKind, what: &str, instead: &str) -> Option<String> {
    let why = match kind {
        KvmKind::Hardware(_) => return None,
        KvmKind::Pvm => {
            "this host's KVM is PVM (/sys/module/kvm_pvm is loaded): it runs only 64-bit \
             user-mode (CPL3) guest code natively and emulates guest kernel code instruction \
             by instruction, so a Linux kernel stops in early boot (KVM internal error)"
        }
        KvmKind::NoHardware => {
            "this host's CPU shows neither the vmx nor the svm flag (no hardware \
             virtualization), so KVM cannot run a Linux kernel"
        }
    };
    Some(format!(
        "{what} needs a host with hardware virtualization (VMX/SVM): {why}. \
         See docs/linux-guests.md. {instead}"
    ))
}

#[cfg(test)]
mod tests {

    #[test]
    fn pins_linux_vms_to_cpus_only_under_emulation() {
        assert_eq!(linux_vm_cpu(false, 0, 2), None);
        assert_eq!(
            (
                linux_vm_cpu(true, 0, 2),
                linux_vm_cpu(true, 1, 2),
                linux_vm_cpu(true, 2, 2)
            ),
            (Some(0), Some(1), Some(0))
        );
        assert_eq!(linux_vm_cpu(true, 1, 1), Some(0));
        assert_eq!(linux_vm_cpu(true, 1, 0), Some(0));
        // Three CPUs or more: the first is left to the host.
        assert_eq!(
            (
                linux_vm_cpu(true, 0, 3),
                linux_vm_cpu(true, 1, 3),
                linux_vm_cpu(true, 2, 3)
            ),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!(linux_vm_cpu(false, 0, 3), None);
    }

    use super::*;

    const INTEL: &str = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae vmx ept\n";
    const AMD: &str = "processor\t: 0\nflags\t\t: fpu svm npt\n";
    const NONE: &str = "processor\t: 0\nflags\t\t: fpu vme hypervisor\nvmx flags\t: ept\n";

    #[test]
    fn classifies_hosts() {
        assert_eq!(classify(false, INTEL), KvmKind::Hardware("vmx"));
        assert_eq!(classify(false, AMD), KvmKind::Hardware("svm"));
        // "vmx flags" lines (the kernel's VMX feature list) are not flags.
        assert_eq!(classify(false, NONE), KvmKind::NoHardware);
        assert_eq!(classify(false, ""), KvmKind::NoHardware);
        // kvm_pvm loaded: PVM whatever the flags say.
        assert_eq!(classify(true, INTEL), KvmKind::Pvm);
    }

    #[test]
    fn refuses_pvm_and_no_hardware_with_the_reason() {
        assert_eq!(linux_guest_refusal(KvmKind::Hardware("vmx"), "x"), None);
        let pvm = linux_guest_refusal(KvmKind::Pvm, "bench build --guest linux").unwrap();
        assert!(
            pvm.starts_with(
                "bench build --guest linux needs a host with hardware virtualization (VMX/SVM)"
            ),
            "{pvm}"
        );
        assert!(pvm.contains("PVM") && pvm.contains("kvm_pvm"), "{pvm}");
        let none = linux_guest_refusal(KvmKind::NoHardware, "x").unwrap();
        assert!(none.contains("neither the vmx nor the svm flag"), "{none}");
        assert!(none.ends_with("The workload form (--guest workload) runs on this host."));
        let other = linux_guest_refusal_with(KvmKind::Pvm, "x", "Use the emulated host.").unwrap();
        assert!(
            other.ends_with("docs/linux-guests.md. Use the emulated host."),
            "{other}"
        );
        assert_eq!(
            linux_guest_refusal_with(KvmKind::Hardware("svm"), "x", "y"),
            None
        );
    }

    #[test]
    fn names_host_kinds_as_the_rows_record_them() {
        let name = |e, k| HostKind::of(e, k).name();
        assert_eq!(name(false, KvmKind::Hardware("vmx")), "hardware");
        assert_eq!(name(false, KvmKind::Pvm), "pvm");
        assert_eq!(name(false, KvmKind::NoHardware), "other");
        // Inside the emulated host the CPU shows svm: the variable decides.
        assert_eq!(name(true, KvmKind::Hardware("svm")), "emulated-svm");
        assert!(HostKind::of(true, KvmKind::Hardware("svm")).runs_linux());
        assert!(!HostKind::of(false, KvmKind::Pvm).runs_linux());
    }
}
