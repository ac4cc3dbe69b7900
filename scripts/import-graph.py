#!/usr/bin/env python3
"""Prints pagefold's import graph and fails when it goes against the
architecture (docs/architecture.md):

* crates: binary -> {api, bench} -> vmm -> {devices, dedup} -> guest ABI;
  an arrow that goes up or sideways fails, and dedup imports no other crate;
* modules: `use crate::...`, `super::...` and child-module paths of every
  crate's non-test code; a circle between modules fails, and so does an
  arrow that the rules below forbid (the grouping of vmm by guest kind, the
  API's router/state/handler split, the KSM backend and its driver);
* the production binary (no `bench` feature) links neither pagefold-bench
  (the benchmarks, their reports and charts) nor plotters; with the feature
  it links both (so the check cannot pass by accident).

Standard library only; run from anywhere: `scripts/import-graph.py`
(`--quiet`: only what fails). Exit status 1 on any failure.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Layer of each crate: an arrow must go to a strictly lower layer.
LAYER = {
    "pagefold": 4,
    "pagefold-api": 3,
    "pagefold-bench": 3,
    "pagefold-vmm": 2,
    "pagefold-devices": 1,
    "pagefold-dedup": 1,
    "pagefold-guest-abi": 0,
}
# Crates that may import no other workspace crate at all.
LEAVES = {"pagefold-dedup", "pagefold-guest-abi"}

# Module arrows that must not exist: (crate, from, to); a module path
# covers its descendants ("" is the crate root).
FORBIDDEN = [
    # vmm: the two guest kinds stay apart; disks and NICs are neutral.
    ("pagefold-vmm", "workload", "linux"),
    ("pagefold-vmm", "linux", "workload"),
    ("pagefold-vmm", "disk", "workload"),
    ("pagefold-vmm", "disk", "linux"),
    ("pagefold-vmm", "disk", "vm"),
    ("pagefold-vmm", "net", "workload"),
    ("pagefold-vmm", "net", "linux"),
    ("pagefold-vmm", "net", "vm"),
    ("pagefold-vmm", "workload", "vm"),
    ("pagefold-vmm", "linux", "vm"),
    # api: router -> handlers -> state; nothing imports the router back.
    ("pagefold-api", "state", "router"),
    ("pagefold-api", "state", "vms"),
    ("pagefold-api", "state", "dedup"),
    ("pagefold-api", "state", "system"),
    ("pagefold-api", "vms", "router"),
    ("pagefold-api", "dedup", "router"),
    ("pagefold-api", "system", "router"),
    # dedup's KSM backend: both halves import the shared state, the driver
    # never the backend.
    ("pagefold-dedup", "ksm::driver", "ksm::backend"),
    ("pagefold-dedup", "ksm::shared", "ksm::backend"),
    ("pagefold-dedup", "ksm::shared", "ksm::driver"),
    # cli: main -> cli (dispatch) -> commands; commands never import back.
    ("pagefold", "bench", "cli"),
    ("pagefold", "ksm", "cli"),
    ("pagefold", "report", "cli"),
    ("pagefold", "output", "cli"),
    ("pagefold", "error", "cli"),
]

# Crates whose module circles are listed but do not fail (none left: the
# benchmarks' seed chart moved to report.rs, the saving percentages to
# seed.rs).
CIRCLES_WARN_ONLY: set[str] = set()

failures = []
warnings = []


def fail(msg):
    failures.append(msg)


# ---------------------------------------------------------------- crates


def crate_graph(quiet):
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    pkgs = {p["name"]: p for p in meta["packages"]}
    if not quiet:
        print("== crates (normal, dev, build dependencies)")
    for name in sorted(pkgs, key=lambda n: -LAYER.get(n, 99)):
        if name not in LAYER:
            fail(f"crate {name} has no layer in scripts/import-graph.py")
            continue
        deps = []
        for d in pkgs[name]["dependencies"]:
            if d["name"] not in LAYER:
                continue
            kind = d["kind"] or "normal"
            if d["name"] == name and kind == "dev":
                # A crate's dev-dependency on itself turns on its test-only
                # features (e.g. dedup's `testing` hooks) for its own
                # integration tests and benches: no arrow to another crate.
                deps.append(f"{name} (dev; itself, test features)")
                continue
            note = [] if kind == "normal" else [kind]
            if d.get("optional"):
                feats = [
                    f
                    for f, v in pkgs[name].get("features", {}).items()
                    if f"dep:{d['name']}" in v
                ]
                note.append("feature " + ",".join(feats or ["?"]))
            deps.append(d["name"] + (f" ({'; '.join(note)})" if note else ""))
            if name in LEAVES:
                fail(f"crate {name} imports {d['name']}: it must import no other crate")
            elif LAYER[d["name"]] >= LAYER[name]:
                fail(f"crate arrow {name} -> {d['name']} goes up or sideways")
        if not quiet:
            print(f"{name} -> {', '.join(sorted(deps)) or '(none)'}")
    return pkgs


# ---------------------------------------------------------------- modules


def strip_comments(text):
    # Line comments (doc comments hold `crate::` links that import nothing).
    out = []
    for line in text.splitlines():
        i = line.find("//")
        # Keep `//` inside string literals (rare in use lines) from cutting.
        while i >= 0 and line[:i].count('"') % 2 == 1:
            i = line.find("//", i + 2)
        out.append(line if i < 0 else line[:i])
    return "\n".join(out)


def strip_test_code(text):
    """Drops `#[cfg(test)]` items: inline test modules and single lines."""
    out, i = [], 0
    pat = re.compile(r"#\[cfg\(test\)\]\s*")
    while True:
        m = pat.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()])
        j = m.end()
        # Skip other attributes, then the item up to its `;` or its block.
        while text.startswith("#[", j):
            j = text.index("]", j) + 1
            while text[j].isspace():
                j += 1
        semi, brace = text.find(";", j), text.find("{", j)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1


MOD_DECL = re.compile(
    r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;"
)


def child_file(path, name, attrs):
    d = os.path.dirname(path)
    m = re.search(r'#\[path\s*=\s*"([^"]+)"\]', attrs)
    if m:
        return os.path.join(d, m.group(1))
    base = os.path.basename(path)
    if base not in ("mod.rs", "lib.rs", "main.rs"):
        d = os.path.join(d, base[:-3])
    for cand in (os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def walk_modules(root_file):
    """Module path (tuple) -> list of non-test source texts."""
    mods, todo = {}, [((), root_file)]
    while todo:
        mpath, f = todo.pop()
        with open(f) as fh:
            text = strip_test_code(strip_comments(fh.read()))
        mods.setdefault(mpath, []).append(text)
        for m in MOD_DECL.finditer(text):
            attrs, name = m.group(1), m.group(2)
            child = child_file(f, name, attrs)
            if child:
                todo.append((mpath + (name,), child))
    return mods


def expand_use(tree):
    """`a::{b, c::{d}}` -> ["a::b", "a::c::d"] (first segments suffice)."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out.extend(prefix + q for q in expand_use(p))
    return out


PATH = re.compile(r"(?<![\w:])(\$?crate|super|self)((?:::(?:super|\w+))+)")
USE = re.compile(r"\buse\s+([^;]+);")


def targets(mpath, text, children):
    """Module paths (possibly too long) this text refers to."""
    paths = []
    for m in USE.finditer(text):
        for p in expand_use(re.sub(r"\s+", "", m.group(1))):
            paths.append(p)
    for m in PATH.finditer(text):
        paths.append(m.group(1) + m.group(2))
    out = []
    for p in paths:
        segs = [s for s in p.split("::") if s]
        if not segs:
            continue
        head = segs[0].lstrip("$")
        if head == "crate":
            out.append(tuple(segs[1:]))
        elif head in ("super", "self"):
            base = list(mpath)
            while segs and segs[0] in ("super", "self"):
                if segs.pop(0) == "super":
                    base = base[:-1]
            out.append(tuple(base + segs))
        elif head in children:
            out.append(mpath + tuple(segs))
    return out


def resolve(target, mods):
    """The longest module path that prefixes `target`."""
    for n in range(len(target), -1, -1):
        if target[:n] in mods:
            return target[:n]
    return ()


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "(root)"


def under(m, prefix):
    p = tuple(prefix.split("::")) if prefix else ()
    return m[: len(p)] == p


def module_graph(pkgs, quiet):
    for crate in sorted(pkgs, key=lambda n: -LAYER.get(n, 99)):
        pkg = pkgs[crate]
        roots = [
            t["src_path"]
            for t in pkg["targets"]
            if set(t["kind"]) & {"lib", "bin"}
        ]
        for root in roots:
            mods = walk_modules(root)
            edges = {}
            for m, texts in mods.items():
                children = {c[-1] for c in mods if c[:-1] == m and len(c) == len(m) + 1}
                for text in texts:
                    for t in targets(m, text, children):
                        r = resolve(t, mods)
                        # Uses of an ancestor (the crate root's constants,
                        # a parent's re-exports) are nesting, not arrows.
                        if r != m and m[: len(r)] != r:
                            edges.setdefault(m, set()).add(r)
            label = f"{crate} ({os.path.relpath(root, ROOT)})"
            if not quiet:
                print(f"\n== modules of {label}")
                for m in sorted(mods):
                    if edges.get(m):
                        print(f"{name(m)} -> {', '.join(sorted(name(t) for t in edges[m]))}")
            for comp in sccs(mods.keys(), edges):
                if len(comp) > 1:
                    msg = f"{label}: circle among {', '.join(sorted(name(c) for c in comp))}"
                    (warnings if crate in CIRCLES_WARN_ONLY else failures).append(msg)
            for c, frm, to in FORBIDDEN:
                if c != crate:
                    continue
                for m, ts in edges.items():
                    for t in ts:
                        if under(m, frm) and under(t, to) and not under(m, to):
                            fail(f"{label}: forbidden arrow {name(m)} -> {name(t)}")


# ---------------------------------------------------------------- bench feature


def linked(features):
    r = subprocess.run(
        ["cargo", "tree", "-p", "pagefold", "-e", "normal", "--prefix", "none"] + features,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        fail(f"cargo tree {' '.join(features)}: {r.stderr.strip()}")
        return set()
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def bench_feature(quiet):
    without, with_ = linked([]), linked(["--features", "bench"])
    for c in ("pagefold-bench", "plotters"):
        if c in without:
            fail(f"the binary without the bench feature links {c}")
        if c not in with_:
            fail(f"the binary with the bench feature does not link {c} (check is stale?)")
    if not quiet:
        print("\n== bench feature")
        print(f"without: pagefold-bench {'linked' if 'pagefold-bench' in without else 'not linked'}, "
              f"plotters {'linked' if 'plotters' in without else 'not linked'}")
        print(f"with:    pagefold-bench {'linked' if 'pagefold-bench' in with_ else 'not linked'}, "
              f"plotters {'linked' if 'plotters' in with_ else 'not linked'}")


def main():
    quiet = "--quiet" in sys.argv[1:]
    pkgs = crate_graph(quiet)
    module_graph(pkgs, quiet)
    bench_feature(quiet)
    for w in warnings:
        print(f"warning (not enforced): {w}", file=sys.stderr)
    if failures:
        print("\nimport graph: FAILED", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print("\nimport graph: ok (no upward crate arrows, no module circles, no forbidden arrows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
