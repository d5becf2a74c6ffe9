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
segment's working set stays bounded (the forward's segments are longer than the backward's, which hold more per
token); `reference/chunked_segments.py` runs them (one forward segment, the forward over all of them, one
backward segment) and states how they keep the kernel count and the memory traffic down.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunked_replay import SegmentReplay
from .chunked_segments import _backward_segment, _forms, _forward, _from_chunks, grad_views

# Working-set targets, as bytes per activation-sized tensor of one segment (N*H*tokens*max(K, V)*itemsize):
# a forward segment keeps about 7 such tensors alive at its peak (plus the output), a backward segment about
# 18 (plus the output and the inputs' gradients, which exist whole). At N=4, H=16, K=V=128 in fp64 the forward
# runs one 4096-token segment and the backward 1024-token ones: peaks of 2.14 and 2.95 GiB, the latter with
# 1.5 GiB of input gradients (bench/chunked.py --count; the same on an H200). The backward's segment count is what
# multiplies its ~150 kernels per segment: 512-token segments (32 MiB) launched 2,174 kernels in all, 1024-token
# ones 1,258, and the H200's forward+backward went from CPU-bound to 40.5 ms (bench/results/s6-h28/).
FORWARD_SEGMENT_BYTES = 256 * 2**20
BACKWARD_SEGMENT_BYTES = 64 * 2**20
# Segments replayed from a CUDA graph may be shorter (the forward's a multiple of the backward's): launches cost
# nothing there, and a short segment's tensors are small enough for one kernel's output to be read back from the
# L2 cache by the next.
GRAPH_FORWARD_SEGMENT_BYTES = 32 * 2**20
GRAPH_BACKWARD_SEGMENT_BYTES = 32 * 2**20
# What ``graph_forward`` / ``graph_backward`` = None mean (replay applies on CUDA only). Both off. At N=4 T=4096
# H=16 K=V=128 in fp64 on an H200 (bench/chunked_sweep.py; bench/results/w28): the eager forward+backward took
# 45.7 ms when it was not the first one timed in its process, the backward replayed from a graph kept across calls
# (chunked_replay.KEEP_LAST) 43.7 ms in another run, per-call capture bought nothing (62.9 against 62.7 ms, an
# earlier session), and once a kept graph was dropped and captured anew the capture failed inside PyTorch 2.11
# (CachingHostAllocator INTERNAL ASSERT; the process then ran eagerly, exactly); replayed forward segments took
# 10.4 ms against 7.4 eager.
GRAPH_FORWARD = False
GRAPH_BACKWARD = False


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
    graph_backward: bool  # replay the backward's segments from a CUDA graph (CUDA, two full segments or more)
    graph_forward: bool = False  # the same for the forward's segments (without autograd recording)


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
        need = ctx.needs_input_grad[1:7]
        grads = [torch.empty(x.shape, dtype=x.dtype, device=x.device) if n else None for x, n in zip(ins, need)]
        y = d_state.reshape(N * H, K, V)
        starts = list(range(0, L, plan.bwd_tokens))
        n_full = L // plan.bwd_tokens
        replayer = None
        if plan.graph_backward and SegmentReplay.applies(q, n_full):
            replayer = SegmentReplay(lambda st: _backward_segment(plan, st[:6], *st[6:]), "backward",
                                     key=(plan, _forms()))
        for seg, t0 in reversed(list(enumerate(starts))):
            Ls = min(plan.bwd_tokens, L - t0)
            seg_ins = [x[:, t0 : t0 + Ls] for x in ins]
            if replayer is not None and Ls == plan.bwd_tokens:
                d_chunks, y = replayer([*seg_ins, kept[seg], y, d_out[:, t0 : t0 + Ls]])
            else:
                d_chunks, y = _backward_segment(plan, seg_ins, kept[seg], y, d_out[:, t0 : t0 + Ls],
                                                grad_views(grads, t0, Ls, plan.chunk, plan.q_scale))
            for i, (grad, d) in enumerate(zip(grads, d_chunks)):
                if grad is not None and d is not None:  # None: written in place already
                    _from_chunks(d, grad[:, t0 : t0 + Ls], plan.q_scale if i == 0 else None)
            del d_chunks
        dh0 = y.clone().view(N, H, K, V) if ctx.needs_input_grad[7] else None
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
    graph_forward: bool | None = None,
    graph_backward: bool | None = None,
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
    runs eagerly. ``graph_backward`` replays the hand-written backward's full-length segments from one CUDA
    graph per backward (CUDA, two full segments or more; the same result bit for bit; a failed capture warns
    once and runs eagerly from then on); ``graph_forward`` the forward's. Replayed segments are sized from
    ``GRAPH_FORWARD_SEGMENT_BYTES`` / ``GRAPH_BACKWARD_SEGMENT_BYTES``. None: ``GRAPH_FORWARD`` /
    ``GRAPH_BACKWARD``.
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

    graph_forward = GRAPH_FORWARD if graph_forward is None else bool(graph_forward)
    graph_backward = GRAPH_BACKWARD if graph_backward is None else bool(graph_backward)
    replays = SegmentReplay.applies(q, 2)  # else every segment runs eagerly, at the eager lengths
    bwd_tokens = tokens(GRAPH_BACKWARD_SEGMENT_BYTES if graph_backward and replays else BACKWARD_SEGMENT_BYTES)
    fwd_budget = GRAPH_FORWARD_SEGMENT_BYTES if graph_forward and replays else FORWARD_SEGMENT_BYTES
    fwd_tokens = max(bwd_tokens, (tokens(fwd_budget) // bwd_tokens) * bwd_tokens)
    # fp64 applies the scale to the output, exactly; other dtypes scale q first, as a plain implementation
    exact = dtype == torch.float64
    plan = _Plan(None if exact else float(scale), float(scale) if exact else 1.0, chunk, fwd_tokens, bwd_tokens,
                 bool(compile_intra), graph_backward, graph_forward)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, g, b, w, h0))
    if grad and use_checkpoint is not False:
        return _ChunkedCore.apply(plan, q, k, v, g, b, w, h0)
    out, s_end, _ = _forward(plan, (q, k, v, g, b, w), h0)
    return out, s_end
