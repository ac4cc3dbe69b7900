//! `pagefold bench` in a build without the `bench` feature. The production
//! binary links no benchmarks (no charts, no reports, no plotters); rather
//! than clap's "unrecognized subcommand", whoever types `pagefold bench`
//! learns that this build has none and how to get them.

use clap::Args;

use crate::error::Error;

/// Whatever follows `pagefold bench` (`--help` included): the answer is
/// the same.
#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// What `pagefold bench` says in this build.
pub const NO_BENCH: &str = "this pagefold was built without benchmarks: \
build it with the `bench` feature (cargo build --release --features bench)";

/// Always a usage error (exit status 2).
pub fn run(_: BenchArgs) -> Result<i32, Error> {
    Err(Error::Usage(NO_BENCH.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_how_to_build_the_benchmarks_with_exit_status_2() {
        let e = run(BenchArgs { rest: Vec::new() }).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--features bench"), "{e}");
    }
}
