"""FLA's first compile at the benchmark's shape, spread over the CPU's cores (issue 28's one-call H200 run).

    python bench/fla_warm.py --slice I/N [--N .. --T .. --H .. --K .. --V ..]
    python bench/fla_warm.py --tune --winners OUT.json [...]
    python bench/fla_warm.py --apply [...]

Why: FLA autotunes its Triton kernels on the first call of each key, and every key holds the head count H
(``key=['H', ...]``); the shipped winners (harness/backends/fla/winners/) were recorded on the L0 tier (H of 1, 2
and 4), so at bench/chunked.py's H=16 none applies and the first ``chunk_gdn2`` forward+backward compiles and
benchmarks every config of every kernel, one compile after another: over 150 s on the H200.

``--slice I/N`` runs one forward+backward of FLA's bf16 ``chunk_gdn2`` at the shape with every FLA autotuner cut
to its configs ``I, I+N, ...``: N such processes side by side compile every config once, on N cores, into the
shared ``TRITON_CACHE_DIR`` (the binaries do not depend on which other configs an autotuner holds). ``--tune`` then
runs the full autotune (all configs, so the choice is FLA's own; every compile is a cache hit, only the timing
runs) and writes the winners (harness/backends/fla/winners.py format) to ``--winners``, which bench/chunked.py
applies through ``DELTACHECK_FLA_WINNERS``: the timed process compiles nothing new. No step changes what a kernel
computes; a slice that fails (a config pruned to nothing, say) only leaves its configs to ``--tune``.

``--apply`` applies the recorded winners first (``DELTACHECK_FLA_WINNERS``, the user's cache, the shipped file; the
H200's holds H=16 since session 4), as bench/chunked.py does, and runs one forward+backward: only the winning config
of each kernel compiles, into ``TRITON_CACHE_DIR``, which a later process then finds there (bench/chunked_h200.sh
runs it beside the on-device exactness check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def cut_configs(i: int, n: int, winners) -> int:
    """Every FLA autotuner keeps its configs ``i::n`` (``[configs[i % len]]`` when that is empty)."""
    cut = 0
    for _, tuner in winners.autotuners():
        configs = list(tuner.configs)
        if len(configs) > 1:
            tuner.configs = configs[i::n] or [configs[i % len(configs)]]
            cut += 1
    return cut


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slice", default=None, help="I/N: compile configs I, I+N, ... of every kernel")
    p.add_argument("--tune", action="store_true", help="autotune with all configs, write the winners")
    p.add_argument("--winners", default=None, help="--tune: where to write the winners (JSON)")
    p.add_argument("--apply", action="store_true", help="apply the recorded winners, compile only those")
    for n, d in dict(N=4, T=4096, H=16, K=128, V=128).items():
        p.add_argument(f"--{n}", type=int, default=d)
    a = p.parse_args(argv)
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    t0 = time.monotonic()
    import fla
    import triton
    from fla.ops.gdn2 import chunk_gdn2

    from deltacheck.harness.backends.fla import winners

    what = f"slice {a.slice}" if a.slice else ("apply" if a.apply else "tune")
    if a.apply:
        files = [f for f in winners.default_files(torch.cuda.get_device_name(), triton.__version__, fla.__version__)
                 if f.is_file()]
        print(f"fla_warm apply: {winners.apply(winners.merge_files(files)) if files else 'no winners'} "
              f"from {[str(f) for f in files]}", flush=True)
    if a.slice:
        i, n = (int(x) for x in a.slice.split("/"))
        print(f"fla_warm {what}: {cut_configs(i, n, winners)} autotuners cut", flush=True)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    N, T, H, K, V = a.N, a.T, a.H, a.K, a.V

    def r(*s, lo=None):
        x = torch.rand(*s, generator=gen, device=dev, dtype=torch.float32)
        return (-(x * 4.9 + 0.1) if lo == "g" else x).to(torch.bfloat16)

    nq = torch.nn.functional.normalize
    q = nq(torch.randn(N, T, H, K, generator=gen, device=dev), dim=-1).to(torch.bfloat16)
    k = nq(torch.randn(N, T, H, K, generator=gen, device=dev), dim=-1).to(torch.bfloat16)
    v = torch.randn(N, T, H, V, generator=gen, device=dev).to(torch.bfloat16)
    g, b, w = r(N, T, H, K, lo="g"), r(N, T, H, K), r(N, T, H, V)
    h0 = torch.randn(N, H, K, V, generator=gen, device=dev) * 0.1
    leaves = [t.requires_grad_() for t in (q, k, v, g, b, w, h0)]
    status = 0
    for mode in ("fwd", "fwd+bwd"):
        try:
            with torch.set_grad_enabled(mode != "fwd"):
                o, s = chunk_gdn2(*leaves[:6], scale=K**-0.5, initial_state=leaves[6], output_final_state=True,
                                  cu_seqlens=None)
                if mode != "fwd":
                    torch.autograd.backward((o, s), (torch.randn_like(o), torch.randn_like(s)))
            torch.cuda.synchronize()
            print(f"fla_warm {what}: {mode} done at {time.monotonic() - t0:.0f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - what this slice could not compile is left to --tune
            print(f"fla_warm {what}: {mode} failed at {time.monotonic() - t0:.0f} s: {type(e).__name__}: "
                  f"{str(e)[:300]}", flush=True)
            status = 1
        if a.tune and a.winners:  # after each mode: a tune cut by its timeout keeps the forward's
            kernels = winners.record()
            data = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "fla": fla.__version__,
                    "source": f"bench/fla_warm.py --tune at N={N} T={T} H={H} K={K} V={V} (bf16 chunk_gdn2 {mode})",
                    "kernels": kernels}
            with open(a.winners + ".part", "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(a.winners + ".part", a.winners)
            print(f"fla_warm tune: {sum(map(len, kernels.values()))} winners of {len(kernels)} kernels -> "
                  f"{a.winners}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
