"""The run queue's rule for shared JIT kernels (harness/run/taskqueue.py, harness/ci/shards.py
``shared_compile_key``): two workers do not start cases that build one shape-keyed kernel at the same time while
their family has another case to give. On the H200 (session 8, a cold sixth of the qla family's L0 at -j 8), four
workers built one of FLA's TileLang backward kernels at once."""

from __future__ import annotations

from collections import Counter

from deltacheck.harness.ci.tiers import select
from deltacheck.harness.ci.shards import compile_family, shared_compile_key
from deltacheck.harness.run.taskqueue import TaskQueue


def _kda_backward_tasks():
    cases = [c for c in select(tier="L0", op="kda") if c.backward and c.io_dtype == "bf16" and c.K == c.V == 128]
    return cases, list(enumerate((c, "fla-dispatch") for c in cases))


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
    assert len(set(got)) == min(8, len(keys))
    assert all(got.index(k) < len(keys) for k in got[: len(keys)])


def test_a_key_is_free_again_when_its_worker_finishes_the_case_and_every_task_is_handed_once():
    cases, tasks = _kda_backward_tasks()
    queue = TaskQueue(tasks)
    family = compile_family(*tasks[0][1])
    first = queue.take()
    key = shared_compile_key(*first[1])
    others = [queue.take() for _ in range(len({shared_compile_key(c, "fla-dispatch") for c in cases}) - 1)]
    assert key not in {shared_compile_key(*t[1]) for t in others}
    # the first worker finishes: the next worker to ask may now start a case with the first one's key
    nxt = queue.take(family, first[1][0].id)
    assert nxt is not None
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
