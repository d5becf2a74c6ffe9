"""The chunked fp64 reference on the CPU with its forward's state hand-off in 4 and in 2 slices
(``reference.chunked_segments.HANDOFF_SLICES``), alternating in one process: issue 28 asks that the CPU path (CI,
``deltacheck verify``) not get slower when the GPU's settings change.

    python bench/cpu_slices.py [--reps 5] [--slices 4,2]

Prints, per shape, the median forward (no autograd) and forward+backward milliseconds of each setting."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from deltacheck.reference import chunked_segments  # noqa: E402
from deltacheck.reference.chunked import chunked_gdn2  # noqa: E402

SHAPES = ((2, 2048, 4, 64, 64), (1, 1024, 2, 128, 128), (4, 512, 4, 32, 32))  # N, T, H, K, V
ORDER = ("q", "k", "v", "g", "b", "w", "h0")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--slices", default="4,2")
    a = p.parse_args(argv)
    settings = [int(n) for n in a.slices.split(",")]
    default = chunked_segments.HANDOFF_SLICES
    try:
        for shape in SHAPES:
            made = common.make_inputs(*shape, torch.device("cpu"))
            x = [made[n] for n in ORDER]
            fwd, both = {n: [] for n in settings}, {n: [] for n in settings}
            for _ in range(a.reps):
                for n in settings:
                    chunked_segments.HANDOFF_SLICES = n
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        chunked_gdn2(*x, 0.3)
                    fwd[n].append(time.perf_counter() - t0)
                    leaves = [t.clone().requires_grad_() for t in x]
                    t0 = time.perf_counter()
                    o, s = chunked_gdn2(*leaves, 0.3)
                    (o.sum() + s.sum()).backward()
                    both[n].append(time.perf_counter() - t0)
            ms = lambda d: " / ".join(f"{statistics.median(d[n]) * 1e3:.1f}" for n in settings)  # noqa: E731
            print(f"N,T,H,K,V={shape}  slices {a.slices}: fwd {ms(fwd)} ms, fwd+bwd {ms(both)} ms", flush=True)
    finally:
        chunked_segments.HANDOFF_SLICES = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
