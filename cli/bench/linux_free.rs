//! `pagefold bench linux-free` (docs/benchmarks.md): its flags and
//! outputs; the work is `pagefold_bench::run_linux_free_bench`.

use std::time::Duration;

use clap::Args;
use pagefold_bench::{
    linux_free_chart, linux_free_json, linux_free_markdown, linux_free_table, run_linux_free_bench,
    select_linux_free_systems, LinuxFreeOptions,
};

use super::{bench_err, check_linux_timing, write_outputs, Outputs};
use crate::error::Error;

#[derive(Args, Debug)]
pub struct LinuxFreeArgs {
    #[command(flatten)]
    pub out: Outputs,
    /// Comma-separated subset of off, pagefold-on, fpr, pagefold-fpr,
    /// ksm-fpr, run in that order (default: all): dedup off, pagefold's
    /// engine or kernel KSM (4096 pages / 20 ms), with free page reporting
    /// (the -fpr ones) or without.
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// The guest image directory of scripts/guest-image.sh (vmlinux,
    /// initrd.img, data.ext4).
    #[arg(long, value_name = "DIR", default_value = "target/guest-img")]
    pub guest: std::path::PathBuf,
    /// RAM per VM.
    #[arg(long, default_value = "512M")]
    pub memory: String,
    /// Seconds from both guests' work to the free: what the mergers get.
    #[arg(long, value_name = "SECS", default_value_t = 40)]
    pub hold: u64,
    /// Seconds to keep sampling after both guests freed.
    #[arg(long, value_name = "SECS", default_value_t = 40)]
    pub idle: u64,
    /// Seconds between samples of the host's memory (0.05 to 60).
    #[arg(long, value_name = "SECS", default_value_t = 0.5)]
    pub sample_interval: f64,
    /// Give up on one system after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout: u64,
    /// Where the mailboxes and console logs go (default: a new directory
    /// under the temporary directory; the console logs are kept).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// Set the guests' page_reporting_order (report free blocks of
    /// 2^ORDER pages and up; 0 to 10) before the work (default: leave
    /// their kernel's, 9 on x86: 2 MiB blocks).
    #[arg(long, value_name = "ORDER", value_parser = clap::value_parser!(u32).range(0..=10))]
    pub reporting_order: Option<u32>,
}

/// The options the flags ask for.
fn options(a: &LinuxFreeArgs) -> Result<LinuxFreeOptions, Error> {
    check_linux_timing(a.sample_interval, a.timeout)?;
    Ok(LinuxFreeOptions {
        guest_dir: a.guest.clone(),
        memory: a.memory.clone(),
        sample_interval: Duration::from_secs_f64(a.sample_interval),
        hold: Duration::from_secs(a.hold),
        idle: Duration::from_secs(a.idle),
        timeout: Duration::from_secs(a.timeout),
        work_dir: a.work_dir.clone(),
        reporting_order: a.reporting_order,
        progress: true,
    })
}

/// Runs it: refuses at once on a host without VMX/SVM outside the
/// emulated host (exit code 4); exit code 1 when the guests' kept data
/// differed or a KSM tunable was not restored.
pub fn linux_free(a: LinuxFreeArgs) -> Result<i32, Error> {
    let systems = select_linux_free_systems(&a.systems).map_err(bench_err)?;
    let opts = options(&a)?;
    let report = run_linux_free_bench(&systems, &opts).map_err(bench_err)?;
    crate::output::write_out_or_drop(&linux_free_table(&report))?;
    let json = linux_free_json(&report).map_err(bench_err)?;
    write_outputs(
        &a.out,
        json,
        linux_free_chart(&report),
        linux_free_markdown(&report),
    )?;
    let ok = report.md5_ok();
    if !ok {
        eprintln!("guest data integrity: a guest's kept data changed (see the table)");
    }
    Ok(if report.unrestored.is_empty() && ok {
        0
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::parse;
    use crate::bench::BenchCommand;

    fn args(args: &[&str]) -> LinuxFreeArgs {
        match parse("linux-free", args) {
            BenchCommand::LinuxFree(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn linux_free_flags() {
        let o = options(&args(&[])).unwrap();
        let d = LinuxFreeOptions::default();
        assert_eq!(o.guest_dir, d.guest_dir);
        assert_eq!(
            (
                o.memory.as_str(),
                o.sample_interval,
                o.hold,
                o.idle,
                o.timeout
            ),
            (
                "512M",
                Duration::from_millis(500),
                Duration::from_secs(40),
                Duration::from_secs(40),
                Duration::from_secs(900)
            )
        );
        let names: Vec<_> = select_linux_free_systems(&args(&[]).systems)
            .unwrap()
            .iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(
            names,
            ["off", "pagefold-on", "fpr", "pagefold-fpr", "ksm-fpr"]
        );
        let a = args(&[
            "--guest",
            "/guest",
            "--memory",
            "384M",
            "--systems",
            "pagefold-fpr,pagefold-on",
            "--hold",
            "20",
            "--idle",
            "30",
            "--sample-interval",
            "1",
            "--json-file",
            "/out/lf.json",
            "--plot",
            "/out/lf.svg",
        ]);
        let o = options(&a).unwrap();
        assert_eq!(o.guest_dir, std::path::PathBuf::from("/guest"));
        assert_eq!(
            (o.memory.as_str(), o.hold, o.idle, o.sample_interval),
            (
                "384M",
                Duration::from_secs(20),
                Duration::from_secs(30),
                Duration::from_secs(1)
            )
        );
        assert_eq!(a.out.json.as_deref(), Some("/out/lf.json"));
        assert_eq!(a.out.plot.as_deref(), Some("/out/lf.svg"));
        assert_eq!(select_linux_free_systems(&a.systems).unwrap().len(), 2);
        for bad in ["0", "61", "0.01"] {
            assert!(
                options(&args(&["--sample-interval", bad])).is_err(),
                "{bad}"
            );
        }
        assert!(options(&args(&["--timeout", "0"])).is_err());
        assert_eq!(o.reporting_order, None);
        let o = options(&args(&["--reporting-order", "5"])).unwrap();
        assert_eq!(o.reporting_order, Some(5));
        let head = ["bench", "linux-free", "--reporting-order", "11"];
        assert!(crate::bench::tests::try_parse(&head).is_err());
        let a = args(&["--systems", "ksm-4096"]);
        assert!(select_linux_free_systems(&a.systems).is_err());
    }
}
