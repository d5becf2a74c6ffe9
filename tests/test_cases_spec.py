"""Case spec: validation, ids (round trip, errors), derived properties, -k expressions."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltacheck.cases import (
    BETA_PROFILES,
    GATE_PROFILES,
    IO_DTYPES,
    OP_SUPPORT,
    STATE_DTYPES,
    TIERS,
    Case,
    CaseError,
    KExprError,
    compile_k,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def valid_cases(draw):
    """Any valid Case, drawn field by field so every combination the spec allows can appear."""
    op = draw(st.sampled_from(sorted(OP_SUPPORT)))
    support = OP_SUPPORT[op]
    layout = draw(st.sampled_from(support.layouts))
    if layout == "thd":
        seqlens = tuple(draw(st.lists(st.integers(0, 5000), min_size=1, max_size=6)))
        if sum(seqlens) == 0:
            seqlens = seqlens[:-1] + (1,)
    else:
        seqlens = (draw(st.integers(1, 70000)),) * draw(st.integers(1, 8))
    config = draw(st.sampled_from(support.head_configs))
    small = draw(st.integers(1, 16))
    ratio = draw(st.integers(2, 4))
    H, HK, HV = {"mha": (small, small, small), "gqa": (small * ratio, small, small),
                 "gva": (small, small, small * ratio)}[config]
    beta_sigmoid = draw(st.booleans())
    neg_eigval = beta_sigmoid and draw(st.booleans())
    safe_gate = draw(st.booleans())
    gate_domain = "log" if safe_gate else draw(st.sampled_from(("log", "linear")))
    beta_choices = BETA_PROFILES if neg_eigval else tuple(b for b in BETA_PROFILES if b != "near2")
    longest = max(seqlens)
    splits = ()
    if longest > 1 and draw(st.booleans()):
        splits = tuple(sorted(draw(st.sets(st.integers(1, longest - 1), min_size=1, max_size=3))))
    scale = draw(st.one_of(st.none(), st.floats(1e-8, 1e4, allow_nan=False, allow_infinity=False)))
    l2norm = draw(st.booleans())
    return Case(
        op=op, io_dtype=draw(st.sampled_from(support.io_dtypes)), layout=layout, seqlens=seqlens,
        H=H, HK=HK, HV=HV, K=draw(st.sampled_from(support.key_dims)), V=draw(st.sampled_from(support.value_dims)),
        gate=draw(st.sampled_from(GATE_PROFILES)), state_dtype=draw(st.sampled_from(support.state_dtypes)),
        beta_profile=draw(st.sampled_from(beta_choices)), l2norm=l2norm,
        beta_sigmoid=beta_sigmoid, neg_eigval=neg_eigval, gate_domain=gate_domain, safe_gate=safe_gate,
        a_log=safe_gate and draw(st.booleans()), dt_bias=safe_gate and draw(st.booleans()),
        beta_guard=op == "gdn2" and l2norm and draw(st.booleans()),
        scale=scale, initial_state=draw(st.booleans()), splits=splits, backward=draw(st.booleans()),
        seed=draw(st.integers(0, 2**40)), tier=draw(st.sampled_from(TIERS)),
        num_householder=draw(st.integers(1, 8)) if support.householder else 1,
    )


@SETTINGS
@given(valid_cases())
def test_id_round_trips_over_the_whole_space(case):
    text = case.id
    again = Case.from_id(text)
    assert again == case
    assert again.id == text
    assert hash(again) == hash(case)
    # Shell/pytest -k friendly: one word, no characters a quoted shell or pytest's -k lexer would mangle.
    assert all(ch.isalnum() or ch in "-_[]/." for ch in text), text


@SETTINGS
@given(valid_cases(), st.data())
def test_mutated_ids_either_parse_consistently_or_raise_case_error(case, data):
    tokens = case.id.split("-")
    index = data.draw(st.integers(0, len(tokens) - 1))
    replacement = data.draw(st.sampled_from(
        ["", "x", "N0", "T[]", "T[1_2", "L-1", "H3/2/2", "K96", "V32", "bf32", "beta_huge", "cont[0]",
         "seed", "scale0", "scaleabc", "state_fp8", "L3", "h0", tokens[0], tokens[index] + "x"]))
    mutated = "-".join(tokens[:index] + [replacement] + tokens[index + 1:])
    try:
        parsed = Case.from_id(mutated)
    except CaseError as error:
        assert error.field and str(error).startswith(error.field + ":")
    else:
        assert Case.from_id(parsed.id) == parsed


def test_example_ids_parse_to_the_fields_they_name():
    case = Case.from_id("gdn2-bf16-thd-N3-T[0_63_1000]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd")
    assert (case.op, case.io_dtype, case.layout, case.seqlens) == ("gdn2", "bf16", "thd", (0, 63, 1000))
    assert (case.H, case.HK, case.HV, case.K, case.V, case.gate) == (4, 4, 4, 128, 128, "steep")
    assert case.initial_state and case.backward and case.splits == (64,)
    assert (case.N, case.HO, case.total_tokens) == (3, 4, 1063)
    assert (case.state_dtype, case.seed, case.tier, case.scale) == ("fp32", 0, "L0", None)
    # Commas are accepted in lists; the canonical form uses underscores.
    assert Case.from_id("gdn2-bf16-thd-N3-T[0,63,1000]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd") == case
    # Optional tokens in any order.
    assert Case.from_id("gdn2-bf16-thd-N3-T[0_63_1000]-H4/4/4-K128-V128-steep-bwd-cont[64]-h0") == case

    dense = Case.from_id("kda-fp16-bhsd-N2-L65-H2/2/8-K64-V128-extreme-state_bf16-beta_near2-l2norm-sigmoid"
                         "-negeig-safegate-alog-dtbias-scale0.5-seed7-L1")
    assert dense.seqlens == (65, 65) and dense.HO == 8 and dense.head_config == "gva"
    assert dense.a_log and dense.dt_bias and dense.safe_gate and dense.neg_eigval and dense.beta_sigmoid
    assert (dense.scale, dense.seed, dense.tier, dense.state_dtype) == (0.5, 7, "L1", "bf16")


def test_tiny_scale_survives_the_id_without_a_dash():
    case = Case(op="gdn", scale=1e-05)
    assert "scale1em05" in case.id and Case.from_id(case.id).scale == 1e-05


@pytest.mark.parametrize("text, field", [
    ("", "id"),
    ("gdn-bf16-thd", "id"),
    ("gdx-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild", "op"),
    ("gdn-fp32-thd-N1-T[5]-H2/2/2-K64-V64-mild", "io_dtype"),
    ("gdn-bf16-tdh-N1-T[5]-H2/2/2-K64-V64-mild", "layout"),
    ("gdn-bf16-thd-N2-T[5]-H2/2/2-K64-V64-mild", "seqlens"),
    ("gdn-bf16-thd-N1-T[5-H2/2/2-K64-V64-mild", "seqlens"),
    ("gdn-bf16-bshd-N2-T[5_6]-H2/2/2-K64-V64-mild", "seqlens"),
    ("gdn-bf16-thd-N1-T[0]-H2/2/2-K64-V64-mild", "seqlens"),
    ("gdn-bf16-thd-N1-T[5]-H2/2-K64-V64-mild", "H"),
    ("gdn-bf16-thd-N1-T[5]-H4/4/2-K64-V64-mild", "HK"),
    ("gdn-bf16-thd-N1-T[5]-H3/2/2-K64-V64-mild", "HK"),
    ("kda-bf16-thd-N1-T[5]-H2/2/2-K48-V64-mild", "K"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V512-mild", "V"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-gentle", "gate"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-state_fp16", "state_dtype"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-beta_two", "beta_profile"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-beta_near2-sigmoid", "beta_profile"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-negeig", "neg_eigval"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-linear-safegate", "gate_domain"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-alog", "a_log"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-dtbias", "dt_bias"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-cont[5]", "splits"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-cont[3_2]", "splits"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-scale-1.0", "scale"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-scale0.0", "scale"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-scalex", "scale"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-seedx", "seed"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-h0-h0", "initial_state"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-L1-L2", "tier"),
    ("gdn-bf16-thd-N1-T[5]-H2/2/2-K64-V64-mild-turbo", "id"),
])
def test_invalid_ids_name_the_field(text, field):
    with pytest.raises(CaseError) as raised:
        Case.from_id(text)
    assert raised.value.field == field, str(raised.value)
    assert str(raised.value).startswith(f"{field}:")


@pytest.mark.parametrize("changes, field", [
    ({"op": "mamba2"}, "op"),
    ({"num_householder": 2}, "num_householder"),
    ({"op": "gdp", "num_householder": 0}, "num_householder"),
    ({"op": "gdp", "num_householder": True}, "num_householder"),
    ({"op": "gdp", "layout": "bshd", "seqlens": (3, 3)}, "layout"),
    ({"op": "gdp", "l2norm": True, "beta_guard": True}, "beta_guard"),
    ({"io_dtype": "fp32"}, "io_dtype"),
    ({"state_dtype": "fp16"}, "state_dtype"),
    ({"layout": "bshd", "seqlens": (3, 4)}, "seqlens"),
    ({"layout": "bshd", "seqlens": (0, 0)}, "seqlens"),
    ({"seqlens": ()}, "seqlens"),
    ({"seqlens": (-1, 4)}, "seqlens"),
    ({"neg_eigval": True}, "neg_eigval"),
    ({"gate_domain": "linear", "safe_gate": True}, "gate_domain"),
    ({"gate_domain": "exp"}, "gate_domain"),
    ({"a_log": True}, "a_log"),
    ({"dt_bias": True}, "dt_bias"),
    ({"op": "kda", "K": 48}, "K"),
    ({"op": "gdn2", "V": 512}, "V"),
    ({"H": 4, "HK": 4, "HV": 2}, "HK"),
    ({"H": 0, "HK": 0, "HV": 0}, "H"),
    ({"scale": -1.0}, "scale"),
    ({"scale": float("nan")}, "scale"),
    ({"splits": (64,)}, "splits"),
    ({"splits": (0,)}, "splits"),
    ({"l2norm": 1}, "l2norm"),
    ({"seed": -1}, "seed"),
    ({"tier": "L3"}, "tier"),
    ({"beta_profile": "near2", "beta_sigmoid": True}, "beta_profile"),
])
def test_invalid_specs_name_the_field(changes, field):
    with pytest.raises(CaseError) as raised:
        Case(**{"op": "gdn", "seqlens": (64,), **changes})
    assert raised.value.field == field, str(raised.value)


def test_valid_edge_specs_are_accepted():
    Case(op="gdn2", layout="thd", seqlens=(0, 1), splits=())   # an empty and a one-token sequence
    Case(op="kda", layout="thd", seqlens=(500,), splits=(1, 499))
    Case(op="gdn", K=256, V=64, H=8, HK=2, HV=2)            # GQA, mixed 256/64
    Case(op="gdn", gate_domain="linear", beta_sigmoid=True, neg_eigval=True, beta_profile="near2")
    assert Case(op="gdn", seqlens=[3, 4]).seqlens == (3, 4)  # lists are stored as tuples


def test_case_is_frozen_hashable_and_exposes_the_contract():
    case = Case(op="kda", layout="sbhd", seqlens=(65, 65), H=1, HK=1, HV=4, splits=(64,), backward=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.op = "gdn"
    assert {case: 1}[Case.from_id(case.id)] == 1
    assert (case.N, case.HO, case.total_tokens, case.seqlens, case.splits) == (2, 4, 130, (65, 65), (64,))
    assert case.segments(65) == [(0, 64), (64, 65)]
    assert case.segments(10) == [(0, 10), (10, 10)]
    assert case.reference_kwargs() == {
        "scale": None, "use_qk_l2norm_in_kernel": False, "use_beta_sigmoid_in_kernel": False,
        "allow_neg_eigval": False, "gate_domain": "log", "safe_gate": False, "output_final_state": True,
        "layout": "sbhd", "gate_lower_bound": -5.0,
    }
    guarded = Case(op="gdn2", l2norm=True, beta_guard=True)
    assert guarded.reference_kwargs()["beta_guard"] is True and "-guard" in guarded.id
    with pytest.raises(CaseError, match="beta_guard: needs l2norm=True"):
        Case(op="gdn2", beta_guard=True)
    with pytest.raises(CaseError, match="beta_guard: op kda does not accept it"):
        Case(op="kda", l2norm=True, beta_guard=True)


def test_op_support_is_the_declared_contract():
    assert set(OP_SUPPORT) == {"gdn", "kda", "gdn2", "gdp"}
    for name, support in OP_SUPPORT.items():
        assert support.op == name
        assert set(support.io_dtypes) == set(IO_DTYPES) and set(support.state_dtypes) == set(STATE_DTYPES)
        assert {64, 128} <= set(support.key_dims) and {64, 128} <= set(support.value_dims)
        assert set(support.head_configs) == {"mha", "gqa", "gva"}
    # head dims are the math's (each backend's envelope narrows them): non-powers of two and K != V included
    assert all(s.key_dims == s.value_dims == (32, 64, 96, 128, 256) for s in OP_SUPPORT.values())
    assert OP_SUPPORT["gdn"].dt_bias_shape == ("HO",) and OP_SUPPORT["kda"].dt_bias_shape == ("HO", "K")
    assert OP_SUPPORT["gdn2"].gate_lower_bound == -5.0 and OP_SUPPORT["gdn2"].write_gate
    gdp = OP_SUPPORT["gdp"]
    assert gdp.layouts == ("thd",) and gdp.subtoken_inputs == ("k", "v", "beta") and gdp.householder
    assert gdp.safe_gate_form == "softplus" and gdp.gate_lower_bound is None and "beta_guard" not in gdp.flags
    assert not any(s.householder for op, s in OP_SUPPORT.items() if op != "gdp")


@pytest.mark.parametrize("expression, expected", [
    ("gdn", {"gdn-a-bwd", "gdn2-b", "xgdn"}),
    ("gdn2", {"gdn2-b"}),
    ("gdn and not gdn2", {"gdn-a-bwd", "xgdn"}),
    ("bwd or kda", {"gdn-a-bwd", "kda-c"}),
    ("not (gdn or kda)", {"other"}),
    ("(gdn2 or kda) and not c", {"gdn2-b"}),
    ("GDN2", {"gdn2-b"}),
    ("not not kda", {"kda-c"}),
])
def test_k_expressions(expression, expected):
    ids = {"gdn-a-bwd", "gdn2-b", "kda-c", "xgdn", "other"}
    matches = compile_k(expression)
    assert {i for i in ids if matches(i)} == expected


@pytest.mark.parametrize("expression", ["", "and", "gdn and", "(gdn", "gdn)", "not", "gdn kda", "()"])
def test_bad_k_expressions_raise(expression):
    with pytest.raises(KExprError):
        compile_k(expression)
