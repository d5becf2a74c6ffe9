"""The serving hook of FlashInfer's GDN decode (harness/backends/flashinfer/serving.py) against the contract double
of FlashInfer 0.7.2's ``gated_delta_rule_decode_pretranspose`` (tests/doubles/flashinfer_gdn.py: the float32 pool
read and written at ``initial_state_indices``, a negative index padding): the clean double passes the pool checks on
the L0 serving cases moved into the decode's envelope (K = V = 128, the safe gate, the beta sigmoid), and each
planted bug of its class fails them."""

from __future__ import annotations

import pytest
import torch
from doubles import flashinfer_gdn

from deltacheck.cases.serving import check_for, serving_cases
from deltacheck.harness.backends.base import Verdict
from deltacheck.harness.backends.flashinfer import adapter
from deltacheck.harness.backends.serving import ServingCall
from deltacheck.harness.judge.serving_checks import SERVING_CHECKS
from deltacheck.harness.machine.environment import probe_env
from deltacheck.reference import serving as sv

ENV = probe_env()
# The serving tier's GDN cases (K = V = 64, no gate flags) moved into the decode's envelope.
CASES = [c.replace(K=128, V=128, safe_gate=True, beta_sigmoid=True) for c in serving_cases("L0", "gdn")]
POOLED = [c for c in CASES if check_for(c) in ("pool_integrity", "decode_chain")]


def backend(mutation=None, decode=True):
    b = adapter.FlashInferBackend(flashinfer_gdn.make(mutation), decode=decode)
    b.pair_verdict = lambda op, env: Verdict.ok()  # the floors have their own tests; the double is capable
    return b


def check(b, case):
    return SERVING_CHECKS[check_for(case)](b, case, ENV)


def first(**fields):
    return next(c for c in POOLED if all(getattr(c, k) == v for k, v in fields.items()))


@pytest.mark.parametrize("case", POOLED, ids=lambda c: c.id)
def test_clean_double_passes_the_pool_checks(case):
    b = backend()
    result = check(b, case)
    assert result.status == "passed", (result.reason, result.numbers)
    calls = [c for c in b._module.calls if c["fn"] == "decode"]
    assert calls and all(c["initial_state"].shape[0] == case.pool and c["q"].shape[1] == 1 for c in calls)


def test_the_null_slot_is_minus_one_and_reaches_the_kernel():
    assert adapter.FlashInferBackend(decode=True).null_slot == sv.SGLANG
    b = backend()
    case = first(nulls=1, seqlens=(1, 1, 1, 1, 1))
    assert check(b, case).status == "passed"
    indices = b._module.calls[-1]["initial_state_indices"]
    assert indices.dtype == torch.int32 and (indices == -1).sum() == 1 and indices.min() == -1


@pytest.mark.parametrize("seqlens", [(1, 1, 1, 1, 1), (4, 1, 6, 1)])
def test_a_null_slot_read_as_the_last_row_is_caught(seqlens):
    # Python's -1 (the pool's last row) instead of FlashInfer's padding: a write to a row no sequence addresses, or
    # a wrong state in a real row that is the last one.
    result = check(backend("negative_wraps"), first(nulls=1, seqlens=seqlens))
    assert result.status == "failed", result.numbers
    assert result.numbers["changed_rows"] or result.numbers["row_err"] > 0.1, result.numbers


def test_a_key_major_read_of_the_value_major_pool_is_caught():
    case = first(nulls=0, seqlens=(1, 1, 1, 1))
    assert case.K == case.V  # silent in shape
    result = check(backend("key_major"), case)
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, result.numbers


def test_the_other_modes_and_the_prefill_decline_with_the_libraries_reasons():
    spec, ckpt = (c for c in CASES if check_for(c) in ("speculative", "checkpoints"))
    assert "intermediate_states_buffer" in check(backend(), spec).reason
    assert "checkpoint" in check(backend(), ckpt).reason
    prefill = check(backend(decode=False), POOLED[0])
    assert prefill.status == "declined", prefill.reason  # outside the prefill's envelope or without a pool: declined
    verdict = backend(decode=False).serving_verdict(POOLED[0], "pool", ENV)
    assert not verdict.runnable and "no state table" in verdict.reason
    assert not backend().serving_verdict(POOLED[0], "batch_invariant", ENV).runnable


def test_serve_refuses_a_pool_it_would_not_update_in_place():
    b, case = backend(), first(nulls=0, seqlens=(1, 1, 1, 1))
    from deltacheck.cases.inputs import make_inputs

    inputs = make_inputs(case)
    pool = torch.zeros(case.pool, case.HO, case.V, case.K, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32"):
        b.serve(case, inputs, ServingCall("pool", pool=pool, state_indices=torch.arange(case.N, dtype=torch.int32)))
