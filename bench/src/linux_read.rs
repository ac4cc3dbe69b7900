//! The `linux-read` benchmark (docs/benchmarks.md): two Linux guests read
//! the same files, and pagefold's engine and kernel KSM each merge what
//! they read. It is the real-guest comparison of the two: the guests' page
//! caches hold the same file data at addresses their own kernels chose,
//! which is what a workload guest only models.
//!
//! Per system, one after the other in one process: a fresh backend, two
//! agent VMs (scripts/guest-image.sh's kernel, initrd and data disk; the
//! guest agent of `pagefold_vmm::linux::agent`) booted one after the
//! other, the same read script posted to both, and `npages`
//! (`pages_sharing + zero_pages`) sampled from the moment it was posted
//! until `idle` after both replied.
//!
//! This file: the options, the systems, the VMs' configs and the pure
//! parts of the figures (md5 agreement, when the saving was reached); the
//! run loop is in `linux_read_run.rs`, the outputs in
//! `linux_read_report.rs`.

use std::path::{Path, PathBuf};

use crate::host::Ipis;
use std::time::Duration;

use pagefold_dedup::DedupSettings;
use pagefold_vmm::config::VmConfig;
use serde::{Deserialize, Serialize};

use crate::build_bench::BuildSystem;
use crate::error::BenchError;
use crate::guest_latency::GuestLatency;
use crate::linux_agents::{agent_vm, AgentSpec};
use crate::system::KSM_DEFAULT_KNOBS;

/// What the refusal message calls this command.
pub const LINUX_READ_COMMAND: &str = "pagefold bench linux-read";
/// The two VMs, in boot order.
pub const LINUX_READ_VMS: [&str; 2] = ["a", "b"];
/// Their dedup group.
pub const LINUX_READ_GROUP: &str = "linux-read";
/// Names accepted by [`select_linux_read_systems`], in run order.
pub const LINUX_READ_SYSTEM_NAMES: [&str; 8] = [
    "off",
    "pagefold-on",
    "pagefold-on-nohints",
    "pagefold-on-nolog",
    "pagefold-on-nopark",
    "pagefold-hardened",
    "ksm-4096",
    "ksm-default",
];
/// The systems run when none are named: the engine without its I/O hints
/// or without its write log only tells, when named, what each costs.
const LINUX_READ_DEFAULT: [&str; 4] = ["off", "pagefold-on", "ksm-4096", "ksm-default"];
/// The system the ratio columns compare with: kernel KSM at pagefold's
/// own knobs.
pub const RATIO_BASE: &str = "ksm-4096";

/// The agent VMs' kernel command line (the guest image's agent mode).
pub use pagefold_vmm::linux::agent::AGENT_CMDLINE;

/// What both guests run: a tmpfs copy of the 16 MiB file (anonymous guest
/// memory), a read of the 64 MiB file (page cache), and the md5 of all
/// three, which must agree between the guests.
pub const READ_SCRIPT: &str = "cp /data/random-16m.bin /tmp/copy16 && \
     cat /data/random-64m.bin >/dev/null && \
     md5sum /data/random-64m.bin /data/random-16m.bin /tmp/copy16";

/// What the read posts: the latency probe started
/// ([`crate::guest_latency::PROBE_START`]), then [`READ_SCRIPT`].
pub fn read_script() -> String {
    format!("{} && {READ_SCRIPT}", crate::guest_latency::PROBE_START)
}

/// The files [`READ_SCRIPT`] hashes, in its order.
pub const HASHED_FILES: [&str; 3] = [
    "/data/random-64m.bin",
    "/data/random-16m.bin",
    "/tmp/copy16",
];

/// Kernel KSM at the engine's default knobs (pages_to_scan 4096, sleep
/// 20 ms): the like-for-like comparison with `pagefold-on`.
pub const KSM_4096_KNOBS: DedupSettings = DedupSettings {
    pages_to_scan: Some(4096),
    sleep_millisecs: Some(20),
    ..DedupSettings::NONE
};

/// The systems named (all if `names` is empty), in run order.
/// `pagefold-on` is the engine as the VMM runs it
/// (`EngineConfig::vmm_default`, `DEFAULT_KNOBS` = 4096 pages / 20 ms).
pub fn select_linux_read_systems(names: &[String]) -> Result<Vec<BuildSystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !LINUX_READ_SYSTEM_NAMES.contains(&n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: LINUX_READ_SYSTEM_NAMES.join(", "),
        });
    }
    Ok([
        BuildSystem::Off,
        BuildSystem::PagefoldOn,
        BuildSystem::PagefoldOnNoHints,
        BuildSystem::PagefoldOnNoLog,
        BuildSystem::PagefoldOnNoPark,
        BuildSystem::PagefoldHardened,
        BuildSystem::Ksm("ksm-4096", KSM_4096_KNOBS),
        BuildSystem::Ksm("ksm-default", KSM_DEFAULT_KNOBS),
    ]
    .into_iter()
    .filter(|s| {
        if names.is_empty() {
            LINUX_READ_DEFAULT.contains(&s.name())
        } else {
            names.iter().any(|n| n == s.name())
        }
    })
    .collect())
}

#[derive(Debug, Clone)]
pub struct LinuxReadOptions {
    /// scripts/guest-image.sh's output: `vmlinux`, `initrd.img` (with the
    /// agent) and `data.ext4` (the files both guests read).
    pub guest_dir: PathBuf,
    /// Guest RAM per VM (config syntax: "384M").
    pub memory: String,
    pub sample_interval: Duration,
    /// How long to keep sampling after both guests replied.
    pub idle: Duration,
    /// Longest one system may take (both boots, the read and `idle`).
    pub timeout: Duration,
    /// Where the mailboxes and console logs go (default: a new directory
    /// under the system's temporary directory).
    pub work_dir: Option<PathBuf>,
    pub progress: bool,
}

impl Default for LinuxReadOptions {
    fn default() -> Self {
        Self {
            guest_dir: PathBuf::from("target/guest-img"),
            memory: "384M".into(),
            sample_interval: Duration::from_secs(1),
            idle: Duration::from_secs(120),
            timeout: Duration::from_secs(900),
            work_dir: None,
            progress: true,
        }
    }
}

impl LinuxReadOptions {
    pub fn kernel(&self) -> PathBuf {
        self.guest_dir.join("vmlinux")
    }

    pub fn initrd(&self) -> PathBuf {
        self.guest_dir.join("initrd.img")
    }

    pub fn data_disk(&self) -> PathBuf {
        self.guest_dir.join("data.ext4")
    }

    /// The directory this run's files go to.
    pub(crate) fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("pagefold-linux-read-{}", std::process::id()))
        })
    }
}

/// One VM's files for one system.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentFiles {
    /// Its mailbox (`/dev/vdb`, written by the host).
    pub mailbox: PathBuf,
    /// Its serial console log.
    pub console: PathBuf,
}

/// The files of VM `vm` for `system` under `dir`.
pub fn agent_files(dir: &Path, system: &str, vm: &str) -> AgentFiles {
    AgentFiles {
        mailbox: dir.join(format!("{system}-{vm}.mbox")),
        console: dir.join(format!("{system}-{vm}.console")),
    }
}

pub use pagefold_vmm::host_kind::linux_vm_cpu as vm_cpu;

/// One agent VM: 1 vCPU, the data disk read-only then its mailbox
/// writable, its console to a file, in the benchmark's dedup group (of
/// `security`).
pub fn agent_vm_config(
    opts: &LinuxReadOptions,
    name: &str,
    files: &AgentFiles,
    cpu: Option<usize>,
    security: pagefold_dedup::Security,
) -> VmConfig {
    let spec = AgentSpec {
        guest_dir: &opts.guest_dir,
        memory: &opts.memory,
        group: LINUX_READ_GROUP,
        security,
        balloon: None,
    };
    agent_vm(&spec, name, &files.mailbox, &files.console, cpu)
}

/// The md5 sums one guest printed for [`HASHED_FILES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Md5s {
    pub random_64m: String,
    pub random_16m: String,
    pub copy16: String,
}

/// The sums in the output of [`READ_SCRIPT`]: `md5sum`'s `HASH  PATH`
/// lines, among whatever else reached the console meanwhile (kernel
/// messages). Err names what is missing.
pub fn parse_md5s(output: &str) -> Result<Md5s, String> {
    let mut found: [Option<String>; 3] = Default::default();
    for line in output.lines() {
        let mut words = line.split_whitespace();
        let (Some(hash), Some(path), None) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let is_md5 = hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit());
        if let (true, Some(i)) = (is_md5, HASHED_FILES.iter().position(|f| *f == path)) {
            found[i].get_or_insert_with(|| hash.to_ascii_lowercase());
        }
    }
    match found {
        [Some(random_64m), Some(random_16m), Some(copy16)] => Ok(Md5s {
            random_64m,
            random_16m,
            copy16,
        }),
        _ => {
            let missing: Vec<&str> = HASHED_FILES
                .iter()
                .zip(&found)
                .filter(|(_, h)| h.is_none())
                .map(|(f, _)| *f)
                .collect();
            Err(format!("no md5 line for {}", missing.join(", ")))
        }
    }
}

/// The guests' data is intact: both printed the same sums, each one's
/// tmpfs copy has the file's sum, and (given) they are the sums the first
/// system's guests printed (every system reads the same disk).
pub fn md5s_agree(a: &Md5s, b: &Md5s, reference: Option<&Md5s>) -> bool {
    a == b && a.copy16 == a.random_16m && reference.is_none_or(|r| r == a)
}

/// One observation, `t_s` seconds after the read script was posted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinuxReadSample {
    pub t_s: f64,
    /// `pages_sharing + zero_pages`.
    pub npages: u64,
    pub pages_sharing: u64,
    pub zero_pages: u64,
}

/// The share of the final `npages` at which a system counts as done:
/// `npages` creeps on by a few pages for a long time (guest kernels keep
/// writing), so the first time it reaches its final value says little.
pub const T_FINAL_SHARE: f64 = 0.95;

/// The first sample time at which `npages` reached [`T_FINAL_SHARE`] of
/// `final_npages`; None when nothing was merged.
pub fn t_final_s(samples: &[LinuxReadSample], final_npages: u64) -> Option<f64> {
    if final_npages == 0 {
        return None;
    }
    let want = T_FINAL_SHARE * final_npages as f64;
    samples
        .iter()
        .find(|s| s.npages as f64 >= want)
        .map(|s| s.t_s)
}

/// One system's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxReadRow {
    pub system: String,
    /// `hardware`, `pvm`, `emulated-svm` or `other` (times compare only
    /// within one run under emulation).
    pub host_kind: String,
    /// The host kernel's release.
    pub host_kernel: String,
    /// `pages_sharing + zero_pages` at the end (KSM with use_zero_pages 0
    /// counts zero pages in `pages_sharing`, pagefold apart: the sum is
    /// the same saving for both).
    pub npages: u64,
    pub pages_sharing: u64,
    pub zero_pages: u64,
    /// Largest `npages` of any sample.
    pub peak_npages: u64,
    /// First sample time at which `npages` reached 95 % of its final value
    /// (s after the read script was posted).
    pub t_final_s: Option<f64>,
    /// Merging-side CPU from the post to the end (`stats().cpu_seconds`:
    /// the engine's threads, or ksmd's utime+stime).
    pub engine_cpu_s: f64,
    /// The same from the backend's start (both boots included).
    pub engine_cpu_total_s: f64,
    /// pagefold's COW breaks from the post to the end (KSM does not
    /// count them: 0).
    pub cow_breaks: u64,
    /// pagefold's merges from the post to the end (0 for KSM, whose
    /// `merges` is a level, not a count).
    pub merges: u64,
    /// pagefold's KSM assist at the end (`off`, `standby`, `engaged ...`;
    /// empty for other backends) and the part of `pages_sharing` kernel
    /// KSM shares for it: what of pagefold's saving came from ksmd.
    pub ksm_assist: String,
    pub ksm_pages_sharing: u64,
    /// From adding each VM to its agent's ready line.
    pub boot_a_s: f64,
    pub boot_b_s: f64,
    /// From the post to each VM's reply, as the host saw it (the agent
    /// polls every 0.3 s; the host's loop every 0.1 s), and the later one.
    pub read_a_s: f64,
    pub read_b_s: f64,
    pub read_s: f64,
    /// See [`md5s_agree`].
    pub md5s_agree: bool,
    /// What each VM printed.
    pub md5_a: Md5s,
    pub md5_b: Md5s,
    /// TLB-shootdown and rescheduling interrupts the host's CPUs took from
    /// the backend's start to the end (both boots included; None where
    /// `/proc/interrupts` lacks them). Each one taken on a CPU that runs
    /// a vCPU is an exit from the guest; a merger that changes the VMM's
    /// page tables causes the shootdowns, ksmd's merges cause them too.
    pub ipis: Option<Ipis>,
    /// The guests' RAM at the end, both VMs paused (`page_census`): the
    /// duplicates a merger left unshared, counted alike for every
    /// backend. None where pagemap hides frames (not root), and in
    /// reports from before it was measured.
    #[serde(default)]
    pub census: Option<crate::page_census::PageCensus>,
    /// Each guest's timer wake-up latency from before the read to the
    /// end of the idle window (`guest_latency`); None in reports from
    /// before it was measured.
    #[serde(default)]
    pub latency_a: Option<GuestLatency>,
    #[serde(default)]
    pub latency_b: Option<GuestLatency>,
    /// The worse guest's p99, p99.9 and maximum wake-up latency, µs.
    #[serde(default)]
    pub p99_us: Option<f64>,
    #[serde(default)]
    pub p999_us: Option<f64>,
    #[serde(default)]
    pub max_us: Option<f64>,
    /// The stops the engine's parks caused (`vmm::pause`: one per vCPU
    /// kept waiting, as long as it waited), both guests together: how
    /// many, their total length and the longest. None in reports from
    /// before they were recorded.
    #[serde(default)]
    pub parks: Option<u64>,
    #[serde(default)]
    pub parked_s: Option<f64>,
    #[serde(default)]
    pub park_max_us: Option<f64>,
    /// Writes that waited for one of the engine's merges in flight (once
    /// per merge window), and the longest wait, µs: a vCPU so waiting
    /// takes no interrupt, which its wake-up latency shows. None for
    /// kernel KSM and in reports from before they were recorded.
    #[serde(default)]
    pub write_waits: Option<u64>,
    #[serde(default)]
    pub write_wait_max_us: Option<f64>,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
    pub samples: Vec<LinuxReadSample>,
}

/// What was run on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxReadGuest {
    pub kernel: String,
    pub initrd: String,
    pub data_disk: String,
    pub memory: String,
    pub cmdline: String,
    pub script: String,
    pub sample_interval_s: f64,
    pub idle_s: f64,
    /// vCPU pinning of a and b (emulated host only, [`vm_cpu`]).
    pub vm_cpus: [Option<usize>; 2],
    /// The console logs of every VM of every system.
    pub console_dir: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxReadReport {
    pub host_kind: String,
    pub host_kernel: String,
    /// `vm.max_map_count` during the run (0: not recorded).
    #[serde(default)]
    pub max_map_count: u64,
    pub guest: LinuxReadGuest,
    pub rows: Vec<LinuxReadRow>,
    pub unrestored: Vec<String>,
}

impl LinuxReadReport {
    /// Every system's guests read intact data.
    pub fn md5s_agree(&self) -> bool {
        self.rows.iter().all(|r| r.md5s_agree)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pagefold_vmm::config::{DiskConfig, SerialOutput};

    const H64: &str = "0123456789abcdef0123456789abcdef";
    const H16: &str = "fedcba9876543210fedcba9876543210";

    fn md5sum_output(h64: &str, h16: &str, copy: &str) -> String {
        format!("{h64}  /data/random-64m.bin\n{h16}  /data/random-16m.bin\n{copy}  /tmp/copy16\n")
    }

    #[test]
    fn selects_systems_in_run_order_with_the_same_knobs_for_ksm_4096() {
        let all = select_linux_read_systems(&[]).unwrap();
        let names: Vec<_> = all.iter().map(|s| s.name()).collect();
        assert_eq!(names, LINUX_READ_DEFAULT);
        // The engine without hints or log runs only when named, in order.
        let named = select_linux_read_systems(&[
            "pagefold-on-nolog".into(),
            "pagefold-on".into(),
            "pagefold-on-nohints".into(),
        ])
        .unwrap();
        assert_eq!(
            named,
            [
                BuildSystem::PagefoldOn,
                BuildSystem::PagefoldOnNoHints,
                BuildSystem::PagefoldOnNoLog
            ]
        );
        let two = select_linux_read_systems(&["ksm-default".into(), "pagefold-on".into()]).unwrap();
        assert_eq!(
            two,
            [
                BuildSystem::PagefoldOn,
                BuildSystem::Ksm("ksm-default", KSM_DEFAULT_KNOBS)
            ]
        );
        let e = select_linux_read_systems(&["ksm-10000".into()]).unwrap_err();
        assert!(e.to_string().contains("ksm-4096"), "{e}");
        // ksm-4096 is the engine's own setting: the comparison is like for
        // like only while the engine's defaults stay these.
        let d = pagefold_dedup::DEFAULT_KNOBS;
        assert_eq!(
            (Some(d.pages_to_scan), Some(d.sleep_millisecs)),
            (KSM_4096_KNOBS.pages_to_scan, KSM_4096_KNOBS.sleep_millisecs)
        );
    }

    /// A guest directory `dir/guest` whose files pass the VMM's config
    /// check: it reads the kernel's ELF magic; the rest is not loaded.
    pub(crate) fn fake_guest_dir(dir: &Path) -> PathBuf {
        let guest = dir.join("guest");
        std::fs::create_dir(&guest).unwrap();
        std::fs::write(guest.join("vmlinux"), b"\x7fELF\x02\x01\x01").unwrap();
        std::fs::write(guest.join("initrd.img"), b"initrd").unwrap();
        std::fs::write(guest.join("data.ext4"), vec![0u8; 4096]).unwrap();
        guest
    }

    #[test]
    fn agent_vms_boot_the_guest_image_with_a_mailbox_each() {
        let dir = tempfile::tempdir().unwrap();
        let guest = fake_guest_dir(dir.path());
        let opts = LinuxReadOptions {
            guest_dir: guest.clone(),
            ..LinuxReadOptions::default()
        };
        let a = agent_files(dir.path(), "ksm-4096", "a");
        let b = agent_files(dir.path(), "ksm-4096", "b");
        assert_ne!(a, b);
        assert!(b.console.ends_with("ksm-4096-b.console"));
        let configs = [
            agent_vm_config(&opts, "a", &a, vm_cpu(true, 0, 2), Default::default()),
            agent_vm_config(&opts, "b", &b, vm_cpu(true, 1, 2), Default::default()),
        ];
        assert_eq!(configs[0].dedup_group(), configs[1].dedup_group());
        assert_eq!(configs[0].dedup_group(), LINUX_READ_GROUP);
        for ((c, f), cpu) in configs.iter().zip([&a, &b]).zip([0, 1]) {
            pagefold_vmm::linux::agent::Mailbox::create(&f.mailbox).unwrap();
            c.validate().unwrap();
            assert_eq!((c.vcpus, c.memory_bytes()), (1, 384 << 20));
            assert!(c.dedup.enabled && c.workload.is_none());
            assert_eq!(c.serial, SerialOutput::File(f.console.clone()));
            assert_eq!(c.vcpu_affinity, Some(vec![cpu]));
            let k = c.kernel.as_ref().unwrap();
            assert_eq!(k.path, guest.join("vmlinux"));
            assert_eq!(k.initrd, Some(guest.join("initrd.img")));
            assert_eq!(k.cmdline, AGENT_CMDLINE);
            assert_eq!(
                k.disks,
                [
                    DiskConfig {
                        path: guest.join("data.ext4"),
                        readonly: true
                    },
                    DiskConfig {
                        path: f.mailbox.clone(),
                        readonly: false
                    }
                ]
            );
        }
    }

    #[test]
    fn reads_the_sums_among_console_noise() {
        let out = format!(
            "[   12.3] random: crng init done\n{}",
            md5sum_output(H64, &H16.to_uppercase(), H16)
        );
        let m = parse_md5s(&out).unwrap();
        assert_eq!(
            m,
            Md5s {
                random_64m: H64.into(),
                random_16m: H16.into(),
                copy16: H16.into()
            }
        );
        // A missing or malformed line is named.
        let e =
            parse_md5s(&format!("{H64}  /data/random-64m.bin\nxyz  /tmp/copy16\n")).unwrap_err();
        assert_eq!(
            e, "no md5 line for /data/random-16m.bin, /tmp/copy16",
            "{e}"
        );
        let e = parse_md5s("md5sum: /tmp/copy16: No such file or directory\n").unwrap_err();
        assert!(e.contains("/data/random-64m.bin"), "{e}");
        // A third word is not md5sum's line.
        let odd = format!("{H64}  /data/random-64m.bin extra\n");
        assert!(parse_md5s(&odd).is_err());
    }

    #[test]
    fn sums_agree_only_when_both_guests_and_the_copy_match() {
        let good = parse_md5s(&md5sum_output(H64, H16, H16)).unwrap();
        assert!(md5s_agree(&good, &good.clone(), None));
        assert!(md5s_agree(&good, &good, Some(&good)));
        // One guest read other data.
        let other = parse_md5s(&md5sum_output(H16, H16, H16)).unwrap();
        assert!(!md5s_agree(&good, &other, None));
        // Both guests' copies went wrong the same way.
        let bad_copy = parse_md5s(&md5sum_output(H64, H16, H64)).unwrap();
        assert!(!md5s_agree(&bad_copy, &bad_copy, None));
        // Alike, but not what the first system's guests read.
        assert!(!md5s_agree(&other, &other, Some(&good)));
    }

    #[test]
    fn t_final_is_the_first_sample_at_95_percent_of_the_end() {
        let s = |t_s: f64, npages: u64| LinuxReadSample {
            t_s,
            npages,
            pages_sharing: npages,
            zero_pages: 0,
        };
        let samples = [
            s(0.0, 0),
            s(1.0, 500),
            s(2.0, 949),
            s(3.0, 950),
            s(4.0, 1000),
        ];
        assert_eq!(t_final_s(&samples, 1000), Some(3.0));
        // A peak above the final value counts from where it passed 95 %.
        let peaked = [s(0.0, 0), s(1.0, 1200), s(2.0, 1000)];
        assert_eq!(t_final_s(&peaked, 1000), Some(1.0));
        assert_eq!(t_final_s(&samples, 0), None);
        assert_eq!(t_final_s(&[], 10), None);
        // Reached at t = 0 (e.g. merged during the boots).
        assert_eq!(t_final_s(&[s(0.0, 10), s(1.0, 10)], 10), Some(0.0));
    }
}
