#!/usr/bin/env python3
"""Focused stress of `pagefold serve`: the soak's hardest VM shape, over and over.

Four workload VMs of one dedup group run at all times, each
`fill, churn, verify, rewrite, wait:N, verify` with scattered placement
(extent 1 or 8), in-VM duplicates and zero pages; as each ends it is
deleted and a new one created, and now and then a running one is deleted.
Meanwhile the dedup mode flips (on, auto, off, unmerge) and the knobs and
the auto threshold change every 0.2-1.5 s. A VM that does not end with
exit status 0 and 0 verify mismatches fails the run.

This is the shape that lost guest pages before the pool stopped being
truncated (docs/engine.md, "The pool file never shrinks"): a VM rewrites
its merged pages (private copies inside pool VMAs), idles while the other
VMs go, and verifies. It failed every 200-300 VMs (5-10 minutes) then.

    scripts/stress-rewrite.py BIN SECONDS [--seed N] [--workdir DIR]

Exit status 0 if every VM passed, 1 otherwise. The server's log, the serial
logs of failed VMs and events.txt (every API action, timed) stay in the
work directory.
"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import Api, Stats  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin")
    p.add_argument("seconds", type=int)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--workdir")
    a = p.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="pagefold-stress.")
    os.makedirs(os.path.join(work, "serial"), exist_ok=True)
    sock = os.path.join(work, "api.sock")
    log = open(os.path.join(work, "pagefold.log"), "w")
    proc = subprocess.Popen([a.bin, "serve", "--api-sock", sock, "--dedup", "on"],
                            stdout=log, stderr=subprocess.STDOUT)
    api = Api(sock, Stats())
    for _ in range(200):
        if os.path.exists(sock) and api.req("GET", "/health", timeout=2)[0] == 200:
            break
        time.sleep(0.05)
    print(f"stress: seed {a.seed}, workdir {work}", flush=True)
    t0 = time.monotonic()
    events = []
    stop = threading.Event()

    def event(text):
        events.append(f"{time.monotonic() - t0:8.3f} {text}")

    def patcher():
        r = random.Random(a.seed + 1)
        while not stop.is_set():
            stop.wait(r.uniform(0.2, 1.5))
            k = r.random()
            if k < 0.6:
                body = {"mode": r.choice(["on", "auto", "off", "unmerge"])}
            elif k < 0.85:
                body = {"pages_to_scan": r.choice([100, 1000, 4096, 20000]),
                        "sleep_millisecs": r.choice([0, 5, 20, 50])}
            else:
                body = {"auto_threshold": r.choice([1, 99]), "mode": "auto"}
            st, _ = api.req("PATCH", "/dedup", body)
            event(f"PATCH {body} -> {st}")

    threading.Thread(target=patcher, daemon=True).start()
    rng = random.Random(a.seed)
    seed = rng.randint(1, 1 << 40)
    vms, seq, ok, bad, last = {}, 0, 0, 0, 0.0
    deadline = time.monotonic() + a.seconds
    while time.monotonic() < deadline and proc.poll() is None:
        st, lst = api.req("GET", "/vms")
        for info in lst if st == 200 else []:
            name = info["name"]
            if name not in vms:
                continue
            serial = os.path.join(work, "serial", name + ".log")
            if info.get("state") == "stopped":
                out = info.get("outcome") or {}
                text = open(serial, errors="replace").read() if os.path.exists(serial) else ""
                mism = sum(int(x) for x in re.findall(r"mismatches (\d+)", text))
                if out.get("kind") == "guest_exit" and out.get("status") == 0 and mism == 0:
                    ok += 1
                    os.unlink(serial)
                else:
                    bad += 1
                    event(f"FAIL {name} {out} mismatches {mism}")
                    print(f"stress: FAIL {name}: {out}, {mism} mismatches", flush=True)
                api.req("DELETE", f"/vms/{name}")
                event(f"deleted {name}")
                del vms[name]
            elif rng.random() < 0.02:
                api.req("DELETE", f"/vms/{name}")
                event(f"deleted running {name}")
                del vms[name]
                if os.path.exists(serial):
                    os.unlink(serial)
        while len(vms) < 4 and proc.poll() is None:
            seq += 1
            name = f"s-{seq}"
            cfg = {
                "memory": "96M", "vcpus": 1,
                "serial": {"file": os.path.join(work, "serial", name + ".log")},
                "dedup": {"group": "g1"},
                "workload": {
                    "seed": seed, "shared": "24M", "private": "12M",
                    "zero_permille": 50, "dup_permille": 20, "churn_permille": 250,
                    "churn_rate": 0, "churn_ms": 2000,
                    "phases": ["fill", "churn", "verify", "rewrite",
                               f"wait:{rng.randint(500, 4000)}", "verify"],
                    "placement": "scattered", "extent_pages": rng.choice([1, 1, 8]),
                },
            }
            st, doc = api.req("PUT", f"/vms/{name}", cfg)
            if st != 201:
                print(f"stress: creating {name} failed: {st} {doc}", flush=True)
                bad += 1
                break
            vms[name] = cfg
            event(f"created {name}")
        if time.monotonic() - last > 30:
            last = time.monotonic()
            print(f"stress: {time.monotonic() - t0:5.0f} s, {seq} VMs created, {ok} passed, {bad} failed",
                  flush=True)
        time.sleep(0.3)
    stop.set()
    crashed = proc.poll() is not None
    if crashed:
        bad += 1
        print(f"stress: pagefold exited ({proc.returncode}); see {work}/pagefold.log", flush=True)
    else:
        api.req("PUT", "/shutdown")
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    with open(os.path.join(work, "events.txt"), "w") as f:
        f.write("\n".join(events) + "\n")
    print(f"stress: {seq} VMs created, {ok} passed, {bad} failed ({'FAIL' if bad else 'PASS'})", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
