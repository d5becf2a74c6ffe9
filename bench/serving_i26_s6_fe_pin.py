"""Issue 26, session 6: does cuDNN FE keep a graph whose pin it refused, and run the next call of that
configuration unpinned? (docs/libraries.md, "The pin is strict only on a graph's first call".) On an H200 with the
FE wheel and NVRTC's include tree (no cuTile toolchain needed: the refusal comes before any compile):

    python bench/serving_i26_s6_fe_pin.py

Calls ``kimi_delta_attention`` twice with ``plan_name="kda_hopper_cuda"`` on one configuration kda_hopper_cuda's
``check_support`` refuses (``safe_gate`` with ``a_log`` and no ``dt_bias``: "safe_gate needs both a_log and
dt_bias", hopper/cuda_engine.py), and prints what each call did and which engine the cached graph has. Expected if
the cache keeps the refused graph: call 1 raises cudnnGraphNotSupportedError "no kda_hopper_cuda plan"; call 2
does not raise that (it runs, or fails inside another engine, e.g. kda_cutile's compile), and the graph's
selected engine is not kda_hopper_cuda."""

from __future__ import annotations

import torch


def main() -> int:
    import cudnn
    from cudnn.linear_attention import kimi_delta_attention
    from cudnn.linear_attention.ops import kda as ops_kda

    torch.manual_seed(0)
    T, H, D = 64, 2, 128
    dev = "cuda"
    q, k, v = (torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) * 0.1 for _ in range(3))
    g = -torch.rand(T, H, D, device=dev, dtype=torch.float32)
    beta = torch.rand(T, H, device=dev, dtype=torch.float32)
    cu = torch.tensor([0, T], device=dev, dtype=torch.int32)
    a_log = torch.zeros(H, device=dev, dtype=torch.float32)
    for call in (1, 2):
        before = set(ops_kda.fprop_cache)
        try:
            kimi_delta_attention(q, k, v, g, beta, cu, safe_gate=True, a_log=a_log, plan_name="kda_hopper_cuda",
                                 output_final_state=True)
            what = "ran"
        except cudnn.cudnnGraphNotSupportedError as exc:
            what = f"cudnnGraphNotSupportedError: {exc}"
        except Exception as exc:  # noqa: BLE001 - another engine's failure is the answer we look for
            what = f"{type(exc).__name__}: {str(exc)[:200]}"
        keys = [key for key in ops_kda.fprop_cache if key[-3] == "kda_hopper_cuda"]
        engines = []
        for key in keys:
            graph = ops_kda.fprop_cache[key][0]
            try:
                engine = graph.selected_engine
                engines.append("cudnn backend" if engine is None else engine.name)
            except Exception as exc:  # noqa: BLE001
                engines.append(f"unknown ({type(exc).__name__})")
        new = len(set(ops_kda.fprop_cache) - before)
        print(f"FE-PIN call {call}: {what} | pinned graphs cached: {len(keys)} (new {new}), their engines: {engines}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
