"""The hand-written backward of the intra-chunk work (`reference/chunked_intra.py`), one segment's chunks at once.

:func:`intra_backward` takes what ``chunked_intra.intra_forward(keep=True)`` kept, plus per chunk its start
state, the gradient of its end state and that of its output, and returns the gradients of the chunked inputs. It
rebuilds the recursive halving's decay factors level by level as the forward does (products of ``exp(g_t) <= 1``
over exactly their intervals) and sends every factor's log-adjoint to the log-decays of its interval as direct
sums: nothing is a ratio or a difference of decays. It always runs in place. On CUDA (``chunked_intra.cuda_shapes``)
the smallest levels' block products are written out as broadcast products and sums (``SMALL_GRADS``).
"""

from __future__ import annotations

import torch

from . import chunked_intra
from .chunked_intra import Intra, _first_half, _next_level, _scale_half


def _sum_to(x, n):
    """Sum the last dim down to a broadcast singleton when the input was one."""
    return x.sum(-1, keepdim=True) if n == 1 and x.shape[-1] != 1 else x


SMALL_GRADS = 2  # levels s <= this form the backward's block products as broadcast products and sums


def _level_grads(dx, kc, rows, small):
    """``(dx @ kc, dx^T @ rows)``: a level's gradients of its rows ``[n, 2s, K]`` and columns ``[n, s, K]``
    from ``dx [n, 2s, s]``. At s <= SMALL_GRADS (fp64) as written-out sums: a matmul of one or two terms per
    entry over tens of thousands of blocks is cuBLAS's slowest case (an H200 takes 0.18 ms for the
    [16384 x 2 x 1] @ [1 x 128] batch of a 512-token segment)."""
    s = dx.shape[-1]
    small = small and (s == 1 or chunked_intra.cuda_shapes(dx))  # s = 1 is the faster form on the CPU too
    if s == 1:  # one term: the outer product, bit for bit what the matmul returns
        dr = dx * kc
    elif small and s <= SMALL_GRADS:
        dr = _terms(dx, kc)
    else:
        dr = torch.bmm(dx, kc)
    if small and s <= SMALL_GRADS:
        dkc = _terms(dx.transpose(1, 2), rows)
    else:
        dkc = torch.bmm(dx.transpose(1, 2), rows)
    return dr, dkc


def _terms(x, y):
    """``x @ y`` for ``x [b, r, n]``, ``y [b, n, K]`` with few terms n, written out term by term (one product
    and n - 1 accumulations in place): no ``[b, r, n, K]`` temporary (at s = 2 of a 1024-token segment that
    temporary alone was 128 MiB, at the backward's peak)."""
    out = x[:, :, 0:1] * y[:, 0:1]
    for j in range(1, x.shape[2]):
        out.addcmul_(x[:, :, j : j + 1], y[:, j : j + 1])
    return out


def intra_backward(z: Intra, outs=None):
    """Gradients ``(dq, dk, dv, dg, db, dw)`` of the chunked inputs, in their shapes.

    ``z`` from ``intra_forward(keep=True)`` with, per chunk, ``z.s0 [B, K, V]`` its start state, ``z.y [B, K,
    V]`` the gradient of its end state and ``z.do [B, C, V]`` scale times that of its output. With the
    pseudo-values ``u = Ut - Wt S0`` a chunk is ``o = scale (qe S0 + M u)`` and ``S_end = Diag(e_total) S0 +
    kh^T u``; the state's own gradient (``P^T y + scale Qe_m^T dO``) is the caller's. ``z`` is consumed: its
    tensors are released as soon as they have been used.

    The log-decay's gradient is the sum, over every decay factor exp(sum of g over an interval) that g_t lies
    in, of that factor's log-adjoint (factor times its gradient): direct sums of the decayed terms over the
    same intervals as the forward's, accumulated in the gate dtype.

    The gradients come as ``[nc, N, H, C, D]`` (``z.grid`` = (nc, N, H)), the layout of ``chunk_view``: ``z.v``,
    ``z.w``, ``z.b`` may be such views of the inputs (``chunked_intra.KEEP_VIEWS``). ``outs``: per gradient, None
    or such a view of where it goes (the input's gradient): its last operation writes there, and it is returned
    as None.
    """
    kq, k, b = z.kq, z.k, z.b
    B, C, K = k.shape
    cd = k.dtype
    gd = z.eg.dtype
    Kg = z.eg.shape[-1]
    m = z.m
    s0, y, do = z.s0, z.y, z.do
    z.s0 = z.y = z.do = z.m = None
    # in place where the operand is not needed afterwards; y (with the chunks' end-state gradients, two
    # activations' worth per chunk) is released first, then s0
    u = z.ut.baddbmm_(z.wt, s0, alpha=-1)
    du = torch.bmm(z.kh, y).baddbmm_(m.transpose(1, 2), do)  # dL/dUt = M^T do + kh y
    z.kh = z.ut = None
    dkh = torch.bmm(u, y.transpose(1, 2))
    Kd, Vd = y.shape[1:]
    # the diagonal of dL/dP: a dot product per state row, as one batched matmul
    de_total = torch.bmm(y.reshape(-1, 1, Vd), s0.reshape(-1, Vd, 1)).view(B, Kd)
    del y
    dwt = torch.baddbmm(z.wt, du, s0.transpose(1, 2), beta=0, alpha=-1)  # dL/dWt = -du S0^T
    z.wt = None
    dm = torch.bmm(do, u.transpose(1, 2))  # used on and below the diagonal only
    del m, u
    dqe = torch.bmm(do, s0.transpose(1, 2))
    del do, s0
    tt = z.t.transpose(1, 2)
    z.t = None
    dt = torch.bmm(du, z.wv.transpose(1, 2)).baddbmm_(dwt, z.kbe.transpose(1, 2))
    z.wv = z.kbe = None  # kbe is a view of the forward's rows buffer: that buffer goes with it
    dwv = torch.bmm(tt, du)
    dkbe = torch.bmm(tt, dwt)
    del du, dwt
    # T = (I + A)^-1: dA = -T^T dT T^T (used strictly below the diagonal only)
    da = torch.bmm(tt, dt)
    da = torch.baddbmm(da, da, tt, beta=0, alpha=-1)
    dam = torch.stack([da, dm], 2)  # [B, C, 2 (A, M), C]
    del da, dt, tt
    outs = list(outs) if outs is not None else [None] * 6

    def _grid(x):  # [B, C, D] as [nc, N, H, C, D] (a view)
        return x if x.dim() == 5 else x.view(*z.grid, *x.shape[1:])

    gw = _grid(dwv)
    dv = torch.mul(gw, _grid(z.w), out=outs[2])
    dw = _mul_sum_to(gw, _grid(z.v), z.w.shape[-1], outs[5])
    z.v = z.w = None
    del gw
    del dwv

    dmd = torch.diagonal(dm, dim1=1, dim2=2).unsqueeze(-1)  # M_ii = q_i . k_i
    dkq = torch.zeros_like(kq)  # (kb, q) rows
    dkq[:, :, 1] = dmd * k
    dk = dmd * kq[:, :, 1]
    del dm, dmd

    # The levels, bottom-up, with their factors rebuilt as in the forward: P (prefixes) on the rows of
    # second halves, Q (suffixes) on the columns of first halves, ``tot`` the blocks' totals. Every factor's
    # log-adjoint (its gradient times itself, in the gate dtype) goes to the g_t of its interval: suffix sums
    # for the prefixes, exclusive prefix sums for the suffixes, both accumulated in one buffer ``dgr`` that holds
    # the tokens in reverse order (a suffix sum is a cumsum there; a prefix sum's terms are flipped into it).
    dgr = torch.zeros(B, C, Kg, dtype=gd, device=k.device)
    tot = z.eg
    pf = tot.clone()
    qf = None  # Q_1 = 1: made at the end of level 1, once that level's temporaries are gone
    z.eg = None
    s = 1
    while s < C:
        nb = C // (2 * s)
        e_row = _first_half(pf, s, 1).unsqueeze(-2)  # [B, nb, s, 1, Kg]
        e_col = _first_half(qf, s) if qf is not None else None
        e_row_cd, e_col_cd = e_row.to(cd), (e_col.to(cd) if e_col is not None else None)
        base, k0 = _first_half(kq, s, 1), _first_half(k, s)
        rows, kc = base * e_row_cd, (k0 * e_col_cd if e_col is not None else k0)  # times 1: k0 itself
        # this level's blocks of dA and dM: rows (i, A|M) of the second half, columns j of the first half
        dx = dam.as_strided((B, nb, s, 2, s), (2 * C * C, 4 * s * C + 2 * s, 2 * C, C, 1),
                            dam.storage_offset() + 2 * s * C).reshape(B * nb, 2 * s, s)
        dr, dkc = _level_grads(dx, kc.view(B * nb, s, K), rows.view(B * nb, 2 * s, K), small=cd == gd)
        dr, dkc = dr.view(B, nb, s, 2, K), dkc.view(B, nb, s, K)
        del dx
        _first_half(dkq, s, 1).addcmul_(dr, e_row_cd)
        if e_col is None:
            _first_half(dk, s).add_(dkc)
        else:
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
            # tokens 1 .. s-1 of a first half: reversed, offsets s-2 .. 0 of the second half of a reversed 2s-block
            _first_half(dgr, s, 1)[:, :, : s - 1].add_(lam[:, :, : s - 1].cumsum(2).flip((1, 2)))
        del lam, dkc, kc, k0, e_row, e_col, e_row_cd, e_col_cd
        ta, tb, tot = _next_level(tot, s)
        pf = _scale_half(pf, s, 1, ta)
        qf = _scale_half(torch.ones_like(pf) if qf is None else qf, s, 0, tb)
        del ta, tb
        s *= 2
    del dam
    if qf is None:  # C = 1: no level ran
        qf = torch.ones_like(pf)
    # pf, qf, tot now hold exp([i..start]), exp([end..j]) and exp([end..start]). exp([i..start]) scales kb and
    # q, and its last row is exp([end..start]): suffix sums; exp([end..j]) scales k: exclusive prefix sums.
    lam = _sum_to(torch.addcmul(dqe * kq[:, :, 1], dkbe, kq[:, :, 0]), Kg).to(gd) * pf
    lam[:, -1].add_(_sum_to(de_total.to(gd), Kg) * tot.view(B, Kg))
    dgr.add_(lam.flip(1).cumsum(1))
    lam = _sum_to(dkh * k, Kg).to(gd) * qf
    dgr[:, : C - 1].add_(lam[:, : C - 1].cumsum(1).flip(1))  # tokens 1 .. C-1, reversed
    del lam, de_total, tot
    e_start, e_end = pf.to(cd), qf.to(cd)
    del pf, qf
    dkb = torch.addcmul(dkq[:, :, 0], dkbe, e_start)
    dq = torch.addcmul(_grid(dkq[:, :, 1]), _grid(dqe), _grid(e_start), out=outs[0])
    del dkq, dkbe, dqe
    dk.addcmul_(dkh, e_end)
    gkb = _grid(dkb)
    dk = _grid(dk).addcmul_(gkb, _grid(b)) if outs[1] is None else torch.addcmul(_grid(dk), gkb, _grid(b), out=outs[1])
    db = _mul_sum_to(gkb, _grid(k), b.shape[-1], outs[4])
    z.kq = z.k = z.b = None
    del gkb
    if cd == gd:
        dg = _grid(dgr.flip(1))
        if outs[3] is not None:
            dg = outs[3].copy_(dg)
    else:
        dg = _grid(dgr.flip(1).to(cd))
        if outs[3] is not None:
            outs[3].copy_(dg)
    return tuple(None if o is not None else d for d, o in zip((dq, dk, dv, dg, db, dw), outs))


def _mul_sum_to(x, y, n, out=None):
    """``x * y`` summed over the last dim down to a broadcast singleton when the input was one (``n == 1``),
    written to ``out`` when given."""
    if n == 1 and max(x.shape[-1], y.shape[-1]) != 1:
        return torch.sum(x * y, -1, keepdim=True, out=out)
    return torch.mul(x, y, out=out)
