"""A contract double of FlashKDA's forward in its two builds, computed with our reference.

``make("flashkda")`` mimics ``torch.ops._flashkda_C`` (vllm 0.33's ``vllm/_flashkda_C.abi3.so``), ``make(
"flashkda-tokenspeed")`` the ``flash_kda`` module of the tokenspeed-flashkda wheel. What it pins (the op schema
and the binaries' TORCH_CHECK messages, docs/libraries.md "FlashKDA"):

- ``fwd(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state, final_state,
  cu_seqlens, checkpoint_state, checkpoint_offsets)`` for the vLLM op, ``fwd(q, k, v, g, beta, scale, out,
  A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None)`` for the standalone; both
  write ``out`` and ``final_state`` in place and return nothing; ``get_workspace_size(T_total, H, N)``;
- q, k, v, g, out ``[B, T, H, 128]`` bf16 contiguous, beta ``[B, T, H]`` bf16, A_log fp32 ``[H]``, dt_bias fp32
  ``[H, 128]``; cu_seqlens int32/int64 (vLLM op) or int64 (standalone) with B == 1; states ``[N, H, V, K]``
  value-major, bf16 or fp32, one dtype in and out;
- always in the kernel: l2norm of q and k, sigmoid of beta, the gate lower_bound * sigmoid(exp(A_log) * (g +
  dt_bias)).

Deviations: the device check ("all tensors must be on CUDA") is not modelled (CI has no GPU); ``out`` is the
caller's bf16 buffer, so the output is rounded to bf16 here as in the kernel (the tests' tolerance says so).
"""

from __future__ import annotations

import types

import torch

from deltacheck import reference

D = 128


def _check(cond, message):
    if not cond:
        raise RuntimeError(message)  # TORCH_CHECK raises RuntimeError


def make(flavour: str = "flashkda", version: str = "0.33.0", *, abi_mismatch: bool = False):
    """``abi_mismatch``: the standalone build under another libtorch, whose first check fails on every tensor."""
    mod = types.SimpleNamespace(__version__=version, calls=[])

    def get_workspace_size(T_total, H, N=1):
        return 64 * (T_total * H + N * H)  # a stand-in size; the real formula is the binary's

    def compute(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state, final_state,
                cu_seqlens):
        _check(not abi_mismatch, "all tensors must be on CUDA")
        mod.calls.append({"q": q, "g": g, "beta": beta, "scale": scale, "A_log": A_log, "dt_bias": dt_bias,
                          "lower_bound": lower_bound, "initial_state": initial_state, "cu_seqlens": cu_seqlens})
        _check(all(x.is_contiguous() for x in (q, k, v, g, out)), "q, k, v, g, out, and workspace must be contiguous")
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("out", out)):
            _check(x.dtype == torch.bfloat16, f"{name} must be bfloat16")
        _check(A_log.dtype == torch.float32, "A_log must be float32")
        _check(dt_bias.dtype == torch.float32, "dt_bias must be float32")
        _check(q.dim() == 4 and q.shape[-1] == D, "q must be [B, T, H, D]")
        for name, x in (("k", k), ("v", v), ("g", g), ("out", out)):
            _check(x.shape == q.shape, f"{name} must match q shape")
        B, T, H, _ = q.shape
        _check(tuple(beta.shape) == (B, T, H), "beta must be [B, T, H] matching q")
        _check(tuple(A_log.shape) == (H,), "A_log must be [H]")
        _check(tuple(dt_bias.shape) == (H, D), "dt_bias must be [H, D]")
        if workspace is not None:
            _check(workspace.numel() >= get_workspace_size(B * T, H, 1 if cu_seqlens is None else cu_seqlens.numel() - 1),
                   "workspace is too small")
        if cu_seqlens is not None:
            _check(B == 1, "B must be 1 when cu_seqlens is provided")
            ok = (torch.int32, torch.int64) if flavour == "flashkda" else (torch.int64,)
            _check(cu_seqlens.dtype in ok, "cu_seqlens must be int32 or int64" if len(ok) == 2 else
                   "cu_seqlens must be int64")
            N = cu_seqlens.numel() - 1
        else:
            N = B
        for name, x in (("initial_state", initial_state), ("final_state", final_state)):
            if x is not None:
                _check(x.is_contiguous(), f"{name} must be contiguous CUDA tensor")
                _check(x.dtype in (torch.bfloat16, torch.float32), f"{name} must be bfloat16 or float32")
                _check(tuple(x.shape) == (N, H, D, D), f"{name} must be [N, H, D, D]")
        if initial_state is not None and final_state is not None:
            _check(initial_state.dtype == final_state.dtype, "initial_state and final_state must have the same dtype")
        layout = "thd" if cu_seqlens is not None else "bshd"
        flat = (lambda x: x.squeeze(0)) if layout == "thd" else (lambda x: x)
        o, ht = reference.kda(
            flat(q), flat(k), flat(v), flat(g), flat(beta), cu_seqlens, scale=scale, initial_state=initial_state,
            output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
            gate_lower_bound=lower_bound, a_log=A_log, dt_bias=dt_bias, layout=layout, state_layout="vk",
            method="oracle", compute_dtype=torch.float64)
        out.copy_(o.reshape(out.shape))
        if final_state is not None:
            final_state.copy_(ht)

    if flavour == "flashkda":
        def fwd(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state=None,
                final_state=None, cu_seqlens=None, checkpoint_state=None, checkpoint_offsets=None):
            _check((checkpoint_state is None) == (checkpoint_offsets is None),
                   "checkpoint_state and checkpoint_offsets must be provided together")
            _check(checkpoint_state is None, "the double does not model checkpoints")
            compute(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens)
    else:
        def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
                cu_seqlens=None):
            compute(q, k, v, g, beta, scale, out, None, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens)

    mod.fwd = fwd
    mod.get_workspace_size = get_workspace_size
    return mod
