"""The chunked fp64 reference's forward+backward at the benchmark's size with the backward's segment budget varied,
and its forward with the hand-off's slicing varied (issue 28's step notes): one process, medians of ``--reps`` after a
settle, peaks and the CPU time per call.

    python bench/chunked_steps.py [--budgets-mib 64,32,64] [--fwd-slices 4,1,4] [--reps 5] [--json OUT]

Each row sets ``reference.chunked.BACKWARD_SEGMENT_BYTES`` (the forward keeps its own budget) and times
``chunked_gdn2`` forward+backward (N=4 T=4096 H=16 K=V=128, fp64, CUDA): the median wall time (CUDA events), the
median CPU time of the process over the same calls (``time.process_time``, every thread: autograd runs the
backward on a thread of its own; how much of the wall the Python and launch work takes), and the peak memory above what was allocated before (with the inputs' gradients). Each forward
row sets ``reference.chunked_segments.HANDOFF_SLICES`` (how many parts the state hand-off's matrices are made in)
and times the forward alone (no autograd)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from deltacheck.reference import chunked, chunked_segments  # noqa: E402
from deltacheck.reference.chunked import chunked_gdn2  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets-mib", default="64,32,64")
    p.add_argument("--fwd-slices", default="4,1,4")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    x = common.make_inputs(4, 4096, 16, 128, 128, dev)
    ins = [x[n] for n in ("q", "k", "v", "g", "b", "w", "h0")]
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(4, 4096, 16, 128, generator=gen, dtype=torch.float64).to(dev)
    ds = torch.randn(4, 16, 128, 128, generator=gen, dtype=torch.float64).to(dev)
    step, prepare = common.fwdbwd_closure(ins, lambda t: chunked_gdn2(*t, 128**-0.5), lambda o, s: (do, ds))
    default = chunked.BACKWARD_SEGMENT_BYTES
    rows = []
    common.settle(step, dev, a.settle)
    for mib in (int(v) for v in a.budgets_mib.split(",")):
        chunked.BACKWARD_SEGMENT_BYTES = mib * 2**20
        for _ in range(2):
            step()
        common.sync(dev)
        walls, cpus = [], []
        for _ in range(a.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c0 = time.process_time()
            e0.record()
            step()
            e1.record()
            e1.synchronize()
            c1 = time.process_time()
            walls.append(e0.elapsed_time(e1))
            cpus.append((c1 - c0) * 1e3)
        peak = common.peak_extra(step, dev, prepare) / 2**30
        row = {"backward_segment_mib": mib, "fwdbwd_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus),
               "peak_gib": peak}
        rows.append(row)
        print(f"backward segment budget {mib:4d} MiB: fwd+bwd {row['fwdbwd_ms']:7.2f} ms (CPU {row['cpu_ms']:7.2f} ms)"
              f"  peak +{peak:.3f} GiB", flush=True)
    chunked.BACKWARD_SEGMENT_BYTES = default
    slices_default = chunked_segments.HANDOFF_SLICES
    with torch.no_grad():
        fwd = lambda: chunked_gdn2(*ins, 128**-0.5)  # noqa: E731
        for n in (int(v) for v in a.fwd_slices.split(",") if v):
            chunked_segments.HANDOFF_SLICES = n
            ms = common.timeit(fwd, dev, 2, a.reps) * 1e3
            peak = common.peak_extra(fwd, dev) / 2**30
            rows.append({"handoff_slices": n, "fwd_ms": ms, "peak_gib": peak})
            print(f"forward, hand-off in {n} slices: {ms:6.3f} ms  peak +{peak:.3f} GiB", flush=True)
    chunked_segments.HANDOFF_SLICES = slices_default
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
