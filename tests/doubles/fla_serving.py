"""A contract double of FLA 0.6's internal serving entry points ``fused_recurrent_kda_fwd`` and
``fused_recurrent_gdn2_fwd``, added to the ``fla_ops`` double. What it pins, read from the fla-core 0.6.0 kernels
(``fla/ops/kda/fused_recurrent.py``, ``fla/ops/gdn2/fused_recurrent.py``):

- ``inplace_final_state=True`` asserts an ``initial_state`` and returns it as the final state (the pool);
- continuous batching: the start row is ``ssm_state_indices[n*stride_seq + i]`` with ``i = num_accepted_tokens[n]
  - 1`` (0 without it); after token t the state goes to ``ssm_state_indices[n*stride_seq + t]`` — ``stride_seq`` is
  ``stride(0)`` of the table (1 for a 1-D table: the token stride is never applied);
- no null slot: every id is a row; a zero-length sequence returns before reading or writing;
- ``state_v_first=True``: the pool rows are ``[HV, V, K]`` (value-major), else ``[HV, K, V]``.

``mutation="key_major"`` reads and writes value-major rows as key-major (the bug class of issue 26).
"""

from __future__ import annotations

import torch

from deltacheck import reference


def add_serving(mod, *, mutation: str | None = None):
    def fwd(op, q, k, v, g, beta, w, *, initial_state, inplace_final_state, state_v_first, cu_seqlens,
            ssm_state_indices, num_accepted_tokens, scale, use_qk_l2norm_in_kernel, kwargs):
        mod.calls.append({"fn": f"fused_recurrent_{op}_fwd", "inplace_final_state": inplace_final_state,
                          "state_v_first": state_v_first, "ssm_state_indices": ssm_state_indices,
                          "num_accepted_tokens": num_accepted_tokens, **kwargs})
        assert inplace_final_state and initial_state is not None, "the double models the in-place mode only"
        assert initial_state.dtype == torch.float32 and q.shape[0] == 1 and cu_seqlens.dtype == torch.int64
        table = ssm_state_indices
        stride_seq = table.stride(0)
        flat = table.reshape(-1).tolist()
        offsets = cu_seqlens.tolist()
        flip = state_v_first != (mutation == "key_major")  # the mutation reads the other orientation

        def row(i):
            state = initial_state[i:i + 1]
            return state if flip else state.transpose(-1, -2)  # -> value-major for the reference

        def store(i, h_vk):
            initial_state[i] = (h_vk[0] if flip else h_vk[0].transpose(-1, -2)).to(torch.float32)

        o = torch.zeros_like(v, dtype=torch.float64)
        for n in range(len(offsets) - 1):
            a, b = offsets[n], offsets[n + 1]
            if b == a:
                continue
            start = int(num_accepted_tokens[n]) - 1 if num_accepted_tokens is not None else 0
            h = row(flat[n * stride_seq + start]).to(torch.float64)
            for t in range(b - a):
                s = slice(a + t, a + t + 1)
                args = [x[0, s] for x in (q, k, v, g, beta)] + ([w[0, s]] if op == "gdn2" else [])
                out, h = getattr(reference, op)(
                    *args, torch.tensor([0, 1], dtype=torch.int32), scale=scale, initial_state=h,
                    output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    use_beta_sigmoid_in_kernel=kwargs.get("use_beta_sigmoid_in_kernel", False),
                    allow_neg_eigval=kwargs.get("allow_neg_eigval", False), state_layout="vk",
                    compute_dtype=torch.float64)
                o[0, a + t] = out[0]
                store(flat[n * stride_seq + t], h)
        return o, initial_state

    def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                output_final_state=False, inplace_final_state=True, state_v_first=False,
                                cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                                out=None, **kwargs):
        if use_gate_in_kernel:
            raise NotImplementedError("the serving double models a log-space g only")
        return fwd("kda", q, k, v, g, beta, None, initial_state=initial_state, inplace_final_state=inplace_final_state,
                   state_v_first=state_v_first, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                   num_accepted_tokens=num_accepted_tokens, scale=scale,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   kwargs={"use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel,
                           "allow_neg_eigval": allow_neg_eigval})

    def fused_recurrent_gdn2_fwd(q, k, v, g, b, w, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                 output_final_state=False, inplace_final_state=False, state_v_first=False,
                                 cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, lower_bound=None,
                                 out=None, **kwargs):
        if use_gate_in_kernel:
            raise NotImplementedError("the serving double models a log-space g only")
        return fwd("gdn2", q, k, v, g, b, w, initial_state=initial_state, inplace_final_state=inplace_final_state,
                   state_v_first=state_v_first, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                   num_accepted_tokens=num_accepted_tokens, scale=scale,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, kwargs={})

    mod.fused_recurrent_kda_fwd = fused_recurrent_kda_fwd
    mod.fused_recurrent_gdn2_fwd = fused_recurrent_gdn2_fwd
    return mod
