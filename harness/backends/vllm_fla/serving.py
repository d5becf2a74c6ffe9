"""vLLM 0.33's FLA copy on the serving path: the serving hook (harness/backends/serving.py) of ``vllm-fla`` and
``vllm-fla-recurrent``. Read from the vllm 0.33.0 wheel, ``vllm/third_party/flash_linear_attention/ops/
fused_recurrent.py`` (``fused_recurrent_gated_delta_rule_fwd_kernel`` and its wrapper); the source wins:

- Only ``fused_recurrent_gated_delta_rule`` takes the serving arguments, on its public signature (no ``**kwargs``
  that could swallow them): ``ssm_state_indices``, ``num_accepted_tokens``, ``inplace_final_state``.
  ``chunk_gated_delta_rule`` takes none (vLLM gathers a prefill's states out of the pool itself).
- The pool is ``initial_state`` read value-major, ``[slots, HV, V, K]``, fp32, through ``stride(0)``: the
  harness's pool goes in as it is and, with ``inplace_final_state=True``, the final state is that very tensor.
- Start slot: ``ssm_state_indices[n*stride_seq + (num_accepted_tokens[n] - 1)]`` (``+ 0`` without the counts);
  the state after token t goes to ``ssm_state_indices[n*stride_seq + t]``. ``stride_seq`` is ``stride(0)`` of the
  table; the token stride the wrapper computes is passed to the kernel and never used. So a 1-D table (vLLM's
  decode call, one token per sequence) with a sequence of T > 1 tokens stores into the NEXT sequence's entry (and
  past the table for the last sequence), and a ``[N, T]`` table must be contiguous in its token axis.
- Null block: a start slot ``<= 0`` returns before any output is stored or any state read (``NULL_BLOCK_ID = 0``);
  a per-token slot ``<= 0`` skips that one store. Null sequences' outputs are left unwritten (``new_empty``).
- A sequence of 0 tokens returns before touching anything.
- No checkpoints, no batch-invariance promise.

What the hook does with that: ``pool`` mode passes the 1-D table when every sequence has at most one token
(vLLM's own decode call) and otherwise the ``[N, T_max]`` table with the sequence's row at every token, made
contiguous (each token's state lands in the sequence's own row; the last store is the final state); ``spec`` mode
passes the ``[N, T_max]`` table and the counts as they are.
"""

from __future__ import annotations

import torch

from deltacheck.reference import serving as sv

from ..base import Verdict
from ..layouts import from_btd, to_btd
from ..serving import SERVING_MODES, ServingOutput


def pool_table(state_indices: torch.Tensor, seqlens) -> torch.Tensor:
    """The ``ssm_state_indices`` a pool-mode call passes: the 1-D table for a decode batch (every sequence <= 1
    token), else each sequence's row repeated over ``T_max`` tokens, contiguous (the kernel ignores the token
    stride, so an expanded view with stride 0 would be read as the next entries)."""
    width = max(max(seqlens, default=0), 1)
    if width == 1:
        return state_indices.contiguous()
    return state_indices[:, None].expand(len(seqlens), width).contiguous()


class VllmFlaServing:
    """Mixed into ``VllmFlaBackend`` (needs ``recurrent``, ``entry_points``, ``_import``)."""

    null_slot = sv.VLLM

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        if mode == "checkpoints":
            return Verdict.no("vLLM 0.33's FLA copy has no checkpoint_every_n_tokens (no state series output)")
        if mode == "batch_invariant":
            return Verdict.no("vLLM 0.33's FLA copy promises no batch invariance")
        if not self.recurrent:
            return Verdict.no("vLLM 0.33's chunk_gated_delta_rule takes no ssm_state_indices / num_accepted_tokens "
                              "(ops/chunk.py): vLLM gathers a prefill's initial states out of its pool before the call; "
                              "the serving arguments are on fused_recurrent_gated_delta_rule (vllm-fla-recurrent)")
        return Verdict.ok("fused_recurrent_gated_delta_rule with inplace_final_state=True, ssm_state_indices and "
                          "num_accepted_tokens, as vLLM's GDN layer calls it")

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        module, attr = self.entry_points[case.op]
        fn = getattr(self._import(module), attr)
        pool = call.pool
        if not pool.is_contiguous() or pool.dtype != torch.float32:
            raise ValueError("the serving pool must be contiguous fp32 (vLLM's ssm state pool)")
        if call.mode == "pool":
            table = pool_table(call.state_indices, case.seqlens)
        elif call.mode == "spec":
            table = call.state_indices.contiguous()
        else:
            raise ValueError(f"vLLM's FLA copy serves no {call.mode!r} mode (serving_verdict declines it)")
        q, k, v, g, beta = (to_btd(inputs[n], "thd") for n in ("q", "k", "v", "g", "beta"))
        o, final = fn(q, k, v, g, beta, scale=case.scale, initial_state=pool, inplace_final_state=True,
                      cu_seqlens=inputs["cu_seqlens"], ssm_state_indices=table,
                      num_accepted_tokens=call.num_accepted_tokens, use_qk_l2norm_in_kernel=case.l2norm)
        return ServingOutput(from_btd(o, "thd"), pool=final)

    def graph_verdict(self, case, env) -> Verdict:
        if not getattr(env, "cuda", False):
            return Verdict.no("no CUDA: vLLM's FLA copy is Triton kernels; a graph needs a GPU to capture")
        return Verdict.ok()

    def causal_rule(self, case) -> str:
        # chunk_gated_delta_rule normalizes gates inside a chunk (docs/serving.md derives the one-ulp rule);
        # fused_recurrent stores each output before it reads the next token: bitwise.
        return "bitwise" if self.recurrent else "chunked"
