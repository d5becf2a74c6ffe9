"""The chunked reference: a WY/UT-transform chunked algorithm for the gated delta rule, pure PyTorch.

Same contract as :func:`deltacheck.reference.oracle.token_oracle` (one GDN2-shaped core for every op),
but with all intra-chunk work done as batched matmuls over every chunk of every (sequence, head) at
once (`reference/chunked_intra.py`); only the state hand-off between chunks is a sequential loop (one
batched ``baddbmm`` per chunk).

The math, per chunk of C tokens with state ``S0`` at its start, ``kb = b*k`` and the exact interval
sums of log-decay ``[i..j] := sum_{j<t<=i} g_t`` (always <= 0, so every ``exp`` below is <= 1)::

    A_ij = sum_c kb_ic k_jc exp([i..j]_c)   (j < i)        T = (I + A)^-1      (unit lower triangular)
    M_ij = sum_c q_ic  k_jc exp([i..j]_c)   (j <= i)
    U~ = T (w*v)        W~ = T (kb * exp([i..start]))     pseudo-values u_i = U~_i - W~_i^T S0
    o  = scale * (M U~ + (q * exp([i..start]) - M W~) S0)
    S1 = (Diag exp([end..start]) - k^^T W~) S0 + k^^T U~,   k^ = k * exp([end..j])

Numerics (docs/ops.md, "The two reference methods"): nothing ever forms exp(-G), nor a ratio or a
difference of decays. A and M are built by recursive halving of the chunk: at level s, the rows of the second
half of each aligned 2s-block meet the columns of its first half through the anchor r = last row of the first
half, so ``exp([i..j]) = exp([i..r]) * exp([r..j])`` with both factors <= 1; the diagonal (s = 0) is exp(0) = 1.
The factors of level 2s are those of level s times the sibling half's total decay, so each is a product of
``exp(g_t) <= 1`` over exactly its own interval: no overflow, no cancellation, -inf is an exact 0. No pairwise
``[.., i, j, K]`` tensor exists at any level: the memory of each level is that of the inputs. T is inverted
by the same recursion (block inversion of a unit lower triangular matrix), so the solve is batched matmuls
too and works in any dtype.

Precision: fp64 inputs -> all fp64 (the scale applied to the output, in its matmul). Other float inputs
(fp32, bf16, fp16: the baseline) -> as a plain implementation in that dtype: q scaled first, every matrix
product and every other tensor in that dtype, except the decay factors (``exp(g)`` and their products) and
the backward's sums of log-decay gradients, kept in fp64; the factors are cast before they multiply a row.

Gradients: under autograd the whole core is one ``torch.autograd.Function`` with a hand-written backward
(``chunked_intra.intra_backward`` inside the chunks, the transposed state hand-off between them). The
forward keeps only the inputs and the states at the backward's segment boundaries; the backward recomputes
one segment's intra-chunk tensors at a time. The gradient of a log-decay is the sum, over the decay factors
whose interval holds it, of factor times gradient: direct sums over intervals, as the forward's products.
``use_checkpoint=False`` instead lets autograd differentiate the forward as written (every intermediate
kept): slower and bigger, and the independent check of the hand-written backward.

Memory and speed: the sequence is processed in segments of whole chunks, sized from a byte budget so that a
segment's working set stays bounded (the forward's segments are longer than the backward's, which hold
more per token). On a GPU the work is bound by kernel launches and memory traffic more than by flops, so a
segment's intra-chunk work is a fixed number of kernels (about 100) whatever its length, written in place
where autograd does not record.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .chunked_intra import handoff, intra_backward, intra_forward, to_chunks

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
