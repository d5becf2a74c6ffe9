"""vLLM's bundled FLA copy (vllm 0.33, ``vllm/third_party/flash_linear_attention``) as deltacheck backends.

``vllm-fla``            ``chunk_gated_delta_rule`` (gdn): the chunked prefill kernel vLLM's GDN layers call.
``vllm-fla-recurrent``  ``fused_recurrent_gated_delta_rule`` (gdn): the token-recurrent decode kernel.

Both are forward only. Their conventions, and what the adapter does about each (docs/libraries.md, "vLLM's FLA
copy", gives the source line of each):

- Layout ``[B, T, heads, dim]``; thd goes in as B = 1 with vLLM's int32 ``cu_seqlens``.
- Heads: q and k at H heads, v / g / beta / state at HV = G*H (value head j reads q/k head j // G, ours too).
- State VALUE-major ``[N, HV, V, K]`` in and out (upstream FLA is key-major): our initial state goes in as it
  is; the final state is transposed to the harness's key-major ``[N, HO, K, V]`` on the way out.
- g is a log-space scalar decay, beta post-activation: no in-kernel gate, no beta sigmoid (vLLM computes both
  outside, in its fused gating kernel): cases that need them are declined, never emulated.
- fused_recurrent is called as vLLM calls it (every caller: inplace_final_state=True with ssm_state_indices):
  the state is a pool ``[N + 1, HV, V, K]`` fp32, slot 0 the null block vLLM reserves, sequence n in slot
  n + 1 (our initial state copied in, widened to fp32 when bf16: exact; zeros when the case has none), and a
  ``[N, T_max]`` index of slot n + 1 for every token, so the kernel leaves each sequence's final state in its
  slot (a sequence of 0 tokens returns before touching it). Its other mode (no indices) reads sequence n's
  initial state at row ``bos`` of the buffer, a token offset, and returns per-token states in a buffer of one
  batch row's tokens (docs/libraries.md): the adapter does not use it.
"""

from __future__ import annotations

import os

import torch

from deltacheck.harness.judge.margins import with_margin
from deltacheck.harness.records.cachedir import cache_root
from deltacheck.plugin import FusedAdapter

from ..layouts import from_btd, to_btd
from ..loading import library_version
from . import facts
from .facts import CHUNK, CHUNK_MAX_K, INSTALL_HINT, RECURRENT
from .serving import VllmFlaServing, pool_table


class VllmFlaBackend(VllmFlaServing, FusedAdapter):
    """vLLM's FLA copy (its serving hook: ``serving.py``). ``module``: a namespace holding the two functions (a contract double in tests);
    default: ``vllm.third_party.flash_linear_attention.ops``, imported lazily."""

    ops = frozenset(CHUNK)
    version_key = "vllm"
    facts = facts
    dist, install, not_installed = facts.DIST, facts.INSTALL, INSTALL_HINT

    def __init__(self, module=None, *, recurrent: bool = False, importer=None):
        super().__init__(module, importer=importer)
        self.recurrent = recurrent
        self.name = "vllm-fla-recurrent" if recurrent else "vllm-fla"
        self.entry_points = RECURRENT if recurrent else CHUNK

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        if self._module is not None:
            return self._module
        # As for FLA (fla/adapter.py): Triton's binaries and autotune results in deltacheck's cache directory
        # unless the user chose otherwise; both are read when the kernels are decorated, i.e. at import.
        os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / "triton"))
        os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
        return self._importer(name)

    def version(self) -> str | None:
        return library_version(self._module, facts.DIST)

    def declared_envelopes(self, op: str):
        return facts.envelopes(self.name, op)

    def no_backward(self, case) -> str:
        return (f"vLLM's FLA copy {self.entry_points[case.op][1]} is inference only (its autograd Function has no "
                "backward); use backend 'fla' for gradients")

    # ------------------------------------------------------------------ what the copy cannot express
    def unsupported(self, case) -> str | None:
        fn = f"vLLM's FLA copy {self.entry_points[case.op][1]}"
        if case.H > case.HV:
            return f"{fn} has no GQA (H={case.H} query heads > HV={case.HV} value heads); GVA only"
        if case.HK != case.H:
            return f"{fn} needs q and k to share heads (H={case.H}, HK={case.HK})"
        if case.gate_domain == "linear":
            return f"{fn} takes g as a log-space decay only (no linear gate domain)"
        if case.safe_gate:
            return (f"{fn} has no in-kernel gate (A_log, dt_bias): vLLM computes g = -exp(A_log) * softplus(a + dt_bias) "
                    "in its own gating kernel before the call")
        if case.beta_sigmoid or case.neg_eigval:
            return f"{fn} takes beta after activation (no use_beta_sigmoid_in_kernel / allow_neg_eigval)"
        if case.beta_guard:
            return f"{fn} has no beta_guard"
        if not self.recurrent and case.K > CHUNK_MAX_K:
            return f"{fn} asserts K <= {CHUNK_MAX_K} (chunk_delta_h.py), got K={case.K}"
        if self.recurrent and case.scale is not None and case.scale <= 0:
            return f"{fn} asserts scale > 0, got {case.scale}"
        return None

    def conversion_notes(self, case) -> list[str]:
        notes = facts.first_config_notes(os.environ)
        if not self.recurrent:
            return notes
        notes += ["state pool [N + 1, HV, V, K] fp32 (slot 0 null, sequence n in slot n + 1) with ssm_state_indices "
                  "and inplace_final_state=True, as vLLM calls fused_recurrent"]
        if case.initial_state and case.state_dtype != "fp32":
            notes.append(f"initial_state widened {case.state_dtype} -> fp32 (exact) into the fp32 pool")
        return notes

    # ------------------------------------------------------------------ the call
    def run(self, case, inputs: dict):
        fn = getattr(self._import(self.entry_points[case.op][0]), self.entry_points[case.op][1])
        if self.recurrent:
            return self._run_recurrent(fn, case, inputs)
        q, k, v, g, beta = (to_btd(inputs[n], case.layout) for n in ("q", "k", "v", "g", "beta"))
        kwargs = {"scale": case.scale, "output_final_state": True, "use_qk_l2norm_in_kernel": case.l2norm,
                  # value-major [N, HV, V, K] is the copy's own orientation (chunk.py docstring, chunk_delta_h.py)
                  "initial_state": with_margin(inputs.get("initial_state"))}
        if case.layout == "thd":
            kwargs["cu_seqlens"] = inputs["cu_seqlens"]
        o, final_state = fn(q, k, v, g, beta, **kwargs)
        return from_btd(o, case.layout), final_state.transpose(-1, -2)

    def _run_recurrent(self, fn, case, inputs: dict):
        layout, N = case.layout, case.N
        q, k, v, g, beta = (to_btd(inputs[n], layout) for n in ("q", "k", "v", "g", "beta"))
        pool = torch.zeros(N + 1, case.HO, case.V, case.K, dtype=torch.float32, device=q.device)
        if inputs.get("initial_state") is not None:
            pool[1:] = inputs["initial_state"]
        slots = torch.arange(1, N + 1, dtype=torch.int32, device=q.device)
        indices = pool_table(slots, case.seqlens)
        kwargs = {"cu_seqlens": inputs["cu_seqlens"]} if layout == "thd" else {}
        o, pool = fn(q, k, v, g, beta, scale=case.scale, initial_state=pool, inplace_final_state=True,
                     ssm_state_indices=indices, use_qk_l2norm_in_kernel=case.l2norm, **kwargs)
        return from_btd(o, layout), pool[1:].transpose(-1, -2)
