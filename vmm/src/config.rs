//! VM descriptions: the TOML config file, and the same built from CLI flags.
//! Everything is validated here, before any VM starts, with messages that
//! name the offending field.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pagefold_dedup::{BackendKind, CheckedSettings, Mode};
use pagefold_devices::virtio::net::{
    mac, tap::check_name as check_tap_name, MacAddr, DEFAULT_QUEUE_PAIRS, MAX_QUEUE_PAIRS,
};
use serde::{Deserialize, Serialize};

mod balloon;
mod size;

pub use balloon::{BalloonConfig, MAX_STATS_INTERVAL_S};
pub use size::{fmt_size, fmt_size_exact, fmt_size_exact_about, parse_size, SizeValue};

/// Errors in a configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid size {0:?}: expected an integer with an optional K, M, G or T suffix (e.g. 256M, 1G); a bare number means MiB")]
    Size(String),
    #[error("VM {vm:?}: {message}")]
    Vm { vm: String, message: String },
    /// The VMs ask for more memory than the host has: a conflict with the
    /// host's state rather than malformed input (the API answers 409).
    #[error("the VMs ask for {} of memory in all, more than this host has ({})", fmt_size_exact(*.asked), fmt_size_exact_about(*.host))]
    HostMemory { asked: u64, host: u64 },
    #[error("{0}")]
    Invalid(String),
}

/// The documented VM name pattern (also in api/openapi.json): names end up
/// in URL paths, CLI arguments, file names and metric labels, so `.`, `..`
/// and names that look like options (`-rf`) are out.
pub const VM_NAME_PATTERN: &str = "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}";

/// Checks a VM name against [`VM_NAME_PATTERN`].
pub fn validate_vm_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(format!(
            "invalid VM name {name:?}: the name must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-', \
             starting with a letter or digit (pattern {VM_NAME_PATTERN})"
        ))
    }
}

/// Checks that `path` names a non-empty regular file, with a message that
/// tells a missing path from a directory, a device or an empty file.
fn check_file(what: &str, path: &Path, allow_empty: bool) -> Result<(), String> {
    let p = path.display();
    let m = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{what} not found: {p}"))
        }
        Err(e) => return Err(format!("{what} {p}: {e}")),
    };
    if m.is_dir() {
        return Err(format!("{what} {p} is a directory"));
    }
    if !m.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        let kind = if t.is_char_device() {
            " (a character device)"
        } else if t.is_block_device() {
            " (a block device)"
        } else if t.is_fifo() {
            " (a FIFO)"
        } else if t.is_socket() {
            " (a socket)"
        } else {
            ""
        };
        return Err(format!("{what} {p} is not a regular file{kind}"));
    }
    if m.len() == 0 && !allow_empty {
        return Err(format!("{what} {p} is empty"));
    }
    Ok(())
}

/// Checks that a kernel image is an ELF vmlinux or a bzImage (the formats
/// the loader takes), so garbage is refused as bad input up front instead
/// of failing later as a VM error.
fn check_kernel_format(path: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut head = Vec::with_capacity(0x206);
    std::fs::File::open(path)
        .and_then(|f| f.take(0x206).read_to_end(&mut head))
        .map_err(|e| format!("kernel file {}: {e}", path.display()))?;
    let elf = head.starts_with(b"\x7fELF");
    // The x86 boot protocol's header magic "HdrS" at offset 0x202.
    let bzimage = head.get(0x202..0x206) == Some(b"HdrS".as_slice());
    if elf || bzimage {
        Ok(())
    } else {
        Err(format!(
            "kernel {} is not an ELF vmlinux or bzImage kernel (no ELF magic, no \"HdrS\" boot header)",
            path.display()
        ))
    }
}

/// Where a VM's serial output goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SerialOutput {
    /// The terminal, each line prefixed with the VM's name when several VMs run.
    #[default]
    Stdout,
    /// Discard.
    Null,
    /// A file (created or truncated).
    File(PathBuf),
}

/// Per-VM dedup settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmDedup {
    /// Register this VM's RAM with the dedup backend.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Pages are shared only within a group; default: the VM's own name.
    #[serde(default)]
    pub group: Option<String>,
    /// The group's security: `default`, or `hardened` (a guest cannot tell
    /// merged pages by timing its writes; docs/security.md). Every VM of a
    /// group must give the same; the pagefold backend only.
    #[serde(default)]
    pub security: pagefold_dedup::Security,
}

fn yes() -> bool {
    true
}

impl Default for VmDedup {
    fn default() -> Self {
        Self {
            enabled: true,
            group: None,
            security: Default::default(),
        }
    }
}

/// The built-in workload guest's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Seed of the shared part: VMs with the same seed hold identical pages.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Seed of the private part; default: derived from the VM's name.
    #[serde(default)]
    pub private_seed: Option<u64>,
    /// Size of the shared, read-mostly part (like a page cache).
    #[serde(default)]
    pub shared: Option<SizeValue>,
    /// Size of the private, changing part.
    #[serde(default)]
    pub private: Option<SizeValue>,
    #[serde(default)]
    pub zero_permille: u32,
    #[serde(default)]
    pub dup_permille: u32,
    #[serde(default)]
    pub churn_permille: u32,
    /// Pages per second the churn phase rewrites (0: as fast as possible).
    #[serde(default)]
    pub churn_rate: u32,
    #[serde(default)]
    pub churn_ms: u64,
    /// Phases, in order: fill, churn, verify, rewrite, sleep:MS, wait:MS.
    #[serde(default = "default_phases")]
    pub phases: Vec<String>,
    /// Raw disk images the guest gets as virtio-blk devices (at most
    /// `pagefold_guest_abi::disk::MAX_DISKS`); its disk-read phase reads
    /// disk 0 into its data area, like a page cache.
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    /// Disk 0 is a test image made with this seed
    /// (`pagefold_guest_abi::disk::image_page_base`): disk-read then checks
    /// every byte it reads. Without it, disk-read only checksums.
    #[serde(default)]
    pub disk_seed: Option<u64>,
    /// Where the guest puts its pages in guest-physical memory: `linear`
    /// (logical page `i` at the same address in every VM) or `scattered`
    /// (extents placed by a VM-specific permutation, as a real guest's
    /// allocator would; `docs/workload-guest.md`).
    #[serde(default)]
    pub placement: PlacementKind,
    /// Scattered: pages per extent (default 1: every page on its own; 4-32
    /// resembles readahead). Range `1..=pagefold_guest_abi::placement::MAX_EXTENT_PAGES`.
    #[serde(default)]
    pub extent_pages: Option<u32>,
    /// Scattered: seed of the permutation; default: derived from the VM's
    /// name, so VMs with the same content seed get different layouts.
    #[serde(default)]
    pub placement_seed: Option<u64>,
}

/// The `placement` key of a workload: how the data area is laid out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementKind {
    /// Logical page `i` in data slot `record_pages + i`.
    #[default]
    Linear,
    /// Extents of `extent_pages` pages permuted by `placement_seed`.
    Scattered,
}

impl std::str::FromStr for PlacementKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "linear" => Ok(Self::Linear),
            "scattered" => Ok(Self::Scattered),
            _ => Err(format!(
                "unknown placement {s:?} (expected linear or scattered)"
            )),
        }
    }
}

fn default_seed() -> u64 {
    1
}

fn default_phases() -> Vec<String> {
    vec!["fill".into(), "verify".into()]
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            seed: default_seed(),
            private_seed: None,
            shared: None,
            private: None,
            zero_permille: 0,
            dup_permille: 0,
            churn_permille: 0,
            churn_rate: 0,
            churn_ms: 0,
            phases: default_phases(),
            disks: Vec::new(),
            disk_seed: None,
            placement: PlacementKind::Linear,
            extent_pages: None,
            placement_seed: None,
        }
    }
}

/// A disk attached to a Linux guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    pub path: PathBuf,
    #[serde(default)]
    pub readonly: bool,
}

/// A MAC address in a config (`"52:54:00:12:34:56"`), checked as the
/// file, the API body or the flag is parsed: a malformed or multicast
/// address is a parse error naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Mac(pub MacAddr);

impl TryFrom<String> for Mac {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse().map(Mac).map_err(|e: mac::Error| e.to_string())
    }
}

impl From<Mac> for String {
    fn from(m: Mac) -> String {
        m.0.to_string()
    }
}

/// A network interface of a Linux guest: a virtio-net device on the host
/// tap `tap` (made beforehand, e.g. `ip tuntap add NAME mode tap`, and
/// put on a bridge), with address `mac` (default: 52:54:00 and three
/// bytes derived from the VM's name and the NIC's index), and at most
/// `queue_pairs` queue pairs (default 4; the NIC gets one per vCPU up to
/// that: [`NetConfig::pairs_for`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    pub tap: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_pairs: Option<u16>,
}

impl NetConfig {
    /// A NIC on `tap` with the default address and pairs.
    pub fn on_tap(tap: &str) -> Self {
        Self {
            tap: tap.to_string(),
            mac: None,
            queue_pairs: None,
        }
    }

    /// The queue pairs the NIC of a VM with `vcpus` vCPUs gets: one per
    /// vCPU, at most `queue_pairs` (default
    /// [`DEFAULT_QUEUE_PAIRS`](pagefold_devices::virtio::net::DEFAULT_QUEUE_PAIRS)).
    /// More pairs than vCPUs would only spread a guest's flows over
    /// queues that the same CPUs serve.
    pub fn pairs_for(&self, vcpus: usize) -> usize {
        let cap = self.queue_pairs.map_or(DEFAULT_QUEUE_PAIRS, usize::from);
        vcpus.clamp(1, cap.max(1))
    }

    /// The address the guest gets: the configured one, else the default
    /// of NIC `index` of VM `vm`.
    pub fn mac_for(&self, vm: &str, index: usize) -> MacAddr {
        self.mac
            .map_or_else(|| MacAddr::default_for(vm, index), |m| m.0)
    }
}

/// A Linux kernel to boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    pub path: PathBuf,
    #[serde(default)]
    pub initrd: Option<PathBuf>,
    #[serde(default = "default_cmdline")]
    pub cmdline: String,
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    /// Network interfaces (virtio-net on host taps), after the disks in
    /// the virtio-mmio slots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net: Vec<NetConfig>,
    /// A memory balloon (virtio-balloon), in the slot after the NICs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonConfig>,
}

/// How many virtio-mmio devices (disks, NICs and the balloon together) a
/// Linux guest may have: one GSI each, from 5 to the IOAPIC's last pin, 23.
pub const MAX_VIRTIO_DEVICES: usize = 19;

pub fn default_cmdline() -> String {
    "console=ttyS0 reboot=k panic=-1".to_string()
}

/// One VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub name: String,
    #[serde(default = "one")]
    pub vcpus: u8,
    pub memory: SizeValue,
    #[serde(default)]
    pub serial: SerialOutput,
    #[serde(default)]
    pub dedup: VmDedup,
    /// The built-in workload guest (the default when no kernel is given).
    #[serde(default)]
    pub workload: Option<WorkloadConfig>,
    /// A Linux kernel instead of the workload guest.
    #[serde(default)]
    pub kernel: Option<KernelConfig>,
    /// Host CPUs the VM's vCPU threads may run on (all of them on any of
    /// these, as `taskset`); default: wherever the process may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_affinity: Option<Vec<usize>>,
}

fn one() -> u8 {
    1
}

/// Engine-wide dedup settings: the backend, chosen at start, and the
/// settings (mode, knobs, auto mode) that the CLI's flags and the API's
/// `PATCH /dedup` also carry, flattened into `[dedup]` and checked as the
/// file is parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// `pagefold` (the userspace engine) or `ksm` (the kernel's KSM).
    #[serde(default)]
    pub backend: BackendKind,
    #[serde(flatten)]
    pub settings: CheckedSettings,
    /// pagefold engine only: let kernel KSM take a group whose duplicates
    /// sit at scattered addresses (one VMA per merge otherwise): `auto`
    /// (default) or `off`. See docs/engine.md.
    #[serde(default = "default_ksm_assist")]
    pub ksm_assist: pagefold_dedup::AssistMode,
    /// pagefold engine only: visit pages virtio-blk reads just filled first
    /// (default true).
    #[serde(default = "yes")]
    pub io_hints: bool,
    /// pagefold engine only: read KVM's dirty log of guest RAM, so pages
    /// the guest did not write are not read again (default true).
    #[serde(default = "yes")]
    pub write_log: bool,
}

fn default_ksm_assist() -> pagefold_dedup::AssistMode {
    pagefold_dedup::AssistMode::Auto
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            backend: BackendKind::default(),
            settings: CheckedSettings::default(),
            ksm_assist: default_ksm_assist(),
            io_hints: true,
            write_log: true,
        }
    }
}

impl DedupConfig {
    /// The mode to start in (`off` unless given).
    pub fn mode(&self) -> Mode {
        self.settings.mode()
    }
}

/// A whole config file: dedup settings and VMs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub dedup: DedupConfig,
    #[serde(default, rename = "vm")]
    pub vms: Vec<VmConfig>,
    /// The VM that receives host stdin on its serial port (default: the
    /// first VM that boots a kernel).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Per-thread seccomp filters (default on; `seccomp = false` or
    /// `--no-seccomp` turns them off; see docs/architecture.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<bool>,
}

/// Maximum vCPUs per VM.
pub const MAX_VCPUS: u8 = 64;

impl Config {
    /// Whether seccomp filters are on (the default).
    pub fn seccomp_enabled(&self) -> bool {
        self.seccomp.unwrap_or(true)
    }

    /// Reads and validates a TOML config file.
    pub fn from_file(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Parses the TOML text of a config file (`path` names it in errors);
    /// like [`Config::from_file`], does not validate.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, Error> {
        toml::from_str(text).map_err(|e| Error::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Checks everything that can be checked before starting: names, sizes,
    /// files, knob ranges, and that the host can give the memory asked for.
    pub fn validate(&self, host_mem_total: Option<u64>) -> Result<(), Error> {
        if self.vms.is_empty() {
            return Err(Error::Invalid(
                "no VM to run: the config has no [[vm]]".into(),
            ));
        }
        let mut names = BTreeSet::new();
        let mut total = 0u64;
        for vm in &self.vms {
            vm.validate()?;
            if !names.insert(vm.name.clone()) {
                return Err(Error::Invalid(format!("two VMs are named {:?}", vm.name)));
            }
            total = total.saturating_add(vm.memory_bytes());
        }
        // A group's VMs share one security; kernel KSM cannot keep a
        // hardened group (the engine refuses it too, at registration).
        let mut security = std::collections::BTreeMap::new();
        for vm in self.vms.iter().filter(|v| v.dedup.enabled) {
            let want = vm.dedup.security;
            if want == pagefold_dedup::Security::Hardened && self.dedup.backend == BackendKind::Ksm
            {
                return Err(vm.err(
                    "dedup.security = \"hardened\" needs the pagefold backend; kernel KSM cannot keep it",
                ));
            }
            let group = vm.dedup_group();
            if let Some(&(other, has)) = security.get(&group) {
                if has != want {
                    return Err(Error::Invalid(format!(
                        "dedup group {group:?}: VM {other:?} is {has} and VM {:?} {want}; a group's VMs share one security",
                        vm.name
                    )));
                }
            } else {
                security.insert(group, (&vm.name, want));
            }
        }
        let mut taps = BTreeSet::new();
        for vm in &self.vms {
            for t in vm.taps() {
                if !taps.insert(t) {
                    return Err(Error::Invalid(format!(
                        "tap {t:?} is given to two VMs; each NIC needs its own tap (put them on one bridge)"
                    )));
                }
            }
        }
        if let Some(s) = &self.stdin {
            if !names.contains(s) {
                return Err(Error::Invalid(format!("stdin: no VM named {s:?}")));
            }
        }
        if let Some(host) = host_mem_total {
            if total > host {
                return Err(Error::HostMemory { asked: total, host });
            }
        }
        Ok(())
    }
}

impl VmConfig {
    fn err(&self, message: impl Into<String>) -> Error {
        Error::Vm {
            vm: self.name.clone(),
            message: message.into(),
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        validate_vm_name(&self.name).map_err(|m| self.err(m))?;
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(self.err(format!(
                "invalid vcpus {} (valid range 1..={MAX_VCPUS})",
                self.vcpus
            )));
        }
        let mem = self.memory.bytes().map_err(|e| self.err(e.to_string()))?;
        if mem == 0 {
            return Err(self.err("memory must be larger than zero"));
        }
        if mem % (1 << 20) != 0 {
            return Err(self.err(format!(
                "memory must be a whole number of MiB, got {}",
                fmt_size_exact(mem)
            )));
        }
        if mem < 16 << 20 {
            return Err(self.err(format!(
                "memory must be at least 16 MiB, got {}",
                fmt_size_exact(mem)
            )));
        }
        if let Some(g) = &self.dedup.group {
            if g.is_empty() {
                return Err(self.err("dedup.group must not be empty"));
            }
        }
        if let Some(cpus) = &self.vcpu_affinity {
            crate::affinity::check(cpus).map_err(|e| self.err(e.to_string()))?;
        }
        match (&self.workload, &self.kernel) {
            (Some(_), Some(_)) => {
                return Err(self.err("give either a workload or a kernel, not both"))
            }
            (_, Some(k)) => {
                check_file("kernel file", &k.path, false).map_err(|m| self.err(m))?;
                check_kernel_format(&k.path).map_err(|m| self.err(m))?;
                if let Some(i) = &k.initrd {
                    check_file("initrd file", i, false).map_err(|m| self.err(m))?;
                }
                for d in &k.disks {
                    check_file("disk image", &d.path, true).map_err(|m| self.err(m))?;
                }
                self.validate_net(k)?;
            }
            (w, None) => {
                let w = w.clone().unwrap_or_default();
                w.validate().map_err(|m| self.err(m))?;
            }
        }
        if let SerialOutput::File(p) = &self.serial {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    return Err(self.err(format!(
                        "serial output directory does not exist: {}",
                        dir.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// NICs: valid tap names, no tap or address twice, room in the
    /// virtio-mmio slots (with the balloon's); the balloon's settings.
    fn validate_net(&self, k: &KernelConfig) -> Result<(), Error> {
        let balloons = usize::from(k.balloon.is_some());
        let devices = k.disks.len() + k.net.len() + balloons;
        if devices > MAX_VIRTIO_DEVICES {
            return Err(self.err(format!(
                "{} disks, {} network interfaces and {balloons} balloon: at most {MAX_VIRTIO_DEVICES} devices in all",
                k.disks.len(),
                k.net.len()
            )));
        }
        if let Some(b) = &k.balloon {
            b.validate().map_err(|m| self.err(m))?;
        }
        let mut taps = BTreeSet::new();
        let mut macs = BTreeSet::new();
        for (i, n) in k.net.iter().enumerate() {
            check_tap_name(&n.tap).map_err(|e| self.err(format!("net[{i}]: {e}")))?;
            if let Some(q) = n.queue_pairs {
                if !(1..=MAX_QUEUE_PAIRS).contains(&usize::from(q)) {
                    return Err(self.err(format!(
                        "net[{i}]: queue_pairs {q}: valid range 1..={MAX_QUEUE_PAIRS}"
                    )));
                }
            }
            if !taps.insert(n.tap.as_str()) {
                return Err(self.err(format!("net[{i}]: tap {:?} is listed twice", n.tap)));
            }
            let mac = n.mac_for(&self.name, i);
            if !macs.insert(mac.bytes()) {
                return Err(self.err(format!("net[{i}]: MAC address {mac} is listed twice")));
            }
        }
        Ok(())
    }

    /// The taps this VM's NICs use.
    pub fn taps(&self) -> impl Iterator<Item = &str> {
        self.kernel
            .iter()
            .flat_map(|k| k.net.iter().map(|n| n.tap.as_str()))
    }

    /// Guest RAM size in bytes (validated): the size asked for, rounded up
    /// to a multiple of 2 MiB (guest RAM is mapped with 2 MiB pages; see
    /// [`VmConfig::memory_note`]).
    pub fn memory_bytes(&self) -> u64 {
        let b = self.memory.bytes().unwrap_or(0);
        b.div_ceil(crate::memory::RAM_ALIGN)
            .saturating_mul(crate::memory::RAM_ALIGN)
    }

    /// A note when the size asked for was rounded up (e.g. 4097 MiB to
    /// 4098 MiB), like Firecracker takes any MiB size: the VMM prints it.
    pub fn memory_note(&self) -> Option<String> {
        let asked = self.memory.bytes().ok()?;
        let got = self.memory_bytes();
        (got != asked).then(|| {
            format!(
                "VM {:?}: memory {} rounded up to {} (guest RAM comes in 2 MiB pages)",
                self.name,
                fmt_size_exact(asked),
                fmt_size_exact(got)
            )
        })
    }

    /// The dedup group this VM's pages may be shared in.
    pub fn dedup_group(&self) -> String {
        self.dedup
            .group
            .clone()
            .unwrap_or_else(|| self.name.clone())
    }
}

/// A parsed workload phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Fill,
    /// Churn for the given milliseconds (0: the workload's `churn_ms`).
    Churn(u64),
    Verify,
    Rewrite,
    Sleep(u64),
    WaitHost(u64),
    /// Fault injection (tests): a triple fault.
    Fault,
    /// Fault injection (tests): a write to an unassigned port.
    BadPort,
    /// Read this many pages of disk 0 (0: all of it).
    DiskRead(u64),
    /// The modelled build over the source tree on disk 0
    /// (`pagefold_guest_abi::build`); the argument is the guest's BUILD
    /// arg: 0 scattered (the VM's placement, or the build's own scatter in
    /// a linear VM), 1 the VM's placement as it is.
    Build(u64),
    /// The pause probe for this many milliseconds
    /// (`pagefold_guest_abi::pause`).
    Latency(u64),
    /// The pause probe that also rewrites a shared page every
    /// `pause::WRITE_INTERVAL_US` (COW breaks of merged pages).
    LatencyWrite(u64),
    /// The write-timing side channel
    /// (`pagefold_guest_abi::merge_probe`), after sleeping this many
    /// milliseconds.
    ProbeMerge(u64),
}

impl Phase {
    pub fn parse(s: &str) -> Result<Phase, String> {
        let (op, arg) = match s.split_once(':') {
            Some((o, a)) => (o, Some(a)),
            None => (s, None),
        };
        let ms = |a: Option<&str>, default: Option<u64>| -> Result<u64, String> {
            match (a, default) {
                (Some(a), _) => a
                    .parse::<u64>()
                    .map_err(|_| format!("phase {s:?}: {a:?} is not a number of milliseconds")),
                (None, Some(d)) => Ok(d),
                (None, None) => Err(format!("phase {s:?} needs a duration, e.g. {op}:1000")),
            }
        };
        let no_arg = |p: Phase| match arg {
            None => Ok(p),
            Some(_) => Err(format!("phase {op:?} takes no argument")),
        };
        match op {
            "fill" => no_arg(Phase::Fill),
            "churn" => Ok(Phase::Churn(ms(arg, Some(0))?)),
            "verify" => no_arg(Phase::Verify),
            "rewrite" => no_arg(Phase::Rewrite),
            "fault" => no_arg(Phase::Fault),
            "badport" => no_arg(Phase::BadPort),
            "sleep" => Ok(Phase::Sleep(ms(arg, None)?)),
            "wait" => Ok(Phase::WaitHost(ms(arg, Some(600_000))?)),
            "latency" => Ok(Phase::Latency(ms(arg, None)?)),
            "latency-write" => Ok(Phase::LatencyWrite(ms(arg, None)?)),
            "probe-merge" => Ok(Phase::ProbeMerge(ms(arg, Some(0))?)),
            "disk-read" => match arg {
                None => Ok(Phase::DiskRead(0)),
                Some(a) => match a.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Phase::DiskRead(n)),
                    _ => Err(format!(
                        "phase {s:?}: {a:?} is not a number of pages (4 KiB) above 0"
                    )),
                },
            },
            "build" => match arg {
                None | Some("scattered") => Ok(Phase::Build(0)),
                Some("linear") => Ok(Phase::Build(1)),
                Some(a) => Err(format!(
                    "phase {s:?}: {a:?} is not a placement (scattered or linear)"
                )),
            },
            _ => Err(format!(
                "unknown phase {op:?} (expected fill, churn[:MS], verify, rewrite, sleep:MS, wait[:MS], disk-read[:PAGES], build[:scattered|linear], latency:MS, latency-write:MS, probe-merge[:MS], or the fault injections fault and badport)"
            )),
        }
    }
}

/// Most phases a workload program holds.
pub const MAX_PHASES: usize = 15;

impl WorkloadConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("zero_permille", self.zero_permille),
            ("dup_permille", self.dup_permille),
            ("churn_permille", self.churn_permille),
        ] {
            if v > 1000 {
                return Err(format!("workload.{name} = {v} (valid range 0..=1000)"));
            }
        }
        if self.zero_permille + self.dup_permille > 1000 {
            return Err(format!(
                "workload.zero_permille + dup_permille = {} (must be at most 1000)",
                self.zero_permille + self.dup_permille
            ));
        }
        if self.phases.is_empty() || self.phases.len() > MAX_PHASES {
            return Err(format!(
                "workload.phases must list 1..={MAX_PHASES} phases, got {}",
                self.phases.len()
            ));
        }
        let phases = self.parsed_phases()?;
        if !matches!(phases.first(), Some(Phase::Fill)) {
            return Err("workload.phases must start with \"fill\"".to_string());
        }
        for s in [&self.shared, &self.private].into_iter().flatten() {
            s.bytes().map_err(|e| e.to_string())?;
        }
        let max_disks = pagefold_guest_abi::disk::MAX_DISKS;
        if self.disks.len() > max_disks {
            return Err(format!(
                "workload.disks lists {} disks (at most {max_disks})",
                self.disks.len()
            ));
        }
        if self.disk_seed == Some(0) {
            return Err(
                "workload.disk_seed must not be 0 (0 means \"unknown content\"; leave it out)"
                    .into(),
            );
        }
        if self.disks.is_empty() && phases.iter().any(|p| matches!(p, Phase::DiskRead(_))) {
            return Err("the disk-read phase needs a disk (workload.disks, or --disk)".into());
        }
        if self.disks.is_empty() && phases.iter().any(|p| matches!(p, Phase::Build(_))) {
            return Err(
                "the build phase needs a source-tree disk (workload.disks, or --disk)".into(),
            );
        }
        for d in &self.disks {
            check_file("disk image", &d.path, true)?;
        }
        let max_extent = pagefold_guest_abi::placement::MAX_EXTENT_PAGES;
        match self.placement {
            PlacementKind::Linear => {
                for (key, given) in [
                    ("extent_pages", self.extent_pages.is_some()),
                    ("placement_seed", self.placement_seed.is_some()),
                ] {
                    if given {
                        return Err(format!(
                            "workload.{key} applies only to placement = \"scattered\" (placement is \"linear\")"
                        ));
                    }
                }
            }
            PlacementKind::Scattered => {
                if let Some(e) = self.extent_pages.filter(|&e| e == 0 || e > max_extent) {
                    return Err(format!(
                        "workload.extent_pages = {e} (valid range 1..={max_extent})"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The placement of a VM named `vm_name`: the default seed is a hash
    /// of the name (apart from the private seed's), so that VMs with the
    /// same content lay it out differently.
    pub fn placement(&self, vm_name: &str) -> pagefold_guest_abi::Placement {
        match self.placement {
            PlacementKind::Linear => pagefold_guest_abi::Placement::Linear,
            PlacementKind::Scattered => pagefold_guest_abi::Placement::Scattered {
                extent_pages: self.extent_pages.unwrap_or(1),
                seed: self
                    .placement_seed
                    .unwrap_or_else(|| crate::seed::name_seed(&format!("placement:{vm_name}"))),
            },
        }
    }

    pub fn parsed_phases(&self) -> Result<Vec<Phase>, String> {
        self.phases.iter().map(|p| Phase::parse(p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("256").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        for bad in ["", "M", "12Q", "-1M", "1.5G", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(fmt_size(256 << 20), "256 MiB");
        assert_eq!(fmt_size(1536 << 20), "1.5 GiB");
    }

    fn parse(s: &str) -> Result<Config, String> {
        toml::from_str::<Config>(s).map_err(|e| e.to_string())
    }

    #[test]
    fn a_groups_vms_share_one_security_and_hardened_needs_pagefold() {
        let two = |sa: &str, sb: &str, backend: &str| {
            parse(&format!(
                "[dedup]\nbackend = \"{backend}\"\n\
                 [[vm]]\nname = \"a\"\nmemory = 64\ndedup = {{ group = \"g\"{sa} }}\n\
                 [[vm]]\nname = \"b\"\nmemory = 64\ndedup = {{ group = \"g\"{sb} }}\n"
            ))
            .unwrap()
        };
        let h = ", security = \"hardened\"";
        let c = two(h, h, "pagefold");
        c.validate(None).unwrap();
        assert_eq!(c.vms[1].dedup.security, pagefold_dedup::Security::Hardened);
        let c = two("", "", "pagefold");
        c.validate(None).unwrap();
        assert_eq!(c.vms[0].dedup.security, pagefold_dedup::Security::Default);
        let e = two(h, "", "pagefold")
            .validate(None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("share one security") && e.contains("hardened"),
            "{e}"
        );
        let e = two(h, h, "ksm").validate(None).unwrap_err().to_string();
        assert!(e.contains("needs the pagefold backend"), "{e}");
        let bad = parse("[[vm]]\nname = \"a\"\nmemory = 64\ndedup = { security = \"paranoid\" }\n");
        assert!(bad.unwrap_err().to_string().contains("paranoid"));
    }

    #[test]
    fn parses_two_vm_config() {
        let c = parse(
            r#"
            [dedup]
            mode = "on"
            pages_to_scan = 1000
            [[vm]]
            name = "a"
            memory = "256M"
            [vm.workload]
            seed = 7
            shared = "128M"
            phases = ["fill", "sleep:100", "verify"]
            [[vm]]
            name = "b"
            memory = 256
            vcpus = 2
            dedup = { group = "g" }
        "#,
        )
        .unwrap();
        c.validate(None).unwrap();
        assert_eq!(c.dedup.mode(), Mode::On);
        assert_eq!(c.dedup.settings.pages_to_scan, Some(1000));
        assert_eq!(c.dedup.backend, BackendKind::Pagefold);
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[1].memory_bytes(), 256 << 20);
        assert_eq!(c.vms[0].dedup_group(), "a");
        assert_eq!(c.vms[1].dedup_group(), "g");
        let w = c.vms[0].workload.as_ref().unwrap();
        assert_eq!(
            w.parsed_phases().unwrap(),
            vec![Phase::Fill, Phase::Sleep(100), Phase::Verify]
        );
    }

    #[test]
    fn dedup_section_takes_every_setting() {
        let c = parse(
            "[dedup]\nbackend = \"ksm\"\nmode = \"auto\"\npages_to_scan = 500\n\
             sleep_millisecs = 0\nmax_page_sharing = 64\nauto_threshold = 30\n\
             max_scanning_factor = 4\nmemory_signal = \"free\"\nksm_assist = \"off\"\n\
             io_hints = false\nwrite_log = false\nsettle = false\n",
        )
        .unwrap();
        let d = &c.dedup;
        assert_eq!(d.backend, BackendKind::Ksm);
        assert_eq!(d.mode(), Mode::Auto);
        let s = *d.settings;
        assert_eq!(
            (s.pages_to_scan, s.sleep_millisecs, s.max_page_sharing),
            (Some(500), Some(0), Some(64))
        );
        assert_eq!(
            (s.auto_threshold, s.max_scanning_factor),
            (Some(30), Some(4))
        );
        assert_eq!(s.memory_signal, Some(pagefold_dedup::MemorySignal::Free));
        assert_eq!(s.settle, Some(false));
        assert_eq!(d.ksm_assist, pagefold_dedup::AssistMode::Off);
        assert!(!d.io_hints);
        assert!(!d.write_log);
        let empty = parse("").unwrap().dedup;
        assert_eq!(empty, DedupConfig::default());
        assert_eq!(empty.mode(), Mode::Off);
    }

    #[test]
    fn rejects_bad_input_with_clear_messages() {
        let e = parse("[[vm]]\nname = \"a\"\nmemory = \"1G\"\ncolour = 3\n").unwrap_err();
        assert!(e.contains("unknown field `colour`"), "{e}");
        // The dedup settings are checked as they are parsed.
        let vm = "[[vm]]\nname = \"a\"\nmemory = 64\n";
        for (dedup, want) in [
            (
                "pages_to_scan = 0",
                "invalid value for pages_to_scan: 0 (valid range 1..=16777216)",
            ),
            (
                "backend = \"zfs\"",
                "unknown backend \"zfs\" (expected pagefold or ksm)",
            ),
            ("mode = \"sometimes\"", "unknown dedup mode \"sometimes\""),
            (
                "memory_signal = \"cached\"",
                "unknown memory signal \"cached\"",
            ),
            (
                "auto_threshold = 101",
                "auto_threshold must be a percentage in 0..=100, got 101",
            ),
            ("turbo = true", "unknown field `turbo`"),
            ("pages_to_scan = \"many\"", "invalid type"),
            ("settle = \"no\"", "invalid type"),
        ] {
            let e = parse(&format!("[dedup]\n{dedup}\n{vm}")).unwrap_err();
            assert!(e.contains(want), "{dedup}: {e}");
        }
        let bad = |s: &str, want: &str| {
            let c = parse(s).unwrap();
            let e = c.validate(Some(8 << 30)).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        };
        bad("[[vm]]\nname = \"a\"\nmemory = 0\n", "larger than zero");
        bad(
            "[[vm]]\nname = \"a\"\nmemory = \"1536K\"\n",
            "whole number of MiB, got 1536 KiB",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = \"3M\"\n",
            "at least 16 MiB, got 3 MiB",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = \"64G\"\n",
            "more than this host has",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\nvcpus = 0\n",
            "valid range 1..=64",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\nvcpu_affinity = []\n",
            "vcpu_affinity is empty",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\nvcpu_affinity = [1023]\n",
            "host CPU 1023 is not available",
        );
        bad("[[vm]]\nname = \"a b\"\nmemory = 64\n", "name must be");
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\n[[vm]]\nname = \"a\"\nmemory = 64\n",
            "two VMs are named",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.kernel]\npath = \"/nonexistent/vmlinux\"\n",
            "file not found",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\nphases = [\"verify\"]\n",
            "must start with",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\nphases = [\"fill\", \"dance\"]\n",
            "unknown phase",
        );
        bad(
            "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\nzero_permille = 1001\n",
            "valid range 0..=1000",
        );
        bad("", "no VM to run");
    }

    #[test]
    fn sizes_are_reported_exactly_and_rounded_up_to_2_mib() {
        assert_eq!(fmt_size_exact(4097 << 20), "4097 MiB");
        assert_eq!(fmt_size_exact(4 << 30), "4 GiB");
        assert_eq!(fmt_size_exact(1536 << 10), "1536 KiB");
        assert_eq!(fmt_size_exact(1000), "1000 B");
        assert_eq!(fmt_size_exact(0), "0 B");
        assert_eq!(
            fmt_size_exact_about(24684096 << 10),
            "24684096 KiB, about 23.5 GiB"
        );
        assert_eq!(fmt_size_exact_about(4 << 30), "4 GiB");
        let c = parse("[[vm]]\nname = \"a\"\nmemory = 4097\n").unwrap();
        c.validate(None).unwrap();
        assert_eq!(c.vms[0].memory_bytes(), 4098 << 20);
        let note = c.vms[0].memory_note().unwrap();
        assert!(note.contains("4097 MiB rounded up to 4098 MiB"), "{note}");
        let c = parse("[[vm]]\nname = \"a\"\nmemory = \"64M\"\n").unwrap();
        assert_eq!(c.vms[0].memory_note(), None);
        // Too much for the host: exact sizes, and its own variant (409 in the API).
        let c = parse("[[vm]]\nname = \"a\"\nmemory = 4097\n").unwrap();
        let e = c.validate(Some(4 << 30)).unwrap_err();
        assert!(matches!(e, Error::HostMemory { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("4098 MiB") && m.contains("(4 GiB)"), "{m}");
    }

    #[test]
    fn sizes_that_are_not_sizes_say_what_a_size_looks_like() {
        for v in ["1.5", "-3", "true"] {
            let e = parse(&format!("[[vm]]\nname = \"a\"\nmemory = {v}\n")).unwrap_err();
            assert!(
                e.contains("integer number of MiB") && e.contains("\"256M\""),
                "{v}: {e}"
            );
            assert!(!e.contains("untagged"), "{e}");
        }
        let e = serde_json::from_str::<VmConfig>(r#"{"name": "a", "memory": 1.5}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("floating point `1.5`") && e.contains("K, M, G or T suffix"),
            "{e}"
        );
        let c: VmConfig = serde_json::from_str(r#"{"name": "a", "memory": 64.0}"#).unwrap();
        assert_eq!(c.memory_bytes(), 64 << 20);
        let c = parse("[[vm]]\nname = \"a\"\nmemory = \"1.5G\"\n").unwrap();
        let e = c.validate(None).unwrap_err().to_string();
        assert!(e.contains("invalid size \"1.5G\""), "{e}");
    }

    #[test]
    fn vm_names_follow_the_documented_pattern() {
        for good in ["a", "vm-1", "A.b_c", "0", &"x".repeat(64)] {
            validate_vm_name(good).unwrap();
        }
        for bad in [
            ".",
            "..",
            "-rf",
            "_x",
            "",
            "a/b",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            let e = validate_vm_name(bad).unwrap_err();
            assert!(e.contains(VM_NAME_PATTERN), "{e}");
        }
        for bad in [".", "..", "-rf"] {
            let c = parse(&format!("[[vm]]\nname = {bad:?}\nmemory = 64\n")).unwrap();
            let e = c.validate(None).unwrap_err().to_string();
            assert!(e.contains("invalid VM name"), "{e}");
        }
    }

    #[test]
    fn kernel_and_disk_paths_say_what_is_wrong_with_them() {
        let d = std::env::temp_dir().join(format!("pagefold-cfg-files-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let empty = d.join("empty");
        std::fs::write(&empty, b"").unwrap();
        let garbage = d.join("garbage");
        std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
        let elf = d.join("elf");
        std::fs::write(&elf, b"\x7fELF\x02\x01\x01").unwrap();
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        let bzimage = d.join("bzimage");
        std::fs::write(&bzimage, &bz).unwrap();
        let kernel = |path: &Path| {
            let c = parse(&format!(
                "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.kernel]\npath = {:?}\n",
                path.display().to_string()
            ))
            .unwrap();
            c.validate(None).map_err(|e| e.to_string())
        };
        let e = kernel(Path::new("/dev/null")).unwrap_err();
        assert!(e.contains("/dev/null is not a regular file"), "{e}");
        let e = kernel(&d).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let e = kernel(&empty).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        let e = kernel(&garbage).unwrap_err();
        assert!(e.contains("not an ELF vmlinux or bzImage kernel"), "{e}");
        kernel(&elf).unwrap();
        kernel(&bzimage).unwrap();
        let disk = |path: &Path| {
            let c = parse(&format!(
                "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\nphases = [\"fill\", \"disk-read\"]\ndisks = [{{ path = {:?} }}]\n",
                path.display().to_string()
            ))
            .unwrap();
            c.validate(None).map_err(|e| e.to_string())
        };
        let e = disk(&d).unwrap_err();
        assert!(
            e.contains("is a directory") && !e.contains("not found"),
            "{e}"
        );
        let e = disk(Path::new("/dev/null")).unwrap_err();
        assert!(e.contains("is not a regular file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn linux_nics_parse_and_bad_ones_are_refused() {
        let elf = std::env::temp_dir().join(format!("pagefold-cfg-net-{}", std::process::id()));
        std::fs::write(&elf, b"\x7fELF\x02\x01\x01").unwrap();
        let vm = |name: &str, nets: &str| {
            format!(
                "[[vm]]\nname = {name:?}\nmemory = 64\n[vm.kernel]\npath = {:?}\n{nets}",
                elf.display().to_string()
            )
        };
        let c = parse(&vm(
            "a",
            "[[vm.kernel.net]]\ntap = \"tap0\"\nmac = \"52:54:00:AA:00:01\"\n[[vm.kernel.net]]\ntap = \"tap1\"\n",
        ))
        .unwrap();
        c.validate(None).unwrap();
        let k = c.vms[0].kernel.as_ref().unwrap();
        assert_eq!(k.net.len(), 2);
        assert_eq!(k.net[0].mac_for("a", 0).to_string(), "52:54:00:aa:00:01");
        assert_eq!(k.net[1].mac_for("a", 1), MacAddr::default_for("a", 1));
        // Written back, the MAC keeps its colon form.
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("mac = \"52:54:00:aa:00:01\""), "{text}");
        assert_eq!(Config::from_toml(&text, Path::new("t")).unwrap(), c);

        // A bad MAC fails the parse, naming it.
        for bad in ["52:54:00:aa:00", "01:00:5e:00:00:01", "zz:54:00:aa:00:01"] {
            let e = parse(&vm(
                "a",
                &format!("[[vm.kernel.net]]\ntap = \"t\"\nmac = {bad:?}\n"),
            ))
            .unwrap_err();
            assert!(e.contains(bad) && e.contains("MAC"), "{e}");
        }
        let invalid = |text: String| {
            parse(&text)
                .unwrap()
                .validate(None)
                .unwrap_err()
                .to_string()
        };
        let e = invalid(vm("a", "[[vm.kernel.net]]\ntap = \"a/b\"\n"));
        assert!(e.contains("net[0]") && e.contains("tap name"), "{e}");
        let e = invalid(vm(
            "a",
            "[[vm.kernel.net]]\ntap = \"t\"\n[[vm.kernel.net]]\ntap = \"t\"\n",
        ));
        assert!(e.contains("listed twice"), "{e}");
        let e = invalid(vm(
            "a",
            "[[vm.kernel.net]]\ntap = \"t\"\nmac = \"52:54:00:00:00:01\"\n[[vm.kernel.net]]\ntap = \"u\"\nmac = \"52:54:00:00:00:01\"\n",
        ));
        assert!(e.contains("52:54:00:00:00:01 is listed twice"), "{e}");
        let e = invalid(format!(
            "{}{}",
            vm("a", "[[vm.kernel.net]]\ntap = \"t\"\n"),
            vm("b", "[[vm.kernel.net]]\ntap = \"t\"\n")
        ));
        assert!(e.contains("two VMs"), "{e}");
        // queue_pairs: 1..=16, and the pairs a NIC gets follow the vCPUs.
        for bad in [0, 17] {
            let e = invalid(vm(
                "a",
                &format!("[[vm.kernel.net]]\ntap = \"t\"\nqueue_pairs = {bad}\n"),
            ));
            assert!(
                e.contains("net[0]")
                    && e.contains(&format!("queue_pairs {bad}"))
                    && e.contains("1..=16"),
                "{e}"
            );
        }
        let c = parse(&vm(
            "a",
            "[[vm.kernel.net]]\ntap = \"t\"\nqueue_pairs = 2\n",
        ))
        .unwrap();
        c.validate(None).unwrap();
        let n = &c.vms[0].kernel.as_ref().unwrap().net[0];
        assert_eq!((n.pairs_for(1), n.pairs_for(2), n.pairs_for(8)), (1, 2, 2));
        let n = NetConfig::on_tap("t");
        assert_eq!((n.pairs_for(1), n.pairs_for(3), n.pairs_for(8)), (1, 3, 4));
        let many: String = (0..20)
            .map(|i| format!("[[vm.kernel.net]]\ntap = \"t{i}\"\n"))
            .collect();
        let e = invalid(vm("a", &many));
        assert!(e.contains("at most 19 devices"), "{e}");
        std::fs::remove_file(&elf).unwrap();
    }

    #[test]
    fn latency_phases_need_a_duration() {
        assert_eq!(Phase::parse("latency:200").unwrap(), Phase::Latency(200));
        assert_eq!(
            Phase::parse("latency-write:50").unwrap(),
            Phase::LatencyWrite(50)
        );
        assert!(Phase::parse("latency").unwrap_err().contains("duration"));
        assert_eq!(Phase::parse("probe-merge").unwrap(), Phase::ProbeMerge(0));
        assert_eq!(
            Phase::parse("probe-merge:3000").unwrap(),
            Phase::ProbeMerge(3000)
        );
        assert!(Phase::parse("probe-merge:soon")
            .unwrap_err()
            .contains("milliseconds"));
        assert!(Phase::parse("latency-write:x")
            .unwrap_err()
            .contains("milliseconds"));
    }

    #[test]
    fn workload_disks() {
        assert_eq!(Phase::parse("disk-read").unwrap(), Phase::DiskRead(0));
        assert_eq!(Phase::parse("disk-read:16").unwrap(), Phase::DiskRead(16));
        assert!(Phase::parse("disk-read:0").unwrap_err().contains("pages"));
        assert!(Phase::parse("disk-read:x").unwrap_err().contains("pages"));
        assert_eq!(Phase::parse("build").unwrap(), Phase::Build(0));
        assert_eq!(Phase::parse("build:scattered").unwrap(), Phase::Build(0));
        assert_eq!(Phase::parse("build:linear").unwrap(), Phase::Build(1));
        assert!(Phase::parse("build:x").unwrap_err().contains("placement"));
        let img = std::env::temp_dir().join(format!("pagefold-cfg-disk-{}", std::process::id()));
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let toml = |extra: &str| {
            format!(
                "[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\nphases = [\"fill\", \"disk-read\"]\n{extra}"
            )
        };
        let c = parse(&toml(&format!(
            "disk_seed = 5\ndisks = [{{ path = {:?}, readonly = true }}]\n",
            img.display().to_string()
        )))
        .unwrap();
        c.validate(None).unwrap();
        let w = c.vms[0].workload.as_ref().unwrap();
        assert_eq!(w.disks[0].path, img);
        assert!(w.disks[0].readonly);
        assert_eq!(w.disk_seed, Some(5));
        let err = |extra: &str| {
            parse(&toml(extra))
                .unwrap()
                .validate(None)
                .unwrap_err()
                .to_string()
        };
        assert!(err("").contains("needs a disk"), "{}", err(""));
        let e = err("disks = [{ path = \"/nonexistent/disk.img\" }]\n");
        assert!(e.contains("disk image not found"), "{e}");
        let e = err(&format!(
            "disk_seed = 0\ndisks = [{{ path = {:?} }}]\n",
            img.display().to_string()
        ));
        assert!(e.contains("disk_seed"), "{e}");
        let five = format!("{{ path = {:?} }}, ", img.display().to_string()).repeat(5);
        let e = err(&format!("disks = [{five}]\n"));
        assert!(e.contains("at most 4"), "{e}");
        std::fs::remove_file(&img).unwrap();
    }

    #[test]
    fn workload_placement() {
        let toml =
            |extra: &str| format!("[[vm]]\nname = \"a\"\nmemory = 64\n[vm.workload]\n{extra}");
        let c = parse(&toml("")).unwrap();
        c.validate(None).unwrap();
        let w = c.vms[0].workload.as_ref().unwrap();
        assert_eq!(w.placement, PlacementKind::Linear);
        assert_eq!(w.placement("a"), pagefold_guest_abi::Placement::Linear);
        let c = parse(&toml("placement = \"scattered\"\nextent_pages = 8\n")).unwrap();
        c.validate(None).unwrap();
        let w = c.vms[0].workload.as_ref().unwrap();
        let pa = w.placement("a");
        assert!(matches!(
            pa,
            pagefold_guest_abi::Placement::Scattered {
                extent_pages: 8,
                ..
            }
        ));
        assert_ne!(pa, w.placement("b"), "VM names must give different seeds");
        let c = parse(&toml("placement = \"scattered\"\nplacement_seed = 9\n")).unwrap();
        let w = c.vms[0].workload.as_ref().unwrap();
        assert_eq!(
            w.placement("a"),
            pagefold_guest_abi::Placement::Scattered {
                extent_pages: 1,
                seed: 9
            }
        );
        assert_eq!(w.placement("a"), w.placement("b"));
        let err = |extra: &str| {
            parse(&toml(extra))
                .unwrap()
                .validate(None)
                .unwrap_err()
                .to_string()
        };
        let e = err("placement = \"scattered\"\nextent_pages = 0\n");
        assert!(
            e.contains("workload.extent_pages = 0 (valid range 1..=65536)"),
            "{e}"
        );
        let e = err("placement = \"scattered\"\nextent_pages = 70000\n");
        assert!(e.contains("extent_pages = 70000"), "{e}");
        let e = err("extent_pages = 8\n");
        assert!(
            e.contains("workload.extent_pages applies only to placement"),
            "{e}"
        );
        let e = err("placement = \"linear\"\nplacement_seed = 3\n");
        assert!(e.contains("workload.placement_seed applies only"), "{e}");
        let e = parse(&toml("placement = \"random\"\n")).unwrap_err();
        assert!(e.contains("unknown variant `random`"), "{e}");
        assert!("scatter"
            .parse::<PlacementKind>()
            .unwrap_err()
            .contains("linear or scattered"));
    }

    #[test]
    fn phases() {
        assert_eq!(Phase::parse("wait").unwrap(), Phase::WaitHost(600_000));
        assert_eq!(Phase::parse("sleep:5").unwrap(), Phase::Sleep(5));
        assert!(Phase::parse("sleep")
            .unwrap_err()
            .contains("needs a duration"));
        assert!(Phase::parse("fill:3")
            .unwrap_err()
            .contains("takes no argument"));
        assert!(Phase::parse("sleep:x")
            .unwrap_err()
            .contains("not a number"));
    }
}
