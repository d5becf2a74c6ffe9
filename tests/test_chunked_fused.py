"""The fused fp64 kernel of the chunked forward (reference/chunked_fused.py, issue 28): where it applies, and its
results through Triton's interpreter against the token oracle and the PyTorch path.

CI has no Triton (and no GPU): there the interpreter test skips with that reason, and the kernel never runs on the
CPU path, which the first tests check. With Triton importable (``pip install --target DIR triton``, DIR on
PYTHONPATH) the interpreter test runs the kernel on CPU tensors in a child process (TRITON_INTERPRET=1 has to be
set before triton is imported)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from child_env import ENV, HANG_GUARD_S, TESTS
import torch

from deltacheck.reference import chunked_fused
from deltacheck.reference.chunked import chunked_gdn2

TOL64 = 1e-12
HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_the_cpu_path_never_takes_the_kernel(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.zeros(1, 64, 1, 8, dtype=torch.float64)
    for flag in (None, True, False):
        monkeypatch.setattr(chunked_fused, "FUSED", flag)
        assert not chunked_fused.applies(x, 64)

    def boom(*a, **k):
        raise AssertionError("the fused kernel ran on the CPU path")

    monkeypatch.setattr(chunked_fused, "start", boom)
    ins = [torch.randn(1, 40, 2, 8, dtype=torch.float64) for _ in range(3)]
    ins[2] = ins[2][..., :5]
    ins += [-torch.rand(1, 40, 2, 8, dtype=torch.float64), torch.rand(1, 40, 2, 8, dtype=torch.float64),
            torch.rand(1, 40, 2, 5, dtype=torch.float64), torch.randn(1, 2, 8, 5, dtype=torch.float64)]
    with torch.no_grad():
        o, s = chunked_gdn2(*ins, 0.5, chunk_size=16)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()


def test_the_reference_imports_and_runs_without_triton():
    """With triton unimportable (CI), the reference imports, says why the kernel is off, and computes."""
    code = ("import sys\nsys.modules['triton'] = None\n"
            "import torch\nfrom deltacheck.reference import chunked_fused\n"
            "from deltacheck.reference.chunked import chunked_gdn2\n"
            "q, k, v, g, b, w = (torch.rand(1, 20, 1, 4, dtype=torch.float64) for _ in range(6))\n"
            "o, s = chunked_gdn2(q, k, v, -g, b, w, torch.rand(1, 1, 4, 4, dtype=torch.float64), 0.5, chunk_size=16)\n"
            "print(chunked_fused.triton, chunked_fused.describe(), bool(o.isfinite().all()))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("None fused kernel unavailable (triton not importable") and "True" in proc.stdout


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), (" 0 ", False)])
def test_the_switch(monkeypatch, value, on):
    monkeypatch.setattr(chunked_fused, "FUSED", None)
    if value is None:
        monkeypatch.delenv("DELTACHECK_CHUNKED_FUSED", raising=False)
    else:
        monkeypatch.setenv("DELTACHECK_CHUNKED_FUSED", value)
    assert chunked_fused.enabled() is on
    monkeypatch.setattr(chunked_fused, "FUSED", not on)
    assert chunked_fused.enabled() is (not on)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable (CI has none): the fused kernel needs it; "
                    "install it with pip --target DIR and put DIR on PYTHONPATH to run this through its interpreter")
def test_the_kernel_through_the_interpreter_is_exact():
    """Every case is a forward+backward: the kernel runs in the forward and again in the backward's recompute (two
    calls at least), and output, state and every input gradient stay within 1e-12 of the oracle and of the PyTorch
    path."""
    env = {**ENV, "TRITON_INTERPRET": "1"}
    env.pop("DELTACHECK_CHUNKED_FUSED", None)
    proc = subprocess.run([sys.executable, str(TESTS / "fused_child.py")], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["interpreting"]
    assert len(got["cases"]) >= 40
    bad = {n: c for n, c in got["cases"].items()
           if not (isinstance(c["oracle"], float) and c["oracle"] <= TOL64 and c["kernel_calls"] >= 2
                   and isinstance(c["plain"], float) and c["plain"] <= TOL64)}
    assert not bad, bad


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable (CI has none): the fused kernel needs it; "
                    "install it with pip --target DIR and put DIR on PYTHONPATH to run this through its interpreter")
@pytest.mark.parametrize("spec,want", [("16x4sd", (16, 4, True, True, False, False)),
                                       ("8x4s", (8, 4, True, False, False, False)),
                                       ("8x2pt", (8, 2, False, False, True, True)),
                                       ("16x2sdp", (16, 2, True, True, True, False))])
def test_the_kernels_other_settings_are_exact(spec, want):
    """The settings the default does not take (exp of the interval sums instead of products, A's pairs written out
    and T's small levels in PyTorch (session 6's default, 16x2sdp), broadcast sums instead of tl.dot, masked sums instead of scans), on the core's
    cases: the same bounds."""
    env = {**ENV, "TRITON_INTERPRET": "1", "FUSED_CHILD_CASES": "core", "DELTACHECK_CHUNKED_FUSED_CONFIG": spec}
    env.pop("DELTACHECK_CHUNKED_FUSED", None)
    proc = subprocess.run([sys.executable, str(TESTS / "fused_child.py")], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["interpreting"] and tuple(got["config"]) == want
    assert len(got["cases"]) == 5
    bad = {n: c for n, c in got["cases"].items()
           if not (isinstance(c["oracle"], float) and c["oracle"] <= TOL64 and c["kernel_calls"] >= 2
                   and isinstance(c["plain"], float) and c["plain"] <= TOL64)}
    assert not bad, bad


def test_a_failing_kernel_falls_back_to_the_pytorch_path(monkeypatch):
    """A kernel that cannot compile or run (say, no fp64 exp on some GPU) warns once, is off for the process, and the
    result is the PyTorch path's, bit for bit."""
    monkeypatch.setattr(chunked_fused, "FAILED", None)
    monkeypatch.setattr(chunked_fused, "applies", lambda x, chunk: chunked_fused.FAILED is None)

    def broken(*a, **k):
        raise RuntimeError("no fp64 exp here")

    monkeypatch.setattr(chunked_fused, "start", broken)
    gen = torch.Generator().manual_seed(3)
    ins = [torch.randn(1, 40, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3)]
    ins += [-torch.rand(1, 40, 2, 8, generator=gen, dtype=torch.float64),
            torch.rand(1, 40, 2, 8, generator=gen, dtype=torch.float64),
            torch.rand(1, 40, 2, 8, generator=gen, dtype=torch.float64),
            torch.randn(1, 2, 8, 8, generator=gen, dtype=torch.float64)]
    with pytest.warns(UserWarning, match="fused fp64 kernel failed .*no fp64 exp"), torch.no_grad():
        o, s = chunked_gdn2(*ins, 0.5, chunk_size=16)
    assert "no fp64 exp" in chunked_fused.FAILED and "failed" in chunked_fused.describe()
    monkeypatch.setattr(chunked_fused, "applies", lambda x, chunk: False)
    with torch.no_grad():
        o2, s2 = chunked_gdn2(*ins, 0.5, chunk_size=16)
    assert torch.equal(o, o2) and torch.equal(s, s2)
