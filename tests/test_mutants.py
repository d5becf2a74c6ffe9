"""Proof that the harness catches bugs: every mutant backend fails at least one check on small CPU
cases (CASES, or the small case its bug class needs: CLASS_CASES), and the clean reference backends fail none on
the same cases. Bugs not caught today (mutants.GAPS, and one wrong token in a long sequence) are strict xfails, each
with its numbers (docs/verdicts.md, Known gaps)."""

from __future__ import annotations

import pytest
from mutants import GAPS, MUTANTS

from deltacheck.cases import Case
from deltacheck.cases.added import guard_separation_cases
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.judge.runner import CaseRunner, RunOptions

# Small enough for the fp64 token oracle on a CPU, large enough to cross a 64-token chunk boundary,
# with ragged packing (empty and one-token sequences), GQA and GVA, an initial state, continuation
# splits and the backward pass.
CASES = [
    Case(op="gdn2", layout="thd", seqlens=(70, 0, 1, 66), H=2, HK=2, HV=4, K=64, V=64, gate="steep",
         initial_state=True, splits=(33,), backward=True),
    Case(op="kda", layout="bshd", seqlens=(67, 67), H=4, HK=2, HV=2, K=64, V=128, gate="typical",
         initial_state=True, splits=(65,), backward=True, l2norm=True),
    Case(op="gdn", layout="sbhd", seqlens=(66, 66), H=2, HK=2, HV=2, K=128, V=64, gate="mild",
         initial_state=True, splits=(64,), backward=True, beta_sigmoid=True),
]


# One small case per bug class CASES cannot show (a head dim, a precision, a gate regime, a flag), each named by the
# mutants that need it; the clean backends must pass them too.
K96 = Case(op="gdn", layout="thd", seqlens=(40, 30), H=1, HK=1, HV=1, K=96, V=96, gate="typical",
           initial_state=True, backward=True)
FP16 = Case(op="gdn2", io_dtype="fp16", layout="thd", seqlens=(70, 20), H=1, HK=1, HV=1, K=64, V=64, gate="typical",
            initial_state=True)
DEEP = Case(op="kda", layout="thd", seqlens=(40, 20), H=1, HK=1, HV=1, K=64, V=64, gate="extreme",
            initial_state=True)
SAFE = Case(op="kda", layout="bshd", seqlens=(33, 33), H=2, HK=2, HV=2, K=64, V=64, gate="typical", safe_gate=True,
            a_log=True, dt_bias=True, initial_state=True, backward=True)
L2FWD = Case(op="gdn", layout="thd", seqlens=(20, 30), H=1, HK=1, HV=1, K=64, V=64, gate="typical", l2norm=True)
FLAGS = Case(op="gdn", layout="thd", seqlens=(30, 20), H=1, HK=1, HV=1, K=64, V=64, gate="typical",
             beta_sigmoid=True, neg_eigval=True, scale=0.5, gate_domain="linear")
NOH0 = Case(op="gdn", layout="thd", seqlens=(30, 20), H=1, HK=1, HV=1, K=64, V=64, gate="typical", backward=True)
CLASS_CASES = {
    "bwd_garbage_without_h0": [NOH0],
    "neg_eigval_dropped": [FLAGS],
    "custom_scale_dropped": [FLAGS],
    "linear_gate_read_as_log": [FLAGS],
    "l2norm_in_place": [L2FWD],
    "pads_g_past_end": [L2FWD],
    "grads_wrong_at_k96": [K96],
    "fp16_computed_in_bf16": [FP16],
    "state_bf16_between_chunks": [FP16],
    "error_3x_baseline": [FP16],
    "nan_below_decay": [DEEP],
    "dt_bias_ignored": [SAFE],
    "safe_gate_not_forwarded": [SAFE],
    "da_log_zero": [SAFE],
}
ALL_CASES = CASES + [K96, FP16, DEEP, SAFE, L2FWD, FLAGS, NOH0]


@pytest.fixture(scope="module")
def runner():
    return CaseRunner(RunOptions(device="cpu", reference="oracle", baseline=True), keep=len(ALL_CASES) + 1)


def failing_checks(runner, backend, name, cases=CASES, first=False):
    """The failing checks per case; ``first``: stop at the first case with one (a mutant needs only one)."""
    found = {}
    for case in cases:
        results = runner.run(case, backend, name, Verdict.ok())
        errors = [f"{r.check}: {r.reason}" for r in results if r.status == "error"]
        assert not errors, f"{name} raised instead of being judged on {case.id}: {errors}"
        found[case.id] = sorted(r.check for r in results if r.status == "fail")
        if first and found[case.id]:
            break
    return found


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_caught(runner, mutant):
    cases = CLASS_CASES.get(mutant.name, CASES)
    found = failing_checks(runner, mutant, f"mutant:{mutant.name}", cases, first=True)
    assert any(found.values()), f"mutant {mutant.name!r} ({mutant.bug}) passed every check: {found}"


@pytest.mark.parametrize("name", ["oracle", "chunked", "baseline"])
def test_clean_reference_backends_pass_everything(runner, name):
    found = failing_checks(runner, get_backend(name), name, ALL_CASES)
    assert not any(found.values()), f"clean backend {name} failed: {found}"


def test_catalogue_is_complete():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 40
    assert set(CLASS_CASES) <= {m.name for m in MUTANTS}


# A backend that writes to its inputs (in place, or past their ends into the NaN margin) fails determinism by name
# (the check's premise, "two calls on the same inputs"): both mutants pass every other check on L2FWD (forward only;
# an in-place normalization is idempotent, so the second call computes the same bits).
@pytest.mark.parametrize("name, tensor", [("l2norm_in_place", "q ("), ("l2norm_in_place", "k ("),
                                          ("pads_g_past_end", "g (")])
def test_writes_to_inputs_fail_determinism_by_name(runner, name, tensor):
    mutant = next(m for m in MUTANTS if m.name == name)
    results = {r.check: r for r in runner.run(L2FWD, mutant, f"mutant:{name}", Verdict.ok())}
    assert [c for c, r in results.items() if r.status != "pass"] == ["determinism"], results
    assert "wrote to its inputs" in results["determinism"].reason and tensor in results["determinism"].reason


# A case at the scale frontier's low end (docs/frontier.md: the magnitude axis goes down to 1e-3): every output is
# below 1e-6 in absolute value, so an all-zero output passes on the negligible rule (max abs error <= 1e-6, FLA's).
TINY = Case(op="gdn", io_dtype="fp16", layout="thd", seqlens=(64,), H=1, HK=1, HV=1, K=64, V=64, gate="typical",
            magnitude=1e-3)
GAP_CASES = {"nondeterministic_backward": CASES[0], "output_flushed_to_zero": TINY}
GAP_REASONS = {
    "nondeterministic_backward": (
        "determinism compares two forward calls only: no check runs the backward twice, so a backward whose gradients "
        "vary in their last bits from call to call (rel RMS ~1e-12 here) passes; docs/verdicts.md, Known gaps"),
    "output_flushed_to_zero": (
        "at mag 1e-3 the reference output is at most 4.4e-07 (fp16 case), so an all-zero output has max abs error "
        "4.4e-07 <= 1e-6 and passes on the negligible rule (headroom 0.44); docs/verdicts.md, Known gaps"),
}


@pytest.mark.parametrize("mutant", [pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=GAP_REASONS[m.name]))
                                    for m in GAPS], ids=lambda m: m.name)
def test_known_gaps_are_not_caught_yet(runner, mutant):
    found = failing_checks(runner, mutant, f"mutant:{mutant.name}", [GAP_CASES[mutant.name]], first=True)
    assert any(found.values()), f"{mutant.name} passed every check: {found}"


def test_gap_mutants_are_bugs_the_checks_see_elsewhere(runner):
    """The zero-output gap is the case's scale, not the mutant: at unit magnitude it fails at once."""
    mutant = next(m for m in GAPS if m.name == "output_flushed_to_zero")
    assert "forward" in failing_checks(runner, mutant, "mutant:output_flushed_to_zero", [FP16])[FP16.id]
    assert set(GAP_CASES) == {m.name for m in GAPS}


# One wrong token in a long sequence is diluted by the global rel RMS: partial_chunk_zero (the last partial chunk left
# as allocated zeros) with a 1-token tail fails T = 4097 at 1.20x the limit but passes T = 16385 at 0.43x (rel RMS
# 3.57e-03, limit 8.39e-03; measured on the CPU, this test's case); the final state is right, so only the output
# shows it.
LONG_TAIL = Case(op="gdn", layout="thd", seqlens=(16385,), H=1, HK=1, HV=1, K=64, V=64, gate="typical")


@pytest.mark.xfail(strict=True, reason=(
    "the forward verdict is one rel RMS over all tokens: a 1-token tail left zero in a 16385-token sequence is "
    "3.57e-03 "    "< limit 8.39e-03 (headroom 0.43); docs/verdicts.md, Known gaps"))
def test_known_gap_one_wrong_token_in_a_long_sequence():
    mutant = next(m for m in MUTANTS if m.name == "partial_chunk_zero")
    runner = CaseRunner(RunOptions(device="cpu", reference="oracle", baseline=True))
    results = runner.run(LONG_TAIL, mutant, "mutant:partial_chunk_zero", Verdict.ok())
    assert any(r.status == "fail" for r in results), {r.check: r.status for r in results}


# Each class mutant is invisible on the cases outside its class (it is a bug of that class, not a general one):
# the case the class needs is what catches it.
@pytest.mark.parametrize("name", ["grads_wrong_at_k96", "fp16_computed_in_bf16", "nan_below_decay",
                                  "dt_bias_ignored"])
def test_class_mutants_need_their_class_case(runner, name):
    mutant = next(m for m in MUTANTS if m.name == name)
    assert not any(failing_checks(runner, mutant, f"mutant:{name}", CASES).values())


# The commonest adapter bugs are named in the failure reason, not only caught (harness/compare.kind_of_wrong).
NAMED = {
    "state_transposed": ("state", "the final state matches the reference's transpose"),
    "scale_missing": ("forward", "the output matches the reference with the scale dropped"),
    "scale_twice": ("forward", "the output matches the reference with the scale applied twice"),
    "initial_state_ignored": ("forward", "the output matches the reference run without the initial state"),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_the_kind_of_wrong_is_named_where_it_is_cheap(runner, name):
    mutant = next(m for m in MUTANTS if m.name == name)
    check, words = NAMED[name]
    # the transpose on a square state (K = V) and on a transposed shape (K != V); the rest on the gdn2 case
    for case in CASES[:2] if name == "state_transposed" else CASES[:1]:
        results = {r.check: r for r in runner.run(case, mutant, f"mutant:{name}", Verdict.ok())}
        assert results[check].status == "fail" and words in results[check].reason, (case.id, results[check].reason)
        if name == "initial_state_ignored":
            assert "the final state matches the reference run without the initial state" in results["state"].reason


def test_other_bugs_are_not_misnamed(runner):
    others = [r.reason for m in MUTANTS if m.name in ("decay_after_erase", "w_ignored", "heads_tiled")
              for r in runner.run(CASES[0], m, f"mutant:{m.name}", Verdict.ok()) if r.status == "fail"]
    assert others and not any(w in reason for reason in others for _, w in NAMED.values()), others


# The mild-gate guard case the generator pins stays (its decay budget is what it covers), but it does not separate
# guard from no guard on the state: dropping the guard moves its out by 2.7e-02 and its state by 2.1e-03, under the
# 2e-2 threshold. Replacing it would re-draw L0 (281 of 287 ids kept; 162 changed when a case was added beside it),
# so the separating cases are appended instead (cases/added.py guard_separation_cases; issue 29 item 12). Of the
# 22 guard cases L0 held before them, 11 show no difference at all without the guard (beta = 0, steep or extreme gates: the guard acts
# only where decays are near 1); measured on the CPU, forward checks, docs/cases.md.
MILD_GUARD = "gdn2-bf16-thd-N3-T[0_65_130]-H2/2/2-K128-V128-mild-l2norm-guard-h0-cont[64]-bwd"


def _l0_guard_cases():
    from deltacheck.harness.ci.tiers import select

    return [c.id for c in select("L0") if c.beta_guard]


def test_l0_has_a_guard_case_that_separates_in_every_layout():
    separating = {c.id for c in guard_separation_cases("L0")}
    assert separating <= set(_l0_guard_cases())
    assert {Case.from_id(i).layout for i in separating} == {"thd", "bshd", "sbhd", "bhsd"}


@pytest.mark.parametrize("case_id", [
    pytest.param(MILD_GUARD, marks=pytest.mark.xfail(strict=True, reason=(
        "dropping the guard moves this mild-gate case's state by only 2.1e-03, under the 2e-2 threshold; the "
        "trained-gate cases appended to L0 separate it (test_l0_has_a_guard_case_that_separates_in_every_layout)"))),
    "gdn2-fp16-bshd-N2-L64-H2/2/4-K64-V64-zero-l2norm-sigmoid-guard-bwd",
    *(c.id for c in guard_separation_cases("L0")),
])
def test_a_wrapper_that_drops_beta_guard_fails_the_l0_guard_cases_clearly(case_id):
    """The L0 guard cases must separate guard from no guard by several times the limit, on the output and on the
    final state (forward checks; the inputs do not depend on splits or the backward)."""
    from fake_backends import DropsBetaGuard

    assert case_id in _l0_guard_cases()
    runner = CaseRunner(RunOptions(device="cpu", reference="oracle", baseline=True))
    quick = Case.from_id(case_id).replace(backward=False, splits=())
    assert all(r.status == "pass" for r in runner.run(quick, get_backend("oracle"), "oracle", Verdict.ok()))
    results = {r.check: r for r in runner.run(quick, DropsBetaGuard(), "fake_backends:DropsBetaGuard", Verdict.ok())}
    for check in ("forward", "state"):
        r = results[check]
        assert r.status == "fail" and r.metrics["headroom"] > 5, (case_id, check, r.metrics.get("headroom"))
