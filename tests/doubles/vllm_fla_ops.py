"""A contract double of vLLM 0.33's bundled FLA copy (``vllm.third_party.flash_linear_attention.ops``): its two
GDN forward entry points, computed with our reference.

What it pins (vllm 0.33.0 wheel, docs/libraries.md "vLLM's FLA copy"):

- the signatures of ``chunk_gated_delta_rule`` (chunk.py:138) and ``fused_recurrent_gated_delta_rule``
  (fused_recurrent.py:535), keywords and defaults;
- layout ``[B, T, heads, dim]``; with ``cu_seqlens`` B must be 1; q and k at H heads, v/g/beta at HV = G*H;
- the state is VALUE-major ``[N, HV, V, K]`` and, as in the kernels, read through its memory (a contiguous
  buffer reinterpreted as [N, HV, V, K]; the kernels check no shape), so a key-major state gives wrong numbers
  rather than an error when K == V; chunk's final state is fp32 [N, HV, V, K];
- chunk asserts no fp32 q/k/v and 3-d beta; fused_recurrent reads ``initial_state.stride(0)`` (None raises)
  and asserts scale > 0. Its two state modes: with ``ssm_state_indices`` (vLLM's only use) initial_state is a
  pool, sequence n starts from slot ``ssm_state_indices[n, 0]`` and, with ``inplace_final_state=True``, token
  t's state goes to slot ``ssm_state_indices[n, t]`` (1-d indices: slot [n]); slots <= 0 (the null block) are
  skipped, no output and no write. Without indices, sequence n's initial state is read at ROW ``bos`` (its
  first token's offset, fused_recurrent.py:119) and, with ``inplace_final_state=False``, every token's state
  is returned in a buffer of ``k.shape[1]`` rows (one batch row's tokens): what the kernel reads or writes
  past a buffer, the double raises IndexError for;
- no backward: both autograd Functions define none.

Results in fp64 (tests/doubles/__init__.py).
"""

from __future__ import annotations

import types

import torch

from deltacheck import reference

VERSION = "0.33.0"


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("vLLM's FLA copy: ChunkGatedDeltaRuleFunction/FusedRecurrentFunction define no backward")


def _heads(q, k, v, g, beta):
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if q.shape != k.shape:
        raise AssertionError(f"q {list(q.shape)} and k {list(k.shape)} must match")
    if HV % H:
        raise AssertionError(f"HV={HV} must be a multiple of H={H}")
    if tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV):
        raise AssertionError(f"g and beta must be [B, T, HV]={[B, T, HV]}, got {list(g.shape)}, {list(beta.shape)}")
    return B, T, H, HV, K, V


def _as_value_major(state, N, HV, V, K):
    """What the kernels do with the state pointer: contiguous memory read as [N, HV, V, K]."""
    return state.contiguous().reshape(N, HV, V, K)


def _reference(q, k, v, g, beta, cu_seqlens, scale, h0, l2norm):
    """out [B, T, HV, V] and value-major final states [N, HV, V, K] from our oracle."""
    B = q.shape[0]
    layout = "thd" if cu_seqlens is not None else "bshd"
    squeeze = (lambda x: x.squeeze(0)) if layout == "thd" else (lambda x: x)
    o, ht = reference.gdn(squeeze(q), squeeze(k), squeeze(v), squeeze(g), squeeze(beta), cu_seqlens, scale=scale,
                          initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm, layout=layout,
                          state_layout="vk", method="oracle", compute_dtype=torch.float64)
    return (o.unsqueeze(0) if layout == "thd" else o), ht, B


def make(version: str = VERSION):
    mod = types.SimpleNamespace(__version__=version, calls=[])

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False,
                               core_attn_out=None):
        mod.calls.append({"fn": "chunk_gated_delta_rule", **{n: x for n, x in locals().items() if n != "mod"}})
        assert q.dtype == k.dtype == v.dtype
        assert q.dtype != torch.float32, "ChunkGatedDeltaRuleFunction does not support float32. Please use bfloat16."
        assert len(beta.shape) == 3, "beta must be of shape [B, T, H]."
        B, T, H, HV, K, V = _heads(q, k, v, g, beta)
        assert K <= 256, "current kernel does not support head dimension larger than 256."
        if cu_seqlens is not None:
            if q.shape[0] != 1:
                raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`.")
            if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
                raise ValueError("The number of initial states is expected to be equal to the number of input sequences")
        N = B if cu_seqlens is None else len(cu_seqlens) - 1
        h0 = None if initial_state is None else _as_value_major(initial_state, N, HV, V, K)
        scale = k.shape[-1] ** -0.5 if scale is None else scale
        o, ht, _ = _reference(q, k, v, g, beta, cu_seqlens, scale, h0, use_qk_l2norm_in_kernel)
        return _NoBackward.apply(o), (ht.float() if output_final_state else None)

    def fused_recurrent_gated_delta_rule(q, k, v, g, beta=None, scale=None, initial_state=None,
                                         inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None,
                                         num_accepted_tokens=None, use_qk_l2norm_in_kernel=False):
        mod.calls.append({"fn": "fused_recurrent_gated_delta_rule",
                          **{n: x for n, x in locals().items() if n != "mod"}})
        if cu_seqlens is not None and q.shape[0] != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`.")
        if scale is None:
            scale = k.shape[-1] ** -0.5
        else:
            assert scale > 0, "scale must be positive"
        if beta is None:
            beta = torch.ones_like(q[..., 0])
        if num_accepted_tokens is not None:
            raise NotImplementedError("the double does not model speculative decoding (num_accepted_tokens)")
        B, T, H, HV, K, V = _heads(q, k, v, g, beta)
        initial_state.stride(0)  # the kernel wrapper reads it unconditionally: None raises AttributeError
        pool = initial_state.view(-1, HV, V, K)  # the kernel's pointer arithmetic: rows of [HV, V, K]
        if cu_seqlens is None:
            bounds = [(n * T, n * T + T) for n in range(B)]
        else:
            c = cu_seqlens.tolist()
            bounds = list(zip(c[:-1], c[1:]))
        flat = [x.reshape(B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
        rows = T  # the kernel's per-token buffer: q.new_empty(T, HV, V, K) with T = k.shape[1]
        states = None if inplace_final_state else torch.zeros(rows, HV, V, K, dtype=initial_state.dtype)
        o = torch.zeros(B * T, HV, V, dtype=torch.float64)
        for n, (bos, eos) in enumerate(bounds):
            if eos == bos:
                continue
            if ssm_state_indices is not None:
                slot = int(ssm_state_indices.reshape(len(bounds), -1)[n, 0])
                if slot <= 0:
                    continue  # the null block: no output, no write
                h0 = pool[slot].double()
            else:  # fused_recurrent.py:119: p_h0 = h0 + bos * HV * V * K, a TOKEN offset, not the sequence's
                if bos >= pool.shape[0]:
                    raise IndexError(f"fused_recurrent reads sequence {n}'s initial state at row bos={bos}, past "
                                     f"the {pool.shape[0]} rows of initial_state")
                h0 = pool[bos].double()
            for t in range(eos - bos):  # the state after each token: a prefix of the sequence
                seg = [x[bos:bos + t + 1] for x in flat]
                cu = torch.tensor([0, t + 1], dtype=torch.int32)
                out_t, ht = reference.gdn(*seg, cu, scale=scale, initial_state=h0.unsqueeze(0),
                                          output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                          layout="thd", state_layout="vk", method="oracle",
                                          compute_dtype=torch.float64)
                o[bos + t] = out_t[-1]
                if inplace_final_state:
                    index = ssm_state_indices.reshape(len(bounds), -1)
                    slot = int(index[n, t if index.shape[1] > 1 else 0])
                    if slot > 0:
                        pool[slot] = ht[0].to(pool.dtype)
                elif bos + t >= rows:
                    raise IndexError(f"fused_recurrent writes token {bos + t}'s state past its buffer of {rows} rows "
                                     f"(B={B} > 1 without cu_seqlens)")
                else:
                    states[bos + t] = ht[0].to(states.dtype)
        final_state = initial_state if inplace_final_state else states
        return _NoBackward.apply(o.reshape(B, T, HV, V)), final_state

    mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    mod.fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule
    return mod
