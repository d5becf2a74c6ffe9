"""Compile once: FLA's autotune winners recorded in one process and applied in the next (issue 17). Triton and
FLA are stood in for by fake modules: what is tested is the walk over FLA's autotuners and the round trip."""

from __future__ import annotations

import json
import sys
import types

import pytest

from deltacheck.harness.backends.fla import winners


class FakeConfig:
    def __init__(self, kwargs, num_warps=4, num_stages=2, num_ctas=1, maxnreg=None):
        self.kwargs, self.num_warps, self.num_stages, self.num_ctas, self.maxnreg = \
            kwargs, num_warps, num_stages, num_ctas, maxnreg


class FakeAutotuner:
    def __init__(self):
        self.cache = {}


class FakeHeuristics:  # @triton.heuristics wraps the autotuner: the walk must look inside .fn
    def __init__(self, fn):
        self.fn = fn


@pytest.fixture
def fake_triton_and_fla(monkeypatch):
    triton = types.ModuleType("triton")
    triton.Config = FakeConfig
    runtime = types.ModuleType("triton.runtime")
    autotuner = types.ModuleType("triton.runtime.autotuner")
    autotuner.Autotuner = FakeAutotuner
    for name, module in (("triton", triton), ("triton.runtime", runtime), ("triton.runtime.autotuner", autotuner)):
        monkeypatch.setitem(sys.modules, name, module)

    def fresh():
        ops = types.ModuleType("fla.ops.fake_kernels")
        ops.chunk_fwd_kernel = FakeAutotuner()
        ops.wrapped_kernel = FakeHeuristics(FakeAutotuner())
        ops.not_a_kernel = 3
        monkeypatch.setitem(sys.modules, "fla.ops.fake_kernels", ops)
        return ops

    return fresh


def test_winners_round_trip_through_a_file(fake_triton_and_fla, tmp_path, monkeypatch):
    tuned = fake_triton_and_fla()
    tuned.chunk_fwd_kernel.cache[(64, 128, True, "torch.bfloat16")] = FakeConfig({"BT": 64, "BK": 32}, num_warps=8)
    tuned.wrapped_kernel.fn.cache[(1, "torch.float16")] = FakeConfig({"BV": 16}, num_stages=3)
    monkeypatch.setenv(winners.RECORD_ENV, str(tmp_path))
    winners.record_to_dir()
    recorded = winners.merge_files(tmp_path.glob("winners.*.json"))
    assert set(recorded) == {"fla.ops.fake_kernels.chunk_fwd_kernel", "fla.ops.fake_kernels.wrapped_kernel"}

    cold = fake_triton_and_fla()  # a new process's kernels: nothing tuned yet
    assert winners.apply(recorded) == 2
    config = cold.chunk_fwd_kernel.cache[(64, 128, True, "torch.bfloat16")]
    assert config.kwargs == {"BT": 64, "BK": 32} and config.num_warps == 8
    assert cold.wrapped_kernel.fn.cache[(1, "torch.float16")].num_stages == 3
    assert winners.apply(recorded) == 0  # what a process already holds is left alone


def test_where_winners_are_looked_up(monkeypatch, tmp_path):
    monkeypatch.setenv("DELTACHECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(winners.FILES_ENV, "/a.json")
    files = winners.default_files("NVIDIA H200", "3.6.0", "0.6.0")
    name = "NVIDIA_H200-triton3.6.0-fla0.6.0.json"
    assert [str(f) for f in files] == ["/a.json", str(tmp_path / "fla-winners" / name), str(winners.SHIPPED / name)]
    json.dumps(winners.record())  # without FLA loaded there is nothing to record, and no error


def test_every_shipped_winners_file_is_named_for_its_versions_and_well_formed():
    shipped = sorted(winners.SHIPPED.glob("*.json"))
    assert shipped, "the H200 x Triton 3.6.0 x FLA 0.6.0 winners are shipped"
    for path in shipped:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert path.name == winners.winners_name(data["gpu"], data["triton"], data["fla"])
        assert data["kernels"] and all(name.startswith("fla.") for name in data["kernels"])
        for entries in data["kernels"].values():
            keys = [json.dumps(e["key"]) for e in entries]
            assert len(keys) == len(set(keys)), f"{path.name}: one winner per key"
            for entry in entries:
                assert isinstance(entry["key"], list) and isinstance(entry["config"]["kwargs"], dict)
                assert isinstance(entry["config"].get("num_warps", 4), int)
        # what a run reads back is exactly what the file holds
        assert winners.merge_files([path]) == data["kernels"]
