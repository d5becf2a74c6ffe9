"""Run directories and the provenance that goes into a run's header.

The runner calls ``new_run_dir()`` for a fresh, never-reused directory and ``provenance()`` for the
``commit`` / ``dirty`` fields of the ``run`` record.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

# The repository root is the package root (pyproject maps "deltacheck" to "."), so this file's
# grandparent is the checkout whose commit describes the code that ran.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def new_run_dir(root: str | Path = "runs") -> Path:
    """Create and return a new run directory under ``root``: ``runs/20261130-051500-ab12cd/``.

    The name is the UTC start time plus a random suffix; an existing directory is never reused, so two
    runs started in the same second (or on two machines writing to one share) never mix records."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for _ in range(100):
        candidate = root / f"{stamp}-{secrets.token_hex(3)}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"could not find an unused run directory name under {root}")


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None  # git not installed, cwd gone, or git hung
    return proc.stdout if proc.returncode == 0 else None


def provenance(repo: str | Path | None = None) -> dict[str, object]:
    """``{"commit": sha, "dirty": bool}`` of the deltacheck checkout (or ``repo``).

    Both are None when it is not a git checkout (an installed wheel, no git on the machine): a run
    never fails for lack of provenance. ``dirty`` counts modified and untracked-but-not-ignored files."""
    where = Path(repo) if repo is not None else PACKAGE_ROOT
    absent: dict[str, object] = {"commit": None, "dirty": None}
    if repo is None and "site-packages" in where.parts:
        return absent  # an installed copy; any enclosing repository is not deltacheck's
    if not where.is_dir():
        return absent
    top = _git(["rev-parse", "--show-toplevel"], where)
    if top is None or (repo is None and Path(top.strip()).resolve() != where):
        return absent
    commit = _git(["rev-parse", "HEAD"], where)
    status = _git(["status", "--porcelain"], where)
    return {
        "commit": commit.strip() if commit else None,  # None: a repository without commits yet
        "dirty": bool(status.strip()) if status is not None else None,
    }
