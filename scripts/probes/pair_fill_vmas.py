#!/usr/bin/env python3
"""How many VMAs the engine's merges of two identical workload VMs cost when
both are created together (their pages then merge as both sides appear, in
no address order).

Starts `pagefold serve` (mode on, KSM assist off), creates two 64 MiB VMs of
one group holding the same 16 MiB of shared data at the same addresses,
waits until the merge count stops moving, prints the engine's figures and
stops the server. A linear layout like this one should cost a handful of
VMAs whatever the merge order; until 2026-12-02 it made 14 in some runs and
up to 4,198 in others.

    cargo build --release --features bench
    for i in $(seq 8); do scripts/probes/pair_fill_vmas.py target/release/pagefold; done
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PAGEFOLD_BINARY")
    work = tempfile.mkdtemp(prefix="pagefold-pair-fill-")
    sock = os.path.join(work, "api.sock")
    cfg = os.path.join(work, "dedup.toml")
    with open(cfg, "w") as f:
        f.write('[dedup]\nmode = "on"\nksm_assist = "off"\n')
    log = open(os.path.join(work, "server.log"), "w")
    srv = subprocess.Popen(
        [sys.argv[1], "serve", "--config", cfg, "--api-sock", sock],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )

    def call(method, path, body=None):
        c = UnixHTTP(sock)
        c.request(
            method,
            "/api/v1" + path,
            body=json.dumps(body) if body is not None else None,
            headers={"Content-Type": "application/json"},
        )
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data) if data else None

    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        time.sleep(0.3)
        for name in ("a1", "a2"):
            call(
                "PUT",
                f"/vms/{name}",
                {
                    "memory": "64M",
                    "serial": "null",
                    "dedup": {"group": "g"},
                    "workload": {
                        "seed": 11,
                        "shared": "16M",
                        "private": "4M",
                        "phases": ["fill", "wait"],
                    },
                },
            )
        last = None
        for _ in range(80):
            time.sleep(0.25)
            d = call("GET", "/dedup")
            now = (d["merges"], d["vmas_created"])
            if now == last and d["merges"] > 0:
                break
            last = now
        d = call("GET", "/dedup")
        keys = ("merges", "pages_sharing", "pool_pages", "vmas_created", "full_scans")
        print(json.dumps({k: d.get(k) for k in keys}))
        call("PUT", "/shutdown")
        srv.wait(20)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    main()
