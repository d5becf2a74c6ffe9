"""Reduced parameter gradients judged for what they are.

``d a_log`` (one number per head) and ``d dt_bias`` (per head, or per head and channel) are sums over tokens (and
channels) of terms that cancel: judged element-wise against 2x a baseline, they compare one noisy draw of an
ill-conditioned sum with another. So each gets two rules (docs/verdicts.md):

(a) consistency — the kernel's reduced gradient must be the sum its *own* ``dg`` implies through the safe gate's
    chain rule, computed here in fp64. A wrong reduction (a dropped chain-rule factor) is off by O(1); an honest
    one by the rounding of the terms it summed: the limit is ``max(1e-3, 4 u(dg) rho)``, ``u(dg)`` the unit
    roundoff of the dtype the kernel returned ``dg`` in and ``rho = |sqrt(sum t^2)| / |sum t|`` (RMS over the
    reduced elements) the noise amplification of summing independently rounded terms; 1e-3 covers an fp32
    accumulation of tens of thousands of terms with that cancellation (FLA 0.6's chunk_kda: 6e-7, measured).
(b) accuracy — the usual limit, widened to ``c * baseline(dg) * kappa`` with the measured conditioning
    ``kappa = |sum |t|| / |sum t|`` (RMS over the reduced elements): a dg within its own limit can move an
    ill-conditioned sum by that much, and the kernel's dg is judged element-wise on its own check.

The chain rule, with ``x = g + dt_bias`` and ``a = exp(a_log)`` (absent: 1 and 0):
    sigmoid form (KDA, GDN2): g_eff = lb * sigmoid(a x)   d a_log = sum dg * x        d dt_bias = sum_t dg
    softplus form (GDN):      g_eff = -a * softplus(x)    d a_log = sum dg * sp(x)/sigmoid(x)   d dt_bias = sum_t dg
"""

from __future__ import annotations

import math

import torch

from deltacheck.reference import layouts

from .compare import rel_rms

F64 = torch.float64
CONSISTENCY_FLOOR = 1e-3
_UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _softplus_over_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """softplus(x) / sigmoid(x) = log1p(e^x) (1 + e^-x), which tends to 1 as x -> -inf (no 0/0 there)."""
    safe = torch.clamp(x, min=-30.0)
    return torch.where(x < -30.0, torch.ones_like(x), torch.nn.functional.softplus(safe) * (1.0 + torch.exp(-safe)))


def terms(case, inputs: dict, dg: torch.Tensor, name: str) -> torch.Tensor:
    """The terms whose sum over every axis but the parameter's is ``d name`` (``a_log`` or ``dt_bias``), from a
    ``dg`` w.r.t. the gate input; packed ``[T, HO(, K)]``, fp64."""
    g = layouts.to_thd(inputs["g"].detach(), case.layout).to(F64)
    d = layouts.to_thd(dg.detach(), case.layout).to(F64)
    if name == "dt_bias":
        return d
    dt = inputs.get("dt_bias")
    x = g + dt.detach().to(F64) if dt is not None else g
    if case.support.safe_gate_form == "softplus":
        return d * _softplus_over_sigmoid(x)
    return d * x


def _reduce(t: torch.Tensor, name: str, case) -> torch.Tensor:
    """Sum the terms down to the parameter's shape: a_log [HO]; dt_bias [HO] (GDN) or [HO, K]."""
    if name == "a_log":
        return t.reshape(t.shape[0], t.shape[1], -1).sum(dim=(0, 2))
    return t.sum(dim=0)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    n, d = float(num.pow(2).sum().sqrt()), float(den.pow(2).sum().sqrt())
    return n / d if d > 0 else math.inf


def judge_reduction(case, name: str, inputs: dict, got: torch.Tensor, kernel_dg: torch.Tensor | None,
                    ref_dg: torch.Tensor | None) -> dict:
    """The consistency verdict and the conditioning of ``d name`` (a_log or dt_bias). Returns metrics:
    ``conditioning`` (kappa, from the reference's dg), and when the kernel returned a dg, ``consistency_rel_rms``,
    ``consistency_limit`` and ``consistent``."""
    out: dict = {}
    if ref_dg is not None:
        t = terms(case, inputs, ref_dg, name)
        out["conditioning"] = _ratio(_reduce(t.abs(), name, case), _reduce(t, name, case))
    if kernel_dg is None or got is None:
        return out
    t = terms(case, inputs, kernel_dg, name)
    implied = _reduce(t, name, case)
    rho = _ratio(_reduce(t.pow(2), name, case).sqrt(), implied)
    limit = max(CONSISTENCY_FLOOR, 4.0 * _UNIT_ROUNDOFF.get(kernel_dg.dtype, 2.0**-8) * rho)
    err = rel_rms(got.detach().to(F64).reshape(implied.shape), implied)
    out.update(consistency_rel_rms=err, consistency_limit=limit, consistent=bool(math.isfinite(err) and err <= limit))
    return out
