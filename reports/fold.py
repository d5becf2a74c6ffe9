"""Folding runs of one machine made in several Python environments (``deltacheck merge --fold``).

Some backends cannot share one Python environment: FlashQLA needs apache-tvm-ffi < 0.1.13 while cuDNN FE 1.32
brings 0.1.15; jax-linear-attention pins jax == 0.11.2. One tier is then run once per backend family, each in
its own venv (``nox -s lanes``, docs/ci.md), and the family runs are folded into one run directory that reports
read as one.

A plain merge refuses runs whose environment fingerprints differ (reports/merge.py), rightly for shards of one
environment. A fold instead requires:

- the same **machine**: GPU (``cuda``, ``device_name``, ``capability``), ``python``, and the versions of what sits
  under every family (``MACHINE_VERSIONS``: torch, its CUDA and cuDNN, cudart, the driver) — the libraries above
  them may differ, which is the point;
- **disjoint backends**: each backend spec is in exactly one input's selection, so every result of a backend
  comes from exactly one environment, recorded per backend in the header as ``env_by_backend``.
"""

from __future__ import annotations

from typing import Any

MACHINE_FIELDS = ("cuda", "device_name", "capability", "python")
MACHINE_VERSIONS = ("torch", "cuda_runtime", "cudart", "driver", "torch_cudnn")


def machine(env: dict[str, Any]) -> dict[str, Any]:
    """What must agree between the environments of a fold."""
    versions = env.get("versions") or {}
    return {**{k: env.get(k) for k in MACHINE_FIELDS}, **{f"versions.{k}": versions.get(k) for k in MACHINE_VERSIONS}}


def fold_problems(runs) -> list[str]:
    """Why ``runs`` (reports.load.Run objects) cannot be folded; empty when they can."""
    problems = []
    first = machine(runs[0].env)
    for run in runs[1:]:
        other = machine(run.env)
        differ = [f"{k} {first[k]!r} vs {other[k]!r}" for k in first if first[k] != other[k]]
        if differ:
            problems.append(f"{run.label} ran on another machine than {runs[0].label}: {'; '.join(differ)}")
    owner: dict[str, str] = {}
    for run in runs:
        for spec in run.header.get("backends") or []:
            if spec in owner:
                problems.append(f"backend {spec!r} is in both {owner[spec]} and {run.label}: a fold takes each "
                                "backend from one environment (merge shards of one environment first)")
            owner.setdefault(spec, run.label)
    return problems


def env_by_backend(runs) -> dict[str, dict[str, Any]]:
    """Each backend spec -> the run it came from and that run's library versions (what differs in a fold)."""
    out = {}
    for run in runs:
        versions = {k: v for k, v in (run.env.get("versions") or {}).items() if k not in MACHINE_VERSIONS and v}
        for spec in run.header.get("backends") or []:
            out[spec] = {"run_id": run.label, "versions": versions}
    return out
