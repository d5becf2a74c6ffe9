"""cuDNN's engines one at a time (issue #24): the cuTile toolchain the probe reads (tileiras, and the ptxas and
libnvvm it will use, CUDA_HOME's effect) and the declines that name the fix; the ``cudnn@<engine>`` backends
(pins, declines listing what was offered, their own envelopes); the engine that served, recorded on every
``cudnn`` forward result. Against the contract double (tests/doubles/cudnn_la.py) and fake Finders."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from doubles import cudnn_la
from test_availability import FakeFinder, hopper

from deltacheck.cases import Case, make_inputs
from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.harness.backends.cudnn import adapter, facts
from deltacheck.harness.judge.runner import CaseRunner, RunOptions
from deltacheck.harness.machine import environment
from deltacheck.harness.machine.environment import probe_env

# ------------------------------------------------------------------------------------------------
# The toolchain probe

BANNER = "Cuda compilation tools, release {r}, V{v}\n"
TC = "/tmp/tc/nvidia/cu13"  # the bundle of ../shared/gpu/cutile-toolchain.sh, put on PATH
OLD = "/usr/local/cuda"  # the image's CUDA 13.0 toolkit
VENV = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia"  # the H200 image's pip CUDA wheels


def h200_finder(*, env=None, ptxas=True, own_nvvm="13.4.92", pip=False) -> FakeFinder:
    """An H200 with the cuTile runtime and tileiras 13.4.92 on PATH (its own ptxas and libnvvm beside it), and the
    image's 13.0 toolkit at /usr/local/cuda."""
    files = {f"{TC}/bin/tileiras", f"{OLD}/bin/ptxas", f"{OLD}/nvvm/lib64/libnvvm.so",
             f"{OLD}/include/cuda_bf16.h", f"{OLD}/include/crt/mma.h",  # the toolkit's full include tree
             f"{VENV}/cu13/include/cuda_bf16.h", f"{VENV}/cu13/include/mma.h"}  # pip nvidia-cuda-runtime: no crt/
    runs = {f"{TC}/bin/tileiras": BANNER.format(r="13.4", v="13.4.92"),
            f"{OLD}/bin/ptxas": BANNER.format(r="13.0", v="13.0.88")}
    banners = {f"{OLD}/nvvm/lib64/libnvvm.so": BANNER.format(r="13.0", v="13.0.88")}
    if ptxas:
        files.add(f"{TC}/bin/ptxas")
        runs[f"{TC}/bin/ptxas"] = BANNER.format(r="13.4", v="13.4.92")
    if own_nvvm:
        files.add(f"{TC}/lib/libnvvm.so.4")
        r = ".".join(own_nvvm.split(".")[:2])
        banners[f"{TC}/lib/libnvvm.so.4"] = BANNER.format(r=r, v=own_nvvm)
    dists = {"nvidia-cudnn-frontend": "1.32.0", "cuda-tile": "1.7.0"}
    dirs = {"nvidia": [VENV]}
    if pip:  # the same files as the pip wheels: cuda.tile then ignores PATH and CUDA_HOME
        dists.update({"nvidia-cuda-tileiras": "13.4.92", "nvidia-cuda-nvcc": "13.4.92", "nvidia-nvvm": "13.4.92"})
        dirs["nvidia.cu13"] = [TC]
    f = FakeFinder(
        dists=dists, modules={"cudnn", "cuda.tile", "cuda.bindings"}, dirs=dirs, files=files, runs=runs,
        banners=banners, env=env or {},
        torch={"torch": "2.11.0", "cuda_runtime": "13.0", "cuda": True, "device_name": "NVIDIA H200",
               "capability": (9, 0), "torch_cudnn": "91400"},
        cudart="13.3", driver="580.95", backend="9.20.0",
    )
    real_which = f.which
    f.which = lambda tool, path=None: real_which(tool, path or f"{TC}/bin")  # PATH = the bundle's bin
    return f


def test_probe_reads_the_toolchain_tileiras_will_use():
    env = probe_env(finder=h200_finder())
    assert env.tools["tileiras"] == f"{TC}/bin/tileiras" and env.tools["tileiras_via"] == "PATH"
    assert env.tools["ptxas"] == f"{TC}/bin/ptxas" and env.tools["libnvvm"] == f"{TC}/lib/libnvvm.so.4"
    assert env.tools["cuda_home"] is None
    assert (env.versions["tileiras"], env.versions["ptxas"], env.versions["libnvvm"]) == ("13.4.92",) * 3
    assert facts.toolchain_unmet(env) == []
    assert facts.floors("cudnn", "gdn", env).runnable
    assert facts.engine_verdict("gdn_cutile", env).runnable


def test_cuda_home_on_an_older_toolkit_is_a_decline_naming_it():
    """CUDA_HOME=/usr/local/cuda (13.0): tileiras takes that ptxas and libnvvm (rc 5 at the first execute)."""
    env = probe_env(finder=h200_finder(env={"CUDA_HOME": OLD}))
    assert env.tools["cuda_home"] == OLD and env.tools["ptxas"] == f"{OLD}/bin/ptxas"
    assert env.tools["libnvvm"] == f"{OLD}/nvvm/lib64/libnvvm.so"
    assert env.versions["ptxas"] == "13.0.88" and env.versions["libnvvm"] == "13.0.88"
    unmet = facts.toolchain_unmet(env)
    assert len(unmet) == 2, unmet
    assert unmet[0].startswith(f"ptxas 13.0.88 at {OLD}/bin/ptxas does not match tileiras 13.4.92")
    assert unmet[1].startswith(f"libnvvm 13.0.88 at {OLD}/nvvm/lib64/libnvvm.so does not match tileiras 13.4.92")
    assert all(f"CUDA_HOME={OLD} makes tileiras take ptxas and libnvvm from there" in u for u in unmet)
    assert all("unset CUDA_HOME" in u and f"(e.g. {TC})" in u for u in unmet)
    v = facts.engine_verdict("gdn_cutile", env)
    assert not v.runnable and v.reason.startswith("cudnn@gdn_cutile:gdn cannot run: (1) ptxas 13.0.88") and "unset CUDA_HOME" in v.reason
    assert not facts.floors("cudnn", "gdn", env).runnable  # on SM90 GDN has cuTile alone
    assert facts.floors("cudnn", "kda", env).runnable  # the Hopper KDA engines need no tileiras
    assert not facts.engine_verdict("kda_cutile", env).runnable
    assert facts.engine_verdict("kda_hopper_cuda", env).runnable  # NVRTC takes $CUDA_HOME/include: complete
    # CUDA_HOME at the bundle itself is fine
    ok = probe_env(finder=h200_finder(env={"CUDA_HOME": TC}))
    assert ok.tools["cuda_home"] == TC and facts.toolchain_unmet(ok) == []


def test_nvrtc_include_tree_without_crt_is_a_kda_hopper_cuda_decline_naming_the_fix():
    """Measured on the H200: with CUDA_HOME unset (for tileiras), FE's NVRTC compiler picks the pip
    nvidia/cu13/include, which has mma.h but not crt/mma.h: kda_hopper_cuda fails to compile at the first call."""
    env = probe_env(finder=h200_finder())
    assert env.tools["nvrtc_include"] == f"{VENV}/cu13/include"
    assert env.tools["nvrtc_include_missing"] == "crt/mma.h"
    v = facts.engine_verdict("kda_hopper_cuda", env)
    assert not v.runnable
    assert v.reason.startswith(f"cudnn@kda_hopper_cuda:kda: the NVRTC include tree {VENV}/cu13/include lacks crt/mma.h")
    assert "set CUDAToolkit_ROOT to a full CUDA toolkit" in v.reason
    assert facts.floors("cudnn", "kda", env).runnable  # kda_cutile still serves
    # the fix: CUDAToolkit_ROOT for NVRTC, CUDA_HOME still unset for tileiras
    fixed = probe_env(finder=h200_finder(env={"CUDAToolkit_ROOT": OLD}))
    assert fixed.tools["nvrtc_include"] == f"{OLD}/include" and fixed.tools["nvrtc_include_missing"] is None
    assert fixed.tools["cuda_home"] is None and facts.toolchain_unmet(fixed) == []
    assert facts.engine_verdict("kda_hopper_cuda", fixed).runnable
    assert facts.engine_verdict("gdn_cutile", fixed).runnable
    # neither cuTile nor the NVRTC engine: the pair says both
    broken = replace(env, importable={**env.importable, "cuda.tile": False})
    v = facts.floors("cudnn", "kda", broken)
    assert not v.runnable and "lacks crt/mma.h" in v.reason and "kda_hopper (CuTe DSL) need it" in v.reason


def test_the_pip_tileiras_does_not_see_cuda_home():
    """cuda.tile drops CUDA_HOME for the pip tileiras (matching nvidia-cuda-tileiras / -nvcc / -nvvm)."""
    env = probe_env(finder=h200_finder(env={"CUDA_HOME": OLD}, pip=True))
    assert env.tools["tileiras_via"] == "pip" and env.tools["cuda_home"] is None
    assert env.tools["ptxas"] == f"{TC}/bin/ptxas" and facts.toolchain_unmet(env) == []


def test_a_missing_or_mismatched_file_beside_tileiras_is_named():
    env = probe_env(finder=h200_finder(ptxas=False))
    assert env.tools["ptxas"] is None  # none beside tileiras, none on PATH
    (why,) = facts.toolchain_unmet(env)
    assert why.startswith(f"no ptxas where tileiras 13.4.92 looks, beside tileiras ({TC})")
    assert f"put ptxas 13.4 at {TC}/bin/ptxas" in why
    env = probe_env(finder=h200_finder(own_nvvm="13.0.88"))
    (why,) = facts.toolchain_unmet(env)
    assert why.startswith(f"libnvvm 13.0.88 at {TC}/lib/libnvvm.so.4 does not match tileiras 13.4.92")
    assert "rc 5" in why and "pip install 'nvidia-nvvm==13.4.92'" in why
    env = probe_env(finder=h200_finder(own_nvvm=None))
    (why,) = facts.toolchain_unmet(env)
    assert why.startswith("no libnvvm where tileiras 13.4.92 looks")


def test_an_env_recorded_before_the_toolchain_probe_is_not_judged():
    old = hopper()  # tools: tileiras only (an older run header)
    assert "ptxas" not in old.tools and facts.toolchain_unmet(old) == []
    assert facts.floors("cudnn", "gdn", old).runnable


def test_the_real_finder_reads_an_embedded_release(tmp_path):
    lib = tmp_path / "libnvvm.so.4"
    lib.write_bytes(b"\x7fELF" + b"\0" * 5000 + b"Cuda compilation tools, release 13.4, V13.4.92\0tail")
    assert environment.Finder().embedded_release(str(lib)).startswith("Cuda compilation tools, release 13.4, V13.4.92")
    assert environment._release(environment.Finder().embedded_release(str(lib))) == "13.4.92"
    assert environment.Finder().embedded_release(str(tmp_path / "absent")) is None


def test_deltacheck_env_shows_the_toolchain():
    from deltacheck.harness.commands.env import env_report, format_env

    env = probe_env(finder=h200_finder(env={"CUDA_HOME": OLD}))
    text = format_env(env_report(env, {}))
    assert f"    ptxas                 13.0.88     {OLD}/bin/ptxas  (what tileiras uses)" in text
    assert f"    libnvvm               13.0.88     {OLD}/nvvm/lib64/libnvvm.so  (what tileiras uses)" in text
    assert f"    CUDA_HOME             {OLD}  (passed to tileiras" in text
    assert f"  NVRTC include tree      {OLD}/include\n" in text
    line = next(x for x in text.splitlines() if x.lstrip().startswith("cudnn@gdn_cutile:gdn"))
    assert "skip" in line and "unset CUDA_HOME" in line


# ------------------------------------------------------------------------------------------------
# One backend per engine

ENV = hopper()


@pytest.fixture
def open_gate(monkeypatch):
    monkeypatch.setattr(adapter.CudnnBackend, "pair_verdict", lambda self, op, env: Verdict.ok())


def test_one_backend_per_engine_is_registered():
    for engine, op in facts.ENGINES.items():
        backend = get_backend(f"cudnn@{engine}")
        assert backend.name == f"cudnn@{engine}" and backend.ops == frozenset({op})
        assert backend.plan_name == engine
    assert get_backend("cudnn").plan_name is None


def test_the_pin_ignores_the_plan_variable(monkeypatch):
    monkeypatch.setenv(adapter.PLAN_ENV, "kda_frost")
    assert get_backend("cudnn").plan_name == "kda_frost"
    assert get_backend("cudnn@kda_hopper").plan_name == "kda_hopper"


def test_a_pinned_backend_passes_its_engine_and_records_it():
    double = cudnn_la.make()
    backend = adapter.CudnnEngineBackend("kda_cutile", double, device="cpu")
    case = Case(op="kda", seqlens=(4, 3), layout="thd")
    backend.run(case, make_inputs(case))
    assert double.calls[-1]["plan_name"] == "kda_cutile"
    assert backend.served() == {"engine": "kda_cutile"}


def _hopper_scope(engine, fn, call):
    """kda_hopper's own gate, in part: no in-kernel l2norm (hopper/kda_engine.py check_support)."""
    if engine == "kda_hopper" and call["use_qk_l2norm_in_kernel"]:
        return "KdaHopperEngine: q/k must be pre-normalized; use_qk_l2norm_in_kernel is unsupported"
    return None


def test_a_declined_pin_is_a_decline_listing_what_was_offered():
    double = cudnn_la.make(engine_decline=_hopper_scope)
    backend = adapter.CudnnEngineBackend("kda_hopper", double, device="cpu")
    v = backend.check(Case(op="kda", seqlens=(4,), l2norm=True), ENV)
    assert not v.runnable
    assert v.reason == ("cuDNN declined (plan_name='kda_hopper'): no kda_hopper plan for this graph "
                        "(offered: ['kda_frost', 'kda_cutile', 'kda_hopper_cuda']); served by cudnn@kda_frost, "
                        "cudnn@kda_cutile, cudnn@kda_hopper_cuda (or routed `cudnn`), not by kda_hopper; outside "
                        "kda_hopper's gate (docs/libraries.md): dims=64x64 (serves 128x128)")
    assert backend.check(Case(op="kda", seqlens=(4,)), ENV).runnable
    # the routing backend, on the same double, is served by the next engine instead
    routed = adapter.CudnnBackend(double, device="cpu")
    assert routed.check(Case(op="kda", seqlens=(4,), l2norm=True), ENV).runnable


def test_a_declined_pin_inside_the_engines_envelope_keeps_fes_words_alone():
    # The engine's envelope serves this case, so the pin's decline has nothing of ours to add.
    double = cudnn_la.make(engine_decline=lambda engine, fn, call: "declined" if engine == "kda_hopper" else None)
    backend = adapter.CudnnEngineBackend("kda_hopper", double, device="cpu")
    case = Case(op="kda", seqlens=(4,), K=128, V=128)
    assert [e.contains(case) for e in facts.engine_envelopes("kda_hopper")] == [True]
    v = backend.check(case, ENV)
    assert not v.runnable and "outside" not in v.reason and "no kda_hopper plan" in v.reason, v.reason


def test_a_pinned_backend_serves_only_its_op():
    backend = get_backend("cudnn@gdn_cutile")
    assert not backend.pair_verdict("kda", ENV).runnable
    assert backend.envelopes("kda", env=ENV) == []


def test_each_engine_backend_has_its_own_envelope():
    names = {e: [x.name for x in get_backend(f"cudnn@{e}").envelopes(op)] for e, op in facts.ENGINES.items()}
    assert names == {e: [f"cudnn {e}"] for e in facts.ENGINES}
    # where it applies: cuTile on the H200 with the runtime, kda_hopper only with the CuTe DSL
    assert [x.name for x in get_backend("cudnn@gdn_cutile").envelopes("gdn", env=ENV)] == ["cudnn gdn_cutile"]
    assert get_backend("cudnn@gdn_frost").envelopes("gdn", env=ENV) == []
    no_dsl = replace(ENV, importable={**ENV.importable, "cutlass": False})
    assert get_backend("cudnn@kda_hopper").envelopes("kda", env=no_dsl) == []
    assert [x.name for x in get_backend("cudnn@kda_hopper_cuda").envelopes("kda", env=no_dsl)] == [
        "cudnn kda_hopper_cuda"]


def test_engine_floors_are_the_engines_own():
    assert facts.engine_verdict("kda_hopper_cuda", ENV).runnable
    v = facts.engine_verdict("kda_hopper", replace(ENV, importable={**ENV.importable, "cutlass": False}))
    assert not v.runnable and "kda_hopper (CuTe DSL) need it" in v.reason
    v = facts.engine_verdict("gdn_frost", ENV)
    assert not v.runnable and "needs SM100/101/102/103/107" in v.reason
    b200 = replace(ENV, capability=(10, 0), device_name="NVIDIA B200")
    v = facts.engine_verdict("kda_hopper_cuda", b200)
    assert not v.runnable and "kda_hopper_cuda needs SM90 (Hopper)" in v.reason
    assert facts.engine_verdict("gdn_frost", b200).runnable


# ------------------------------------------------------------------------------------------------
# The engine that served, on the result


def test_the_forward_result_records_the_engine_that_served(open_gate):
    """Default routing walks the offered engines (here: Hopper order); the forward result says which served."""
    order = {"kimi_delta_attention": ("kda_hopper_cuda", "kda_hopper", "kda_frost", "kda_cutile")}

    def refuse(engine, fn, call):
        if engine == "kda_hopper_cuda" and call["use_beta_sigmoid_in_kernel"]:
            return "KdaHopperCudaEngine: (test) no in-kernel sigmoid"
        return _hopper_scope(engine, fn, call)

    backend = adapter.CudnnBackend(cudnn_la.make(engine_decline=refuse, order=order), device="cpu")
    runner = CaseRunner(RunOptions(device="cpu", reference="oracle"))
    served = {}
    for case in (Case(op="kda", seqlens=(5, 3)), Case(op="kda", seqlens=(5, 3), beta_sigmoid=True),
                 Case(op="kda", seqlens=(5, 3), beta_sigmoid=True, l2norm=True)):
        results = runner.run(case, backend, "cudnn", backend.check(case, ENV))
        fwd = next(r for r in results if r.check == "forward")
        assert fwd.status == "pass", fwd.reason
        served[case.id] = fwd.metrics["engine"]
        assert all("engine" not in r.metrics for r in results if r.check != "forward")
    assert list(served.values()) == ["kda_hopper_cuda", "kda_hopper", "kda_frost"]


def test_an_fe_without_the_op_modules_says_the_engine_was_not_recorded():
    double = cudnn_la.make()
    del double.ops
    backend = adapter.CudnnBackend(double, device="cpu")
    case = Case(op="gdn", seqlens=(3,))
    backend.run(case, make_inputs(case))
    assert backend.served() == {"engine": "not recorded (this FE has no ops.<op>.execute_graph)"}


def test_a_compile_failure_at_the_first_call_names_the_engine():
    class TileCompilerExecutionError(Exception):
        pass

    err = TileCompilerExecutionError("Return code 5: failed to compile Tile IR program")
    double = cudnn_la.make()
    real = double.ops.gdn.execute_graph

    def boom(graph, *a):
        real(graph, *a)
        raise err

    double.ops.gdn.execute_graph = boom
    backend = adapter.CudnnEngineBackend("gdn_cutile", double, device="cpu")
    v = backend.check(Case(op="gdn", seqlens=(3,)), ENV)
    assert not v.runnable
    assert v.reason.startswith("cuDNN engine (gdn_cutile) failed to compile its kernel (plan_name='gdn_cutile'): "
                               "TileCompilerExecutionError: Return code 5")


# ------------------------------------------------------------------------------------------------
# The kda_cutile known issues against the H200 run they came from (L0, warm pass, 2026-12-02): the KDA cases
# kda_cutile ran, pinned (cudnn@kda_cutile) and under default routing (cudnn, where results say engine=kda_cutile).
# FAILED: a check failed (NaN out); NOT_FAILED: no check failed (a few errored: non-contiguous d_final_state / dO).

H200_KDA_CUTILE_FAILED = [
    "kda-bf16-bhsd-N1-L128-H4/4/4-K64-V64-trained-l2norm-cont[42]-bwd",
    "kda-bf16-bhsd-N1-L200-H2/2/4-K128-V128-trained-l2norm-sigmoid-h0-cont[63]",
    "kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme-bwd",
    "kda-fp16-bhsd-N2-L129-H1/1/4-K96-V96-steep-state_bf16-beta_zero-l2norm-safegate-cont[65_128]-bwd",
    "kda-fp16-bshd-N1-L200-H2/2/4-K64-V128-extreme-beta_zero-safegate-alog-scale1.0-bwd",
    "kda-fp16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_zero-safegate-dtbias-scale0.0625-bwd",
    "kda-fp16-bshd-N2-L64-H2/2/2-K128-V64-steep-state_bf16-beta_one-safegate-scale0.5-cont[21]",
    "kda-fp16-sbhd-N4-L31-H2/2/4-K96-V96-trained-beta_zero-l2norm-safegate-alog-h0",
    "kda-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V64-extreme-l2norm-h0-cont[64]-bwd",
    "kda-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K96-V96-typical-l2norm-sigmoid-scale0.5-cont[63]"
]
H200_KDA_CUTILE_NOT_FAILED = [
    "kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-extreme-state_bf16-safegate-alog-dtbias-scale0.5",
    "kda-bf16-bhsd-N1-L1-H2/2/2-K128-V128-typical-state_bf16-beta_one-bwd",
    "kda-bf16-bhsd-N1-L1-H2/2/2-K96-V96-typical-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0-bwd",
    "kda-bf16-bhsd-N1-L63-H2/2/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale0.0625-cont[31]",
    "kda-bf16-bhsd-N1-L64-H1/1/4-K128-V64-typical-state_bf16-safegate-alog",
    "kda-bf16-bhsd-N1-L65-H4/4/4-K128-V128-mild-beta_zero-h0-bwd",
    "kda-bf16-bhsd-N4-L31-H2/2/2-K128-V128-typical-beta_one-l2norm-safegate-alog-dtbias",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-mild-beta_zero-cont[32_63]-bwd",
    "kda-bf16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0-cont[63]",
    "kda-bf16-bshd-N2-L130-H4/4/4-K128-V128-typical-sigmoid-bwd",
    "kda-bf16-bshd-N2-L200-H2/2/2-K128-V128-long-l2norm-safegate-alog-dtbias-scale0.5-h0-cont[133]",
    "kda-bf16-sbhd-N1-L128-H1/1/4-K64-V64-steep-state_bf16-beta_one-l2norm-safegate-alog-scale0.5-cont[64]",
    "kda-bf16-sbhd-N1-L128-H2/2/2-K128-V128-trained-beta_zero-cont[65]-bwd",
    "kda-bf16-sbhd-N1-L65-H2/2/2-K128-V128-typical-state_bf16-beta_one-sigmoid-safegate-alog-dtbias-scale0.0625",
    "kda-bf16-sbhd-N2-L129-H1/1/4-K128-V128-steep-beta_zero-scale1.0-h0",
    "kda-bf16-sbhd-N2-L64-H2/2/4-K128-V128-mild-h0-cont[33]",
    "kda-bf16-sbhd-N4-L31-H4/4/4-K96-V96-steep-safegate-dtbias-scale0.5-h0-bwd",
    "kda-bf16-thd-N1-T[200]-H2/2/4-K128-V128-extreme-state_bf16-beta_one-safegate-alog-dtbias-scale0.5-cont[1]",
    "kda-bf16-thd-N1-T[65]-H4/4/4-K128-V128-typical-sigmoid-safegate-alog-dtbias-scale1.0-cont[21]",
    "kda-bf16-thd-N2-T[129_129]-H2/2/2-K96-V96-zero-beta_zero-l2norm-safegate-alog-cont[43]-bwd",
    "kda-bf16-thd-N3-T[0_1_127]-H2/2/2-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N3-T[1_64_200]-H2/2/2-K128-V128-steep-h0-cont[64]-bwd",
    "kda-bf16-thd-N3-T[257_0_300]-H2/2/4-K128-V128-long-beta_zero-l2norm-sigmoid-safegate-alog-dtbias-scale0.5-h0-cont[150]",
    "kda-bf16-thd-N3-T[65_1_129]-H2/2/2-K128-V128-extreme-l2norm-sigmoid-safegate-alog-dtbias-h0-bwd",
    "kda-bf16-thd-N3-T[65_65_65]-H4/4/4-K128-V128-trained-state_bf16-safegate-alog-dtbias-scale1.0",
    "kda-bf16-thd-N4-T[0_1_63_65]-H2/2/4-K128-V128-extreme-beta_zero-l2norm-safegate-alog-dtbias-h0",
    "kda-bf16-thd-N4-T[0_1_64_200]-H2/2/2-K128-V128-steep-l2norm-h0-cont[64]-bwd",
    "kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K128-V128-zero-cont[1]",
    "kda-bf16-thd-N6-T[63_1_0_64_65_2]-H4/4/4-K128-V128-mild-state_bf16-beta_one-l2norm-sigmoid-safegate-alog-dtbias-scale1.0",
    "kda-fp16-bhsd-N1-L200-H1/1/4-K64-V128-mild-sigmoid-safegate-h0-bwd",
    "kda-fp16-bhsd-N1-L320-H2/2/2-K96-V96-long-h0-cont[106]",
    "kda-fp16-bhsd-N1-L63-H2/2/2-K64-V64-mild-sigmoid-safegate-dtbias-h0-cont[1]",
    "kda-fp16-thd-N2-T[63_63]-H4/4/4-K64-V128-zero-safegate-dtbias-scale0.5-cont[62]"
]
H200_CUDNN_CUTILE_FAILED = [
    "kda-bf16-bhsd-N1-L128-H4/4/4-K64-V64-trained-l2norm-cont[42]-bwd",
    "kda-fp16-bhsd-N2-L129-H1/1/4-K96-V96-steep-state_bf16-beta_zero-l2norm-safegate-cont[65_128]-bwd",
    "kda-fp16-bshd-N1-L200-H2/2/4-K64-V128-extreme-beta_zero-safegate-alog-scale1.0-bwd",
    "kda-fp16-bshd-N1-L65-H2/2/2-K128-V128-trained-state_bf16-beta_zero-safegate-dtbias-scale0.0625-bwd",
    "kda-fp16-bshd-N2-L64-H2/2/2-K128-V64-steep-state_bf16-beta_one-safegate-scale0.5-cont[21]",
    "kda-fp16-sbhd-N4-L31-H2/2/4-K96-V96-trained-beta_zero-l2norm-safegate-alog-h0",
    "kda-fp16-thd-N5-T[65_0_1_200_3]-H4/4/4-K128-V64-extreme-l2norm-h0-cont[64]-bwd",
    "kda-fp16-thd-N6-T[63_1_0_64_65_2]-H2/2/4-K96-V96-typical-l2norm-sigmoid-scale0.5-cont[63]"
]
H200_CUDNN_CUTILE_NOT_FAILED = [
    "kda-bf16-bhsd-N1-L1-H2/2/2-K96-V96-typical-beta_zero-l2norm-sigmoid-safegate-scale0.0625-h0-bwd",
    "kda-bf16-bhsd-N1-L64-H1/1/4-K128-V64-typical-state_bf16-safegate-alog",
    "kda-bf16-sbhd-N1-L128-H1/1/4-K64-V64-steep-state_bf16-beta_one-l2norm-safegate-alog-scale0.5-cont[64]",
    "kda-bf16-sbhd-N4-L31-H4/4/4-K96-V96-steep-safegate-dtbias-scale0.5-h0-bwd",
    "kda-bf16-thd-N2-T[129_129]-H2/2/2-K96-V96-zero-beta_zero-l2norm-safegate-alog-cont[43]-bwd",
    "kda-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-h0-cont[1_64]-bwd",
    "kda-fp16-bhsd-N1-L200-H1/1/4-K64-V128-mild-sigmoid-safegate-h0-bwd",
    "kda-fp16-bhsd-N1-L320-H2/2/2-K96-V96-long-h0-cont[106]",
    "kda-fp16-bhsd-N1-L63-H2/2/2-K64-V64-mild-sigmoid-safegate-dtbias-h0-cont[1]",
    "kda-fp16-thd-N2-T[63_63]-H4/4/4-K64-V128-zero-safegate-dtbias-scale0.5-cont[62]"
]


def _shipped():
    from deltacheck.harness.ci.known import SHIPPED, load_known_issues

    return {i.id: i for i in load_known_issues([SHIPPED])}


H200_KNOWN_ENV = environment.Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0),
                                 versions={"cudnn_frontend": "1.32.0"})


@pytest.mark.parametrize("spec, ids, failed, not_failed", [
    ("cudnn@kda_cutile", ("cudnn-kda-cutile-fp16-nan", "cudnn-kda-cutile-nan-below-log-decay"),
     H200_KDA_CUTILE_FAILED, H200_KDA_CUTILE_NOT_FAILED),
    ("cudnn", ("cudnn-kda-cutile-fp16-nan-routed",),
     [c for c in H200_CUDNN_CUTILE_FAILED if "-fp16-" in c], [c for c in H200_CUDNN_CUTILE_NOT_FAILED if "-fp16-" in c]),
])
def test_the_kda_cutile_entries_cover_exactly_the_h200_failures(spec, ids, failed, not_failed):
    issues = _shipped()
    covered = {cid for cid in failed + not_failed
               if any(issues[i].applies_to(Case.from_id(cid), spec, spec, H200_KNOWN_ENV) for i in ids)}
    assert covered == set(failed)


def test_the_kda_cutile_entries_stay_on_their_engine_and_machine():
    issues = _shipped()
    case = Case.from_id(H200_KDA_CUTILE_FAILED[-1])  # fp16
    entry = issues["cudnn-kda-cutile-fp16-nan"]
    assert entry.applies_to(case, "cudnn@kda_cutile", "cudnn@kda_cutile", H200_KNOWN_ENV)
    assert not entry.applies_to(case, "cudnn", "cudnn", H200_KNOWN_ENV)
    assert not entry.applies_to(case, "cudnn@kda_cutile", "cudnn@kda_cutile",
                                replace(H200_KNOWN_ENV, capability=(10, 0)))
    assert not entry.applies_to(case, "cudnn@kda_cutile", "cudnn@kda_cutile",
                                replace(H200_KNOWN_ENV, versions={"cudnn_frontend": "1.33.0"}))


def test_compare_says_which_engine_changed(tmp_path, capsys):
    """A release comparison names the forward results another engine served (metrics["engine"])."""
    from test_reports_compare import cli, pair, result

    def served(status, rel, engine, case):
        r = result(status, rel, case=case)
        r["metrics"]["engine"] = engine
        return r

    a, b = "kda-bf16-thd-N1-T[64]-H2/2/2-K128-V128-typical", "kda-bf16-thd-N1-T[64]-H2/2/2-K64-V64-typical"
    old_dir, new_dir = pair(tmp_path, [served("pass", 1e-3, "kda_hopper_cuda", a), served("pass", 1e-3, "kda_cutile", b)],
                            [served("fail", 9e-2, "kda_cutile", a), served("pass", 1e-3, "kda_cutile", b)])
    cli("compare", str(old_dir), str(new_dir))
    text = capsys.readouterr().out
    assert "## Engine changes: another engine served the forward (1)" in text
    assert f"| `{a}` | cudnn | kda_hopper_cuda | **kda_cutile** |" in text
    assert f"`{b}` | cudnn | kda_cutile" not in text.split("## Engine changes", 1)[1].split("##", 1)[0]


# ------------------------------------------------------------------------------------------------
# Incoming gradients: FE 1.32's cuTile engines refuse a strided d_out / d_final_state (H200, 2026-12-02); the
# adapter's own layout transposes must not be what hands them one.

@pytest.mark.parametrize("layout", ["thd", "bhsd", "sbhd"])
def test_the_backward_gets_contiguous_incoming_gradients(layout, monkeypatch):
    from deltacheck.harness.judge.expected import forward_backward, grad_leaves
    from deltacheck.harness.judge.checks import grad_inputs

    case = Case(op="gdn", seqlens=(5, 5) if layout != "thd" else (5, 3), layout=layout, initial_state=True,
                backward=True)
    names = grad_inputs(case)
    backend = adapter.CudnnEngineBackend("gdn_cutile", cudnn_la.make(contiguous_grads=True), device="cpu")
    _, _, grads = forward_backward(backend, case, grad_leaves(make_inputs(case), names), names, "cpu")
    oracle = get_backend("oracle")
    _, _, want = forward_backward(oracle, case, grad_leaves(make_inputs(case), names), names, "cpu")
    for n in names:
        assert grads[n] is not None and torch.allclose(grads[n].double(), want[n].double(), rtol=1e-9, atol=1e-9), n
    # Without the adapter's contiguous hand-over the double refuses, as FE's cuTile engines do: the test can fail.
    monkeypatch.setattr(adapter, "contiguous_grad", lambda x: x)
    with pytest.raises(ValueError, match="must be contiguous"):
        forward_backward(backend, case, grad_leaves(make_inputs(case), names), names, "cpu")


# ------------------------------------------------------------------------------------------------
# States: FE 1.32's cuTile engines (and kda_hopper) take fp32 states only, "callers convert" (cutile/engine.py). On the
# H200 (2026-12-02, third session) that refusal declined every bf16-state case with an initial state and errored
# every continuation that carries its state in bf16. The pinned backends convert, as FE asks.

def _fp32_states_only(engine, fn, call):
    """The SM90 engines' state gate, in part: cuTile and kda_hopper refuse a non-fp32 initial_state."""
    state = call["initial_state"]
    if engine in ("gdn_cutile", "kda_cutile", "kda_hopper") and state is not None and state.dtype != torch.float32:
        return f"{engine}: 'initial_state' must be fp32 (callers convert), got {state.dtype}"
    return None


SM90_GDN = {"gated_delta_net": ("gdn_cutile",)}  # the only GDN engine on SM90


def test_a_pinned_fp32_state_engine_gets_its_bf16_state_converted():
    double = cudnn_la.make(engine_decline=_fp32_states_only, order=SM90_GDN)
    backend = adapter.CudnnEngineBackend("gdn_cutile", double, device="cpu")
    case = Case(op="gdn", seqlens=(6, 5), state_dtype="bf16", initial_state=True)
    v = backend.check(case, ENV)
    assert v.runnable, v.reason
    assert "initial_state cast bf16 -> fp32: cuDNN gdn_cutile (gdn) takes fp32" in v.notes
    assert double.calls[-1]["initial_state"].dtype == torch.float32
    # default routing converts nothing: with the one SM90 GDN engine refusing, it is a decline
    routed = adapter.CudnnBackend(double, device="cpu")
    v = routed.check(case, ENV)
    assert not v.runnable and "'initial_state' must be fp32 (callers convert)" in v.reason


@pytest.mark.parametrize("engine, op", [("gdn_cutile", "gdn"), ("kda_cutile", "kda")])
def test_a_continuation_carrying_a_bf16_state_is_judged(engine, op):
    """The carried bf16 state reaches the pinned engine as fp32: the continuation checks are judged, not errors."""
    order = {**SM90_GDN, "kimi_delta_attention": ("kda_hopper_cuda", "kda_cutile")}
    backend = adapter.CudnnEngineBackend(engine, cudnn_la.make(engine_decline=_fp32_states_only, order=order),
                                         device="cpu")
    case = Case(op=op, seqlens=(7, 5), state_dtype="bf16", splits=(3,))
    results = CaseRunner(RunOptions(device="cpu", reference="oracle")).run(case, backend, backend.name,
                                                                           backend.check(case, ENV))
    status = {r.check: r.status for r in results}
    assert status["continuation_ref"] == "pass" and status["continuation_self"] == "pass", status


def test_the_pinned_envelopes_admit_the_state_they_convert():
    for engine in ("gdn_cutile", "kda_cutile", "kda_hopper"):
        (envelope,) = facts.engine_envelopes(engine)
        assert "state_dtype" not in envelope.allowed, engine
    routed = {e.name: e for e in facts.envelopes("gdn", 90, frozenset({"cutile"}))}
    assert routed["cudnn gdn_cutile"].allowed["state_dtype"] == ("fp32",)  # cuDNN's own routing does not convert
    (hopper_cuda,) = facts.engine_envelopes("kda_hopper_cuda")
    assert "state_dtype" not in hopper_cuda.allowed  # it takes bf16 states itself


# ------------------------------------------------------------------------------------------------
# A pin FE refuses at the call is a decline, never an error, and never another engine's result (issue 26, S5)
#
# Session 5's H200 serving run recorded `cudnn@kda_hopper` causality as an error on 6 cases (kda_hopper_cuda: 1) with
# "cudnnGraphNotSupportedError: no kda_hopper plan for this graph (offered: ['kda_hopper_cuda', 'kda_cutile'])",
# and then graph replay on the same cases as passed: FE 1.32 caches a graph before it pins the plan, so the refused
# pin leaves an unpinned graph behind and the next call of that configuration ran on kda_hopper_cuda. The probe was
# fooled the same way (a bf16-state case converts to fp32 for kda_hopper: the probe's FE key was an earlier refusal's).

def _long_only(engine, fn, call):
    """kda_hopper refuses any call over more than one token: a refusal the one-token probe cannot see."""
    return "KdaHopperEngine: (test) one token only" if engine == "kda_hopper" and call["q"].shape[0] > 1 else None


def _replaying(backend):
    backend.capture_graph = lambda case, static: (lambda: backend.run(case, static))  # a CPU stand-in for a graph
    return backend


S5_BASE = dict(op="kda", layout="thd", K=128, V=128, H=2, HK=2, HV=2, l2norm=True, initial_state=True)


@pytest.mark.parametrize("plan_cache", [False, True])
def test_a_pin_refused_at_the_call_is_a_decline_naming_the_engines_that_serve(plan_cache):
    from deltacheck.harness.judge.invariance_checks import causality, graph_replay

    double = cudnn_la.make(engine_decline=_long_only, plan_cache=plan_cache)
    backend = _replaying(adapter.CudnnEngineBackend("kda_hopper", double, device="cpu"))
    case = Case(op="kda", layout="thd", seqlens=(6, 4), K=128, V=128)
    assert backend.check(case, ENV).runnable  # the probe's one token is served
    for check in (causality, graph_replay, causality):  # the second causality meets FE's cached graph (plan_cache)
        r = check(backend, case, ENV, device="cpu")
        assert r.status == "declined", (r.status, r.reason)
        assert r.reason.startswith("cuDNN declined (plan_name='kda_hopper'): no kda_hopper plan for this graph"), r.reason
        assert "served by cudnn@kda_frost" in r.reason and "(or routed `cudnn`), not by kda_hopper" in r.reason
        assert "served by cudnn@kda_frost, cudnn@kda_cutile, cudnn@kda_hopper_cuda" in r.reason or (
            plan_cache and "FE served it with kda_frost instead" in r.reason), r.reason
    # deltacheck run: every check a decline (skip) with that reason, none an error
    results = CaseRunner(RunOptions(device="cpu", reference="oracle")).run(case, backend, backend.name,
                                                                           backend.check(case, ENV))
    assert results and {r.status for r in results} == {"skip"}, {(r.check, r.status, r.reason) for r in results}
    assert all("no kda_hopper plan" in r.reason for r in results)


def test_fes_cached_unpinned_graph_is_a_decline_not_another_engines_result():
    """The S5 sequence, on FE 1.32's plan cache: a declined case, then one whose probe shares its FE key."""
    from deltacheck.harness.judge.invariance_checks import causality, graph_replay

    double = cudnn_la.make(engine_decline=_hopper_scope, plan_cache=True)
    backend = _replaying(adapter.CudnnEngineBackend("kda_hopper", double, device="cpu"))
    first = Case(**S5_BASE, seqlens=(4, 6), gate="steep")
    assert not backend.check(first, ENV).runnable  # refused by FE; its unpinned graph stays cached
    later = Case(**S5_BASE, seqlens=(5, 4), gate="zero", state_dtype="bf16")  # converted to fp32: same key
    assert backend._probe_key(later) != backend._probe_key(first)
    v = backend.check(later, ENV)
    assert not v.runnable, "the probe ran on FE's cached unpinned graph and took another engine's answer"
    assert "FE served it with kda_frost instead" in v.reason and "not by kda_hopper" in v.reason, v.reason
    assert "outside kda_hopper's gate (docs/libraries.md): l2norm=on (serves off)" in v.reason, v.reason
    for check in (causality, graph_replay):
        r = check(backend, later, ENV, device="cpu")
        assert r.status == "declined" and r.reason == v.reason, (r.status, r.reason)
    # the run itself, had a probe let it through: FE's refusal first, then its cached graph on another engine
    fresh = adapter.CudnnEngineBackend("kda_hopper", double, device="cpu")
    case = Case(**S5_BASE, seqlens=(7, 3))
    for _ in range(2):
        with pytest.raises(adapter.RunDeclined, match="no kda_hopper plan for this graph"):
            fresh.run(case, make_inputs(case))
    assert double.calls[-1]["plan_name"] == "kda_hopper" and fresh.served() == {"engine": "kda_frost"}


def test_another_engines_failure_on_fes_cached_graph_is_the_pins_decline():
    """The cached unpinned graph's engine fails to run (on the H200 without the cuTile toolchain, kda_cutile cannot
    compile): still the pin's decline, naming the engine FE took, not that engine's error."""
    double = cudnn_la.make(engine_decline=_hopper_scope, plan_cache=True)

    def execute_graph(graph, *args):
        if graph.selected_engine.name != "kda_hopper":
            raise FileNotFoundError("tileiras not found (test)")

    double.ops.kda.execute_graph = execute_graph
    backend = adapter.CudnnEngineBackend("kda_hopper", double, device="cpu")
    assert not backend.check(Case(**S5_BASE, seqlens=(4, 6), gate="steep"), ENV).runnable
    v = backend.check(Case(**S5_BASE, seqlens=(5, 4), gate="zero", state_dtype="bf16"), ENV)
    assert not v.runnable and "FE served it with kda_frost instead" in v.reason, v.reason
    assert "tileiras" not in v.reason
