"""``deltacheck warmup``: run a selection against FLA once, autotuning, and record the autotune winners every
worker held, so later runs on this GPU x Triton x FLA compile one config per kernel instead of autotuning
(harness/backends/fla/winners.py). The run is an ordinary run directory too."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from deltacheck.cases.spec import TIERS
from deltacheck.cases.support import OPS
from deltacheck.harness.backends.fla import winners
from deltacheck.harness.ci.tiers import select
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.machine.environment import probe_env
from deltacheck.harness.run.execute import execute


def cmd_warmup(args) -> int:
    env = probe_env()
    if not env.cuda:
        print("deltacheck warmup: needs a CUDA GPU (FLA's kernels autotune on the device they run on)", file=sys.stderr)
        return 2
    cases = [c for op in (args.op or [None]) for c in select(args.tier, op=op, k=args.k)]
    if not cases:
        print(f"deltacheck warmup: no case selected from tier {args.tier}", file=sys.stderr)
        return 2
    name = winners.winners_name(env.device_name or "gpu", env.version("triton") or "unknown",
                                env.version("fla") or "unknown")
    target = Path(args.output) if args.output else winners.cache_root() / "fla-winners" / name
    with tempfile.TemporaryDirectory(prefix="deltacheck-winners-") as scratch:
        os.environ[winners.RECORD_ENV] = scratch
        try:
            status, run_dir = execute(cases, ["fla"], args.out, RunOptions(device="cuda", baseline=False),
                                      argv=sys.argv[1:], jobs=args.jobs, environ={})
        finally:
            os.environ.pop(winners.RECORD_ENV, None)
        kernels = winners.merge_files(sorted(Path(scratch).glob("winners.*.json")))
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {"gpu": env.device_name, "triton": env.version("triton"), "fla": env.version("fla"), "kernels": kernels}
    target.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    keys = sum(len(v) for v in kernels.values())
    print(f"deltacheck warmup: {keys} autotune winners of {len(kernels)} kernels recorded in {target} "
          f"(run directory {run_dir}, exit {status}); later runs with this GPU, Triton and FLA apply them")
    return 0 if kernels else 1


def add_cli(sub) -> None:
    p = sub.add_parser("warmup", help="autotune FLA's kernels once and record the winners for later runs",
                       description="Run a selection against fla on this GPU with autotuning, and write every "
                                   "autotune winner the workers held to the cache (or --output). Later runs with "
                                   "the same GPU model, Triton and FLA apply them: one compile per kernel and key.")
    p.add_argument("--tier", default="L0", choices=TIERS, help="the tier whose cases warm up (default L0)")
    p.add_argument("--op", action="append", choices=OPS, help="only this op (repeatable; default: every op)")
    p.add_argument("-k", dest="k", default=None, metavar="EXPR",
                   help="only cases whose id matches this pytest-style -k expression (e.g. 'thd and bwd')")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="N worker processes side by side (default 1); each records the winners it autotuned")
    p.add_argument("--out", default="runs", help="root folder for the run directory (default ./runs)")
    p.add_argument("--output", metavar="FILE", help="where to write the winners (default: the deltacheck cache)")
    p.set_defaults(func=cmd_warmup)
