"""The serving hook's data: what the harness asks a backend to do in a serving call, and what comes back.

A backend that serves (issue 26; docs/backends.md, "The serving hook") has, beside ``check`` and ``run``:

- ``null_slot``: its null-slot convention as data (``reference.serving.VLLM`` / ``SGLANG``, or ``None``: every
  index is a real row, as cuDNN and FLA 0.6 have it);
- ``serving_verdict(case, mode, env) -> Verdict`` for each mode in ``SERVING_MODES`` (a decline carries the
  library's own reason);
- ``serve(case, inputs, call: ServingCall) -> ServingOutput``.

Optional, for the graph-replay and causality checks: ``capture_graph(case, static_inputs) -> replay`` (a
zero-argument callable returning ``(out, final_state)`` computed from whatever ``static_inputs`` hold when it is
called; without it the harness captures ``run`` in a ``torch.cuda.CUDAGraph``), ``graph_verdict(case, env) ->
Verdict`` (a path that cannot be captured declines with why) and ``causal_rule(case) -> "bitwise" | "chunked"``
(how exactly earlier outputs must survive a change of later inputs; default ``"bitwise"``).

Torch is never imported here: the dataclasses only carry tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# "pool": 1-D indices, one state per sequence read and written back in place (cuDNN state_indices, vLLM/FLA
# ssm_state_indices with inplace_final_state=True); "spec": [N, T_max] per-token slots and num_accepted_tokens;
# "checkpoints": cuDNN's checkpoint_every_n_tokens series; "batch_invariant": the plain call with the promise that
# a sequence's results do not depend on the batch (cuDNN's batch_invariant=True).
SERVING_MODES = ("pool", "spec", "checkpoints", "batch_invariant")


@dataclass
class ServingCall:
    """One serving call. Token-wise inputs are the case's own (``make_inputs``: packed thd with ``cu_seqlens``).

    ``pool``: value-major ``[N_pool, HO, V, K]`` (cuDNN's orientation; fp32), on the inputs' device; the backend
    updates it in place, or returns the updated pool, and must leave every row it was not asked to write
    bit-identical. ``state_indices``: int32, ``[N]`` ("pool") or ``[N, T_max]`` ("spec"), already in the backend's
    ``null_slot`` convention. ``num_accepted_tokens``: int32 ``[N]`` ("spec"; the kernel starts sequence n from
    slot ``[n, num_accepted_tokens[n] - 1]``). ``checkpoint_every``: the cadence ("checkpoints")."""

    mode: str
    pool: Any = None
    state_indices: Any = None
    num_accepted_tokens: Any = None
    checkpoint_every: int = 0
    batch_invariant: bool = False


@dataclass
class ServingOutput:
    """``out``: thd ``[T, HO, V]``. ``pool``: the pool after the call (value-major; may be the very tensor given).
    ``checkpoints``: value-major ``[rows, HO, V, K]`` in ``reference.serving.checkpoint_rows`` packing (rows past
    the last count are ignored). ``final_state``: key-major ``[N, HO, K, V]`` where the mode returns one."""

    out: Any
    pool: Any = None
    checkpoints: Any = None
    final_state: Any = None
