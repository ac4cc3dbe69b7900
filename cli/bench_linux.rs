//! `pagefold bench build --guest linux`: the real-Linux form of the build
//! benchmark (docs/benchmarks.md). Flag checks and outputs only; the work
//! is `pagefold_bench::run_linux_build_bench`, which refuses at once on a
//! host without VMX/SVM (exit code 4).

use std::time::Duration;

use pagefold_bench::{
    linux_build_chart, linux_build_json, linux_build_markdown, linux_build_table,
    run_linux_build_bench, BuildSystem, LinuxBuildOptions,
};

use crate::bench::{bench_err, write_outputs, BuildArgs};
use crate::error::Error;

pub fn build_linux(a: BuildArgs, systems: Vec<BuildSystem>) -> Result<i32, Error> {
    let (Some(kernel), Some(disk)) = (a.kernel.clone(), a.disk.clone()) else {
        return Err(Error::Usage(
            "--guest linux needs --kernel and --disk (see scripts/linux-build-bench.sh)".into(),
        ));
    };
    if a.runs == 0 {
        return Err(Error::Usage("--runs must be above 0".into()));
    }
    let defaults = LinuxBuildOptions::new(kernel, disk);
    let opts = LinuxBuildOptions {
        initrd: a.initrd.clone(),
        memory: a.memory.clone(),
        vcpus: a.vcpus,
        runs: a.runs,
        timeout: a.timeout_secs.map_or(defaults.timeout, Duration::from_secs),
        ..defaults
    };
    let report = run_linux_build_bench(&systems, &opts).map_err(bench_err)?;
    crate::output::write_out_or_drop(&linux_build_table(&report))?;
    let json = linux_build_json(&report).map_err(bench_err)?;
    write_outputs(
        &a.out,
        json,
        linux_build_chart(&report),
        linux_build_markdown(&report),
    )?;
    let agree = report.rows.iter().all(|r| r.checksums_agree);
    if !agree {
        eprintln!("the guests' vmlinux hashes differ between builds");
    }
    Ok(if report.unrestored.is_empty() && agree {
        0
    } else {
        1
    })
}
