"""FlashKDA's forward as deltacheck backends: ``flashkda`` (the op vLLM 0.33 ships) and ``flashkda-tokenspeed``
(the standalone wheel). One kernel, two builds and two call forms:

    torch.ops._flashkda_C.fwd(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound,
                              initial_state, final_state, cu_seqlens, checkpoint_state, checkpoint_offsets)
    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                  initial_state=None, final_state=None, cu_seqlens=None)     # allocates the workspace itself

Conventions (docs/libraries.md, "FlashKDA", has the source of each) and what the adapter does:

- ``[B, T, H, 128]`` bf16, contiguous, q/k/v/g at one head count (no GQA/GVA); thd as B = 1 with cu_seqlens
  (int32 as vLLM passes it to the vLLM op; the standalone build checks for int64); dense layouts as B = N.
- Always in the kernel: l2-normalized q and k, sigmoid of the beta logits, the bounded gate
  ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` with A_log fp32 [H] and dt_bias fp32 [H, K], both
  required: a missing a_log is passed as 0 (exp(0) = 1) and a missing dt_bias as 0, identities. Cases without
  these flags are declined, never emulated.
- g and beta must be bf16: our fp32 ones are rounded to bf16 (noted), as vLLM's projections hand them over.
- State VALUE-major ``[N, H, V, K]``, bf16 or fp32, the same dtype in and out: a bf16 initial state is widened
  to fp32 (exact) so the final state comes back in fp32; transposed to key-major on the way out.
- ``out`` and ``final_state`` are buffers the kernel writes; the vLLM op also takes a uint8 workspace of
  ``get_workspace_size(T_total, H, N)`` bytes (vLLM sizes it the same way).
- The vLLM op's ``checkpoint_state`` / ``checkpoint_offsets``: None in ``run``; the serving hook's "checkpoints"
  mode passes them (serving.py).
"""

from __future__ import annotations

import torch

from deltacheck.harness.judge.margins import with_margin
from deltacheck.plugin import FusedAdapter

from ..base import Verdict
from ..layouts import from_btd, to_btd
from ..loading import library_version
from . import facts
from .facts import HEAD_DIM, STANDALONE, VLLM
from .serving import FlashKdaServing


class FlashKdaBackend(FlashKdaServing, FusedAdapter):
    """``flavour``: ``facts.VLLM`` or ``facts.STANDALONE``. ``module``: the object holding ``fwd`` and
    ``get_workspace_size`` (a contract double in tests); default: ``torch.ops._flashkda_C`` after importing
    ``vllm._flashkda_C``, or the ``flash_kda`` module."""

    ops = frozenset({"kda"})
    facts = facts

    def __init__(self, flavour: str = VLLM, module=None, *, importer=None, probe_device: str | None = "cuda"):
        if flavour not in (VLLM, STANDALONE):
            raise ValueError(f"unknown FlashKDA flavour {flavour!r}")
        super().__init__(module, importer=importer)
        self.name = flavour
        self.version_key = facts.VERSION_KEYS[flavour]
        self.dist, self.install = facts.DISTS[flavour], facts.INSTALL[flavour]
        self.not_installed = f"{self.dist} is not installed; {self.install}"
        self.entry_points = {"kda": (facts.MODULES[flavour], "fwd")}
        self._probe_device = probe_device  # where the standalone build's ABI probe runs (tests: "cpu")
        self._abi: Verdict | None = None

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        if self._module is not None:
            return self._module
        module = self._importer(name)
        # The vLLM build's module is only the carrier of its torch.ops registrations.
        return torch.ops._flashkda_C if self.name == VLLM else module

    def version(self) -> str | None:
        return library_version(self._module, self.dist)

    def declared_envelopes(self, op: str):
        return facts.envelopes(self.name, op)

    def accepted(self, case) -> Verdict:
        if self.name == STANDALONE:
            abi = self._abi_probe()
            if not abi.runnable:
                return abi
        return super().accepted(case)

    def no_backward(self, case) -> str:
        return "FlashKDA is a forward kernel (no autograd); use fla or cudnn for gradients"

    def _abi_probe(self) -> Verdict:
        """Once per process: one token through the standalone build. Its pybind11 module is compiled against one
        libtorch's C++ headers and reads TensorImpl's fields inline; under another torch its first check fails on
        CUDA tensors ("all tensors must be on CUDA", flash_kda.cpp:44), as measured on torch 2.11 (docs/libraries.md)."""
        if self._abi is None:
            self._abi = Verdict.ok()
            device = self._probe_device
            if device == "cuda" and not torch.cuda.is_available():
                return self._abi
            if device is None:
                return self._abi
            bf16, f32 = torch.bfloat16, torch.float32
            x = torch.zeros(1, 1, 1, HEAD_DIM, dtype=bf16, device=device)
            try:
                self._import(facts.MODULES[STANDALONE]).fwd(
                    x, x.clone(), x.clone(), x.clone(), torch.zeros(1, 1, 1, dtype=bf16, device=device), 1.0,
                    torch.empty_like(x), torch.zeros(1, dtype=f32, device=device),
                    torch.zeros(1, HEAD_DIM, dtype=f32, device=device), -1.0)
            except RuntimeError as exc:
                if "must be on CUDA" not in str(exc):
                    raise
                self._abi = Verdict.no(
                    f"{STANDALONE}: its flash_kda_C extension rejects CUDA tensors as not on CUDA ('all tensors must "
                    f"be on CUDA' on a one-token probe): it was built against another libtorch than this torch "
                    f"{torch.__version__} and reads TensorImpl's fields at that torch's offsets. Fix: install the "
                    "torch the wheel was built with, or build FlashKDA from source against this torch "
                    "(FLASH_KDA_CUDA_ARCHS=all pip install --no-build-isolation .); vLLM's stable-ABI build, backend "
                    "'flashkda', runs the same kernel")
        return self._abi

    # ------------------------------------------------------------------ what FlashKDA cannot express
    def unsupported(self, case) -> str | None:
        who = f"FlashKDA ({self.name})"
        if case.K != HEAD_DIM or case.V != HEAD_DIM:
            return f"{who} requires K = V = {HEAD_DIM} (got K={case.K}, V={case.V})"
        if not (case.H == case.HK == case.HV):
            return f"{who} takes q, k, v and g at one head count (H={case.H}, HK={case.HK}, HV={case.HV})"
        if case.io_dtype != "bf16":
            return f"{who} takes bf16 q/k/v only (got {case.io_dtype})"
        if not case.safe_gate:
            return (f"{who} always computes the bounded gate lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) "
                    "in-kernel; it cannot take a log-space or linear decay")
        if not case.l2norm:
            return f"{who} always l2-normalizes q and k in-kernel (no switch)"
        if not case.beta_sigmoid or case.neg_eigval:
            return (f"{who} always takes beta as logits and applies sigmoid in-kernel"
                    + (" (no allow_neg_eigval)" if case.neg_eigval else ""))
        if case.beta_guard:
            return f"{who} has no beta_guard"
        low, high = facts.LOWER_BOUND_RANGE
        bound = case.support.gate_lower_bound
        if bound is None or not (low <= bound <= high):
            return f"{who} expects lower_bound in [{low}, {high}], the case's is {bound}"
        return None

    def conversion_notes(self, case) -> list[str]:
        notes = ["g and beta rounded fp32 -> bf16 (FlashKDA checks 'g must be bfloat16', 'beta must be bfloat16')"]
        if not case.a_log:
            notes.append("no a_log: A_log = 0 passed (exp(0) = 1, the same gate; FlashKDA requires A_log)")
        if not case.dt_bias:
            notes.append("no dt_bias: dt_bias = 0 passed (the same gate; FlashKDA requires dt_bias)")
        if case.initial_state and case.state_dtype != "fp32":
            notes.append(f"initial_state widened {case.state_dtype} -> fp32 (exact): FlashKDA returns the final "
                         "state in the initial state's dtype")
        return notes

    def causal_rule(self, case) -> str:
        # A chunked kernel (its bf16 state is carried between chunks, docs/libraries.md): the causality check's
        # one-ulp rule for chunked kernels (docs/serving.md), not the recurrent kernels' bitwise one.
        return "chunked"

    # ------------------------------------------------------------------ the call
    def run(self, case, inputs: dict):
        out, final_state = self._fwd(case, inputs)
        return from_btd(out, case.layout), final_state.transpose(-1, -2)

    def _fwd(self, case, inputs: dict, checkpoint_state=None, checkpoint_offsets=None):
        """One FlashKDA forward: ``(out [B, T, H, 128] bf16, final_state [N, H, V, K] fp32)``; the checkpoint pair
        goes to the vLLM op's last two arguments (serving.py)."""
        ops = self._import(facts.MODULES[self.name])
        layout, bf16 = case.layout, torch.bfloat16
        q, k, v = (to_btd(inputs[n], layout) for n in ("q", "k", "v"))
        g = with_margin(to_btd(inputs["g"], layout), bf16)
        beta = with_margin(to_btd(inputs["beta"], layout), bf16)
        device = q.device
        B, T, H = q.shape[0], q.shape[1], q.shape[2]
        N = case.N
        a_log, dt_bias = inputs.get("a_log"), inputs.get("dt_bias")
        a_log = torch.zeros(H, device=device) if a_log is None else a_log
        dt_bias = torch.zeros(H, HEAD_DIM, device=device) if dt_bias is None else dt_bias
        a_log = with_margin(a_log, torch.float32)
        dt_bias = with_margin(dt_bias.reshape(H, HEAD_DIM), torch.float32)
        h0 = with_margin(inputs.get("initial_state"), torch.float32)
        final_state = torch.empty(N, H, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device=device)
        out = torch.empty(B, T, H, HEAD_DIM, dtype=bf16, device=device)
        cu_seqlens = inputs["cu_seqlens"] if layout == "thd" else None
        scale = float(case.scale if case.scale is not None else HEAD_DIM ** -0.5)
        bound = float(case.support.gate_lower_bound)
        if self.name == VLLM:
            workspace = torch.empty(ops.get_workspace_size(B * T, H, N), dtype=torch.uint8, device=device)
            ops.fwd(q, k, v, g, beta, scale, out, workspace, a_log, dt_bias, bound, h0, final_state, cu_seqlens,
                    checkpoint_state, checkpoint_offsets)
        else:
            if checkpoint_state is not None:
                raise ValueError(f"{STANDALONE}'s fwd takes no checkpoint arguments (serving_verdict declines it)")
            cu_seqlens = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
            ops.fwd(q, k, v, g, beta, scale, out, a_log, dt_bias, bound, initial_state=h0, final_state=final_state,
                    cu_seqlens=cu_seqlens)
        return out, final_state
