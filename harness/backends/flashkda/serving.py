"""FlashKDA's checkpoint state on the serving path: the serving hook (harness/backends/serving.py) of ``flashkda``
(vLLM's ``_flashkda_C`` op). Read from vllm-project/FlashKDA's sources (the binary vLLM ships is built from them;
the source wins over any summary):

- ``fwd(..., initial_state, final_state, cu_seqlens, checkpoint_state, checkpoint_offsets)``: both or neither
  ("checkpoint_state and checkpoint_offsets must be provided together"); ``checkpoint_state`` fp32, contiguous,
  ``[N, H, D, D]`` (the state's own value-major ``[H, V, K]`` per sequence); ``checkpoint_offsets`` ``[N]``, int32
  when ``cu_seqlens`` is int32, else int64 ("checkpoint_offsets and cu_seqlens must have matching dtypes"),
  ``csrc/flash_kda.cpp``. A later version also takes ``[N, C]`` offsets with ``[N, C, H, D, D]`` states (C <= 2,
  ``tests/test_dual_checkpoint.py``); ``[N]`` is accepted by both, so the hook uses it, one checkpoint per call.
- What is stored (``csrc/smxx/fwd_kernel2.cuh``, the recurrence): the kernel walks a sequence in tiles of 16
  tokens and exports its state after tile t when ``checkpoint_offsets[n] == (t + 1) * 16``: the state after that
  many tokens of sequence n, in fp32 (the kernel carries it in bf16). Any other offset (0, a non-multiple of 16,
  past the sequence) matches no tile and its slot is never written. The initial state (offset 0) is never stored.

The harness's "checkpoints" mode (cuDNN's ``checkpoint_every_n_tokens`` series, ``reference.serving.checkpoint_rows``:
per sequence the states after p = 0, N, 2N, ... tokens strictly below its length) maps onto that: for the j-th
checkpoint (p = j*N, j >= 1) one call with ``offsets[n] = j*N`` for the sequences that have it and 0 (never
matched) for the others; row p = 0 of each sequence is the initial state as given (or zeros), passed through, not
the kernel's: FlashKDA has no offset that stores it. So the cadence must be a positive multiple of 16.
Declined: "pool" and "spec" (``fwd`` takes one initial and one final state per sequence, ``[N, H, V, K]``, no state
indices: vLLM gathers a prefill's states out of its pool before the call), "batch_invariant" (no promise), and every
mode of the standalone build (its ``fwd`` has no checkpoint arguments).
"""

from __future__ import annotations

import torch

from ..base import Verdict
from ..serving import SERVING_MODES, ServingOutput
from .facts import HEAD_DIM, VLLM

TILE = 16  # the recurrence's tile (fwd_kernel2.cuh, CHUNK): a checkpoint offset must end one


def checkpoint_offsets(lengths, every: int) -> list[list[int]]:
    """Per call j (the j-th checkpoint, j >= 1), the ``[N]`` offsets: ``j * every`` for each sequence whose length
    exceeds it, else 0 (FlashKDA writes no slot for an offset that ends no tile)."""
    calls = max(((length - 1) // every for length in lengths if length > 0), default=0)
    return [[j * every if j * every < length else 0 for length in lengths] for j in range(1, calls + 1)]


class FlashKdaServing:
    """Mixed into ``FlashKdaBackend`` (needs ``name`` and ``_fwd(case, inputs, checkpoint_state,
    checkpoint_offsets)``)."""

    null_slot = None  # no pool: one state per sequence

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        if self.name != VLLM:
            return Verdict.no(f"{self.name}: the standalone flash_kda.fwd takes no checkpoint or state-index "
                              "arguments (initial_state, final_state, cu_seqlens only)")
        if mode in ("pool", "spec"):
            return Verdict.no("FlashKDA's fwd takes one initial and one final state per sequence ([N, H, V, K]) and no "
                              "state indices (vLLM gathers a prefill's states out of its pool before the call)")
        if mode == "batch_invariant":
            return Verdict.no("FlashKDA promises no batch invariance")
        every = case.checkpoint_every
        if every % TILE:
            return Verdict.no(f"FlashKDA stores a checkpoint only at the end of one of its {TILE}-token tiles "
                              f"(checkpoint_offsets[n] == (t + 1) * {TILE}, csrc/smxx/fwd_kernel2.cuh); the cadence "
                              f"{every} is not a multiple of {TILE}")
        return Verdict.ok(f"checkpoint_state / checkpoint_offsets ([N], one checkpoint per call); row p = 0 is the "
                          f"initial state passed through (FlashKDA stores no offset 0)")

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        if call.mode != "checkpoints":
            raise ValueError(f"{self.name} serves no {call.mode!r} mode (serving_verdict declines it)")
        every = call.checkpoint_every
        lengths = list(case.seqlens)  # serving cases are packed thd (cases/serving_axes.py)
        device = inputs["q"].device
        dtype = inputs["cu_seqlens"].dtype  # the kernel wants cu_seqlens's
        h0 = inputs.get("initial_state")
        N, H = len(lengths), case.HO
        out = None
        slots = []
        for offsets in checkpoint_offsets(lengths, every):
            state = torch.zeros(N, H, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=device)
            got, final = self._fwd(case, inputs, state, torch.tensor(offsets, dtype=dtype, device=device))
            out = got if out is None else out
            slots.append(state)
        if out is None:  # no sequence reaches a second checkpoint: the plain call
            out, final = self._fwd(case, inputs)
        rows = []
        for n, length in enumerate(lengths):
            if length <= 0:
                continue
            rows.append(torch.zeros(H, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=device) if h0 is None
                        else h0[n].to(device=device, dtype=torch.float32))  # value-major, as the kernel's slots
            rows += [slots[j][n] for j in range((length - 1) // every)]
        series = (torch.stack(rows) if rows else
                  torch.zeros(0, H, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=device))
        # out [1, T, H, V]: packed
        return ServingOutput(out.reshape(-1, H, HEAD_DIM), checkpoints=series, final_state=final.transpose(-1, -2))
