"""The Case: a frozen, validated description of one test input, with a stable readable id.

Id grammar (tokens joined by "-"; the first eight are always present, in this order, the rest only
when they differ from their default, in the order shown):

    <op>-<io>-<layout>-N<n>-<lengths>-H<H>/<HK>/<HV>-K<K>-V<V>-<gate>
        [-nh<n>] [-state_bf16] [-beta_<profile>] [-l2norm] [-sigmoid] [-negeig] [-linear]
        [-safegate] [-alog] [-dtbias] [-guard] [-scale<x>] [-mag<x>] [-h0] [-cont[<s>_<s>...]] [-bwd]
        [-pool<n>] [-null<k>] [-chain<n>] [-spec<k>[<a>_<a>...]] [-ckpt<n>] [-seed<n>] [-L1|-L2]

    lengths: dense layouts  L<len>               (every sequence has this length)
             thd            T[<l1>_<l2>_...]     (one entry per sequence; 0 is allowed)
    gate:    a named profile, or unif<x>: log-decays from U(-x, -0.1) (stability searches)
    scale, mag: Python's repr of the float with "e-" written "em" (so the id never has a stray "-")
    nh:      GDP's number of Householder steps per token (num_householder), always written for gdp and
             only for gdp (other ops have none: their ids are unchanged)
    pool, null, chain, spec, ckpt: the serving axes (issue 26), defined in ``serving_axes.py``

Example: ``gdn2-bf16-thd-N3-T[0_63_1000]-H4/4/4-K128-V128-steep-h0-cont[64]-bwd``.

List items are separated by "_" rather than "," so an id is a single pytest ``-k`` word; "," is
accepted when parsing. Optional tokens are accepted in any order when parsing; `Case.id` always emits
the canonical order, so id -> Case -> id is stable.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from . import serving_axes
from .support import OP_SUPPORT, head_config_of

IO_DTYPES = ("bf16", "fp16")
STATE_DTYPES = ("fp32", "bf16")
LAYOUTS = ("thd", "bshd", "sbhd", "bhsd")
DENSE_LAYOUTS = ("bshd", "sbhd", "bhsd")
GATE_PROFILES = ("mild", "typical", "steep", "extreme", "zero", "long", "trained")
# A parametrized profile for stability searches: log-decays drawn from U(-x, -0.1), written "unif<x>" (x >= 0.1).
UNIFORM_GATE = re.compile(r"unif(\d+(?:\.\d+)?)")


def gate_floor(gate: str) -> float | None:
    """The lower end -x of a ``unif<x>`` gate profile, or None for a named profile."""
    match = UNIFORM_GATE.fullmatch(gate)
    return -float(match.group(1)) if match else None
BETA_PROFILES = ("uniform", "zero", "one", "near2")
GATE_DOMAINS = ("log", "linear")
TIERS = ("L0", "L1", "L2")


class CaseError(ValueError):
    """A Case (or an id) is invalid; the message names the field and what was expected."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


def _bad(field_name: str, message: str) -> CaseError:
    return CaseError(field_name, message)


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
        parts = [self.op, self.io_dtype, self.layout, f"N{self.N}"]
        if self.layout == "thd":
            parts.append("T[" + "_".join(map(str, self.seqlens)) + "]")
        else:
            parts.append(f"L{self.seqlens[0]}")
        parts += [f"H{self.H}/{self.HK}/{self.HV}", f"K{self.K}", f"V{self.V}", self.gate]
        if self.support.householder:
            parts.append(f"nh{self.num_householder}")
        if self.state_dtype != "fp32":
            parts.append(f"state_{self.state_dtype}")
        if self.beta_profile != "uniform":
            parts.append(f"beta_{self.beta_profile}")
        for attr, token in _FLAG_TOKENS:
            if attr == "gate_domain":
                if self.gate_domain == "linear":
                    parts.append(token)
            elif getattr(self, attr):
                parts.append(token)
        if self.scale is not None:
            parts.append("scale" + _format_scale(self.scale))
        if self.magnitude is not None:
            parts.append("mag" + _format_scale(self.magnitude))
        if self.initial_state:
            parts.append("h0")
        if self.splits:
            parts.append("cont[" + "_".join(map(str, self.splits)) + "]")
        if self.backward:
            parts.append("bwd")
        parts += serving_axes.tokens(self)
        if self.seed:
            parts.append(f"seed{self.seed}")
        if self.tier != "L0":
            parts.append(self.tier)
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def from_id(cls, text: str) -> Case:
        return parse_id(text)


# Flags in canonical id order ("linear" stands for gate_domain="linear").
_FLAG_TOKENS = (
    ("l2norm", "l2norm"),
    ("beta_sigmoid", "sigmoid"),
    ("neg_eigval", "negeig"),
    ("gate_domain", "linear"),
    ("safe_gate", "safegate"),
    ("a_log", "alog"),
    ("dt_bias", "dtbias"),
    ("beta_guard", "guard"),
)


def _format_scale(scale: float) -> str:
    return repr(float(scale)).replace("e-", "em").replace("e+", "e")


def _parse_scale(text: str) -> float:
    return float(text.replace("em", "e-"))


_INT = r"(0|[1-9][0-9]*)"
_LIST = re.compile(r"\[(\d+(?:[_,]\d+)*)\]")


def _int_token(token: str, prefix: str, field_name: str, position: str) -> int:
    match = re.fullmatch(re.escape(prefix) + _INT, token)
    if not match:
        raise _bad(field_name, f"{position} token should be {prefix}<int>; got {token!r}")
    return int(match.group(1))


def _int_list(text: str, field_name: str, token: str) -> tuple[int, ...]:
    match = _LIST.fullmatch(text)
    if not match:
        raise _bad(field_name, f"expected a bracketed list like [0_63_1000]; got {token!r}")
    return tuple(int(x) for x in re.split(r"[_,]", match.group(1)))


def parse_id(text: str) -> Case:
    """Parse an id back into the Case it names. Errors name the field and the offending token."""
    if not isinstance(text, str) or not text.strip():
        raise _bad("id", f"expected a non-empty id string; got {text!r}")
    tokens = text.strip().split("-")
    if len(tokens) < 9:
        raise _bad("id", f"expected at least 9 '-'-separated tokens "
                         f"(op-io-layout-N-lengths-H-K-V-gate); got {len(tokens)} in {text!r}")
    op, io, layout, n_tok, len_tok, head_tok, k_tok, v_tok, gate, *rest = tokens
    fields: dict = {"op": op, "io_dtype": io, "layout": layout, "gate": gate}
    if op not in OP_SUPPORT:
        raise _bad("op", f"1st token should be one of {', '.join(OP_SUPPORT)}; got {op!r}")
    if io not in IO_DTYPES:
        raise _bad("io_dtype", f"2nd token should be one of {', '.join(IO_DTYPES)}; got {io!r}")
    if layout not in LAYOUTS:
        raise _bad("layout", f"3rd token should be one of {', '.join(LAYOUTS)}; got {layout!r}")
    n = _int_token(n_tok, "N", "seqlens", "4th")
    if layout == "thd":
        if not len_tok.startswith("T"):
            raise _bad("seqlens", f"5th token for thd should be T[<l1>_<l2>...]; got {len_tok!r}")
        seqlens = _int_list(len_tok[1:], "seqlens", len_tok)
        if len(seqlens) != n:
            raise _bad("seqlens", f"N{n} but {len(seqlens)} lengths in {len_tok!r}")
    else:
        length = _int_token(len_tok, "L", "seqlens", "5th (dense layout)")
        seqlens = (length,) * n
    fields["seqlens"] = seqlens
    head_match = re.fullmatch(rf"H{_INT}/{_INT}/{_INT}", head_tok)
    if not head_match:
        raise _bad("H", f"6th token should be H<H>/<HK>/<HV>; got {head_tok!r}")
    fields["H"], fields["HK"], fields["HV"] = (int(x) for x in head_match.groups())
    fields["K"] = _int_token(k_tok, "K", "K", "7th")
    fields["V"] = _int_token(v_tok, "V", "V", "8th")
    if gate not in GATE_PROFILES and not UNIFORM_GATE.fullmatch(gate):
        raise _bad("gate", f"9th token should be one of {', '.join(GATE_PROFILES)} or unif<x>; got {gate!r}")

    flag_attrs = {token: attr for attr, token in _FLAG_TOKENS if attr != "gate_domain"}
    seen: set[str] = set()
    for token in rest:
        if token in flag_attrs:
            key = flag_attrs[token]
            value = True
        elif token == "linear":
            key, value = "gate_domain", "linear"
        elif token == "h0":
            key, value = "initial_state", True
        elif token == "bwd":
            key, value = "backward", True
        elif token in TIERS:
            key, value = "tier", token
        elif token.startswith("state_"):
            key, value = "state_dtype", token[len("state_"):]
            if value not in STATE_DTYPES:
                raise _bad("state_dtype", f"token {token!r}: expected state_<{'|'.join(STATE_DTYPES)}>")
        elif token.startswith("beta_"):
            key, value = "beta_profile", token[len("beta_"):]
            if value not in BETA_PROFILES:
                raise _bad("beta_profile", f"token {token!r}: expected beta_<{'|'.join(BETA_PROFILES)}>")
        elif token.startswith("scale") or token.startswith("mag"):
            key = "scale" if token.startswith("scale") else "magnitude"
            try:
                value = _parse_scale(token[len("scale" if key == "scale" else "mag"):])
            except ValueError:
                raise _bad(key, f"token {token!r}: expected {token[:3]}...<float>, e.g. scale0.125, mag1000.0") from None
        elif re.fullmatch(r"nh\d+", token):
            key, value = "num_householder", _int_token(token, "nh", "num_householder", "nh")
        elif (served := serving_axes.parse_token(token, _bad)) is not None:
            for key, value in served:
                if key in seen:
                    raise _bad(key, f"given twice (token {token!r}) in {text!r}")
                seen.add(key)
                fields[key] = value
            continue
        elif token.startswith("cont"):
            key, value = "splits", _int_list(token[len("cont"):], "splits", token)
        elif token.startswith("seed"):
            key, value = "seed", _int_token(token, "seed", "seed", "seed")
        else:
            raise _bad("id", f"unknown token {token!r} in {text!r}")
        if key in seen:
            raise _bad(key, f"given twice (token {token!r}) in {text!r}")
        seen.add(key)
        fields[key] = value
    return Case(**fields)
