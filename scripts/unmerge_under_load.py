#!/usr/bin/env python3
"""Mode `unmerge` while the guests run: how long it takes to give every
merged page back, with both VMs' vCPUs busy on the host's CPUs.

Starts `pagefold serve` with two 256 MiB workload VMs holding the same
200 MiB in a scattered order (extent 1), whose vCPUs keep running (a flat-out
churn of 0.5 % of their private pages), waits until the dedup backend's
sharing stops growing, then sets mode `unmerge` and times it until every
page is back (mode `off` for pagefold; for the kernel-KSM backend the
`run = 2` write itself, which returns once KSM has unmerged everything).

    scripts/unmerge_under_load.py [--bin target/release/pagefold]
                                  [--backend pagefold|ksm] [--runs N]

The KSM backend is driven at pages_to_scan 10000, sleep 0 to merge, and puts
KSM's knobs back when the server exits. Prints one line per run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VM = """
[[vm]]
name = "{name}"
vcpus = 1
memory = "256M"
dedup = {{ group = "g" }}

[vm.workload]
seed = 42
shared = "200M"
private = "16M"
zero_permille = 0
dup_permille = 0
churn_permille = 5
churn_rate = 0
churn_ms = 600000
placement = "scattered"
extent_pages = 1
phases = ["fill", "churn"]
"""


def one(binp, backend, workdir, tag):
    cfg = os.path.join(workdir, f"{tag}.toml")
    with open(cfg, "w") as f:
        f.write(f'[dedup]\nmode = "on"\nbackend = "{backend}"\n')
        f.write(VM.format(name="vm0") + VM.format(name="vm1"))
    sock = os.path.join(workdir, f"{tag}.sock")
    log = open(os.path.join(workdir, f"{tag}.log"), "w")
    srv = subprocess.Popen([binp, "serve", "--config", cfg, "--api-sock", sock],
                           stdout=subprocess.DEVNULL, stderr=log)

    def cli(*args):
        return subprocess.run([binp, *args, "--api-sock", sock],
                              check=True, capture_output=True, text=True).stdout

    def dedup():
        return json.loads(cli("status", "-o", "json"))["dedup"]

    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        if backend == "ksm":
            cli("dedup", "set", "pages_to_scan=10000", "sleep_millisecs=0")
        t0, last, stable = time.time(), -1, 0
        while time.time() - t0 < 120 and stable < 3:
            d = dedup()
            s = d["pages_sharing"]  # KSM's included (assist)
            stable = stable + 1 if s == last and s > 0 else 0
            last = s
            time.sleep(1)
        d = dedup()
        merged, by_ksm = d["pages_sharing"], d.get("ksm_pages_sharing", 0)
        t = time.time()
        cli("dedup", "set", "mode=unmerge")
        while True:
            d = dedup()
            if d["mode"] == "off" or (backend == "ksm" and d["pages_sharing"] == 0):
                break
            time.sleep(0.02)
        took = time.time() - t
        print(f"{tag}: {backend}: {merged} pages sharing ({by_ksm} of them through the KSM "
              f"assist), unmerge took {took:.3f} s; left: sharing {d['pages_sharing']}, "
              f"pool {d['pool_pages']}", flush=True)
        return took
    finally:
        srv.terminate()
        srv.wait()
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--bin", default=os.path.join(root, "target/release/pagefold"))
    ap.add_argument("--backend", choices=["pagefold", "ksm"], default="pagefold")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"no pagefold binary at {a.bin} (cargo build --release)")
    workdir = tempfile.mkdtemp(prefix="pagefold-unmerge.")
    times = [one(a.bin, a.backend, workdir, f"run{i + 1}") for i in range(a.runs)]
    print(f"{a.backend}: unmerge {min(times):.3f}-{max(times):.3f} s over {len(times)} run(s); "
          f"logs in {workdir}")


if __name__ == "__main__":
    main()
