"""The Case: a frozen, validated description of one test input, with a stable readable id.

Its id grammar (``Case.id``, ``parse_id``) is ``case_id.py``; the values each field may take are ``fields.py``
(re-exported here, where the rest of the package has always imported them).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import serving_axes
from .case_id import format_id, parse_fields
from .fields import (
    BETA_PROFILES,
    DENSE_LAYOUTS,
    GATE_DOMAINS,
    GATE_PROFILES,
    IO_DTYPES,
    LAYOUTS,
    STATE_DTYPES,
    TIERS,
    UNIFORM_GATE,
    CaseError,
    gate_floor,
)
from .fields import field_error as _bad
from .support import OP_SUPPORT, head_config_of

__all__ = [
    "BETA_PROFILES", "DENSE_LAYOUTS", "GATE_DOMAINS", "GATE_PROFILES", "IO_DTYPES", "LAYOUTS", "STATE_DTYPES", "TIERS",
    "UNIFORM_GATE", "Case", "CaseError", "gate_floor", "parse_id",
]


@dataclass(frozen=True)
class Case:
    op: str
    io_dtype: str = "bf16"
    layout: str = "thd"
    seqlens: tuple[int, ...] = (64,)
    H: int = 2
    HK: int = 2
    HV: int = 2
    K: int = 64
    V: int = 64
    gate: str = "typical"
    state_dtype: str = "fp32"
    beta_profile: str = "uniform"
    l2norm: bool = False
    beta_sigmoid: bool = False
    neg_eigval: bool = False
    gate_domain: str = "log"
    safe_gate: bool = False
    a_log: bool = False
    dt_bias: bool = False
    beta_guard: bool = False
    scale: float | None = None
    magnitude: float | None = None  # multiplies v and q (and k under l2norm): where fp16/bf16 overflow or underflow
    initial_state: bool = False
    splits: tuple[int, ...] = ()
    num_householder: int = 1  # GDP's sub-token updates per real token; 1 (the only value) for other ops
    backward: bool = False
    # The serving axes (serving_axes.py): pool rows, null sequences, decode chain, draft tokens with accepted
    # counts, checkpoint cadence; all 0/() for a training-style call.
    pool: int = 0
    nulls: int = 0
    chain: int = 0
    draft: int = 0
    accepted: tuple[int, ...] = ()
    checkpoint_every: int = 0
    seed: int = 0
    tier: str = field(default="L0")

    # ------------------------------------------------------------------ validation
    def __post_init__(self):
        # Lists are convenient to write; the frozen, hashable Case stores tuples.
        for name in ("seqlens", "splits", "accepted"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("scale", "magnitude"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        self._validate()

    def _validate(self):
        def one_of(name, choices):
            value = getattr(self, name)
            if value not in choices:
                raise _bad(name, f"expected one of {', '.join(map(str, choices))}; got {value!r}")

        one_of("op", tuple(OP_SUPPORT))
        support = OP_SUPPORT[self.op]
        one_of("io_dtype", IO_DTYPES)
        if self.io_dtype not in support.io_dtypes:
            raise _bad("io_dtype", f"op {self.op} accepts {support.io_dtypes}; got {self.io_dtype!r}")
        one_of("state_dtype", STATE_DTYPES)
        if self.state_dtype not in support.state_dtypes:
            raise _bad("state_dtype", f"op {self.op} accepts {support.state_dtypes}; got {self.state_dtype!r}")
        one_of("layout", LAYOUTS)
        if self.layout not in support.layouts:
            raise _bad("layout", f"op {self.op} accepts layouts {support.layouts}; got {self.layout!r}")
        if self.gate not in GATE_PROFILES and not (isinstance(self.gate, str) and UNIFORM_GATE.fullmatch(self.gate)):
            raise _bad("gate", f"expected one of {', '.join(GATE_PROFILES)} or unif<x> (log-decays from U(-x, -0.1)); "
                               f"got {self.gate!r}")
        if gate_floor(self.gate) is not None:
            if gate_floor(self.gate) > -0.1:
                raise _bad("gate", f"unif<x> needs x >= 0.1 (decays from U(-x, -0.1)); got {self.gate!r}")
            if self.safe_gate or self.gate_domain != "log":
                raise _bad("gate", f"{self.gate!r} is a log-space decay profile: it needs gate_domain='log' and no "
                                   "safe_gate")
        one_of("beta_profile", BETA_PROFILES)
        one_of("gate_domain", GATE_DOMAINS)
        one_of("tier", TIERS)

        for name in ("l2norm", "beta_sigmoid", "neg_eigval", "safe_gate", "a_log", "dt_bias", "beta_guard",
                     "initial_state", "backward"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, f"expected a bool; got {getattr(self, name)!r}")
        for name in ("H", "HK", "HV", "K", "V", "seed", "num_householder"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise _bad(name, f"expected an int; got {value!r}")
        if self.seed < 0:
            raise _bad("seed", f"expected an int >= 0; got {self.seed}")
        if self.num_householder < 1:
            raise _bad("num_householder", f"expected an int >= 1; got {self.num_householder}")
        if self.num_householder != 1 and not support.householder:
            raise _bad("num_householder", f"op {self.op} has no Householder steps (only gdp); got {self.num_householder}")

        # Sequence lengths.
        if not isinstance(self.seqlens, tuple) or not self.seqlens:
            raise _bad("seqlens", f"expected a non-empty tuple of lengths; got {self.seqlens!r}")
        for length in self.seqlens:
            if not isinstance(length, int) or isinstance(length, bool) or length < 0:
                raise _bad("seqlens", f"expected ints >= 0; got {self.seqlens!r}")
        if sum(self.seqlens) < 1:
            raise _bad("seqlens", f"expected at least one token in total; got {self.seqlens!r}")
        if self.layout in DENSE_LAYOUTS:
            if len(set(self.seqlens)) != 1:
                raise _bad("seqlens", f"dense layout {self.layout} needs equal lengths; got ragged {self.seqlens!r}"
                           " (use layout thd)")
            if self.seqlens[0] < 1:
                raise _bad("seqlens", f"dense layout {self.layout} needs length >= 1; got {self.seqlens[0]}")

        # Heads and dims.
        for name in ("H", "HK", "HV"):
            if getattr(self, name) < 1:
                raise _bad(name, f"expected >= 1; got {getattr(self, name)}")
        config = head_config_of(self.H, self.HK, self.HV)
        if config is None:
            raise _bad("HK", f"heads H/HK/HV = {self.H}/{self.HK}/{self.HV} are none of mha (H=HK=HV), "
                             "gqa (H>HV, H%HV==0, HK=HV), gva (HV>H, HV%H==0, HK=H)")
        if config not in support.head_configs:
            raise _bad("H", f"op {self.op} accepts head configs {support.head_configs}; got {config}")
        if self.K not in support.key_dims:
            raise _bad("K", f"op {self.op} accepts K in {support.key_dims}; got {self.K}")
        if self.V not in support.value_dims:
            raise _bad("V", f"op {self.op} accepts V in {support.value_dims}; got {self.V}")

        # Flags: op support, then the combinations no op allows.
        for name, on in (("l2norm", self.l2norm), ("beta_sigmoid", self.beta_sigmoid),
                         ("neg_eigval", self.neg_eigval), ("linear_gate", self.gate_domain == "linear"),
                         ("safe_gate", self.safe_gate), ("a_log", self.a_log), ("dt_bias", self.dt_bias),
                         ("beta_guard", self.beta_guard), ("scale", self.scale is not None)):
            if on and name not in support.flags:
                raise _bad(name if name != "linear_gate" else "gate_domain", f"op {self.op} does not accept it")
        if self.neg_eigval and not self.beta_sigmoid:
            raise _bad("neg_eigval", "needs beta_sigmoid=True (allow_neg_eigval scales sigmoid(beta) by 2)")
        if self.safe_gate and self.gate_domain == "linear":
            raise _bad("gate_domain", "safe_gate needs gate_domain='log' (g is a raw pre-activation, not alpha)")
        if self.a_log and not self.safe_gate:
            raise _bad("a_log", "needs safe_gate=True")
        if self.dt_bias and not self.safe_gate:
            raise _bad("dt_bias", "needs safe_gate=True")
        if self.beta_guard and not self.l2norm:
            raise _bad("beta_guard", "needs l2norm=True (the guard is defined on the normalized key)")
        if self.beta_profile == "near2" and not self.neg_eigval:
            raise _bad("beta_profile", "'near2' needs neg_eigval=True (beta_eff = 2*sigmoid(logit) reaches 2)")
        for name in ("scale", "magnitude"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, float) or not math.isfinite(value) or value <= 0):
                raise _bad(name, f"expected None or a finite float > 0; got {value!r}")

        # Continuation split points: token offsets inside each sequence (clamped to its length).
        if not isinstance(self.splits, tuple):
            raise _bad("splits", f"expected a tuple of offsets; got {self.splits!r}")
        previous = 0
        for offset in self.splits:
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise _bad("splits", f"expected int offsets; got {self.splits!r}")
            if offset <= previous:
                raise _bad("splits", f"expected strictly increasing offsets >= 1; got {self.splits!r}")
            previous = offset
        if self.splits and self.splits[-1] >= max(self.seqlens):
            raise _bad("splits", f"offsets must be < the longest sequence ({max(self.seqlens)}); "
                                 f"got {self.splits!r}")
        serving_axes.validate(self, _bad)

    # ------------------------------------------------------------------ derived facts
    @property
    def N(self) -> int:
        """Number of sequences."""
        return len(self.seqlens)

    @property
    def HO(self) -> int:
        """Output heads: gates, output and state live at max(H, HV) heads."""
        return max(self.H, self.HV)

    @property
    def total_tokens(self) -> int:
        return sum(self.seqlens)

    @property
    def max_len(self) -> int:
        return max(self.seqlens)

    @property
    def head_config(self) -> str:
        return head_config_of(self.H, self.HK, self.HV)

    @property
    def support(self):
        return OP_SUPPORT[self.op]

    def segments(self, seq_len: int) -> list[tuple[int, int]]:
        """[start, end) token ranges the continuation check runs for a sequence of this length.

        Split offsets past the end of a short sequence clamp to its length (giving empty segments),
        so every sequence of a ragged batch is cut at the same offsets.
        """
        cuts = [0, *(min(s, seq_len) for s in self.splits), seq_len]
        return list(zip(cuts[:-1], cuts[1:]))

    def reference_kwargs(self) -> dict:
        """Keyword flags for the reference (and backend) call."""
        return {
            "scale": self.scale,
            "use_qk_l2norm_in_kernel": self.l2norm,
            "use_beta_sigmoid_in_kernel": self.beta_sigmoid,
            "allow_neg_eigval": self.neg_eigval,
            "gate_domain": self.gate_domain,
            "safe_gate": self.safe_gate,
            "output_final_state": True,
            "layout": self.layout,
            # Op-specific keywords, only where the op takes them.
            **({"gate_lower_bound": self.support.gate_lower_bound} if self.support.gate_lower_bound is not None
               else {}),
            **({"beta_guard": True} if self.beta_guard else {}),
            **({"num_householder": self.num_householder} if self.support.householder else {}),
        }

    def replace(self, **changes) -> Case:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ id
    @property
    def id(self) -> str:
        return format_id(self)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def from_id(cls, text: str) -> Case:
        return parse_id(text)


def parse_id(text: str) -> Case:
    """Parse an id back into the Case it names. Errors name the field and the offending token."""
    return Case(**parse_fields(text))
