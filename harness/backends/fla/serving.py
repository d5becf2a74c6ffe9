"""FLA 0.6's serving path, as the serving hook (harness/backends/serving.py) of the ``fla`` / ``fla-recurrent``
backends. Read from the fla-core 0.6.0 wheel (the source wins over any summary):

- Only the internal ``fused_recurrent_kda_fwd`` (``fla/ops/kda/fused_recurrent.py``) and ``fused_recurrent_gdn2_fwd``
  (``fla/ops/gdn2/fused_recurrent.py``) take ``ssm_state_indices``, ``num_accepted_tokens`` and
  ``inplace_final_state``. The public ``fused_recurrent_kda`` / ``fused_recurrent_gdn2`` call them with
  ``inplace_final_state=False`` and pass neither table on: their ``**kwargs`` swallows both silently (only
  ``transpose_state_layout`` is read). ``fused_recurrent_gated_delta_rule_fwd`` (GDN) has no serving arguments.
  So the hook calls the ``_fwd`` functions, and GDN declines.
- In-place mode: ``initial_state`` is the pool and the final state is the same tensor; the kernel reads row
  ``ssm_state_indices[n*stride_seq + (num_accepted_tokens[n] - 1)]`` and stores the state after token t at
  ``ssm_state_indices[n*stride_seq + t]`` (no token stride). ``state_v_first=True`` reads the pool value-major,
  cuDNN's ``[N_pool, HV, V, K]`` orientation, so the harness's pool goes in as it is: the very rows are written.
- 1-D tables: ``stride_seq = 1``, so for T > 1 the per-token store lands on ``ssm_state_indices[n + t]`` (the next
  sequence's entry, and past the table's end for the last sequence). The pool mode is therefore decode-only
  (every sequence of length <= 1); a prefill through a pool declines with that reason.
- No null slot: the kernel has no ``state_idx <= 0`` skip (vLLM's copy adds it), so ``null_slot = None``.
- No checkpoints, no batch-invariance promise.
"""

from __future__ import annotations

import torch

from ..base import Verdict
from ..layouts import from_btd, to_btd
from ..serving import SERVING_MODES, ServingOutput

SERVING_FWD = {"kda": ("fla.ops.kda.fused_recurrent", "fused_recurrent_kda_fwd"),
               "gdn2": ("fla.ops.gdn2.fused_recurrent", "fused_recurrent_gdn2_fwd")}


class FlaServing:
    """Mixed into ``FlaBackend`` (needs ``recurrent``, ``check``, ``_import``, ``_flags``, ``_gate_kwargs``).

    A copy of these kernels (vLLM's) reuses it by setting three class attributes: ``null_slot`` (vLLM: ``VLLM``),
    ``serving_entry`` (op -> (module, function) of its in-place entry points; a "gdn" entry is called with
    ``g=``/``beta=`` keywords) and ``pool_decode_only`` (False where the per-token store applies the token stride)."""

    null_slot = None
    serving_entry = SERVING_FWD
    pool_decode_only = True

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        if mode == "checkpoints":
            return Verdict.no("FLA 0.6 has no checkpoint_every_n_tokens (no state series output)")
        if mode == "batch_invariant":
            return Verdict.no("FLA 0.6 promises no batch invariance")
        if not self.recurrent:
            return Verdict.no("FLA 0.6 chunk_* take no ssm_state_indices / num_accepted_tokens: the serving arguments "
                              "are on fused_recurrent_kda_fwd / fused_recurrent_gdn2_fwd only (use fla-recurrent)")
        if case.op not in self.serving_entry:
            return Verdict.no("FLA 0.6 fused_recurrent_gated_delta_rule_fwd has no ssm_state_indices, "
                              "num_accepted_tokens or inplace_final_state (fla/ops/gated_delta_rule/fused_recurrent.py"
                              "); its public function's **kwargs reads only transpose_state_layout")
        if mode == "pool" and self.pool_decode_only and max(case.seqlens) > 1:
            return Verdict.no(f"FLA 0.6 {self.serving_entry[case.op][1]} stores the state after token t at "
                              "ssm_state_indices[n*stride_seq + t]: with a 1-D table and T > 1 that is the next "
                              "sequence's entry (past the table's end for the last): the 1-D pool is decode-only")
        return Verdict.ok("serving through FLA's internal _fwd (the public function drops the serving kwargs)")

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        module, attr = self.serving_entry[case.op]
        fwd = getattr(self._import(module), attr)
        q, k, v, g, beta = (to_btd(inputs[n], "thd") for n in ("q", "k", "v", "g", "beta"))
        kwargs = self._flags(case)
        kwargs.update(self._gate_kwargs(case, inputs))
        pool = call.pool
        if not pool.is_contiguous() or pool.dtype != torch.float32:
            raise ValueError("the serving pool must be contiguous fp32 (FLA asserts an fp32 state)")
        kwargs.update(initial_state=pool, inplace_final_state=True, state_v_first=True,
                      ssm_state_indices=call.state_indices.contiguous(),
                      num_accepted_tokens=call.num_accepted_tokens,
                      cu_seqlens=inputs["cu_seqlens"].to(torch.int64))
        if case.op == "gdn2":
            o, _ = fwd(q, k, v, g, beta, to_btd(inputs["w"], "thd"), **kwargs)
        elif case.op == "gdn":  # FLA's GDN signature: (q, k, v, g=None, gk=None, gv=None, beta=None, ...)
            o, _ = fwd(q, k, v, g=g, beta=beta, **kwargs)
        else:
            o, _ = fwd(q, k, v, g, beta, **kwargs)
        return ServingOutput(from_btd(o, "thd"), pool=pool)

    def graph_verdict(self, case, env) -> Verdict:
        if not getattr(env, "cuda", False):
            return Verdict.no("no CUDA: FLA's Triton kernels need a GPU to capture")
        return Verdict.ok()

    def causal_rule(self, case) -> str:
        # The chunk kernels normalize gates inside a chunk and sum masked (exactly zero) products of future tokens:
        # earlier outputs may move by one io-dtype ulp (docs/serving.md derives it); the recurrent ones not at all.
        return "bitwise" if self.recurrent else "chunked"
