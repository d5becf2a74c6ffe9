"""One fused fp64 Triton kernel for the start of the chunked forward: the input preparation and its smallest levels.

`reference/chunked_intra.py`'s forward (fp64, autograd not recording) spends most of its memory traffic before the
first large level: exp(g), k's chunk copy, ``q . k``, ``k*b*exp(g)``, ``q*exp(g)``, ``w*v`` (about eight passes over
activation-sized tensors), then per level s = 1, 2, 4, 8 a product and a rescaling in place of rows and columns.
:func:`start` does all of that in one kernel per 16-token group of every chunk: it reads q, k, b, g, w, v once
from their ``[N, L, H, D]`` layout and writes

- the rows and columns of level 16, ``(kb, q) * exp([i..start of i's 16-group])`` and ``k * exp([end of j's
  16-group..j])``, in chunk layout (what the recursion's levels 16, 32, ... go on from),
- the 16-groups' total decays ``exp(sum of g over the group)`` (the block totals of level 16),
- ``w * v`` in chunk layout,
- M's diagonal 16 x 16 blocks (``q_i . k_i`` on the diagonal, every pair j < i of a group with its decay factor),
- T's diagonal 16 x 16 blocks (``TINV``; else A's pairs j < i inside each group, ``[B, C/16, 16, 16]``, from which
  ``chunked_intra._inverse_block`` builds them),
- for the backward's recompute (``keep``), also what the backward keeps: ``(k*b, q)``, k and exp(g) in chunk layout.

The numerics are the recursion's (`reference/chunked.py`, docs/ops.md "The two reference methods"): the pair
(i, j) of level s meets through the anchor r (the last token of j's s-block): ``exp([i..j]) = exp(P_s(i)) *
exp(Q_s(j))``, P_s(i) the sum of g over i's s-block up to and including i, Q_s(j) the sum over j's s-block after
j. Both are sums of numbers <= 0 over their own interval (no difference of prefix sums, no ratio), so every factor
is <= 1, nothing overflows, nothing cancels, and a log-decay of -inf is an exact 0. The PyTorch path forms the same
factors as products of ``exp(g_t)`` level by level; here each is the exp of its interval's sum: not the same bits,
the same accuracy (a few ulp), which the tests hold to the token oracle at 1e-12.

It applies only to fp64 CUDA tensors with whole 16-token groups (chunk >= 16), with Triton importable, where
:func:`enabled` (``FUSED``; None = ``DELTACHECK_CHUNKED_FUSED``, "0" = off). The CPU path (CI, ``deltacheck
verify``) never takes it. ``TRITON_INTERPRET=1`` runs it on CPU tensors through Triton's interpreter: the tests.
"""

from __future__ import annotations

import os
import warnings

import torch

try:  # optional: CI and the CPU path have no Triton
    import triton
    import triton.language as tl

    IMPORT_ERROR = None
except Exception as _e:  # noqa: BLE001 - any failure to import means "not available"
    triton = tl = None
    IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

FUSED = None  # None: DELTACHECK_CHUNKED_FUSED decides ("0": off); True / False: whatever the environment says
GROUP = 16  # tokens per group: levels 1, 2, 4, 8 inside the kernel
# The kernel's settings (its speed only; every setting computes the same sums): key columns per step of its loop,
# warps per program, SCAN: the interval sums as segmented scans (else each row's masked sum over its group), DOT:
# the level products as tl.dot (fp64 MMA; K_TILE >= 16) rather than broadcast products and sums.
# TINV: T's diagonal 16 x 16 blocks made in the kernel, T <- T - T X T per level (X the level's pairs; T block-diagonal
# so far: exactly -T1 X T0 in each block), instead of A's pairs written out for PyTorch (about 20 small kernels).
# PROD: each level's factors as segmented products of exp(g) (two exps per element), not exps of segmented sums (11).
# LOOP: the four levels of a group as a loop the compiler keeps, not unrolled: the same results bit for bit, a
# fifth less kernel time on the H200 (spills 560 -> 8 bytes per thread; docs/ops.md, "The fused fp64 kernel").
# ``DELTACHECK_CHUNKED_FUSED_CONFIG`` = "KTxWARPS" plus any of s, d, p, t, l (the flags' initials), e.g. "16x1sdptl".
K_TILE = 16
NUM_WARPS = 1
SCAN = True
DOT = True
PROD = True
TINV = True
LOOP = True
V_TILE = 32
# HANDOFF: a forward segment's chunk-to-chunk state hand-off (``S_{c+1} = P_c S_c + Hh_c``, else one batched K x K
# product per chunk launched from Python) as one kernel that walks the chunks, each program one head's state in
# HANDOFF_VT-column strips. Opt-in, no faster on the H200 (docs/ops.md, "The hand-off kernel"). None =
# ``DELTACHECK_CHUNKED_HANDOFF_KERNEL`` ("1" = on); it runs only where the fused kernel is enabled too.
HANDOFF = None
HANDOFF_KB = 32  # rows of P_c (and of the state) per step of the inner loop
HANDOFF_VT = 32  # state columns per program
HANDOFF_WARPS = 8


def config() -> tuple[int, int, bool, bool, bool, bool, bool]:
    """``(K_TILE, NUM_WARPS, SCAN, DOT, PROD, TINV, LOOP)``: the module's, or ``DELTACHECK_CHUNKED_FUSED_CONFIG``'s
    where set."""
    spec = os.environ.get("DELTACHECK_CHUNKED_FUSED_CONFIG", "").strip()
    if not spec:
        return K_TILE, NUM_WARPS, SCAN, DOT, PROD, TINV, LOOP
    kt, rest = spec.split("x", 1)
    digits = "".join(ch for ch in rest if ch.isdigit())
    return int(kt), int(digits), "s" in rest, "d" in rest, "p" in rest, "t" in rest, "l" in rest


FAILED = None  # the first failure of the kernel (a compile error, say): from then on the PyTorch path runs
HANDOFF_FAILED = None  # the same for the hand-off kernel (HANDOFF)


def failed(e: Exception) -> None:
    """Record the kernel's failure: warn once; every later segment takes the PyTorch path (the same results to
    1e-12)."""
    global FAILED
    FAILED = f"{type(e).__name__}: {e}"
    warnings.warn(f"chunked_gdn2: the fused fp64 kernel failed ({FAILED[:500]}); running the PyTorch path",
                  stacklevel=3)


def enabled() -> bool:
    if FUSED is not None:
        return bool(FUSED)
    return os.environ.get("DELTACHECK_CHUNKED_FUSED", "1").strip() != "0"


def describe() -> str:
    """One line for a benchmark's log: whether the kernel can run here, and why not."""
    if FAILED is not None:
        return f"fused kernel failed, off for the process ({FAILED[:300]})"
    if triton is None:
        return f"fused kernel unavailable (triton not importable: {IMPORT_ERROR})"
    return (f"fused kernel {'on' if enabled() else 'off'} (triton {triton.__version__}; FUSED={FUSED}, "
            f"DELTACHECK_CHUNKED_FUSED={os.environ.get('DELTACHECK_CHUNKED_FUSED')!r}; K_TILE, NUM_WARPS, SCAN, DOT, "
            f"PROD, TINV, LOOP = {config()}; hand-off kernel {'on' if handoff_enabled() else 'off'}; fp64 CUDA only)")


def handoff_enabled() -> bool:
    if HANDOFF is not None:
        return bool(HANDOFF)
    return os.environ.get("DELTACHECK_CHUNKED_HANDOFF_KERNEL", "0").strip() == "1"


def handoff_applies(p: torch.Tensor, states: torch.Tensor) -> bool:
    """Whether :func:`handoff_scan` runs for these tensors (fp64, contiguous, CUDA or the interpreter)."""
    return (triton is not None and FAILED is None and HANDOFF_FAILED is None and enabled() and handoff_enabled()
            and p.dtype == states.dtype == torch.float64 and p.is_contiguous() and states.is_contiguous()
            and (states.is_cuda or _interpreting()))


def handoff_failed(e: Exception) -> None:
    """Record the hand-off kernel's failure (raised before its launch: the states are untouched): warn once; the
    hand-off runs as one product per chunk from then on, the start kernel is unaffected."""
    global HANDOFF_FAILED
    HANDOFF_FAILED = f"{type(e).__name__}: {e}"
    warnings.warn(f"chunked_gdn2: the fp64 hand-off kernel failed ({HANDOFF_FAILED[:500]}); one product per chunk "
                  "from now on", stacklevel=3)


def handoff_scan(p: torch.Tensor, states: torch.Tensor) -> None:
    """In place, ``states[c + 1] <- p[c] @ states[c] + states[c + 1]`` for c = 0 .. n-1 in order, ``p [n, NH, K, K]``,
    ``states [n + 1, NH, K, V]`` (the start state in slot 0, each chunk's ``Hh`` in slot c + 1), as
    ``chunked_segments._run_states`` does with one batched product per chunk: the same sums, accumulated in
    HANDOFF_KB-row blocks of P (not the same bits; the same accuracy)."""
    n, NH, K, _ = p.shape
    V = states.shape[-1]
    kp = triton.next_power_of_2(K)
    kb = min(HANDOFF_KB, kp)
    vt = max(16, min(HANDOFF_VT, triton.next_power_of_2(V)))
    _handoff[(NH, triton.cdiv(V, vt))](p, states, n, NH, K=K, V=V, KP=kp, KB=kb, VT=vt, num_warps=HANDOFF_WARPS)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def applies(x: torch.Tensor, chunk: int) -> bool:
    """Whether :func:`start` runs for a segment of ``x``'s dtype and device with this chunk length."""
    return (triton is not None and FAILED is None and enabled() and x.dtype == torch.float64 and chunk >= GROUP
            and chunk % GROUP == 0 and (x.is_cuda or _interpreting()))


def _strides(x):
    """x's strides, 0 along a last dimension of size 1 (a gate broadcast over K or V)."""
    s = list(x.stride())
    if x.shape[-1] == 1:
        s[-1] = 0
    return s


def start(q, k, v, g, b, w, chunk, keep=False):
    """The kernel over every 16-token group of a segment ``[N, Ls, H, D]`` (fp64): ``(tm, rows, cols, wv, tot,
    agrp)`` with ``tm [B, 2, C, C]`` zero but for T's unit diagonal (with TINV: T's diagonal 16-blocks) and M's
    diagonal 16-blocks, ``rows [B, C, 2, K]`` and ``cols [B, C, K]`` scaled for level 16, ``wv [B, C, V]``, ``tot [B,
    C/16, Kg]`` and ``agrp [B, C/16, 16, 16]`` (A's pairs inside each group; None with TINV), B = nc*N*H
    chunk-major (``chunked_intra.chunk_view``). With ``keep`` (the backward's recompute) also ``kq [B, C, 2, K]`` =
    (k*b, q), k ``[B, C, K]`` and exp(g) ``[B, C, Kg]`` in chunk layout, as ``(..., kq, k, eg)``."""
    N, Ls, H, K = k.shape
    V = v.shape[-1]
    C = chunk
    nc = -(-Ls // C)
    B, G = nc * N * H, C // GROUP
    rows = k.new_empty(B, C, 2, K)
    cols = k.new_empty(B, C, K)
    wv = k.new_empty(B, C, V)
    tot = k.new_empty(B, G, K)
    kt, warps, scan, dot, prod, tinv, loop = config()
    agrp = k.new_empty(1) if tinv else k.new_empty(B, G, GROUP, GROUP)  # with TINV never written
    Kg = g.shape[-1]
    kq, kc, eg = (k.new_empty(B, C, 2, K), k.new_empty(B, C, K), k.new_empty(B, C, Kg)) if keep else (rows, cols, tot)
    tm = k.new_zeros(B, 2, C, C)
    if not tinv:  # else the kernel writes T's diagonal blocks whole
        tm[:, 0].diagonal(dim1=1, dim2=2).fill_(1.0)
    kt = min(kt, triton.next_power_of_2(K))
    if dot:
        kt = max(kt, 16)  # tl.dot's smallest inner dimension (masked past K)
    vt = min(V_TILE, triton.next_power_of_2(V))
    _groups[(B, G)](q, k, b, g, w, v, rows, cols, wv, tot, agrp, tm, kq, kc, eg, Ls, N, H,
                    *_strides(q), *_strides(k), *_strides(b), *_strides(g), *_strides(w), *_strides(v),
                    K=K, V=V, C=C, W=GROUP, KT=kt, VT=vt, SCAN=scan, DOT=dot, PROD=prod, TINV=tinv,
                    LOOP=loop, KEEP=bool(keep), KG=Kg, num_warps=warps)
    out = (tm, rows, cols, wv, tot[..., :Kg], None if tinv else agrp)
    return out + (kq, kc, eg) if keep else out


if triton is not None:

    @triton.jit
    def _seg_add(fa, va, fb, vb):
        """The segmented sum: flags mark a segment's first element, whose sum restarts there."""
        return fa | fb, tl.where(fb != 0, vb, va + vb)

    @triton.jit
    def _prefix(vals, first, W: tl.constexpr, KT: tl.constexpr, SCAN: tl.constexpr):
        """Per row i of ``vals [W, KT]``: the sum of the rows from its segment's first row (``first [W, 1]`` marks
        them) up to and including i; a sum of its own interval's numbers, never a difference."""
        if SCAN:
            flags = tl.broadcast_to(first.to(tl.int32), (W, KT))
            _, out = tl.associative_scan((flags, vals), 0, _seg_add)
        else:  # every row's own masked sum
            r = tl.arange(0, W)
            seg = tl.cumsum(first.to(tl.int32), axis=0)  # [W, 1] the segment's number
            same = (tl.reshape(seg, (W, 1, 1)) == tl.reshape(seg, (1, W, 1))) & (r[:, None, None] >= r[None, :, None])
            out = tl.sum(tl.where(same, vals[None, :, :], 0.0), axis=1)
        return out

    @triton.jit
    def _seg_mul(fa, va, fb, vb):
        """The segmented product: flags mark a segment's first element, whose product restarts there."""
        return fa | fb, tl.where(fb != 0, vb, va * vb)

    @triton.jit
    def _prefix_prod(vals, first, W: tl.constexpr, KT: tl.constexpr, SCAN: tl.constexpr):
        """As :func:`_prefix` with products: per row i of ``vals [W, KT]`` (factors exp(g) <= 1), the product of the
        rows from its segment's first row up to and including i."""
        if SCAN:
            flags = tl.broadcast_to(first.to(tl.int32), (W, KT))
            _, out = tl.associative_scan((flags, vals), 0, _seg_mul)
        else:  # every row's own masked product
            r = tl.arange(0, W)
            seg = tl.cumsum(first.to(tl.int32), axis=0)
            same = (tl.reshape(seg, (W, 1, 1)) == tl.reshape(seg, (1, W, 1))) & (r[:, None, None] >= r[None, :, None])
            out = tl.reduce(tl.where(same, vals[None, :, :], 1.0), 1, _mul)
        return out

    @triton.jit
    def _mm(a, b, DOT: tl.constexpr):
        """``a @ b`` of two ``[W, W]`` tiles: fp64 ``tl.dot``, or broadcast products and sums."""
        if DOT:
            out = tl.dot(a, b)
        else:
            out = tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        return out

    @triton.jit
    def _handoff(p_ptr, st_ptr, NC: tl.constexpr, NH, K: tl.constexpr, V: tl.constexpr, KP: tl.constexpr,
                 KB: tl.constexpr, VT: tl.constexpr):
        """One head's state, columns [e0, e0 + VT), carried through the NC chunks: S <- P_c S + Hh_c, each new state
        written over Hh_c in place. The state lives in ``states`` between chunks (a program holds no K x K tile):
        every step reads the previous chunk's state back in KB-row blocks, after a barrier, because other threads
        of the program wrote them. NC (chunks per hand-off slice) is a compile-time constant: Triton's interpreter
        cannot loop to a runtime bound, and a segment's slices have one or two lengths."""
        hd = tl.program_id(0)
        e = tl.program_id(1) * VT + tl.arange(0, VT)
        r = tl.arange(0, KP)
        out_mask = (r[:, None] < K) & (e[None, :] < V)
        # num_stages=1: never software-pipeline this loop, whose next step reads what this step stores. Triton 3.6 does
        # not pipeline it either way (no cp.async in its sm_90 PTX); the argument keeps a later version from starting to.
        for c in tl.range(0, NC, num_stages=1):
            here = st_ptr + ((c + 1) * NH + hd) * K * V
            prev = st_ptr + (c * NH + hd) * K * V
            pc = p_ptr + (c * NH + hd) * K * K
            acc = tl.load(here + r[:, None] * V + e[None, :], mask=out_mask, other=0.0)  # Hh_c
            for k0 in tl.static_range(0, KP, KB):
                kk = k0 + tl.arange(0, KB)
                pk = tl.load(pc + r[:, None] * K + kk[None, :], mask=(r[:, None] < K) & (kk[None, :] < K), other=0.0)
                sk = tl.load(prev + kk[:, None] * V + e[None, :], mask=(kk[:, None] < K) & (e[None, :] < V),
                             other=0.0, cache_modifier=".cg")
                acc += tl.dot(pk, sk)
            tl.store(here + r[:, None] * V + e[None, :], acc, mask=out_mask)
            tl.debug_barrier()  # the next chunk reads this state back in other threads' blocks

    @triton.jit
    def _mul(a, b):
        return a * b

    @triton.jit
    def _level(acc_a, acc_m, kb, qv, kp, eg, egn, s, r, p, W: tl.constexpr, KT: tl.constexpr, SCAN: tl.constexpr,
               DOT: tl.constexpr, PROD: tl.constexpr):
        """Level s of a group: its pairs (i in a 2s-block's second half, j in its first) added to A's and M's sums;
        ``eg`` / ``egn`` exp(g) of the rows' and the columns' next tokens (PROD), else those log-decays."""
        # P_s(i): g over i's s-block up to i; Q_s(j): g over j's s-block after j (in reverse order, a prefix from the
        # block's last token, whose own term is 0)
        last = (p % s == s - 1)[:, None]  # j is its s-block's last token
        if PROD:
            ep = _prefix_prod(eg, (r % s == 0)[:, None], W, KT, SCAN)
            cp = kp * _prefix_prod(tl.where(last, 1.0, egn), last, W, KT, SCAN)
        else:
            ep = tl.exp(_prefix(eg, (r % s == 0)[:, None], W, KT, SCAN))
            cp = kp * tl.exp(_prefix(tl.where(last, 0.0, egn), last, W, KT, SCAN))
        i2 = r[:, None]
        j2 = p[None, :]
        at_level = (i2 > j2) & ((i2 ^ j2) >= s) & ((i2 ^ j2) < 2 * s)  # j in the first half, i the second
        if DOT:
            pa = tl.dot(kb * ep, tl.trans(cp))
            pm = tl.dot(qv * ep, tl.trans(cp))
        else:
            pa = tl.sum((kb * ep)[:, None, :] * cp[None, :, :], axis=2)
            pm = tl.sum((qv * ep)[:, None, :] * cp[None, :, :], axis=2)
        return acc_a + tl.where(at_level, pa, 0.0), acc_m + tl.where(at_level, pm, 0.0)

    @triton.jit
    def _groups(q_ptr, k_ptr, b_ptr, g_ptr, w_ptr, v_ptr, rows_ptr, cols_ptr, wv_ptr, tot_ptr, agrp_ptr, tm_ptr,
                kq_ptr, kc_ptr, eg_ptr, L, N, H,
                sqn, sqt, sqh, sqd, skn, skt, skh, skd, sbn, sbt, sbh, sbd,
                sgn, sgt, sgh, sgd, swn, swt, swh, swd, svn, svt, svh, svd,
                K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, W: tl.constexpr, KT: tl.constexpr,
                VT: tl.constexpr, SCAN: tl.constexpr, DOT: tl.constexpr, PROD: tl.constexpr, TINV: tl.constexpr,
                LOOP: tl.constexpr, KEEP: tl.constexpr, KG: tl.constexpr):
        bidx = tl.program_id(0).to(tl.int64)  # chunk-major: ((chunk * N) + n) * H + h
        gi = tl.program_id(1).to(tl.int64)
        h = bidx % H
        n = (bidx // H) % N
        c = bidx // (N * H)
        r = tl.arange(0, W)  # rows i in token order
        p = W - 1 - r  # columns in reverse token order: position r holds token j = W-1-r
        t = c * C + gi * W + r
        tp = c * C + gi * W + p
        valid = t < L  # past L: the zero padding of the last chunk (g = 0, every other input 0)
        validp = tp < L
        nxt = (tp + 1 < L) & (p < W - 1)  # token j+1 inside the group and the sequence
        row0 = bidx * C + gi * W  # the group's first row in chunk layout
        i2 = r[:, None]
        j2 = p[None, :]  # the token of each column of the [W, W] products
        acc_a = tl.zeros([W, W], dtype=tl.float64)
        acc_m = tl.zeros([W, W], dtype=tl.float64)
        qk = tl.zeros([W], dtype=tl.float64)
        for d0 in range(0, K, KT):
            d = d0 + tl.arange(0, KT)
            dm = d[None, :] < K
            m2 = valid[:, None] & dm
            qv = tl.load(q_ptr + n * sqn + t[:, None] * sqt + h * sqh + d[None, :] * sqd, mask=m2, other=0.0)
            kv = tl.load(k_ptr + n * skn + t[:, None] * skt + h * skh + d[None, :] * skd, mask=m2, other=0.0)
            bv = tl.load(b_ptr + n * sbn + t[:, None] * sbt + h * sbh + d[None, :] * sbd, mask=m2, other=0.0)
            gv = tl.load(g_ptr + n * sgn + t[:, None] * sgt + h * sgh + d[None, :] * sgd, mask=m2, other=0.0)
            # the columns' side in reverse order: k at token j, g at token j+1 (0 past the group or the sequence)
            kp = tl.load(k_ptr + n * skn + tp[:, None] * skt + h * skh + d[None, :] * skd,
                         mask=validp[:, None] & dm, other=0.0)
            gn = tl.load(g_ptr + n * sgn + (tp[:, None] + 1) * sgt + h * sgh + d[None, :] * sgd,
                         mask=nxt[:, None] & dm, other=0.0)
            kb = kv * bv
            qk += tl.sum(qv * kv, axis=1)
            if PROD:  # exp(g) of the rows' tokens and of the columns' next tokens (1 past the group: exp(0))
                eg, egn = tl.exp(gv), tl.exp(gn)
            else:  # _level takes the log-decays themselves
                eg, egn = gv, gn
            if LOOP:
                for lvl in range(4):
                    acc_a, acc_m = _level(acc_a, acc_m, kb, qv, kp, eg, egn, 1 << lvl, r, p, W, KT, SCAN, DOT, PROD)
            else:
                for lvl in tl.static_range(4):
                    acc_a, acc_m = _level(acc_a, acc_m, kb, qv, kp, eg, egn, 1 << lvl, r, p, W, KT, SCAN, DOT, PROD)
            # level 16's rows and columns: the group's inclusive prefix, exclusive suffix; and its total
            last = (p == W - 1)[:, None]
            if PROD:
                ep = tl.cumprod(eg, axis=0)
                eq = _prefix_prod(egn, last, W, KT, SCAN)
            else:
                ep = tl.exp(tl.cumsum(gv, axis=0))
                eq = tl.exp(_prefix(gn, last, W, KT, SCAN))
            tl.store(rows_ptr + ((row0 + r[:, None]) * 2) * K + d[None, :], kb * ep, mask=dm)
            tl.store(rows_ptr + ((row0 + r[:, None]) * 2 + 1) * K + d[None, :], qv * ep, mask=dm)
            tl.store(cols_ptr + (row0 + p[:, None]) * K + d[None, :], kp * eq, mask=dm)
            tl.store(tot_ptr + (bidx * (C // W) + gi) * K + d, tl.exp(tl.sum(gv, axis=0)), mask=d < K)
            if KEEP:  # what the backward's recompute keeps: (kb, q), k and exp(g) in chunk layout
                tl.store(kq_ptr + ((row0 + r[:, None]) * 2) * K + d[None, :], kb, mask=dm)
                tl.store(kq_ptr + ((row0 + r[:, None]) * 2 + 1) * K + d[None, :], qv, mask=dm)
                tl.store(kc_ptr + (row0 + r[:, None]) * K + d[None, :], kv, mask=dm)
                tl.store(eg_ptr + (row0 + r[:, None]) * KG + d[None, :], tl.exp(gv), mask=d[None, :] < KG)
        if TINV:
            # A in token order (acc_a's columns are tokens W-1 .. 0): times the reversal, exactly (one product of 1.0)
            rr = r[:, None]
            cc = r[None, :]
            a_nat = _mm(acc_a, tl.where(rr + cc == W - 1, 1.0, 0.0).to(tl.float64), DOT)
            t_blk = tl.where(rr == cc, 1.0, 0.0).to(tl.float64)
            for lvl in tl.static_range(4):
                s = 1 << lvl
                x = tl.where((rr > cc) & ((rr ^ cc) >= s) & ((rr ^ cc) < 2 * s), a_nat, 0.0)
                t_blk = t_blk - _mm(t_blk, _mm(x, t_blk, DOT), DOT)  # each 2s-block's -T1 X T0, below its diagonal
            tl.store(tm_ptr + ((bidx * 2) * C + gi * W + rr) * C + gi * W + cc, t_blk)
        else:
            tl.store(agrp_ptr + ((bidx * (C // W) + gi) * W + i2) * W + j2, acc_a)
        m_blk = acc_m + tl.where(i2 == j2, qk[:, None], 0.0)  # the diagonal: q_i . k_i
        tl.store(tm_ptr + ((bidx * 2 + 1) * C + gi * W + i2) * C + gi * W + j2, m_blk)
        for e0 in range(0, V, VT):
            e = e0 + tl.arange(0, VT)
            mv = valid[:, None] & (e[None, :] < V)
            wl = tl.load(w_ptr + n * swn + t[:, None] * swt + h * swh + e[None, :] * swd, mask=mv, other=0.0)
            vl = tl.load(v_ptr + n * svn + t[:, None] * svt + h * svh + e[None, :] * svd, mask=mv, other=0.0)
            tl.store(wv_ptr + (row0 + r[:, None]) * V + e[None, :], wl * vl, mask=e[None, :] < V)
