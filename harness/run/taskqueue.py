"""The run's queue of case x backend tasks, shared by the pool's workers (``harness/run/pool.py``).

Its rules exist to keep JIT compiles few: a worker stays on one compile family (``shards.compile_family``), one
case's tasks of a family go to one worker, and two workers do not start cases that build the same shared JIT
kernel at the same time (``shards.shared_compile_key``) while the family has another case to give.
"""

from __future__ import annotations

import threading
from collections import Counter, deque

from ..ci.shards import compile_family, shared_compile_key


class TaskQueue:
    """The run's tasks, handed to workers one at a time (thread-safe).

    A worker gets the next task of the compile family it last ran while that family has tasks left (its
    kernels are built and autotuned in that process); otherwise it starts the family that the fewest
    workers are on, most tasks left first. So each family is compiled by as few processes as possible,
    and the work balances itself however long each family takes — no family is stuck behind a slow one.

    Within a family one case's tasks go to one worker, back to back (``take(family, case_id)`` hands it the rest):
    backends sharing kernels (``shards.SHARED_KERNELS``) would else build a case's kernels in two workers at once
    when two share a family (on the H200: 17 of 83 TileLang compiles, 303 s, at -j 8).

    A case that builds a kernel other cases share (``shards.shared_compile_key``: FLA's TileLang backward pieces,
    keyed on shapes, not on the case) is not started while another worker is on a case with the same key, if the
    family has a case without that conflict (else the one whose key the fewest are building): the later one then
    finds the kernel in TileLang's disk cache. A worker that finished such a case takes another case of its key
    first (the kernel is in its process). On the H200 (session 8, a cold sixth of the qla family's L0 at -j 8) four
    keys were built more than once, one by four workers at once: 6 extra compiles, 163 of 711 worker-seconds."""

    def __init__(self, tasks: list, pairs=None) -> None:
        self.pairs = dict(pairs or {})  # the run's availability verdicts, handed to every worker with its config
        self._lock = threading.Lock()
        by_case: dict[tuple, dict[str, deque]] = {}  # family -> case id -> its tasks, in the order given
        for task in tasks:
            by_case.setdefault(compile_family(*task[1]), {}).setdefault(task[1][0].id, deque()).append(task)
        self._left = {family: deque(cases.values()) for family, cases in by_case.items()}  # per family, per case
        self._active: Counter = Counter()
        self._held: dict[tuple, deque] = {}  # (family, case id) -> the case's tasks its worker has still to run
        self._keys = {(family, cid): _case_key(case)  # each case's shared compile key, or None
                      for family, cases in by_case.items() for cid, case in cases.items()}
        self._building: Counter = Counter()  # shared compile keys of the cases workers are on

    def take(self, previous: tuple | None = None, case_id: str | None = None):
        """The next task for a worker whose last task was of family ``previous``, case ``case_id``; else None."""
        with self._lock:
            if previous is not None:
                self._active[previous] -= 1
            family = previous
            case = self._held.pop((previous, case_id), None)
            if not case:
                built = self._release(previous, case_id)  # that worker is done with its case
                if previous is None or not self._left.get(previous):
                    open_families = [f for f, q in self._left.items() if q]
                    if not open_families:
                        return None
                    family = min(open_families, key=lambda f: (self._active[f], -sum(map(len, self._left[f]))))
                case = self._next_case(family, built)
            self._active[family] += 1
            task = case.popleft()
            if case:  # the case's other tasks in this family: this worker's, next
                self._held[(family, task[1][0].id)] = case
            return task

    def _next_case(self, family: tuple, built=None) -> deque:
        """The family's case to start next, marked as being built: first one whose shared compile key is ``built``
        (the asking worker's last case's: that kernel is in its process), then one with no key or a key nobody is
        building, then the one whose key the fewest workers are building; the family's order breaks ties."""
        cases = self._left[family]

        def rank(i):
            key = self._keys[(family, cases[i][0][1][0].id)]
            if key is not None and key == built:
                return (0, i)
            return (1 if key is None else 1 + self._building[key], i)

        pick = min(range(len(cases)), key=rank)
        case = cases[pick]
        del cases[pick]
        if (key := self._keys[(family, case[0][1][0].id)]) is not None:
            self._building[key] += 1
        return case

    def _release(self, family, case_id):
        """Mark the case a worker finished (each case once: a worker asks with it only after its last task) as no
        longer being built; its key (None if it had none, or for a worker's first ask)."""
        key = self._keys.get((family, case_id))
        if key is not None:
            self._building[key] -= 1
        return key


def _case_key(case: deque):
    """The shared compile key of a case's tasks in one family (the first task that has one), or None."""
    return next((key for _, (c, spec) in case if (key := shared_compile_key(c, spec)) is not None), None)
