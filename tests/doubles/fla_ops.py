"""A contract double of FLA 0.6's ops (``fla.ops`` + ``fla.ops.gdn2``), computed with our reference.

What it pins (from the fla-core 0.6.0 sources, see docs/libraries.md):

- exact signatures of ``chunk_gated_delta_rule``, ``chunk_kda``, ``chunk_gdn2`` and the
  ``fused_recurrent_*`` trio (``A_log``/``dt_bias`` through ``**kwargs`` for the chunk ops);
- layout ``[B, T, heads, dim]``; with ``cu_seqlens`` (int64 — FLA types it LongTensor) B must be 1;
- GVA only: q and k share H heads, v / gates / state at HV = G*H; ``chunk_gdn2`` has no GVA at all;
- state key-major ``[N, HV, K, V]``, fp32 asserted; ``final_state`` is None unless requested;
- in-kernel gate: GDN ``-exp(A_log) * softplus(g + dt_bias)`` (A_log required); KDA/GDN2 with
  ``lower_bound``: ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, dt_bias flat ``[HV*K]``;
  ``safe_gate`` with the in-kernel gate needs lower_bound in [-5, 0);
- the Hopper guard flags (``IS_NVIDIA_HOPPER``, ``TRITON_ABOVE_3_4_0``, ``TRITON_ABOVE_3_7_1``) as
  attributes a test can set; when they say "refuse", the GDN backward raises FLA's RuntimeError;
- ``fused_recurrent_*`` are forward only: their backward raises NotImplementedError.

Results in fp64 (see the package docstring).
"""

from __future__ import annotations

import types

import torch

from deltacheck import reference

VERSION = "0.6.0"
_HOPPER_MESSAGE = ("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for "
                   "gated chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1 or "
                   "install tilelang: `pip install tilelang`")


class _ForwardOnly(torch.autograd.Function):
    """Identity whose backward raises, as FLA's fused_recurrent_* functions do."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Backward pass is not implemented yet and we do not have plans to implement it "
                                  "because we haven't figured out how to compute dg without materializing the full "
                                  "hidden states for all time steps.")


def make(*, hopper_guard_fires: bool = False, version: str = VERSION):
    mod = types.SimpleNamespace(__version__=version, calls=[])
    # FLA's own guard inputs (fla/utils): refuse when Hopper and 3.4.0 <= triton < 3.7.1.
    mod.IS_NVIDIA_HOPPER = hopper_guard_fires
    mod.TRITON_ABOVE_3_4_0 = hopper_guard_fires
    mod.TRITON_ABOVE_3_7_1 = not hopper_guard_fires

    def run(fn, op, q, k, v, g, beta, w, call, *, recurrent):
        mod.calls.append({"fn": fn, **call})
        if q.dim() != 4:
            raise ValueError(f"{fn}: expected [B, T, H, D] tensors, got q {list(q.shape)}")
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        if k.shape != q.shape:
            raise ValueError(f"q and k must have the same shape, got q={tuple(q.shape)} vs k={tuple(k.shape)}")
        if HV % H:
            raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H})")
        if fn == "chunk_gdn2" and HV != H:
            raise AssertionError("v must have shape [B, T, H, V] matching q on (B, T, H)")
        gate_feat = () if op == "gdn" else (K,)
        if tuple(g.shape) != (B, T, HV, *gate_feat):
            raise AssertionError(f"g must have shape {[B, T, HV, *gate_feat]}, got {list(g.shape)}")
        beta_feat = (K,) if op == "gdn2" else ()
        if tuple(beta.shape) != (B, T, HV, *beta_feat):
            raise AssertionError(f"beta must have shape {[B, T, HV, *beta_feat]}, got {list(beta.shape)}")
        if op == "gdn2" and tuple(w.shape) != (B, T, HV, V):
            raise AssertionError(f"w must have shape {[B, T, HV, V]}, got {list(w.shape)}")
        if call.get("state_v_first"):
            raise NotImplementedError("the double models state_v_first=False only")
        cu_seqlens = call["cu_seqlens"]
        if cu_seqlens is not None:
            if B != 1:
                raise ValueError(f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`.")
            if cu_seqlens.dtype != torch.int64:
                raise TypeError(f"{fn}: cu_seqlens is a LongTensor (int64) in FLA, got {cu_seqlens.dtype}")
            N = cu_seqlens.numel() - 1
        else:
            N = B
        state = call["initial_state"]
        if state is not None:
            if state.shape[0] != N:
                raise ValueError(f"The number of initial states is expected to be equal to the number of input "
                                 f"sequences, i.e., {N} rather than {state.shape[0]}.")
            if state.dtype != torch.float32:
                raise AssertionError("initial_state must be in float32.")
            if tuple(state.shape) != (N, HV, K, V):
                raise AssertionError(f"initial_state must be [N, HV, K, V]={[N, HV, K, V]}, got {list(state.shape)}")
        if call.get("allow_neg_eigval") and not call.get("use_beta_sigmoid_in_kernel"):
            raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")

        # The in-kernel gate, as the reference's safe gate.
        safe = {}
        if call.get("use_gate_in_kernel"):
            A_log, dt_bias, lower_bound = call.get("A_log"), call.get("dt_bias"), call.get("lower_bound")
            if op == "gdn":
                if A_log is None:
                    raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
                if A_log.shape != (HV,) or (dt_bias is not None and dt_bias.shape != (HV,)):
                    raise AssertionError("A_log and dt_bias must be [HV]")
            else:
                if lower_bound is None:
                    raise NotImplementedError("the double models KDA/GDN2's lower-bound gate only")
                if call.get("safe_gate") and not (-5 <= lower_bound < 0):
                    raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
                if dt_bias is not None:
                    if dt_bias.shape != (HV * K,):
                        raise AssertionError(f"dt_bias must be flat [HV*K]=[{HV * K}], got {list(dt_bias.shape)}")
                    dt_bias = dt_bias.view(HV, K)
                safe["gate_lower_bound"] = lower_bound
            safe.update(safe_gate=True, a_log=A_log, dt_bias=dt_bias)

        layout = "thd" if cu_seqlens is not None else "bshd"

        def flat(x):
            return x.squeeze(0) if layout == "thd" else x

        args = [flat(q), flat(k), flat(v), flat(g), flat(beta)] + ([flat(w)] if op == "gdn2" else [])
        args.append(cu_seqlens)
        o, final_state = getattr(reference, op)(
            *args, scale=call["scale"], initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=call["use_qk_l2norm_in_kernel"],
            use_beta_sigmoid_in_kernel=call.get("use_beta_sigmoid_in_kernel", False),
            allow_neg_eigval=call.get("allow_neg_eigval", False), layout=layout, state_layout="kv",
            method="oracle", compute_dtype=torch.float64, **safe,
        )
        if layout == "thd":
            o = o.unsqueeze(0)
        if recurrent:
            o = _ForwardOnly.apply(o)
            final_state = _ForwardOnly.apply(final_state)
        elif op == "gdn" and mod.IS_NVIDIA_HOPPER and mod.TRITON_ABOVE_3_4_0 and not mod.TRITON_ABOVE_3_7_1:
            def refuse(grad):
                raise RuntimeError(_HOPPER_MESSAGE)

            if o.requires_grad:
                o.register_hook(refuse)
        return o, (final_state if call["output_final_state"] else None)

    def chunk_gated_delta_rule(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
        state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs,
    ):
        call = {**locals(), **kwargs}
        return run("chunk_gated_delta_rule", "gdn", q, k, v, g, beta, None, call, recurrent=False)

    def chunk_kda(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
        lower_bound=None, disable_recompute=False, return_intermediate_states=False, state_v_first=False,
        cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs,
    ):
        call = {**locals(), **kwargs}
        return run("chunk_kda", "kda", q, k, v, g, beta, None, call, recurrent=False)

    def chunk_gdn2(
        q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        use_gate_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, safe_gate=False, lower_bound=None,
        disable_recompute=False, return_intermediate_states=False, state_v_first=False, cp_context=None, **kwargs,
    ):
        call = {**locals(), **kwargs}
        return run("chunk_gdn2", "gdn2", q, k, v, g, b, w, call, recurrent=False)

    def fused_recurrent_gated_delta_rule(
        q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, **kwargs,
    ):
        if gk is not None or gv is not None or g is None or beta is None:
            raise NotImplementedError("the double models the scalar-gate GDN call only (g=, beta=)")
        call = {**locals(), **kwargs}
        return run("fused_recurrent_gated_delta_rule", "gdn", q, k, v, g, beta, None, call, recurrent=True)

    def fused_recurrent_kda(
        q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
        allow_neg_eigval=False, lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs,
    ):
        call = {**locals(), **kwargs}
        return run("fused_recurrent_kda", "kda", q, k, v, g, beta, None, call, recurrent=True)

    def fused_recurrent_gdn2(
        q, k, v, g, b, w, A_log=None, dt_bias=None, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, lower_bound=None, state_v_first=False,
        cu_seqlens=None, **kwargs,
    ):
        call = {**locals(), **kwargs}
        return run("fused_recurrent_gdn2", "gdn2", q, k, v, g, b, w, call, recurrent=True)

    for fn in (chunk_gated_delta_rule, chunk_kda, chunk_gdn2, fused_recurrent_gated_delta_rule,
               fused_recurrent_kda, fused_recurrent_gdn2):
        setattr(mod, fn.__name__, fn)
    return mod
