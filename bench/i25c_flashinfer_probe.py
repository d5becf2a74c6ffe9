"""One FlashInfer SM90 GDN prefill call against deltacheck's fp64 reference (issue 25: can FlashInfer run here?).

Prints what imported, what the call returned and the max abs error of out and final state; every failure is
printed with its exception, never hidden. Run on the GPU with FlashInfer and nvidia-cutlass-dsl on the path."""

from __future__ import annotations

import time
import traceback

import torch


def main() -> None:
    t0 = time.time()
    try:
        import flashinfer
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception:  # noqa: BLE001 - the point is to print what stopped the import
        traceback.print_exc()
        print("FLASHINFER_IMPORT_FAILED")
        return
    print("flashinfer", flashinfer.__version__, f"import {time.time() - t0:.1f}s")
    from deltacheck import reference

    torch.manual_seed(0)
    T, H, D = 130, 2, 128
    cu = torch.tensor([0, 64, 130], dtype=torch.int32, device="cuda")
    q = torch.randn(T, H, D, device="cuda").bfloat16()
    k = torch.nn.functional.normalize(torch.randn(T, H, D, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(T, H, D, device="cuda").bfloat16()
    g = -torch.rand(T, H, device="cuda") * 0.5 - 0.05  # log-space decay
    beta = torch.rand(T, H, device="cuda")
    h0 = torch.randn(2, H, D, D, device="cuda")  # value-major [N, H, V, K]
    try:
        t1 = time.time()
        out, state = chunk_gated_delta_rule(q, k, v, g.exp().float(), beta.float(), None, h0.clone(), True, cu)
        torch.cuda.synchronize()
        print(f"call {time.time() - t1:.1f}s out {tuple(out.shape)} {out.dtype} state {tuple(state.shape)} {state.dtype}")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        print("FLASHINFER_CALL_FAILED")
        return
    ref_out, ref_state = reference.gdn(q, k, v, g, beta, cu, initial_state=h0, state_layout="vk",
                                       output_final_state=True, compute_dtype=torch.float64)
    print("out max abs err", (out.double() - ref_out.double()).abs().max().item())
    for name, got in (("vk", state), ("kv", state.transpose(-1, -2))):
        print(f"state as {name} max abs err", (got.double() - ref_state.double()).abs().max().item())


if __name__ == "__main__":
    main()
