"""The serving axes in the case id (cases/serving_axes.py) and the serving tiers (cases/serving.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltacheck.cases import OP_SUPPORT, Case, CaseError, make_inputs
from deltacheck.cases.serving import check_for, serving_cases
from deltacheck.cases.serving_axes import is_serving, pool_rows_needed

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def serving_case(draw):
    """Any valid serving Case: one of pool (with nulls, chain or spec) or ckpt, over ragged thd lengths."""
    op = draw(st.sampled_from(sorted(OP_SUPPORT)))
    nh = draw(st.integers(1, 4)) if OP_SUPPORT[op].householder else 1
    kind = draw(st.sampled_from(("pool", "chain", "spec", "ckpt")))
    n = draw(st.integers(1, 6))
    fields = {"op": op, "num_householder": nh, "seed": draw(st.integers(0, 2**20)),
              "tier": draw(st.sampled_from(("L0", "L1", "L2")))}
    if kind == "ckpt":
        seqlens = tuple(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)))
        seqlens = seqlens if sum(seqlens) else (1,) + seqlens[1:]
        every = nh * draw(st.integers(1, 80))
        return Case(seqlens=seqlens, checkpoint_every=every, initial_state=draw(st.booleans()), **fields)
    nulls = draw(st.integers(0, n))
    if kind == "chain":
        length = draw(st.integers(1, 9))
        seqlens, extra = (length,) * n, {"chain": length}
    elif kind == "spec":
        k = draw(st.integers(1, 7))
        seqlens = (k + 1,) * n
        extra = {"draft": k, "accepted": tuple(draw(st.lists(st.integers(0, k), min_size=n, max_size=n)))}
    else:
        seqlens = tuple(draw(st.lists(st.integers(0, 70), min_size=n, max_size=n)))
        seqlens, extra = (seqlens if sum(seqlens) else (1,) + seqlens[1:]), {}
    probe = Case(seqlens=seqlens, pool=10**6, nulls=nulls, **extra, **fields)
    pool = pool_rows_needed(probe) + draw(st.integers(0, 40))
    return probe.replace(pool=pool)


@SETTINGS
@given(serving_case())
def test_serving_ids_round_trip(case):
    text = case.id
    assert Case.from_id(text) == case and Case.from_id(text).id == text
    assert is_serving(case)
    assert all(ch.isalnum() or ch in "-_[]/." for ch in text), text


@SETTINGS
@given(serving_case(), st.data())
def test_mutated_serving_ids_parse_consistently_or_raise_case_error(case, data):
    tokens = case.id.split("-")
    index = data.draw(st.integers(0, len(tokens) - 1))
    replacement = data.draw(st.sampled_from(["pool0", "pool07", "null9", "chain0", "spec2[]", "spec2[1_9]",
                                             "ckpt3", "pool", "specx", "bwd", "h0", "cont[1]", tokens[index] + "1"]))
    mutated = "-".join(tokens[:index] + [replacement] + tokens[index + 1:])
    try:
        parsed = Case.from_id(mutated)
    except CaseError as error:
        assert error.field and str(error).startswith(error.field + ":")
    else:
        assert Case.from_id(parsed.id) == parsed


@pytest.mark.parametrize("text, field", [
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool3", "pool"),          # needs N + 2 rows
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-null1", "nulls"),         # null without a pool
    ("gdn-bf16-thd-N2-T[3_4]-H2/2/2-K64-V64-typical-pool9-chain3", "chain"),  # ragged chain
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool9-spec2[0_3]", "accepted"),  # 3 > k
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool99-spec3[0_3]", "draft"),  # length != k + 1
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool9-ckpt4", "checkpoint_every"),  # ckpt with pool
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-bwd-pool9", "backward"),
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-h0-pool9", "initial_state"),
    ("gdn-bf16-bshd-N2-L3-H2/2/2-K64-V64-typical-pool9", "layout"),
    ("gdp-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-nh2-ckpt3", "checkpoint_every"),  # inside a token
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool09", "pool"),
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool9-pool9", "pool"),
    ("gdn-bf16-thd-N2-T[3_3]-H2/2/2-K64-V64-typical-pool9-spec2", "draft"),
])
def test_bad_serving_ids_name_the_field(text, field):
    with pytest.raises(CaseError) as info:
        Case.from_id(text)
    assert info.value.field == field, str(info.value)


def test_training_ids_are_unchanged_and_serving_twins_share_the_token_draws():
    plain = Case(op="kda", seqlens=(4, 4, 4))
    assert not is_serving(plain) and "pool" not in plain.id
    served = plain.replace(pool=15, draft=3, accepted=(0, 2, 3))
    a, b = make_inputs(plain), make_inputs(served)
    for name in ("q", "k", "v", "g", "beta"):
        assert torch.equal(a[name], b[name])


@pytest.mark.parametrize("tier", ["L0", "L1", "L2"])
def test_serving_tiers_are_valid_unique_and_cover_every_check(tier):
    cases = serving_cases(tier)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert all(Case.from_id(i) == c for i, c in zip(ids, cases))
    assert {check_for(c) for c in cases} == {"pool_integrity", "decode_chain", "speculative", "checkpoints"}
    assert {c.op for c in cases} == set(OP_SUPPORT)
    pools = [c for c in cases if c.pool]
    assert all(c.pool > c.N for c in pools) and any(c.nulls for c in pools)
    assert any(1 in c.seqlens and max(c.seqlens) > 1 for c in pools)  # mixed prefill + decode
    assert any(c.draft and 0 in c.accepted and c.draft in c.accepted for c in cases)
