"""The case id: a stable, readable name for a Case, and its parser.

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

import re

from . import serving_axes
from .fields import BETA_PROFILES, GATE_PROFILES, IO_DTYPES, LAYOUTS, STATE_DTYPES, TIERS, UNIFORM_GATE, field_error
from .support import OP_SUPPORT

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
        raise field_error(field_name, f"{position} token should be {prefix}<int>; got {token!r}")
    return int(match.group(1))


def _int_list(text: str, field_name: str, token: str) -> tuple[int, ...]:
    match = _LIST.fullmatch(text)
    if not match:
        raise field_error(field_name, f"expected a bracketed list like [0_63_1000]; got {token!r}")
    return tuple(int(x) for x in re.split(r"[_,]", match.group(1)))


def format_id(case) -> str:
    """The canonical id of ``case`` (the grammar above; optional tokens in the order shown)."""
    parts = [case.op, case.io_dtype, case.layout, f"N{case.N}"]
    if case.layout == "thd":
        parts.append("T[" + "_".join(map(str, case.seqlens)) + "]")
    else:
        parts.append(f"L{case.seqlens[0]}")
    parts += [f"H{case.H}/{case.HK}/{case.HV}", f"K{case.K}", f"V{case.V}", case.gate]
    if case.support.householder:
        parts.append(f"nh{case.num_householder}")
    if case.state_dtype != "fp32":
        parts.append(f"state_{case.state_dtype}")
    if case.beta_profile != "uniform":
        parts.append(f"beta_{case.beta_profile}")
    for attr, token in _FLAG_TOKENS:
        if attr == "gate_domain":
            if case.gate_domain == "linear":
                parts.append(token)
        elif getattr(case, attr):
            parts.append(token)
    if case.scale is not None:
        parts.append("scale" + _format_scale(case.scale))
    if case.magnitude is not None:
        parts.append("mag" + _format_scale(case.magnitude))
    if case.initial_state:
        parts.append("h0")
    if case.splits:
        parts.append("cont[" + "_".join(map(str, case.splits)) + "]")
    if case.backward:
        parts.append("bwd")
    parts += serving_axes.tokens(case)
    if case.seed:
        parts.append(f"seed{case.seed}")
    if case.tier != "L0":
        parts.append(case.tier)
    return "-".join(parts)


def parse_fields(text: str) -> dict:
    """The Case fields an id names (``spec.parse_id`` builds the Case). Errors name the field and the offending token."""
    if not isinstance(text, str) or not text.strip():
        raise field_error("id", f"expected a non-empty id string; got {text!r}")
    tokens = text.strip().split("-")
    if len(tokens) < 9:
        raise field_error("id", f"expected at least 9 '-'-separated tokens "
                                f"(op-io-layout-N-lengths-H-K-V-gate); got {len(tokens)} in {text!r}")
    op, io, layout, n_tok, len_tok, head_tok, k_tok, v_tok, gate, *rest = tokens
    fields: dict = {"op": op, "io_dtype": io, "layout": layout, "gate": gate}
    if op not in OP_SUPPORT:
        raise field_error("op", f"1st token should be one of {', '.join(OP_SUPPORT)}; got {op!r}")
    if io not in IO_DTYPES:
        raise field_error("io_dtype", f"2nd token should be one of {', '.join(IO_DTYPES)}; got {io!r}")
    if layout not in LAYOUTS:
        raise field_error("layout", f"3rd token should be one of {', '.join(LAYOUTS)}; got {layout!r}")
    n = _int_token(n_tok, "N", "seqlens", "4th")
    if layout == "thd":
        if not len_tok.startswith("T"):
            raise field_error("seqlens", f"5th token for thd should be T[<l1>_<l2>...]; got {len_tok!r}")
        seqlens = _int_list(len_tok[1:], "seqlens", len_tok)
        if len(seqlens) != n:
            raise field_error("seqlens", f"N{n} but {len(seqlens)} lengths in {len_tok!r}")
    else:
        length = _int_token(len_tok, "L", "seqlens", "5th (dense layout)")
        seqlens = (length,) * n
    fields["seqlens"] = seqlens
    head_match = re.fullmatch(rf"H{_INT}/{_INT}/{_INT}", head_tok)
    if not head_match:
        raise field_error("H", f"6th token should be H<H>/<HK>/<HV>; got {head_tok!r}")
    fields["H"], fields["HK"], fields["HV"] = (int(x) for x in head_match.groups())
    fields["K"] = _int_token(k_tok, "K", "K", "7th")
    fields["V"] = _int_token(v_tok, "V", "V", "8th")
    if gate not in GATE_PROFILES and not UNIFORM_GATE.fullmatch(gate):
        raise field_error("gate", f"9th token should be one of {', '.join(GATE_PROFILES)} or unif<x>; got {gate!r}")

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
                raise field_error("state_dtype", f"token {token!r}: expected state_<{'|'.join(STATE_DTYPES)}>")
        elif token.startswith("beta_"):
            key, value = "beta_profile", token[len("beta_"):]
            if value not in BETA_PROFILES:
                raise field_error("beta_profile", f"token {token!r}: expected beta_<{'|'.join(BETA_PROFILES)}>")
        elif token.startswith("scale") or token.startswith("mag"):
            key = "scale" if token.startswith("scale") else "magnitude"
            try:
                value = _parse_scale(token[len("scale" if key == "scale" else "mag"):])
            except ValueError:
                raise field_error(key, f"token {token!r}: expected {token[:3]}...<float>, e.g. scale0.125, mag1000.0") from None
        elif re.fullmatch(r"nh\d+", token):
            key, value = "num_householder", _int_token(token, "nh", "num_householder", "nh")
        elif (served := serving_axes.parse_token(token, field_error)) is not None:
            for key, value in served:
                if key in seen:
                    raise field_error(key, f"given twice (token {token!r}) in {text!r}")
                seen.add(key)
                fields[key] = value
            continue
        elif token.startswith("cont"):
            key, value = "splits", _int_list(token[len("cont"):], "splits", token)
        elif token.startswith("seed"):
            key, value = "seed", _int_token(token, "seed", "seed", "seed")
        else:
            raise field_error("id", f"unknown token {token!r} in {text!r}")
        if key in seen:
            raise field_error(key, f"given twice (token {token!r}) in {text!r}")
        seen.add(key)
        fields[key] = value
    return fields
