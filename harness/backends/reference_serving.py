"""The serving hook of the reference backends (``oracle``, ``chunked``, ``baseline``): every serving mode, through
``reference.serving`` with the backend's own method and precision, so every serving check has a clean backend
to pass. The null-slot convention is vLLM's (``NULL_BLOCK_ID = 0``): null cases run here; a CPU double of another
library sets its own (``tests/fake_backends.py``)."""

from __future__ import annotations

import torch

from ...reference import serving as sv
from .base import Verdict
from .serving import SERVING_MODES, ServingOutput


def _tensors(case, inputs: dict, method: str, compute) -> tuple[tuple, dict, torch.Tensor]:
    from .reference import reference_arguments  # the reference backends' module imports this one

    args, kwargs = reference_arguments(case, inputs, compute_dtype=compute, method=method)
    for key in ("initial_state", "output_final_state", "layout"):
        kwargs.pop(key, None)
    return tuple(args[:-1]), kwargs, inputs["cu_seqlens"]


def _write_back(pool: torch.Tensor, served: sv.Served) -> torch.Tensor:
    """The given pool with the written rows replaced, in place and in the pool's own dtype (a kernel's semantics;
    the reference's own pool is in its compute dtype)."""
    for row in served.written:
        pool[row] = served.pool[row].to(pool.dtype)
    return pool


class ReferenceServing:
    """Mixed into ``ReferenceBackend``: needs ``method``, ``same_precision``, ``_compute(case)``, ``run``."""

    null_slot = sv.VLLM

    def serving_verdict(self, case, mode: str, env) -> Verdict:
        if mode not in SERVING_MODES:
            return Verdict.no(f"{self.name}: unknown serving mode {mode!r}; modes: {SERVING_MODES}")
        return Verdict.ok()

    def serve(self, case, inputs: dict, call) -> ServingOutput:
        method, _ = self._method()
        compute = self._compute(case)
        tensors, kw, cu = _tensors(case, inputs, method, compute)
        if call.mode == "pool":
            served = sv.pooled(case.op, call.pool, call.state_indices, *tensors, cu_seqlens=cu,
                               null_slot=self.null_slot, **kw)
            return ServingOutput(served.out, _write_back(call.pool, served))
        if call.mode == "spec":
            served = sv.spec_verify(case.op, call.pool, call.state_indices, *tensors, cu_seqlens=cu,
                                    num_accepted_tokens=call.num_accepted_tokens, null_slot=self.null_slot, **kw)
            return ServingOutput(served.out, _write_back(call.pool, served))
        if call.mode == "checkpoints":
            series = sv.checkpoints(case.op, *tensors, every_n=call.checkpoint_every, cu_seqlens=cu,
                                    initial_state=inputs.get("initial_state"), **kw)
            out, final = self.run(case, inputs)
            return ServingOutput(out, checkpoints=series, final_state=final)
        return self._one_by_one(case, inputs)

    def _one_by_one(self, case, inputs: dict) -> ServingOutput:
        """``batch_invariant=True`` kept by construction: each sequence computed alone (the plain ``run`` batches
        its sequences and differs in the last bits, measured on the CPU: ~4e-16 in fp64)."""
        offsets = inputs["cu_seqlens"].tolist()
        sub_rows = case.num_householder if case.op == "gdp" else 1
        outs, finals = [], []
        for n, length in enumerate(case.seqlens):
            a, b = offsets[n], offsets[n + 1]
            if length == 0:  # nothing to run: the final state is the initial one (zeros without h0)
                h0 = inputs.get("initial_state")
                h0 = h0[n:n + 1] if h0 is not None else torch.zeros(1, case.HO, case.V, case.K)
                outs.append(torch.zeros(0, case.HO, case.V, dtype=self._compute(case)))
                finals.append(h0.to(self._compute(case)).transpose(-1, -2))
                continue
            one = dict(inputs)
            for name in ("q", "k", "v", "g", "beta", "w"):
                x = inputs.get(name)
                if x is not None:
                    r = sub_rows if name in ("k", "v", "beta") else 1
                    one[name] = x[a * r:b * r]
            one["cu_seqlens"] = torch.tensor([0, length], dtype=torch.int32, device=inputs["q"].device)
            if inputs.get("initial_state") is not None:
                one["initial_state"] = inputs["initial_state"][n:n + 1]
            out, final = self.run(case.replace(seqlens=(length,), splits=()), one)
            outs.append(out)
            finals.append(final)
        return ServingOutput(torch.cat(outs), final_state=torch.cat(finals))

    def capture_graph(self, case, static_inputs: dict):
        """A CPU stand-in for a captured graph: the replay computes from whatever the static buffers hold."""
        return lambda: self.run(case, static_inputs)

    def causal_rule(self, case) -> str:
        return "bitwise" if self.method == "oracle" else "chunked"
