"""A contract double of flash-qla 0.1.3's public entry point, computed with our reference.

What it pins (flash_qla/ops/gated_delta_rule/chunk/__init__.py; docs/libraries.md "FlashQLA"):

- the exact signature of ``chunk_gated_delta_rule`` (:314-331), keyword names included;
- its asserts: q, k, v one dtype, bf16 or fp16 (:416-419); no head_first (:420); HV a multiple of H (:421);
  with ``cu_seqlens`` B must be 1 and the initial states one per sequence (:429-439);
- the kernels' K == V == 128 (hopper/fused_fwd.py:662) and q and k sharing their heads;
- layout ``[B, T, H, D]``, state key-major ``[N, HV, K, V]`` unless ``state_v_first``; the final state (fp32 in the kernel) is
  None unless asked for; a log-space g, beta post-activation (there is no flag for either);
- its autograd: gradients flow to q, k, v, g, beta and the initial state;
- ``auto_cp=True`` on a B = 1 input decides intra-card CP from the sequences' chunk counts and refuses a packed
  batch holding an empty sequence: ``ValueError("invalid sequence lengths: [...]")``
  (chunk/__init__.py:39-57 -> cp/autocp/decision.py:75-76; seen on the H200, docs/libraries.md "FlashQLA").

Results in fp64 (see the package docstring). ``calls`` records each call's keyword arguments.
"""

from __future__ import annotations

import types

import torch

from deltacheck import reference

VERSION = "0.1.3"


def make(version: str = VERSION):
    mod = types.SimpleNamespace(__version__=version, calls=[])

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False,
                               state_v_first=False, auto_cp=True, enable_fwd_cp_cache=True, cp_context=None,
                               force_intra_cp=False):
        mod.calls.append({"scale": scale, "initial_state": initial_state, "output_final_state": output_final_state,
                          "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "cu_seqlens": cu_seqlens,
                          "state_v_first": state_v_first, "auto_cp": auto_cp, "shape": tuple(q.shape)})
        assert q.dtype == k.dtype == v.dtype
        assert q.dtype in (torch.bfloat16, torch.float16), "FlashQLA only supports bfloat16 and float16."
        assert not head_first, "head_first=True is not supported."
        assert v.shape[2] % k.shape[2] == 0, "num_qk_heads must be divisible to num_v_heads."
        B, T, H, K = k.shape
        HV, V = v.shape[2], v.shape[3]
        if q.shape != k.shape:
            raise RuntimeError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share [B, T, H, K]")
        assert K == V == 128
        if tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV):
            raise RuntimeError(f"g and beta must be [B, T, HV] = {[B, T, HV]}: {list(g.shape)}, {list(beta.shape)}")
        N = B
        if cu_seqlens is not None:
            if B != 1:
                raise ValueError(f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`.")
            N = len(cu_seqlens) - 1
            if initial_state is not None and initial_state.shape[0] != N:
                raise ValueError("The number of initial states is expected to be equal to the number of input "
                                 f"sequences, i.e., {N} rather than {initial_state.shape[0]}.")
        if auto_cp and B == 1 and cu_seqlens is not None:  # dense B = 1 gets one synthesized sequence of T tokens
            chunks = [-(-int(n) // 64) for n in torch.diff(cu_seqlens.cpu()).tolist()]
            if not chunks or min(chunks) <= 0:
                raise ValueError(f"invalid sequence lengths: {chunks}")
        state = initial_state
        if state is not None:
            want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
            if tuple(state.shape) != want:
                raise RuntimeError(f"initial_state must be {list(want)}, got {list(state.shape)}")
            if state_v_first:
                state = state.transpose(-1, -2)
        layout = "thd" if cu_seqlens is not None else "bshd"

        def flat(x):
            return x.squeeze(0) if layout == "thd" else x

        o, final_state = reference.gdn(
            flat(q), flat(k), flat(v), flat(g), flat(beta), cu_seqlens, scale=scale, initial_state=state,
            output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, layout=layout,
            state_layout="kv", method="oracle", compute_dtype=torch.float64)
        if layout == "thd":
            o = o.unsqueeze(0)
        if state_v_first:
            final_state = final_state.transpose(-1, -2)
        return o, (final_state if output_final_state else None)  # fp64, as every double (package docstring)

    mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    return mod
