"""What each op accepts, declared once per op.

The Case validator and the matrix generator both read `OP_SUPPORT`; nothing else in `cases/` branches on
the op name for capability questions. This is the *op's* contract (what the math and the public APIs
define), not any backend's: a case a particular backend cannot serve (FLA's chunk_gdn2 has no GVA, a
kernel needs SM100) still belongs in the matrix, and that backend declines it with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every boolean/str flag a Case can carry. `OpSupport.flags` lists the ones an op accepts.
ALL_FLAGS = frozenset(
    {"l2norm", "beta_sigmoid", "neg_eigval", "linear_gate", "safe_gate", "a_log", "dt_bias", "scale", "beta_guard"}
)

# Head configurations, by name. HO = max(H, HV) everywhere; the smaller head count must divide the larger.
#   mha: H == HK == HV
#   gqa: H > HV, H % HV == 0, HK == HV  (several query heads share one key/value head)
#   gva: HV > H, HV % H == 0, HK == H   (several value heads share one query/key head)
HEAD_CONFIGS = ("mha", "gqa", "gva")


def head_config_of(H: int, HK: int, HV: int) -> str | None:
    """The name of the head configuration (H, HK, HV) forms, or None if it is none of them."""
    if H == HK == HV:
        return "mha"
    if H > HV and H % HV == 0 and HK == HV:
        return "gqa"
    if HV > H and HV % H == 0 and HK == H:
        return "gva"
    return None


@dataclass(frozen=True)
class OpSupport:
    """Declaration of one op's accepted inputs.

    Shapes are given in the packed (thd) layout with symbolic dims (``Tn``: T * num_householder sub-token
    rows); dense layouts put the same trailing dims after their own batch/sequence/head arrangement.
    """

    op: str
    io_dtypes: tuple[str, ...]
    state_dtypes: tuple[str, ...]
    key_dims: tuple[int, ...]  # K values; any K may pair with any V ("mixed")
    value_dims: tuple[int, ...]
    head_configs: tuple[str, ...]
    flags: frozenset[str]
    gate_shape: tuple[str, ...]  # g
    beta_shape: tuple[str, ...]
    beta_dtype: str  # "fp32" or "io"
    write_gate: bool  # has the GDN2 write gate w [T, HO, V] (io dtype)
    dt_bias_shape: tuple[str, ...]
    # Safe-gate formula family: "softplus" (GDN: -exp(a_log) * softplus(g + dt_bias)) or
    # "sigmoid" (KDA/GDN2: gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias))).
    safe_gate_form: str
    gate_lower_bound: float | None  # default lower bound of the sigmoid safe gate; None for softplus
    layouts: tuple[str, ...] = ("thd", "bshd", "sbhd", "bhsd")  # GDP: packed thd only, as cuDNN's op
    # Inputs with one row per Householder step (GDP: k, v, beta carry num_householder sub-token rows per
    # real token, expanded as rows t*n .. t*n+n-1); empty for ops without Householder steps.
    subtoken_inputs: tuple[str, ...] = ()

    @property
    def householder(self) -> bool:
        """Whether the op runs ``num_householder`` sub-token updates per token (GDP)."""
        return bool(self.subtoken_inputs)

    def supports_dims(self, K: int, V: int) -> bool:
        return K in self.key_dims and V in self.value_dims


# Head dims the math (and the reference) takes; each backend's envelope says which it serves (cuDNN FROST: 64 and
# 128; FLA: K <= 256). Non-powers of two are where masking bugs live.
HEAD_DIMS = (32, 64, 96, 128, 256)

# beta_guard is GDN2's alone (cuDNN's erase-side safeguard on the per-channel erase gate).
_COMMON_FLAGS = ALL_FLAGS - {"beta_guard"}

OP_SUPPORT: dict[str, OpSupport] = {
    "gdn": OpSupport(
        op="gdn",
        io_dtypes=("bf16", "fp16"),
        state_dtypes=("fp32", "bf16"),
        key_dims=HEAD_DIMS,
        value_dims=HEAD_DIMS,
        head_configs=HEAD_CONFIGS,
        flags=_COMMON_FLAGS,
        gate_shape=("T", "HO"),
        beta_shape=("T", "HO"),
        beta_dtype="fp32",
        write_gate=False,
        dt_bias_shape=("HO",),
        safe_gate_form="softplus",
        gate_lower_bound=None,
    ),
    "kda": OpSupport(
        op="kda",
        io_dtypes=("bf16", "fp16"),
        state_dtypes=("fp32", "bf16"),
        key_dims=HEAD_DIMS,
        value_dims=HEAD_DIMS,
        head_configs=HEAD_CONFIGS,
        flags=_COMMON_FLAGS,
        gate_shape=("T", "HO", "K"),
        beta_shape=("T", "HO"),
        beta_dtype="fp32",
        write_gate=False,
        dt_bias_shape=("HO", "K"),
        safe_gate_form="sigmoid",
        gate_lower_bound=-5.0,
    ),
    "gdn2": OpSupport(
        op="gdn2",
        io_dtypes=("bf16", "fp16"),
        state_dtypes=("fp32", "bf16"),
        key_dims=HEAD_DIMS,
        value_dims=HEAD_DIMS,
        head_configs=HEAD_CONFIGS,
        flags=ALL_FLAGS,
        gate_shape=("T", "HO", "K"),
        beta_shape=("T", "HO", "K"),
        beta_dtype="io",
        write_gate=True,
        dt_bias_shape=("HO", "K"),
        safe_gate_form="sigmoid",
        gate_lower_bound=-5.0,
    ),
    # Gated DeltaProduct: GDN's gates, n = num_householder (k, v, beta) rows per real token; q and g per real
    # token. cuDNN FE 1.32 gated_delta_product: no beta_guard, no gate_lower_bound, the safe gate is GDN's
    # softplus form with a_log, dt_bias [HO]; its only engine (FROST) is built for K, V in {64, 128}.
    "gdp": OpSupport(
        op="gdp",
        io_dtypes=("bf16", "fp16"),
        state_dtypes=("fp32", "bf16"),
        key_dims=HEAD_DIMS,
        value_dims=HEAD_DIMS,
        head_configs=HEAD_CONFIGS,
        flags=_COMMON_FLAGS,
        gate_shape=("T", "HO"),
        beta_shape=("Tn", "HO"),
        beta_dtype="fp32",
        write_gate=False,
        dt_bias_shape=("HO",),
        safe_gate_form="softplus",
        gate_lower_bound=None,
        layouts=("thd",),
        subtoken_inputs=("k", "v", "beta"),
    ),
}

OPS = tuple(OP_SUPPORT)

# The ops of the tiers' main covering arrays (cases/axes.py, cases/matrix.py). GDP, the op with Householder steps,
# has an array of its own per tier (HOUSEHOLDER_OPS; cases/matrix.py), so adding it changed no other case's id.
TIER_OPS = ("gdn", "kda", "gdn2")
HOUSEHOLDER_OPS = tuple(op for op, sup in OP_SUPPORT.items() if sup.householder)
