"""Covering arrays: rows of axis values that together contain every compatible pair of values (and every
compatible triple within chosen groups of axes), built greedily and deterministically from a seeded
``random.Random``. ``compatible`` says which (partial) rows a valid case can have; by default the op-level
rules of ``axes.compatible``, narrower for a backend's envelope.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable

from .axes import compatible


def row_interactions(values: dict[str, str], axes: dict[str, tuple[str, ...]], strength: int = 2) -> set:
    """The interactions (pairs by default) of `axes` that a concrete row of values contains."""
    names = [n for n in axes if n in values]
    return set(itertools.combinations([(n, values[n]) for n in names], strength))


def interactions(axes: dict[str, tuple[str, ...]], groups: list[tuple[str, ...]], strength: int,
                 compatible: Callable[[dict], bool] = compatible):
    """All compatible value combinations of `strength` axes drawn from each group, in a fixed order."""
    found = []
    for group in groups:
        for names in itertools.combinations(group, strength):
            for values in itertools.product(*(axes[n] for n in names)):
                if compatible(dict(zip(names, values))):
                    found.append(tuple(zip(names, values)))
    return list(dict.fromkeys(found))


def covering_rows(axes: dict[str, tuple[str, ...]], rng: random.Random,
                  triple_groups: tuple[tuple[str, ...], ...] = (), candidates: int = 16,
                  compatible: Callable[[dict], bool] = compatible, covered: Iterable = ()) -> list[dict]:
    """Greedy covering array: rows that together contain every compatible pair of axis values (and
    every compatible triple within each of `triple_groups`) not already in `covered` (interactions that cases
    made earlier contain, so a tier built from several arrays shares their rows).

    Each new row starts from the first still-uncovered interaction (so every row makes progress and
    the loop ends), then fills the other axes one by one with the value that covers the most new
    pairs; the best of `candidates` such rows is kept.
    """
    names = list(axes)
    index = {name: i for i, name in enumerate(names)}
    targets = interactions(axes, [tuple(names)], 2, compatible)
    targets += interactions(axes, [tuple(n for n in names if n in g) for g in triple_groups], 3, compatible)
    uncovered = set(targets) - set(covered)
    rows: list[dict] = []
    cursor = 0

    def new_interactions(row: dict) -> set:
        items = sorted(row.items(), key=lambda kv: index[kv[0]])
        hits = {pair for pair in itertools.combinations(items, 2) if pair in uncovered}
        if triple_groups:
            hits |= {t for t in itertools.combinations(items, 3) if t in uncovered}
        return hits

    while uncovered:
        while targets[cursor] not in uncovered:
            cursor += 1
        seed = dict(targets[cursor])
        best_row, best_hits = None, None
        for _ in range(candidates):
            row = dict(seed)
            order = [n for n in names if n not in row]
            rng.shuffle(order)
            for name in order:
                scored = []
                for value in axes[name]:
                    trial = {**row, name: value}
                    if not compatible(trial):
                        continue
                    score = 0
                    for other, other_value in row.items():
                        a, b = (other, other_value), (name, value)
                        pair = (a, b) if index[other] < index[name] else (b, a)
                        score += pair in uncovered
                    scored.append((score, value))
                if not scored:  # a dead end of this random order (possible only with look-ahead rules)
                    break
                top = max(score for score, _ in scored)
                row[name] = rng.choice([value for score, value in scored if score == top])
            if len(row) < len(names):
                continue
            hits = new_interactions(row)
            if best_hits is None or len(hits) > len(best_hits):
                best_row, best_hits = row, hits
        if best_row is None:
            raise ValueError(f"no complete row holds {seed}: the compatibility rules contradict the axes")
        rows.append(best_row)
        uncovered -= best_hits
    return rows


def joint_covering_rows(groups: list[tuple[dict[str, tuple[str, ...]], Callable[[dict], bool], Iterable]],
                        rng: random.Random, candidates: int = 8) -> list[dict]:
    """One greedy covering array for several envelopes at once: group ``g = (axes, compatible, covered)`` wants
    every pair of its axes that ``compatible`` allows and ``covered`` lacks. A row covers a pair *for each group
    whose envelope holds the whole row*, so rows inside several envelopes (a case cuDNN and FLA both serve) are
    preferred and shared, instead of each envelope getting an array of its own."""
    targets = [(g, pair) for g, (axes, ok, covered) in enumerate(groups)
               for pair in interactions(axes, [tuple(axes)], 2, ok) if pair not in set(covered)]
    uncovered = set(targets)
    names = list(dict.fromkeys(n for axes, _, _ in groups for n in axes))
    index = {name: i for i, name in enumerate(names)}
    rows: list[dict] = []
    cursor = 0

    def key(a, b):
        return (a, b) if index[a[0]] < index[b[0]] else (b, a)

    while uncovered:
        while targets[cursor] not in uncovered:
            cursor += 1
        seed_group, seed_pair = targets[cursor]
        best_row, best_hits = None, None
        for _ in range(candidates):
            row = dict(seed_pair)
            alive = [g for g, (_, ok, _) in enumerate(groups) if ok(row)]
            order = [n for n in names if n not in row]
            rng.shuffle(order)
            for name in order:
                scored = []
                values = dict.fromkeys(v for g in alive for v in groups[g][0].get(name, ()))
                for value in values:
                    trial = {**row, name: value}
                    still = [g for g in alive if groups[g][1](trial)]
                    if seed_group not in still:
                        continue
                    pairs = [key((other, other_value), (name, value)) for other, other_value in row.items()]
                    score = sum((g, pair) in uncovered for g in still for pair in pairs)
                    scored.append((score, len(still), value, still))
                if not scored:
                    break
                top = max((score, n) for score, n, _, _ in scored)
                picks = [(value, still) for score, n, value, still in scored if (score, n) == top]
                row[name], alive = rng.choice(picks)
            if len(row) < len(names):
                continue
            items = sorted(row.items(), key=lambda kv: index[kv[0]])
            hits = {(g, pair) for g in alive for pair in itertools.combinations(items, 2) if (g, pair) in uncovered}
            if best_hits is None or len(hits) > len(best_hits):
                best_row, best_hits = row, hits
        if best_row is None:
            raise ValueError(f"no complete row holds {seed_pair} for envelope group {seed_group}")
        rows.append(best_row)
        uncovered -= best_hits
    return rows
