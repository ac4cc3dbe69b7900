#!/usr/bin/env python3
"""Reads a trace of scripts/lib/mmap-lock-trace.sh and prints who waited
for the process's mmap lock longest, who held it meanwhile, and the
longest holds: a stop of a guest that an mmap-lock writer (the engine's
mmap or userfaultfd registration) turned from one vCPU's into every
vCPU's shows as a write wait with a long read hold under it.

    scripts/lib/mmap-lock-report.py lock.trace [N]
"""
import re
import sys

EVENT = re.compile(
    r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (mmap_lock_\w+): "
    r"mm=\S+ memcg_path=\S* write=(\w+)"
)
FAULT = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\].*kvm_page_fault: .*address (0x[0-9a-f]+)")


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    names, starts, acquired, fault = {}, {}, {}, {}
    waits, holds = [], []
    with open(path) as f:
        for line in f:
            m = FAULT.match(line)
            if m:
                # The guest-physical page of the vCPU's latest nested fault.
                fault[int(m.group(2))] = m.group(3)
                continue
            m = EVENT.match(line)
            if not m:
                continue
            comm, tid, t, ev, write = m.groups()
            tid, t = int(tid), float(t)
            names[tid] = comm
            if ev == "mmap_lock_start_locking":
                starts[tid] = t
            elif ev == "mmap_lock_acquire_returned":
                if tid in starts:
                    waits.append((t - starts.pop(tid), t, tid, write))
                acquired[tid] = (t, write, fault.pop(tid, None))
            elif ev == "mmap_lock_released" and tid in acquired:
                a, w, gpa = acquired.pop(tid)
                holds.append((t - a, a, tid, w, gpa))
    print(f"{len(waits)} acquisitions, {len(holds)} releases")
    print("longest waits (and the holds of 20 ms or more by others during them):")
    for d, end, tid, write in sorted(waits, key=lambda w: w[0], reverse=True)[:top]:
        start = end - d
        kind = "write" if write == "true" else "read"
        print(f"  {d * 1e3:8.1f} ms {kind:5} {names[tid]}-{tid} at {start:.3f}")
        for hd, hs, htid, hw, _ in holds:
            if htid != tid and hs < end and hs + hd > start and hd >= 0.02:
                hk = "write" if hw == "true" else "read"
                print(f"      held {hd * 1e3:8.1f} ms {hk:5} by {names[htid]}-{htid} from {hs:.3f}")
    print("longest holds:")
    for d, a, tid, write, gpa in sorted(holds, key=lambda h: h[0], reverse=True)[:top]:
        kind = "write" if write == "true" else "read"
        why = f", nested fault at guest-physical {gpa}" if gpa else ""
        print(f"  {d * 1e3:8.1f} ms {kind:5} {names[tid]}-{tid} from {a:.3f}{why}")


if __name__ == "__main__":
    main()
