"""The fused fp64 kernel's settings, timed on the GPU (issue 28; reference/chunked_fused.py).

    python bench/fused_configs.py [--configs 8x4s,16x4sd,...] [--reps 5] [--budget-s 60] [--jsonl OUT] [--best OUT]
    python bench/fused_configs.py --compile-only --configs C

A setting is ``DELTACHECK_CHUNKED_FUSED_CONFIG``'s "KTxWARPS" plus "s" (segmented scans), "d" (tl.dot), "p" (products
of exp(g)) and/or "t" (T's diagonal blocks in the kernel);
settings change the kernel's speed, not what it computes. At N=4 T=4096 H=16 K=V=128, per setting: the kernel alone
(``chunked_fused.start`` on the one 4096-token segment) and the whole fp64 forward, medians after warm-ups (the first
call compiles), and the forward's rel RMS against the same forward with the kernel off; then the forward with the
kernel off. Each is one JSON line as soon as it is measured (``--jsonl`` appends), so a run cut short keeps what it
had. ``--best`` writes the fastest setting whose forward agrees with the unfused one to 1e-13 (nothing when none
does). ``--compile-only`` runs each setting once at a small size with the benchmark's widths (K, V, the chunk and
the integer specializations are the same), which compiles it into ``TRITON_CACHE_DIR`` for a later process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from deltacheck.reference import chunked_fused  # noqa: E402
from deltacheck.reference.chunked import chunked_gdn2  # noqa: E402

CONFIGS = "16x2sdpt,16x2sdp,16x4sd,16x1sdpt,32x2sdpt,8x4s"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=CONFIGS)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument("--jsonl", default=None)
    p.add_argument("--best", default=None)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--device", default="cuda", help="cpu: a check of this script under TRITON_INTERPRET=1")
    p.add_argument("--size", default=None, help="N,T,H,K,V instead of 4,4096,16,128,128 (or 4,128,... to compile)")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    dev = torch.device(a.device)
    size = [int(v) for v in a.size.split(",")] if a.size else [4, 128 if a.compile_only else 4096, 16, 128, 128]
    x = common.make_inputs(*size, dev)
    ins = [x[n] for n in ("q", "k", "v", "g", "b", "w", "h0")]
    scale = size[3] ** -0.5

    def emit(row):
        print(json.dumps(row), flush=True)
        if a.jsonl:
            with open(a.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    with torch.no_grad():
        chunked_fused.FUSED = False
        ref = chunked_gdn2(*ins, scale)[0]
    chunked_fused.FUSED = None
    emit({"fused": chunked_fused.describe()})
    timed = {}
    for cfg in [c for c in a.configs.split(",") if c] + ([] if a.compile_only else ["off"]):
        if time.monotonic() - t0 > a.budget_s:
            emit({"config": cfg, "skipped": "budget"})
            continue
        row = {"config": cfg}
        try:
            chunked_fused.FUSED = cfg != "off"
            if cfg != "off":
                os.environ["DELTACHECK_CHUNKED_FUSED_CONFIG"] = cfg
            with torch.no_grad():
                if cfg != "off":
                    c0 = time.monotonic()
                    chunked_fused.start(*ins[:6], 64)
                    common.sync(dev)
                    row["first_call_s"] = round(time.monotonic() - c0, 2)
                    o = chunked_gdn2(*ins, scale)[0]
                    row["vs_unfused"] = common.rel_rms(o, ref)
                    del o
                if not a.compile_only:
                    if cfg != "off":
                        row["kernel_ms"] = common.timeit(lambda: chunked_fused.start(*ins[:6], 64), dev, 2, a.reps) * 1e3
                    row["fwd_ms"] = common.timeit(lambda: chunked_gdn2(*ins, scale), dev, 2, a.reps) * 1e3
                    if cfg != "off" and row["vs_unfused"] <= 1e-13:
                        timed[cfg] = row["fwd_ms"]
            row["failed"] = chunked_fused.FAILED
        except Exception as e:  # noqa: BLE001 - one setting's failure keeps the others
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        finally:
            os.environ.pop("DELTACHECK_CHUNKED_FUSED_CONFIG", None)
            chunked_fused.FUSED, chunked_fused.FAILED = None, None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        emit(row)
    if a.best and timed:
        best = min(timed, key=timed.get)
        Path(a.best).write_text(best + "\n")
        emit({"best": best, "fwd_ms": timed[best]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
