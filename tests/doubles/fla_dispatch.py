"""A contract double of FLA 0.6's backend dispatch (``fla/backends.py``) around the FLA ops double (fla_ops.py).

What it pins (fla-core 0.6.0; docs/libraries.md "FLA's backend dispatch"):

- the registry objects the adapter reads: ``_operation_registries`` / ``_function_registries`` of registries with
  ``operation_name`` and ``_backends`` (backend_type -> backend instance), and ``_DISPATCH_DISABLED``;
- the call walk of ``BackendRegistry.dispatch`` (fla/backends.py:163-203): backends by ascending ``priority``,
  skipping the unavailable or disabled, ``verify(function_name, *args, **kwargs)`` (a ``<fn>_verifier`` method),
  then ``get_implementation(function_name)`` called; none accepted: the decorated (Triton) function;
- ``is_enabled`` reading its environment variable on every call (fla/backends.py:76-82);
- FlashQLA at priority 3 on ``gated_delta_rule.chunk_gated_delta_rule`` with FLA's verifier rules (K = V = 128,
  bf16/fp16, no in-kernel gate, beta sigmoid or negative eigenvalues; fla/ops/gated_delta_rule/backends/
  flash_qla.py:84-110), calling the FlashQLA double with ``auto_cp=True``;
- 'common' pieces: ``chunk_gated_delta_rule_fwd_h`` (the intra-card CP backend, ``FLA_INTRACARD_CP``, off by
  default, accepting only under inference mode with cu_seqlens: intracard.py:42-84) and ``chunk_bwd_dqkwg``
  (the TileLang backend, on by default on Hopper; the Triton default raises FLA's #640 refusal on Hopper with a
  bad Triton): the Triton GDN path calls both, the forward one in the forward, the other in the backward.
"""

from __future__ import annotations

import os
import types

import torch

from . import fla_ops, flash_qla


class Backend:
    backend_type = "base"
    priority = 5
    env_var: str | None = None
    default_enable = True

    def __init__(self, available=True):
        self.available = available

    def is_available(self):
        return self.available

    def is_enabled(self):
        if self.env_var is None:
            return True
        return os.environ.get(self.env_var, "1" if self.default_enable else "0") != "0"

    def verify(self, function_name, *args, **kwargs):
        verifier = getattr(self, f"{function_name}_verifier", None)
        return (True, None) if verifier is None else verifier(*args, **kwargs)

    def get_implementation(self, function_name):
        return getattr(self, function_name, None)


class Registry:
    def __init__(self, operation_name):
        self.operation_name = operation_name
        self._backends = {}

    def register(self, backend):
        self._backends[backend.backend_type] = backend

    def dispatch(self, default):
        name = default.__name__

        def wrapper(*args, **kwargs):
            for backend in sorted(self._backends.values(), key=lambda b: b.priority):
                if not (backend.is_available() and backend.is_enabled()):
                    continue
                accepted, _ = backend.verify(name, *args, **kwargs)
                if not accepted:
                    continue
                implementation = backend.get_implementation(name)
                if implementation is None:
                    continue
                return implementation(*args, **kwargs)
            return default(*args, **kwargs)

        wrapper.__name__ = name
        return wrapper


class FlashQLA(Backend):
    backend_type, priority, env_var = "flash_qla", 3, "FLA_FLASH_QLA"

    def __init__(self, available, library):
        super().__init__(available)
        self.library = library

    def chunk_gated_delta_rule_verifier(self, q, k, v, g, beta, **kwargs):
        if q.dtype not in (torch.float16, torch.bfloat16):
            return False, f"FlashQLA requires dtype float16 or bfloat16, got {q.dtype}"
        if q.shape[-1] != 128 or v.shape[-1] != 128:
            return False, f"FlashQLA requires K=128, got {q.shape[-1]}"
        if kwargs.get("use_gate_in_kernel"):
            return False, "FlashQLA does not support use_gate_in_kernel"
        if kwargs.get("use_beta_sigmoid_in_kernel"):
            return False, "FlashQLA does not support use_beta_sigmoid_in_kernel"
        if kwargs.get("allow_neg_eigval"):
            return False, "FlashQLA does not support allow_neg_eigval"
        return True, None

    def chunk_gated_delta_rule(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                               allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, **kwargs):
        return self.library.chunk_gated_delta_rule(
            q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            state_v_first=state_v_first, cu_seqlens=cu_seqlens, auto_cp=True)


class IntraCardCP(Backend):
    backend_type, env_var, default_enable = "intracard_cp", "FLA_INTRACARD_CP", False

    def chunk_gated_delta_rule_fwd_h_verifier(self, cu_seqlens=None):
        if not torch.is_inference_mode_enabled():
            return False, "Not in inference mode"
        if cu_seqlens is None:
            return False, "cu_seqlens is None"
        return True, None

    def chunk_gated_delta_rule_fwd_h(self, cu_seqlens=None):
        return "split"


class CommonTileLang(Backend):
    backend_type, env_var = "tilelang", "FLA_TILELANG"

    def chunk_bwd_dqkwg(self, grad):
        return grad


def make(*, flash_qla_installed=True, tilelang_usable=True, hopper_guard_fires=False, dispatch_disabled=False):
    """(ops, backends): the op namespace the adapter calls, and the ``fla.backends`` stand-in it reads."""
    plain = fla_ops.make()  # the Triton defaults (no guard of its own: the guard lives in chunk_bwd_dqkwg here)
    library = flash_qla.make()
    backends = types.SimpleNamespace(_DISPATCH_DISABLED=dispatch_disabled, _operation_registries={},
                                     _function_registries={})
    gdr, common = Registry("gated_delta_rule"), Registry("common")
    backends._operation_registries.update({"gated_delta_rule": gdr, "common": common})
    gdr.register(FlashQLA(flash_qla_installed, library))
    common.register(IntraCardCP())
    common.register(CommonTileLang(tilelang_usable))

    def chunk_gated_delta_rule_fwd_h(cu_seqlens=None):
        return "whole"

    def chunk_bwd_dqkwg(grad):
        if hopper_guard_fires:
            raise RuntimeError(fla_ops._HOPPER_MESSAGE)
        return grad

    fwd_h, dqkwg = common.dispatch(chunk_gated_delta_rule_fwd_h), common.dispatch(chunk_bwd_dqkwg)

    def chunk_gated_delta_rule(q, k, v, g, beta, **kwargs):
        fwd_h(cu_seqlens=kwargs.get("cu_seqlens"))
        o, state = plain.chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
        if o.requires_grad:
            o.register_hook(dqkwg)
        return o, state

    ops = types.SimpleNamespace(**vars(plain))
    ops.chunk_gated_delta_rule = gdr.dispatch(chunk_gated_delta_rule)
    ops.IS_NVIDIA_HOPPER = ops.TRITON_ABOVE_3_4_0 = hopper_guard_fires
    ops.TRITON_ABOVE_3_7_1 = not hopper_guard_fires
    ops.flash_qla = library
    # FLA's split rule (fla/ops/common/intracard_cp.py: compute_subseq_len, prepare_subseq_cu_seqlens), reduced to
    # what the adapter reads: the subsequence count, 0 when nothing is split.
    ops.get_multiprocessor_count = lambda: 132
    ops.compute_subseq_len = lambda seq_len, num_sms, num_heads, chunk_size=64: max(
        -(-(-(-seq_len // chunk_size)) // max(4, num_sms // (2 * num_heads))), 128) * chunk_size

    def prepare_subseq_cu_seqlens(cu_seqlens, subseq_len, chunk_size=64, max_splits=32):
        lengths = torch.diff(cu_seqlens).tolist()
        chunks = -(-subseq_len // chunk_size)
        pieces = [min(max_splits, -(-(-(-n // chunk_size)) // chunks)) if n >= 3 * subseq_len else 1
                  for n in lengths]
        split = any(n >= 3 * subseq_len for n in lengths)
        return cu_seqlens.tolist(), split, sum(pieces) if split else 0

    ops.prepare_subseq_cu_seqlens = prepare_subseq_cu_seqlens
    return ops, backends
