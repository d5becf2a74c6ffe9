"""How many torch threads each process of a run gets: ``--threads``, ``OMP_NUM_THREADS``, or a share of the cores
not already busy (``pool`` sets it for its workers, ``run`` and ``env`` report it)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS says; else every core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def torch_threads(jobs: int = 1, explicit: int | None = None, environ=None, *, cores: int | None = None,
                  load: float | None = None) -> tuple[int, str]:
    """(torch threads for each process of a run, how that was decided). ``--threads N`` first, then an explicit
    ``OMP_NUM_THREADS``; otherwise each of the ``jobs`` processes gets its share of the cores not already busy
    (the 1-minute load average, read before the run starts): torch's default of a thread per core oversubscribes
    a shared CI machine, and spinning OpenMP threads then run many times slower than one thread each."""
    environ = os.environ if environ is None else environ
    if explicit is not None:
        return explicit, "--threads"
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    free = min(cores, max(1, cores - int(load)))
    n = max(1, free // max(1, jobs))
    return n, (f"{cores} core(s), load {load:.1f}, {jobs} process(es): a share of the free cores each "
               "(--threads N or OMP_NUM_THREADS to set it)")
