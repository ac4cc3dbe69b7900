#!/usr/bin/env python3
"""Soak test driver for `pagefold serve`. Run through scripts/soak.sh.

Starts `pagefold serve --api-sock S --dedup on` and, for the given duration,
keeps 2-6 workload VMs alive through the API (created and deleted, in reused
and new dedup groups, linear and scattered placements, churn phases), flips
the dedup mode and knobs, flaps the auto threshold around the host's free
memory, and loads the API with a bounded number of concurrent GETs, while
sampling the process's RSS, mappings and fds and polling /health.

At the end: every VM that ran to its end must have exited 0 (its VERIFY
phases found 0 mismatches), and after every VM is deleted and a final
`mode: unmerge`, pool_pages, the fd count and the mapping count must be back
at their no-VM baseline. Exit status 0 when everything held, 1 otherwise.
Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# ---------------------------------------------------------------- HTTP ----


class UnixConn(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


class Api:
    """One request per connection (so connections open and close all the time)."""

    def __init__(self, sock, stats):
        self.sock = sock
        self.stats = stats

    def req(self, method, path, body=None, timeout=40.0):
        conn = UnixConn(self.sock, timeout)
        t0 = time.monotonic()
        try:
            data = None
            headers = {}
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, "/api/v1" + path, body=data, headers=headers)
            r = conn.getresponse()
            raw = r.read()
            status = r.status
        except Exception as e:  # connection refused, timeout, reset
            self.stats.request(method, path, None, time.monotonic() - t0, str(e))
            return None, None
        finally:
            conn.close()
        self.stats.request(method, path, status, time.monotonic() - t0, raw[:300])
        try:
            doc = json.loads(raw) if raw and path != "/metrics" else raw
        except ValueError:
            doc = raw
        return status, doc


# --------------------------------------------------------------- stats ----


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.by_status = {}
        self.max_latency = 0.0
        self.slowest = "-"  # the request that took max_latency
        self.failures = []  # (time, text)
        self.vms_created = 0
        self.vms_deleted = 0
        self.vms_deleted_running = 0
        self.vms_finished_ok = 0
        self.create_refused = 0  # 409 (not enough memory etc.)
        self.scattered = 0
        self.assist_samples = 0  # progress samples with the KSM assist engaged
        self.assist_seen = set()  # distinct ksm_assist states seen
        self.groups_new = 0
        self.groups_reused = 0
        self.mode_changes = 0
        self.knob_changes = 0
        self.auto_changes = 0
        self.patch_refused = 0
        self.health_checks = 0
        self.health_bad = 0
        self.mismatches = 0
        self.verify_lines = 0
        self.max_rss_kb = 0
        self.max_maps = 0
        self.max_fds = 0
        self.max_threads = 0
        self.max_vms = 0
        self.samples = []  # (t, rss_kb, maps, fds, threads, vms, pool_pages)
        self.t0 = time.monotonic()
        self.dead = False  # the server is gone: no more per-request failures

    def now(self):
        return time.monotonic() - self.t0

    def fail(self, text):
        with self.lock:
            self.failures.append((round(self.now(), 1), text))
        log(f"FAIL: {text}")

    def request(self, method, path, status, latency, detail):
        with self.lock:
            self.requests += 1
            key = str(status) if status is not None else "error"
            self.by_status[key] = self.by_status.get(key, 0) + 1
            if latency > self.max_latency:
                self.max_latency = latency
                self.slowest = f"{method} {path} -> {status} at {self.now():.0f} s"
            dead = self.dead
        if dead:
            return
        if status is None or status >= 500:
            # 503 from /health is counted by the health poller as a stall.
            self.fail(f"{method} {path} -> {status}: {detail!r}")


def log(msg):
    sys.stderr.write(f"[soak {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


# ------------------------------------------------------------- process ----


def proc_sample(pid):
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, maps, fds, threads


def classify_anon(maps_text):
    """Counts the process's anonymous mappings by kind: glibc malloc arenas
    (64 MiB at a 64 MiB-aligned address: the heap in use and its reserve),
    thread stacks (a 4 KiB guard page right under a stack; glibc caches the
    stacks of exited threads for reuse, up to 40 MiB), and the rest."""
    anon = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) > 5 and parts[5].strip():
            continue
        x, y = (int(v, 16) for v in parts[0].split("-"))
        anon.append((x, y, parts[1]))
    arenas = stacks = other = 0
    i = 0
    mb64 = 64 << 20
    while i < len(anon):
        x, y, perm = anon[i]
        nxt = anon[i + 1] if i + 1 < len(anon) else None
        if x % mb64 == 0 and y - x == mb64:
            arenas += 1
            i += 1
        elif x % mb64 == 0 and nxt and nxt[0] == y and nxt[1] == x + mb64 and nxt[2] == "---p":
            arenas += 1
            i += 2
        elif perm == "---p" and y - x == 4096 and nxt and nxt[0] == y and nxt[2] == "rw-p":
            stacks += 1
            i += 2
        else:
            other += 1
            i += 1
    return {"arenas": arenas, "stacks": stacks, "other_anon": other}


KSM_SYSFS = "/sys/kernel/mm/ksm"
# Every KSM knob pagefold may write (dedup/src/ksm/sysfs.rs, TUNABLES).
KSM_TUNABLES = [
    "run", "pages_to_scan", "sleep_millisecs", "max_page_sharing", "merge_across_nodes",
    "use_zero_pages", "smart_scan", "stable_node_chains_prune_millisecs", "advisor_mode",
    "advisor_max_cpu", "advisor_min_pages_to_scan", "advisor_max_pages_to_scan",
    "advisor_target_scan_time",
]


def ksm_tunables():
    """The KSM knobs as the host has them now (absent ones left out)."""
    out = {}
    for n in KSM_TUNABLES:
        try:
            with open(os.path.join(KSM_SYSFS, n)) as f:
                out[n] = f.read().strip()
        except OSError:
            pass
    return out


def free_pct():
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0])
    return 100.0 * mem["MemFree"] / mem["MemTotal"]


# ------------------------------------------------------------- workers ----


class Soak:
    def __init__(self, args):
        self.args = args
        self.stats = Stats()
        self.stop = threading.Event()  # stop the churn (VM creation, patches, load)
        self.halt = threading.Event()  # stop the samplers
        self.rng = random.Random(args.seed)
        self.vms = {}  # name -> dict(config, created_at, group)
        self.vm_seq = 0
        self.group_seq = 0
        self.groups = {}  # reusable groups: name -> content seed
        self.serial_dir = os.path.join(args.workdir, "serial")
        os.makedirs(self.serial_dir, exist_ok=True)

    # ---- server
    def start_server(self):
        a = self.args
        self.sock = os.path.join(a.workdir, "api.sock")
        self.server_log = os.path.join(a.workdir, "pagefold.log")
        lf = open(self.server_log, "w")
        cmd = [a.bin, "serve", "--api-sock", self.sock, "--dedup", "on"]
        log("starting: " + " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.api = Api(self.sock, self.stats)
        for _ in range(200):
            if os.path.exists(self.sock):
                st, _ = Api(self.sock, Stats()).req("GET", "/health", timeout=2)
                if st == 200:
                    return
            if self.proc.poll() is not None:
                raise SystemExit(f"pagefold exited early ({self.proc.returncode}); see {self.server_log}")
            time.sleep(0.05)
        raise SystemExit("pagefold did not answer within 10 s")

    def alive(self):
        return self.proc.poll() is None

    def dedup_state(self):
        st, d = self.api.req("GET", "/dedup")
        return d if st == 200 and isinstance(d, dict) else None

    def measure(self, label):
        d = self.dedup_state() or {}
        time.sleep(0.5)  # let the server close that connection
        rss, maps, fds, threads = proc_sample(self.pid)
        tag = re.sub(r"[^a-z]+", "-", label.lower())[:30].strip("-")
        try:
            with open(f"/proc/{self.pid}/maps") as f:
                maps_text = f.read()
            with open(os.path.join(self.args.workdir, f"maps-{tag}.txt"), "w") as f:
                f.write(maps_text)
            with open(os.path.join(self.args.workdir, f"fds-{tag}.txt"), "w") as f:
                for fd in sorted(os.listdir(f"/proc/{self.pid}/fd"), key=int):
                    try:
                        f.write(f"{fd} {os.readlink(f'/proc/{self.pid}/fd/{fd}')}\n")
                    except OSError:
                        pass
        except OSError:
            maps_text = ""
        named = {}
        for line in maps_text.splitlines():
            parts = line.split(None, 5)
            name = parts[5].strip() if len(parts) > 5 else ""
            if name:
                named[name] = named.get(name, 0) + 1
        m = {
            "label": label,
            "rss_kb": rss,
            "maps": maps,
            "fds": fds,
            "threads": threads,
            "pool_pages": d.get("pool_pages"),
            "pages_sharing": d.get("pages_sharing"),
            "mode": d.get("mode"),
        }
        log(f"{label}: " + ", ".join(f"{k}={v}" for k, v in m.items() if k != "label"))
        m["named_maps"] = named
        m["anon"] = classify_anon(maps_text)
        log(f"  anonymous mappings: {m['anon']}")
        return m

    # ---- samplers
    def sampler(self):
        last_progress = 0.0
        while not self.halt.is_set():
            if not self.alive():
                self.stats.fail(f"pagefold exited (status {self.proc.returncode}); see {self.server_log}")
                with self.stats.lock:
                    self.stats.dead = True
                self.stop.set()
                self.halt.set()
                return
            try:
                rss, maps, fds, threads = proc_sample(self.pid)
            except OSError:
                continue
            s = self.stats
            with s.lock:
                s.max_rss_kb = max(s.max_rss_kb, rss)
                s.max_maps = max(s.max_maps, maps)
                s.max_fds = max(s.max_fds, fds)
                s.max_threads = max(s.max_threads, threads)
                nvms = len(self.vms)
            if s.now() - last_progress >= 10:
                last_progress = s.now()
                d = self.dedup_state() or {}
                pool = d.get("pool_pages")
                assist = d.get("ksm_assist")
                if assist is not None:
                    with s.lock:
                        s.assist_seen.add(assist.split(":")[0])
                        if assist.startswith("engaged"):
                            s.assist_samples += 1
                s.samples.append((round(s.now(), 1), rss, maps, fds, threads, nvms, pool))
                log(
                    f"t={s.now():6.0f}s vms={nvms} created={s.vms_created} deleted={s.vms_deleted} "
                    f"ok={s.vms_finished_ok} req={s.requests} modes={s.mode_changes} "
                    f"knobs={s.knob_changes} auto={s.auto_changes} mode={d.get('mode')} "
                    f"sharing={d.get('pages_sharing')} pool={pool} rss={rss // 1024}M "
                    f"maps={maps} fds={fds} thr={threads} health={s.health_checks - s.health_bad}/{s.health_checks} "
                    f"assist={(assist or '-').split(':')[0]} fail={len(s.failures)}"
                )
            self.halt.wait(2.0)

    def health(self):
        api = Api(self.sock, _HealthStats(self.stats))
        while not self.halt.is_set():
            st, doc = api.req("GET", "/health", timeout=10)
            with self.stats.lock:
                self.stats.health_checks += 1
            if st != 200:
                with self.stats.lock:
                    self.stats.health_bad += 1
                if self.alive():
                    self.stats.fail(f"/health -> {st}: {doc!r}"[:400])
            self.halt.wait(1.0)

    def load(self, idx):
        rng = random.Random(self.args.seed * 100 + idx)
        paths = ["/dedup", "/vms", "/metrics", "/health"]
        while not self.stop.is_set():
            path = rng.choice(paths)
            if path == "/vms" and rng.random() < 0.3:
                names = list(self.vms)
                if names:
                    path = "/vms/" + rng.choice(names)
            st, _ = self.api.req("GET", path)
            if st is not None and st >= 400 and not (st == 404 and path.startswith("/vms/")):
                self.stats.fail(f"GET {path} -> {st}")
            self.stop.wait(rng.uniform(0.0, self.args.load_gap))

    def patcher(self):
        rng = random.Random(self.args.seed + 7)
        modes = ["on", "auto", "off", "unmerge", "on", "auto"]
        high = True
        while not self.stop.is_set():
            self.stop.wait(rng.uniform(2.0, 6.0))
            if self.stop.is_set():
                break
            # A row of changes, back to back.
            for _ in range(rng.randint(1, 4)):
                kind = rng.random()
                if kind < 0.4:
                    body = {"mode": rng.choice(modes)}
                elif kind < 0.7:
                    body = {
                        "pages_to_scan": rng.choice([100, 500, 1000, 4096, 20000]),
                        "sleep_millisecs": rng.choice([0, 5, 20, 50, 200]),
                    }
                    if rng.random() < 0.3:
                        body["mode"] = rng.choice(modes)
                else:
                    # Auto threshold flapping around the host's free memory:
                    # just above it (triggers) and just below (stops).
                    fp = free_pct()
                    t = int(fp) + (3 if high else -3)
                    high = not high
                    body = {"auto_threshold": max(1, min(99, t))}
                    if rng.random() < 0.3:
                        body["memory_signal"] = rng.choice(["free", "available"])
                    if rng.random() < 0.5:
                        body["mode"] = "auto"
                st, doc = self.api.req("PATCH", "/dedup", body)
                if st == 200:
                    with self.stats.lock:
                        if "mode" in body:
                            self.stats.mode_changes += 1
                        if "pages_to_scan" in body:
                            self.stats.knob_changes += 1
                        if "auto_threshold" in body:
                            self.stats.auto_changes += 1
                elif st is not None and 400 <= st < 500:
                    with self.stats.lock:
                        self.stats.patch_refused += 1
                    self.stats.fail(f"PATCH /dedup {body} -> {st}: {doc}")

    # ---- VMs
    def vm_config(self, name):
        rng = self.rng
        if self.groups and rng.random() < 0.7:
            group = rng.choice(list(self.groups))
            self.stats.groups_reused += 1
        else:
            self.group_seq += 1
            group = f"g{self.group_seq}"
            self.groups[group] = rng.randint(1, 1 << 40)
            self.stats.groups_new += 1
            if len(self.groups) > 4:  # keep a few groups for reuse
                self.groups.pop(rng.choice([g for g in self.groups if g != group]))
        mem = rng.choice([64, 96, 128, 192])
        # The guest needs a few MiB of its RAM besides the data area.
        shared = rng.choice([16, 24, 32, 40]) * mem // 64
        private = min(rng.choice([8, 12, 16]) * mem // 64, mem - 8 - shared)
        churn_ms = rng.choice([300, 1000, 2000, 4000])
        phases = rng.choice(
            [
                ["fill", f"churn:{churn_ms}", "verify", "wait:1000"],
                ["fill", "verify", f"wait:{rng.randint(1000, 6000)}", f"churn:{churn_ms}", "verify"],
                ["fill", f"sleep:{rng.randint(500, 3000)}", "churn", "rewrite", "verify"],
                ["fill", "churn", "verify", "rewrite", f"wait:{rng.randint(500, 4000)}", "verify"],
                ["fill", f"wait:{rng.randint(2000, 8000)}", "verify", f"churn:{churn_ms}", "verify", "rewrite", "verify"],
            ]
        )
        wl = {
            "seed": self.groups[group],
            "shared": f"{shared}M",
            "private": f"{private}M",
            "zero_permille": rng.choice([0, 50, 200]),
            "dup_permille": rng.choice([0, 20, 100]),
            "churn_permille": rng.choice([100, 250, 500]),
            "churn_rate": rng.choice([0, 5000, 20000]),
            "churn_ms": churn_ms,
            "phases": phases,
        }
        if rng.random() < 0.4:
            wl["placement"] = "scattered"
            wl["extent_pages"] = rng.choice([1, 4, 8, 32])
            self.stats.scattered += 1
        return {
            "memory": f"{mem}M",
            "vcpus": 1,
            "serial": {"file": os.path.join(self.serial_dir, name + ".log")},
            "dedup": {"group": group},
            "workload": wl,
        }

    def create_vm(self):
        self.vm_seq += 1
        name = f"soak-{self.vm_seq}"
        cfg = self.vm_config(name)
        st, doc = self.api.req("PUT", f"/vms/{name}", cfg)
        if st == 201:
            self.stats.vms_created += 1
            self.vms[name] = {"cfg": cfg, "t": self.stats.now()}
            with self.stats.lock:
                self.stats.max_vms = max(self.stats.max_vms, len(self.vms))
        elif st == 409:
            self.stats.create_refused += 1
            log(f"create {name} refused (409): {doc}")
        elif st is not None and st < 500:
            self.stats.fail(f"PUT /vms/{name} -> {st}: {doc}")

    def delete_vm(self, name, running):
        st, doc = self.api.req("DELETE", f"/vms/{name}")
        if st == 204:
            self.stats.vms_deleted += 1
            if running:
                self.stats.vms_deleted_running += 1
            del self.vms[name]
            return True
        if st is not None and st < 500:
            self.stats.fail(f"DELETE /vms/{name} -> {st}: {doc}")
        return False

    def check_finished(self, name, info):
        oc = info.get("outcome") or {}
        if oc.get("kind") == "guest_exit" and oc.get("status") == 0:
            self.stats.vms_finished_ok += 1
        else:
            self.stats.fail(f"VM {name} ended badly: {oc} (config {json.dumps(self.vms[name]['cfg'])})")
        self.scan_serial(name)

    def scan_serial(self, name):
        path = os.path.join(self.serial_dir, name + ".log")
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            return
        for m in re.finditer(r"mismatches (\d+)", text):
            self.stats.verify_lines += 1
            n = int(m.group(1))
            if n:
                self.stats.mismatches += n
                self.stats.fail(f"VM {name}: {n} mismatches in its serial log")

    def poll_vms(self, may_kill):
        st, lst = self.api.req("GET", "/vms")
        if st != 200 or not isinstance(lst, list):
            return
        for info in lst:
            name = info.get("name")
            if name not in self.vms:
                continue
            if info.get("state") == "stopped":
                self.check_finished(name, info)
                if self.delete_vm(name, False):
                    try:
                        os.unlink(os.path.join(self.serial_dir, name + ".log"))
                    except OSError:
                        pass
            elif may_kill and self.rng.random() < 0.03 and self.stats.now() - self.vms[name]["t"] > 1.0:
                # Delete a running VM now and then: teardown with merged pages.
                log(f"deleting running VM {name}")
                self.delete_vm(name, True)

    def vm_loop(self, deadline):
        target = self.rng.randint(2, 6)
        next_retarget = time.monotonic() + 20
        while time.monotonic() < deadline and not self.stop.is_set():
            if time.monotonic() > next_retarget:
                target = self.rng.randint(2, 6)
                next_retarget = time.monotonic() + self.rng.uniform(10, 40)
            self.poll_vms(may_kill=True)
            # Create at most two per round so starts are spread out.
            for _ in range(2):
                if len(self.vms) < target:
                    self.create_vm()
            time.sleep(0.5)

    # ---- run
    def run(self):
        a = self.args
        # pagefold's KSM assist (and only it, in `serve`) writes KSM's knobs;
        # they must be as found once it has exited (docs/global-state.md).
        self.ksm_before = ksm_tunables()
        self.start_server()
        base0 = self.measure("baseline (fresh, no VMs)")
        # Warm the server up once (API threads, one VM created and deleted,
        # unmerge), then let idle blocking threads expire: the baseline.
        for p in ["/dedup", "/vms", "/metrics", "/health"]:
            self.api.req("GET", p)
        self.create_vm()
        time.sleep(1.5)
        for name in list(self.vms):
            self.delete_vm(name, True)
        # The warm-up VM is not counted.
        self.stats.vms_created = self.stats.vms_deleted = self.stats.vms_deleted_running = 0
        self.api.req("PATCH", "/dedup", {"mode": "unmerge"})
        self.wait_pool_empty(30)
        self.api.req("PATCH", "/dedup", {"mode": "on"})
        time.sleep(a.settle)
        base = self.measure("baseline (after warm-up, no VMs)")
        self.base0, self.base = base0, base

        threads = [
            threading.Thread(target=self.sampler, daemon=True),
            threading.Thread(target=self.health, daemon=True),
            threading.Thread(target=self.patcher, daemon=True),
        ]
        threads += [threading.Thread(target=self.load, args=(i,), daemon=True) for i in range(a.load_threads)]
        for t in threads:
            t.start()

        deadline = time.monotonic() + a.duration
        log(f"soaking for {a.duration} s")
        try:
            self.vm_loop(deadline)
        except KeyboardInterrupt:
            self.stats.fail("interrupted")
        self.stop.set()
        for t in threads[2:]:
            t.join(60)

        if not self.alive():
            return self.crashed()
        # Drain: let every VM finish, check it and delete it.
        log(f"draining {len(self.vms)} VMs")
        drain_end = time.monotonic() + 120
        while self.vms and time.monotonic() < drain_end and self.alive():
            self.poll_vms(may_kill=False)
            time.sleep(0.5)
        for name in list(self.vms):
            self.stats.fail(f"VM {name} still running 120 s after the end; deleting it")
            self.delete_vm(name, True)

        # Back to no VMs: unmerge, let the pool drain and idle threads expire.
        self.api.req("PATCH", "/dedup", {"mode": "unmerge"})
        with self.stats.lock:
            self.stats.mode_changes += 1
        self.wait_pool_empty(60)
        # Stop the samplers (their connections would count as fds), let idle
        # runtime threads expire, then measure.
        self.halt.set()
        for t in threads[:2]:
            t.join(15)
        time.sleep(a.settle)
        if not self.alive():
            return self.crashed()
        end = self.measure("end (all VMs deleted, mode unmerge)")

        self.check_leaks(base, end)
        st, final_vms = self.api.req("GET", "/vms")
        if st == 200 and final_vms:
            self.stats.fail(f"VMs still listed at the end: {final_vms}")

        # Stop the server and check its exit.
        if self.alive():
            self.api.req("PUT", "/shutdown")
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.stats.fail("pagefold did not exit within 30 s of PUT /shutdown")
                self.proc.kill()
                rc = self.proc.wait()
            if rc != 0:
                self.stats.fail(f"pagefold exited {rc} after PUT /shutdown")
        self.check_ksm_restored()
        self.check_server_log()
        return self.report(base0, base, end)

    def check_ksm_restored(self):
        after = ksm_tunables()
        for n in sorted(set(self.ksm_before) | set(after)):
            if self.ksm_before.get(n) != after.get(n):
                self.stats.fail(f"KSM {n} not restored: {self.ksm_before.get(n)!r} before, {after.get(n)!r} after")

    def crashed(self):
        with self.stats.lock:
            self.stats.dead = True
        self.stop.set()
        self.halt.set()
        rc = self.proc.wait()
        self.stats.fail(f"pagefold died with status {rc}; its log: {self.server_log}")
        self.check_server_log()
        gone = {"rss_kb": 0, "maps": 0, "fds": 0, "threads": 0, "pool_pages": None}
        return self.report(self.base0, self.base, gone)

    def wait_pool_empty(self, timeout):
        end = time.monotonic() + timeout
        d = None
        while time.monotonic() < end:
            d = self.dedup_state()
            if d and d.get("pool_pages") == 0 and d.get("pages_sharing") == 0:
                return True
            time.sleep(0.5)
        log(f"pool not empty after {timeout} s: pool_pages={d and d.get('pool_pages')}")
        return False

    def check_leaks(self, base, end):
        if end["pool_pages"] != base["pool_pages"]:
            self.stats.fail(f"pool_pages leak: {base['pool_pages']} at the start, {end['pool_pages']} at the end")
        if end["fds"] != base["fds"]:
            self.stats.fail(f"fd leak: {base['fds']} at the start, {end['fds']} at the end")
        # Named mappings (memfds, anon inodes, devices, files) must match
        # exactly. Anonymous ones: each live thread owns a stack and a guard
        # page, and glibc keeps the malloc arenas threads created (a heap and
        # its reserve each, at most 8 per core): allow for those.
        bn, en = base.get("named_maps", {}), end.get("named_maps", {})
        for name in sorted(set(bn) | set(en)):
            if bn.get(name, 0) != en.get(name, 0):
                self.stats.fail(f"mapping leak: {name}: {bn.get(name, 0)} at the start, {en.get(name, 0)} at the end")
        ba, ea = base.get("anon", {}), end.get("anon", {})
        cpus = os.cpu_count() or 1
        if ea.get("arenas", 0) > 8 * cpus:
            self.stats.fail(f"more malloc arenas than glibc makes: {ea}")
        # glibc's stack cache holds 40 MiB: 20 stacks of 2 MiB, besides the live threads.
        if ea.get("stacks", 0) > end["threads"] + 20:
            self.stats.fail(f"more thread stacks than live threads and glibc's cache: {ea}, {end['threads']} threads")
        if ea.get("other_anon", 0) > ba.get("other_anon", 0) + self.args.maps_slack:
            self.stats.fail(
                f"anonymous mapping leak: {ba.get('other_anon')} at the start, {ea.get('other_anon')} at the end "
                f"(besides arenas and stacks; slack {self.args.maps_slack})"
            )
        if end["rss_kb"] > base["rss_kb"] + self.args.rss_slack_mb * 1024:
            self.stats.fail(
                f"RSS not returned: {base['rss_kb']} KiB at the start, {end['rss_kb']} KiB at the end"
            )

    def check_server_log(self):
        try:
            with open(self.server_log, errors="replace") as f:
                text = f.read()
        except OSError:
            return
        for m in re.finditer(r"mismatches (\d+)", text):
            self.stats.verify_lines += 1
            if int(m.group(1)):
                self.stats.mismatches += int(m.group(1))
                self.stats.fail(f"mismatches in pagefold's log: {m.group(0)}")
        for pat in ["panicked", "stalled", "overdue"]:
            for line in text.splitlines():
                if pat in line.lower():
                    self.stats.fail(f"pagefold log: {line[:300]}")
                    break

    def report(self, base0, base, end):
        s = self.stats
        ok = not s.failures
        rows = [
            ("duration", f"{self.args.duration} s soak (+ drain), wall {s.now():.0f} s"),
            ("VMs created / deleted", f"{s.vms_created} / {s.vms_deleted}"),
            ("  ran to the end, exit 0", s.vms_finished_ok),
            ("  deleted while running", s.vms_deleted_running),
            ("  scattered placement", s.scattered),
            ("KSM assist: samples engaged / states seen", f"{s.assist_samples} / {', '.join(sorted(s.assist_seen)) or '-'}"),
            ("  new / reused groups", f"{s.groups_new} / {s.groups_reused}"),
            ("  creates refused (409)", s.create_refused),
            ("  most VMs at once", s.max_vms),
            ("VERIFY lines / mismatches", f"{s.verify_lines} / {s.mismatches}"),
            ("API requests", s.requests),
            ("  by status", json.dumps(dict(sorted(s.by_status.items())))),
            ("  max latency", f"{s.max_latency * 1000:.0f} ms ({s.slowest})"),
            ("mode changes", s.mode_changes),
            ("knob changes", s.knob_changes),
            ("auto threshold changes", s.auto_changes),
            ("health checks (non-200)", f"{s.health_checks} ({s.health_bad})"),
            ("max RSS", f"{s.max_rss_kb // 1024} MiB"),
            ("max maps / fds / threads", f"{s.max_maps} / {s.max_fds} / {s.max_threads}"),
            ("RSS fresh / base / end", f"{base0['rss_kb'] // 1024} / {base['rss_kb'] // 1024} / {end['rss_kb'] // 1024} MiB"),
            ("maps fresh / base / end", f"{base0['maps']} / {base['maps']} / {end['maps']}"),
            ("fds fresh / base / end", f"{base0['fds']} / {base['fds']} / {end['fds']}"),
            ("threads fresh / base / end", f"{base0['threads']} / {base['threads']} / {end['threads']}"),
            ("pool_pages base / end", f"{base['pool_pages']} / {end['pool_pages']}"),
            ("failures", len(s.failures)),
            ("result", "PASS" if ok else "FAIL"),
        ]
        w = max(len(r[0]) for r in rows)
        out = ["", "soak summary", "-" * (w + 40)]
        out += [f"{k:<{w}}  {v}" for k, v in rows]
        for t, f in s.failures[:30]:
            out.append(f"  failure at {t} s: {f}")
        if len(s.failures) > 30:
            out.append(f"  ... {len(s.failures) - 30} more")
        sys.stderr.write("\n".join(out) + "\n")
        summary = {
            "result": "PASS" if ok else "FAIL",
            "duration_s": self.args.duration,
            "rows": {k.strip(): v for k, v in rows},
            "baseline_fresh": base0,
            "baseline": base,
            "end": end,
            "failures": s.failures,
            "samples": s.samples,
        }
        with open(os.path.join(self.args.workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        return 0 if ok else 1


class _HealthStats:
    """Health answers are judged by the health poller itself."""

    def __init__(self, stats):
        self.s = stats

    def request(self, method, path, status, latency, detail):
        with self.s.lock:
            self.s.requests += 1
            key = str(status) if status is not None else "error"
            self.s.by_status[key] = self.s.by_status.get(key, 0) + 1
            if latency > self.s.max_latency:
                self.s.max_latency = latency
                self.s.slowest = f"{method} {path} -> {status} at {self.s.now():.0f} s"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--duration", type=int, required=True, help="seconds")
    p.add_argument("--workdir", required=True)
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--load-threads", type=int, default=4)
    p.add_argument("--load-gap", type=float, default=0.05, help="max pause between a load thread's requests (s)")
    p.add_argument("--settle", type=float, default=12.0, help="idle seconds before baseline/end measurements")
    p.add_argument("--maps-slack", type=int, default=8, help="anonymous mappings (besides malloc arenas and thread stacks) allowed to stay")
    p.add_argument("--rss-slack-mb", type=int, default=64)
    a = p.parse_args()
    log(f"seed {a.seed}, workdir {a.workdir}")
    s = Soak(a)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        rc = s.run()
    finally:
        if getattr(s, "proc", None) is not None and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    sys.exit(rc)


if __name__ == "__main__":
    main()
