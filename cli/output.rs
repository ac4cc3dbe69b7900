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
