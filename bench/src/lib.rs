//! Benchmarks: pagefold against in-kernel KSM, side by side.
//!
//! - `ksm-seed` ([`run_ksm_seed`]): the 2022 auto-mode test's 300 MiB region
//!   (`full` and `sparse`), time and CPU to converge, for every [`System`].
//! - `auto` ([`run_auto`]): auto mode reacting to a scripted memory drop.
//!
//! Both hold the KSM lock ([`pagefold_dedup::ksm::ksm_exclusive`]) and leave
//! every KSM tunable as found. See docs/benchmarks.md.

mod auto_bench;
mod error;
mod region;
mod report;
mod seed;
mod settle;
mod svg;
mod system;

pub use auto_bench::{bench_auto_config, run_auto, AutoFactory, AutoOptions, AutoRow, AutoSystem};
pub use error::BenchError;
pub use region::{Region, Shape, PAGE, SEED_REGION_BYTES};
pub use report::{rows_json, table, write_file};
pub use seed::{run_ksm_seed, run_seed_once, SeedOptions, SeedReport, SeedRow, Series};
pub use settle::{Sample, Settled, Settler};
pub use svg::{nice_step, render, seed_chart, simplify, Line, Panel};
pub use system::{all_systems, ksm_systems, BackendFactory, System, DEFAULT_KNOBS, MAX_KNOBS};
