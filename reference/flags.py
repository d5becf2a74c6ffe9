"""The flag and gate transforms every op applies before the recurrence, as cuDNN FE 1.32 defines them:
q/k l2norm, the beta sigmoid, the effective log-decay (log / linear domain, the safe gates), GDN2's beta guard,
and which input head each output head reads. Imports torch only; docs/ops.md states each formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layouts import ReferenceInputError

# cuDNN FE 1.32 frost/tile_dsl/pointwise.py: x * rsqrt(sum(x^2) + 1e-6).
L2NORM_EPS = 1e-6
# cuDNN FE 1.32 frost/common/gdn2_operands.py: linear gates enter as log(alpha + 1e-10) (additive,
# not a clamp as some docs put it; docs/ops.md).
LINEAR_GATE_EPS = 1e-10
DEFAULT_GATE_LOWER_BOUND = -5.0
def head_index(n_out: int, n_in: int, device=None) -> torch.Tensor:
    """Which input head each of ``n_out`` output heads reads: ``h // (n_out // n_in)``.

    This is cuDNN's grouping (FE 1.32 frost/kernel/gdn_prefill_f16.py computes the q/k/v head of output
    head h as ``h // (HO // H)``): consecutive output heads share an input head, as with
    ``repeat_interleave`` — not ``h % n_in`` (tiling).
    """
    return torch.arange(n_out, device=device) // (n_out // n_in)


def expand_heads(x: torch.Tensor, n_out: int) -> torch.Tensor:
    n_in = x.shape[1]
    return x if n_in == n_out else x.index_select(1, head_index(n_out, n_in, x.device))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


# cuDNN FE 1.32 frost/common/beta_guard.py: margin, quantization tolerance and the io dtypes' epsilons.
BETA_GUARD_MARGIN = 1.0 / 32
BETA_GUARD_QUANT_TOL_MULT = 4.0
_IO_EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def guarded_beta(beta: torch.Tensor, k_normed: torch.Tensor, g: torch.Tensor, io_dtype: torch.dtype) -> torch.Tensor:
    """GDN2's ``beta_guard``: per (token, head), keep the erase ``I - k (beta*k)^T`` non-expansive under
    this token's decay budget, exactly as cuDNN FE 1.32 frost/common/beta_guard.py specifies.

    ``beta [T, HO, K]`` (after the sigmoid), ``k_normed [T, HO, K]`` (l2-normalized), ``g [T, HO, K]`` (the
    effective log-decay). With ``w = k^2``, ``n = sum w``, ``a = sum beta w``, ``nu = sum beta^2 w`` and
    ``1/c^2 = max_d exp(g_d)^2``, a row is unsafe when ``n nu - a^2 > (c^2 - 1)(1 - (1 - a)^2 / c^2)``; it is
    shrunk toward ``mu = a / n`` by ``eta = sqrt((1 - 1/32) r2_crit / r2)``, rounded to the io dtype and
    re-tested with a quantization tolerance, falling back to the flat ``mu``. The backward is straight-through.
    """
    with torch.no_grad():
        x = beta.detach()
        w = k_normed.detach() ** 2
        n, a, nu = w.sum(-1), (x * w).sum(-1), (x * x * w).sum(-1)
        inv_c2 = torch.exp(g.detach()).amax(-1) ** 2
        c2 = 1.0 / inv_c2

        def crit(a_):
            return torch.clamp((c2 - 1.0) * (1.0 - (1.0 - a_) ** 2 * inv_c2), min=0.0)

        r2 = torch.clamp(n * nu - a * a, min=0.0)
        r2_crit = crit(a)
        unsafe = (n > 1e-20) & (r2 > r2_crit)
        inv_n = 1.0 / torch.clamp(n, min=1e-20)
        mu = a * inv_n
        eta = torch.sqrt((1.0 - BETA_GUARD_MARGIN) * r2_crit / torch.clamp(r2, min=1e-30)).clamp(0.0, 1.0)
        cand = torch.where(unsafe.unsqueeze(-1), mu.unsqueeze(-1) + eta.unsqueeze(-1) * (x - mu.unsqueeze(-1)), x)
        cand = cand.to(io_dtype).to(x.dtype)
        a_q, nu_q = (cand * w).sum(-1), (cand * cand * w).sum(-1)
        r2_q = torch.clamp(n * nu_q - a_q * a_q, min=0.0)
        tol = BETA_GUARD_QUANT_TOL_MULT * _IO_EPS.get(io_dtype, 2.0**-7) * (n * nu_q + a_q * a_q)
        fallback = unsafe & (r2_q > crit(a_q) + tol)
        mu_q = (a_q * inv_n).to(io_dtype).to(x.dtype)
        out = torch.where(fallback.unsqueeze(-1), mu_q.unsqueeze(-1).expand_as(cand), cand)
    return beta + (out - beta).detach()  # straight-through: the kernels recompute it, never differentiate it


def check_flags(spec, *, use_beta_sigmoid_in_kernel, allow_neg_eigval, gate_domain, safe_gate, a_log, dt_bias):
    if gate_domain not in ("log", "linear"):
        raise ReferenceInputError(f"gate_domain: expected 'log' or 'linear', got {gate_domain!r}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ReferenceInputError(
            "allow_neg_eigval: needs use_beta_sigmoid_in_kernel=True (beta_eff = 2*sigmoid(beta))"
        )
    if gate_domain == "linear" and safe_gate:
        raise ReferenceInputError(
            "gate_domain='linear' cannot combine with safe_gate=True (safe gate computes a log-space decay)"
        )
    for name, val in (("a_log", a_log), ("dt_bias", dt_bias)):
        if val is not None and not safe_gate:
            raise ReferenceInputError(f"{name}: only used with safe_gate=True; pass safe_gate=True or drop {name}")


def effective_log_gate(spec, g, *, gate_domain, safe_gate, a_log, dt_bias, gate_lower_bound):
    """The log-space decay the recurrence uses, at ``[T, HO]`` (gdn) or ``[T, HO, K]``."""
    if safe_gate:
        a = torch.exp(a_log) if a_log is not None else None
        x = g + dt_bias if dt_bias is not None else g
        if spec.name == "gdn":
            sp = F.softplus(x)
            return -(a * sp) if a is not None else -sp
        if a is not None:
            x = a.unsqueeze(-1) * x
        return gate_lower_bound * torch.sigmoid(x)
    if gate_domain == "linear":
        return torch.log(g + LINEAR_GATE_EPS)
    return g
