"""Inside the chunks: the WY/UT quantities of every chunk of a segment at once, and their hand-written backward.

`reference/chunked.py` owns the algorithm's contract (its docstring states the math and the numerics) and the
state hand-off between chunks; this module does the intra-chunk part of one segment ``[N, Ls, H, D]``, as a
batch of B = nc*N*H chunks of C tokens (C a power of two, chunk-major: see :func:`chunk_view`): q and k
``[B, C, K]``, v ``[B, C, V]``, log-decay g ``[B, C, Kg]``, erase gate b ``[B, C, Kb]``, write gate w
``[B, C, Vw]`` (Kg, Kb in {1, K}; Vw in {1, V}: singleton gates broadcast).

The decay factors of the recursive halving are built level by level as products of ``exp(g_t) <= 1``: with
``P_s`` (exp of the inclusive prefix sum inside each aligned s-block), ``Q_s`` (exp of the exclusive suffix
sum) and ``T_s`` (exp of the block's total), level s uses ``P_s`` on the rows of each second half and ``Q_s`` on
the columns of each first half, and level 2s follows by one multiplication of half the rows (the second
half's P by the first half's total, the first half's Q by the second half's total). Scaled rows and columns
are kept in the gate dtype (fp64) and updated the same way; after the last level they are exactly
``kb*exp([i..start])``, ``q*exp([i..start])`` and ``k*exp([end..j])``. Every factor is a product of numbers
<= 1 (a tree of depth log2(C)): nothing overflows and nothing is a ratio or a difference. T and M are built
together in one buffer, each level's off-diagonal blocks written through diagonal views, with one matmul for
both blocks of a level: the kernels per segment do not depend on its length.

The forward is plain differentiable PyTorch (``chunked_gdn2(use_checkpoint=False)`` lets autograd run
through it, which is how the tests check :func:`intra_backward`); when autograd is not recording (and
torch.compile is not tracing) it writes in place and into preallocated buffers: the same arithmetic with
fewer passes over memory. The backward always runs in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Intra:
    """One segment's chunks. With start state S0: ``o = scale * (oi + qe_m S0)`` and ``S_end = P S0 + Hh``
    (:func:`handoff`); the rest is what :func:`intra_backward` needs (kept only when asked for)."""

    oi: torch.Tensor | None  # [B, C, V]
    qe_m: torch.Tensor | None  # [B, C, K]
    kh: torch.Tensor | None  # k * exp([end..j]) [B, C, K]
    ut: torch.Tensor | None  # T wv [B, C, V]
    wt: torch.Tensor | None  # T kbe [B, C, K]
    e_total: torch.Tensor | None  # exp([end..start]) [B, Kg]
    t: torch.Tensor | None = None  # (I + A)^-1 [B, C, C]
    m: torch.Tensor | None = None  # [B, C, C]
    kq: torch.Tensor | None = None  # (kb, q) [B, C, 2, K]
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    b: torch.Tensor | None = None
    w: torch.Tensor | None = None
    eg: torch.Tensor | None = None  # exp(g) in the gate dtype [B, C, Kg]
    kbe: torch.Tensor | None = None  # kb * exp([i..start]) [B, C, K]
    wv: torch.Tensor | None = None  # w * v [B, C, V]
    # set by the caller for the backward: per chunk, the start state, the end state's gradient, scale * dO
    s0: torch.Tensor | None = None
    y: torch.Tensor | None = None
    do: torch.Tensor | None = None


# --- layout and in-place helpers -------------------------------------------------------------------


def _in_place() -> bool:
    """Whether to write in place and into preallocated buffers: not while autograd records (it needs the
    values it saved) nor while torch.compile traces (it fuses the plain form itself)."""
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)
    return not torch.is_grad_enabled() and not compiling()


def chunk_view(x, chunk):
    """``x [N, Ls, H, D]`` as ``[nc, N, H, C, D]`` (a view; zero-padded to whole chunks first where needed: g = 0
    is no decay, zero q, k, v, b, w write and read nothing). Batches of chunks are chunk-major: the chunks
    of one chunk index over every (sequence, head) are contiguous, which is what the state hand-off reads."""
    N, Ls, H, D = x.shape
    nc = -(-Ls // chunk)
    if nc * chunk != Ls:
        x = F.pad(x, (0, 0, 0, 0, 0, nc * chunk - Ls))
    return x.unflatten(1, (nc, chunk)).permute(1, 0, 3, 2, 4)


def to_chunks(x, chunk, scale=None, fn=None):
    """``fn(scale * x)`` of ``x [N, Ls, H, D]`` as a batch of chunks ``[nc*N*H, chunk, D]`` (see chunk_view)."""
    src = chunk_view(x, chunk)
    if not _in_place():
        y = src * scale if scale is not None else src
        y = fn(y) if fn is not None else y
        return y.reshape(-1, chunk, x.shape[-1])
    out = x.new_empty(src.shape)
    if fn is not None:
        fn(src, out=out)
    elif scale is not None:
        torch.mul(src, scale, out=out)
    else:
        out.copy_(src)
    return out.view(-1, chunk, x.shape[-1])


def _scale_half(x, s, half, f):
    """``x [B, C, ...]`` with rows of the ``half`` (0 or 1) s-block of every aligned 2s-block multiplied by ``f``
    (``[B, C/2s, ...]``, broadcast over the block's rows): in place unless autograd is recording."""
    v = x.view(x.shape[0], -1, 2, s, *x.shape[2:])
    f = f.unsqueeze(2)
    if _in_place():
        v[:, :, half].mul_(f)
        return x
    parts = [v[:, :, 0], v[:, :, 1]]
    parts[half] = parts[half] * f
    return torch.stack(parts, 2).view(x.shape)


def _first_half(x, s, half=0):
    """Rows of the ``half`` (0 or 1) s-block of every aligned 2s-block of ``x [B, C, ...]``: ``[B, C/2s, s, ...]``."""
    return x.view(x.shape[0], -1, 2, s, *x.shape[2:])[:, :, half]


def _next_level(tot, s):
    """The block totals of level 2s from those of level s ``[B, C/s, Kg]``: (first halves', second halves',
    their products)."""
    tv = tot.view(tot.shape[0], -1, 2, tot.shape[-1])
    ta, tb = tv[:, :, 0], tv[:, :, 1]
    return ta, tb, ta * tb


# --- forward ---------------------------------------------------------------------------------------


def intra_forward(q, k, v, g, b, w, chunk, gate_dtype, keep=False, q_scale=None) -> Intra:
    """The intra-chunk quantities of every chunk of a segment ``[N, Ls, H, D]`` (``keep``: also what the
    backward needs; ``q_scale``: q's factor, applied to q here). Without ``keep`` every tensor is dropped as
    soon as it has been used.

    In the gate dtype (fp64) the rows and columns are scaled once and their scaling updated level by level;
    in any other dtype, as a plain implementation in that dtype does it, the fp64 decay factors are updated
    and cast, and each level multiplies them into the rows and columns in that dtype."""
    fast = _in_place()
    N, Ls, H, K = k.shape
    nc = -(-Ls // chunk)
    B, C = N * H * nc, chunk
    eg = to_chunks(g.to(gate_dtype), C, fn=torch.exp)  # [B, C, Kg] exp(g) <= 1
    Kg = eg.shape[-1]
    if keep or not fast:
        k, v, b, w = (to_chunks(x, C) for x in (k, v, b, w))
        kq = torch.stack([k * b, to_chunks(q, C, q_scale)], 2)
        wv = w * v
    else:  # straight from the inputs into chunk layout: no copies of b, v, w
        kq = k.new_empty(B, C, 2, K)
        kqv = kq.view(nc, N, H, C, 2, K)
        torch.mul(chunk_view(k, C), chunk_view(b, C), out=kqv[..., 0, :])
        if q_scale is None:
            kqv[..., 1, :].copy_(chunk_view(q, C))
        else:
            torch.mul(chunk_view(q, C), q_scale, out=kqv[..., 1, :])
        wv = v.new_empty(B, C, v.shape[-1])
        torch.mul(chunk_view(w, C), chunk_view(v, C), out=wv.view(nc, N, H, C, -1))
        k = to_chunks(k, C)
        q = v = b = w = kqv = None
    cd = k.dtype
    scaled = cd == gate_dtype

    # T and M side by side in one buffer [B, 2, C, C]; level 0 is their diagonal: T_ii = 1, M_ii = q_i . k_i.
    tm = k.new_zeros(B, 2, C, C)
    tm[:, 0].diagonal(dim1=1, dim2=2).fill_(1.0)
    if scaled:
        qk = torch.bmm(kq[:, :, 1].reshape(B * C, 1, K), k.reshape(B * C, K, 1)).view(B, C)
    else:  # as a plain implementation: products rounded to the dtype, then summed
        qk = (kq[:, :, 1] * k).sum(-1)
    tm[:, 1].diagonal(dim1=1, dim2=2).copy_(qk)
    del qk
    # Level 1: P_1 = exp(g) (rows), Q_1 = 1 (columns), T_1 = exp(g) (totals of 1-blocks). ``rows`` and
    # ``cols`` hold the scaled rows and columns (gate dtype) or the factors P and Q (any other dtype).
    if scaled:
        rows = kq.mul_(eg.unsqueeze(2)) if fast and not keep else kq * eg.unsqueeze(2)
        cols = k.clone() if keep or not fast else k
    else:
        rows, cols = eg.clone(), torch.ones_like(eg)
    tot = eg
    s = 1
    while s < C:
        nb = C // (2 * s)
        # the A and M blocks of this level in one matmul: rows (i in a second half, A|M), columns j in a first half
        if scaled:
            rv, cv = _first_half(rows, s, 1), _first_half(cols, s)
        else:
            rv = _first_half(kq, s, 1) * _first_half(rows, s, 1).to(cd).unsqueeze(-2)
            cv = _first_half(k, s) * _first_half(cols, s).to(cd)
        x = torch.bmm(rv.reshape(B * nb, 2 * s, K), cv.reshape(B * nb, s, K).transpose(1, 2)).view(B, nb, s, 2, s)
        del rv, cv
        # the inverse of [[L0, 0], [X, L1]] is [[T0, 0], [-T1 X T0, T1]], T0 and T1 the diagonal s-blocks so far
        diag = torch.diagonal(tm[:, 0].view(B, 2 * nb, s, 2 * nb, s), dim1=1, dim2=3)  # [B, s, s, 2nb]
        tdiag = diag.permute(0, 3, 1, 2).contiguous().view(B, nb, 2, s, s)
        xt = torch.bmm(x[:, :, :, 0].reshape(B * nb, s, s), tdiag[:, :, 0].reshape(B * nb, s, s))
        off = torch.baddbmm(xt, tdiag[:, :, 1].reshape(B * nb, s, s), xt, beta=0, alpha=-1)
        del xt, tdiag, diag
        # write this level's blocks (second half's rows, first half's columns) of T and M
        blocks = torch.diagonal(tm.view(B, 2, nb, 2 * s, nb, 2 * s), dim1=2, dim2=4)[:, :, s:, :s]  # [B, 2, s, s, nb]
        blocks[:, 0].copy_(off.view(B, nb, s, s).permute(0, 2, 3, 1))
        blocks[:, 1].copy_(x[:, :, :, 1].permute(0, 2, 3, 1))
        del x, off, blocks
        # level 2s: second halves' rows gain the first half's total, first halves' columns the second half's
        ta, tb, tot = _next_level(tot, s)
        rows = _scale_half(rows, s, 1, ta.unsqueeze(-2) if scaled else ta)
        cols = _scale_half(cols, s, 0, tb)
        del ta, tb
        s *= 2
    t, m = tm[:, 0], tm[:, 1]
    e_total = tot.view(B, Kg).to(cd)
    if scaled:
        kbe, qe, kh = rows[:, :, 0], rows[:, :, 1], cols
    else:
        e_start = rows.to(cd)
        kbe, qe, kh = kq[:, :, 0] * e_start, kq[:, :, 1] * e_start, k * cols.to(cd)
        del e_start
    kept = {}
    if keep:
        kept = dict(t=t, m=m, kq=kq, k=k, v=v, b=b, w=w, eg=eg, kbe=kbe, wv=wv)
    del cols, tot, rows, kq, q, k, v, b, w, eg
    ut = torch.bmm(t, wv)
    del wv
    wt = torch.bmm(t, kbe)
    del t, kbe
    qe_m = torch.baddbmm(qe, m, wt, alpha=-1)
    del qe
    oi = torch.bmm(m, ut)
    del m, tm
    return Intra(oi, qe_m, kh=kh, ut=ut, wt=wt, e_total=e_total, **kept)


def handoff(z: Intra, rows=slice(None)):
    """``(P, Hh)`` of the chunks ``rows`` of the batch: ``S_end = P S0 + Hh``, ``P = Diag(e_total) - kh^T Wt``
    ``[n, K, K]`` and ``Hh = kh^T Ut`` ``[n, K, V]``."""
    kht = z.kh[rows].transpose(1, 2)
    n, K = kht.shape[:2]
    if kht.dtype == torch.float64:  # the gate dtype: the diagonal added exactly afterwards
        p = torch.baddbmm(kht.new_zeros(()).expand(n, K, K), kht, z.wt[rows], beta=0, alpha=-1)
        p.diagonal(dim1=1, dim2=2).add_(z.e_total[rows])
    else:  # the diagonal rounded once with the product, as a plain implementation
        p = torch.baddbmm(torch.diag_embed(z.e_total[rows].expand(n, K)), kht, z.wt[rows], alpha=-1)
    return p, torch.bmm(kht, z.ut[rows])


# --- backward --------------------------------------------------------------------------------------


def _sum_to(x, n):
    """Sum the last dim down to a broadcast singleton when the input was one."""
    return x.sum(-1, keepdim=True) if n == 1 and x.shape[-1] != 1 else x


def intra_backward(z: Intra):
    """Gradients ``(dq, dk, dv, dg, db, dw)`` of the chunked inputs, in their shapes.

    ``z`` from ``intra_forward(keep=True)`` with, per chunk, ``z.s0 [B, K, V]`` its start state, ``z.y [B, K,
    V]`` the gradient of its end state and ``z.do [B, C, V]`` scale times that of its output. With the
    pseudo-values ``u = Ut - Wt S0`` a chunk is ``o = scale (qe S0 + M u)`` and ``S_end = Diag(e_total) S0 +
    kh^T u``; the state's own gradient (``P^T y + scale Qe_m^T dO``) is the caller's. ``z`` is consumed: its
    tensors are released as soon as they have been used.

    The log-decay's gradient is the sum, over every decay factor exp(sum of g over an interval) that g_t lies
    in, of that factor's log-adjoint (factor times its gradient): direct sums of the decayed terms over the
    same intervals as the forward's, accumulated in the gate dtype.
    """
    kq, k, b = z.kq, z.k, z.b
    B, C, K = k.shape
    cd = k.dtype
    gd = z.eg.dtype
    Kg = z.eg.shape[-1]
    m = z.m
    s0, y, do = z.s0, z.y, z.do
    z.s0 = z.y = z.do = z.m = None
    u = torch.baddbmm(z.ut, z.wt, s0, alpha=-1)
    du = torch.baddbmm(torch.bmm(z.kh, y), m.transpose(1, 2), do)  # dL/dUt = M^T do + kh y
    dwt = torch.baddbmm(z.wt, du, s0.transpose(1, 2), beta=0, alpha=-1)  # dL/dWt = -du S0^T
    z.ut = z.wt = None
    dm = torch.bmm(do, u.transpose(1, 2))  # used on and below the diagonal only
    del m
    dkh = torch.bmm(u, y.transpose(1, 2))
    dqe = torch.bmm(do, s0.transpose(1, 2))
    Kd, Vd = y.shape[1:]
    # the diagonal of dL/dP: a dot product per state row, as one batched matmul
    de_total = torch.bmm(y.reshape(-1, 1, Vd), s0.reshape(-1, Vd, 1)).view(B, Kd)
    del u, do, y, s0
    tt = z.t.transpose(1, 2)
    z.t = None
    dt = torch.baddbmm(torch.bmm(du, z.wv.transpose(1, 2)), dwt, z.kbe.transpose(1, 2))
    z.wv = None
    dwv = torch.bmm(tt, du)
    dkbe = torch.bmm(tt, dwt)
    del du, dwt
    # T = (I + A)^-1: dA = -T^T dT T^T (used strictly below the diagonal only)
    da = torch.bmm(tt, dt)
    da = torch.baddbmm(da, da, tt, beta=0, alpha=-1)
    dam = torch.stack([da, dm], 2)  # [B, C, 2 (A, M), C]
    del da, dt, tt
    dv = dwv * z.w
    dw = _sum_to(dwv * z.v, z.w.shape[-1])
    z.v = z.w = None
    del dwv

    dmd = torch.diagonal(dm, dim1=1, dim2=2).unsqueeze(-1)  # M_ii = q_i . k_i
    dkq = torch.zeros_like(kq)  # (kb, q) rows
    dkq[:, :, 1] = dmd * k
    dk = dmd * kq[:, :, 1]
    del dm, dmd

    # The levels, bottom-up, with their factors rebuilt as in the forward: P (prefixes) on the rows of
    # second halves, Q (suffixes) on the columns of first halves, ``tot`` the blocks' totals. Every factor's
    # log-adjoint (its gradient times itself, in the gate dtype) goes to the g_t of its interval: suffix sums
    # (accumulated reversed, in ``dgr``) for the prefixes, exclusive prefix sums (``dgn``) for the suffixes.
    dgr = torch.zeros(B, C, Kg, dtype=gd, device=k.device)
    dgn = torch.zeros_like(dgr)
    tot = z.eg
    pf = tot.clone()
    qf = torch.ones_like(tot)
    z.eg = None
    s = 1
    while s < C:
        nb = C // (2 * s)
        e_row = _first_half(pf, s, 1).unsqueeze(-2)  # [B, nb, s, 1, Kg]
        e_col = _first_half(qf, s)
        e_row_cd, e_col_cd = e_row.to(cd), e_col.to(cd)
        base, k0 = _first_half(kq, s, 1), _first_half(k, s)
        rows, kc = base * e_row_cd, k0 * e_col_cd
        # this level's blocks of dA and dM: rows (i, A|M) of the second half, columns j of the first half
        dx = dam.as_strided((B, nb, s, 2, s), (2 * C * C, 4 * s * C + 2 * s, 2 * C, C, 1),
                            dam.storage_offset() + 2 * s * C).reshape(B * nb, 2 * s, s)
        dr = torch.bmm(dx, kc.view(B * nb, s, K)).view(B, nb, s, 2, K)
        dkc = torch.bmm(dx.transpose(1, 2), rows.view(B * nb, 2 * s, K)).view(B, nb, s, K)
        del dx
        _first_half(dkq, s, 1).addcmul_(dr, e_row_cd)
        _first_half(dk, s).addcmul_(dkc, e_col_cd)
        # exp([i..r]) of a second half's row i: each g_t there gets the suffix sum from t. In the gate dtype
        # the scaled rows give the log-adjoint at once; otherwise the gradient of the cast factor, as autograd
        # of a plain implementation forms it, times the factor.
        if cd == gd:
            lam = _sum_to(torch.addcmul(dr[:, :, :, 0] * rows[:, :, :, 0], dr[:, :, :, 1], rows[:, :, :, 1]), Kg)
        else:
            lam = torch.addcmul(dr[:, :, :, 0] * base[:, :, :, 0], dr[:, :, :, 1], base[:, :, :, 1])
            lam = _sum_to(lam, Kg).to(gd) * e_row.squeeze(-2)
        _first_half(dgr, s).add_(lam.flip((1, 2)).cumsum(2))
        del dr, base, rows
        if s > 1:  # exp([r..j]) of a first half's column j: each g_t there gets the prefix sum before t
            lam = _sum_to(dkc * kc, Kg) if cd == gd else _sum_to(dkc * k0, Kg).to(gd) * e_col
            _first_half(dgn, s)[:, :, 1:].add_(lam[:, :, : s - 1].cumsum(2))
        del lam, dkc, kc, k0, e_row, e_col, e_row_cd, e_col_cd
        ta, tb, tot = _next_level(tot, s)
        pf = _scale_half(pf, s, 1, ta)
        qf = _scale_half(qf, s, 0, tb)
        del ta, tb
        s *= 2
    del dam
    # pf, qf, tot now hold exp([i..start]), exp([end..j]) and exp([end..start]). exp([i..start]) scales kb and
    # q, and its last row is exp([end..start]): suffix sums; exp([end..j]) scales k: exclusive prefix sums.
    lam = _sum_to(torch.addcmul(dqe * kq[:, :, 1], dkbe, kq[:, :, 0]), Kg).to(gd) * pf
    lam[:, -1].add_(_sum_to(de_total.to(gd), Kg) * tot.view(B, Kg))
    dgr.add_(lam.flip(1).cumsum(1))
    lam = _sum_to(dkh * k, Kg).to(gd) * qf
    dgn[:, 1:].add_(lam[:, : C - 1].cumsum(1))
    del lam, de_total, tot
    e_start, e_end = pf.to(cd), qf.to(cd)
    del pf, qf
    dkb = torch.addcmul(dkq[:, :, 0], dkbe, e_start)
    dq = torch.addcmul(dkq[:, :, 1], dqe, e_start)
    del dkq, dkbe, dqe
    dk.addcmul_(dkh, e_end)
    dk.addcmul_(dkb, b)
    db = _sum_to(dkb * k, b.shape[-1])
    z.kq = z.k = z.b = None
    dg = (dgn + dgr.flip(1)).to(cd)
    return dq, dk, dv, dg, db, dw
