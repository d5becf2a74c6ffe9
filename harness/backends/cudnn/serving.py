"""cuDNN FE 1.32's four serving arguments as the serving hook (harness/backends/serving.py) of the ``cudnn``
backends. Read from the nvidia-cudnn-frontend 1.32.0 wheel (``cudnn/linear_attention/ops/gdn.py: gated_delta_net``
and its kin; the source wins):

- ``state_indices`` (int32 ``[N]``): ``initial_state`` becomes a pool ``[N_pool, HO, V, K]`` (value-major, the
  harness's own orientation: the pool goes in as it is); sequence i reads row ``state_indices[i]`` and writes its
  final state back there in place. Implies ``overwrite_initial_state``; forward only; "cannot combine with
  checkpoint_every_n_tokens". Every index is a row: no null slot.
- ``overwrite_initial_state``: the final state is written into the ``initial_state`` buffer (passed with the pool).
- ``checkpoint_every_n_tokens`` (+ ``checkpoint_dtype``: None = io dtype, or fp32; fp32 here, so the series is
  judged at the state's precision): a third return value, the series every N tokens strictly before each sequence
  end (``reference.serving.checkpoint_rows``); FROST takes a positive multiple of 64.
- ``batch_invariant``: each sequence's results bitwise independent of the batch composition.

On FE 1.32 the pool and the checkpoints are FROST's (Blackwell). On SM90 no engine takes them; the reasons are the
engines' own (``hopper/cuda_engine.py: KdaHopperCudaEngine``, ``cutile/engine.py``), quoted in the decline.
cuDNN has no per-token slots or ``num_accepted_tokens``: the speculative mode declines everywhere.
"""

from __future__ import annotations

import torch

from ..base import Verdict
from ..serving import SERVING_MODES, ServingOutput

# The SM90 engines' own words (FE 1.32), per serving argument.
HOPPER_REASONS = {
    "pool": ("KdaHopperCudaEngine: 'state_indices (pool-addressed state) is unsupported'; cuTile: 'pool-addressed "
             "state (state_indices) is FROST-only'; FROST (the engine that takes it) is Blackwell-only"),
    "checkpoints": ("KdaHopperCudaEngine: 'state_checkpoints are not produced by the Hopper kernel'; cuTile: "
                    "'per-chunk state_checkpoints output is not supported'; FROST (the engine that takes it) is "
                    "Blackwell-only"),
}


def _sm(env) -> int | None:
    capability = getattr(env, "capability", None)
    return capability[0] * 10 + capability[1] if capability else None


class CudnnServing:
    """Mixed into ``CudnnBackend`` (needs ``_call(case, inputs, extra)`` and ``_checkpoints``)."""

    null_slot = None  # reference.serving.CUDNN: every index is a real row

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        if mode == "spec":
            return Verdict.no("cuDNN FE 1.32 has no per-token state slots or num_accepted_tokens (state_indices is "
                              "[N]: one row per sequence)")
        sm = _sm(env)
        if mode in HOPPER_REASONS and sm is not None and sm < 100:
            return Verdict.no(f"cuDNN FE 1.32 on SM{sm}: {HOPPER_REASONS[mode]}")
        if mode == "checkpoints" and case.checkpoint_every % 64 and (sm is None or sm >= 100):
            return Verdict.no(f"cuDNN FE 1.32 FROST takes checkpoint_every_n_tokens as a positive multiple of 64 "
                              f"(frost/gdn_engine.py); got {case.checkpoint_every}")
        return Verdict.ok()

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        if call.mode == "pool":
            extra = {"initial_state": call.pool, "state_indices": call.state_indices.to(torch.int32),
                     "overwrite_initial_state": True, "batch_invariant": call.batch_invariant}
            out, _, _ = self._call(case, inputs, extra)
            return ServingOutput(out, pool=call.pool)
        if call.mode == "checkpoints":
            extra = {"checkpoint_every_n_tokens": call.checkpoint_every, "checkpoint_dtype": torch.float32}
            out, final, _ = self._call(case, inputs, extra)
            return ServingOutput(out, checkpoints=self._checkpoints, final_state=final)
        if call.mode == "batch_invariant":
            out, final, _ = self._call(case, inputs, {"batch_invariant": True})
            return ServingOutput(out, final_state=final)
        raise ValueError(f"cuDNN serves no {call.mode!r} mode (serving_verdict declines it)")

    def causal_rule(self, case) -> str:
        return "chunked"
