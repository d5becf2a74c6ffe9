"""Deterministic inputs: shapes, dtypes, value ranges per profile, layout invariance, cross-process bytes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from child_env import HANG_GUARD_S

from deltacheck.cases import Case, make_inputs, make_weights, tensor_digest
from deltacheck.cases.inputs import stream_key
from deltacheck.harness.ci.tiers import tier_cases

# A spread of ids: every op, every layout, every gate mode, h0, edges of ragged lengths.
SAMPLE_IDS = [
    "gdn2-bf16-thd-N3-T[0_63_200]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd",
    "gdn-fp16-sbhd-N2-L65-H4/2/2-K64-V128-extreme-state_bf16-beta_near2-sigmoid-negeig-safegate-dtbias-scale0.5",
    "kda-bf16-bhsd-N2-L64-H1/1/4-K128-V64-zero-linear-h0",
    "kda-fp16-bshd-N1-L63-H2/2/2-K64-V64-mild-sigmoid-safegate-alog-dtbias-h0-seed3",
    "gdn2-fp16-thd-N4-T[1_64_0_130]-H2/2/4-K64-V128-typical-beta_one-sigmoid-negeig-h0-L1",
]


# Runs in this process and, verbatim, in a fresh interpreter.
_DIGEST_CODE = """
from deltacheck.cases import Case, make_inputs, make_weights, tensor_digest
from deltacheck.harness.ci.tiers import tier_cases

def digests(ids):
    out = {}
    for text in ids:
        case = Case.from_id(text)
        wo, ws = make_weights(case, (case.total_tokens, case.HO, case.V), (case.N, case.HO, case.K, case.V))
        out[text] = [tensor_digest(make_inputs(case)), tensor_digest({"wo": wo, "ws": ws})]
    return out
"""


def test_same_id_gives_identical_tensors_in_another_process():
    namespace: dict = {}
    exec(_DIGEST_CODE, namespace)
    ids = SAMPLE_IDS + [c.id for c in tier_cases("L0")[::10]]
    child_code = _DIGEST_CODE + (
        "import json, sys\n"
        "ids = json.loads(sys.stdin.read())\n"
        "print(json.dumps({'digests': digests(ids), 'l0': [c.id for c in tier_cases('L0')]}))\n"
    )
    child = subprocess.run([sys.executable, "-c", child_code], input=json.dumps(ids), capture_output=True,
                           text=True, check=True, timeout=HANG_GUARD_S)
    theirs = json.loads(child.stdout)
    ours = namespace["digests"](ids)
    # Different streams, different tensors (ids that differ only in layout etc. share a stream).
    assert len({d[0] for d in ours.values()}) == len({stream_key(Case.from_id(i)) for i in ids})
    assert theirs["digests"] == ours
    assert theirs["l0"] == [c.id for c in tier_cases("L0")]  # the matrix itself is the same too


def test_seed_changes_the_numbers_and_nothing_else():
    base = Case.from_id(SAMPLE_IDS[0])
    other = base.replace(seed=1)
    a, b = make_inputs(base), make_inputs(other)
    assert not torch.equal(a["q"], b["q"])
    assert {k: (tuple(v.shape), v.dtype) for k, v in a.items() if v is not None} == \
           {k: (tuple(v.shape), v.dtype) for k, v in b.items() if v is not None}
    assert tensor_digest(make_inputs(base.replace(tier="L1"))) == tensor_digest(a)  # tier is not data


def test_dense_layouts_hold_the_same_numbers_as_thd():
    thd = Case(op="kda", layout="thd", seqlens=(65, 65, 65), H=2, HK=2, HV=4, K=64, V=128, gate="extreme",
               initial_state=True)
    packed = make_inputs(thd)
    n, length = 3, 65
    for layout in ("bshd", "sbhd", "bhsd"):
        dense = make_inputs(thd.replace(layout=layout))
        assert dense["cu_seqlens"] is None
        for name in ("q", "k", "v", "g", "beta"):
            x = dense[name]
            if layout == "sbhd":
                x = x.transpose(0, 1)
            elif layout == "bhsd":
                x = x.transpose(1, 2)
            assert torch.equal(x.reshape(n * length, *x.shape[2:]), packed[name]), (layout, name)
        assert torch.equal(dense["initial_state"], packed["initial_state"])
    assert make_inputs(thd.replace(layout="bshd"))["q"].shape == (n, length, 2, 64)
    assert make_inputs(thd.replace(layout="sbhd"))["v"].shape == (length, n, 4, 128)
    assert make_inputs(thd.replace(layout="bhsd"))["g"].shape == (n, 4, length, 64)


@pytest.mark.parametrize("op", ["gdn", "kda", "gdn2"])
def test_shapes_and_dtypes_follow_the_contract(op):
    case = Case(op=op, io_dtype="fp16", state_dtype="bf16", layout="thd", seqlens=(0, 1, 70), H=4, HK=2, HV=2,
                K=128, V=64, safe_gate=True, a_log=True, dt_bias=True, initial_state=True)
    x = make_inputs(case)
    T, HO = 71, 4
    assert x["q"].shape == (T, 4, 128) and x["k"].shape == (T, 2, 128) and x["v"].shape == (T, 2, 64)
    assert x["q"].dtype == x["k"].dtype == x["v"].dtype == torch.float16
    assert x["cu_seqlens"].tolist() == [0, 0, 1, 71] and x["cu_seqlens"].dtype == torch.int32
    assert x["initial_state"].shape == (3, HO, 64, 128) and x["initial_state"].dtype == torch.bfloat16
    assert x["a_log"].shape == (HO,) and x["a_log"].dtype == torch.float32
    assert x["g"].dtype == torch.float32
    if op == "gdn":
        assert x["g"].shape == (T, HO) and x["beta"].shape == (T, HO) and x["beta"].dtype == torch.float32
        assert x["dt_bias"].shape == (HO,)
        assert "w" not in x
    else:
        assert x["g"].shape == (T, HO, 128) and x["dt_bias"].shape == (HO, 128)
        if op == "kda":
            assert x["beta"].shape == (T, HO) and x["beta"].dtype == torch.float32 and "w" not in x
        else:
            assert x["beta"].shape == (T, HO, 128) and x["beta"].dtype == torch.float16
            assert x["w"].shape == (T, HO, 64) and x["w"].dtype == torch.float16
    plain = make_inputs(case.replace(safe_gate=False, a_log=False, dt_bias=False, initial_state=False))
    assert plain["a_log"] is None and plain["dt_bias"] is None and plain["initial_state"] is None


@pytest.mark.parametrize("gate, low, high", [
    ("mild", torch.log(torch.tensor(0.5)).item(), 0.0),
    ("typical", -20.0, 0.0),
    ("steep", -5.0, -0.1),
    ("zero", 0.0, 0.0),
])
def test_gate_profiles_stay_in_their_documented_ranges(gate, low, high):
    case = Case(op="kda", seqlens=(300,), gate=gate)
    g = make_inputs(case)["g"]
    assert low - 1e-6 <= g.min().item() and g.max().item() <= high + 1e-6
    alpha = make_inputs(case.replace(gate_domain="linear"))["g"]
    torch.testing.assert_close(alpha, torch.exp(g), rtol=0, atol=0)


def test_extreme_gates_mix_steep_values_with_minus_1000():
    g = make_inputs(Case(op="gdn2", seqlens=(400,), gate="extreme"))["g"]
    hard = g == -1000.0
    assert 0.03 < hard.float().mean().item() < 0.2
    assert (hard.all(dim=-1)).any()                          # whole (token, head) rows
    assert ((g[~hard] >= -5.0) & (g[~hard] <= -0.1)).all()


@pytest.mark.parametrize("profile, neg, expected", [
    ("zero", False, (0.0, 0.0)), ("one", False, (1.0, 1.0)), ("uniform", False, (0.0, 1.0)),
    ("zero", True, (0.0, 0.0)), ("one", True, (1.0, 1.0)), ("uniform", True, (0.0, 2.0)),
    ("near2", True, (1.9, 2.0)),
])
def test_beta_profiles_give_the_documented_effective_beta(profile, neg, expected):
    plain = Case(op="gdn", seqlens=(200,), beta_profile=profile) if not neg else None
    if plain is not None:
        beta = make_inputs(plain)["beta"]
        assert expected[0] <= beta.min().item() and beta.max().item() <= expected[1]
    logits_case = Case(op="gdn", seqlens=(200,), beta_profile=profile, beta_sigmoid=True, neg_eigval=neg)
    logits = make_inputs(logits_case)["beta"]
    effective = torch.sigmoid(logits.double()) * (2 if neg else 1)
    assert expected[0] - 1e-9 <= effective.min().item() and effective.max().item() <= expected[1] + 1e-9
    assert torch.isfinite(logits).all()


def test_write_gate_and_k_normalisation():
    case = Case(op="gdn2", seqlens=(100,), beta_profile="one")
    x = make_inputs(case)
    assert (x["w"] == 1).all() and (x["beta"] == 1).all()
    norms = x["k"].float().norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=2e-2, rtol=0)
    raw = make_inputs(case.replace(l2norm=True))["k"].float().norm(dim=-1)
    assert raw.mean() > 4  # left unnormalised: the kernel normalises it


def test_safe_gate_holds_raw_preactivations():
    g = make_inputs(Case(op="gdn", seqlens=(500,), gate="typical", safe_gate=True))["g"]
    assert g.max() > 0 and g.min() < 0  # a normal draw, not a decay
    zero = make_inputs(Case(op="kda", seqlens=(10,), gate="zero", safe_gate=True))["g"]
    assert torch.sigmoid(zero).max().item() == 0.0  # drives the sigmoid gate to no decay


def test_inputs_move_to_the_requested_device():
    x = make_inputs(Case(op="gdn"), device="meta")
    assert x["q"].device.type == "meta" and x["cu_seqlens"].device.type == "meta"


def test_weights_have_their_own_stream():
    case = Case(op="gdn")
    wo, ws = make_weights(case, (64, 2, 64), (1, 2, 64, 64))
    assert wo.dtype == ws.dtype == torch.float32 and wo.shape == (64, 2, 64) and ws.shape == (1, 2, 64, 64)
    assert not torch.equal(wo, make_inputs(case)["v"].float())
    wo2, _ = make_weights(case, (64, 2, 64), (1, 2, 64, 64))
    assert torch.equal(wo, wo2)


def test_state_dtype_and_check_axes_do_not_change_the_draws():
    base = Case(op="gdn2", seqlens=(0, 70), initial_state=True)
    x = make_inputs(base)
    y = make_inputs(base.replace(state_dtype="bf16", splits=(64,), backward=True))
    assert torch.equal(y["initial_state"], x["initial_state"].to(torch.bfloat16))
    assert all(torch.equal(x[n], y[n]) for n in ("q", "k", "v", "g", "beta", "w"))
