"""Availability (our floors per backend, the libraries' import checks) and required mode (issue #6). CPU only:
every machine and library is a fake.

How the situations are modelled:
- the machine is an ``Env`` built directly (``blackwell()`` / ``hopper()`` / ``no_gpu()`` below, then
  ``with_(...)`` to break one thing) or from a fake ``Finder`` (the probe tests);
- "package present but op attribute missing" and "the backend raises on import" are a fake
  ``importer`` handed to the adapter whose ``load`` / ``library_verdict`` runs it (a module object without
  the attribute, or a function that raises), never the real libraries;
- "required" means the pair is in ``required_failures``'s ``required``; "not required" means the gate
  verdict is a skip carrying the same reason. Either way, never a silent pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import replace

import pytest
from child_env import HANG_GUARD_S

from deltacheck.harness import cli
from deltacheck.harness.backends.base import Verdict
from deltacheck.harness.backends.cudnn import CudnnBackend
from deltacheck.harness.backends.fla import FlaBackend
from deltacheck.harness.backends.loading import Library, load_entry_point
from deltacheck.harness.ci.required import (
    RequiredModeError,
    RequireSpecError,
    format_required_report,
    required_failures,
    required_pairs,
    required_spec,
)
from deltacheck.harness.machine import environment as gate
from deltacheck.harness.machine.availability import floors_by_name as pair_verdict
from deltacheck.harness.machine.availability import library_verdict
from deltacheck.harness.machine.environment import Env, Finder, probe_env


def adapter(name: str, importer):
    """The fused adapter ``name`` importing through ``importer`` (a fake module, or one that raises)."""
    if name == "cudnn":
        return CudnnBackend(importer=importer)
    return FlaBackend(recurrent=name == "fla-recurrent", importer=importer)


def check_pair(backend: str, op: str, env: Env, importer) -> Verdict:
    """Floors, then the adapter's import of the library through ``importer``."""
    return library_verdict(adapter(backend, importer), backend, op, env)


GOOD_VERSIONS = {
    "torch": "2.13.0",
    "cuda_runtime": "13.0",
    "cudart": "13.3",
    "driver": "590.10",
    "cudnn_frontend": "1.32.0",
    "cudnn_backend": "9.20.0",
    "cutlass_dsl": "4.8.0",
    "cuda_tile": "1.4.0",
    "tileiras": "13.3",
    "fla": "0.6.0",
    "triton": "3.7.1",
    "transformer_engine": None,
}
ALL_IMPORTABLE = {k: True for k in gate.IMPORTABLE_KEYS}


def blackwell(**versions) -> Env:
    return Env(
        cuda=True,
        device_name="NVIDIA B200",
        capability=(10, 0),
        versions={**GOOD_VERSIONS, **versions},
        importable=dict(ALL_IMPORTABLE),
        tools={"tileiras": "/opt/cuda/bin/tileiras"},
    )


def hopper(**versions) -> Env:
    return replace(blackwell(**versions), device_name="NVIDIA H200", capability=(9, 0))


def no_gpu(**versions) -> Env:
    return replace(blackwell(**versions), cuda=False, device_name=None, capability=None)


def with_(env: Env, *, importable=None, tools=None) -> Env:
    return replace(
        env,
        importable={**env.importable, **(importable or {})},
        tools={**env.tools, **(tools or {})},
    )


def outcome(pair, verdict, *, required, executed=None, declined=None, **kw):
    """Required: the failure lines. Not required: the verdict (and required_failures must stay quiet)."""
    executed = {pair: 0} if executed is None else executed
    if required:
        return required_failures({pair}, {pair: verdict}, executed, declined, **kw)
    assert required_failures(set(), {pair: verdict}, executed, declined, **kw) == []
    return verdict


def assert_required_fails(pair, verdict, *needles, **kw):
    lines = outcome(pair, verdict, required=True, **kw)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"REQUIRED {pair[0]}:{pair[1]}")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_skips(pair, verdict, *needles):
    v = outcome(pair, verdict, required=False)
    assert not v.runnable and v.reason, "a decline without a reason is a silent skip"
    for needle in needles:
        assert needle in v.reason, (needle, v.reason)
    return v


# ------------------------------------------------------------------------------------------------
# The situations of issue #6, each required and not required.

SITUATIONS = {
    # name: (pair, env, importer or None, reason fragments: cause and fix)
    "no-cuda": (("cudnn", "gdn2"), no_gpu(), None, ["needs a CUDA GPU", "run on a GPU runner"]),
    "no-cuda-fla": (("fla", "kda"), no_gpu(), None, ["needs a CUDA GPU", "is_available() is False"]),
    "sm90-gdn2": (
        ("cudnn", "gdn2"),
        hopper(),
        None,
        ["needs SM100/101/102/103/107 (Blackwell", "found SM90 (NVIDIA H200)", "B200/GB200"],
    ),
    "fe-not-installed": (
        ("cudnn", "gdn"),
        blackwell(cudnn_frontend=None),
        None,
        ["nvidia-cudnn-frontend is not installed", "pip install -U 'nvidia-cudnn-frontend>=1.32'"],
    ),
    "fla-not-installed": (
        ("fla", "gdn2"),
        blackwell(fla=None),
        None,
        ["fla-core is not installed", "pip install -U 'fla-core>=0.6'"],
    ),
    "triton-not-installed": (("fla", "gdn"), blackwell(triton=None), None, ["triton is not installed", "pip install triton"]),
    "op-attribute-missing": (
        ("cudnn", "gdn2"),
        blackwell(),
        lambda name: types.SimpleNamespace(gated_delta_net=lambda *a: None),  # an FE without GDN2
        ["cudnn.linear_attention has no gated_delta_net_v2", "pip install -U 'nvidia-cudnn-frontend>=1.32'"],
    ),
    "fla-op-attribute-missing": (
        ("fla", "gdn2"),
        blackwell(),
        lambda name: types.ModuleType(name),
        ["fla.ops.gdn2 has no chunk_gdn2", "fla-core"],
    ),
    "fe-below-floor": (
        ("cudnn", "gdn"),
        blackwell(cudnn_frontend="1.28.0"),
        None,
        ["nvidia-cudnn-frontend 1.28.0 < 1.29", "GDN kernels can return NaN", "pip install"],
    ),
    "cutlass-below-floor": (
        ("cudnn", "gdn2"),
        blackwell(cutlass_dsl="4.6.2"),
        None,
        ["nvidia-cutlass-dsl 4.6.2 < 4.7.0", "pip install -U 'nvidia-cutlass-dsl>=4.7'"],
    ),
    "fla-below-floor": (("fla", "kda"), blackwell(fla="0.4.1"), None, ["fla-core 0.4.1 < 0.6", "pip install"]),
    "cutlass-dsl-missing": (
        ("cudnn", "gdn2"),
        with_(blackwell(cutlass_dsl=None), importable={"cutlass": False}),
        None,
        ["nvidia-cutlass-dsl is not installed", "FROST", "pip install -U 'nvidia-cutlass-dsl>=4.7'"],
    ),
    "raises-on-import": (
        ("cudnn", "kda"),
        blackwell(),
        lambda name: (_ for _ in ()).throw(OSError("libcudnn_graph.so.9: cannot open shared object file")),
        ["importing cudnn.linear_attention raised OSError: libcudnn_graph.so.9", "python -c 'import cudnn.linear_attention'"],
    ),
    "fla-raises-on-import": (
        ("fla", "gdn"),
        blackwell(),
        lambda name: (_ for _ in ()).throw(RuntimeError("Triton kernel registry broken")),
        # fla.ops, where the adapter finds chunk_gated_delta_rule (the old gate table said
        # fla.ops.gated_delta_rule: the two copies disagreed, the adapter's path is what runs)
        ["importing fla.ops raised RuntimeError: Triton kernel registry broken"],
    ),
    "module-not-found-on-import": (
        ("cudnn", "gdn"),
        blackwell(),
        lambda name: (_ for _ in ()).throw(ModuleNotFoundError("No module named 'cudnn'", name="cudnn")),
        # one message for "the package is absent", the adapter's (the gate's copy worded it differently)
        ["nvidia-cudnn-frontend is not installed", "pip install"],
    ),
    "subpackage-missing-on-import": (
        ("cudnn", "gdn"),
        blackwell(cudnn_frontend="1.27.0"),
        lambda name: (_ for _ in ()).throw(
            ModuleNotFoundError("No module named 'cudnn.linear_attention'", name="cudnn.linear_attention")
        ),
        ["1.27.0 < 1.29", "has no cudnn.linear_attention (too old for gdn)"],
    ),
}


def _verdict(situation):
    pair, env, importer, _ = SITUATIONS[situation]
    return pair, check_pair(*pair, env, importer) if importer else pair_verdict(*pair, env)


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_situation_required_fails_loudly(situation):
    pair, verdict = _verdict(situation)
    assert_required_fails(pair, verdict, "cannot run", *SITUATIONS[situation][3])


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_situation_not_required_is_a_skip_with_the_same_reason(situation):
    pair, verdict = _verdict(situation)
    v = assert_skips(pair, verdict, *SITUATIONS[situation][3])
    required_line = assert_required_fails(pair, verdict)
    name = f"{pair[0]}:{pair[1]}"
    assert v.reason.startswith(name), "a skip names its pair"
    stripped = v.reason[len(name):].removeprefix(" cannot run: ").removeprefix(": ").removeprefix(" ")
    assert required_line == f"REQUIRED {name} cannot run: {stripped}", "required and not required give the same reason"


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
def test_situation_required_fails_even_if_cases_were_counted(situation):
    # A runner bug that executes cases of a pair the gate refused must not turn the failure into a pass.
    pair, verdict = _verdict(situation)
    assert assert_required_fails(pair, verdict, executed={pair: 5})


def test_engine_declines_every_case():
    pair = ("cudnn", "gdn2")
    ok = pair_verdict(*pair, blackwell())
    assert ok.runnable
    reasons = ["gdn2_frost: K=256 is not supported (K in {64, 128})", "gdn2_frost: fp32 io declined"]
    line = assert_required_fails(
        pair, ok, "executed zero cases", "all 2 selected case(s) were declined", f"first reason: {reasons[0]}",
        declined={pair: reasons},
    )
    assert "filtered" not in line
    # a count, or one reason, works as well as the list
    assert_required_fails(pair, ok, "all 7 selected", declined={pair: 7})
    assert_required_fails(pair, ok, "all 1 selected", "first reason: nope", declined={pair: "nope"})
    # the shape the runner and the pytest plugin pass: (count, first reason)
    assert_required_fails(pair, ok, "all 3 selected", f"first reason: {reasons[1]}", declined={pair: (3, reasons[1])})
    assert_required_fails(pair, ok, "all 3 selected", declined={pair: (3, "")})
    assert_required_fails(pair, ok, "none was declined", declined={pair: (0, "")})
    # not required: nothing fails at the run level (each decline is its own skip result, with its reason)
    assert outcome(pair, ok, required=False, declined={pair: reasons}).runnable


def test_selection_filters_every_case_away():
    pair = ("cudnn", "gdn")
    ok = pair_verdict(*pair, blackwell())
    line = assert_required_fails(pair, ok, "executed zero cases", "none was declined", "widen -k", "--op gdn")
    assert "first reason" not in line
    assert assert_required_fails(pair, ok, "none was declined", declined={pair: []})
    assert outcome(pair, ok, required=False).runnable


def test_required_pair_never_gated_is_a_failure():
    lines = required_failures({("fla", "kda")}, {}, {})
    assert len(lines) == 1 and "was not part of this run" in lines[0] and "--backend fla --op kda" in lines[0]


def test_required_pair_that_ran_passes_and_others_still_fail():
    good, bad = ("cudnn", "gdn2"), ("fla", "gdn2")
    env = blackwell(fla=None)
    verdicts = {good: pair_verdict(*good, env), bad: pair_verdict(*bad, env)}
    lines = required_failures({good, bad}, verdicts, {good: 12, bad: 0})
    assert len(lines) == 1 and lines[0].startswith("REQUIRED fla:gdn2 cannot run")


def test_required_sources_are_named():
    spec = required_spec({"NVTE_GDN2_TEST_REQUIRED": "1"})
    lines = required_failures(spec, {("cudnn", "gdn2"): pair_verdict("cudnn", "gdn2", hopper())}, {})
    assert lines[0].endswith("[required by NVTE_GDN2_TEST_REQUIRED=1]")


# ------------------------------------------------------------------------------------------------
# Floors and facts, one by one


def test_all_good_everywhere_it_should_be():
    for op in ("gdn", "kda", "gdn2"):
        for backend in ("cudnn", "fla"):
            v = pair_verdict(backend, op, blackwell())
            assert v.runnable and v.backward and v.notes == (), (backend, op, v)


def test_every_unmet_requirement_is_gathered():
    env = with_(hopper(cudnn_frontend="1.28.0", cutlass_dsl=None), importable={"cutlass": False})
    v = pair_verdict("cudnn", "gdn2", env)
    assert not v.runnable
    assert v.reason.startswith("cudnn:gdn2 cannot run: (1) ")
    for needle in ("1.28.0 < 1.29", "found SM90", "nvidia-cutlass-dsl is not installed"):
        assert needle in v.reason
    v = pair_verdict("fla", "gdn", no_gpu(fla=None, triton=None))
    assert "(1)" in v.reason and "(2)" in v.reason and "(3)" in v.reason


def test_gdn2_below_1_32_is_runnable_but_flagged_known_wrong():
    v = pair_verdict("cudnn", "gdn2", blackwell(cudnn_frontend="1.31.0"))
    assert v.runnable
    assert any(n.startswith("KNOWN-WRONG") and "steep" in n and "1.32" in n for n in v.notes), v.notes
    assert not any("KNOWN-WRONG" in n for n in pair_verdict("cudnn", "gdn2", blackwell()).notes)
    assert not any("KNOWN-WRONG" in n for n in pair_verdict("cudnn", "gdn", blackwell(cudnn_frontend="1.31.0")).notes)


def test_fe_floor_applies_to_gdn_and_gdn2_not_kda():
    env = blackwell(cudnn_frontend="1.28.0")
    assert not pair_verdict("cudnn", "gdn", env).runnable
    assert not pair_verdict("cudnn", "gdn2", env).runnable
    assert pair_verdict("cudnn", "kda", env).runnable


@pytest.mark.parametrize("sm,ok", [((10, 0), True), ((10, 1), True), ((10, 3), True), ((10, 7), True),
                                   ((9, 0), False), ((12, 0), False), ((8, 0), False), ((10, 4), False)])
def test_gdn2_arch(sm, ok):
    assert pair_verdict("cudnn", "gdn2", replace(blackwell(), capability=sm)).runnable is ok


def test_gdn_on_hopper_only_through_cutile():
    assert pair_verdict("cudnn", "gdn", hopper()).runnable
    v = pair_verdict("cudnn", "gdn", hopper(cudart="12.8"))
    assert not v.runnable
    assert "FROST (needs SM100/101/102/103/107) excluded" in v.reason
    assert "CUDA runtime 12.8 (cuda-bindings) < 13.3" in v.reason
    # without cuda-bindings the torch build's runtime stands in
    v = pair_verdict("cudnn", "gdn", hopper(cudart=None, cuda_runtime="12.8"))
    assert "CUDA runtime 12.8 (torch.version.cuda) < 13.3" in v.reason
    v = pair_verdict("cudnn", "gdn", with_(hopper(cuda_tile=None), importable={"cuda.tile": False}))
    assert "cuda-tile is not installed" in v.reason and "pip install 'cuda-tile[tileiras]>=1.4'" in v.reason
    assert "cuda-tile 1.3.0 < 1.4" in pair_verdict("cudnn", "gdn", hopper(cuda_tile="1.3.0")).reason
    v = pair_verdict("cudnn", "gdn", with_(hopper(), tools={"tileiras": None}))
    assert "tileiras not found" in v.reason
    v = pair_verdict("cudnn", "gdn", hopper(tileiras=None))
    assert "does not run" in v.reason
    # cutlass-dsl is irrelevant on Hopper for GDN
    assert pair_verdict("cudnn", "gdn", with_(hopper(cutlass_dsl=None), importable={"cutlass": False})).runnable


def test_gdn_on_blackwell_needs_one_engine_family():
    no_cutile = with_(blackwell(cuda_tile=None), importable={"cuda.tile": False}, tools={"tileiras": None})
    assert pair_verdict("cudnn", "gdn", no_cutile).runnable
    no_frost = with_(blackwell(cutlass_dsl=None), importable={"cutlass": False})
    assert pair_verdict("cudnn", "gdn", no_frost).runnable
    neither = with_(no_cutile, importable={"cutlass": False})
    v = pair_verdict("cudnn", "gdn", replace(neither, versions={**neither.versions, "cutlass_dsl": None}))
    assert not v.runnable and "FROST needs:" in v.reason and "cuTile needs:" in v.reason


def test_kda_on_hopper_through_the_hopper_engines_from_1_30():
    no_cutile = with_(hopper(cuda_tile=None), importable={"cuda.tile": False})
    assert pair_verdict("cudnn", "kda", replace(no_cutile, versions={**no_cutile.versions, "cudnn_frontend": "1.30.0"})).runnable
    v = pair_verdict("cudnn", "kda", replace(no_cutile, versions={**no_cutile.versions, "cudnn_frontend": "1.29.1"}))
    assert not v.runnable and "Hopper needs:" in v.reason and "1.29.1 < 1.30" in v.reason
    # cuTile also serves KDA on Hopper
    assert pair_verdict("cudnn", "kda", hopper(cudnn_frontend="1.29.1")).runnable
    # on an Ada card neither FROST nor Hopper engines exist
    v = pair_verdict("cudnn", "kda", replace(no_cutile, capability=(8, 9), device_name="NVIDIA L40S"))
    assert "FROST (needs SM100/101/102/103/107) and Hopper (needs SM90) excluded" in v.reason


def test_cutlass_dsl_installed_but_not_importable():
    v = pair_verdict("cudnn", "gdn2", with_(blackwell(), importable={"cutlass": False}))
    assert not v.runnable and "4.8.0 distribution is installed but `cutlass` does not resolve" in v.reason


@pytest.mark.parametrize(
    "triton,refused", [("3.3.1", False), ("3.4.0", True), ("3.5.0+git1234", True), ("3.7.0", True), ("3.7.1", False), ("3.8.0", False)]
)
def test_fla_gdn_backward_refused_on_hopper_with_triton_3_4_to_3_7_0(triton, refused):
    v = pair_verdict("fla", "gdn", hopper(triton=triton))
    assert v.runnable, "the forward still runs"
    assert v.backward is not refused
    if refused:
        assert "FLA #640" in v.backward_reason and "pip install -U 'triton>=3.7.1'" in v.backward_reason
        assert f"triton {triton}" in v.backward_reason
        pair = ("fla", "gdn")
        # required and backward cases selected (or unknown): fails; forward-only selection: fine
        assert_required_fails(pair, v, "cannot run its backward", "FLA #640", executed={pair: 3})
        assert assert_required_fails(pair, v, executed={pair: 3}, backward_selected={pair})
        assert required_failures({pair}, {pair: v}, {pair: 3}, backward_selected=set()) == []
        # not required: a runnable verdict with a visible backward refusal
        assert outcome(pair, v, required=False).backward_reason


def test_fla_hopper_guard_only_for_gdn_and_only_on_hopper():
    assert pair_verdict("fla", "kda", hopper(triton="3.5.0")).backward
    assert pair_verdict("fla", "gdn2", hopper(triton="3.5.0")).backward
    assert pair_verdict("fla", "gdn", blackwell(triton="3.5.0")).backward
    # FLA's own test also matches the name ("NVIDIA H" in the device name)
    odd = replace(hopper(triton="3.5.0"), capability=(8, 0), device_name="NVIDIA H100-ish")
    assert not pair_verdict("fla", "gdn", odd).backward


def test_fla_recurrent_is_gated_like_fla_without_the_backward_guard():
    assert_skips(("fla-recurrent", "gdn2"), pair_verdict("fla-recurrent", "gdn2", blackwell(fla=None)),
                 "fla-recurrent:gdn2: fla-core is not installed")
    assert pair_verdict("fla-recurrent", "gdn", hopper(triton="3.5.0")).backward
    v = adapter("fla-recurrent", lambda name: types.ModuleType(name)).load("gdn2")
    assert "fla.ops.gdn2 has no fused_recurrent_gdn2" in v.reason
    assert required_pairs({"DELTACHECK_REQUIRE": "fla-recurrent:kda"}) == {("fla-recurrent", "kda")}


def test_unknown_backend_is_its_own_judge_and_unknown_op_declines():
    assert pair_verdict("mypkg.mod:Obj", "gdn2", no_gpu()) == Verdict.ok()
    assert pair_verdict("oracle", "kda", no_gpu()).runnable
    v = pair_verdict("cudnn", "mamba2", blackwell())
    assert not v.runnable and "unknown op 'mamba2'" in v.reason


def test_unreadable_versions_are_noted_not_judged():
    v = pair_verdict("cudnn", "gdn2", blackwell(cudnn_frontend="main"))
    assert v.runnable and any("unreadable" in n for n in v.notes)


def test_load_op_happy_path_and_third_party():
    def fn(*a):
        return "ran"

    library = Library("fla-core", "0.6.0", "pip install -U 'fla-core>=0.6'", "fla-core is not installed")
    got, v = load_entry_point("fla:kda", "kda", "fla.ops", "chunk_kda", library,
                              lambda name: types.SimpleNamespace(chunk_kda=fn))
    assert got is fn and v.runnable
    assert adapter("fla", lambda name: types.SimpleNamespace(chunk_kda=fn)).load("kda") == Verdict.ok()

    class ThirdParty:  # no floors, no load(): its own check() decides
        name, ops = "mine", frozenset({"gdn"})

        def check(self, case, env):
            return Verdict.ok()

        def run(self, case, inputs):
            raise AssertionError("not called")

    assert library_verdict(ThirdParty(), "mypkg:Obj", "gdn", no_gpu()) == Verdict.ok()
    v = adapter("cudnn", lambda name: types.SimpleNamespace(gated_delta_net=42)).load("gdn")
    assert not v.runnable and "not callable" in v.reason


def test_load_op_lazy_export_that_raises_is_a_decline():
    class Lazy:
        def __getattr__(self, name):
            raise ImportError("cutlass._mlir missing")

    v = adapter("cudnn", lambda name: Lazy()).load("gdn2")
    assert not v.runnable and "loading cudnn.linear_attention.gated_delta_net_v2 raised ImportError" in v.reason


def test_check_pair_does_not_import_what_is_not_installed():
    calls = []
    v = check_pair("cudnn", "gdn", blackwell(cudnn_frontend=None), lambda name: calls.append(name))
    assert calls == [] and not v.runnable and v.reason.count("not installed") == 1


def test_check_pair_merges_gate_and_import_reasons():
    v = check_pair("cudnn", "gdn2", hopper(), lambda name: types.SimpleNamespace())
    assert not v.runnable and "found SM90" in v.reason and "has no gated_delta_net_v2" in v.reason


# ------------------------------------------------------------------------------------------------
# Required-mode configuration


def test_required_pairs_from_environment():
    assert required_pairs({}) == set()
    assert required_pairs({"NVTE_GDN2_TEST_REQUIRED": "1"}) == {("cudnn", "gdn2")}
    assert required_pairs({"NVTE_GDN_TEST_REQUIRED": "1", "NVTE_GDN2_TEST_REQUIRED": "0"}) == {("cudnn", "gdn")}
    assert required_pairs({"DELTACHECK_REQUIRE": " cudnn:gdn2, fla:kda ,,mypkg.mod:Obj:gdn,"}) == {
        ("cudnn", "gdn2"), ("fla", "kda"), ("mypkg.mod:Obj", "gdn"),
    }
    spec = required_spec({"NVTE_GDN2_TEST_REQUIRED": "1", "DELTACHECK_REQUIRE": "cudnn:gdn2,fla:gdn"})
    assert spec == {("cudnn", "gdn2"): "NVTE_GDN2_TEST_REQUIRED=1", ("fla", "gdn"): "DELTACHECK_REQUIRE=cudnn:gdn2,fla:gdn"}


@pytest.mark.parametrize(
    "environ,needles",
    [
        ({"DELTACHECK_REQUIRE": "cudnn"}, ["entry 'cudnn' is not backend:op"]),
        ({"DELTACHECK_REQUIRE": "cudnn:foo"}, ["entry 'cudnn:foo': unknown op 'foo'", "gdn, kda, gdn2"]),
        ({"DELTACHECK_REQUIRE": ":gdn"}, ["entry ':gdn' is not backend:op"]),
        ({"DELTACHECK_REQUIRE": "cud nn:gdn"}, ["'cud nn' is not a backend name"]),
        ({"DELTACHECK_REQUIRE": "cudnn,fla:kda,cudnn:foo"}, ["'cudnn' is not", "'cudnn:foo'"]),
        ({"NVTE_GDN2_TEST_REQUIRED": "2"}, ["NVTE_GDN2_TEST_REQUIRED='2' is neither 1 nor 0"]),
    ],
)
def test_malformed_required_settings_are_errors_naming_the_entry(environ, needles):
    with pytest.raises(RequireSpecError) as info:
        required_pairs(environ)
    assert isinstance(info.value, RequiredModeError) and isinstance(info.value, ValueError)
    text = str(info.value)
    for needle in needles:
        assert needle in text


def test_report_format_is_shared_and_loud():
    assert format_required_report([]) == ""
    lines = ["REQUIRED cudnn:gdn2 cannot run: x", "REQUIRED fla:kda executed zero cases: y"]
    text = format_required_report(lines)
    assert "REQUIRED MODE FAILED: 2 required pair(s)" in text
    assert all(f"  * {line}" in text for line in lines)
    assert str(RequiredModeError(lines)) == text
    assert RequiredModeError(lines).failures == lines


def test_functions_are_pure():
    env = hopper()
    before = env.to_dict()
    a = required_failures({("cudnn", "gdn2")}, {("cudnn", "gdn2"): pair_verdict("cudnn", "gdn2", env)}, {})
    b = required_failures({("cudnn", "gdn2")}, {("cudnn", "gdn2"): pair_verdict("cudnn", "gdn2", env)}, {})
    assert a == b and env.to_dict() == before


# ------------------------------------------------------------------------------------------------
# The probe, through a fake Finder


class FakeFinder(Finder):
    def __init__(self, *, dists=None, modules=(), dirs=None, files=(), env=None, runs=None, torch=None,
                 cudart=None, driver=None, backend=None, banners=None):
        self.banners = banners or {}  # path -> the release banner embedded in that library's bytes
        self.dists = dists or {}
        self.modules = set(modules)
        self.dirs = dirs or {}
        self.files = set(files)
        self.env = env or {}
        self.runs = runs or {}
        self.torch = torch if torch is not None else {"torch": "2.13.0+cpu", "cuda_runtime": None, "cuda": False}
        self.cudart = cudart
        self.driver = driver
        self.backend = backend
        self.calls: list[str] = []

    def dist_version(self, dist):
        return self.dists.get(dist)

    def has_module(self, name):
        return name in self.modules

    def module_dirs(self, name):
        return self.dirs.get(name, [])

    def which(self, tool, path=None):
        for d in (path.split(":") if path else ["/usr/bin"]):
            if f"{d}/{tool}" in self.files:
                return f"{d}/{tool}"
        return None

    def getenv(self, name):
        return self.env.get(name)

    def exists(self, path):
        return path in self.files

    def embedded_release(self, path):
        return self.banners.get(path)

    def run(self, argv, timeout=15.0):
        self.calls.append(" ".join(argv))
        return self.runs.get(argv[0])

    def torch_facts(self):
        if isinstance(self.torch, Exception):
            raise self.torch
        return dict(self.torch)

    def cudart_version(self):
        return self.cudart

    def driver_version(self):
        self.calls.append("driver")
        return self.driver

    def cudnn_backend_version(self):
        self.calls.append("cudnn_backend")
        return self.backend


def test_probe_cpu_machine_reads_nothing_gpu_only():
    f = FakeFinder()
    env = probe_env(finder=f)
    assert env.cuda is False and env.capability is None and env.device() == "no CUDA device"
    assert set(gate.VERSION_KEYS) <= set(env.versions) and env.versions["cudnn_frontend"] is None
    assert "driver" not in f.calls and "cudnn_backend" not in f.calls
    assert not any(env.importable.values())


def test_probe_hopper_machine_with_everything():
    f = FakeFinder(
        dists={"nvidia-cudnn-frontend": "1.32.0", "nvidia-cutlass-dsl": "4.8.0", "cuda-tile": "1.4.0",
               "nvidia-cuda-tileiras": "13.3.0", "nvidia-cuda-nvcc": "13.3.1", "nvidia-nvvm": "13.3.0",
               "flash-linear-attention": "0.6.0", "triton": "3.5.0", "transformer-engine": "2.20.0"},
        modules={"cudnn", "cutlass", "cuda.tile", "cuda.bindings", "fla", "triton", "transformer_engine"},
        dirs={"nvidia.cu13": ["/sp/nvidia/cu13"]},
        files={"/sp/nvidia/cu13/bin/tileiras", "/sp/nvidia/cu13/bin/ptxas", "/sp/nvidia/cu13/lib/libnvvm.so.4"},
        runs={"/sp/nvidia/cu13/bin/tileiras": "Cuda compilation tools, release 13.3, V13.3.41\n",
              "/sp/nvidia/cu13/bin/ptxas": "Cuda compilation tools, release 13.3, V13.3.41\n"},
        banners={"/sp/nvidia/cu13/lib/libnvvm.so.4": "Cuda compilation tools, release 13.3, V13.3.41"},
        torch={"torch": "2.13.0", "cuda_runtime": "13.0", "cuda": True, "device_name": "NVIDIA H200",
               "capability": (9, 0), "torch_cudnn": "91400"},
        cudart="13.3", driver="590.10", backend="9.20.0",
    )
    env = probe_env(finder=f)
    assert env.cuda and env.sm == 90 and env.device() == "SM90 (NVIDIA H200)"
    assert env.versions["fla"] == "0.6.0", "flash-linear-attention counts when fla-core is absent"
    assert env.versions["tileiras"] == "13.3.41" and env.tools["tileiras"] == "/sp/nvidia/cu13/bin/tileiras"
    assert env.tools["tileiras_via"] == "pip"
    assert env.versions["cudnn_backend"] == "9.20.0" and env.versions["driver"] == "590.10"
    assert env.versions["transformer_engine"] == "2.20.0"
    assert pair_verdict("cudnn", "gdn", env).runnable
    assert not pair_verdict("cudnn", "gdn2", env).runnable
    assert not pair_verdict("fla", "gdn", env).backward
    # round trip through the run header
    again = Env.from_dict(json.loads(json.dumps(env.to_dict())))
    assert again == env


def test_probe_tileiras_lookup_order_and_broken_binary():
    f = FakeFinder(
        dists={"cuda-tile": "1.4.0"}, modules={"cuda.tile"},
        env={"CUDA_HOME": "/opt/cuda-13.3"}, files={"/opt/cuda-13.3/bin/tileiras"},
        runs={},  # present, but `--version` fails
    )
    env = probe_env(finder=f)
    assert env.tools["tileiras"] == "/opt/cuda-13.3/bin/tileiras"
    assert env.versions["tileiras"] is None and "not runnable" in env.probe_errors["tileiras"]
    f = FakeFinder(files={"/usr/bin/tileiras"}, runs={"/usr/bin/tileiras": "tileiras version ???"})
    env = probe_env(finder=f)
    assert env.tools["tileiras"] == "/usr/bin/tileiras" and env.versions["tileiras"] == "unknown"


def test_probe_survives_a_broken_torch_and_cudnn():
    env = probe_env(finder=FakeFinder(torch=RuntimeError("CUDA driver init failed"),
                                      dists={"nvidia-cudnn-frontend": "1.32.0"}))
    assert env.cuda is False and "CUDA driver init failed" in env.probe_errors["torch"]
    assert env.versions["cudnn_backend"] is None and "cudnn_backend" in env.probe_errors
    env = probe_env(finder=FakeFinder(torch={"torch": "2.13.0", "cuda": False, "error": "RuntimeError: no driver"}))
    assert "no driver" in pair_verdict("fla", "kda", env).reason


def test_real_probe_is_cached_and_sane_on_this_machine():
    env = probe_env()
    assert probe_env() is env
    assert env.versions["torch"]
    json.dumps(env.to_dict())


# ------------------------------------------------------------------------------------------------
# `deltacheck env`


@pytest.fixture
def clean_required(monkeypatch):
    for var in ("NVTE_GDN2_TEST_REQUIRED", "NVTE_GDN_TEST_REQUIRED", "DELTACHECK_REQUIRE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_cli_env_readable(clean_required, capsys):
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "deltacheck env" in out and "packages" in out and "nvidia-cudnn-frontend" in out
    assert "cudnn:gdn2" in out and "fla:kda" in out and "required: none" in out


def test_cli_env_json(clean_required, capsys):
    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    env = Env.from_dict(report["env"])
    assert env.versions["torch"]
    # Each fused backend with the ops it implements: TE 2.20 has no KDA module, FLA no GDP entry point here.
    assert set(report["pairs"]) == (
        {f"cudnn:{o}" for o in ("gdn", "kda", "gdn2", "gdp")}
        | {"cudnn@gdn_frost:gdn", "cudnn@gdn_cutile:gdn", "cudnn@kda_frost:kda", "cudnn@kda_cutile:kda",
           "cudnn@kda_hopper:kda", "cudnn@kda_hopper_cuda:kda", "cudnn@gdn2_frost:gdn2", "cudnn@gdp_frost:gdp"}
        | {f"{b}:{o}" for b in ("fla", "fla-recurrent", "fla-dispatch", "fla-dispatch-cp") for o in ("gdn", "kda", "gdn2")}
        | {"vllm-fla:gdn", "vllm-fla-recurrent:gdn", "flashkda:kda", "flashkda-tokenspeed:kda", "flashqla:gdn"}
        | {f"{b}:{o}" for b in ("te", "te-checkpoint") for o in ("gdn", "gdn2", "gdp")}
        | {f"jax:{o}" for o in ("gdn", "kda", "gdn2", "gdp")} | {"flashinfer:gdn", "flashinfer-decode:gdn"})
    for d in report["pairs"].values():
        assert d["runnable"] or d["reason"]
    assert report["required"] == {} and report["required_failures"] == []


def test_cli_env_required_pair_that_cannot_run_exits_1(clean_required, capsys):
    real = probe_env()
    if real.cuda:
        pytest.skip("this test asserts on a CPU machine")
    clean_required.setenv("NVTE_GDN2_TEST_REQUIRED", "1")
    assert cli.main(["env"]) == 1
    out = capsys.readouterr().out
    assert "REQUIRED MODE FAILED" in out and "REQUIRED cudnn:gdn2 cannot run" in out
    assert "[required by NVTE_GDN2_TEST_REQUIRED=1]" in out


def test_cli_env_malformed_required_exits_2(clean_required, capsys):
    clean_required.setenv("DELTACHECK_REQUIRE", "cudnn,cudnn:foo")
    assert cli.main(["env", "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert "'cudnn' is not backend:op" in report["required_error"] and "'cudnn:foo'" in report["required_error"]


def test_cli_env_subprocess(clean_required):
    res = subprocess.run([sys.executable, "-m", "deltacheck.harness.cli", "env", "--json"],
                         capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert res.returncode == 0, res.stderr
    assert "pairs" in json.loads(res.stdout)


def _forward(status, reason="", **metrics):
    from deltacheck.harness.records.results import Result

    return Result(case="kda-bf16-bshd-N1-L1-H2/2/4-K128-V128-steep", backend="cudnn", check="forward",
                  status=status, reason=reason, metrics=metrics)


@pytest.mark.parametrize("ill_posed", [True, False])
def test_an_ill_posed_case_ran_it_was_not_declined(ill_posed):
    """On the H200, DELTACHECK_REQUIRE=cudnn:kda failed both ways with 'declined 1 case(s) inside the envelope'
    when the kernel had run a case whose bf16 baseline misses the threshold too (skipped as ill-posed). Such a
    skip is an execution: not a decline, and not a refusal inside the envelope."""
    from deltacheck.harness.run.tally import RunTally as RequiredTally
    from deltacheck.harness.run.task import task_summary

    skip = _forward("skip", "ill-posed at bf16: ..." if ill_posed else "cuDNN declined: no engine",
                    envelope_inside=True, **({"ill_posed": True} if ill_posed else {}))
    summary = task_summary([skip])
    assert (summary["executed"], summary["declined"], summary["declined_inside_envelope"]) == (
        (True, False, False) if ill_posed else (False, True, True))
    tally = RequiredTally()
    tally.add("cudnn", "kda", summary, skip.case)
    tally.add("cudnn", "kda", task_summary([_forward("pass", envelope_inside=True)]), "another")
    pair = ("cudnn", "kda")
    failures = tally.failures({pair}, {pair: Verdict(True)})
    assert (failures == []) is ill_posed, failures
    assert tally.executed[pair] == (2 if ill_posed else 1)
