"""The serving checks (harness/judge/serving_checks.py, harness/judge/invariance_checks.py): each passes the clean backends
(the reference backends and a third-party clean one, tests/serving_backends.py) on every serving case of L0, and
catches the planted bug of its class."""

from __future__ import annotations

import pytest
import serving_backends as sb
import torch

from deltacheck.cases.serving import check_for, serving_cases
from deltacheck.cases.spec import Case
from deltacheck.harness.backends.base import get_backend
from deltacheck.harness.judge.invariance_checks import INVARIANCE_CHECKS
from deltacheck.harness.judge.serving_checks import SERVING_CHECKS
from deltacheck.harness.machine.environment import probe_env
from deltacheck.reference import serving as sv

ENV = probe_env()
L0 = serving_cases("L0")


def run_check(backend, case, name=None):
    name = name or check_for(case)
    fn = SERVING_CHECKS.get(name) or INVARIANCE_CHECKS[name]
    return fn(backend, case, ENV)


@pytest.mark.parametrize("backend, case", [(b, c) for b in ("oracle", "chunked", "baseline", "clean") for c in L0
                                           if b != "baseline" or c.op == "kda"],  # baseline: one op (CPU time)
                         ids=lambda x: x if isinstance(x, str) else x.id)
def test_clean_backends_pass_every_serving_case(backend, case):
    be = sb.Clean() if backend == "clean" else get_backend(backend)
    result = run_check(be, case)
    assert result.status == "passed", (result.reason, result.numbers)


# Training-style thd cases for the invariance checks: ragged, an empty sequence, h0, GDP's sub-tokens.
INVARIANCE_CASES = [
    Case(op="gdn", seqlens=(7, 0, 5)), Case(op="kda", seqlens=(6, 9), initial_state=True),
    Case(op="gdn2", seqlens=(4, 4, 3)), Case(op="gdp", seqlens=(5, 6), num_householder=2),
]


@pytest.mark.parametrize("backend", ["oracle", "chunked", "clean"])
@pytest.mark.parametrize("check", sorted(INVARIANCE_CHECKS))
@pytest.mark.parametrize("case", INVARIANCE_CASES, ids=lambda c: c.id)
def test_clean_backends_pass_the_invariance_checks(backend, check, case):
    be = sb.Clean() if backend == "clean" else get_backend(backend)
    result = run_check(be, case, check)
    assert result.status == "passed", (result.reason, result.numbers)


def _one(check: str, **fields) -> Case:
    return next(c for c in L0 if check_for(c) == check and all(getattr(c, k) == v for k, v in fields.items()))


def test_pool_integrity_catches_a_key_major_read_of_a_value_major_pool():
    case = _one("pool_integrity", nulls=0)
    assert case.K == case.V  # silent in shape: only the numbers show it
    result = run_check(sb.KeyMajorPool(), case)
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, result.numbers
    assert run_check(sb.Clean(), case).status == "passed"


def test_pool_integrity_catches_a_write_to_the_null_slot():
    case = _one("pool_integrity", nulls=1)
    result = run_check(sb.NullSlotWriter(), case)
    assert result.status == "failed" and result.numbers["changed_rows"] == [0], result.numbers
    assert "rows no sequence addresses changed" in result.reason


def test_speculative_catches_the_first_instead_of_the_accepted_block():
    case = _one("speculative")
    assert max(case.accepted) >= 1  # a_n = 0 reads the first block legitimately
    result = run_check(sb.FirstBlock(), case)
    assert result.status == "failed" and result.numbers["picked_err"] > 0.1, result.numbers


def test_causality_catches_a_future_gate_read():
    for case in INVARIANCE_CASES:
        result = run_check(sb.FutureGate(), case, "causality")
        assert result.status == "failed" and result.numbers["max_ulps_before"] > 1, (case.id, result.numbers)


def test_graph_replay_catches_a_replay_that_keeps_the_captured_inputs():
    result = run_check(sb.GraphKeepsInputs(), INVARIANCE_CASES[0], "graph_replay")
    assert result.status == "failed" and result.numbers["out_diff"] > 0.1, result.numbers


def test_graph_replay_fails_a_non_finite_result_instead_of_bounding_it_by_an_infinite_spread():
    # Seen on the H200 (vllm-fla, an empty sequence before others): eager spread inf, so "diff <= spread" held.
    result = run_check(sb.UnwrittenAfterEmpty(), INVARIANCE_CASES[0], "graph_replay")
    assert result.numbers["out_spread"] == float("inf")
    assert result.status == "failed" and not result.numbers["finite"], result.numbers
    assert run_check(sb.Clean(), INVARIANCE_CASES[0], "graph_replay").numbers["finite"]


def test_checkpoints_catch_rows_one_cadence_late():
    result = run_check(sb.CheckpointAfter(), _one("checkpoints"))
    assert result.status == "failed" and result.numbers["checkpoint_err"] > 0.01, result.numbers


def test_checks_decline_with_a_reason():
    pool_case = _one("pool_integrity", nulls=0)
    training = Case(op="gdn", seqlens=(3, 4))
    assert run_check(get_backend("oracle"), training, "pool_integrity").status == "declined"

    class NoHook:
        name, ops = "nohook", frozenset({"gdn"})

        def check(self, case, env):
            return sb.Clean().check(case, env)

        def run(self, case, inputs):
            return sb.Clean().run(case, inputs)

    result = run_check(NoHook(), pool_case)
    assert result.status == "declined" and "no serving hook" in result.reason
    cudnn_like = sb.Clean()
    cudnn_like.null_slot = None
    result = run_check(cudnn_like, _one("pool_integrity", nulls=1))
    assert result.status == "declined" and "no null slot" in result.reason
    # On a CPU the CUDA-graph capture declines unless the backend brings its own capture.
    result = run_check(NoHook(), training, "graph_replay")
    assert result.status == "declined" and "CUDAGraph needs a GPU" in result.reason


def test_batch_invariance_fails_a_promised_kernel_whose_output_is_nan_in_every_batch():
    # cuDNN's all-NaN KDA cases replayed "bitwise" on the H200: equal NaN bits must not read as invariance.
    result = run_check(sb.NaNOutput(), INVARIANCE_CASES[0], "batch_invariance")
    assert result.numbers["promised"] and result.numbers["bitwise"], result.numbers
    assert result.status == "failed" and not result.numbers["finite"], result.numbers
    assert run_check(sb.Clean(), INVARIANCE_CASES[0], "batch_invariance").status == "passed"


def test_batch_invariance_reports_the_spread_where_nothing_is_promised():
    class Unpromised(sb.Clean):
        def serving_verdict(self, case, mode, env):
            return sb.Verdict.no("no promise") if mode == "batch_invariant" else sb.Verdict.ok()

    result = run_check(Unpromised(), INVARIANCE_CASES[0], "batch_invariance")
    assert result.status == "reported" and result.numbers["promised"] is False
    assert result.numbers["out_spread"] == 0.0  # the clean loop is invariant even unpromised


# --- the FLA serving adapter, against a contract double of FLA 0.6's internal _fwd ---------------------------------

def _fla_serving(mutation=None):
    from doubles import fla_ops, fla_serving

    from deltacheck.harness.backends.base import Verdict
    from deltacheck.harness.backends.fla import adapter as fla_adapter

    backend = fla_adapter.FlaBackend(fla_serving.add_serving(fla_ops.make(), mutation=mutation), recurrent=True)
    backend.pair_verdict = lambda op, env: Verdict.ok()  # the floors have their own tests; the double is capable
    return backend


FLA_CASES = [c for c in L0 if c.op in ("kda", "gdn2") and check_for(c) in ("pool_integrity", "decode_chain",
                                                                               "speculative")]


@pytest.mark.parametrize("case", FLA_CASES, ids=lambda c: c.id)
def test_fla_serving_adapter_passes_or_declines_with_the_source_reason(case):
    backend = _fla_serving()
    result = run_check(backend, case)
    if check_for(case) == "pool_integrity" and max(case.seqlens) > 1:
        assert result.status == "declined" and "decode-only" in result.reason
    elif case.nulls:
        assert result.status == "declined" and "no null slot" in result.reason
    else:
        assert result.status == "passed", (result.reason, result.numbers)
        call = backend._module.calls[-1]
        assert call["inplace_final_state"] and call["state_v_first"]


def test_fla_serving_adapter_with_a_key_major_pool_read_fails():
    case = next(c for c in FLA_CASES if check_for(c) == "speculative")
    result = run_check(_fla_serving("key_major"), case)
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, result.numbers


def test_fla_serving_declines_gdn_and_the_chunk_path_with_reasons():
    case = _one("speculative")
    from deltacheck.harness.backends.fla import adapter as fla_adapter

    assert "fused_recurrent_gated_delta_rule_fwd has no ssm_state_indices" in \
        fla_adapter.FlaBackend(recurrent=True).serving_verdict(case, "spec", ENV).reason
    assert "chunk_* take no ssm_state_indices" in fla_adapter.FlaBackend().serving_verdict(
        case.replace(op="kda"), "spec", ENV).reason


# --- the cuDNN serving adapter, against FROST's semantics on the cudnn_la double ------------------------------------

def _cudnn_serving(mutation=None):
    from doubles import cudnn_la, cudnn_serving

    from deltacheck.harness.backends.base import Verdict
    from deltacheck.harness.backends.cudnn import adapter as cudnn_adapter

    backend = cudnn_adapter.CudnnBackend(cudnn_serving.add_frost(cudnn_la.make(), mutation=mutation), device="cpu")
    backend.pair_verdict = lambda op, env: Verdict.ok()
    return backend


BLACKWELL = probe_env().__class__(cuda=True, device_name="NVIDIA B200 (test double)", capability=(10, 0))
HOPPER = probe_env().__class__(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0))
CUDNN_CASES = [c.replace(checkpoint_every=64, seqlens=(130, 64, 0, 7)) if c.checkpoint_every else c
               for c in L0 if check_for(c) in ("pool_integrity", "decode_chain", "checkpoints")]


@pytest.mark.parametrize("case", CUDNN_CASES, ids=lambda c: c.id)
def test_cudnn_serving_adapter_on_the_frost_double(case):
    result = SERVING_CHECKS[check_for(case)](_cudnn_serving(), case, BLACKWELL)
    if case.nulls:
        assert result.status == "declined" and "no null slot" in result.reason
    else:
        assert result.status == "passed", (result.reason, result.numbers)


def test_cudnn_serving_adapter_passes_the_four_arguments_and_frost_mutations_fail():
    backend = _cudnn_serving()
    pool_case = _one("pool_integrity", nulls=0)
    assert SERVING_CHECKS["pool_integrity"](backend, pool_case, BLACKWELL).status == "passed"
    call = backend._module.serving_calls[-1]
    assert call["initial_state"].shape[0] == pool_case.pool  # the pool itself, not a gathered copy
    assert call["overwrite_initial_state"] and call["state_indices"].dtype == torch.int32
    bad = SERVING_CHECKS["pool_integrity"](_cudnn_serving("key_major_pool"), pool_case, BLACKWELL)
    assert bad.status == "failed" and bad.numbers["row_err"] > 0.1
    ckpt = CUDNN_CASES[-1]
    late = SERVING_CHECKS["checkpoints"](_cudnn_serving("late_checkpoints"), ckpt, BLACKWELL)
    assert late.status == "failed" and late.numbers["checkpoint_err"] > 0.01, late.numbers
    inv = INVARIANCE_CHECKS["batch_invariance"](backend, Case(op="kda", seqlens=(6, 9, 2)), BLACKWELL)
    assert inv.status == "passed" and inv.numbers["promised"], inv.numbers


def test_cudnn_serving_declines_on_hopper_with_the_engines_reasons():
    backend = _cudnn_serving()
    result = SERVING_CHECKS["pool_integrity"](backend, _one("pool_integrity", nulls=0), HOPPER)
    assert result.status == "declined" and "KdaHopperCudaEngine: 'state_indices" in result.reason
    result = SERVING_CHECKS["checkpoints"](backend, CUDNN_CASES[-1], HOPPER)
    assert result.status == "declined" and "state_checkpoints are not produced by the Hopper kernel" in result.reason
    result = SERVING_CHECKS["speculative"](backend, _one("speculative"), BLACKWELL)
    assert result.status == "declined" and "num_accepted_tokens" in result.reason


def test_what_the_fla_declines_guard_against_is_caught_when_not_declined():
    # FLA 0.6's 1-D per-token store (ssm_state_indices[n + t]): a prefill through the pool writes sequence 0's
    # intermediate state into sequence 1's row; an adapter that did not decline it fails pool integrity.
    backend = _fla_serving()
    backend.pool_decode_only = False
    result = run_check(backend, Case(op="kda", seqlens=(2, 1, 1), pool=6), "pool_integrity")
    assert result.status == "failed" and result.numbers["row_err"] > 0.1, result.numbers
    # vLLM's null slot over a kernel without the `state_idx <= 0` skip: it reads and writes row 0.
    backend = _fla_serving()
    backend.null_slot = sv.VLLM
    result = run_check(backend, next(c for c in FLA_CASES if c.nulls and max(c.seqlens) == 1), "pool_integrity")
    assert result.status == "failed" and 0 in result.numbers["changed_rows"], result.numbers
