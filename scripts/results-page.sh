#!/usr/bin/env bash
# Writes docs/results/results.md from docs/results/runs.toml and the JSON
# rows it names, with the benchmarks' own tables and goal checks
# (bench/src/results_page.rs). After a benchmark run: replace the run's
# JSON and plot in docs/results, update its entry in runs.toml, run this.
# --check: write nothing; fail when the committed page is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p pagefold-bench --bin results-page -- "$@" docs/results
