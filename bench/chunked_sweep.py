"""Every candidate setting of the fp64 chunked reference, side by side in one GPU run (issue 28).

    python bench/chunked_sweep.py [--variants a,b,..] [--reps 5] [--json OUT] [--profile] [--fla] [--compile]
                                  [--budget-s 80] [--settle 3] [--N .. --T .. --H .. --K .. --V ..]

A variant is a set of keyword arguments of ``chunked_gdn2`` plus overrides of the module constants that choose
its forms (``chunked_intra.GROUP_TOKENS``, ``SMALL_INVERSE``, ``chunked_intra_backward.SMALL_GRADS``,
``chunked_segments.HANDOFF_SLICES``, the segment byte budgets), applied only while that variant runs. Per
variant: fp64 forward and forward+backward medians (CUDA events, after warm-ups, and after ``--settle`` seconds
of forward+backward before the first variant: bench/common.py ``settle``), the peak memory above what was
allocated before, and, first, its worst relative RMS against the fp64 token oracle (output, state and every input
gradient) on small cases on the same device, one of them with log-decays of -1000 and -inf, which must be <= 1e-12
and finite. ``--profile``: for the first variant, torch.profiler's kernel count, summed kernel time against wall
time (how much is launch overhead) and top kernels. ``--fla``: FLA's bf16 ``chunk_gdn2`` rows (bench/chunked.py's
loader and winners). ``--compile``: a ``compile_intra=True`` row, only while the time budget allows. Steps run
cheapest-first and each prints as soon as it is measured, so a run cut short keeps what it had.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
try:
    from deltacheck.reference import chunked, chunked_intra, chunked_intra_backward, chunked_replay, chunked_segments
    from deltacheck.reference.oracle import token_oracle
except ImportError:  # a bare checkout: the repository root as the package `deltacheck`
    _spec = importlib.util.spec_from_file_location(
        "deltacheck", _HERE.parent / "__init__.py", submodule_search_locations=[str(_HERE.parent)])
    sys.modules["deltacheck"] = _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    from deltacheck.reference import chunked, chunked_intra, chunked_intra_backward, chunked_replay, chunked_segments
    from deltacheck.reference.oracle import token_oracle


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", _HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


common = _load("common")
MIB = 2**20
EXACT = 1e-12

# name -> (chunked_gdn2 keywords, {(module, constant): value})
_I, _C, _R = chunked_intra, chunked, chunked_replay
_S, _IB, _F = chunked_segments, chunked_intra_backward, chunked_segments.chunked_fused
VARIANTS = {
    "main": ({}, {}),
    "eager": ({"graph_forward": False, "graph_backward": False}, {}),
    "c32": ({"chunk_size": 32}, {}),
    "c128": ({"chunk_size": 128}, {}),
    "group32": ({}, {(_I, "GROUP_TOKENS"): 32}),
    "group64": ({}, {(_I, "GROUP_TOKENS"): 64}),
    "inv2": ({}, {(_I, "SMALL_INVERSE"): 2}),
    "inv8": ({}, {(_I, "SMALL_INVERSE"): 8}),
    "inv16": ({}, {(_I, "SMALL_INVERSE"): 16}),
    "grads1": ({}, {(_IB, "SMALL_GRADS"): 1}),
    "grads4": ({}, {(_IB, "SMALL_GRADS"): 4}),
    "slices1": ({}, {(_S, "HANDOFF_SLICES"): 1}),
    "slices2": ({}, {(_S, "HANDOFF_SLICES"): 2}),
    "slices8": ({}, {(_S, "HANDOFF_SLICES"): 8}),
    "bwd16": ({}, {(_C, "BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
    "bwd48": ({}, {(_C, "BACKWARD_SEGMENT_BYTES"): 48 * MIB}),
    "gb": ({"graph_backward": True}, {}),
    "gb-bwd16": ({"graph_backward": True}, {(_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
    "gb-bwd8": ({"graph_backward": True}, {(_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 8 * MIB}),
    "gb-c128": ({"graph_backward": True, "chunk_size": 128}, {}),
    # the forward replayed too, in GRAPH_FORWARD_SEGMENT_BYTES segments (a multiple of the backward's)
    "gf": ({"graph_forward": True}, {}),
    "gf64": ({"graph_forward": True}, {(_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 64 * MIB}),
    "gfgb": ({"graph_forward": True, "graph_backward": True}, {}),
    "gfgb16": ({"graph_forward": True, "graph_backward": True},
               {(_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 16 * MIB, (_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
    "gfgb8": ({"graph_forward": True, "graph_backward": True},
              {(_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 8 * MIB, (_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 8 * MIB}),
    "gfgb-s1": ({"graph_forward": True, "graph_backward": True}, {(_S, "HANDOFF_SLICES"): 1}),
    "gfgb16-s1": ({"graph_forward": True, "graph_backward": True},
                  {(_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 16 * MIB, (_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 16 * MIB,
                   (_S, "HANDOFF_SLICES"): 1}),
    # the last graph kept for the next call of the same shapes (chunked_replay.KEEP_LAST)
    "gb-keep": ({"graph_backward": True}, {(_R, "KEEP_LAST"): True}),
    "gb-bwd16-keep": ({"graph_backward": True}, {(_R, "KEEP_LAST"): True,
                                                 (_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
    "gfgb-keep": ({"graph_forward": True, "graph_backward": True}, {(_R, "KEEP_LAST"): True}),
    "gf-keep": ({"graph_forward": True}, {(_R, "KEEP_LAST"): True}),
    "gf16-keep": ({"graph_forward": True}, {(_R, "KEEP_LAST"): True, (_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 16 * MIB,
                                            (_C, "BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
    "gb-s1": ({"graph_backward": True}, {(_S, "HANDOFF_SLICES"): 1}),
    "gb-bwd24": ({"graph_backward": True}, {(_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 24 * MIB}),
    "gb-bwd24-keep": ({"graph_backward": True}, {(_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 24 * MIB,
                                                 (_R, "KEEP_LAST"): True}),
    "gb-s1-keep": ({"graph_backward": True}, {(_S, "HANDOFF_SLICES"): 1, (_R, "KEEP_LAST"): True}),
    # issue 28's byte cuts, one at a time (h28): the recompute's kept inputs as views, gradients written in place
    "no-views": ({}, {(_I, "KEEP_VIEWS"): False}),
    "no-direct": ({}, {(_S, "DIRECT_GRADS"): False}),
    "copies": ({}, {(_I, "KEEP_VIEWS"): False, (_S, "DIRECT_GRADS"): False}),
    # the chunks' state hand-off as one Triton kernel (chunked_fused.HANDOFF), and its strip widths / warps
    "handoff": ({}, {(_F, "HANDOFF"): True}),
    "handoff-vt16": ({}, {(_F, "HANDOFF"): True, (_F, "HANDOFF_VT"): 16}),
    "handoff-vt64": ({}, {(_F, "HANDOFF"): True, (_F, "HANDOFF_VT"): 64}),
    "handoff-w4": ({}, {(_F, "HANDOFF"): True, (_F, "HANDOFF_WARPS"): 4}),
    "handoff-s1": ({}, {(_F, "HANDOFF"): True, (_S, "HANDOFF_SLICES"): 1}),
    "no-handoff": ({}, {(_F, "HANDOFF"): False}),
    "gfgb16-c128": ({"graph_forward": True, "graph_backward": True, "chunk_size": 128},
                    {(_C, "GRAPH_FORWARD_SEGMENT_BYTES"): 16 * MIB, (_C, "GRAPH_BACKWARD_SEGMENT_BYTES"): 16 * MIB}),
}


def _origin():
    """``chunked_gdn2`` of an unmodified copy of the reference, where one was put at bench/_origin_ref/ (a package
    holding that revision's chunked.py and chunked_intra.py): the before of a side-by-side run. Else None."""
    if not (_HERE / "_origin_ref" / "chunked.py").is_file():
        return None
    sys.path.insert(0, str(_HERE))
    try:
        from _origin_ref.chunked import chunked_gdn2
    except Exception as e:  # noqa: BLE001 - no before row
        print(f"origin: {type(e).__name__}: {e}")
        return None
    finally:
        sys.path.remove(str(_HERE))
    return chunked_gdn2


ORIGIN = _origin()
if ORIGIN is not None:
    VARIANTS = {"origin": ({"_fn": ORIGIN}, {}), **VARIANTS}


def _core(kw):
    """``(chunked_gdn2 to call, its keywords)`` of a variant."""
    kw = dict(kw)
    return kw.pop("_fn", chunked.chunked_gdn2), kw


@contextlib.contextmanager
def applied(overrides):
    old = {key: getattr(*key) for key in overrides}
    try:
        for (mod, name), value in overrides.items():
            setattr(mod, name, value)
        yield
    finally:
        for (mod, name), value in old.items():
            setattr(mod, name, value)


# --- exactness against the oracle ------------------------------------------------------------------


def exact_cases(device):
    """Small fp64 cases ``(name, inputs, keywords)``: per-channel steep gates; -1000 and -inf decays on whole
    tokens and single channels; scalar gates (GDN's widths). 200 tokens in 64-token backward segments: several
    chunks, several segments (so a graph-replayed backward replays), a ragged last chunk."""
    out = []
    for name, kg, kb, vw, extreme in (("steep", 32, 32, 32, False), ("-1000/-inf", 32, 32, 32, True),
                                      ("scalar gates", 1, 1, 1, True)):
        gen = torch.Generator().manual_seed(len(out) + 7)
        N, L, H, K, V = 2, 200, 2, 32, 32
        r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
        u = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
        g = -(u(N, L, H, kg) * 4.9 + 0.1)
        if extreme:
            g[:, u(L) < 0.1] = -1000.0
            g[u(N, L, H, kg) < 0.1] = -1000.0
            g[u(N, L, H, kg) < 0.05] = -math.inf
        ins = [torch.nn.functional.normalize(r(N, L, H, K), dim=-1), torch.nn.functional.normalize(r(N, L, H, K), dim=-1),
               r(N, L, H, V), g, u(N, L, H, kb), u(N, L, H, vw), r(N, H, K, V) * 0.1]
        out.append((name, [t.to(device) for t in ins]))
    return out


def _run_with_grads(fn, ins, **kw):
    leaves = [t.clone().requires_grad_() for t in ins]
    o, s = fn(*leaves, 0.3, **kw)
    gen = torch.Generator().manual_seed(3)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
    ws = torch.randn(s.shape, generator=gen, dtype=torch.float64).to(s.device)
    grads = torch.autograd.grad((o * wo).sum() + (s * ws).sum(), leaves)
    return [o.detach(), s.detach(), *grads]


def worst_error(got, ref):
    worst = 0.0
    for a, b in zip(got, ref):
        if not torch.isfinite(a).all():
            return math.inf
        den = b.pow(2).mean().sqrt()
        err = float((a - b).pow(2).mean().sqrt() / den) if den > 0 else float((a - b).abs().max())
        worst = max(worst, err)
    return worst


# --- timing ------------------------------------------------------------------------------------------


def time_variant(kw, inputs, cot, device, warmup, reps, scale):
    """``{fwd_ms, fwd_peak_gib, fwdbwd_ms, fwdbwd_peak_gib}`` of one variant."""
    row = {}
    core, kw = _core(kw)

    def fwd():
        with torch.no_grad():
            return core(*inputs, scale, **kw)

    row["fwd_ms"] = common.timeit(fwd, device, warmup, reps) * 1e3
    row["fwd_peak_gib"] = (common.peak_extra(fwd, device) or 0) / 2**30
    step, prepare = common.fwdbwd_closure(inputs, lambda ls: core(*ls, scale, **kw), lambda o, s: cot)
    row["fwdbwd_ms"] = common.timeit(step, device, warmup, reps) * 1e3
    row["fwdbwd_peak_gib"] = (common.peak_extra(step, device, prepare) or 0) / 2**30
    del step, prepare
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def launch_variant(kw, inputs, device, reps, scale):
    """Where a forward's wall time goes besides the GPU's work: ``{cpu_launch_ms, graph_ms}``. cpu_launch_ms is the
    CPU's time to issue one forward while the GPU is still busy with a long sleep kernel queued first (so no launch
    waits for the GPU: Python, the dispatcher and the launches alone); graph_ms is the same forward replayed from a
    CUDA graph (the GPU's work without launch gaps). The eager median minus graph_ms is the time the GPU waited on
    the CPU; where cpu_launch_ms is below graph_ms that wait is the start (the call's work before its first kernel)
    and the short kernels the CPU could not stay ahead of."""
    core, kw = _core(kw)

    def fwd():
        with torch.no_grad():
            return core(*inputs, scale, **kw)

    fwd()
    torch.cuda.synchronize(device)
    launches = []
    for _ in range(reps):
        torch.cuda._sleep(int(50e6))  # ~25 ms of GPU clocks queued ahead of the forward
        t0 = time.perf_counter()
        out = fwd()
        launches.append((time.perf_counter() - t0) * 1e3)
        del out
        torch.cuda.synchronize(device)
    row = {"cpu_launch_ms": sorted(launches)[len(launches) // 2]}
    try:
        replay = common.cuda_graph(fwd)
        row["graph_ms"] = common.timeit(replay, device, 1, reps) * 1e3
        del replay
    except Exception as e:  # noqa: BLE001 - a diagnostic
        row["graph_error"] = f"{type(e).__name__}: {e}"
    torch.cuda.empty_cache()
    return row


def profile_variant(kw, inputs, cot, scale, device):
    """Kernel count, summed kernel time and wall time of one forward and one forward+backward, and the top
    kernels: the share of wall time the GPU was busy says how much is launch overhead."""
    from torch.profiler import ProfilerActivity, profile

    core, kw = _core(kw)
    step, _ = common.fwdbwd_closure(inputs, lambda ls: core(*ls, scale, **kw), lambda o, s: cot)

    def fwd():
        with torch.no_grad():
            core(*inputs, scale, **kw)

    out = {}
    for name, fn in (("fwd", fwd), ("fwd+bwd", step)):
        fn()
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            wall = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e3  # us -> ms
        by_name = {}
        for e in kernels:
            n, t = by_name.get(e.name, (0, 0.0))
            by_name[e.name] = (n + 1, t + e.device_time / 1e3)
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:16]
        out[name] = {"kernels": len(kernels), "gpu_busy_ms": busy, "wall_ms": wall * 1e3,
                     "top": [(n[:90], c, round(t, 3)) for n, (c, t) in top]}
        print(f"profile {name}: {len(kernels)} kernels, GPU busy {busy:.2f} ms of {wall * 1e3:.2f} ms wall "
              f"(profiled)", flush=True)
        for n, c, t in out[name]["top"]:
            print(f"   {t:8.3f} ms  x{c:<5d} {n}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--profile-variant", default=None, help="the variant to profile (default: the first)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--launch", action="store_true",
                   help="per variant, the forward's CPU launch time (GPU kept busy) and its CUDA graph replay time")
    p.add_argument("--fla", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--exact-only", action="store_true", help="only the exactness checks")
    p.add_argument("--cuda-forms", action="store_true",
                   help="the forms chosen for CUDA (chunked_intra.cuda_shapes) on any device: checks them on a CPU")
    p.add_argument("--budget-s", type=float, default=1e9, help="skip the optional steps once this much has passed")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds of fwd+bwd run before the first timed variant (bench/common.py settle)")
    for n, d in zip("NTHKV", (4, 4096, 16, 128, 128)):
        p.add_argument(f"--{n}", type=int, default=d)
    a = p.parse_args(argv)
    started = time.monotonic()
    if a.cuda_forms:
        chunked_intra.cuda_shapes = lambda x: True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = [n for n in a.variants.split(",") if n]
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "size": dict(N=a.N, T=a.T, H=a.H, K=a.K, V=a.V), "exact": {}, "rows": {}}

    def save():
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))

    # exactness first: a fast variant that is not exact is no candidate
    for cname, ins in exact_cases(device):
        ref = _run_with_grads(token_oracle, ins)
        for name in names:
            kw, over = VARIANTS[name]
            try:
                fn, fkw = _core(kw)
                with applied(over):
                    err = worst_error(_run_with_grads(fn, ins, segment_tokens=64, **fkw), ref)
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            res["exact"].setdefault(name, {})[cname] = err
    for name in names:
        errs = res["exact"][name]
        ok = all(isinstance(e, float) and e <= EXACT for e in errs.values())
        print(f"exact {name:<10} {'OK ' if ok else 'BAD'} " + "  ".join(
            f"{c}: {e:.1e}" if isinstance(e, float) else f"{c}: {e[:60]}" for c, e in errs.items()), flush=True)
    print(f"[{time.monotonic() - started:.0f} s]", flush=True)
    save()
    if a.exact_only:
        return 0

    x = common.make_inputs(a.N, a.T, a.H, a.K, a.V, device)
    inputs = [x[n] for n in ("q", "k", "v", "g", "b", "w", "h0")]
    gen = torch.Generator().manual_seed(1)
    cot = (torch.randn(a.N, a.T, a.H, a.V, generator=gen, dtype=torch.float64).to(device),
           torch.randn(a.N, a.H, a.K, a.V, generator=gen, dtype=torch.float64).to(device))
    scale = a.K**-0.5
    if a.settle > 0:  # common.settle: the first forward+backward timed in a process is slower than later ones
        step, _ = common.fwdbwd_closure(inputs, lambda ls: chunked.chunked_gdn2(*ls, scale), lambda o, s: cot)
        calls, last = common.settle(step, device, a.settle)
        res["settle"] = {"seconds": a.settle, "calls": calls, "last_ms": last}
        print(f"settled: {calls} fwd+bwd calls in {a.settle:.0f} s (last {last:.1f} ms)", flush=True)
        del step
    print(f"{'variant':<10} {'fwd ms':>8} {'peak':>6} {'fwd+bwd ms':>11} {'peak':>6}", flush=True)
    for name in names:
        kw, over = VARIANTS[name]
        try:
            with applied(over):
                row = time_variant(kw, inputs, cot, device, a.warmup, a.reps, scale)
        except Exception as e:  # noqa: BLE001
            row = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(limit=2)
            torch.cuda.empty_cache()
        if a.launch and device.type == "cuda" and "error" not in row:
            try:
                with applied(over):
                    row.update(launch_variant(kw, inputs, device, a.reps, scale))
            except Exception as e:  # noqa: BLE001 - a diagnostic
                row["launch_error"] = f"{type(e).__name__}: {e}"
        res["rows"][name] = row
        if "error" in row:
            print(f"{name:<10} ERROR {row['error'][:100]}", flush=True)
        else:
            extra = (f"  launch {row['cpu_launch_ms']:.2f} ms, graph {row.get('graph_ms', float('nan')):.2f} ms"
                     if "cpu_launch_ms" in row else "")
            print(f"{name:<10} {row['fwd_ms']:8.2f} {row['fwd_peak_gib']:6.2f} {row['fwdbwd_ms']:11.2f} "
                  f"{row['fwdbwd_peak_gib']:6.2f}{extra}  [{time.monotonic() - started:.0f} s]", flush=True)
        save()

    if a.profile and device.type == "cuda":
        kw, over = VARIANTS[a.profile_variant or names[0]]
        with applied(over):
            res["profile"] = profile_variant(kw, inputs, cot, scale, device)
        save()
    if device.type == "cuda" and time.monotonic() - started < a.budget_s:
        core, kw = _core(VARIANTS[names[0]][0])
        with applied(VARIANTS[names[0]][1]), torch.no_grad():
            try:
                replay = common.cuda_graph(lambda: core(*inputs, scale, **kw))
                res["rows"]["fwd CUDA graph"] = {"fwd_ms": common.timeit(replay, device, 1, a.reps) * 1e3}
                print(f"{names[0]} fwd replayed from a CUDA graph: {res['rows']['fwd CUDA graph']['fwd_ms']:.2f} ms",
                      flush=True)
                del replay
            except Exception as e:  # noqa: BLE001 - a diagnostic
                print(f"CUDA graph forward: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
        save()
    if a.fla and time.monotonic() - started < a.budget_s:
        fla_rows(res, x, device, scale, cot, a)
        save()
    if a.compile and time.monotonic() - started < a.budget_s:
        t0 = time.monotonic()
        try:
            with torch.no_grad():
                fn = lambda: chunked.chunked_gdn2(*inputs, scale, compile_intra=True)  # noqa: E731
                fn()
                compile_s = time.monotonic() - t0
                ms = common.timeit(fn, device, 1, a.reps) * 1e3
            res["rows"]["compiled fwd"] = {"fwd_ms": ms, "compile_s": compile_s}
            print(f"compile_intra fwd: {ms:.2f} ms (first call {compile_s:.0f} s)", flush=True)
            with torch.no_grad():  # against the eager forward on the same inputs
                (co, cs), (eo, es) = fn(), chunked.chunked_gdn2(*inputs, scale)
            res["rows"]["compiled fwd"].update(rel_out=common.rel_rms(co, eo), rel_state=common.rel_rms(cs, es))
            print(f"compile_intra fwd vs eager: out {common.rel_rms(co, eo):.1e}, state {common.rel_rms(cs, es):.1e}",
                  flush=True)
            del co, cs, eo, es
            save()
            if time.monotonic() - started < a.budget_s:  # the backward's recompute compiles too (its own shapes)
                t0 = time.monotonic()
                step, _ = common.fwdbwd_closure(
                    inputs, lambda ls: chunked.chunked_gdn2(*ls, scale, compile_intra=True), lambda o, s: cot)
                step()
                compile_s = time.monotonic() - t0
                ms = common.timeit(step, device, 1, a.reps) * 1e3
                res["rows"]["compiled fwd+bwd"] = {"fwdbwd_ms": ms, "compile_s": compile_s}
                print(f"compile_intra fwd+bwd: {ms:.2f} ms (first call {compile_s:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"compile_intra: {type(e).__name__}: {e}")
        save()
    print(f"done in {time.monotonic() - started:.0f} s")


def fla_rows(res, x, device, scale, cot, a):
    bench = _load("chunked")
    fn, why = bench.load_fla()
    if fn is None:
        print("fla:", why)
        res["fla"] = why
        return
    res["fla_winners"] = bench.apply_fla_winners()
    bf = [x[n].to(torch.bfloat16) for n in ("q", "k", "v", "g", "b", "w")] + [x["h0"].float()]

    def call(ls):
        q, k, v, g, b, w, h0 = ls
        return fn(q, k, v, g, b, w, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=None)

    t0 = time.monotonic()
    with torch.no_grad():
        f = common.timeit(lambda: call(bf), device, 2, a.reps) * 1e3
    step, _ = common.fwdbwd_closure(bf, call, lambda o, s: (cot[0].to(o.dtype), cot[1].to(s.dtype)))
    fb = common.timeit(step, device, 2, a.reps) * 1e3
    res["rows"]["fla bf16"] = {"fwd_ms": f, "fwdbwd_ms": fb}
    print(f"fla bf16   {f:8.2f}        {fb:11.2f}   (with compiles {time.monotonic() - t0:.0f} s)", flush=True)
    for name, row in res["rows"].items():
        if "fwdbwd_ms" in row and name != "fla bf16":
            print(f"  {name:<10} fwd {row['fwd_ms'] / f:5.2f}x  fwd+bwd {row['fwdbwd_ms'] / fb:5.2f}x of FLA")


if __name__ == "__main__":
    sys.exit(main())
