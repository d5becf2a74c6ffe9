"""Public reference ops mirroring ``cudnn.linear_attention``: ``gdn``, ``kda``, ``gdn2``.

Call them exactly where you call the kernel. Defaults follow cuDNN: packed THD tensors with
``cu_seqlens``, states ``[N, HO, V, K]``, output at ``HO = max(H, HV)`` heads. Our own keyword extras:
``layout``, ``state_layout``, ``method`` ("oracle" or "chunked"), ``compute_dtype``, ``chunk_size``, and
``allow_nonfinite``: a NaN or Inf among the inputs is a ``ReferenceInputError`` naming the argument unless
it is True (as is a q/k/v dtype mix, always: ``checks.py``).

Unlike the kernels, outputs come back in ``compute_dtype`` (fp64 by default): the reference's job is to
be the gold standard, and rounding it to the io dtype would throw that away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import layouts
from .checks import (
    check_devices,
    check_dtypes,
    check_finite,
    check_initial_state,
    check_linear_gate,
    check_shapes,
    check_tensor,
)
from .flags import (
    DEFAULT_GATE_LOWER_BOUND,
    L2NORM_EPS,
    LINEAR_GATE_EPS,
    check_flags,
    effective_log_gate,
    expand_heads,
    guarded_beta,
    head_index,
    l2norm,
)
from .layouts import ReferenceInputError
from .oracle import token_oracle

__all__ = ["DEFAULT_GATE_LOWER_BOUND", "L2NORM_EPS", "LINEAR_GATE_EPS", "METHODS", "gdn", "gdn2", "gdp",
           "guarded_beta", "head_index", "kda"]

METHODS = ("oracle", "chunked")


@dataclass(frozen=True)
class _OpSpec:
    name: str
    g_feat: str  # "" (one per head) or "K" (per key channel)
    beta_feat: str  # "" or "K"
    has_w: bool
    dt_bias_feat: str  # safe-gate dt_bias shape beyond [HO]


_SPECS = {
    "gdn": _OpSpec("gdn", g_feat="", beta_feat="", has_w=False, dt_bias_feat=""),
    "kda": _OpSpec("kda", g_feat="K", beta_feat="", has_w=False, dt_bias_feat="K"),
    "gdn2": _OpSpec("gdn2", g_feat="K", beta_feat="K", has_w=True, dt_bias_feat="K"),
}


def _run(
    spec: _OpSpec,
    q, k, v, g, beta, w, cu_seqlens, *,
    scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
    allow_neg_eigval, gate_domain, safe_gate, gate_lower_bound, a_log, dt_bias,
    layout, state_layout, method, compute_dtype, chunk_size, beta_guard=False, guard_dtype=None,
    allow_nonfinite=False,
):
    layouts.check_layout(layout)
    layouts.check_state_layout(state_layout)
    if method not in METHODS:
        raise ReferenceInputError(f"method: expected one of {METHODS}, got {method!r}")
    if not (isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point):
        raise ReferenceInputError(f"compute_dtype: expected a floating torch.dtype, got {compute_dtype!r}")
    check_flags(
        spec, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        gate_domain=gate_domain, safe_gate=safe_gate, a_log=a_log, dt_bias=dt_bias,
    )
    if beta_guard and not use_qk_l2norm_in_kernel:
        raise ReferenceInputError(
            "beta_guard: needs use_qk_l2norm_in_kernel=True (the guard is defined on the normalized key, as in cuDNN)"
        )

    # --- layout -> thd -------------------------------------------------------------------------
    tokenwise = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if spec.has_w:
        tokenwise["w"] = w
    feat_ndim = {"q": 1, "k": 1, "v": 1, "g": len(spec.g_feat), "beta": len(spec.beta_feat), "w": 1}
    for name, x in tokenwise.items():
        check_tensor(name, x)
        want = (3 if layout != "thd" else 2) + feat_ndim[name]
        if x.dim() != want:
            raise ReferenceInputError(
                f"{name}: expected {want} dims for {spec.name} in layout {layout!r}, got shape {tuple(x.shape)}"
            )
    given = dict(tokenwise)  # as the caller laid them out: where a check points, it points into these
    if layout == "thd":
        n_dense = None
    else:
        if cu_seqlens is not None:
            raise ReferenceInputError(f"cu_seqlens: must be None for the dense layout {layout!r}")
        n_dense, length = layouts.dense_shape(q, layout, "q")
        for name, x in tokenwise.items():
            if layouts.dense_shape(x, layout, name) != (n_dense, length):
                raise ReferenceInputError(
                    f"{name}: batch/sequence dims {layouts.dense_shape(x, layout, name)} do not match q's "
                    f"{(n_dense, length)} in layout {layout!r}"
                )
        tokenwise = {name: layouts.to_thd(x, layout) for name, x in tokenwise.items()}
    q, k, v, g, beta = (tokenwise[n] for n in ("q", "k", "v", "g", "beta"))
    w = tokenwise.get("w")

    # --- shapes ----------------------------------------------------------------------------------
    T, H, K, HV, V = check_shapes(spec, q, k, v, g, beta, w, safe_gate=safe_gate, a_log=a_log, dt_bias=dt_bias)
    HO = max(H, HV)

    if layout == "thd":
        if cu_seqlens is None:
            offsets = [0, T]
        else:
            offsets = layouts.check_cu_seqlens(cu_seqlens, T)
    else:
        offsets = [i * length for i in range(n_dense + 1)]
    N = len(offsets) - 1

    check_initial_state(initial_state, (N, HO, K, V), state_layout)
    check_devices({**given, "initial_state": initial_state, "a_log": a_log, "dt_bias": dt_bias})
    check_dtypes(q, k, v, beta, w)
    if not allow_nonfinite:
        check_finite({**given, "initial_state": initial_state, "a_log": a_log, "dt_bias": dt_bias})
    if gate_domain == "linear":
        check_linear_gate(g)
    if scale is None:
        scale = 1.0 / math.sqrt(K)

    # --- flags ---------------------------------------------------------------------------------------
    # Flag and gate math runs in fp32 at least, as kernels do it: in fp16, log(alpha + 1e-10) of a
    # fully decayed gate is log(0) = -inf, and sigmoid(-30) flushes to 0. The recurrence itself then
    # runs in compute_dtype (bf16/fp16 for the same-precision baseline).
    cd = compute_dtype if compute_dtype.itemsize >= 4 else torch.float32
    # The guard rounds its candidate betas to the kernel's io dtype (FE 1.32 frost/common/beta_guard.py); an fp64
    # reference fed upcast inputs must round to the same dtype as the bf16/fp16 kernel it judges.
    io_dtype = guard_dtype if guard_dtype is not None else q.dtype
    q, k, v, g, beta = (x.to(cd) for x in (q, k, v, g, beta))
    w = w.to(cd) if w is not None else None
    a_log = a_log.to(cd) if a_log is not None else None
    dt_bias = dt_bias.to(cd) if dt_bias is not None else None
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if use_beta_sigmoid_in_kernel:
        beta = torch.sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)
    g = effective_log_gate(
        spec, g, gate_domain=gate_domain, safe_gate=safe_gate, a_log=a_log, dt_bias=dt_bias,
        gate_lower_bound=gate_lower_bound,
    )
    q, k, v = expand_heads(q, HO), expand_heads(k, HO), expand_heads(v, HO)
    if beta_guard:
        beta = guarded_beta(beta, k, g, io_dtype)
    if cd != compute_dtype:
        q, k, v, g, beta = (x.to(compute_dtype) for x in (q, k, v, g, beta))
        w = w.to(compute_dtype) if w is not None else None
    # Reduce every op to the GDN2 core: scalar gates stay broadcastable singletons.
    g = g if spec.g_feat else g.unsqueeze(-1)
    b = beta if spec.beta_feat else beta.unsqueeze(-1)
    wv = w if spec.has_w else beta.unsqueeze(-1)

    if initial_state is None:
        h0 = q.new_zeros(N, HO, K, V)
    else:
        h0 = layouts.state_convert(initial_state.to(compute_dtype), state_layout, "kv")

    out, final = _run_core(
        (q, k, v, g, b, wv), offsets, h0, scale, method=method, chunk_size=chunk_size, dense=n_dense is not None
    )
    if n_dense is not None:
        out = layouts.from_thd(out, layout, n_dense)
    if not output_final_state:
        return out, None
    return out, layouts.state_convert(final, "kv", state_layout)


def _run_core(tensors, offsets, h0, scale, *, method, chunk_size, dense):
    """Split packed tensors into a padded batch, run the core, pack the output back."""
    N = len(offsets) - 1
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    L = max(lengths) if lengths else 0
    T = tensors[0].shape[0]
    if L == 0:
        v = tensors[2]
        return v.new_zeros(T, v.shape[1], v.shape[2]), h0
    if dense:
        batched = [x.reshape(N, L, *x.shape[1:]) for x in tensors]
    else:
        # Gather each sequence into a padded row; padded steps get zero k, v, q and gates, and a zero
        # log-decay, so they leave the state untouched.
        device = tensors[0].device
        pos = torch.arange(L, device=device)
        starts = torch.tensor(offsets[:-1], device=device)
        lens = torch.tensor(lengths, device=device)
        valid = pos.unsqueeze(0) < lens.unsqueeze(1)  # [N, L]
        idx = torch.where(valid, starts.unsqueeze(1) + pos.unsqueeze(0), torch.zeros_like(pos))
        batched = []
        for x in tensors:
            y = x.index_select(0, idx.reshape(-1)).reshape(N, L, *x.shape[1:])
            batched.append(y * valid.reshape(N, L, *([1] * (x.dim() - 1))).to(y.dtype))
    if method == "oracle":
        out, final = token_oracle(*batched, h0, scale)
    else:
        from .chunked import chunked_gdn2

        out, final = chunked_gdn2(*batched, h0, scale, chunk_size=chunk_size)
    out = out.reshape(N * L, *out.shape[2:])
    if not dense:
        keep = valid.reshape(-1).nonzero().squeeze(-1)
        out = out.index_select(0, keep)
    return out, final


def gdn(
    q, k, v, g, beta, cu_seqlens=None, *, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
    gate_domain="log", safe_gate=False, a_log=None, dt_bias=None,
    layout="thd", state_layout="vk", method="oracle", compute_dtype=torch.float64, chunk_size=64,
    allow_nonfinite=False,
):
    """Gated DeltaNet: scalar decay ``g [T, HO]`` and scalar ``beta [T, HO]`` per token and head.

    ``S <- exp(g_t) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = scale * S^T q_t``.
    Returns ``(out, final_state)``; ``final_state`` is None unless ``output_final_state``.
    Safe gate: ``g_eff = -exp(a_log) * softplus(g + dt_bias)`` with ``a_log, dt_bias [HO]``.
    """
    return _run(
        _SPECS["gdn"], q, k, v, g, beta, None, cu_seqlens, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        gate_domain=gate_domain, safe_gate=safe_gate, gate_lower_bound=None, a_log=a_log, dt_bias=dt_bias,
        layout=layout, state_layout=state_layout, method=method, compute_dtype=compute_dtype,
        chunk_size=chunk_size, allow_nonfinite=allow_nonfinite,
    )


def kda(
    q, k, v, g, beta, cu_seqlens=None, *, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
    gate_domain="log", safe_gate=False, gate_lower_bound=DEFAULT_GATE_LOWER_BOUND, a_log=None, dt_bias=None,
    layout="thd", state_layout="vk", method="oracle", compute_dtype=torch.float64, chunk_size=64,
    allow_nonfinite=False,
):
    """Kimi Delta Attention: per-channel decay ``g [T, HO, K]``, scalar ``beta [T, HO]``.

    ``S <- Diag(exp g_t) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = scale * S^T q_t``.
    Safe gate: ``g_eff = gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias))``, ``dt_bias [HO, K]``.
    """
    return _run(
        _SPECS["kda"], q, k, v, g, beta, None, cu_seqlens, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        gate_domain=gate_domain, safe_gate=safe_gate, gate_lower_bound=gate_lower_bound, a_log=a_log,
        dt_bias=dt_bias, layout=layout, state_layout=state_layout, method=method, compute_dtype=compute_dtype,
        chunk_size=chunk_size, allow_nonfinite=allow_nonfinite,
    )


def gdn2(
    q, k, v, g, beta, w, cu_seqlens=None, *, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
    gate_domain="log", safe_gate=False, gate_lower_bound=DEFAULT_GATE_LOWER_BOUND, a_log=None, dt_bias=None,
    layout="thd", state_layout="vk", method="oracle", compute_dtype=torch.float64, chunk_size=64, beta_guard=False,
    guard_dtype=None, allow_nonfinite=False,
):
    """Gated DeltaNet 2: channel-wise decay ``g [T, HO, K]``, erase gate ``beta [T, HO, K]`` and write
    gate ``w [T, HO, V]``.

    ``S <- Diag(exp g_t) S;  S <- S + k_t (w_t*v_t - S^T (beta_t*k_t))^T;  o_t = scale * S^T q_t``.
    ``beta_guard=True`` (needs l2norm) applies cuDNN's erase-side safeguard, see ``guarded_beta``; it rounds its
    candidates to ``guard_dtype`` (default: q's dtype) — pass the kernel's io dtype when q is upcast.
    """
    return _run(
        _SPECS["gdn2"], q, k, v, g, beta, w, cu_seqlens, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        gate_domain=gate_domain, safe_gate=safe_gate, gate_lower_bound=gate_lower_bound, a_log=a_log,
        dt_bias=dt_bias, layout=layout, state_layout=state_layout, method=method, compute_dtype=compute_dtype,
        chunk_size=chunk_size, beta_guard=beta_guard, guard_dtype=guard_dtype, allow_nonfinite=allow_nonfinite,
    )


def gdp(
    q, k, v, g, beta, cu_seqlens=None, num_householder=None, *, scale=None, initial_state=None,
    output_final_state=False, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False, gate_domain="log", safe_gate=False, a_log=None, dt_bias=None,
    layout="thd", state_layout="vk", method="oracle", compute_dtype=torch.float64, chunk_size=64,
    allow_nonfinite=False,
):
    """Gated DeltaProduct: GDN run on ``n = num_householder`` sub-tokens per token (cuDNN FE 1.29+).

    ``q [T, H, K]`` and the decay ``g [T, HO]`` are per real token; ``k``, ``v`` and ``beta`` are per
    sub-token, either expanded (``k [T*n, HK, K]``, ``v [T*n, HV, V]``, ``beta [T*n, HO]``; token t's
    sub-tokens are rows ``t*n .. t*n+n-1``) or token-major (``[T, n, ...]``). The decay acts on
    sub-token 0, the readout follows sub-token n-1 (cuDNN FE 1.32 gdp.py); ``n = 1`` is exactly GDN.
    ``cu_seqlens`` counts real tokens. Packed THD only, as in cuDNN.
    """
    if not isinstance(num_householder, int) or isinstance(num_householder, bool) or num_householder < 1:
        raise ReferenceInputError(f"num_householder: expected a positive integer, got {num_householder!r}")
    if layout != "thd":
        raise ReferenceInputError(f"layout: gdp takes packed 'thd' tensors only (as cuDNN), got {layout!r}")
    n = num_householder
    check_tensor("q", q, ndim=3)
    T = q.shape[0]
    subtoken = {}
    for name, x, rank in (("k", k, 3), ("v", v, 3), ("beta", beta, 2)):
        check_tensor(name, x)
        if x.dim() == rank + 1:  # token-major [T, n, ...]
            if tuple(x.shape[:2]) != (T, n):
                raise ReferenceInputError(
                    f"{name}: token-major {name} must be [T={T}, n={n}, ...], got {list(x.shape)}")
            x = x.reshape(T * n, *x.shape[2:])
        elif x.dim() != rank or x.shape[0] != T * n:
            raise ReferenceInputError(
                f"{name}: expected {rank} dims with T*n = {T * n} rows (or token-major [T, n, ...]), "
                f"got {list(x.shape)}")
        subtoken[name] = x
    check_tensor("g", g, ndim=2)
    HO = g.shape[1]
    check_flags(_SPECS["gdn"], use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval, gate_domain=gate_domain, safe_gate=safe_gate,
                 a_log=a_log, dt_bias=dt_bias)
    if g.shape[0] != T:
        raise ReferenceInputError(f"g: expected one row per real token ([T={T}, HO]), got {list(g.shape)}")
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state, "a_log": a_log,
              "dt_bias": dt_bias}
    check_devices(inputs)
    check_dtypes(q, subtoken["k"], subtoken["v"], subtoken["beta"], None)
    if not allow_nonfinite:
        check_finite(inputs)
    if gate_domain == "linear":
        check_linear_gate(g)
    # The gate transform belongs to the real token; the expanded timeline then carries a plain
    # log-decay on sub-token 0 and no decay (0) on the others.
    pre = compute_dtype if compute_dtype.itemsize >= 4 else torch.float32
    g_eff = effective_log_gate(
        _SPECS["gdn"], g.to(pre), gate_domain=gate_domain, safe_gate=safe_gate,
        a_log=a_log.to(pre) if a_log is not None else None, dt_bias=dt_bias.to(pre) if dt_bias is not None else None,
        gate_lower_bound=None,
    )
    q_pre = q.to(pre)
    q_sub = torch.cat([q_pre.new_zeros(T, n - 1, *q.shape[1:]), q_pre.unsqueeze(1)], dim=1).reshape(T * n, *q.shape[1:])
    g_sub = torch.cat([g_eff.unsqueeze(1), g_eff.new_zeros(T, n - 1, HO)], dim=1).reshape(T * n, HO)
    if cu_seqlens is not None:
        layouts.check_cu_seqlens(cu_seqlens, T)
    cu = None if cu_seqlens is None else cu_seqlens * n
    # k, v and beta join q in the precision gdn computes its flags in anyway (so the cast changes no number);
    # the inputs were checked above, and what is derived from them is gdn's to take as it is.
    k_sub, v_sub, beta_sub = (subtoken[name].to(pre) for name in ("k", "v", "beta"))
    out, final = gdn(
        q_sub, k_sub, v_sub, g_sub, beta_sub, cu,
        scale=scale if scale is not None else 1.0 / math.sqrt(q.shape[2]), initial_state=initial_state,
        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_layout=state_layout, method=method, compute_dtype=compute_dtype, chunk_size=chunk_size,
        allow_nonfinite=True,
    )
    return out.reshape(T, n, *out.shape[1:])[:, n - 1], final
