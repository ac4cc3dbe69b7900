//! `pagefold completions SHELL` and `pagefold man --dir DIR`: shell
//! completions and man pages generated from the clap definitions at run
//! time, so they always describe the flags of the binary at hand.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;
use crate::output::{outln, write_out};

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for; install the output where it looks, e.g.
    /// /usr/share/bash-completion/completions/pagefold.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Directory for pagefold.1 and one page per subcommand
    /// (pagefold-run.1, pagefold-vm-create.1, ...); created if missing.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Prints the completion script of `cmd` (the binary's clap tree) for
/// `a.shell`.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> Result<i32, Error> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "pagefold", &mut script);
    write_out(&String::from_utf8_lossy(&script))?;
    Ok(0)
}

/// Writes the man pages of `cmd` (the binary's clap tree) into `a.dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> Result<i32, Error> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", a.dir.display()));
    std::fs::create_dir_all(&a.dir).map_err(io)?;
    clap_mangen::generate_to(cmd, &a.dir).map_err(io)?;
    outln!("man pages written to {}", a.dir.display())?;
    Ok(0)
}
