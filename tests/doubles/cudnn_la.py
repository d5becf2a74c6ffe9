"""A contract double of ``cudnn.linear_attention`` (cuDNN frontend 1.32), computed with our reference.

What it pins (from the FE 1.32 sources, see docs/libraries.md):

- entry points ``gated_delta_net``, ``kimi_delta_attention``, ``gated_delta_net_v2``, ``gated_delta_product``
  with the exact parameter lists (``gate_lower_bound`` sits before ``gate_domain`` in KDA, after it in GDN2;
  GDP's required ``num_householder`` is its 7th positional argument);
- GDP's two timelines (``check_gdp_rows``): q and g per real token; k, v, beta expanded ``[T*n, ...]`` or
  token-major ``[T, n, ...]`` (the rank decides); ``cu_seqlens`` over the real tokens;
- THD only: q ``[T, H, K]``, k ``[T, HK, K]``, v ``[T, HV, V]``, ``cu_seqlens [N+1]`` int32/int64;
  gates, output and state at ``HO = max(H, HV)`` heads; output ``o [T, HO, V]``;
- states value-major ``[N, HO, V, K]``; ``final_state`` is an *empty* tensor unless
  ``output_final_state=True``; returns a 2-tuple;
- ``check_dtype`` rules (TypeError): g fp32/bf16/fp16; GDN/KDA beta fp32 or io; GDN2 beta and w io;
  a_log/dt_bias fp32/bf16/fp16; states fp32/bf16/fp16; ValueErrors for flag misuse;
- refusal through ``cudnnGraphNotSupportedError`` (fp32 io, unknown ``plan_name``, and whatever the
  test's ``decline`` hook says), and a first-call error hook (the missing-``tileiras`` case);
- engines: ``plan_name`` is a strict pin (ops/common.py ``select_plan``: a plan not offered raises
  "no X plan for this graph (offered: [...])"; a pinned engine that declines raises, no fallback); default routing
  walks the offered plans in ``order`` (FE: slot order, KDA on SM90 kda_hopper_cuda then kda_hopper first) and
  takes the first that does not decline (``engine_decline``); the graph is executed through
  ``ops.<op>.execute_graph(graph, ...)`` (looked up at call time, as FE's op modules do) with
  ``graph.selected_engine.name`` naming the engine that served.

Results come back in fp64 (see the package docstring) unless ``exact=False``, which rounds like the
kernels (o in the io dtype, state in the state dtype).
"""

from __future__ import annotations

import math
import types

import torch

from deltacheck import reference

VERSION = "1.32.0"
PLANS = {
    "gated_delta_net": ("gdn_frost", "gdn_cutile"),
    "kimi_delta_attention": ("kda_frost", "kda_cutile", "kda_hopper", "kda_hopper_cuda"),
    "gated_delta_net_v2": ("gdn2_frost",),
    "gated_delta_product": ("gdp_frost",),
}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class cudnnGraphNotSupportedError(Exception):
    """Stands in for ``cudnn.cudnnGraphNotSupportedError`` (a pybind exception in the real package)."""


def _no_plan(reasons: str) -> cudnnGraphNotSupportedError:
    return cudnnGraphNotSupportedError(
        f"no engine \u2014 python or backend \u2014 proposed a plan for this graph (python engines declined: {reasons})"
    )


def _check_dtype(fn: str, name: str, t: torch.Tensor, want) -> None:
    wants = want if isinstance(want, tuple) else (want,)
    if t.dtype not in wants:
        names = " or ".join(str(w) for w in wants)
        raise TypeError(f"{fn}: {name} must be {names} (kernel-native; callers convert), got {t.dtype}")


def _check_shape(fn: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must be {list(shape)}, got {list(t.shape)}")


def _check_gdp_rows(total: int, n: int, k, v, beta, g) -> None:
    """FE 1.32 ``check_gdp_rows``: g per real token; k / v / beta expanded (``T*n`` rows) or token-major."""
    fn = "gated_delta_product"
    if g.shape[0] != total:
        raise ValueError(f"{fn}: g must carry {total} rows (q rows), got {g.shape[0]}")
    for name, t, rank in (("k", k, 3), ("v", v, 3), ("beta", beta, 2)):
        if t.dim() == rank:
            if t.shape[0] != total * n:
                raise ValueError(f"{fn}: {name} must carry {total * n} rows (q rows * num_householder), got {t.shape[0]}")
        elif t.dim() == rank + 1:
            if t.shape[0] != total or t.shape[1] != n:
                raise ValueError(f"{fn}: token-major {name} must be [{total}, {n}, ...] (q rows, num_householder), "
                                 f"got {tuple(t.shape)}")
        else:
            raise ValueError(f"{fn}: {name} must be rank {rank} (expanded rows) or rank {rank + 1} (token-major), "
                             f"got rank {t.dim()}")


class _Engine:
    def __init__(self, name: str):
        self.name = name


class _Graph:
    """The little of FE's pygraph the adapter reads: ``selected_engine`` (None would mean the C++ backend)."""

    def __init__(self, engine: str | None):
        self.selected_engine = None if engine is None else _Engine(engine)


def _refuse_strided(name: str, grad: torch.Tensor) -> None:
    if not grad.is_contiguous():
        raise ValueError(f"GdnCuTileEngine: buffer for '{name}' must be contiguous (the cuTile backend stages "
                         f"rank-merged views); got shape {tuple(grad.shape)} strides {grad.stride()}")


def _execute_graph(graph, variant_pack=None, workspace=None, handle=None):
    """FE's ops/common.py execute_graph; the double has already computed the answer."""


def make(*, decline=None, backward_decline=None, first_call_error=None, exact=True, version=VERSION,
         engine_decline=None, order=None, contiguous_grads=False, plan_cache=False):
    """A fresh double module.

    ``decline(fn_name, call) -> str | None``: a reason makes planning raise cudnnGraphNotSupportedError;
    ``call`` is a dict of every argument. ``backward_decline`` likewise, raised when the backward runs
    (a forward-only plan). ``first_call_error``: raised once, by the first call (an uncompiled engine).
    ``mod.calls`` records each call's arguments, for tests that inspect what the adapter passed.
    ``engine_decline(engine, fn_name, call) -> str | None``: one engine's refusal (a pin to it raises; default
    routing moves on to the next engine of ``order``, ``{fn_name: (engine, ...)}``, default PLANS order).
    ``contiguous_grads``: the backward refuses a strided incoming ``d_out`` / ``d_final_state`` with FE 1.32
    cuTile's ValueError (``cutile/engine.py`` stages rank-merged views of every buffer).
    ``plan_cache``: FE 1.32's per-configuration graph cache (``ops/kda.py``: ``fprop_cache[key] = build_fprop_graph
    (...)``, then ``select_plan(graph, plan_name)``): the graph is cached before its pin is checked, so after a
    refused pin a later call with the same key (shapes, dtypes, flags, ``plan_name``) runs the cached graph on its
    first offered plan, no refusal (``mod.graphs``: key -> engine).
    """
    mod = types.ModuleType("cudnn_linear_attention_double")
    mod.__version__ = version
    mod.cudnnGraphNotSupportedError = cudnnGraphNotSupportedError
    mod.calls = []
    mod.graphs = {}
    mod.ops = types.SimpleNamespace(**{op: types.SimpleNamespace(execute_graph=_execute_graph)
                                       for op in ("gdn", "kda", "gdn2", "gdp")})
    pending_error = [first_call_error]

    def run(fn, op, q, k, v, g, beta, w, cu_seqlens, call):
        mod.calls.append({"fn": fn, **call})
        if pending_error[0] is not None:
            error, pending_error[0] = pending_error[0], None
            raise error
        if q.dim() != 3:
            raise ValueError("expected THD [total_tokens, heads, dim] tensors")
        T, H, K = q.shape
        HK, HV, V = k.shape[-2], v.shape[-2], v.shape[-1]
        if HK not in (H, HV):
            raise ValueError(f"k head count ({HK}) must match q's ({H}) or v's ({HV})")
        HO = max(H, HV)
        if cu_seqlens is None or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{fn}: cu_seqlens must be int32 or int64; got "
                             f"{None if cu_seqlens is None else cu_seqlens.dtype}")
        N = cu_seqlens.shape[0] - 1
        if int(cu_seqlens[-1]) != T or int(cu_seqlens[0]) != 0:
            raise ValueError(f"{fn}: cu_seqlens must run from 0 to total_tokens={T}; got {cu_seqlens.tolist()}")
        if call["allow_neg_eigval"] and not call["use_beta_sigmoid_in_kernel"]:
            raise ValueError(f"{fn}: allow_neg_eigval requires use_beta_sigmoid_in_kernel")
        _check_dtype(fn, "k", k, q.dtype)
        _check_dtype(fn, "v", v, q.dtype)
        _check_dtype(fn, "g", g, _FLOATS)
        _check_dtype(fn, "beta", beta, q.dtype if op == "gdn2" else (torch.float32, q.dtype))
        if op == "gdp":
            n = call["num_householder"]
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{fn}: num_householder must be a positive integer, got {n}")
            _check_gdp_rows(T, n, k, v, beta, g)
            _check_shape(fn, "g", g, (T, HO))
        else:
            _check_shape(fn, "k", k, (T, HK, K))
            _check_shape(fn, "g", g, (T, HO) if op == "gdn" else (T, HO, K))
            _check_shape(fn, "beta", beta, (T, HO, K) if op == "gdn2" else (T, HO))
        if op == "gdn2":
            _check_dtype(fn, "w", w, q.dtype)
            _check_shape(fn, "w", w, (T, HO, V))
        a_log, dt_bias, state = call["a_log"], call["dt_bias"], call["initial_state"]
        if call["safe_gate"]:
            if a_log is not None:
                _check_dtype(fn, "a_log", a_log, _FLOATS)
                _check_shape(fn, "a_log", a_log, (HO,))
            if dt_bias is not None:
                _check_dtype(fn, "dt_bias", dt_bias, _FLOATS)
                _check_shape(fn, "dt_bias", dt_bias, (HO,) if op in ("gdn", "gdp") else (HO, K))
        elif a_log is not None or dt_bias is not None:
            raise ValueError(f"{fn}: a_log/dt_bias require safe_gate=True")
        if call["gate_domain"] not in ("log", "linear"):
            raise ValueError(f"{fn}: gate_domain must be 'log' or 'linear', got {call['gate_domain']!r}")
        if call["gate_domain"] == "linear" and call["safe_gate"]:
            raise ValueError(f"{fn}: gate_domain='linear' cannot combine with safe_gate=True")
        if state is not None:
            _check_dtype(fn, "initial_state", state, _FLOATS)
            if state.shape[0] != N:
                raise ValueError(f"initial_state must carry one state per sequence: got {state.shape[0]} for {N} sequences")
            _check_shape(fn, "initial_state", state, (N, HO, V, K))

        # Planning: the engines' refusals.
        plans = PLANS[fn]
        plan_name = call["plan_name"]
        if plan_name is not None and plan_name not in plans:  # an engine of another op
            raise cudnnGraphNotSupportedError(f"no {plan_name} plan for this graph (offered: {list(plans)})")
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise _no_plan(f"{plans[0]}: io dtype must be bf16 or fp16, got {q.dtype}")
        reason = decline(fn, call) if decline is not None else None
        if reason:
            raise _no_plan(reason)
        # Planning proposes only the engines whose check_support passes; a pin picks among those.
        key = (fn, T, N, H, HK, HV, K, V, q.dtype, g.dtype, beta.dtype, None if state is None else state.dtype,
               tuple((n, v) for n, v in call.items() if isinstance(v, (bool, float, int, str, type(None)))))
        if plan_cache and key in mod.graphs:  # FE 1.32: a cached graph runs as planned, no pin checked again
            engine = mod.graphs[key]
        else:
            why = {e: engine_decline(e, fn, call) if engine_decline is not None else None for e in plans}
            offered = [e for e in (order or {}).get(fn, plans) if not why.get(e)]
            if not offered:
                raise _no_plan("; ".join(f"{e}: {w}" for e, w in why.items()))
            if plan_cache:  # cached before the pin is selected (ops/kda.py), so a refused pin leaves it unpinned
                mod.graphs[key] = offered[0]
            if plan_name is not None and plan_name not in offered:
                raise cudnnGraphNotSupportedError(f"no {plan_name} plan for this graph (offered: {offered})")
            engine = plan_name or offered[0]
            if plan_cache:
                mod.graphs[key] = engine
        ops = getattr(mod, "ops", None)  # a test may take it away (an FE of another layout)
        (getattr(ops, op).execute_graph if ops is not None else _execute_graph)(_Graph(engine), {}, None, None)

        kwargs = dict(  # noqa: C408 - mirrors the keyword call it feeds
            scale=call["scale"], initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=call["use_qk_l2norm_in_kernel"],
            use_beta_sigmoid_in_kernel=call["use_beta_sigmoid_in_kernel"],
            allow_neg_eigval=call["allow_neg_eigval"], gate_domain=call["gate_domain"],
            safe_gate=call["safe_gate"], a_log=a_log, dt_bias=dt_bias,
            layout="thd", state_layout="vk", method="oracle", compute_dtype=torch.float64,
        )
        if op in ("kda", "gdn2"):
            lb = call["gate_lower_bound"]
            kwargs["gate_lower_bound"] = -5.0 if lb is None else float(lb)
        if call.get("beta_guard"):
            kwargs["beta_guard"] = True
        args = [q, k, v, g, beta] + ([w] if op == "gdn2" else []) + [cu_seqlens]
        if op == "gdp":
            args.append(call["num_householder"])
        o, final_state = getattr(reference, op)(*args, **kwargs)
        state_dtype = state.dtype if state is not None else torch.float32
        if not exact:
            o, final_state = o.to(q.dtype), final_state.to(state_dtype)
        if backward_decline is not None:
            why = backward_decline(fn, call)
            if why:
                def refuse(grad, why=why):
                    raise _no_plan(why)

                if o.requires_grad:
                    o.register_hook(refuse)
        if contiguous_grads:
            for name, t in (("d_out", o), ("d_final_state", final_state)):
                if t.requires_grad:
                    t.register_hook(lambda grad, name=name: _refuse_strided(name, grad))
        if not call["output_final_state"]:
            final_state = torch.empty(0, dtype=state_dtype, device=q.device)
        return o, final_state

    def gated_delta_net(
        q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, batch_invariant=False, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, safe_gate=False, gate_domain="log", a_log=None, dt_bias=None,
        checkpoint_every_n_tokens=0, checkpoint_dtype=None, plan_name=None, overwrite_initial_state=False,
        state_indices=None,
    ):
        call = dict(locals())
        if scale is None:
            call["scale"] = 1.0 / math.sqrt(q.shape[-1])
        call["gate_lower_bound"] = None
        return run("gated_delta_net", "gdn", q, k, v, g, beta, None, cu_seqlens, call)

    def kimi_delta_attention(
        q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, batch_invariant=False, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, safe_gate=False, gate_lower_bound=None, gate_domain="log", a_log=None,
        dt_bias=None, checkpoint_every_n_tokens=0, checkpoint_dtype=None, plan_name=None,
        overwrite_initial_state=False, state_indices=None,
    ):
        call = dict(locals())
        if scale is None:
            call["scale"] = 1.0 / math.sqrt(q.shape[-1])
        return run("kimi_delta_attention", "kda", q, k, v, g, beta, None, cu_seqlens, call)

    def gated_delta_net_v2(
        q, k, v, g, beta, w, cu_seqlens, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, batch_invariant=False, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, beta_guard=False, safe_gate=False, gate_domain="log", gate_lower_bound=None,
        a_log=None, dt_bias=None, checkpoint_every_n_tokens=0, checkpoint_dtype=None, plan_name=None,
        overwrite_initial_state=False, state_indices=None,
    ):
        call = dict(locals())
        if scale is None:
            call["scale"] = 1.0 / math.sqrt(q.shape[-1])
        return run("gated_delta_net_v2", "gdn2", q, k, v, g, beta, w, cu_seqlens, call)

    def gated_delta_product(
        q, k, v, g, beta, cu_seqlens, num_householder, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, batch_invariant=False, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, safe_gate=False, gate_domain="log", a_log=None, dt_bias=None,
        checkpoint_every_n_tokens=0, checkpoint_dtype=None, plan_name=None, overwrite_initial_state=False,
        state_indices=None,
    ):
        call = dict(locals())
        if q.dim() != 3:
            raise ValueError("expected THD [total_tokens, heads, dim] tensors")
        if scale is None:
            call["scale"] = 1.0 / math.sqrt(q.shape[-1])
        call["gate_lower_bound"] = None
        return run("gated_delta_product", "gdp", q, k, v, g, beta, None, cu_seqlens, call)

    mod.gated_delta_net = gated_delta_net
    mod.kimi_delta_attention = kimi_delta_attention
    mod.gated_delta_net_v2 = gated_delta_net_v2
    mod.gated_delta_product = gated_delta_product
    return mod
