"""Helpers of bench/chunked.py: timing (CUDA events or perf_counter, medians after warm-ups), peak memory,
inputs, forward+backward closures and the printed table of times, peak memory and ratios."""

from __future__ import annotations

import statistics
import time

import torch

GiB = 2**30
TARGETS = {"fwd_ratio": 10.0, "fwdbwd_ratio": 15.0, "peak_gib": 3.0}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, device, warmup, reps):
    """Median seconds of ``fn()`` (CUDA events on the GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_extra(fn, device, prepare=None):
    """Peak bytes allocated during ``fn()`` above what was allocated before it (CUDA only); ``prepare()``
    runs first (frees what a previous run left, e.g. gradients)."""
    if device.type != "cuda":
        return None
    if prepare is not None:
        prepare()
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def cuda_graph(fn):
    """``fn`` (no autograd) captured once in a CUDA graph, after two warm-up calls on a side stream: the
    replay callable. A diagnostic: the same kernels without the CPU's launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def rel_rms(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return float((a - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def make_inputs(N, T, H, K, V, device, seed=0):
    """fp64 inputs on ``device``: unit-norm q/k, steep per-channel decay U(-5, -0.1), b, w in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    nq = torch.nn.functional.normalize
    x = {
        "q": nq(r(N, T, H, K), dim=-1), "k": nq(r(N, T, H, K), dim=-1), "v": r(N, T, H, V),
        "g": -(u(N, T, H, K) * 4.9 + 0.1), "b": u(N, T, H, K), "w": u(N, T, H, V), "h0": r(N, H, K, V) * 0.1,
    }
    return {n: t.to(device) for n, t in x.items()}


def fwdbwd_closure(inputs, call, cotangents):
    """``(step, prepare)``: ``step()`` runs forward + backward of ``call(leaves)`` with fixed output cotangents;
    ``prepare()`` frees the leaves' gradients."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def prepare():
        for t in leaves:
            t.grad = None

    def step():
        prepare()
        o, s = call(leaves)
        torch.autograd.backward((o, s), cotangents(o, s))

    return step, prepare


def table(results, device):
    rows = results["rows"]

    def t(name):
        return rows.get(name, {}).get("median_s")

    ratios = {}
    for v in ("chunked", "chunked (compiled)", "previous"):
        target = v == "chunked"
        for mode, fla_row, tkey in (("fwd", "fla bf16 fwd", "fwd_ratio"), ("fwd+bwd", "fla bf16 fwd+bwd", "fwdbwd_ratio")):
            if t(fla_row) and t(f"{v} fp64 {mode}"):
                ratios[f"{v} fp64 {mode} / fla {mode}"] = (t(f"{v} fp64 {mode}") / t(fla_row),
                                                           TARGETS[tkey] if target else None)
    if t("fla bf16 fwd") and t("chunked fp32 fwd"):
        ratios["chunked fp32 fwd / fla fwd"] = (t("chunked fp32 fwd") / t("fla bf16 fwd"), None)
    for v in ("chunked", "previous"):
        if t("fla bf16 fwd") and t(f"{v} fp64 fwd (CUDA graph)"):
            ratios[f"{v} fp64 fwd (CUDA graph) / fla fwd"] = (t(f"{v} fp64 fwd (CUDA graph)") / t("fla bf16 fwd"), None)
    for mode in ("fwd", "fwd+bwd"):
        for other in ("previous", "oracle"):
            if t(f"{other} fp64 {mode}") and t(f"chunked fp64 {mode}"):
                ratios[f"{other} {mode} / chunked fp64 {mode} (speedup)"] = (
                    t(f"{other} fp64 {mode}") / t(f"chunked fp64 {mode}"), None)
    results["ratios"] = {k: v[0] for k, v in ratios.items()}

    print()
    print(f"{'what':<32} {'median ms':>11} {'peak extra GiB':>15}")
    print("-" * 60)
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<32} ERROR {row['error']}")
            continue
        pk = row.get("peak_extra_bytes")
        flag = ""
        if pk is not None and name.startswith("chunked fp64") and pk / GiB > TARGETS["peak_gib"]:
            flag = f"  (over the {TARGETS['peak_gib']} GiB target)"
        if pk is not None and "grad_bytes" in row:
            flag += f"  (incl. {row['grad_bytes'] / GiB:.2f} GiB of input gradients)"
        pk = f"{pk / GiB:15.3f}" if pk is not None else f"{'-':>15}"
        print(f"{name:<32} {row['median_s'] * 1e3:11.3f} {pk}{flag}")
    for what in ("fla", "previous"):
        if what in results and not results[what]["available"]:
            print(f"{what}: not run: {results[what]['reason']}")
    if ratios:
        print()
        for name, (val, target) in ratios.items():
            verdict = "" if target is None else ("  ok" if val <= target else "  OVER") + f" (target <= {target:g}x)"
            print(f"{name:<52} {val:8.2f}x{verdict}")
    print()
    for name, val in results["accuracy"].items():
        print(f"{name:<44} {val:.2e}" if isinstance(val, float) else f"{name:<44} {val}")
