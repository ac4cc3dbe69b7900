//! The run loop of the `linux-read` benchmark ([`crate::linux_read`]):
//! per system a fresh backend and two fresh agent VMs in one `Runner`; VM
//! `a` boots first and `b` is added from the run loop once `a`'s agent is
//! ready, then both get the read script (which starts each guest's
//! latency probe first), and the backend's counters are sampled from that
//! post until `idle` after both replied; then the probes stop and report.

use std::path::Path;
use std::time::Instant;

use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};
use pagefold_dedup::Stats;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::linux::agent::{self, Mailbox, Reply};
use pagefold_vmm::pause::GuestPauses;

use crate::build_bench::{first_run_context, npages, BuildSystem};
use crate::error::{input_err, linux_vm_err, BenchError};
use crate::guest_latency::{parse_cyclictest, GuestLatency, PROBE_END};
use crate::host::{HostId, Ipis};
use crate::linux_agents::{
    check_agent_vm, check_guest_files, console_error, console_text, post_to_both,
    refuse_without_linux_guests, run_pair, GuestHost,
};
use crate::linux_read::{
    agent_files, agent_vm_config, md5s_agree, parse_md5s, read_script, t_final_s, vm_cpu,
    AgentFiles, LinuxReadGuest, LinuxReadOptions, LinuxReadReport, LinuxReadRow, LinuxReadSample,
    Md5s, AGENT_CMDLINE, LINUX_READ_COMMAND, LINUX_READ_VMS,
};
use crate::page_census::PageCensus;
use pagefold_vmm::host_kind::emulated_host;

/// Seconds between progress lines while sampling.
const PROGRESS_EVERY_S: f64 = 10.0;

/// Runs every system in turn, holding the KSM lock, and checks that every
/// KSM tunable is as found afterwards. Refuses at once on a host that
/// cannot boot Linux guests (no VMX/SVM) unless it is the emulated host.
pub fn run_linux_read_bench(
    systems: &[BuildSystem],
    opts: &LinuxReadOptions,
) -> Result<LinuxReadReport, BenchError> {
    refuse_without_linux_guests(LINUX_READ_COMMAND, "linux-read")?;
    let emulated = emulated_host();
    if systems.is_empty() {
        return Err(BenchError::NoSystems);
    }
    if opts.sample_interval.is_zero() {
        return Err(input_err("the sample interval must be above 0"));
    }
    check_guest_files(
        &opts.guest_dir,
        &[opts.kernel(), opts.initrd(), opts.data_disk()],
    )?;
    let dir = opts.work_dir();
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let vm_cpus = [vm_cpu(emulated, 0, cpus), vm_cpu(emulated, 1, cpus)];
    check_vm_configs(opts, &dir, vm_cpus)?;
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let HostId {
        kind,
        kernel,
        max_map_count,
    } = HostId::current();
    let _lock = ksm_exclusive()?;
    let root = Path::new(KSM_SYSFS);
    let before = snapshot_tunables(root);
    let mut rows: Vec<LinuxReadRow> = Vec::new();
    let mut result = Ok(());
    for s in systems {
        if opts.progress {
            eprintln!(
                "[linux read] {}: starting (host {kind}, Linux {kernel})",
                s.name()
            );
        }
        let (load_avg, warnings) = first_run_context(*s);
        let reference = rows.first().map(|r| r.md5_a.clone());
        let ctx = SystemRun {
            s: *s,
            opts,
            dir: &dir,
            vm_cpus,
            reference: reference.as_ref(),
        };
        match ctx.run() {
            Ok(m) => rows.push(m.into_row(s.name(), &kind, &kernel, load_avg, warnings)),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let unrestored = crate::host::unrestored_tunables(root, &before);
    result?;
    Ok(LinuxReadReport {
        host_kind: kind,
        host_kernel: kernel,
        max_map_count,
        guest: LinuxReadGuest {
            kernel: opts.kernel().display().to_string(),
            initrd: opts.initrd().display().to_string(),
            data_disk: opts.data_disk().display().to_string(),
            memory: opts.memory.clone(),
            cmdline: AGENT_CMDLINE.into(),
            script: read_script(),
            sample_interval_s: opts.sample_interval.as_secs_f64(),
            idle_s: opts.idle.as_secs_f64(),
            vm_cpus,
            console_dir: dir.display().to_string(),
        },
        rows,
        unrestored,
    })
}

/// One system's run.
struct SystemRun<'a> {
    s: BuildSystem,
    opts: &'a LinuxReadOptions,
    dir: &'a Path,
    vm_cpus: [Option<usize>; 2],
    /// The first system's sums, which every later one must read too.
    reference: Option<&'a Md5s>,
}

/// Where a system's run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    BootA,
    BootB,
    Reading,
    Idle,
    /// The probe stopped, its histograms awaited.
    Probe,
    Done,
}

impl Stage {
    /// What the run waits for, for the timeout message.
    fn waiting_for(self) -> &'static str {
        match self {
            Stage::BootA => "a's agent",
            Stage::BootB => "b's agent",
            Stage::Reading => "the guests' replies",
            Stage::Idle => "the end of the idle window",
            Stage::Probe => "the latency probes' histograms",
            Stage::Done => "nothing",
        }
    }
}

/// What one system's run measured.
struct Measured {
    ipis: Option<Ipis>,
    boot_s: [f64; 2],
    read_s: [f64; 2],
    md5: [Md5s; 2],
    md5s_agree: bool,
    base: Stats,
    end: Stats,
    census: Option<PageCensus>,
    latency: [GuestLatency; 2],
    pauses: GuestPauses,
    samples: Vec<LinuxReadSample>,
}

impl Measured {
    fn into_row(
        self,
        system: &str,
        host_kind: &str,
        host_kernel: &str,
        load_avg: [f64; 3],
        warnings: Vec<String>,
    ) -> LinuxReadRow {
        let (b, e) = (&self.base, &self.end);
        let final_n = npages(e);
        let [md5_a, md5_b] = self.md5;
        let [lat_a, lat_b] = self.latency;
        let worse = GuestLatency::worse(&lat_a, &lat_b);
        LinuxReadRow {
            system: system.into(),
            host_kind: host_kind.into(),
            host_kernel: host_kernel.into(),
            npages: final_n,
            pages_sharing: e.pages_sharing,
            zero_pages: e.zero_pages,
            peak_npages: self.samples.iter().map(|x| x.npages).max().unwrap_or(0),
            t_final_s: t_final_s(&self.samples, final_n),
            engine_cpu_s: (e.cpu_seconds - b.cpu_seconds).max(0.0),
            engine_cpu_total_s: e.cpu_seconds,
            cow_breaks: e.cow_breaks.saturating_sub(b.cow_breaks),
            // KSM's `merges` is this process's merged pages now, not a count.
            merges: if e.backend == "pagefold" {
                e.merges.saturating_sub(b.merges)
            } else {
                0
            },
            ksm_assist: e.ksm_assist.clone(),
            ksm_pages_sharing: e.ksm_pages_sharing,
            boot_a_s: self.boot_s[0],
            boot_b_s: self.boot_s[1],
            read_a_s: self.read_s[0],
            read_b_s: self.read_s[1],
            read_s: self.read_s[0].max(self.read_s[1]),
            md5s_agree: self.md5s_agree,
            md5_a,
            md5_b,
            ipis: self.ipis,
            census: self.census,
            latency_a: Some(lat_a),
            latency_b: Some(lat_b),
            p99_us: Some(worse.p99_us),
            p999_us: Some(worse.p999_us),
            max_us: Some(worse.max_us),
            parks: Some(self.pauses.count),
            parked_s: Some(self.pauses.total_s),
            park_max_us: Some(self.pauses.max_s * 1e6),
            write_waits: e
                .write_waits
                .map(|n| n.saturating_sub(b.write_waits.unwrap_or(0))),
            write_wait_max_us: e.max_write_wait_us.map(|us| us as f64),
            load_avg,
            warnings,
            samples: self.samples,
        }
    }
}

/// What the run loop's tick keeps between calls.
struct Trace {
    stage: Stage,
    /// When each VM was added, and how long it took to its agent.
    added: [Option<Instant>; 2],
    boot_s: [f64; 2],
    /// The read script's post (t = 0) and sequence numbers.
    t0: Option<Instant>,
    seqs: [u64; 2],
    replies: [Option<(f64, Reply)>; 2],
    /// When both replies were in (the idle window starts).
    replied: Option<Instant>,
    md5: Option<([Md5s; 2], bool)>,
    base: Option<Stats>,
    end: Option<Stats>,
    /// The guests' RAM at the end (`page_census`).
    census: Option<PageCensus>,
    /// The probe-end script's sequence numbers, and each guest's figures.
    probe_seqs: [u64; 2],
    latency: [Option<GuestLatency>; 2],
    /// The guests' parks when the probes ended.
    pauses: GuestPauses,
    /// The host's IPI counts before the backend started and at the end.
    ipis: [Option<Ipis>; 2],
    samples: Vec<LinuxReadSample>,
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
            replied: None,
            md5: None,
            base: None,
            end: None,
            census: None,
            pauses: GuestPauses::default(),
            probe_seqs: [0; 2],
            latency: [None; 2],
            ipis: [None; 2],
            samples: Vec::new(),
            last_sample: None,
            last_progress_s: 0.0,
        }
    }

    /// Takes a sample of the backend's counters (a zero sample for `off`)
    /// at `t_s` seconds after the post.
    fn sample(&mut self, r: &impl GuestHost, t_s: f64) -> Stats {
        let st = r.stats();
        self.samples.push(LinuxReadSample {
            t_s,
            npages: npages(&st),
            pages_sharing: st.pages_sharing,
            zero_pages: st.zero_pages,
        });
        self.last_sample = Some(Instant::now());
        st
    }
}

impl SystemRun<'_> {
    fn name(&self) -> &'static str {
        self.s.name()
    }

    fn progress(&self, what: std::fmt::Arguments<'_>) {
        if self.opts.progress {
            eprintln!("[linux read] {}: {what}", self.name());
        }
    }

    /// What a finished trace measured; Err: the stage it stopped in.
    fn measured(tr: Trace) -> Result<Measured, Stage> {
        match (tr.stage, tr.md5, tr.base, tr.end, tr.latency) {
            (Stage::Done, Some((md5, md5s_agree)), Some(base), Some(end), [Some(a), Some(b)]) => {
                Ok(Measured {
                    ipis: match tr.ipis {
                        [Some(a), Some(b)] => Some(b.since(a)),
                        _ => None,
                    },
                    boot_s: tr.boot_s,
                    read_s: tr.replies.map(|x| x.map_or(0.0, |(t, _)| t)),
                    md5,
                    md5s_agree,
                    base,
                    end,
                    census: tr.census,
                    latency: [a, b],
                    pauses: tr.pauses,
                    samples: tr.samples,
                })
            }
            (stage, ..) => Err(stage),
        }
    }

    /// Fresh mailboxes and consoles, a fresh backend and both VMs; the
    /// mailboxes are removed afterwards, the console logs kept.
    fn run(&self) -> Result<Measured, BenchError> {
        let files: Vec<AgentFiles> = LINUX_READ_VMS
            .iter()
            .map(|vm| agent_files(self.dir, self.name(), vm))
            .collect();
        let mut mailboxes = Vec::new();
        for f in &files {
            let _ = std::fs::remove_file(&f.console);
            match Mailbox::create(&f.mailbox) {
                Ok(m) => mailboxes.push(m),
                Err(e) => {
                    remove_mailboxes(&files);
                    return Err(linux_vm_err(e));
                }
            }
        }
        let configs: Vec<VmConfig> = LINUX_READ_VMS
            .iter()
            .zip(&files)
            .zip(self.vm_cpus)
            .map(|((vm, f), cpu)| agent_vm_config(self.opts, vm, f, cpu, self.s.security()))
            .collect();
        let out = self.drive(&configs, &files, &mut mailboxes);
        drop(mailboxes);
        remove_mailboxes(&files);
        out
    }

    fn drive(
        &self,
        configs: &[VmConfig],
        files: &[AgentFiles],
        mailboxes: &mut [Mailbox],
    ) -> Result<Measured, BenchError> {
        let mut tr = Trace::new();
        tr.ipis[0] = Ipis::current();
        let start = Instant::now();
        tr.added[0] = Some(start);
        run_pair(self.s, "linux-read", &configs[0], |r| {
            if tr.stage == Stage::Done {
                return Ok(());
            }
            self.tick(r, &mut tr, configs, files, mailboxes, start)
        })?;
        // Stopped from outside (a signal) before the end: Err.
        Self::measured(tr).map_err(|stage| {
            linux_vm_err(format!(
                "{}: the VMs stopped while waiting for {}",
                self.name(),
                stage.waiting_for()
            ))
        })
    }

    /// One turn of the run loop (about every 100 ms); Err ends the run.
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
        match tr.stage {
            Stage::BootA | Stage::BootB => self.boot(r, tr, configs, files, mailboxes)?,
            Stage::Reading => self.read(r, tr, files)?,
            Stage::Probe => self.probe_end(r, tr, files)?,
            Stage::Idle | Stage::Done => {}
        }
        // A VM that stops before the end (replies read first: it may have
        // replied just before stopping).
        for (i, vm) in LINUX_READ_VMS.iter().enumerate() {
            if tr.added[i].is_some() && !r.running(vm) {
                let what = format!("stopped while waiting for {}", tr.stage.waiting_for());
                return Err(console_error(vm, &files[i].console, &what));
            }
        }
        let Some(t0) = tr.t0 else { return Ok(()) };
        let due = tr
            .last_sample
            .is_none_or(|l| l.elapsed() >= self.opts.sample_interval);
        // Sampled while the guests read and through the idle window; not
        // once the probes are told to stop.
        let sampling = matches!(tr.stage, Stage::Reading | Stage::Idle);
        let over = tr.replied.is_some_and(|t| t.elapsed() >= self.opts.idle);
        if sampling && (due || over) {
            let t = t0.elapsed().as_secs_f64();
            let st = tr.sample(r, t);
            if t - tr.last_progress_s >= PROGRESS_EVERY_S {
                tr.last_progress_s = t;
                self.progress(format_args!(
                    "{t:5.0} s: npages {} (sharing {}, zero {})",
                    npages(&st),
                    st.pages_sharing,
                    st.zero_pages
                ));
            }
            if over {
                self.progress(format_args!(
                    "done at {t:.1} s: npages {} (sharing {}, zero {}), engine {:.2} s",
                    npages(&st),
                    st.pages_sharing,
                    st.zero_pages,
                    st.cpu_seconds
                ));
                tr.end = Some(st);
                tr.ipis[1] = Ipis::current();
                // The probes stop before the census, which pauses the VMs.
                tr.probe_seqs = post_to_both(mailboxes, PROBE_END)?;
                tr.stage = Stage::Probe;
            }
        }
        Ok(())
    }

    /// Waits for the agent of the VM booting; adds `b` once `a` is ready,
    /// and posts the read script to both once `b` is.
    fn boot(
        &self,
        r: &mut impl GuestHost,
        tr: &mut Trace,
        configs: &[VmConfig],
        files: &[AgentFiles],
        mailboxes: &mut [Mailbox],
    ) -> Result<(), String> {
        let i = usize::from(tr.stage == Stage::BootB);
        let vm = LINUX_READ_VMS[i];
        if !agent::is_ready(&files[i].console).map_err(|e| e.to_string())? {
            return Ok(());
        }
        let added = tr.added[i].unwrap_or_else(Instant::now);
        tr.boot_s[i] = added.elapsed().as_secs_f64();
        self.progress(format_args!("{vm} ready after {:.1} s", tr.boot_s[i]));
        if i == 0 {
            // One after the other: two Linux guests booting at once under
            // the emulated host sometimes crash (docs/linux-guests.md).
            r.add(&configs[1])
                .map_err(|e| format!("VM b: starting it: {e}"))?;
            tr.added[1] = Some(Instant::now());
            tr.stage = Stage::BootB;
            return Ok(());
        }
        tr.seqs = post_to_both(mailboxes, &read_script())?;
        tr.t0 = Some(Instant::now());
        tr.base = Some(tr.sample(r, 0.0));
        tr.stage = Stage::Reading;
        self.progress(format_args!("read script posted to a and b (t = 0)"));
        Ok(())
    }

    /// Looks for the replies; once both are in, checks them and starts the
    /// idle window.
    fn read(&self, r: &impl GuestHost, tr: &mut Trace, files: &[AgentFiles]) -> Result<(), String> {
        let t0 = tr.t0.unwrap_or_else(Instant::now);
        for (i, vm) in LINUX_READ_VMS.iter().enumerate() {
            if tr.replies[i].is_some() {
                continue;
            }
            let text = console_text(&files[i].console)?;
            if let Some(reply) = agent::find_reply(&text, tr.seqs[i]) {
                let t = t0.elapsed().as_secs_f64();
                self.progress(format_args!("{vm} replied after {t:.1} s"));
                if reply.status != 0 {
                    let what = format!(
                        "the read script failed (status {}); its output:\n{}",
                        reply.status, reply.output
                    );
                    return Err(console_error(vm, &files[i].console, &what));
                }
                tr.replies[i] = Some((t, reply));
            } else if !r.running(vm) {
                return Err(console_error(
                    vm,
                    &files[i].console,
                    "stopped before replying to the read script",
                ));
            }
        }
        let [Some((_, ra)), Some((_, rb))] = &tr.replies else {
            return Ok(());
        };
        let parse = |vm: &str, reply: &Reply| {
            parse_md5s(&reply.output)
                .map_err(|e| format!("VM {vm}: {e} in its reply:\n{}", reply.output))
        };
        let (a, b) = (parse("a", ra)?, parse("b", rb)?);
        let agree = md5s_agree(&a, &b, self.reference);
        if !agree {
            self.progress(format_args!(
                "GUEST DATA DIFFERS: a read {a:?}, b read {b:?}, the first system's guests {:?}",
                self.reference
            ));
        }
        tr.md5 = Some(([a, b], agree));
        tr.replied = Some(Instant::now());
        tr.stage = Stage::Idle;
        self.progress(format_args!(
            "both replied; md5s agree: {}; sampling for {:?} more",
            if agree { "yes" } else { "NO" },
            self.opts.idle
        ));
        Ok(())
    }

    /// Looks for the probes' histograms; once both are in, takes the
    /// census and ends the run.
    fn probe_end(
        &self,
        r: &mut impl GuestHost,
        tr: &mut Trace,
        files: &[AgentFiles],
    ) -> Result<(), String> {
        for (i, vm) in LINUX_READ_VMS.iter().enumerate() {
            if tr.latency[i].is_some() {
                continue;
            }
            let text = console_text(&files[i].console)?;
            let Some(reply) = agent::find_reply(&text, tr.probe_seqs[i]) else {
                continue;
            };
            let l = parse_cyclictest(&reply.output).map_err(|e| {
                let what = format!(
                    "the latency probe's end (status {}): {e}; its output:\n{}",
                    reply.status, reply.output
                );
                console_error(vm, &files[i].console, &what)
            })?;
            self.progress(format_args!(
                "{vm}'s wake-up latency: p99 {} µs, p99.9 {} µs, max {} µs ({} wake-ups)",
                l.p99_us, l.p999_us, l.max_us, l.samples
            ));
            tr.latency[i] = Some(l);
        }
        if tr.latency.iter().any(Option::is_none) {
            return Ok(());
        }
        tr.pauses = r.guest_pauses();
        self.progress(format_args!(
            "guests' parks: {} stops, {:.1} ms in all, the longest {:.0} µs",
            tr.pauses.count,
            tr.pauses.total_s * 1e3,
            tr.pauses.max_s * 1e6
        ));
        tr.census = r.census();
        if let Some(c) = tr.census {
            self.progress(format_args!(
                "guest RAM: {} pages present, {} zero; {} non-zero copies, {} of them and {} zero pages left unshared",
                c.present, c.zero, c.nonzero_copies, c.nonzero_left, c.zero_left
            ));
        }
        tr.stage = Stage::Done;
        r.stop("linux-read done");
        Ok(())
    }
}

/// Checks both VMs' configs as the VMM will before anything is created
/// or the lock taken.
fn check_vm_configs(
    opts: &LinuxReadOptions,
    dir: &Path,
    vm_cpus: [Option<usize>; 2],
) -> Result<(), BenchError> {
    for (vm, cpu) in LINUX_READ_VMS.iter().zip(vm_cpus) {
        let files = agent_files(dir, "check", vm);
        check_agent_vm(agent_vm_config(opts, vm, &files, cpu, Default::default()))?;
    }
    Ok(())
}

fn remove_mailboxes(files: &[AgentFiles]) {
    for f in files {
        let _ = std::fs::remove_file(&f.mailbox);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux_agents::testing::{append, Pair};
    use crate::linux_read::select_linux_read_systems;
    use std::time::Duration;

    #[test]
    fn refuses_on_a_host_without_vmx_or_svm_before_touching_files() {
        if emulated_host()
            || pagefold_vmm::host_kind::linux_guest_refusal(
                pagefold_vmm::host_kind::host_kvm_kind(),
                "x",
            )
            .is_none()
        {
            eprintln!("SKIPPED: this host runs Linux guests; the refusal is for the others");
            return;
        }
        let work = std::env::temp_dir().join(format!("pagefold-lr-refusal-{}", std::process::id()));
        let opts = LinuxReadOptions {
            guest_dir: "/nonexistent".into(),
            work_dir: Some(work.clone()),
            progress: false,
            ..LinuxReadOptions::default()
        };
        let t = Instant::now();
        let e = run_linux_read_bench(&select_linux_read_systems(&[]).unwrap(), &opts).unwrap_err();
        assert!(matches!(e, BenchError::HostUnsupported(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with("pagefold bench linux-read needs a host with hardware virtualization"),
            "{msg}"
        );
        assert!(msg.contains("scripts/emulated-host.sh"), "{msg}");
        assert!(!work.exists(), "created {}", work.display());
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_work_dir_still_to_create_passes_the_config_check_a_missing_file_not() {
        let dir = tempfile::tempdir().unwrap();
        let guest = crate::linux_read::tests::fake_guest_dir(dir.path());
        let opts = LinuxReadOptions {
            guest_dir: guest.clone(),
            ..LinuxReadOptions::default()
        };
        let work = dir.path().join("out").join("consoles");
        check_vm_configs(&opts, &work, [Some(0), Some(1)]).unwrap();
        assert!(!work.exists(), "the check created {}", work.display());
        std::fs::remove_file(guest.join("initrd.img")).unwrap();
        let e = check_vm_configs(&opts, &work, [Some(0), Some(1)]).unwrap_err();
        assert!(e.to_string().contains("initrd"), "{e}");
    }

    /// The runner's part, played by the test: which VMs were added and
    /// which stopped, and the backend's counters.
    #[derive(Default)]
    struct Fake {
        pair: Pair,
        npages: u64,
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
                backend: "pagefold".into(),
                pages_sharing: self.npages - self.npages / 4,
                zero_pages: self.npages / 4,
                merges: self.npages,
                cpu_seconds: self.npages as f64 / 1000.0,
                ..Stats::default()
            }
        }

        fn guest_pauses(&self) -> GuestPauses {
            GuestPauses {
                count: 3,
                total_s: 0.002,
                max_s: 0.001,
                ..GuestPauses::default()
            }
        }

        fn census(&self) -> Option<PageCensus> {
            Some(PageCensus {
                present: 1000,
                zero: 100,
                nonzero_copies: self.npages,
                nonzero_left: 7,
                zero_left: 3,
                frames: 900,
            })
        }

        fn stop(&mut self, reason: &str) {
            self.pair.stop(reason)
        }
    }

    /// One system's run loop on files in a temporary directory, with the
    /// test writing what the guests would print to their consoles.
    struct Harness {
        dir: tempfile::TempDir,
        opts: LinuxReadOptions,
        files: Vec<AgentFiles>,
        mailboxes: Vec<Mailbox>,
        configs: Vec<VmConfig>,
        fake: Fake,
        tr: Trace,
        start: Instant,
    }

    const H64: &str = "0123456789abcdef0123456789abcdef";
    const H16: &str = "fedcba9876543210fedcba9876543210";

    impl Harness {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let opts = LinuxReadOptions {
                guest_dir: dir.path().join("guest"),
                sample_interval: Duration::from_millis(5),
                // Long enough that the test's 10 ms nap stays inside it on a
                // loaded machine.
                idle: Duration::from_secs(1),
                progress: false,
                ..LinuxReadOptions::default()
            };
            let files: Vec<AgentFiles> = LINUX_READ_VMS
                .iter()
                .map(|vm| agent_files(dir.path(), "pagefold-on", vm))
                .collect();
            let mailboxes = files
                .iter()
                .map(|f| Mailbox::create(&f.mailbox).unwrap())
                .collect();
            let configs = LINUX_READ_VMS
                .iter()
                .zip(&files)
                .map(|(vm, f)| agent_vm_config(&opts, vm, f, None, Default::default()))
                .collect();
            let mut tr = Trace::new();
            tr.added[0] = Some(Instant::now());
            let fake = Fake {
                pair: Pair::started(),
                ..Fake::default()
            };
            Self {
                dir,
                opts,
                files,
                mailboxes,
                configs,
                fake,
                tr,
                start: Instant::now(),
            }
        }

        fn tick(&mut self) -> Result<(), String> {
            let run = SystemRun {
                s: BuildSystem::PagefoldOn,
                opts: &self.opts,
                dir: self.dir.path(),
                vm_cpus: [None; 2],
                reference: None,
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

        /// VM `i` prints `text` on its console.
        fn print(&self, i: usize, text: &str) {
            append(&self.files[i].console, text);
        }

        fn ready(&self, i: usize) {
            self.print(
                i,
                "[    0.000000] Linux version 6.1.0\nPAGEFOLD-AGENT-READY 6.1.0\n",
            );
        }

        fn reply(&self, i: usize, status: i32, h64: &str) {
            self.print(
                i,
                &format!(
                    "PAGEFOLD-AGENT-BEGIN 1\n{h64}  /data/random-64m.bin\n\
                     {H16}  /data/random-16m.bin\n{H16}  /tmp/copy16\n\
                     PAGEFOLD-AGENT-END 1 {status}\n"
                ),
            );
        }

        /// VM `i` answers the probe's end (the agent's second script)
        /// with a histogram: 99 wake-ups `lat` µs late, one `max` µs.
        fn probe(&self, i: usize, lat: u64, max: u64) {
            self.print(
                i,
                &format!(
                    "PAGEFOLD-AGENT-BEGIN 2\nCYCLICTEST-HISTOGRAM\n# Histogram\n\
                     {lat:06} 000099\n{max:06} 000001\n# Total: 000000100\n\
                     # Max Latencies: {max:05}\n# Histogram Overflows: 00000\n\
                     # Histogram Overflow at cycle number:\nPAGEFOLD-AGENT-END 2 0\n"
                ),
            );
        }

        /// Boots both agents, posts the read and has both reply alike:
        /// the idle window starts.
        fn both_replied(&mut self) {
            self.boot_and_post();
            self.reply(0, 0, H64);
            self.reply(1, 0, H64);
            self.tick().unwrap();
            assert_eq!(self.tr.stage, Stage::Idle);
        }

        /// Boots both agents and posts the read.
        fn boot_and_post(&mut self) {
            self.ready(0);
            self.tick().unwrap();
            self.ready(1);
            self.tick().unwrap();
            assert_eq!(self.tr.stage, Stage::Reading);
        }
    }

    #[test]
    fn boots_a_then_b_posts_the_read_to_both_and_samples_until_the_idle_window_ends() {
        let mut h = Harness::new();
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::BootA);
        // b is added only once a's agent is ready.
        assert_eq!(h.fake.pair.added, ["a"]);
        h.ready(0);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::BootB);
        assert_eq!(h.fake.pair.added, ["a", "b"]);
        assert!(h.tr.added[1].is_some() && h.tr.boot_s[0] > 0.0);
        h.tick().unwrap();
        // Nothing posted before b is ready; no samples before the post.
        for f in &h.files {
            let mbox = std::fs::read(&f.mailbox).unwrap();
            assert!(mbox.iter().all(|&b| b == 0));
        }
        assert!(h.tr.samples.is_empty());
        h.fake.npages = 100;
        h.ready(1);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Reading);
        for f in &h.files {
            let mbox = String::from_utf8(std::fs::read(&f.mailbox).unwrap()).unwrap();
            assert!(mbox.starts_with("PFAGENT 1 "), "{mbox:?}");
            assert!(mbox.contains(&read_script()), "{mbox:?}");
            assert!(mbox.contains("cyclictest"), "{mbox:?}");
        }
        // The base sample at t = 0.
        assert_eq!(h.tr.samples.len(), 1);
        assert_eq!((h.tr.samples[0].t_s, h.tr.samples[0].npages), (0.0, 100));
        // Sampled while the guests read, too.
        std::thread::sleep(Duration::from_millis(10));
        h.fake.npages = 500;
        h.reply(0, 0, H64);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Reading);
        assert!(h.tr.replies[0].is_some() && h.tr.replies[1].is_none());
        assert!(
            h.tr.samples.iter().any(|s| s.npages == 500),
            "{:?}",
            h.tr.samples
        );
        h.fake.npages = 1000;
        h.reply(1, 0, H64);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Idle);
        assert!(h.fake.pair.stopped.is_none());
        std::thread::sleep(Duration::from_millis(10));
        h.fake.npages = 2000;
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Idle);
        std::thread::sleep(h.opts.idle);
        h.fake.npages = 2004;
        h.tick().unwrap();
        // The idle window is over: the probes are told to stop; no census
        // (it pauses the VMs) until both reported.
        assert_eq!(h.tr.stage, Stage::Probe);
        for f in &h.files {
            let mbox = String::from_utf8(std::fs::read(&f.mailbox).unwrap()).unwrap();
            assert!(mbox.starts_with("PFAGENT 2 "), "{mbox:?}");
            assert!(mbox.contains(PROBE_END), "{mbox:?}");
        }
        h.fake.npages = 3000;
        h.probe(1, 40, 900);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Probe);
        assert!(h.tr.census.is_none() && h.fake.pair.stopped.is_none());
        h.probe(0, 60, 500);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Done);
        assert_eq!(h.fake.pair.stopped.as_deref(), Some("linux-read done"));
        let n = h.tr.samples.len();
        // The base sample, the one after 10 ms, the last one (others when
        // ticks were slower than the 5 ms interval).
        assert!(n >= 3, "{:?}", h.tr.samples);
        assert!(h.tr.samples.windows(2).all(|w| w[0].t_s <= w[1].t_s));
        let t_2000 = h.tr.samples.iter().find(|s| s.npages == 2000).unwrap().t_s;
        let m = SystemRun::measured(h.tr).unwrap();
        let row = m.into_row("pagefold-on", "emulated-svm", "6.1.0", [0.0; 3], vec![]);
        assert_eq!((row.npages, row.peak_npages), (2004, 2004));
        assert_eq!((row.pages_sharing, row.zero_pages), (1503, 501));
        // Merges and CPU from the post (npages 100) to the end.
        assert_eq!(row.merges, 1904);
        assert!(
            (row.engine_cpu_s - 1.904).abs() < 1e-9,
            "{}",
            row.engine_cpu_s
        );
        assert!((row.engine_cpu_total_s - 2.004).abs() < 1e-9);
        // The census is taken once, after the probes ended (the fake's
        // copies follow its npages).
        assert_eq!(row.census.map(|c| c.nonzero_copies), Some(3000));
        // The guests' parks, from the VMM's record at the probes' end.
        assert_eq!(row.parks, Some(3));
        assert_eq!(row.parked_s, Some(0.002));
        assert_eq!(row.park_max_us, Some(1000.0));
        // Each guest's latency, and the worse of the two.
        assert_eq!(
            row.latency_a.map(|l| (l.p99_us, l.max_us)),
            Some((60.0, 500.0))
        );
        assert_eq!(
            row.latency_b.map(|l| (l.p99_us, l.max_us)),
            Some((40.0, 900.0))
        );
        assert_eq!(
            (row.p99_us, row.p999_us, row.max_us),
            (Some(60.0), Some(900.0), Some(900.0))
        );
        // 95 % of 2004 is first reached by the 2000 sample.
        assert_eq!(row.t_final_s, Some(t_2000));
        assert!(row.md5s_agree);
        assert_eq!(row.md5_a.random_64m, H64);
        assert!(row.read_a_s <= row.read_b_s && row.read_s == row.read_b_s);
        assert!(row.boot_a_s > 0.0 && row.boot_b_s > 0.0);
    }

    #[test]
    fn differing_sums_are_recorded_not_fatal() {
        let mut h = Harness::new();
        h.boot_and_post();
        h.reply(0, 0, H64);
        h.reply(1, 0, H16);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Idle);
        let (md5, agree) = h.tr.md5.clone().unwrap();
        assert!(!agree);
        assert_ne!(md5[0], md5[1]);
    }

    #[test]
    fn a_vm_that_stops_fails_the_run_with_its_name_and_console() {
        let mut h = Harness::new();
        h.print(0, "[    1.0] Kernel panic - not syncing: VFS\n");
        h.fake.pair.dead.push("a".into());
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM a: stopped while waiting for a's agent (console log "),
            "{e}"
        );
        assert!(e.ends_with("Kernel panic - not syncing: VFS"), "{e}");
        // While reading: the VM that did not reply is named.
        let mut h = Harness::new();
        h.boot_and_post();
        h.reply(0, 0, H64);
        h.fake.pair.dead.push("b".into());
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM b: stopped before replying to the read script"),
            "{e}"
        );
        // After both replied, during the idle window.
        let mut h = Harness::new();
        h.both_replied();
        h.fake.pair.dead.push("a".into());
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM a: stopped while waiting for the end of the idle window"),
            "{e}"
        );
    }

    #[test]
    fn a_failed_script_a_reply_without_sums_and_the_timeout_fail_the_run() {
        let mut h = Harness::new();
        h.boot_and_post();
        h.reply(1, 1, H64);
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM b: the read script failed (status 1); its output:"),
            "{e}"
        );
        let mut h = Harness::new();
        h.boot_and_post();
        h.reply(0, 0, "not-an-md5");
        h.reply(1, 0, H64);
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM a: no md5 line for /data/random-64m.bin in its reply"),
            "{e}"
        );
        let mut h = Harness::new();
        h.opts.timeout = Duration::ZERO;
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("not done within 0ns (--timeout) while waiting for a's agent"),
            "{e}"
        );
    }

    #[test]
    fn a_probe_that_reports_no_histogram_fails_the_run_naming_its_vm() {
        let mut h = Harness::new();
        h.both_replied();
        std::thread::sleep(h.opts.idle);
        h.tick().unwrap();
        assert_eq!(h.tr.stage, Stage::Probe);
        h.print(
            1,
            "PAGEFOLD-AGENT-BEGIN 2\nkill: can't kill pid 88\nPAGEFOLD-AGENT-END 2 1\n",
        );
        let e = h.tick().unwrap_err();
        assert!(
            e.starts_with("VM b: the latency probe's end (status 1): no CYCLICTEST-HISTOGRAM"),
            "{e}"
        );
        assert!(e.contains("can't kill pid 88"), "{e}");
    }

    #[test]
    fn stages_name_what_they_wait_for() {
        for (s, w) in [
            (Stage::BootA, "a's agent"),
            (Stage::BootB, "b's agent"),
            (Stage::Reading, "the guests' replies"),
            (Stage::Idle, "the end of the idle window"),
            (Stage::Probe, "the latency probes' histograms"),
        ] {
            assert_eq!(s.waiting_for(), w);
        }
    }
}
