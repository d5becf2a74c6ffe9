"""cuDNN frontend adapter: ``cudnn.linear_attention.{gated_delta_net, kimi_delta_attention, gated_delta_net_v2,
gated_delta_product}``.

What this file does, in the order a call goes through it:

1. Pack the case's tensors to cuDNN's only layout, THD (``[T, heads, dim]`` + int32 ``cu_seqlens``),
   the way a framework would: a dense batch goes to bshd and is reshaped ``[N*L, H, D]`` with
   ``cu_seqlens = [0, L, 2L, ...]``. GDP's k, v, beta go in expanded, ``[T*n, ...]`` (its cases are thd),
   with ``num_householder`` as the 7th positional argument.
2. Give every tensor a dtype the op accepts (FE 1.32 ``check_dtype`` rules). The case inputs already
   conform; anything that does not is converted *and the conversion is recorded* in ``Verdict.notes``.
3. Map every Case flag to its keyword (``gate_lower_bound`` by keyword: its position differs between
   KDA and GDN2). ``output_final_state=True`` always.
4. Unpack ``o [T, HO, V]`` to the case's layout; turn the state from cuDNN's value-major
   ``[N, HO, V, K]`` into the harness's key-major ``[N, HO, K, V]`` (float32 or wider).

``check`` asks the library itself whether it can serve a case: it calls the op on a one-token version
of the case (and runs its backward when the case needs it) and turns ``cudnnGraphNotSupportedError`` —
whose message lists every engine's reason — into a decline. Decisions are cached per configuration.

Which engine served: each op module (``cudnn.linear_attention.ops.<op>``) runs its cached graph through its own
``execute_graph(graph, ...)``; the adapter wraps that name once per module (``_watch``) and reads
``graph.selected_engine.name`` (FE's public "which python engine serves the selected plan"; None means the cuDNN
C++ backend) on every execution. ``served()`` gives the forward's engine to the runner, which records it as the
forward result's ``engine`` metric (so compare/release can say which engine changed).

Importing this module never imports cuDNN: that happens on the first ``check``/``run``. Our floors and the
entry points live beside it, in ``facts.py``.
"""

from __future__ import annotations

import importlib
import os
import re

import torch

from deltacheck.plugin import floors_then_library

from ..base import RunDeclined, Verdict
from ..loading import Library, library_version, load_entry_point
from . import facts
from .facts import ENTRY_POINTS, INSTALL_HINT
from .gradients import contiguous_grad
from .packing import conform, from_thd, op_keywords, state_from_cudnn, state_to_cudnn, to_thd
from .serving import CudnnServing

PLAN_ENV = "DELTACHECK_CUDNN_PLAN"

# The engines each wrapped execute_graph saw, oldest first (one list per process: every CudnnBackend reads it).
_SEEN: list[str] = []


def _engine_of(graph) -> str:
    try:
        engine = graph.selected_engine
    except Exception as exc:  # noqa: BLE001 - a graph that cannot say is recorded as such, never raised
        return f"unknown ({type(exc).__name__}: {exc})"
    return "cudnn backend (C++ engine)" if engine is None else str(getattr(engine, "name", engine))


def _watch(ops_module) -> bool:
    """Wrap ``ops_module.execute_graph`` (once) so every execution appends its engine to ``_SEEN``; False when the
    module has no such function (another FE layout: the engine goes unrecorded)."""
    real = getattr(ops_module, "execute_graph", None)
    if real is None:
        return False
    if getattr(real, "_deltacheck_watch", False):
        return True

    def execute_graph(graph, *args, **kwargs):
        _SEEN.append(_engine_of(graph))
        result = real(graph, *args, **kwargs)
        _SEEN[-1] = _engine_of(graph)  # a lazily built graph may only now have walked to its engine
        return result

    execute_graph._deltacheck_watch = True
    ops_module.execute_graph = execute_graph
    return True


class CudnnBackend(CudnnServing):
    """The cuDNN frontend's linear-attention ops as a deltacheck backend.

    ``module``: the ``cudnn.linear_attention`` module, or a contract double; it (or ``package``) must
    also expose ``cudnnGraphNotSupportedError`` and ``__version__`` when injected. Default: imported
    lazily on first use. ``plan_name`` pins one engine (e.g. ``"gdn2_frost"``); default from the
    ``DELTACHECK_CUDNN_PLAN`` environment variable. ``device`` is where ``check`` runs its probe.
    """

    name = "cudnn"
    ops = frozenset(ENTRY_POINTS)
    engine: str | None = None  # CudnnEngineBackend: the pinned engine (its own dtypes, packing.conform)

    version_key = "cudnn_frontend"  # Env.versions key of the distribution (environment.VERSION_KEYS)

    def __init__(self, module=None, *, package=None, plan_name: str | None = None, device="cuda",
                 importer=None):
        self._module = module
        self._package = package if package is not None else module
        self._importer = importer or importlib.import_module
        self.plan_name = plan_name if plan_name is not None else (os.environ.get(PLAN_ENV) or None)
        self.device = device
        self._probe_cache: dict[tuple, Verdict] = {}
        self._served: str | None = None

    # ------------------------------------------------------------------ the library
    def _import(self, name: str):
        """``name`` through the importer; the top-level package too (its version, its decline error). The compile
        caches FE's engines keep (cuda.tile's cubins, the NVRTC cubins of kda_hopper_cuda and kda_cake) go under
        deltacheck's cache directory unless the user chose otherwise (docs/ci.md: keep it between CI runs)."""
        if self._module is None:
            from deltacheck.harness.records.cachedir import cache_root

            os.environ.setdefault("CUDA_TILE_CACHE_DIR", str(cache_root() / "cutile"))
            os.environ.setdefault("CUDNN_FRONTEND_CAKE_CACHE_DIR", str(cache_root() / "cudnn_frontend"))
            package = self._importer(name.split(".")[0])
            self._module = self._importer(name)
            self._package = package
        return self._module

    def _load(self):
        """(linear_attention module, top-level package); raises as the import does."""
        return self._import(facts.MODULE), self._package

    def _version(self) -> str:
        return library_version(self._package, facts.DIST, "unknown version")

    def _op(self, case):
        module, _ = self._load()
        return getattr(module, ENTRY_POINTS[case.op])

    def _declined_errors(self) -> tuple[type, ...]:
        error = getattr(self._package, "cudnnGraphNotSupportedError", None)
        return (error,) if isinstance(error, type) else ()

    # ------------------------------------------------------------------ the call
    def _call(self, case, inputs: dict, extra: dict | None = None):
        """Pack, conform, call, unpack. Returns ``(out, final_state_kv, notes)``. ``extra``: serving keywords
        (serving.py), over the case's own; a checkpoint series (the op's third return value) goes to
        ``self._checkpoints``."""
        op = self._op(case)
        io = inputs["q"].dtype
        layout = case.layout
        tensors = {name: to_thd(inputs[name], layout) for name in ("q", "k", "v", "g", "beta")}
        if case.op == "gdn2":
            tensors["w"] = to_thd(inputs["w"], layout)
        tensors["a_log"] = inputs.get("a_log")
        tensors["dt_bias"] = inputs.get("dt_bias")
        tensors["initial_state"] = state_to_cudnn(inputs.get("initial_state"))
        tensors, notes = conform(case.op, tensors, io, self.engine)  # a pinned engine's own dtypes too

        if layout == "thd":
            cu_seqlens = inputs["cu_seqlens"]
        else:
            length = case.seqlens[0]
            cu_seqlens = torch.arange(case.N + 1, dtype=torch.int32, device=inputs["q"].device) * length

        args = [tensors["q"], tensors["k"], tensors["v"], tensors["g"], tensors["beta"]]
        if case.op == "gdn2":
            args.append(tensors["w"])
        args.append(cu_seqlens)
        if case.support.householder:
            args.append(case.num_householder)
        kwargs = op_keywords(case)
        kwargs["initial_state"] = tensors["initial_state"]
        if tensors["a_log"] is not None:
            kwargs["a_log"] = tensors["a_log"]
        if tensors["dt_bias"] is not None:
            kwargs["dt_bias"] = tensors["dt_bias"]
        if self.plan_name:
            kwargs["plan_name"] = self.plan_name
        kwargs.update(extra or {})

        watched = _watch(getattr(getattr(self._module, "ops", None), case.op, None))
        start = len(_SEEN)
        self._served = None
        try:
            try:
                o, final_state, *series = op(*args, **kwargs)
                self._checkpoints = series[0] if series else None
            finally:
                seen = _SEEN[start:]
                del _SEEN[:]
                self._served = seen[0] if seen else ("not recorded (no execute_graph seen)" if watched else
                                                     "not recorded (this FE has no ops.<op>.execute_graph)")
        except self._declined_errors() as exc:  # FE's refusal of this very call: a decline, with the fix
            raise RunDeclined(self._decline_reason(case, exc)) from exc
        except Exception:
            self._check_pin(case)  # another engine's failure (e.g. its compile) is the pin's decline, not an error
            raise
        self._check_pin(case)
        o, final_state = contiguous_grad(o), contiguous_grad(final_state)  # gradients.py: FE refuses strided ones
        return from_thd(o, layout, case.N), state_from_cudnn(final_state), notes

    def _pin_text(self) -> str:
        return pin_text(self.plan_name)

    def _decline_reason(self, case, exc: Exception) -> str:
        """FE's refusal in its words, and the fix: which engines FE offered the graph to instead."""
        return refusal_reason(self.plan_name, str(exc)) + self._why_outside(case)

    def _why_outside(self, case) -> str:
        """Where a pinned engine's envelope (read from its gate) leaves the case out: "; outside ...", or ""."""
        return ""

    def _check_pin(self, case) -> None:
        """A pinned call must have been served by its engine. FE 1.32 caches a graph before pinning its plan
        (ops/<op>.py: ``fprop_cache[key] = build_...graph(...)`` then ``select_plan``); when the pin is refused the
        unpinned graph stays cached, and every later call with the same key (shapes, dtypes, flags, plan_name) runs
        it on its first-ranked plan, silently. Such a result is another engine's: raise the pin's decline instead."""
        served = self._served
        if (not self.plan_name or served is None or served.startswith(("not recorded", "unknown"))
                or served == self.plan_name or served.startswith(self.plan_name + "[")):
            return
        raise RunDeclined(
            f"cuDNN declined{self._pin_text()}: no {self.plan_name} plan for this graph; FE served it with "
            f"{served} instead (FE 1.32 keeps a graph whose pin was refused in its plan cache and runs later calls "
            f"of that configuration unpinned: ops/common.py select_plan after the graph is cached); served by "
            f"{facts.engine_backend(served) if served in facts.ENGINES else served} (or routed `cudnn`), not by "
            f"{self.plan_name}{self._why_outside(case)}")

    def served(self) -> dict:
        """The engine that served the last forward call (``graph.selected_engine.name``), as result metrics."""
        return {} if self._served is None else {"engine": self._served}

    def run(self, case, inputs: dict):
        out, final_state, _ = self._call(case, inputs)
        return out, final_state

    # ------------------------------------------------------------------ can it run?
    def pair_verdict(self, op: str, env) -> Verdict:
        """Our floors for ``cudnn:op`` from the Env alone (facts.py); no import of cuDNN."""
        return facts.floors(self.name, op, env)

    def envelopes(self, op: str, env=None, sm: int | None = None):
        """The engines (facts.ENVELOPES) that serve ``op`` on ``env`` (its SM and runtimes), or on a GPU of
        architecture ``sm`` with no optional runtime, or anywhere (neither given)."""
        if env is not None:
            return facts.envelopes(op, env.sm, facts.runtimes(env)) if env.cuda else []
        return facts.envelopes(op, sm, frozenset() if sm is not None else None)

    def check(self, case, env) -> Verdict:
        return floors_then_library(self.pair_verdict(case.op, env), lambda: self._library_verdict(case))

    def load(self, op: str) -> Verdict:
        """Import cuDNN and look up the op's entry point: ok, or a decline naming what is missing and the fix."""
        if op not in self.ops:
            return Verdict.no(f"cudnn serves {sorted(self.ops)}, not {op!r}")
        library = Library(facts.DIST, self._version(), facts.INSTALL, INSTALL_HINT)
        _, verdict = load_entry_point(f"cudnn:{op}", op, facts.MODULE, ENTRY_POINTS[op], library, self._import)
        return verdict

    def _library_verdict(self, case) -> Verdict:
        loaded = self.load(case.op)
        if not loaded.runnable:
            return loaded
        key = self._probe_key(case)
        if key not in self._probe_cache:
            self._probe_cache[key] = self._probe(case)
        return self._probe_cache[key]

    def _probe_case(self, case):
        """The same configuration (op, dtypes, heads, dims, flags) on a single one-token sequence."""
        return case.replace(layout="thd", seqlens=(1,), splits=(), backward=False, gate="typical",
                            beta_profile="uniform", seed=0, tier="L0", pool=0, nulls=0, chain=0, draft=0,
                            accepted=(), checkpoint_every=0)  # the serving axes: serving_verdict's to judge

    def _probe_key(self, case) -> tuple:
        return (self._probe_case(case).id, case.backward, self.plan_name)

    def _probe(self, case) -> Verdict:
        """Ask the library: call the op (and its backward, if needed) on a one-token version of the case."""
        # cases sit left of harness (allowed); imported here so importing this module stays light.
        from deltacheck.cases import make_inputs

        probe_case = self._probe_case(case)
        inputs = make_inputs(probe_case, device=self.device)
        plan, outside = self._pin_text(), self._why_outside(case)
        try:
            _, _, notes = self._call(probe_case, inputs)
        except RunDeclined as exc:  # FE's refusal (_call turns FE's error into it), or a pin FE did not honour
            return Verdict.no(str(exc))
        except FileNotFoundError as exc:
            if "tileiras" in str(exc):  # the cuTile engine compiles on first call with the external tileiras
                return Verdict.no(f"cuDNN engine could not compile its kernel{plan}: `tileiras` not found "
                                  f"(cuTile needs it on PATH): {exc}{outside}")
            # e.g. FE 1.30.0's wheel ships the Hopper KDA engine without its kda_fused_sm90.cu source.
            return Verdict.no(f"cuDNN engine needs a file missing from this nvidia-cudnn-frontend installation"
                              f"{plan}: {exc} (a packaging problem of this version: reinstall, or use another)"
                              f"{outside}")
        except Exception as exc:  # noqa: BLE001
            if _looks_like_compile_error(exc):
                engine = f" ({self._served})" if self._served and not self._served.startswith("not recorded") else ""
                return Verdict.no(f"cuDNN engine{engine} failed to compile its kernel{plan}: {type(exc).__name__}: "
                                  f"{exc}{outside}")
            # Anything else is not a decline: let the run itself raise it, so it is reported as an error.
            return Verdict.ok(f"probe call raised {type(exc).__name__}: {exc}; the run will report it")
        if not case.backward:
            return Verdict.ok(*notes)
        grads = {n: x.detach().requires_grad_() for n, x in inputs.items()
                 if isinstance(x, torch.Tensor) and x.is_floating_point()}
        try:
            out, final_state, _ = self._call(probe_case, {**inputs, **grads})
            (out.float().sum() + final_state.float().sum()).backward()
        except RunDeclined as exc:  # FE refused the forward that records for a backward: the backward's decline
            return Verdict.ok(*notes, backward=False, backward_reason=f"the backward: {exc}")
        except self._declined_errors() as exc:
            return Verdict.ok(*notes, backward=False, backward_reason=f"cuDNN declined the backward{plan}: {exc}")
        except Exception as exc:  # noqa: BLE001
            return Verdict.ok(*notes, f"backward probe raised {type(exc).__name__}: {exc}; the run will report it")
        return Verdict.ok(*notes)


def pin_text(plan_name: str | None) -> str:
    """How a message names a pinned call: " (plan_name='...')", or "" for a routed one."""
    return f" (plan_name={plan_name!r})" if plan_name else ""


def refusal_reason(plan_name: str | None, message: str) -> str:
    """FE's refusal (``message``, in its words) of a call pinned to ``plan_name`` (or routed: None), and the fix:
    the backends of the engines FE offered the graph to instead."""
    reason = f"cuDNN declined{pin_text(plan_name)}: {message}"
    offered = _offered(message)
    if plan_name and offered:
        reason += (f"; served by {', '.join(facts.engine_backend(e) for e in offered)} (or routed `cudnn`), "
                   f"not by {plan_name}")
    return reason


def _offered(message: str) -> list[str]:
    """The plans FE offered instead, from a strict pin's refusal: "no X plan for this graph (offered: ['a', 'b'])"."""
    m = re.search(r"\(offered: \[([^\]]*)\]\)", message)
    return re.findall(r"'([^']+)'", m.group(1)) if m else []


def _looks_like_compile_error(exc: Exception) -> bool:
    """cuda.tile / CuTe DSL compile failures (no common base class): judge by name and message."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "tileiras" in text or "compil" in type(exc).__name__.lower()


class CudnnEngineBackend(CudnnBackend):
    """``cudnn@<engine>``: one cuDNN engine, pinned (``plan_name=<engine>``: a strict pin, so a case the engine
    declines is a decline listing the plans offered, never another engine's answer). Its floors and envelope are
    that engine's alone (facts.engine_verdict, facts.engine_envelopes); ``DELTACHECK_CUDNN_PLAN`` does not apply."""

    def __init__(self, engine: str, module=None, **kwargs):
        if engine not in facts.ENGINES:
            raise ValueError(f"unknown cuDNN engine {engine!r}; known: {', '.join(facts.ENGINES)}")
        super().__init__(module, plan_name=engine, **kwargs)
        self.engine = engine
        self.name = facts.engine_backend(engine)
        self.ops = frozenset({facts.ENGINES[engine]})

    def pair_verdict(self, op: str, env) -> Verdict:
        if op not in self.ops:
            return Verdict.no(f"{self.name} serves {facts.ENGINES[self.engine]} only, not {op!r}")
        return facts.engine_verdict(self.engine, env)

    def _why_outside(self, case) -> str:
        # A strict pin's decline names only the plans offered; the engine's own gate reason stays inside FE. Where
        # the case is outside the engine's envelope (read from that gate), every decline says which axis put it there.
        outside = [why for e in facts.engine_envelopes(self.engine) if (why := e.why_not(case))]
        return f"; outside {self.engine}'s gate (docs/libraries.md): {outside[0]}" if outside else ""

    def envelopes(self, op: str, env=None, sm: int | None = None):
        if op not in self.ops:
            return []
        if env is not None:
            return facts.engine_envelopes(self.engine, env.sm, facts.runtimes(env)) if env.cuda else []
        return facts.engine_envelopes(self.engine, sm, frozenset() if sm is not None else None)
