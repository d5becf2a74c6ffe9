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
  t's state goes to slot ``ssm_state_indices[n, t]`` (below: how the kernel really walks the table). Without indices, sequence n's initial state is read at ROW ``bos`` (its
  first token's offset, fused_recurrent.py:119) and, with ``inplace_final_state=False``, every token's state
  is returned in a buffer of ``k.shape[1]`` rows (one batch row's tokens): what the kernel reads or writes
  past a buffer, the double raises IndexError for;
- the serving path, read from the kernel (fused_recurrent.py:104-117, 150-160): the table is walked as memory,
  ``ssm_state_indices[n*stride(0) + i]`` (no token stride: a 1-D table with T > 1 reaches the next sequence's
  entry), the start entry is ``i = num_accepted_tokens[n] - 1`` (0 without it), a start slot <= 0 returns before
  any output or state (outputs stay unwritten: NaN here), a per-token slot <= 0 skips that store;
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


def _pointer_walk(table: torch.Tensor):
    """``(n, i) -> ssm_state_indices[n*stride_seq + i]`` over the table's memory, as the kernel's pointer reads
    it (fused_recurrent.py:111, 156): ``stride_seq = stride(0)``; the token stride is never applied. A read past
    the table's storage raises IndexError (on the GPU: an out-of-bounds read)."""
    memory = table.new_empty(0).set_(table.untyped_storage())
    stride_seq, base = table.stride(0), table.storage_offset()

    def entry(n: int, i: int) -> int:
        at = base + n * stride_seq + i
        if at >= memory.numel():
            raise IndexError(f"ssm_state_indices read at entry {at}, past its {memory.numel()} entries")
        return int(memory[at])

    return entry


MUTATIONS = (None, "key_major", "null_write", "first_block", "future_gate")


def make(version: str = VERSION, mutation: str | None = None):
    """The double; ``mutation`` plants one serving bug in ``fused_recurrent_gated_delta_rule`` (issue 26's classes):
    ``key_major`` reads and writes the value-major pool as key-major (S^T), ``null_write`` drops the null-block checks
    (a null sequence reads and writes slot 0, as a kernel without ``state_idx <= 0`` does), ``first_block`` starts every sequence from slot
    ``[n, 0]`` whatever ``num_accepted_tokens`` says, ``future_gate`` decays token t with token t+1's gate."""
    if mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}; {MUTATIONS}")
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
        o = torch.full((B * T, HV, V), float("nan"), dtype=torch.float64)  # new_empty: unwritten rows stay garbage
        table = None if ssm_state_indices is None else _pointer_walk(ssm_state_indices)
        key_major = mutation == "key_major"
        for n, (bos, eos) in enumerate(bounds):
            if eos == bos:
                continue  # `if T == 0: return`
            if table is not None:
                start = 0 if num_accepted_tokens is None or mutation == "first_block" else \
                    int(num_accepted_tokens[n]) - 1
                slot = table(n, start)
                if slot <= 0 and mutation != "null_write":
                    continue  # the null block: no output, no state read, no write
                h = pool[slot].double()
            else:  # fused_recurrent.py:119: p_h0 = h0 + bos * HV * V * K, a TOKEN offset, not the sequence's
                if bos >= pool.shape[0]:
                    raise IndexError(f"fused_recurrent reads sequence {n}'s initial state at row bos={bos}, past "
                                     f"the {pool.shape[0]} rows of initial_state")
                h = pool[bos].double()
            if key_major:
                h = h.transpose(-1, -2)
            for t in range(eos - bos):
                seg = [x[bos + t:bos + t + 1] for x in flat]
                if mutation == "future_gate" and bos + t + 1 < eos:
                    seg[3] = flat[3][bos + t + 1:bos + t + 2]  # the bug class: a later token's gate
                out_t, ht = reference.gdn(*seg, torch.tensor([0, 1], dtype=torch.int32), scale=scale,
                                          initial_state=h.unsqueeze(0), output_final_state=True,
                                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, layout="thd",
                                          state_layout="vk", method="oracle", compute_dtype=torch.float64)
                h = ht[0]
                o[bos + t] = out_t[0]
                if inplace_final_state:
                    slot = table(n, t)
                    if slot > 0 or mutation == "null_write":
                        pool[slot] = (h.transpose(-1, -2) if key_major else h).to(pool.dtype)
                elif bos + t >= rows:
                    raise IndexError(f"fused_recurrent writes token {bos + t}'s state past its buffer of {rows} rows "
                                     f"(B={B} > 1 without cu_seqlens)")
                else:
                    states[bos + t] = h.to(states.dtype)
        final_state = initial_state if inplace_final_state else states
        return _NoBackward.apply(o.reshape(B, T, HV, V)), final_state

    mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    mod.fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule
    return mod
