#!/usr/bin/env bash
# Profiles a command inside the emulated host (scripts/emulated-host.sh):
# `perf record -a -g` at 499 Hz of CPU clock (TCG has no PMU) over the
# whole host while the command runs, then text reports, made inside the
# host where its kernel's symbols are, into the --out directory:
#   comm.txt      share of samples per thread name
#   report.txt    per thread name and symbol (self time)
#   THREAD.txt    for each --thread, callers of where its time goes
#
#   scripts/emulated-profile.sh --out DIR [--thread NAME]... \
#       [emulated-host options] -- COMMAND [ARG...]
#
# The host needs Debian's linux-perf package here (apt-get install
# linux-perf); its perf matches the emulated host's 6.1 kernel. Thread
# names are the kernel's 15-character comm: pagefold-scan (the engine),
# ksmd, NAME-vcpuN (a VM's vCPUs, cut to 15 characters).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PERF=$(command -v perf) || { echo "perf is missing: apt-get install linux-perf" >&2; exit 2; }
OUT=
BIN=0
THREADS=()
PASS=()
while (($#)); do
    case $1 in
    --out) OUT=${2:?}; PASS+=("$1" "$2"); shift 2 ;;
    --thread) THREADS+=("${2:?}"); shift 2 ;;
    --bin) BIN=1; PASS+=("$1" "${2:?}"); shift 2 ;;
    --) shift; break ;;
    *) PASS+=("$1"); shift ;;
    esac
done
[[ -n $OUT ]] || { echo "--out DIR is required: the reports land there" >&2; exit 2; }
(($#)) || { echo "no command given" >&2; exit 2; }
# perf's --bin would replace emulated-host.sh's default one.
if ((BIN == 0)) && [ -x "$ROOT/target/release/pagefold" ]; then
    PASS+=(--bin "$ROOT/target/release/pagefold")
fi
SCRIPT=$(mktemp)
trap 'rm -f "$SCRIPT"' EXIT
{
    # The data goes to /scratch when there is one (it outgrows the host's
    # tmpfs on long runs), else to /work.
    echo 'D=/work; [ -d /scratch ] && D=/scratch'
    printf 'perf record -F 499 -a -g -o $D/perf.data --'
    printf ' %q' "$@"
    echo '; rc=$?'
    echo 'R="perf report -i $D/perf.data --stdio"'
    echo '$R --no-children --sort comm --percent-limit 0.1 -g none > /out/comm.txt 2>&1'
    echo '$R --no-children --sort comm,dso,sym --percent-limit 0.2 -g none > /out/report.txt 2>&1'
    for t in "${THREADS[@]}"; do
        printf '$R --children --sort sym --percent-limit 1 -g caller,0.2,caller,function,percent --comm %q > /out/%q.txt 2>&1\n' "$t" "$t"
    done
    echo 'exit $rc'
} > "$SCRIPT"
exec "$ROOT/scripts/emulated-host.sh" --bin "$PERF" --file "$SCRIPT:profile.sh" "${PASS[@]}" -- sh /in/profile.sh
