"""The token-by-token oracle: the recurrence exactly as written, one token at a time.

Every op (GDN, KDA, GDN2) is reduced by the front end to this one GDN2-shaped core. Gates may be
given at full width or as broadcastable singletons (GDN's scalar decay is ``g[..., :1]``), which
costs nothing here and lets the chunked core exploit scalar gates.
"""

from __future__ import annotations

import torch


def token_oracle(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    h0: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the gated delta rule token by token.

    Shapes: ``q, k [N, L, HO, K]``, ``v [N, L, HO, V]``, log-decay ``g [N, L, HO, K|1]``, erase gate
    ``b [N, L, HO, K|1]``, write gate ``w [N, L, HO, V|1]``, key-major state ``h0 [N, HO, K, V]``.
    Returns ``(o [N, L, HO, V], S_L [N, HO, K, V])``; everything in the inputs' dtype.

    Per token: decay first, then the erase reads the *decayed* state, then the write, then the readout
    sees the state after this token's write::

        S <- Diag(exp g_t) S
        S <- S + k_t (w_t * v_t - S^T (b_t * k_t))^T
        o_t = scale * S^T q_t
    """
    state = h0
    outs = []
    for t in range(q.shape[1]):
        k_t = k[:, t]
        state = state * torch.exp(g[:, t]).unsqueeze(-1)
        erased = torch.einsum("nhkv,nhk->nhv", state, b[:, t] * k_t)
        state = state + k_t.unsqueeze(-1) * (w[:, t] * v[:, t] - erased).unsqueeze(-2)
        outs.append(torch.einsum("nhkv,nhk->nhv", state, q[:, t]) * scale)
    if outs:
        out = torch.stack(outs, dim=1)
    else:
        out = v.new_zeros(v.shape)
    return out, state
