"""Child process of tests/test_chunked_fused.py: the fused kernel (reference/chunked_fused.py) through Triton's
interpreter on CPU tensors (TRITON_INTERPRET=1 must be set before triton is imported, hence a process of its own),
against the token oracle and against the PyTorch path. Prints one JSON object: the kernel's settings
(``chunked_fused.config()``, DELTACHECK_CHUNKED_FUSED_CONFIG where set) and per case the worst rel RMS over the output,
the state and every input gradient, and how many times the kernel ran."""

from __future__ import annotations

import json
import math
import os
import sys
import zlib

import torch

import test_chunked as T
from deltacheck.reference import chunked_fused
from deltacheck.reference.chunked import chunked_gdn2
from deltacheck.reference.oracle import token_oracle


def counted(fn, box):
    """``fn`` that adds 1 to ``box[0]`` per call."""
    def wrapper(*a, **kw):
        box[0] += 1
        return fn(*a, **kw)
    return wrapper


calls, handoffs = [0], [0]
chunked_fused.start = counted(chunked_fused.start, calls)
chunked_fused.handoff_scan = counted(chunked_fused.handoff_scan, handoffs)


def both(fn):
    """``fn()`` with the fused kernel on and off: (on, off, kernel calls while on); the hand-off kernel's calls
    while on (``chunked_fused.HANDOFF`` / DELTACHECK_CHUNKED_HANDOFF_KERNEL) are added up in ``handoffs``."""
    before = calls[0]
    chunked_fused.FUSED = True
    on = fn()
    ran = calls[0] - before
    chunked_fused.FUSED = False
    off = fn()
    chunked_fused.FUSED = None
    return on, off, ran


def main():
    out = {"interpreting": chunked_fused._interpreting(), "cases": {}, "config": chunked_fused.config(),
           "handoff": chunked_fused.handoff_enabled()}
    # the public API, every op and flag set, at chunk 16 (tiers' decays of -1000 on whole tokens and channels);
    # FUSED_CHILD_CASES=core: only the core's cases below (a quicker run, for the kernel's other settings)
    api = os.environ.get("FUSED_CHILD_CASES", "all") != "core"
    for op in ("gdn", "kda", "gdn2") if api else ():
        for flagset in T.FLAGSETS:
            for profile, L in (("extreme", 37), ("steep", 16)):
                built = T.build(op, flagset, profile, L, seed=zlib.crc32(f"{op}-{flagset}-{profile}".encode()) % 1000)
                ref = T.run(built, "oracle")
                on, off, ran = both(lambda: T.run(built, "chunked", chunk_size=16))
                out["cases"][f"{op}-{flagset}-{profile}-L{L}"] = {
                    "oracle": T.worst(on, ref)[0], "plain": T.worst(on, off)[0], "kernel_calls": ran}
    # the core: chunk 16, 32, 64, gates broadcast over K / V or not, -inf and -1e30 decays, ragged last chunk
    for name, kw, chunk in (("c16-full", dict(L=70, K=12, V=5, kg=12), 16), ("c32-bcast", dict(L=100, kg=1, kb=1, vw=1), 32),
                            ("c64-full", dict(L=130, K=16, V=8, kg=16), 64), ("c64-kg1", dict(L=64, kg=1, kb=1), 64)):
        ins = T.core_inputs(**kw)
        ref = T.core_run(token_oracle, ins)
        on, off, ran = both(lambda: T.core_run(chunked_gdn2, ins, chunk_size=chunk))
        out["cases"][name] = {"oracle": T.worst(on, ref)[0], "plain": T.worst(on, off)[0], "kernel_calls": ran}
    # a log-decay of -1000 on every token and channel: finite, exact
    ins = T.core_inputs(L=48, inf=False)
    ins[3] = torch.full_like(ins[3], -1000.0)
    ref = T.core_run(token_oracle, ins)
    on, off, ran = both(lambda: T.core_run(chunked_gdn2, ins, chunk_size=16))
    out["cases"]["all--1000"] = {"oracle": T.worst(on, ref)[0], "plain": T.worst(on, off)[0], "kernel_calls": ran}
    for c in out["cases"].values():
        for key in ("oracle", "plain"):
            c[key] = c[key] if math.isfinite(c[key]) else "inf"
    out["handoff_calls"] = handoffs[0]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
