"""GDP_CASES: hand-written Gated DeltaProduct cases, pinned in L0 beside GDP's generated array.

GDP (``num_householder`` beta-gated Householder updates per token, cuDNN FE ``gated_delta_product``, TE
``GatedDeltaProductAttention``) is generated in every tier as its own covering array (``cases/matrix.py``:
``tier_axes``, over ``support.HOUSEHOLDER_OPS``), over the tier's axes narrowed to packed thd plus ``nh``. These hand-written
cases are the ones a covering array would only meet by chance: together they meet n = 1 (GDP is then GDN), 2, 3
and 4; ragged thd with empty and one-token sequences; continuation splits; the backward; every GDP flag (l2norm,
the beta sigmoid and neg-eig, the linear gate, the softplus safe gate with and without a_log/dt_bias, a custom
scale); a bf16 state; MHA, GQA and GVA; K != V; bf16 and fp16; zero, mild, typical, steep and extreme gates; and
the n = 1 / n = 2 partners of L0's pinned GDN case (the reductions). Each runs on its own with
``deltacheck run --case ID --backend ...``.
"""

from __future__ import annotations

from .spec import Case

GDP_IDS = (
    # The reduction partner of L0's pinned GDN case (same lengths, heads, gate, splits): n = 2 and n = 1.
    "gdp-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-nh2-h0-cont[1_64]-bwd",
    "gdp-bf16-thd-N4-T[0_1_64_65]-H2/2/2-K64-V64-typical-nh1-h0-cont[1_64]-bwd",
    # Three reflections per token that can reach eigenvalue -1 (beta near 2), through the fused sigmoid.
    "gdp-fp16-thd-N3-T[65_0_130]-H2/2/2-K128-V64-steep-nh3-beta_near2-l2norm-sigmoid-negeig-h0-bwd",
    # The softplus safe gate with both per-head parameters (their gradients too).
    "gdp-bf16-thd-N2-T[63_129]-H4/4/4-K128-V128-typical-nh2-safegate-alog-dtbias-h0-bwd",
    # The linear gate domain, a custom scale and a bf16 state carried across a split.
    "gdp-bf16-thd-N2-T[1_200]-H2/2/2-K64-V128-mild-nh2-state_bf16-linear-scale0.5-h0-cont[64]",
    # GVA with -1000 log-decays on some tokens.
    "gdp-bf16-thd-N3-T[0_64_65]-H1/1/2-K64-V64-extreme-nh2-l2norm-h0-bwd",
    # GQA, no decay at all, four reflections per token.
    "gdp-fp16-thd-N1-T[200]-H4/2/2-K128-V128-zero-nh4-sigmoid-cont[63]",
)

GDP_CASES: tuple[Case, ...] = tuple(Case.from_id(i) for i in GDP_IDS)
