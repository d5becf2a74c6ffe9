"""The serving hook of vLLM's FLA copy (harness/backends/vllm_fla/serving.py) against a contract double of vLLM
0.33's ``fused_recurrent_gated_delta_rule`` (tests/doubles/vllm_fla_ops.py: the table walked as the kernel's memory,
``num_accepted_tokens``, the null block): the clean double passes every L0 GDN serving case it serves, and each
planted bug of issue 26's classes fails its check."""

from __future__ import annotations

import pytest
import torch
from doubles import vllm_fla_ops

from deltacheck.cases.serving import check_for, serving_cases
from deltacheck.cases.spec import Case
from deltacheck.harness.backends.base import Verdict
from deltacheck.harness.backends.vllm_fla import VllmFlaBackend
from deltacheck.harness.backends.vllm_fla.serving import pool_table
from deltacheck.harness.judge.invariance_checks import INVARIANCE_CHECKS
from deltacheck.harness.judge.serving_checks import SERVING_CHECKS
from deltacheck.harness.machine.environment import probe_env
from deltacheck.reference import serving as sv

ENV = probe_env()
GDN = serving_cases("L0", "gdn")


def backend(mutation=None, recurrent=True):
    b = VllmFlaBackend(vllm_fla_ops.make(mutation=mutation), recurrent=recurrent)
    b.pair_verdict = lambda op, env: Verdict.ok()  # the floors have their own tests; the double is capable
    return b


def check(b, case, name=None):
    name = name or check_for(case)
    return (SERVING_CHECKS.get(name) or INVARIANCE_CHECKS[name])(b, case, ENV)


def first(name, **fields):
    return next(c for c in GDN if check_for(c) == name and all(getattr(c, k) == v for k, v in fields.items()))


@pytest.mark.parametrize("case", GDN, ids=lambda c: c.id)
def test_clean_double_passes_every_l0_gdn_serving_case(case):
    b = backend()
    result = check(b, case)
    if check_for(case) == "checkpoints":
        assert result.status == "declined" and "checkpoint_every_n_tokens" in result.reason
        return
    assert result.status == "passed", (result.reason, result.numbers)
    calls = [c for c in b._module.calls if c["ssm_state_indices"] is not None]
    assert calls and all(c["inplace_final_state"] and c["initial_state"].shape[0] == case.pool for c in calls)


def test_the_table_is_1d_for_decode_and_per_token_for_a_prefill():
    decode = pool_table(torch.tensor([3, 0, 5], dtype=torch.int32), (1, 1, 0))
    assert decode.tolist() == [3, 0, 5]
    prefill = pool_table(torch.tensor([3, 0, 5], dtype=torch.int32), (2, 1, 3))
    assert prefill.tolist() == [[3, 3, 3], [0, 0, 0], [5, 5, 5]] and prefill.stride() == (3, 1)
    b = backend()
    check(b, first("pool_integrity", nulls=0, seqlens=(1, 1, 1, 1)))
    assert b._module.calls[-1]["ssm_state_indices"].dim() == 1  # vLLM's own decode call
    check(b, first("speculative"))
    assert b._module.calls[-1]["num_accepted_tokens"].tolist() == [1, 3, 4]  # accepted drafts 0, 2, 3 -> a + 1


def test_a_1d_table_for_a_prefill_is_caught():
    # The kernel ignores the token stride: with a 1-D table token t of sequence n stores into entry n + t, the next
    # sequence's row (and reads past the table for the last one). Why the hook widens the table for a prefill.
    b = backend()
    b.serve = lambda case, inputs, call, serve=b.serve: serve(case.replace(seqlens=(1,) * case.N), inputs, call)
    result = check(b, Case(op="gdn", seqlens=(2, 2, 1), pool=9), "pool_integrity")
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, (result.reason, result.numbers)
    last_longer = check(b, Case(op="gdn", seqlens=(2, 1, 3), pool=7), "pool_integrity")
    assert last_longer.status == "error" and "past its 3 entries" in last_longer.reason  # an out-of-bounds read


def test_key_major_read_of_the_pool_is_caught():
    case = first("pool_integrity", nulls=0)
    assert case.K == case.V  # silent in shape
    result = check(backend("key_major"), case)
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, result.numbers


def test_a_write_to_the_null_slot_is_caught():
    case = first("pool_integrity", nulls=1, seqlens=(1, 1, 1, 1, 1))
    assert check(backend(), case).status == "passed"
    result = check(backend("null_write"), case)
    assert result.status == "failed" and 0 in result.numbers["changed_rows"], result.numbers


def test_the_first_instead_of_the_accepted_block_is_caught():
    result = check(backend("first_block"), first("speculative"))
    assert result.status == "failed" and result.numbers["picked_err"] > 0.1, result.numbers


@pytest.mark.parametrize("case", [Case(op="gdn", seqlens=(7, 0, 5)), Case(op="gdn", seqlens=(6, 9),
                                                                            initial_state=True)], ids=lambda c: c.id)
def test_causality_passes_clean_and_catches_a_future_gate_read(case):
    clean = check(backend(), case, "causality")
    assert clean.status == "passed" and clean.numbers["states"]["unchanged"], (clean.reason, clean.numbers)
    bad = check(backend("future_gate"), case, "causality")
    assert bad.status == "failed" and "before the cut changed" in bad.reason, bad.numbers


def test_declines_with_the_sources_reasons():
    spec = first("speculative")
    chunk = backend(recurrent=False)
    assert "chunk_gated_delta_rule takes no ssm_state_indices" in check(chunk, spec).reason
    assert chunk.causal_rule(spec) == "chunked" and backend().causal_rule(spec) == "bitwise"
    assert "no batch invariance" in backend().serving_verdict(spec, "batch_invariant", ENV).reason
    result = check(backend(), Case(op="gdn", seqlens=(6, 9)), "batch_invariance")
    assert result.status == "reported" and result.numbers["promised"] is False
    assert backend().null_slot == sv.VLLM
