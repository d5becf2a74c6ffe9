"""Benchmark of the chunked reference (issues 3, 17 and 28), side by side with FLA's fused ``chunk_gdn2``.

    python bench/chunked.py [--device cuda|cpu] [--json OUT] [--quick] [--count [--cuda-forms]] [--compile]
                            [--no-unfused] [--no-exact | --exact-only]
                            [--graph-backward] [--eager] [--no-previous] [--no-graph] [--no-rates] [--no-attainable]
                            [--threads N] [--N .. --T .. --H .. --K .. --V ..] [--profile] [--settle S]

On CUDA (default when available) it first checks every chunked variant's fp64 forward+backward against the token
oracle on the device (small cases with -1000 and -inf decays and one with every log-decay -1000: <= 1e-12 and finite;
with how many times the fused kernel ran; ``--no-exact`` skips it, ``--exact-only`` runs only it). Then it times, at
N=4 T=4096 H=16 K=V=128 unless told otherwise: chunked fp64 forward (the default: with the fused fp64 kernel of
reference/chunked_fused.py where it applies), chunked fp32 forward, chunked fp64 forward+backward, the same with the
fused kernel off ("chunked (unfused)"; ``--no-unfused`` skips it), the same for the previous implementation
(bench/chunked_previous.py, the reference before issue 28; ``--no-previous`` skips it), and, when ``fla``
imports, FLA's bf16 ``chunk_gdn2`` forward and forward+backward (with the harness's recorded autotune winners
for this GPU applied first, so FLA compiles one config per kernel; with ``DELTACHECK_RECORD_WINNERS`` naming a
directory, this run's winners are written there after FLA's rows, bench/fla_warm.py). It prints medians (CUDA events, after
warm-ups), the peak memory above what was allocated before (forward+backward: including the inputs'
gradients, which it frees first), and the ratios to FLA against issue 28's targets (fwd <= 5x, fwd+bwd <= 7x,
peak <= 3 GiB). Each fp64 row also gets its achieved FLOP/s and bytes/s (the flops and bytes of the same
variant and mode counted on the meta device, over the median) and their fractions of the GPU's peaks, read
from the device (SM count and clock, memory clock and bus width, times the architecture's fp64 rate per SM)
or else taken from a datasheet table (bench/common.py), with what this GPU reaches on an fp64 matmul and a
copy, measured (``--no-rates``, ``--no-attainable`` skip them). ``--compile`` adds rows with
``compile_intra=True`` (torch.compile; falls back to eager with a warning where it cannot compile),
``--graph-backward`` a forward+backward row with the backward's segments replayed from a CUDA graph, ``--eager``
rows with no segment replayed (``graph_forward=graph_backward=False``). Last, as a
diagnostic, each forward replayed from a CUDA graph (the same kernels without the CPU's launch overhead;
``--no-graph`` skips it). Before the first timed row it runs the chunked fp64 forward+backward for ``--settle``
seconds (3 on CUDA): the first such row timed in a process was measured slower than later ones (bench/common.py
``settle``). On the CPU it runs a CPU-sized case and reports the speedup over the token oracle.
``--quick`` is a seconds-long CPU smoke run. ``--count`` runs nothing: it counts kernels, bytes moved and the
peak of live tensors on the ``meta`` device at the size (default the GPU size), for the current and the
previous implementation (bench/opcount.py; ``--cuda-forms``: the forms the reference takes on CUDA). Nothing
missing (FLA, CUDA, a compiler) and no failing variant stops the others: what could not run is printed with
the reason.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
try:  # installed (editable) package
    from deltacheck.reference import chunked_fused, chunked_intra
    from deltacheck.reference.chunked import chunked_gdn2
    from deltacheck.reference.oracle import token_oracle
except ImportError:  # a bare checkout: load the repository root as the package `deltacheck`
    _spec = importlib.util.spec_from_file_location(
        "deltacheck", _HERE.parent / "__init__.py", submodule_search_locations=[str(_HERE.parent)]
    )
    sys.modules["deltacheck"] = _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    from deltacheck.reference import chunked_fused, chunked_intra
    from deltacheck.reference.chunked import chunked_gdn2
    from deltacheck.reference.oracle import token_oracle


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", _HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


common = _load("common")
GiB, TARGETS = common.GiB, common.TARGETS
timeit, peak_extra, rel_rms, sync = common.timeit, common.peak_extra, common.rel_rms, common.sync
make_inputs, fwdbwd_closure, table = common.make_inputs, common.fwdbwd_closure, common.table
NAMES = ("q", "k", "v", "g", "b", "w", "h0")
GPU_SIZE = dict(N=4, T=4096, H=16, K=128, V=128)


# --- the variants --------------------------------------------------------------------------------


def unfused(fn):
    """``fn`` with the fused kernel switched off while it runs (reference/chunked_fused.py ``FUSED``). A backward that
    runs after the call returns (its recompute takes the kernel too) needs the whole step wrapped."""
    def call(*x, **kw):
        old = chunked_fused.FUSED
        chunked_fused.FUSED = False
        try:
            return fn(*x, **kw)
        finally:
            chunked_fused.FUSED = old
    return call


def variants(a, previous):
    """name -> ``core(q, k, v, g, b, w, h0, scale) -> (o, S)`` with this run's settings. "chunked" is the default
    (the fused kernel on where it applies: fp64 on CUDA with Triton); "chunked (unfused)" the same with it off."""
    ckpt = False if a.no_checkpoint else None
    st = a.segment_tokens
    out = {"chunked": lambda *x: chunked_gdn2(*x, chunk_size=a.chunk, segment_tokens=st, use_checkpoint=ckpt)}
    if not a.no_unfused:
        out["chunked (unfused)"] = unfused(out["chunked"])
    if a.compile:
        out["chunked (compiled)"] = lambda *x: chunked_gdn2(
            *x, chunk_size=a.chunk, segment_tokens=st, use_checkpoint=ckpt, compile_intra=True)
    if a.graph_backward:
        out["chunked (graph backward)"] = lambda *x: chunked_gdn2(
            *x, chunk_size=a.chunk, segment_tokens=st, use_checkpoint=ckpt, graph_backward=True)
    if a.eager:
        out["chunked (eager)"] = lambda *x: chunked_gdn2(
            *x, chunk_size=a.chunk, segment_tokens=st, use_checkpoint=ckpt, graph_forward=False, graph_backward=False)
    if previous is not None:
        out["previous"] = lambda *x: previous.chunked_gdn2(*x, chunk_size=a.chunk, segment_tokens=st,
                                                           use_checkpoint=ckpt)
    return out


def load_fla():
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        from fla.ops.gdn2 import chunk_gdn2
    except Exception as e:  # noqa: BLE001 - any import failure means "not available", with its reason
        return None, f"fla not importable ({type(e).__name__}: {e})"
    return chunk_gdn2, None


def load_previous(a):
    if a.no_previous:
        return None, "skipped (--no-previous)"
    try:
        return _load("chunked_previous"), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


# --- --count: kernels, bytes and peak on the meta device --------------------------------------------


def _meta_count(opcount, fn, size, mode, cuda_forms):
    """Kernels, bytes, flops and peak of one fp64 ``mode`` ("fwd" / "fwd+bwd") of ``fn`` at ``size``, counted on
    the meta device; ``cuda_forms``: with the forms the reference takes on CUDA (chunked_intra.cuda_shapes)."""
    N, T, H, K, V = (size[n] for n in "NTHKV")
    meta = [torch.empty(*s, dtype=torch.float64, device="meta")
            for s in ((N, T, H, K), (N, T, H, K), (N, T, H, V), (N, T, H, K), (N, T, H, K), (N, T, H, V), (N, H, K, V))]
    cot = (torch.empty(N, T, H, V, dtype=torch.float64, device="meta"),
           torch.empty(N, H, K, V, dtype=torch.float64, device="meta"))
    real = chunked_intra.cuda_shapes
    if cuda_forms:
        chunked_intra.cuda_shapes = lambda x: True
    try:
        if mode == "fwd":
            return opcount.count_forward(fn, meta, K**-0.5)
        return opcount.count_forward_backward(fn, meta, cot, K**-0.5)
    finally:
        chunked_intra.cuda_shapes = real


def count(a, size, variant_fns):
    opcount = _load("opcount")
    results = {}
    print(f"{'counted on meta (fp64)':<34} {'kernels':>8} {'GB moved':>9} {'GFLOP':>7} {'peak GiB':>9}")
    print("-" * 71)
    for name, fn in variant_fns.items():
        if "compiled" in name:
            continue
        for mode in ("fwd", "fwd+bwd"):
            row = f"{name} fp64 {mode}"
            try:
                r = _meta_count(opcount, fn, size, mode, a.cuda_forms)
            except Exception as e:  # noqa: BLE001 - one variant's failure keeps the others
                results[row] = {"error": f"{type(e).__name__}: {e}"}
                print(f"{row:<34} ERROR {results[row]['error']}")
                continue
            results[row] = r
            note = f"  (of which input gradients {r['grad_bytes'] / GiB:.2f})" if "grad_bytes" in r else ""
            print(f"{row:<34} {r['kernels']:8d} {r['bytes'] / 1e9:9.1f} {r['flops'] / 1e9:7.1f} "
                  f"{r['peak_bytes'] / GiB:9.2f}{note}")
    return results


# --- rates: achieved fp64 FLOP/s and bytes/s against the device's peaks ------------------------------------


def limits(a, results, device):
    """The device's peaks (bench/common.py: read from the device, else a datasheet) and, on CUDA, what it reaches
    on an fp64 matmul and a copy, measured; printed at once, so that a run cut short still has them."""
    peaks = results["peaks"] = common.device_peaks(device)
    if device.type == "cuda" and not a.no_attainable:
        try:
            results["attainable"] = common.attainable(device)
        except Exception as e:  # noqa: BLE001 - a diagnostic
            results["attainable"] = {"error": f"{type(e).__name__}: {e}"}
    common.print_limits(peaks, results.get("attainable"))


def rate_row(results, name, size, cores, device, counted):
    """Row ``name``'s achieved fp64 FLOP/s and bytes/s: the flops and bytes of the same variant and mode counted
    on the meta device (with the forms the reference takes on this device; ``counted`` caches them) over its
    median, and their fractions of the peaks. A one-line summary, or None for a row that has none."""
    row = results["rows"].get(name, {})
    parts = name.split(" fp64 ")
    if "median_s" not in row or len(parts) != 2 or parts[0] not in cores or "compiled" in parts[0]:
        return None
    vname, mode = parts[0], parts[1].replace(" (CUDA graph)", "")
    note = ""
    if vname == "chunked" and device.type == "cuda" and chunked_fused.triton is not None and chunked_fused.enabled():
        # the meta device runs the unfused path: these are its flops and bytes over the fused row's time
        row["rates_note"] = "flops and bytes counted for the unfused path (the fused kernel's are not counted)"
        note, vname = f" [{row['rates_note']}]", "chunked (unfused)"
        cores = {**cores, vname: cores["chunked"]}
    if (vname, mode) not in counted:
        try:
            counted[vname, mode] = _meta_count(_load("opcount"), cores[vname], size, mode,
                                               device.type == "cuda" and vname.startswith("chunked"))
        except Exception as e:  # noqa: BLE001 - a row without rates
            counted[vname, mode] = {"error": f"{type(e).__name__}: {e}"}
    c = counted[vname, mode]
    if "error" in c:
        row["rates_error"] = c["error"]
        return f"rates: {c['error'][:100]}"
    peaks = results.get("peaks") or {}
    row["flops"], row["bytes"] = c["flops"], c["bytes"]
    row["flop_s"], row["byte_s"] = c["flops"] / row["median_s"], c["bytes"] / row["median_s"]
    row["flop_frac"] = row["flop_s"] / peaks["fp64_flop_s"] if "fp64_flop_s" in peaks else None
    row["byte_frac"] = row["byte_s"] / peaks["bytes_s"] if "bytes_s" in peaks else None
    line = f"{row['flop_s'] / 1e9:.1f} fp64 GFLOP/s"
    line += f" ({row['flop_frac']:.1%} of peak)" if row["flop_frac"] is not None else ""
    line += f", {row['byte_s'] / 1e9:.1f} GB/s counted"
    line += f" ({row['byte_frac']:.1%} of peak)" if row["byte_frac"] is not None else ""
    return line + note


# --- on-device exactness of each variant against the token oracle ---------------------------------------


def exact(cores, device):
    """Each chunked variant's forward+backward (output, state, every input gradient) against the fp64 token oracle
    on the device, on bench/chunked_sweep.py's small cases (steep gates; -1000 and -inf decays on whole tokens and
    single channels; scalar gates) and one with every log-decay -1000; worst rel RMS per variant (<= 1e-12, finite),
    and how many times the fused kernel ran (so a silent fallback to the unfused path shows)."""
    sweep = _load("chunked_sweep")
    cases = sweep.exact_cases(device)
    ins = [t.clone() for t in cases[0][1]]
    ins[3] = torch.full_like(ins[3], -1000.0)
    cases.append(("all -1000", ins))
    calls = [0]
    real = chunked_fused.start

    def counted(*x, **kw):
        got = real(*x, **kw)
        calls[0] += 1  # runs that returned (a failing kernel falls back to the PyTorch path, uncounted)
        return got

    out = {}
    chunked_fused.start = counted
    try:
        for cname, ins in cases:
            ref = sweep._run_with_grads(token_oracle, ins)
            for vname, core in cores.items():
                if not vname.startswith("chunked"):
                    continue
                before = calls[0]
                try:
                    run = unfused(sweep._run_with_grads) if vname == "chunked (unfused)" else sweep._run_with_grads
                    err = sweep.worst_error(run(core, ins), ref)
                except Exception as e:  # noqa: BLE001 - reported, and counted as a failure
                    err = f"{type(e).__name__}: {e}"
                ok = isinstance(err, float) and err <= 1e-12
                out[f"{vname} | {cname}"] = {"worst_rel_rms": err, "ok": ok, "fused_calls": calls[0] - before}
                shown = f"{err:.2e}" if isinstance(err, float) else err[:100]
                print(f"  exact {vname:<20} {cname:<14} worst rel RMS {shown}  {'ok' if ok else 'FAIL'} (<= 1e-12, "
                      f"finite)  fused kernel calls {calls[0] - before}", flush=True)
        # the kernel compiled once more at the benchmark's widths (K, V and the chunk are compile-time constants),
        # so that a later process finds it in Triton's cache
        x = list(make_inputs(4, 128, 16, 128, 128, device).values())  # N, H, L: as the run specializes them
        with torch.no_grad():
            cores["chunked"](*x, 0.1)
    finally:
        chunked_fused.start = real
    print(chunked_fused.describe(), flush=True)
    return out


# --- the run -------------------------------------------------------------------------------------


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--json", default=None, help="write the results as JSON to this path")
    p.add_argument("--quick", action="store_true", help="seconds-long CPU smoke run (tiny sizes, 1 rep)")
    p.add_argument("--count", action="store_true",
                   help="run nothing: count kernels, bytes moved and peak memory on the meta device (default: GPU size)")
    for n in "NTHKV":
        p.add_argument(f"--{n}", type=int)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--segment-tokens", type=int, default=None, help="chunked_gdn2 segment length (default: auto)")
    p.add_argument("--no-checkpoint", action="store_true",
                   help="use_checkpoint=False: autograd through the forward, every intermediate kept")
    p.add_argument("--compile", action="store_true", help="also time chunked_gdn2(compile_intra=True) (torch.compile)")
    p.add_argument("--graph-backward", action="store_true",
                   help="also time chunked_gdn2(graph_backward=True) (backward segments replayed from a CUDA graph)")
    p.add_argument("--eager", action="store_true",
                   help="also time chunked_gdn2 with no segment replayed from a CUDA graph (graph_forward/backward=False)")
    p.add_argument("--no-previous", action="store_true", help="skip the previous implementation")
    p.add_argument("--no-unfused", action="store_true",
                   help="skip the rows with the fused kernel switched off (reference/chunked_fused.py)")
    p.add_argument("--exact-only", action="store_true",
                   help="run only the exactness check (any device), exit 1 if a variant is not exact")
    p.add_argument("--no-exact", action="store_true",
                   help="CUDA: skip the on-device exactness check (fused and unfused against the token oracle)")
    p.add_argument("--no-graph", action="store_true",
                   help="skip the CUDA-graph rows (forward replayed without launch overhead, a diagnostic)")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of one fp64 fwd and fwd+bwd")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds of chunked fp64 fwd+bwd before the first timed row (default 3 on CUDA, 0 on the CPU)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-fla", action="store_true", help="skip FLA even if importable")
    p.add_argument("--no-oracle", action="store_true", help="skip the token oracle (CPU)")
    p.add_argument("--no-rates", action="store_true",
                   help="skip the achieved FLOP/s and bytes/s (counted on the meta device) and the peaks")
    p.add_argument("--no-attainable", action="store_true",
                   help="skip measuring the attainable fp64 matmul rate and copy bandwidth (CUDA)")
    p.add_argument("--cuda-forms", action="store_true",
                   help="--count: count the forms the reference takes on CUDA (default: the CPU's)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (CPU timings on a shared machine are steadier with 1)")
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    want = a.device or ("cuda" if torch.cuda.is_available() and not (a.quick or a.count) else "cpu")
    notes = []
    if want == "cuda" and not torch.cuda.is_available():
        notes.append("CUDA requested but not available: running on the CPU")
        want = "cpu"
    device = torch.device(want)
    if a.quick:
        size, (warmup, reps) = dict(N=1, T=40, H=2, K=8, V=8), (1, 1)
    elif device.type == "cuda" or a.count:
        size, (warmup, reps) = dict(GPU_SIZE), (2, 5)
    else:
        size, (warmup, reps) = dict(N=1, T=512, H=2, K=32, V=32), (1, 3)
    for n in size:
        if getattr(a, n) is not None:
            size[n] = getattr(a, n)
    warmup = a.warmup if a.warmup is not None else warmup
    reps = a.reps if a.reps is not None else reps
    N, T, H, K, V = (size[n] for n in "NTHKV")
    if a.quick:
        a.chunk = min(a.chunk, 16)
    scale = K**-0.5
    previous, why_previous = load_previous(a)
    cores = variants(a, previous)

    env = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
    }
    results = {"size": size, "chunk": a.chunk, "device": str(device), "env": env, "targets": TARGETS, "rows": {},
               "accuracy": {}, "previous": {"available": previous is not None, "reason": why_previous}}
    if a.count:
        print(f"deltacheck chunked benchmark: counts at N={N} T={T} H={H} K={K} V={V} chunk={a.chunk} "
              f"segment_tokens={a.segment_tokens or 'auto'}, torch {env['torch']}\n")
        results["counts"] = count(a, size, cores)
        if previous is None:
            print(f"previous: not counted: {why_previous}")
        return finish(a, results, errors=[n for n, r in results["counts"].items()
                                          if "error" in r and not n.startswith("previous")])

    print(f"deltacheck chunked benchmark on {device} ({env['device']}), torch {env['torch']}")
    print(f"size N={N} T={T} H={H} K={K} V={V} chunk={a.chunk} segment_tokens={a.segment_tokens or 'auto'} "
          f"checkpoint={'off' if a.no_checkpoint else 'auto'} compile={'on' if a.compile else 'off'} "
          f"warmup={warmup} reps={reps}")
    for n in notes:
        print("note:", n)
    print(chunked_fused.describe())
    results["fused"] = chunked_fused.describe()
    if (device.type == "cuda" and not a.no_exact) or a.exact_only:
        results["exact"] = exact(cores, device)
        if a.exact_only:
            return finish(a, results, [n for n, r in results["exact"].items() if not r["ok"]])

    x = make_inputs(N, T, H, K, V, device)
    gen = torch.Generator().manual_seed(1)
    do64 = torch.randn(N, T, H, V, generator=gen, dtype=torch.float64).to(device)
    ds64 = torch.randn(N, H, K, V, generator=gen, dtype=torch.float64).to(device)
    inputs64 = [x[n] for n in NAMES]
    rows = results["rows"]
    settle_s = a.settle if a.settle is not None else (3.0 if device.type == "cuda" else 0.0)
    if settle_s > 0:  # common.settle: the first forward+backward timed in a process is slower than later ones
        step, _ = fwdbwd_closure(inputs64, lambda ls: cores["chunked"](*ls, scale), lambda o, s: (do64, ds64))
        calls, last = common.settle(step, device, settle_s)
        results["settle"] = {"seconds": settle_s, "calls": calls, "last_ms": last}
        print(f"settled: {calls} chunked fp64 fwd+bwd calls in {settle_s:.1f} s before timing (last {last:.1f} ms)")
        del step
    counted = {}
    if not a.no_rates:
        limits(a, results, device)

    def record(name, fn, *, prepare=None, mem=True):
        started = time.monotonic()
        try:
            row = {"median_s": timeit(fn, device, warmup, reps)}
            if mem and device.type == "cuda":
                row["peak_extra_bytes"] = peak_extra(fn, device, prepare)
            rows[name] = row
        except Exception as e:  # noqa: BLE001 - report and keep going
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(limit=3)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        # each row as soon as it is measured: a run cut by a time limit keeps what it had (the table comes last)
        peak = rows[name].get("peak_extra_bytes")
        print(f"  {name:<34} " + (f"{rows[name]['median_s'] * 1e3:10.2f} ms" if "median_s" in rows[name]
                                   else rows[name]["error"][:100])
              + (f"  peak +{peak / 2**30:.2f} GiB" if peak else "")
              + f"  ({time.monotonic() - started:.0f} s with warm-ups)", flush=True)
        rate = None if a.no_rates else rate_row(results, name, size, cores, device, counted)
        if rate:
            print(f"  {'':<34} {rate}", flush=True)

    def graph_row(name, fn):
        """``fn`` replayed from a CUDA graph: the forward's time without launch overhead (a diagnostic)."""
        try:
            replay = common.cuda_graph(fn)
        except Exception as e:  # noqa: BLE001 - report and keep going
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc(limit=3)
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            return
        record(name, replay, mem=False)
        del replay
        torch.cuda.empty_cache()

    outputs = {}
    for vname, core in cores.items():
        with torch.no_grad():
            if "graph backward" not in vname:  # its forward is the chunked one
                record(f"{vname} fp64 fwd", lambda core=core: core(*inputs64, scale))
            if vname == "chunked":
                in32 = [t.float() for t in inputs64]
                record("chunked fp32 fwd", lambda core=core, in32=in32: core(*in32, scale))
                del in32
        step, prepare = fwdbwd_closure(inputs64, lambda ls, core=core: core(*ls, scale), lambda o, s: (do64, ds64))
        if vname == "chunked (unfused)":  # the backward (its recompute) runs after the call: off for the whole step
            step = unfused(step)
        record(f"{vname} fp64 fwd+bwd", step, prepare=prepare)
        if device.type == "cuda" and f"{vname} fp64 fwd+bwd" in rows:
            rows[f"{vname} fp64 fwd+bwd"]["grad_bytes"] = sum(t.numel() * t.element_size() for t in inputs64)
        del step, prepare
        try:
            with torch.no_grad():
                outputs[vname] = core(*inputs64, scale)
        except Exception as e:  # noqa: BLE001
            results["accuracy"][f"{vname} output"] = f"{type(e).__name__}: {e}"
    if "chunked" in outputs:
        o64, s64 = outputs["chunked"]
        for other in (n for n in outputs if n != "chunked"):
            results["accuracy"][f"{other} vs chunked fp64 (out)"] = rel_rms(outputs[other][0], o64)
            results["accuracy"][f"{other} vs chunked fp64 (state)"] = rel_rms(outputs[other][1], s64)
        try:
            with torch.no_grad():
                o32, s32 = cores["chunked"](*[t.float() for t in inputs64], scale)
            results["accuracy"]["chunked fp32 vs fp64 (out)"] = rel_rms(o32, o64)
            results["accuracy"]["chunked fp32 vs fp64 (state)"] = rel_rms(s32, s64)
        except Exception as e:  # noqa: BLE001
            results["accuracy"]["chunked fp32"] = f"{type(e).__name__}: {e}"

    if a.profile:
        profile(cores["chunked"], inputs64, scale, device, do64, ds64)

    # the token oracle (CPU-sized runs only)
    if device.type == "cpu" and not a.no_oracle:
        with torch.no_grad():
            record("oracle fp64 fwd", lambda: token_oracle(*inputs64, scale), mem=False)
            ro, rs = token_oracle(*inputs64, scale)
        if "chunked" in outputs:
            results["accuracy"]["chunked fp64 vs oracle (out)"] = rel_rms(outputs["chunked"][0], ro)
            results["accuracy"]["chunked fp64 vs oracle (state)"] = rel_rms(outputs["chunked"][1], rs)
        ostep, _ = fwdbwd_closure(inputs64, lambda ls: token_oracle(*ls, scale), lambda o, s: (do64, ds64))
        record("oracle fp64 fwd+bwd", ostep, mem=False)

    fla(a, results, x, device, scale, record, do64, ds64, outputs.get("chunked"))
    # last: a capture that goes wrong must not take the other rows' numbers with it
    if device.type == "cuda" and not a.no_graph:
        for vname, core in cores.items():
            if "compiled" not in vname and "graph backward" not in vname:
                with torch.no_grad():
                    graph_row(f"{vname} fp64 fwd (CUDA graph)", lambda core=core: core(*inputs64, scale))
    table(results, device)
    errors = [n for n, r in rows.items()
              if "error" in r and n.startswith("chunked") and "compiled" not in n and "graph" not in n]
    return finish(a, results, errors)


def fla(a, results, x, device, scale, record, do64, ds64, ref):
    fla_fn, why = (None, "skipped (--no-fla)") if a.no_fla else load_fla()
    if fla_fn is not None and device.type != "cuda":
        fla_fn, why = None, "FLA needs CUDA (Triton); not run on the CPU"
    results["fla"] = {"available": fla_fn is not None, "reason": why}
    if fla_fn is None:
        return
    bf = [x[n].to(torch.bfloat16) for n in NAMES[:6]] + [x["h0"].float()]

    def call(ls):
        q, k, v, g, b, w, h0 = ls
        return fla_fn(q, k, v, g, b, w, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=None)

    results["fla"]["winners"] = apply_fla_winners()
    print(f"  fla autotune winners applied: {results['fla']['winners']}", flush=True)
    with torch.no_grad():
        record("fla bf16 fwd", lambda: call(bf))
    step, prepare = fwdbwd_closure(bf, call, lambda o, s: (do64.to(o.dtype), ds64.to(s.dtype)))
    record("fla bf16 fwd+bwd", step, prepare=prepare)
    results["fla"]["recorded"] = record_fla_winners()
    if ref is not None:
        try:
            with torch.no_grad():
                fo, fs = call(bf)
            results["accuracy"]["fla bf16 vs chunked fp64 (out)"] = rel_rms(fo, ref[0])
            results["accuracy"]["fla bf16 vs chunked fp64 (state)"] = rel_rms(fs, ref[1])
        except Exception as e:  # noqa: BLE001
            results["accuracy"]["fla"] = f"{type(e).__name__}: {e}"


def apply_fla_winners():
    """FLA's recorded autotune winners for this GPU x Triton x FLA (the harness's, harness/backends/fla/winners/),
    so its first calls compile one config per kernel instead of autotuning all: how many were applied, or why
    none. Only compile time: a winner is one of FLA's own configs."""
    try:
        import fla
        import triton

        from deltacheck.harness.backends.fla import winners

        files = [f for f in winners.default_files(torch.cuda.get_device_name(), triton.__version__, fla.__version__)
                 if f.is_file()]
        return winners.apply(winners.merge_files(files)) if files else "no recorded winners for this GPU"
    except Exception as e:  # noqa: BLE001 - FLA just autotunes
        return f"not applied ({type(e).__name__}: {e})"


def record_fla_winners():
    """With ``DELTACHECK_RECORD_WINNERS`` (a directory), this process's FLA autotune winners written there
    (harness/backends/fla/winners.py), so that the next run at this shape compiles one config per kernel."""
    if not os.environ.get("DELTACHECK_RECORD_WINNERS"):
        return None
    try:
        from deltacheck.harness.backends.fla import winners

        winners.record_to_dir()
        return os.environ["DELTACHECK_RECORD_WINNERS"]
    except Exception as e:  # noqa: BLE001 - compile time only
        return f"not recorded ({type(e).__name__}: {e})"


def profile(core, inputs64, scale, device, do64, ds64):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    step, _ = fwdbwd_closure(inputs64, lambda ls: core(*ls, scale), lambda o, s: (do64, ds64))
    for name, fn in (("fp64 fwd", lambda: core(*inputs64, scale)), ("fp64 fwd+bwd", step)):
        with torch_profile(activities=acts) as prof:
            with torch.set_grad_enabled(name.endswith("bwd")):
                fn()
            sync(device)
        print(f"\n--- profile: chunked {name} ---")
        print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=40))


def finish(a, results, errors):
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=2))
        print(f"\nwrote {a.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
