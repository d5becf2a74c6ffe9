"""A contract double of FlashInfer 0.7.2's SM90 GDN entry points, computing with OUR reference:
``flashinfer.gdn_prefill.chunk_gated_delta_rule`` and ``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose``.

What it pins (flashinfer-python 0.7.2.post1; docs/libraries.md has the file:line of each):

- prefill: the signature (``q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
  cu_seqlens=None, use_qk_l2norm_in_kernel=False, ...``); ``cu_seqlens`` required (packed THD only), integer;
  q, k, v ``[T, heads, 128]`` contiguous, one dtype in {fp16, bf16} (``delta_rule_sm90.py``: D == 128);
  ``can_implement``'s head rule (GQA: HK == HV, H a multiple; GVA: HK == H, HV a multiple); ``g`` is **alpha**,
  the linear-domain decay, float32 ``[T, HO]`` and ``beta`` float32 ``[T, HO]``; the state value-major
  ``[N, HO, V, K]`` in and out, float32 out; returns ``(output, final_state)`` only with
  ``output_final_state=True``. alpha enters as ``log2(alpha + 1e-10)`` (``delta_rule_dsl/alpha.py``), so a
  log-space g passed as alpha is negative and gives NaN, as FlashInfer's issue 2490 reports for the real kernel.
- decode: ``(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None, use_qk_l2norm=True,
  initial_state=None, initial_state_indices=None, ...)``; q, k ``[B, 1, H, K]``, v ``[B, 1, HV, V]`` fp16/bf16;
  T == 1; the float32 legacy path's K >= 128 and V >= 128; A_log float32 ``[HV]``, dt_bias bf16/fp32 ``[HV]``,
  a and b ``[B, 1, HV]`` in any float dtype (the docstring says fp16/bf16; the kernel keys its build on their
  dtypes and converts on load, gdn_decode_pretranspose.py); HV a multiple of H; the pool ``[pool, HV, V, K]`` float32 with int32/int64
  indices, updated in place; the kernel's gate ``-exp(A_log) * softplus(a + dt_bias)`` and ``sigmoid(b)``.

Deviations: CPU tensors are accepted, and results are fp64 (doubles/__init__.py). ``mod.calls`` records each
call's arguments.
"""

from __future__ import annotations

import types

import torch

from deltacheck import reference

VERSION = "0.7.2.post1"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _heads_ok(h: int, hk: int, hv: int) -> bool:
    if hv > h:  # GVA
        return hk == h and hv % h == 0
    return hk == hv and h % hv == 0  # GQA, or all equal


def make(mutation=None):
    mod = types.ModuleType("flashinfer")
    mod.__version__ = VERSION
    mod.calls = []

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, output=None, output_state=None,
                               **rest):
        mod.calls.append({"fn": "prefill", "q": q, "k": k, "v": v, "g": g, "beta": beta, "scale": scale,
                          "initial_state": initial_state, "cu_seqlens": cu_seqlens,
                          "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, **rest})
        assert cu_seqlens is not None, "cu_seqlens is required for varlen mode"
        if cu_seqlens.is_floating_point():
            raise ValueError(f"cu_seqlens must have an integer dtype, got {cu_seqlens.dtype}")
        H, HK, HV, D = q.shape[1], k.shape[1], v.shape[1], q.shape[2]
        _require(_heads_ok(H, HK, HV), "can_implement failed")
        _require(D == 128 and k.shape[2] == 128 and v.shape[2] == 128, f"DSL kernel only supports D=128, got {D}")
        _require(q.dtype in (torch.float16, torch.bfloat16), f"DSL kernel only supports fp16/bf16 inputs, got {q.dtype}")
        _require(k.dtype == q.dtype and v.dtype == q.dtype, "q/k/v/o dtypes must match")
        _require(g is None or g.dtype == torch.float32, f"alpha must have dtype torch.float32, got {g.dtype}")
        _require(beta is None or beta.dtype == torch.float32, f"beta must have dtype torch.float32, got {beta.dtype}")
        for name, x in (("q", q), ("k", k), ("v", v), ("alpha", g), ("beta", beta)):
            _require(x is None or x.is_contiguous(), f"{name} must be contiguous")
        N, HO = cu_seqlens.numel() - 1, max(H, HV)
        if initial_state is not None:
            _require(tuple(initial_state.shape) == (N, HO, D, D), f"init_state must have shape [{N}] + {(HO, D, D)}")
        T = q.shape[0]
        alpha = torch.ones(T, HO) if g is None else g
        beta = torch.ones(T, HO) if beta is None else beta
        log_alpha = torch.log(alpha.double() + 1e-10)  # alpha.py: log2(alpha + 1e-10); NaN for a negative alpha
        out, state = reference.gdn(q, k, v, log_alpha, beta, cu_seqlens.long(), scale=scale or None,
                                   initial_state=initial_state, output_final_state=True,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout="vk",
                                   allow_nonfinite=True)
        return (out, state) if output_final_state else out

    def gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,
                                             use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
                                             **rest):
        mod.calls.append({"fn": "decode", "q": q, "k": k, "v": v, "A_log": A_log, "a": a, "dt_bias": dt_bias,
                          "b": b, "scale": scale, "use_qk_l2norm": use_qk_l2norm, "initial_state": initial_state,
                          "initial_state_indices": initial_state_indices, **rest})
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        assert (initial_state is None) == (initial_state_indices is None), \
            "initial_state and initial_state_indices must be provided together"
        pool = initial_state if initial_state is not None else state
        assert pool is not None, "Either state or initial_state must be provided"
        assert pool.dtype == torch.float32, f"initial_state must be float32 for legacy path, got {pool.dtype}"
        assert tuple(pool.shape[1:]) == (HV, V, K), f"Expected state pool [*, {HV}, {V}, {K}], got {tuple(pool.shape)}"
        assert T == 1, f"Decode only supports T=1, got T={T}"
        assert K >= 128 and V >= 128, f"K and V must be at least 128, got K={K}, V={V}"
        assert q.dtype in (torch.float16, torch.bfloat16), f"q must be float16/bfloat16, got {q.dtype}"
        assert A_log.dtype == torch.float32, f"A_log must be float32, got {A_log.dtype}"
        assert dt_bias.dtype in (torch.bfloat16, torch.float32), f"dt_bias must be bfloat16 or float32"
        assert a.is_floating_point() and b.is_floating_point()
        assert tuple(a.shape) == (B, 1, HV) and tuple(b.shape) == (B, 1, HV)
        assert HV % H == 0 and k.shape[2] == H
        idx = (torch.arange(B) if initial_state_indices is None else initial_state_indices).long()
        if initial_state_indices is not None:
            assert initial_state_indices.dtype in (torch.int32, torch.int64)
            assert tuple(initial_state_indices.shape) == (B,) and initial_state_indices.is_contiguous()
        # gdn_decode_pretranspose.py:152-161, 363-367: a negative index is padding, its row of the pool neither read
        # nor written and its output zero. Planted: "negative_wraps" reads and writes it as Python would (-1: the
        # last row), "key_major" reads and writes the pool K-major (silent when K == V).
        real = idx >= 0 if mutation != "negative_wraps" else torch.ones_like(idx, dtype=torch.bool)
        rows = idx[real]
        view = pool.transpose(-1, -2) if mutation == "key_major" else pool
        if not bool(real.any()):
            return torch.zeros(B, 1, HV, V, dtype=torch.float64), pool
        cu = torch.arange(int(real.sum()) + 1)
        out_real, final = reference.gdn(q[real, 0], k[real, 0], v[real, 0], a[real, 0].float(), b[real, 0].float(),
                                        cu, scale=scale, initial_state=view[rows], output_final_state=True,
                                        safe_gate=True, a_log=A_log, dt_bias=dt_bias.float(),
                                        use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=use_qk_l2norm,
                                        state_layout="vk")
        view[rows] = final.to(pool.dtype)
        out = torch.zeros(B, HV, V, dtype=out_real.dtype)
        out[real] = out_real
        return out.unsqueeze(1), pool

    # The routing helpers the adapter asks which prefill kernel serves (varlen_helper.py, utils.py): an H200's 132
    # SMs, and FlashInfer's HBM rule (CP_HBM_PARALLELISM_THRESHOLD 1/2): context-parallel while num_seqs * heads
    # < num_sms / 2.
    mod.get_compute_capability = lambda device: (9, 0)
    mod.get_device_sm_count = lambda device: 132
    mod.get_device_name = lambda device: "NVIDIA H200"
    mod.should_use_cp_host = lambda work, sms, name, device_capability=None: work * 2 < sms
    mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    mod.gated_delta_rule_decode_pretranspose = gated_delta_rule_decode_pretranspose
    return mod
