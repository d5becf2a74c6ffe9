"""The shapes the built-in adapters share: one ``pair_verdict(op, env)`` hook over one facts function
``floors(backend, op, env)``; the fused adapters' base (harness/backends/fused.py), so each states only what
differs, the checks come in one order and the envelopes follow one rule; the FLA-convention layouts
(harness/backends/layouts.py), exact inverses."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch

from deltacheck.cases import Case
from deltacheck.harness.backends import layouts
from deltacheck.harness.backends.base import Verdict, backend_for
from deltacheck.harness.backends.flashinfer.adapter import FlashInferBackend
from deltacheck.harness.backends.flashkda import FlashKdaBackend
from deltacheck.harness.backends.flashqla.adapter import FlashQlaBackend
from deltacheck.harness.backends.fused import FusedAdapter
from deltacheck.harness.backends.jaxla.adapter import JaxBackend
from deltacheck.harness.backends.table import BUILTINS
from deltacheck.harness.backends.vllm_fla import VllmFlaBackend
from deltacheck.harness.machine.environment import Env

ADAPTERS = {
    "vllm-fla": lambda: VllmFlaBackend(),
    "vllm-fla-recurrent": lambda: VllmFlaBackend(recurrent=True),
    "flashkda": lambda: FlashKdaBackend("flashkda"),
    "flashkda-tokenspeed": lambda: FlashKdaBackend("flashkda-tokenspeed"),
    "flashqla": lambda: FlashQlaBackend(),
    "flashinfer": lambda: FlashInferBackend(),
    "flashinfer-decode": lambda: FlashInferBackend(decode=True),
    "jax": lambda: JaxBackend(),
}
ROOT = Path(__file__).resolve().parent.parent
SHARED = ("check", "load", "pair_verdict", "envelopes", "_library_verdict")


@pytest.mark.parametrize("cls", sorted({type(make()) for make in ADAPTERS.values()}, key=lambda c: c.__name__))
def test_each_adapter_states_only_what_differs(cls):
    """The shared stanzas are the base's: an adapter that writes its own check/load/floors/envelopes again fails."""
    assert issubclass(cls, FusedAdapter)
    assert [name for name in SHARED if name in vars(cls)] == []
    assert [name for name in ("unsupported", "declared_envelopes", "version")
            if getattr(cls, name) is getattr(FusedAdapter, name)] == []


@pytest.mark.parametrize("name", ADAPTERS)
def test_envelopes_follow_one_rule(name):
    """None without CUDA; on a GPU only those covering its architecture; by ``sm`` the same; with neither, all."""
    backend = ADAPTERS[name]()
    declared = {op: backend.declared_envelopes(op) for op in ("gdn", "kda", "gdn2", "gdp")}
    assert any(declared.values()), name
    for op, envelopes in declared.items():
        assert backend.envelopes(op) == envelopes
        assert backend.envelopes(op, env=Env(cuda=False)) == []
        for sm in (80, 90, 100, 120):
            covering = [e for e in envelopes if e.sms is None or sm in e.sms]
            gpu = Env(cuda=True, device_name="test GPU", capability=(sm // 10, sm % 10))
            assert backend.envelopes(op, sm=sm) == covering, (op, sm)
            assert backend.envelopes(op, env=gpu) == covering, (op, sm)


@pytest.mark.parametrize("name", ADAPTERS)
def test_floors_come_before_the_library(name):
    """On a machine without CUDA the floors decline and the library is never imported."""
    imported = []
    backend = ADAPTERS[name]()
    backend._importer = lambda module: imported.append(module)
    op = sorted(backend.ops)[0]
    verdict = backend.check(Case(op=op, layout="thd", seqlens=(3,), K=128, V=128), Env(cuda=False))
    assert not verdict.runnable and verdict.reason.startswith(f"{name}:{op}")
    assert imported == []


def test_an_op_not_served_is_refused_before_any_import():
    backend = VllmFlaBackend(importer=lambda module: pytest.fail(f"imported {module}"))
    assert backend.load("kda") == Verdict.no("vllm-fla serves ['gdn'], not 'kda'")


def test_an_accepted_case_carries_the_notes_and_the_missing_backward():
    class Toy(FusedAdapter):
        name, ops = "toy", frozenset({"gdn"})

        def load(self, op):
            return Verdict.ok()

        def unsupported(self, case):
            return "no K=64" if case.K == 64 else None

        def conversion_notes(self, case):
            return ["widened"]

        def no_backward(self, case):
            return "forward only"

    case = Case(op="gdn", layout="thd", seqlens=(3,), K=32, V=32)
    assert Toy()._library_verdict(case) == Verdict.ok("widened", backward=False, backward_reason="forward only")
    assert Toy()._library_verdict(case.replace(K=64)) == Verdict.no("no K=64")


@pytest.mark.parametrize("layout, shape", [("thd", (7, 2, 3)), ("bshd", (2, 5, 2, 3)), ("sbhd", (5, 2, 2, 3)),
                                           ("bhsd", (2, 2, 5, 3))])
def test_layouts_round_trip(layout, shape):
    x = torch.randn(*shape)
    btd = layouts.to_btd(x, layout)
    assert btd.dim() == 4 and btd.shape[2:] == (2, 3) and btd.is_contiguous()
    assert torch.equal(layouts.from_btd(btd, layout), x)


def test_states_go_key_major_fp32_and_come_back_widened():
    state = torch.randn(2, 3, 4, 5, dtype=torch.bfloat16)  # value-major [N, HO, V, K]
    key_major = layouts.state_to_key_major_fp32(state)
    assert key_major.dtype == torch.float32 and key_major.shape == (2, 3, 5, 4)
    assert torch.equal(key_major, state.float().transpose(-1, -2))
    assert layouts.state_to_key_major_fp32(None) is None
    assert layouts.state_widened_to_fp32(state).dtype == torch.float32
    wide = torch.randn(2, dtype=torch.float64)
    assert layouts.state_widened_to_fp32(wide) is wide


# ================================================================================ one pair_verdict signature

def _defs(name: str):
    for path in sorted((ROOT / "harness").rglob("*.py")) + [ROOT / "plugin.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", [a.arg for a in node.args.args]


def test_every_pair_verdict_is_the_documented_hook():
    """``pair_verdict`` means one thing: the backend hook ``(op, env)`` (base.BackendHooks, docs/backends.md); the
    facts modules' floors, which need the backend's name, are ``floors(backend, op, env)`` everywhere."""
    hooks = dict(_defs("pair_verdict"))
    assert hooks and {where: args for where, args in hooks.items() if args != ["self", "op", "env"]} == {}
    floors = dict(_defs("floors"))
    assert len(floors) == sum(1 for entry in BUILTINS if entry.floors)
    assert {where: args for where, args in floors.items() if args != ["backend", "op", "env"]} == {}


ENVS = [Env(cuda=False), Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0)),
        Env(cuda=True, device_name="NVIDIA B200", capability=(10, 0))]


@pytest.mark.parametrize("entry", [e for e in BUILTINS if e.floors], ids=lambda e: e.package)
def test_the_tables_floors_are_what_each_hook_returns(entry):
    module, _, attr = entry.floors.partition(":")
    floors = getattr(importlib.import_module(module), attr)
    assert list(inspect.signature(floors).parameters) == ["backend", "op", "env"]
    for name in (n for n in entry.names if not n.endswith("@*")):
        backend = backend_for(name)
        assert list(inspect.signature(backend.pair_verdict).parameters) == ["op", "env"]
        for op in sorted(backend.ops):  # availability asks the floors only for the ops a backend serves
            for env in ENVS:
                assert backend.pair_verdict(op, env) == floors(name, op, env), (name, op, env.device())
