"""Metrics, the tolerance table, and error localization. The one place where numbers are judged.

Metric: relative RMS ``sqrt(mean((a - ref)^2)) / sqrt(mean(ref^2))`` against the fp64 reference,
computed in fp64 (the metric every peer uses: TE, cuDNN FE, FLA). A check passes when its error is
within the *limit*::

    limit = min(threshold, max(c * baseline, floor))

``threshold`` is the absolute table entry; ``baseline`` is the error of a same-precision PyTorch run
(the chunked reference computing in the io dtype) against the same fp64 reference, as FlashAttention
judges kernels; ``floor`` (k times the io dtype's unit roundoff, derived below) keeps a near-zero baseline from
failing good kernels spuriously. Without a baseline the limit is the threshold. ``headroom = error / limit``
(< 1 passes). docs/verdicts.md explains each rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from deltacheck.cases.support import OPS

F64 = torch.float64


# FLA's assert_close passes at once when the largest absolute error is <= 1e-6: a quantity that is
# itself negligible (dbeta through a saturated sigmoid, dk when beta ~ 1e-13) has no meaningful
# relative error, and every finite-precision kernel rounds it to exactly 0 (rel RMS 1.0).
NEGLIGIBLE_MAX_ABS = 1e-6


@dataclass(frozen=True)
class Tolerance:
    threshold: float  # absolute relative-RMS bound
    c: float  # allowed multiple of the same-precision baseline's error
    floor: float  # lowest baseline-relative limit
    source: str


# Floors, derived from each io dtype's unit roundoff u (the relative error of one round-to-nearest: bf16 has
# 8 significant bits, u = 2^-8 = 3.9e-3; fp16 has 11, u = 2^-11 = 4.9e-4). A kernel that computes in fp32 and
# stores its result in the io dtype is at best ~u/sqrt(3) off (uniform rounding error); every intermediate it
# keeps in the io dtype adds about as much again. So a floor is k * u with k counting those roundings: k = 1.28
# for outputs and states (5e-3 in bf16, the floor measured-good kernels clear: cuDNN KDA and FLA GDN/KDA/GDN2
# land at 3e-3..5e-3 in bf16 on the H200), 2.56 for input gradients (two more roundings on the way back), 3.84
# for the gate-side and state gradients (reductions over tokens). fp16 gets the same k at its own u — 8x
# tighter than bf16, not the 2x the peers' absolute thresholds differ by: a precision bug of 5-10x the baseline
# (a bf16 step inside an fp16 kernel) must not hide under a bf16-sized floor.
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
K_OUT, K_GRAD, K_GATE_GRAD = 1.28, 2.56, 3.84


def _floor(k: float, dtype: str) -> float:
    return k * UNIT_ROUNDOFF[dtype]


# Forward output / final state / continuation. Thresholds bf16 2e-2, fp16 1e-2: TE 2.20 GDN2 tests and cuDNN FE
# tests agree. c = 2 as FlashAttention.
_FWD = {
    "bf16": Tolerance(2e-2, 2.0, _floor(K_OUT, "bf16"), "TE GDN2 / cuDNN FE tests: bf16 out/state 2e-2"),
    "fp16": Tolerance(1e-2, 2.0, _floor(K_OUT, "fp16"), "TE GDN2 / cuDNN FE tests: fp16 out/state 1e-2"),
}
# Input gradients dq, dk, dv, dg: TE bf16 4e-2 / fp16 2e-2; cuDNN FE 4e-2 / 3e-2. We take TE's stricter fp16.
_BWD = {
    "bf16": Tolerance(4e-2, 2.0, _floor(K_GRAD, "bf16"), "TE GDN2 + cuDNN FE tests: bf16 dq/dk/dv/dg 4e-2"),
    "fp16": Tolerance(2e-2, 2.0, _floor(K_GRAD, "fp16"), "TE GDN2 tests: fp16 dq/dk/dv/dg 2e-2 (cuDNN FE allows 3e-2)"),
}
# dbeta, dw: TE 6e-2 / 3e-2. dh0: cuDNN FE 6e-2 (both dtypes). da_log, ddt_bias: no peer publishes one;
# they are reductions of dg over tokens (and channels), so we hold them to dbeta's bound.
_GATE_BWD = {
    "bf16": Tolerance(6e-2, 2.0, _floor(K_GATE_GRAD, "bf16"), "TE GDN2 tests: bf16 dbeta/dw 6e-2"),
    "fp16": Tolerance(3e-2, 2.0, _floor(K_GATE_GRAD, "fp16"), "TE GDN2 tests: fp16 dbeta/dw 3e-2"),
}
_DH0 = {
    "bf16": Tolerance(6e-2, 2.0, _floor(K_GATE_GRAD, "bf16"), "cuDNN FE tests: dh0 6e-2"),
    "fp16": Tolerance(6e-2, 2.0, _floor(K_GATE_GRAD, "fp16"), "cuDNN FE tests: dh0 6e-2"),
}

QUANTITIES = {
    "out": _FWD, "state": _FWD,
    "dq": _BWD, "dk": _BWD, "dv": _BWD, "dg": _BWD,
    "dbeta": _GATE_BWD, "dw": _GATE_BWD, "da_log": _GATE_BWD, "ddt_bias": _GATE_BWD,
    "dh0": _DH0,
}

# One table: op x io dtype x quantity. The ops share today's entries (every peer uses one bound for all
# three); it is keyed by op so that a per-op finding can tighten or document one entry without a rewrite.
TOLERANCES: dict[tuple[str, str, str], Tolerance] = {
    (op, dtype, qty): table[dtype] for op in OPS for qty, table in QUANTITIES.items() for dtype in table
}


def tolerance(op: str, io_dtype: str, quantity: str) -> Tolerance:
    try:
        return TOLERANCES[(op, io_dtype, quantity)]
    except KeyError:
        raise KeyError(f"no tolerance for op={op!r} io_dtype={io_dtype!r} quantity={quantity!r}") from None


def rel_rms(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error in fp64; with an all-zero reference, the plain RMS error."""
    a, r = actual.detach().to(F64), ref.detach().to(F64)
    num = (a - r).pow(2).mean().sqrt().item() if r.numel() else 0.0
    den = r.pow(2).mean().sqrt().item() if r.numel() else 0.0
    return num / den if den > 0 else num


def metrics(actual: torch.Tensor, ref: torch.Tensor) -> dict:
    """rel RMS, max abs, NaN/Inf counts, cosine similarity; NaN/Inf-safe."""
    a, r = actual.detach().to(F64), ref.detach().to(F64)
    if a.shape != r.shape:
        return {"shape_mismatch": f"{list(a.shape)} vs reference {list(r.shape)}", "rel_rms": math.inf}
    nan, inf = int(torch.isnan(a).sum()), int(torch.isinf(a).sum())
    finite = torch.isfinite(a)
    clean = torch.where(finite, a, torch.zeros_like(a))
    diff = (clean - r).abs()
    err = rel_rms(clean, r) if (nan + inf) == 0 else math.inf
    denom = clean.norm() * r.norm()
    cosine = float((clean * r).sum() / denom) if denom > 0 else (1.0 if clean.norm() == r.norm() else 0.0)
    return {
        "rel_rms": err,
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "nan": nan,
        "inf": inf,
        "cosine": cosine,
    }


def judge(op: str, io_dtype: str, quantity: str, error: float, baseline: float | None,
          max_abs: float | None = None, carried: str | None = None, at_least: float | None = None) -> dict:
    """Limit, headroom and pass/fail for one error; the entry's provenance travels with it.

    ``max_abs`` (the largest absolute error) at or below ``NEGLIGIBLE_MAX_ABS`` passes outright, as in FLA.
    ``floor_judged``: the limit is the floor (the baseline was so good that ``c * baseline`` fell below it), so
    the verdict rests on the dtype's floor, not on the baseline. ``ill_posed``: the same-precision baseline
    itself misses the threshold, so the check judges the case at this precision more than the kernel; an error
    over the threshold but within ``c * baseline`` is then reported as ill-posed (never a pass), and only an
    error worse than that (or non-finite) fails. ``carried``: a dtype the quantity was also rounded to on its
    way (a bf16 state returned, or carried between calls, in an fp16 case): the floor is the coarser dtype's.
    """
    tol = tolerance(op, io_dtype, quantity)
    if carried in UNIT_ROUNDOFF and UNIT_ROUNDOFF[carried] > UNIT_ROUNDOFF[io_dtype]:
        tol = replace(tol, floor=tol.floor * UNIT_ROUNDOFF[carried] / UNIT_ROUNDOFF[io_dtype])
    limit = tol.threshold
    floor_judged = False
    if baseline is not None and math.isfinite(baseline):
        relative = max(tol.c * baseline, tol.floor)
        floor_judged = tol.c * baseline < tol.floor < tol.threshold
        limit = min(tol.threshold, relative)
    if at_least is not None and math.isfinite(at_least) and at_least > limit:
        # a reduced gradient's conditioning (harness/judge/reductions.py): the limit a good dg allows the sum to move
        limit = at_least
    ill_posed = baseline is not None and not (math.isfinite(baseline) and baseline <= tol.threshold)
    headroom = error / limit if limit > 0 else math.inf
    negligible = max_abs is not None and max_abs <= NEGLIGIBLE_MAX_ABS
    passed = (math.isfinite(error) and error <= limit) or negligible
    if negligible and not (math.isfinite(error) and error <= limit):
        # Passed on the absolute rule: its headroom is measured against that rule, so it stays < 1.
        headroom = max_abs / NEGLIGIBLE_MAX_ABS
    within_baseline = (ill_posed and not passed and math.isfinite(error) and
                       (not math.isfinite(baseline) or error <= tol.c * baseline))
    return {
        "threshold": tol.threshold,
        "baseline": baseline,
        "limit": limit,
        "headroom": headroom,
        "passed": passed,
        "negligible": negligible,
        "floor_judged": floor_judged and passed and not negligible,
        "ill_posed": within_baseline,
        "tolerance_source": tol.source,
    }


def localize(actual: torch.Tensor, ref: torch.Tensor, offsets: list[int], limit: float, max_points: int = 200) -> dict:
    """Where an output error lives. ``actual``/``ref`` are packed ``[T, HO, V]``; ``offsets`` the
    sequence boundaries.

    Returns the worst sequence and head (by relative RMS), the first token at which the running
    relative error of some (sequence, head) crosses ``limit`` (None if none does), and a per-token
    error curve (RMS over heads and channels of the error at each token, relative to the RMS of the
    whole reference), downsampled to at most ``max_points`` points.
    """
    a, r = actual.detach().to(F64), ref.detach().to(F64)
    a = torch.where(torch.isfinite(a), a, torch.full_like(a, math.inf))
    T = a.shape[0]
    if T == 0:
        return {"worst_seq": None, "worst_head": None, "first_bad_token": None, "token_curve": []}
    err2 = (a - r).pow(2)  # [T, HO, V]
    ref2 = r.pow(2)
    scale = ref2.mean().sqrt().item() or 1.0
    token_err = err2.mean(dim=(1, 2)).sqrt() / scale
    step = max(1, math.ceil(T / max_points))
    curve = [[t, _finite_or_str(float(token_err[t:t + step].max()))] for t in range(0, T, step)]

    head_err = (err2.sum(dim=(0, 2)) / ref2.sum(dim=(0, 2)).clamp_min(1e-300)).sqrt()
    worst_head = int(torch.nan_to_num(head_err, nan=math.inf).argmax())
    seq_errs = []
    first_bad = None
    for s, e in zip(offsets[:-1], offsets[1:]):
        if e == s:
            seq_errs.append(0.0)
            continue
        e2, r2 = err2[s:e].sum(-1), ref2[s:e].sum(-1)  # [L, HO]
        seq_errs.append(float((e2.sum() / r2.sum().clamp_min(1e-300)).sqrt()))
        running = (e2.cumsum(0) / r2.cumsum(0).clamp_min(1e-300)).sqrt()  # [L, HO]
        crossed = (running > limit).any(dim=1).nonzero()
        if crossed.numel():
            tok = s + int(crossed[0])
            first_bad = tok if first_bad is None else min(first_bad, tok)
    worst_seq = max(range(len(seq_errs)), key=lambda i: seq_errs[i]) if seq_errs else None
    return {"worst_seq": worst_seq, "worst_head": worst_head, "first_bad_token": first_bad, "token_curve": curve}


def _finite_or_str(x: float):
    return x if math.isfinite(x) else str(x)


def kind_of_wrong(quantity: str, actual: torch.Tensor, ref: torch.Tensor, limit: float, *,
                  scale: float | None = None, without_h0: Callable[[], tuple] | None = None) -> str:
    """A name for the commonest adapter bugs, where naming one is cheap: ``actual`` (a failing ``out`` or final
    ``state``) matches, within ``limit``, the reference transposed (the state's orientation), the reference with
    the scale dropped or applied twice, or the reference run without the initial state (``without_h0()`` gives
    that run's ``(out, state)``; called only when nothing cheaper fits). '' when none fits."""
    a = actual.detach().to(F64)
    if not bool(torch.isfinite(a).all()):
        return ""

    def fits(candidate: torch.Tensor) -> bool:
        candidate = candidate.detach().to(F64)
        return candidate.shape == a.shape and rel_rms(a, candidate) <= limit

    if quantity == "state" and ref.dim() >= 2 and fits(ref.transpose(-1, -2)):
        return ("the final state matches the reference's transpose: value-major [N, HO, V, K] returned where "
                "key-major [N, HO, K, V] is promised (the adapter must convert the kernel's state orientation)")
    if quantity == "out" and scale is not None and scale != 1.0:
        if fits(ref / scale):
            return f"the output matches the reference with the scale dropped (out / {scale:g}: scale not applied)"
        if fits(ref * scale):
            return f"the output matches the reference with the scale applied twice (out x {scale:g})"
    if without_h0 is not None:
        out0, state0 = without_h0()
        if fits(out0 if quantity == "out" else state0):
            return (f"the {'output' if quantity == 'out' else 'final state'} matches the reference run without "
                    "the initial state (initial_state dropped)")
    return ""


# --- detection power: how small a bug the check still sees ----------------------------------------------------------

DETECT_LO, DETECT_HI, DETECT_STEPS = 1e-7, 10.0, 40


def detection_delta(actual: torch.Tensor, ref: torch.Tensor, fails, seed: int) -> float | None:
    """The smallest relative perturbation ``delta`` of the kernel's own result that fails the check: ``actual``
    plus seeded Gaussian noise scaled to ``delta`` times ``actual``'s RMS, judged by ``fails(rel_rms, max_abs)``
    (the check's own rule, which reads ``max_abs`` only against ``NEGLIGIBLE_MAX_ABS``), ``delta`` found by bisection
    in log space over [1e-7, 10] (no second kernel call).
    0.0 when the result already fails; inf when even ``delta`` = 10 passes; None when there is nothing to perturb
    (shapes differ, non-finite values, an empty or all-zero result)."""
    a, r = actual.detach().to(F64), ref.detach().to(F64)
    if a.shape != r.shape or a.numel() == 0 or not bool(torch.isfinite(a).all()):
        return None
    scale = a.pow(2).mean().sqrt().item()
    if scale == 0:
        return None
    gen = torch.Generator(device=a.device).manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    noise = torch.randn(a.shape, generator=gen, dtype=F64, device=a.device)
    noise *= scale / noise.pow(2).mean().sqrt().item()
    err = a - r
    den = r.pow(2).mean().sqrt().item()
    # mean((err + delta*noise)^2) = A + 2 delta B + delta^2 C: three reductions, then every step is arithmetic
    A, B, C = err.pow(2).mean().item(), (err * noise).mean().item(), noise.pow(2).mean().item()
    e_max, n_max = float(err.abs().max()), float(noise.abs().max())

    def fails_at(delta: float) -> bool:
        num = math.sqrt(max(A + 2 * delta * B + delta * delta * C, 0.0))
        # max |err + delta*noise| only decides the negligible rule (<= NEGLIGIBLE_MAX_ABS): a lower bound above it
        # decides the same, so the tensor is only read where the rule could apply
        low = max(delta * n_max - e_max, e_max - delta * n_max, 0.0)
        max_abs = low if low > NEGLIGIBLE_MAX_ABS else float((err + delta * noise).abs().max())
        return bool(fails(num / den if den > 0 else num, max_abs))

    if fails_at(0.0):
        return 0.0
    if not fails_at(DETECT_HI):
        return math.inf
    lo, hi = math.log(DETECT_LO), math.log(DETECT_HI)
    if fails_at(DETECT_LO):
        return DETECT_LO
    for _ in range(DETECT_STEPS):  # ~1.2% resolution in delta
        mid = (lo + hi) / 2
        if fails_at(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)
