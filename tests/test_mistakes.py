"""Every mistake a new user makes on the CPU gets one clean line naming what is wrong, a non-zero exit (2 for
usage), no traceback, and nothing lost (issue 15, part 4). One test per mistake, named for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from child_env import ENV, HANG_GUARD_S, TESTS

from deltacheck.harness.ci.tiers import select
from deltacheck.harness.cli import main as cli_main

# Two small cases: seconds per run.
CASE_A = "gdn2-fp16-thd-N1-T[33]-H2/2/2-K64-V64-typical"
CASE_B = "gdn-bf16-thd-N2-T[1_20]-H2/2/2-K64-V64-steep"
QUICK = ["--in-process", "--reference", "oracle", "--no-baseline"]


@pytest.fixture(autouse=True)
def _fake_backends_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    for var in ("NVTE_GDN2_TEST_REQUIRED", "NVTE_GDN_TEST_REQUIRED", "DELTACHECK_REQUIRE"):
        monkeypatch.delenv(var, raising=False)


def one_run(out: Path, *extra: str, backend: str = "oracle", case: str = CASE_A) -> Path:
    """A finished run directory of ``case`` x ``backend`` under ``out``."""
    before = set(out.iterdir()) if out.exists() else set()
    assert cli_main(["run", "--backend", backend, "--case", case, "--out", str(out), *QUICK, *extra]) == 0
    (run_dir,) = set(out.iterdir()) - before
    return run_dir


def one_line_error(err: str, prefix: str) -> str:
    """The one line a mistake printed: no traceback, nothing else."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), err
    return lines[0]


# --- run --resume with another selection -----------------------------------------------------------


@pytest.mark.parametrize("differs,argv,named", [
    ("case", ["--backend", "oracle", "--case", CASE_B, "--reference", "oracle", "--no-baseline"], CASE_B),
    ("backend", ["--backend", "chunked", "--case", CASE_A, "--reference", "oracle", "--no-baseline"], "chunked"),
    ("option", ["--backend", "oracle", "--case", CASE_A, "--reference", "chunked", "--no-baseline"], "reference"),
])
def test_resume_with_another_selection_is_refused_naming_what_differs(tmp_path, capsys, differs, argv, named):
    run_dir = one_run(tmp_path)
    before = (run_dir / "results.jsonl").read_bytes()
    capsys.readouterr()
    assert cli_main(["run", *argv, "--in-process", "--resume", str(run_dir)]) == 2
    line = one_line_error(capsys.readouterr().err, f"deltacheck run: --resume {run_dir}:")
    assert named in line and "differs" in line
    assert (run_dir / "results.jsonl").read_bytes() == before, "a refused resume appends nothing"


# --- a non-UTF-8 line in results.jsonl ---------------------------------------------------------------


def test_a_non_utf8_line_is_skipped_and_named_by_its_line_number(tmp_path, capsys):
    clean = one_run(tmp_path / "runs")
    bad = tmp_path / "bad"
    shutil.copytree(clean, bad)
    lines = (bad / "results.jsonl").read_bytes().splitlines(keepends=True)
    n_results = sum(b'"kind": "result"' in line for line in lines)
    lines.insert(3, b'{"kind": "result", "case": "caf\xe9 \xff"}\n')  # latin-1 and a stray byte: line 4
    (bad / "results.jsonl").write_bytes(b"".join(lines))
    capsys.readouterr()

    assert cli_main(["report", str(bad)]) == 0
    out, err = capsys.readouterr()
    assert "line 4: not UTF-8 text" in err and "Traceback" not in err
    assert "unusable line(s) of results.jsonl skipped: 4" in out
    assert json.loads((bad / "summary.json").read_text())["counts"]["pass"] == n_results, "nothing else lost"

    assert cli_main(["compare", str(clean), str(bad)]) == 0
    assert "line 4: not UTF-8 text" in capsys.readouterr().out
    assert cli_main(["merge", str(clean), str(bad), "--out", str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    assert cli_main(["run", "--backend", "oracle", "--case", CASE_A, *QUICK, "--resume", str(bad)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "1 of 1 tasks were judged before" in err


# --- a third-party backend whose constructor raises -----------------------------------------------------


def test_a_backend_whose_constructor_raises_is_reported_like_one_that_cannot_be_imported(tmp_path, capsys):
    out = tmp_path / "runs"
    status = cli_main(["run", "--backend", "fake_backends:ConstructorRaises", "--case", CASE_A, "--out", str(out),
                       *QUICK])
    captured = capsys.readouterr()
    assert status == 1 and "Traceback" not in captured.err
    (run_dir,) = list(out.iterdir())
    recs = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert recs[0]["kind"] == "run" and recs[-1]["kind"] == "end", "a whole run directory, not a half-made one"
    why = "backend 'fake_backends:ConstructorRaises': constructing ConstructorRaises raised RuntimeError: " \
          "no CUDA driver (fake)"
    assert {r["reason"] for r in recs if r["kind"] == "gate"} == {why}
    results = [r for r in recs if r["kind"] == "result"]
    assert results and {(r["status"], r["reason"]) for r in results} == {("error", why)}
    assert why in captured.out
    # exactly as an unimportable module is reported
    cli_main(["run", "--backend", "no_such_module:Backend", "--case", CASE_A, "--out", str(out), *QUICK])
    assert "backend 'no_such_module:Backend': cannot import module" in capsys.readouterr().out
    assert cli_main(["run", "--dry-run", "--backend", "fake_backends:ConstructorRaises", "--case", CASE_A]) == 0
    assert f"1 × {why}" in capsys.readouterr().out


# --- compare of two runs with nothing in common ------------------------------------------------------------


def test_compare_of_runs_that_share_nothing_is_an_error_not_no_regression(tmp_path, capsys):
    old = one_run(tmp_path / "old", case=CASE_A)
    new = one_run(tmp_path / "new", case=CASE_B)
    capsys.readouterr()
    assert cli_main(["compare", str(old), str(new)]) == 2
    out, err = capsys.readouterr()
    line = one_line_error(err, "deltacheck compare: error: ")
    assert "share no (case, backend, check)" in line and "no regression" not in out
    assert cli_main(["compare", str(old), str(old)]) == 0  # the same run: everything in common


# --- --out that cannot hold what the command writes --------------------------------------------------------


def _unwritable(tmp_path: Path, kind: str) -> Path:
    if kind in ("a file", "under a file"):
        target = tmp_path / "a-file"
        target.write_text("not a directory\n")
        return target / "runs" if kind == "under a file" else target
    if kind in ("a directory", "a directory in the way"):
        (tmp_path / "a-directory").mkdir()
        return tmp_path / "a-directory"
    target = tmp_path / "read-only"
    target.mkdir()
    target.chmod(0o555)
    return target


AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def read_only(command: str):
    return pytest.param(command, "read-only directory", marks=pytest.mark.skipif(
        AS_ROOT, reason="root writes into read-only directories, so this machine cannot make one it cannot write"))


@pytest.mark.parametrize("command,kind", [
    *[(command, kind) for command in ("run", "verify", "merge") for kind in ("a file", "under a file")],
    read_only("run"), read_only("verify"), read_only("merge"),
    ("compare", "a directory"), ("compare", "under a file"), read_only("compare"),
    # report takes no --out: it writes into the run directory itself
    read_only("report"), ("report", "a directory in the way"),
])
def test_an_out_that_cannot_be_written_is_a_one_line_error_with_exit_2(tmp_path, capsys, command, kind):
    runs = tmp_path / "runs"
    target = _unwritable(tmp_path, kind)
    if command in ("run", "verify"):
        argv = [command, "--backend", "oracle", "--case", CASE_A, "--out", str(target), *QUICK]
    elif command == "report":
        target.chmod(0o755)
        shutil.copytree(one_run(runs), target, dirs_exist_ok=True)
        if kind == "a directory in the way":
            (target / "summary.json").mkdir()  # where report writes a file (root can make this one)
        else:
            target.chmod(0o555)
        argv = ["report", str(target)]
    else:
        first, second = one_run(runs), one_run(runs)
        if command == "compare" and kind == "read-only directory":
            target = target / "comparison.md"
        argv = [command, str(first), str(second), "--out", str(target)]
    capsys.readouterr()
    assert cli_main(argv) == 2
    # verify is run with other defaults, and speaks as `deltacheck run`
    line = one_line_error(capsys.readouterr().err, f"deltacheck {'run' if command == 'verify' else command}: ")
    assert str(target) in line
    if command in ("run", "verify"):
        assert not runs.exists()


# --- --device that this machine does not have ---------------------------------------------------------------


def _missing_cuda() -> str:
    return "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


@pytest.mark.parametrize("device", ["foo", "mps", "missing cuda"])
def test_a_device_this_machine_lacks_is_a_usage_error_naming_what_is_available(tmp_path, capsys, device):
    device = _missing_cuda() if device == "missing cuda" else device
    out = tmp_path / "runs"
    assert cli_main(["run", "--backend", "oracle", "--case", CASE_A, "--out", str(out), "--device", device,
                     *QUICK]) == 2
    line = one_line_error(capsys.readouterr().err, f"deltacheck run: --device {device}: ")
    assert "available here: cpu" in line
    assert not out.exists(), "nothing run, no run directory"


# --- --limit -1 and empty selections --------------------------------------------------------------------------


@pytest.mark.parametrize("argv,named", [
    (["--limit", "-1"], "argument --limit: expected a whole number >= 1, got -1"),
    (["--limit", "0"], "argument --limit: expected a whole number >= 1, got 0"),
    (["-k", "no_such_token"], "-k 'no_such_token' matched none of the"),
    (["--op", "gdn", "-k", "gdn2-"], "-k 'gdn2-' matched none of the"),
])
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_a_negative_limit_or_an_empty_selection_is_a_usage_error_not_a_green_run(tmp_path, capsys, argv, named,
                                                                                  dry_run):
    out = tmp_path / "runs"
    command = ["run", "--backend", "oracle", "--out", str(out), *QUICK, *argv] + (["--dry-run"] if dry_run else [])
    if argv[0] == "--limit":
        with pytest.raises(SystemExit) as exc:
            cli_main(command)
        assert exc.value.code == 2
        assert named in capsys.readouterr().err
    else:
        assert cli_main(command) == 2
        line = one_line_error(capsys.readouterr().err, "deltacheck run: ")
        assert named in line and "no case selected" in line
    assert not out.exists()


# --- the same --backend twice -----------------------------------------------------------------------------------


def test_the_same_backend_twice_runs_once_with_a_note(tmp_path, capsys):
    out = tmp_path / "runs"
    assert cli_main(["run", "--backend", "oracle", "--backend", "oracle", "--case", CASE_A, "--out", str(out),
                     *QUICK]) == 0
    err = capsys.readouterr().err
    assert "note: --backend oracle was given 2 times; it runs once" in err
    (run_dir,) = list(out.iterdir())
    recs = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    checks = [(r["case"], r["backend"], r["check"]) for r in recs if r["kind"] == "result"]
    assert checks and len(checks) == len(set(checks)), "each check judged once"
    assert recs[0]["backends"] == ["oracle"]


# --- -k and the io dtype -------------------------------------------------------------------------------------------


def test_k_selects_by_io_dtype_with_the_dashed_token_and_help_says_how(capsys):
    cases = select(tier="L0")
    io_bf16 = [c for c in cases if c.io_dtype == "bf16"]
    assert [c for c in select(tier="L0", k="bf16") if c.io_dtype != "bf16"], "bare bf16 also matches state_bf16"
    assert select(tier="L0", k="-bf16-") == io_bf16
    # through the command line: the value starts with '-', so it is attached (-k=...), or holds a space
    for argv in (["-k=-bf16-"], ["-k-bf16-"], ["-k", "-bf16- and thd"]):
        assert cli_main(["run", "--backend", "oracle", "--dry-run", *argv]) == 0
        want = io_bf16 if len(argv) == 1 else [c for c in io_bf16 if c.layout == "thd"]
        assert f"--dry-run: {len(want)} cases" in capsys.readouterr().out
    assert cli_main(["list", "-k=-bf16-"]) == 0
    assert capsys.readouterr().out.split() == [c.id for c in io_bf16]
    for command in ("run", "list"):
        with pytest.raises(SystemExit):
            cli_main([command, "--help"])
        assert "-k=-bf16-" in " ".join(capsys.readouterr().out.split())
    assert "-k=-bf16-" in (TESTS.parent / "docs" / "cases.md").read_text()


# --- nanobind leak warnings at a worker's exit ------------------------------------------------------------------------

LEAK_REPORT = [
    "nanobind: leaked 3 instances!",
    ' - leaked instance 0x55d0c0ffee00 of type "cudnn._compiled_module.pygraph"',
    ' - leaked instance 0x55d0c0ffee80 of type "cudnn._compiled_module.tensor"',
    " - ... skipped remainder",
    "nanobind: leaked 2 types!",
    ' - leaked type "cudnn._compiled_module.pygraph"',
    "nanobind: leaked 1 functions!",
    ' - leaked function "create_handle"',
    "nanobind: this is likely caused by a reference counting issue in the binding code.",
    "See https://nanobind.readthedocs.io/en/latest/refleaks.html",
]
OTHER_LINES = ["kernel library: 3 plans cached (fake)", ' - leaked instance is a phrase a library may print too']


def test_leak_filter_drops_the_nanobind_report_and_nothing_else():
    from deltacheck.harness.machine.leaks import LeakFilter

    text = ["before\n", *(line + "\n" for line in LEAK_REPORT), OTHER_LINES[1] + "\n", "after"]
    leak_filter = LeakFilter()
    kept = [line for line in (t.encode() for t in text) if leak_filter.keep(line)]
    assert kept == [b"before\n", OTHER_LINES[1].encode() + b"\n", b"after"]


def test_nanobind_leak_warnings_at_a_run_workers_exit_stay_out_of_the_terminal(tmp_path):
    argv = [sys.executable, "-m", "deltacheck", "run", "--backend", "fake_backends:LeaksAtExit", "--case", CASE_A,
            "--case", CASE_B, "--out", str(tmp_path), "--reference", "oracle", "--no-baseline", "-j", "2"]
    proc = subprocess.run(argv, env=dict(ENV, DELTACHECK_FAKE_LEAKS="1"), capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [line for line in LEAK_REPORT if line in proc.stderr], proc.stderr
    # each worker printed the other lines once at its exit; every one reaches the terminal
    printed = proc.stderr.count(OTHER_LINES[0])
    assert printed >= 1 and proc.stderr.count(OTHER_LINES[1]) == printed, proc.stderr


def test_nanobind_leak_warnings_at_a_pytest_workers_exit_stay_out_of_the_terminal(tmp_path):
    # The fake library prints at exit after our exit-time filter is in place, as nanobind does (Py_AtExit runs
    # after every atexit handler): its handler is registered before the plugin's, so it runs after it.
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import atexit, os
        try:
            from deltacheck.harness.machine import leaks
            leaks.nanobind_loaded = lambda: True  # stands in for cuDNN's nanobind extension
        except ImportError:  # a deltacheck without the filter: the report reaches the terminal
            pass
        REPORT = {LEAK_REPORT + OTHER_LINES!r}
        atexit.register(lambda: os.write(2, "".join(line + "\\n" for line in REPORT).encode()))
        pytest_plugins = ["deltacheck.harness.pytest_plugin"]
    """))
    (tmp_path / "test_fake.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(tmp_path)]
    proc = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [line for line in LEAK_REPORT if line in proc.stdout + proc.stderr], proc.stderr
    # the controller and both workers print the other lines; each reaches the terminal
    assert proc.stderr.count(OTHER_LINES[0]) == 3 and proc.stderr.count(OTHER_LINES[1]) == 3, proc.stderr


@pytest.mark.parametrize("argv", [["env"], ["list", "--tier", "L0", "--op", "kda"], ["frontier", "--help"],
                                  ["report", "--help"]], ids=lambda a: a[0])
def test_nanobind_leak_warnings_at_exit_stay_out_of_the_terminal_in_every_command(argv):
    """Not only `run`: any command may have imported cuDNN's nanobind extension (frontier against cuDNN printed 25
    lines of it). The fake report is registered before the command starts, so it prints after the command's own
    exit-time filter is in place, as nanobind does."""
    script = textwrap.dedent(f"""
        import atexit, os, sys
        from deltacheck.harness.machine import leaks
        leaks.nanobind_loaded = lambda: True  # stands in for cuDNN's nanobind extension
        REPORT = {LEAK_REPORT + OTHER_LINES!r}
        atexit.register(lambda: os.write(2, "".join(line + "\\n" for line in REPORT).encode()))
        from deltacheck.harness.cli import main
        sys.exit(main({argv!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [line for line in LEAK_REPORT if line in proc.stdout + proc.stderr], proc.stderr
    assert proc.stderr.count(OTHER_LINES[0]) == 1 and proc.stderr.count(OTHER_LINES[1]) == 1, proc.stderr


# --- --help: each command's own examples, every option explained, the top line naming every op and library -------


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exc:
        cli_main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_verify_help_gives_verifys_own_examples(capsys):
    text = _help(capsys, "verify")
    examples = text.split("examples:", 1)[1]
    lines = [line.strip() for line in examples.splitlines() if "deltacheck " in line]
    assert lines and all("deltacheck verify" in line for line in lines), lines
    assert "NVTE_GDN2_TEST_REQUIRED=1" in text  # required mode is explained as for run
    assert "deltacheck verify" not in _help(capsys, "run").split("examples:", 1)[1]


def test_every_warmup_option_has_help(capsys):
    from deltacheck.harness.cli import build_parser

    parser = build_parser(every=True)  # every command's real parser, not the lazy CLI's one-line stubs
    warmup = parser._subparsers._group_actions[0].choices["warmup"]
    bare = [a.option_strings for a in warmup._actions if a.option_strings and a.help in (None, "")]
    assert not bare, f"warmup options without help: {bare}"


def test_the_top_level_help_names_every_op_and_te(capsys):
    text = " ".join(_help(capsys).split())
    assert "(GDN, KDA, GDN2, GDP)" in text and "TransformerEngine (TE)" in text


def test_the_eta_is_estimated_over_the_tasks_that_will_run(monkeypatch):
    import io

    from deltacheck.harness.run import execute as ex

    clock = [0.0]
    monkeypatch.setattr(ex.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(ex.Progress, "LOG_EVERY_S", 0.0)
    out = io.StringIO()
    progress = ex.Progress(12, stream=out, will_run=2)  # 10 tasks of a pair that cannot run here
    clock[0] = 300.0
    progress.update("a reference task", runnable=True)
    assert "ETA   300s" in out.getvalue().splitlines()[-1]  # one more task will run: about 300 s, not 11 x 300
    for n in range(10):
        clock[0] += 0.01
        progress.update(f"declined {n}", runnable=False)
    assert "ETA   300s" in out.getvalue().splitlines()[-1], out.getvalue()
    resumed = ex.Progress(3, stream=out, will_run=3)
    clock[0] += 1.0
    resumed.update("judged before", resumed=True)
    assert "ETA     ?" in out.getvalue().splitlines()[-1]  # nothing timed yet: no made-up number
