//! `pagefold completions SHELL` and `pagefold man --dir DIR`: shell
//! completions and man pages generated from the clap definitions at run
//! time, so they always describe the flags of the binary at hand.

use std::path::PathBuf;

use clap::{Args, CommandFactory};

use crate::cli::Cli;
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

/// Prints the completion script for `a.shell`.
pub fn completions(a: CompletionsArgs) -> Result<i32, Error> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut Cli::command(), "pagefold", &mut script);
    write_out(&String::from_utf8_lossy(&script))?;
    Ok(0)
}

/// Writes the man pages into `a.dir`.
pub fn man(a: ManArgs) -> Result<i32, Error> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", a.dir.display()));
    std::fs::create_dir_all(&a.dir).map_err(io)?;
    clap_mangen::generate_to(Cli::command(), &a.dir).map_err(io)?;
    outln!("man pages written to {}", a.dir.display())?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand gets a page, and a page lists its flags.
    #[test]
    fn a_man_page_per_command() {
        let dir = tempfile::tempdir().unwrap();
        clap_mangen::generate_to(Cli::command(), dir.path()).unwrap();
        let page = |name: &str| {
            std::fs::read_to_string(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert!(page("pagefold.1").contains(".TH pagefold 1"));
        let serve = page("pagefold-serve.1");
        assert!(serve.contains("\\-\\-metrics\\-addr"), "{serve}");
        assert!(serve.contains("\\-\\-dedup\\-backend"), "{serve}");
        for sub in [
            "run",
            "demo",
            "status",
            "vm-create",
            "dedup-set",
            "ksm-restore",
            "completions",
        ] {
            page(&format!("pagefold-{sub}.1"));
        }
    }
}
