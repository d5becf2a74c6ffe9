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


NEEDS_TRITON = pytest.mark.skipif(
    not HAS_TRITON, reason="triton is not importable (CI has none): the fused kernel needs it; install it with pip "
    "--target DIR and put DIR on PYTHONPATH to run this through its interpreter")


def _child(**env) -> dict:
    """tests/fused_child.py through Triton's interpreter with ``env`` added: its JSON (the kernel's settings, per case
    the worst rel RMS against the oracle and the PyTorch path, the kernels' call counts)."""
    full = {**ENV, "TRITON_INTERPRET": "1", **env}
    full.pop("DELTACHECK_CHUNKED_FUSED", None)
    proc = subprocess.run([sys.executable, str(TESTS / "fused_child.py")], env=full, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["interpreting"]
    return got


def _not_exact(cases: dict) -> dict:
    """The cases outside 1e-12 of the oracle or of the PyTorch path, or where the start kernel ran fewer than twice
    (the forward and the backward's recompute)."""
    return {n: c for n, c in cases.items()
            if not (isinstance(c["oracle"], float) and c["oracle"] <= TOL64 and c["kernel_calls"] >= 2
                    and isinstance(c["plain"], float) and c["plain"] <= TOL64)}


@NEEDS_TRITON
def test_the_kernel_through_the_interpreter_is_exact():
    """Every case is a forward+backward: the kernel runs in the forward and again in the backward's recompute (two
    calls at least), and output, state and every input gradient stay within 1e-12 of the oracle and of the PyTorch
    path."""
    got = _child()
    assert len(got["cases"]) >= 40
    assert not _not_exact(got["cases"]), _not_exact(got["cases"])


@NEEDS_TRITON
@pytest.mark.parametrize("spec,want", [("16x4sd", (16, 4, True, True, False, False, False)),
                                       ("8x4s", (8, 4, True, False, False, False, False)),
                                       ("8x2pt", (8, 2, False, False, True, True, False)),
                                       ("16x2sdp", (16, 2, True, True, True, False, False)),
                                       ("16x1sdpt", (16, 1, True, True, True, True, False)),
                                       ("16x4sdptl", (16, 4, True, True, True, True, True)),
                                       ("8x2ptl", (8, 2, False, False, True, True, True))])
def test_the_kernels_other_settings_are_exact(spec, want):
    """The settings the default does not take (exp of the interval sums instead of products, A's pairs written out
    and T's small levels in PyTorch as in session 6's default 16x2sdp, broadcast sums instead of tl.dot, masked sums
    instead of scans, the levels unrolled or as a loop), on the core's cases: the same bounds."""
    got = _child(FUSED_CHILD_CASES="core", DELTACHECK_CHUNKED_FUSED_CONFIG=spec)
    assert tuple(got["config"]) == want and len(got["cases"]) == 5
    assert not _not_exact(got["cases"]), _not_exact(got["cases"])


@NEEDS_TRITON
def test_the_handoff_kernel_through_the_interpreter_is_exact():
    """The opt-in hand-off kernel (DELTACHECK_CHUNKED_HANDOFF_KERNEL=1) on the core's cases: it runs (in every
    forward), and output, state and every input gradient stay within 1e-12 of the oracle and the PyTorch path."""
    got = _child(FUSED_CHILD_CASES="core", DELTACHECK_CHUNKED_HANDOFF_KERNEL="1")
    assert got["handoff"] is True and len(got["cases"]) == 5 and got["handoff_calls"] >= 5
    assert not _not_exact(got["cases"]), _not_exact(got["cases"])


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable (CI has none): compiling the kernel for sm_90 "
                    "needs it (no GPU needed); install it with pip --target DIR and put DIR on PYTHONPATH")
def test_the_handoff_kernel_compiles_for_hopper_with_fp64_mma():
    """Compiled for sm_90 off-device at the benchmark's shape (K = V = 128, 16 chunks a slice): the products are
    fp64 tensor-core MMAs, not a scalar fallback."""
    import triton
    from triton.backends.compiler import GPUTarget

    sig = {"p_ptr": "*fp64", "st_ptr": "*fp64", "NC": "constexpr", "NH": "i32", "K": "constexpr", "V": "constexpr",
           "KP": "constexpr", "KB": "constexpr", "VT": "constexpr"}
    consts = {"NC": 16, "K": 128, "V": 128, "KP": 128, "KB": chunked_fused.HANDOFF_KB, "VT": chunked_fused.HANDOFF_VT}
    src = triton.compiler.ASTSource(fn=chunked_fused._handoff, signature=sig, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": chunked_fused.HANDOFF_WARPS}).asm["ptx"]
    assert "mma.sync.aligned" in ptx and ".f64.f64.f64.f64" in ptx


def test_the_handoff_kernel_is_opt_in_and_only_where_the_fused_kernel_runs(monkeypatch):
    """Off unless asked for (the constant, else the environment variable); never on CPU tensors outside the
    interpreter, never in another dtype, never once the fused kernel is off or has failed."""
    monkeypatch.delenv("DELTACHECK_CHUNKED_HANDOFF_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert chunked_fused.HANDOFF is None and not chunked_fused.handoff_enabled()
    monkeypatch.setenv("DELTACHECK_CHUNKED_HANDOFF_KERNEL", "1")
    assert chunked_fused.handoff_enabled()
    monkeypatch.setattr(chunked_fused, "HANDOFF", False)
    assert not chunked_fused.handoff_enabled()
    monkeypatch.setattr(chunked_fused, "HANDOFF", True)
    p, st = torch.zeros(2, 1, 4, 4, dtype=torch.float64), torch.zeros(3, 1, 4, 4, dtype=torch.float64)
    assert not chunked_fused.handoff_applies(p, st)  # CPU tensors, no interpreter (and in CI no Triton)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert chunked_fused.handoff_applies(p, st) is (chunked_fused.triton is not None)
    assert not chunked_fused.handoff_applies(p.float(), st.float())
    monkeypatch.setattr(chunked_fused, "FUSED", False)
    assert not chunked_fused.handoff_applies(p, st)


def test_a_failing_handoff_kernel_falls_back_to_one_product_per_chunk(monkeypatch):
    """A hand-off kernel that cannot compile warns once, is off from then on, and the states are the per-chunk
    products' exactly; the start kernel stays on."""
    from deltacheck.reference import chunked_segments

    monkeypatch.setattr(chunked_fused, "HANDOFF_FAILED", None)
    monkeypatch.setattr(chunked_fused, "handoff_applies", lambda p, st: chunked_fused.HANDOFF_FAILED is None)

    def broken(p, states):
        raise RuntimeError("no fp64 tl.dot here")

    monkeypatch.setattr(chunked_fused, "handoff_scan", broken)
    g = torch.Generator().manual_seed(3)
    p = torch.randn(4, 2, 6, 6, dtype=torch.float64, generator=g)
    st = torch.randn(5, 2, 6, 3, dtype=torch.float64, generator=g)
    want = st.clone()
    for c in range(4):
        want[c + 1] = torch.baddbmm(want[c + 1], p[c], want[c])
    with pytest.warns(UserWarning, match="hand-off kernel failed"):
        chunked_segments._run_states(p, st)
    assert torch.equal(st, want)
    assert "no fp64 tl.dot" in chunked_fused.HANDOFF_FAILED and chunked_fused.FAILED is None


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
