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

Every level's products are the same sums whatever form computes them. Batched matmuls are the plain form; on
CUDA, where cuBLAS runs blocks of one to four rows and columns far below its speed on larger ones, the
smallest levels instead read their blocks from one product per 16-token group (all rows against all columns:
the rows hold ``kq * P_s`` and the columns ``k * Q_s`` everywhere, so a level's blocks are among the group's
products), and the inverse's 2x2 and 4x4 products and the backward's two-term products are written out as
broadcast products and sums (``cuda_shapes``; fp64 only: the other dtypes keep a plain implementation's
matmuls). At s = 1, on every device and in every dtype, the inverse's products by T's unit diagonal are
skipped and the backward's one-term products are outer products, bit for bit what the matmuls return; in fp64
the backward's s = 1 sums are written out on the CPU too, where that form is the faster one as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import chunked_fused


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
    grid: tuple | None = None  # (nc, N, H): the batch as chunk_view lays it out


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


# The products of the levels. cuBLAS runs the batched matmuls of the smallest levels (a few rows and columns per
# block, tens of thousands of blocks) far below its speed on larger blocks: measured on an H200 in fp64, a
# [65536 x 4 x 128] @ [128 x 2] batch takes 0.5 ms where [4096 x 64 x 128] @ [128 x 32] takes 0.12 ms, and the
# 2 x 2 products of the inverse's recursion 0.38 ms where the same sums written out take 0.05 ms.
# On the CPU the batched matmuls are the faster form at these sizes: the written-out forms apply on CUDA only
# (``cuda_shapes``; the tests force them on the CPU to check them).
SMALL_INVERSE = 4  # levels s <= this form -T1 X T0 as broadcast products and sums (s = 1: -X, T0 = T1 = 1)
GROUP_TOKENS = 16  # levels 1 < s < GROUP_TOKENS / 2 take their blocks from one product per group


# With KEEP_VIEWS the backward's recompute (keep=True) builds kq as the forward does, straight into its buffer, and
# keeps v, w, b as chunk-layout views of the inputs instead of copies (bit for bit the same values).
KEEP_VIEWS = True


def cuda_shapes(x) -> bool:
    """Whether to use the forms chosen for cuBLAS's speed on small blocks (see above)."""
    return x.is_cuda


def _level_blocks(rows, cols, s):
    """The A and M blocks of level ``s`` from the scaled ``rows [B, C, 2, K]`` and ``cols [B, C, K]``:
    ``[B, nb, s, 2, s]`` (row i of a second half, A|M, column j of the first half of each 2s-block)."""
    B, C, _, K = rows.shape
    nb = C // (2 * s)
    W = min(GROUP_TOKENS, C)
    if cuda_shapes(rows) and 1 < s < W // 2:
        # every row against every column of its W-token group (all rows hold kq * P_s, all columns k * Q_s,
        # so the level's blocks are among the products); a few times the flops, in a shape cuBLAS runs fast
        G, nw = C // W, W // (2 * s)
        full = torch.bmm(rows.reshape(B * G, 2 * W, K), cols.reshape(B * G, W, K).transpose(1, 2))
        f = full.view(B, G, nw, 2, s, 2, nw, 2, s)[:, :, :, 1, :, :, :, 0]  # [B, G, nw, s, 2, nw, s]
        return torch.diagonal(f, dim1=2, dim2=5).permute(0, 1, 5, 2, 3, 4).reshape(B, nb, s, 2, s)
    rv, cv = _first_half(rows, s, 1), _first_half(cols, s)
    return torch.bmm(rv.reshape(B * nb, 2 * s, K), cv.reshape(B * nb, s, K).transpose(1, 2)).view(B, nb, s, 2, s)


def _inverse_block(t, xa, s, small):
    """``-T1 X T0`` ``[B, nb, s, s]``: the off-diagonal block of each 2s-block of ``T = (I + A)^-1`` from ``xa``
    (its A block, ``[B, nb, s, s]``) and ``t``'s diagonal s-blocks so far (``T0``, ``T1``). ``small``: the
    written-out sums may replace the matmuls (fp64; another dtype keeps the matmuls of a plain implementation)."""
    B, nb = xa.shape[:2]
    if s == 1:  # T0 = T1 = 1 exactly: the matmuls would return -X bit for bit
        return -xa
    diag = torch.diagonal(t.view(B, 2 * nb, s, 2 * nb, s), dim1=1, dim2=3)  # [B, s, s, 2nb]
    tdiag = diag.permute(0, 3, 1, 2).unflatten(1, (nb, 2))  # [B, nb, 2, s, s]
    if not _in_place():  # autograd keeps what it multiplies, and t is written afterwards
        tdiag = tdiag.contiguous()
    t0, t1 = tdiag[:, :, 0], tdiag[:, :, 1]
    if small and s <= SMALL_INVERSE and cuda_shapes(xa):
        xt = (xa.unsqueeze(-1) * t0.unsqueeze(-3)).sum(-2)
        return -(t1.unsqueeze(-1) * xt.unsqueeze(-3)).sum(-2)
    t0, t1 = t0.reshape(B * nb, s, s), t1.reshape(B * nb, s, s)
    xt = torch.bmm(xa.reshape(B * nb, s, s), t0)
    return torch.baddbmm(xt, t1, xt, beta=0, alpha=-1).view(B, nb, s, s)


# --- forward ---------------------------------------------------------------------------------------


def _plain_start(q, k, v, g, b, w, C, gate_dtype, keep, q_scale, fast, scaled, pre_scaled):
    """The forward's input preparation and level 0 in PyTorch: ``(tm, rows, cols, wv, tot, kq, k, v, b, w, eg, cd,
    s)`` for the levels' loop to start from at s = 1."""
    N, Ls, H, K = k.shape
    nc = -(-Ls // C)
    B = N * H * nc
    # M's diagonal q_i . k_i: products rounded to the dtype, then summed (as a plain implementation; in fp64 as
    # good as a matmul's dot). With pre_scaled, from the inputs, first, while nothing else is allocated.
    qk = chunk_view((q * k).sum(-1, keepdim=True), C).reshape(B, C) if pre_scaled else None
    eg = to_chunks(g.to(gate_dtype), C, fn=torch.exp)  # [B, C, Kg] exp(g) <= 1
    Kg = eg.shape[-1]
    views = keep and fast and KEEP_VIEWS  # the backward reads v, w, b through views of the inputs
    if not fast or (keep and not views):
        k, v, b, w = (to_chunks(x, C) for x in (k, v, b, w))
        kq = torch.stack([k * b, to_chunks(q, C, q_scale)], 2)
        wv = w * v
    else:  # straight from the inputs into chunk layout: no copies of b, v, w
        kq = k.new_empty(B, C, 2, K)
        kqv = kq.view(nc, N, H, C, 2, K)
        torch.mul(chunk_view(k, C), chunk_view(b, C), out=kqv[..., 0, :])
        if pre_scaled:  # the rows of level 1, kq * exp(g), made here: q is read once
            egv = eg.view(nc, N, H, C, Kg)
            kqv[..., 0, :].mul_(egv)
            torch.mul(chunk_view(q, C), egv, out=kqv[..., 1, :])
            del egv
        elif q_scale is None:
            kqv[..., 1, :].copy_(chunk_view(q, C))
        else:
            torch.mul(chunk_view(q, C), q_scale, out=kqv[..., 1, :])
        wv = v.new_empty(B, C, v.shape[-1])
        torch.mul(chunk_view(w, C), chunk_view(v, C), out=wv.view(nc, N, H, C, -1))
        k = to_chunks(k, C)
        # kept for the backward as chunk-layout views [nc, N, H, C, D] of the inputs (no copies)
        v, b, w = (chunk_view(x, C) for x in (v, b, w)) if views else (None, None, None)
        q = kqv = None
    cd = k.dtype

    # T and M side by side in one buffer [B, 2, C, C]; level 0 is their diagonal: T_ii = 1, M_ii = q_i . k_i.
    tm = k.new_zeros(B, 2, C, C)
    tm[:, 0].diagonal(dim1=1, dim2=2).fill_(1.0)
    if qk is None:
        qk = (kq[:, :, 1] * k).sum(-1)
    tm[:, 1].diagonal(dim1=1, dim2=2).copy_(qk)
    del qk
    # Level 1: P_1 = exp(g) (rows), Q_1 = 1 (columns), T_1 = exp(g) (totals of 1-blocks). ``rows`` and
    # ``cols`` hold the scaled rows and columns (gate dtype) or the factors P and Q (any other dtype).
    if pre_scaled:
        rows, cols = kq, k
    elif scaled:
        rows = kq * eg.unsqueeze(2)
        cols = k.clone() if keep or not fast else k
    else:
        rows, cols = eg.clone(), torch.ones_like(eg)
    tot = eg
    if not keep:
        eg = None  # tot holds it until level 2
    return tm, rows, cols, wv, tot, kq, k, v, b, w, eg, cd, 1


def _fused_start(q, k, v, g, b, w, C, keep):
    """The same start from ``chunked_fused.start`` (fp64 on CUDA): its kernel makes levels 1..8's M blocks and T
    blocks (``chunked_fused.TINV``; else A's pairs, from which T's blocks of levels 1..8 follow here as the loop makes
    them), the rows, columns and totals of level 16 and ``w*v``. Returns ``(tm, rows, cols, wv, tot, s, kq, k, eg)``
    for the loop to go on from at s = 16 (the last three for the backward with ``keep``, else None), or None where
    the kernel failed (``chunked_fused.failed``: the PyTorch path runs from then on)."""
    try:
        got = chunked_fused.start(q, k, v, g, b, w, C, keep)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot compile or run here must not lose the result
        chunked_fused.failed(e)
        return None
    (tm, rows, cols, wv, tot, agrp), kept = got[:6], (got[6:] if keep else (None, None, None))
    B, W = tm.shape[0], chunked_fused.GROUP
    G = C // W
    s = 1 if agrp is not None else W  # no A pairs: the kernel made T's blocks of levels 1..8 (chunked_fused.TINV)
    while s < W:
        nb, nw = C // (2 * s), W // (2 * s)
        f = agrp.view(B, G, nw, 2, s, nw, 2, s)[:, :, :, 1, :, :, 0]  # [B, G, nw, s, nw, s]
        xa = torch.diagonal(f, dim1=2, dim2=4).permute(0, 1, 4, 2, 3).reshape(B, nb, s, s)
        off = _inverse_block(tm[:, 0], xa, s, small=True)
        blocks = torch.diagonal(tm.view(B, 2, nb, 2 * s, nb, 2 * s), dim1=2, dim2=4)[:, 0, s:, :s]
        blocks.copy_(off.permute(0, 2, 3, 1))
        del f, xa, off, blocks
        s *= 2
    return (tm, rows, cols, wv, tot, s, *kept)


def intra_forward(q, k, v, g, b, w, chunk, gate_dtype, keep=False, q_scale=None) -> Intra:
    """The intra-chunk quantities of every chunk of a segment ``[N, Ls, H, D]`` (``keep``: what the backward
    needs, which is all but ``oi``; ``q_scale``: q's factor, applied to q here). Without ``keep`` every tensor is
    dropped as soon as it has been used.

    In the gate dtype (fp64) the rows and columns are scaled once and their scaling updated level by level;
    in any other dtype, as a plain implementation in that dtype does it, the fp64 decay factors are updated
    and cast, and each level multiplies them into the rows and columns in that dtype."""
    fast = _in_place()
    N, Ls, H, K = k.shape
    nc = -(-Ls // chunk)
    B, C = N * H * nc, chunk
    scaled = k.dtype == gate_dtype
    pre_scaled = scaled and fast and not keep  # kq will hold the rows of level 1 (kq * exp(g)) at once
    Kg = g.shape[-1]
    fused = None  # fp64 on CUDA: one kernel up to level 16 (chunked_fused); the recompute's with its inputs as views
    if scaled and fast and q_scale is None and (not keep or KEEP_VIEWS) and chunked_fused.applies(k, C):
        fused = _fused_start(q, k, v, g, b, w, C, keep)
    if fused is not None:
        tm, rows, cols, wv, tot, s, kq, k, eg = fused
        v, b, w = (chunk_view(x, C) for x in (v, b, w)) if keep else (None, None, None)
        q = fused = None
        cd = torch.float64
    else:
        tm, rows, cols, wv, tot, kq, k, v, b, w, eg, cd, s = _plain_start(q, k, v, g, b, w, C, gate_dtype, keep,
                                                                            q_scale, fast, scaled, pre_scaled)
        q = None
    while s < C:
        nb = C // (2 * s)
        # the A and M blocks of this level: rows (i in a second half, A|M), columns j in a first half
        if scaled:
            x = _level_blocks(rows, cols, s)
        else:
            rv = _first_half(kq, s, 1) * _first_half(rows, s, 1).to(cd).unsqueeze(-2)
            cv = _first_half(k, s) * _first_half(cols, s).to(cd)
            x = torch.bmm(rv.reshape(B * nb, 2 * s, K), cv.reshape(B * nb, s, K).transpose(1, 2))
            x = x.view(B, nb, s, 2, s)
            del rv, cv
        # the inverse of [[L0, 0], [X, L1]] is [[T0, 0], [-T1 X T0, T1]], T0 and T1 the diagonal s-blocks so far
        off = _inverse_block(tm[:, 0], x[:, :, :, 0], s, small=scaled)
        # write this level's blocks (second half's rows, first half's columns) of T and M
        blocks = torch.diagonal(tm.view(B, 2, nb, 2 * s, nb, 2 * s), dim1=2, dim2=4)[:, :, s:, :s]  # [B, 2, s, s, nb]
        blocks[:, 0].copy_(off.permute(0, 2, 3, 1))
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
    # qe - M Wt, in place in qe's rows where nothing else reads them (kept: kbe, the other half, is left alone)
    qe_m = qe.baddbmm_(m, wt, alpha=-1) if fast else torch.baddbmm(qe, m, wt, alpha=-1)
    del qe
    oi = None if keep else torch.bmm(m, ut)  # the backward (keep) reads qe_m for the state's gradient, never oi
    del m, tm
    return Intra(oi, qe_m, kh=kh, ut=ut, wt=wt, e_total=e_total, grid=(nc, N, H), **kept)


def handoff(z: Intra, rows=slice(None), hh_out=None):
    """``(P, Hh)`` of the chunks ``rows`` of the batch: ``S_end = P S0 + Hh``, ``P = Diag(e_total) - kh^T Wt``
    ``[n, K, K]`` and ``Hh = kh^T Ut`` ``[n, K, V]`` (written into ``hh_out`` when given)."""
    kht = z.kh[rows].transpose(1, 2)
    n, K = kht.shape[:2]
    if kht.dtype == torch.float64:  # the gate dtype: the diagonal added exactly afterwards
        p = torch.baddbmm(kht.new_zeros(()).expand(n, K, K), kht, z.wt[rows], beta=0, alpha=-1)
        p.diagonal(dim1=1, dim2=2).add_(z.e_total[rows])
    else:  # the diagonal rounded once with the product, as a plain implementation
        p = torch.baddbmm(torch.diag_embed(z.e_total[rows].expand(n, K)), kht, z.wt[rows], alpha=-1)
    if hh_out is None:
        return p, torch.bmm(kht, z.ut[rows])
    return p, torch.bmm(kht, z.ut[rows], out=hh_out)
