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

Backends that cannot share a Python environment (harness/ci/families.py) run as families, side by side, each a
``deltacheck run`` of its own with its share of the workers, over the same caches:

    python bench/lanes.py -j 8 --family qla:4=/tmp/qla-site --family jax:2=/tmp/jax-site --family vllm:2=/tmp/vllm
    python bench/lanes.py -j 8 --family qla --family jax     # the jobs split evenly, this interpreter's packages

``--family NAME[:JOBS][=PATH]``: the family's registered backends (those of ``--backend`` too, if given), JOBS
workers (default: -j split evenly over the families), PATH put in front of PYTHONPATH (a site directory, as on a
machine without a package index; docs/ci.md). A pass's wall time is the slowest family's; its worker-seconds and
tasks are summed; each family's run directory is under --out/<pass>/<family>. Issue 25's target for the lane
with every backend that runs on the H200: cold <= 6 min, warm <= 1 min at -j 8.
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

from deltacheck.harness.backends.base import registered
from deltacheck.harness.backends.table import LANES_DEFAULT
from deltacheck.harness.ci.families import family


def parse_family(text: str) -> tuple[str, int | None, str | None]:
    """``NAME[:JOBS][=PATH]`` -> (name, jobs or None, path or None); the name must be a family's."""
    head, _, path = text.partition("=")
    name, _, jobs = head.partition(":")
    try:
        family(name)
    except KeyError as err:
        raise argparse.ArgumentTypeError(err.args[0]) from None
    if jobs and (not jobs.isdigit() or int(jobs) < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: JOBS must be a whole number >= 1")
    return name, int(jobs) if jobs else None, path or None


def family_runs(specs, jobs: int, backends=None, known=None) -> list[tuple[str, list[str], int, str | None]]:
    """Per family (name, its backends, its workers, its PYTHONPATH prefix): the backends it holds that are
    registered (and in ``backends`` when given); workers as given, else ``jobs`` split evenly over the families
    without a count (at least 1 each). A family left with no backend is dropped."""
    known = set(registered()) if known is None else set(known)
    free = [s for s in specs if s[1] is None]
    left = max(jobs - sum(s[1] for s in specs if s[1] is not None), len(free))
    shares = {s[0]: left // len(free) + (1 if i < left % len(free) else 0) for i, s in enumerate(free)} if free else {}
    runs = []
    for name, count, path in specs:
        names = [b for b in family(name).backends if b in known and (not backends or b in backends)]
        if names:
            runs.append((name, names, count if count is not None else shares[name], path))
    return runs


def _run_argv(args, backends, jobs: int, root: Path) -> list[str]:
    argv = [sys.executable, "-m", "deltacheck", "run", "--tier", args.tier, "-j", str(jobs), "--out", str(root)]
    for backend in backends:
        argv += ["--backend", backend]
    for op in args.op or []:
        argv += ["--op", op]
    if args.task_timeout:
        argv += ["--task-timeout", str(args.task_timeout)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if args.shard:
        argv += ["--shard", args.shard]
    return argv


def _tasks(root: Path) -> list[dict]:
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
    return tasks


def _pass(name: str, args, cache: Path, out: Path) -> dict:
    env = dict(os.environ)
    env.update(DELTACHECK_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"), PYTHONUNBUFFERED="1")
    if name == "cold" and args.winners:
        env["DELTACHECK_FLA_WINNERS"] = str(Path(args.winners).resolve())
    if args.record_winners:
        env["DELTACHECK_RECORD_WINNERS"] = str(out / f"winners-{name}")
    root = out / name
    if args.family:
        runs = family_runs(args.family, args.jobs, args.backend)
    else:
        runs = [("", list(args.backend or LANES_DEFAULT), args.jobs, None)]
    t0 = time.monotonic()
    procs = []
    for fam, backends, jobs, path in runs:
        run_env = dict(env)
        if path:
            run_env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)
        procs.append(subprocess.Popen(_run_argv(args, backends, jobs, root / fam if fam else root), env=run_env))
    codes, walls = [], []
    for proc in procs:
        left = None if args.timeout is None else max(0.0, args.timeout - (time.monotonic() - t0))
        try:
            codes.append(proc.wait(timeout=left))
        except subprocess.TimeoutExpired:
            # SIGTERM ends a run the way a CI timeout does: every judged check kept, workers stopped, files folded
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            codes.append("timeout")
        walls.append(time.monotonic() - t0)
    wall = time.monotonic() - t0
    tasks = [t for fam, *_ in runs for t in _tasks(root / fam if fam else root)]
    phases: dict[str, float] = {}
    for t in tasks:
        for k, v in (t.get("phases") or {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
    exit_code = codes[0] if len(codes) == 1 else " ".join(f"{r[0]}:{c}" for r, c in zip(runs, codes))
    return {"pass": name, "exit": exit_code, "wall_s": wall, "tasks": len(tasks), "worker_s": sum(phases.values()),
            "shard": args.shard, "threads": args.threads,
            "phases": phases, "families": {r[0]: {"backends": r[1], "jobs": r[2], "exit": c}
                                           for r, c in zip(runs, codes) if r[0]},
            "run_dir": str(root)}


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
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (deltacheck run --threads)")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="only shard I of N of the tier's selection (deltacheck run --shard): a pass over a part of "
                        "the tier, e.g. a cold and a warm pass that fit one call")
    p.add_argument("--out", default="runs/lanes", help="where the passes' run directories go")
    p.add_argument("--json", help="also write the numbers here")
    p.add_argument("--family", action="append", type=parse_family, metavar="NAME[:JOBS][=PATH]",
                   help="run this backend family (harness/ci/families.py) as a run of its own, side by side with the "
                        "other --family runs (repeatable)")
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
    what = (", ".join(f"{f}: {'+'.join(b)} -j {j}" for f, b, j, _ in family_runs(args.family, args.jobs, args.backend))
            if args.family else f"backends {', '.join(args.backend or LANES_DEFAULT)}, -j {args.jobs}")
    part = (f", shard {args.shard}" if args.shard else "") + (f", --threads {args.threads}" if args.threads else "")
    print(f"\nlanes: tier {args.tier}{part}, {what}")
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
