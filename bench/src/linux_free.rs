//! The `linux-free` benchmark (docs/benchmarks.md): two identical Linux
//! guests (one dedup group) do the same work, hold it a while, free most
//! of it and idle; the host memory they cost is measured all along, with
//! dedup and free page reporting (the balloon) each on or off, and beside
//! kernel KSM with reporting. Issue 37's goals: with both on, the guests
//! cost at most what dedup alone costs minus what they freed; reporting
//! brings 90 % of what a guest frees back to the host within 5 s; the data
//! they kept is intact.
//!
//! This file: the options, the systems, the guests' scripts and the pure
//! parts of the figures (the replies' parsing, what was freed, how soon
//! it came back); the run loop is in `linux_free_run.rs`, the outputs in
//! `linux_free_report.rs`.

use std::path::PathBuf;
use std::time::Duration;

use pagefold_vmm::config::{BalloonConfig, VmConfig};
use serde::{Deserialize, Serialize};

use crate::build_bench::BuildSystem;
use crate::error::BenchError;
use crate::linux_agents::{agent_vm, AgentSpec};
use crate::linux_read::{AgentFiles, KSM_4096_KNOBS};

/// A balloon for free page reporting only: no statistics (the benchmarks
/// read none), deflate on OOM as a Linux guest expects. The benchmarks
/// that give their guests one (`linux-free`, `build --free-page-reporting`)
/// use this.
pub fn reporting_balloon() -> BalloonConfig {
    BalloonConfig {
        free_page_reporting: true,
        stats_interval_s: 0,
        deflate_on_oom: true,
    }
}

/// What the refusal message calls this command.
pub const LINUX_FREE_COMMAND: &str = "pagefold bench linux-free";
/// The guests' dedup group.
pub const LINUX_FREE_GROUP: &str = "linux-free";

/// One system: a dedup backend, and free page reporting on or off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FreeSystem {
    pub name: &'static str,
    /// The backend (`Off`: none).
    pub backend: BuildSystem,
    /// The guests get a balloon with free page reporting.
    pub reporting: bool,
}

impl FreeSystem {
    /// Whether a backend merges the guests' pages.
    pub fn dedup(&self) -> bool {
        self.backend != BuildSystem::Off
    }
}

/// Every system, in run order: dedup off / pagefold / kernel KSM, each
/// without and with free page reporting (KSM only with it: the issue's
/// baseline is KSM with a balloon).
pub const LINUX_FREE_SYSTEMS: [FreeSystem; 5] = [
    FreeSystem {
        name: "off",
        backend: BuildSystem::Off,
        reporting: false,
    },
    FreeSystem {
        name: "pagefold-on",
        backend: BuildSystem::PagefoldOn,
        reporting: false,
    },
    FreeSystem {
        name: "fpr",
        backend: BuildSystem::Off,
        reporting: true,
    },
    FreeSystem {
        name: "pagefold-fpr",
        backend: BuildSystem::PagefoldOn,
        reporting: true,
    },
    FreeSystem {
        name: "ksm-fpr",
        backend: BuildSystem::Ksm("ksm-fpr", KSM_4096_KNOBS),
        reporting: true,
    },
];

/// The systems named (all if `names` is empty), in run order.
pub fn select_linux_free_systems(names: &[String]) -> Result<Vec<FreeSystem>, BenchError> {
    if let Some(bad) = names
        .iter()
        .find(|n| !LINUX_FREE_SYSTEMS.iter().any(|s| s.name == n.as_str()))
    {
        return Err(BenchError::UnknownSystem {
            name: bad.clone(),
            known: LINUX_FREE_SYSTEMS.map(|s| s.name).join(", "),
        });
    }
    Ok(LINUX_FREE_SYSTEMS
        .into_iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name))
        .collect())
}

/// MiB of tmpfs each guest fills with a copy of the 64 MiB data file
/// (identical in both guests) and frees.
pub const SHARED_MIB: u64 = 64;
/// MiB of random bytes each guest writes to tmpfs, its own, and frees.
pub const OWN_MIB: u64 = 32;
/// MiB each guest keeps to the end: a copy of the 16 MiB data file
/// (identical) and random bytes of its own.
pub const KEEP_SHARED_MIB: u64 = 16;
pub const KEEP_OWN_MIB: u64 = 8;
/// Of what the two guests free, the MiB whose content dedup alone holds
/// once for several copies: each guest drops the page caches of both data
/// files and removes its tmpfs copy of the 64 MiB one, so four copies of
/// the 64 MiB file's content go, of which dedup held one frame each (three
/// copies' worth were never on the host), and both page caches of the
/// 16 MiB file go, whose content the kept copies still hold (dedup held
/// it, and holds it still). Freeing these gives dedup alone nothing back.
pub const DUPLICATE_FREED_MIB: u64 = 3 * SHARED_MIB + 2 * KEEP_SHARED_MIB;

/// The work, the same in both guests: a tmpfs, the 64 MiB data file
/// copied there (its page cache filled on the way), the 16 MiB one too
/// (kept), random bytes of each guest's own (freed, and a kept part), and
/// the sums of what is kept. With `reporting_order`, the guest's free
/// page reporting is first set to report free blocks of 2^order pages
/// and up (Linux's `page_reporting_order`; its default on x86 is 9, 2 MiB
/// blocks).
pub fn work_script(reporting_order: Option<u32>) -> String {
    let order = reporting_order.map_or(String::new(), |o| {
        format!("echo {o} >{REPORTING_ORDER} && ")
    });
    format!(
        "{order}mkdir -p /mnt/w && mount -t tmpfs -o size=400m tmpfs /mnt/w && \
         cp /data/random-64m.bin /mnt/w/shared && \
         cp /data/random-16m.bin /mnt/w/keep && \
         dd if=/dev/urandom of=/mnt/w/own bs=1M count={OWN_MIB} 2>/dev/null && \
         dd if=/dev/urandom of=/mnt/w/keepown bs=1M count={KEEP_OWN_MIB} 2>/dev/null && \
         {SUMS} && echo \"data16=$(md5sum </data/random-16m.bin | cut -d' ' -f1)\""
    )
}

/// The guest kernel's knob for the smallest free block it reports.
pub const REPORTING_ORDER: &str = "/sys/module/page_reporting/parameters/page_reporting_order";

/// The sums of the kept files, as `keep=HASH keepown=HASH` lines.
const SUMS: &str = "echo \"keep=$(md5sum </mnt/w/keep | cut -d' ' -f1)\" && \
     echo \"keepown=$(md5sum </mnt/w/keepown | cut -d' ' -f1)\"";

/// The guest's free memory in KiB, as a shell expression: `MemFree` of
/// `/proc/meminfo` plus the pages on the per-CPU free lists
/// (`/proc/zoneinfo`'s `count:` lines), which `MemFree` leaves out. Linux
/// keeps freed pages on those lists up to each list's `high` (about
/// 35 MiB in a 384 MiB guest), so `MemFree` alone can miss that much of a
/// free.
const FREE_KIB: &str = "$(( $(sed -n 's/^MemFree: *\\([0-9]*\\) kB$/\\1/p' /proc/meminfo) + \
     4 * $(awk '$1 == \"count:\" {n += $2} END {print n + 0}' /proc/zoneinfo) ))";

/// The free: the tmpfs copy and the own bytes removed, the page cache
/// dropped; the free memory before and after (what the guest freed, as
/// it sees it; free page reporting leaves reported pages free in the
/// guest).
pub fn free_script() -> String {
    format!(
        "b={FREE_KIB} && rm /mnt/w/shared /mnt/w/own && sync && \
         echo 3 >/proc/sys/vm/drop_caches && a={FREE_KIB} && \
         echo \"free_before_kib=$b free_after_kib=$a\""
    )
}

/// The check at the end: the kept files' sums again.
pub fn check_script() -> String {
    SUMS.to_string()
}

/// What a guest's work reply says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// The kept copy of the 16 MiB file, its own bytes, and the data file
    /// itself.
    pub keep: String,
    pub keepown: String,
    #[serde(default)]
    pub data16: String,
}

fn md5_value(output: &str, key: &str) -> Result<String, String> {
    let v = output
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .ok_or_else(|| format!("no {key}= in the reply"))?;
    if v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(v.to_ascii_lowercase())
    } else {
        Err(format!("{key}={v} is not an md5 sum"))
    }
}

/// The sums of a work reply (with `data16`) or of the check's (without).
pub fn parse_kept(output: &str, with_data: bool) -> Result<Kept, String> {
    Ok(Kept {
        keep: md5_value(output, "keep")?,
        keepown: md5_value(output, "keepown")?,
        data16: if with_data {
            md5_value(output, "data16")?
        } else {
            String::new()
        },
    })
}

/// MiB a guest freed, from its free reply: free memory after less before
/// (never below 0).
pub fn parse_freed_mib(output: &str) -> Result<f64, String> {
    let kib = |key: &str| -> Result<u64, String> {
        output
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .ok_or_else(|| format!("no {key}= in the reply"))?
            .parse()
            .map_err(|e| format!("{key}: {e}"))
    };
    let (b, a) = (kib("free_before_kib")?, kib("free_after_kib")?);
    Ok(a.saturating_sub(b) as f64 / 1024.0)
}

/// The kept data is intact: each guest's check repeats its work sums, the
/// kept copy has the data file's sum, both guests read the same data
/// file, and (given) the first system's guests did too.
pub fn kept_intact(work: &[Kept; 2], check: &[Kept; 2], reference: Option<&str>) -> bool {
    work.iter().zip(check).all(|(w, c)| {
        w.keep == c.keep && w.keepown == c.keepown && w.keep == w.data16 && !w.data16.is_empty()
    }) && work[0].data16 == work[1].data16
        && reference.is_none_or(|r| r == work[0].data16)
}

/// What the freed data cost the host under dedup alone, MiB: all of
/// `freed_mib` (both guests') less [`DUPLICATE_FREED_MIB`], never below
/// 0. With the scripts' sizes: the 64 MiB file's content once and both
/// guests' own 32 MiB, 128 MiB.
pub fn freed_host_mib(freed_mib: f64) -> f64 {
    (freed_mib - DUPLICATE_FREED_MIB as f64).max(0.0)
}

/// The host memory the free should give back under `s`, MiB: every page
/// the guests freed without dedup (each on a frame of its own), the
/// freed data's cost under dedup alone ([`freed_host_mib`]) with it.
pub fn expected_back_mib(s: &FreeSystem, freed_mib: f64) -> f64 {
    if s.dedup() {
        freed_host_mib(freed_mib)
    } else {
        freed_mib
    }
}

/// One observation, `t_s` seconds after the work was posted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FreeSample {
    pub t_s: f64,
    /// Host frames the guests' RAM and the pool hold (`host_frames`); 0
    /// where pagemap hides frames.
    pub host_pages: u64,
    /// `pages_sharing + zero_pages`.
    pub saved_pages: u64,
    /// Pages the balloons reported so far, both VMs.
    pub reported_pages: u64,
}

/// MiB of `pages` 4 KiB pages.
pub fn mib(pages: u64) -> f64 {
    pages as f64 / 256.0
}

/// Share of `expected_mib` that came back `within` seconds after the free
/// ended at `t_freed`: the fall of host memory from `pre_pages` (the last
/// sample before the free was posted) to the last sample at or before
/// `t_freed + within`. None without an expectation.
pub fn back_share(
    samples: &[FreeSample],
    pre_pages: u64,
    t_freed: f64,
    within: f64,
    expected_mib: f64,
) -> Option<f64> {
    if expected_mib <= 0.0 {
        return None;
    }
    let at = samples
        .iter()
        .take_while(|s| s.t_s <= t_freed + within)
        .last()
        .filter(|s| s.host_pages > 0)?;
    Some((mib(pre_pages) - mib(at.host_pages)) / expected_mib)
}

/// The share of the expected return [`back_90_s`] waits for.
pub const BACK_SHARE: f64 = 0.9;
/// How soon it must be back (issue 37).
pub const BACK_WITHIN_S: f64 = 5.0;

/// Seconds from the free's end (`t_freed`) to the first sample after the
/// free was posted (`t_posted`) at which host memory had fallen from
/// `pre_pages` by [`BACK_SHARE`] of `expected_mib` (0 when it had before
/// the free ended); None if it never did.
pub fn back_90_s(
    samples: &[FreeSample],
    pre_pages: u64,
    t_posted: f64,
    t_freed: f64,
    expected_mib: f64,
) -> Option<f64> {
    if expected_mib <= 0.0 {
        return None;
    }
    let want = BACK_SHARE * expected_mib;
    samples
        .iter()
        .filter(|s| s.t_s >= t_posted && s.host_pages > 0)
        .find(|s| mib(pre_pages) - mib(s.host_pages) >= want)
        .map(|s| (s.t_s - t_freed).max(0.0))
}

#[derive(Debug, Clone)]
pub struct LinuxFreeOptions {
    /// scripts/guest-image.sh's output: `vmlinux`, `initrd.img`,
    /// `data.ext4`.
    pub guest_dir: PathBuf,
    /// Guest RAM per VM (config syntax).
    pub memory: String,
    pub sample_interval: Duration,
    /// From both work replies to the free: the time the mergers have.
    pub hold: Duration,
    /// From both free replies to the end.
    pub idle: Duration,
    /// Longest one system may take.
    pub timeout: Duration,
    /// Where the mailboxes and console logs go (default: a new directory
    /// under the temporary directory).
    pub work_dir: Option<PathBuf>,
    /// The guests' `page_reporting_order` (None: their kernel's own).
    pub reporting_order: Option<u32>,
    pub progress: bool,
}

impl Default for LinuxFreeOptions {
    fn default() -> Self {
        Self {
            guest_dir: PathBuf::from("target/guest-img"),
            memory: "512M".into(),
            sample_interval: Duration::from_millis(500),
            hold: Duration::from_secs(40),
            idle: Duration::from_secs(40),
            timeout: Duration::from_secs(900),
            work_dir: None,
            reporting_order: None,
            progress: true,
        }
    }
}

impl LinuxFreeOptions {
    /// The guest image's files the run needs.
    pub fn image_files(&self) -> [PathBuf; 3] {
        ["vmlinux", "initrd.img", "data.ext4"].map(|f| self.guest_dir.join(f))
    }

    /// The directory this run's files go to.
    pub(crate) fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("pagefold-linux-free-{}", std::process::id()))
        })
    }

    /// The balloon of a system's VMs: [`reporting_balloon`], or none.
    pub fn balloon(s: &FreeSystem) -> Option<BalloonConfig> {
        s.reporting.then(reporting_balloon)
    }

    /// VM `vm` of system `s`.
    pub fn vm_config(
        &self,
        s: &FreeSystem,
        vm: &str,
        files: &AgentFiles,
        cpu: Option<usize>,
    ) -> VmConfig {
        let spec = AgentSpec {
            guest_dir: &self.guest_dir,
            memory: &self.memory,
            group: LINUX_FREE_GROUP,
            security: Default::default(),
            balloon: Self::balloon(s),
        };
        agent_vm(&spec, vm, &files.mailbox, &files.console, cpu)
    }
}

/// One system's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxFreeRow {
    pub system: String,
    /// Free page reporting on.
    pub reporting: bool,
    /// Host memory the guests' RAM and the pool hold at the end, MiB
    /// (`host_frames`), and just before the free.
    pub host_mib_end: f64,
    pub host_mib_pre_free: f64,
    pub host_mib_peak: f64,
    /// The process's PSS at the end, MiB (everything it maps, shared
    /// frames divided among their mappings): the cross-check.
    pub pss_mib_end: f64,
    /// What both guests freed, by their free memory (MiB), each guest's,
    /// and what that data cost under dedup alone ([`freed_host_mib`]).
    pub freed_mib: f64,
    pub freed_a_mib: f64,
    pub freed_b_mib: f64,
    pub freed_host_mib: f64,
    /// `pages_sharing + zero_pages` at the end, and the two parts.
    pub saved_pages: u64,
    pub pages_sharing: u64,
    pub zero_pages: u64,
    /// Pages the balloons reported and gave back, both VMs, whole run
    /// (boots included).
    pub reported_pages: u64,
    pub returned_pages: u64,
    /// The engine's guest pages given back and still absent at the end
    /// (`Stats::pages_returned`; None from KSM and without a backend).
    pub engine_pages_returned: Option<u64>,
    /// Seconds from the free's end to 90 % of [`expected_back_mib`] back
    /// on the host (None: never, or reporting off), and the share back
    /// within 5 s.
    pub back_90_s: Option<f64>,
    pub back_5s_share: Option<f64>,
    /// When the free was posted and when both had replied (s since t = 0,
    /// the work's post); the work's time.
    pub t_free_posted_s: f64,
    pub t_freed_s: f64,
    pub work_s: f64,
    /// Merging-side CPU from t = 0 to the end.
    pub engine_cpu_s: f64,
    pub boot_a_s: f64,
    pub boot_b_s: f64,
    /// The kept data's sums matched ([`kept_intact`]).
    pub md5_ok: bool,
    pub kept_a: Kept,
    pub kept_b: Kept,
    pub load_avg: [f64; 3],
    pub warnings: Vec<String>,
    pub samples: Vec<FreeSample>,
}

/// What was run on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxFreeGuest {
    pub kernel: String,
    /// The guests' `page_reporting_order` when set (None: the kernel's).
    #[serde(default)]
    pub reporting_order: Option<u32>,
    pub memory: String,
    pub work_script: String,
    pub free_script: String,
    pub sample_interval_s: f64,
    pub hold_s: f64,
    pub idle_s: f64,
    pub vm_cpus: [Option<usize>; 2],
    pub console_dir: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinuxFreeReport {
    pub host_kind: String,
    pub host_kernel: String,
    pub guest: LinuxFreeGuest,
    pub rows: Vec<LinuxFreeRow>,
    pub unrestored: Vec<String>,
}

impl LinuxFreeReport {
    /// Every system's guests kept intact data.
    pub fn md5_ok(&self) -> bool {
        self.rows.iter().all(|r| r.md5_ok)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const H1: &str = "0123456789abcdef0123456789abcdef";
    pub(crate) const H2: &str = "fedcba9876543210fedcba9876543210";
    pub(crate) const H3: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn selects_systems_in_run_order() {
        let all = select_linux_free_systems(&[]).unwrap();
        let names: Vec<_> = all.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            ["off", "pagefold-on", "fpr", "pagefold-fpr", "ksm-fpr"]
        );
        let two = select_linux_free_systems(&["ksm-fpr".into(), "fpr".into()]).unwrap();
        assert_eq!(
            two.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["fpr", "ksm-fpr"]
        );
        assert!(two.iter().all(|s| s.reporting));
        assert!(!two[0].dedup() && two[1].dedup());
        let e = select_linux_free_systems(&["ksm-4096".into()]).unwrap_err();
        assert!(e.to_string().contains("pagefold-fpr"), "{e}");
        // KSM runs at the engine's own knobs.
        assert_eq!(
            LINUX_FREE_SYSTEMS[4].backend,
            BuildSystem::Ksm("ksm-fpr", KSM_4096_KNOBS)
        );
    }

    #[test]
    fn vms_get_a_reporting_balloon_only_under_reporting_systems() {
        let dir = tempfile::tempdir().unwrap();
        let guest = crate::linux_read::tests::fake_guest_dir(dir.path());
        let opts = LinuxFreeOptions {
            guest_dir: guest.clone(),
            ..LinuxFreeOptions::default()
        };
        let f = crate::linux_read::agent_files(dir.path(), "fpr", "a");
        pagefold_vmm::linux::agent::Mailbox::create(&f.mailbox).unwrap();
        for s in LINUX_FREE_SYSTEMS {
            let c = opts.vm_config(&s, "a", &f, Some(1));
            c.validate().unwrap();
            assert_eq!(c.dedup_group(), LINUX_FREE_GROUP);
            assert_eq!((c.vcpus, c.memory_bytes()), (1, 512 << 20));
            let k = c.kernel.unwrap();
            assert_eq!(k.path, guest.join("vmlinux"));
            assert_eq!(k.disks.len(), 2);
            match k.balloon {
                Some(b) => assert!(s.reporting && b.free_page_reporting, "{}", s.name),
                None => assert!(!s.reporting, "{}", s.name),
            }
        }
    }

    #[test]
    fn scripts_free_what_they_made_and_keep_the_rest() {
        let w = work_script(None);
        assert!(w.contains("count=32") && w.contains("count=8"), "{w}");
        assert!(
            w.starts_with("mkdir") && !w.contains("page_reporting"),
            "{w}"
        );
        let w = work_script(Some(5));
        assert!(
            w.starts_with(&format!("echo 5 >{REPORTING_ORDER} && mkdir")),
            "{w}"
        );
        let f = free_script();
        assert!(f.contains("rm /mnt/w/shared /mnt/w/own"), "{f}");
        assert!(f.contains("drop_caches") && !f.contains("keep"), "{f}");
        assert!(
            check_script().contains("/mnt/w/keep "),
            "{}",
            check_script()
        );
        // Of 2 x (64 + 64 + 16 + 32) MiB freed, the 64 MiB file's content
        // once and the own bytes cost dedup alone anything.
        assert_eq!(
            2 * (SHARED_MIB + 64 + KEEP_SHARED_MIB + OWN_MIB) - DUPLICATE_FREED_MIB,
            SHARED_MIB + 2 * OWN_MIB
        );
    }

    #[test]
    fn reads_the_sums_and_what_was_freed_among_console_noise() {
        let out = format!(
            "[   12.3] random: crng init done\nkeep={H1}\nkeepown={}\ndata16={H1}\n",
            H2.to_uppercase()
        );
        let k = parse_kept(&out, true).unwrap();
        assert_eq!((k.keep.as_str(), k.keepown.as_str()), (H1, H2));
        assert_eq!(k.data16, H1);
        assert_eq!(parse_kept(&out, false).unwrap().data16, "");
        let e = parse_kept(&format!("keep={H1}\n"), false).unwrap_err();
        assert_eq!(e, "no keepown= in the reply");
        let e = parse_kept(&format!("keep=xyz keepown={H2}"), false).unwrap_err();
        assert!(e.contains("not an md5"), "{e}");
        let freed = parse_freed_mib("free_before_kib=102400 free_after_kib=286720\n");
        assert_eq!(freed, Ok(180.0));
        // Memory taken meanwhile: nothing freed, not a negative figure.
        assert_eq!(
            parse_freed_mib("free_before_kib=5000 free_after_kib=4000"),
            Ok(0.0)
        );
        assert!(parse_freed_mib("free_before_kib=1").is_err());
        assert!(parse_freed_mib("free_before_kib=x free_after_kib=1").is_err());
    }

    #[test]
    fn kept_data_is_intact_only_when_every_sum_matches() {
        let k = |keep: &str, own: &str, data: &str| Kept {
            keep: keep.into(),
            keepown: own.into(),
            data16: data.into(),
        };
        let work = [k(H1, H2, H1), k(H1, H3, H1)];
        let check = [k(H1, H2, ""), k(H1, H3, "")];
        assert!(kept_intact(&work, &check, None));
        assert!(kept_intact(&work, &check, Some(H1)));
        assert!(!kept_intact(&work, &check, Some(H2)));
        // A lost write in b's own bytes.
        assert!(!kept_intact(&work, &[k(H1, H2, ""), k(H1, H2, "")], None));
        // a's copy differs from the file it copied.
        assert!(!kept_intact(&[k(H2, H2, H1), k(H1, H3, H1)], &check, None));
        // The guests read different data files.
        assert!(!kept_intact(
            &[k(H1, H2, H1), k(H3, H3, H3)],
            &[k(H1, H2, ""), k(H3, H3, "")],
            None
        ));
    }

    fn sample(t_s: f64, host_mib: u64) -> FreeSample {
        FreeSample {
            t_s,
            host_pages: host_mib * 256,
            saved_pages: 0,
            reported_pages: 0,
        }
    }

    #[test]
    fn what_came_back_is_timed_from_the_free_against_the_expected_return() {
        // 500 MiB before the free (posted at 10 s, done at 11 s), 100 MiB
        // expected back.
        let s = [
            sample(9.0, 500),
            sample(11.0, 495),
            sample(13.0, 450),
            sample(14.5, 409),
            sample(17.0, 400),
        ];
        assert_eq!(back_90_s(&s, 500 * 256, 10.0, 11.0, 100.0), Some(3.5));
        assert_eq!(back_share(&s, 500 * 256, 11.0, 5.0, 100.0), Some(0.91));
        // Within 2 s only half of it.
        assert_eq!(back_share(&s, 500 * 256, 11.0, 2.0, 100.0), Some(0.5));
        // More expected than ever came back: never 90 %.
        assert_eq!(back_90_s(&s, 500 * 256, 10.0, 11.0, 200.0), None);
        assert_eq!(back_share(&s, 500 * 256, 11.0, 5.0, 200.0), Some(0.455));
        // Back before the later guest's reply: 0.
        assert_eq!(back_90_s(&s, 500 * 256, 10.0, 16.0, 50.0), Some(0.0));
        // Memory lower before the work filled it is not a return.
        let early = [sample(1.0, 100), sample(9.0, 500), sample(12.0, 480)];
        assert_eq!(back_90_s(&early, 500 * 256, 10.0, 11.0, 100.0), None);
        // Nothing to expect: no figure.
        assert_eq!(back_90_s(&s, 500 * 256, 10.0, 11.0, 0.0), None);
        assert_eq!(back_share(&s, 500 * 256, 11.0, 5.0, 0.0), None);
        // A sample without frames (pagemap hidden) is not a fall.
        let hidden = [sample(12.0, 0)];
        assert_eq!(back_90_s(&hidden, 500 * 256, 10.0, 11.0, 100.0), None);
        assert_eq!(back_share(&hidden, 500 * 256, 11.0, 5.0, 100.0), None);
    }

    #[test]
    fn dedup_alone_held_the_identical_freed_data_once() {
        // Both guests freed 176 MiB: 224 MiB of it copies of content
        // dedup held once, or holds still.
        assert_eq!(freed_host_mib(352.0), 128.0);
        assert_eq!(freed_host_mib(100.0), 0.0);
        let [off, on, fpr, both, ksm] = LINUX_FREE_SYSTEMS;
        assert_eq!(expected_back_mib(&fpr, 352.0), 352.0);
        assert_eq!(expected_back_mib(&off, 352.0), 352.0);
        for s in [on, both, ksm] {
            assert_eq!(expected_back_mib(&s, 352.0), 128.0, "{}", s.name);
        }
    }
}
