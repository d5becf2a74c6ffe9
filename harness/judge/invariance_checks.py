"""The invariance checks (issue 26): batch invariance, CUDA-graph replay, causality. They compare a backend with
itself (no reference), on training-style cases, so they run over the ordinary tiers. Verdict rules:
docs/serving.md, "The serving checks".
"""

from __future__ import annotations

import torch

from deltacheck.cases.inputs import make_inputs

from ..backends.serving import ServingCall
from .segments import bitwise_equal
from .serving_checks import CheckResult, _guarded, _result, serving_decline

TOKENWISE = ("q", "k", "v", "g", "beta", "w")
_SUBTOKEN = ("k", "v", "beta")  # GDP's expanded rows: num_householder per token


def _rows(case, name: str) -> int:
    return case.num_householder if case.op == "gdp" and name in _SUBTOKEN else 1


def _max_abs(a, b) -> float:
    a, b = a.detach().cpu().to(torch.float64), b.detach().cpu().to(torch.float64)
    if a.shape != b.shape:
        return float("inf")
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return float(diff.max()) if diff.numel() else 0.0


def _bitwise(a, b) -> bool:
    return bitwise_equal(a.detach().cpu(), b.detach().cpu())


def _finite(*tensors) -> bool:
    """Every element of every tensor finite: a NaN spread bounds any difference, and equal NaN bits look equal."""
    return all(bool(torch.isfinite(x.detach()).all()) for x in tensors)


# --- batch invariance ----------------------------------------------------------------------------------------------

def _sub_batch(case, inputs: dict, order: list[int]):
    """The case and inputs of the sequences ``order`` (packed thd, in that order), sliced from ``inputs``."""
    offsets = inputs["cu_seqlens"].tolist()
    sub = case.replace(seqlens=tuple(case.seqlens[i] for i in order), splits=())
    out = dict(inputs)
    for name in TOKENWISE:
        x = inputs.get(name)
        if x is None:
            continue
        r = _rows(case, name)
        out[name] = torch.cat([x[offsets[i] * r:offsets[i + 1] * r] for i in order]).contiguous()
    cu = [0]
    for i in order:
        cu.append(cu[-1] + case.seqlens[i])
    out["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=inputs["q"].device)
    if inputs.get("initial_state") is not None:
        out["initial_state"] = inputs["initial_state"][order].contiguous()
    return sub, out


def batch_invariance(backend, case, env, device="cpu") -> CheckResult:
    """Sequence 0 alone, in the case's batch and in the batch reversed: bitwise equal outputs and final states where
    the backend promises it (``serving_verdict(case, "batch_invariant")`` runnable: the call then carries
    ``batch_invariant=True``); otherwise the spread (max |diff|) is reported, status ``reported``."""
    check = "batch_invariance"
    if case.layout != "thd" or case.N < 2 or case.seqlens[0] == 0 or case.backward:
        return _result(check, backend, case, "declined", "needs a forward thd batch of >= 2 sequences, the first "
                                                          "non-empty")
    verdict = backend.check(case, env)
    if not verdict.runnable:
        return _result(check, backend, case, "declined", verdict.reason)
    promised = serving_decline(backend, case, "batch_invariant", env) is None

    def go():
        inputs = make_inputs(case, device)
        compositions = {"alone": [0], "batch": list(range(case.N)), "reversed": list(range(case.N))[::-1]}
        seen = {}
        for label, order in compositions.items():
            sub, sub_inputs = _sub_batch(case, inputs, order)
            if promised:
                got = backend.serve(sub, sub_inputs, ServingCall("batch_invariant", batch_invariant=True))
                out, state = got.out, got.final_state
            else:
                out, state = backend.run(sub, sub_inputs)
            pos = order.index(0)
            start = sum(case.seqlens[i] for i in order[:pos])
            seen[label] = (out[start:start + case.seqlens[0]], state[pos])
        ref_out, ref_state = seen["alone"]
        out_spread = max(_max_abs(o, ref_out) for o, _ in seen.values())
        state_spread = max(_max_abs(s, ref_state) for _, s in seen.values())
        identical = all(_bitwise(o, ref_out) and _bitwise(s, ref_state) for o, s in seen.values())
        # NaN bits equal NaN bits: an all-NaN sequence is "bitwise invariant", never a pass.
        finite = _finite(*(x for pair in seen.values() for x in pair))
        numbers = {"promised": promised, "bitwise": identical, "out_spread": out_spread, "state_spread": state_spread,
                   "finite": finite}
        if not promised:
            return _result(check, backend, case, "reported", "batch invariance not promised; spread reported",
                           **numbers)
        if not finite:
            return _result(check, backend, case, "failed", "non-finite outputs or states for sequence 0: bitwise "
                           "equal NaNs are no invariance", **numbers)
        if identical:
            return _result(check, backend, case, "passed", **numbers)
        return _result(check, backend, case, "failed", f"batch_invariant=True promised, but sequence 0 differs "
                       f"across batches: out {out_spread:.3g}, state {state_spread:.3g} (max |diff|)", **numbers)

    return _guarded(check, backend, case, go)


# --- CUDA-graph replay ---------------------------------------------------------------------------------------------

def cuda_graph_capture(backend, case, static: dict):
    """Capture ``backend.run(case, static)`` once in a ``torch.cuda.CUDAGraph`` (after two warm-up calls on a side
    stream, so autotuning and lazy allocations happen outside the capture); the replay returns copies of the
    captured outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            backend.run(case, static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, state = backend.run(case, static)

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return out.clone(), state.clone()

    return replay


def graph_replay(backend, case, env, device="cpu") -> CheckResult:
    """Capture once, refill the captured input buffers with fresh inputs of the same shapes (the case at seed + 1),
    replay: the outputs and final state equal an eager call on the fresh inputs bitwise, or within the determinism
    spread (max |diff| of two eager calls on them); a non-finite output or state (replay or eager) fails."""
    check = "graph_replay"
    if case.backward:
        return _result(check, backend, case, "declined", "graph replay is checked on forward calls")
    verdict = backend.check(case, env)
    if not verdict.runnable:
        return _result(check, backend, case, "declined", verdict.reason)
    graph_verdict = getattr(backend, "graph_verdict", None)
    if callable(graph_verdict):
        verdict = graph_verdict(case, env)
        if not verdict.runnable:
            return _result(check, backend, case, "declined", verdict.reason)
    capture = getattr(backend, "capture_graph", None)
    if not callable(capture):
        if str(device).startswith("cuda"):
            def capture(c, s):
                return cuda_graph_capture(backend, c, s)
        else:
            return _result(check, backend, case, "declined", "torch.cuda.CUDAGraph needs a GPU, and the backend has "
                                                              "no capture_graph hook")

    def go():
        static = make_inputs(case, device)
        fresh = make_inputs(case.replace(seed=case.seed + 1), device)
        try:
            replay = capture(case, static)
        except Exception as exc:  # noqa: BLE001 - a library's refusal of capture is its answer, with its words
            if "captur" not in str(exc).lower():
                raise
            return _result(check, backend, case, "declined", f"capture refused: {type(exc).__name__}: {exc}")
        for name, x in fresh.items():
            if isinstance(x, torch.Tensor):
                static[name].copy_(x)
        got_out, got_state = replay()
        eager = [backend.run(case, fresh) for _ in range(2)]
        spread_out, spread_state = _max_abs(eager[0][0], eager[1][0]), _max_abs(eager[0][1], eager[1][1])
        diff_out, diff_state = _max_abs(got_out, eager[0][0]), _max_abs(got_state, eager[0][1])
        # A non-finite result makes the spread inf or NaN, which would bound any replay: never a pass.
        finite = _finite(got_out, got_state, *eager[0], *eager[1])
        numbers = {"out_diff": diff_out, "state_diff": diff_state, "out_spread": spread_out,
                   "state_spread": spread_state, "finite": finite,
                   "bitwise": _bitwise(got_out, eager[0][0]) and _bitwise(got_state, eager[0][1])}
        if not finite:
            return _result(check, backend, case, "failed", "non-finite outputs or states (replay or eager): no spread "
                           "bounds the replay", **numbers)
        if diff_out <= spread_out and diff_state <= spread_state:
            return _result(check, backend, case, "passed", **numbers)
        return _result(check, backend, case, "failed", f"replay on fresh inputs differs from eager: out {diff_out:.3g}"
                       f" (spread {spread_out:.3g}), state {diff_state:.3g} (spread {spread_state:.3g})", **numbers)

    return _guarded(check, backend, case, go)


# --- causality -----------------------------------------------------------------------------------------------------

def _token_axis(case) -> int:
    return {"thd": 0, "bshd": 1, "sbhd": 0, "bhsd": 2}[case.layout]


def _future_mask(case, device) -> tuple[torch.Tensor, list[int]]:
    """Per packed token (thd) or sequence position (dense), True at tokens >= the cut; the cut of each sequence is
    half its length (a sequence shorter than 2 has none)."""
    cuts = [L // 2 if L >= 2 else L for L in case.seqlens]
    if case.layout != "thd":
        L = case.seqlens[0]
        return torch.arange(L, device=device) >= cuts[0], cuts
    mask = torch.cat([torch.arange(L, device=device) >= c for L, c in zip(case.seqlens, cuts)])
    return mask, cuts


def _along(x: torch.Tensor, mask: torch.Tensor, axis: int) -> torch.Tensor:
    shape = [1] * x.dim()
    shape[axis] = mask.numel()
    return mask.reshape(shape)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at the magnitude of ``x`` (fp64 tensor), the smallest normal's at 0."""
    info = torch.finfo(dtype)
    mag = x.abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def causality(backend, case, env, device="cpu") -> CheckResult:
    """Redraw q, k, v, g, beta (and w) at every token >= the cut (half of each sequence): outputs before the cut are
    unchanged, bitwise for a recurrent kernel (``causal_rule`` "bitwise", the default) and within one ulp of the
    output dtype for a chunked one ("chunked"); no output is non-finite."""
    check = "causality"
    if case.backward:
        return _result(check, backend, case, "declined", "causality is checked on forward calls")
    verdict = backend.check(case, env)
    if not verdict.runnable:
        return _result(check, backend, case, "declined", verdict.reason)
    rule_of = getattr(backend, "causal_rule", None)
    rule = rule_of(case) if callable(rule_of) else "bitwise"

    def go():
        inputs = make_inputs(case, device)
        other = make_inputs(case.replace(seed=case.seed + 1), device)
        mask, cuts = _future_mask(case, inputs["q"].device)
        axis = _token_axis(case)
        perturbed = dict(inputs)
        for name in TOKENWISE:
            if inputs.get(name) is None:
                continue
            rows = torch.repeat_interleave(mask, _rows(case, name)) if case.layout == "thd" else mask
            m = _along(inputs[name], rows, axis)
            perturbed[name] = torch.where(m, other[name], inputs[name]).contiguous()
        out0, _ = backend.run(case, inputs)
        out1, _ = backend.run(case, perturbed)
        states = _states_before_cut(backend, case, env, inputs, perturbed, cuts)
        before = ~_along(out0, mask, _token_axis(case))
        a = torch.masked_select(out0.detach(), before).to(torch.float64)
        b = torch.masked_select(out1.detach(), before).to(torch.float64)
        finite = _finite(out1, out0)
        diff = (a - b).abs()
        ulps = float((diff / ulp(torch.maximum(a.abs(), b.abs()), out0.dtype)).max()) if diff.numel() else 0.0
        numbers = {"rule": rule, "cuts": cuts, "max_abs_before": float(diff.max()) if diff.numel() else 0.0,
                   "max_ulps_before": ulps, "finite": finite, "states": states}
        problems = []
        if isinstance(states, dict) and not states["unchanged"]:
            problems.append(f"per-token states before the cut changed (max |diff| {states['max_abs']:.3g})")
        if not finite:
            problems.append("non-finite outputs")
        if rule == "bitwise" and not _bitwise(torch.masked_select(out0.detach(), before),
                                              torch.masked_select(out1.detach(), before)):
            problems.append(f"outputs before the cut changed (max |diff| {numbers['max_abs_before']:.3g}); a "
                            "recurrent kernel must leave them bit-identical")
        if rule == "chunked" and ulps > 1.0:
            problems.append(f"outputs before the cut changed by {ulps:.3g} ulps of {out0.dtype} (> 1)")
        return _result(check, backend, case, "failed" if problems else "passed", "; ".join(problems), **numbers)

    return _guarded(check, backend, case, go)


def _states_before_cut(backend, case, env, inputs, perturbed, cuts):
    """The state after each token before the cut, from both inputs, where the backend serves per-token states
    (its "spec" mode with one slot per token, started from slot [n, 0] holding the initial state): bit-identical
    (both come from the same recurrent path). Returns a dict, or why it was not compared."""
    if case.layout != "thd" or serving_decline(backend, case, "spec", env) is not None:
        return "not compared: no per-token states from this backend (its spec mode)"
    null = getattr(backend, "null_slot", None)
    first = null.first_real() if null is not None else 0
    width = max(max(case.seqlens), 1)
    table = torch.tensor([[first + n * width + t for t in range(width)] for n in range(case.N)], dtype=torch.int32)
    rows = first + case.N * width
    got = []
    for which in (inputs, perturbed):
        pool = torch.zeros(rows, case.HO, case.V, case.K, dtype=torch.float32, device=inputs["q"].device)
        h0 = which.get("initial_state")
        if h0 is not None:
            pool[table[:, 0].long()] = h0.to(torch.float32)
        table_d = table.to(pool.device)
        out = backend.serve(case, which, ServingCall("spec", pool=pool, state_indices=table_d))
        got.append(out.pool if out.pool is not None else pool)
    keep = [int(table[n, t]) for n, c in enumerate(cuts) for t in range(c)]
    if not keep:
        return {"unchanged": True, "max_abs": 0.0, "rows": 0}
    a, b = got[0][keep], got[1][keep]
    return {"unchanged": _bitwise(a, b), "max_abs": _max_abs(a, b), "rows": len(keep)}


INVARIANCE_CHECKS = {"batch_invariance": batch_invariance, "graph_replay": graph_replay, "causality": causality}
