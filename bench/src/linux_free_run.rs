//! The run loop of the `linux-free` benchmark ([`crate::linux_free`]):
//! per system a fresh backend and two fresh agent VMs; `a` boots, then
//! `b`; both get the work (t = 0), hold it for `hold`, free most of it,
//! idle for `idle`, and check what they kept. Host memory, the saving and
//! the balloons' reports are sampled from t = 0 to the check.

use std::path::Path;
use std::time::Instant;

use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};
use pagefold_dedup::Stats;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::host_kind::emulated_host;
use pagefold_vmm::linux::agent::{self, Mailbox, Reply};

use crate::build_bench::{first_run_context, npages};
use crate::error::{linux_vm_err, BenchError};
use crate::host::HostId;
use crate::linux_agents::{
    check_agent_vm, check_guest_files, collect_replies, console_error, post_to_both,
    refuse_without_linux_guests, run_pair, GuestHost, PAIR,
};
use crate::linux_free::{
    back_90_s, back_share, check_script, expected_back_mib, free_script, freed_host_mib,
    kept_intact, mib, parse_freed_mib, parse_kept, work_script, FreeSample, FreeSystem, Kept,
    LinuxFreeGuest, LinuxFreeOptions, LinuxFreeReport, LinuxFreeRow, BACK_WITHIN_S,
    LINUX_FREE_COMMAND,
};
use crate::linux_read::{agent_files, vm_cpu, AgentFiles};

/// Seconds between progress lines while sampling.
const PROGRESS_EVERY_S: f64 = 10.0;

/// Runs every system in turn, holding the KSM lock, and checks that every
/// KSM tunable is as found afterwards. Refuses at once on a host that
/// cannot boot Linux guests, unless it is the emulated host.
pub fn run_linux_free_bench(
    systems: &[FreeSystem],
    opts: &LinuxFreeOptions,
) -> Result<LinuxFreeReport, BenchError> {
    refuse_without_linux_guests(LINUX_FREE_COMMAND, "linux-free")?;
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    if opts.sample_interval.is_zero() {
        return Err(crate::error::input_err(
            "the sample interval must be above 0",
        ));
    }
    check_guest_files(&opts.guest_dir, &opts.image_files())?;
    let dir = opts.work_dir();
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let emulated = emulated_host();
    let vm_cpus = [vm_cpu(emulated, 0, cpus), vm_cpu(emulated, 1, cpus)];
    for s in systems {
        for (vm, cpu) in PAIR.iter().zip(vm_cpus) {
            check_agent_vm(opts.vm_config(s, vm, &agent_files(&dir, "check", vm), cpu))?;
        }
    }
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let HostId { kind, kernel, .. } = HostId::current();
    let _lock = ksm_exclusive()?;
    let root = Path::new(KSM_SYSFS);
    let before = snapshot_tunables(root);
    let mut rows: Vec<LinuxFreeRow> = Vec::new();
    let mut result = Ok(());
    for s in systems {
        if opts.progress {
            eprintln!(
                "[linux free] {}: starting (host {kind}, Linux {kernel})",
                s.name
            );
        }
        let (load_avg, warnings) = first_run_context(s.backend);
        let reference = rows.first().map(|r| r.kept_a.data16.clone());
        let run = SystemRun {
            s: *s,
            opts,
            dir: &dir,
            vm_cpus,
            reference: reference.as_deref(),
        };
        match run.run() {
            Ok(tr) => rows.push(tr.into_row(s, load_avg, warnings)),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let unrestored = crate::host::unrestored_tunables(root, &before);
    result?;
    Ok(LinuxFreeReport {
        host_kind: kind,
        host_kernel: kernel,
        guest: LinuxFreeGuest {
            kernel: opts.guest_dir.join("vmlinux").display().to_string(),
            reporting_order: opts.reporting_order,
            memory: opts.memory.clone(),
            work_script: work_script(opts.reporting_order),
            free_script: free_script(),
            sample_interval_s: opts.sample_interval.as_secs_f64(),
            hold_s: opts.hold.as_secs_f64(),
            idle_s: opts.idle.as_secs_f64(),
            vm_cpus,
            console_dir: dir.display().to_string(),
        },
        rows,
        unrestored,
    })
}

/// Where a system's run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    BootA,
    BootB,
    Working,
    /// Both did the work: the mergers have `hold`.
    Holding,
    Freeing,
    /// Both freed: `idle` to watch the memory come back.
    Idle,
    Checking,
    Done,
}

impl Stage {
    /// What the run waits for, for the timeout message.
    fn waiting_for(self) -> &'static str {
        match self {
            Stage::BootA => "a's agent",
            Stage::BootB => "b's agent",
            Stage::Working => "the work's replies",
            Stage::Holding => "the end of the hold",
            Stage::Freeing => "the free's replies",
            Stage::Idle => "the end of the idle window",
            Stage::Checking => "the check's replies",
            Stage::Done => "nothing",
        }
    }
}

/// What the run loop's tick keeps between calls.
struct Trace {
    stage: Stage,
    added: [Option<Instant>; 2],
    boot_s: [f64; 2],
    /// The work's post (t = 0).
    t0: Option<Instant>,
    seqs: [u64; 2],
    replies: [Option<(f64, Reply)>; 2],
    /// When the current stage's wait began.
    since: Option<Instant>,
    work_s: f64,
    kept: Option<[Kept; 2]>,
    check: Option<[Kept; 2]>,
    /// The kept data was intact ([`kept_intact`], against the first
    /// system's data file).
    md5_ok: bool,
    freed_mib: [f64; 2],
    t_free_posted: f64,
    t_freed: f64,
    /// Host pages at the last sample before the free was posted.
    pre_free_pages: u64,
    base: Option<Stats>,
    end: Option<Stats>,
    balloons: (u64, u64),
    pss_mib: f64,
    samples: Vec<FreeSample>,
    last_sample: Option<Instant>,
    last_progress_s: f64,
}

impl Trace {
    fn new() -> Self {
        Self {
            stage: Stage::BootA,
            added: [None; 2],
            boot_s: [0.0; 2],
            t0: None,
            seqs: [0; 2],
            replies: [None, None],
            since: None,
            work_s: 0.0,
            kept: None,
            check: None,
            md5_ok: false,
            freed_mib: [0.0; 2],
            t_free_posted: 0.0,
            t_freed: 0.0,
            pre_free_pages: 0,
            base: None,
            end: None,
            balloons: (0, 0),
            pss_mib: 0.0,
            samples: Vec::new(),
            last_sample: None,
            last_progress_s: 0.0,
        }
    }

    fn t(&self) -> f64 {
        self.t0.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// Samples the host's memory, the saving and the balloons at `t_s`.
    fn sample(&mut self, r: &impl GuestHost, t_s: f64) -> Stats {
        let st = r.stats();
        let reported = r.balloons().iter().map(|b| b.reported_pages).sum();
        self.samples.push(FreeSample {
            t_s,
            host_pages: r.host_frames().unwrap_or(0),
            saved_pages: npages(&st),
            reported_pages: reported,
        });
        self.last_sample = Some(Instant::now());
        st
    }

    /// Posts `script` to both, clears the replies and moves to `stage`.
    fn post(
        &mut self,
        mailboxes: &mut [Mailbox],
        script: &str,
        stage: Stage,
    ) -> Result<(), String> {
        self.seqs = post_to_both(mailboxes, script)?;
        self.replies = [None, None];
        self.stage = stage;
        Ok(())
    }

    /// Both replies read by `parse`; Err names the VM whose reply it
    /// could not read.
    fn parse_both<T>(&self, parse: impl Fn(&str) -> Result<T, String>) -> Result<[T; 2], String> {
        let read = |i: usize| {
            let out = self.replies[i]
                .as_ref()
                .map_or("", |(_, r)| r.output.as_str());
            parse(out).map_err(|e| format!("VM {}: {e}", PAIR[i]))
        };
        Ok([read(0)?, read(1)?])
    }

    /// The row of a finished trace.
    fn into_row(self, s: &FreeSystem, load_avg: [f64; 3], warnings: Vec<String>) -> LinuxFreeRow {
        let base = self.base.unwrap_or_default();
        let end = self.end.unwrap_or_default();
        let freed_mib = self.freed_mib[0] + self.freed_mib[1];
        let expected = expected_back_mib(s, freed_mib);
        let (back_90, share) = if s.reporting {
            (
                back_90_s(
                    &self.samples,
                    self.pre_free_pages,
                    self.t_free_posted,
                    self.t_freed,
                    expected,
                ),
                back_share(
                    &self.samples,
                    self.pre_free_pages,
                    self.t_freed,
                    BACK_WITHIN_S,
                    expected,
                ),
            )
        } else {
            (None, None)
        };
        let last = self.samples.last().map_or(0, |x| x.host_pages);
        let kept = self.kept.clone().unwrap_or_else(|| {
            [0, 1].map(|_| Kept {
                keep: String::new(),
                keepown: String::new(),
                data16: String::new(),
            })
        });
        let [kept_a, kept_b] = kept;
        LinuxFreeRow {
            system: s.name.into(),
            reporting: s.reporting,
            host_mib_end: mib(last),
            host_mib_pre_free: mib(self.pre_free_pages),
            host_mib_peak: mib(self.samples.iter().map(|x| x.host_pages).max().unwrap_or(0)),
            pss_mib_end: self.pss_mib,
            freed_mib,
            freed_a_mib: self.freed_mib[0],
            freed_b_mib: self.freed_mib[1],
            freed_host_mib: freed_host_mib(freed_mib),
            saved_pages: npages(&end),
            pages_sharing: end.pages_sharing,
            zero_pages: end.zero_pages,
            reported_pages: self.balloons.0,
            returned_pages: self.balloons.1,
            engine_pages_returned: end.pages_returned,
            back_90_s: back_90,
            back_5s_share: share,
            t_free_posted_s: self.t_free_posted,
            t_freed_s: self.t_freed,
            work_s: self.work_s,
            engine_cpu_s: (end.cpu_seconds - base.cpu_seconds).max(0.0),
            boot_a_s: self.boot_s[0],
            boot_b_s: self.boot_s[1],
            md5_ok: self.md5_ok && self.check.is_some(),
            kept_a,
            kept_b,
            load_avg,
            warnings,
            samples: self.samples,
        }
    }
}

/// One system's run.
struct SystemRun<'a> {
    s: FreeSystem,
    opts: &'a LinuxFreeOptions,
    dir: &'a Path,
    vm_cpus: [Option<usize>; 2],
    /// The data file's sum as the first system's guests read it.
    reference: Option<&'a str>,
}

impl SystemRun<'_> {
    fn progress(&self, what: std::fmt::Arguments<'_>) {
        if self.opts.progress {
            eprintln!("[linux free] {}: {what}", self.s.name);
        }
    }

    /// Fresh mailboxes and consoles, a fresh backend and both VMs; the
    /// mailboxes are removed afterwards, the console logs kept.
    fn run(&self) -> Result<Trace, BenchError> {
        let files: Vec<AgentFiles> = PAIR
            .iter()
            .map(|vm| agent_files(self.dir, self.s.name, vm))
            .collect();
        let mut mailboxes = Vec::new();
        let remove = |files: &[AgentFiles]| {
            for f in files {
                let _ = std::fs::remove_file(&f.mailbox);
            }
        };
        for f in &files {
            let _ = std::fs::remove_file(&f.console);
            match Mailbox::create(&f.mailbox) {
                Ok(m) => mailboxes.push(m),
                Err(e) => {
                    remove(&files);
                    return Err(linux_vm_err(e));
                }
            }
        }
        let configs: Vec<VmConfig> = PAIR
            .iter()
            .zip(&files)
            .zip(self.vm_cpus)
            .map(|((vm, f), cpu)| self.opts.vm_config(&self.s, vm, f, cpu))
            .collect();
        let mut tr = Trace::new();
        let start = Instant::now();
        tr.added[0] = Some(start);
        let out = run_pair(self.s.backend, "linux-free", &configs[0], |r| {
            if tr.stage == Stage::Done {
                return Ok(());
            }
            self.tick(r, &mut tr, &configs, &files, &mut mailboxes, start)
        });
        drop(mailboxes);
        remove(&files);
        out?;
        if tr.stage != Stage::Done {
            // Stopped from outside (a signal) before the end.
            return Err(linux_vm_err(format!(
                "{}: the VMs stopped while waiting for {}",
                self.s.name,
                tr.stage.waiting_for()
            )));
        }
        Ok(tr)
    }

    /// One turn of the run loop; Err ends the run.
    fn tick(
        &self,
        r: &mut impl GuestHost,
        tr: &mut Trace,
        configs: &[VmConfig],
        files: &[AgentFiles],
        mailboxes: &mut [Mailbox],
        start: Instant,
    ) -> Result<(), String> {
        if start.elapsed() > self.opts.timeout {
            return Err(format!(
                "not done within {:?} (--timeout) while waiting for {}",
                self.opts.timeout,
                tr.stage.waiting_for()
            ));
        }
        // Sampled from the work's post until the check is posted.
        let sampling = matches!(
            tr.stage,
            Stage::Working | Stage::Holding | Stage::Freeing | Stage::Idle
        );
        let due = tr
            .last_sample
            .is_none_or(|l| l.elapsed() >= self.opts.sample_interval);
        if sampling && due {
            let t = tr.t();
            let st = tr.sample(r, t);
            if t - tr.last_progress_s >= PROGRESS_EVERY_S {
                tr.last_progress_s = t;
                let x = tr.samples.last().copied();
                self.progress(format_args!(
                    "{t:5.0} s: host {:.0} MiB, saved {} pages, reported {} pages",
                    x.map_or(0.0, |x| mib(x.host_pages)),
                    npages(&st),
                    x.map_or(0, |x| x.reported_pages)
                ));
            }
        }
        let consoles = [files[0].console.as_path(), files[1].console.as_path()];
        let waited = |since: Option<Instant>| since.map_or(0.0, |s| s.elapsed().as_secs_f64());
        match tr.stage {
            Stage::BootA | Stage::BootB => self.boot(r, tr, configs, consoles, mailboxes)?,
            Stage::Working => {
                let t = tr.t();
                if collect_replies(r, tr.seqs, &mut tr.replies, consoles, t, "work")? {
                    tr.kept = Some(tr.parse_both(|o| parse_kept(o, true))?);
                    tr.work_s = t;
                    tr.since = Some(Instant::now());
                    tr.stage = Stage::Holding;
                    self.progress(format_args!(
                        "both did the work in {t:.1} s; holding it {:?}",
                        self.opts.hold
                    ));
                }
            }
            Stage::Holding if waited(tr.since) >= self.opts.hold.as_secs_f64() => {
                tr.pre_free_pages = tr.samples.last().map_or(0, |x| x.host_pages);
                tr.t_free_posted = tr.t();
                tr.post(mailboxes, &free_script(), Stage::Freeing)?;
                self.progress(format_args!(
                    "free posted at {:.1} s (host {:.0} MiB)",
                    tr.t_free_posted,
                    mib(tr.pre_free_pages)
                ));
            }
            Stage::Freeing => {
                let t = tr.t();
                if collect_replies(r, tr.seqs, &mut tr.replies, consoles, t, "free")? {
                    tr.freed_mib = tr.parse_both(parse_freed_mib)?;
                    tr.t_freed = t;
                    tr.since = Some(Instant::now());
                    tr.stage = Stage::Idle;
                    self.progress(format_args!(
                        "both freed by {t:.1} s: {:.0} + {:.0} MiB",
                        tr.freed_mib[0], tr.freed_mib[1]
                    ));
                }
            }
            Stage::Idle if waited(tr.since) >= self.opts.idle.as_secs_f64() => {
                let t = tr.t();
                tr.end = Some(tr.sample(r, t));
                let bs = r.balloons();
                tr.balloons = (
                    bs.iter().map(|b| b.reported_pages).sum(),
                    bs.iter().map(|b| b.returned_pages).sum(),
                );
                tr.pss_mib = crate::host_frames::self_pss_mib().unwrap_or(0.0);
                tr.post(mailboxes, &check_script(), Stage::Checking)?;
            }
            Stage::Checking => {
                let t = tr.t();
                if collect_replies(r, tr.seqs, &mut tr.replies, consoles, t, "check")? {
                    let check = tr.parse_both(|o| parse_kept(o, false))?;
                    let ok = tr
                        .kept
                        .as_ref()
                        .is_some_and(|w| kept_intact(w, &check, self.reference));
                    tr.check = Some(check);
                    tr.md5_ok = ok;
                    let last = tr.samples.last().map_or(0, |x| x.host_pages);
                    self.progress(format_args!(
                        "done: host {:.0} MiB, kept data {}",
                        mib(last),
                        if ok { "intact" } else { "DIFFERS" }
                    ));
                    tr.stage = Stage::Done;
                    r.stop("linux-free done");
                    return Ok(());
                }
            }
            _ => {}
        }
        for (i, vm) in PAIR.iter().enumerate() {
            if tr.added[i].is_some() && !r.running(vm) {
                let what = format!("stopped while waiting for {}", tr.stage.waiting_for());
                return Err(console_error(vm, consoles[i], &what));
            }
        }
        Ok(())
    }

    /// Waits for the agent of the VM booting; adds `b` once `a` is ready,
    /// and posts the work to both once `b` is.
    fn boot(
        &self,
        r: &mut impl GuestHost,
        tr: &mut Trace,
        configs: &[VmConfig],
        consoles: [&Path; 2],
        mailboxes: &mut [Mailbox],
    ) -> Result<(), String> {
        let i = usize::from(tr.stage == Stage::BootB);
        if !agent::is_ready(consoles[i]).map_err(|e| e.to_string())? {
            return Ok(());
        }
        tr.boot_s[i] = tr.added[i].map_or(0.0, |a| a.elapsed().as_secs_f64());
        self.progress(format_args!(
            "{} ready after {:.1} s",
            PAIR[i], tr.boot_s[i]
        ));
        if i == 0 {
            // One after the other: two Linux guests booting at once under
            // the emulated host sometimes crash (docs/linux-guests.md).
            r.add(&configs[1])
                .map_err(|e| format!("VM b: starting it: {e}"))?;
            tr.added[1] = Some(Instant::now());
            tr.stage = Stage::BootB;
            return Ok(());
        }
        tr.post(
            mailboxes,
            &work_script(self.opts.reporting_order),
            Stage::Working,
        )?;
        tr.t0 = Some(Instant::now());
        tr.base = Some(tr.sample(r, 0.0));
        self.progress(format_args!("work posted to a and b (t = 0)"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux_agents::testing::{append, Pair};
    use crate::linux_free::tests::{H1, H2, H3};
    use crate::linux_free::LINUX_FREE_SYSTEMS;
    use pagefold_vmm::balloon::BalloonStatus;
    use pagefold_vmm::pause::GuestPauses;
    use std::time::Duration;

    /// The runner's part, played by the test.
    #[derive(Default)]
    struct Fake {
        pair: Pair,
        host_pages: u64,
        reported: u64,
        saved: u64,
    }

    impl GuestHost for Fake {
        fn running(&self, vm: &str) -> bool {
            self.pair.running(vm)
        }

        fn add(&mut self, c: &VmConfig) -> Result<(), String> {
            self.pair.add(c)
        }

        fn stats(&self) -> Stats {
            Stats {
                pages_sharing: self.saved,
                cpu_seconds: self.saved as f64 / 1000.0,
                ..Stats::default()
            }
        }

        fn census(&self) -> Option<crate::page_census::PageCensus> {
            None
        }

        fn guest_pauses(&self) -> GuestPauses {
            GuestPauses::default()
        }

        fn balloons(&self) -> Vec<BalloonStatus> {
            [0, 1]
                .map(|_| BalloonStatus {
                    reported_pages: self.reported / 2,
                    returned_pages: self.reported / 2,
                    ..BalloonStatus::default()
                })
                .to_vec()
        }

        fn host_frames(&self) -> Option<u64> {
            Some(self.host_pages)
        }

        fn stop(&mut self, reason: &str) {
            self.pair.stop(reason)
        }
    }

    struct Harness {
        dir: tempfile::TempDir,
        opts: LinuxFreeOptions,
        files: Vec<AgentFiles>,
        mailboxes: Vec<Mailbox>,
        configs: Vec<VmConfig>,
        fake: Fake,
        tr: Trace,
        start: Instant,
        reference: Option<String>,
    }

    impl Harness {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let opts = LinuxFreeOptions {
                guest_dir: dir.path().join("guest"),
                sample_interval: Duration::from_millis(1),
                hold: Duration::from_millis(20),
                idle: Duration::from_millis(20),
                progress: false,
                ..LinuxFreeOptions::default()
            };
            let s = LINUX_FREE_SYSTEMS[3];
            let files: Vec<AgentFiles> = PAIR
                .iter()
                .map(|vm| agent_files(dir.path(), s.name, vm))
                .collect();
            let mailboxes = files
                .iter()
                .map(|f| Mailbox::create(&f.mailbox).unwrap())
                .collect();
            let configs = PAIR
                .iter()
                .zip(&files)
                .map(|(vm, f)| opts.vm_config(&s, vm, f, None))
                .collect();
            let mut tr = Trace::new();
            tr.added[0] = Some(Instant::now());
            Self {
                dir,
                opts,
                files,
                mailboxes,
                configs,
                fake: Fake {
                    pair: Pair::started(),
                    ..Fake::default()
                },
                tr,
                start: Instant::now(),
                reference: None,
            }
        }

        fn tick(&mut self) -> Result<(), String> {
            let run = SystemRun {
                s: LINUX_FREE_SYSTEMS[3],
                opts: &self.opts,
                dir: self.dir.path(),
                vm_cpus: [None; 2],
                reference: self.reference.as_deref(),
            };
            run.tick(
                &mut self.fake,
                &mut self.tr,
                &self.configs,
                &self.files,
                &mut self.mailboxes,
                self.start,
            )
        }

        fn print(&self, i: usize, text: &str) {
            append(&self.files[i].console, text);
        }

        fn reply(&self, i: usize, seq: u64, status: i32, body: &str) {
            self.print(
                i,
                &format!("PAGEFOLD-AGENT-BEGIN {seq}\n{body}\nPAGEFOLD-AGENT-END {seq} {status}\n"),
            );
        }

        /// Ticks until the stage is `want` (at most 2 s).
        fn until(&mut self, want: Stage) {
            let t = Instant::now();
            while self.tr.stage != want {
                assert!(t.elapsed() < Duration::from_secs(2), "{:?}", self.tr.stage);
                std::thread::sleep(Duration::from_millis(2));
                self.tick().unwrap();
            }
        }

        /// Boots both agents and posts the work.
        fn boot(&mut self) {
            self.print(0, "PAGEFOLD-AGENT-READY 6.1.0\n");
            self.tick().unwrap();
            assert_eq!(self.tr.stage, Stage::BootB);
            assert_eq!(self.fake.pair.added, ["a", "b"]);
            self.print(1, "PAGEFOLD-AGENT-READY 6.1.0\n");
            self.tick().unwrap();
            assert_eq!(self.tr.stage, Stage::Working);
        }

        fn work_reply(&self, i: usize, own: &str) {
            self.reply(i, 1, 0, &format!("keep={H1}\nkeepown={own}\ndata16={H1}"));
        }
    }

    #[test]
    fn works_holds_frees_idles_and_checks_sampling_host_memory_throughout() {
        let mut h = Harness::new();
        h.fake.host_pages = 100 * 256;
        h.boot();
        let mbox = String::from_utf8(std::fs::read(&h.files[0].mailbox).unwrap()).unwrap();
        assert!(
            mbox.starts_with("PFAGENT 1 ") && mbox.contains("/mnt/w/own"),
            "{mbox:?}"
        );
        h.fake.host_pages = 600 * 256;
        h.work_reply(0, H2);
        h.work_reply(1, H3);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Holding);
        // The free is posted once the hold is over, with the memory then.
        h.until(Stage::Freeing);
        assert_eq!(h.tr.pre_free_pages, 600 * 256);
        let mbox = String::from_utf8(std::fs::read(&h.files[1].mailbox).unwrap()).unwrap();
        assert!(
            mbox.starts_with("PFAGENT 2 ") && mbox.contains("drop_caches"),
            "{mbox:?}"
        );
        h.reply(0, 2, 0, "free_before_kib=102400 free_after_kib=284672");
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Freeing);
        h.reply(1, 2, 0, "free_before_kib=102400 free_after_kib=284672");
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Idle);
        assert_eq!(h.tr.freed_mib, [178.0, 178.0]);
        // 356 MiB freed, 132 as dedup alone held it; 400 MiB back.
        h.fake.host_pages = 200 * 256;
        h.fake.reported = 9000;
        h.fake.saved = 4000;
        h.until(Stage::Checking);
        h.reply(0, 3, 0, &format!("keep={H1}\nkeepown={H2}"));
        h.reply(1, 3, 0, &format!("keep={H1}\nkeepown={H3}"));
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Done);
        assert_eq!(h.fake.pair.stopped.as_deref(), Some("linux-free done"));
        let row = h.tr.into_row(&LINUX_FREE_SYSTEMS[3], [0.0; 3], vec![]);
        assert_eq!(row.system, "pagefold-fpr");
        assert_eq!((row.host_mib_pre_free, row.host_mib_end), (600.0, 200.0));
        assert_eq!((row.freed_mib, row.freed_host_mib), (356.0, 132.0));
        assert_eq!((row.reported_pages, row.returned_pages), (9000, 9000));
        assert_eq!(row.saved_pages, 4000);
        assert!(row.md5_ok);
        assert_eq!(row.kept_b.keepown, H3);
        // Back at once (the fake's memory fell before the next sample).
        let b = row.back_90_s.unwrap();
        assert!((0.0..1.0).contains(&b), "{b}");
        assert!(row.back_5s_share.unwrap() > 1.8, "{:?}", row.back_5s_share);
        assert!(row.samples.windows(2).all(|w| w[0].t_s <= w[1].t_s));
        assert!(row.engine_cpu_s > 3.9, "{}", row.engine_cpu_s);
    }

    #[test]
    fn a_lost_write_in_kept_data_is_recorded_not_fatal() {
        let mut h = Harness::new();
        h.reference = Some(H1.into());
        h.fake.host_pages = 256;
        h.boot();
        h.work_reply(0, H2);
        h.work_reply(1, H3);
        h.until(Stage::Freeing);
        for i in 0..2 {
            h.reply(i, 2, 0, "free_before_kib=0 free_after_kib=1024");
        }
        h.until(Stage::Checking);
        h.reply(0, 3, 0, &format!("keep={H1}\nkeepown={H2}"));
        // b's own bytes changed.
        h.reply(1, 3, 0, &format!("keep={H1}\nkeepown={H2}"));
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Done);
        assert!(
            !h.tr
                .into_row(&LINUX_FREE_SYSTEMS[3], [0.0; 3], vec![])
                .md5_ok
        );
    }

    #[test]
    fn failures_name_the_vm_and_the_script() {
        let mut h = Harness::new();
        h.boot();
        h.reply(1, 1, 2, "dd: /mnt/w/own: No space left on device");
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM b: the work failed (status 2); its output:"),
            "{e}"
        );
        assert!(e.contains("No space left"), "{e}");
        // A reply without its sums.
        let mut h = Harness::new();
        h.boot();
        h.work_reply(0, H2);
        h.reply(1, 1, 0, "keep=abc");
        let e = h.tick().unwrap_err();
        assert!(e.starts_with("VM b: keep=abc is not an md5 sum"), "{e}");
        // A VM that stops during the idle window.
        let mut h = Harness::new();
        h.boot();
        h.work_reply(0, H2);
        h.work_reply(1, H3);
        h.until(Stage::Freeing);
        for i in 0..2 {
            h.reply(i, 2, 0, "free_before_kib=0 free_after_kib=1024");
        }
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Idle);
        h.fake.pair.dead.push("a".into());
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM a: stopped while waiting for the end of the idle window"),
            "{e}"
        );
        // The timeout.
        let mut h = Harness::new();
        h.opts.timeout = Duration::ZERO;
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("not done within 0ns (--timeout) while waiting for a's agent"),
            "{e}"
        );
    }
}
