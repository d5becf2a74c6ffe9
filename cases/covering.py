"""Covering arrays: rows of axis values that together contain every compatible pair of values (and every
compatible triple within chosen groups of axes), built greedily and deterministically from a seeded
``random.Random``. ``compatible`` says which (partial) rows a valid case can have; by default the op-level
rules of ``axes.compatible``, narrower for a backend's envelope.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from .axes import compatible


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
                  compatible: Callable[[dict], bool] = compatible) -> list[dict]:
    """Greedy covering array: rows that together contain every compatible pair of axis values (and
    every compatible triple within each of `triple_groups`).

    Each new row starts from the first still-uncovered interaction (so every row makes progress and
    the loop ends), then fills the other axes one by one with the value that covers the most new
    pairs; the best of `candidates` such rows is kept.
    """
    names = list(axes)
    index = {name: i for i, name in enumerate(names)}
    targets = interactions(axes, [tuple(names)], 2, compatible)
    targets += interactions(axes, [tuple(n for n in names if n in g) for g in triple_groups], 3, compatible)
    uncovered = set(targets)
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
                top = max(score for score, _ in scored)
                row[name] = rng.choice([value for score, value in scored if score == top])
            hits = new_interactions(row)
            if best_hits is None or len(hits) > len(best_hits):
                best_row, best_hits = row, hits
        rows.append(best_row)
        uncovered -= best_hits
    return rows
