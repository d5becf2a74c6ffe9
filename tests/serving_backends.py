"""Third-party-style serving backends for the serving-check tests: one clean, and one planted bug per check class.

``Clean`` serves every mode with its own gather / run / scatter loop over the fp64 reference op (one sequence at a
time, so batch invariance holds by construction); it shares no code with ``reference.serving``, so a check that
passes it is not just the reference agreeing with itself. Each subclass plants exactly one bug of a class issue 26
names.
"""

from __future__ import annotations

import torch

from deltacheck import reference
from deltacheck.harness.backends.base import Verdict
from deltacheck.harness.backends.reference import reference_arguments
from deltacheck.harness.backends.serving import ServingOutput
from deltacheck.reference import serving as sv

TOKENWISE = ("q", "k", "v", "g", "beta", "w")


def _slice(case, inputs, a, b):
    """Tokens [a, b) of packed inputs as a one-sequence case and its inputs."""
    r = case.num_householder if case.op == "gdp" else 1
    one = dict(inputs)
    for name in TOKENWISE:
        if inputs.get(name) is not None:
            one[name] = inputs[name][a * r:b * r] if name in ("k", "v", "beta") else inputs[name][a:b]
    one["cu_seqlens"] = torch.tensor([0, b - a], dtype=torch.int32)
    return case.replace(seqlens=(b - a,), pool=0, nulls=0, chain=0, draft=0, accepted=(), checkpoint_every=0,
                        splits=(), initial_state=True), one


def _op(case, inputs, h0_vk):
    """(out, final value-major) of one sequence from ``h0_vk [1, HO, V, K]``."""
    inputs = dict(inputs, initial_state=h0_vk)
    args, kwargs = reference_arguments(case, inputs)
    return getattr(reference, case.op)(*args, **kwargs)


class Clean:
    name = "serving-clean"
    ops = frozenset({"gdn", "kda", "gdn2", "gdp"})
    null_slot = sv.VLLM

    def check(self, case, env):
        if case.layout != "thd" or case.backward:
            return Verdict.no("serving-clean takes forward thd calls only")
        return Verdict.ok()

    def serving_verdict(self, case, mode, env):
        return Verdict.ok()

    def run(self, case, inputs):
        out = self.serve(case, inputs, _Plain())
        return out.out, out.final_state

    # --- modes -------------------------------------------------------------------------------------------------
    def read_row(self, pool, row):
        return pool[row:row + 1].to(torch.float64)

    def write_row(self, pool, row, state_vk):
        pool[row] = state_vk[0].to(pool.dtype)

    def start_slot(self, table, n, accepted):
        return int(table[n, int(accepted[n]) - 1]) if accepted is not None else int(table[n, 0])

    def gates(self, case, inputs):
        return inputs["g"]

    def serve(self, case, inputs, call):
        inputs = dict(inputs, g=self.gates(case, inputs))
        offsets = inputs["cu_seqlens"].tolist()
        outs, finals = [], []
        table = call.state_indices
        if table is not None and table.dim() == 1:
            table = table[:, None]
        for n in range(len(offsets) - 1):
            a, b = offsets[n], offsets[n + 1]
            zero = torch.zeros(1, case.HO, case.V, case.K, dtype=torch.float64)
            if table is None:
                h0 = inputs.get("initial_state")
                h = h0[n:n + 1].to(torch.float64) if h0 is not None else zero
            else:
                slot = self.start_slot(table, n, call.num_accepted_tokens)
                null = self.null_slot is not None and self.null_slot.is_null(slot)
                h = zero if null else self.read_row(call.pool, slot)
            if call.mode == "spec":
                o_parts = []
                for t in range(a, b):
                    step_case, step = _slice(case, inputs, t, t + 1)
                    o, h = _op(step_case, step, h)
                    o_parts.append(o)
                    row = int(table[n, t - a])
                    if not null and not self.null_slot.is_null(row):
                        self.write_row(call.pool, row, h)
                outs.append(torch.cat(o_parts) if o_parts else torch.zeros(0, case.HO, case.V, dtype=torch.float64))
                continue
            if b > a:
                o, h_new = _op(*_slice(case, inputs, a, b), h)
            else:
                o, h_new = torch.zeros(0, case.HO, case.V, dtype=torch.float64), h
            outs.append(o)
            finals.append(h_new)
            if table is not None:
                self.store_final(call.pool, slot, null, h_new)
        out = torch.cat(outs)
        if call.mode == "checkpoints":
            series = sv.checkpoints(case.op, *reference_arguments(case, inputs)[0][:-1],
                                    every_n=call.checkpoint_every, cu_seqlens=inputs["cu_seqlens"],
                                    initial_state=inputs.get("initial_state"),
                                    **_kw(case, inputs))
            return ServingOutput(out, checkpoints=self.shift_checkpoints(series))
        final = torch.cat(finals).transpose(-1, -2) if finals else None
        return ServingOutput(out, pool=call.pool, final_state=final)

    def store_final(self, pool, slot, null, h_new):
        if not null:
            self.write_row(pool, slot, h_new)

    def shift_checkpoints(self, series):
        return series

    def capture_graph(self, case, static_inputs):
        return lambda: self.run(case, static_inputs)

    def causal_rule(self, case):
        return "bitwise"


def _kw(case, inputs):
    kwargs = reference_arguments(case, inputs)[1]
    for key in ("initial_state", "output_final_state", "layout"):
        kwargs.pop(key, None)
    return kwargs


class _Plain:
    mode = "plain"
    state_indices = None
    num_accepted_tokens = None
    pool = None


class KeyMajorPool(Clean):
    """Reads and writes the value-major pool rows key-major (S^T): silent in shape when K == V."""

    name = "serving-keymajor"

    def read_row(self, pool, row):
        return pool[row:row + 1].to(torch.float64).transpose(-1, -2)

    def write_row(self, pool, row, state_vk):
        pool[row] = state_vk[0].transpose(-1, -2).to(pool.dtype)


class NullSlotWriter(Clean):
    """Stores a null sequence's final state in slot 0 (vLLM's NULL_BLOCK_ID) instead of skipping the store."""

    name = "serving-nullwrite"

    def store_final(self, pool, slot, null, h_new):
        self.write_row(pool, 0 if null else slot, h_new)


class FirstBlock(Clean):
    """Speculative decoding from the first block of the row, ignoring num_accepted_tokens."""

    name = "serving-firstblock"

    def start_slot(self, table, n, accepted):
        return int(table[n, 0])


class FutureGate(Clean):
    """Token t decays with the gate of token t + 1 (the last token of a sequence keeps its own): a future gate read."""

    name = "serving-futuregate"

    def gates(self, case, inputs):
        g = inputs["g"].clone()
        offsets = inputs["cu_seqlens"].tolist()
        for a, b in zip(offsets[:-1], offsets[1:]):
            if b - a > 1:
                g[a:b - 1] = inputs["g"][a + 1:b]
        return g


class GraphKeepsInputs(Clean):
    """A graph replay that keeps the inputs it was captured with (copies them at capture)."""

    name = "serving-stalegraph"

    def capture_graph(self, case, static_inputs):
        frozen = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in static_inputs.items()}
        return lambda: self.run(case, frozen)


class UnwrittenAfterEmpty(Clean):
    """Leaves the outputs of every sequence after an empty one unwritten (inf here): a chunk kernel that numbers the
    chunks past an empty sequence wrongly (vLLM 0.33's chunk path). Two eager calls then differ by inf - inf, a spread
    that bounds any replay."""

    name = "serving-unwritten"

    def run(self, case, inputs):
        out, state = super().run(case, inputs)
        offsets = inputs["cu_seqlens"].tolist()
        empty = [n for n in range(len(offsets) - 1) if offsets[n] == offsets[n + 1]]
        if empty:
            out = out.clone()
            out[offsets[empty[0] + 1]:] = float("inf")
        return out, state


class NaNOutput(Clean):
    """Every serving call's output is NaN, identically in every batch (a kernel that NaNs deterministically): the same
    NaN bits in every composition."""

    name = "serving-nan"

    def serve(self, case, inputs, call):
        got = super().serve(case, inputs, call)
        got.out = torch.full_like(got.out, float("nan"))
        return got


class CheckpointAfter(Clean):
    """Checkpoint rows one cadence late (the state after p + N tokens): drops p = 0 and may emit the final state."""

    name = "serving-lateckpt"

    def shift_checkpoints(self, series):
        return torch.cat([series[1:], series[-1:]])
