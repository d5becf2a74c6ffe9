"""Known issues as data (harness/ci/known.py): the file format's mistakes, who an entry speaks about, strictness, the
CLI and the pytest plugin giving the same verdict, and the shipped table against the H200 run it came from."""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from child_env import ENV, PYTEST, TESTS, run_child

from deltacheck.cases import Case
from deltacheck.harness.ci.known import (
    CHECK_NAMES,
    SERVING_CHECK_NAMES,
    SHIPPED,
    applicable,
    KnownIssuesError,
    known_issue_paths,
    load_known_issues,
    mark_known,
    outcomes,
)
from deltacheck.harness.machine.environment import Env
from deltacheck.harness.records.results import Result

H200 = Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0),
           versions={"cudnn_frontend": "1.32.0", "fla": "0.6.0"})

GOOD = """
[[issue]]
id = "x"
backend = "cudnn"
op = "kda"
where = "extreme"
reason = "r"
evidence = "e"
"""


def write(tmp_path: Path, text: str, name: str = "known.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- the file format: every mistake names the file, the entry and the key ----------------------------------------


@pytest.mark.parametrize("text,named", [
    (GOOD.replace('reason = "r"', 'reason = "r"\ncolour = "red"'), "unknown key(s) colour"),
    (GOOD.replace('evidence = "e"\n', ""), "missing or empty evidence"),
    (GOOD.replace('reason = "r"', 'reason = "  "'), "missing or empty reason"),
    (GOOD + GOOD, "id 'x' is already used by"),
    (GOOD.replace('where = "extreme"', 'where = "extreme and ("'), "where:"),
    (GOOD + 'versions = { nvidia-cudnn-frontend = "1.32 or so" }\n', "is not a PEP 440 specifier set"),
    (GOOD + 'sm = ["hopper"]\n', "sm must be a list of compute capabilities"),
    (GOOD + 'checks = "forward"\n', "checks must be a list of check names"),
    (GOOD + 'error_contains = ""\n', "error_contains must be a non-empty string"),
    (GOOD + 'error_contains = ["invalid"]\n', "error_contains must be a non-empty string"),
    ("[[issue]\nid = 1\n", "not valid TOML"),
    ('title = "mine"\n' + GOOD, "expected only [[issue]] tables"),
])
def test_a_malformed_file_is_refused_with_the_reason(tmp_path, text, named):
    path = write(tmp_path, text)
    with pytest.raises(KnownIssuesError, match="known issues file|issue #") as info:
        load_known_issues([path])
    assert named in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("text,named", [
    (GOOD.replace('op = "kda"', 'op = "gdn9"'), "op = 'gdn9' is not an op; ops are gdn, kda"),
    (GOOD + 'checks = ["fwd"]\n', "checks: 'fwd' not a check name; checks are forward, state"),
    (GOOD + 'checks = ["forward", "grad_x"]\n', "checks: 'grad_x' not a check name"),
])
def test_an_entry_that_could_never_match_is_refused_naming_the_valid_values(tmp_path, text, named):
    path = write(tmp_path, text)
    with pytest.raises(KnownIssuesError) as info:
        load_known_issues([path])
    assert named in str(info.value) and f"{path} issue #1" in str(info.value)


def test_an_unknown_backend_is_refused_where_the_runs_backends_are_known(tmp_path):
    path = write(tmp_path, GOOD.replace('backend = "cudnn"', 'backend = "cudnnn"'))
    with pytest.raises(KnownIssuesError) as info:
        load_known_issues([path], backends=["cudnn"])
    assert "backend = 'cudnnn' is not a backend; backends are" in str(info.value)
    assert "oracle" in str(info.value) and "pkg.mod:attr" in str(info.value) and "issue #1" in str(info.value)
    # a registered name, a backend name of the run, a pkg.mod:attr spec (accepted as is): all fine
    for backend, names in (("fla", ["cudnn"]), ("nan-on-one", ["fake_backends:NaNOnOneCase", "nan-on-one"]),
                           ("mypkg.mod:Mine", [])):
        ok = write(tmp_path, GOOD.replace('backend = "cudnn"', f'backend = "{backend}"'))
        assert load_known_issues([ok], backends=names)[0].backend == backend
    # every check name a case can owe is accepted
    from deltacheck.harness.ci.known import CHECK_NAMES
    from deltacheck.harness.ci.tiers import select
    from deltacheck.harness.run.task import checks_for
    owed = {c for case in select(tier="L0") for c in checks_for(case)}
    assert owed <= set(CHECK_NAMES), owed - set(CHECK_NAMES)


def test_an_unknown_backend_in_an_entry_is_a_usage_error_in_both(tmp_path, run_cli):
    known = write(tmp_path, ENTRY.format(backend="nan-on-two", where=BAD, extra=""))
    cli_rc, cli_text = cli_outcome(run_cli, tmp_path, known)
    py_rc, py_text = pytest_outcome(known)
    assert cli_rc == 2 and "backend = 'nan-on-two' is not a backend" in cli_text and "Traceback" not in cli_text
    assert py_rc != 0 and "backend = 'nan-on-two' is not a backend" in py_text


def test_a_missing_file_is_refused_by_name(tmp_path):
    with pytest.raises(KnownIssuesError, match="cannot read it"):
        load_known_issues([tmp_path / "absent.toml"])


def test_ids_are_unique_across_files(tmp_path):
    with pytest.raises(KnownIssuesError, match="already used by"):
        load_known_issues([write(tmp_path, GOOD, "a.toml"), write(tmp_path, GOOD, "b.toml")])


def test_the_shipped_table_comes_first_then_the_environment_then_the_flag():
    paths = known_issue_paths(["flag.toml"], {"DELTACHECK_KNOWN_ISSUES": os.pathsep.join(["e1.toml", "e2.toml"])})
    assert paths == [str(SHIPPED), "e1.toml", "e2.toml", "flag.toml"]


# --- who an entry speaks about -------------------------------------------------------------------------------------

CASE = Case.from_id("kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd")


def one_entry(tmp_path, extra: str = ""):
    (issue,) = load_known_issues([write(tmp_path, GOOD + extra)])
    return issue


@pytest.mark.parametrize("extra,spec,env,applies", [
    ("", "cudnn", H200, True),
    ("", "fla", H200, False),  # another backend
    ('sm = [90]\n', "cudnn", H200, True),
    ('sm = [100]\n', "cudnn", H200, False),  # another architecture
    ('sm = [90]\n', "cudnn", Env(cuda=False), False),  # no GPU at all
    ('versions = { nvidia-cudnn-frontend = ">=1.32,<1.33" }\n', "cudnn", H200, True),
    ('versions = { nvidia-cudnn-frontend = ">=1.33" }\n', "cudnn", H200, False),  # fixed in a later release
    ('versions = { cudnn_frontend = "<1.33" }\n', "cudnn", H200, True),  # the Env key works as the package name
    ('versions = { nvidia-cudnn-frontend = "<1.33" }\n', "cudnn", Env(cuda=True, capability=(9, 0)), False),
])
def test_an_entry_applies_only_where_its_evidence_was_seen(tmp_path, extra, spec, env, applies):
    assert one_entry(tmp_path, extra).applies_to(CASE, spec, spec, env) is applies


def test_an_entry_matches_cases_by_its_where_expression_and_its_op(tmp_path):
    issue = one_entry(tmp_path)
    assert not issue.applies_to(Case.from_id("kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-steep-bwd"), "cudnn", "cudnn",
                                H200)
    assert not issue.applies_to(Case.from_id("gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd"), "cudnn", "cudnn",
                                H200)


def result(check: str, status: str) -> Result:
    return Result(case=CASE.id, backend="cudnn", check=check, status=status,
                  reason="" if status == "pass" else "66048 NaN in out")


def test_failing_checks_become_known_and_passing_ones_stay(tmp_path):
    issue = one_entry(tmp_path, 'checks = ["forward"]\n')
    results = [result("forward", "fail"), result("state", "fail"), result("determinism", "pass")]
    for r in results:
        mark_known(r, [issue])
    assert [r.status for r in results] == ["known", "fail", "pass"]  # state is outside the entry's checks
    assert results[0].reason.startswith("known issue x: r") and results[0].metrics["known_issue"] == "x"
    assert outcomes(results, [issue]) == {"x": "reproduced"}


def test_an_entry_whose_checks_all_pass_is_gone_and_one_that_did_not_run_is_not_judged(tmp_path):
    issue = one_entry(tmp_path, 'checks = ["forward", "state"]\n')
    assert outcomes([result("forward", "pass"), result("state", "pass"), result("grad_q", "fail")],
                    [issue]) == {"x": "gone"}
    assert outcomes([result("forward", "skip"), result("state", "pass")], [issue]) == {"x": "not judged"}
    assert outcomes([result("grad_q", "pass")], [issue]) == {"x": "not judged"}


def refusal(check: str, status: str, reason: str = "ValueError: invalid sequence lengths: [1, 0, 1]") -> Result:
    return Result(case=CASE.id, backend="cudnn", check=check, status=status, reason="" if status == "pass" else reason)


def test_an_errored_check_is_never_known_without_error_contains(tmp_path):
    issue = one_entry(tmp_path)
    r = refusal("forward", "error")
    mark_known(r, [issue])
    assert r.status == "error" and outcomes([r], [issue]) == {"x": "not judged"}


def test_error_contains_turns_the_errors_it_names_into_known_and_nothing_else(tmp_path):
    """A library's refusal (it raised) is known when the message holds the entry's text; a wrong value, or an error
    with another message, is a new failure and stays one."""
    issue = one_entry(tmp_path, 'error_contains = "invalid sequence lengths"\n')
    results = [refusal("forward", "error"), refusal("state", "error"),
               refusal("determinism", "error", "not run: the first call raised ValueError: invalid sequence lengths: "
                                               "[1, 0, 1]"),
               refusal("continuation_ref", "error", "RuntimeError: CUDA error: an illegal memory access"),
               refusal("continuation_self", "fail", "out rel RMS 1.0e+00 > limit 1.1e-02"), refusal("grad_q", "pass")]
    for r in results:
        mark_known(r, [issue])
    assert [r.status for r in results] == ["known", "known", "known", "error", "fail", "pass"]
    assert results[0].reason == ("known issue x: r — ValueError: invalid sequence lengths: [1, 0, 1]")
    assert results[0].metrics["known_issue"] == "x"
    assert outcomes(results, [issue]) == {"x": "reproduced"}


def test_an_error_contains_entry_whose_checks_all_pass_is_gone_and_a_wrong_value_proves_nothing(tmp_path):
    issue = one_entry(tmp_path, 'error_contains = "invalid sequence lengths"\nchecks = ["continuation_ref"]\n')
    assert outcomes([refusal("forward", "error"), refusal("continuation_ref", "pass")], [issue]) == {"x": "gone"}
    failing = refusal("continuation_ref", "fail", "invalid sequence lengths, said a fail reason")
    mark_known(failing, [issue])
    assert failing.status == "fail" and outcomes([failing], [issue]) == {"x": "not judged"}


# --- the CLI and the pytest plugin: one verdict ---------------------------------------------------------------------

# fake_backends.NaNOnOneCase is all-NaN on its one bad case and right everywhere else.
BAD = "kda-bf16-thd-N3-T[0_1_127]"
SELECTION = f"{BAD} or (kda and K64-V64 and not bwd)"
ENTRY = """
[[issue]]
id = "fake-nan"
backend = "{backend}"
op = "kda"
where = "{where}"
reason = "all-NaN out on one case"
evidence = "tests/fake_backends.py"
{extra}
"""

KNOWN_SITUATIONS = {
    # name: (where, extra keys, the run fails, a line the output must hold)
    "the entry covers the failing case": (BAD, "", False, "failed as known issues (fake-nan)"),
    "the entry covers only checks that pass": (BAD, 'checks = ["state"]', True, "KNOWN ISSUES NO LONGER REPRODUCE"),
    "the entry covers a passing case too": ("kda", "", True, "known issue no longer reproduces: fake-nan matches"),
    "the entry is for another architecture": (BAD, "sm = [90]", True, None),
}
# fake_backends.RefusesOneCase raises on the same one case (a library's refusal): an error, not a wrong value.
REFUSAL_SITUATIONS = {
    "error_contains names the refusal": (BAD, 'error_contains = "invalid sequence lengths"', False,
                                         "failed as known issues (fake-nan)"),
    "an entry without error_contains": (BAD, "", True, None),
    "error_contains names another error": (BAD, 'error_contains = "out of memory"', True, None),
    "error_contains on a passing case too": ("kda", 'error_contains = "invalid sequence lengths"', True,
                                             "known issue no longer reproduces: fake-nan matches"),
}


def cli_outcome(run_cli, tmp_path, known: Path, backend: str = "NaNOnOneCase"):
    return run_cli(["run", "--backend", f"fake_backends:{backend}", "--tier", "L0", "--limit", "3", "-k", SELECTION,
                    "--out", str(tmp_path / "cli"), "--in-process", "--no-baseline", "--reference", "oracle",
                    "--known-issues", str(known)], env={"DELTACHECK_KNOWN_ISSUES": None})


def pytest_outcome(known: Path, backend: str = "NaNOnOneCase"):
    argv = [*PYTEST, str(TESTS / "test_matrix.py"), "-q", "-p", "no:cacheprovider", "-rxX",
            "--dc-backend", f"fake_backends:{backend}", "--dc-limit", "3", "--dc-k", SELECTION,
            "--dc-reference", "oracle", "--dc-no-baseline"]
    proc = run_child(argv, env=dict(ENV, DELTACHECK_KNOWN_ISSUES=str(known)), cwd=TESTS.parent)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("situation", list(KNOWN_SITUATIONS))
def test_cli_and_pytest_agree_on_known_issues(situation, tmp_path, run_cli):
    where, extra, fails, line = KNOWN_SITUATIONS[situation]
    known = write(tmp_path, ENTRY.format(backend="nan-on-one", where=where, extra=extra))
    cli_rc, cli_text = cli_outcome(run_cli, tmp_path, known)
    py_rc, py_text = pytest_outcome(known)
    assert (cli_rc != 0, py_rc != 0) == (fails, fails), f"CLI exit {cli_rc}:\n{cli_text}\npytest exit {py_rc}:\n{py_text}"
    assert "Traceback" not in cli_text + py_text
    if line:
        assert line in cli_text, cli_text
    if situation == "the entry covers the failing case":
        assert "xfail" in py_text.lower(), py_text
    if situation == "the entry covers a passing case too":
        assert "known issue no longer reproduces" in py_text, py_text


@pytest.mark.parametrize("situation", list(REFUSAL_SITUATIONS))
def test_cli_and_pytest_agree_on_known_refusals(situation, tmp_path, run_cli):
    """An ``error_contains`` entry: the refusal it names is known (every check of the case, those left unrun after
    the first call raised included); without the key, or naming another message, the errors still fail the run."""
    where, extra, fails, line = REFUSAL_SITUATIONS[situation]
    known = write(tmp_path, ENTRY.format(backend="refuses-one", where=where, extra=extra))
    cli_rc, cli_text = cli_outcome(run_cli, tmp_path, known, "RefusesOneCase")
    py_rc, py_text = pytest_outcome(known, "RefusesOneCase")
    assert (cli_rc != 0, py_rc != 0) == (fails, fails), f"CLI exit {cli_rc}:\n{cli_text}\npytest exit {py_rc}:\n{py_text}"
    assert "Traceback" not in cli_text + py_text
    if line:
        assert line in cli_text, cli_text
    if not fails:
        assert "xfail" in py_text.lower() and "invalid sequence lengths" in py_text, py_text
    elif situation != "error_contains on a passing case too":
        assert "invalid sequence lengths" in cli_text and "failed as known issues" not in cli_text, cli_text
    else:
        assert "known issue no longer reproduces" in py_text, py_text


def test_a_malformed_known_issues_file_is_a_usage_error_in_both(tmp_path, run_cli):
    known = write(tmp_path, GOOD.replace('evidence = "e"\n', ""))
    cli_rc, cli_text = cli_outcome(run_cli, tmp_path, known)
    py_rc, py_text = pytest_outcome(known)
    assert cli_rc == 2 and "missing or empty evidence" in cli_text and "Traceback" not in cli_text
    assert py_rc != 0 and "missing or empty evidence" in py_text


# --- the shipped table against the run it came from -----------------------------------------------------------------

# cuDNN FE 1.32.0 on the H200 (SM90), L0 tier, 2026-12-01: the KDA cases the Hopper engine ran. Every failure was
# all-NaN without a decline; every case listed as passing passed all of its checks.
H200_CUDNN_KDA_FAILED = [
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    "kda-bf16-bhsd-N1-L200-H2/2/4-K128-V128-trained-l2norm-sigmoid-h0-cont[63]",
]
H200_CUDNN_KDA_PASSED = [
    "kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-extreme-state_bf16-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-typical-state_bf16-beta_one-bwd",
    "kda-bf16-bhsd-N1-L1-H2/2/4-K128-V128-steep-state_bf16-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-state_bf16-beta_one-h0-cont[85]-bwd",
    "kda-bf16-bhsd-N1-L63-H2/2/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[31]",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-beta_zero-h0-bwd",
    "kda-bf16-bhsd-N4-L31-H2/2/2-K128-V128-typical-beta_one-l2norm-safegate-alog-dtbias",
    "kda-bf16-bshd-N1-L1-H2/2/4-K128-V128-steep-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bshd-N1-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-mild-beta_zero-cont[32_63]-bwd",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-"
    "cont[63]",
    "kda-bf16-bshd-N2-L129-H2/2/4-K128-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-scale0.0625-h0-cont[43_64]",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-bshd-N2-L200-H2/2/2-K128-V128-long-l2norm-safegate-alog-dtbias-scale0.5-h0-cont[133]",
    "kda-bf16-sbhd-N1-L128-H2/2/2-K128-V128-trained-beta_zero-cont[65]-bwd",
    "kda-bf16-sbhd-N1-L320-H4/4/4-K128-V128-long-state_bf16-l2norm-safegate-alog-dtbias-scale0.0625-h0-cont[160]",
    "kda-bf16-sbhd-N1-L63-H2/2/2-K128-V128-extreme-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-sbhd-N1-L65-H2/2/2-K128-V128-typical-state_bf16-beta_one-sigmoid-safegate-alog-dtbias-scale0.0625",
    "kda-bf16-sbhd-N2-L129-H1/1/4-K128-V128-steep-beta_zero-scale1.0-h0",
    "kda-bf16-sbhd-N2-L129-H2/2/2-K128-V128-zero-state_bf16-beta_zero-h0-bwd",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-thd-N1-T[200]-H2/2/4-K128-V128-extreme-state_bf16-beta_one-safegate-alog-dtbias-scale0.5-cont[1]",
    "kda-bf16-thd-N1-T[65]-H4/4/4-K128-V128-typical-sigmoid-safegate-alog-dtbias-scale1.0-cont[21]",
    "kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0-bwd",
    "kda-bf16-thd-N3-T[0_1_127]-H2/2/2-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-thd-N3-T[257_0_300]-H2/2/4-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-"
    "cont[150]",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N4-T[0_1_63_65]-H2/2/4-K128-V128-extreme-beta_zero-l2norm-safegate-alog-dtbias-h0",
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-typical-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-"
    "scale0.0625-h0",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-cont[1]",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H4/4/4-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-"
    "scale1.0",
]


def test_the_shipped_table_loads():
    issues = load_known_issues([SHIPPED])
    assert issues and all(i.reason and i.evidence for i in issues)


def test_the_shipped_cudnn_entry_covers_exactly_the_h200_failures():
    """Strict entries must be narrow: on the machine and versions they were seen with, every failing case is covered
    and no case that passed is (it would fail the run as 'no longer reproduces')."""
    issues = {i.id: i for i in load_known_issues([SHIPPED])}
    issue = issues["cudnn-kda-hopper-nan-below-log-decay-7"]
    covered = {cid for cid in H200_CUDNN_KDA_FAILED + H200_CUDNN_KDA_PASSED
               if issue.applies_to(Case.from_id(cid), "cudnn", "cudnn", H200)}
    assert covered == set(H200_CUDNN_KDA_FAILED)


@pytest.mark.parametrize("env,spec", [
    (Env(cuda=True, capability=(10, 0), versions={"cudnn_frontend": "1.32.0"}), "cudnn"),  # Blackwell's engine
    (Env(cuda=True, capability=(9, 0), versions={"cudnn_frontend": "1.33.0"}), "cudnn"),  # not seen there yet
    (Env(cuda=False), "cudnn"),  # CI: no GPU
    (H200, "fla"),  # FLA passes these inputs
])
def test_the_shipped_cudnn_entry_stays_where_it_was_seen(env, spec):
    issues = {i.id: i for i in load_known_issues([SHIPPED])}
    case = Case.from_id(H200_CUDNN_KDA_FAILED[0])
    assert not issues["cudnn-kda-hopper-nan-below-log-decay-7"].applies_to(case, spec, spec, env)


# FLA 0.6.0 chunk_kda on the H200 (SM90, Triton 3.6), L0 tier, 2026-12-02 (issue #27): the KDA cases with a failing
# check (the forward, each), and every case whose checks all passed (the new cases of cases/added.py among them).
H200_FLA_KDA_FAILED = [
    # session 7, the regenerated L0's two (bench/results/s7/d25-S7.tgz: fla, dispatch off)
    'kda-fp16-bshd-N2-L63-H4/4/4-K128-V64-steep-beta_one-safegate-scale0.5',
    'kda-fp16-bshd-N1-L128-H4/4/4-K128-V64-mild-beta_near2-sigmoid-negeig-safegate-alog-scale0.0625-bwd',
    'kda-fp16-bshd-N2-L64-H2/2/2-K128-V64-steep-state_bf16-beta_one-safegate-scale0.5-cont[21]',
    'kda-fp16-thd-N1-T[1]-H2/2/2-K64-V64-extreme-state_bf16-sigmoid-negeig-safegate-scale0.5',
    'kda-fp16-thd-N3-T[0_1_127]-H2/2/4-K64-V128-extreme-state_bf16-beta_one-sigmoid-negeig-safegate-dtbias-cont[64]',
]

H200_FLA_KDA_PASSED = [
    'kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-extreme-state_bf16-safegate-alog-dtbias-scale0.5',
    'kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-typical-state_bf16-beta_one-bwd',
    'kda-bf16-bhsd-N1-L1-H2/2/2-K96-V96-typical-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0-bwd',
    'kda-bf16-bhsd-N1-L1-H2/2/4-K128-V128-steep-state_bf16-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-bhsd-N1-L128-H4/4/4-K64-V128-steep-state_bf16-beta_near2-l2norm-sigmoid-negeig-safegate-alog-dtbias-'
    'scale0.0625-h0-bwd',
    'kda-bf16-bhsd-N1-L128-H4/4/4-K64-V64-trained-l2norm-cont[42]-bwd',
    'kda-bf16-bhsd-N1-L200-H2/2/4-K128-V128-trained-l2norm-sigmoid-h0-cont[63]',
    'kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-state_bf16-beta_one-h0-cont[85]-bwd',
    'kda-bf16-bhsd-N1-L63-H2/2/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[31]',
    'kda-bf16-bhsd-N1-L64-H1/1/4-K128-V64-typical-state_bf16-safegate-alog',
    'kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-beta_zero-h0-bwd',
    'kda-bf16-bhsd-N2-L200-H4/4/4-K128-V128-long-state_bf16-beta_near2-sigmoid-negeig-safegate-alog-scale1.0-h0-'
    'cont[66]',
    'kda-bf16-bhsd-N4-L31-H2/2/2-K128-V128-typical-beta_one-l2norm-safegate-alog-dtbias',
    'kda-bf16-bshd-N1-L200-H2/2/2-K96-V96-mild-state_bf16-beta_one-sigmoid-negeig-safegate-alog-dtbias-scale0.5-'
    'cont[65_66]',
    'kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0-bwd',
    'kda-bf16-bshd-N1-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-mild-beta_zero-cont[32_63]-bwd',
    'kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-'
    'scale1.0-cont[63]',
    'kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd',
    'kda-bf16-bshd-N2-L129-H2/2/4-K128-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-scale0.0625-h0-cont[43_64]',
    'kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd',
    'kda-bf16-bshd-N2-L200-H2/2/2-K128-V128-long-l2norm-safegate-alog-dtbias-scale0.5-h0-cont[133]',
    'kda-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-bwd',
    'kda-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0-bwd',
    'kda-bf16-sbhd-N1-L128-H1/1/4-K64-V64-steep-state_bf16-beta_one-l2norm-safegate-alog-scale0.5-cont[64]',
    'kda-bf16-sbhd-N1-L128-H2/2/2-K128-V128-trained-beta_zero-cont[65]-bwd',
    'kda-bf16-sbhd-N1-L200-H1/1/4-K96-V96-extreme-beta_near2-l2norm-sigmoid-negeig-safegate-dtbias-cont[1_66]',
    'kda-bf16-sbhd-N1-L200-H4/4/4-K128-V64-mild-state_bf16-beta_near2-sigmoid-negeig-safegate-alog-dtbias-scale0.5-h0',
    'kda-bf16-sbhd-N1-L320-H4/4/4-K128-V128-long-state_bf16-l2norm-safegate-alog-dtbias-scale0.0625-h0-cont[160]',
    'kda-bf16-sbhd-N1-L63-H2/2/2-K128-V128-extreme-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-sbhd-N1-L65-H2/2/2-K128-V128-typical-state_bf16-beta_one-sigmoid-safegate-alog-dtbias-scale0.0625',
    'kda-bf16-sbhd-N2-L129-H1/1/4-K128-V128-steep-beta_zero-scale1.0-h0',
    'kda-bf16-sbhd-N2-L129-H2/2/2-K128-V128-zero-state_bf16-beta_zero-h0-bwd',
    'kda-bf16-sbhd-N2-L200-H1/1/4-K128-V64-long-beta_near2-sigmoid-negeig-safegate-dtbias-scale1.0-h0-cont[133]',
    'kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]',
    'kda-bf16-sbhd-N4-L31-H2/2/2-K64-V128-trained-state_bf16-beta_one-l2norm-sigmoid-negeig-safegate-cont[15_30]',
    'kda-bf16-sbhd-N4-L31-H4/4/4-K96-V96-steep-safegate-dtbias-scale0.5-h0-bwd',
    'kda-bf16-thd-N1-T[200]-H2/2/4-K128-V128-extreme-state_bf16-beta_one-safegate-alog-dtbias-scale0.5-cont[1]',
    'kda-bf16-thd-N1-T[63]-H4/4/4-K64-V128-typical-beta_near2-sigmoid-negeig-safegate-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N1-T[65]-H4/4/4-K128-V128-typical-sigmoid-safegate-alog-dtbias-scale1.0-cont[21]',
    'kda-bf16-thd-N2-T[129_129]-H2/2/2-K96-V96-zero-beta_zero-l2norm-safegate-alog-cont[43]-bwd',
    'kda-bf16-thd-N2-T[257_257]-H4/4/4-K64-V128-long-state_bf16-beta_zero-l2norm-h0-cont[85_171]-bwd',
    'kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0-bwd',
    'kda-bf16-thd-N3-T[0_1_127]-H1/1/4-K128-V64-trained-state_bf16-beta_near2-l2norm-sigmoid-negeig-safegate-'
    'dtbias-h0-bwd',
    'kda-bf16-thd-N3-T[0_1_127]-H2/2/2-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0',
    'kda-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-bwd',
    'kda-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0-bwd',
    'kda-bf16-thd-N3-T[0_257_1]-H2/2/2-K128-V128-typical-safegate-h0-bwd',
    'kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd',
    'kda-bf16-thd-N3-T[257_0_300]-H2/2/4-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-'
    'cont[150]',
    'kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd',
    'kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0',
    'kda-bf16-thd-N4-T[0_1_63_65]-H2/2/4-K128-V128-extreme-beta_zero-l2norm-safegate-alog-dtbias-h0',
    'kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd',
    'kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd',
    'kda-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-typical-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-'
    'scale0.0625-h0',
    'kda-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-cont[1]',
    'kda-bf16-thd-N6-T[63_1_0_64_65_2]-H4/4/4-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-'
    'dtbias-scale1.0',
    'kda-fp16-bhsd-N1-L200-H1/1/4-K64-V128-mild-sigmoid-safegate-h0-bwd',
    'kda-fp16-bhsd-N1-L320-H2/2/2-K96-V96-long-h0-cont[106]',
    'kda-fp16-bhsd-N1-L63-H2/2/2-K64-V64-mild-sigmoid-safegate-dtbias-h0-cont[1]',
    'kda-fp16-bhsd-N2-L129-H1/1/4-K96-V96-steep-state_bf16-beta_zero-l2norm-safegate-cont[65_128]-bwd',
    'kda-fp16-bshd-N1-L200-H2/2/4-K64-V128-extreme-beta_zero-safegate-alog-scale1.0-bwd',
    'kda-fp16-bshd-N1-L257-H2/2/2-K128-V128-long-state_bf16-beta_one-safegate-scale0.5-h0-cont[85]',
    'kda-fp16-bshd-N1-L260-H2/2/2-K64-V64-steep-safegate-alog-dtbias-h0-bwd',
    'kda-fp16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_zero-safegate-dtbias-scale0.0625-bwd',
    'kda-fp16-bshd-N2-L200-H2/2/4-K64-V64-long-beta_zero-sigmoid-negeig-safegate-alog-dtbias-scale0.0625-h0-cont[100]',
    'kda-fp16-bshd-N4-L31-H2/2/4-K64-V128-extreme-beta_near2-sigmoid-negeig',
    'kda-fp16-sbhd-N1-L200-H1/1/4-K128-V128-typical-beta_one-l2norm-sigmoid-negeig-h0-cont[63_66]',
    'kda-fp16-sbhd-N4-L31-H2/2/4-K96-V96-trained-beta_zero-l2norm-safegate-alog-h0',
    'kda-fp16-thd-N1-T[1]-H2/2/4-K128-V64-zero-state_bf16-beta_one-safegate-dtbias-h0',
    'kda-fp16-thd-N2-T[63_63]-H4/4/4-K64-V128-zero-safegate-dtbias-scale0.5-cont[62]',
    'kda-fp16-thd-N3-T[0_257_1]-H2/2/2-K64-V64-typical-safegate-h0-bwd',
    'kda-fp16-thd-N4-T[0_1_63_65]-H1/1/4-K64-V64-zero-state_bf16-beta_near2-sigmoid-negeig-safegate-scale0.5-h0',
    'kda-fp16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V64-mild-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-'
    'scale0.5-h0-bwd',
    'kda-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V64-extreme-l2norm-h0-cont[64]-bwd',
    'kda-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K96-V96-typical-l2norm-sigmoid-scale0.5-cont[63]',
]


def test_the_shipped_fla_entry_covers_exactly_the_h200_failures():
    issue = {i.id: i for i in load_known_issues([SHIPPED])}["fla-kda-fp16-safe-gate-forward-tf32"]
    fla = Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0), versions={"fla": "0.6.0", "triton": "3.6.0"})
    covered = {cid for cid in H200_FLA_KDA_FAILED + H200_FLA_KDA_PASSED
               if issue.applies_to(Case.from_id(cid), "fla", "fla", fla)}
    assert covered == set(H200_FLA_KDA_FAILED)
    assert issue.checks == ("forward", "grad_beta")
    case = Case.from_id(H200_FLA_KDA_FAILED[0])
    for env in (Env(cuda=True, capability=(9, 0), versions={"fla": "0.6.1", "triton": "3.6.0"}),
                Env(cuda=True, capability=(9, 0), versions={"fla": "0.6.0", "triton": "3.7.1"}),
                Env(cuda=True, capability=(10, 0), versions={"fla": "0.6.0", "triton": "3.6.0"})):
        assert not issue.applies_to(case, "fla", "fla", env), env
    assert not issue.applies_to(case, "cudnn", "cudnn", fla)


# cuDNN FE 1.32.0's engines pinned on the H200 (SM90), L0 tier, 2026-12-02 (issue #24): kda_hopper_cuda with
# CUDAToolkit_ROOT set (it compiled; 37 cases ran) and the CuTe DSL engine kda_hopper (6 cases ran). Every case not
# listed as failing passed all of its checks.
H200_KDA_HOPPER_CUDA_PASSED = [*H200_CUDNN_KDA_PASSED, "kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0-bwd"]
H200_KDA_HOPPER_DSL_FAILED = ["kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd"]
H200_KDA_HOPPER_DSL_PASSED = [
    "kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-typical-state_bf16-beta_one-bwd",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-beta_zero-h0-bwd",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-mild-beta_zero-cont[32_63]-bwd",
    "kda-bf16-sbhd-N1-L128-H2/2/2-K128-V128-trained-beta_zero-cont[65]-bwd",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
]


# cuDNN FE 1.32.0 on the H200 (SM90), L0 gdn + kda, 2026-12-02, third session (the adapter hands FE contiguous
# incoming gradients; cuda-tile 1.7.0 and tileiras 13.4.92 on PATH; run cut at 287 s: 68 of 119 gdn and 66 of 117 kda
# cases reached). FAILED: a check failed or was known; NOT_FAILED: no check failed (a few errored: FE refused the
# bf16 state a continuation carries). `cudnn` served GDN by gdn_cutile alone, so its lists are gdn_cutile's.
H200_R3_GDN_CUTILE_FAILED = [
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-bwd",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0-bwd",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-bwd",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0-bwd",
]
H200_R3_GDN_CUTILE_NOT_FAILED = [
    "gdn-bf16-bhsd-N1-L128-H2/2/4-K128-V128-mild-beta_one-l2norm-h0-cont[63]",
    "gdn-bf16-bhsd-N4-L31-H4/4/4-K64-V128-mild-state_bf16-beta_one-l2norm-safegate-scale0.0625-cont[1_15]",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-typical-l2norm-cont[64]-bwd",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K64-V64-trained-beta_one-h0",
    "gdn-bf16-bshd-N2-L129-H4/4/4-K96-V96-zero-beta_one-l2norm",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0",
    "gdn-bf16-bshd-N3-L65-H1/1/4-K64-V128-mild-beta_zero-scale0.0625-h0",
    "gdn-bf16-bshd-N3-L65-H2/2/2-K96-V96-steep-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-bwd",
    "gdn-bf16-sbhd-N1-L1-H2/2/2-K128-V128-steep-state_bf16-l2norm",
    "gdn-bf16-sbhd-N2-L257-H4/4/4-K128-V128-long-beta_zero-scale0.5-h0-cont[171]-bwd",
    "gdn-bf16-sbhd-N3-L65-H2/2/4-K96-V96-typical-beta_one-l2norm",
    "gdn-bf16-thd-N1-T[63]-H4/4/4-K64-V128-zero-state_bf16-beta_one-scale0.5",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0",
    "gdn-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "gdn-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K64-V64-steep-h0-cont[63]",
    "gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-beta_one-h0-bwd",
    "gdn-fp16-bhsd-N1-L65-H4/4/4-K128-V128-zero-state_bf16-scale0.0625-cont[1]",
    "gdn-fp16-sbhd-N1-L200-H1/1/4-K128-V128-mild-state_bf16-beta_zero-scale1.0-bwd",
    "gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V64-trained-beta_one-safegate-alog-dtbias-scale1.0-cont[62]",
    "gdn-fp16-thd-N1-T[63]-H4/4/4-K128-V128-extreme-beta_one-cont[21_31]",
    "gdn-fp16-thd-N3-T[65_65_65]-H2/2/4-K128-V128-steep-beta_one-scale0.0625-h0-cont[64]-bwd",
    "gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-trained-beta_zero-l2norm-h0",
]
H200_R3_KDA_CUTILE_FAILED = [
    "kda-bf16-bhsd-N4-L31-H2/2/4-K128-V128-trained-beta_one-l2norm-sigmoid-h0-cont[10]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    "kda-bf16-thd-N1-T[65]-H2/2/2-K128-V128-trained-cont[1]-bwd",
]
H200_R3_KDA_CUTILE_NOT_FAILED = [
    "kda-bf16-bhsd-N1-L200-H4/4/4-K128-V128-mild-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0",
    "kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-cont[85]",
    "kda-bf16-bhsd-N1-L63-H4/4/4-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-cont[62]",
    "kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1_21]",
    "kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-dtbias-scale0.0625-h0-cont[63]",
    "kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-mild-l2norm-sigmoid-safegate-scale0.0625-h0",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-state_bf16-beta_zero-cont[64]-bwd",
    "kda-bf16-bhsd-N2-L129-H2/2/2-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0-cont[63_64]",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-steep-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-alog-dtbias",
    "kda-bf16-bshd-N1-L200-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0-cont[100_199]",
    "kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-l2norm-scale1.0",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-alog-scale1.0-h0-cont[1]",
    "kda-bf16-bshd-N1-L65-H2/2/4-K128-V128-steep-l2norm-safegate-alog-dtbias-cont[21]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-zero-l2norm-sigmoid-safegate-dtbias-h0",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-bshd-N2-L200-H2/2/4-K128-V128-long-beta_zero-l2norm-scale0.5-h0-cont[133]",
    "kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-trained-l2norm-sigmoid-safegate-alog-dtbias-scale1.0",
    "kda-bf16-bshd-N3-L65-H2/2/2-K128-V128-typical-l2norm-sigmoid-safegate-dtbias-h0-cont[21]",
    "kda-bf16-sbhd-N1-L257-H4/4/4-K128-V128-long-beta_one-h0-cont[171]-bwd",
    "kda-bf16-sbhd-N1-L64-H2/2/2-K128-V128-steep-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1]",
    "kda-bf16-sbhd-N1-L64-H4/4/4-K128-V128-zero-l2norm-sigmoid-safegate",
    "kda-bf16-sbhd-N2-L257-H2/2/2-K128-V128-long-beta_one-l2norm-sigmoid-safegate-dtbias-h0-cont[85]",
    "kda-bf16-sbhd-N2-L63-H4/4/4-K128-V128-steep-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-cont[62]",
    "kda-bf16-sbhd-N2-L64-H2/2/2-K128-V128-mild-state_bf16-l2norm-sigmoid-safegate-alog",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-sbhd-N4-L31-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-h0",
    "kda-bf16-thd-N1-T[128]-H4/4/4-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[63]",
    "kda-bf16-thd-N1-T[200]-H4/4/4-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias-scale1.0-cont[199]",
    "kda-bf16-thd-N1-T[65]-H2/2/4-K128-V128-mild-beta_zero-h0",
    "kda-bf16-thd-N2-T[64_64]-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N3-T[0_257_1]-H2/2/2-K128-V128-typical-safegate-h0-bwd",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N4-T[0_1_63_65]-H1/1/4-K128-V128-typical-beta_one-sigmoid-scale1.0-cont[32_64]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-scale0.0625-cont[1]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-mild-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-scale0.0625-cont[21]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-zero-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias",
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[129]",
    "kda-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H1/1/4-K128-V128-zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
]
# `cudnn` kda: both engines served (results' engine); the kda_hopper_cuda subset judges the pinned entry too.
H200_R3_KDA_ROUTED_FAILED = [
    "kda-bf16-bhsd-N1-L64-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0",
    "kda-bf16-bhsd-N4-L31-H2/2/4-K128-V128-trained-beta_one-l2norm-sigmoid-h0-cont[10]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    "kda-bf16-thd-N1-T[65]-H2/2/2-K128-V128-trained-cont[1]-bwd",
    "kda-bf16-thd-N5-T[65_0_1_200_3]-H2/2/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-h0",
]
H200_R3_KDA_ROUTED_NOT_FAILED = [
    "kda-bf16-bhsd-N1-L200-H4/4/4-K128-V128-mild-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0",
    "kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-cont[85]",
    "kda-bf16-bhsd-N1-L63-H4/4/4-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-cont[62]",
    "kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-beta_one-h0-bwd",
    "kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1_21]",
    "kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-dtbias-scale0.0625-h0-cont[63]",
    "kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-mild-l2norm-sigmoid-safegate-scale0.0625-h0",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-state_bf16-beta_zero-cont[64]-bwd",
    "kda-bf16-bhsd-N2-L129-H2/2/2-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0-cont[63_64]",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-steep-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-alog-dtbias",
    "kda-bf16-bshd-N1-L200-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0-cont[100_199]",
    "kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-l2norm-scale1.0",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-alog-scale1.0-h0-cont[1]",
    "kda-bf16-bshd-N1-L65-H2/2/4-K128-V128-steep-l2norm-safegate-alog-dtbias-cont[21]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-zero-l2norm-sigmoid-safegate-dtbias-h0",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-bshd-N2-L200-H2/2/4-K128-V128-long-beta_zero-l2norm-scale0.5-h0-cont[133]",
    "kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-trained-l2norm-sigmoid-safegate-alog-dtbias-scale1.0",
    "kda-bf16-bshd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-h0-bwd",
    "kda-bf16-bshd-N3-L65-H2/2/2-K128-V128-typical-l2norm-sigmoid-safegate-dtbias-h0-cont[21]",
    "kda-bf16-sbhd-N1-L200-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-sbhd-N1-L257-H4/4/4-K128-V128-long-beta_one-h0-cont[171]-bwd",
    "kda-bf16-sbhd-N1-L64-H2/2/2-K128-V128-steep-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1]",
    "kda-bf16-sbhd-N1-L64-H4/4/4-K128-V128-zero-l2norm-sigmoid-safegate",
    "kda-bf16-sbhd-N2-L257-H2/2/2-K128-V128-long-beta_one-l2norm-sigmoid-safegate-dtbias-h0-cont[85]",
    "kda-bf16-sbhd-N2-L63-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[21]",
    "kda-bf16-sbhd-N2-L63-H4/4/4-K128-V128-steep-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-cont[62]",
    "kda-bf16-sbhd-N2-L64-H2/2/2-K128-V128-mild-state_bf16-l2norm-sigmoid-safegate-alog",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-sbhd-N4-L31-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-h0",
    "kda-bf16-thd-N1-T[128]-H4/4/4-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[63]",
    "kda-bf16-thd-N1-T[200]-H4/4/4-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias-scale1.0-cont[199]",
    "kda-bf16-thd-N1-T[65]-H2/2/4-K128-V128-mild-beta_zero-h0",
    "kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0-bwd",
    "kda-bf16-thd-N2-T[64_64]-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N3-T[0_257_1]-H2/2/2-K128-V128-typical-safegate-h0-bwd",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-thd-N3-T[257_0_300]-H2/2/2-K128-V128-long-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[150_200]",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N4-T[0_1_63_65]-H1/1/4-K128-V128-typical-beta_one-sigmoid-scale1.0-cont[32_64]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-scale0.0625-cont[1]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-mild-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-scale0.0625-cont[21]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-zero-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias",
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-steep-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[129]",
    "kda-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H1/1/4-K128-V128-zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
]
H200_R3_KDA_ROUTED_HOPPER_CUDA_FAILED = [
    "kda-bf16-bhsd-N1-L64-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0",
    "kda-bf16-bhsd-N4-L31-H2/2/4-K128-V128-trained-beta_one-l2norm-sigmoid-h0-cont[10]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    "kda-bf16-thd-N1-T[65]-H2/2/2-K128-V128-trained-cont[1]-bwd",
    "kda-bf16-thd-N5-T[65_0_1_200_3]-H2/2/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-h0",
]
H200_R3_KDA_ROUTED_HOPPER_CUDA_NOT_FAILED = [
    "kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-cont[85]",
    "kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-beta_one-h0-bwd",
    "kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1_21]",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-state_bf16-beta_zero-cont[64]-bwd",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-steep-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-alog-dtbias",
    "kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-l2norm-scale1.0",
    "kda-bf16-bshd-N1-L65-H2/2/4-K128-V128-steep-l2norm-safegate-alog-dtbias-cont[21]",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-bshd-N2-L200-H2/2/4-K128-V128-long-beta_zero-l2norm-scale0.5-h0-cont[133]",
    "kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-trained-l2norm-sigmoid-safegate-alog-dtbias-scale1.0",
    "kda-bf16-bshd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-h0-bwd",
    "kda-bf16-sbhd-N1-L200-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-sbhd-N1-L257-H4/4/4-K128-V128-long-beta_one-h0-cont[171]-bwd",
    "kda-bf16-sbhd-N1-L64-H2/2/2-K128-V128-steep-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[1]",
    "kda-bf16-sbhd-N2-L63-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[21]",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
    "kda-bf16-thd-N1-T[128]-H4/4/4-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[63]",
    "kda-bf16-thd-N1-T[65]-H2/2/4-K128-V128-mild-beta_zero-h0",
    "kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0-bwd",
    "kda-bf16-thd-N2-T[64_64]-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-thd-N3-T[257_0_300]-H2/2/2-K128-V128-long-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-h0-cont[150_200]",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N4-T[0_1_63_65]-H1/1/4-K128-V128-typical-beta_one-sigmoid-scale1.0-cont[32_64]",
    "kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-mild-beta_one-l2norm-sigmoid-safegate-alog-dtbias-cont[63]",
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-steep-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0",
    "kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[129]",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H1/1/4-K128-V128-zero-l2norm-sigmoid-safegate-alog-dtbias-h0",
]


H200_FI = replace(H200, versions={**H200.versions, "flashinfer": "0.7.2.post1"})
H200_VLLM = replace(H200, versions={**H200.versions, "vllm": "0.33.0"})

# vLLM 0.33's FLA copy, chunk path, on the H200 (2026-12-02, issue 26, bench/serving_h200.sh): every case run.
H200_VLLM_CHUNK_FAILED = [
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0",
    "gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V64-typical-state_bf16-l2norm",
    # the same day, issue 25 (helper w25): the L0 gdn cases of vllm-fla that ran before `run --tier L0 --op gdn
    # --backend fla-dispatch --backend flashqla --backend vllm-fla -j 8` was cut at 280 s
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-bwd",
    "gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0-bwd",
    "gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K96-V96-extreme-state_bf16-beta_one-l2norm-scale1.0-h0",
    "gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-trained-beta_zero-l2norm-h0",
    # issue 25's complete L0 run (helper h25, 2026-12-02, bench/i25_h200.sh: `run --tier L0 --op gdn --op kda
    # --backend vllm-fla --backend flashkda -j 1`, VLLM_TRITON_FORCE_FIRST_CONFIG=1): every case of the description
    # failed. T[1_300_192]...cont[150_200] holds no empty sequence, but its continuation's second call does (the
    # 1-token first sequence has ended at the split: lengths [0, 50, 42]); only its two continuation checks fail
    "gdn-bf16-thd-N3-T[1_300_192]-H1/1/4-K128-V128-long-state_bf16-l2norm-scale1.0-h0-cont[150_200]",
    "gdn-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-beta_one-l2norm-scale1.0-cont[32_63]",
    "gdn-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "gdn-bf16-thd-N4-T[1_64_0_130]-H1/1/4-K128-V64-zero-beta_zero-scale0.5-h0-cont[43]",
    "gdn-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K64-V64-steep-h0-cont[63]",
    "gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-steep-l2norm-cont[65]",
    "gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-beta_one-h0-bwd",
    "gdn-fp16-thd-N3-T[257_0_300]-H2/2/2-K64-V128-long-beta_one-scale1.0-h0-cont[150_200]",
    "gdn-fp16-thd-N4-T[1_64_0_130]-H2/2/4-K128-V128-typical-state_bf16-beta_zero-l2norm-h0-cont[43]",
    "gdn-fp16-thd-N5-T[65_0_1_200_3]-H2/2/4-K96-V96-mild-state_bf16-l2norm-scale0.5-cont[63_65]",
    "gdn-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V128-mild-state_bf16-l2norm-scale0.0625-cont[1_199]",
]
H200_VLLM_CHUNK_PASSED = [
    "gdn-bf16-thd-N3-T[1_65_0]-H2/2/2-K96-V96-typical",
    "gdn-bf16-thd-N2-T[1_65]-H2/2/2-K96-V96-typical",
    # issue 25's L0 run (above): every other vllm-fla case that ran passed all of its checks
    "gdn-bf16-bhsd-N1-L128-H2/2/4-K128-V128-mild-beta_one-l2norm-h0-cont[63]",
    "gdn-bf16-bhsd-N1-L64-H2/2/4-K96-V96-trained-state_bf16-beta_zero-h0-cont[63]",
    "gdn-bf16-bshd-N2-L129-H4/4/4-K96-V96-zero-beta_one-l2norm",
    "gdn-bf16-sbhd-N1-L1-H2/2/2-K128-V128-steep-state_bf16-l2norm",
    "gdn-bf16-sbhd-N2-L257-H4/4/4-K128-V128-long-beta_zero-scale0.5-h0-cont[171]-bwd",
    "gdn-bf16-sbhd-N3-L65-H2/2/4-K96-V96-typical-beta_one-l2norm",
    "gdn-fp16-bhsd-N1-L65-H4/4/4-K128-V128-zero-state_bf16-scale0.0625-cont[1]",
    "gdn-fp16-bshd-N2-L129-H1/1/4-K128-V128-typical-state_bf16-beta_one-scale0.0625-h0",
    # issue 25's complete L0 run (above): every other vllm-fla case that ran passed all of its checks
    "gdn-bf16-bhsd-N1-L200-H4/4/4-K128-V128-typical-state_bf16-l2norm-cont[64_199]",
    "gdn-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-l2norm-h0-cont[85_171]",
    "gdn-bf16-bhsd-N2-L129-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0-bwd",
    "gdn-bf16-bhsd-N2-L129-H2/2/2-K128-V128-trained-scale0.0625-cont[64_128]",
    "gdn-bf16-bhsd-N4-L31-H4/4/4-K128-V128-steep-state_bf16-l2norm",
    "gdn-bf16-bshd-N1-L128-H2/2/2-K128-V64-steep-state_bf16-beta_one-l2norm-scale1.0-cont[64_127]",
    "gdn-bf16-bshd-N1-L63-H2/2/2-K128-V128-extreme-state_bf16-cont[62]",
    "gdn-bf16-bshd-N1-L65-H1/1/4-K128-V128-trained-state_bf16-beta_one-scale0.0625-cont[63]-bwd",
    "gdn-bf16-bshd-N1-L65-H4/4/4-K64-V64-extreme-state_bf16-l2norm-scale1.0-h0",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-steep-beta_zero-l2norm-scale0.0625-h0",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-typical-l2norm-cont[64]-bwd",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K64-V64-trained-beta_one-h0",
    "gdn-bf16-bshd-N2-L257-H2/2/2-K128-V64-long-beta_one-scale0.5-h0-cont[171]",
    "gdn-bf16-bshd-N2-L63-H2/2/2-K64-V128-trained-state_bf16-h0-bwd",
    "gdn-bf16-bshd-N2-L64-H2/2/4-K128-V128-mild-beta_zero-l2norm-scale0.5-h0",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-bwd",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0",
    "gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0-bwd",
    "gdn-bf16-bshd-N3-L65-H1/1/4-K64-V128-mild-beta_zero-scale0.0625-h0",
    "gdn-bf16-bshd-N3-L65-H4/4/4-K64-V128-typical-state_bf16-beta_zero-l2norm-h0-cont[21]",
    "gdn-bf16-bshd-N4-L31-H2/2/2-K128-V128-zero-state_bf16-beta_zero-l2norm-scale0.0625-h0-cont[15]",
    "gdn-bf16-sbhd-N1-L65-H2/2/2-K64-V128-trained-state_bf16-beta_one-scale0.5-h0",
    "gdn-bf16-sbhd-N2-L63-H4/4/4-K128-V128-trained-state_bf16-l2norm-scale1.0-cont[1]",
    "gdn-bf16-sbhd-N2-L64-H2/2/2-K128-V128-zero-beta_one-l2norm-cont[1_32]",
    "gdn-bf16-thd-N1-T[63]-H4/4/4-K64-V128-zero-state_bf16-beta_one-scale0.5",
    "gdn-bf16-thd-N3-T[65_65_65]-H2/2/2-K64-V64-mild-state_bf16-beta_zero-l2norm-scale1.0-h0",
    "gdn-fp16-bhsd-N1-L320-H2/2/2-K96-V96-long-beta_zero-h0-cont[160]",
    "gdn-fp16-bhsd-N1-L65-H2/2/2-K64-V64-typical-beta_one-l2norm-scale0.0625-cont[63]",
    "gdn-fp16-bhsd-N2-L64-H4/4/4-K128-V64-trained-state_bf16-l2norm",
    "gdn-fp16-bhsd-N3-L65-H1/1/4-K64-V128-steep-beta_one-scale0.0625-cont[1]",
    "gdn-fp16-bhsd-N3-L65-H2/2/4-K64-V128-extreme-cont[1_64]",
    "gdn-fp16-bshd-N1-L320-H4/4/4-K128-V128-long-beta_one-l2norm-h0-cont[160_213]",
    "gdn-fp16-sbhd-N1-L200-H1/1/4-K128-V128-mild-state_bf16-beta_zero-scale1.0-bwd",
    "gdn-fp16-sbhd-N1-L320-H2/2/4-K64-V64-long-state_bf16-beta_zero-h0-cont[160]",
    "gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V128-extreme-beta_zero-l2norm-h0-cont[21]",
    "gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V64-mild-state_bf16-scale1.0-h0-cont[1_21]",
    "gdn-fp16-sbhd-N1-L63-H2/2/2-K128-V128-typical-state_bf16-beta_one-l2norm-cont[1_21]",
    "gdn-fp16-sbhd-N3-L65-H2/2/2-K64-V64-zero-state_bf16",
    "gdn-fp16-sbhd-N4-L31-H2/2/4-K128-V64-extreme-beta_zero-scale0.5-h0",
    "gdn-fp16-sbhd-N4-L31-H2/2/4-K96-V96-steep-beta_zero-scale0.5-h0-cont[1]",
    "gdn-fp16-thd-N1-T[63]-H4/4/4-K128-V128-extreme-beta_one-cont[21_31]",
    "gdn-fp16-thd-N3-T[65_65_65]-H2/2/4-K128-V128-steep-beta_one-scale0.0625-h0-cont[64]-bwd",
]


H200_QLA = replace(H200, versions={**H200.versions, "flash_qla": "0.1.3", "tilelang": "0.1.15"})

# FlashQLA 0.1.3 on the H200 (2026-12-02, issue 25, helper w25): `deltacheck run --tier L0 --op gdn --backend
# fla-dispatch --backend flashqla --backend vllm-fla -j 8 --threads 1`, cut at 280 s; the cases that ran (a check not
# skipped). The two errored (ValueError: invalid sequence lengths), every check of the others passed; the same two
# on fla-dispatch (served by FlashQLA through FLA's dispatch), where FLA's Triton served three other empty-sequence
# cases (beta sigmoid or K = 96) and they passed.
H200_QLA_REFUSED = [
    "gdn-bf16-thd-N3-T[1_300_192]-H1/1/4-K128-V128-long-state_bf16-l2norm-scale1.0-h0-cont[150_200]",
    "gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-trained-beta_zero-l2norm-h0",
]
H200_QLA_PASSED = [
    "gdn-bf16-bhsd-N1-L128-H2/2/4-K128-V128-mild-beta_one-l2norm-h0-cont[63]",
    "gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-typical-l2norm-cont[64]-bwd",
    "gdn-bf16-sbhd-N1-L1-H2/2/2-K128-V128-steep-state_bf16-l2norm",
    "gdn-bf16-sbhd-N2-L257-H4/4/4-K128-V128-long-beta_zero-scale0.5-h0-cont[171]-bwd",
    "gdn-fp16-bhsd-N1-L65-H4/4/4-K128-V128-zero-state_bf16-scale0.0625-cont[1]",
    "gdn-fp16-bshd-N2-L129-H1/1/4-K128-V128-typical-state_bf16-beta_one-scale0.0625-h0",
    "gdn-fp16-sbhd-N1-L200-H1/1/4-K128-V128-mild-state_bf16-beta_zero-scale1.0-bwd",
    "gdn-fp16-thd-N1-T[63]-H4/4/4-K128-V128-extreme-beta_one-cont[21_31]",
]
H200_FLA_DISPATCH_GDN_PASSED = H200_QLA_PASSED + [
    "gdn-bf16-bhsd-N1-L128-H2/2/2-K96-V96-trained-state_bf16-safegate-scale0.0625-h0-cont[64_127]",
    "gdn-bf16-bhsd-N1-L200-H1/1/4-K128-V128-mild-beta_zero-sigmoid-negeig-safegate-dtbias-h0-bwd",
    "gdn-bf16-bhsd-N1-L64-H2/2/4-K96-V96-trained-state_bf16-beta_zero-h0-cont[63]",
    "gdn-bf16-bshd-N1-L65-H4/4/4-K96-V96-typical-state_bf16-beta_near2-sigmoid-negeig-scale1.0",
    "gdn-bf16-bshd-N2-L129-H4/4/4-K96-V96-zero-beta_one-l2norm",
    "gdn-bf16-bshd-N3-L65-H2/2/2-K96-V96-steep-state_bf16-beta_zero-l2norm-safegate-alog-dtbias-bwd",
    "gdn-bf16-sbhd-N2-L200-H2/2/2-K96-V96-long-beta_zero-sigmoid-safegate-dtbias-h0-cont[100]-bwd",
    "gdn-bf16-sbhd-N3-L65-H2/2/2-K128-V128-trained-sigmoid-safegate-alog-scale0.5-cont[64]",
    "gdn-bf16-sbhd-N3-L65-H2/2/4-K96-V96-typical-beta_one-l2norm",
    "gdn-bf16-thd-N3-T[0_1_127]-H4/4/4-K128-V128-extreme-state_bf16-beta_near2-sigmoid-negeig-safegate-alog-dtbias-"
    "scale0.5-cont[42_64]-bwd",
    "gdn-bf16-thd-N3-T[0_1_127]-H4/4/4-K96-V96-typical-sigmoid-safegate-dtbias-scale0.0625-cont[1_64]",
    "gdn-fp16-bhsd-N2-L64-H1/1/4-K128-V128-zero-sigmoid-safegate-alog-dtbias-scale0.0625-h0-cont[21]",
    "gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-zero-state_bf16-beta_near2-l2norm-sigmoid-negeig-safegate-"
    "scale0.0625-h0-cont[32]-bwd",
]
# What those two cases' checks said (results.jsonl of that run; the determinism check of the first, left unrun after
# the first call raised, worded as the runner words it since: with the first call's error).
H200_QLA_REFUSALS = {
    H200_QLA_REFUSED[0]: {"forward": "pass", "state": "pass", "determinism": "pass",
                          "continuation_ref": "ValueError: invalid sequence lengths: [0, 1, 1]",
                          "continuation_self": "ValueError: invalid sequence lengths: [0, 1, 1]"},
    H200_QLA_REFUSED[1]: {"forward": "ValueError: invalid sequence lengths: [1, 1, 0, 1, 2, 1]",
                          "state": "ValueError: invalid sequence lengths: [1, 1, 0, 1, 2, 1]",
                          "determinism": "not run: the first call raised ValueError: invalid sequence lengths: "
                                         "[1, 1, 0, 1, 2, 1]"},
}


@pytest.mark.parametrize("spec", ["flashqla", "fla-dispatch"])
def test_the_shipped_flashqla_refusal_entries_make_exactly_the_h200_errors_known(spec):
    """On the run the entries came from, every errored check becomes known (each case's outcome 'reproduced'), the
    passing checks stay passes, and a wrong value on the same checks would stay a failure."""
    entries = [i for i in load_known_issues([SHIPPED]) if i.error_contains and i.covers("forward")]  # run's
    for case_id, checks in H200_QLA_REFUSALS.items():
        applying = applicable(entries, Case.from_id(case_id), spec, spec, H200_QLA)
        assert len(applying) == 1 and applying[0].backend == spec, case_id
        results = [Result(case=case_id, backend=spec, check=check, status="pass" if said == "pass" else "error",
                          reason="" if said == "pass" else said) for check, said in checks.items()]
        for r in results:
            mark_known(r, applying)
        assert {r.status for r in results} <= {"known", "pass"} and "known" in {r.status for r in results}, case_id
        assert outcomes(results, applying) == {applying[0].id: "reproduced"}
        wrong = Result(case=case_id, backend=spec, check="continuation_ref", status="fail", reason="out rel RMS 1.2")
        mark_known(wrong, applying)
        assert wrong.status == "fail"


# The FlashInfer lists are defined further down; the parameters are read when the module is collected.
def _shipped_entry_params():
    return [
        ("cudnn-kda-hopper-cuda-nan-below-log-decay-7", "cudnn@kda_hopper_cuda", "cudnn@kda_cutile", H200,
         H200_CUDNN_KDA_FAILED, H200_KDA_HOPPER_CUDA_PASSED),
        ("cudnn-kda-hopper-dsl-nan-extreme-gate", "cudnn@kda_hopper", "cudnn@kda_cutile", H200,
         H200_KDA_HOPPER_DSL_FAILED, H200_KDA_HOPPER_DSL_PASSED),
        ("cudnn-gdn-cutile-k96-backward-wrong", "cudnn@gdn_cutile", "cudnn", H200,
         H200_R3_GDN_CUTILE_FAILED, H200_R3_GDN_CUTILE_NOT_FAILED),
        ("cudnn-gdn-cutile-k96-backward-wrong-routed", "cudnn", "cudnn@gdn_cutile", H200,
         H200_R3_GDN_CUTILE_FAILED, H200_R3_GDN_CUTILE_NOT_FAILED),
        ("cudnn-kda-cutile-nan-below-log-decay", "cudnn@kda_cutile", "cudnn", H200,
         H200_R3_KDA_CUTILE_FAILED, H200_R3_KDA_CUTILE_NOT_FAILED),
        ("cudnn-kda-hopper-nan-below-log-decay-7", "cudnn", "cudnn@kda_cutile", H200,
         H200_R3_KDA_ROUTED_FAILED, H200_R3_KDA_ROUTED_NOT_FAILED),
        ("cudnn-kda-hopper-cuda-nan-below-log-decay-7", "cudnn@kda_hopper_cuda", "cudnn@kda_cutile", H200,
         H200_R3_KDA_ROUTED_HOPPER_CUDA_FAILED, H200_R3_KDA_ROUTED_HOPPER_CUDA_NOT_FAILED),
        ("flashinfer-gdn-prefill-empty-sequence-state-unwritten", "flashinfer", "flashinfer-decode", H200_FI,
         H200_FI_PREFILL_FAILED, H200_FI_PREFILL_PASSED),
        ("flashinfer-gdn-decode-fp16-bf16-level-error", "flashinfer-decode", "flashinfer", H200_FI,
         H200_FI_DECODE_FAILED, H200_FI_DECODE_PASSED),
        ("vllm-fla-chunk-empty-sequence-misnumbers-chunks", "vllm-fla", "vllm-fla-recurrent", H200_VLLM,
         H200_VLLM_CHUNK_FAILED, H200_VLLM_CHUNK_PASSED),
        ("flashqla-auto-cp-refuses-empty-sequence", "flashqla", "fla-dispatch", H200_QLA,
         H200_QLA_REFUSED, H200_QLA_PASSED),
        ("flashqla-auto-cp-refuses-empty-sequence-via-fla-dispatch", "fla-dispatch", "flashqla", H200_QLA,
         H200_QLA_REFUSED, H200_FLA_DISPATCH_GDN_PASSED),
    ]


def test_the_shipped_engine_entries_cover_exactly_the_h200_failures():
    """Each entry covers exactly the cases that failed where its evidence was taken, and is its own backend's:
    default routing and the sibling backends are judged by theirs."""
    for issue_id, spec, other, env, failed, passed in _shipped_entry_params():
        issue = {i.id: i for i in load_known_issues([SHIPPED])}[issue_id]
        covered = {cid for cid in failed + passed if issue.applies_to(Case.from_id(cid), spec, spec, env)}
        assert covered == set(failed), issue_id
        assert not issue.applies_to(Case.from_id(failed[0]), other, other, env), issue_id


# FlashInfer 0.7.2.post1 on the H200 (2026-12-02, second session): the envelope lists' cases that ran.
H200_FI_PREFILL_FAILED = [
    'gdn-bf16-thd-N3-T[257_0_300]-H2/2/2-K128-V128-long-state_bf16-beta_one-l2norm-linear-scale0.0625-h0-cont[100_200]',
    'gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-zero-state_bf16-l2norm-scale0.5-cont[199]',
    'gdn-fp16-thd-N3-T[0_1_127]-H4/4/4-K128-V128-typical-state_bf16-l2norm-h0-cont[1_63]',
    'gdn-fp16-thd-N4-T[0_1_63_65]-H2/2/4-K128-V128-trained-state_bf16-beta_one-l2norm-linear-scale0.0625-h0',
    'gdn-fp16-thd-N5-T[65_0_1_200_3]-H1/1/4-K128-V128-steep-state_bf16-l2norm-cont[63_66]',
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-extreme-beta_one-scale0.0625-cont[1_21]',
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H4/2/2-K128-V128-mild-beta_zero-h0-cont[63]',
]
H200_FI_PREFILL_PASSED = [
    'gdn-bf16-bhsd-N1-L63-H1/1/4-K128-V128-typical-beta_one-scale1.0-cont[62]',
    'gdn-bf16-bhsd-N1-L64-H1/1/4-K128-V128-trained-l2norm-h0-cont[21]',
    'gdn-bf16-bhsd-N2-L129-H2/2/2-K128-V128-steep-l2norm-linear',
    'gdn-bf16-bhsd-N2-L257-H4/2/2-K128-V128-long-state_bf16-l2norm-scale1.0-h0-cont[171]',
    'gdn-bf16-bshd-N1-L200-H2/2/2-K128-V128-mild-h0-cont[66]',
    'gdn-bf16-bshd-N1-L257-H2/2/2-K128-V128-long-beta_one-linear-h0-cont[85_171]',
    'gdn-bf16-bshd-N2-L64-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-linear-h0',
    'gdn-bf16-sbhd-N1-L64-H2/2/4-K128-V128-trained-l2norm-linear-scale0.5',
    'gdn-bf16-sbhd-N1-L64-H4/4/4-K128-V128-zero-beta_zero-linear-h0',
    'gdn-bf16-sbhd-N3-L65-H2/2/4-K128-V128-mild-state_bf16-beta_one-l2norm-linear-scale0.0625',
    'gdn-bf16-thd-N1-T[63]-H4/1/1-K128-V128-trained-linear-cont[31]',
    'gdn-bf16-thd-N2-T[200_200]-H1/1/4-K128-V128-long-state_bf16-beta_zero-l2norm-scale1.0-h0-cont[66]',
    'gdn-fp16-bhsd-N1-L200-H4/2/2-K128-V128-mild-state_bf16-l2norm-linear-h0',
    'gdn-fp16-bhsd-N2-L63-H4/2/2-K128-V128-typical-state_bf16-beta_zero-l2norm-linear-h0',
    'gdn-fp16-bhsd-N2-L64-H1/1/4-K128-V128-zero-beta_one-l2norm-h0',
    'gdn-fp16-bhsd-N4-L31-H4/2/2-K128-V128-extreme-state_bf16-l2norm-h0',
    'gdn-fp16-bshd-N1-L1-H4/1/1-K128-V128-zero-state_bf16-beta_one-h0',
    'gdn-fp16-bshd-N1-L200-H4/1/1-K128-V128-typical-beta_zero-l2norm-h0-cont[1_63]',
    'gdn-fp16-bshd-N1-L64-H2/2/4-K128-V128-steep-beta_zero-linear-h0-cont[21_32]',
    'gdn-fp16-bshd-N3-L65-H4/2/2-K128-V128-extreme-state_bf16-l2norm-scale0.0625-cont[21]',
    'gdn-fp16-bshd-N4-L31-H2/2/2-K128-V128-trained-state_bf16-beta_zero-h0',
    'gdn-fp16-sbhd-N1-L1-H4/2/2-K128-V128-steep-state_bf16-beta_one-scale0.0625-h0',
    'gdn-fp16-sbhd-N1-L320-H4/4/4-K128-V128-long-state_bf16-l2norm-scale0.5-h0-cont[106]',
    'gdn-fp16-sbhd-N1-L64-H4/4/4-K128-V128-extreme-state_bf16-h0',
    'gdn-fp16-sbhd-N2-L64-H2/2/4-K128-V128-typical-state_bf16-l2norm-scale0.5',
]
H200_FI_DECODE_FAILED = [
    'gdn-fp16-bhsd-N1-L200-H2/2/4-K128-V128-mild-state_bf16-beta_zero-l2norm-sigmoid-safegate-dtbias-scale1.0-h0',
    'gdn-fp16-bhsd-N2-L129-H4/4/4-K128-V128-trained-sigmoid-safegate-cont[128]',
    'gdn-fp16-bhsd-N2-L64-H1/1/4-K128-V128-zero-sigmoid-safegate-alog-dtbias-scale0.0625-h0-cont[21]',
    'gdn-fp16-bhsd-N3-L65-H4/4/4-K128-V128-steep-state_bf16-sigmoid-safegate-alog-h0',
    'gdn-fp16-bshd-N1-L128-H1/1/4-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-cont[64]',
    'gdn-fp16-bshd-N1-L128-H2/2/2-K128-V128-extreme-state_bf16-sigmoid-safegate-dtbias-scale1.0-cont[1_63]',
    'gdn-fp16-bshd-N1-L200-H4/4/4-K128-V128-zero-beta_zero-l2norm-sigmoid-safegate-alog-scale0.5-h0-cont[66]',
    'gdn-fp16-bshd-N1-L65-H4/4/4-K128-V128-typical-state_bf16-beta_one-sigmoid-safegate-dtbias-scale1.0-h0-cont[63]',
    'gdn-fp16-bshd-N2-L64-H2/2/4-K128-V128-steep-beta_one-sigmoid-safegate-dtbias-cont[1_21]',
    'gdn-fp16-sbhd-N1-L128-H4/4/4-K128-V128-typical-beta_zero-sigmoid-safegate-h0',
    'gdn-fp16-sbhd-N2-L200-H4/4/4-K128-V128-long-sigmoid-safegate-alog-scale1.0-h0-cont[66_100]',
    'gdn-fp16-sbhd-N2-L64-H1/1/4-K128-V128-trained-sigmoid-safegate-dtbias-scale1.0-h0-cont[63]',
    'gdn-fp16-sbhd-N3-L65-H2/2/2-K128-V128-mild-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'gdn-fp16-thd-N1-T[63]-H2/2/2-K128-V128-extreme-state_bf16-beta_one-sigmoid-safegate-alog-dtbias-h0',
    'gdn-fp16-thd-N2-T[63_63]-H2/2/4-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-scale0.5-cont[21]',
    'gdn-fp16-thd-N3-T[0_1_127]-H4/4/4-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0',
    'gdn-fp16-thd-N4-T[0_1_63_65]-H2/2/4-K128-V128-steep-beta_one-sigmoid-safegate-scale0.5-cont[21]',
    'gdn-fp16-thd-N4-T[1_64_0_130]-H2/2/4-K128-V128-zero-beta_one-sigmoid-safegate-cont[1]',
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H1/1/4-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-mild-beta_one-sigmoid-safegate-alog-scale1.0',
]
H200_FI_DECODE_PASSED = [
    'gdn-bf16-bhsd-N1-L320-H2/2/4-K128-V128-long-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0-cont[160]',
    'gdn-bf16-bhsd-N2-L64-H4/4/4-K128-V128-typical-state_bf16-beta_zero-sigmoid-safegate-alog-scale0.5-h0-cont[32_63]',
    'gdn-bf16-bhsd-N4-L31-H2/2/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-cont[30]',
    'gdn-bf16-bshd-N1-L1-H4/4/4-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog',
    'gdn-bf16-bshd-N2-L200-H2/2/2-K128-V128-long-state_bf16-beta_one-sigmoid-safegate-h0-cont[100_133]',
    'gdn-bf16-bshd-N4-L31-H1/1/4-K128-V128-mild-sigmoid-safegate-alog-dtbias-scale0.0625-cont[15]',
    'gdn-bf16-sbhd-N2-L129-H4/4/4-K128-V128-steep-state_bf16-l2norm-sigmoid-safegate-alog-dtbias',
    'gdn-bf16-sbhd-N2-L63-H2/2/2-K128-V128-zero-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias-h0',
    'gdn-bf16-thd-N3-T[1_300_192]-H1/1/4-K128-V128-long-state_bf16-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.0625-h0-cont[200]',
    'gdn-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-cont[1]',
    'gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-mild-state_bf16-l2norm-sigmoid-safegate-h0-cont[100]',
    'gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V128-extreme-beta_zero-sigmoid-safegate-alog-h0',
]



# --- the serving checks (serving_run): the same entries, through the same functions ---------------------------------

SERVING_ENTRY = """
[[issue]]
id = "s"
backend = "b"
op = "kda"
where = "thd"
checks = ["causality"]
reason = "r"
evidence = "e"
"""
SERVING_CASE = "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0"


def serving_result(check: str, status: str, case: str = SERVING_CASE) -> dict:
    return {"check": check, "backend": "b", "case": case, "status": status,
            "reason": "" if status == "passed" else "outputs before the cut changed by 106 ulps", "numbers": {}}


def test_a_serving_failure_an_entry_names_becomes_known_and_other_failures_stay(tmp_path):
    from deltacheck.harness.run.serving_run import apply_known, table

    issues = load_known_issues([write(tmp_path, SERVING_ENTRY)])
    rows = [serving_result("causality", "failed"), serving_result("graph_replay", "failed"),
            serving_result("causality", "failed", "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid")]
    assert apply_known(rows, issues, H200) == []
    assert [r["status"] for r in rows] == ["known", "failed", "failed"]  # graph_replay: not named; bshd: not where
    assert rows[0]["reason"].startswith("known issue s: r — outputs before") and rows[0]["numbers"]["known_issue"] == "s"
    assert table(rows).splitlines()[1] == "b causality 2 0 1 0 0 0 0 1"
    assert apply_known(rows, issues, H200) == [] and rows[0]["status"] == "known"  # resumed results: the same


def test_a_serving_pass_under_an_entry_no_longer_reproduces(tmp_path):
    from deltacheck.harness.run.serving_run import apply_known

    issues = load_known_issues([write(tmp_path, SERVING_ENTRY)])
    rows = [serving_result("causality", "passed"), serving_result("graph_replay", "failed")]
    (line,) = apply_known(rows, issues, H200)
    assert line.startswith(f"known issue no longer reproduces: s matches {SERVING_CASE} against b")
    assert rows[1]["status"] == "failed"
    declined = [serving_result("causality", "declined")]
    assert apply_known(declined, issues, H200) == []  # not judged


def test_an_entry_without_checks_says_nothing_about_the_serving_checks(tmp_path):
    """The entries whose evidence is deltacheck run's checks keep their scope: a serving failure stays a failure,
    a serving pass is no verdict on them."""
    from deltacheck.harness.run.serving_run import apply_known

    issues = load_known_issues([write(tmp_path, SERVING_ENTRY.replace('checks = ["causality"]\n', ""))])
    rows = [serving_result("causality", "failed"), serving_result("graph_replay", "passed")]
    assert apply_known(rows, issues, H200) == [] and rows[0]["status"] == "failed"
    (issue,) = issues
    assert issue.covers("forward") and issue.covers("grad_q") and not issue.covers("causality")


def test_serving_check_names_are_the_serving_checks():
    from deltacheck.harness.ci.known import SERVING_CHECK_NAMES
    from deltacheck.harness.run.serving_run import ALL_CHECKS

    assert set(SERVING_CHECK_NAMES) == set(ALL_CHECKS)


def test_serving_run_fails_on_a_serving_pass_an_entry_covers(tmp_path, capsys):
    """End to end on the CPU: the clean reference passes causality on a case an entry says fails: strict."""
    from deltacheck.harness.run import serving_run

    case = "gdn-bf16-thd-N2-T[3_4]-H1/1/1-K32-V32-typical"
    entry = write(tmp_path, SERVING_ENTRY.replace('"b"', '"oracle"').replace('"kda"', '"gdn"'))
    rc = serving_run.main(["--backend", "oracle", "--checks", "causality", "--case", case, "--device", "cpu",
                           "--known-issues", str(entry)])
    out = capsys.readouterr().out
    assert rc == 1 and "KNOWN ISSUES NO LONGER REPRODUCE" in out and f"s matches {case} against oracle" in out
    assert serving_run.main(["--backend", "oracle", "--checks", "causality", "--case", case, "--device", "cpu"]) == 0


# The serving results of session 4 on the H200 (python -m deltacheck.harness.run.serving_run; the cases each entry
# speaks about that the check judged: failed, or errored, and passed).
H200_SERVING_VLLM_FAILED = [
    'gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical',
    'gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0',
    'gdn-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-beta_one-l2norm-scale1.0',
    'gdn-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0',
    'gdn-bf16-thd-N4-T[1_64_0_130]-H1/1/4-K128-V64-zero-beta_zero-scale0.5-h0',
    'gdn-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K64-V64-steep-h0',
    'gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K128-V128-steep-l2norm',
    'gdn-bf16-thd-N5-T[65_0_1_200_3]-H2/2/2-K96-V96-extreme-state_bf16-beta_one-l2norm-scale1.0-h0',
    'gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V64-typical-state_bf16-l2norm',
    'gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-beta_one-h0',
    'gdn-fp16-thd-N3-T[257_0_300]-H2/2/2-K64-V128-long-beta_one-scale1.0-h0',
    'gdn-fp16-thd-N4-T[1_64_0_130]-H2/2/4-K128-V128-typical-state_bf16-beta_zero-l2norm-h0',
    'gdn-fp16-thd-N5-T[65_0_1_200_3]-H2/2/4-K96-V96-mild-state_bf16-l2norm-scale0.5',
    'gdn-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V128-mild-state_bf16-l2norm-scale0.0625',
]
H200_SERVING_QLA_ERRORED = [
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-trained-beta_zero-l2norm-h0',
    'gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-beta_one-h0',
    'gdn-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V128-mild-state_bf16-l2norm-scale0.0625',
    'gdn-fp16-thd-N4-T[1_64_0_130]-H2/2/4-K128-V128-typical-state_bf16-beta_zero-l2norm-h0',
]
H200_SERVING_VLLM_PASSED = [
    'gdn-bf16-bhsd-N1-L128-H2/2/4-K128-V128-mild-beta_one-l2norm-h0',
    'gdn-bf16-bhsd-N1-L200-H4/4/4-K128-V128-typical-state_bf16-l2norm',
    'gdn-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-l2norm-h0',
    'gdn-bf16-bhsd-N1-L64-H2/2/4-K96-V96-trained-state_bf16-beta_zero-h0',
    'gdn-bf16-bhsd-N2-L129-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-bhsd-N2-L129-H2/2/2-K128-V128-trained-scale0.0625',
    'gdn-bf16-bhsd-N4-L31-H4/4/4-K128-V128-steep-state_bf16-l2norm',
    'gdn-bf16-bshd-N1-L128-H2/2/2-K128-V64-steep-state_bf16-beta_one-l2norm-scale1.0',
    'gdn-bf16-bshd-N1-L63-H2/2/2-K128-V128-extreme-state_bf16',
    'gdn-bf16-bshd-N1-L65-H1/1/4-K128-V128-trained-state_bf16-beta_one-scale0.0625',
    'gdn-bf16-bshd-N1-L65-H4/4/4-K64-V64-extreme-state_bf16-l2norm-scale1.0-h0',
    'gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-steep-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-typical-l2norm',
    'gdn-bf16-bshd-N2-L129-H2/2/2-K64-V64-trained-beta_one-h0',
    'gdn-bf16-bshd-N2-L129-H4/4/4-K96-V96-zero-beta_one-l2norm',
    'gdn-bf16-bshd-N2-L257-H2/2/2-K128-V64-long-beta_one-scale0.5-h0',
    'gdn-bf16-bshd-N2-L63-H2/2/2-K64-V128-trained-state_bf16-h0',
    'gdn-bf16-bshd-N2-L64-H2/2/4-K128-V128-mild-beta_zero-l2norm-scale0.5-h0',
    'gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical',
    'gdn-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0',
    'gdn-bf16-bshd-N3-L65-H1/1/4-K64-V128-mild-beta_zero-scale0.0625-h0',
    'gdn-bf16-bshd-N3-L65-H4/4/4-K64-V128-typical-state_bf16-beta_zero-l2norm-h0',
    'gdn-bf16-bshd-N4-L31-H2/2/2-K128-V128-zero-state_bf16-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-sbhd-N1-L1-H2/2/2-K128-V128-steep-state_bf16-l2norm',
    'gdn-bf16-sbhd-N1-L65-H2/2/2-K64-V128-trained-state_bf16-beta_one-scale0.5-h0',
    'gdn-bf16-sbhd-N2-L257-H4/4/4-K128-V128-long-beta_zero-scale0.5-h0',
    'gdn-bf16-sbhd-N2-L63-H4/4/4-K128-V128-trained-state_bf16-l2norm-scale1.0',
    'gdn-bf16-sbhd-N2-L64-H2/2/2-K128-V128-zero-beta_one-l2norm',
    'gdn-bf16-sbhd-N3-L65-H2/2/4-K96-V96-typical-beta_one-l2norm',
    'gdn-bf16-thd-N1-T[63]-H4/4/4-K64-V128-zero-state_bf16-beta_one-scale0.5',
    'gdn-bf16-thd-N3-T[1_300_192]-H1/1/4-K128-V128-long-state_bf16-l2norm-scale1.0-h0',
    'gdn-bf16-thd-N3-T[65_65_65]-H2/2/2-K64-V64-mild-state_bf16-beta_zero-l2norm-scale1.0-h0',
    'gdn-fp16-bhsd-N1-L320-H2/2/2-K96-V96-long-beta_zero-h0',
    'gdn-fp16-bhsd-N1-L65-H2/2/2-K64-V64-typical-beta_one-l2norm-scale0.0625',
    'gdn-fp16-bhsd-N1-L65-H4/4/4-K128-V128-zero-state_bf16-scale0.0625',
    'gdn-fp16-bhsd-N2-L64-H4/4/4-K128-V64-trained-state_bf16-l2norm',
    'gdn-fp16-bhsd-N3-L65-H1/1/4-K64-V128-steep-beta_one-scale0.0625',
    'gdn-fp16-bhsd-N3-L65-H2/2/4-K64-V128-extreme',
    'gdn-fp16-bshd-N1-L320-H4/4/4-K128-V128-long-beta_one-l2norm-h0',
    'gdn-fp16-bshd-N2-L129-H1/1/4-K128-V128-typical-state_bf16-beta_one-scale0.0625-h0',
    'gdn-fp16-sbhd-N1-L200-H1/1/4-K128-V128-mild-state_bf16-beta_zero-scale1.0',
    'gdn-fp16-sbhd-N1-L320-H2/2/4-K64-V64-long-state_bf16-beta_zero-h0',
    'gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V128-extreme-beta_zero-l2norm-h0',
    'gdn-fp16-sbhd-N1-L63-H1/1/4-K128-V64-mild-state_bf16-scale1.0-h0',
    'gdn-fp16-sbhd-N1-L63-H2/2/2-K128-V128-typical-state_bf16-beta_one-l2norm',
    'gdn-fp16-sbhd-N3-L65-H2/2/2-K64-V64-zero-state_bf16',
    'gdn-fp16-sbhd-N4-L31-H2/2/4-K128-V64-extreme-beta_zero-scale0.5-h0',
    'gdn-fp16-sbhd-N4-L31-H2/2/4-K96-V96-steep-beta_zero-scale0.5-h0',
    'gdn-fp16-thd-N1-T[63]-H4/4/4-K128-V128-extreme-beta_one',
    'gdn-fp16-thd-N3-T[65_65_65]-H2/2/4-K128-V128-steep-beta_one-scale0.0625-h0',
    'gdn-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V128-trained-beta_zero-l2norm-h0',
]
H200_SERVING_QLA_PASSED = [
    'gdn-bf16-bhsd-N1-L128-H2/2/4-K128-V128-mild-beta_one-l2norm-h0',
    'gdn-bf16-bhsd-N2-L129-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-bshd-N1-L63-H2/2/2-K128-V128-extreme-state_bf16',
    'gdn-bf16-bshd-N1-L65-H1/1/4-K128-V128-trained-state_bf16-beta_one-scale0.0625',
    'gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-steep-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-bshd-N2-L129-H2/2/2-K128-V128-typical-l2norm',
    'gdn-bf16-bshd-N2-L64-H2/2/4-K128-V128-mild-beta_zero-l2norm-scale0.5-h0',
    'gdn-bf16-bshd-N4-L31-H2/2/2-K128-V128-zero-state_bf16-beta_zero-l2norm-scale0.0625-h0',
    'gdn-bf16-sbhd-N1-L1-H2/2/2-K128-V128-steep-state_bf16-l2norm',
    'gdn-bf16-sbhd-N2-L257-H4/4/4-K128-V128-long-beta_zero-scale0.5-h0',
    'gdn-bf16-thd-N3-T[1_300_192]-H1/1/4-K128-V128-long-state_bf16-l2norm-scale1.0-h0',
    'gdn-fp16-bhsd-N1-L65-H4/4/4-K128-V128-zero-state_bf16-scale0.0625',
    'gdn-fp16-bshd-N1-L320-H4/4/4-K128-V128-long-beta_one-l2norm-h0',
    'gdn-fp16-bshd-N2-L129-H1/1/4-K128-V128-typical-state_bf16-beta_one-scale0.0625-h0',
    'gdn-fp16-sbhd-N1-L200-H1/1/4-K128-V128-mild-state_bf16-beta_zero-scale1.0',
    'gdn-fp16-thd-N3-T[65_65_65]-H2/2/4-K128-V128-steep-beta_one-scale0.0625-h0',
]
H200_SERVING_KDA_CUTILE_MOVED = [
    'kda-bf16-bhsd-N4-L31-H2/2/2-K128-V64-typical-state_bf16-beta_one-l2norm-safegate',
    'kda-bf16-bshd-N1-L200-H1/1/4-K64-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-scale1.0-h0',
    'kda-bf16-bshd-N1-L200-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0',
    'kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0',
    'kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid',
    'kda-bf16-bshd-N2-L200-H2/2/2-K128-V128-long-state_bf16-beta_one-l2norm-sigmoid-safegate-h0',
    'kda-bf16-sbhd-N1-L200-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-sbhd-N4-L31-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-h0',
    'kda-bf16-thd-N1-T[200]-H4/4/4-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias-scale1.0',
    'kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0',
    'kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-steep-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K64-V64-trained-state_bf16-sigmoid-safegate-scale0.5',
    'kda-fp16-bhsd-N1-L200-H1/1/4-K64-V128-mild-sigmoid-safegate-h0',
]
H200_SERVING_KDA_CUTILE_PASSED = [
    'kda-bf16-bhsd-N1-L200-H4/4/4-K128-V128-mild-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0',
    'kda-bf16-bhsd-N1-L257-H2/2/2-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0',
    'kda-bf16-bhsd-N1-L63-H4/4/4-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog',
    'kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-beta_one-h0',
    'kda-bf16-bhsd-N1-L64-H2/2/2-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0',
    'kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-dtbias-scale0.0625-h0',
    'kda-bf16-bhsd-N1-L64-H4/4/4-K128-V128-mild-l2norm-sigmoid-safegate-scale0.0625-h0',
    'kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-state_bf16-beta_zero',
    'kda-bf16-bhsd-N2-L129-H2/2/2-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0',
    'kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-steep-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-bhsd-N3-L65-H2/2/2-K128-V128-typical-state_bf16-l2norm-sigmoid-safegate-alog-dtbias',
    'kda-bf16-bshd-N1-L320-H4/4/4-K64-V128-long-beta_zero-safegate-dtbias-scale0.0625-h0',
    'kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.5',
    'kda-bf16-bshd-N1-L64-H2/2/2-K128-V128-typical-state_bf16-l2norm-scale1.0',
    'kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-alog-scale1.0-h0',
    'kda-bf16-bshd-N1-L65-H2/2/4-K128-V128-steep-l2norm-safegate-alog-dtbias',
    'kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-zero-l2norm-sigmoid-safegate-dtbias-h0',
    'kda-bf16-bshd-N2-L200-H2/2/4-K128-V128-long-beta_zero-l2norm-scale0.5-h0',
    'kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-extreme-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-h0',
    'kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-trained-l2norm-sigmoid-safegate-alog-dtbias-scale1.0',
    'kda-bf16-bshd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-h0',
    'kda-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical',
    'kda-bf16-bshd-N2-L65-H2/2/2-K96-V96-typical-h0',
    'kda-bf16-bshd-N3-L65-H2/2/2-K128-V128-typical-l2norm-sigmoid-safegate-dtbias-h0',
    'kda-bf16-sbhd-N1-L128-H1/1/4-K64-V64-steep-state_bf16-beta_one-l2norm-safegate-alog-scale0.5',
    'kda-bf16-sbhd-N1-L257-H4/4/4-K128-V128-long-beta_one-h0',
    'kda-bf16-sbhd-N1-L64-H2/2/2-K128-V128-steep-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0',
    'kda-bf16-sbhd-N1-L64-H4/4/4-K128-V128-zero-l2norm-sigmoid-safegate',
    'kda-bf16-sbhd-N2-L257-H2/2/2-K128-V128-long-beta_one-l2norm-sigmoid-safegate-dtbias-h0',
    'kda-bf16-sbhd-N2-L63-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-sbhd-N2-L63-H4/4/4-K128-V128-steep-state_bf16-beta_one-l2norm-sigmoid-safegate-alog',
    'kda-bf16-sbhd-N2-L64-H2/2/2-K128-V128-mild-state_bf16-l2norm-sigmoid-safegate-alog',
    'kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0',
    'kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-typical-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-sbhd-N2-L64-H4/4/4-K128-V128-zero-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-sbhd-N2-L64-H4/4/4-K64-V128-extreme-state_bf16-beta_one-l2norm-safegate-scale1.0',
    'kda-bf16-thd-N1-T[128]-H4/4/4-K128-V128-trained-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-thd-N1-T[65]-H2/2/4-K128-V128-mild-beta_zero-h0',
    'kda-bf16-thd-N2-T[257_257]-H1/1/4-K96-V96-long-state_bf16-beta_zero-sigmoid-safegate-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N2-T[300_257]-H2/2/2-K128-V128-zero-state_bf16-l2norm-h0',
    'kda-bf16-thd-N2-T[64_64]-H4/4/4-K128-V128-extreme-beta_one-l2norm-sigmoid-safegate-alog-dtbias',
    'kda-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical',
    'kda-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0',
    'kda-bf16-thd-N3-T[1_300_192]-H2/2/2-K128-V64-long-beta_zero-l2norm-sigmoid-safegate-dtbias-h0',
    'kda-bf16-thd-N3-T[1_300_192]-H4/4/4-K128-V128-long-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-scale0.0625-h0',
    'kda-bf16-thd-N3-T[257_0_300]-H2/2/2-K128-V128-long-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0',
    'kda-bf16-thd-N4-T[0_1_63_65]-H1/1/4-K128-V128-typical-beta_one-sigmoid-scale1.0',
    'kda-bf16-thd-N4-T[0_1_63_65]-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-scale0.0625',
    'kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-mild-beta_one-l2norm-sigmoid-safegate-alog-dtbias',
    'kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-typical-beta_one-l2norm-sigmoid-safegate-scale0.0625',
    'kda-bf16-thd-N4-T[0_1_63_65]-H4/4/4-K128-V128-zero-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias',
    'kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog',
    'kda-bf16-thd-N6-T[63_1_0_64_65_2]-H1/1/4-K128-V128-zero-l2norm-sigmoid-safegate-alog-dtbias-h0',
    'kda-fp16-bhsd-N1-L1-H4/4/4-K96-V96-zero-state_bf16-beta_zero-safegate-alog-dtbias-h0',
    'kda-fp16-bhsd-N3-L65-H4/4/4-K64-V64-mild-beta_one-l2norm-sigmoid-safegate-dtbias-scale0.5',
    'kda-fp16-bshd-N2-L63-H4/4/4-K96-V96-mild-state_bf16-l2norm-safegate-alog-dtbias-h0',
    'kda-fp16-bshd-N2-L64-H4/4/4-K128-V64-zero-state_bf16-beta_zero-l2norm-safegate-alog-dtbias',
]
H200_SERVING_KDA_ROUTED_MOVED = [
    'kda-bf16-bhsd-N4-L31-H2/2/2-K128-V64-typical-state_bf16-beta_one-l2norm-safegate',
    'kda-bf16-bshd-N1-L200-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-dtbias-scale0.5-h0',
    'kda-bf16-sbhd-N4-L31-H2/2/2-K128-V128-steep-beta_zero-l2norm-sigmoid-safegate-h0',
    'kda-bf16-thd-N1-T[200]-H4/4/4-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-dtbias-scale1.0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K64-V64-trained-state_bf16-sigmoid-safegate-scale0.5',
    'kda-fp16-bhsd-N1-L200-H1/1/4-K64-V128-mild-sigmoid-safegate-h0',
]
# Routed cudnn passed causality on kda_cutile's passes but 5 (R2 holds no routed result for them), on 7 of the 15
# cases kda_cutile moved (another engine served them) and on one kda_cutile has no result for.
H200_SERVING_KDA_ROUTED_PASSED = sorted(set(H200_SERVING_KDA_CUTILE_PASSED) - {
    'kda-bf16-bshd-N2-L63-H2/2/2-K128-V128-extreme-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-h0',
    'kda-bf16-thd-N2-T[257_257]-H1/1/4-K96-V96-long-state_bf16-beta_zero-sigmoid-safegate-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N3-T[1_300_192]-H4/4/4-K128-V128-long-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-scale0.0625-h0',
    'kda-fp16-bhsd-N1-L1-H4/4/4-K96-V96-zero-state_bf16-beta_zero-safegate-alog-dtbias-h0',
    'kda-fp16-bshd-N2-L63-H4/4/4-K96-V96-mild-state_bf16-l2norm-safegate-alog-dtbias-h0',
} | {
    'kda-bf16-bshd-N1-L260-H2/2/2-K128-V128-steep-safegate-alog-dtbias-h0',
    'kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid',
    'kda-bf16-sbhd-N1-L200-H2/2/2-K128-V128-extreme-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N3-T[0_257_1]-H2/2/2-K128-V128-typical-safegate-h0',
    'kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0',
    'kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-steep-state_bf16-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-h0',
    'kda-bf16-thd-N4-T[1_64_0_130]-H2/2/2-K128-V128-trained-state_bf16-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625',
})

H200_SERVING = replace(H200, versions={**H200.versions, "vllm": "0.33.0", "flash_qla": "0.1.3"})


@pytest.mark.parametrize("issue_id,spec,other,failed,passed", [
    ("vllm-fla-chunk-empty-sequence-misnumbers-chunks-serving", "vllm-fla", "vllm-fla-recurrent",
     H200_SERVING_VLLM_FAILED, H200_SERVING_VLLM_PASSED),
    ("flashqla-auto-cp-refuses-empty-sequence-serving", "flashqla", "fla-dispatch",
     H200_SERVING_QLA_ERRORED, H200_SERVING_QLA_PASSED),
    ("cudnn-kda-cutile-causality-earlier-outputs-move", "cudnn@kda_cutile", "cudnn",
     H200_SERVING_KDA_CUTILE_MOVED, H200_SERVING_KDA_CUTILE_PASSED),
    ("cudnn-kda-cutile-causality-earlier-outputs-move-routed", "cudnn", "cudnn@kda_cutile",
     H200_SERVING_KDA_ROUTED_MOVED, H200_SERVING_KDA_ROUTED_PASSED),
])
def test_the_shipped_serving_entries_cover_exactly_the_h200_serving_failures(issue_id, spec, other, failed, passed):
    issue = {i.id: i for i in load_known_issues([SHIPPED])}[issue_id]
    covered = {cid for cid in failed + passed if issue.applies_to(Case.from_id(cid), spec, spec, H200_SERVING)}
    assert covered == set(failed), issue_id
    assert not issue.applies_to(Case.from_id(failed[0]), other, other, H200_SERVING), issue_id
    assert set(issue.checks) <= {"causality", "graph_replay"}  # deltacheck run's checks keep their own entries


@pytest.mark.parametrize("path,backends,known,left", [
    ("bench/results/serving-i26-h200/ran.jsonl", ("flashqla",), 8, 0),
    ("bench/results/serving-i26-h200-r2/vllm-fla.jsonl", ("vllm-fla",), 22, 0),
    # cuDNN's non-finite results: the NaN entries' serving twins cover causality and graph replay (the log-decay
    # descriptions' graph-replay entries less the one case whose replay stayed finite; kda_cutile's with beta = 0 and
    # a bf16 initial state, as the Hopper engines' entries), and the ulps entries kda_cutile's moved outputs.
    ("bench/results/serving-i26-h200-r2/ran.jsonl", ("cudnn", "cudnn@kda_cutile"), 67, 0),
])
def test_the_shipped_table_on_the_recorded_h200_serving_results(path, backends, known, left):
    """The recorded results of session 4 with the shipped table applied as serving_run applies it: no entry is gone,
    the failures the entries name are known, the rest stay failures."""
    from deltacheck.harness.run.serving_run import apply_known, load_done

    rows = [r for r in load_done(str(TESTS.parent / path))[0] if r["backend"] in backends]
    assert apply_known(rows, load_known_issues([SHIPPED]), H200_SERVING) == []
    statuses = [r["status"] for r in rows]
    assert (statuses.count("known"), statuses.count("failed") + statuses.count("error")) == (known, left)


@pytest.mark.parametrize("issue_id,spec,check,n", [
    ("cudnn-kda-hopper-nan-below-log-decay-7-serving", "cudnn", "causality", 6),
    ("cudnn-kda-hopper-nan-below-log-decay-7-graph-replay", "cudnn", "graph_replay", 5),
    ("cudnn-kda-cutile-nan-below-log-decay-serving", "cudnn@kda_cutile", "causality", 5),
    ("cudnn-kda-cutile-nan-below-log-decay-graph-replay", "cudnn@kda_cutile", "graph_replay", 4),
])
def test_the_log_decay_nan_serving_entries_cover_only_non_finite_r2_results(issue_id, spec, check, n):
    """Each log-decay NaN entry of the serving checks names, among the R2 results of its backend x check, only
    non-finite failures (n of them), and every non-finite bf16 result of that check is inside it; the one case whose
    graph replay stayed finite inside the description is named out, so strict mode has nothing to flag."""
    from deltacheck.harness.run.serving_run import load_done

    issue = {i.id: i for i in load_known_issues([SHIPPED])}[issue_id]
    rows = [r for r in load_done(str(TESTS.parent / "bench/results/serving-i26-h200-r2/ran.jsonl"))[0]
            if r["backend"] == spec and r["check"] == check]
    covered = [r for r in rows if issue.applies_to(Case.from_id(r["case"]), spec, spec, H200_SERVING)]
    assert len(covered) == n and all(r["status"] == "failed" and r["numbers"]["finite"] is False for r in covered)
    non_finite_bf16 = {r["case"] for r in rows if r["numbers"].get("finite") is False and "-bf16-" in r["case"]}
    assert non_finite_bf16 <= {r["case"] for r in covered}
    assert tuple(issue.checks) == (check,)
    named_out = "kda-bf16-thd-N1-T[65]-H2/2/2-K128-V128-trained"
    assert any(r["case"] == named_out for r in rows)
    assert issue.applies_to(Case.from_id(named_out), spec, spec, H200_SERVING) == (check == "causality")


# --- issue 25, session 5: FlashInfer's L0 on the H200, as recorded (bench/results/s5/d25-S5.tgz) --------------------

S5_TGZ = TESTS.parent / "bench/results/s5/d25-S5.tgz"
SHIPPED_BY_ID = {i.id: i for i in load_known_issues([SHIPPED])}


def _records(archive: Path, prefix: str) -> list[dict]:
    """Every record of the run directories under ``prefix`` in ``archive`` (a device call's archive as returned)."""
    import json
    import tarfile

    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name.endswith("/results.jsonl")]
        assert members, prefix
        return [json.loads(line) for m in members
                for line in tar.extractfile(m).read().decode().splitlines() if line.strip()]


def _unmarked(rec: dict) -> Result:
    """A recorded result as the runner judged it before any known-issues entry: ``known`` back to the failure (or,
    for an ``error_contains`` entry, the error) the entry covered, its reason the one after the entry's text."""
    result = Result(**{k: v for k, v in rec.items() if k in Result.__dataclass_fields__})
    if result.status == "known":
        entry = SHIPPED_BY_ID[result.metrics.pop("known_issue")]
        result.reason = result.reason.split(" — ", 1)[1]
        result.status = "error" if entry.error_contains else "fail"
    return result


def _judge(by_task: dict, issues, env) -> tuple[list, list, dict]:
    """Known-issue entries applied per case x backend as the runner applies them to ``by_task`` ({(case, spec):
    [Result]}, marked in place): (failures left, entries gone, {entry: [(case, check)]})."""
    from collections import defaultdict

    left, gone, known = [], [], defaultdict(list)
    for (cid, spec), results in sorted(by_task.items()):
        entries = applicable(issues, Case.from_id(cid), spec, spec, env)
        for r in results:
            mark_known(r, entries)
            if r.status in ("fail", "error"):
                left.append((cid, spec, r.check))
            if r.status == "known":
                known[r.metrics["known_issue"]].append((cid, r.check))
        gone += [(cid, i) for i, said in outcomes(results, entries).items() if said == "gone"]
    return left, gone, known


@pytest.mark.parametrize("run", ["F", "F-warm"])
def test_the_shipped_table_on_flashinfers_s5_l0_leaves_no_failure_and_no_entry_gone(run):
    """Every failure of FlashInfer's L0 on the H200 (session 5, cold and warm) is inside a shipped entry, and no
    entry covers a case whose checks all passed (strict mode would fail the run)."""
    from collections import defaultdict

    issues = load_known_issues([SHIPPED])
    by_task = defaultdict(list)
    for rec in _records(S5_TGZ, f"d25-s5/runs/{run}/"):
        if rec.get("kind") == "result" and rec["backend"].startswith("flashinfer"):
            assert rec["status"] != "known" or rec["metrics"]["known_issue"].startswith("flashinfer-")
            by_task[(rec["case"], rec["backend"])].append(_unmarked(rec))
    raw = sorted((c, b, r.check) for (c, b), rs in by_task.items() for r in rs if r.status in ("fail", "error"))
    assert len(raw) == 44  # the run's own end record: 40 known, 2 failed, 2 errored
    left, gone, known = _judge(by_task, issues, H200_FI)
    assert left == [] and gone == []
    assert {i: len({cid for cid, _ in c}) for i, c in known.items()} == {
        "flashinfer-gdn-prefill-empty-sequence-state-unwritten": 9,
        "flashinfer-gdn-prefill-misaligned-beta-view-refused": 1,
        "flashinfer-gdn-decode-fp16-bf16-level-error": 14,
    }


# --- session 5 (bench/results/s5/d26-S5.tgz): the pinned Hopper KDA engines' serving NaN ------------------------------

S5_ARCHIVE = TESTS.parent / "bench/results/s5/d26-S5.tgz"


def _s5_rows(tmp_path, name: str) -> list[dict]:
    """The recorded results of session 5's ``serving_run`` job ``name`` (d26-s5/<name>.jsonl in the archive)."""
    import tarfile

    from deltacheck.harness.run.serving_run import load_done

    with tarfile.open(S5_ARCHIVE) as tar:
        data = tar.extractfile(f"d26-s5/{name}.jsonl").read()
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(data)
    return load_done(str(path))[0]


S5_NAMED_OUT = "kda-bf16-thd-N1-T[65]-H2/2/2-K128-V128-trained"  # replayed finite at seed + 1, as in R2


@pytest.mark.parametrize("issue_id,spec,check,n", [
    ("cudnn-kda-hopper-cuda-nan-below-log-decay-7", "cudnn@kda_hopper_cuda", "causality", 5),
    ("cudnn-kda-hopper-cuda-nan-below-log-decay-7-graph-replay", "cudnn@kda_hopper_cuda", "graph_replay", 4),
    ("cudnn-kda-hopper-dsl-nan-extreme-gate", "cudnn@kda_hopper", "causality", 2),
    ("cudnn-kda-hopper-dsl-nan-extreme-gate-graph-replay", "cudnn@kda_hopper", "graph_replay", 1),
])
def test_the_pinned_hopper_nan_entries_cover_exactly_s5s_non_finite_serving_results(tmp_path, issue_id, spec, check,
                                                                                      n):
    """Among session 5's results of the engine x check, each entry names exactly the non-finite failures (n), and
    every failure of that check is one of them; the case whose replay stayed finite is named out of graph replay."""
    issue = {i.id: i for i in load_known_issues([SHIPPED])}[issue_id]
    rows = [r for r in _s5_rows(tmp_path, spec.split("@")[1])
            if r["backend"] == spec and r["check"] == check and r["status"] != "declined"]
    covered = [r for r in rows if issue.applies_to(Case.from_id(r["case"]), spec, spec, H200_SERVING)
               and issue.covers(check)]
    assert len(covered) == n and all(r["status"] == "failed" and r["numbers"]["finite"] is False for r in covered)
    assert {r["case"] for r in rows if r["status"] == "failed"} == {r["case"] for r in covered}
    assert any(r["case"] == S5_NAMED_OUT and r["status"] == ("failed" if check == "causality" else "passed")
               for r in rows)
    assert issue.applies_to(Case.from_id(S5_NAMED_OUT), spec, spec, H200_SERVING) == (check == "causality")
    # its own engine's only: routed cudnn and the sibling engine keep their entries
    for other in ("cudnn", "cudnn@kda_hopper" if spec.endswith("_cuda") else "cudnn@kda_hopper_cuda"):
        assert not issue.applies_to(Case.from_id(covered[0]["case"]), other, other, H200_SERVING)


def test_the_extended_hopper_entries_keep_their_deltacheck_run_scope():
    """Extended to causality, the training entries still cover exactly the checks of deltacheck run they covered."""
    issues = {i.id: i for i in load_known_issues([SHIPPED])}
    cuda = issues["cudnn-kda-hopper-cuda-nan-below-log-decay-7"]
    assert [c for c in CHECK_NAMES if cuda.covers(c)] == list(CHECK_NAMES)  # as without `checks`
    assert [c for c in SERVING_CHECK_NAMES if cuda.covers(c)] == ["causality"]
    dsl = issues["cudnn-kda-hopper-dsl-nan-extreme-gate"]
    assert [c for c in CHECK_NAMES if dsl.covers(c)] == ["forward", "state", "continuation_ref", "continuation_self"]
    assert [c for c in SERVING_CHECK_NAMES if dsl.covers(c)] == ["causality"]


@pytest.mark.parametrize("name,known,errors", [("kda_hopper_cuda", 9, 1), ("kda_hopper", 3, 6)])
def test_the_shipped_table_on_s5s_pinned_hopper_results(tmp_path, name, known, errors):
    """Session 5's records with the shipped table applied as serving_run applies it: no entry is gone, no failure is
    left; what is left are the errors of the pin FE refused at the call (FE's "no <engine> plan for this graph"),
    which the fixed adapter declines (tests/test_cudnn_engines.py)."""
    from deltacheck.harness.run.serving_run import apply_known

    rows = _s5_rows(tmp_path, name)
    assert apply_known(rows, load_known_issues([SHIPPED]), H200_SERVING) == []
    statuses = [r["status"] for r in rows]
    assert (statuses.count("known"), statuses.count("failed"), statuses.count("error")) == (known, 0, errors)
    assert all(r["reason"].startswith(f"cudnnGraphNotSupportedError: no {name} plan for this graph")
               for r in rows if r["status"] == "error")


# --- issue 25, session 7: the completed fla-dispatch + flashqla L0 on the H200 (bench/results/s7/d25-S6.tgz: session
# 5's run A resumed to its end) and the four cases that failed there, alone (bench/results/s7/d25-S7.tgz) ------------

S7_DIR = TESTS.parent / "bench/results/s7"
H200_QLA = replace(H200, versions={**H200.versions, "flash_qla": "0.1.3", "triton": "3.6.0"})


def _judge_records(records: list[dict], issues) -> tuple[list, list, dict]:
    """``_judge`` over recorded results (each as judged before any entry) on session 7's H200 environment."""
    from collections import defaultdict

    by_task = defaultdict(list)
    for rec in records:
        if rec.get("kind") == "result":
            by_task[(rec["case"], rec["backend"])].append(_unmarked(rec))
    return _judge(by_task, issues, H200_QLA)


def test_the_shipped_table_on_the_completed_fla_dispatch_l0_leaves_no_failure_and_no_entry_gone():
    """Session 5's fla-dispatch + flashqla L0, resumed to its end in session 7: its 5 failing checks (4 cases) and 68
    known ones are all inside shipped entries, each new entry covers exactly what failed, and none is gone."""
    records = _records(S7_DIR / "d25-S6.tgz", "d25-s6/runs/A/")
    end = [r for r in records if r.get("kind") == "end"]
    assert end and end[-1]["counts"]["fail"] == 5 and end[-1]["counts"]["known"] == 68
    left, gone, known = _judge_records(records, load_known_issues([SHIPPED]))
    assert left == [] and gone == []
    assert sorted(known["fla-kda-fp16-safe-gate-forward-tf32-via-fla-dispatch"]) == [
        ("kda-fp16-bshd-N1-L128-H4/4/4-K128-V64-mild-beta_near2-sigmoid-negeig-safegate-alog-scale0.0625-bwd",
         "forward"),
        ("kda-fp16-bshd-N1-L128-H4/4/4-K128-V64-mild-beta_near2-sigmoid-negeig-safegate-alog-scale0.0625-bwd",
         "grad_beta"),
        ("kda-fp16-bshd-N2-L63-H4/4/4-K128-V64-steep-beta_one-safegate-scale0.5", "forward")]
    assert sorted(known["fla-gdn-extreme-gate-a-log-gradient-via-fla-dispatch"]) == [
        ("gdn-bf16-bshd-N2-L63-H2/2/2-K128-V64-extreme-beta_one-sigmoid-safegate-alog-bwd", "grad_a_log"),
        ("gdn-fp16-bhsd-N1-L200-H4/4/4-K96-V96-extreme-beta_one-sigmoid-negeig-safegate-alog-h0-bwd", "grad_a_log")]
    # without the two session-7 entries exactly those five checks are failures again (the entries are not vacuous)
    older = [i for i in load_known_issues([SHIPPED]) if not i.id.endswith("-via-fla-dispatch") or "flashqla" in i.id]
    assert len(_judge_records(records, older)[0]) == 5


def test_the_repro_runs_separate_tf32_from_the_a_log_gradient():
    """bench/i25_s7_repro.sh: alone, the KDA failures reproduce through fla-dispatch (D) and fla (F) and pass every
    check with exact fp32 dots (I); the GDN dA_log failures stay with exact fp32 dots (not TF32)."""
    def statuses(run: str) -> dict:
        return {(r["case"].split("-")[0], r["case"], r["check"]): r["status"]
                for r in _records(S7_DIR / "d25-S7.tgz", f"d25-s7/runs/{run}/")
                if r.get("kind") == "result" and r["status"] != "skip"}

    default, ieee, plain = statuses("D"), statuses("I"), statuses("F")
    kda_failed = {(c, k) for (op, c, k), st in default.items() if op == "kda" and st in ("fail", "known")}
    assert len(kda_failed) == 3 and all(ch in ("forward", "grad_beta") for _, ch in kda_failed)
    assert {(c, k) for (op, c, k), st in plain.items() if st in ("fail", "known")} == kda_failed
    assert all(st == "pass" for (op, _, _), st in ieee.items() if op == "kda")
    gdn_failed = {(c, k) for (op, c, k), st in default.items() if op == "gdn" and st in ("fail", "known")}
    assert {k for _, k in gdn_failed} == {"grad_a_log"} and len(gdn_failed) == 2
    assert {(c, k) for (op, c, k), st in ieee.items() if op == "gdn" and st in ("fail", "known")} == gdn_failed
