"""What TileLang compiled in a run, from its logs: with ``TILELANG_JIT_DIAGNOSTICS=1`` (bench/i25_s5_h200.sh sets it)
TileLang logs every JIT phase it runs (tilelang 0.1.15, ``tilelang/jit/diagnostics.py``), e.g.

    2026-12-02 18:30:01  [TileLang:tilelang.jit.diagnostics:INFO] (diagnostics.py:44): TileLang JIT phase done:
    cache.compile elapsed=12.345s backend='tvm_ffi', cache_key='ab12...', cache_path='...', kernel='main', ...

(one line). ``cache.compile`` is a kernel built on a cache miss (memory and disk), ``lower`` its lowering through
nvcc, ``adapter`` the call wrapper. Prints, per phase, how many and how many seconds; per kernel name the compiles;
and the cache keys built more than once (by two worker processes at the same time: a process finds what it built in
memory, and what another finished on disk).

    python3 bench/i25_tilelang_compiles.py LOG... [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"TileLang JIT phase (done|failed): (\S+) elapsed=([0-9.]+)s(.*)$")
FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|[^,\s]+)")


def phases(lines) -> list[dict]:
    """One dict per logged phase: phase, ok, seconds, and the context fields (kernel, cache_key, ...) unquoted."""
    out = []
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        fields = {k: v[1:-1] if v.startswith("'") else v for k, v in FIELD.findall(m.group(4))}
        out.append({"phase": m.group(2), "ok": m.group(1) == "done", "seconds": float(m.group(3)), **fields})
    return out


def summarize(rows: list[dict]) -> dict:
    by_phase = defaultdict(list)
    for r in rows:
        by_phase[r["phase"]].append(r["seconds"])
    compiles = [r for r in rows if r["phase"] == "cache.compile" and r["ok"]]
    by_kernel = defaultdict(list)
    by_key = defaultdict(list)
    for r in compiles:
        by_kernel[r.get("kernel", "?")].append(r["seconds"])
        by_key[r.get("cache_key", "?")].append(r["seconds"])
    again = {k: s for k, s in by_key.items() if len(s) > 1}
    return {
        "phases": {p: {"count": len(s), "seconds": round(sum(s), 1)} for p, s in sorted(by_phase.items())},
        "failed": sum(not r["ok"] for r in rows),
        "compiles": len(compiles), "distinct_keys": len(by_key),
        "kernels": {k: {"count": len(s), "seconds": round(sum(s), 1), "median": round(statistics.median(s), 1)}
                    for k, s in sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))},
        "built_again": {"keys": len(again), "extra_compiles": sum(len(s) - 1 for s in again.values()),
                        "extra_seconds": round(sum(sum(s) - max(s) for s in again.values()), 1)},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--json", help="also write the summary as JSON here")
    args = p.parse_args(argv)
    rows = []
    for path in args.logs:
        with open(path, encoding="utf-8", errors="replace") as fh:
            rows += phases(fh)
    s = summarize(rows)
    print(f"TileLang: {s['compiles']} kernel compiles ({s['distinct_keys']} distinct cache keys), "
          f"{s['failed']} failed phases")
    for name, v in s["phases"].items():
        print(f"  phase {name:<14} {v['count']:>5} x, {v['seconds']:>8.1f} s")
    again = s["built_again"]
    print(f"  built more than once: {again['keys']} keys, {again['extra_compiles']} extra compiles, "
          f"{again['extra_seconds']:.1f} s")
    print("  by kernel (compiles, seconds, median):")
    for name, v in s["kernels"].items():
        print(f"    {name:<48} {v['count']:>4} {v['seconds']:>8.1f} {v['median']:>6.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(s, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
