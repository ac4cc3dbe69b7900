//! `results-page [--check] DIR`: writes DIR/results.md from DIR/runs.toml
//! and the JSON rows it names (see `pagefold_bench::results_page`). With
//! `--check`, writes nothing and exits 1 when the page on disk differs
//! from what the rows give.

use std::path::PathBuf;
use std::process::ExitCode;

use pagefold_bench::{results_page, MAX_PAGE_LINES, PAGE_FILE};

const USAGE: &str = "usage: results-page [--check] DIR";

fn main() -> ExitCode {
    let mut check = false;
    let mut dir: Option<PathBuf> = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if dir.is_none() && !arg.starts_with('-') => dir = Some(arg.into()),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let page = match results_page(&dir) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("results-page: {e}");
            return ExitCode::FAILURE;
        }
    };
    let lines = page.lines().count();
    if lines > MAX_PAGE_LINES {
        eprintln!("results-page: the page has {lines} lines, over {MAX_PAGE_LINES}");
        return ExitCode::FAILURE;
    }
    let path = dir.join(PAGE_FILE);
    if check {
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != page {
            eprintln!(
                "results-page: {} is stale: run scripts/results-page.sh",
                path.display()
            );
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = std::fs::write(&path, page) {
        eprintln!("results-page: writing {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    eprintln!("wrote {} ({lines} lines)", path.display());
    ExitCode::SUCCESS
}
