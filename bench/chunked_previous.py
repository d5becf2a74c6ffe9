"""The chunked reference as it was before issue 28 (issue 17's, commit fb5df93: reference/chunked_intra.py and
reference/chunked.py in one file), frozen here so that bench/chunked.py can time it side by side with the current
one (``--no-previous`` skips it). Not used by deltacheck itself; only this docstring and the joined imports are
new.

Same algorithm and numerics; the differences are where the time goes: every level's products, the inverse's
included, are batched matmuls whatever their size, the hand-off writes each chunk's state into a new buffer (a
copy per chunk), the output and ``qe - M Wt`` are new tensors, and the backward's segments always run eagerly.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# --- reference/chunked_intra.py --------------------------------------------------------------------------

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


# --- reference/chunked.py --------------------------------------------------------------------------------

# Working-set targets, as bytes per activation-sized tensor of one segment (N*H*tokens*max(K, V)*itemsize):
# a forward segment keeps about 7 such tensors alive at its peak (plus the output), a backward segment about
# 25 (plus the output and the inputs' gradients, which exist whole). At N=4, H=16, K=V=128 in fp64 the forward
# runs one 4096-token segment and the backward 512-token ones: peaks of 2.0 and 2.6 GiB, the latter with
# 1.5 GiB of input gradients (bench/chunked.py --count).
FORWARD_SEGMENT_BYTES = 256 * 2**20
BACKWARD_SEGMENT_BYTES = 32 * 2**20


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class _Plan:
    q_scale: float | None  # scale applied to q (other dtypes: as a plain implementation does)
    out_scale: float  # scale applied to the output (fp64: exactly, in the output's matmul)
    chunk: int
    fwd_tokens: int  # forward segment length (a multiple of bwd_tokens)
    bwd_tokens: int  # backward segment length (a multiple of chunk)
    compile_intra: bool


# --- optional torch.compile ------------------------------------------------------------------------

_COMPILED: dict = {}


def _intra(fn, plan: _Plan):
    """``fn`` itself, or its ``torch.compile``d version when asked for; a compile failure warns once and
    falls back to eager for good."""
    if not plan.compile_intra:
        return fn
    compiled = _COMPILED.get(fn)
    if compiled is None:
        try:
            compiled = torch.compile(fn, dynamic=False)
        except Exception as e:  # noqa: BLE001 - no compiler here: eager is the same math
            warnings.warn(f"chunked_gdn2: torch.compile unavailable ({type(e).__name__}: {e}); running eagerly",
                          stacklevel=3)
            compiled = fn
        _COMPILED[fn] = compiled
    if compiled is fn:
        return fn

    def call(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a failed compile must not lose the result
            warnings.warn(f"chunked_gdn2: torch.compile failed ({type(e).__name__}: {e}); running eagerly",
                          stacklevel=2)
            _COMPILED[fn] = fn
            return fn(*args, **kwargs)

    return call


# --- layout, state hand-off ----------------------------------------------------------------------


def _from_chunks(src, dst, scale=None):
    """Write (``scale`` times) chunk-major ``src [nc*N*H, C, D]`` into ``dst [N, Ls, H, D]`` (its first Ls
    tokens)."""
    N, Ls, H, D = dst.shape
    C = src.shape[1]
    src = src.reshape(-1, N, H, C, D)
    full, tail = divmod(Ls, C)
    pieces = []
    if full:
        pieces.append((dst[:, : full * C].unflatten(1, (full, C)), src[:full].permute(1, 0, 3, 2, 4)))
    if tail:
        pieces.append((dst[:, full * C :], src[full, :, :, :tail].transpose(1, 2)))
    for d, s_ in pieces:
        if scale is None:
            d.copy_(s_)
        else:
            torch.mul(s_, scale, out=d)


def _states(p, hh, s):
    """The chunk-to-chunk hand-off ``S <- P S + Hh`` over ``p [nc, NH, K, K]``, ``hh [nc, NH, K, V]`` from
    ``s [NH, K, V]``: every chunk's start state ``[nc, NH, K, V]`` and the end state."""
    nc = p.shape[0]
    if torch.is_grad_enabled():  # autograd needs every state it saved
        starts = []
        for c in range(nc):
            starts.append(s)
            s = torch.baddbmm(hh[c], p[c], s)
        return torch.stack(starts), s
    starts = s.new_empty(nc, *s.shape)
    starts[0].copy_(s)
    for c in range(nc - 1):
        torch.baddbmm(hh[c], p[c], starts[c], out=starts[c + 1])
    return starts, torch.baddbmm(hh[-1], p[-1], starts[-1])


# --- forward -----------------------------------------------------------------------------------------

# The hand-off matrices of a segment's chunks (P, Hh, the start states and the output: seven
# activation-sized tensors per chunk at K = V = 2C) are made and used a quarter of the chunks at a time.
HANDOFF_SLICES = 4


def _forward(plan: _Plan, ins, h0, keep_every=None):
    """``(o [N, L, H, V], S_L, kept)``; ``kept`` holds the start state of every ``keep_every``-token
    segment (for the backward)."""
    q, k, v = ins[:3]
    N, L, H, K = k.shape
    V = v.shape[-1]
    C, NH = plan.chunk, N * H
    out = q.new_empty(N, L, H, V)
    s = h0.reshape(NH, K, V)
    kept = []
    fwd = _intra(intra_forward, plan)
    for t0 in range(0, L, plan.fwd_tokens):
        Ls = min(plan.fwd_tokens, L - t0)
        nc = -(-Ls // C)
        z = fwd(*(x[:, t0 : t0 + Ls] for x in ins), C, torch.float64, q_scale=plan.q_scale)
        step = -(-nc // HANDOFF_SLICES)
        for c0 in range(0, nc, step):
            c1 = min(nc, c0 + step)
            rows = slice(c0 * NH, c1 * NH)
            p, hh = handoff(z, rows)
            s0, s = _states(p.view(c1 - c0, NH, K, K), hh.view(c1 - c0, NH, K, V), s)
            del p, hh
            if keep_every is not None:
                kept += [s0[c - c0].clone() for c in range(c0, c1) if (t0 + c * C) % keep_every == 0]
            o = torch.baddbmm(z.oi[rows], z.qe_m[rows], s0.view(-1, K, V), beta=plan.out_scale,
                              alpha=plan.out_scale)
            del s0
            _from_chunks(o, out[:, t0 + c0 * C : t0 + min(c1 * C, Ls)])
            del o
        del z
    return out, s.view(N, H, K, V), kept


# --- backward ----------------------------------------------------------------------------------------


class _ChunkedCore(torch.autograd.Function):
    """The chunked core with a hand-written backward that recomputes one segment at a time."""

    @staticmethod
    def forward(ctx, plan, q, k, v, g, b, w, h0):
        out, s_end, kept = _forward(plan, (q, k, v, g, b, w), h0, keep_every=plan.bwd_tokens)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, g, b, w, *kept)
        return out, s_end

    @staticmethod
    def backward(ctx, d_out, d_state):
        plan = ctx.plan
        q, k, v, g, b, w, *kept = ctx.saved_tensors
        ins = (q, k, v, g, b, w)
        N, L, H, K = k.shape
        V = v.shape[-1]
        C, NH = plan.chunk, N * H
        need = ctx.needs_input_grad[1:7]
        grads = [torch.empty(x.shape, dtype=x.dtype, device=x.device) if n else None for x, n in zip(ins, need)]
        fwd = _intra(intra_forward, plan)
        bwd = intra_backward  # eager: in place throughout (torch.compile covers the forward's intra-chunk work)
        y = d_state.reshape(NH, K, V)
        starts = list(range(0, L, plan.bwd_tokens))
        for seg, t0 in reversed(list(enumerate(starts))):
            Ls = min(plan.bwd_tokens, L - t0)
            nc = -(-Ls // C)
            z = fwd(*(x[:, t0 : t0 + Ls] for x in ins), C, torch.float64, keep=True, q_scale=plan.q_scale)
            p, hh = handoff(z)
            p = p.view(nc, NH, K, K)
            s0, _ = _states(p, hh.view(nc, NH, K, V), kept[seg])
            del hh
            out_scale = plan.out_scale if plan.out_scale != 1.0 else None
            do = to_chunks(d_out[:, t0 : t0 + Ls], C, out_scale)  # the gradient of oi + qe_m S0
            # the state's gradient runs backwards: dS0 = P^T y + Qe_m^T do, y the gradient of the end state
            zc = torch.bmm(z.qe_m.transpose(1, 2), do).view(nc, NH, K, V)
            z.qe_m = z.oi = None
            ys = y.new_empty(nc, NH, K, V)
            ys[-1].copy_(y)
            for c in range(nc - 1, 0, -1):
                torch.baddbmm(zc[c], p[c].transpose(1, 2), ys[c], out=ys[c - 1])
            y = torch.baddbmm(zc[0], p[0].transpose(1, 2), ys[0])
            del zc, p
            z.s0, z.y, z.do = s0.view(-1, K, V), ys.view(-1, K, V), do
            del s0, ys, do
            d_chunks = list(bwd(z))
            del z
            for i, grad in enumerate(grads):
                d = d_chunks.pop(0)
                if grad is not None:
                    _from_chunks(d, grad[:, t0 : t0 + Ls], plan.q_scale if i == 0 else None)
                del d
        dh0 = y.view(N, H, K, V) if ctx.needs_input_grad[7] else None
        return (None, *grads, dh0)


# --- the entry point ---------------------------------------------------------------------------------


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
    bounds the working set of the forward and the backward alike; by default each is chosen from
    ``FORWARD_SEGMENT_BYTES`` / ``BACKWARD_SEGMENT_BYTES``. Under autograd the default (``use_checkpoint``
    None or True) is the hand-written backward that recomputes one segment at a time; ``False`` lets
    autograd differentiate the forward as written, keeping every intermediate. ``compile_intra`` runs the
    forward's intra-chunk work (also recomputed by the backward) through ``torch.compile``, which fuses its
    elementwise passes; the first call of each shape compiles; where it cannot compile it warns once and
    runs eagerly.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    dtype = q.dtype
    k, v, g, b, w, h0 = (x.to(dtype) for x in (k, v, g, b, w, h0))
    N, L, H, K = k.shape
    V = v.shape[-1]
    if L == 0:
        return v.new_zeros(v.shape), h0
    chunk = min(_next_pow2(chunk_size), _next_pow2(L))

    def tokens(budget):
        n = segment_tokens
        if n is None:
            n = max(1, budget // max(1, N * H * max(K, V) * dtype.itemsize))
        return max(chunk, (n // chunk) * chunk)

    bwd_tokens = tokens(BACKWARD_SEGMENT_BYTES)
    fwd_tokens = max(bwd_tokens, (tokens(FORWARD_SEGMENT_BYTES) // bwd_tokens) * bwd_tokens)
    # fp64 applies the scale to the output, exactly; other dtypes scale q first, as a plain implementation
    exact = dtype == torch.float64
    plan = _Plan(None if exact else float(scale), float(scale) if exact else 1.0, chunk, fwd_tokens, bwd_tokens,
                 bool(compile_intra))
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, g, b, w, h0))
    if grad and use_checkpoint is not False:
        return _ChunkedCore.apply(plan, q, k, v, g, b, w, h0)
    out, s_end, _ = _forward(plan, (q, k, v, g, b, w), h0)
    return out, s_end
