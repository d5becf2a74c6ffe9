"""The token oracle and the public reference API (issue 2)."""

from __future__ import annotations

import math

import pytest
import torch

from deltacheck import reference as R
from deltacheck.reference import ReferenceInputError, layouts

F64 = torch.float64


def rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.to(F64)
    den = ref.pow(2).mean().sqrt()
    num = (a.to(F64) - ref).pow(2).mean().sqrt()
    return float(num / den) if den > 0 else float(num)


def make(op, T=9, H=2, HK=None, HV=None, K=4, V=3, seed=0, dtype=F64, gen_gate="steep"):
    """Random inputs in thd for one op; gates in the op's shapes."""
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H
    HK = HK or H
    HO = max(H, HV)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=dtype)  # noqa: E731
    gshape = (T, HO) if op == "gdn" else (T, HO, K)
    bshape = (T, HO, K) if op == "gdn2" else (T, HO)
    x = {
        "q": r(T, H, K), "k": r(T, HK, K) / math.sqrt(K), "v": r(T, HV, V),
        "g": -(u(*gshape) * 4.9 + 0.1) if gen_gate == "steep" else torch.log(0.5 + 0.5 * u(*gshape)),
        "beta": u(*bshape),
    }
    if op == "gdn2":
        x["w"] = u(T, HO, V)
    return x


def call(op, x, **kw):
    fn = getattr(R, op)
    args = [x["q"], x["k"], x["v"], x["g"], x["beta"]] + ([x["w"]] if op == "gdn2" else [])
    return fn(*args, **kw)


# --- worked by hand ------------------------------------------------------------------------------
# K = 2, V = 1, scale = 1. Token 1: q=[1,1], k=[1,0], v=[2], no decay. Token 2: q=[0,1], k=[1,1], v=[1],
# decay 0.5 on key channel 0 (and on both channels for GDN).


def _t(rows):
    return torch.tensor(rows, dtype=F64)


def test_gdn2_worked_by_hand():
    q, k, v = _t([[[1, 1]], [[0, 1]]]), _t([[[1, 0]], [[1, 1]]]), _t([[[2]], [[1]]])
    g = _t([[[0, 0]], [[math.log(0.5), 0]]])
    b = _t([[[0.5, 0.5]], [[1, 0.5]]])
    w = _t([[[1]], [[0.5]]])
    out, s = R.gdn2(q, k, v, g, b, w, scale=1.0, output_final_state=True)
    # t1: S = k1 (w1 v1)^T = [[2],[0]], o1 = 2.
    # t2: decay -> [[1],[0]]; erase reads S^T(b2*k2) = 1; S += k2 (0.5*1 - 1) -> [[0.5],[-0.5]]; o2 = -0.5.
    assert out.flatten().tolist() == [2.0, -0.5]
    assert s.flatten().tolist() == [0.5, -0.5]  # [N, HO, V, K] = [[0.5, -0.5]]


def test_kda_worked_by_hand():
    q, k, v = _t([[[1, 1]], [[0, 1]]]), _t([[[1, 0]], [[1, 1]]]), _t([[[2]], [[1]]])
    g = _t([[[0, 0]], [[math.log(0.5), 0]]])
    beta = _t([[0.5], [1.0]])
    out, s = R.kda(q, k, v, g, beta, scale=1.0, output_final_state=True)
    # t1: S = 0.5 k1 v1^T = [[1],[0]], o1 = 1.
    # t2: decay -> [[0.5],[0]]; S^T k2 = 0.5; S += 1 * k2 (1 - 0.5) -> [[1],[0.5]]; o2 = 0.5.
    assert out.flatten().tolist() == [1.0, 0.5]
    assert s.flatten().tolist() == [1.0, 0.5]


def test_gdn_worked_by_hand():
    q, k, v = _t([[[1, 1]], [[0, 1]]]), _t([[[1, 0]], [[1, 1]]]), _t([[[2]], [[1]]])
    g = _t([[0.0], [math.log(0.5)]])
    beta = _t([[0.5], [1.0]])
    h0 = _t([[[[0.0, 2.0]]]])  # [N=1, HO=1, V=1, K=2]: S0 = [[0],[2]]
    out, s = R.gdn(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True)
    # t1: S0^T k1 = 0; S = [[0],[2]] + 0.5 k1 (2 - 0) = [[1],[2]]; o1 = 3.
    # t2: decay -> [[0.5],[1]]; S^T k2 = 1.5; S += k2 (1 - 1.5) = [[0],[0.5]]; o2 = 0.5.
    assert out.flatten().tolist() == [3.0, 0.5]
    assert s.flatten().tolist() == [0.0, 0.5]


def test_single_token_default_scale():
    # T=1, zero state: o = (q.k / sqrt(K)) * beta * v.
    q, k, v = _t([[[1, 2, 0, 1]]]), _t([[[1, 1, 1, 0]]]), _t([[[4, -2]]])
    out, _ = R.gdn(q, k, v, _t([[-0.3]]), _t([[0.25]]))
    assert torch.allclose(out, (3 / 2) * 0.25 * v, rtol=0, atol=1e-15)


def test_oracle_matches_matrix_form():
    """An independent transcription: S_t = (I - k (b*k)^T) Diag(exp g) S + k (w*v)^T, one head at a time."""
    x = make("gdn2", T=6, H=1, K=3, V=2, seed=3)
    out, s = call("gdn2", x, scale=0.7, output_final_state=True, state_layout="kv")
    S = torch.zeros(3, 2, dtype=F64)
    for t in range(6):
        kt, bt, wt, vt = x["k"][t, 0], x["beta"][t, 0], x["w"][t, 0], x["v"][t, 0]
        erase = torch.eye(3, dtype=F64) - torch.outer(kt, bt * kt)
        S = erase @ torch.diag(torch.exp(x["g"][t, 0])) @ S + torch.outer(kt, wt * vt)
        assert torch.allclose(out[t, 0], 0.7 * S.T @ x["q"][t, 0], rtol=1e-13, atol=1e-14)
    assert torch.allclose(s[0, 0], S, rtol=1e-13, atol=1e-14)


# --- reductions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [{}, {"use_qk_l2norm_in_kernel": True}, {"gate_domain": "linear"}])
def test_gdn2_with_scalar_gates_is_kda(flags):
    x = make("kda", T=11, H=2, K=4, V=3, seed=1)
    if flags.get("gate_domain") == "linear":
        x["g"] = x["g"].exp()
    kda_out, kda_s = call("kda", x, output_final_state=True, **flags)
    beta = x["beta"]
    y = dict(x, beta=beta.unsqueeze(-1).expand(-1, -1, 4), w=beta.unsqueeze(-1).expand(-1, -1, 3))
    g2_out, g2_s = call("gdn2", y, output_final_state=True, **flags)
    assert rel_rms(g2_out, kda_out) <= 1e-14 and rel_rms(g2_s, kda_s) <= 1e-14


def test_kda_with_uniform_decay_is_gdn():
    x = make("gdn", T=11, H=2, K=4, V=3, seed=2)
    gdn_out, gdn_s = call("gdn", x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    y = dict(x, g=x["g"].unsqueeze(-1).expand(-1, -1, 4))
    kda_out, kda_s = call("kda", y, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel_rms(kda_out, gdn_out) <= 1e-14 and rel_rms(kda_s, gdn_s) <= 1e-14


# --- flags ---------------------------------------------------------------------------------------


def test_flag_formulas_match_explicit_preprocessing():
    """Each flag equals doing its formula by hand and calling the op without it."""
    x = make("gdn2", T=7, H=2, K=4, V=3, seed=4)
    x["beta"] = torch.randn_like(x["beta"])  # logits
    out, _ = call("gdn2", x, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    y = dict(x, q=l2(x["q"]), k=l2(x["k"]), beta=2 * torch.sigmoid(x["beta"]))
    assert rel_rms(out, call("gdn2", y)[0]) <= 1e-14

    alpha = torch.rand(7, 2, 4, dtype=F64) * 0.9 + 0.05
    lin, _ = call("gdn2", dict(x, g=alpha, beta=x["beta"].sigmoid()), gate_domain="linear")
    log, _ = call("gdn2", dict(x, g=torch.log(alpha + 1e-10), beta=x["beta"].sigmoid()))
    assert rel_rms(lin, log) <= 1e-15


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_safe_gate_formulas(op):
    x = make(op, T=6, H=2, K=4, V=3, seed=5)
    raw = torch.randn_like(x["g"])
    a_log = torch.tensor([0.3, -0.2], dtype=F64)
    dt_bias = torch.randn(2, dtype=F64) if op == "gdn" else torch.randn(2, 4, dtype=F64)
    out, _ = call(op, dict(x, g=raw), safe_gate=True, a_log=a_log, dt_bias=dt_bias)
    if op == "gdn":
        g_eff = -a_log.exp() * torch.nn.functional.softplus(raw + dt_bias)
    else:
        g_eff = -5.0 * torch.sigmoid(a_log.exp()[:, None] * (raw + dt_bias))
    assert rel_rms(out, call(op, dict(x, g=g_eff))[0]) <= 1e-14
    if op != "gdn":  # absent a_log means exp(a_log) = 1, absent dt_bias means 0; custom lower bound
        out, _ = call(op, dict(x, g=raw), safe_gate=True, gate_lower_bound=-2.0)
        assert rel_rms(out, call(op, dict(x, g=-2.0 * torch.sigmoid(raw)))[0]) <= 1e-14


@pytest.mark.parametrize("H,HK,HV", [(4, 2, 2), (2, 2, 4), (4, 4, 2), (2, 4, 4)])
def test_head_mapping_groups_consecutive_heads(H, HK, HV):
    """cuDNN maps output head h to input head h // (HO // Hx) (repeat_interleave, not tiling)."""
    HO = max(H, HV)
    x = make("kda", T=5, H=H, HK=HK, HV=HV, K=4, V=3, seed=6)
    out, s = call("kda", x, output_final_state=True)
    assert out.shape == (5, HO, 3) and s.shape == (1, HO, 3, 4)
    for h in range(HO):
        one = {
            "q": x["q"][:, [h // (HO // H)]], "k": x["k"][:, [h // (HO // HK)]], "v": x["v"][:, [h // (HO // HV)]],
            "g": x["g"][:, [h]], "beta": x["beta"][:, [h]],
        }
        o1, s1 = call("kda", one, output_final_state=True)
        assert torch.equal(o1[:, 0], out[:, h]) and torch.equal(s1[:, 0], s[:, h])
    assert R.head_index(4, 2).tolist() == [0, 0, 1, 1]


# --- packing, layouts, continuation ----------------------------------------------------------------


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_packed_equals_per_sequence_with_empty_and_unit_lengths(op):
    lengths = [3, 0, 1, 5]
    x = make(op, T=sum(lengths), H=2, HV=4, HK=2, K=4, V=3, seed=7)
    h0 = torch.randn(4, 4, 3, 4, dtype=F64)
    cu = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32)
    out, s = call(op, x, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {name: t[a:b] for name, t in x.items()}
        o_n, s_n = call(op, part, initial_state=h0[n : n + 1], output_final_state=True)
        assert torch.allclose(out[a:b], o_n, rtol=0, atol=1e-14)
        assert torch.allclose(s[n : n + 1], s_n, rtol=0, atol=1e-14)
    assert torch.equal(s[1], h0[1])  # an empty sequence's final state is its initial state


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_layouts_round_trip_bitwise(layout):
    x = torch.randn(3, 5, 2, 4)  # bshd
    dense = layouts.convert(x, "bshd", layout)
    assert torch.equal(layouts.convert(dense, layout, "bshd"), x)
    packed = layouts.to_thd(dense, layout)
    assert torch.equal(packed, x.reshape(15, 2, 4))
    assert torch.equal(layouts.from_thd(packed, layout, 3), dense)
    gate = torch.randn(3, 5, 2)  # a gate with no feature axis
    assert torch.equal(layouts.to_thd(layouts.convert(gate, "bshd", layout), layout), gate.reshape(15, 2))
    st = torch.randn(3, 2, 4, 5)
    assert torch.equal(layouts.state_convert(layouts.state_convert(st, "vk", "kv"), "kv", "vk"), st)
    seqs = [torch.randn(n, 2, 4) for n in (2, 0, 3)]
    packed, cu = layouts.pack(seqs)
    assert cu.tolist() == [0, 2, 2, 5] and all(torch.equal(a, b) for a, b in zip(layouts.unpack(packed, cu), seqs))


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_dense_layouts_match_thd(op, layout):
    N, L = 3, 4
    x = make(op, T=N * L, H=2, K=4, V=3, seed=8)
    h0 = torch.randn(N, 2, 3, 4, dtype=F64)
    ref_out, ref_s = call(op, x, cu_seqlens=layouts.dense_cu_seqlens(N, L), initial_state=h0, output_final_state=True)
    dense = {name: layouts.from_thd(t, layout, N) for name, t in x.items()}
    out, s = call(op, dense, layout=layout, initial_state=h0, output_final_state=True)
    assert torch.equal(layouts.to_thd(out, layout), ref_out) and torch.equal(s, ref_s)


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
@pytest.mark.parametrize("split", [1, 6, 12])
def test_state_continuation(op, split):
    x = make(op, T=13, H=2, K=4, V=3, seed=9)
    h0 = torch.randn(1, 2, 3, 4, dtype=F64)
    full, s_full = call(op, x, initial_state=h0, output_final_state=True)
    first = {n: t[:split] for n, t in x.items()}
    rest = {n: t[split:] for n, t in x.items()}
    o1, s1 = call(op, first, initial_state=h0, output_final_state=True)
    o2, s2 = call(op, rest, initial_state=s1, output_final_state=True)
    assert rel_rms(torch.cat([o1, o2]), full) <= 1e-14 and rel_rms(s2, s_full) <= 1e-14


def test_kv_state_layout_is_the_transpose():
    x = make("gdn2", T=5, seed=10)
    h0 = torch.randn(1, 2, 3, 4, dtype=F64)
    _, s_vk = call("gdn2", x, initial_state=h0, output_final_state=True)
    _, s_kv = call("gdn2", x, initial_state=h0.transpose(-1, -2), output_final_state=True, state_layout="kv")
    assert torch.equal(s_kv, s_vk.transpose(-1, -2))


def test_compute_dtype_float32_is_close_to_float64():
    x = make("gdn2", T=20, seed=11)
    o64, _ = call("gdn2", x)
    o32, _ = call("gdn2", {n: t.float() for n, t in x.items()}, compute_dtype=torch.float32)
    assert o32.dtype == torch.float32 and rel_rms(o32, o64) < 1e-5


# --- gradients -----------------------------------------------------------------------------------

GRAD_FLAGS = [
    {},
    {"use_qk_l2norm_in_kernel": True},
    {"use_beta_sigmoid_in_kernel": True},
    {"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True},
    {"gate_domain": "linear"},
    {"safe_gate": True},
    {"safe_gate": True, "a_log": True, "dt_bias": True},
    {"scale": 0.37},
]


@pytest.mark.parametrize("flags", GRAD_FLAGS, ids=lambda f: "-".join(f) or "plain")
@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_gradcheck_every_input(op, flags):
    flags = dict(flags)
    x = make(op, T=4, H=1, HV=2, K=3, V=2, seed=12)
    if flags.get("gate_domain") == "linear":
        x["g"] = x["g"].exp()
    if flags.get("safe_gate"):
        x["g"] = torch.randn_like(x["g"])
    extra = {}
    if flags.pop("a_log", False):
        extra["a_log"] = torch.randn(2, dtype=F64)
    if flags.pop("dt_bias", False):
        extra["dt_bias"] = torch.randn(2, dtype=F64) if op == "gdn" else torch.randn(2, 3, dtype=F64)
    cu = torch.tensor([0, 1, 4])
    extra["initial_state"] = torch.randn(2, 2, 2, 3, dtype=F64)
    names = list(x) + list(extra)
    leaves = [t.clone().requires_grad_() for t in list(x.values()) + list(extra.values())]

    def fn(*ts):
        d = dict(zip(names, ts))
        kw = {n: d[n] for n in extra}
        o, s = call(op, d, cu_seqlens=cu, output_final_state=True, **kw, **flags)
        return o, s

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# --- malformed input -----------------------------------------------------------------------------


def _bad(op="gdn2", **over):
    x = make(op, T=5, H=2, K=4, V=3, seed=13)
    kw = {k: over.pop(k) for k in list(over) if k not in x}
    x.update(over)
    return lambda: call(op, x, **kw)


@pytest.mark.parametrize(
    "bad,match",
    [
        (_bad(cu_seqlens=torch.tensor([0.0, 5.0])), r"cu_seqlens: expected an int32 or int64"),
        (_bad(cu_seqlens=torch.tensor([[0, 5]])), r"cu_seqlens: expected a 1-D"),
        (_bad(cu_seqlens=torch.tensor([0, 4, 2, 5])), r"cu_seqlens: must be non-decreasing"),
        (_bad(cu_seqlens=torch.tensor([1, 5])), r"cu_seqlens: must start at 0"),
        (_bad(cu_seqlens=torch.tensor([0, 4])), r"cu_seqlens: last entry must equal the number of tokens \(5\)"),
        (_bad(q=torch.randn(5, 3, 4, dtype=F64)), r"heads: the larger of H=3"),
        (_bad(k=torch.randn(5, 1, 4, dtype=F64)), r"k: head count HK=1 must equal"),
        (_bad(g=torch.randn(5, 2, dtype=F64)), r"g: expected 3 dims for gdn2"),
        (_bad(g=torch.randn(5, 2, 3, dtype=F64)), r"g: expected shape \[T, HO, K\]"),
        (_bad(w=torch.randn(5, 2, 4, dtype=F64)), r"w: expected shape \[T, HO, V\]"),
        (_bad("kda", beta=torch.randn(5, 2, 4, dtype=F64)), r"beta: expected 2 dims for kda"),
        (_bad(beta=torch.ones(5, 2, 4, dtype=torch.int64)), r"beta: expected a floating-point tensor"),
        (_bad(allow_neg_eigval=True), r"allow_neg_eigval: needs use_beta_sigmoid_in_kernel"),
        (_bad(gate_domain="linear", safe_gate=True), r"gate_domain='linear' cannot combine with safe_gate"),
        (_bad(a_log=torch.zeros(2, dtype=F64)), r"a_log: only used with safe_gate=True"),
        (_bad(safe_gate=True, dt_bias=torch.zeros(2, dtype=F64)), r"dt_bias: expected shape \[2, 4\]"),
        (_bad(gate_domain="exp"), r"gate_domain: expected 'log' or 'linear'"),
        (_bad(layout="btd"), r"layout: expected one of"),
        (_bad(initial_state=torch.zeros(1, 2, 4, 3, dtype=F64)), r"initial_state: expected shape \[1, 2, 3, 4\]"),
        (_bad(method="magic"), r"method: expected one of"),
        (_bad(k=make("gdn2", T=5, H=2, K=4, V=3, dtype=torch.float32)["k"]),
         r"k: dtype torch.float32 differs from q's torch.float64; q, k and v must share one dtype"),
        (_bad("kda", v=torch.randn(5, 2, 3, dtype=torch.bfloat16)), r"v: dtype torch.bfloat16 differs from q's"),
        (_bad(w=torch.rand(5, 2, 3, dtype=torch.float16)), r"w: dtype torch.float16; expected q's torch.float64 or"),
        (_bad("gdn", beta=torch.rand(5, 2, dtype=torch.bfloat16)), r"beta: dtype torch.bfloat16; expected q's"),
    ],
)
def test_malformed_input_raises_naming_the_argument(bad, match):
    with pytest.raises(ReferenceInputError, match=match):
        bad()


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2", "gdp"])
@pytest.mark.parametrize("name", ["q", "v", "g", "beta", "initial_state"])
def test_nonfinite_inputs_are_refused_naming_the_argument_unless_allowed(op, name):
    x = make("gdn" if op == "gdp" else op, T=5, H=2, K=4, V=3, seed=3)
    extra = {"num_householder": 1} if op == "gdp" else {}
    x["initial_state"] = torch.randn(1, 2, 3, 4, dtype=F64)
    x[name] = x[name].clone()
    x[name].view(-1)[2] = math.nan
    x[name].view(-1)[3] = -math.inf
    h0 = x.pop("initial_state")
    with pytest.raises(ReferenceInputError, match=rf"^{name}: 1 NaN and 1 Inf values .*allow_nonfinite=True"):
        call(op, x, initial_state=h0, **extra)
    out, _ = call(op, x, initial_state=h0, allow_nonfinite=True, **extra)  # computed, NaN and all
    assert not torch.isfinite(out).all()


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2", "gdp"])
@pytest.mark.parametrize("alpha", [-0.25, 1.5])
def test_a_linear_gate_outside_0_1_is_refused_not_computed_to_nan(op, alpha):
    x = make("gdn" if op == "gdp" else op, T=5, H=2, K=4, V=3, seed=3)
    extra = {"num_householder": 1} if op == "gdp" else {}
    x["g"] = torch.rand_like(x["g"]) * 0.5 + 0.25
    call(op, x, gate_domain="linear", **extra)  # alphas in [0, 1]: computed
    x["g"].view(-1)[1] = alpha
    with pytest.raises(ReferenceInputError, match=r"^g: gate_domain='linear' takes the decay alpha in \[0, 1\], "
                                                  r"but 1 values are outside it"):
        call(op, x, gate_domain="linear", **extra)
    x["g"].view(-1)[1] = 0.0  # a fully decayed alpha (log(0 + 1e-10), as cuDNN takes it) is in range
    assert torch.isfinite(call(op, x, gate_domain="linear", **extra)[0]).all()


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2", "gdp"])
@pytest.mark.parametrize("name", ["k", "beta", "initial_state"])
def test_inputs_on_different_devices_are_refused_naming_the_argument(op, name):
    x = make("gdn" if op == "gdp" else op, T=5, H=2, K=4, V=3, seed=3)
    extra = {"num_householder": 1} if op == "gdp" else {}
    x["initial_state"] = torch.randn(1, 2, 3, 4, dtype=F64)
    x[name] = x[name].to("meta")  # another device on a CPU-only machine
    h0 = x.pop("initial_state")
    with pytest.raises(ReferenceInputError, match=rf"^{name}: on device meta, q on cpu; every input tensor must be"):
        call(op, x, initial_state=h0, **extra)


def test_the_finite_check_reads_a_views_own_elements_only():
    # The harness hands backends views into buffers whose margins hold NaN (runner.guarded): those are fine.
    x = make("kda", T=5, H=2, K=4, V=3, seed=4)
    for name, t in list(x.items()):
        buffer = torch.full((t.numel() + 16,), math.nan, dtype=t.dtype)
        x[name] = buffer[8:8 + t.numel()].view(t.shape).copy_(t)
    assert torch.isfinite(call("kda", x)[0]).all()


def test_the_harness_baseline_and_fp64_reference_pass_the_dtype_checks():
    from deltacheck.cases import Case, make_inputs
    from deltacheck.harness.backends.base import get_backend

    case = Case.from_id("gdn2-bf16-thd-N2-T[3_5]-H2/2/2-K64-V64-steep-state_bf16-l2norm-safegate-alog-dtbias-h0")
    inputs = make_inputs(case)  # q/k/v/w bf16, g fp32, initial state bf16: the io dtype and its own dtypes
    for name in ("oracle", "baseline"):
        out, state = get_backend(name).run(case, inputs)
        assert torch.isfinite(out).all() and torch.isfinite(state).all()


def test_dense_layout_rejects_cu_seqlens_and_mismatched_batches():
    x = {n: layouts.from_thd(t, "bshd", 2) for n, t in make("gdn", T=6, seed=14).items()}
    with pytest.raises(ReferenceInputError, match="cu_seqlens: must be None for the dense layout"):
        call("gdn", x, layout="bshd", cu_seqlens=torch.tensor([0, 3, 6]))
    x["v"] = x["v"][:1]
    with pytest.raises(ReferenceInputError, match=r"v: batch/sequence dims \(1, 3\) do not match q's \(2, 3\)"):
        call("gdn", x, layout="bshd")


# --- GDP ---------------------------------------------------------------------------------------


def _gdp_inputs(T=5, n=3, H=2, K=4, V=3, seed=20):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    return {"q": r(T, H, K), "k": r(T * n, H, K) / 2, "v": r(T * n, H, V),
            "g": -torch.rand(T, H, generator=gen, dtype=F64), "beta": torch.rand(T * n, H, generator=gen, dtype=F64)}


def test_gdp_with_one_householder_is_gdn():
    x = _gdp_inputs(n=1)
    cu = torch.tensor([0, 2, 5])
    out, s = R.gdp(x["q"], x["k"], x["v"], x["g"], x["beta"], cu, 1, output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
    ref, ref_s = call("gdn", x, cu_seqlens=cu, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel_rms(out, ref) <= 1e-15 and rel_rms(s, ref_s) <= 1e-15


def test_gdp_matches_an_explicit_subtoken_loop_and_token_major_layout():
    T, n, K, V = 4, 3, 4, 2
    x = _gdp_inputs(T=T, n=n, H=1, K=K, V=V, seed=21)
    out, s = R.gdp(x["q"], x["k"], x["v"], x["g"], x["beta"], None, n, scale=1.0, output_final_state=True,
                   state_layout="kv")
    S = torch.zeros(K, V, dtype=F64)
    for t in range(T):
        for j in range(n):  # decay on sub-token 0 only; readout after sub-token n-1
            if j == 0:
                S = S * x["g"][t, 0].exp()
            kj, vj, bj = x["k"][t * n + j, 0], x["v"][t * n + j, 0], x["beta"][t * n + j, 0]
            S = S + bj * torch.outer(kj, vj - S.T @ kj)
        assert torch.allclose(out[t, 0], S.T @ x["q"][t, 0], rtol=1e-13, atol=1e-14)
    assert torch.allclose(s[0, 0], S, rtol=1e-13, atol=1e-14)
    token_major = R.gdp(x["q"], x["k"].reshape(T, n, 1, K), x["v"].reshape(T, n, 1, V), x["g"],
                        x["beta"].reshape(T, n, 1), None, n, scale=1.0)[0]
    assert torch.equal(token_major, out)


def test_gdp_gradcheck_and_bad_input():
    x = _gdp_inputs(T=3, n=2, H=1, K=3, V=2, seed=22)
    leaves = [t.clone().requires_grad_() for t in x.values()]
    assert torch.autograd.gradcheck(
        lambda *ts: R.gdp(*ts, torch.tensor([0, 1, 3]), 2, safe_gate=True, output_final_state=True),
        leaves, eps=1e-6, atol=1e-7, rtol=1e-5)
    with pytest.raises(ReferenceInputError, match="num_householder: expected a positive integer"):
        R.gdp(*x.values(), None, 0)
    with pytest.raises(ReferenceInputError, match=r"k: expected 3 dims with T\*n = 9 rows"):
        R.gdp(*x.values(), None, 3)


# --- GDN2 beta_guard -------------------------------------------------------------------------------


def _guard_inputs(seed=30, T=6, H=2, K=4, V=3, decay=True):
    x = make("gdn2", T=T, H=H, K=K, V=V, seed=seed)
    x["beta"] = torch.rand(T, H, K, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 1.9
    if not decay:
        x["g"] = torch.zeros_like(x["g"])
    return x


def test_beta_guard_leaves_channel_uniform_beta_alone():
    x = _guard_inputs()
    x["beta"] = x["beta"][..., :1].expand_as(x["beta"]).contiguous()
    plain = call("gdn2", x, use_qk_l2norm_in_kernel=True)[0]
    guarded = call("gdn2", x, use_qk_l2norm_in_kernel=True, beta_guard=True)[0]
    assert torch.equal(plain, guarded)


def test_beta_guard_without_decay_flattens_beta_to_the_key_weighted_mean():
    x = _guard_inputs(decay=False)
    kn = x["k"] / torch.sqrt((x["k"] ** 2).sum(-1, keepdim=True) + 1e-6)
    w = kn**2
    mean = (x["beta"] * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True)
    flat = call("gdn2", dict(x, beta=mean.expand_as(x["beta"])), use_qk_l2norm_in_kernel=True)[0]
    guarded = call("gdn2", x, use_qk_l2norm_in_kernel=True, beta_guard=True)[0]
    assert rel_rms(guarded, flat) <= 1e-14


def test_beta_guard_makes_every_erase_non_expansive_under_its_decay():
    from deltacheck.reference.ops import guarded_beta

    x = _guard_inputs(seed=31, T=40, K=8)
    x["g"] = -0.05 * torch.rand_like(x["g"])  # a small decay budget, so the guard has work to do
    kn = x["k"] / torch.sqrt((x["k"] ** 2).sum(-1, keepdim=True) + 1e-6)
    b = guarded_beta(x["beta"], kn, x["g"], torch.float64)
    assert not torch.equal(b, x["beta"])  # the profile does trip the guard somewhere
    for t in range(40):
        for h in range(2):
            erase = torch.eye(8, dtype=F64) - torch.outer(kn[t, h], b[t, h] * kn[t, h])
            step = erase @ torch.diag(torch.exp(x["g"][t, h]))
            budget = 1.0 / torch.exp(x["g"][t, h]).max()
            assert torch.linalg.matrix_norm(erase, ord=2) <= budget * (1 + 1e-9), (t, h)
            assert torch.linalg.matrix_norm(step, ord=2) <= 1 + 1e-9, (t, h)


def test_beta_guard_backward_is_straight_through():
    from deltacheck.reference.ops import guarded_beta

    x = _guard_inputs(seed=32)
    beta = x["beta"].clone().requires_grad_()
    out = call("gdn2", dict(x, beta=beta), use_qk_l2norm_in_kernel=True, beta_guard=True)[0]
    (g_guarded,) = torch.autograd.grad(out.sum(), beta)
    kn = x["k"] / torch.sqrt((x["k"] ** 2).sum(-1, keepdim=True) + 1e-6)
    eff = guarded_beta(x["beta"], kn, x["g"], torch.float64).detach().requires_grad_()
    (g_eff,) = torch.autograd.grad(call("gdn2", dict(x, beta=eff), use_qk_l2norm_in_kernel=True)[0].sum(), eff)
    assert torch.allclose(g_guarded, g_eff, rtol=1e-12, atol=1e-14)


def test_beta_guard_needs_l2norm():
    with pytest.raises(ReferenceInputError, match="beta_guard: needs use_qk_l2norm_in_kernel=True"):
        call("gdn2", _guard_inputs(), beta_guard=True)
