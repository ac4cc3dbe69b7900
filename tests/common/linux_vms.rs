//! Linux VMs that run the guest agent (scripts/guest-image.sh's initrd with
//! `pagefold.agent=`), served by a real `pagefold serve` process, for the
//! Linux-guest tests: the test writes shell scripts to a VM's mailbox disk
//! and reads their output from its serial console file
//! (`pagefold_vmm::linux::agent`), and drives dedup through the HTTP API.
//!
//! Every VM gets the image's data disk (`/dev/vda`, read-only, mounted at
//! `/data`: the same 64 MiB and 16 MiB random files in every VM) and its own
//! mailbox (`/dev/vdb`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pagefold_api::client::Client;
use pagefold_api::dedup_view::DedupView;
use pagefold_api::vms::Target as VmTarget;
use pagefold_dedup::DedupSettings;
use pagefold_vmm::config::VmConfig;
use pagefold_vmm::linux::agent::{self, Mailbox, Reply, AGENT_CMDLINE};
use pagefold_vmm::vm::VmInfo;

use super::linux_host::image;
use super::pagemap_audit::{self, Audit, Claimed};
use super::{api_client, bin, TempDir};

/// How long a Linux guest may take to boot to its agent under the
/// emulated host (about 15 s there; the bound leaves room for a loaded
/// machine).
pub const BOOT_LIMIT: Duration = Duration::from_secs(240);

/// The backend CPU time that counts as work in [`Served::wait_dedup`].
pub const WORK_SECONDS: f64 = 1.0;

/// The longest [`Served::wait_dedup`] waits while the backend works, in
/// multiples of its limit.
pub const WORK_CAP: u32 = 4;

/// When a dedup backend last worked, by its CPU time.
#[derive(Debug)]
struct Work {
    start: Instant,
    /// The CPU time at the start.
    first: f64,
    /// The CPU time at the last mark, and when that was.
    mark: (f64, Instant),
    /// The CPU time seen last.
    seen: f64,
}

impl Work {
    fn new(cpu_seconds: f64, now: Instant) -> Self {
        Self {
            start: now,
            first: cpu_seconds,
            mark: (cpu_seconds, now),
            seen: cpu_seconds,
        }
    }

    /// Takes in the backend's CPU time at `now`.
    fn see(&mut self, cpu_seconds: f64, now: Instant) {
        self.seen = cpu_seconds;
        if cpu_seconds - self.mark.0 >= WORK_SECONDS {
            self.mark = (cpu_seconds, now);
        }
    }

    /// Why the wait ends at `now`, if it does.
    fn expired(&self, limit: Duration, now: Instant) -> Option<String> {
        let idle = now - self.mark.1;
        let all = now - self.start;
        if idle > limit {
            Some(format!(
                "the backend used under {WORK_SECONDS} s of CPU in {idle:.1?} \
                 ({:.1} s in {all:.1?} in all)",
                self.seen - self.first
            ))
        } else if all > limit * WORK_CAP {
            Some(format!(
                "still working at the cap of {WORK_CAP} x {limit:?} ({:.1} s of CPU in all)",
                self.seen - self.first
            ))
        } else {
            None
        }
    }
}

/// A VM to serve.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: &'static str,
    pub memory: &'static str,
    pub group: &'static str,
    /// A NIC on this host tap (pagefold creates it; see `linux_net`).
    pub tap: Option<String>,
    /// A balloon with free page reporting, statistics every second.
    pub balloon: bool,
    /// vCPUs (1 unless [`Spec::with_vcpus`]); all on the one host CPU
    /// the VM is pinned to under the emulated host.
    pub vcpus: u8,
}

impl Spec {
    pub fn new(name: &'static str, memory: &'static str, group: &'static str) -> Self {
        Self {
            name,
            memory,
            group,
            tap: None,
            balloon: false,
            vcpus: 1,
        }
    }

    /// The same VM with `n` vCPUs (a NIC then gets a queue pair each).
    pub fn with_vcpus(mut self, n: u8) -> Self {
        self.vcpus = n;
        self
    }

    /// The same VM with a balloon (free page reporting, statistics every
    /// second).
    pub fn with_balloon(mut self) -> Self {
        self.balloon = true;
        self
    }

    /// The same VM with a NIC on tap `tap`.
    pub fn with_tap(mut self, tap: &str) -> Self {
        self.tap = Some(tap.to_string());
        self
    }
}

/// One served VM's agent ends.
pub struct AgentVm {
    pub name: String,
    pub mailbox: Mailbox,
    pub console: PathBuf,
    /// Its RAM's host addresses, as the server's maps showed them new
    /// when the VM was created (None if they could not be told apart).
    pub ram: Option<std::ops::Range<u64>>,
}

/// A `pagefold serve` process with Linux agent VMs.
pub struct Served {
    child: Option<Child>,
    pub dir: TempDir,
    pub sock: PathBuf,
    pub client: Client,
    pub vms: Vec<AgentVm>,
    stderr: PathBuf,
    /// VMs created so far (deleted ones included).
    created: usize,
}

/// The host CPU VM number `n` (in creation order) is pinned to under the
/// emulated host, None elsewhere: one VM per CPU, the first CPU left free
/// when there are three or more (`pagefold_vmm::host_kind::linux_vm_cpu`).
pub fn emulated_cpu(n: usize) -> Option<usize> {
    let emulated = super::linux_host::host_kind() == super::linux_host::HostKind::EmulatedSvm;
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    pagefold_vmm::host_kind::linux_vm_cpu(emulated, n, cpus)
}

/// The config of one agent VM, with its files in `dir`; `cpu` pins its
/// vCPUs (see [`emulated_cpu`]).
pub fn agent_vm_config(dir: &Path, spec: &Spec, cpu: Option<usize>) -> (VmConfig, AgentVm) {
    let mbox_path = dir.join(format!("{}.mbox", spec.name));
    let console = dir.join(format!("{}.console", spec.name));
    let mailbox = Mailbox::create(&mbox_path).expect("mailbox");
    // PAGEFOLD_TEST_GUEST_APPEND: more guest kernel parameters (experiments).
    let cmdline = match std::env::var("PAGEFOLD_TEST_GUEST_APPEND") {
        Ok(more) => format!("{AGENT_CMDLINE} {more}"),
        Err(_) => AGENT_CMDLINE.to_string(),
    };
    let toml = format!(
        r#"
        name = "{name}"
        vcpus = {vcpus}
        memory = "{memory}"
        serial = {{ file = {console:?} }}
        dedup = {{ group = "{group}" }}
        [kernel]
        path = {kernel:?}
        initrd = {initrd:?}
        cmdline = "{cmdline}"
        disks = [{{ path = {data:?}, readonly = true }}, {{ path = {mbox:?} }}]
        {net}
        {balloon}
        "#,
        name = spec.name,
        vcpus = spec.vcpus,
        memory = spec.memory,
        group = spec.group,
        kernel = image("vmlinux"),
        initrd = image("initrd.img"),
        data = image("data.ext4"),
        mbox = mbox_path,
        net = match &spec.tap {
            Some(t) => format!("net = [{{ tap = {t:?} }}]"),
            None => String::new(),
        },
        balloon = if spec.balloon {
            "balloon = { stats_interval_s = 1 }"
        } else {
            ""
        },
    );
    let mut cfg: VmConfig = toml::from_str(&toml).expect("agent VM config");
    cfg.vcpu_affinity = cpu.map(|c| vec![c]);
    (
        cfg,
        AgentVm {
            name: spec.name.to_string(),
            mailbox,
            console,
            ram: None,
        },
    )
}

impl Served {
    /// Starts `pagefold serve` with `extra_args` (dedup flags), then
    /// creates the VMs of `specs` through the API one after the other,
    /// each once the one before has booted to its agent.
    ///
    /// One after the other because of the emulated host: there, a Linux
    /// guest booting while another one boots sometimes dies early
    /// (docs/linux-guests.md, "The emulated host"). On a hardware host it
    /// costs a few seconds.
    pub fn start(tag: &str, dedup_toml: &str, specs: &[Spec]) -> Served {
        let dir = TempDir::new(tag);
        let sock = dir.path("api.sock");
        let stderr = dir.path("serve.stderr");
        let cfg = dir.path("serve.toml");
        std::fs::write(&cfg, format!("[dedup]\n{dedup_toml}\n")).unwrap();
        let mut cmd = Command::new(bin());
        if std::env::var_os("RUST_LOG").is_none() {
            // Info lines (slow holds of the engine, slow unregisters) are
            // the context a failure prints (`assert_no_warnings`).
            cmd.args(["--log", "info"]);
        }
        let mut child = cmd
            .arg("serve")
            .arg("--api-sock")
            .arg(&sock)
            .arg("--config")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path("serve.stdout")).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn pagefold serve");
        let start = Instant::now();
        while !sock.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "pagefold serve exited {st} before serving:\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "pagefold serve did not create its socket within 60 s:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let client = api_client(&sock);
        let mut served = Served {
            child: Some(child),
            dir,
            sock,
            client,
            vms: Vec::new(),
            stderr,
            created: 0,
        };
        for s in specs {
            served.create(s);
        }
        served
    }

    fn index(&self, name: &str) -> usize {
        self.vms
            .iter()
            .position(|v| v.name == name)
            .unwrap_or_else(|| panic!("no agent VM {name}"))
    }

    /// Adds a VM through `PUT /vms/NAME` and waits for its agent.
    pub fn create(&mut self, spec: &Spec) -> VmInfo {
        let cpu = emulated_cpu(self.created);
        self.created += 1;
        let (vc, mut vm) = agent_vm_config(&self.dir.0, spec, cpu);
        let maps = || std::fs::read_to_string(format!("/proc/{}/maps", self.pid()));
        let before = maps();
        let info = self.client.create_vm(&vc).expect("PUT /vms");
        if let (Ok(before), Ok(after)) = (before, maps()) {
            vm.ram = pagemap_audit::new_anon_range(&before, &after, vc.memory_bytes());
        }
        self.vms.push(vm);
        self.wait_ready(self.vms.len() - 1);
        info
    }

    /// Deletes a VM through `DELETE /vms/NAME` (the API stops it first).
    pub fn delete(&mut self, name: &str) {
        let i = self.index(name);
        self.client.delete_vm(name).expect("DELETE /vms");
        self.vms.remove(i);
    }

    fn wait_ready(&self, i: usize) {
        let vm = &self.vms[i];
        let start = Instant::now();
        while !agent::is_ready(&vm.console).expect("console") {
            if let Some(why) = self.stopped(&vm.name) {
                panic!(
                    "{} stopped before its agent started: {why}\n{}",
                    vm.name,
                    self.console_tail(&vm.name)
                );
            }
            assert!(
                start.elapsed() < BOOT_LIMIT,
                "{}'s agent did not start within {BOOT_LIMIT:?}:\n{}",
                vm.name,
                self.console_tail(&vm.name)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("{}: agent ready after {:.1?}", vm.name, start.elapsed());
    }

    /// Why VM `name` stopped, if it did (or the server died).
    fn stopped(&self, name: &str) -> Option<String> {
        match self.client.vms() {
            Ok(list) => list
                .into_iter()
                .find(|v| v.name == name)
                .and_then(|v| v.outcome.map(|o| format!("{o:?}"))),
            Err(e) => Some(format!("the API does not answer: {e}")),
        }
    }

    pub fn console_tail(&self, name: &str) -> String {
        let vm = &self.vms[self.index(name)];
        let text = std::fs::read_to_string(&vm.console).unwrap_or_default();
        agent::tail(&text, 40)
    }

    /// Posts `script` to the VMs named (all if empty), then waits for each
    /// reply: the guests run it at the same time. Every reply must have
    /// status 0.
    pub fn run_on(&mut self, names: &[&str], script: &str, limit: Duration) -> Vec<Reply> {
        let targets: Vec<usize> = if names.is_empty() {
            (0..self.vms.len()).collect()
        } else {
            names.iter().map(|n| self.index(n)).collect()
        };
        let seqs: Vec<u64> = targets
            .iter()
            .map(|&i| self.vms[i].mailbox.post(script).expect("post to mailbox"))
            .collect();
        targets
            .iter()
            .zip(seqs)
            .map(|(&i, seq)| {
                let name = self.vms[i].name.clone();
                let r = agent::wait_reply(&self.vms[i].console, seq, limit, || self.stopped(&name))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    r.status, 0,
                    "{name}: the script failed ({}):\n{script}\n--- output\n{}",
                    r.status, r.output
                );
                r
            })
            .collect()
    }

    /// Posts `script` to VM `name` and waits for its reply, as `run_on`
    /// does, but returns what went wrong (no reply within `limit`, the VM
    /// stopped, a status other than 0) instead of panicking, so the
    /// caller can gather more before it fails.
    pub fn try_run(&mut self, name: &str, script: &str, limit: Duration) -> Result<Reply, String> {
        let i = self.index(name);
        let seq = self.vms[i].mailbox.post(script).expect("post to mailbox");
        let r = agent::wait_reply(&self.vms[i].console, seq, limit, || self.stopped(name))
            .map_err(|e| format!("{name}: {e}"))?;
        if r.status != 0 {
            return Err(format!(
                "{name}: the script failed ({}):\n{script}\n--- output\n{}",
                r.status, r.output
            ));
        }
        Ok(r)
    }

    /// `run_on` every VM.
    pub fn run_all(&mut self, script: &str, limit: Duration) -> Vec<Reply> {
        self.run_on(&[], script, limit)
    }

    pub fn dedup(&self) -> DedupView {
        self.client
            .dedup()
            .expect("GET /dedup")
            .expect("a dedup backend")
    }

    /// Waits for a quiet moment at which the engine's figures agree
    /// exactly with the server's page tables ([`pagemap_audit`]). The VMs
    /// are paused through the API meanwhile: a Linux guest is never quiet
    /// (timers, logs, the page cache's own writes), and the engine sees a
    /// copy on write only at its next visit of the page, so with the
    /// guests running its figures trail the page tables by the writes of
    /// the last moments.
    pub fn audit(&self, what: &str, limit: Duration) -> Audit {
        let names: Vec<String> = self.vms.iter().map(|v| v.name.clone()).collect();
        for n in &names {
            self.client
                .set_vm_state(n, VmTarget::Paused)
                .unwrap_or_else(|e| panic!("pausing {n}: {e}"));
        }
        let a = self.audit_now(what, limit);
        for n in &names {
            self.client
                .set_vm_state(n, VmTarget::Running)
                .unwrap_or_else(|e| panic!("resuming {n}: {e}"));
        }
        a
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// Pauses (true) or resumes every VM.
    pub fn pause_all(&self, paused: bool) {
        let target = if paused {
            VmTarget::Paused
        } else {
            VmTarget::Running
        };
        for v in &self.vms {
            self.client
                .set_vm_state(&v.name, target)
                .unwrap_or_else(|e| panic!("{target:?} {}: {e}", v.name));
        }
    }

    fn audit_now(&self, what: &str, limit: Duration) -> Audit {
        let pid = self.child.as_ref().expect("server running").id();
        let claimed = || {
            let d = self.dedup();
            let engine = d.backend == "pagefold";
            Claimed {
                pages_sharing: d.pages_sharing,
                pages_shared: engine.then_some(d.pages_shared),
                pool_pages: engine.then_some(d.pool_pages),
            }
        };
        let per_vm = || self.per_vm_pool_pages(pid);
        let a = pagemap_audit::wait_agreement_or_report(what, pid, claimed, limit, per_vm).1;
        eprintln!("{what}: {}", self.per_vm_pool_pages(pid).trim_start());
        a
    }

    /// Each VM's merged pages, the engine's figure beside the kernel's
    /// (pages of its RAM in pool VMAs): which VM's books a disagreement
    /// is in, or none (then a slot's count of mappers is off, as when a
    /// VM left without dropping its references).
    fn per_vm_pool_pages(&self, pid: u32) -> String {
        let d = self.dedup();
        let mut out = String::from("\nper VM, merged pages (engine / kernel):");
        for vm in &self.vms {
            let engine = d.per_owner.get(&vm.name).map(|o| o.pages_merged);
            let kernel = vm.ram.clone().map(|r| pagemap_audit::pool_pages_in(pid, r));
            let mark = if engine.is_some() && engine == kernel {
                ""
            } else {
                "  <-"
            };
            out += &format!("\n  {}: {engine:?} / {kernel:?}{mark}", vm.name);
        }
        out
    }

    /// `PATCH /dedup` with a JSON body of settings (`{"mode": "unmerge"}`).
    pub fn set(&self, settings: serde_json::Value) -> DedupView {
        let p: DedupSettings = serde_json::from_value(settings.clone())
            .unwrap_or_else(|e| panic!("dedup settings {settings}: {e}"));
        self.client.patch_dedup(&p).expect("PATCH /dedup")
    }

    /// Waits until `cond` holds of the dedup view; returns that view.
    ///
    /// `limit` is how long the backend may go without working (its CPU
    /// time, `cpu_seconds`, growing by [`WORK_SECONDS`]); while it works,
    /// the wait goes on up to [`WORK_CAP`] times `limit`. Under the
    /// emulated host a pass over three guests' RAM takes minutes, and
    /// kernel KSM shows nothing for a whole pass after it starts over (its
    /// first look only takes checksums), so a fixed limit fails a backend
    /// that is slow but on its way, while one that stopped still fails
    /// after `limit`.
    pub fn wait_dedup(
        &self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&DedupView) -> bool,
    ) -> DedupView {
        let start = Instant::now();
        let mut work = Work::new(self.dedup().cpu_seconds, start);
        loop {
            let d = self.dedup();
            if cond(&d) {
                eprintln!("{what}: after {:.1?}", start.elapsed());
                return d;
            }
            let now = Instant::now();
            work.see(d.cpu_seconds, now);
            if let Some(why) = work.expired(limit, now) {
                panic!("gave up waiting for {what}: {why}: {d:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// What the server printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Shuts the server down (`PUT /shutdown`), waits for it, and returns
    /// its stderr; the exit status must be 0.
    pub fn shutdown(mut self) -> String {
        let _ = self.client.call("PUT", "/shutdown", None);
        let mut child = self.child.take().expect("server running");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                panic!(
                    "pagefold serve did not stop within 120 s:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = self.stderr();
        assert!(status.success(), "pagefold serve exited {status}:\n{err}");
        err
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if std::thread::panicking() {
                // The test failed while the server ran: its last lines.
                let err = self.stderr();
                let lines: Vec<&str> = err.lines().collect();
                eprintln!(
                    "--- the server's stderr, last lines\n{}",
                    lines[lines.len().saturating_sub(80)..].join("\n")
                );
            }
        }
    }
}

/// Lines of `stderr` at warn level or above.
pub fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(": warn:") || l.contains(": error:"))
        .collect()
}

/// The longest hold of the engine by one wake-up that the server logged
/// (`a wake-up held the engine for 1.2s (...)`, at info level), in
/// seconds, with its line: how close the run came to the health check's
/// 10 s.
pub fn longest_wakeup(stderr: &str) -> Option<(f64, &str)> {
    const MARK: &str = "a wake-up held the engine for ";
    stderr
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find(MARK)? + MARK.len()..];
            let d = rest.split_whitespace().next()?;
            let secs = if let Some(v) = d.strip_suffix("ms") {
                v.parse::<f64>().ok()? / 1e3
            } else if let Some(v) = d.strip_suffix("µs") {
                v.parse::<f64>().ok()? / 1e6
            } else {
                d.strip_suffix('s')?.parse::<f64>().ok()?
            };
            Some((secs, l))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// Asserts that the server printed no warning; else fails with them and
/// the lines before the first one (the context, at `RUST_LOG=info`).
pub fn assert_no_warnings(stderr: &str) {
    let w = warnings(stderr);
    if w.is_empty() {
        return;
    }
    let lines: Vec<&str> = stderr.lines().collect();
    let first = lines.iter().position(|l| *l == w[0]).unwrap_or(0);
    panic!(
        "warnings in a normal run:\n{}\n--- the server's stderr before the first\n{}",
        w.join("\n"),
        lines[first.saturating_sub(60)..first].join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dedup_wait_goes_on_while_the_backend_works_up_to_its_cap() {
        let start = Instant::now();
        let t = |s: u64| start + Duration::from_secs(s);
        let limit = Duration::from_secs(60);
        let mut w = Work::new(10.0, start);
        // A second of CPU every 50 s keeps it going past the limit...
        for s in (50..=200).step_by(50) {
            w.see(10.0 + (s / 50) as f64 * WORK_SECONDS, t(s));
            assert_eq!(w.expired(limit, t(s + 5)), None, "at {s} s");
        }
        // ...up to four times the limit in all.
        w.see(20.0, t(239));
        assert_eq!(w.expired(limit, t(240)), None);
        let why = w.expired(limit, t(241)).expect("past the cap");
        assert!(why.contains("cap"), "{why}");
    }

    #[test]
    fn a_dedup_wait_ends_a_limit_after_the_backend_stops() {
        let start = Instant::now();
        let t = |s: u64| start + Duration::from_secs(s);
        let limit = Duration::from_secs(60);
        let mut w = Work::new(3.0, start);
        w.see(4.5, t(30));
        // Under a second more in the next 60 s: not work.
        w.see(5.4, t(80));
        assert_eq!(w.expired(limit, t(90)), None);
        let why = w.expired(limit, t(91)).expect("a limit without work");
        assert!(why.contains("2.4 s in"), "{why}");
    }
}
