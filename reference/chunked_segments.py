"""The chunked reference's segments: one forward segment, the forward over all of them, one backward segment.

`reference/chunked.py` owns the contract, the plan (chunk and segment lengths) and the autograd Function; the
intra-chunk work of a segment is `reference/chunked_intra.py` (its backward `reference/chunked_intra_backward.py`);
this module runs a segment's chunks through it and hands the state from chunk to chunk.

On a GPU the work is bound by kernel launches and memory traffic more than by flops, so a
segment's intra-chunk work is a fixed number of kernels (about 100) whatever its length, written in place
where autograd does not record: the hand-off runs in place in the buffer that holds Hh (slot c + 1 becomes
chunk c's end state, one matmul per chunk and no copies), and the output is written over ``oi``. On CUDA the
smallest levels' products take the forms cuBLAS runs fast (``chunked_intra.cuda_shapes``); the CPU keeps the
batched matmuls, its faster form at those sizes. ``graph_forward`` / ``graph_backward`` replay full segments
from a CUDA graph (``chunked_replay``): the same kernels, bit for bit, without their launch cost, which lets the
segments be short enough for their tensors to stay in the L2 cache between kernels.
"""

from __future__ import annotations

import os
import warnings

import torch

from . import chunked_fused, chunked_intra, chunked_intra_backward
from .chunked_intra import chunk_view, handoff, intra_forward, to_chunks
from .chunked_intra_backward import intra_backward
from .chunked_replay import SegmentReplay

# --- optional torch.compile ------------------------------------------------------------------------

_COMPILED: dict = {}


def _intra(fn, plan):
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
    """Write (``scale`` times) chunk-major ``src [nc*N*H, C, D]`` (or ``[nc, N, H, C, D]``) into ``dst [N, Ls, H, D]``
    (its first Ls tokens)."""
    N, Ls, H, D = dst.shape
    C = src.shape[-2]
    src = src.reshape(-1, N, H, C, D)
    full, tail = divmod(Ls, C)
    # each view of dst taken just before its write: under autograd the first write makes dst a non-leaf
    pieces = []
    if full:
        pieces.append((lambda: dst[:, : full * C].unflatten(1, (full, C)), src[:full].permute(1, 0, 3, 2, 4)))
    if tail:
        pieces.append((lambda: dst[:, full * C :], src[full, :, :, :tail].transpose(1, 2)))
    for view, s_ in pieces:
        d = view()
        if scale is None:
            d.copy_(s_)
        else:
            torch.mul(s_, scale, out=d)


def _states(p, hh, s):
    """The chunk-to-chunk hand-off ``S <- P S + Hh`` over ``p [nc, NH, K, K]``, ``hh [nc, NH, K, V]`` from
    ``s [NH, K, V]``, as autograd records it: every chunk's start state ``[nc, NH, K, V]`` and the end state."""
    starts = []
    for c in range(p.shape[0]):
        starts.append(s)
        s = torch.baddbmm(hh[c], p[c], s)
    return torch.stack(starts), s


def _run_states(p, states):
    """The hand-off in place: ``states[c + 1] <- P_c states[c] + states[c + 1]`` for c = 0 .. n-1, where
    ``states [n + 1, NH, K, V]`` holds the start state in slot 0 and ``Hh_c`` in slot c + 1. After it, slot c
    is chunk c's start state and slot n the end state: no copies, one matmul per chunk (or, where
    ``chunked_fused.handoff_applies``, one kernel for all of them)."""
    if chunked_fused.handoff_applies(p, states):
        try:
            chunked_fused.handoff_scan(p, states)
            return
        except Exception as e:  # noqa: BLE001 - a kernel that cannot compile here must not lose the result
            chunked_fused.handoff_failed(e)
    ps, ss = p.unbind(0), states.unbind(0)
    for c, pc in enumerate(ps):
        ss[c + 1].baddbmm_(pc, ss[c])


# --- forward -----------------------------------------------------------------------------------------

# The hand-off matrices of a segment's chunks (P, the states, at K = V = 2C four activation-sized tensors per
# chunk) are made and used a part of the chunks at a time: in CUDA_HANDOFF_SLICES parts on a GPU, CPU_HANDOFF_SLICES
# elsewhere, unless HANDOFF_SLICES is set. Each part costs five kernels besides its chunks' products, and on an H200
# the forward's CPU side is nearly as long as its GPU work (4.5 ms to issue what a CUDA graph replays in 4.9 ms at
# N=4 T=4096 H=16 K=V=128): in one process 1 / 2 / 4 / 8 parts took 5.18 / 5.29 / 5.48 / 5.53 ms with peaks of 2.76 /
# 2.52 / 2.14 / 2.00 GiB (bench/results/s9/h28-sweep.tgz); two keep the peak well under issue 28's 3 GiB. The CPU has
# no launches to save: it keeps the four it had (bench/cpu_slices.py: two and four within noise there).
# ``DELTACHECK_CHUNKED_HANDOFF_SLICES`` (read at import) sets HANDOFF_SLICES, for a benchmark's side-by-side run.
CUDA_HANDOFF_SLICES = 2
CPU_HANDOFF_SLICES = 4
_SLICES_ENV = os.environ.get("DELTACHECK_CHUNKED_HANDOFF_SLICES", "").strip()
HANDOFF_SLICES = max(1, int(_SLICES_ENV)) if _SLICES_ENV else None


def handoff_slices(x: torch.Tensor) -> int:
    """How many parts a forward segment's hand-off is made in, for tensors on ``x``'s device."""
    if HANDOFF_SLICES is not None:
        return HANDOFF_SLICES
    return CUDA_HANDOFF_SLICES if x.is_cuda else CPU_HANDOFF_SLICES


def _forward_segment(plan, ins, s, keep_every=None):
    """One forward segment ``ins [N, Ls, H, D]`` from its start state ``s [NH, K, V]``: ``(o, s_end, kept)`` with
    the output in chunk layout ``[nc*NH, C, V]`` (unscaled rows past Ls are padding), the end state and the
    start state of every ``keep_every``-token stretch of the segment (the segment starts at a multiple of it)."""
    q, k, v = ins[:3]
    N, Ls, H, K = k.shape
    V = v.shape[-1]
    C, NH = plan.chunk, N * H
    nc = -(-Ls // C)
    kept, outs = [], []
    recording = torch.is_grad_enabled()  # use_checkpoint=False: autograd needs every value it saved
    z = _intra(intra_forward, plan)(*ins, C, torch.float64, q_scale=plan.q_scale)
    step = -(-nc // handoff_slices(k))
    for c0 in range(0, nc, step):
        c1 = min(nc, c0 + step)
        n, rows = c1 - c0, slice(c0 * NH, c1 * NH)
        if recording:
            p, hh = handoff(z, rows)
            s0, s = _states(p.view(n, NH, K, K), hh.view(n, NH, K, V), s)
            del p, hh
            outs.append(torch.baddbmm(z.oi[rows], z.qe_m[rows], s0.view(-1, K, V), beta=plan.out_scale,
                                      alpha=plan.out_scale))
        else:
            states = s.new_empty(n + 1, NH, K, V)
            p, _ = handoff(z, rows, hh_out=states[1:].view(-1, K, V))
            states[0].copy_(s)
            _run_states(p.view(n, NH, K, K), states)
            del p
            s0, s = states[:n], states[n]
            # the output in place of oi, which nothing reads afterwards
            z.oi[rows].baddbmm_(z.qe_m[rows], s0.view(-1, K, V), beta=plan.out_scale, alpha=plan.out_scale)
        if keep_every is not None:
            kept += [s0[c - c0].clone() for c in range(c0, c1) if (c * C) % keep_every == 0]
        del s0
    o = torch.cat(outs) if recording else z.oi
    del z
    return o, s, kept


def _forward(plan, ins, h0, keep_every=None):
    """``(o [N, L, H, V], S_L, kept)``; ``kept`` holds the start state of every ``keep_every``-token
    segment (for the backward)."""
    q, k, v = ins[:3]
    N, L, H, K = k.shape
    V = v.shape[-1]
    out = q.new_empty(N, L, H, V)
    s = h0.reshape(N * H, K, V)
    kept = []
    recording = torch.is_grad_enabled()
    n_full = L // plan.fwd_tokens
    replayer = None
    if plan.graph_forward and not recording and SegmentReplay.applies(q, n_full):
        replayer = SegmentReplay(lambda st: _forward_segment(plan, st[:6], st[6], keep_every), "forward",
                                 key=(plan, keep_every, _forms()))
    for t0 in range(0, L, plan.fwd_tokens):
        Ls = min(plan.fwd_tokens, L - t0)
        seg = [x[:, t0 : t0 + Ls] for x in ins]
        if replayer is not None and Ls == plan.fwd_tokens:
            o, s, seg_kept = replayer([*seg, s])
            seg_kept = [t.clone() for t in seg_kept]  # a replay's are the graph's buffers
        else:
            o, s, seg_kept = _forward_segment(plan, seg, s, keep_every)
        kept += seg_kept
        _from_chunks(o, out[:, t0 : t0 + Ls])
        del o
    if not recording:
        s = s.clone()  # not a view that keeps the last segment's states (or a graph's buffer) alive
    return out, s.view(N, H, K, V), kept


def _forms():
    """The module constants that choose a segment's kernels, besides the plan (part of a kept graph's key)."""
    return (HANDOFF_SLICES, CUDA_HANDOFF_SLICES, chunked_intra.GROUP_TOKENS, chunked_intra.SMALL_INVERSE,
            chunked_intra_backward.SMALL_GRADS, chunked_intra.KEEP_VIEWS, chunked_fused.enabled(),
            chunked_fused.handoff_enabled())


# With DIRECT_GRADS the backward writes each input's gradient straight into its stretch of the gradient tensor
# (the last operation of each gradient writes through a chunk-layout view of it) instead of into a chunk-layout
# buffer that is then copied there: one pass less over every gradient.
DIRECT_GRADS = True


def grad_views(grads, t0, Ls, chunk, q_scale):
    """Per input gradient ``[N, L, H, D]`` (or None): the chunk-layout view ``[nc, N, H, C, D]`` of its tokens
    ``t0 .. t0+Ls`` for the backward segment to write into, or None where it cannot (DIRECT_GRADS off, a segment
    that is not whole chunks, q's gradient when q was scaled first: that one takes the copy with the scale)."""
    if not DIRECT_GRADS or Ls % chunk:
        return [None] * len(grads)
    return [None if g is None or (i == 0 and q_scale is not None) else chunk_view(g[:, t0 : t0 + Ls], chunk)
            for i, g in enumerate(grads)]


# --- backward ----------------------------------------------------------------------------------------


def _backward_segment(plan, ins, s_start, y, d_out, outs=None):
    """One backward segment ``ins [N, Ls, H, D]`` with its start state ``s_start`` and the gradient ``y`` of its
    end state: its intra-chunk tensors recomputed, the states again, the state's gradient backwards through
    the chunks, the intra-chunk backward. Returns the inputs' gradients in chunk layout and the gradient of the
    start state ``[NH, K, V]``. ``outs``: per input, None or the chunk-layout view of its gradient's stretch,
    which its gradient is written into (then returned as None; ``grad_views``)."""
    q, k, v = ins[:3]
    N, Ls, H, K = k.shape
    V = v.shape[-1]
    C, NH = plan.chunk, N * H
    nc = -(-Ls // C)
    z = _intra(intra_forward, plan)(*ins, C, torch.float64, keep=True, q_scale=plan.q_scale)
    states = y.new_empty(nc + 1, NH, K, V)
    p = handoff(z, hh_out=states[1:].view(-1, K, V))[0].view(nc, NH, K, K)  # (no name left holding Hh's view)
    states[0].copy_(s_start)
    _run_states(p, states)
    out_scale = plan.out_scale if plan.out_scale != 1.0 else None
    do = to_chunks(d_out, C, out_scale)  # the gradient of oi + qe_m S0
    # The state's gradient runs backwards: dS_c = P_c^T dS_(c+1) + Qe_m^T do_c, dS_nc = y (the end state's); in
    # place, slot c of ``ds`` holding Qe_m^T do_c until it becomes dS_c.
    ds = y.new_empty(nc + 1, NH, K, V)
    torch.bmm(z.qe_m.transpose(1, 2), do, out=ds[:nc].view(-1, K, V))
    z.qe_m = z.oi = None
    ds[nc].copy_(y)
    dss = ds.unbind(0)
    for c in range(nc - 1, -1, -1):
        dss[c].baddbmm_(p[c].transpose(1, 2), dss[c + 1])
    y = dss[0].clone()
    del p, dss
    z.s0, z.y, z.do = states[:nc].view(-1, K, V), ds[1:].view(-1, K, V), do
    del states, ds, do
    return list(intra_backward(z, outs)), y  # z is consumed
