//! Benchmarks: pagefold against in-kernel KSM, side by side.
//!
//! - `ksm-seed` ([`run_ksm_seed`]): the 2022 auto-mode test's 300 MiB region
//!   (`full` and `sparse`), two regions with the same pages in random order
//!   (`scattered`), optionally two identical workload VMs; time and CPU to
//!   converge, saving, VMAs, for every [`System`].
//! - `auto` ([`run_auto_all`]): auto mode reacting to a scripted memory drop
//!   in two identical workload VMs.
//!
//! - `build` ([`run_build_bench`]): two workload VMs build one source tree
//!   side by side, `runs` times per system; mean and stdev of build time,
//!   process CPU, engine CPU and merged pages.
//!
//!   Its real-Linux form ([`run_linux_build_bench`]) boots two Linux VMs
//!   building the kernel with `make -j` (hosts with VMX/SVM only).
//!
//! - `linux-read` ([`run_linux_read_bench`]): two Linux guests read the
//!   same files; how much of it each system merges, and how soon (hosts
//!   with VMX/SVM, or the emulated host).
//!
//! - `linux-free` ([`run_linux_free_bench`]): two Linux guests do the
//!   same work and free most of it; the host memory they cost with dedup
//!   and free page reporting each on or off, and with kernel KSM.
//!
//! - `latency` ([`run_latency_bench`]): two identical workload VMs run the
//!   guest-side pause probe while each system merges them and while they
//!   rewrite merged pages; pause percentiles, stopped time, COW breaks.
//!
//! - `side-channel` ([`run_side_channel_bench`]): a workload guest times
//!   its writes (and a read right after each) to tell which of its pages
//!   each system merged with another VM's (or as zero pages); the attack's
//!   accuracy, the saving, the engine's CPU.
//!
//! docs/results/results.md is rendered from the runs' JSON by
//! [`results_page`] (the `results-page` binary, scripts/results-page.sh).
//!
//! All hold the KSM lock ([`pagefold_dedup::ksm::ksm_exclusive`]) and leave
//! every KSM tunable as found. See docs/benchmarks.md.

mod auto_bench;
mod auto_report;
mod build_bench;
mod build_linux;
mod build_linux_report;
mod build_linux_run;
mod build_report;
mod chart;
mod disk_copy;
mod error;
mod guest_latency;
mod host;
mod host_frames;
mod latency;
mod latency_bench;
mod latency_report;
mod latency_run;
mod latency_vms;
mod linux_agents;
mod linux_console;
mod linux_free;
mod linux_free_report;
mod linux_free_run;
mod linux_read;
mod linux_read_report;
mod linux_read_run;
mod linux_result;
mod page_census;
mod ratio;
mod region;
mod report;
mod results_page;
mod seed;
mod settle;
mod side_channel;
mod side_channel_report;
mod system;
mod table;
mod target;
mod vms;

pub use auto_bench::{
    bench_auto_config, run_auto, run_auto_all, select_auto_systems, AutoFactory, AutoOptions,
    AutoReport, AutoRow, AutoSample, AutoSeries, AutoSystem, AUTO_SYSTEM_NAMES,
};
pub use auto_report::{auto_chart, auto_goals, auto_json, auto_markdown, auto_table};
pub use build_bench::{
    build_configs, mean_stdev, run_build_bench, select_build_systems, self_rusage, BuildOptions,
    BuildReport, BuildRow, BuildRun, BuildSample, BuildSystem, BUILD_SYSTEM_NAMES, KSM_10000_KNOBS,
};
pub use build_linux::{
    linux_build_cmdline, linux_build_configs, linux_vm_files, LinuxBuildOptions, LinuxBuildReport,
    LinuxGuestInfo, LinuxVmResult, VmFiles, BUILD_INIT, LINUX_BUILD_COMMAND, LINUX_BUILD_GROUP,
    LINUX_BUILD_VMS,
};
pub use build_linux_report::{
    linux_build_chart, linux_build_goals, linux_build_json, linux_build_markdown, linux_build_table,
};
pub use build_linux_run::run_linux_build_bench;
pub use build_report::{build_chart, build_goals, build_json, build_markdown, build_table};
pub use chart::{
    nice_step, png_path, simplify, Chart, ChartError, Line, Panel, PANEL_HEIGHT, WIDTH,
};
pub use disk_copy::{copy_disk, CopyKind};
pub use error::BenchError;
pub use host::{kernel_release, load_avg, mem_available, other_ksm_users};
pub use latency::{
    select_latency_systems, LatencyOptions, LatencyReport, LatencyRow, LatencyShape, LatencySystem,
    ProbePhase, LATENCY_SYSTEM_NAMES,
};
pub use latency_bench::run_latency_bench;
pub use latency_report::{
    latency_chart, latency_goals, latency_json, latency_markdown, latency_table,
};
pub use latency_vms::{program as latency_program, ProbePair, ProbeResult};
pub use linux_console::ConsoleWatch;
pub use linux_free::{
    select_linux_free_systems, FreeSample, FreeSystem, LinuxFreeOptions, LinuxFreeReport,
    LinuxFreeRow, LINUX_FREE_COMMAND, LINUX_FREE_SYSTEMS,
};
pub use linux_free_report::{
    linux_free_chart, linux_free_goals, linux_free_json, linux_free_markdown, linux_free_table,
};
pub use linux_free_run::run_linux_free_bench;
pub use linux_read::{
    agent_files, agent_vm_config, md5s_agree, parse_md5s, select_linux_read_systems, t_final_s,
    vm_cpu, AgentFiles, LinuxReadGuest, LinuxReadOptions, LinuxReadReport, LinuxReadRow,
    LinuxReadSample, Md5s, AGENT_CMDLINE, HASHED_FILES, KSM_4096_KNOBS, LINUX_READ_COMMAND,
    LINUX_READ_GROUP, LINUX_READ_SYSTEM_NAMES, LINUX_READ_VMS, RATIO_BASE, READ_SCRIPT,
    T_FINAL_SHARE,
};
pub use linux_read_report::{
    linux_read_chart, linux_read_goals, linux_read_json, linux_read_markdown,
};
pub use linux_read_run::run_linux_read_bench;
pub use linux_result::{
    parse_result_line, LinuxBuildResult, ResultLineError, RESULT_MARKER, START_MARKER,
};
/// The build benchmark's tree description (from the guest ABI).
pub use pagefold_guest_abi::build::TreeSpec;
pub use ratio::{fmt_ratio, ratio, Goal};
pub use region::{Region, Shape, PAGE, SCATTERED_REGION_BYTES, SCATTERED_SEED, SEED_REGION_BYTES};
pub use report::{
    cpu_vs_ksm_max, rows_json, seed_chart, seed_goals, seed_markdown, speedup_vs_ksm_default,
    table, write_file,
};
pub use results_page::{
    results_page, PageError, MAX_PAGE_LINES, MAX_RESULT_FILES, PAGE_FILE, RUNS_FILE,
};
pub use seed::{
    fill_pct_of_ksm, run_ksm_seed, run_seed_once, SeedOptions, SeedReport, SeedRow, Series,
};
pub use settle::{Sample, Settled, Settler};
pub use side_channel::{
    attack_configs, run_side_channel_bench, select_side_channel_systems, AttackSystem, Grouping,
    SideChannelOptions, SideChannelReport, SideChannelRow, Variant, ATTACKER,
    SIDE_CHANNEL_SYSTEM_NAMES, VICTIM,
};
pub use side_channel_report::{
    side_channel_chart, side_channel_goals, side_channel_json, side_channel_markdown,
    side_channel_table,
};
pub use system::{
    all_systems, engine_factory, ksm_systems, select_systems, BackendFactory, System,
    KSM_DEFAULT_KNOBS, MAX_KNOBS, SYSTEM_NAMES,
};
pub use target::{make_regions, Attached, Case, RegionSizes};
pub use vms::{Expected, Placement, VmOptions, VmPair};
