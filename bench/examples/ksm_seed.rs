//! Runs the KSM side of `ksm-seed` (until the CLI wires in pagefold's
//! engine): `cargo run --release -p pagefold-bench --example ksm_seed --
//! [--json PATH] [--plot PATH.svg] [--shape full|sparse] [--system ksm-default|ksm-max]`.

use pagefold_bench::{ksm_systems, rows_json, run_ksm_seed, seed_chart, table, write_file};
use pagefold_bench::{SeedOptions, Shape};

fn main() {
    let mut opts = SeedOptions::default();
    let (mut json, mut plot) = (None, None);
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = args.next(),
            "--plot" => plot = args.next(),
            "--shape" => {
                let s: Shape = args.next().unwrap_or_default().parse().unwrap_or_else(|e| {
                    eprintln!("{e}");
                    std::process::exit(2)
                });
                opts.shapes = vec![s];
            }
            "--system" => only = args.next(),
            other => {
                eprintln!("unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let systems: Vec<_> = ksm_systems()
        .into_iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == s.name))
        .collect();
    let report = match run_ksm_seed(&systems, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ksm-seed: {e}");
            std::process::exit(1);
        }
    };
    print!("{}", table(&report));
    let out = |path: Option<String>, text: String| {
        if let Some(p) = path {
            if let Err(e) = write_file(&p, &text) {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    };
    out(json, rows_json(&report).expect("rows serialize"));
    out(plot, seed_chart(&report));
}
