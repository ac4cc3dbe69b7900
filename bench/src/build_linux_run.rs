//! The run loop of the real-Linux `build` benchmark
//! ([`crate::build_linux`]): per run, fresh disk copies, a fresh backend
//! and two fresh VMs; it follows both consoles for the start and result
//! lines and measures on the host between them, as the workload form does.

use std::path::Path;
use std::time::{Duration, Instant};

use pagefold_dedup::auto::ScriptedSource;
use pagefold_dedup::ksm::{ksm_exclusive, snapshot_tunables, KSM_SYSFS};
use pagefold_vmm::config::Config;
use pagefold_vmm::runner::Runner;

use crate::auto_bench::{FREE_AFTER, TOTAL};
use crate::build_bench::{
    end_backend, first_run_context, make_backend, quiet_linux_runner, row, BuildRun, BuildSample,
    BuildSystem, Track,
};
use crate::build_linux::{
    linux_build_cmdline, linux_build_configs, linux_vm_files, LinuxBuildOptions, LinuxBuildReport,
    LinuxGuestInfo, LinuxVmResult, VmFiles, LINUX_BUILD_COMMAND, LINUX_BUILD_VMS,
};
use crate::disk_copy::copy_disk;
use crate::error::{input_err, linux_vm_err, BenchError};
use crate::host::HostId;
use crate::linux_console::ConsoleWatch;
use crate::linux_result::LinuxBuildResult;
use pagefold_vmm::host_kind::{
    emulated_host, host_kvm_kind, linux_guest_refusal_with, linux_vm_cpu,
};

/// A console silent this long before its result line ends the run: the
/// guest prints a progress line a minute, so it stopped (under the
/// emulated host, an emulator fault: docs/linux-guests.md).
const SILENCE_LIMIT: Duration = Duration::from_secs(600);

/// Runs every system `opts.runs` times (interleaved, as the workload
/// form), holding the KSM lock; refuses at once on a host without
/// VMX/SVM.
pub fn run_linux_build_bench(
    systems: &[BuildSystem],
    opts: &LinuxBuildOptions,
) -> Result<LinuxBuildReport, BenchError> {
    let emulated = emulated_host();
    if !emulated {
        let instead = "On such a host, run it inside the emulated host (docs/benchmarks.md): \
                       scripts/emulated-host.sh --scratch 8G --file DIR/build.ext4 --guest DIR/guest -- \
                       pagefold bench build --guest linux --disk /in/build.ext4 --kernel /guest/vmlinux \
                       --initrd /guest/initrd.img --work-dir /scratch";
        if let Some(why) = linux_guest_refusal_with(host_kvm_kind(), LINUX_BUILD_COMMAND, instead) {
            return Err(BenchError::HostUnsupported(why));
        }
    }
    if systems.is_empty() || opts.runs == 0 {
        return Err(BenchError::NoSystems);
    }
    // The targets go on the guests' kernel command line.
    let plain = |t: &String| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b))
    };
    if let Some(bad) = opts.targets.iter().find(|t| !plain(t)) {
        return Err(input_err(format!(
            "make target {bad:?}: only letters, digits and _./- are allowed"
        )));
    }
    let disk_bytes = std::fs::metadata(&opts.disk)
        .map_err(|e| input_err(format!("disk image {}: {e}", opts.disk.display())))?
        .len();
    let dir = opts
        .work_dir()
        .join(format!("pagefold-linux-build-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| BenchError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    // Check the configs as the VMM will (kernel format, files, memory)
    // before the first copy.
    let originals: Vec<VmFiles> = linux_vm_files(&dir, "check", 0)
        .into_iter()
        .map(|f| VmFiles {
            disk: opts.disk.clone(),
            ..f
        })
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let vm_cpus = [
        linux_vm_cpu(emulated, 0, cpus),
        linux_vm_cpu(emulated, 1, cpus),
    ];
    for c in linux_build_configs(opts, &originals, vm_cpus) {
        c.validate().map_err(input_err)?;
    }
    let _lock = ksm_exclusive()?;
    let root = Path::new(KSM_SYSFS);
    let before = snapshot_tunables(root);
    let mut runs: Vec<Vec<BuildRun>> = vec![Vec::new(); systems.len()];
    let host = HostId::current();
    let mut loads = vec![[0.0; 3]; systems.len()];
    let mut warnings: Vec<Vec<String>> = vec![Vec::new(); systems.len()];
    let mut results = Vec::new();
    let mut targets = None;
    let mut result = Ok(());
    'outer: for run in 0..opts.runs {
        for (i, s) in systems.iter().enumerate() {
            if run == 0 {
                (loads[i], warnings[i]) = first_run_context(*s);
            }
            if opts.progress {
                eprintln!("[linux build] {} run {}/{}", s.name(), run + 1, opts.runs);
            }
            match run_linux_once(*s, opts, &dir, run, vm_cpus) {
                Ok((r, vm_results, t)) => {
                    targets = targets.or(t);
                    if opts.progress {
                        eprintln!(
                            "[linux build] {} run {}: real {:.1} s, user {:.1} s, sys {:.1} s, engine {:.2} s, npages {}, guests parked {:.1} s",
                            s.name(), run + 1, r.real_s, r.user_s, r.sys_s, r.engine_cpu_s, r.npages,
                            r.samples.last().map_or(0.0, |x| x.parked_s)
                        );
                        if let Some(o) = &r.origins {
                            eprintln!(
                                "[linux build] {} run {}: {}",
                                s.name(),
                                run + 1,
                                origins_line(o)
                            );
                        }
                    }
                    runs[i].push(r);
                    for (vm, result) in LINUX_BUILD_VMS.iter().zip(vm_results) {
                        results.push(LinuxVmResult {
                            system: s.name().into(),
                            run: run + 1,
                            vm: (*vm).into(),
                            result,
                        });
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break 'outer;
                }
            }
        }
    }
    let unrestored = crate::host::unrestored_tunables(root, &before);
    result?;
    let reference = results.first().and_then(|r| r.result.sha256.clone());
    let want = results.first().map_or(0, |r| r.result.checksum());
    let rows = systems
        .iter()
        .zip(runs)
        .zip(loads.into_iter().zip(warnings))
        .map(|((s, r), (load, w))| row(s.name(), r, want, &host, load, w))
        .collect();
    Ok(LinuxBuildReport {
        guest: LinuxGuestInfo {
            kernel: opts.kernel.display().to_string(),
            initrd: opts.initrd.as_ref().map(|p| p.display().to_string()),
            disk: opts.disk.display().to_string(),
            disk_bytes,
            memory: opts.memory.clone(),
            vcpus: opts.vcpus,
            cmdline: linux_build_cmdline(opts.timeout, &opts.targets),
            console_dir: dir.display().to_string(),
            targets,
            reference_sha256: reference,
            free_page_reporting: opts.free_page_reporting,
        },
        rows,
        results,
        unrestored,
    })
}

fn console_error(w: &ConsoleWatch, vm: &str, what: &str) -> String {
    format!(
        "VM {vm}: {what} (console log {}); its last lines:\n{}",
        w.path().display(),
        w.tail()
    )
}

/// A run's figures, both guests' result lines, and what they built.
type LinuxRunOut = (BuildRun, Vec<LinuxBuildResult>, Option<String>);

/// One run: fresh disk copies, fresh backend, two fresh VMs, both builds.
fn run_linux_once(
    s: BuildSystem,
    opts: &LinuxBuildOptions,
    dir: &Path,
    run: usize,
    vm_cpus: [Option<usize>; 2],
) -> Result<LinuxRunOut, BenchError> {
    let files = linux_vm_files(dir, s.name(), run);
    let remove_disks = || {
        for f in &files {
            let _ = std::fs::remove_file(&f.disk);
        }
    };
    for f in &files {
        let kind = copy_disk(&opts.disk, &f.disk).map_err(|source| {
            remove_disks();
            BenchError::Write {
                path: f.disk.display().to_string(),
                source,
            }
        })?;
        if opts.progress {
            eprintln!("[linux build] {} ({kind:?} copy)", f.disk.display());
        }
    }
    let out = drive(s, opts, &files, vm_cpus);
    remove_disks();
    out
}

fn drive(
    s: BuildSystem,
    opts: &LinuxBuildOptions,
    files: &[VmFiles],
    vm_cpus: [Option<usize>; 2],
) -> Result<LinuxRunOut, BenchError> {
    let (backend, script) = make_backend(s)?;
    let cfg = Config {
        dedup: Default::default(),
        vms: linux_build_configs(opts, files, vm_cpus),
        stdin: None,
        // Benchmarks run their VMs in-process without the VMM's filters.
        seccomp: Some(false),
    };
    let mut runner = quiet_linux_runner(s, &backend)?;
    if let Err(err) = runner.start_all(&cfg) {
        drop(runner);
        end_backend(s, backend.as_ref());
        return Err(linux_vm_err(err));
    }
    let mut watches: Vec<ConsoleWatch> = files
        .iter()
        .map(|f| ConsoleWatch::new(&f.console))
        .collect();
    let t_run = Instant::now();
    let mut tr = Track::default();
    let report = runner.run(|r| {
        if tr.done.is_some() || tr.error.is_some() {
            return;
        }
        let fail = |tr: &mut Track, r: &mut Runner, e: String| {
            tr.error = Some(e);
            r.stop_all("a Linux build failed");
        };
        if t_run.elapsed() > opts.timeout {
            return fail(
                &mut tr,
                r,
                format!("the builds did not finish in {:?}", opts.timeout),
            );
        }
        for (w, vm) in watches.iter_mut().zip(LINUX_BUILD_VMS) {
            if let Err(e) = w.poll() {
                return fail(&mut tr, r, format!("reading {}: {e}", w.path().display()));
            }
            if let Some(p) = &w.panic {
                // A panicked guest never prints its result: end the run
                // now rather than at the timeout, hours later.
                let what = match &w.first_report {
                    Some(first) => {
                        format!("the guest kernel panicked ({p}; first report: {first})")
                    }
                    None => format!("the guest kernel panicked ({p})"),
                };
                return fail(&mut tr, r, console_error(w, vm, &what));
            }
            if w.result.is_none() && w.silent_for() > SILENCE_LIMIT {
                let what = format!(
                    "the guest printed nothing for {} s before its result line \
                     (a build guest prints a line a minute)",
                    w.silent_for().as_secs()
                );
                return fail(&mut tr, r, console_error(w, vm, &what));
            }
            match &w.result {
                Some(Err(e)) => return fail(&mut tr, r, console_error(w, vm, &e.to_string())),
                Some(Ok(res)) if res.status != 0 => {
                    let what = format!("the build failed (status {})", res.status);
                    return fail(&mut tr, r, console_error(w, vm, &what));
                }
                Some(Ok(_)) => {}
                None if r.summary(vm).is_none() => {
                    let what = "the VM stopped before printing its result line";
                    return fail(&mut tr, r, console_error(w, vm, what));
                }
                None => {}
            }
        }
        if tr.started.is_none() && watches.iter().all(|w| w.started) {
            tr.start(r);
        }
        let Some((t0, _, _)) = tr.started else { return };
        if let (Some(h), None) = (&script, tr.trigger_s) {
            if t0.elapsed() >= opts.auto_trigger_after {
                h.set(ScriptedSource::sample(TOTAL, FREE_AFTER));
                tr.trigger_s = Some(t0.elapsed().as_secs_f64());
            }
        }
        let finished = watches.iter().all(|w| matches!(w.result, Some(Ok(_))));
        let due = tr
            .last_sample
            .is_none_or(|l| l.elapsed() >= opts.sample_interval);
        if due || finished {
            tr.last_sample = Some(Instant::now());
            let st = r.dedup().map(|b| b.stats());
            let x = BuildSample::of(t0.elapsed().as_secs_f64(), st.as_ref()).parked(r);
            tr.samples.push(x);
            if opts.progress && tr.samples.len() % 60 == 0 {
                eprintln!(
                    "[linux build {}] {:6.0} s: npages {}, full scans {}, merges {}, COW breaks {}, settle {} ms, CPU {:.1} s ({:.1} s merging, {:.1} s ksmd's), guests parked {:.1} s",
                    s.name(),
                    x.t_s,
                    x.npages,
                    x.full_scans,
                    x.merges,
                    x.cow_breaks,
                    x.settle_ms,
                    x.cpu_s,
                    x.merge_cpu_s,
                    x.ksm_cpu_s,
                    x.parked_s
                );
            }
        }
        if finished {
            tr.finish(r);
        }
    });
    drop(runner);
    end_backend(s, backend.as_ref());
    let report = report.map_err(linux_vm_err)?;
    if let Some(e) = tr.error {
        // How each VM ended says why a guest stopped (e.g. a KVM error).
        let ends: Vec<String> = report
            .vms
            .iter()
            .map(|v| format!("{}: {}", v.name, v.outcome))
            .collect();
        return Err(linux_vm_err(format!("{e}\nVMs ended: {}", ends.join("; "))));
    }
    if !tr.finished() {
        return Err(linux_vm_err("the builds did not finish"));
    }
    let targets = watches.iter().find_map(|w| w.targets.clone());
    let results: Vec<LinuxBuildResult> = watches
        .into_iter()
        .filter_map(|w| w.result.and_then(Result::ok))
        .collect();
    let real_s = results.iter().map(|r| r.real_s).fold(0.0, f64::max);
    let guest_cpu_s =
        results.iter().map(|r| r.user_s + r.sys_s).sum::<f64>() / results.len() as f64;
    let checksums = results.iter().map(LinuxBuildResult::checksum).collect();
    let run = tr
        .into_run(real_s, guest_cpu_s, checksums)
        .ok_or_else(|| linux_vm_err("the builds did not finish"))?;
    Ok((run, results, targets))
}

/// Merges and COW breaks by the rule that let each page merge, in one
/// line: which merges the guests undid.
fn origins_line(o: &pagefold_dedup::MergeOrigins) -> String {
    let by = |b: &pagefold_dedup::ByOrigin| {
        format!(
            "steady {}, second look {}, first sight {}, hinted {}",
            b.steady, b.second_look, b.first_sight, b.hinted
        )
    };
    format!(
        "merges ({}; {} to zero), COW breaks ({}; {} zero refills)",
        by(&o.merges),
        o.zero_merges,
        by(&o.cow_breaks),
        o.zero_refills
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    /// The run loop on real VMs, as far as a PVM host goes: both guests
    /// stop in early boot (KVM's emulator), so the run must end with an
    /// error that names the VM and shows its console, and remove the disk
    /// copies. Emulated boots take minutes of CPU, so it is ignored by
    /// default; run it with the image of scripts/guest-image.sh:
    /// `PAGEFOLD_GUEST_DIR=DIR cargo test -p pagefold-bench --lib -- --ignored pvm_guests`
    #[test]
    #[ignore]
    fn pvm_guests_stop_before_their_result_and_the_run_says_so() {
        if host_kvm_kind() != pagefold_vmm::host_kind::KvmKind::Pvm {
            eprintln!("SKIPPED: not a PVM host");
            return;
        }
        let guest =
            PathBuf::from(std::env::var_os("PAGEFOLD_GUEST_DIR").expect("PAGEFOLD_GUEST_DIR"));
        let work = std::env::temp_dir().join(format!("pagefold-linux-pvm-{}", std::process::id()));
        std::fs::create_dir_all(&work).unwrap();
        let opts = LinuxBuildOptions {
            memory: "256M".into(),
            vcpus: 1,
            runs: 1,
            timeout: Duration::from_secs(900),
            work_dir: Some(work.clone()),
            progress: false,
            ..LinuxBuildOptions::new(guest.join("vmlinux"), guest.join("rootfs.ext4"))
        };
        let t = Instant::now();
        let e = run_linux_once(BuildSystem::PagefoldOn, &opts, &work, 0, [None; 2])
            .unwrap_err()
            .to_string();
        eprintln!("run ended after {:?}: {e}", t.elapsed());
        assert!(
            e.contains("the VM stopped before printing its result line"),
            "{e}"
        );
        assert!(e.contains("VM linux-"), "{e}");
        // The emulator's stop, as the VM's outcome.
        assert!(e.contains("KVM internal error"), "{e}");
        let mut shown = 0;
        for f in linux_vm_files(&work, "pagefold-on", 0) {
            assert!(!f.disk.exists(), "disk copy left: {}", f.disk.display());
            let console = std::fs::read_to_string(&f.console).unwrap();
            assert!(console.contains("Linux version"), "{console}");
            // The failing VM's last console line is in the message.
            let last = console.lines().last().unwrap().trim_end();
            shown += usize::from(e.contains(last));
        }
        assert!(shown >= 1, "no console tail in: {e}");
        std::fs::remove_dir_all(&work).unwrap();
    }

    #[test]
    fn refuses_on_a_host_without_vmx_or_svm_before_touching_files() {
        if emulated_host() || linux_guest_refusal_with(host_kvm_kind(), "x", "").is_none() {
            eprintln!("SKIPPED: this host has VMX/SVM; the refusal is for PVM hosts");
            return;
        }
        let opts =
            LinuxBuildOptions::new("/nonexistent/vmlinux".into(), "/nonexistent/disk".into());
        let t = Instant::now();
        let e = run_linux_build_bench(&[BuildSystem::Off], &opts).unwrap_err();
        assert!(matches!(e, BenchError::HostUnsupported(_)), "{e}");
        assert!(e.to_string().contains("VMX/SVM"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
