//! The real-Linux form of the `build` benchmark (docs/benchmarks.md): two
//! Linux VMs, each booted from its own copy of one disk image made by
//! scripts/linux-build-bench.sh, run `make -j$(nproc) TARGETS` in the
//! Debian kernel source (configured as tinyconfig in the image; TARGETS
//! from the image, `mm/` by default) side by side, `runs` times per system. `real`
//! comes from the guests' result lines; `user`, `sys`, engine CPU and
//! `npages` are measured on the host exactly as in the workload form, and
//! fill the same table.
//!
//! Needs hardware virtualization: on a PVM host it refuses before touching
//! anything ([`pagefold_vmm::host_kind`]).
//!
//! This file: the options, the two VMs' configs and the report's types;
//! the run loop is in `build_linux_run.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pagefold_vmm::config::{DiskConfig, KernelConfig, SerialOutput, SizeValue, VmConfig, VmDedup};
use serde::{Deserialize, Serialize};

use crate::build_bench::BuildRow;
use crate::linux_result::LinuxBuildResult;

/// The init program scripts/linux-build-bench.sh installs in the image.
pub const BUILD_INIT: &str = "/pagefold-build-init";
/// The dedup group of the two VMs.
pub const LINUX_BUILD_GROUP: &str = "linux-build";
/// The two VMs' names.
pub const LINUX_BUILD_VMS: [&str; 2] = ["linux-a", "linux-b"];
/// What the refusal message calls this command.
pub const LINUX_BUILD_COMMAND: &str = "pagefold bench build --guest linux";

#[derive(Debug, Clone)]
pub struct LinuxBuildOptions {
    /// Kernel (vmlinux or bzImage) and initrd: scripts/guest-image.sh's,
    /// whose initrd loads the virtio modules and switches to `root=`.
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// The image scripts/linux-build-bench.sh made; each VM gets a copy.
    pub disk: PathBuf,
    /// Guest RAM per VM (config syntax: "2G", "2048M").
    pub memory: String,
    pub vcpus: u8,
    /// Runs per system.
    pub runs: usize,
    pub sample_interval: Duration,
    /// Longest one run may take (boot, unpacking and the build).
    pub timeout: Duration,
    /// pagefold-auto: the scripted free memory drops below the threshold
    /// this long after both builds started (the guests report no progress
    /// to trigger on, unlike the workload form).
    pub auto_trigger_after: Duration,
    /// Where the disk copies and console logs go (default: the disk's
    /// directory, so a copy can be a reflink).
    pub work_dir: Option<PathBuf>,
    /// What the guests build (kbuild targets such as `mm/` or `vmlinux`);
    /// None: the image's default (scripts/linux-build-bench.sh).
    pub targets: Vec<String>,
    /// Each VM gets a balloon with free page reporting
    /// ([`crate::linux_free::reporting_balloon`]): what a guest frees goes
    /// back to the host, and the engine leaves it alone until the guest
    /// writes it again. Every system of the run gets it, KSM's too.
    pub free_page_reporting: bool,
    pub progress: bool,
}

impl LinuxBuildOptions {
    pub fn new(kernel: PathBuf, disk: PathBuf) -> Self {
        Self {
            kernel,
            initrd: None,
            disk,
            memory: "2G".into(),
            vcpus: 2,
            runs: 5,
            sample_interval: Duration::from_millis(500),
            timeout: Duration::from_secs(3 * 3600),
            auto_trigger_after: Duration::from_secs(60),
            work_dir: None,
            targets: Vec::new(),
            free_page_reporting: false,
            progress: true,
        }
    }

    pub(crate) fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            self.disk
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        })
    }
}

/// The guests' kernel command line: the disk is the root filesystem, the
/// build script is init, and after its result line the guest waits `hold`
/// (`pagefold.hold=`, read by the init script) so its memory is still in
/// place when the host reads the end-of-build figures; the host stops it.
/// `targets`, when given, replace the image's default build targets
/// (`pagefold.make=`). `tsc=reliable`: under the emulated host, on a
/// loaded machine, a guest's clocksource watchdog saw its TSC skew
/// against kvm-clock, switched to kvm-clock, and the guest printed nothing
/// more (twice in six systems' runs, off and ksm-10000 among them); on a
/// real host the TSC is reliable and the flag changes nothing.
pub fn linux_build_cmdline(hold: Duration, targets: &[String]) -> String {
    let mut c = format!(
        "console=ttyS0 panic=-1 tsc=reliable root=/dev/vda rw init={BUILD_INIT} pagefold.hold={}",
        hold.as_secs()
    );
    if !targets.is_empty() {
        c.push_str(" pagefold.make=");
        c.push_str(&targets.join(","));
    }
    c
}

/// One VM's files for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct VmFiles {
    /// Its private copy of the image.
    pub disk: PathBuf,
    /// Its serial console log.
    pub console: PathBuf,
}

/// The files of run `run` of `system` under `dir` (one per VM).
pub fn linux_vm_files(dir: &Path, system: &str, run: usize) -> Vec<VmFiles> {
    LINUX_BUILD_VMS
        .iter()
        .map(|vm| VmFiles {
            disk: dir.join(format!("{vm}.img")),
            console: dir.join(format!("{system}-run{}-{vm}.console", run + 1)),
        })
        .collect()
}

/// The two VMs: same kernel and initrd, each its own writable disk copy
/// and console file, one dedup group. `cpus[n]`: the host CPU the n-th
/// VM's vCPUs are pinned to, if any
/// ([`pagefold_vmm::host_kind::linux_vm_cpu`]: under the emulated host).
pub fn linux_build_configs(
    opts: &LinuxBuildOptions,
    files: &[VmFiles],
    cpus: [Option<usize>; 2],
) -> Vec<VmConfig> {
    LINUX_BUILD_VMS
        .iter()
        .zip(files)
        .zip(cpus)
        .map(|((name, f), cpu)| VmConfig {
            name: (*name).into(),
            vcpus: opts.vcpus,
            memory: SizeValue::Text(opts.memory.clone()),
            serial: SerialOutput::File(f.console.clone()),
            dedup: VmDedup {
                enabled: true,
                group: Some(LINUX_BUILD_GROUP.into()),
                security: Default::default(),
            },
            workload: None,
            kernel: Some(KernelConfig {
                path: opts.kernel.clone(),
                initrd: opts.initrd.clone(),
                cmdline: linux_build_cmdline(opts.timeout, &opts.targets),
                disks: vec![DiskConfig {
                    path: f.disk.clone(),
                    readonly: false,
                }],
                net: Vec::new(),
                balloon: opts
                    .free_page_reporting
                    .then(crate::linux_free::reporting_balloon),
            }),
            vcpu_affinity: cpu.map(|c| vec![c]),
        })
        .collect()
}

/// What was run on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxGuestInfo {
    pub kernel: String,
    pub initrd: Option<String>,
    pub disk: String,
    pub disk_bytes: u64,
    pub memory: String,
    pub vcpus: u8,
    pub cmdline: String,
    /// Console logs of every VM of every run.
    pub console_dir: String,
    /// What the guests built (kbuild targets, from their start lines).
    #[serde(default)]
    pub targets: Option<String>,
    /// The objects' hash every build is compared with (the first build's).
    pub reference_sha256: Option<String>,
    /// The VMs had balloons with free page reporting (rows from before
    /// the option: false).
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// One guest's result line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxVmResult {
    pub system: String,
    pub run: usize,
    pub vm: String,
    pub result: LinuxBuildResult,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxBuildReport {
    pub guest: LinuxGuestInfo,
    /// The same rows as the workload form's (`checksums agree`: every
    /// build produced the reference objects).
    pub rows: Vec<BuildRow>,
    pub results: Vec<LinuxVmResult>,
    pub unrestored: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk_copy::copy_disk;

    #[test]
    fn configs_boot_the_kernel_from_a_private_disk_copy_each() {
        let dir = std::env::temp_dir().join(format!("pagefold-linux-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        let initrd = dir.join("initrd.img");
        let disk = dir.join("build.ext4");
        // The config check reads the ELF magic; the rest is not loaded.
        std::fs::write(&kernel, b"\x7fELF\x02\x01\x01").unwrap();
        std::fs::write(&initrd, b"initrd").unwrap();
        std::fs::write(&disk, vec![0u8; 4096]).unwrap();
        let opts = LinuxBuildOptions {
            initrd: Some(initrd.clone()),
            ..LinuxBuildOptions::new(kernel.clone(), disk.clone())
        };
        let files = linux_vm_files(&dir, "ksm-10000", 1);
        assert_eq!(files.len(), 2);
        assert_ne!(files[0].disk, files[1].disk);
        assert_ne!(files[0].console, files[1].console);
        assert!(files.iter().all(|f| f.disk != disk));
        assert!(files[1].console.ends_with("ksm-10000-run2-linux-b.console"));
        for f in &files {
            copy_disk(&disk, &f.disk).unwrap();
        }
        let c = linux_build_configs(&opts, &files, [None, Some(1)]);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].dedup_group(), c[1].dedup_group());
        assert_eq!(c[0].dedup_group(), LINUX_BUILD_GROUP);
        assert_eq!(c[0].vcpu_affinity, None);
        assert_eq!(c[1].vcpu_affinity, Some(vec![1]));
        for (v, f) in c.iter().zip(&files) {
            v.validate().unwrap();
            assert!(v.workload.is_none());
            assert_eq!(v.vcpus, 2);
            assert_eq!(v.memory_bytes(), 2 << 30);
            assert!(v.dedup.enabled);
            assert_eq!(v.serial, SerialOutput::File(f.console.clone()));
            let k = v.kernel.as_ref().unwrap();
            assert_eq!((&k.path, k.initrd.as_ref()), (&kernel, Some(&initrd)));
            assert_eq!(
                k.disks,
                [DiskConfig {
                    path: f.disk.clone(),
                    readonly: false
                }]
            );
            let words: Vec<&str> = k.cmdline.split_whitespace().collect();
            for w in [
                "console=ttyS0",
                "tsc=reliable",
                "root=/dev/vda",
                "rw",
                "init=/pagefold-build-init",
            ] {
                assert!(words.contains(&w), "{w} missing from {:?}", k.cmdline);
            }
            // The guest holds its memory until the host stops it, at most
            // as long as a run may take.
            assert!(words.contains(&"pagefold.hold=10800"), "{:?}", k.cmdline);
            assert!(!k.cmdline.contains("pagefold.make="), "{:?}", k.cmdline);
            assert_eq!(k.balloon, None);
        }
        // With free page reporting every VM gets a reporting balloon.
        let fpr = LinuxBuildOptions {
            free_page_reporting: true,
            ..opts.clone()
        };
        for v in linux_build_configs(&fpr, &files, [None, None]) {
            v.validate().unwrap();
            let b = v
                .kernel
                .as_ref()
                .unwrap()
                .balloon
                .clone()
                .expect("a balloon");
            assert!(b.free_page_reporting, "{b:?}");
        }
        let two = vec!["mm/".to_string(), "vmlinux".to_string()];
        assert!(linux_build_cmdline(Duration::from_secs(1), &two)
            .ends_with(" pagefold.make=mm/,vmlinux"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn work_dir_defaults_to_the_disks_directory() {
        let o = LinuxBuildOptions::new("k".into(), "/var/tmp/pf/build.ext4".into());
        assert_eq!(o.work_dir(), PathBuf::from("/var/tmp/pf"));
        let o = LinuxBuildOptions::new("k".into(), "build.ext4".into());
        assert_eq!(o.work_dir(), PathBuf::from("."));
    }
}
