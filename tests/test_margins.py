"""NaN margins survive every adapter's layout conversion (issue #27).

A planted kernel reads one element past the end of one of its inputs (q, k, v, g or beta), as it finds the
buffer the adapter hands it, and lets that value into its output (``out + 0 * value``: NaN poisons, any finite
memory does not). Through the runner, it must fail ``forward`` with a NaN count in every layout (thd, bshd,
sbhd, bhsd) and through every adapter (FLA, cuDNN, TE, against their contract doubles). Before the margins
survived conversion, bhsd and sbhd handed FLA a margin-less ``.contiguous()`` copy and the read went unseen.
"""

from __future__ import annotations

import pytest
import torch
from doubles import cudnn_la, fla_ops, te_la

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict
from deltacheck.harness.backends.cudnn import adapter as cudnn_adapter
from deltacheck.harness.backends.fla import adapter as fla_adapter
from deltacheck.harness.backends.te import adapter as te_adapter
from deltacheck.harness.judge import margins
from deltacheck.harness.judge.runner import CaseRunner, RunOptions, guarded

LAYOUTS = ("thd", "bshd", "sbhd", "bhsd")
NAMES = ("q", "k", "v", "g", "beta")
ARG = {n: i for i, n in enumerate(NAMES)}  # every library takes q, k, v, g, beta as its first five positionals


@pytest.fixture
def open_gate(monkeypatch):
    for cls in (cudnn_adapter.CudnnBackend, fla_adapter.FlaBackend, te_adapter.TeBackend):
        monkeypatch.setattr(cls, "pair_verdict", lambda self, op, env: Verdict.ok())


def _case(op: str, layout: str) -> Case:
    lens = (5, 3, 6) if layout == "thd" else (6, 6)
    return Case(op=op, layout=layout, seqlens=lens, H=2, HK=2, HV=2, K=32, V=32)


def _poisoned(fn, name: str):
    """``fn`` that also loads one element past the end of its input ``name`` into its output."""

    def kernel(*args, **kwargs):
        extra = margins.read_past_end(args[ARG[name]])
        out, state = fn(*args, **kwargs)
        return out + 0 * extra.to(out.dtype), state

    return kernel


def _fla(name):
    mod = fla_ops.make()
    mod.chunk_kda = _poisoned(mod.chunk_kda, name)
    return fla_adapter.FlaBackend(mod), "kda"


def _cudnn(name):
    mod = cudnn_la.make()
    mod.kimi_delta_attention = _poisoned(mod.kimi_delta_attention, name)
    return cudnn_adapter.CudnnBackend(mod, device="cpu"), "kda"


def _te(name):
    backend = te_adapter.TeBackend(te_la.make(), device="cpu")
    instance = backend._instance
    backend._instance = lambda case: _poisoned(instance(case), name)
    return backend, "gdn"  # TE 2.20 has no KDA module


ADAPTERS = {"fla": _fla, "cudnn": _cudnn, "te": _te}


def _forward(backend, case):
    runner = CaseRunner(RunOptions(reference="oracle", baseline=False))
    results = runner.run(case, backend, backend.name, Verdict.ok())
    return next(r for r in results if r.check == "forward")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_read_one_past_the_end_of_any_input_is_caught_in_every_layout(open_gate, adapter, layout):
    missed = []
    for name in NAMES:
        backend, op = ADAPTERS[adapter](name)
        case = _case(op, layout)
        forward = _forward(backend, case)
        if not (forward.status == "fail" and "NaN" in (forward.reason or "")):
            missed.append((name, forward.status, forward.reason))
    assert not missed, f"{adapter} {layout}: out-of-bounds reads not caught: {missed}"


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_the_clean_kernel_passes_and_without_margins_the_planted_read_is_missed(open_gate, adapter):
    """The other side: the same planted reader goes unseen when the runner's margin is 0 (so the test above is
    about the margin), and the clean double passes in every layout (so the margin itself breaks nothing)."""
    for layout in LAYOUTS:
        backend, op = ADAPTERS[adapter]("q")
        case = _case(op, layout)
        runner = CaseRunner(RunOptions(reference="oracle", baseline=False, margin=0))
        results = runner.run(case, backend, backend.name, Verdict.ok())
        assert next(r for r in results if r.check == "forward").status == "pass", (adapter, layout)
    clean = {"fla": lambda: fla_adapter.FlaBackend(fla_ops.make()),
             "cudnn": lambda: cudnn_adapter.CudnnBackend(cudnn_la.make(), device="cpu"),
             "te": lambda: te_adapter.TeBackend(te_la.make(), device="cpu")}[adapter]()
    op = "gdn" if adapter == "te" else "kda"
    for layout in LAYOUTS:
        assert _forward(clean, _case(op, layout)).status == "pass", (adapter, layout)


def test_with_margin_keeps_an_input_in_place_and_copies_a_conversion_into_a_guarded_buffer():
    x = guarded(torch.randn(4, 3, 2), 64)
    assert margins.has_margin(x, 64)
    assert margins.with_margin(x) is x  # already contiguous between NaN margins: no copy
    t = x.transpose(0, 1)
    y = margins.with_margin(t)
    assert y.is_contiguous() and torch.equal(y, t) and margins.has_margin(y, 64)
    z = margins.with_margin(x, torch.float64)
    assert z.dtype == torch.float64 and margins.has_margin(z, 64) and torch.equal(z, x.double())
    assert not margins.has_margin(t.contiguous(), 1)  # what the adapters used to hand over
    with margins.use(0):
        assert not margins.has_margin(margins.with_margin(t), 1)


def test_the_margin_copy_carries_gradients():
    leaf = guarded(torch.randn(3, 4, 5, dtype=torch.float64), 64).requires_grad_()
    y = margins.with_margin(leaf.transpose(1, 2))
    (y * torch.arange(y.numel(), dtype=y.dtype).view(y.shape)).sum().backward()
    want = torch.arange(y.numel(), dtype=torch.float64).view(y.shape).transpose(1, 2)
    assert torch.equal(leaf.grad, want)


def test_inputs_reach_the_runner_with_margins():
    case = _case("kda", "bhsd")
    for name, x in make_inputs(case).items():
        if x is not None and x.is_floating_point():
            assert margins.has_margin(guarded(x, 64), 64), name
