"""The fused lane benchmark: the same tier against the fused backends twice — cold caches, then warm — printing
each pass's wall time, worker-seconds and where they went (the phase totals every task records), side by side.

    python bench/lanes.py                          # L0, the lanes' backends, -j 8: a cold pass then a warm pass
    python bench/lanes.py --passes warm --jobs 8   # only a pass on the caches as they are
    nox -s bench -- lanes

Cold means an empty Triton cache and no winners recorded in the cache (a fresh DELTACHECK_CACHE_DIR and
TRITON_CACHE_DIR, both in a scratch directory unless --cache-dir names one): what a fresh CI runner has, so the
winners shipped for this GPU x Triton x FLA (harness/backends/fla/winners/) do apply. Warm reuses the caches the
cold pass left (binaries and, with TRITON_CACHE_AUTOTUNING, autotune results). ``--winners FILE`` gives the cold
pass more recorded FLA autotune winners (deltacheck warmup). Every pass is an ordinary run directory under --out.
Targets (issue 17, one H200, -j 8): cold <= 8 min, warm <= 2 min.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltacheck.harness.backends.table import LANES_DEFAULT


def _pass(name: str, args, cache: Path, out: Path) -> dict:
    env = dict(os.environ)
    env.update(DELTACHECK_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"), PYTHONUNBUFFERED="1")
    if name == "cold" and args.winners:
        env["DELTACHECK_FLA_WINNERS"] = str(Path(args.winners).resolve())
    if args.record_winners:
        env["DELTACHECK_RECORD_WINNERS"] = str(out / f"winners-{name}")
    root = out / name
    argv = [sys.executable, "-m", "deltacheck", "run", "--tier", args.tier, "-j", str(args.jobs), "--out", str(root)]
    for backend in args.backend or list(LANES_DEFAULT):
        argv += ["--backend", backend]
    for op in args.op or []:
        argv += ["--op", op]
    if args.task_timeout:
        argv += ["--task-timeout", str(args.task_timeout)]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env)
    try:
        code = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM ends a run the way a CI timeout does: every judged check kept, workers stopped, files folded
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        code = "timeout"
    wall = time.monotonic() - t0
    run_dir = max(root.glob("*/"), default=None, key=lambda p: p.name)
    tasks = []
    if run_dir is not None:
        for line in (run_dir / "results.jsonl").read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "task":
                tasks.append(rec)
    phases: dict[str, float] = {}
    for t in tasks:
        for k, v in (t.get("phases") or {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
    return {"pass": name, "exit": code, "wall_s": wall, "tasks": len(tasks),
            "worker_s": sum(phases.values()), "phases": phases, "run_dir": str(run_dir) if run_dir else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", default="L0")
    p.add_argument("--backend", action="append")
    p.add_argument("--op", action="append")
    p.add_argument("--jobs", "-j", type=int, default=8)
    p.add_argument("--passes", default="cold,warm",
                   help="comma list of cold, warm, in order; repeat one for a median (default cold,warm)")
    p.add_argument("--cache-dir", help="the caches to use (default: a fresh scratch directory)")
    p.add_argument("--winners", help="recorded FLA autotune winners for the cold pass")
    p.add_argument("--record-winners", action="store_true", help="each pass records the winners its workers held")
    p.add_argument("--timeout", type=float, default=None, help="seconds per pass (the run is cut; judged checks stay)")
    p.add_argument("--task-timeout", type=float, default=None)
    p.add_argument("--out", default="runs/lanes", help="where the passes' run directories go")
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    passes = [name.strip() for name in args.passes.split(",") if name.strip()]
    if set(passes) - {"cold", "warm"} or passes.count("cold") > 1 or ("cold" in passes and passes[0] != "cold"):
        p.error(f"--passes: cold (once, first: the caches are empty only then) and warm (any number); got {args.passes!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = None if args.cache_dir else tempfile.TemporaryDirectory(prefix="deltacheck-lanes-")
    cache = Path(args.cache_dir) if args.cache_dir else Path(scratch.name)
    rows = [_pass(name, args, cache, out) for name in passes]
    names = sorted({k for r in rows for k in r["phases"]}, key=lambda k: -sum(r["phases"].get(k, 0.0) for r in rows))
    print(f"\nlanes: tier {args.tier}, backends {', '.join(args.backend or LANES_DEFAULT)}, -j {args.jobs}")
    print(f"{'':18}" + "".join(f"{r['pass']:>12}" for r in rows))
    for label, key in (("wall s", "wall_s"), ("worker s", "worker_s"), ("tasks", "tasks"), ("exit", "exit")):
        print(f"{label:18}" + "".join(f"{r[key]:>12.1f}" if isinstance(r[key], float) else f"{r[key]!s:>12}"
                                      for r in rows))
    for name in names:
        print(f"  {name:16}" + "".join(f"{r['phases'].get(name, 0.0):>12.1f}" for r in rows))
    # a pass named more than once (--passes cold,warm,warm,warm) is summarized by its median
    walls = {name: sorted(r["wall_s"] for r in rows if r["pass"] == name) for name in {r["pass"] for r in rows}}
    medians = {name: w[len(w) // 2] if len(w) % 2 else (w[len(w) // 2 - 1] + w[len(w) // 2]) / 2
               for name, w in walls.items()}
    for name in sorted(walls, key=lambda n: n != "cold"):
        if len(walls[name]) > 1:
            print(f"{name} wall: median {medians[name]:.1f} s of {len(walls[name])} passes "
                  f"({', '.join(f'{w:.1f}' for w in walls[name])})")
    if medians.get("warm") and "cold" in medians:
        print(f"cold / warm wall: {medians['cold'] / medians['warm']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    if scratch is not None:
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
