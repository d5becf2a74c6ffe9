"""Helpers of bench/chunked.py: timing (CUDA events or perf_counter, medians after warm-ups), peak memory,
inputs, forward+backward closures and the printed table of times, peak memory and ratios."""

from __future__ import annotations

import statistics
import time

import torch

GiB = 2**30
TARGETS = {"fwd_ratio": 5.0, "fwdbwd_ratio": 7.0, "peak_gib": 3.0}  # issue 28


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


def settle(fn, device, seconds):
    """Run ``fn()`` for about ``seconds`` before anything is timed: ``(calls, last call's ms)``. On an H200 the first
    forward+backward row timed in a process came out 14-20 ms slower than the same row timed later (59.1 and
    65.6 ms against 45.7, after two warm-ups each; the forward, timed first, was not): whatever warms up (clocks,
    the allocator, the launch path), it outlasts a row's warm-ups, so the rows are timed after it."""
    calls, last, t0 = 0, None, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < seconds:
        t1 = time.perf_counter()
        fn()
        sync(device)
        last, calls = (time.perf_counter() - t1) * 1e3, calls + 1
    return calls, last


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


# --- the machine's limits ---------------------------------------------------------------------------------

# fp64 FLOP per clock per SM on the tensor cores (DMMA), by compute capability, from NVIDIA's whitepapers:
# A100 (sm_80) 19.5 TFLOP/s = 108 SMs x 1.41 GHz x 128; H100/H200 (sm_90) 66.9 TFLOP/s = 132 SMs x 1.98 GHz x 256.
FP64_PER_SM_CLOCK = {(8, 0): 128, (9, 0): 256}
# Datasheet peaks, for what the device does not report: name fragment -> (fp64 FLOP/s, bytes/s, source).
DATASHEETS = {
    "H200": (66.9e12, 4.8e12, "NVIDIA H200 datasheet (SXM): FP64 Tensor Core 67 TFLOPS, 4.8 TB/s"),
    "H100": (66.9e12, 3.35e12, "NVIDIA H100 datasheet (SXM): FP64 Tensor Core 67 TFLOPS, 3.35 TB/s"),
    "A100": (19.5e12, 2.04e12, "NVIDIA A100 datasheet (80GB SXM): FP64 Tensor Core 19.5 TFLOPS, 2.04 TB/s"),
}


def _smi_max_sm_clock_hz(index):
    """The SM clock's maximum from nvidia-smi, or None."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return float(out) * 1e6 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def device_peaks(device):
    """``{"fp64_flop_s", "bytes_s", "fp64_source", "bytes_source"}`` of a CUDA device (None on the CPU): read from
    the device where torch reports it (SM count and clock, memory clock and bus width) times the per-SM fp64
    rate of its architecture, else the datasheet value of the table above."""
    if device.type != "cuda":
        return None
    p = torch.cuda.get_device_properties(device)
    sheet = next((v for k, v in DATASHEETS.items() if k in p.name), None)
    out = {}
    clock = getattr(p, "clock_rate", 0) * 1e3 or _smi_max_sm_clock_hz(device.index or 0)  # kHz -> Hz
    per = FP64_PER_SM_CLOCK.get((p.major, p.minor))
    if clock and per:
        out["fp64_flop_s"] = p.multi_processor_count * clock * per
        out["fp64_source"] = (f"{p.multi_processor_count} SMs x {clock / 1e9:.3f} GHz x {per} FLOP/clock/SM "
                              f"(sm_{p.major}{p.minor} fp64 tensor cores)")
    elif sheet:
        out["fp64_flop_s"], out["fp64_source"] = sheet[0], sheet[2]
    mem, bus = getattr(p, "memory_clock_rate", 0) * 1e3, getattr(p, "memory_bus_width", 0)
    if mem and bus:
        out["bytes_s"] = mem * 2 * bus / 8
        out["bytes_source"] = f"{mem / 1e9:.3f} GHz x 2 (DDR) x {bus} bit / 8 (device properties)"
    elif sheet:
        out["bytes_s"], out["bytes_source"] = sheet[1], sheet[2]
    return out or None


def attainable(device):
    """What this device reaches on the two limits, measured: an 8192^3 fp64 matmul (FLOP/s) and a 2 GiB copy
    (bytes read + written per second). CUDA only."""
    n = 8192
    a = torch.randn(n, n, dtype=torch.float64, device=device)
    mm = timeit(lambda: a @ a, device, 1, 3)
    a = None
    x = torch.empty(2**28, dtype=torch.float64, device=device)
    cp = timeit(lambda: x.clone(), device, 1, 3)
    x = None
    torch.cuda.empty_cache()
    return {"fp64_flop_s": 2 * n**3 / mm, "bytes_s": 2 * 2**28 * 8 / cp}


def print_limits(peaks, att):
    """The peaks with their sources, and what was reached on them."""
    if peaks:
        for key, source, unit, scale, label in (("fp64_flop_s", "fp64_source", "TFLOP/s", 1e12, "fp64 peak"),
                                                ("bytes_s", "bytes_source", "GB/s", 1e9, "memory peak")):
            if key in peaks:
                print(f"{label}: {peaks[key] / scale:.1f} {unit} = {peaks[source]}")
    if att and "error" not in att:
        line = f"attainable here (measured): fp64 8192^3 matmul {att['fp64_flop_s'] / 1e12:.1f} TFLOP/s"
        line += f", 2 GiB copy {att['bytes_s'] / 1e9:.0f} GB/s"
        if peaks and "fp64_flop_s" in peaks and "bytes_s" in peaks:
            line += (f" ({att['fp64_flop_s'] / peaks['fp64_flop_s']:.0%} and {att['bytes_s'] / peaks['bytes_s']:.0%}"
                     " of the peaks)")
        print(line)


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
    for v in ("chunked", "chunked (unfused)", "chunked (compiled)", "chunked (graph backward)", "previous"):
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
    for mode in ("fwd", "fwd+bwd"):  # the fused kernel's gain (reference/chunked_fused.py)
        if t(f"chunked (unfused) fp64 {mode}") and t(f"chunked fp64 {mode}"):
            ratios[f"unfused {mode} / chunked fp64 {mode} (speedup)"] = (
                t(f"chunked (unfused) fp64 {mode}") / t(f"chunked fp64 {mode}"), None)
    results["ratios"] = {k: v[0] for k, v in ratios.items()}

    print()
    print(f"{'what':<38} {'median ms':>11} {'peak extra GiB':>15} {'fp64 GFLOP/s (of peak)':>23} "
          f"{'GB/s (of peak)':>17}")
    print("-" * 108)
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<38} ERROR {row['error']}")
            continue
        pk = row.get("peak_extra_bytes")
        flag = ""
        if pk is not None and name.startswith("chunked fp64") and pk / GiB > TARGETS["peak_gib"]:
            flag = f"  (over the {TARGETS['peak_gib']} GiB target)"
        if pk is not None and "grad_bytes" in row:
            flag += f"  (incl. {row['grad_bytes'] / GiB:.2f} GiB of input gradients)"
        pk = f"{pk / GiB:15.3f}" if pk is not None else f"{'-':>15}"
        rate = f"{'-':>23} {'-':>17}"
        if "flop_s" in row:
            frac = lambda f: f" ({f:6.1%})" if f is not None else " " * 9  # noqa: E731
            rate = (f"{row['flop_s'] / 1e9:14.1f}{frac(row.get('flop_frac'))} "
                    f"{row['byte_s'] / 1e9:8.1f}{frac(row.get('byte_frac'))}")
        print(f"{name:<38} {row['median_s'] * 1e3:11.3f} {pk} {rate}{flag}")
    if any("flop_s" in r for r in rows.values()):
        print("(flops and bytes of each fp64 row counted on the meta device for the same variant and mode "
              "(bench/opcount.py): matmul flops as run, and every op's operand and result bytes, the traffic of "
              "unfused kernels, over the row's median time)")
    print_limits(results.get("peaks"), results.get("attainable"))
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
