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

- the checkpoint pair (vLLM op; vllm-project/FlashKDA ``csrc/flash_kda.cpp``, ``csrc/smxx/fwd_kernel2.cuh``):
  ``checkpoint_state`` fp32 ``[N, H, D, D]``, ``checkpoint_offsets`` ``[N]`` in cu_seqlens's dtype (int64 without
  cu_seqlens); sequence n's slot gets the state after ``offsets[n]`` tokens when that offset ends one of its
  16-token tiles, and is left unwritten otherwise (0, a non-multiple of 16, past the sequence).

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


TILE = 16  # the recurrence's tile (csrc/smxx/fwd_kernel2.cuh, CHUNK)
CHECKPOINT_BUGS = ("late", "early", "seq_reversed")


def make(flavour: str = "flashkda", version: str = "0.33.0", *, abi_mismatch: bool = False,
         checkpoint_bug: str | None = None):
    """``abi_mismatch``: the standalone build under another libtorch, whose first check fails on every tensor.
    ``checkpoint_bug`` (vLLM op), a planted defect of the checkpoint store: "late" (the state one tile after the
    offset), "early" (one tile before it: the state the tile started from), "seq_reversed" (sequence n's checkpoint
    in sequence N-1-n's slot: the kernel's reversed scheduling index used for the store)."""
    if checkpoint_bug not in (None, *CHECKPOINT_BUGS):
        raise ValueError(f"unknown checkpoint bug {checkpoint_bug!r}")
    mod = types.SimpleNamespace(__version__=version, calls=[])

    def get_workspace_size(T_total, H, N=1):
        return 64 * (T_total * H + N * H)  # a stand-in size; the real formula is the binary's

    def compute(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state, final_state,
                cu_seqlens, checkpoint=None):
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

        def kda(q, k, v, g, beta, cu, h0, layout):
            return reference.kda(
                q, k, v, g, beta, cu, scale=scale, initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                gate_lower_bound=lower_bound, a_log=A_log, dt_bias=dt_bias, layout=layout, state_layout="vk",
                method="oracle", compute_dtype=torch.float64)

        o, ht = kda(flat(q), flat(k), flat(v), flat(g), flat(beta), cu_seqlens, initial_state, layout)
        out.copy_(o.reshape(out.shape))
        if final_state is not None:
            final_state.copy_(ht)
        if checkpoint is None:
            return
        state, offsets = checkpoint
        _check(state.dtype == torch.float32, "checkpoint_state must be float32")
        _check(state.is_contiguous(), "checkpoint_state must be a contiguous CUDA tensor")
        _check(offsets.dtype in (torch.int32, torch.int64), "checkpoint_offsets must be int32 or int64")
        _check(tuple(state.shape) == (N, H, D, D), "checkpoint_state must be [N, H, D, D]")
        _check(offsets.dim() == 1 and offsets.shape[0] == N, "checkpoint_offsets must be [N]")
        want = torch.int32 if cu_seqlens is not None and cu_seqlens.dtype == torch.int32 else torch.int64
        _check(offsets.dtype == want, "checkpoint_offsets and cu_seqlens must have matching dtypes")
        bounds = cu_seqlens.tolist() if cu_seqlens is not None else [n * T for n in range(N + 1)]
        for n in range(N):
            bos, length, o = bounds[n], bounds[n + 1] - bounds[n], int(offsets[n])
            tiles = -(-length // TILE)
            if o % TILE or not TILE <= o <= tiles * TILE:  # no tile ends there: the slot is never written
                continue
            p = {"late": o + TILE, "early": o - TILE}.get(checkpoint_bug, o)
            p = max(0, min(p, length))
            slot = N - 1 - n if checkpoint_bug == "seq_reversed" else n
            h0 = None if initial_state is None else initial_state[n:n + 1]
            if p == 0:
                state[slot] = 0 if h0 is None else h0[0].float()
                continue
            if cu_seqlens is not None:
                part = [x[0, bos:bos + p] for x in (q, k, v, g, beta)]
                cu = torch.tensor([0, p], dtype=cu_seqlens.dtype, device=q.device)
                _, h = kda(*part, cu, h0, "thd")
            else:
                part = [x[n:n + 1, :p] for x in (q, k, v, g, beta)]
                _, h = kda(*part, None, h0, "bshd")
            state[slot] = h[0].float()

    if flavour == "flashkda":
        def fwd(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state=None,
                final_state=None, cu_seqlens=None, checkpoint_state=None, checkpoint_offsets=None):
            _check((checkpoint_state is None) == (checkpoint_offsets is None),
                   "checkpoint_state and checkpoint_offsets must be provided together")
            compute(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens, None if checkpoint_state is None else (checkpoint_state, checkpoint_offsets))
    else:
        def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
                cu_seqlens=None):
            compute(q, k, v, g, beta, scale, out, None, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens)

    mod.fwd = fwd
    mod.get_workspace_size = get_workspace_size
    return mod
