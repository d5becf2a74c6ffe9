"""jax-linear-attention adapter (``jax``): ``jla.ops.linear_attention(kind, q, k, v, impl="mosaic_gpu", ...)``,
the Pallas Mosaic GPU kernels for Hopper, called from torch through DLPack (``bridge.py``); gradients are JAX's
own (``jax.vjp`` through the kernels' custom VJPs).

What a call goes through (jla 0.1.0; docs/libraries.md has the source lines):

1. Layout: jla takes FLA's ``[B, T, H, D]``. bshd as is, sbhd / bhsd transposed. thd: jla takes no
   ``cu_seqlens`` (``scalar_gate.py`` "cu_seqlens is not supported"); one sequence becomes ``B = 1`` and several
   sequences of one length become a batch ``[N, L, H, D]`` (the same tokens, exactly); unequal lengths are
   declined (``segment_ids`` restarts the state but cannot give each sequence its own initial and final state).
2. Heads: q and k at H heads, v, the gates and the state at HV = G*H (GVA; ``scalar_gate.py``: value heads a
   multiple of key heads). KDA and GDN2 need one head count (``vector_gate_ops.py``: ``v.shape[:3] ==
   q.shape[:3]``). GQA (H > HV) is declined.
3. Gates: g is the log-space decay, as ours (``reference.py`` docstring); GDN2's erase gate ``b`` is our beta
   ``[T, H, K]`` and ``w`` the write gate. GDP: k, v, beta hold ``num_householder`` consecutive rows per token
   (FLA's layout, as ours). jla has no beta sigmoid, neg-eig, safe gate or linear gate: declined, never
   emulated here.
4. State: key-major ``[B, H, K, V]`` in and out (``reference.py``; the kernels cast it to fp32): our value-major
   ``[N, HO, V, K]`` initial state is transposed in; the final state comes back key-major float32.

``check`` declines from our reading of the kernels' ``unsupported_reason`` (facts.py); a call the kernel still
refuses raises its ``ValueError`` ("mosaic_gpu ...: <reason>"), an error result against our declaration rather
than a silent fallback (``impl="mosaic_gpu"`` by name, never ``"auto"``). Importing this module never imports JAX.
"""

from __future__ import annotations

import sys

import torch

from deltacheck.plugin import FusedAdapter

from ..base import LibraryContractError, Verdict
from ..loading import library_version
from . import bridge, facts
from .facts import HEAD_DIMS, INSTALL_HINT, IO_DTYPES, KINDS

GRAPH_REASON = ("not capturable by torch.cuda.CUDAGraph: XLA launches jla's kernels on its own CUDA streams, and the "
                "DLPack hand-off synchronizes the device each way (torch.cuda.synchronize before JAX reads, "
                "block_until_ready before torch does; bridge.py), which stream capture forbids; JAX's CUDA graphs "
                "are XLA command buffers inside jit, not a graph the caller can capture and replay")
_FLAG_WORDS = {"beta_sigmoid": "a beta sigmoid", "neg_eigval": "allow_neg_eigval", "safe_gate": "a safe gate",
               "beta_guard": "beta_guard"}


def to_btd(x: torch.Tensor, case) -> torch.Tensor:
    """Case layout -> jla's ``[B, T, heads, *feat]``: thd with N equal-length sequences -> ``[N, L, ...]``
    (GDP's k, v, beta: ``L * num_householder`` rows per sequence)."""
    if case.layout == "thd":
        return x.reshape(case.N, x.shape[0] // case.N, *x.shape[1:])
    if case.layout == "sbhd":
        return x.transpose(0, 1)
    if case.layout == "bhsd":
        return x.transpose(1, 2)
    return x


def from_btd(o: torch.Tensor, case) -> torch.Tensor:
    """jla's ``[B, T, HV, V]`` -> the case's layout (inverse of ``to_btd``)."""
    if case.layout == "thd":
        return o.reshape(o.shape[0] * o.shape[1], *o.shape[2:])
    if case.layout == "sbhd":
        return o.transpose(0, 1)
    if case.layout == "bhsd":
        return o.transpose(1, 2)
    return o


def library_gate(case, g: torch.Tensor) -> torch.Tensor:
    """The decay as jla reads it: the log-space g, which is ours (linear-domain cases are declined)."""
    return g


def library_state(h0: torch.Tensor | None) -> torch.Tensor | None:
    """Our value-major ``[N, HO, V, K]`` initial state -> jla's key-major ``[N, HO, K, V]`` (dtype kept: the
    kernels cast it to float32 themselves)."""
    return None if h0 is None else h0.transpose(-1, -2)


class JaxBackend(FusedAdapter):
    """jax-linear-attention's Mosaic GPU kernels as a deltacheck backend.

    ``module``: a stand-in for the ``jla.ops`` module (tests/doubles/jax_la.py); ``jax``: a stand-in for the
    ``jax`` module. Default: both imported lazily on first use, JAX configured first (``bridge.configure_jax``).
    """

    name = "jax"
    ops = frozenset(KINDS)
    version_key = "jax_linear_attention"
    facts = facts
    dist, install, not_installed = facts.DIST, facts.INSTALL, INSTALL_HINT
    entry_points = {op: (facts.MODULE, facts.ENTRY_POINT) for op in KINDS}

    def __init__(self, module=None, *, jax=None, importer=None):
        super().__init__(module, importer=importer)
        self._jax = jax
        self._jitted: dict[tuple, object] = {}

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        if self._module is not None:
            return self._module
        self._jax_module()  # JAX configured before jla imports it
        self._importer(name.split(".")[0])
        return self._importer(name)

    def _jax_module(self):
        if self._jax is None:
            self._jax = bridge.configure_jax(self._importer)
        return self._jax

    def version(self) -> str:
        source = sys.modules.get("jla") if self._module is None else self._module
        return library_version(source, facts.DIST, "unknown version")

    def _ops(self):
        return self._import(facts.MODULE)

    # ------------------------------------------------------------------ can it run?
    def declared_envelopes(self, op: str):
        return [facts.ENVELOPES[op]] if op in facts.ENVELOPES else []

    def unsupported(self, case) -> str | None:
        """What jla's entry point cannot express for this case (our reading of its source), or None."""
        kind = KINDS[case.op][0]
        on = [word for flag, word in _FLAG_WORDS.items() if getattr(case, flag)]
        if case.gate_domain == "linear":
            on.append("gate_domain='linear'")
        if on:
            return (f"jla {kind} cannot express {', '.join(on)}: linear_attention takes the post-activation beta "
                    "and a log-space g only (jla/ops/reference.py); apply them in the model before the call")
        if case.H > case.HV or case.HK != case.H:
            return (f"jla {kind} has no GQA (H/HK/HV = {case.H}/{case.HK}/{case.HV}): q and k share one shape and "
                    "v carries a multiple of their heads (scalar_gate.py unsupported_reason)")
        if case.op in ("kda", "gdn2") and case.HV != case.H:
            return f"jla {kind} has no GVA: q, k, v and the gates share one head count (vector_gate_ops.py)"
        if case.layout == "thd" and len(set(case.seqlens)) > 1:
            return (f"jla takes no cu_seqlens and these sequences differ in length {list(case.seqlens)}: "
                    "segment_ids would restart the state but give no per-sequence initial or final state "
                    "(scalar_gate.py unsupported_reason); only equal lengths map onto a batch")
        if (case.K, case.V) not in HEAD_DIMS[case.op]:
            return f"jla {kind} serves head dims (K, V) in {sorted(HEAD_DIMS[case.op])}; the case has ({case.K}, {case.V})"
        if case.io_dtype not in IO_DTYPES[case.op]:
            return f"jla {kind} takes q, k, v in {IO_DTYPES[case.op]} only; the case is {case.io_dtype}"
        if case.op in ("kda", "gdn2") and (case.H * case.K) % 128:
            return f"jla {kind} needs H * K a multiple of 128 (vector_gate_ops.py SCAN_WIDTH); H*K = {case.H * case.K}"
        return None

    def conversion_notes(self, case) -> list[str]:
        notes = []
        if case.layout == "thd" and case.N > 1:
            notes.append(f"thd of {case.N} equal-length sequences passed as a batch [N, L, ...]: jla has no cu_seqlens")
        if case.initial_state:
            notes.append("initial_state transposed [N, HO, V, K] -> [N, HO, K, V] (jla's key-major state)")
        return notes

    def graph_verdict(self, case, env) -> Verdict:
        """The graph-replay check's question (docs/serving.md): a ``torch.cuda.CUDAGraph`` cannot hold this call."""
        return Verdict.no(GRAPH_REASON)

    def causal_rule(self, case) -> str:
        # jla's Mosaic GPU kernels are chunked (mosaic_gpu/gated_delta_rule.py, kda.py: chunk_size 64, adapted from
        # FLA's chunk kernels): the causality check's one-ulp rule for chunked kernels (docs/serving.md).
        return "chunked"

    # ------------------------------------------------------------------ the call
    def _function(self, case):
        """The jitted JAX function of the arrays for this configuration (static flags bound once)."""
        key = (case.op, case.l2norm, case.scale, case.num_householder, case.initial_state)
        if key not in self._jitted:
            jax, ops = self._jax_module(), self._ops()
            kind, gate_names = KINDS[case.op]
            options = {"impl": facts.IMPL, "scale": case.scale, "output_final_state": True,
                       "use_qk_l2norm": case.l2norm}
            if case.op == "gdp":
                options["num_householder"] = case.num_householder

            def fn(q, k, v, h0, *gates):
                return ops.linear_attention(kind, q, k, v, initial_state=h0, **dict(zip(gate_names, gates)), **options)

            self._jitted[key] = jax.jit(fn)
        return self._jitted[key]

    def run(self, case, inputs: dict):
        jax = self._jax_module()
        names = ("q", "k", "v", "g", "beta") + (("w",) if case.op == "gdn2" else ())
        tensors = {n: to_btd(inputs[n], case) for n in names}
        tensors["g"] = library_gate(case, tensors["g"])
        h0 = library_state(inputs.get("initial_state"))
        gates = [tensors[n] for n in names[3:]]
        got = bridge.call(jax, self._function(case), tensors["q"], tensors["k"], tensors["v"], h0, *gates)
        out, state = got
        if state is None or state.dim() != 4:
            raise LibraryContractError(f"jax: jla {KINDS[case.op][0]} asked for the final state and returned "
                                       f"{None if state is None else tuple(state.shape)}")
        state = state.float() if state.dtype in (torch.bfloat16, torch.float16) else state
        return from_btd(out, case), state
