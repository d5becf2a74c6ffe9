"""``fla-dispatch``: FLA exactly as a user gets it — backend dispatch on, whatever dispatch backends are installed
and enabled (FlashQLA and FlashKDA at priority 3, TileLang pieces at 5, FLA's Triton function last) — with the
implementation that served each call recorded on the result (``served.py``: from FLA's registry objects, not
from its log). ``fla-dispatch-cp``: the same under ``torch.inference_mode()`` with ``FLA_INTRACARD_CP=1``, the
lane where FLA's intra-card context parallelism splits long varlen sequences (forward only).

Everything else (layouts, state orientation, flags, declines) is the ``fla`` adapter's: this subclass changes
only what is imported and how, and what it records. docs/libraries.md ("FLA's backend dispatch") has the
source lines.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

import torch

from deltacheck.harness.records.cachedir import keep_tilelang_caches

from ..base import Verdict
from . import facts
from .adapter import DISPATCH_ENV, FlaBackend
from .served import ServedLog

INTRACARD_ENV = "FLA_INTRACARD_CP"  # fla/ops/common/backends/intracard.py:34 (default off)
CP_LANE_REASON = ("fla-dispatch-cp runs FLA under torch.inference_mode() (the only mode where FLA's intra-card CP "
                  "verifier accepts a call, fla/ops/common/backends/intracard.py:73): forward only; "
                  "use fla-dispatch for gradients")


class FlaDispatchBackend(FlaBackend):
    """FLA with dispatch on. ``module``: the op functions (a double in tests, else the real ``fla.ops``);
    ``backends_module``: ``fla.backends`` or a double of it (its registries are what ``served()`` reads)."""

    dispatch_off = False

    def __init__(self, module=None, *, backends_module=None, importer=None, inference_cp: bool = False):
        super().__init__(module, importer=importer)
        self.inference_cp = inference_cp
        self.name = "fla-dispatch-cp" if inference_cp else "fla-dispatch"
        self._backends_module = backends_module
        self._log = ServedLog()
        self._forward_served: dict = {}

    # ------------------------------------------------------------------ the library, dispatch on
    def _import_fla(self):
        # TileLang (FLA's TileLang pieces, FlashQLA) JIT-compiles with nvcc and caches the binaries: keep them with
        # deltacheck's other caches unless the user chose a place.
        keep_tilelang_caches()
        return super()._import_fla()

    def _dispatch_module(self):
        if self._backends_module is None:
            self._import_fla()
            self._backends_module = self._importer("fla.backends")
        return self._backends_module

    def _dispatch_refusal(self) -> str | None:
        """Why dispatch is off in this process (then this backend would judge plain ``fla``), or None."""
        module = self._dispatch_module()
        if getattr(module, "_DISPATCH_DISABLED", False):
            return (f"FLA's backend dispatch is off in this process: {DISPATCH_ENV}=1 was set when fla was imported "
                    f"(now {os.environ.get(DISPATCH_ENV)!r}; the 'fla' backend sets it, and FLA reads it once, "
                    "fla/backends.py:27). Fix: unset it and run fla-dispatch in a run of its own, without 'fla'")
        return None

    def _usable(self, registry: str, backend_type: str) -> bool | None:
        """Whether FLA would consider ``backend_type`` in ``registry`` (installed and enabled; its verifier still
        decides per call), by FLA's own ``is_available``/``is_enabled``; None when it is not registered."""
        found = getattr(self._dispatch_module(), "_operation_registries", {}).get(registry)
        backend = getattr(found, "_backends", {}).get(backend_type) if found is not None else None
        if backend is None:
            return None
        return bool(backend.is_available() and backend.is_enabled())

    def _hopper_guard(self) -> str | None:
        """FLA's Hopper refusal (#640) is in its Triton ``chunk_bwd_dqkwg`` only: with dispatch on, FLA routes that
        piece to TileLang where TileLang is usable (fla/ops/common/backends/tilelang/__init__.py:19), so the guard
        binds only when it is not. Conservative: a case FlashQLA serves whole (its own backward) is declined too
        when TileLang is unusable."""
        guard = super()._hopper_guard()
        if guard is None or self._usable("common", "tilelang"):
            return None
        return (f"{guard}, or install tilelang (with a usable nvcc) so FLA's dispatch serves chunk_bwd_dqkwg with "
                "its TileLang kernel; FLA_TILELANG=0 disables that")

    # ------------------------------------------------------------------ can it run?
    def envelopes(self, op: str, env=None, sm: int | None = None):
        found = super().envelopes(op, env=env, sm=sm)
        if self.inference_cp:
            return [replace(e, name=f"{e.name} (inference, intra-card CP)", backward=False) for e in found]
        return found

    def _library_verdict(self, case) -> Verdict:
        verdict = super()._library_verdict(case)
        if not verdict.runnable:
            return verdict
        refusal = self._dispatch_refusal()
        if refusal:
            return Verdict.no(refusal)
        if self.inference_cp:
            return Verdict.ok(*verdict.notes, backward=False, backward_reason=CP_LANE_REASON)
        return verdict

    # ------------------------------------------------------------------ the call
    def run(self, case, inputs: dict):
        self._log.attach(self._dispatch_module())
        self._log.clear()
        with self._lane():
            out, state = super().run(case, inputs)
        if self.inference_cp:  # leave inference mode with ordinary tensors (the harness carries the state on)
            out, state = out.clone(), state.clone()
        self._forward_served = self._log.summary(self._entry[case.op][1])
        if self.inference_cp:
            self._forward_served.update(self._intracard_split(case, inputs))
        self._log.clear()
        return out, state

    @contextlib.contextmanager
    def _lane(self):
        if not self.inference_cp:
            yield
            return
        # FLA reads FLA_INTRACARD_CP on every dispatched call (fla/backends.py:82): scoped to this call.
        before = os.environ.get(INTRACARD_ENV)
        os.environ[INTRACARD_ENV] = "1"
        try:
            with torch.inference_mode():
                yield
        finally:
            if before is None:
                os.environ.pop(INTRACARD_ENV, None)
            else:
                os.environ[INTRACARD_ENV] = before

    def _intracard_split(self, case, inputs) -> dict:
        """How many subsequences FLA's intra-card CP cut the longest sequence into, by FLA's own split rule
        (fla/ops/common/intracard_cp.py: compute_subseq_len, prepare_subseq_cu_seqlens): 0 when it ran unsplit."""
        if not any(k == "intracard_cp" for _, k in self._served_pieces()):
            return {}
        try:
            cp = self._import("fla.ops.common.intracard_cp")  # a double: its own namespace
            cu = inputs["cu_seqlens"].to("cpu", torch.int64)
            longest = int(torch.diff(cu).max())
            subseq = cp.compute_subseq_len(seq_len=longest, num_sms=cp.get_multiprocessor_count(),
                                           num_heads=case.HO, chunk_size=64)
            _, _, total = cp.prepare_subseq_cu_seqlens(cu, subseq, 64, int(os.environ.get(
                "FLA_INTRACARD_MAX_SPLITS", 32)))
        except Exception as exc:  # noqa: BLE001 - a record, never the reason a case fails
            return {"intracard_subseqs": f"not computed: {type(exc).__name__}: {exc}"}
        return {"intracard_subseqs": int(total)}

    def _served_pieces(self):
        return [tuple(c.split(" -> ")) for c in self._forward_served.get("served_calls", [])]

    def served(self) -> dict:
        """What served the last forward call (runner: the ``forward`` result's metrics)."""
        return dict(self._forward_served)

    def served_backward(self) -> dict:
        """What served the backward since the forward: FLA's dispatched backward pieces, over whoever served the
        forward (a FlashQLA forward brings FlashQLA's own backward)."""
        top = self._forward_served.get("engine", "triton").split(" + ")[0]
        got = self._log.summary(None, default=top)
        self._log.clear()
        return got


__all__ = ["CP_LANE_REASON", "INTRACARD_ENV", "FlaDispatchBackend", "facts"]
