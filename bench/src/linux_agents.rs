//! What the Linux-guest benchmarks with agent VMs share (`linux-read`,
//! `linux-free`): the runner seen through a small trait (so that their
//! run loops are tested without booting Linux, which this host cannot),
//! the guests' consoles, posting one script to both mailboxes, the host
//! check that refuses where no Linux guest boots, and the check of the
//! guest image's files.

use std::path::Path;

use pagefold_dedup::Stats;
use pagefold_vmm::balloon::BalloonStatus;
use pagefold_vmm::config::{
    BalloonConfig, DiskConfig, KernelConfig, SerialOutput, SizeValue, VmConfig, VmDedup,
};
use pagefold_vmm::host_kind::{emulated_host, host_kvm_kind, linux_guest_refusal_with};
use pagefold_vmm::linux::agent::{self, Mailbox, Reply};
use pagefold_vmm::pause::GuestPauses;
use pagefold_vmm::runner::Runner;

use crate::build_bench::{end_backend, make_backend, quiet_linux_runner, BuildSystem};
use crate::error::{input_err, linux_vm_err, BenchError};
use crate::page_census::{self, PageCensus};

/// The two agent VMs of a pair, in boot order.
pub const PAIR: [&str; 2] = ["a", "b"];

/// What the run loops need of the VMs' runner.
pub(crate) trait GuestHost {
    /// VM `vm` was added and has not stopped.
    fn running(&self, vm: &str) -> bool;
    fn add(&mut self, c: &VmConfig) -> Result<(), String>;
    /// The backend's counters (all zero without one).
    fn stats(&self) -> Stats;
    /// What the VMs' RAM holds (`page_census`), with the VMs paused for
    /// it; None where pagemap hides frames.
    fn census(&self) -> Option<PageCensus>;
    /// The stops the engine's parks caused the VMs' vCPUs so far, all VMs
    /// together.
    fn guest_pauses(&self) -> GuestPauses;
    /// The balloons' figures of the VMs that have one.
    fn balloons(&self) -> Vec<BalloonStatus> {
        Vec::new()
    }
    /// The host frames the VMs' RAM and the dedup pool hold now
    /// (`host_frames`); None where pagemap hides frames.
    fn host_frames(&self) -> Option<u64> {
        None
    }
    fn stop(&mut self, reason: &str);
}

impl GuestHost for Runner {
    fn running(&self, vm: &str) -> bool {
        // The runner keeps a VM's summary from its start until it is
        // reaped (stopped).
        self.summary(vm).is_some()
    }

    fn add(&mut self, c: &VmConfig) -> Result<(), String> {
        self.add_vm(c).map_err(|e| e.to_string())
    }

    fn stats(&self) -> Stats {
        self.dedup().map(|b| b.stats()).unwrap_or_default()
    }

    fn guest_pauses(&self) -> GuestPauses {
        self.vms().iter().fold(GuestPauses::default(), |acc, v| {
            acc.merged(&v.info().guest_pauses)
        })
    }

    fn census(&self) -> Option<PageCensus> {
        // Paused, the guests write nothing while their pages are read (a
        // pause fails only for a VM that is stopping: counted anyway).
        let paused: Vec<_> = self.vms().iter().filter(|v| v.pause().is_ok()).collect();
        let ranges = ram_ranges(self);
        // SAFETY: the ranges are the guest RAM of VMs this runner owns,
        // mapped while they live, and none is dropped during the call.
        let c = unsafe { page_census::census(&ranges) };
        for v in paused {
            let _ = v.resume();
        }
        c
    }

    fn balloons(&self) -> Vec<BalloonStatus> {
        self.vms().iter().filter_map(|v| v.info().balloon).collect()
    }

    fn host_frames(&self) -> Option<u64> {
        crate::host_frames::host_frames(&ram_ranges(self)).ok()
    }

    fn stop(&mut self, reason: &str) {
        self.stop_all(reason);
    }
}

/// The host ranges of every VM's guest RAM.
fn ram_ranges(r: &Runner) -> Vec<(usize, usize)> {
    r.vms().iter().flat_map(|v| v.ram_host_ranges()).collect()
}

/// What the agent VMs of one benchmark have in common.
#[derive(Debug, Clone)]
pub(crate) struct AgentSpec<'a> {
    /// scripts/guest-image.sh's output: `vmlinux`, `initrd.img` (with the
    /// agent) and `data.ext4`.
    pub guest_dir: &'a Path,
    /// Guest RAM per VM (config syntax: "384M").
    pub memory: &'a str,
    /// The dedup group both VMs are in.
    pub group: &'a str,
    pub security: pagefold_dedup::Security,
    pub balloon: Option<BalloonConfig>,
}

/// One agent VM: 1 vCPU, the data disk read-only then its mailbox
/// writable, its console to a file, in the spec's dedup group.
pub(crate) fn agent_vm(
    spec: &AgentSpec<'_>,
    name: &str,
    mailbox: &Path,
    console: &Path,
    cpu: Option<usize>,
) -> VmConfig {
    VmConfig {
        name: name.into(),
        vcpus: 1,
        memory: SizeValue::Text(spec.memory.into()),
        serial: SerialOutput::File(console.to_path_buf()),
        dedup: VmDedup {
            enabled: true,
            group: Some(spec.group.into()),
            security: spec.security,
        },
        workload: None,
        kernel: Some(KernelConfig {
            path: spec.guest_dir.join("vmlinux"),
            initrd: Some(spec.guest_dir.join("initrd.img")),
            cmdline: agent::AGENT_CMDLINE.into(),
            disks: vec![
                DiskConfig {
                    path: spec.guest_dir.join("data.ext4"),
                    readonly: true,
                },
                DiskConfig {
                    path: mailbox.to_path_buf(),
                    readonly: false,
                },
            ],
            net: Vec::new(),
            balloon: spec.balloon.clone(),
        }),
        vcpu_affinity: cpu.map(|c| vec![c]),
    }
}

/// Checks an agent VM's config as the VMM will (kernel format, files,
/// memory) before anything is created: without its mailbox and console,
/// which do not exist yet (nor, maybe, the directory that will hold
/// them).
pub(crate) fn check_agent_vm(mut check: VmConfig) -> Result<(), BenchError> {
    if let Some(k) = check.kernel.as_mut() {
        k.disks.truncate(1);
    }
    check.serial = SerialOutput::Null;
    check.validate().map_err(input_err)
}

/// Runs one system's pair: a fresh backend of `s`, a runner with `first`
/// added, and `tick` on every turn of the run loop (about every 100 ms)
/// until it stops the runner (done) or fails (Err: the runner is stopped
/// and the error says how each VM ended). The backend is ended in every
/// case.
pub(crate) fn run_pair(
    s: BuildSystem,
    bench: &str,
    first: &VmConfig,
    mut tick: impl FnMut(&mut Runner) -> Result<(), String>,
) -> Result<(), BenchError> {
    let (backend, _) = make_backend(s)?;
    let mut runner = quiet_linux_runner(s, &backend)?;
    if let Err(err) = runner.add_vm(first) {
        drop(runner);
        end_backend(s, backend.as_ref());
        return Err(linux_vm_err(err));
    }
    let mut error = None;
    let report = runner.run(|r| {
        if error.is_some() {
            return;
        }
        if let Err(e) = tick(r) {
            error = Some(e);
            r.stop(&format!("the {bench} benchmark failed"));
        }
    });
    drop(runner);
    end_backend(s, backend.as_ref());
    let report = report.map_err(linux_vm_err)?;
    match error {
        Some(e) => {
            // How each VM ended says why a guest stopped (e.g. a KVM error).
            let ends: Vec<String> = report
                .vms
                .iter()
                .map(|v| format!("{}: {}", v.name, v.outcome))
                .collect();
            Err(linux_vm_err(format!(
                "{}: {e}\nVMs ended: {}",
                s.name(),
                ends.join("; ")
            )))
        }
        None => Ok(()),
    }
}

/// Looks for both VMs' replies to the scripts numbered `seqs` (named
/// `what` in errors), filling `replies` with each one's arrival time `t`
/// (s) and text as it comes; true once both are in. A script that fails
/// or a VM that stops first fails the run.
pub(crate) fn collect_replies(
    r: &impl GuestHost,
    seqs: [u64; 2],
    replies: &mut [Option<(f64, Reply)>; 2],
    consoles: [&Path; 2],
    t: f64,
    what: &str,
) -> Result<bool, String> {
    for (i, vm) in PAIR.iter().enumerate() {
        if replies[i].is_some() {
            continue;
        }
        let text = console_text(consoles[i])?;
        if let Some(reply) = agent::find_reply(&text, seqs[i]) {
            if reply.status != 0 {
                let why = format!(
                    "the {what} failed (status {}); its output:\n{}",
                    reply.status, reply.output
                );
                return Err(console_error(vm, consoles[i], &why));
            }
            replies[i] = Some((t, reply));
        } else if !r.running(vm) {
            let why = format!("stopped before replying to the {what}");
            return Err(console_error(vm, consoles[i], &why));
        }
    }
    Ok(replies.iter().all(Option::is_some))
}

/// Console lines an error message shows.
pub(crate) const TAIL_LINES: usize = 30;

/// The console text of a VM (empty until the VM has written any).
pub(crate) fn console_text(path: &Path) -> Result<String, String> {
    match std::fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// `VM a: what (console log P); its last lines:\n...`.
pub(crate) fn console_error(vm: &str, console: &Path, what: &str) -> String {
    let text = console_text(console).unwrap_or_default();
    format!(
        "VM {vm}: {what} (console log {}); its last lines:\n{}",
        console.display(),
        agent::tail(&text, TAIL_LINES)
    )
}

/// Posts `script` to both VMs' mailboxes ([`PAIR`] order); their
/// sequence numbers.
pub(crate) fn post_to_both(mailboxes: &mut [Mailbox], script: &str) -> Result<[u64; 2], String> {
    let mut seqs = [0; 2];
    for ((seq, m), vm) in seqs.iter_mut().zip(mailboxes).zip(PAIR) {
        *seq = m.post(script).map_err(|e| format!("VM {vm}: {e}"))?;
    }
    Ok(seqs)
}

/// Refuses at once, naming `command` and the emulated host's way to run
/// it, on a host that cannot boot Linux guests (no VMX/SVM, e.g. PVM),
/// unless this is the emulated host.
pub(crate) fn refuse_without_linux_guests(command: &str, bench: &str) -> Result<(), BenchError> {
    if emulated_host() {
        return Ok(());
    }
    let instead = format!(
        "On such a host, run it inside the emulated host: \
         scripts/emulated-host.sh --bin target/release/pagefold -- \
         pagefold bench {bench} --guest /guest"
    );
    match linux_guest_refusal_with(host_kvm_kind(), command, &instead) {
        Some(why) => Err(BenchError::HostUnsupported(why)),
        None => Ok(()),
    }
}

/// Every file of `files` exists, else the error says how to make the
/// guest image in `guest_dir`.
pub(crate) fn check_guest_files(
    guest_dir: &Path,
    files: &[std::path::PathBuf],
) -> Result<(), BenchError> {
    for f in files {
        if !f.is_file() {
            return Err(input_err(format!(
                "guest image file missing: {} (make the image with scripts/guest-image.sh {})",
                f.display(),
                guest_dir.display()
            )));
        }
    }
    Ok(())
}

/// What the run loops' tests share: a stand-in runner's record of its
/// VMs, and guests' console output written by the test.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Which VMs a stand-in runner added and which stopped, and why the
    /// run stopped it.
    #[derive(Debug, Default)]
    pub(crate) struct Pair {
        pub added: Vec<String>,
        pub dead: Vec<String>,
        pub stopped: Option<String>,
    }

    impl Pair {
        /// `a` added, as a run loop finds it on its first turn.
        pub(crate) fn started() -> Self {
            Self {
                added: vec![PAIR[0].into()],
                ..Self::default()
            }
        }

        pub(crate) fn running(&self, vm: &str) -> bool {
            self.added.iter().any(|v| v == vm) && !self.dead.iter().any(|v| v == vm)
        }

        pub(crate) fn add(&mut self, c: &VmConfig) -> Result<(), String> {
            self.added.push(c.name.clone());
            Ok(())
        }

        pub(crate) fn stop(&mut self, reason: &str) {
            self.stopped = Some(reason.into());
        }
    }

    /// Appends `text` to the console log at `path`, as a guest would.
    pub(crate) fn append(path: &Path, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_errors_name_the_vm_and_show_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let console = dir.path().join("off-b.console");
        let lines: Vec<String> = (0..50).map(|i| format!("line {i}")).collect();
        std::fs::write(&console, lines.join("\n")).unwrap();
        let e = console_error("b", &console, "stopped before replying to the read script");
        assert!(
            e.starts_with("VM b: stopped before replying to the read script (console log "),
            "{e}"
        );
        assert!(e.contains("off-b.console"), "{e}");
        assert!(e.ends_with("line 49") && e.contains("line 20\n"), "{e}");
        assert!(!e.contains("line 19\n"), "{e}");
        // No console yet: the message still names the VM.
        let none = dir.path().join("off-a.console");
        assert!(console_error("a", &none, "x").starts_with("VM a: x"));
        assert_eq!(console_text(&none).unwrap(), "");
    }

    #[test]
    fn a_missing_guest_file_names_the_image_script() {
        let dir = tempfile::tempdir().unwrap();
        let there = dir.path().join("vmlinux");
        std::fs::write(&there, b"x").unwrap();
        check_guest_files(dir.path(), std::slice::from_ref(&there)).unwrap();
        let e = check_guest_files(dir.path(), &[there, dir.path().join("initrd.img")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("guest image file missing: "), "{e}");
        assert!(
            e.contains("initrd.img") && e.contains("scripts/guest-image.sh"),
            "{e}"
        );
    }

    #[test]
    fn a_script_goes_to_both_mailboxes_with_its_own_sequence_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let mut m: Vec<Mailbox> = PAIR
            .iter()
            .map(|vm| Mailbox::create(&dir.path().join(format!("{vm}.mbox"))).unwrap())
            .collect();
        assert_eq!(post_to_both(&mut m, "echo 1").unwrap(), [1, 1]);
        assert_eq!(post_to_both(&mut m, "echo 2").unwrap(), [2, 2]);
        for vm in PAIR {
            let text = std::fs::read(dir.path().join(format!("{vm}.mbox"))).unwrap();
            let text = String::from_utf8_lossy(&text);
            assert!(
                text.starts_with("PFAGENT 2 ") && text.contains("echo 2"),
                "{text}"
            );
        }
    }
}
