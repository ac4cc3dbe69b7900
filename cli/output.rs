//! Standard output for the CLI. A reader that goes away early
//! (`pagefold status | head -1`) is normal for a Unix tool: `println!`
//! would panic ("failed printing to stdout: Broken pipe", exit 101), so
//! every line goes through [`write_out`], which turns a closed pipe into
//! [`Error::StdoutClosed`]: the command ends quietly with exit status 0.

use std::io::Write;

use crate::error::Error;

/// Writes `s` to stdout and flushes it; a closed pipe is
/// [`Error::StdoutClosed`], any other failure [`Error::Io`].
pub fn write_out(s: &str) -> Result<(), Error> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes())
        .and_then(|()| o.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => Error::StdoutClosed,
            _ => Error::Io(format!("writing to stdout: {e}")),
        })
}

/// As [`write_out`], for output that is a by-product (a long run's
/// progress, its final report, a benchmark's table): with nobody reading,
/// the command still does its work (VMs run, JSON files get written) and
/// keeps its own exit status.
pub fn write_out_or_drop(s: &str) -> Result<(), Error> {
    match write_out(s) {
        Err(Error::StdoutClosed) => Ok(()),
        r => r,
    }
}

/// `println!` through [`write_out`]: evaluates to a `Result<(), Error>`.
macro_rules! outln {
    () => {
        $crate::output::write_out("\n")
    };
    ($($arg:tt)*) => {
        $crate::output::write_out(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_out(&format!($($arg)*))
    };
}

pub(crate) use {out, outln};

/// How a command that prints data prints it: `-o text` (tables and lists
/// for people, the default) or `-o json` (the API's own objects, for
/// scripts), as kubectl and ch-remote spell it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// The `-o/--output` flag, shared by every command that prints data.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct OutputArg {
    /// Output format: text for people, json for scripts.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    output: Format,
    /// The old spelling of `-o json`, kept for scripts written before `-o`.
    #[arg(long, hide = true, conflicts_with = "output")]
    json: bool,
}

impl OutputArg {
    /// Whether to print JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == Format::Json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        o: OutputArg,
    }

    fn parse(args: &[&str]) -> Result<bool, clap::Error> {
        Cmd::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|c| c.o.json())
    }

    #[test]
    fn output_flag_spellings() {
        assert!(!parse(&[]).unwrap());
        assert!(!parse(&["-o", "text"]).unwrap());
        assert!(parse(&["-o", "json"]).unwrap());
        assert!(parse(&["--output=json"]).unwrap());
        assert!(parse(&["--json"]).unwrap());
        let e = parse(&["-o", "yaml"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        // `--json -o text` says two things: refused, not silently one.
        let e = parse(&["--json", "-o", "text"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
