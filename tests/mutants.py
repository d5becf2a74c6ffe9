"""A catalogue of mutant backends: the reference with one realistic kernel bug injected each.

The harness earns trust by catching every one of them (tests/test_mutants.py). Bugs inside the
recurrence are injected by running the reference front end with a mutated token loop; bugs at the
boundary (layouts, state handling, gradients) wrap the clean oracle backend.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deltacheck.harness.backends.base import Verdict, get_backend
from deltacheck.reference import layouts
from deltacheck.reference import ops as reference_ops

ORACLE = get_backend("oracle")


def mutated_core(*, decay_after_erase=False, erase_reads_undecayed=False, chunk_gate_dropped=False,
                 state_one_token_early=False, erase_without_beta=False):
    """The token oracle with one ordering/indexing bug switched on."""

    def core(q, k, v, g, b, w, h0, scale):
        state, outs, prev = h0, [], h0
        for t in range(q.shape[1]):
            prev = state
            k_t, g_t = k[:, t], g[:, t]
            if chunk_gate_dropped and t > 0 and t % 64 == 0:
                g_t = torch.zeros_like(g_t)  # the first token of each 64-token chunk loses its decay
            decay = torch.exp(g_t).unsqueeze(-1)
            erase_key = k_t if erase_without_beta else b[:, t] * k_t
            if erase_reads_undecayed:
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
                state = state * decay
            elif decay_after_erase:
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
            else:
                state = state * decay
                erased = torch.einsum("nhkv,nhk->nhv", state, erase_key)
            state = state + k_t.unsqueeze(-1) * (w[:, t] * v[:, t] - erased).unsqueeze(-2)
            if decay_after_erase:
                state = state * decay
            outs.append(torch.einsum("nhkv,nhk->nhv", state, q[:, t]) * scale)
        out = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape)
        return out, (prev if state_one_token_early else state)

    return core


@contextlib.contextmanager
def patched_core(core):
    original = reference_ops.token_oracle
    reference_ops.token_oracle = core
    try:
        yield
    finally:
        reference_ops.token_oracle = original


def _scale(case) -> float:
    return case.scale if case.scale is not None else 1.0 / math.sqrt(case.K)


class _FlipGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _per_sequence_carry(case, inputs):
    """Packed sequences run one after another, each starting from the previous one's final state."""
    if case.layout != "thd":
        dense = {n: (layouts.to_thd(x, case.layout) if n in ("q", "k", "v", "g", "beta", "w") and x is not None else x)
                 for n, x in inputs.items()}
        dense["cu_seqlens"] = layouts.dense_cu_seqlens(case.N, case.seqlens[0])
        thd_case = case.replace(layout="thd")
        out, state = _per_sequence_carry(thd_case, dense)
        return layouts.from_thd(out, case.layout, case.N), state
    cu = inputs["cu_seqlens"].tolist()
    outs, states = [], []
    carried = inputs.get("initial_state")
    carried = carried[:1] if carried is not None else None
    for n in range(case.N):
        a, b = cu[n], cu[n + 1]
        if a == b:  # an empty sequence: its final state is whatever it started from
            states.append(layouts.state_convert(carried, "vk", "kv").to(torch.float64) if carried is not None
                          else torch.zeros(1, case.HO, case.K, case.V, dtype=torch.float64))
            continue
        part = {name: (x[a:b] if name in ("q", "k", "v", "g", "beta", "w") and x is not None else x)
                for name, x in inputs.items()}
        part["cu_seqlens"] = torch.tensor([0, b - a], dtype=inputs["cu_seqlens"].dtype)
        part["initial_state"] = carried
        o, s = ORACLE.run(case.replace(seqlens=(b - a,), splits=()), part)
        outs.append(o)
        states.append(s)
        carried = layouts.state_convert(s, "kv", "vk")  # the bug: the next sequence starts from this one
    return torch.cat(outs), torch.cat(states)


HEAD_AXIS = {"thd": 1, "bshd": 2, "sbhd": 2, "bhsd": 1}


def _tile_heads(case, inputs):
    """GQA/GVA heads tiled (h % H) instead of grouped (h // (HO // H))."""
    axis = HEAD_AXIS[case.layout]
    out = dict(inputs)
    for name in ("q", "k", "v"):
        x = inputs[name]
        reps = case.HO // x.shape[axis]
        out[name] = x.repeat(*[reps if d == axis else 1 for d in range(x.dim())])
    return ORACLE.run(case.replace(H=case.HO, HK=case.HO, HV=case.HO), out)


def _unwritten_tail(case, inputs):
    out, state = ORACLE.run(case, inputs)
    packed = layouts.to_thd(out, case.layout).clone()
    tail = max(1, packed.shape[0] // 8)
    packed[-tail:] = math.nan  # the adapter prefilled NaN; the kernel never wrote the last tokens
    return layouts.from_thd(packed, case.layout, case.N), state


def _nan_at_one_token(case, inputs):
    out, state = ORACLE.run(case, inputs)
    packed = layouts.to_thd(out, case.layout).clone()
    packed[packed.shape[0] // 2, 0, 0] = math.nan
    return layouts.from_thd(packed, case.layout, case.N), state


def _nondeterministic(case, inputs):
    out, state = ORACLE.run(case, inputs)
    # An unordered atomic reduction: the last bits change from run to run.
    noise = 1 + 1e-12 * torch.randn(out.shape, dtype=out.dtype, device=out.device)
    return out * noise, state


def _with_core(**bug):
    def run(case, inputs):
        with patched_core(mutated_core(**bug)):
            return ORACLE.run(case, inputs)

    return run


def _with_grad_factor(name, factor):
    def run(case, inputs):
        return ORACLE.run(case, dict(inputs, **{name: _FlipGrad.apply(inputs[name], factor)}))

    return run


def _w_ignored(case, inputs):
    if case.op != "gdn2":
        return ORACLE.run(case, inputs)
    return ORACLE.run(case, dict(inputs, w=torch.ones_like(inputs["w"])))


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    inject: Callable

    ops = frozenset({"gdn", "kda", "gdn2"})

    def check(self, case, env) -> Verdict:
        return Verdict.ok()

    def run(self, case, inputs):
        return self.inject(case, inputs)


MUTANTS = [
    Mutant("state_transposed", "final state returned value-major where key-major is promised",
           lambda c, i: (lambda o, s: (o, s.transpose(-1, -2)))(*ORACLE.run(c, i))),
    Mutant("decay_after_erase", "decay applied after the erase and write", _with_core(decay_after_erase=True)),
    Mutant("erase_reads_undecayed", "the erase reads the state before this token's decay",
           _with_core(erase_reads_undecayed=True)),
    Mutant("scale_twice", "scale applied twice", lambda c, i: (lambda o, s: (o * _scale(c), s))(*ORACLE.run(c, i))),
    Mutant("scale_missing", "scale not applied", lambda c, i: (lambda o, s: (o / _scale(c), s))(*ORACLE.run(c, i))),
    Mutant("chunk_boundary_off_by_one", "first token of every 64-token chunk loses its decay",
           _with_core(chunk_gate_dropped=True)),
    Mutant("state_leaks_between_sequences", "each packed sequence starts from the previous one's final state",
           _per_sequence_carry),
    Mutant("initial_state_ignored", "initial state dropped", lambda c, i: ORACLE.run(c, dict(i, initial_state=None))),
    Mutant("final_state_one_token_early", "final state taken before the last token's update",
           _with_core(state_one_token_early=True)),
    Mutant("beta_on_v_only", "beta scales the write but not the erase", _with_core(erase_without_beta=True)),
    Mutant("w_ignored", "GDN2's write gate w ignored (treated as 1)", _w_ignored),
    Mutant("nan_at_one_token", "one output element is NaN", _nan_at_one_token),
    Mutant("unwritten_output_tail", "the last eighth of the output tokens never written (NaN prefill)",
           _unwritten_tail),
    Mutant("dg_wrong_sign", "gate gradient with the wrong sign", _with_grad_factor("g", -1.0)),
    Mutant("dbeta_halved", "beta gradient halved", _with_grad_factor("beta", 0.5)),
    Mutant("nondeterministic", "output varies in its last bits between runs", _nondeterministic),
    Mutant("heads_tiled", "GQA/GVA heads mapped h % H (tiled) instead of h // (HO/H) (grouped)", _tile_heads),
]
