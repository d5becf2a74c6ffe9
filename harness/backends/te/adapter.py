"""TransformerEngine adapter: ``transformer_engine.pytorch.{GatedDeltaNetAttention, GatedDeltaNet2Attention,
GatedDeltaProductAttention}`` (TE >= 2.20), the modules framework code calls rather than the cuDNN op under them.

``te``             the modules called plainly.
``te-checkpoint``  the same calls with ``checkpoint_core_attention=True``: TE's reentrant activation checkpoint
                   reruns the forward inside the backward (the runner's backward uses ``loss.backward()``, which
                   that checkpoint requires).

What a call goes through, as a framework would make it (TE 2.20.2 ``linear_attention/``; docs/libraries.md):

1. One module per configuration, constructed with TE's arguments: ``num_attention_heads=H``,
   ``kv_channels=(K, V)``, ``scale``, and GDP's ``num_householder``. The module's own ``qkv_format`` is left at
   TE's default (sbhd) and every call passes ``qkv_format`` explicitly, so a call that loses it misreads the
   tensors instead of passing by luck.
2. The case's layout as a qkv_format: thd (with int32 ``cu_seqlens``), bshd, sbhd; TE has no bhsd, so a bhsd
   case goes in as ``x.transpose(1, 2)`` with ``qkv_format='bshd'`` (noted). GDP's expanded k, v, beta
   ``[T*n, ...]`` become TE's ``[T, n, ...]`` (the num_householder axis right after the token dimension).
3. The state in TE's convention: value-major ``[B, H, V, K]``, float32 only (a bf16 state is widened, exactly,
   and noted); ``output_final_state=True`` always, so the call returns ``(output, final_state)``.
4. TE's output ``[..., H*V]`` (heads flattened) is unflattened to the case's layout; the final state goes back to
   the harness's key-major ``[N, H, K, V]``.

What the modules cannot express is declined with the reason, never emulated in glue code: GQA/GVA (q, k and v
must all have ``num_attention_heads`` heads), flags a module's forward does not take (GDN: beta sigmoid, neg-eig,
safe gate, linear gate; GDN2: safe gate, linear gate), head sizes outside GDN2's/GDP's check (64, 128). A module
that refuses to be constructed here (TE raises ``RuntimeError("TransformerEngine needs CUDA.")`` without a GPU)
is a decline carrying TE's words. ``check`` then asks the library on a one-token version of the case, as the
cuDNN adapter does: the cuDNN op's ``cudnnGraphNotSupportedError`` under the module becomes a decline.

Importing this module never imports TransformerEngine. Our floors, the entry points and what each module can
express live beside it, in ``facts.py``.
"""

from __future__ import annotations

import importlib
import sys

import torch

from deltacheck.harness.judge.margins import with_margin
from deltacheck.plugin import floors_then_library

from ..base import LibraryContractError, Verdict
from ..loading import Library, library_version, load_entry_point
from . import facts
from .facts import ENTRY_POINTS, FLAGS, HEAD_DIMS, INSTALL_HINT, QKV_FORMAT

# The Case flags a case turns on, by the names facts.FLAGS uses, and how TE (or the cuDNN op) spells them.
_FLAG_WORDS = {
    "l2norm": "use_qk_l2norm_in_kernel", "scale": "scale", "beta_sigmoid": "use_beta_sigmoid_in_kernel",
    "neg_eigval": "allow_neg_eigval", "linear_gate": "gate_domain='linear'", "safe_gate": "safe_gate",
    "a_log": "a_log", "dt_bias": "dt_bias", "beta_guard": "beta_guard",
}


def _flags_on(case) -> list[str]:
    on = {"l2norm": case.l2norm, "scale": case.scale is not None, "beta_sigmoid": case.beta_sigmoid,
          "neg_eigval": case.neg_eigval, "linear_gate": case.gate_domain == "linear", "safe_gate": case.safe_gate,
          "a_log": case.a_log, "dt_bias": case.dt_bias, "beta_guard": case.beta_guard}
    return [name for name, value in on.items() if value]


def constructor_kwargs(case) -> dict:
    """The module's constructor arguments, by keyword (GDP's num_householder is TE's 3rd positional)."""
    kwargs = {"num_attention_heads": case.H, "kv_channels": (case.K, case.V), "scale": case.scale}
    if case.support.householder:
        kwargs["num_householder"] = case.num_householder
    return kwargs


def _to_te(x: torch.Tensor | None, case, name: str) -> torch.Tensor | None:
    """One input in the layout TE reads: bhsd -> bshd; GDP's expanded sub-token rows -> ``[T, n, ...]``."""
    if x is None:
        return None
    if case.layout == "bhsd":
        x = x.transpose(1, 2)
    x = with_margin(x)  # contiguous between NaN margins (harness/judge/margins.py); the unflatten below is a view
    if name in case.support.subtoken_inputs:  # GDP, thd only: row t*n + j is token t's sub-token j
        x = x.unflatten(0, (x.shape[0] // case.num_householder, case.num_householder))
    return x


def _state_to_te(state: torch.Tensor | None) -> torch.Tensor | None:
    """make_inputs gives value-major ``[N, HO, V, K]``, TE's own convention; TE takes float32 only."""
    return with_margin(state, torch.float32)


def _state_from_te(state: torch.Tensor) -> torch.Tensor:
    """TE ``[B, H, V, K]`` (float32) -> key-major ``[N, H, K, V]``."""
    state = state.transpose(-1, -2)
    return state.float() if state.dtype in (torch.bfloat16, torch.float16) else state


def _from_te(out: torch.Tensor, case) -> torch.Tensor:
    """TE's ``[T | B,S | S,B, H*V]`` -> the case's layout with heads and V apart."""
    out = out.unflatten(-1, (case.HO, case.V))
    return out.transpose(1, 2) if case.layout == "bhsd" else out


def _declined_by_cudnn(exc: BaseException | None) -> bool:
    """Whether the cuDNN op under the module refused the graph (its error may be wrapped by TE)."""
    while exc is not None:
        if type(exc).__name__ == "cudnnGraphNotSupportedError":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class TeBackend:
    """TransformerEngine's linear-attention modules as a deltacheck backend.

    ``module``: the ``transformer_engine.pytorch`` module, or a contract double (tests/doubles/te_la.py); default:
    imported lazily on first use. ``checkpoint``: call with ``checkpoint_core_attention=True`` (``te-checkpoint``).
    ``device`` is where ``check`` runs its one-token probe.
    """

    ops = frozenset(ENTRY_POINTS)

    version_key = "transformer_engine"  # Env.versions key of the distribution (environment.VERSION_KEYS)

    def __init__(self, module=None, *, checkpoint: bool = False, device="cuda", importer=None):
        self._module = module
        self._importer = importer or importlib.import_module
        self.checkpoint = checkpoint
        self.name = "te-checkpoint" if checkpoint else "te"
        self.device = device
        self._instances: dict[tuple, torch.nn.Module] = {}
        self._probe_cache: dict[tuple, Verdict] = {}

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        """``name`` through the importer, the top-level package first (a missing TE is named as such); a double as is."""
        if self._module is not None:
            return self._module
        self._importer(name.split(".")[0])
        return self._importer(name)

    def _version(self) -> str:
        source = self._module if self._module is not None else sys.modules.get("transformer_engine")
        return library_version(source, "transformer_engine", "unknown version")

    def _instance(self, case) -> torch.nn.Module:
        """The module for this configuration, constructed once (the modules hold no parameters)."""
        key = (case.op, case.H, case.K, case.V, case.num_householder, case.scale)
        if key not in self._instances:
            cls = getattr(self._import(facts.MODULE), ENTRY_POINTS[case.op])
            self._instances[key] = cls(**constructor_kwargs(case))
        return self._instances[key]

    # ------------------------------------------------------------------ the call
    def _forward_kwargs(self, case, inputs: dict) -> dict:
        """Every keyword of the module's forward the case decides."""
        kwargs = {
            "qkv_format": QKV_FORMAT[case.layout],
            "cu_seqlens": inputs["cu_seqlens"].to(torch.int32) if case.layout == "thd" else None,
            "checkpoint_core_attention": self.checkpoint,
            "initial_state": _state_to_te(inputs.get("initial_state")),
            "output_final_state": True,
            "use_qk_l2norm_in_kernel": case.l2norm,
        }
        if case.op in ("gdn2", "gdp"):
            kwargs["use_beta_sigmoid_in_kernel"] = case.beta_sigmoid
            kwargs["allow_neg_eigval"] = case.neg_eigval
        if case.op == "gdn2":
            kwargs["beta_guard"] = case.beta_guard
        if case.op == "gdp":
            kwargs["safe_gate"] = case.safe_gate
            kwargs["gate_domain"] = case.gate_domain
            for name in ("a_log", "dt_bias"):
                if inputs.get(name) is not None:
                    kwargs[name] = inputs[name]
        return kwargs

    def run(self, case, inputs: dict):
        module = self._instance(case)
        names = ("q", "k", "v", "g", "beta") + (("w",) if case.support.write_gate else ())
        args = [_to_te(inputs[n], case, n) for n in names]
        got = module(*args, **self._forward_kwargs(case, inputs))
        # A module that ignored output_final_state returns the output alone: unpacking a tensor would take its
        # first two rows for (out, state) whenever its leading dimension is 2.
        if not (isinstance(got, tuple) and len(got) == 2):
            raise LibraryContractError(f"{self.name}: the {type(module).__name__} call asked for the final state "
                                       f"and returned {type(got).__name__} instead of (output, final_state)")
        out, final_state = got
        return _from_te(out, case), _state_from_te(final_state)

    # ------------------------------------------------------------------ can it run?
    def pair_verdict(self, op: str, env) -> Verdict:
        """Our floors for this backend and op from the Env alone (facts.py); no import of TransformerEngine."""
        return facts.floors(self.name, op, env)

    def check(self, case, env) -> Verdict:
        return floors_then_library(self.pair_verdict(case.op, env), lambda: self._library_verdict(case))

    def load(self, op: str) -> Verdict:
        """Import TransformerEngine and look up the op's module class: ok, or a decline naming the cause and fix."""
        if op not in self.ops:
            return Verdict.no(f"{self.name} serves {sorted(self.ops)}, not {op!r} (TE 2.20 has no KDA module)")
        library = Library(facts.DIST, self._version(), facts.INSTALL, INSTALL_HINT)
        _, verdict = load_entry_point(f"{self.name}:{op}", op, facts.MODULE, ENTRY_POINTS[op], library, self._import)
        return verdict

    def unsupported(self, case) -> str | None:
        """What the module cannot express for this case, or None."""
        cls = ENTRY_POINTS[case.op]
        if not case.H == case.HK == case.HV:
            return (f"TE {cls} has no {case.head_config.upper()} (H/HK/HV = {case.H}/{case.HK}/{case.HV}): q, k and v "
                    "must all carry num_attention_heads heads, the module's output being num_attention_heads * "
                    "v_head_dim wide (TE 2.20 linear_attention/base.py: integrations with more V heads must "
                    "expand Q/K before the module)")
        missing = [_FLAG_WORDS[f] for f in _flags_on(case) if f not in FLAGS[case.op]]
        if missing:
            return (f"TE {cls} cannot express {', '.join(missing)}: its forward has no such argument (the cuDNN "
                    "op underneath may have it; the module does not pass it)")
        dims = HEAD_DIMS.get(case.op)
        if dims and (case.K not in dims or case.V not in dims):
            return f"TE {cls} accepts head sizes {dims} only (its constructor's check); the case has K={case.K}, V={case.V}"
        return None

    def _notes(self, case) -> list[str]:
        notes = []
        if case.layout == "bhsd":
            notes.append("bhsd passed as qkv_format='bshd' (x.transpose(1, 2)): TE has no bhsd")
        if case.initial_state and case.state_dtype != "fp32":
            notes.append(f"initial_state cast {case.state_dtype} -> fp32: TE takes a float32 state only")
        return notes

    def _library_verdict(self, case) -> Verdict:
        loaded = self.load(case.op)
        if not loaded.runnable:
            return loaded
        reason = self.unsupported(case)
        if reason:
            return Verdict.no(reason)
        try:
            self._instance(case)
        except Exception as exc:  # noqa: BLE001 - TE's refusal to construct (no CUDA, a changed check) is a decline
            args = ", ".join(f"{k}={v!r}" for k, v in constructor_kwargs(case).items())
            return Verdict.no(f"TransformerEngine {self._version()} refused to construct "
                              f"{ENTRY_POINTS[case.op]}({args}): {type(exc).__name__}: {exc}")
        key = (self._probe_case(case).id, case.backward)
        if key not in self._probe_cache:
            self._probe_cache[key] = self._probe(case)
        probed = self._probe_cache[key]
        return Verdict(probed.runnable, probed.reason, probed.backward, probed.backward_reason,
                       (*self._notes(case), *probed.notes))

    def _probe_case(self, case):
        """The same configuration (op, dtypes, heads, dims, flags) on a single one-token sequence."""
        return case.replace(layout="thd", seqlens=(1,), splits=(), backward=False, gate="typical",
                            beta_profile="uniform", seed=0, tier="L0")

    def _probe(self, case) -> Verdict:
        """Ask the library: call the module (and its backward, if needed) on a one-token version of the case."""
        from deltacheck.cases import make_inputs  # cases sit left of harness; imported here to keep this light

        probe_case = self._probe_case(case)
        inputs = make_inputs(probe_case, device=self.device)
        cls = ENTRY_POINTS[case.op]
        try:
            self.run(probe_case, inputs)
        except Exception as exc:  # noqa: BLE001
            if _declined_by_cudnn(exc) or isinstance(exc, ImportError):
                return Verdict.no(f"TE {cls}: the cuDNN frontend op under it cannot serve this case: "
                                  f"{type(exc).__name__}: {exc}")
            return Verdict.ok(f"probe call raised {type(exc).__name__}: {exc}; the run will report it")
        if not case.backward:
            return Verdict.ok()
        leaves = {n: x.detach().requires_grad_() for n, x in inputs.items()
                  if isinstance(x, torch.Tensor) and x.is_floating_point()}
        try:
            out, state = self.run(probe_case, {**inputs, **leaves})
            (out.float().sum() + state.float().sum()).backward()
        except Exception as exc:  # noqa: BLE001
            if _declined_by_cudnn(exc):
                return Verdict.ok(backward=False, backward_reason=f"the cuDNN op under TE {cls} declined the "
                                                                  f"backward: {exc}")
            return Verdict.ok(f"backward probe raised {type(exc).__name__}: {exc}; the run will report it")
        return Verdict.ok()
