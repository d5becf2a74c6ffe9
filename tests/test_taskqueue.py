"""The run queue's rule for shared JIT kernels (harness/run/taskqueue.py, harness/ci/shards.py
``shared_compile_key``): two workers do not start cases that build one shape-keyed kernel at the same time while
their family has another case to give. On the H200 (session 8, a cold sixth of the qla family's L0 at -j 8), four
workers built one of FLA's TileLang backward kernels at once."""

from __future__ import annotations

from collections import Counter

from deltacheck.harness.ci.shards import compile_family, shared_compile_key
from deltacheck.harness.ci.tiers import select
from deltacheck.harness.run.taskqueue import TaskQueue


def _kda_backward_tasks():
    cases = [c for c in select(tier="L0", op="kda") if c.backward and c.io_dtype == "bf16" and c.K == c.V == 128]
    return cases, list(enumerate((c, "fla-dispatch") for c in cases))


def _first_worker(tasks):
    """A queue over ``tasks`` (one family), its family, the first worker's task and that task's shared key."""
    queue = TaskQueue(tasks)
    first = queue.take()
    return queue, compile_family(*tasks[0][1]), first, shared_compile_key(*first[1])


def test_the_key_is_the_shapes_fla_keys_its_tilelang_backward_on_and_only_for_backward_fla_dispatch_tasks():
    cases, _ = _kda_backward_tasks()
    case = cases[0]
    key = shared_compile_key(case, "fla-dispatch")
    packed = case.layout == "thd"
    heads = max(case.H, case.HK, case.HV)
    assert key == ("fla-dispatch", "kda", "bf16", 1 if packed else case.N, heads, 128, 128, packed)
    assert shared_compile_key(case, "fla") is None and shared_compile_key(case, "flashqla") is None
    forward = next(c for c in select(tier="L0", op="kda") if not c.backward)
    assert shared_compile_key(forward, "fla-dispatch") is None


def test_workers_starting_together_take_cases_of_distinct_keys_while_there_are_any():
    cases, tasks = _kda_backward_tasks()
    keys = {shared_compile_key(c, "fla-dispatch") for c in cases}
    assert len(keys) >= 2 and len(cases) > len(keys)  # L0 has cases that share a key: the situation to avoid
    queue = TaskQueue(tasks)
    started = [queue.take() for _ in range(8)]
    got = [shared_compile_key(*t[1]) for t in started]
    # as many distinct keys as there are (up to the workers), before any key is taken twice
    assert len(set(got[: len(keys)])) == min(8, len(keys))
    # past that, the extra workers spread over the keys: none is being built by a third worker while one has two
    assert max(Counter(got).values()) - min(Counter(got).values()) <= 1


def test_a_key_is_free_again_when_its_worker_finishes_the_case_and_every_task_is_handed_once():
    cases, tasks = _kda_backward_tasks()
    queue, family, first, key = _first_worker(tasks)
    others = [queue.take() for _ in range(len({shared_compile_key(c, "fla-dispatch") for c in cases}) - 1)]
    assert key not in {shared_compile_key(*t[1]) for t in others}
    # the first worker finishes: it takes another case of its own key (the kernel is in its process) while one is left
    nxt = queue.take(family, first[1][0].id)
    assert nxt is not None
    if sum(shared_compile_key(c, "fla-dispatch") == key for c in cases) > 1:
        assert shared_compile_key(*nxt[1]) == key
    handed = [first, *others, nxt]
    running = [t for t in others] + [nxt]
    while running:
        done = running.pop(0)
        t = queue.take(family, done[1][0].id)
        if t is not None:
            handed.append(t)
            running.append(t)
    assert sorted(i for i, _ in handed) == list(range(len(tasks)))
    assert not +queue._building  # every key released


def test_with_every_case_of_a_family_conflicting_a_worker_still_gets_one():
    """The rule orders cases; it never leaves a worker idle: when every case left shares the key being built, the
    family's first case is handed anyway."""
    cases, _ = _kda_backward_tasks()
    key = Counter(shared_compile_key(c, "fla-dispatch") for c in cases).most_common(1)[0][0]
    same = [c for c in cases if shared_compile_key(c, "fla-dispatch") == key]
    assert len(same) >= 2
    queue = TaskQueue(list(enumerate((c, "fla-dispatch") for c in same)))
    a, b = queue.take(), queue.take()
    assert a is not None and b is not None and a[1][0].id != b[1][0].id


def _gdn_shared_family_tasks():
    """GDN backward cases at K = V = 128 bf16: fla-dispatch and flashqla share FlashQLA's kernels, so a case's two
    tasks are one family, held by one worker back to back (the fla-dispatch one carries the shared key)."""
    cases = [c for c in select(tier="L0", op="gdn") if c.backward and c.io_dtype == "bf16" and c.K == c.V == 128]
    tasks = list(enumerate((c, s) for c in cases for s in ("fla-dispatch", "flashqla")))
    assert len({compile_family(*t[1]) for t in tasks}) == 1
    return cases, tasks


def test_a_key_stays_taken_until_the_worker_has_run_every_task_of_its_case():
    _, tasks = _gdn_shared_family_tasks()
    queue, family, first, key = _first_worker(tasks)
    assert key is not None and first[1][1] == "fla-dispatch"
    held = queue.take(family, first[1][0].id)  # the case's flashqla task: the key is still being built
    assert held[1] == (first[1][0], "flashqla") and queue._building[key] == 1
    nxt = queue.take(family, held[1][0].id)  # the case is done: released, and the next case marked
    assert queue._building[key] == (1 if shared_compile_key(*nxt[1]) == key else 0)


def test_a_crashed_workers_case_releases_its_key_when_the_fresh_worker_finishes_it():
    """The pool's crash path asks ``take(family, case_id)`` for the crashed case's held tasks: the key stays taken
    until that case is done, then it is released like any other."""
    _, tasks = _gdn_shared_family_tasks()
    queue, family, first, key = _first_worker(tasks)
    again = queue.take(family, first[1][0].id)  # the worker crashed on its first task: the fresh one gets the rest
    assert again[1] == (first[1][0], "flashqla") and queue._building[key] == 1
    rest = []
    while (t := queue.take(family, (rest[-1] if rest else again)[1][0].id)) is not None:
        rest.append(t)
    assert sorted(i for i, _ in [first, again, *rest]) == list(range(len(tasks)))
    assert not +queue._building
