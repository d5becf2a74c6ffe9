"""A serving case's pool, index tables and reference results (issue 26).

The pool and the tables are drawn from the case (its id and seed), like every other input: the same id gives the
same pool and the same permutation on every machine. The table is in the backend's null-slot convention (data:
``reference.serving.NullSlot``); the reference results come from ``reference.serving`` in fp64 on the very
tensors the kernel reads (upcast exactly), through ``reference_arguments`` so every Case field maps as it does for
the training-style checks.
"""

from __future__ import annotations

import torch

from deltacheck.cases.inputs import stream_seed
from deltacheck.reference import serving as sv

from ..backends.reference import reference_arguments

POOL_SCALE = 0.5  # pool rows ~ N(0, 0.25): states of the magnitude a contractive recurrence keeps


def _generator(case, name: str) -> torch.Generator:
    """The case's own stream for ``name`` (cases/inputs.py's seeding: the id and seed, never Python's hash)."""
    return torch.Generator().manual_seed(stream_seed(case, name))


class NoNullSlot(ValueError):
    """The case has null sequences but the backend has no null-slot convention (cuDNN, FLA 0.6)."""


def pool_tensor(case, device="cpu") -> torch.Tensor:
    """The pool, value-major ``[pool, HO, V, K]`` fp32."""
    pool = torch.randn(case.pool, case.HO, case.V, case.K, generator=_generator(case, "pool"), dtype=torch.float32)
    return (pool * POOL_SCALE).to(device)


def _null_id(null_slot) -> int:
    return 0 if null_slot.kind == "zero_index_is_null" else -1


def index_table(case, null_slot, device="cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(state_indices, num_accepted_tokens)``: int32 ``[N]`` (``[N, k+1]`` for spec) of pairwise distinct real
    rows drawn as a permutation of the convention's real range (never 0..N-1 in order, so a kernel that ignores the
    table fails), with ``case.nulls`` sequences (chosen by the seed) on the null id; ``num_accepted_tokens =
    accepted + 1`` for spec, else None."""
    if case.nulls and null_slot is None:
        raise NoNullSlot(f"{case.nulls} null sequence(s), but the backend's convention has no null slot "
                         "(every index is a real row)")
    gen = _generator(case, "state_indices")
    first = null_slot.first_real() if null_slot is not None else 0
    slots = case.draft + 1 if case.draft else 1
    real = (torch.randperm(case.pool - first, generator=gen) + first).tolist()
    null_seqs = set(torch.randperm(case.N, generator=gen)[:case.nulls].tolist())
    rows = []
    for n in range(case.N):
        if n in null_seqs:
            rows.append([_null_id(null_slot)] * slots)
        else:
            rows.append([real.pop() for _ in range(slots)])
    table = torch.tensor(rows, dtype=torch.int32, device=device)
    if not case.draft:
        return table[:, 0].contiguous(), None
    accepted = torch.tensor([a + 1 for a in case.accepted], dtype=torch.int32, device=device)
    return table, accepted


def reference_call(case, inputs: dict) -> tuple[tuple, dict]:
    """The token-wise tensors (positionally) and the op keywords ``reference.serving`` takes for this case."""
    args, kwargs = reference_arguments(case, inputs)
    for key in ("initial_state", "output_final_state", "layout"):
        kwargs.pop(key, None)
    return tuple(a.cpu() if a is not None else a for a in args[:-1]), _cpu(kwargs)


def _cpu(kwargs: dict) -> dict:
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def cu_seqlens(case) -> torch.Tensor:
    offsets = [0]
    for length in case.seqlens:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32)


def reference_pool(case, inputs, pool, indices, null_slot) -> sv.Served:
    tensors, kw = reference_call(case, inputs)
    return sv.pooled(case.op, pool.cpu(), indices.cpu(), *tensors, cu_seqlens=cu_seqlens(case),
                     null_slot=null_slot, **kw)


def reference_spec(case, inputs, pool, table, accepted, null_slot) -> sv.Served:
    tensors, kw = reference_call(case, inputs)
    return sv.spec_verify(case.op, pool.cpu(), table.cpu(), *tensors, cu_seqlens=cu_seqlens(case),
                          num_accepted_tokens=accepted.cpu(), null_slot=null_slot, **kw)


def reference_checkpoints(case, inputs) -> torch.Tensor:
    tensors, kw = reference_call(case, inputs)
    h0 = inputs.get("initial_state")
    return sv.checkpoints(case.op, *tensors, every_n=case.checkpoint_every, cu_seqlens=cu_seqlens(case),
                          initial_state=h0.cpu() if h0 is not None else None, **kw)


def token_rows(case) -> list[tuple[int, int]]:
    """``[start, end)`` of each sequence in the packed token axis."""
    offsets = cu_seqlens(case).tolist()
    return list(zip(offsets[:-1], offsets[1:]))
