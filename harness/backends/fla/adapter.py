"""flash-linear-attention (FLA 0.6) adapters.

``fla``            the chunked training kernels with autograd: ``chunk_gated_delta_rule`` (gdn),
                   ``chunk_kda`` (kda), ``chunk_gdn2`` (gdn2).
``fla-recurrent``  the token-recurrent inference kernels ``fused_recurrent_*``: a second, independent FLA
                   implementation to cross-check the first; forward only.

FLA's conventions, and what the adapter does about each:

- Layout ``[B, T, heads, dim]``. Dense cases go to bshd (B = N); thd cases become B = 1 with int64
  ``cu_seqlens`` (FLA refuses B > 1 with cu_seqlens).
- Heads: GVA only — q and k share H heads and v/gates/state have HV = G*H heads (value head j reads q/k
  head j // G, the same grouping as cuDNN). GQA (H > HV) is declined; ``chunk_gdn2`` has no GVA either.
- State ``[N, HV, K, V]`` key-major, fp32 in (asserted by FLA) and out. Our inputs carry the state
  value-major ``[N, HO, V, K]``: transposed here; a bf16 state is widened to fp32 (exact, noted).
- Flags FLA does not have are declined, never emulated in glue code: we test the kernel, not our glue.
  (``gate_domain='linear'``: no op; ``chunk_gdn2``/``fused_recurrent_gdn2``: no beta sigmoid.)
- ``FLA_DISABLE_BACKEND_DISPATCH=1`` is set before FLA is imported, so FLA cannot reroute an op to
  another package's kernel; it is read once, at import, so an earlier import is recorded in the notes.
- FLA's own refusal — the GDN backward on Hopper with 3.4.0 <= Triton < 3.7.1 (its issue #640) — is
  read from FLA's own flags and becomes ``backward=False`` with the reason, not a crash.

Our floors and the entry points live beside this file, in ``facts.py``.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

from deltacheck.plugin import floors_then_library

from ..base import Verdict
from ..layouts import from_btd, state_to_key_major_fp32, state_widened_to_fp32, to_btd
from ..loading import Library, library_version, load_entry_point
from . import facts, winners
from .facts import CHUNK, INSTALL_HINT, RECURRENT
from .serving import FlaServing

DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"


class FlaBackend(FlaServing):
    """FLA's kernels as a deltacheck backend. ``recurrent=True`` selects the fused_recurrent_* family.

    ``module``: a namespace holding the FLA functions by name (a contract double in tests; it may also
    carry FLA's Hopper-guard flags ``IS_NVIDIA_HOPPER``, ``TRITON_ABOVE_3_4_0``, ``TRITON_ABOVE_3_7_1``
    and ``__version__``). Default: the real modules, imported lazily.
    """

    ops = frozenset(CHUNK)

    version_key = "fla"  # Env.versions key of the distribution (environment.VERSION_KEYS)
    dispatch_off = True  # set FLA_DISABLE_BACKEND_DISPATCH=1 before importing FLA (fla-dispatch: False)

    def __init__(self, module=None, *, recurrent: bool = False, importer=None):
        self._module = module
        self._importer = importer or importlib.import_module
        self.recurrent = recurrent
        self.name = "fla-recurrent" if recurrent else "fla"
        self._entry = RECURRENT if recurrent else CHUNK
        self._import_notes: tuple[str, ...] = ()

    # ------------------------------------------------------------------ the library
    def _import_fla(self):
        """Import FLA with backend dispatch off (note it when that cannot be guaranteed), Triton's cache (with its
        autotune results) in deltacheck's cache directory unless the user chose otherwise, and recorded autotune
        winners applied."""
        already = "fla" in sys.modules
        if self.dispatch_off:
            os.environ.setdefault(DISPATCH_ENV, "1")
        os.environ.setdefault("TRITON_CACHE_DIR", str(winners.cache_root() / "triton"))
        # Triton caches binaries, but by default re-benchmarks every autotune config in each new process: a warm
        # cache then still pays FLA's autotuning in every worker. This keeps the results beside the binaries
        # (read when the kernels are decorated, so it must be set before FLA is imported).
        autotune_cache_was_set = "TRITON_CACHE_AUTOTUNING" in os.environ
        os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
        fla = self._importer("fla")
        notes = list(_apply_winners()) if self._module is None else []
        if self.dispatch_off and os.environ.get(DISPATCH_ENV) != "1":
            notes.append(f"{DISPATCH_ENV}={os.environ.get(DISPATCH_ENV)!r} in the environment (not '1'): "
                         "FLA may reroute ops to other packages' kernels")
        backends = sys.modules.get("fla.backends")
        if (self.dispatch_off and already and backends is not None
                and getattr(backends, "_DISPATCH_DISABLED", True) is False):
            notes.append(f"fla was imported before deltacheck set {DISPATCH_ENV}=1; backend dispatch is ON "
                         "for this process, so an op may run another package's kernel")
        if already and not autotune_cache_was_set:
            notes.append("fla was imported before deltacheck set TRITON_CACHE_AUTOTUNING=1: this process keeps no "
                         "autotune results on disk (set it before importing fla)")
        self._import_notes = tuple(notes)
        return fla

    def _import(self, name: str):
        """``name`` (an FLA module) through the importer, FLA itself first with dispatch off; a double as is."""
        if self._module is not None:
            return self._module
        self._import_fla()
        return self._importer(name)

    def _function(self, op: str):
        module_name, attr = self._entry[op]
        return getattr(self._import(module_name), attr)

    def _version(self) -> str:
        return self.version() or "unknown version"

    def version(self) -> str | None:
        """FLA's version for the run header's ``backend_versions`` (None where fla-core is not installed)."""
        source = self._module if self._module is not None else sys.modules.get("fla")
        return library_version(source, "fla-core")

    def _hopper_guard(self) -> str | None:
        """FLA's own refusal of the gated backward on Hopper (fla/ops/common/chunk_o.py, issue #640).

        Read from the very flags FLA's guard tests, so we decline exactly when FLA would raise.
        """
        if self._module is not None:
            flags = self._module
        else:
            try:
                flags = importlib.import_module("fla.ops.common.chunk_o")
            except ImportError:
                return None
        if not hasattr(flags, "TRITON_ABOVE_3_7_1"):
            return None  # a FLA without the guard
        if (getattr(flags, "IS_NVIDIA_HOPPER", False) and getattr(flags, "TRITON_ABOVE_3_4_0", False)
                and not getattr(flags, "TRITON_ABOVE_3_7_1", True)):
            triton = getattr(sys.modules.get("triton"), "__version__", "unknown")
            return (f"FLA {self._version()} refuses the gated GDN backward on Hopper with 3.4.0 <= Triton < 3.7.1 "
                    f"(found Triton {triton}): 'produces incorrect results for gated chunk_bwd_dqkwg (see #640)'. "
                    "Fix: upgrade Triton to >= 3.7.1")
        return None

    # ------------------------------------------------------------------ what FLA cannot express
    def _unsupported(self, case) -> str | None:
        fn = self._entry[case.op][1]
        if case.H > case.HV:
            return (f"FLA {fn} has no GQA (H={case.H} query heads > HV={case.HV} value heads); "
                    "FLA supports only GVA (HV a multiple of H, HK == H)")
        if case.HK != case.H:
            return f"FLA {fn} needs q and k to share heads (H={case.H}, HK={case.HK})"
        if fn == "chunk_gdn2" and case.HV != case.H:
            return f"FLA 0.6 chunk_gdn2 has no GVA (asserts q, k, g, b and v, w at one head count; H={case.H}, HV={case.HV})"
        if case.gate_domain == "linear":
            return f"FLA {fn} has no linear gate domain (g must be a log-space decay)"
        if case.op == "gdn2" and case.beta_sigmoid:
            return f"FLA {fn} has no use_beta_sigmoid_in_kernel / allow_neg_eigval"
        if case.beta_guard:
            return f"FLA {fn} has no beta_guard (cuDNN's erase-side safeguard)"
        return None

    # ------------------------------------------------------------------ can it run?
    def pair_verdict(self, op: str, env) -> Verdict:
        """Our floors for this flavour and op from the Env alone (facts.py); no import of FLA."""
        return facts.floors(self.name, op, env)

    def envelopes(self, op: str, env=None, sm: int | None = None):
        """FLA's envelope for ``op`` (any CUDA GPU; ``sm`` does not narrow it); on ``env``, without a GPU none,
        and its backward as FLA's own Hopper guard decides."""
        if env is not None and not env.cuda:
            return []
        return facts.envelopes(self.name, op, env)

    def check(self, case, env) -> Verdict:
        return floors_then_library(self.pair_verdict(case.op, env), lambda: self._library_verdict(case))

    def load(self, op: str) -> Verdict:
        """Import FLA (dispatch off) and look up the op's entry point: ok, or a decline with the fix."""
        if op not in self.ops:
            return Verdict.no(f"{self.name} serves {sorted(self.ops)}, not {op!r}")
        module_name, attr = self._entry[op]
        library = Library("fla-core", self._version(), facts.INSTALL, INSTALL_HINT)
        _, verdict = load_entry_point(f"{self.name}:{op}", op, module_name, attr, library, self._import)
        return verdict

    def _library_verdict(self, case) -> Verdict:
        loaded = self.load(case.op)
        if not loaded.runnable:
            return loaded
        attr = self._entry[case.op][1]
        reason = self._unsupported(case)
        if reason:
            return Verdict.no(reason)

        notes = list(self._import_notes) + self._conversion_notes(case)
        if self.recurrent:
            return Verdict.ok(*notes, backward=False,
                              backward_reason=f"FLA {attr} is forward-only (its backward raises); "
                                              "use backend 'fla' for gradients")
        if case.op == "gdn" and case.backward:
            guard = self._hopper_guard()
            if guard:
                return Verdict.ok(*notes, backward=False, backward_reason=guard)
        return Verdict.ok(*notes)

    def _conversion_notes(self, case) -> list[str]:
        notes = []
        if case.initial_state and case.state_dtype != "fp32":
            notes.append(f"initial_state cast {case.state_dtype} -> fp32 (FLA asserts an fp32 state) "
                         "and transposed [N, HO, V, K] -> [N, HV, K, V]")
        if case.op == "gdn" and case.safe_gate and not case.a_log:
            notes.append("safe gate without a_log passed as A_log = 0 (exp(0) = 1, identical by definition): "
                         "FLA's GDN in-kernel gate requires A_log")
        return notes

    # ------------------------------------------------------------------ the call
    def _gate_kwargs(self, case, inputs: dict) -> dict:
        """The safe gate as FLA's in-kernel gate (``use_gate_in_kernel``)."""
        if not case.safe_gate:
            return {}
        a_log, dt_bias = inputs.get("a_log"), inputs.get("dt_bias")
        kwargs = {"use_gate_in_kernel": True}
        if case.op == "gdn":
            # -exp(A_log) * softplus(g + dt_bias), A_log and dt_bias [HV]; A_log is mandatory in FLA.
            kwargs["A_log"] = a_log if a_log is not None else torch.zeros(case.HO, device=inputs["q"].device)
            kwargs["dt_bias"] = dt_bias
        else:
            # lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), dt_bias flat [HV*K] in FLA.
            kwargs["lower_bound"] = case.support.gate_lower_bound
            kwargs["A_log"] = a_log
            kwargs["dt_bias"] = dt_bias.reshape(-1) if dt_bias is not None else None
            if not self.recurrent:
                kwargs["safe_gate"] = True  # FLA's bounded-gate kernel path; needs lower_bound in [-5, 0)
        return kwargs

    def _flags(self, case) -> dict:
        kwargs = {
            "scale": case.scale,  # None -> FLA's default K ** -0.5, the same as ours
            "output_final_state": True,
            "use_qk_l2norm_in_kernel": case.l2norm,
        }
        if case.op != "gdn2":  # FLA's gdn2 ops have no beta sigmoid (declined in check)
            kwargs["use_beta_sigmoid_in_kernel"] = case.beta_sigmoid
            kwargs["allow_neg_eigval"] = case.neg_eigval
        return kwargs

    def run(self, case, inputs: dict):
        fn = self._function(case.op)
        layout = case.layout
        q, k, v, g, beta = (to_btd(inputs[n], layout) for n in ("q", "k", "v", "g", "beta"))
        kwargs = self._flags(case)
        kwargs.update(self._gate_kwargs(case, inputs))
        kwargs["initial_state"] = state_to_key_major_fp32(inputs.get("initial_state"))
        if layout == "thd":
            kwargs["cu_seqlens"] = inputs["cu_seqlens"].to(torch.int64)
        if case.op == "gdn2":
            o, final_state = fn(q, k, v, g, beta, to_btd(inputs["w"], layout), **kwargs)
        elif case.op == "gdn" and self.recurrent:
            # fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, ...)
            o, final_state = fn(q, k, v, g=g, beta=beta, **kwargs)
        else:
            o, final_state = fn(q, k, v, g, beta, **kwargs)
        if os.environ.get(winners.RECORD_ENV):
            winners.record_to_dir()
        return from_btd(o, layout), state_widened_to_fp32(final_state)


_WINNERS_APPLIED: list[str] = []


def _apply_winners() -> list[str]:
    """Once per process, after FLA's kernels are imported: put recorded autotune winners into their autotuners
    (harness/backends/fla/winners.py), and record this process's winners at exit when asked to. Returns the note
    saying what was applied (the same note every time)."""
    if _WINNERS_APPLIED:
        return _WINNERS_APPLIED[1:]
    _WINNERS_APPLIED.append("done")
    try:
        import torch as _torch

        importlib.import_module("fla.ops")
        importlib.import_module("fla.ops.gdn2")
        gpu = _torch.cuda.get_device_name(0) if _torch.cuda.is_available() else "cpu"
        triton = getattr(sys.modules.get("triton"), "__version__", "unknown")
        fla = getattr(sys.modules.get("fla"), "__version__", "unknown")
        files = [p for p in winners.default_files(gpu, triton, fla) if p.is_file()]
        applied = winners.apply(winners.merge_files(files)) if files else 0
    except Exception as exc:  # noqa: BLE001 - winners only save compile time; never the reason a case fails
        _WINNERS_APPLIED.append(f"recorded autotune winners not applied: {type(exc).__name__}: {exc}")
        return _WINNERS_APPLIED[1:]
    if applied:
        _WINNERS_APPLIED.append(f"{applied} recorded autotune winners applied from {', '.join(map(str, files))}: "
                                "Triton compiles one config per kernel and key instead of autotuning")
    return _WINNERS_APPLIED[1:]
