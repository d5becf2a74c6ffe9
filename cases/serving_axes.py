"""The serving axes of a Case (issue 26): how a serving stack calls the kernel, as id tokens.

A Case with all of these at their defaults is a training-style call (its id is unchanged). The tokens, in
canonical id order, come after ``bwd`` and before ``seed``:

    pool<n>           the states live in a pool of n rows (n > N: pool size > batch); sequence i reads row
                      ``indices[i]`` and writes its final state back in place. The rows are a repeat-free
                      permutation drawn from the case's seed (harness/judge/serving_inputs.py), never 0..N-1 in order.
    null<k>           k of the N sequences carry the backend's null slot (vLLM: an id <= 0, SGLang: -1): zero
                      start, nothing written. Needs pool; a backend without a null slot (cuDNN, FLA 0.6) declines.
    chain<n>          a chain of n decode steps (T = 1 each) through the pool, judged against one prefill over
                      the same n tokens. Needs pool and every sequence of length n.
    spec<k>[a_b_..]   speculative decoding: k draft tokens after the last verified one (every sequence has
                      k + 1 tokens), per-token in-place states ``[N, k+1]`` and per sequence the accepted draft
                      count a_i in 0..k (the kernel's ``num_accepted_tokens`` is a_i + 1). Needs pool; the pool
                      then holds N*(k+1) addressed rows plus spares.
    ckpt<n>           cuDNN's ``checkpoint_every_n_tokens = n``: the state series every n tokens strictly before
                      each sequence end. Not combinable with pool (cuDNN FE 1.32 ``ops/gdn.py`` refuses
                      state_indices with checkpoints); thd only.

Serving calls are forward-only: none of these combines with ``bwd``, and ``pool`` replaces ``h0``.
This module holds the validation, the tokens and their parser; ``spec.Case`` calls it.
"""

from __future__ import annotations

import re

# Case field -> default; the order is the canonical id order.
SERVING_FIELDS = {"pool": 0, "nulls": 0, "chain": 0, "draft": 0, "accepted": (), "checkpoint_every": 0}
_INT = r"(0|[1-9][0-9]*)"
_SPEC = re.compile(rf"spec{_INT}\[(\d+(?:[_,]\d+)*)\]")


def is_serving(case) -> bool:
    """True when any serving axis is set."""
    return any(getattr(case, name) != default for name, default in SERVING_FIELDS.items())


def pool_rows_needed(case) -> int:
    """The fewest pool rows the case's addressed rows need, plus one spare row no sequence addresses and one row
    for a null slot at id 0 (vLLM's convention reserves it), so every convention fits and pool integrity always
    has a row to watch."""
    per_sequence = case.draft + 1 if case.draft else 1
    return (case.N - case.nulls) * per_sequence + 2


def validate(case, bad) -> None:
    """Raise ``bad(field, message)`` for an invalid combination of the serving axes."""
    for name in ("pool", "nulls", "chain", "draft", "checkpoint_every"):
        value = getattr(case, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(name, f"expected an int >= 0; got {value!r}")
    if not isinstance(case.accepted, tuple) or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in case.accepted):
        raise bad("accepted", f"expected a tuple of ints; got {case.accepted!r}")
    if not is_serving(case):
        return
    if case.backward:
        raise bad("backward", "serving calls are forward-only (pool/chain/spec/ckpt never combine with bwd)")
    if case.layout != "thd":
        raise bad("layout", f"serving cases are packed thd (cu_seqlens), as serving stacks call; got {case.layout!r}")
    if case.splits:
        raise bad("splits", "a serving case has no continuation splits (chain is the serving continuation)")
    if case.checkpoint_every and case.pool:
        raise bad("checkpoint_every", "ckpt does not combine with pool (cuDNN FE 1.32 refuses state_indices "
                                      "with checkpoint_every_n_tokens)")
    if case.checkpoint_every and case.num_householder > 1 and case.checkpoint_every % case.num_householder:
        raise bad("checkpoint_every", f"gdp counts sub-tokens: ckpt{case.checkpoint_every} must be a multiple "
                                      f"of nh{case.num_householder} (a state inside a token is not exposed)")
    needs_pool = [name for name in ("nulls", "chain", "draft") if getattr(case, name)]
    if needs_pool and not case.pool:
        raise bad(needs_pool[0], f"{needs_pool[0]} needs a pool (pool<n>)")
    if case.pool:
        if case.initial_state:
            raise bad("initial_state", "pool replaces h0 (the initial states are the pool's rows)")
        if case.nulls > case.N:
            raise bad("nulls", f"{case.nulls} null sequences but only N={case.N}")
        if case.pool < pool_rows_needed(case):
            raise bad("pool", f"pool{case.pool} is too small: N={case.N} with {case.nulls} null(s)"
                              f"{f' and {case.draft + 1} slots each' if case.draft else ''} needs >= "
                              f"{pool_rows_needed(case)} rows (one spare row and a null row 0)")
    if case.chain and set(case.seqlens) != {case.chain}:
        raise bad("chain", f"chain{case.chain} needs every sequence of length {case.chain}; got {case.seqlens!r}")
    if case.chain and case.draft:
        raise bad("chain", "chain and spec are separate checks; give one")
    if case.draft or case.accepted:
        if not case.draft:
            raise bad("accepted", "accepted counts need spec<k>")
        if set(case.seqlens) != {case.draft + 1}:
            raise bad("draft", f"spec{case.draft} verifies the last token and {case.draft} drafts: every sequence "
                               f"has {case.draft + 1} tokens; got {case.seqlens!r}")
        if len(case.accepted) != case.N or not all(0 <= a <= case.draft for a in case.accepted):
            raise bad("accepted", f"expected N={case.N} accepted counts in 0..{case.draft}; got {case.accepted!r}")


def tokens(case) -> list[str]:
    """The serving tokens of ``case.id``, in canonical order."""
    out = []
    if case.pool:
        out.append(f"pool{case.pool}")
    if case.nulls:
        out.append(f"null{case.nulls}")
    if case.chain:
        out.append(f"chain{case.chain}")
    if case.draft:
        out.append(f"spec{case.draft}[" + "_".join(map(str, case.accepted)) + "]")
    if case.checkpoint_every:
        out.append(f"ckpt{case.checkpoint_every}")
    return out


def parse_token(token: str, bad):
    """``[(field, value), ...]`` for a serving token, or None when ``token`` is not one."""
    for prefix, name in (("pool", "pool"), ("null", "nulls"), ("chain", "chain"), ("ckpt", "checkpoint_every")):
        if token.startswith(prefix) and re.fullmatch(rf"{prefix}\d+", token):
            match = re.fullmatch(rf"{prefix}{_INT}", token)
            if not match:
                raise bad(name, f"token {token!r}: expected {prefix}<int> without leading zeros")
            return [(name, int(match.group(1)))]
    if token.startswith("spec"):
        match = _SPEC.fullmatch(token)
        if not match:
            raise bad("draft", f"token {token!r}: expected spec<k>[<a1>_<a2>...] (accepted draft counts)")
        return [("draft", int(match.group(1))),
                ("accepted", tuple(int(x) for x in re.split(r"[_,]", match.group(2))))]
    return None
