"""Session 7's two device scripts (bench/i25_s7_repro.sh, bench/serving_i26_s7.sh) on the CPU: without the qla
environment they say so, pack what they have and exit 1 (nothing is run); without OUT they refuse before anything.
The H200 results they returned are checked by tests/test_known.py and tests/test_serving_tally.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {"bench/i25_s7_repro.sh": ("D25_WORK", "d25-S7.tgz", "d25-s7"),
           "bench/serving_i26_s7.sh": ("D26_WORK", "d26-S7.tgz", "d26-s7")}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None,
                                reason="the device scripts need bash and GNU tar")


def _run(script: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    # the checkout root is the working directory on the device; S5_ROOT an empty folder: nothing installed
    base = {k: v for k, v in os.environ.items() if k not in ("OUT", "S5_ROOT")}
    return subprocess.run(["bash", str(REPO / script)], cwd=tmp_path / "checkout", env={**base, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def checkout(tmp_path):
    # a checkout without .qla: bench/s5_env.sh installs nothing
    (tmp_path / "checkout" / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench/s5_env.sh", tmp_path / "checkout" / "bench")
    return tmp_path


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_without_the_qla_environment_the_script_says_so_and_packs_its_log(script, checkout):
    work_var, archive, top = SCRIPTS[script]
    out = checkout / "out"
    out.mkdir()
    proc = _run(script, checkout, OUT=str(out), S5_ROOT=str(checkout / "s5"), **{work_var: str(checkout / "work")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the qla environment is not installed (carry .qla)" in proc.stdout
    with tarfile.open(out / archive) as tar:
        names = tar.getnames()
    assert any(n.startswith(f"{top}/") and n.endswith("script.log") for n in names), names
    assert not (checkout / "work" / "runs").exists() or not any((checkout / "work" / "runs").iterdir())


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_without_out_the_script_refuses_first(script, checkout):
    work_var = SCRIPTS[script][0]
    proc = _run(script, checkout, S5_ROOT=str(checkout / "s5"), **{work_var: str(checkout / "work")})
    assert proc.returncode != 0
    assert "OUT must name the folder results go to" in proc.stderr
    assert not (checkout / "s5").exists()
