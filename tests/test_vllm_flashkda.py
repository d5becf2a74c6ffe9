"""The vLLM FLA-copy and FlashKDA adapters against their contract doubles (issue 25): every case either agrees
with the oracle backend or is declined with its reason; each agreement has a twin that proves a conversion bug
(a transposed state either way, a dropped scale or flag, an unconverted index dtype) is caught."""

from __future__ import annotations

import pytest
import torch
from caught import caught
from doubles import flashkda_ops, vllm_fla_ops

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.flashkda import FlashKdaBackend
from deltacheck.harness.backends.flashkda import facts as kda_facts
from deltacheck.harness.backends.vllm_fla import VllmFlaBackend
from deltacheck.harness.backends.vllm_fla import facts as vllm_facts
from deltacheck.harness.commands.env import env_report, format_env
from deltacheck.harness.machine import environment as gate

H200 = gate.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                versions={"vllm": "0.33.0", "triton": "3.6.0", "flashkda": "0.0.1.post20260901"})

GDN_RUNS = [
    Case(op="gdn", layout="thd", seqlens=(0, 1, 6, 3), H=2, HK=2, HV=4, K=64, V=32, initial_state=True, l2norm=True,
         scale=0.3),
    Case(op="gdn", layout="bshd", seqlens=(5, 5), H=2, HK=2, HV=2, K=32, V=64, initial_state=True, state_dtype="bf16"),
    Case(op="gdn", layout="sbhd", seqlens=(4, 4, 4), H=1, HK=1, HV=2, K=32, V=32, io_dtype="fp16", scale=0.5),
    Case(op="gdn", layout="bhsd", seqlens=(3, 3), H=2, HK=2, HV=2, K=32, V=32, initial_state=True, l2norm=True),
]
GDN_DECLINES = [
    (Case(op="gdn", layout="thd", seqlens=(3,), H=4, HK=2, HV=2, K=32, V=32), "no GQA"),
    (Case(op="gdn", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=32, V=32, gate_domain="linear"), "log-space"),
    (Case(op="gdn", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=32, V=32, safe_gate=True, a_log=True),
     "no in-kernel gate"),
    (Case(op="gdn", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=32, V=32, beta_sigmoid=True), "after activation"),
]
KDA = dict(op="kda", K=128, V=128, l2norm=True, beta_sigmoid=True, safe_gate=True)
KDA_RUNS = [
    Case(layout="thd", seqlens=(3, 0, 5), H=2, HK=2, HV=2, initial_state=True, a_log=True, dt_bias=True, scale=0.2,
         **KDA),
    Case(layout="bhsd", seqlens=(4, 4), H=1, HK=1, HV=1, initial_state=True, state_dtype="bf16", **KDA),
    Case(layout="bshd", seqlens=(6,), H=2, HK=2, HV=2, dt_bias=True, **KDA),
]
KDA_DECLINES = [
    (Case(op="kda", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=64, V=64, l2norm=True, beta_sigmoid=True,
          safe_gate=True), "K = V = 128"),
    (Case(layout="thd", seqlens=(3,), H=1, HK=1, HV=2, **KDA), "one head count"),
    (Case(layout="thd", seqlens=(3,), H=2, HK=2, HV=2, io_dtype="fp16", **KDA), "bf16"),
    (Case(op="kda", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=128, V=128, l2norm=True, beta_sigmoid=True),
     "bounded gate"),
    (Case(op="kda", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=128, V=128, beta_sigmoid=True, safe_gate=True),
     "l2-normalizes"),
    (Case(op="kda", layout="thd", seqlens=(3,), H=2, HK=2, HV=2, K=128, V=128, l2norm=True, safe_gate=True),
     "logits"),
]
FLAVOURS = (kda_facts.VLLM, kda_facts.STANDALONE)


def _err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def agrees(backend, case, out_tol, state_tol) -> bool:
    inputs = make_inputs(case)
    out, state = backend.run(case, inputs)
    ref_out, ref_state = get_backend("oracle").run(case, inputs)
    if out.shape != ref_out.shape or state.shape != ref_state.shape:
        return False
    return _err(out, ref_out) <= out_tol and _err(state, ref_state) <= state_tol


# The vLLM copy's double returns fp64 outputs and fp32 states (as the kernels do): 1e-12 / 1e-6. FlashKDA writes the
# caller's bf16 `out` and takes bf16 g and beta, so its agreement is bf16-level: 1e-2 (a conversion bug is O(1)).
VLLM_TOL = (1e-12, 1e-6)
KDA_TOL = (1e-2, 1e-2)


def vllm_backend(recurrent, double=None):
    return VllmFlaBackend(double or vllm_fla_ops.make(), recurrent=recurrent)


def kda_backend(flavour, double=None):
    return FlashKdaBackend(flavour, double or flashkda_ops.make(flavour), probe_device="cpu")


def wrap(double, name, change):
    """``double.name`` with its keyword arguments passed through ``change(kwargs)`` (an adapter bug, simulated)."""
    real = getattr(double, name)

    def changed(*args, **kwargs):
        args, kwargs = change(list(args), dict(kwargs))
        return real(*args, **kwargs)

    setattr(double, name, changed)
    return double


# ================================================================================ vLLM's FLA copy

@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
@pytest.mark.parametrize("case", GDN_RUNS, ids=lambda c: c.id)
def test_vllm_fla_matches_oracle(case, recurrent):
    backend = vllm_backend(recurrent)
    verdict = backend._library_verdict(case)
    assert verdict.runnable and not verdict.backward and "inference only" in verdict.backward_reason
    assert agrees(backend, case, *VLLM_TOL)


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
@pytest.mark.parametrize(("case", "why"), GDN_DECLINES, ids=lambda x: x.id if isinstance(x, Case) else x)
def test_vllm_fla_declines_what_it_cannot_express(case, why, recurrent):
    verdict = vllm_backend(recurrent)._library_verdict(case)
    assert not verdict.runnable and why in verdict.reason


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
@pytest.mark.parametrize(("value", "noted"),
                         [("1", True), (" TRUE ", True), ("0", False), ("yes", False), (None, False)])
def test_vllm_fla_results_say_when_the_first_config_ran(monkeypatch, recurrent, value, noted):
    """VLLM_TRITON_FORCE_FIRST_CONFIG as vLLM parses it (envs.py: "1"/"true", stripped, any case): every result's
    notes say the first valid config ran instead of the autotuned one; nothing is said when it is off."""
    if value is None:
        monkeypatch.delenv(vllm_facts.FORCE_FIRST_CONFIG, raising=False)
    else:
        monkeypatch.setenv(vllm_facts.FORCE_FIRST_CONFIG, value)
    verdict = vllm_backend(recurrent)._library_verdict(GDN_RUNS[0])
    assert verdict.runnable
    said = [n for n in verdict.notes if n.startswith("VLLM_TRITON_FORCE_FIRST_CONFIG=1: ")]
    assert len(said) == (1 if noted else 0), verdict.notes
    assert not noted or "not the autotuned one" in said[0]


def _state_key_major(args, kwargs):
    """The bug: the state handed over key-major [N, HV, K, V] (upstream FLA's orientation), as a contiguous copy."""
    kwargs["initial_state"] = kwargs["initial_state"].transpose(-1, -2).contiguous()
    return args, kwargs


@pytest.mark.parametrize("recurrent", [False, True], ids=["chunk", "recurrent"])
def test_vllm_fla_mutations_are_caught(recurrent):
    fn = "fused_recurrent_gated_delta_rule" if recurrent else "chunk_gated_delta_rule"
    case, square = GDN_RUNS[0], GDN_RUNS[3]  # K != V, and K == V (where a transposed state has the right shape)
    assert caught(lambda: agrees(vllm_backend(recurrent, wrap(vllm_fla_ops.make(), fn, _state_key_major)), square,
                                 *VLLM_TOL)) or not agrees(
        vllm_backend(recurrent, wrap(vllm_fla_ops.make(), fn, _state_key_major)), square, *VLLM_TOL)
    assert caught(lambda: agrees(vllm_backend(recurrent, wrap(vllm_fla_ops.make(), fn, _state_key_major)), case,
                                 *VLLM_TOL))

    def drop(name):
        return lambda a, k: (a, {n: x for n, x in k.items() if n != name})

    for flag in ("scale", "use_qk_l2norm_in_kernel"):
        assert caught(lambda flag=flag: agrees(vllm_backend(recurrent, wrap(vllm_fla_ops.make(), fn, drop(flag))),
                                               case, *VLLM_TOL)), flag

    class NotTransposedOut(VllmFlaBackend):  # the final state returned value-major, as the library gives it
        def run(self, case, inputs):
            out, state = super().run(case, inputs)
            return out, state.transpose(-1, -2)

    assert caught(lambda: agrees(NotTransposedOut(vllm_fla_ops.make(), recurrent=recurrent), square, *VLLM_TOL))


def test_vllm_fla_recurrent_uses_the_pool_as_vllm_does():
    """ssm_state_indices and inplace_final_state=True, slot 0 the null block: the double's other mode reads
    sequence n's initial state at row bos (the kernel's token offset) and would be wrong for n > 0."""
    double = vllm_fla_ops.make()
    case = GDN_RUNS[0]
    assert agrees(vllm_backend(True, double), case, *VLLM_TOL)
    call = double.calls[-1]
    assert call["inplace_final_state"] is True and call["ssm_state_indices"].min() >= 1
    assert call["initial_state"].shape[0] == case.N + 1

    def plain_mode(args, kwargs):  # the bug: the documented [N, HV, V, K] state, no indices
        kwargs.update(initial_state=kwargs["initial_state"][1:].contiguous(), ssm_state_indices=None,
                      inplace_final_state=False)
        return args, kwargs

    assert caught(lambda: agrees(vllm_backend(True, wrap(vllm_fla_ops.make(), "fused_recurrent_gated_delta_rule",
                                                         plain_mode)), case, *VLLM_TOL))


def test_vllm_fla_floors_and_envelope():
    backend = VllmFlaBackend(recurrent=False)
    assert backend.pair_verdict("gdn", H200).runnable
    old = gate.Env(cuda=True, capability=(9, 0), versions={"vllm": "0.32.1", "triton": "3.6.0"})
    assert "vllm 0.32.1 < 0.33" in backend.pair_verdict("gdn", old).reason
    assert "triton is not installed" in backend.pair_verdict("gdn", gate.Env(cuda=True, versions={"vllm": "0.33.0"})).reason
    (envelope,) = backend.envelopes("gdn", H200)
    assert not envelope.backward and envelope.allowed["gate_mode"] == ("log",)
    assert backend.envelopes("kda", H200) == [] and backend.envelopes("gdn", gate.Env(cuda=False)) == []
    assert set(vllm_facts.SERVING_KWARGS) <= set(vllm_fla_ops.make().fused_recurrent_gated_delta_rule.__code__.co_varnames)


def test_vllm_fla_load_names_what_is_missing():
    def no_vllm(name):
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

    def no_einops(name):
        raise ModuleNotFoundError("No module named 'einops'", name="einops")

    assert "vllm is not installed" in VllmFlaBackend(importer=no_vllm).load("gdn").reason
    assert "'einops'" in VllmFlaBackend(importer=no_einops).load("gdn").reason


# ================================================================================ FlashKDA

@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("case", KDA_RUNS, ids=lambda c: c.id)
def test_flashkda_matches_oracle(case, flavour):
    backend = kda_backend(flavour)
    verdict = backend._library_verdict(case)
    assert verdict.runnable and not verdict.backward
    assert any("rounded fp32 -> bf16" in n for n in verdict.notes)
    assert agrees(backend, case, *KDA_TOL)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(("case", "why"), KDA_DECLINES, ids=lambda x: x.id if isinstance(x, Case) else x)
def test_flashkda_declines_what_it_cannot_express(case, why, flavour):
    verdict = kda_backend(flavour)._library_verdict(case)
    assert not verdict.runnable and why in verdict.reason


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_flashkda_mutations_are_caught(flavour):
    case = KDA_RUNS[0]
    scale_at = 5  # fwd's positional scale, in both builds
    state_at = 11 if flavour == kda_facts.VLLM else None

    def default_scale(args, kwargs):
        args[scale_at] = 128 ** -0.5
        return args, kwargs

    def key_major_state(args, kwargs):
        if state_at is not None:
            args[state_at] = args[state_at].transpose(-1, -2).contiguous()
        else:
            kwargs["initial_state"] = kwargs["initial_state"].transpose(-1, -2).contiguous()
        return args, kwargs

    def no_a_log(args, kwargs):
        a_log_at = 8 if flavour == kda_facts.VLLM else 7
        args[a_log_at] = torch.zeros_like(args[a_log_at])
        return args, kwargs

    for bug in (default_scale, key_major_state, no_a_log):
        assert caught(lambda bug=bug: agrees(kda_backend(flavour, wrap(flashkda_ops.make(flavour), "fwd", bug)),
                                             case, *KDA_TOL)), bug.__name__

    class NotTransposedOut(FlashKdaBackend):
        def run(self, case, inputs):
            out, state = super().run(case, inputs)
            return out, state.transpose(-1, -2)

    assert caught(lambda: agrees(NotTransposedOut(flavour, flashkda_ops.make(flavour)), case, *KDA_TOL))


def test_flashkda_standalone_under_another_libtorch_declines_with_the_fix():
    """The standalone build's probe: a build that rejects every tensor as not on CUDA declines every case (with
    the cause and the fix) instead of erroring per case; vLLM's stable-ABI build is not probed."""
    broken = kda_backend(kda_facts.STANDALONE, flashkda_ops.make(kda_facts.STANDALONE, abi_mismatch=True))
    verdict = broken._library_verdict(KDA_RUNS[0])
    assert not verdict.runnable and "built against another libtorch" in verdict.reason and "Fix:" in verdict.reason
    assert not broken._library_verdict(KDA_RUNS[1]).runnable  # probed once, remembered
    good = kda_backend(kda_facts.STANDALONE)
    assert good._library_verdict(KDA_RUNS[0]).runnable
    assert good._module.calls and good._module.calls[0]["q"].shape == (1, 1, 1, 128)  # the probe's one token
    vllm_op = kda_backend(kda_facts.VLLM, flashkda_ops.make(kda_facts.VLLM, abi_mismatch=True))
    assert vllm_op._library_verdict(KDA_RUNS[0]).runnable  # no probe: its failure would be the kernel's


def test_flashkda_standalone_gets_int64_cu_seqlens():
    double = flashkda_ops.make(kda_facts.STANDALONE)
    assert agrees(kda_backend(kda_facts.STANDALONE, double), KDA_RUNS[0], *KDA_TOL)
    assert double.calls[-1]["cu_seqlens"].dtype == torch.int64

    def int32(args, kwargs):
        kwargs["cu_seqlens"] = kwargs["cu_seqlens"].to(torch.int32)
        return args, kwargs

    with pytest.raises(RuntimeError, match="cu_seqlens must be int64"):
        agrees(kda_backend(kda_facts.STANDALONE, wrap(flashkda_ops.make(kda_facts.STANDALONE), "fwd", int32)),
               KDA_RUNS[0], *KDA_TOL)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_flashkda_floors_architectures_and_envelope(flavour):
    backend = FlashKdaBackend(flavour)
    assert backend.pair_verdict("kda", H200).runnable
    ampere = gate.Env(cuda=True, device_name="NVIDIA A100", capability=(8, 0), versions=dict(H200.versions))
    assert "needs one of SM90" in backend.pair_verdict("kda", ampere).reason
    sm103 = gate.Env(cuda=True, capability=(10, 3), versions=dict(H200.versions))
    assert backend.pair_verdict("kda", sm103).runnable == (flavour == kda_facts.STANDALONE)  # the cubins carried
    (envelope,) = backend.envelopes("kda", H200)
    assert envelope.allowed["l2norm"] == ("on",) and envelope.allowed["beta_mode"] == ("sigmoid",)
    assert backend.envelopes("kda", sm=80) == [] and backend.envelopes("gdn", H200) == []


def test_env_lists_the_libraries_and_pairs():
    env = gate.Env(cuda=True, device_name="NVIDIA H200 (test double)", capability=(9, 0),
                   versions={"vllm": "0.33.0", "triton": "3.6.0"}, importable={"vllm": True, "flash_kda": False})
    report = env_report(env, environ={})
    text = format_env(report)
    assert any(line.split()[:3] == ["vllm", "0.33.0", "importable"] for line in text.splitlines())
    assert any(line.split()[:2] == ["tokenspeed-flashkda", "-"] for line in text.splitlines())
    pairs = report["pairs"]
    assert pairs["vllm-fla:gdn"]["runnable"] and not pairs["vllm-fla:gdn"]["backward"]
    assert pairs["flashkda:kda"]["runnable"]
    assert "tokenspeed-flashkda is not installed" in pairs["flashkda-tokenspeed:kda"]["reason"]
    assert "flashkda:gdn" not in pairs  # an op the backend does not implement is not a pair


def test_verdicts_are_verdicts():
    assert isinstance(kda_backend(kda_facts.VLLM).load("gdn"), Verdict)
    assert not kda_backend(kda_facts.VLLM).load("gdn").runnable


def test_flashkda_is_judged_by_the_chunked_causal_rule():
    # FlashKDA is a chunked kernel: the causality check allows it one ulp of its output dtype before the cut
    # (docs/serving.md), as for cuDNN and FLA's chunk path; the default rule would demand bit-identity.
    from deltacheck.harness.judge.invariance_checks import causality

    backend = kda_backend(kda_facts.VLLM)
    backend.pair_verdict = lambda op, env: Verdict.ok()
    result = causality(backend, KDA_RUNS[0], gate.probe_env())
    assert result.status == "passed" and result.numbers["rule"] == "chunked", (result.reason, result.numbers)
