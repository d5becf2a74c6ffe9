"""FlashInfer adapter: the SM90 GDN kernels (CuTe DSL), forward only (FlashInfer's GDN is inference code).

``flashinfer``         ``flashinfer.gdn_prefill.chunk_gated_delta_rule`` — packed prefill.
``flashinfer-decode``  ``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose`` — one token per call, as a
                       server decodes: the case's tokens are fed one step at a time, the state carried in a pool.

What a call goes through (FlashInfer 0.7.2; docs/libraries.md has the source lines):

1. Layout: FlashInfer's prefill takes packed THD only (``cu_seqlens`` is required). A dense case ``[B, S, ...]``
   (bshd, or sbhd / bhsd transposed to it) is the same tokens packed as B sequences of S:
   ``cu_seqlens = [0, S, 2S, ...]``. The decode takes ``[B, 1, H, D]`` per step.
2. Gates, prefill: FlashInfer takes the **linear-domain** decay ``alpha`` (``g``: "Forget gate (alpha)", float32)
   and a post-activation float32 beta. A log-space case's g is handed over as ``alpha = exp(g)`` (float32); a
   linear-domain case's g is passed as is. No beta sigmoid, neg-eig or safe gate in the prefill: declined.
   Decode: the kernel computes ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` itself
   (gdn_decode_pretranspose.py) — our safe gate with the beta sigmoid, nothing else. ``a`` (our g) and ``b`` (our
   beta logits) go in float32: the docstring says fp16/bf16, but the kernel keys its build on their dtypes and
   converts on load ("Unlike q/k/v these convert on load", gdn_decode_pretranspose.py), so nothing is rounded.
   An absent ``a_log`` goes in as zeros (exp(0) = 1), an absent ``dt_bias`` as zeros.
3. State: value-major ``[N, H, V, K]`` in and out (``gdn_prefill.py``: "The final state layout is
   [N, H, V, K]"), our orientation in, transposed to key-major out. The decode's pool is float32 (the legacy
   kernel; a bf16 initial state is widened, exactly).
"""

from __future__ import annotations

import sys

import torch

from deltacheck.plugin import FusedAdapter

from ..base import LibraryContractError
from ..loading import library_version
from . import facts
from .facts import DECODE_DIMS, ENTRY_POINTS, INSTALL_HINT, IO_DTYPES, PREFILL_DIMS
from .serving import FlashInferServing


def to_packed(x: torch.Tensor | None, case) -> torch.Tensor | None:
    """Case layout -> FlashInfer's packed ``[T, heads, *feat]``, contiguous (its kernels assert it)."""
    if x is None:
        return None
    if case.layout == "sbhd":
        x = x.transpose(0, 1)
    elif case.layout == "bhsd":
        x = x.transpose(1, 2)
    if case.layout != "thd":
        x = x.flatten(0, 1)
    return x.contiguous()


def from_packed(o: torch.Tensor, case) -> torch.Tensor:
    """FlashInfer's packed ``[T, HO, V]`` -> the case's layout (inverse of ``to_packed``)."""
    if case.layout == "thd":
        return o
    o = o.unflatten(0, (case.N, o.shape[0] // case.N))
    if case.layout == "sbhd":
        return o.transpose(0, 1)
    if case.layout == "bhsd":
        return o.transpose(1, 2)
    return o


def packed_offsets(case, device) -> torch.Tensor:
    offsets = [0]
    for length in case.seqlens:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def library_alpha(case, g: torch.Tensor) -> torch.Tensor:
    """The decay as FlashInfer's prefill reads it: alpha, linear-domain float32 (``gdn_prefill.py``: "Forget gate
    (alpha) ... Must be float32"). A log-space g is exponentiated; a linear-domain case's g already is alpha."""
    return torch.exp(g.float()) if case.gate_domain == "log" else g.float()


class FlashInferBackend(FlashInferServing, FusedAdapter):
    """FlashInfer's SM90 GDN prefill (``decode=False``) or decode (``decode=True``) as a deltacheck backend.

    ``module``: a stand-in for the entry point's module (tests/doubles/flashinfer_gdn.py); default: imported
    lazily on first use.
    """

    ops = frozenset({"gdn"})
    version_key = "flashinfer"
    facts = facts
    dist, install, not_installed = facts.DIST, facts.INSTALL, INSTALL_HINT

    def __init__(self, module=None, *, decode: bool = False, importer=None):
        super().__init__(module, importer=importer)
        self.decode = decode
        self.name = "flashinfer-decode" if decode else "flashinfer"
        self._entry = ENTRY_POINTS[self.name]
        self.entry_points = {"gdn": self._entry}
        self._served: dict = {}
        self._indices: dict[tuple, object] = {}  # _index_tensors: per (lengths, device), made once

    def _index_tensors(self, case, device, what: str):
        """The index tensors a call of ``case`` needs, made from host lists once per (lengths, device) and reused:
        a CUDA graph's capture refuses the host-to-device copy ``torch.tensor(list, device=...)`` makes ("Cannot copy
        between CPU and CUDA tensors during CUDA graph capture"), and the warm-up calls before a capture fill this.
        ``what``: "cu" (packed offsets, int32 ``[N+1]``) or "steps" (per decode step t: the packed rows of token t
        of every sequence longer than t, and those sequences' indices)."""
        key = (what, tuple(case.seqlens), str(device))
        if key not in self._indices:
            if len(self._indices) > 512:  # one L0 run holds a few hundred; keep the dict bounded
                self._indices.clear()
            if what == "cu":
                self._indices[key] = packed_offsets(case, device)
            else:
                starts = packed_offsets(case, "cpu").tolist()
                steps = []
                for t in range(max(case.seqlens, default=0)):
                    active = [n for n, length in enumerate(case.seqlens) if length > t]
                    steps.append((torch.tensor([starts[n] + t for n in active], device=device),
                                  torch.tensor(active, device=device)))
                self._indices[key] = steps
        return self._indices[key]

    def _import(self, name: str):
        if self._module is not None:
            return self._module
        self._importer(name.split(".")[0])
        return self._importer(name)

    def version(self) -> str:
        source = sys.modules.get("flashinfer") if self._module is None else self._module
        return library_version(source, facts.DIST, "unknown version")

    def _function(self):
        return getattr(self._import(self._entry[0]), self._entry[1])

    # ------------------------------------------------------------------ can it run?
    def declared_envelopes(self, op: str):
        envelope = facts.ENVELOPES[self.name]
        return [envelope] if envelope.op == op else []

    def refusal(self, op: str) -> str | None:
        if op == "gdp":
            return facts.GDP_REASON
        if op not in self.ops:
            return f"{self.name} serves ['gdn'] (FlashInfer's SM90 GDN kernels), not {op!r}"
        return None

    def unsupported(self, case) -> str | None:
        fn = self._entry[1]
        if case.io_dtype not in IO_DTYPES:
            return f"FlashInfer {fn} takes fp16/bf16 q, k, v only; the case is {case.io_dtype}"
        dims = DECODE_DIMS if self.decode else PREFILL_DIMS
        if (case.K, case.V) not in dims:
            return f"FlashInfer {fn} serves head dims (K, V) in {list(dims)} on SM90; the case has ({case.K}, {case.V})"
        if case.neg_eigval:
            return f"FlashInfer {fn} has no allow_neg_eigval"
        if self.decode:
            if case.H > case.HV:
                return (f"FlashInfer {fn} has no GQA (H={case.H} > HV={case.HV}): value head j reads q/k head "
                        "j // (HV // H) (gdn_decode_pretranspose.py)")
            if not (case.safe_gate and case.beta_sigmoid):
                return (f"FlashInfer {fn} always computes g = -exp(A_log) * softplus(a + dt_bias) and "
                        "beta = sigmoid(b) in the kernel: only cases with the safe gate and the beta sigmoid map onto it")
            return None
        if case.beta_sigmoid or case.safe_gate:
            return (f"FlashInfer {fn} takes the post-activation alpha and beta only (no beta sigmoid, no safe gate); "
                    "use backend flashinfer-decode for the in-kernel gate")
        return None

    def no_backward(self, case) -> str:
        return f"FlashInfer {self._entry[1]} is forward-only (inference kernels; no autograd)"

    def conversion_notes(self, case) -> list[str]:
        notes = []
        if case.layout != "thd":
            notes.append(f"{case.layout} packed as thd with cu_seqlens [0, S, 2S, ...]: FlashInfer takes packed tokens")
        if self.decode:
            notes.append(f"fed one token per call over {max(case.seqlens, default=0)} steps, the state in a float32 "
                         "pool indexed by sequence (initial_state_indices)")
            if case.initial_state and case.state_dtype != "fp32":
                notes.append(f"initial_state widened {case.state_dtype} -> fp32 (the decode's float32 state pool)")
        elif case.gate_domain == "log":
            notes.append("g passed as alpha = exp(g) (float32): FlashInfer takes the linear-domain decay")
        return notes

    # ------------------------------------------------------------------ what served
    def served(self) -> dict:
        """The prefill path of the last call (``{"path": "cp" | "chunked"}``), or {} for the decode."""
        return dict(self._served)

    def _prefill_path(self, num_seqs: int, heads: int, device) -> str:
        """Which SM90 prefill kernel FlashInfer routes this call to under ``use_cp="auto"``, asked of FlashInfer's own
        routing helper (``gdn_prefill.py:953-960``: context-parallel when ``num_seqs * heads`` is below its
        threshold for the SM count), not guessed."""
        helper = self._import("flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper")
        utils = self._import("flashinfer.utils")
        capability = utils.get_compute_capability(device)
        cp = capability[0] in (9, 10, 12) and helper.should_use_cp_host(
            num_seqs * heads, utils.get_device_sm_count(device), utils.get_device_name(device),
            device_capability=capability)
        return "cp" if cp else "chunked"

    # ------------------------------------------------------------------ the call
    def run(self, case, inputs: dict):
        return self._run_decode(case, inputs) if self.decode else self._run_prefill(case, inputs)

    def _run_prefill(self, case, inputs: dict):
        q, k, v, g, beta = (to_packed(inputs[n], case) for n in ("q", "k", "v", "g", "beta"))
        alpha = library_alpha(case, g)
        cu = inputs["cu_seqlens"] if case.layout == "thd" else None
        cu = self._index_tensors(case, q.device, "cu") if cu is None else cu.to(device=q.device, dtype=torch.int32)
        h0 = inputs.get("initial_state")
        h0 = None if h0 is None else h0.contiguous()
        self._served = {"path": self._prefill_path(cu.numel() - 1, case.HO, q.device)}
        got = self._function()(q, k, v, g=alpha.contiguous(), beta=beta.float().contiguous(), scale=case.scale,
                               initial_state=h0, output_final_state=True, cu_seqlens=cu,
                               use_qk_l2norm_in_kernel=case.l2norm)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise LibraryContractError(f"{self.name}: chunk_gated_delta_rule(output_final_state=True) returned "
                                       f"{type(got).__name__}, not (output, final_state)")
        out, state = got
        return from_packed(out, case), state.transpose(-1, -2).float()

    def _run_decode(self, case, inputs: dict):
        """One step per token; step t carries every sequence still longer than t (its pool slot by index)."""
        h0 = inputs.get("initial_state")
        device = inputs["q"].device
        pool = (torch.zeros(case.N, case.HO, case.V, case.K, device=device) if h0 is None
                else h0.float().contiguous().clone())  # value-major [N, HV, V, K], updated in place
        out = self._decode_steps(case, inputs, pool, torch.arange(case.N, dtype=torch.int32, device=device))
        return from_packed(out, case), pool.transpose(-1, -2)

    def _decode_steps(self, case, inputs: dict, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The decode calls over the case's tokens: call t takes token t of every sequence longer than t, sequence n
        reading and writing ``pool[slots[n]]`` in place (``slots``: int32 ``[N]``; a negative one is FlashInfer's
        padding). Returns the packed output ``[T, HO, V]``."""
        q, k, v, g, beta = (to_packed(inputs[n], case) for n in ("q", "k", "v", "g", "beta"))
        device, io = q.device, q.dtype
        a_log = inputs.get("a_log")
        a_log = torch.zeros(case.HO, device=device) if a_log is None else a_log.float().contiguous()
        dt_bias = inputs.get("dt_bias")
        dt_bias = torch.zeros(case.HO, device=device) if dt_bias is None else dt_bias.float().contiguous()
        slots = slots.to(device=device, dtype=torch.int32)
        out = None  # allocated at the first step in the dtype the kernel returns
        fn = self._function()
        for rows, active in self._index_tensors(case, device, "steps"):
            step = {name: x.index_select(0, rows).unsqueeze(1).contiguous()
                    for name, x in (("q", q), ("k", k), ("v", v), ("a", g.float()), ("b", beta.float()))}
            got = fn(step["q"], step["k"], step["v"], None, a_log, step["a"], dt_bias, step["b"], scale=case.scale,
                     use_qk_l2norm=case.l2norm, initial_state=pool,
                     initial_state_indices=slots.index_select(0, active).contiguous())
            if not (isinstance(got, tuple) and len(got) == 2):
                raise LibraryContractError(f"{self.name}: {self._entry[1]} returned {type(got).__name__}, "
                                           "not (output, state)")
            step_out = got[0].squeeze(1)
            if out is None:
                out = torch.full((q.shape[0], case.HO, case.V), float("nan"), dtype=step_out.dtype, device=device)
            out.index_copy_(0, rows, step_out)
        if out is None:  # every sequence empty: no step ran
            out = torch.empty(0, case.HO, case.V, dtype=io, device=device)
        return out
