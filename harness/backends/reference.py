"""The reference exposed as backends, so the harness can test itself.

Three backends, all CPU-capable and always runnable:

``oracle``    the token-by-token recurrence in fp64: the gold standard everything is compared to.
``chunked``   the chunked (WY/UT) reference in fp64: a second, independent algorithm for the same math.
``baseline``  the chunked reference run *in the case's io dtype* on the kernel's inputs: what a plain
              same-precision PyTorch implementation gets, the yardstick for "kernel error <= c x baseline".

Unlike the fused adapters these return ``final_state`` in their compute dtype (fp64 for oracle/chunked,
the io dtype for the baseline), key-major ``[N, HO, K, V]``; the harness compares in fp64, and rounding
the gold standard to fp32 would throw precision away. Everything stays differentiable with respect to
the input tensors the runner passes in (casts and transposes are autograd ops).
"""

from __future__ import annotations

import importlib

import torch

from ... import reference
from ...reference import layouts
from .base import Verdict, register
from .reference_serving import ReferenceServing

OPS = frozenset({"gdn", "kda", "gdn2", "gdp"})
_IO_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def chunked_import_error() -> str | None:
    """Why ``deltacheck.reference.chunked`` cannot be imported, or None when it can."""
    try:
        importlib.import_module("deltacheck.reference.chunked")
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _op_args(case, inputs: dict) -> list:
    """Positional tensors of the reference op, in cuDNN's order (q, k, v, g, beta[, w], cu_seqlens); GDP's
    ``num_householder`` travels in ``case.reference_kwargs()``."""
    args = [inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"]]
    if case.op == "gdn2":
        args.append(inputs["w"])
    args.append(inputs["cu_seqlens"] if case.layout == "thd" else None)
    return args


def reference_arguments(case, inputs: dict, *, compute_dtype: torch.dtype = torch.float64,
                        method: str = "oracle") -> tuple[list, dict]:
    """``(args, kwargs)`` with which ``getattr(deltacheck.reference, case.op)(*args, **kwargs)`` computes what the
    harness compares a backend's ``run(case, inputs)`` against: every Case field mapped to the reference's
    keyword (docs/backends.md has the table), ``beta_guard`` with its ``guard_dtype`` (the kernel's io dtype)
    and the op's ``gate_lower_bound``. The state comes back value-major ``[N, HO, V, K]`` (``state_layout="vk"``,
    cuDNN's, as ``initial_state`` arrives). A backend author can print these to see the exact call."""
    kwargs = case.reference_kwargs()
    kwargs.update(
        initial_state=inputs.get("initial_state"),
        a_log=inputs.get("a_log"),
        dt_bias=inputs.get("dt_bias"),
        output_final_state=True,
        state_layout="vk",  # make_inputs gives cuDNN's value-major [N, HO, V, K]
        method=method,
        compute_dtype=compute_dtype,
    )
    if case.beta_guard:
        kwargs["guard_dtype"] = _IO_DTYPES[case.io_dtype]  # the guard rounds to the kernel's io dtype
    return _op_args(case, inputs), kwargs


class ReferenceBackend(ReferenceServing):
    """One reference configuration: ``method`` ("oracle" / "chunked") and the compute precision.

    ``same_precision=False`` computes in fp64 from the inputs as given; ``same_precision=True`` computes in the
    case's io dtype from the same inputs (the gate and flag math in fp32, the recurrence in the io dtype), as a
    same-precision PyTorch implementation handed the kernel's inputs would. (Rounding a linear-domain alpha near 1
    to bf16 before its log, as an earlier baseline did, made the yardstick itself miss the threshold.)
    """

    ops = OPS

    def __init__(self, name: str, method: str, same_precision: bool = False):
        self.name = name
        self.method = method
        self.same_precision = same_precision

    def _method(self) -> tuple[str, tuple[str, ...]]:
        """The method actually used, and notes saying so when it is not the one asked for."""
        if self.method != "chunked":
            return self.method, ()
        error = chunked_import_error()
        if error is None:
            return "chunked", ()
        if self.same_precision:
            # The baseline's point is the io-dtype arithmetic, which the oracle can supply too.
            note = f"baseline: chunked reference unavailable ({error}); used method='oracle' in the io dtype instead"
            return "oracle", (note,)
        return "", (error,)

    def check(self, case, env) -> Verdict:
        if case.op not in self.ops:
            return Verdict.no(f"{self.name} serves {sorted(self.ops)}, not {case.op!r}")
        method, notes = self._method()
        if not method:
            return Verdict.no(f"{self.name}: the chunked reference cannot be imported ({notes[0]})")
        if self.same_precision:
            notes = (*notes, f"{self.name}: gate and flag math in fp32, the recurrence in {case.io_dtype}")
        return Verdict.ok(*notes)

    def _compute(self, case) -> torch.dtype:
        return _IO_DTYPES[case.io_dtype] if self.same_precision else torch.float64

    def run(self, case, inputs: dict):
        method, _ = self._method()
        if not method:
            raise RuntimeError(f"{self.name}: the chunked reference cannot be imported")
        # Every reference reads the inputs exactly as the kernel receives them (q/k/v in the io dtype; g, fp32 beta,
        # states, a_log, dt_bias as given): the fp64 references up-cast them (exact), the baseline does its gate and
        # flag math in fp32, as kernels do, and its recurrence in the io dtype.
        compute = self._compute(case)
        args, kwargs = reference_arguments(case, inputs, compute_dtype=compute, method=method)
        out, final_vk = getattr(reference, case.op)(*args, **kwargs)
        return out, layouts.state_convert(final_vk, "vk", "kv")


@register("oracle")
def _oracle() -> ReferenceBackend:
    return ReferenceBackend("oracle", "oracle")


@register("chunked")
def _chunked() -> ReferenceBackend:
    return ReferenceBackend("chunked", "chunked")


@register("baseline")
def _baseline() -> ReferenceBackend:
    return ReferenceBackend("baseline", "chunked", same_precision=True)
