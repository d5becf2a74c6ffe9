"""FlashQLA 0.1.3 (Qwen's fused TileLang GDN forward and backward, ``flash_qla.chunk_gated_delta_rule``) as the
``flashqla`` backend: the library called directly, as FLA's dispatch calls it (fla/ops/gated_delta_rule/backends/
flash_qla.py:131-146), not through FLA.

FlashQLA's conventions, and what the adapter does about each (docs/libraries.md "FlashQLA" has the lines):

- Layout ``[B, T, H, D]``; with ``cu_seqlens`` B must be 1 (chunk/__init__.py:429-434). Dense cases go to bshd
  (B = N), thd to B = 1 with int64 ``cu_seqlens`` (the LongTensor FLA hands it).
- Heads: GVA (``v.shape[2] % k.shape[2] == 0``, :421), q and k share heads; GQA declined.
- K = V = 128 only (hopper/fused_fwd.py:662 asserts); bf16/fp16 q, k, v of one dtype (:416-419).
- State ``[N, HV, K, V]`` key-major (``state_v_first=False``, FLA's default) in and out; fp32 out (fused_fwd.py:
  711-727 allocates the final state float32). Ours is value-major: transposed; a bf16 state is widened to fp32
  (what FLA passes, it asserts fp32), noted.
- Gate: log-space ``g`` (:343-344), cumulated inside; no in-kernel gate, no linear domain, no beta sigmoid or
  negative eigenvalues: declined, never emulated in glue code.
- ``auto_cp=True`` (its default and FLA's): FlashQLA decides intra-card CP itself for B == 1 inputs (:39-57).

Importing this module never imports FlashQLA.
"""

from __future__ import annotations

import importlib.metadata

import torch

from deltacheck.harness.records.cachedir import keep_tilelang_caches
from deltacheck.plugin import FusedAdapter

from ..layouts import from_btd, state_to_key_major_fp32, state_widened_to_fp32, to_btd
from . import facts

TILELANG_CACHE_ENV = "TILELANG_CACHE_DIR"  # one of cachedir.TILELANG_CACHES


class FlashQlaBackend(FusedAdapter):
    """``module``: a namespace holding ``chunk_gated_delta_rule`` (a contract double in tests); default: the real
    ``flash_qla``, imported lazily with TileLang's kernel cache under deltacheck's cache directory."""

    name = "flashqla"
    ops = frozenset({"gdn"})
    version_key = "flash_qla"
    facts = facts
    dist, install, not_installed = facts.DIST, facts.INSTALL, facts.INSTALL_HINT
    entry_points = {"gdn": (facts.MODULE, facts.ENTRY)}

    def _import(self, name: str):
        if self._module is not None:
            return self._module
        keep_tilelang_caches()
        return self._importer(name)

    def version(self) -> str | None:
        # Not loading.library_version: a module (a double) without __version__ reports 'unknown version' here.
        if self._module is not None:
            return str(getattr(self._module, "__version__", "unknown version"))
        try:
            return importlib.metadata.version(facts.DIST)
        except importlib.metadata.PackageNotFoundError:
            return None

    # ------------------------------------------------------------------ can it run?
    def declared_envelopes(self, op: str):
        return facts.envelopes(op)

    def unsupported(self, case) -> str | None:
        if case.H > case.HV:
            return (f"FlashQLA has no GQA (H={case.H} query heads > HV={case.HV} value heads); it needs HV a "
                    "multiple of H (chunk/__init__.py:421)")
        if case.HK != case.H:
            return f"FlashQLA needs q and k to share heads (H={case.H}, HK={case.HK})"
        if case.K != facts.HEAD_DIM or case.V != facts.HEAD_DIM:
            return (f"FlashQLA's kernels assert K == V == 128 (hopper/fused_fwd.py:662), this case has "
                    f"K={case.K}, V={case.V}")
        if case.io_dtype not in facts.IO_DTYPES:
            return f"FlashQLA takes bf16 or fp16 q/k/v (chunk/__init__.py:417), not {case.io_dtype}"
        if case.gate_domain == "linear":
            return "FlashQLA takes a log-space gate only (g 'in log space', chunk/__init__.py:343-344)"
        if case.safe_gate:
            return "FlashQLA has no in-kernel gate (no use_gate_in_kernel / A_log / dt_bias)"
        if case.beta_sigmoid or case.neg_eigval:
            return "FlashQLA takes beta post-activation: no use_beta_sigmoid_in_kernel / allow_neg_eigval"
        if case.beta_guard:
            return "FlashQLA has no beta_guard (cuDNN's erase-side safeguard)"
        return None

    def conversion_notes(self, case) -> list[str]:
        if case.initial_state and case.state_dtype != "fp32":
            return [f"initial_state cast {case.state_dtype} -> fp32 (the dtype FLA hands FlashQLA) and "
                    "transposed [N, HO, V, K] -> [N, HV, K, V]"]
        return []

    # ------------------------------------------------------------------ the call
    def causal_rule(self, case) -> str:
        # A chunked TileLang kernel (FLA's chunk algorithm): the causality check's one-ulp rule for chunked kernels
        # (docs/serving.md), not the recurrent kernels' bitwise one. No graph_verdict: thd with auto_cp reads
        # cu_seqlens on the host, and the check declines on the capture error FlashQLA raises, in its words.
        return "chunked"

    def run(self, case, inputs: dict):
        fn = getattr(self._import(facts.MODULE), facts.ENTRY)
        layout = case.layout
        q, k, v, g, beta = (to_btd(inputs[n], layout) for n in ("q", "k", "v", "g", "beta"))
        cu_seqlens = inputs["cu_seqlens"].to(torch.int64) if layout == "thd" else None
        h0 = state_to_key_major_fp32(inputs.get("initial_state"))
        o, final_state = fn(q, k, v, g, beta, scale=case.scale, initial_state=h0, output_final_state=True,
                            use_qk_l2norm_in_kernel=case.l2norm, cu_seqlens=cu_seqlens, state_v_first=False,
                            auto_cp=True)
        return from_btd(o, layout), state_widened_to_fp32(final_state)
