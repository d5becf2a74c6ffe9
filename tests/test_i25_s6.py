"""bench/i25_s6_h200.sh, the device call that completes session 5's cut fla-dispatch + flashqla L0, exercised on the
CPU: its plan (what it would run, from session 5's recorded run, by this checkout's code), and its control flow with
a fake ``deltacheck run`` (S6_RUN_CMD): a first call cut by its own limit, a second call on a fresh machine that
continues the same run directory from the first call's archive, and the fallback when ``--resume`` is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench/i25_s6_h200.sh"
S5_RUN = "20261202-200900-ed6340"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None,
                                reason="the device script needs bash and GNU tar")

# A stand-in for `python3 -m deltacheck run`: with --resume it appends a resume record to the run (and refuses, as
# deltacheck does for another machine, under FAKE_REFUSE); then it ends the run (FAKE_FINISH) or waits to be cut.
FAKE = r'''
import json, os, signal, sys, time
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\n")
if "--resume" in argv:
    run = argv[argv.index("--resume") + 1]
    if os.environ.get("FAKE_REFUSE"):
        print(f"deltacheck run: --resume {run}: it ran in another environment (H200) than this one (cpu); resume it "
              "there, or start a new run", file=sys.stderr)
        sys.exit(2)
else:
    run = os.path.join(argv[argv.index("--out") + 1], "20261203-000000-abcdef")
    os.makedirs(run)
    with open(os.path.join(run, "results.jsonl"), "w") as f:
        f.write(json.dumps({"kind": "run", "argv": ["run"] + argv, "backends": ["fla-dispatch", "flashqla"],
                            "case_ids": [argv[i + 1] for i, a in enumerate(argv) if a == "--case"]}) + "\n")
with open(os.path.join(run, "results.jsonl"), "a") as f:
    f.write(json.dumps({"kind": "resume" if "--resume" in argv else "note", "argv": argv}) + "\n")
if os.environ.get("FAKE_FINISH"):
    with open(os.path.join(run, "results.jsonl"), "a") as f:
        f.write(json.dumps({"kind": "end"}) + "\n")
    sys.exit(0)
signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
time.sleep(120)
'''


def _call(tmp_path: Path, mode: str, work: str, out: str, **env) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE)
    (tmp_path / out).mkdir(exist_ok=True)
    full = {**os.environ, "D25_WORK": str(tmp_path / work), "OUT": str(tmp_path / out),
            "S5_ROOT": str(tmp_path / "s5"), "DELTACHECK_CACHE_DIR": str(tmp_path / "cache"),
            "S6_RUN_CMD": f"{sys.executable} {fake}", "FAKE_LOG": str(tmp_path / "fake.log"),
            "PREV": str(tmp_path / "no-such.tgz"), "CAP": "14", "PACK_S": "2", "MIN_LEFT": "1", **env}
    return subprocess.run(["bash", str(SCRIPT), mode], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=300)


def _archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _records(blob: bytes) -> list[dict]:
    return [json.loads(line) for line in blob.decode().splitlines() if line.strip()]


def test_the_plan_names_what_is_left_of_session_5s_run_and_the_resume_command(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "plan"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "D25_WORK": str(tmp_path / "w")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "tasks left: 186 (over 94 cases)" in out
    assert "fla-dispatch:gdn   half-judged (run again) 5, judged 76" in out
    assert "flashqla:kda       judged 66, left outside (declines) 51, not reached 51" in out
    assert "the same (--resume accepts it)" in out
    assert (f"--resume {tmp_path / 'w'}/runs/A/{S5_RUN} --tier L0 --op gdn --op kda --backend fla-dispatch "
            "--backend flashqla --threads 1 --task-timeout 420 -j 8") in out
    assert len((tmp_path / "w/cases-left.txt").read_text().splitlines()) == 94


# The two rehearsals below run the script three times and once (about 90 s of one worker under -n 2, where the whole
# suite has a 300 s budget); the run they rehearse finished on the H200 in session 7 (bench/results/s7/d25-S6.tgz),
# so they are opt-in now, like the other long CPU runs.
REHEARSAL_SKIP = ("rehearses session 6's device call, whose run finished on the H200 in session 7 "
                  "(bench/results/s7/d25-S6.tgz), through four bash runs of the script (about 90 s of CPU); "
                  "run with --dc-exhaustive")


@pytest.mark.slow
def test_a_cut_first_call_then_a_second_on_a_fresh_machine_continue_one_run_directory(tmp_path, request):
    if not request.config.getoption("--dc-exhaustive"):
        pytest.skip(REHEARSAL_SKIP)
    first = _call(tmp_path, "cold", "w1", "out1")
    assert first.returncode == 0, first.stdout + first.stderr
    files = _archive(tmp_path / "out1/d25-S6.tgz")
    run = f"d25-s6/runs/A/{S5_RUN}/results.jsonl"
    recs = _records(files[run])
    assert recs[0]["kind"] == "run" and [r["kind"] for r in recs[-1:]] == ["resume"]
    assert not any(r["kind"] == "end" for r in recs)
    walls = files["d25-s6/walls.tsv"].decode().split("\t")
    assert walls[:4] == ["A", "resume", "8", "cold"] and walls[7] == "124" and walls[8].startswith("cut")
    assert "tasks left: 186" in files["d25-s6/logs/plan-cold.txt"].decode()
    argv = json.loads((tmp_path / "fake.log").read_text().splitlines()[0])
    assert argv[:2] == ["--resume", f"{tmp_path}/w1/runs/A/{S5_RUN}"] and argv[-2:] == ["-j", "8"]

    # the machine is gone: the second call continues the same run from the first call's archive
    second = _call(tmp_path, "resume", "w2", "out2", PREV=str(tmp_path / "out1/d25-S6.tgz"), FAKE_FINISH="1")
    assert second.returncode == 0, second.stdout + second.stderr
    recs = _records(_archive(tmp_path / "out2/d25-S6.tgz")[run])
    assert [r["kind"] for r in recs if r["kind"] in ("resume", "end")] == ["resume", "resume", "end"]
    walls = _archive(tmp_path / "out2/d25-S6.tgz")["d25-s6/walls.tsv"].decode().splitlines()
    assert walls[0].split("\t")[8].startswith("cut") and walls[1].split("\t")[:4] == ["A", "resume", "8", "resume"]
    assert walls[1].split("\t")[8].startswith("finished")
    # a third call finds the run finished and runs nothing
    third = _call(tmp_path, "resume", "w2", "out3")
    assert third.returncode == 0 and "has finished: nothing to run" in third.stdout
    assert len((tmp_path / "fake.log").read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_refused_resume_falls_back_to_a_run_of_exactly_the_cases_left(tmp_path, request):
    if not request.config.getoption("--dc-exhaustive"):
        pytest.skip(REHEARSAL_SKIP)
    proc = _call(tmp_path, "cold", "w", "out", FAKE_REFUSE="1", FAKE_FINISH="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(line) for line in (tmp_path / "fake.log").read_text().splitlines()]
    assert calls[0][0] == "--resume" and calls[1][:2] == ["--out", f"{tmp_path}/w/runs/A-rest"]
    cases = [calls[1][i + 1] for i, a in enumerate(calls[1]) if a == "--case"]
    assert cases == (tmp_path / "w/cases-left.txt").read_text().splitlines() and len(cases) == 94
    assert "--tier" not in calls[1] and calls[1].count("--backend") == 2
    files = _archive(tmp_path / "out/d25-S6.tgz")
    assert any(n.startswith("d25-s6/runs/A-rest/") for n in files)
    assert files["d25-s6/walls.tsv"].decode().splitlines()[1].split("\t")[:2] == ["A-rest", "rest"]
