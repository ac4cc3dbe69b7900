//! `pagefold`: run KVM VMs with guest-memory deduplication.

// `pagefold bench`: the benchmarks with the `bench` feature, else a stub
// that says how to build them.
#[cfg(feature = "bench")]
mod bench;
#[cfg(not(feature = "bench"))]
#[path = "no_bench.rs"]
mod bench;
mod cli;
mod docs_gen;
mod error;
mod ksm;
mod logging;
mod notify;
mod output;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    pagefold_vmm::runner::mark_process_start();
    pagefold_api::metrics::set_build_info(cli::build_info());
    let args = cli::Cli::parse();
    let code = match cli::dispatch(args) {
        Ok(code) => code,
        // The reader of our output went away: nothing to say, nobody to
        // say it to (like other Unix tools; see cli/output.rs).
        Err(error::Error::StdoutClosed) => 0,
        Err(e) => {
            eprintln!("pagefold: error: {e}");
            e.exit_code()
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
