"""Shards: a selection of cases split into ``n`` deterministic, disjoint parts whose union is the selection, for
CI matrices (``deltacheck list/run --shard i/n``, pytest's ``--dc-shard i/n``; docs/ci.md).

**The unit is a case.** Every task of a case (the case against each backend) goes to the case's shard, so
``list --shard`` can print case ids and ``run --shard`` runs exactly those cases.

**The family rule.** Cases are grouped by their compile family without the backend: (op, io dtype, K, V), which
is ``compile_family(case, spec)`` (the pool's queue groups by it too) minus its backend. The assignment reads the selected cases only, never
the backends, so ``list --shard i/n`` (no backend) and ``run --shard i/n --backend ...`` select the same cases;
and since a case family holds exactly the cases of one compile family per backend, keeping a case family in one
shard keeps every backend's compile family there too (each shard builds and autotunes it once).

**The cost model** (estimated nanoseconds of one CPU core, the references and the baseline included; fit in log
space to 286 cases timed against ``chunked``, all of L0 and a sample of L1: median estimate/measured 1.16, 80%
of cases within 0.53-1.68; docs/ci.md)::

    case   = CASE_NS + tokens x passes x (TOKEN_NS + STATE_NS x heads x K x V)
    passes = 1, or 5 with a backward (the references' autograd through every token step); GDP's tokens count
             its Householder steps; heads = max(H, HV), the heads the state lives at
    family = FAMILY_NS + the sum of its cases          (FAMILY_NS: one first compile, assumed, not measured)

**The balancing** is longest-processing-time-first over families: a family goes whole to the shard with the
least cost so far. A family is split only when it alone costs more than a shard's share (total / n), into
``ceil(cost x n / total)`` pieces (and into more only when there would otherwise be fewer pieces than shards,
so no shard is empty while the selection has n cases); a piece never goes to a shard holding another piece of its
family. Then a local search: while moving one piece out of the
dearest shard, or swapping it for one of another shard's, brings that shard's load down, do the best such move.
Ties are broken by family key, then shard number, and costs are integers, so the result never depends on dict
order, hashing or float rounding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from deltacheck.cases import Case

# Backends that build the very same JIT kernels for a case: FLA's dispatch hands a GDN call with K = V = 128 to
# FlashQLA with the arguments the `flashqla` adapter passes (fla/ops/gated_delta_rule/backends/flash_qla.py), and
# TileLang keys each kernel on its static arguments (heads, scale, dtypes, flags: nearly one set per case), so a
# case's FlashQLA kernels are compiled for one backend's task and found in that process's memory by the other's.
# In one family, the queue hands a case's two tasks to one worker back to back (a run lists its tasks case by
# case): the second runs warm instead of compiling again in another worker, or tracing every kernel again to look
# it up in TileLang's disk cache (its key hashes the traced program).
SHARED_KERNELS = {("fla-dispatch", "gdn"): "flash_qla", ("flashqla", "gdn"): "flash_qla"}


def compile_family(case, spec: str) -> tuple:
    """Tasks that share a kernel specialization: same backend (or group of backends building the same kernels,
    ``SHARED_KERNELS``), op, dtype and head dims. JIT backends (Triton, cuDNN's runtime compile, TileLang) build
    and autotune a kernel per family and process, so keeping a worker on one family saves compiles."""
    return (SHARED_KERNELS.get((spec, case.op), spec), case.op, case.io_dtype, case.K, case.V)


# Backends whose JIT kernels are keyed on shapes that many cases share, not once per case: FLA's TileLang backward
# pieces, which FLA's dispatch serves on Hopper (fla-core 0.6: fla/ops/common/backends/tilelang/chunk_bwd.py builds
# ``_build_chunk_bwd_dqkwg_kernel(B, H, HV, K, V, BT, BK, BV, NK, hD1, hD2, dtype, USE_G, USE_DW, STATE_V_FIRST,
# IS_VARLEN)``, fla/ops/kda/backends/tilelang/chunk_bwd_dqkg.py ``_build_kda_bwd_kernel(B, H, K, V, ...)``, a
# TileLang disk-cached kernel per distinct argument tuple). FlashQLA's own kernels take the scale and head counts:
# about one key per case, which keeping a case on one worker already covers.
SHAPE_KEYED_BACKWARD = frozenset({"fla-dispatch"})


def shared_compile_key(case, spec: str):
    """What a task's shared JIT kernel is keyed on, as far as the case shows it (None: no shared kernel known).
    For ``SHAPE_KEYED_BACKWARD`` backends' backward cases: the op, dtype, batch as the library sees it (1 for a
    packed batch), the most heads, head dims, packed or not. Where the case cannot tell what the library keys
    on, a wrong guess only changes which case a worker starts first, never what runs (``harness/run/taskqueue.py``)."""
    if spec not in SHAPE_KEYED_BACKWARD or not case.backward:
        return None
    packed = case.layout == "thd"
    # heads: the most of H, HK, HV, which the library's H (and HV) follow once an adapter has expanded grouped heads
    heads = max(case.H, case.HK, case.HV)
    return (spec, case.op, case.io_dtype, 1 if packed else case.N, heads, case.K, case.V, packed)


CASE_NS = 20_000_000  # inputs, setup, judging: a case's cost before any token
TOKEN_NS = 190_000  # one token step of the references, whatever its size (dispatch, Python)
STATE_NS = 20  # per state element (heads x K x V) a token step updates
BACKWARD_PASSES = 5  # a backward case's token steps, counting the forward's as 1
FAMILY_NS = 10_000_000_000  # a family's first compile and autotune (Triton, cuDNN's runtime compile): assumed


_SHARD = re.compile(r"([0-9]+)/([0-9]+)")


class ShardError(ValueError):
    """``--shard`` is not ``i/n`` with 1 <= i <= n; the message says what was given and what is expected."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/4"`` -> Shard(2, 4); anything else raises ``ShardError``."""
        match = _SHARD.fullmatch(str(text).strip())
        if match is None:
            raise ShardError(f"expected i/n, shard i of n shards (whole numbers, 1 <= i <= n), got {text!r}")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1:
            raise ShardError(f"expected i/n with at least n = 1 shard, got {text!r}")
        if not 1 <= index <= count:
            raise ShardError(f"expected i/n with 1 <= i <= n (shards are numbered from 1), got {text!r}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def case_family(case: Case) -> tuple:
    """The compile family of a case without the backend: (op, io dtype, K, V)."""
    return compile_family(case, "")[1:]


def case_cost(case: Case) -> int:
    """The estimated cost of one case (nanoseconds of one CPU core; the module docstring has the model)."""
    passes = BACKWARD_PASSES if case.backward else 1
    steps = case.total_tokens * case.num_householder
    return CASE_NS + steps * passes * (TOKEN_NS + STATE_NS * case.HO * case.K * case.V)


def selection_cost(cases: Sequence[Case]) -> int:
    """What running ``cases`` in one place costs: each family's compile once, plus every case."""
    return FAMILY_NS * len({case_family(c) for c in cases}) + sum(case_cost(c) for c in cases)


def _split(members: list[int], costs: list[int], ids: list[str], pieces: int) -> list[list[int]]:
    """``members`` (indices into the selection) in ``pieces`` parts of near-equal cost: dearest case first (by id on
    a tie, so the parts do not depend on the selection's order), each to the cheapest part so far (the
    lowest-numbered on a tie)."""
    parts: list[list[int]] = [[] for _ in range(pieces)]
    loads = [0] * pieces
    for i in sorted(members, key=lambda i: (-costs[i], ids[i], i)):
        p = min(range(pieces), key=lambda p: (loads[p], p))
        parts[p].append(i)
        loads[p] += costs[i]
    return parts


def shard_plan(cases: Sequence[Case], n: int) -> list[list[Case]]:
    """The ``n`` shards of ``cases``, each in the selection's order; shard i is ``shard_plan(...)[i - 1]``."""
    if n < 1:
        raise ShardError(f"the number of shards must be at least 1, got {n}")
    costs = [case_cost(c) for c in cases]
    ids = [c.id for c in cases]
    families: dict[tuple, list[int]] = {}
    for i, case in enumerate(cases):
        families.setdefault(case_family(case), []).append(i)
    keys = sorted(families)  # every decision below walks families in key order, never in dict order
    family_cost = {key: FAMILY_NS + sum(costs[i] for i in families[key]) for key in keys}
    total = sum(family_cost.values())
    # A family over a shard's share (cost > total / n, in integers) is split into ceil(cost * n / total) pieces.
    pieces = {key: min(len(families[key]), max(1, -(-family_cost[key] * n // total))) for key in keys}
    # Fewer pieces than shards would leave a shard empty: split the family with the dearest pieces once more.
    while sum(pieces.values()) < n:
        splittable = [key for key in keys if pieces[key] < len(families[key])]
        if not splittable:
            break  # fewer cases than shards: some shard must be empty
        key = min(splittable, key=lambda k: (-(family_cost[k] // pieces[k]), k))
        pieces[key] += 1
    work = []  # (cost, family key, piece number, members)
    for key in keys:
        for p, part in enumerate(_split(families[key], costs, ids, pieces[key])):
            work.append((FAMILY_NS + sum(costs[i] for i in part), key, p, part))
    work.sort(key=lambda w: (-w[0], w[1], w[2]))
    loads = [0] * n
    chosen: list[list[int]] = [[] for _ in range(n)]
    placed: list[set] = [set() for _ in range(n)]
    items: list[list[tuple]] = [[] for _ in range(n)]
    for item in work:
        # a piece goes where no other piece of its family is (a split family is spread, as the split meant)
        free = [s for s in range(n) if item[1] not in placed[s]] or range(n)
        s = min(free, key=lambda s: (loads[s], s))
        loads[s] += item[0] - (FAMILY_NS if item[1] in placed[s] else 0)  # two pieces in one shard compile once
        placed[s].add(item[1])
        items[s].append(item)
    _rebalance(items)
    for s, held in enumerate(items):
        for _, _, _, part in held:
            chosen[s] += part
    return [[cases[i] for i in sorted(part)] for part in chosen]


def _load(items: list[tuple]) -> int:
    """A shard's cost: its pieces, each family compiled once."""
    return sum(cost for cost, *_ in items) - FAMILY_NS * (len(items) - len({key for _, key, _, _ in items}))


def _rebalance(items: list[list[tuple]]) -> None:
    """Lower the dearest shard's load by moving one piece out of it, or swapping one with another shard's, while
    that helps (in place). Every piece costs at least a family's compile, so on selections of few families
    longest-first alone can leave one shard a whole piece above the rest (L0 in 8 shards: 1.10 max/mean). A piece
    never joins a shard that holds another piece of its family."""
    n = len(items)
    for _ in range(64 * n):  # each step lowers the dearest shard's load below what it was: a guard, not the stopping rule
        loads = [_load(held) for held in items]
        top = max(range(n), key=lambda s: (loads[s], -s))
        best = None  # (the larger of the two new loads, other shard, piece out of top, piece back or None)
        for other in range(n):
            if other == top:
                continue
            for a, piece in enumerate(items[top]):
                rest_top = items[top][:a] + items[top][a + 1:]
                options = [(None, items[other])] + [(b, items[other][:b] + items[other][b + 1:])
                                                    for b in range(len(items[other]))]
                for b, rest_other in options:
                    back = [] if b is None else [items[other][b]]
                    # a split family's pieces stay in different shards (the split rule holds after the search)
                    if piece[1] in {key for _, key, _, _ in rest_other} or (
                            back and back[0][1] in {key for _, key, _, _ in rest_top}):
                        continue
                    worse = max(_load(rest_top + back), _load(rest_other + [piece]))
                    if worse < loads[top] and (best is None or worse < best[0]):
                        best = (worse, other, a, b)
        if best is None:
            return
        _, other, a, b = best
        piece = items[top].pop(a)
        if b is not None:
            items[top].append(items[other].pop(b))
        items[other].append(piece)


def shard_cases(cases: Sequence[Case], shard: Shard) -> list[Case]:
    """The cases of ``shard`` (in the selection's order)."""
    return shard_plan(cases, shard.count)[shard.index - 1]


def pairs_elsewhere(required, shard: Sequence[Case], selection: Sequence[Case]) -> set[tuple[str, str]]:
    """The required (backend, op) pairs a shard leaves to the other shards: their op has cases in the selection
    and none in this shard. A shard judges required mode on the pairs it holds cases of; a pair whose op the
    whole selection lacks is judged (and fails) in every shard, as it would unsharded: never a silent pass."""
    here, anywhere = {c.op for c in shard}, {c.op for c in selection}
    return {(spec, op) for spec, op in required if op in anywhere and op not in here}
