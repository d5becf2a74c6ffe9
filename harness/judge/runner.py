"""The runner: per case x backend, every check as its own Result, streamed as it finishes.

Checks: ``forward`` (output), ``state`` (final state), ``continuation_ref`` and ``continuation_self``
(the case split at its points with the state carried, against the reference and against the backend's
own single call), ``grad_<input>`` (weighted loss on output and final state, against fp64 autograd
through the reference), ``determinism`` (two runs, bitwise, and no call wrote to its input buffers).
Inputs handed to a backend sit inside larger buffers whose margins hold NaN, so an out-of-bounds read poisons the
output and fails ``forward`` with a NaN count, and an out-of-bounds write into a margin (or any write to an input)
fails ``determinism``; an adapter that converts a layout or dtype makes its copy with the same margin
(harness/judge/margins.py ``with_margin``), so the margin survives in the layout the kernel reads. Any NaN in an
output fails its check; an adapter that allocates an
output itself should prefill it with NaN so an unwritten tail shows up the same way (today's cuDNN
and FLA adapters do not allocate: the libraries do, with ``torch.empty``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deltacheck.cases import Case, make_inputs

from ..backends.base import Backend, RunDeclined, Verdict, backend_for
from ..ci.known import load_known_issues
from ..records.results import Result
from . import compare, margins
from .checks import checks_for, grad_inputs, stage_checks, task_result
from .expected import (
    F64,
    GRAD_NAMES,
    Expected,
    ReferenceFailure,
    compute_expected,
    input_grads,
    reference_name,
    synchronize,
    weighted_loss,
)
from .reductions import judge_reduction
from .segments import (  # noqa: F401 - guarded and segment_inputs are imported from here by tests and adapters
    bitwise_equal,
    guarded,
    offsets_of,
    run_in_segments,
    segment_inputs,
    snapshot,
    to_packed,
    written,
)


@dataclass
class RunOptions:
    device: str = "cpu"
    reference: str = "auto"  # oracle | chunked | auto
    baseline: bool = True  # compute the same-precision baseline for the FlashAttention criterion
    margin: int = 64  # NaN elements each side of every input buffer
    known_issues: tuple[str, ...] = ()  # known-issues files (harness/ci/known.py), loaded by every worker
    threads: int | None = None  # torch threads in each process that runs tasks (cores.torch_threads); None: torch's


class _Judged:
    """The results of the task being judged, in order; each goes to ``sink`` the moment it is added, so a hard
    crash later in the same case loses none of the checks already judged."""

    def __init__(self, sink=None):
        self.items: list[Result] = []
        self.sink = sink

    def add(self, *results: Result) -> None:
        for result in results:
            self.items.append(result)
            if self.sink is not None:
                self.sink(result)

    def checks(self) -> set[str]:
        return {r.check for r in self.items}


class CaseRunner:
    """Runs every check of one (case, backend) pair; caches the expected values of the last case."""

    def __init__(self, opts: RunOptions, keep: int = 1):
        self.opts = opts
        if opts.threads:  # every process that runs tasks (a worker, or the in-process run) makes one CaseRunner
            torch.set_num_threads(opts.threads)
        self.keep = keep  # how many cases' expected values to hold (tasks arrive case-major: 1 suffices)
        self._expected: dict[str, Expected] = {}
        self._known = None
        self._snapshot: dict = {}  # the task's input buffers as handed over (segments.snapshot)
        self._no_h0: dict[str, tuple] = {}  # the reference without its initial state, where a failure asked
        self.phases: dict[str, float] = {}

    def known_issues(self) -> list:
        """The known-issues entries of ``opts.known_issues`` (loaded once; a bad file raises KnownIssuesError)."""
        if self._known is None:
            self._known = load_known_issues(self.opts.known_issues)
        return self._known

    def expected(self, case: Case, subject: str = "") -> Expected:
        """The reference side of ``case`` (cached); raises ReferenceFailure, also cached, if it failed."""
        ref = reference_name(case, self.opts.reference, subject)
        key = f"{case.id}|{ref}"
        if key not in self._expected:
            while len(self._expected) >= self.keep:
                self._expected.pop(next(iter(self._expected)))
            try:
                self._expected[key] = compute_expected(case, self.opts, ref)
            except Exception as exc:  # noqa: BLE001 - reported once per case as the reference's failure
                self._expected[key] = ReferenceFailure(f"the {ref} reference failed on this case: "
                                                       f"{type(exc).__name__}: {exc}")
        got = self._expected[key]
        if isinstance(got, ReferenceFailure):
            raise got
        return got

    def run(self, case: Case, backend: Backend, backend_spec: str, verdict: Verdict, env=None,
            sink=None) -> list[Result]:
        """Every check of (case, backend); each result also goes to ``sink`` as soon as it is judged. Where the
        time went is left in ``self.phases`` (seconds per phase, this task only)."""
        self.phases = {}
        results = _Judged(sink)
        with margins.use(self.opts.margin):  # the adapters' converted inputs carry the same NaN margin
            self._run(case, backend, backend_spec, verdict, results)
        return results.items

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Time a phase of the task (device work included: CUDA is synchronized at both ends)."""
        synchronize(self.opts.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.opts.device)
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def _run(self, case: Case, backend: Backend, backend_spec: str, verdict: Verdict, results: _Judged) -> None:
        # Every result of this task is made by checks.task_result: base(check=..., status=..., ...).
        base = functools.partial(task_result, case, backend_spec)
        if not verdict.runnable:
            results.add(*(base(check=c, status="skip", reason=verdict.reason) for c in checks_for(case)))
            return
        try:
            fresh = f"{case.id}|{reference_name(case, self.opts.reference, backend_spec)}" not in self._expected
            exp = self.expected(case, backend_spec)
            if fresh:  # computed for this task (a case's later backends reuse it)
                for name, seconds in exp.phases.items():
                    self.phases[name] = self.phases.get(name, 0.0) + seconds
        except ReferenceFailure as exc:  # not the backend's fault: no check can be judged
            results.add(*(base(check=c, status="error", reason=str(exc), metrics={"reference_failed": True})
                          for c in checks_for(case)))
            return
        # Stages are guarded one by one: an exception is that stage's error result, and the stages
        # after it still run. Only a failing first call leaves nothing to judge.
        forward = self._guard(results, case, base, "forward", self._forward, case, backend, verdict, base, exp)
        if forward is None:
            if self._declined:  # the library declined at the first call: every check is that decline
                self._fill(results, case, base, "skip", self._declined)
                return
            # the first call's error (a known-issues entry's error_contains then matches these checks too)
            self._fill(results, case, base, "error", f"not run: the first call raised {self._raised}".rstrip())
            return
        inputs, out, state = forward
        if case.splits:
            self._guard(results, case, base, "continuation_ref", self._continuation_checks, case, backend, inputs,
                        out, state, base, exp)
        self._guard(results, case, base, "determinism", self._determinism, case, backend, inputs, out, state, base)

    def _guard(self, results, case, base, stage, fn, *args):
        self._raised = self._declined = ""
        try:
            return fn(*args, results)
        except RunDeclined as exc:  # the library's refusal at the call (base.RunDeclined): a decline, not an error
            done = results.checks()
            self._declined = str(exc)
            results.add(*(base(check=c, status="skip", reason=self._declined)
                          for c in stage_checks(case, stage) if c not in done))
            return None
        except Exception as exc:  # noqa: BLE001 - a backend's exception is that stage's error result
            done = results.checks()
            reason = self._raised = f"{type(exc).__name__}: {exc}"
            tb = traceback.format_exc(limit=-3)
            results.add(*(base(check=c, status="error", reason=reason, metrics={"traceback": tb})
                          for c in stage_checks(case, stage) if c not in done))
            return None

    def _fill(self, results, case, base, status, reason):
        """Every check of ``case`` not judged yet gets ``status`` with ``reason``."""
        done = results.checks()
        results.add(*(base(check=c, status=status, reason=reason) for c in checks_for(case) if c not in done))

    def _judge(self, case, quantity, check, actual, expected, baseline, base, seconds, offsets=None,
               reduction: dict | None = None, kind: Callable | None = None):
        # The final state and a continuation (whose state is carried between calls) pass through the state dtype.
        carried = case.state_dtype if (quantity == "state" or check.startswith("continuation")) else None
        with self._phase("judging"):
            r = self._judged(case, quantity, check, actual, expected, baseline, base, seconds, offsets, reduction,
                             carried)
            if kind is not None and r.status == "fail":  # name the kind of wrong where that is cheap
                limit = r.metrics.get("limit", compare.tolerance(case.op, case.io_dtype, quantity).threshold)
                named = kind(actual, expected, limit)
                if named:
                    r.reason += f"; {named}"
                    r.metrics["kind_of_wrong"] = named
            return r

    def _kind(self, case, quantity: str, exp: Expected) -> Callable:
        """``kind(actual, expected, limit)`` for the forward's out or state: compare.kind_of_wrong with the case's
        scale and, for a case with an initial state, the reference run without it (computed only if asked)."""
        scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.K)

        def without_h0():
            key = f"{case.id}|{exp.reference}"
            if key not in self._no_h0:
                ref = backend_for(exp.reference)
                inputs = {n: (x.to(torch.float64) if x is not None and x.is_floating_point() else x)
                          for n, x in make_inputs(case, self.opts.device).items()}
                with torch.no_grad():
                    out, state = ref.run(case, dict(inputs, initial_state=None))
                self._no_h0.clear()  # the last case's only: tasks arrive case-major
                self._no_h0[key] = (to_packed(out, case).to(torch.float64), state.to(torch.float64))
            return self._no_h0[key]

        return lambda actual, expected, limit: compare.kind_of_wrong(
            quantity, actual, expected, limit, scale=scale, without_h0=without_h0 if case.initial_state else None)

    def _judged(self, case, quantity, check, actual, expected, baseline, base, seconds, offsets, reduction, carried):
        m = compare.metrics(actual, expected)
        if "shape_mismatch" in m:
            return base(check=check, status="fail", reason=f"shape mismatch: {m['shape_mismatch']}",
                          metrics=m, seconds=seconds)
        reduction = reduction or {}
        verdict = compare.judge(case.op, case.io_dtype, quantity, m["rel_rms"], baseline,
                                max_abs=m["max_abs"] if not (m["nan"] or m["inf"]) else None, carried=carried,
                                at_least=reduction.get("conditioned_limit"))
        m.update({k: v for k, v in verdict.items() if k != "passed"})
        m.update(reduction)
        self._detection_power(case, quantity, check, actual, expected, baseline, carried, reduction, m)
        if reduction.get("consistent") is False:
            return base(check=check, status="fail", metrics=m, seconds=seconds, reason=(
                f"{quantity} is not the sum the backend's own dg implies: rel RMS {m['consistency_rel_rms']:.3e} from "
                f"it > {m['consistency_limit']:.1e} (a wrong reduction, e.g. a dropped chain-rule factor)"))
        if offsets is not None:
            m.update(compare.localize(actual, expected, offsets, verdict["limit"]))
        ref_bad = int((~torch.isfinite(expected)).sum())
        if verdict["passed"]:
            return base(check=check, status="pass", metrics=m, seconds=seconds)
        if verdict["ill_posed"]:  # the same-precision baseline misses the threshold too: the case, not the kernel
            return base(check=check, status="skip", metrics=m, seconds=seconds, reason=(
                f"ill-posed at {case.io_dtype}: {quantity} rel RMS {m['rel_rms']:.3e} > threshold "
                f"{verdict['threshold']:.1e}, but the same-precision baseline misses it too ({_fmt(baseline)}) and "
                f"the error is within {compare.tolerance(case.op, case.io_dtype, quantity).c:g}x of it"))
        if m["nan"] or m["inf"]:
            reason = f"{m['nan']} NaN / {m['inf']} Inf in {quantity} (unwritten output, out-of-bounds read or overflow)"
            if ref_bad:
                reason += f"; the reference has {ref_bad} non-finite values too"
        else:
            reason = (f"{quantity} rel RMS {m['rel_rms']:.3e} > limit {verdict['limit']:.3e} "
                      f"(threshold {verdict['threshold']:.1e}, baseline {_fmt(baseline)})")
        if m.get("first_bad_token") is not None:
            reason += f"; diverges at token {m['first_bad_token']}, worst seq {m['worst_seq']}, head {m['worst_head']}"
        return base(check=check, status="fail", reason=reason, metrics=m, seconds=seconds)

    def _detection_power(self, case, quantity, check, actual, expected, baseline, carried, reduction, m) -> None:
        """``m["detects"]``: the smallest relative perturbation of this result the check fails (compare.detection_delta,
        the same judge and limit); ``m["detects_vs_baseline"]``: that over the same-precision baseline's error."""
        def fails(rel, max_abs):
            return not compare.judge(case.op, case.io_dtype, quantity, rel, baseline, max_abs=max_abs, carried=carried,
                                     at_least=reduction.get("conditioned_limit"))["passed"]

        seed = int.from_bytes(hashlib.sha256(f"{case.id}|{check}".encode()).digest()[:8], "little")
        delta = compare.detection_delta(actual, expected, fails, seed)
        if delta is None:
            return
        m["detects"] = delta
        if baseline is not None and math.isfinite(baseline) and baseline > 0:
            m["detects_vs_baseline"] = delta / baseline

    def _reduction(self, case, name, inputs, got, grads, exp) -> dict:
        """For a reduced parameter gradient (a_log, dt_bias): consistency with the backend's own dg, and the
        limit widened to c * baseline(dg) * conditioning (harness/judge/reductions.py)."""
        if name not in ("a_log", "dt_bias"):
            return {}
        out = judge_reduction(case, name, inputs, got, grads.get("g"), exp.grads.get("g"))
        b_dg, kappa = exp.baseline_err.get("dg"), out.get("conditioning")
        if b_dg is not None and kappa is not None and math.isfinite(b_dg) and math.isfinite(kappa):
            tol = compare.tolerance(case.op, case.io_dtype, GRAD_NAMES[name])
            out["conditioned_limit"] = tol.c * b_dg * kappa
        return out

    def _forward(self, case, backend, verdict, base, exp, results):
        opts = self.opts
        offsets = offsets_of(case)
        names = grad_inputs(case) if case.backward and verdict.backward else []
        inputs = {n: guarded(x, opts.margin) for n, x in make_inputs(case, opts.device).items()}
        for n in names:  # guarded() made fresh leaves, so the NaN margins stay around the grad inputs
            inputs[n].requires_grad_()
        self._snapshot = snapshot(inputs)  # the determinism check asks whether any call wrote to these buffers

        t0 = time.perf_counter()
        with torch.set_grad_enabled(bool(names)), self._phase("first_call"):
            out, state = backend.run(case, inputs)
        seconds = time.perf_counter() - t0
        served = getattr(backend, "served", None)  # e.g. cuDNN: {"engine": graph.selected_engine.name}
        packed = to_packed(out, case)
        # Judged (and streamed) before the backward runs: a crash in the backward keeps these.
        forward = self._judge(case, "out", "forward", packed, exp.out, exp.baseline_err.get("out"), base, seconds,
                              offsets, kind=self._kind(case, "out", exp))
        if callable(served):
            forward.metrics.update(served())
        results.add(forward)
        results.add(self._judge(case, "state", "state", state, exp.state, exp.baseline_err.get("state"),
                                   base, seconds, kind=self._kind(case, "state", exp)))
        with self._phase("backward"):
            grads = (input_grads(weighted_loss(case, out, state, opts.device), {n: inputs[n] for n in names})
                     if names else {})
        after = getattr(backend, "served_backward", None)  # e.g. fla-dispatch: FLA's dispatched backward pieces
        served_backward = after() if callable(after) and grads else {}
        if case.backward:
            for n in grad_inputs(case):
                check = f"grad_{n}"
                if not verdict.backward:
                    results.add(base(check=check, status="skip", reason=verdict.backward_reason or
                                          "backend has no backward for this case"))
                    continue
                got, want = grads.get(n), exp.grads.get(n)
                if got is None:
                    results.add(base(check=check, status="fail", reason=f"backend returned no gradient for {n}"))
                    continue
                q = GRAD_NAMES[n]
                reduction = self._reduction(case, n, inputs, got, grads, exp)
                judged = self._judge(case, q, check, got, want, exp.baseline_err.get(q), base, 0.0,
                                     reduction=reduction)
                judged.metrics.update(served_backward)
                results.add(judged)
        return inputs, out, state

    def _continuation_checks(self, case, backend, inputs, out, state, base, exp, results):
        offsets = offsets_of(case)
        packed = to_packed(out, case).detach().to(F64)
        want = (case.N, case.HO, case.K, case.V)
        if tuple(state.shape) != want:  # nothing sensible to carry: the backend broke the state contract
            reason = (f"cannot carry the state: backend returned final_state of shape {list(state.shape)}; "
                      f"the contract is float32 key-major [N, HO, K, V] = {list(want)}")
            results.add(*(base(check=c, status="fail", reason=reason) for c in ("continuation_ref", "continuation_self")))
            return
        with self._phase("continuation"):
            chained_out, chained_state = run_in_segments(case, backend, inputs)
        results.add(self._judge(case, "out", "continuation_ref", chained_out, exp.out,
                                   exp.baseline_err.get("out"), base, 0.0, offsets))
        r = self._judge(case, "out", "continuation_self", chained_out, packed, None, base, 0.0)
        same_shape = chained_state.shape == state.shape
        state_err = compare.rel_rms(chained_state, state) if same_shape else math.inf
        # FLA's negligible rule here too: a state that decayed to ~1e-46 has no meaningful relative error (the
        # state carried in bf16 between the calls flushes it to 0)
        state_abs = compare.metrics(chained_state, state)["max_abs"] if same_shape else None
        r.metrics["state_rel_rms_vs_self"] = state_err
        state_ok = compare.judge(case.op, case.io_dtype, "state", state_err, None, max_abs=state_abs,
                                 carried=case.state_dtype)
        if r.status == "pass" and not state_ok["passed"]:
            r.status, r.reason = "fail", f"chained final state differs from the single call's by rel RMS {state_err:.3e}"
        results.add(r)

    def _determinism(self, case, backend, inputs, out, state, base, results):
        # The second call runs in the same grad mode as the first (some engines plan training and inference
        # differently), on the very same input tensors.
        grad_mode = any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs.values())
        # "the same inputs" holds only if no call (the first, its backward, the continuation's) wrote to them
        changed = written(self._snapshot)
        with torch.set_grad_enabled(grad_mode), self._phase("steady_call"):  # a warm call: the kernel's own time
            out2, state2 = backend.run(case, inputs)
        if changed:
            results.add(base(check="determinism", status="fail", metrics={"inputs_written": changed}, reason=(
                "the backend wrote to its inputs (in place, or past their ends into the NaN margin): "
                + ", ".join(changed))))
        elif bitwise_equal(out2, out) and bitwise_equal(state2, state):
            results.add(base(check="determinism", status="pass"))
        else:
            diff = compare.rel_rms(to_packed(out2, case), to_packed(out, case))
            results.add(base(check="determinism", status="fail",
                                  reason=f"two runs differ (output rel RMS {diff:.3e} between runs)",
                                  metrics={"rel_rms": diff}))


def _fmt(x) -> str:
    return "none" if x is None else f"{x:.3e}"
