"""The serving path's reference: state pools, decode steps, state series and speculative verification. Torch only.

Every function here is built on the public reference ops (``gdn``, ``kda``, ``gdn2``, ``gdp``) and computes in their
``compute_dtype`` (fp64 by default). Token-wise tensors are packed THD with ``cu_seqlens``, as cuDNN takes them.
What each function computes and where each convention comes from: ``docs/serving.md``.

- ``pooled``: pool in -> pool out. Sequence ``i`` starts from pool row ``state_indices[i]`` and its final state
  replaces that row; rows no sequence addresses come back bit-identical (as exact upcasts to ``compute_dtype``).
- ``decode_step`` / ``decode_chain``: T = 1 per sequence; a chain of n steps through the pool.
- ``state_series`` / ``checkpoints``: the state after every token; cuDNN's every-N-token checkpoint rows.
- ``spec_verify`` / ``picked_state``: vLLM's per-token in-place mode (``ssm_state_indices [N, T]``,
  ``num_accepted_tokens``).
- ``compare_pool``: the pool-integrity comparison (addressed rows within a tolerance, every other row bitwise),
  with the null-slot conventions (``NullSlot``, ``VLLM``, ``SGLANG``, ``CUDNN``): ``pools.py``, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import layouts
from .layouts import ReferenceInputError
from .ops import gdn, gdn2, gdp, kda
from .pools import (  # the pools' conventions and their comparison, offered here as they always were
    CUDNN,
    NULL_SLOT_KINDS,
    SGLANG,
    VLLM,
    NullSlot,
    PoolComparison,
    check_state_indices,
    compare_pool,
    is_null,
    written_rows,
)

__all__ = ["CUDNN", "NULL_SLOT_KINDS", "SGLANG", "VLLM", "NullSlot", "PoolComparison", "Served", "checkpoint_rows",
           "checkpoints", "compare_pool", "decode_chain", "decode_step", "picked_state", "pooled", "spec_verify",
           "state_series", "check_state_indices", "written_rows"]

# --- the ops' token-wise arguments ------------------------------------------------------------------------------

_OPS = {gdn: "gdn", kda: "kda", gdn2: "gdn2", gdp: "gdp"}
_TOKENWISE = {"gdn": ("q", "k", "v", "g", "beta"), "kda": ("q", "k", "v", "g", "beta"),
              "gdn2": ("q", "k", "v", "g", "beta", "w"), "gdp": ("q", "k", "v", "g", "beta")}


def _op_name(op) -> str:
    name = _OPS.get(op, op if op in _TOKENWISE else None)
    if name is None:
        raise ReferenceInputError(f"op: expected one of reference.gdn/kda/gdn2/gdp or their names, got {op!r}")
    return name


def _normalize(name: str, tensors, kwargs) -> tuple:
    """The token-wise tensors with token t at row t of every one (GDP's expanded sub-token tensors go token-major,
    a pure reshape, which gdp reads identically)."""
    want = _TOKENWISE[name]
    if len(tensors) != len(want):
        raise ReferenceInputError(f"{name}: expected the token-wise tensors {want} positionally, got {len(tensors)}")
    if name != "gdp":
        return tuple(tensors)
    n = kwargs.get("num_householder")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ReferenceInputError(f"num_householder: expected a positive integer keyword, got {n!r}")
    q, k, v, g, beta = tensors
    T = q.shape[0]
    out = [q]
    for x, rank in ((k, 3), (v, 3), (g, None), (beta, 2)):
        if rank is not None and x.dim() == rank:
            if x.shape[0] != T * n:
                raise ReferenceInputError(
                    f"gdp: expanded sub-token tensors need T*n = {T * n} rows, got {list(x.shape)}")
            x = x.reshape(T, n, *x.shape[1:])
        out.append(x)
    return tuple(out)


def _tokens(tensors, a: int, b: int) -> tuple:
    return tuple(x[a:b] for x in tensors)


def _call(name: str, tensors, cu_seqlens, h0, kwargs):
    op = {"gdn": gdn, "kda": kda, "gdn2": gdn2, "gdp": gdp}[name]
    return op(*tensors, cu_seqlens=cu_seqlens, initial_state=h0, output_final_state=True, **kwargs)


def _kwargs(kwargs):
    for bad in ("initial_state", "output_final_state", "cu_seqlens", "layout"):
        if bad in kwargs:
            raise ReferenceInputError(f"{bad}: set by the serving reference itself; do not pass it")
    out = dict(kwargs)
    out.setdefault("compute_dtype", torch.float64)
    out.setdefault("state_layout", "vk")
    return out


def _offsets(cu_seqlens, T: int) -> list[int]:
    return [0, T] if cu_seqlens is None else layouts.check_cu_seqlens(cu_seqlens, T)


def _check_pool(pool, state_layout: str):
    if not isinstance(pool, torch.Tensor) or not pool.is_floating_point() or pool.dim() != 4:
        raise ReferenceInputError(
            f"pool: expected a floating 4-D tensor [N_pool, HO, {'V, K' if state_layout == 'vk' else 'K, V'}], got "
            f"{getattr(pool, 'shape', type(pool).__name__)}")


# --- pool in -> pool out ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Served:
    """What a serving call returns: the output (packed, ``compute_dtype``), the new pool (``compute_dtype``; rows not
    written are exact upcasts of the input pool's), and per sequence whether it was null (its output is the
    zero-state computation, which a library may instead zero or leave unwritten: compare only non-null rows)."""

    out: torch.Tensor
    pool: torch.Tensor
    null: tuple
    written: tuple  # the pool rows this call wrote, in order


def pooled(op, pool, state_indices, *tensors, cu_seqlens=None, null_slot=None, **kwargs) -> Served:
    """Gather each sequence's initial state from ``pool[state_indices[i]]``, run the reference op over the batch,
    scatter each final state back to its row (cuDNN FE 1.32 ``state_indices``; vLLM's 1-D ``ssm_state_indices``
    with one token per sequence). A null index starts from zeros and writes nothing."""
    name = _op_name(op)
    kw = _kwargs(kwargs)
    _check_pool(pool, kw["state_layout"])
    tensors = _normalize(name, tensors, kw)
    offsets = _offsets(cu_seqlens, tensors[0].shape[0])
    N = len(offsets) - 1
    if not isinstance(state_indices, torch.Tensor) or state_indices.dim() != 1 or state_indices.numel() != N:
        raise ReferenceInputError(f"state_indices: expected a 1-D integer tensor [N={N}], got "
                                  f"{getattr(state_indices, 'shape', type(state_indices).__name__)}")
    idx = check_state_indices(state_indices, pool.shape[0], null_slot)
    null = tuple(is_null(null_slot, i) for i in idx)
    base = pool.to(kw["compute_dtype"])
    h0 = torch.stack([torch.zeros_like(base[0]) if z else base[i] for i, z in zip(idx, null)])
    out, final = _call(name, tensors, cu_seqlens, h0, kw)
    new = base.clone()
    written = []
    for n, (i, z) in enumerate(zip(idx, null)):
        if not z:
            new[i] = final[n]
            written.append(i)
    return Served(out, new, null, tuple(written))


def decode_step(op, pool, state_indices, *tensors, null_slot=None, **kwargs) -> Served:
    """One decode step: T = 1 per sequence, token ``i`` belongs to sequence ``i`` (no cu_seqlens needed)."""
    N = tensors[0].shape[0] if tensors else 0
    cu = torch.arange(N + 1, dtype=torch.int32)
    return pooled(op, pool, state_indices, *tensors, cu_seqlens=cu, null_slot=null_slot, **kwargs)


def decode_chain(op, pool, state_indices, *tensors, steps: int, null_slot=None, **kwargs) -> Served:
    """``steps`` decode steps through the pool. The tensors hold N sequences of ``steps`` tokens each, sequence-major
    (token j of sequence i at row ``i*steps + j``, i.e. ``cu_seqlens = arange(N+1) * steps``); step j runs token j of
    every sequence from the pool the previous step left. Returns the outputs in the same packing and the last pool,
    which must equal one ``pooled`` prefill over the same packing."""
    name = _op_name(op)
    kw = _kwargs(kwargs)
    tensors = _normalize(name, tensors, kw)
    T = tensors[0].shape[0]
    if not isinstance(steps, int) or steps < 1 or T % steps:
        raise ReferenceInputError(f"steps: expected a positive integer dividing the {T} tokens, got {steps!r}")
    N = T // steps
    rows = torch.arange(N) * steps
    outs = []
    served = None
    current = pool
    for j in range(steps):
        step = tuple(x.index_select(0, rows + j) for x in tensors)
        served = decode_step(name, current, state_indices, *step, null_slot=null_slot, **kw)
        current = served.pool
        outs.append(served.out)
    out = torch.stack(outs, dim=1).reshape(T, *outs[0].shape[1:])
    return Served(out, current, served.null, served.written)


# --- state series -------------------------------------------------------------------------------------------------

def _initial(initial_state, offsets, tensors, kw) -> list:
    """Per sequence its initial state ``[1, HO, ., .]`` in compute_dtype (zeros when ``initial_state`` is None)."""
    N = len(offsets) - 1
    cd = kw["compute_dtype"]
    if initial_state is None:
        q, v, g = tensors[0], tensors[2], tensors[3]
        K, V, HO = q.shape[-1], v.shape[-1], g.shape[1]
        shape = (1, HO, V, K) if kw["state_layout"] == "vk" else (1, HO, K, V)
        return [torch.zeros(shape, dtype=cd, device=q.device) for _ in range(N)]
    if not isinstance(initial_state, torch.Tensor) or initial_state.dim() != 4 or initial_state.shape[0] != N:
        raise ReferenceInputError(f"initial_state: expected [N={N}, HO, ., .], got "
                                  f"{getattr(initial_state, 'shape', type(initial_state).__name__)}")
    return [initial_state[i:i + 1].to(cd) for i in range(N)]


def state_series(op, *tensors, cu_seqlens=None, initial_state=None, **kwargs) -> list:
    """Per sequence, ``[L_i + 1, HO, V, K]`` (state_layout's orientation): entry p is the state after p tokens
    (entry 0 the initial state, entry L_i the final state). One single-token reference call per token, chained."""
    name = _op_name(op)
    kw = _kwargs(kwargs)
    tensors = _normalize(name, tensors, kw)
    offsets = _offsets(cu_seqlens, tensors[0].shape[0])
    one = torch.tensor([0, 1], dtype=torch.int32)
    series = []
    for (a, b), h in zip(zip(offsets[:-1], offsets[1:]), _initial(initial_state, offsets, tensors, kw)):
        states = [h[0]]
        for t in range(a, b):
            _, h = _call(name, _tokens(tensors, t, t + 1), one, h, kw)
            states.append(h[0])
        series.append(torch.stack(states))
    return series


def checkpoint_rows(cu_seqlens, every_n: int, num_householder: int = 1) -> list[tuple[int, int]]:
    """cuDNN FE 1.32's checkpoint rows: ``(first row, count)`` per sequence, ``count = (L*n - 1) // every_n + 1``
    (0 for an empty sequence) on the sub-token timeline, rows packed sequence after sequence
    (``frost/common/thd.py: emit_checkpoint_seq_descs``). The op allocates ``max(T*n // every_n + N, 1)`` rows
    (``ops/gdn.py``); rows past the last count are not written."""
    if not isinstance(every_n, int) or isinstance(every_n, bool) or every_n < 1:
        raise ReferenceInputError(f"every_n: expected a positive integer, got {every_n!r}")
    offsets = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    rows, start = [], 0
    for L in lengths:
        count = (L * num_householder - 1) // every_n + 1 if L > 0 else 0
        rows.append((start, count))
        start += count
    return rows


def checkpoints(op, *tensors, every_n: int, cu_seqlens=None, initial_state=None, **kwargs) -> torch.Tensor:
    """cuDNN's ``checkpoint_every_n_tokens`` series: per sequence the states after p tokens for p = 0, every_n,
    2*every_n, ... strictly below the sequence length (p = 0 is the initial state), packed as ``checkpoint_rows``.
    Computed by chaining reference calls over the segments between checkpoints (independent of ``state_series``).
    GDP counts sub-tokens, as cuDNN does; the reference needs ``every_n % num_householder == 0`` there (a
    checkpoint inside a token's sub-tokens is not a state the token-level ops expose)."""
    name = _op_name(op)
    kw = _kwargs(kwargs)
    tensors = _normalize(name, tensors, kw)
    T = tensors[0].shape[0]
    offsets = _offsets(cu_seqlens, T)
    n = kw.get("num_householder", 1) if name == "gdp" else 1
    if not isinstance(every_n, int) or isinstance(every_n, bool) or every_n < 1:
        raise ReferenceInputError(f"every_n: expected a positive integer, got {every_n!r}")
    if every_n % n:
        raise ReferenceInputError(f"every_n: {every_n} is not a multiple of num_householder={n}; a checkpoint would "
                                  "fall inside a token's sub-tokens")
    stride = every_n // n
    out = []
    for (a, b), h in zip(zip(offsets[:-1], offsets[1:]), _initial(initial_state, offsets, tensors, kw)):
        for p in range(0, b - a, stride):
            out.append(h[0])
            if a + p + stride < b:  # the state at the next checkpoint: one call over the segment
                cu = torch.tensor([0, stride], dtype=torch.int32)
                _, h = _call(name, _tokens(tensors, a + p, a + p + stride), cu, h, kw)
    if not out:
        raise ReferenceInputError("checkpoints: every sequence is empty; there is no state to checkpoint")
    return torch.stack(out)


# --- speculative verification (vLLM's per-token in-place mode) -----------------------------------------------------

def spec_verify(op, pool, ssm_state_indices, *tensors, cu_seqlens=None, num_accepted_tokens=None, null_slot=VLLM,
                **kwargs) -> Served:
    """vLLM's FLA copy (``fused_recurrent_gated_delta_rule_fwd_kernel`` with ``inplace_final_state=True``): sequence n
    starts from ``pool[ssm_state_indices[n, num_accepted_tokens[n] - 1]]`` (``[n, 0]`` without
    ``num_accepted_tokens``) and stores the state after its token t at ``pool[ssm_state_indices[n, t]]``. A null
    start slot skips the sequence (zero start, no stores: vLLM's ``if state_idx <= 0: return``); a null per-token
    slot skips that one store. Every non-null slot of the table is distinct."""
    name = _op_name(op)
    kw = _kwargs(kwargs)
    _check_pool(pool, kw["state_layout"])
    tensors = _normalize(name, tensors, kw)
    offsets = _offsets(cu_seqlens, tensors[0].shape[0])
    N = len(offsets) - 1
    if not isinstance(ssm_state_indices, torch.Tensor) or ssm_state_indices.dim() != 2 \
            or ssm_state_indices.shape[0] != N:
        raise ReferenceInputError(f"ssm_state_indices: expected a 2-D integer tensor [N={N}, T_max], got "
                                  f"{getattr(ssm_state_indices, 'shape', type(ssm_state_indices).__name__)}")
    table = check_state_indices(ssm_state_indices, pool.shape[0], null_slot, name="ssm_state_indices")
    width = ssm_state_indices.shape[1]
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    for n, L in enumerate(lengths):
        if L > width:
            raise ReferenceInputError(f"ssm_state_indices: sequence {n} has {L} tokens but its row has {width} slots")
    if num_accepted_tokens is None:
        start = [0] * N
    else:
        if not isinstance(num_accepted_tokens, torch.Tensor) or num_accepted_tokens.shape != (N,):
            raise ReferenceInputError(f"num_accepted_tokens: expected an integer tensor [N={N}]")
        start = [int(a) - 1 for a in num_accepted_tokens.tolist()]
        for n, s in enumerate(start):
            if not 0 <= s < width:
                raise ReferenceInputError(
                    f"num_accepted_tokens[{n}] = {s + 1}: must lie in [1, {width}] (the kernel reads slot "
                    f"[n, num_accepted_tokens[n] - 1]; 0 would read the slot before the row)")
    base = pool.to(kw["compute_dtype"])
    new = base.clone()
    outs, null, written = [], [], []
    one = torch.tensor([0, 1], dtype=torch.int32)
    for n, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        slot0 = table[n][start[n]]
        skip = is_null(null_slot, slot0)
        null.append(skip)
        h = torch.zeros_like(base[:1]) if skip else base[slot0:slot0 + 1]
        for t in range(a, b):
            o, h = _call(name, _tokens(tensors, t, t + 1), one, h, kw)
            outs.append(o)
            slot = table[n][t - a]
            if not skip and not is_null(null_slot, slot):
                new[slot] = h[0]
                written.append(slot)
    out = torch.cat(outs) if outs else None
    return Served(out, new, tuple(null), tuple(written))


def picked_state(pool, ssm_state_indices, num_accepted_tokens) -> torch.Tensor:
    """The state the next step starts from: ``pool[ssm_state_indices[n, num_accepted_tokens[n] - 1]]`` per sequence,
    i.e. the state after the first ``num_accepted_tokens[n]`` tokens of the verified call."""
    rows = [int(ssm_state_indices[n, a - 1]) for n, a in enumerate(num_accepted_tokens.tolist())]
    return pool[rows]
