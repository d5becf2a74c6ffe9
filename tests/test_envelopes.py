"""Envelopes: what each fused backend declares it serves, the tiers built over them, the `list` contract, and
the note a result carries when the library's runtime answer disagrees with the declaration (issue 14)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from doubles import fla_ops

from deltacheck.cases import Case
from deltacheck.cases.envelope import Envelope
from deltacheck.harness.backends.base import get_backend
from deltacheck.harness.backends.fla import FlaBackend
from deltacheck.harness.ci.tiers import tier_cases
from deltacheck.harness.cli import main as cli_main
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine.availability import backend_envelope, envelope_note
from deltacheck.harness.machine.environment import Env
from deltacheck.harness.run.task import run_task

TESTS = Path(__file__).resolve().parent
CAPABLE = Env(cuda=True, device_name="NVIDIA B200", capability=(10, 0),
              versions={"fla": "0.6.0", "triton": "3.7.1", "cudnn_frontend": "1.32.0", "cutlass_dsl": "4.8.0"},
              importable={"cutlass": True})

# The targets: every fused backend x op (x architecture) gets at least 20 L0 cases and all its pairs.
TARGETS = [("fla", None, "gdn"), ("fla", None, "kda"), ("fla", None, "gdn2"), ("cudnn", 90, "kda"),
           ("cudnn", 100, "gdn"), ("cudnn", 100, "kda"), ("cudnn", 100, "gdn2")]


@pytest.mark.parametrize("backend, sm, op", TARGETS, ids=[f"{b}-{s}-{o}" for b, s, o in TARGETS])
def test_list_contract_meets_the_l0_targets(backend, sm, op, capsys):
    argv = ["list", "--tier", "L0", "--backend", backend, "--op", op, "--count"] + (["--sm", str(sm)] if sm else [])
    assert cli_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    count = re.fullmatch(r"(\d+) cases", lines[0])
    assert count and int(count.group(1)) >= 20, lines[0]
    pairs = [line for line in lines if line.startswith("pairs of axis values covered: ")]
    assert pairs and re.fullmatch(r"pairs of axis values covered: (\d+)/\1 \(100\.0%\)", pairs[0]), pairs


def test_list_counts_only_what_the_envelope_serves(capsys):
    assert cli_main(["list", "--tier", "L0", "--backend", "cudnn", "--sm", "90", "--op", "kda"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids and all("-bf16-" in i and "-K128-V128-" in i for i in ids)  # kda_hopper*: bf16, K = V = 128
    assert cli_main(["list", "--tier", "L0", "--op", "gdn", "--op", "gdn2"]) == 0  # both ops, not the last
    assert {i.split("-")[0] for i in capsys.readouterr().out.split()} == {"gdn", "gdn2"}


def test_list_count_prints_the_task_count_per_backend(capsys):
    assert cli_main(["list", "--tier", "L0", "--count"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  fla: \d+ of \d+ \(gdn \d+, kda \d+, gdn2 \d+\)$", out, re.M), out
    assert re.search(r"^  cudnn SM90: \d+ of \d+ \(kda \d+\)$", out, re.M), out


@pytest.mark.parametrize("argv, needle", [
    (["list", "--sm", "90"], "--sm needs --backend"),
    (["list", "--backend", "fake_backends:Working", "--count"], "declares no envelope"),
    (["list", "--backend", "nosuch"], "unknown backend"),
])
def test_list_mistakes_are_one_line_errors(argv, needle, capsys):
    sys.path.insert(0, str(TESTS))
    try:
        assert cli_main(argv) == 2
    finally:
        sys.path.remove(str(TESTS))
    assert needle in capsys.readouterr().err


def test_an_envelope_is_checked_when_declared():
    with pytest.raises(ValueError, match="unknown axis"):
        Envelope("x", "kda", allowed={"colour": ("red",)})
    with pytest.raises(ValueError, match="no value"):
        Envelope("x", "kda", allowed={"dims": ("48x48",)})
    with pytest.raises(ValueError, match="needs a reason"):
        Envelope("x", "kda", excluded=(((("l2norm", "on"), ("bwd", "on")), ""),))


def test_fla_declines_exactly_outside_its_envelope_on_every_l0_case(monkeypatch):
    """The FLA adapter's own declines (what FLA cannot express) and its declared envelope must agree, so
    neither can drift: forward served iff runnable, backward served iff the backward runs."""
    for recurrent in (False, True):
        backend = FlaBackend(fla_ops.make(), recurrent=recurrent)
        for case in tier_cases("L0"):
            verdict = backend.check(case, CAPABLE)
            forward, backward = backend_envelope(backend.name, case.op, env=CAPABLE, backend=backend).serves(case)
            assert verdict.runnable == forward, (backend.name, case.id, verdict.reason)
            if case.backward and verdict.runnable:
                assert verdict.backward == backward, (backend.name, case.id, verdict.backward_reason)


def test_disagreements_with_the_envelope_are_noted_on_the_result():
    sys.path.insert(0, str(TESTS))
    try:
        backend = get_backend("fake_backends:DecliningInside")
        _noted(backend, Env(cuda=False))
    finally:
        sys.path.remove(str(TESTS))


def _noted(backend, env):
    inside = Case(op="kda", seqlens=(5,), K=64, V=64)
    outside = Case(op="kda", seqlens=(5,), K=128, V=128)
    note = envelope_note(backend, "mine", inside, env, backend.check(inside, env))
    assert note["envelope_inside"] and "declined inside its declared envelope" in note["envelope_disagreement"]
    assert "engine refused (fake)" in note["envelope_disagreement"]
    note = envelope_note(backend, "mine", outside, env, backend.check(outside, env))
    assert not note["envelope_inside"] and "ran outside its declared envelope" in note["envelope_disagreement"]
    assert "dims=128x128" in note["envelope_disagreement"]
    # and the forward result carries it
    runner = CaseRunner(RunOptions(reference="oracle", baseline=False))
    forward = next(r for r in run_task(runner, outside, "fake_backends:DecliningInside", env) if r.check == "forward")
    assert forward.status == "pass" and "ran outside" in forward.metrics["envelope_disagreement"]


def test_agreement_leaves_no_note():
    backend = FlaBackend(fla_ops.make())
    case = next(c for c in tier_cases("L0") if c.op == "kda" and backend.check(c, CAPABLE).runnable)
    note = envelope_note(backend, "fla", case, CAPABLE, backend.check(case, CAPABLE))
    assert note["envelope_inside"] and note["envelope_disagreement"] == ""


def test_an_envelope_narrows_a_base_changed_in_place_anew():
    """The narrowed axes are memoized per base; a base dict changed in place is another key (found by review: an
    id-keyed memo returned the old narrowing)."""
    from deltacheck.cases.axes import MAIN_AXES
    from deltacheck.cases.envelope import Envelope

    envelope = Envelope(name="test", op="gdn", allowed={"dims": ("64x64",)})
    base = dict(MAIN_AXES)
    assert envelope.axes(base)["dims"] == ("64x64",)
    base["dims"] = ("128x128",)
    assert envelope.axes(base)["dims"] == ()
    assert not envelope.compatible({"dims": "64x64"}, base)
    assert envelope.axes({k: list(v) for k, v in MAIN_AXES.items()})["dims"] == ("64x64",)  # unhashable: no memo
