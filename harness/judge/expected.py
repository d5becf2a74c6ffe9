"""The reference side of a case, computed once per case: the fp64 reference's output, final state and input
gradients, and the same-precision baseline's error against them (the yardstick of the baseline rule,
docs/verdicts.md).

The loss for gradients is ``(out * Wo).sum() + (state * Ws).sum()`` with random fp32 weights drawn from the
case's own streams (``cases.make_weights``), as TransformerEngine's GDN2 tests do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from deltacheck.cases import Case, make_inputs, make_weights
from deltacheck.reference import layouts

from ..backends.base import Backend, backend_for
from . import compare
from .checks import grad_inputs

F64 = torch.float64
GRAD_NAMES = {
    "q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "w": "dw",
    "initial_state": "dh0", "a_log": "da_log", "dt_bias": "ddt_bias",
}
# Above this many tokens the token oracle is too slow to be the reference; the fp64 chunked
# reference (verified against the oracle to 1e-12) takes over.
ORACLE_MAX_TOKENS = 2048


class ReferenceFailure(Exception):
    """The reference side of a case could not be computed (never blamed on the backend under test)."""


@dataclass
class Expected:
    out: torch.Tensor  # packed [T, HO, V], fp64
    state: torch.Tensor  # [N, HO, K, V], fp64
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    baseline_err: dict[str, float] = field(default_factory=dict)
    reference: str = ""
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # reference, baseline: seconds each took


def grad_leaves(inputs: dict, names: list[str], dtype=None) -> dict:
    """Fresh grad-requiring leaves for ``names`` (optionally cast), other entries passed through."""
    out = dict(inputs)
    for n in names:
        x = inputs[n]
        x = x.detach().to(dtype) if dtype is not None else x.detach().clone()
        out[n] = x.requires_grad_()
    return out


def weighted_loss(case: Case, out: torch.Tensor, state: torch.Tensor, device) -> torch.Tensor:
    wo, ws = make_weights(case, out.shape, state.shape, device=device)
    return (out.to(F64) * wo.to(F64)).sum() + (state.to(F64) * ws.to(F64)).sum()


def input_grads(loss: torch.Tensor, leaves: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """d loss / d each leaf (None where the loss does not depend on it), through ``loss.backward()`` as a
    training step takes it: ``torch.autograd.grad`` is refused by reentrant activation checkpointing (TE's
    ``checkpoint_core_attention=True``: "Checkpointing is not compatible with .grad()")."""
    for x in leaves.values():
        x.grad = None
    loss.backward()
    return {n: x.grad for n, x in leaves.items()}


def forward_backward(backend: Backend, case: Case, inputs: dict, names: list[str], device):
    out, state = backend.run(case, inputs)
    grads = input_grads(weighted_loss(case, out, state, device), {n: inputs[n] for n in names}) if names else {}
    return out, state, grads


def reference_name(case: Case, mode: str, subject: str = "") -> str:
    """The fp64 reference for ``case``; in auto mode never the backend under test itself, so the
    chunked reference is always judged by the oracle and vice versa."""
    if mode != "auto":
        return mode
    name = "oracle" if case.total_tokens <= ORACLE_MAX_TOKENS else "chunked"
    if name == subject:
        name = "chunked" if name == "oracle" else "oracle"
    return name


def compute_expected(case: Case, opts, ref_name: str) -> Expected:
    """The reference ``ref_name`` on ``case`` (fp64), and the baseline's errors when ``opts.baseline``."""
    t0 = time.perf_counter()
    base = make_inputs(case, opts.device)
    names = grad_inputs(case) if case.backward else []
    ref = backend_for(ref_name)
    float_names = [n for n, x in base.items() if x is not None and x.is_floating_point()]
    ref_inputs = grad_leaves(base, float_names, F64) if names else {
        n: (x.to(F64) if n in float_names else x) for n, x in base.items()
    }
    with torch.set_grad_enabled(bool(names)):
        out, state, grads = forward_backward(ref, case, ref_inputs, names, opts.device)
    synchronize(opts.device)
    t_ref = time.perf_counter()
    exp = Expected(
        out=layouts.to_thd(out, case.layout).detach().to(F64), state=state.detach().to(F64),
        grads={n: (g.detach() if g is not None else None) for n, g in grads.items()}, reference=ref_name,
    )
    if opts.baseline:
        bl = backend_for("baseline")
        bl_inputs = grad_leaves(base, names) if names else base
        with torch.set_grad_enabled(bool(names)):
            b_out, b_state, b_grads = forward_backward(bl, case, bl_inputs, names, opts.device)
        exp.baseline_err["out"] = compare.rel_rms(layouts.to_thd(b_out, case.layout), exp.out)
        exp.baseline_err["state"] = compare.rel_rms(b_state, exp.state)
        for n, g in b_grads.items():
            if g is not None and exp.grads.get(n) is not None:
                exp.baseline_err[GRAD_NAMES[n]] = compare.rel_rms(g, exp.grads[n])
    synchronize(opts.device)
    exp.seconds = time.perf_counter() - t0
    exp.phases = {"reference": t_ref - t0, "baseline": exp.seconds - (t_ref - t0)}
    return exp


def synchronize(device) -> None:
    """Wait for the device's queued work, so a phase's time is its own (CUDA launches are asynchronous)."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()
