"""FROST's serving semantics (cuDNN FE 1.32, Blackwell) added to the ``cudnn_la`` double, computed with our
reference. What it pins (``cudnn/linear_attention/ops/gdn.py`` and its kin, ``frost/common/thd.py``):

- ``state_indices`` (int32 ``[N]``) needs ``initial_state`` (the pool ``[N_pool, HO, V, K]``), refuses
  ``checkpoint_every_n_tokens``, reads row ``state_indices[i]`` for sequence i and writes the final state back
  there in place; the returned final state is the pool itself;
- ``overwrite_initial_state`` writes the final state into ``initial_state``;
- ``checkpoint_every_n_tokens`` (a positive multiple of 64 on FROST) returns a third value, ``max(T*n // N + N_seqs,
  1)`` rows (``ops/gdn.py``) in ``checkpoint_dtype`` (None: the io dtype), filled per ``checkpoint_rows``;
- ``batch_invariant=True`` runs each sequence alone (whole-sequence scheduling).

``mutation``: ``"key_major_pool"`` reads and writes the pool rows transposed; ``"late_checkpoints"`` stores the
state after p + N tokens at row p (the final state among them).
"""

from __future__ import annotations

import torch

from deltacheck.reference import serving as sv

ENTRY = {"gated_delta_net": "gdn", "kimi_delta_attention": "kda", "gated_delta_net_v2": "gdn2",
         "gated_delta_product": "gdp"}


def add_frost(mod, *, mutation: str | None = None):
    """``mod.serving_calls`` records the serving keywords of each call, as the adapter passed them."""
    mod.serving_calls = []
    for fn_name, op in ENTRY.items():
        setattr(mod, fn_name, _frost(getattr(mod, fn_name), op, mutation, mod.serving_calls))
    return mod


def _frost(inner, op, mutation, record):
    def call(*args, state_indices=None, overwrite_initial_state=False, checkpoint_every_n_tokens=0,
             checkpoint_dtype=None, batch_invariant=False, **kwargs):
        record.append({"state_indices": state_indices, "initial_state": kwargs.get("initial_state"),
                       "overwrite_initial_state": overwrite_initial_state, "batch_invariant": batch_invariant,
                       "checkpoint_every_n_tokens": checkpoint_every_n_tokens, "checkpoint_dtype": checkpoint_dtype})
        n_tensors = 6 if op == "gdn2" else 5
        tensors, cu = args[:n_tensors], args[n_tensors]
        nh = args[n_tensors + 1] if op == "gdp" else 1
        pool = kwargs.get("initial_state")
        if state_indices is not None:
            if pool is None:
                raise ValueError("state_indices selects rows of the initial_state pool, so initial_state is required")
            if checkpoint_every_n_tokens:
                raise ValueError("state_indices cannot be combined with checkpoint_every_n_tokens")
            if state_indices.dtype != torch.int32 or state_indices.shape != (cu.numel() - 1,):
                raise ValueError(f"state_indices must be int32 [N]; got {state_indices.dtype} "
                                 f"{tuple(state_indices.shape)}")
            rows = pool[state_indices.long()]
            kwargs["initial_state"] = rows.transpose(-1, -2).contiguous() if mutation == "key_major_pool" else rows
        if batch_invariant:
            o, final = _one_by_one(inner, tensors, cu, args[n_tensors + 1:], kwargs, nh)
        else:
            o, final = inner(*args, **kwargs)
        if state_indices is not None:
            final = final.transpose(-1, -2) if mutation == "key_major_pool" else final
            pool[state_indices.long()] = final.to(pool.dtype)
            final = pool
        elif overwrite_initial_state:
            pool.copy_(final.to(pool.dtype))
            final = pool
        if not checkpoint_every_n_tokens:
            return o, final
        if checkpoint_every_n_tokens % 64:
            raise ValueError("FROST takes checkpoint_every_n_tokens as a positive multiple of 64")
        return o, final, _series(op, tensors, cu, nh, kwargs, checkpoint_every_n_tokens, checkpoint_dtype, mutation)

    return call


def _one_by_one(inner, tensors, cu, rest, kwargs, nh):
    offsets = cu.tolist()
    outs, finals = [], []
    for n in range(len(offsets) - 1):
        a, b = offsets[n], offsets[n + 1]
        part = [x[a * nh:b * nh] if (nh > 1 and i in (1, 2, 4)) else x[a:b] for i, x in enumerate(tensors)]
        one = dict(kwargs)
        if kwargs.get("initial_state") is not None:
            one["initial_state"] = kwargs["initial_state"][n:n + 1]
        o, f = inner(*part, torch.tensor([0, b - a], dtype=cu.dtype), *rest, **one)
        outs.append(o)
        finals.append(f)
    return torch.cat(outs), torch.cat(finals)


def _series(op, tensors, cu, nh, kwargs, every, dtype, mutation):
    flags = {k: kwargs[k] for k in ("scale", "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel",
                                    "allow_neg_eigval", "gate_domain", "safe_gate", "a_log", "dt_bias",
                                    "gate_lower_bound", "beta_guard") if kwargs.get(k) is not None}
    if op == "gdp":
        flags["num_householder"] = nh
    h0 = kwargs.get("initial_state")
    rows = max(tensors[0].shape[0] * nh // every + cu.numel() - 1, 1)  # ops/gdn.py's allocation
    if mutation == "late_checkpoints":  # row p holds the state after p + N tokens (the final state at the end)
        full = sv.state_series(op, *tensors, cu_seqlens=cu, initial_state=h0, **flags)
        lengths = (cu[1:] - cu[:-1]).tolist()
        series = torch.stack([states[min(p + every, L)] for L, states in zip(lengths, full)
                              for p in range(0, L, every // nh)])
    else:
        series = sv.checkpoints(op, *tensors, every_n=every, cu_seqlens=cu, initial_state=h0, **flags)
    series = series.to(dtype or tensors[0].dtype)
    unwritten = torch.full((rows - series.shape[0], *series.shape[1:]), float("nan"), dtype=series.dtype)
    return torch.cat([series, unwritten])
