"""The serving checks (issue 26): pool integrity, decode chain == one prefill, speculative decoding, checkpoints.

Each is a named check with its own verdict rule (docs/serving.md, "The serving checks"), run through a backend's
serving hook (``harness/backends/serving.py``) and judged against ``reference.serving`` in fp64 on the same inputs.
"Within tolerance" is the forward tolerance of the training-style checks (``compare.tolerance(op, io, "out" |
"state").threshold``, rel RMS), applied per sequence (outputs) and per pool row (states): a pool bug touches a
row or a sequence, and an average over the whole pool would dilute it. "Bit-identical" compares raw bits.

A check returns a ``CheckResult``: ``passed`` / ``failed`` / ``declined`` (with the reason: no hook, the backend's
own decline, a case outside the backend's convention) / ``error`` (the call raised). The invariance checks
(batch invariance, CUDA-graph replay, causality) are in ``invariance_checks.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from deltacheck.cases.inputs import make_inputs
from deltacheck.reference import serving as sv

from ..backends.base import RunDeclined
from ..backends.serving import ServingCall
from . import serving_inputs as si
from .compare import rel_rms, tolerance


@dataclass
class CheckResult:
    check: str
    backend: str
    case: str
    status: str  # passed | failed | declined | error
    reason: str = ""
    numbers: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"check": self.check, "backend": self.backend, "case": self.case, "status": self.status,
                "reason": self.reason, "numbers": self.numbers}


def _result(check, backend, case, status, reason="", **numbers) -> CheckResult:
    return CheckResult(check, getattr(backend, "name", str(backend)), case.id, status, reason, numbers)


def serving_decline(backend, case, mode: str, env) -> str | None:
    """Why ``backend`` cannot serve ``case`` in ``mode``, or None: the case itself first (``check``), then the hook."""
    verdict = backend.check(case, env)
    if not verdict.runnable:
        return verdict.reason
    if not callable(getattr(backend, "serve", None)) or not callable(getattr(backend, "serving_verdict", None)):
        return f"{getattr(backend, 'name', backend)} has no serving hook (serving_verdict/serve)"
    verdict = backend.serving_verdict(case, mode, env)
    return None if verdict.runnable else verdict.reason


def _limits(case) -> tuple[float, float]:
    return tolerance(case.op, case.io_dtype, "out").threshold, tolerance(case.op, case.io_dtype, "state").threshold


def _err(actual, expected) -> float:
    a = actual.detach().cpu().to(torch.float64)
    if a.shape != expected.shape:
        return math.inf
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return rel_rms(a, expected.to(torch.float64))


def _out_errors(case, got_out, ref_out, null) -> list[float]:
    """Per non-null sequence, the output's rel RMS against the reference."""
    got = got_out.detach().cpu()
    if got.shape != ref_out.shape:
        return [math.inf]
    return [_err(got[a:b], ref_out[a:b]) for (a, b), z in zip(si.token_rows(case), null) if not z and b > a]


def _pool_numbers(case, got_pool, expected: sv.Served, before) -> dict:
    """Addressed rows within the state limit, every other row bit-identical (``reference.serving.compare_pool``)."""
    got = got_pool.detach().cpu()
    if got.shape != before.shape or got.dtype != before.dtype:
        return {"pool_shape": f"{list(got.shape)} {got.dtype} vs the {list(before.shape)} {before.dtype} given",
                "row_err": math.inf, "changed_rows": []}
    cmp = sv.compare_pool(got, expected.pool, before.cpu(), expected.written, atol=math.inf, rtol=0.0)
    rows = {r: _err(got[r], expected.pool[r]) for r in sorted(set(expected.written))}
    return {"row_err": max(rows.values(), default=0.0), "worst_row": max(rows, key=rows.get) if rows else None,
            "changed_rows": list(cmp.changed_rows)}


def _verdict(check, backend, case, numbers: dict, out_limit: float, state_limit: float) -> CheckResult:
    problems = []
    if numbers.get("out_err", 0.0) > out_limit:
        problems.append(f"output rel RMS {numbers['out_err']:.3g} > {out_limit:g}")
    for key in ("row_err", "picked_err", "prefill_row_err", "prefill_out_err", "checkpoint_err"):
        limit = out_limit if key == "prefill_out_err" else state_limit
        if numbers.get(key, 0.0) > limit:
            problems.append(f"{key.replace('_', ' ')} {numbers[key]:.3g} > {limit:g}")
    if numbers.get("changed_rows"):
        problems.append(f"rows no sequence addresses changed: {numbers['changed_rows']}")
    if "pool_shape" in numbers:
        problems.append(f"pool came back {numbers['pool_shape']}")
    status = "failed" if problems else "passed"
    return _result(check, backend, case, status, "; ".join(problems), **numbers)


def _prepare(check, backend, case, env, mode, device):
    """Inputs, pool and tables, or a declined CheckResult."""
    if mode != "checkpoints" and not case.pool:
        return _result(check, backend, case, "declined", f"{case.id} has no pool axis")
    reason = serving_decline(backend, case, mode, env)
    if reason:
        return _result(check, backend, case, "declined", reason)
    null_slot = getattr(backend, "null_slot", None)
    inputs = make_inputs(case, device)
    if mode == "checkpoints":
        return inputs, None, None, None, null_slot
    try:
        table, accepted = si.index_table(case, null_slot, device)
    except si.NoNullSlot as exc:
        return _result(check, backend, case, "declined", f"{getattr(backend, 'name', backend)}: {exc}")
    return inputs, si.pool_tensor(case, device), table, accepted, null_slot


def _guarded(check, backend, case, fn) -> CheckResult:
    try:
        return fn()
    except RunDeclined as exc:  # the library's refusal at the call itself: a decline with its reason
        return _result(check, backend, case, "declined", str(exc))
    except Exception as exc:  # noqa: BLE001 - a kernel's exception is a result, never a crash of the run
        return _result(check, backend, case, "error", f"{type(exc).__name__}: {exc}")


def pool_integrity(backend, case, env, device="cpu") -> CheckResult:
    """Pool in -> pool out: outputs and addressed rows within tolerance; every other row bit-identical."""
    check = "pool_integrity"
    prepared = _prepare(check, backend, case, env, "pool", device)
    if isinstance(prepared, CheckResult):
        return prepared
    inputs, pool, idx, _, null_slot = prepared

    def go():
        before = pool.clone()
        expected = si.reference_pool(case, inputs, before, idx, null_slot)
        got = backend.serve(case, inputs, ServingCall("pool", pool=pool, state_indices=idx))
        numbers = {"out_err": max(_out_errors(case, got.out, expected.out, expected.null), default=0.0),
                   **_pool_numbers(case, got.pool if got.pool is not None else pool, expected, before)}
        return _verdict(check, backend, case, numbers, *_limits(case))

    return _guarded(check, backend, case, go)


def _step_inputs(case, inputs: dict, j: int) -> dict:
    """Token j of every sequence (a decode step of a chain case): the sub-token rows of GDP's k, v, beta too."""
    n, nh = case.chain, case.num_householder
    rows = torch.arange(case.N, device=inputs["q"].device) * n + j
    sub = (rows[:, None] * nh + torch.arange(nh, device=rows.device)).reshape(-1)
    step = dict(inputs)
    for name in ("q", "k", "v", "g", "beta", "w"):
        x = inputs.get(name)
        if x is None:
            continue
        expanded = case.op == "gdp" and name in ("k", "v", "beta")
        step[name] = x.index_select(0, sub if expanded else rows).contiguous()
    step["cu_seqlens"] = torch.arange(case.N + 1, dtype=torch.int32, device=rows.device)
    return step


def _run_prefill(backend, case, inputs, pool, idx, null) -> tuple:
    """One plain prefill from the rows the table names (zeros for a null sequence): ``(out, final states as pool
    rows [N, HO, V, K])``, for a backend whose pool mode is decode-only."""
    prefill_case = case.replace(pool=0, nulls=0, chain=0, initial_state=True)
    rows = [torch.zeros_like(pool[0]) if z else pool[int(i)] for i, z in zip(idx.tolist(), null)]
    out, final = backend.run(prefill_case, dict(inputs, initial_state=torch.stack(rows).contiguous()))
    return out, final.transpose(-1, -2)


def decode_chain(backend, case, env, device="cpu") -> CheckResult:
    """n decode steps through the pool == one prefill over the n tokens: the chain within tolerance of the reference
    and of the backend's own prefill (outputs and final states), unaddressed rows bit-identical; bitwise equality
    with the prefill is reported (``chain_equals_prefill``), not required: a chunked prefill rounds differently. The
    prefill goes through the pool when the backend's pool mode takes it, else through ``run`` from the same rows."""
    check = "decode_chain"
    if not case.chain:
        return _result(check, backend, case, "declined", f"{case.id} has no chain axis")
    step_case = case.replace(seqlens=(1,) * case.N, chain=0)
    prepared = _prepare(check, backend, step_case, env, "pool", device)
    if isinstance(prepared, CheckResult):
        return _result(check, backend, case, "declined", prepared.reason)
    _, pool, idx, _, null_slot = prepared
    inputs = make_inputs(case, device)
    prefill_in_pool = serving_decline(backend, case, "pool", env) is None

    def go():
        before = pool.clone()
        expected = si.reference_pool(case, inputs, before, idx, null_slot)
        if prefill_in_pool:
            prefill_pool = pool.clone()
            prefill = backend.serve(case, inputs, ServingCall("pool", pool=prefill_pool, state_indices=idx))
            prefill_pool = prefill.pool if prefill.pool is not None else prefill_pool
            prefill_out = prefill.out
            prefill_rows = {r: prefill_pool[r] for r in expected.written}
        else:
            prefill_out, finals = _run_prefill(backend, case, inputs, before, idx, expected.null)
            live = [i for i, z in zip(idx.tolist(), expected.null) if not z]
            prefill_rows = {r: finals[n] for n, r in enumerate(idx.tolist()) if r in live}
        current, outs = pool, []
        for j in range(case.chain):
            got = backend.serve(step_case, _step_inputs(case, inputs, j), ServingCall("pool", pool=current,
                                                                                      state_indices=idx))
            current = got.pool if got.pool is not None else current
            outs.append(got.out.detach().cpu())
        chain_out = torch.stack(outs, dim=1).reshape(case.total_tokens, *outs[0].shape[1:])
        # A null sequence keeps no state between steps (reference/serving.py): its chain output is not its prefill
        # output, so outputs are compared for the non-null sequences only (as everywhere).
        numbers = {"out_err": max(_out_errors(case, chain_out, expected.out, expected.null), default=0.0),
                   **_pool_numbers(case, current, expected, before),
                   "prefill": "pool" if prefill_in_pool else "run"}
        numbers["prefill_row_err"] = max((_err(current[r], prefill_rows[r].detach().cpu().to(torch.float64))
                                          for r in prefill_rows), default=0.0)
        numbers["prefill_out_err"] = max(_out_errors(case, chain_out, prefill_out.detach().cpu().to(torch.float64),
                                                     expected.null), default=0.0)
        numbers["chain_equals_prefill"] = all(
            bool(torch.equal(current[r].detach().cpu(), prefill_rows[r].detach().cpu().to(current.dtype)))
            for r in prefill_rows)
        return _verdict(check, backend, case, numbers, *_limits(case))

    return _guarded(check, backend, case, go)


def speculative(backend, case, env, device="cpu") -> CheckResult:
    """Speculative verification: start from slot ``[n, accepted_n]`` (``num_accepted_tokens = accepted + 1``), store
    the state after every token at ``[n, t]``: outputs and every per-token slot within tolerance, other rows
    bit-identical, and the state the next step picks (``picked_err``) within tolerance."""
    check = "speculative"
    if not case.draft:
        return _result(check, backend, case, "declined", f"{case.id} has no spec axis")
    prepared = _prepare(check, backend, case, env, "spec", device)
    if isinstance(prepared, CheckResult):
        return prepared
    inputs, pool, table, accepted, null_slot = prepared

    def go():
        before = pool.clone()
        expected = si.reference_spec(case, inputs, before, table, accepted, null_slot)
        got = backend.serve(case, inputs, ServingCall("spec", pool=pool, state_indices=table,
                                                      num_accepted_tokens=accepted))
        got_pool = got.pool if got.pool is not None else pool
        numbers = {"out_err": max(_out_errors(case, got.out, expected.out, expected.null), default=0.0),
                   **_pool_numbers(case, got_pool, expected, before)}
        live = [n for n, z in enumerate(expected.null) if not z]
        if live and "pool_shape" not in numbers:
            picked = sv.picked_state(got_pool.detach().cpu(), table.cpu()[live], accepted.cpu()[live])
            want = sv.picked_state(expected.pool, table.cpu()[live], accepted.cpu()[live])
            numbers["picked_err"] = max(_err(picked[i], want[i]) for i in range(len(live)))
        return _verdict(check, backend, case, numbers, *_limits(case))

    return _guarded(check, backend, case, go)


def checkpoints(backend, case, env, device="cpu") -> CheckResult:
    """cuDNN's checkpoint series: every row ``reference.serving.checkpoint_rows`` names within the state limit of
    the reference's (p = 0 is the initial state; the final state is never a row)."""
    check = "checkpoints"
    if not case.checkpoint_every:
        return _result(check, backend, case, "declined", f"{case.id} has no ckpt axis")
    prepared = _prepare(check, backend, case, env, "checkpoints", device)
    if isinstance(prepared, CheckResult):
        return prepared
    inputs = prepared[0]

    def go():
        expected = si.reference_checkpoints(case, inputs)
        got = backend.serve(case, inputs, ServingCall("checkpoints", checkpoint_every=case.checkpoint_every))
        rows = sv.checkpoint_rows(si.cu_seqlens(case), case.checkpoint_every, case.num_householder)
        needed = sum(count for _, count in rows)
        series = got.checkpoints.detach().cpu() if got.checkpoints is not None else None
        if series is None or series.shape[0] < needed or series.shape[1:] != expected.shape[1:]:
            shape = None if series is None else list(series.shape)
            return _result(check, backend, case, "failed", f"checkpoints came back {shape}; {needed} rows of "
                           f"{list(expected.shape[1:])} needed", rows_needed=needed)
        errors = [_err(series[r], expected[r]) for r in range(needed)]
        numbers = {"checkpoint_err": max(errors, default=0.0), "rows": needed,
                   "worst_row": max(range(needed), key=errors.__getitem__) if needed else None}
        return _verdict(check, backend, case, numbers, *_limits(case))

    return _guarded(check, backend, case, go)


SERVING_CHECKS = {"pool_integrity": pool_integrity, "decode_chain": decode_chain, "speculative": speculative,
                  "checkpoints": checkpoints}
