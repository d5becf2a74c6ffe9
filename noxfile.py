"""nox sessions for deltacheck. Each passes ``*session.posargs`` through to the tool it wraps."""

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# The CPU wheel: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
CPU_TORCH = "torch==2.13.0"


@nox.session
def tests(session):
    """The project's own tests on the CPU (what CI runs): `nox -s tests -- -k oracle`."""
    session.install(CPU_TORCH, "-e", ".[test,report]")
    session.run("python", "-m", "pytest", "-n", "2", *session.posargs)


@nox.session
def verify(session):
    """The main job on the CPU: the reference verifying itself, fused backends reported with reasons."""
    session.install(CPU_TORCH, "-e", ".[report]")
    session.run("deltacheck", "verify", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session):
    """The case matrix on this machine's GPU, in the current environment (keeps its CUDA torch):
    `nox -s gpu -- --tier L0 --backend cudnn --backend fla`."""
    session.run("python", "-m", "deltacheck", "run", *session.posargs)


@nox.session(venv_backend="none")
def bench(session):
    """Chunked reference vs token oracle (CPU) or vs FLA's fused kernels (GPU), printed side by side."""
    session.run("python", "bench/chunked.py", *session.posargs)


@nox.session
def lint(session):
    """Static checks: ruff over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".", *session.posargs)
