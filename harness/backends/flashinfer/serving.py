"""FlashInfer 0.7.2's SM90 GDN decode on the serving path: the serving hook (harness/backends/serving.py) of
``flashinfer-decode``. Read from the flashinfer-python 0.7.2.post1 wheel (the source wins over any summary):

- ``gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias, b, initial_state=pool,
  initial_state_indices=idx)``: the pool is value-major ``[pool, HV, V, K]``, float32 on the legacy path (T = 1 per
  call, ``gdn_decode.py:1019-1109``); entry b reads row ``idx[b]`` and, without ``output_state_indices``, writes
  its new state back to that row in place. The harness's pool goes in as it is.
- Null slot, float32 path: a **negative** index is padding: no state read or written and the output row zero
  (``gdn_kernels/gdn_decode_pretranspose.py:152-161``, ``:363-367``). As data: ``reference.serving.SGLANG`` (``-1``
  padding, real rows ``0 .. N_pool-1``). (The bf16-state fast path redirects ``-1`` to slot 0 instead, a
  sacrificial null buffer: ``gdn_decode.py:736-751``; the adapter's pool is float32.)
- Per-token states (``intermediate_states_buffer``) and a verify call (``disable_state_update``) exist for T > 1 on
  the bf16-state path only, with no accepted-count start: "spec" declines. No checkpoint series; no batch
  invariance promise.
- The prefill (``chunk_gated_delta_rule``) takes one initial state per sequence and no table: ``flashinfer``
  declines every mode.

"pool" mode feeds the case's tokens one step per call (as ``run`` does), each step carrying the sequences still
longer than it with their own rows of the table, so a prefill through the pool is a chain of decode calls.
"""

from __future__ import annotations

import torch

from deltacheck.reference import serving as sv

from ..base import Verdict
from ..serving import SERVING_MODES, ServingOutput


class FlashInferServing:
    """Mixed into ``FlashInferBackend`` (needs ``decode``, ``_decode_steps``)."""

    null_slot = sv.SGLANG

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        if not self.decode:
            return Verdict.no("FlashInfer 0.7.2's chunk_gated_delta_rule takes one initial_state per sequence and no "
                              "state table (gdn_prefill.py); the pool is on the decode (flashinfer-decode)")
        if mode == "spec":
            return Verdict.no("FlashInfer 0.7.2's decode keeps per-token states (intermediate_states_buffer) only for "
                              "T > 1 on its bf16-state path, with no accepted-count start; the float32 pool path is "
                              "T = 1 (gdn_decode.py)")
        if mode == "checkpoints":
            return Verdict.no("FlashInfer 0.7.2's decode has no checkpoint series")
        if mode == "batch_invariant":
            return Verdict.no("FlashInfer 0.7.2 promises no batch invariance")
        return Verdict.ok("gated_delta_rule_decode_pretranspose with the float32 pool as initial_state and "
                          "initial_state_indices, one token per call; a negative index is padding")

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        if call.mode != "pool":
            raise ValueError(f"{self.name} serves no {call.mode!r} mode (serving_verdict declines it)")
        pool = call.pool
        if not pool.is_contiguous() or pool.dtype != torch.float32:
            raise ValueError("the serving pool must be contiguous fp32 (FlashInfer's float32 decode path)")
        out = self._decode_steps(case, inputs, pool, call.state_indices)
        return ServingOutput(out, pool=pool)
