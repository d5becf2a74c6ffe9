"""``deltacheck merge --fold``: one tier run in two Python environments (two processes, one of which sees a
library the other does not), each with its own backend, folded into one run (issue 25, item 4; docs/ci.md).

The two runs here are real: ``deltacheck run`` in child processes on the CPU, backends ``chunked`` and
``baseline``; process B's ``sys.path`` holds a distribution the other lacks (jax-linear-attention's metadata), so
their environment fingerprints differ exactly as two family venvs' do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltacheck.harness.cli import main as cli_main

CASE = "gdn-bf16-thd-N1-T[8]-H1/1/1-K32-V32-typical"


def run_in_env(tmp_path: Path, name: str, backend: str, extra_path: Path | None = None) -> Path:
    """``deltacheck run`` in a child process; returns the run directory it made."""
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "deltacheck", "run", "--backend", backend, "--case", CASE,
                           "--device", "cpu", "--in-process", "--no-baseline", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in out.iterdir() if (p / "results.jsonl").exists()]
    return run_dir


def fake_distribution(root: Path) -> Path:
    info = root / "jax_linear_attention-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax-linear-attention\nVersion: 0.1.0\n")
    return root


@pytest.fixture(scope="module")
def two_envs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fold")
    a = run_in_env(tmp, "a", "chunked")
    b = run_in_env(tmp, "b", "baseline", fake_distribution(tmp / "site-b"))
    return tmp, a, b


def header(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.jsonl").read_text().splitlines()[0])


def test_the_two_processes_are_two_environments(two_envs):
    _, a, b = two_envs
    assert header(a)["env"]["versions"].get("jax_linear_attention") is None
    assert header(b)["env"]["versions"]["jax_linear_attention"] == "0.1.0"


def test_a_plain_merge_refuses_them_and_a_fold_takes_them(two_envs, capsys):
    tmp, a, b = two_envs
    assert cli_main(["merge", str(a), str(b), "--out", str(tmp / "plain")]) != 0
    assert "different environments" in capsys.readouterr().err
    out = tmp / "folded"
    assert cli_main(["merge", "--fold", str(a), str(b), "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    head = records[0]
    assert head["backends"] == ["chunked", "baseline"]
    assert head["env_by_backend"]["baseline"]["versions"]["jax_linear_attention"] == "0.1.0"
    assert "jax_linear_attention" not in head["env_by_backend"]["chunked"]["versions"]
    backends = {r["backend"] for r in records if r.get("kind") == "result"}
    assert backends == {"chunked", "baseline"}
    assert records[-1]["kind"] == "end"


def test_a_fold_refuses_one_backend_from_two_environments(two_envs, capsys):
    tmp, a, _ = two_envs
    again = run_in_env(tmp, "a2", "chunked", fake_distribution(tmp / "site-a2"))
    assert cli_main(["merge", "--fold", str(a), str(again), "--out", str(tmp / "twice")]) != 0
    assert "backend 'chunked' is in both" in capsys.readouterr().err


def test_a_fold_refuses_another_machine(two_envs, capsys):
    tmp, a, b = two_envs
    lines = (b / "results.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["env"]["device_name"] = "NVIDIA H200"
    moved = tmp / "moved"
    moved.mkdir()
    (moved / "results.jsonl").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    assert cli_main(["merge", "--fold", str(a), str(moved), "--out", str(tmp / "machines")]) != 0
    assert "ran on another machine" in capsys.readouterr().err


def test_the_lane_runs_each_family_in_its_own_venv_then_folds():
    from deltacheck.harness.ci.families import FAMILIES, lane_commands

    commands = lane_commands([f.name for f in FAMILIES], {"jax", "cudnn", "flashinfer", "fla"}, wheels="/w")
    runs = [c for c in commands if c[2:4] == ["deltacheck", "run"]]
    backends = [[c[i + 1] for i, x in enumerate(c) if x == "--backend"] for c in runs]
    assert backends == [["cudnn", "flashinfer"], ["jax"], ["fla"]]  # qla: nothing registered here, skipped
    assert all(c[0] == f".nox/lane-{f}/bin/python" for c, f in zip(runs, ("nvidia", "jax", "fla")))
    installs = [c for c in commands if c[2:4] == ["pip", "install"] and "-e" not in c]
    assert all(c[4:7] == ["--no-index", "--find-links", "/w"] for c in installs)
    assert commands[-1][2:5] == ["deltacheck", "merge", "--fold"] and len(commands[-1]) == 5 + 3 + 3
    flat = [b for group in backends for b in group]
    assert len(flat) == len(set(flat))  # disjoint: what a fold requires


def test_the_vllm_family_installs_vllm_without_its_torch_pin():
    """vLLM 0.33 pins torch == 2.14.0: its family installs it --no-deps (einops beside it), so the venv keeps the
    machine's torch; its backends run in their own process, apart from FLA's."""
    from deltacheck.harness.backends.base import registered
    from deltacheck.harness.ci.families import FAMILIES, family, lane_commands

    fam = family("vllm")
    assert set(fam.backends) == {"vllm-fla", "vllm-fla-recurrent", "flashkda"} and fam.no_deps
    commands = lane_commands(["vllm"], set(fam.backends) | {"fla"})
    install = [c for c in commands if c[2:4] == ["pip", "install"] and "-e" not in c]
    assert install == [[".nox/lane-vllm/bin/python", "-m", "pip", "install", "--no-deps", "vllm==0.33.0", "einops"]]
    run = [c for c in commands if c[2:4] == ["deltacheck", "run"]]
    assert [c[i + 1] for c in run for i, x in enumerate(c) if x == "--backend"] == list(fam.backends)
    # no other family installs --no-deps; every family's backends are names this checkout registers, once each
    assert [f.name for f in FAMILIES if f.no_deps] == ["vllm"]
    names = [b for f in FAMILIES for b in f.backends]
    assert len(names) == len(set(names)) and set(names) <= set(registered())
