"""Benchmark of the chunked reference (issue 3), side by side with FLA's fused ``chunk_gdn2``.

    python bench/chunked.py [--device cuda|cpu] [--json OUT] [--quick]

On CUDA (default when available) it times, at N=4 T=4096 H=16 K=V=128 unless told otherwise:
chunked fp64 forward, chunked fp32 forward, chunked fp64 forward+backward, their peak memory above the
inputs (torch.cuda.max_memory_allocated), and, when ``fla`` imports, FLA's bf16 ``chunk_gdn2`` forward and
forward+backward; it prints medians (CUDA events, after warm-ups) and the ratios ours / FLA against the
targets (fwd <= 10x, fwd+bwd <= 15x, peak <= 3 GiB). On the CPU it runs a CPU-sized case and reports the
speedup over the token oracle. ``--quick`` is a seconds-long CPU smoke run. Nothing missing (FLA, CUDA)
makes it crash: what could not run is printed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

try:  # installed (editable) package
    from deltacheck.reference.chunked import chunked_gdn2
    from deltacheck.reference.oracle import token_oracle
except ImportError:  # a bare checkout: load the repository root as the package `deltacheck`
    import importlib.util

    _root = Path(__file__).resolve().parents[1]
    _spec = importlib.util.spec_from_file_location(
        "deltacheck", _root / "__init__.py", submodule_search_locations=[str(_root)]
    )
    sys.modules["deltacheck"] = _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    from deltacheck.reference.chunked import chunked_gdn2
    from deltacheck.reference.oracle import token_oracle

GiB = 2**30
TARGETS = {"fwd_ratio": 10.0, "fwdbwd_ratio": 15.0, "peak_gib": 3.0}


# --- timing --------------------------------------------------------------------------------------


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


def peak_extra(fn, device):
    """Peak bytes allocated during ``fn()`` above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def rel_rms(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return float((a - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


# --- inputs --------------------------------------------------------------------------------------


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


def ours(x, dtype, chunk, segment_tokens, scale, compile_intra=False):
    args = [x[n].to(dtype) for n in ("q", "k", "v", "g", "b", "w", "h0")]
    return chunked_gdn2(*args, scale, chunk_size=chunk, segment_tokens=segment_tokens, compile_intra=compile_intra)


def fwdbwd_closure(fn_inputs, call, grads_like):
    """A closure running forward + backward of ``call(leaves)`` with fixed output cotangents."""
    leaves = [t.detach().clone().requires_grad_() for t in fn_inputs]

    def step():
        for t in leaves:
            t.grad = None
        o, s = call(leaves)
        do, ds = grads_like(o, s)
        torch.autograd.backward((o, s), (do, ds))

    return step


def load_fla():
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        from fla.ops.gdn2 import chunk_gdn2
    except Exception as e:  # noqa: BLE001 - any import failure means "not available", with its reason
        return None, f"fla not importable ({type(e).__name__}: {e})"
    return chunk_gdn2, None


# --- the run -------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--quick", action="store_true", help="seconds-long CPU smoke run (tiny sizes, 1 rep)")
    p.add_argument("--N", type=int)
    p.add_argument("--T", type=int)
    p.add_argument("--H", type=int)
    p.add_argument("--K", type=int)
    p.add_argument("--V", type=int)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--segment-tokens", type=int, default=None, help="chunked_gdn2 segment length (default: auto)")
    p.add_argument("--no-checkpoint", action="store_true", help="keep every segment's tensors for the backward")
    p.add_argument("--compile", action="store_true", help="chunked_gdn2(compile_intra=True): torch.compile the intra-chunk part")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of one fp64 fwd and fwd+bwd")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-fla", action="store_true", help="skip FLA even if importable")
    p.add_argument("--no-oracle", action="store_true", help="skip the token oracle (CPU)")
    a = p.parse_args(argv)

    want = a.device or ("cuda" if torch.cuda.is_available() and not a.quick else "cpu")
    notes = []
    if want == "cuda" and not torch.cuda.is_available():
        notes.append("CUDA requested but not available: running on the CPU")
        want = "cpu"
    device = torch.device(want)
    if a.quick:
        size = dict(N=1, T=40, H=2, K=8, V=8)
        warmup, reps = 1, 1
    elif device.type == "cuda":
        size = dict(N=4, T=4096, H=16, K=128, V=128)
        warmup, reps = 2, 5
    else:
        size = dict(N=1, T=512, H=2, K=32, V=32)
        warmup, reps = 1, 3
    for n in size:
        if getattr(a, n) is not None:
            size[n] = getattr(a, n)
    warmup = a.warmup if a.warmup is not None else warmup
    reps = a.reps if a.reps is not None else reps
    N, T, H, K, V = (size[n] for n in "NTHKV")
    chunk = min(a.chunk, 16) if a.quick else a.chunk
    scale = K**-0.5

    env = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
    }
    print(f"deltacheck chunked benchmark on {device} ({env['device']}), torch {env['torch']}")
    print(f"size N={N} T={T} H={H} K={K} V={V} chunk={chunk} segment_tokens={a.segment_tokens or 'auto'} "
          f"checkpoint={'off' if a.no_checkpoint else 'auto'} compile={'on' if a.compile else 'off'} "
          f"warmup={warmup} reps={reps}")
    for n in notes:
        print("note:", n)

    x = make_inputs(N, T, H, K, V, device)
    gen = torch.Generator().manual_seed(1)
    do64 = torch.randn(N, T, H, V, generator=gen, dtype=torch.float64).to(device)
    ds64 = torch.randn(N, H, K, V, generator=gen, dtype=torch.float64).to(device)
    results = {"size": size, "chunk": chunk, "device": str(device), "env": env, "targets": TARGETS, "rows": {}}
    rows = results["rows"]

    def record(name, fn, *, mem=True, time_it=True):
        try:
            row = {}
            if time_it:
                row["median_s"] = timeit(fn, device, warmup, reps)
            if mem and device.type == "cuda":
                row["peak_extra_bytes"] = peak_extra(fn, device)
            rows[name] = row
        except Exception as e:  # noqa: BLE001 - report and keep going
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(limit=3)

    st = a.segment_tokens
    ckpt = False if a.no_checkpoint else None
    cc = a.compile
    with torch.no_grad():
        record("chunked fp64 fwd", lambda: ours(x, torch.float64, chunk, st, scale, cc))
        record("chunked fp32 fwd", lambda: ours(x, torch.float32, chunk, st, scale, cc))
    inputs64 = [x[n] for n in ("q", "k", "v", "g", "b", "w", "h0")]
    step = fwdbwd_closure(
        inputs64, lambda ls: chunked_gdn2(*ls, scale, chunk_size=chunk, segment_tokens=st, use_checkpoint=ckpt, compile_intra=cc), lambda o, s: (do64, ds64)
    )
    record("chunked fp64 fwd+bwd", step)

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        for name, fn in (("fp64 fwd", lambda: ours(x, torch.float64, chunk, st, scale, cc)), ("fp64 fwd+bwd", step)):
            with profile(activities=acts) as prof:
                if name.endswith("fwd"):
                    with torch.no_grad():
                        fn()
                else:
                    fn()
                sync(device)
            print(f"\n--- profile: chunked {name} ---")
            print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=40))

    # accuracy on these inputs (fp64 chunked is the reference here)
    with torch.no_grad():
        o64, s64 = ours(x, torch.float64, chunk, st, scale, cc)
        o32, s32 = ours(x, torch.float32, chunk, st, scale, cc)
    results["accuracy"] = {"chunked fp32 vs fp64 (out)": rel_rms(o32, o64), "chunked fp32 vs fp64 (state)": rel_rms(s32, s64)}

    # the token oracle (CPU-sized runs only)
    if device.type == "cpu" and not a.no_oracle:
        with torch.no_grad():
            record("oracle fp64 fwd", lambda: token_oracle(*inputs64[:6], inputs64[6], scale), mem=False)
            ro, rs = token_oracle(*inputs64[:6], inputs64[6], scale)
        results["accuracy"]["chunked fp64 vs oracle (out)"] = rel_rms(o64, ro)
        results["accuracy"]["chunked fp64 vs oracle (state)"] = rel_rms(s64, rs)
        ostep = fwdbwd_closure(inputs64, lambda ls: token_oracle(*ls, scale), lambda o, s: (do64, ds64))
        record("oracle fp64 fwd+bwd", ostep, mem=False)

    # FLA
    fla_fn, why = (None, "skipped (--no-fla)") if a.no_fla else load_fla()
    if fla_fn is not None and device.type != "cuda":
        fla_fn, why = None, "FLA needs CUDA (Triton); not run on the CPU"
    results["fla"] = {"available": fla_fn is not None, "reason": why}
    if fla_fn is not None:
        bf = {n: x[n].to(torch.bfloat16) for n in ("q", "k", "v", "g", "b", "w")}
        h0f = x["h0"].float()

        def fla_call(ls):
            q, k, v, g, b, w, h0 = ls
            return fla_fn(q, k, v, g, b, w, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=None)

        fla_in = [bf[n] for n in ("q", "k", "v", "g", "b", "w")] + [h0f]
        with torch.no_grad():
            record("fla bf16 fwd", lambda: fla_call(fla_in))
        fstep = fwdbwd_closure(fla_in, fla_call, lambda o, s: (do64.to(o.dtype), ds64.to(s.dtype)))
        record("fla bf16 fwd+bwd", fstep)
        try:
            with torch.no_grad():
                fo, fs = fla_call(fla_in)
            results["accuracy"]["fla bf16 vs chunked fp64 (out)"] = rel_rms(fo, o64)
            results["accuracy"]["fla bf16 vs chunked fp64 (state)"] = rel_rms(fs, s64)
        except Exception as e:  # noqa: BLE001
            results["accuracy"]["fla"] = f"{type(e).__name__}: {e}"

    # --- table -------------------------------------------------------------------------------------
    def t(name):
        return rows.get(name, {}).get("median_s")

    ratios = {}
    if t("fla bf16 fwd"):
        if t("chunked fp64 fwd"):
            ratios["chunked fp64 fwd / fla fwd"] = (t("chunked fp64 fwd") / t("fla bf16 fwd"), TARGETS["fwd_ratio"])
        if t("chunked fp32 fwd"):
            ratios["chunked fp32 fwd / fla fwd"] = (t("chunked fp32 fwd") / t("fla bf16 fwd"), None)
    if t("fla bf16 fwd+bwd") and t("chunked fp64 fwd+bwd"):
        ratios["chunked fp64 fwd+bwd / fla fwd+bwd"] = (
            t("chunked fp64 fwd+bwd") / t("fla bf16 fwd+bwd"), TARGETS["fwdbwd_ratio"])
    if t("oracle fp64 fwd") and t("chunked fp64 fwd"):
        ratios["oracle fwd / chunked fp64 fwd (speedup)"] = (t("oracle fp64 fwd") / t("chunked fp64 fwd"), None)
    if t("oracle fp64 fwd+bwd") and t("chunked fp64 fwd+bwd"):
        ratios["oracle fwd+bwd / chunked fp64 fwd+bwd (speedup)"] = (
            t("oracle fp64 fwd+bwd") / t("chunked fp64 fwd+bwd"), None)
    results["ratios"] = {k: v[0] for k, v in ratios.items()}

    print()
    print(f"{'what':<28} {'median ms':>11} {'peak extra GiB':>15}")
    print("-" * 56)
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<28} ERROR {row['error']}")
            continue
        ms = f"{row['median_s'] * 1e3:11.3f}" if "median_s" in row else f"{'-':>11}"
        pk = row.get("peak_extra_bytes")
        pk = f"{pk / GiB:15.3f}" if pk is not None else f"{'-':>15}"
        flag = ""
        if pk.strip() != "-" and name.startswith("chunked fp64") and row["peak_extra_bytes"] / GiB > TARGETS["peak_gib"]:
            flag = f"  (over the {TARGETS['peak_gib']} GiB target)"
        print(f"{name:<28} {ms} {pk}{flag}")
    if not results["fla"]["available"]:
        print(f"fla: not run: {results['fla']['reason']}")
    if ratios:
        print()
        for name, (val, target) in ratios.items():
            verdict = "" if target is None else ("  ok" if val <= target else "  OVER") + f" (target <= {target:g}x)"
            print(f"{name:<48} {val:8.2f}x{verdict}")
    print()
    for name, val in results["accuracy"].items():
        print(f"{name:<40} {val:.2e}" if isinstance(val, float) else f"{name:<40} {val}")

    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=2))
        print(f"\nwrote {a.json}")
    errors = [n for n, r in rows.items() if "error" in r and not n.startswith("fla")]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
