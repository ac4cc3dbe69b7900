//! `pagefold bench ...`: benchmarks against the kernel's KSM.

use clap::Subcommand;

use crate::cli::Error;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// The 2022 KSM auto-mode test (300 MiB, shapes full and sparse), for
    /// kernel KSM and pagefold at their defaults and at maximum effort.
    KsmSeed,
}

pub fn run(cmd: BenchCommand) -> Result<i32, Error> {
    match cmd {
        BenchCommand::KsmSeed => Err(Error::Usage("pagefold bench ksm-seed: being wired in".into())),
    }
}
