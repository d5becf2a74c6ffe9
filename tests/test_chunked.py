"""The chunked reference against the token oracle (issue 3): exact in fp64, close in fp32, finite at
extreme gates, for every op and flag, forward and every gradient."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import types
import zlib
from pathlib import Path

import pytest
from child_env import HANG_GUARD_S
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deltacheck import reference as R
from deltacheck.reference import chunked as chunked_mod
from deltacheck.reference import chunked_intra, chunked_replay, chunked_segments, layouts
from deltacheck.reference.chunked import chunked_gdn2
from deltacheck.reference.oracle import token_oracle

F64 = torch.float64
CHUNK = 8
TOL64 = 1e-12
TOL32 = 1e-5
REPO = Path(__file__).resolve().parents[1]


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``sqrt(mean((a-ref)^2)) / sqrt(mean(ref^2))`` in fp64 (absolute when ref is all zero)."""
    a, ref = a.detach().to(F64), ref.detach().to(F64)
    num = (a - ref).pow(2).mean().sqrt()
    den = ref.pow(2).mean().sqrt()
    return float(num / den) if den > 0 else float(num)


def worst(got: dict, ref: dict) -> tuple[float, str]:
    """Worst rel RMS over matching entries, and its name; non-finite counts as infinitely bad."""
    assert got.keys() == ref.keys()
    errs = {n: (rel_rms(got[n], ref[n]) if torch.isfinite(got[n]).all() else math.inf) for n in ref}
    name = max(errs, key=errs.get)
    return errs[name], name


# --- inputs --------------------------------------------------------------------------------------

PROFILES = ("mild", "steep", "extreme")

# Each flag set names a few features at once; every set runs on every op, profile and length.
FLAGSETS = {
    "plain": {},
    "h0": {"h0": True},
    "l2norm": {"use_qk_l2norm_in_kernel": True, "h0": True},
    "sigmoid": {"use_beta_sigmoid_in_kernel": True, "h0": True},
    "negeig": {"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True, "use_qk_l2norm_in_kernel": True},
    "linear": {"gate_domain": "linear", "h0": True},
    "safe": {"safe_gate": True, "a_log": True, "dt_bias": True, "h0": True},
    "scale": {"scale": 0.37, "h0": True},
    "gqa": {"heads": (4, 2, 2), "h0": True},
    "gva": {"heads": (2, 2, 4), "h0": True},
    "ragged": {"ragged": True, "h0": True},
    "bshd": {"layout": "bshd", "h0": True},
    "sbhd": {"layout": "sbhd"},
    "bhsd": {"layout": "bhsd", "h0": True},
}


def log_gate(shape, profile, gen):
    u = torch.rand(*shape, generator=gen, dtype=F64)
    if profile == "mild":
        return torch.log(0.5 + 0.5 * u)
    g = -(u * 4.9 + 0.1)
    if profile == "extreme":
        # -1000 on whole tokens and on single channels
        tok = torch.rand(shape[0], generator=gen) < 0.2
        g[tok] = -1000.0
        g[torch.rand(*shape, generator=gen) < 0.15] = -1000.0
    return g


def build(op, flagset, profile, L, seed=0, K=4, V=3):
    """Public-API call arguments: ``(args, kwargs, leaves)`` with every tensor input a leaf."""
    f = dict(FLAGSETS[flagset])
    gen = torch.Generator().manual_seed(seed)
    H, HK, HV = f.pop("heads", (2, 2, 2))
    HO = max(H, HV)
    layout = f.pop("layout", "thd")
    ragged = f.pop("ragged", False)
    lengths = [0, L, 1, max(L - 1, 0)] if ragged else [L, L]
    N, T = len(lengths), sum(lengths)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    x = {"q": r(T, H, K), "k": r(T, HK, K) / math.sqrt(K), "v": r(T, HV, V)}
    gshape = (T, HO) if op == "gdn" else (T, HO, K)
    g = log_gate(gshape, profile, gen)
    if f.get("gate_domain") == "linear":
        g = g.exp()
    elif f.get("safe_gate"):
        g = -g - 1.0 if op == "gdn" else r(*gshape) * 3  # gdn: softplus of a large argument -> steep decay
    x["g"] = g
    bshape = (T, HO, K) if op == "gdn2" else (T, HO)
    x["beta"] = r(*bshape) if f.get("use_beta_sigmoid_in_kernel") else torch.rand(*bshape, generator=gen, dtype=F64)
    if op == "gdn2":
        x["w"] = torch.rand(T, HO, V, generator=gen, dtype=F64)
    kw = {}
    if f.pop("a_log", False):
        kw["a_log"] = 0.3 * r(HO)
    if f.pop("dt_bias", False):
        kw["dt_bias"] = r(HO) if op == "gdn" else r(HO, K)
    if f.pop("h0", False):
        kw["initial_state"] = r(N, HO, V, K)
    if ragged:
        kw["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    elif layout != "thd":
        x = {n: layouts.from_thd(t, layout, N) for n, t in x.items()}
        kw["layout"] = layout
    else:
        kw["cu_seqlens"] = layouts.dense_cu_seqlens(N, L)
    kw.update(f)
    leaves = {n: t.requires_grad_() for n, t in {**x, **kw}.items() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    return op, x, kw, leaves


def run(built, method, compute_dtype=F64, chunk_size=CHUNK, seed=99):
    """Output, final state and every input gradient of a weighted loss, as a dict of fp64-comparable tensors."""
    op, x, kw, leaves = built
    args = [x["q"], x["k"], x["v"], x["g"], x["beta"]] + ([x["w"]] if op == "gdn2" else [])
    out, st = getattr(R, op)(
        *args, **kw, output_final_state=True, method=method, compute_dtype=compute_dtype, chunk_size=chunk_size
    )
    gen = torch.Generator().manual_seed(seed)
    wo = torch.randn(out.shape, generator=gen, dtype=F64).to(out.dtype)
    ws = torch.randn(st.shape, generator=gen, dtype=F64).to(st.dtype)
    loss = (out * wo).sum() + (st * ws).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {"out": out.detach(), "state": st.detach(), **{f"d{n}": g for n, g in zip(leaves, grads)}}


# --- fp64 exact, fp32 close, finite -----------------------------------------------------------------


@pytest.mark.parametrize("L", [CHUNK - 1, CHUNK, CHUNK + 1])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("flagset", list(FLAGSETS))
@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_chunked_matches_oracle(op, flagset, profile, L):
    built = build(op, flagset, profile, L, seed=zlib.crc32(f"{op}-{flagset}-{profile}-{L}".encode()) % 1000)
    ref = run(built, "oracle")
    assert all(torch.isfinite(t).all() for t in ref.values())
    err64, name64 = worst(run(built, "chunked"), ref)
    assert err64 <= TOL64, f"fp64 chunked vs oracle: {name64} rel RMS {err64:.2e}"
    err32, name32 = worst(run(built, "chunked", compute_dtype=torch.float32), ref)
    assert err32 <= TOL32, f"fp32 chunked vs fp64 oracle: {name32} rel RMS {err32:.2e}"


@pytest.mark.parametrize("chunk_size,L,K,V", [(16, 33, 16, 16), (64, 130, 8, 12), (1, 5, 4, 3), (3, 11, 4, 3)])
def test_larger_chunks_and_odd_chunk_sizes(chunk_size, L, K, V):
    built = build("gdn2", "h0", "extreme", L, seed=3, K=K, V=V)
    ref = run(built, "oracle")
    err, name = worst(run(built, "chunked", chunk_size=chunk_size), ref)
    assert err <= TOL64, f"{name}: {err:.2e}"
    err, name = worst(run(built, "chunked", compute_dtype=torch.float32, chunk_size=chunk_size), ref)
    assert err <= TOL32, f"{name}: {err:.2e}"


# --- the core directly: infinite decay, segments, dtypes ---------------------------------------------


def core_inputs(N=2, L=21, H=2, K=8, V=5, kg=8, seed=0, inf=True, kb=None, vw=None):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=F64)  # noqa: E731
    k = torch.nn.functional.normalize(r(N, L, H, K), dim=-1)
    g = -(u(N, L, H, kg) * 4.9 + 0.1)
    if inf:
        g[u(N, L, H, kg) < 0.15] = -math.inf
        g[u(N, L, H, kg) < 0.15] = -1e30
    return [r(N, L, H, K), k, r(N, L, H, V), g, 2 * u(N, L, H, kb or K), u(N, L, H, vw or V), r(N, H, K, V)]


def core_run(fn, ins, dtype=F64, **kw):
    leaves = [t.to(dtype).requires_grad_() for t in ins]
    o, s = fn(*leaves, 0.5, **kw)
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=F64).to(dtype)).sum()
    loss = loss + (s * torch.randn(s.shape, generator=gen, dtype=F64).to(dtype)).sum()
    names = ["dq", "dk", "dv", "dg", "db", "dw", "dh0"]
    return {"out": o, "state": s, **dict(zip(names, torch.autograd.grad(loss, leaves)))}


@pytest.mark.parametrize("kg", [1, 8])
def test_infinite_decay_is_finite_and_exact(kg):
    ins = core_inputs(kg=kg)
    ref = core_run(token_oracle, ins)
    assert all(torch.isfinite(t).all() for t in ref.values())
    err, name = worst(core_run(chunked_gdn2, ins, chunk_size=8), ref)
    assert err <= TOL64, f"{name}: {err:.2e}"
    err, name = worst(core_run(chunked_gdn2, ins, dtype=torch.float32, chunk_size=8), ref)
    assert err <= TOL32, f"{name}: {err:.2e}"


@pytest.mark.parametrize("kw", [{"segment_tokens": 8}, {"segment_tokens": 16, "use_checkpoint": False}, {}])
def test_segments_and_checkpointing_change_nothing(kw):
    ins = core_inputs(L=37, inf=False)
    ref = core_run(chunked_gdn2, ins, chunk_size=8, segment_tokens=1 << 20, use_checkpoint=False)
    got = core_run(chunked_gdn2, ins, chunk_size=8, **kw)
    err, name = worst(got, ref)
    assert err <= 1e-14, f"{name}: {err:.2e}"


# Gate widths: GDN2 (per channel), GDN (one decay, erase and write gate per token: [.., 1]), KDA (per-channel
# decay, scalar erase and write).
WIDTHS = {"gdn2": (8, 8, 5), "gdn": (1, 1, 1), "kda": (8, 1, 1)}


@pytest.mark.parametrize("chunk_size,L,seg", [(8, 37, 16), (16, 64, 16), (4, 11, None), (1, 5, None)])
@pytest.mark.parametrize("widths", list(WIDTHS))
def test_handwritten_backward_is_autograds(widths, chunk_size, L, seg):
    """The autograd.Function's hand-written backward against autograd differentiating the same forward
    (use_checkpoint=False), at infinite and -1000 decays, for every gate width: equal to rounding."""
    kg, kb, vw = WIDTHS[widths]
    ins = core_inputs(L=L, kg=kg, kb=kb, vw=vw, seed=L)  # -inf and -1e30 on 15 % of the decays each
    g = ins[3][:, :2]
    g[g > -1] = -1000.0
    ref = core_run(chunked_gdn2, ins, chunk_size=chunk_size, segment_tokens=seg, use_checkpoint=False)
    got = core_run(chunked_gdn2, ins, chunk_size=chunk_size, segment_tokens=seg)
    err, name = worst(got, ref)
    assert err <= 1e-14, f"{name}: {err:.2e}"


def test_forward_without_autograd_is_the_recorded_forward():
    """Without autograd the forward writes in place and into buffers; it is the same arithmetic."""
    ins = core_inputs(L=45)
    with torch.no_grad():
        fast = chunked_gdn2(*ins, 0.5, chunk_size=8, segment_tokens=16)
    leaves = [t.clone().requires_grad_() for t in ins]
    recorded = chunked_gdn2(*leaves, 0.5, chunk_size=8, segment_tokens=16, use_checkpoint=False)
    for a, b in zip(fast, recorded):
        assert rel_rms(a, b) <= 1e-15


class _MatmulDtypes(TorchDispatchMode):
    """Records the dtypes of every matrix product's operands."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("bmm", "baddbmm", "mm", "addmm", "matmul"):
            self.seen |= {a.dtype for a in args if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_baseline_matmuls_run_in_the_io_dtype(dtype):
    """The baseline is a plain same-precision implementation: none of its matrix products, forward or
    backward, is silently upcast (only the log-decay sums run in fp64, elementwise)."""
    leaves = [t.to(dtype).requires_grad_() for t in core_inputs(L=19)]
    with _MatmulDtypes() as mode:
        o, s = chunked_gdn2(*leaves, 0.5, chunk_size=8)
        torch.autograd.backward((o, s), (torch.ones_like(o), torch.ones_like(s)))
    assert mode.seen == {dtype}


def test_a_failing_compile_falls_back_to_eager(monkeypatch):
    """compile_intra=True where torch.compile cannot run: one warning, then the eager result, exactly."""
    ins = core_inputs(L=19, inf=False)
    want = core_run(chunked_gdn2, ins, chunk_size=8)

    def broken_compile(fn, **kw):
        def compiled(*a, **k):
            raise RuntimeError("no compiler here")
        return compiled

    monkeypatch.setattr(chunked_segments, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", broken_compile)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        got = core_run(chunked_gdn2, ins, chunk_size=8, compile_intra=True)
    err, name = worst(got, want)
    assert err == 0.0, f"{name}: {err:.2e}"


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_half_precision_baseline_runs_in_its_dtype(dtype, tol):
    ins = core_inputs(L=19)
    ref = core_run(token_oracle, ins)
    got = core_run(chunked_gdn2, ins, dtype=dtype, chunk_size=8)
    assert got["out"].dtype == dtype and got["state"].dtype == dtype
    err, name = worst(got, ref)
    assert err <= tol, f"{name}: {err:.2e}"


def test_empty_and_single_token():
    ins = core_inputs(L=1)
    err, name = worst(core_run(chunked_gdn2, ins), core_run(token_oracle, ins))
    assert err <= TOL64, f"{name}: {err:.2e}"
    empty = [t[:, :0] if t.dim() == 4 and i < 6 else t for i, t in enumerate(ins)]
    o, s = chunked_gdn2(*empty, 0.5)
    assert o.shape == (2, 0, 2, 5) and torch.equal(s, ins[6])


# --- the forms chosen for CUDA, and the backward replayed from a CUDA graph, checked on the CPU ----------------


@pytest.mark.parametrize("chunk_size,L", [(8, 37), (16, 50), (64, 130)])
@pytest.mark.parametrize("widths", list(WIDTHS))
def test_the_cuda_forms_are_exact_on_the_cpu(monkeypatch, widths, chunk_size, L):
    """On CUDA the small levels take their blocks from grouped products and write the inverse's and the
    backward's smallest products out as sums (``chunked_intra.cuda_shapes``). Forced on the CPU, at infinite and
    -1000 decays: exact against the oracle, and the hand-written backward still autograd's."""
    monkeypatch.setattr(chunked_intra, "cuda_shapes", lambda x: True)
    kg, kb, vw = WIDTHS[widths]
    ins = core_inputs(L=L, kg=kg, kb=kb, vw=vw, seed=L)  # -inf and -1e30 on 15 % of the decays each
    g = ins[3][:, :2]
    g[g > -1] = -1000.0
    ref = core_run(token_oracle, ins)
    got = core_run(chunked_gdn2, ins, chunk_size=chunk_size, segment_tokens=2 * chunk_size)
    err, name = worst(got, ref)
    assert err <= TOL64, f"{name}: {err:.2e}"
    autograd = core_run(chunked_gdn2, ins, chunk_size=chunk_size, segment_tokens=2 * chunk_size, use_checkpoint=False)
    err, name = worst(got, autograd)
    assert err <= 1e-14, f"{name}: {err:.2e}"


@pytest.mark.parametrize("chunk_size,L,seg", [(8, 37, 16), (16, 64, 32), (16, 50, None)])
@pytest.mark.parametrize("widths", list(WIDTHS))
def test_fewer_passes_change_no_bit(monkeypatch, widths, chunk_size, L, seg):
    """Issue 28's byte cuts: the backward's recompute keeping v, w, b as views of the inputs
    (``chunked_intra.KEEP_VIEWS``) and writing each gradient straight into its tensor (``chunked_segments.
    DIRECT_GRADS``; segments of whole chunks, and a padded last chunk that takes the copy) give the gradients of
    the copying forms bit for bit, at infinite and -1000 decays."""
    kg, kb, vw = WIDTHS[widths]
    ins = core_inputs(L=L, kg=kg, kb=kb, vw=vw, seed=L)
    g = ins[3][:, :2]
    g[g > -1] = -1000.0
    kw = dict(chunk_size=chunk_size, segment_tokens=seg)
    monkeypatch.setattr(chunked_intra, "KEEP_VIEWS", False)
    monkeypatch.setattr(chunked_segments, "DIRECT_GRADS", False)
    copying = core_run(chunked_gdn2, ins, **kw)
    monkeypatch.setattr(chunked_intra, "KEEP_VIEWS", True)
    monkeypatch.setattr(chunked_segments, "DIRECT_GRADS", True)
    fewer = core_run(chunked_gdn2, ins, **kw)
    assert copying.keys() == fewer.keys()
    for name in copying:
        assert torch.equal(copying[name], fewer[name]), name


def test_the_handoff_is_sliced_by_device_and_slicing_changes_nothing(monkeypatch):
    """The forward's hand-off is made in CUDA_HANDOFF_SLICES parts on a GPU and CPU_HANDOFF_SLICES elsewhere unless
    HANDOFF_SLICES is set (issue 28, session 9: fewer launches pay on the H200; the CPU path keeps its four); and
    however many parts, the output and the end state are the same within rounding (1, 2, 3 and 7 parts, a ragged
    last part, -1000 decays)."""
    monkeypatch.setattr(chunked_segments, "HANDOFF_SLICES", None)
    on_gpu = types.SimpleNamespace(is_cuda=True)
    assert chunked_segments.handoff_slices(torch.zeros(1)) == chunked_segments.CPU_HANDOFF_SLICES == 4
    assert chunked_segments.handoff_slices(on_gpu) == chunked_segments.CUDA_HANDOFF_SLICES == 2
    monkeypatch.setattr(chunked_segments, "HANDOFF_SLICES", 3)
    assert chunked_segments.handoff_slices(on_gpu) == chunked_segments.handoff_slices(torch.zeros(1)) == 3
    ins = core_inputs(L=83, seed=5)
    g = ins[3][:, :2]
    g[g > -1] = -1000.0
    outs = {}
    for n in (1, 2, 3, 7):
        monkeypatch.setattr(chunked_segments, "HANDOFF_SLICES", n)
        with torch.no_grad():
            outs[n] = chunked_gdn2(*ins, 0.4, chunk_size=8)
    for n in (2, 3, 7):
        for got, ref in zip(outs[n], outs[1]):
            assert torch.isfinite(got).all()
            assert float((got - ref).abs().max()) <= 1e-14 * float(ref.abs().max()), n


def _fake_graphs(monkeypatch, capture):
    """Let the backward's segment replayer run on the CPU: no streams, ``capture`` in place of the CUDA graph."""
    monkeypatch.setattr(chunked_replay.SegmentReplay, "disabled", False)
    monkeypatch.setattr(chunked_replay.SegmentReplay, "warmed", set())
    monkeypatch.setattr(chunked_replay.SegmentReplay, "kept", {})
    monkeypatch.setattr(chunked_replay, "_SIDE_STREAMS", {})
    monkeypatch.setattr(chunked_replay.SegmentReplay, "applies", staticmethod(lambda x, n_full: n_full >= 2))
    monkeypatch.setattr(chunked_replay, "new_stream", lambda: None)
    monkeypatch.setattr(chunked_replay, "on_side_stream", lambda side, fn: fn())
    monkeypatch.setattr(chunked_replay, "capture", capture)


def test_backward_replayed_from_a_graph_is_the_eager_backward(monkeypatch):
    """Segments replayed from a (faked) graph: the first runs as the warm-up, the second is captured, the later
    ones copy their inputs into the static buffers and overwrite the same outputs, the short last one runs
    eagerly. The gradients are the eager backward's, bit for bit."""
    captures = []

    def capture(side, fn, kind=None):
        outs = fn()  # what a capture leaves: the buffers every replay writes
        captures.append(outs)

        def replay():
            fresh = fn()
            for dst, src in zip([*outs[0], outs[1]], [*fresh[0], fresh[1]]):
                dst.copy_(src)
            return outs

        return replay

    ins = core_inputs(L=45, inf=True)
    want = core_run(chunked_gdn2, ins, chunk_size=8, segment_tokens=8)
    _fake_graphs(monkeypatch, capture)
    got = core_run(chunked_gdn2, ins, chunk_size=8, segment_tokens=8, graph_backward=True)
    assert len(captures) == 1  # five full segments: one warm-up, one capture, three more replays
    for name in want:
        assert torch.equal(got[name], want[name]), name


def _fake_capture(captures):
    """A fake capture: the outputs of one run stand for the graph's buffers; a replay runs the segment again and
    copies its results into them."""

    def capture(side, fn, kind=None):
        outs = fn()
        captures.append(outs)

        def replay():
            for dst, src in zip(list(chunked_replay._tensors(outs)), list(chunked_replay._tensors(fn()))):
                dst.copy_(src)
            return outs

        return replay

    return capture


def test_forward_replayed_from_a_graph_is_the_eager_forward(monkeypatch):
    """The forward's segments replayed from a (faked) graph, without autograd and under the hand-written backward
    (whose start states it keeps, two per forward segment here): output, state and gradients bit for bit."""
    ins = core_inputs(L=61, inf=True)
    # 256 bytes per token: 8-token backward segments, 16-token forward segments when replayed
    monkeypatch.setattr(chunked_mod, "BACKWARD_SEGMENT_BYTES", 8 * 256)
    monkeypatch.setattr(chunked_mod, "GRAPH_BACKWARD_SEGMENT_BYTES", 8 * 256)
    monkeypatch.setattr(chunked_mod, "GRAPH_FORWARD_SEGMENT_BYTES", 16 * 256)
    want = core_run(chunked_gdn2, ins, chunk_size=8)
    with torch.no_grad():
        want_o, want_s = chunked_gdn2(*ins, 0.5, chunk_size=8)
    captures = []
    _fake_graphs(monkeypatch, _fake_capture(captures))
    with torch.no_grad():
        got_o, got_s = chunked_gdn2(*ins, 0.5, chunk_size=8, graph_forward=True)
    assert len(captures) == 1  # three full 16-token segments: warm-up, capture + replay, replay; a short one eager
    assert torch.equal(got_o, want_o) and torch.equal(got_s, want_s)
    got = core_run(chunked_gdn2, ins, chunk_size=8, graph_forward=True, graph_backward=True)
    assert len(captures) == 3
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_a_kept_graph_is_replayed_only_for_the_same_shapes_and_plan(monkeypatch):
    """KEEP_LAST: a later backward whose segments have the same shapes (another sequence length, other inputs)
    replays the kept graph with its inputs, without a capture, bit for bit the eager result; another segment
    length, or another chunk, captures anew."""
    captures = []
    _fake_graphs(monkeypatch, _fake_capture(captures))
    monkeypatch.setattr(chunked_replay, "KEEP_LAST", True)
    for seed, L, chunk, seg, n in ((0, 45, 8, 8, 1), (1, 37, 8, 8, 1), (2, 45, 8, 16, 2), (3, 45, 4, 16, 3)):
        ins = core_inputs(L=L, inf=True, seed=seed)
        want = core_run(chunked_gdn2, ins, chunk_size=chunk, segment_tokens=seg)
        got = core_run(chunked_gdn2, ins, chunk_size=chunk, segment_tokens=seg, graph_backward=True)
        assert len(captures) == n, (seed, len(captures))
        for name in want:
            assert torch.equal(got[name], want[name]), (seed, name)


def test_a_failing_graph_capture_falls_back_to_eager(monkeypatch):
    def capture(side, fn, kind=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    ins = core_inputs(L=37, inf=False)
    want = core_run(chunked_gdn2, ins, chunk_size=8, segment_tokens=8, graph_backward=False)
    _fake_graphs(monkeypatch, capture)
    with pytest.warns(UserWarning, match="CUDA graph capture of the backward failed"):
        got = core_run(chunked_gdn2, ins, chunk_size=8, segment_tokens=8, graph_backward=True)
    assert chunked_replay.SegmentReplay.disabled
    for name in want:
        assert torch.equal(got[name], want[name]), name

# --- the comparison can fail --------------------------------------------------------------------------


def test_a_broken_core_is_caught(monkeypatch):
    """Drop the decay of the last token in every chunk: the same comparison must flag it."""
    real = chunked_mod.chunked_gdn2

    def broken(q, k, v, g, b, w, h0, scale, **kw):
        g = g.clone()
        g[:, CHUNK - 1 :: CHUNK] = 0.0
        return real(q, k, v, g, b, w, h0, scale, **kw)

    built = build("kda", "h0", "steep", CHUNK + 1, seed=5)
    ref = run(built, "oracle")
    monkeypatch.setattr(chunked_mod, "chunked_gdn2", broken)
    err, _ = worst(run(built, "chunked"), ref)
    assert err > 1e-3


# --- the benchmark script runs end to end -------------------------------------------------------------


def test_bench_quick_runs():
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "chunked.py"), "--quick", "--device", "cpu"],
        capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("chunked fp64 fwd", "chunked fp64 fwd+bwd", "previous fp64 fwd+bwd", "oracle fp64 fwd"):
        assert row in proc.stdout, row
    assert "fp64 GFLOP/s (of peak)" in proc.stdout and "counted on the meta device" in proc.stdout


def _bench_common():
    spec = importlib.util.spec_from_file_location("_bench_common_test", REPO / "bench" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_peaks_from_the_device_else_the_datasheet(monkeypatch):
    """The peaks the benchmark divides by: an H200's own numbers (132 SMs x 1.98 GHz x 256 fp64 FLOP per clock
    and SM; 3.201 GHz x 2 x 6016 bit / 8), else, where torch reports no clocks and nvidia-smi is not there,
    the datasheet's, with its source."""
    common = _bench_common()
    h200 = dict(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132)
    clocks = dict(clock_rate=1980000, memory_clock_rate=3201000, memory_bus_width=6016)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(**h200, **clocks))
    peaks = common.device_peaks(torch.device("cuda", 0))
    assert peaks["fp64_flop_s"] == pytest.approx(66.9e12, rel=1e-3)
    assert peaks["bytes_s"] == pytest.approx(4.814e12, rel=1e-3)
    assert "132 SMs" in peaks["fp64_source"] and "6016 bit" in peaks["bytes_source"]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(**h200))
    monkeypatch.setattr(common, "_smi_max_sm_clock_hz", lambda index: None)
    peaks = common.device_peaks(torch.device("cuda", 0))
    assert (peaks["fp64_flop_s"], peaks["bytes_s"]) == (66.9e12, 4.8e12)
    assert "datasheet" in peaks["fp64_source"] and "datasheet" in peaks["bytes_source"]
    assert common.device_peaks(torch.device("cpu")) is None


def test_gpu_size_memory_and_launches(tmp_path):
    """At the GPU benchmark's size (N=4, T=4096, H=16, K=V=128, fp64), counted on the meta device by
    ``bench/chunked.py --count``: the peak stays within the 3 GiB target forward and forward+backward (the
    inputs' gradients included), and the kernel launches and bytes moved of this launch- and bandwidth-bound
    work stay near what issue 17 brought them to (160 / 2144 kernels, 27 GB forward)."""
    out = tmp_path / "count.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "chunked.py"), "--count", "--no-previous", "--json", str(out)],
        capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = json.loads(out.read_text())["counts"]
    fwd, both = counts["chunked fp64 fwd"], counts["chunked fp64 fwd+bwd"]
    assert fwd["peak_bytes"] <= 3 * 2**30 and both["peak_bytes"] <= 3 * 2**30, (fwd, both)
    assert fwd["kernels"] <= 200 and both["kernels"] <= 2500, (fwd, both)
    assert fwd["bytes"] <= 30e9, fwd


def test_bench_settle_runs_until_its_time_is_up(monkeypatch):
    """bench/common.settle: at least one call, then calls until the seconds are up; it reports their number."""
    common = _bench_common()
    clock = iter(range(100))
    monkeypatch.setattr(common.time, "perf_counter", lambda: float(next(clock)))
    calls = []
    n, last = common.settle(lambda: calls.append(1), torch.device("cpu"), 5.0)
    assert n == len(calls) == 2 and last == 1000.0  # three ticks a call (start, end, the check): 3 < 5, then 6
    assert common.settle(lambda: calls.append(1), torch.device("cpu"), 0.0)[0] == 1
