"""Backend families: backends that must run in a Python environment of their own, and the lane that runs one
tier across all of them (``nox -s lanes``; docs/ci.md "Backends that cannot share an environment").

Why families (each pin read from the library's wheel METADATA, or as issue 25 measured it):

- ``qla``: flash-qla 0.1.3 needs apache-tvm-ffi < 0.1.13 and z3-solver < 4.15.5 (issue 25), while
  nvidia-cudnn-frontend 1.32 brings apache-tvm-ffi 0.1.15: FlashQLA and cuDNN FE cannot share one environment;
- ``nvidia``: cuDNN FE 1.32 (and TE on it) and FlashInfer 0.7.2, which needs apache-tvm-ffi >= 0.1.11, < 0.2
  and nvidia-cudnn-frontend >= 1.31 (its METADATA) — compatible with FE's 0.1.15;
- ``jax``: jax-linear-attention 0.1.0 pins jax == 0.11.2 (its METADATA), kept apart from the torch families so
  its JAX never moves theirs;
- ``vllm``: vLLM 0.33 pins torch == 2.14.0 (its METADATA) while deltacheck uses only its FLA copy and
  ``_flashkda_C`` (torch, triton and einops): installed ``--no-deps`` in a venv of its own, so the machine's torch
  stays and nothing else sees vLLM's modules (``VLLM_TRITON_FORCE_FIRST_CONFIG``, if set, replaces triton's
  ``Autotuner.run`` in the whole process when vLLM's ``triton_utils`` is imported: FLA's kernels beside it
  would skip their autotune too);
- ``fla``: FLA's own Triton path, beside any family.

Each family runs ``deltacheck run`` in its own venv (``--system-site-packages``: the machine's CUDA torch stays),
and ``deltacheck merge --fold`` folds the runs into one (reports/fold.py: same machine, disjoint backends).
A backend this checkout does not register (another branch's adapter) is left out of its family's run, by name.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    backends: tuple[str, ...]
    requirements: tuple[str, ...]  # pip requirement specifiers installed into the family's venv
    why: str
    no_deps: bool = False  # install the requirements with --no-deps (their pins would replace the machine's torch)


FAMILIES = (
    Family("nvidia", ("cudnn", "te", "flashinfer", "flashinfer-decode"),
           ("nvidia-cudnn-frontend==1.32.0", "flashinfer-python==0.7.2.post1", "nvidia-cutlass-dsl[cu13]>=4.7"),
           "cuDNN FE 1.32 brings apache-tvm-ffi 0.1.15; FlashInfer and TE sit on the same FE"),
    Family("qla", ("flashqla", "fla-dispatch"),
           ("flash-qla==0.1.3", "apache-tvm-ffi<0.1.13", "z3-solver<4.15.5", "fla-core==0.6.0"),
           "flash-qla needs apache-tvm-ffi < 0.1.13"),
    Family("jax", ("jax",), ("jax-linear-attention==0.1.0", "jax[cuda13]==0.11.2"),
           "jax-linear-attention pins jax == 0.11.2"),
    Family("vllm", ("vllm-fla", "vllm-fla-recurrent", "flashkda"), ("vllm==0.33.0", "einops"),
           "vLLM 0.33 pins torch == 2.14.0: --no-deps keeps the machine's torch", no_deps=True),
    Family("fla", ("fla", "fla-recurrent"), ("fla-core==0.6.0",), "FLA's Triton path, any environment"),
)


def family(name: str) -> Family:
    for fam in FAMILIES:
        if fam.name == name:
            return fam
    raise KeyError(f"no backend family {name!r}; families: {', '.join(f.name for f in FAMILIES)}")


def lane_commands(names, registered, *, tier: str = "L0", out: str = "runs/lanes", wheels: str | None = None,
                  extra: tuple[str, ...] = ()) -> list[list[str]]:
    """The lane as argv lists, in order: per family a venv, its requirements, ``deltacheck run`` into
    ``OUT/<family>``; then the fold of every family's run into ``OUT/folded``. ``registered``: the backend names
    this checkout knows (a family's unregistered backends are left out; a family left with none is skipped)."""
    commands: list[list[str]] = []
    runs = []
    for name in names:
        fam = family(name)
        backends = [b for b in fam.backends if b in registered]
        if not backends:
            continue
        venv = f".nox/lane-{fam.name}"
        python = f"{venv}/bin/python"
        offline = ["--no-index", "--find-links", wheels] if wheels else []
        commands.append(["python", "-m", "venv", "--clear", "--system-site-packages", venv])
        no_deps = ["--no-deps"] if fam.no_deps else []
        commands.append([python, "-m", "pip", "install", *offline, *no_deps, *fam.requirements])
        commands.append([python, "-m", "pip", "install", "--no-deps", "-e", "."])
        argv = [python, "-m", "deltacheck", "run", "--tier", tier, "--out", f"{out}/{fam.name}", *extra]
        for backend in backends:
            argv += ["--backend", backend]
        commands.append(argv)
        runs.append(f"{out}/{fam.name}/LATEST")
    if len(runs) > 1:
        commands.append(["python", "-m", "deltacheck", "merge", "--fold", *runs, "--out", f"{out}/folded", "--report"])
    return commands


def shell(commands: list[list[str]]) -> str:
    """The lane as shell lines (docs/ci.md prints these); ``LATEST`` stands for the run directory ``run`` made."""
    return "\n".join(" ".join(shlex.quote(part) for part in argv) for argv in commands)
