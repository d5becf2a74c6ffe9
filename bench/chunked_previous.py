"""The chunked reference as it was before issue 17 (commit 8194eba, reference/chunked.py), frozen here so that
bench/chunked.py can time it side by side with the current one (``--no-previous`` skips it). Not used by
deltacheck itself; only its module docstring is new.

Same algorithm and numerics (recursive halving with exponent sums, fp64 gates), but every level
recomputes its decay factors with cumulative sums and flips, T and M are assembled with concatenations, and
the backward is autograd replaying ``torch.utils.checkpoint`` segments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Working-set target for one segment: N*H*tokens*max(K, V)*itemsize bytes per activation-sized tensor.
DEFAULT_SEGMENT_BYTES = 32 * 2**20


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _excl_rev_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``y_j = sum_{t > j} x_t`` along dim -2, as a direct sum (no subtraction)."""
    if x.shape[-2] == 1:
        return torch.zeros_like(x)
    tail = x[..., 1:, :].flip(-2).cumsum(-2).flip(-2)
    return F.pad(tail, (0, 0, 0, 1))


def _assemble(d0: torch.Tensor, off: torch.Tensor, d1: torch.Tensor) -> torch.Tensor:
    """``[[d0, 0], [off, d1]]`` over the last two dims."""
    top = torch.cat([d0, torch.zeros_like(d0)], -1)
    bottom = torch.cat([off, d1], -1)
    return torch.cat([top, bottom], -2)


def _intra(q, k, v, g, b, w, gate_dtype):
    """Intra-chunk work for a batch of chunks: inputs ``[B, C, D]`` (q pre-scaled, padded).

    Returns ``(Oi [B,C,V], Qe [B,C,K], P [B,K,K], Hh [B,K,V])`` such that, for a chunk with start state
    S0, ``o = Oi + Qe S0`` and ``S_end = P S0 + Hh``.
    """
    B, C, K = k.shape
    cd = k.dtype
    kb = k * b
    g = g.to(gate_dtype)
    Kg = g.shape[-1]

    # Level 0 (the diagonal): T = (I + A)^-1 has ones, M has q_i . k_i. Level s joins the two halves of
    # every aligned 2s-block: rows of the second half meet columns of the first half through the anchor
    # r = the last row of the first half, exp([i..j]) = exp([i..r]) * exp([r..j]), both factors <= 1.
    Tcur = torch.ones(B, C, 1, 1, dtype=cd, device=k.device)
    Mcur = (q * k).sum(-1)[..., None, None]
    s = 1
    while s < C:
        nb = C // (2 * s)
        gv = g.reshape(B, nb, 2, s, Kg)
        e_row = gv[:, :, 1].cumsum(-2).exp().to(cd)  # exp([i..r]), i in the second half
        e_col = _excl_rev_cumsum(gv[:, :, 0]).exp().to(cd)  # exp([r..j]), j in the first half
        k_col = (k.reshape(B, nb, 2, s, K)[:, :, 0] * e_col).transpose(-1, -2)  # [B, nb, K, s]
        xa = (kb.reshape(B, nb, 2, s, K)[:, :, 1] * e_row) @ k_col  # A block [B, nb, s, s]
        xm = (q.reshape(B, nb, 2, s, K)[:, :, 1] * e_row) @ k_col  # M block
        tv = Tcur.reshape(B, nb, 2, s, s)
        mv = Mcur.reshape(B, nb, 2, s, s)
        t0, t1 = tv[:, :, 0], tv[:, :, 1]
        # the inverse of [[L0, 0], [X, L1]] is [[T0, 0], [-T1 X T0, T1]]
        Tcur = _assemble(t0, -(t1 @ (xa @ t0)), t1)
        Mcur = _assemble(mv[:, :, 0], xm, mv[:, :, 1])
        s *= 2
    T = Tcur.reshape(B, C, C)
    M = Mcur.reshape(B, C, C)

    G = g.cumsum(-2)  # [i..start]
    e_start = G.exp().to(cd)
    e_end = _excl_rev_cumsum(g).exp().to(cd)  # [end..j]
    e_total = G[:, -1].exp().to(cd)  # [end..start], [B, Kg]

    Ut = T @ (w * v)  # [B, C, V]
    Wt = T @ (kb * e_start)  # [B, C, K]
    Qe = q * e_start - M @ Wt
    Oi = M @ Ut
    kh_t = (k * e_end).transpose(-1, -2)  # [B, K, C]
    D = torch.diag_embed(e_total.expand(B, K))
    P = torch.baddbmm(D, kh_t, Wt, alpha=-1.0)
    Hh = kh_t @ Ut
    return Oi, Qe, P, Hh


_COMPILED = {}


def _intra_fn(compile_intra: bool):
    if not compile_intra:
        return _intra
    if "intra" not in _COMPILED:
        _COMPILED["intra"] = torch.compile(_intra, dynamic=False)
    return _COMPILED["intra"]


def _segment(q, k, v, g, b, w, S, chunk, gate_dtype, compile_intra=False):
    """One segment ``[N, Ls, H, D]`` (any Ls) with start state ``S [N, H, K, V]``: returns ``(o, S_end)``."""
    N, Ls, H, K = k.shape
    V = v.shape[-1]
    nc = -(-Ls // chunk)
    pad = nc * chunk - Ls

    def prep(x):
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))  # zeros: g = 0 (no decay), q = k = v = b = w = 0
        d = x.shape[-1]
        return x.reshape(N, nc, chunk, H, d).permute(0, 3, 1, 2, 4).reshape(N * H * nc, chunk, d)

    Oi, Qe, P, Hh = _intra_fn(compile_intra)(*(prep(x) for x in (q, k, v, g, b, w)), gate_dtype)
    NH = N * H
    P = P.reshape(NH, nc, K, K)
    Hh = Hh.reshape(NH, nc, K, V)
    S = S.reshape(NH, K, V)
    starts = []
    for c in range(nc):
        starts.append(S)
        S = torch.baddbmm(Hh[:, c], P[:, c], S)
    S0 = torch.stack(starts, 1).reshape(NH * nc, K, V)
    o = torch.baddbmm(Oi, Qe, S0)  # [NH*nc, C, V]
    o = o.reshape(N, H, nc * chunk, V).transpose(1, 2)
    if pad:
        o = o[:, :Ls]
    return o, S.reshape(N, H, K, V)


def chunked_gdn2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    h0: torch.Tensor,
    scale: float,
    *,
    chunk_size: int = 64,
    segment_tokens: int | None = None,
    use_checkpoint: bool | None = None,
    compile_intra: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule; same shapes and semantics as ``token_oracle``.

    ``q, k [N, L, HO, K]``, ``v [N, L, HO, V]``, log-decay ``g [N, L, HO, K|1]`` (<= 0, -inf allowed),
    erase gate ``b [N, L, HO, K|1]``, write gate ``w [N, L, HO, V|1]``, key-major ``h0 [N, HO, K, V]``.
    Returns ``(o [N, L, HO, V], S_L [N, HO, K, V])`` in q's dtype.

    ``chunk_size`` is rounded up to a power of two (and down to the padded length for short inputs);
    the result does not depend on it beyond rounding. ``segment_tokens`` (a multiple of the chunk)
    bounds the working set; by default it is chosen from ``DEFAULT_SEGMENT_BYTES``. ``use_checkpoint``
    (default: when autograd records) recomputes each segment in the backward instead of storing it.
    ``compile_intra`` runs the intra-chunk part through ``torch.compile`` (fuses its elementwise passes on
    the GPU; the first call compiles).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    dtype = q.dtype
    k, v, g, b, w, h0 = (x.to(dtype) for x in (k, v, g, b, w, h0))
    gate_dtype = torch.float64
    N, L, H, K = k.shape
    V = v.shape[-1]
    if L == 0:
        return v.new_zeros(v.shape), h0
    chunk = min(_next_pow2(chunk_size), _next_pow2(L))
    q = q * scale

    if segment_tokens is None:
        per_token = N * H * max(K, V) * dtype.itemsize
        segment_tokens = max(1, DEFAULT_SEGMENT_BYTES // max(1, per_token))
    seg = max(chunk, (segment_tokens // chunk) * chunk)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, g, b, w, h0))
    if use_checkpoint is None:
        use_checkpoint = grad
    use_checkpoint = use_checkpoint and grad

    S = h0
    outs = []
    for t0 in range(0, L, seg):
        parts = [x[:, t0 : t0 + seg] for x in (q, k, v, g, b, w)]
        if use_checkpoint:
            o, S = checkpoint(_segment, *parts, S, chunk, gate_dtype, compile_intra, use_reentrant=False)
        else:
            o, S = _segment(*parts, S, chunk, gate_dtype, compile_intra)
        outs.append(o)
    o = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
    return o, S
