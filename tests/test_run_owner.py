"""One exit rule, one backend object per process, the plug-in floor, and what a CI job must never misread:
merged shards, unfinished runs, empty runs, torn files, full disks and the usage errors a newcomer makes."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import pytest
from child_env import ENV, PYTEST, TESTS, run_child
from test_reports_compare import result, write_run
from test_runner import CASE_IDS, records, run

from deltacheck.harness.backends import base
from deltacheck.harness.cli import main as cli_main
from deltacheck.harness.records.exitrule import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, run_exit_status, run_verdict
from deltacheck.reports.load import load_run
from deltacheck.reports.summary import summarize

A = "kda-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical"
B = "kda-bf16-thd-N2-T[1_64]-H2/2/2-K64-V64-steep"


def with_end(directory: Path, **end) -> Path:
    """Replace a written run's end record's fields."""
    path = directory / "results.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[-1])
    assert rec["kind"] == "end"
    rec.update(end)
    path.write_text("\n".join(lines[:-1] + [json.dumps(rec)]) + "\n")
    return directory


# --- the exit rule ----------------------------------------------------------------------------------

def test_the_exit_rule():
    assert run_exit_status({"pass": 3}) == EXIT_OK
    assert run_exit_status({"pass": 3, "fail": 1}) == EXIT_FAILED
    assert run_exit_status({"pass": 3, "error": 1}) == EXIT_FAILED
    assert run_exit_status({"pass": 3}, ["REQUIRED x:gdn cannot run"]) == EXIT_FAILED
    assert run_exit_status({"pass": 3, "known": 1}, (), ["known issue K no longer reproduces"]) == EXIT_FAILED
    assert run_exit_status({"skip": 9}) == EXIT_NOTHING_RAN
    assert run_exit_status({}) == EXIT_NOTHING_RAN
    assert run_exit_status({"known": 1, "skip": 2}) == EXIT_OK
    assert run_verdict({"pass": 1}, finished=False) == "INCOMPLETE"
    assert run_verdict({"pass": 1, "fail": 1}, finished=False) == "FAILED"
    assert run_verdict({"skip": 1}, finished=True) == "NOTHING RAN"
    assert run_verdict({"pass": 1}, finished=True, recorded_exit=1) == "FAILED"


def test_two_shards_one_with_known_gone_merge_to_a_failing_run(tmp_path):
    gone = "known issue cudnn-kda-nan no longer reproduces: 2 covered case(s) passed"
    first = with_end(write_run(tmp_path / "s1", [result("pass", 1e-3, case=A)], "1.32.0"),
                     exit_status=1, known_gone=[gone])
    second = write_run(tmp_path / "s2", [result("pass", 1e-3, case=B)], "1.32.0")
    out = tmp_path / "merged"
    assert cli_main(["merge", str(first), str(second), "--out", str(out)]) == 0
    end = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][-1]
    assert end["kind"] == "end" and end["exit_status"] == 1 and end["known_gone"] == [gone]
    assert summarize(load_run(out, warn=False))["verdict"] == "FAILED"


def test_compare_fails_when_the_new_run_did_not_finish(tmp_path, capsys):
    old = write_run(tmp_path / "old", [result("pass", 1e-3, case=A), result("pass", 1e-3, case=B)], "1.32.0")
    new = write_run(tmp_path / "new", [result("pass", 1e-3, case=A)], "1.32.0")
    path = new / "results.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:7])  # a torn end record: the run did not finish
    assert cli_main(["compare", str(old), str(new)]) == 1
    assert "did not finish" in capsys.readouterr().out
    finished = write_run(tmp_path / "new2", [result("pass", 1e-3, case=A), result("pass", 1e-3, case=B)], "1.32.0")
    assert cli_main(["compare", str(old), str(finished)]) == 0


def test_a_run_that_verifies_nothing_exits_5_and_says_so(tmp_path, run_cli):
    rc, text = run_cli(["run", "--backend", "fake_backends:Declining", "--case", CASE_IDS[0], "--out",
                        str(tmp_path), "--in-process"])
    assert rc == EXIT_NOTHING_RAN and "NOTHING RAN" in text, text


# --- known before the first task --------------------------------------------------------------------

def test_required_pairs_outside_the_selection_fail_before_anything_runs(tmp_path, run_cli):
    out = tmp_path / "runs"
    rc, text = run_cli(["run", "--backend", "chunked", "--case", CASE_IDS[0], "--out", str(out), "--in-process"],
                       env={"NVTE_GDN2_TEST_REQUIRED": "1", "DELTACHECK_REQUIRE": None, "NVTE_GDN_TEST_REQUIRED": None})
    assert rc == 1 and "REQUIRED cudnn:gdn2 was not part of this run" in text, text
    assert not out.exists() or not any(out.iterdir()), "no run directory for a run that cannot qualify"
    # the same pair, selected but without a case of its op: known upfront too, in the end-of-run words
    rc, text = run_cli(["run", "--backend", "fake_backends:Working", "--case", CASE_IDS[0], "--out", str(out),
                        "--in-process"], env={"DELTACHECK_REQUIRE": "fake_backends:Working:gdn2"})
    assert rc == 1 and "REQUIRED fake_backends:Working:gdn2 executed zero cases" in text, text


def test_an_unknown_backend_name_is_refused_before_anything_starts(tmp_path, run_cli):
    out = tmp_path / "runs"
    rc, text = run_cli(["run", "--backend", "nosuch", "--case", CASE_IDS[0], "--out", str(out)])
    assert rc == 2 and "unknown backend" in text and "registered:" in text, text
    assert not out.exists()


@pytest.mark.parametrize("extra", [["-j", "1"], ["-j", "3"], ["-j", "3", "--dry-run"], ["--in-process"]])
def test_fla_beside_fla_dispatch_is_refused_before_anything_starts(tmp_path, run_cli, extra):
    """FLA reads its dispatch switch once per process: a worker that ran `fla` would judge `fla-dispatch` with
    dispatch off (and the reverse), whichever -j. The run is refused, saying why and what to do instead."""
    out = tmp_path / "runs"
    argv = ["run", "--backend", "fla", "--backend", "fla-dispatch", "--case", CASE_IDS[0], "--out", str(out)]
    rc, text = run_cli(argv + extra)
    assert rc == 2, text
    assert "fla cannot run beside fla-dispatch in one run" in text and "FLA_DISABLE_BACKEND_DISPATCH" in text, text
    assert "two runs" in text and "deltacheck merge" in text, text
    assert not out.exists(), "nothing may start: no run directory"


@pytest.mark.parametrize("backends, refused", [
    (["fla", "fla-recurrent", "fake_backends:Working"], False),
    (["fla-dispatch", "fla-dispatch-cp", "flashqla"], False),
    (["fla-recurrent", "cudnn", "fla-dispatch-cp"], True),
    (["fla-dispatch", "fla"], True),
])
def test_which_backends_cannot_share_a_process(backends, refused):
    from deltacheck.harness.backends.table import process_conflict

    assert (process_conflict(backends) is not None) == refused


def test_no_lane_family_mixes_backends_that_cannot_share_a_process():
    from deltacheck.harness.backends.table import process_conflict
    from deltacheck.harness.ci.families import FAMILIES

    assert {f.name: process_conflict(f.backends) for f in FAMILIES} == {f.name: None for f in FAMILIES}


def test_the_serving_run_and_the_frontier_refuse_the_pair_too(tmp_path, run_cli, capsys):
    from deltacheck.harness.run import serving_run

    with pytest.raises(SystemExit) as exit_:
        serving_run.main(["--backend", "fla-dispatch", "--backend", "fla", "--case", CASE_IDS[0]])
    assert exit_.value.code == 2 and "cannot run beside" in capsys.readouterr().err
    rc, text = run_cli(["frontier", "--backend", "fla", "--backend", "fla-dispatch", "--op", "gdn", "--out",
                        str(tmp_path / "f")])
    assert rc == 2 and "cannot run beside" in text, text
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("setting", ["nosuch:gdn2", "cudnn:gdn9"])
def test_a_required_pair_naming_an_unknown_backend_or_op_is_a_configuration_error(tmp_path, run_cli, setting):
    rc, text = run_cli(["run", "--backend", "oracle", "--limit", "1", "--out", str(tmp_path), "--in-process"],
                       env={"DELTACHECK_REQUIRE": setting})
    assert rc == 2, text


def _pytest(*argv):
    cmd = [*PYTEST, str(TESTS / "test_matrix.py"), "-q", "-p", "no:cacheprovider", *argv]
    return run_child(cmd, env=ENV, cwd=TESTS.parent, timeout=600)


@pytest.mark.parametrize("argv, says", [
    (["--dc-limit", "0"], "--dc-limit"), (["--dc-limit", "-1"], "--dc-limit"),
    (["--dc-device", "cuda:7"], "--dc-device cuda:7"), (["--dc-k", "and and"], "--dc-k"),
    (["--dc-backend", "nosuch"], "unknown backend"),
    (["--dc-backend", "fla", "--dc-backend", "fla-dispatch"], "cannot run beside"),
])
def test_the_pytest_plugin_refuses_what_the_cli_refuses_once(argv, says):
    proc = _pytest("--dc-backend", "oracle", *argv) if "--dc-backend" not in argv else _pytest(*argv)
    text = proc.stdout + proc.stderr
    assert proc.returncode in (4, 2), text  # pytest's usage error (argparse's own is 4 under pytest too)
    assert says in text, text
    assert "Traceback" not in text


# --- files and faults -------------------------------------------------------------------------------

def test_resume_after_a_torn_last_line_keeps_every_line_readable(tmp_path):
    from deltacheck.cases import Case

    cases = [Case.from_id(c) for c in CASE_IDS]
    status, run_dir = run(["fake_backends:Working"], tmp_path, cases=cases)
    path = run_dir / "results.jsonl"
    lines = path.read_text().splitlines()
    cut = len(lines) // 2
    path.write_text("\n".join(lines[:cut]) + "\n" + lines[cut][: len(lines[cut]) // 2])  # torn mid-record
    status, again = run(["fake_backends:Working"], tmp_path, cases=cases, resume=run_dir)
    assert again == run_dir
    text = path.read_text().splitlines()
    bad = [i for i, line in enumerate(text, 1) if line.strip() and not _is_json(line)]
    assert bad == [cut + 1], f"only the torn line may be unreadable, got lines {bad}"
    assert any(json.loads(line).get("kind") == "resume" for line in text if _is_json(line))


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def test_a_full_disk_is_one_line_with_the_resume_hint(tmp_path, run_cli, monkeypatch):
    from deltacheck.harness.records import results

    real = results.ResultStream.write
    calls = {"n": 0}

    def write(self, record):
        calls["n"] += 1
        if calls["n"] > 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, record)

    monkeypatch.setattr(results.ResultStream, "write", write)
    rc, text = run_cli(["run", "--backend", "oracle", "--case", CASE_IDS[0], "--out", str(tmp_path), "--in-process"])
    assert rc == 1, text
    lines = [line for line in text.splitlines() if "No space left" in line]
    assert len(lines) == 1 and "--resume" in lines[0] and "results.jsonl" in lines[0], text
    assert "Traceback" not in text


# --- one backend object per process; the plug-in floor ---------------------------------------------

class CountingBackend:
    """A third-party backend that counts how often it is built and how often its probe runs."""

    built = 0
    probes = 0
    name = "counting"
    ops = frozenset({"gdn", "kda", "gdn2", "gdp"})
    version_key = "counting_dist"  # a key deltacheck's probe never looks for
    loads = 0

    def __init__(self):
        type(self).built += 1
        self._probed = {}

    def version(self):
        return "7.1.2"

    def load(self, op):
        type(self).loads += 1
        return base.Verdict.ok()

    def check(self, case, env):
        key = (case.op, case.io_dtype)
        if key not in self._probed:
            type(self).probes += 1
            self._probed[key] = base.Verdict.ok()
        return self._probed[key]

    def run(self, case, inputs):
        return base.get_backend("oracle").run(case, inputs)


def test_one_backend_object_and_one_probe_per_process(tmp_path, monkeypatch):
    from deltacheck.cases import Case

    monkeypatch.setattr(sys.modules[__name__], "CountingBackend", CountingBackend)
    CountingBackend.built = CountingBackend.probes = 0
    base.forget_backends()
    spec = f"{__name__}:CountingBackend"
    cases = [Case.from_id(c) for c in ["kda-bf16-thd-N1-T[8]-H2/2/2-K64-V64-typical",
                                       "kda-bf16-thd-N1-T[9]-H2/2/2-K64-V64-typical",
                                       "kda-bf16-thd-N1-T[10]-H2/2/2-K64-V64-typical"]]
    status, run_dir = run([spec], tmp_path, cases=cases)
    assert status == 0
    assert CountingBackend.probes == 1, "three tasks with one probe key: one probe"
    assert CountingBackend.built == 1, "one backend object per spec per process"


def test_the_cudnn_adapter_probes_once_for_tasks_that_share_a_probe_key(tmp_path, monkeypatch):
    """On the contract double: three tasks with one probe key give one planner probe (a real call on a GPU)."""
    from doubles import cudnn_la

    from deltacheck.cases import Case
    from deltacheck.harness.backends.cudnn import adapter as cudnn_adapter

    calls = {"n": 0}
    double = cudnn_la.make()
    real = double.kimi_delta_attention

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    double.kimi_delta_attention = counted
    backend = cudnn_adapter.CudnnBackend(double, device="cpu")
    monkeypatch.setitem(base._REGISTRY, "cudnn-double", lambda: backend)
    base.forget_backends()
    monkeypatch.setattr(cudnn_adapter.CudnnBackend, "pair_verdict", lambda self, op, env: base.Verdict.ok())
    cases = [Case.from_id(f"kda-bf16-thd-N1-T[{n}]-H2/2/2-K64-V64-typical") for n in (8, 9, 10)]
    keys = {backend._probe_key(c) for c in cases}
    assert len(keys) == 1, keys
    before = calls["n"]
    for case in cases:
        backend.check(case, None)
    probes = calls["n"] - before
    assert probes == 1, probes
    assert base.backend_for("cudnn-double") is base.backend_for("cudnn-double") is backend
    base.forget_backends()


def test_a_plugin_version_reaches_the_header_and_compare_says_when_it_changed(tmp_path, monkeypatch, capsys):
    from deltacheck.cases import Case

    monkeypatch.setattr(sys.modules[__name__], "CountingBackend", CountingBackend)
    base.forget_backends()
    spec = f"{__name__}:CountingBackend"
    case = [Case.from_id("kda-bf16-thd-N1-T[8]-H2/2/2-K64-V64-typical")]
    _, old = run([spec], tmp_path / "old", cases=case)
    assert records(old)[0]["backend_versions"] == {spec: "7.1.2"}
    monkeypatch.setattr(CountingBackend, "version", lambda self: "7.2.0")
    base.forget_backends()
    _, new = run([spec], tmp_path / "new", cases=case)
    assert records(new)[0]["backend_versions"] == {spec: "7.2.0"}
    capsys.readouterr()
    cli_main(["compare", str(old), str(new)])
    out = capsys.readouterr().out
    assert f"backend {spec}" in out and "7.1.2" in out and "7.2.0" in out, out
    base.forget_backends()


def test_a_version_key_the_probe_does_not_know_does_not_skip_load(monkeypatch):
    from deltacheck.harness.machine.availability import library_verdict
    from deltacheck.harness.machine.environment import probe_env

    CountingBackend.loads = 0
    backend = CountingBackend()
    verdict = library_verdict(backend, "counting", "kda", probe_env())
    assert verdict.runnable and CountingBackend.loads == 1


def test_the_plugin_module_exports_its_floor():
    import deltacheck.plugin as plugin

    for name in plugin.__all__:
        assert getattr(plugin, name) is not None
    assert {"Backend", "BackendHooks", "Verdict", "Envelope", "register", "get_backend", "gathered",
            "floors_then_library", "package_floor", "no_cuda_reason", "strip_pair"} <= set(plugin.__all__)
