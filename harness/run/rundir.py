"""A run directory's lifecycle: a fresh, never-reused directory (``new_run_dir``), its header and availability
records (``open_run``), reopening an interrupted run (``resume_run``), and the provenance (commit, dirty) a
header records. The format itself is described in docs/run-directory.md.

``deltacheck run`` and the pytest plugin's ``--dc-out`` both open their run directories here, so both write
the same records.
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from deltacheck import __version__

from ..backends.base import Verdict
from ..machine.availability import availability_records, backend_versions
from ..records.results import SCHEMA, Result, ResultStream, fingerprint, fold_parts, read_records, utc_now

# The repository root is the package root (pyproject maps "deltacheck" to "."), so this file's
# great-grandparent (harness/run/) is the checkout whose commit describes the code that ran.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class RunDirError(ValueError):
    """``--out`` cannot hold a new run directory; the message names the path and why."""


def new_run_dir(root: str | Path = "runs") -> Path:
    """Create and return a new run directory under ``root``: ``runs/20261130-051500-ab12cd/``.

    The name is the UTC start time plus a random suffix; an existing directory is never reused, so two
    runs started in the same second (or on two machines writing to one share) never mix records. Raises
    ``RunDirError`` when ``root`` cannot hold one (a file, a read-only directory)."""
    root = Path(root)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    if root.exists() and not root.is_dir():
        raise RunDirError(f"cannot create a run directory under {root}: it is a file, not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            candidate = root / f"{stamp}-{secrets.token_hex(3)}"
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate
    except OSError as exc:  # a file in the way, a read-only or missing mount
        raise RunDirError(f"cannot create a run directory under {root}: {exc.strerror or exc}") from None
    raise RunDirError(f"could not find an unused run directory name under {root}")


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


def open_run(results_path: Path, backend_specs: list[str], env, required, argv: list[str],
             extra: dict | None = None) -> dict[tuple[str, str], Verdict]:
    """Write a run's header and one availability record per backend x op; return their verdicts.
    Shared by `deltacheck run` and the pytest plugin's ``--dc-out``, so both runs read the same."""
    gates = availability_records(backend_specs, env, required)
    with ResultStream(results_path) as out:
        out.write({"kind": "run", "schema": SCHEMA, "deltacheck": __version__, "started": utc_now(), "argv": argv,
                   "env": env.to_dict(), "run_id": results_path.parent.name, "backends": backend_specs,
                   "required": sorted(":".join(p) for p in required),
                   "backend_versions": backend_versions(backend_specs), **(extra or {}), **provenance()})
        for _, record in gates.values():
            out.write(record)
    return {pair: verdict for pair, (verdict, _) in gates.items()}


class ResumeError(ValueError):
    """A run directory that ``--resume`` cannot continue; the message says why and what to do."""


def selection_difference(header: dict, backend_specs: list[str], extra: dict, case_ids: list[str] | None) -> str:
    """What this selection changes against the one a run's header records ("" when nothing): other cases,
    backends or options would append another run's results to it. What the header does not record (a run of
    an older deltacheck, a pytest run) is not compared."""
    def listed(items: list[str]) -> str:
        return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")

    differences = []
    if isinstance(header.get("case_ids"), list) and case_ids is not None:
        theirs, ours = set(header["case_ids"]), set(case_ids)
        if theirs != ours:
            only_ours = [c for c in case_ids if c not in theirs]
            only_theirs = [c for c in header["case_ids"] if c not in ours]
            differences.append("cases: " + "; ".join(
                ([f"{len(only_ours)} selected that the run does not hold ({listed(only_ours)})"] if only_ours else [])
                + ([f"{len(only_theirs)} of the run's not selected ({listed(only_theirs)})"] if only_theirs else [])))
    elif isinstance(header.get("cases"), int) and header["cases"] != extra.get("cases"):
        differences.append(f"cases: {extra.get('cases')} selected, the run holds {header['cases']}")
    if isinstance(header.get("backends"), list) and set(header["backends"]) != set(backend_specs):
        differences.append(f"backends: {', '.join(backend_specs)} (the run's: {', '.join(header['backends'])})")
    theirs_opts = header.get("options")
    ours_opts = json.loads(json.dumps(extra.get("options") or {}))  # as the header holds it (tuples are lists)
    if isinstance(theirs_opts, dict):
        # which known-issues files classify failures is not a selection: a resume may bring a newer table; nor is
        # how many torch threads a process used
        changed = [f"{k} {ours_opts[k]!r} (the run's: {theirs_opts[k]!r})" for k in sorted(ours_opts)
                   if k in theirs_opts and theirs_opts[k] != ours_opts[k] and k not in ("known_issues", "threads")]
        if changed:
            differences.append("options: " + ", ".join(changed))
    return "; ".join(differences)


def resume_run(run_dir: Path, backend_specs: list[str], env, required, argv: list[str], extra: dict,
               case_ids: list[str] | None = None,
               ) -> tuple[dict[tuple[str, str], Verdict], dict[tuple[str, str], list[Result]]]:
    """Reopen an interrupted run: fold worker files it left, check that this is its environment and its
    selection (``case_ids``, ``backend_specs`` and ``extra["options"]``), append a ``resume`` record (and
    availability records for backends it did not have); return the verdicts and the results it already
    holds, by (case id, backend)."""
    results_path = run_dir / "results.jsonl"
    if not results_path.is_file():
        raise ResumeError(f"--resume {run_dir}: not a run directory (no results.jsonl)")
    fold_parts(results_path, sorted(run_dir.glob("results.*w*.jsonl")))
    header, gated, judged = None, set(), defaultdict(dict)
    for _, rec, _ in read_records(results_path):
        if rec is None:
            continue
        if rec["kind"] == "run" and header is None:
            header = rec
        elif rec["kind"] == "gate":
            gated.add((rec.get("backend"), rec.get("op")))
        elif rec["kind"] == "result":
            result = Result(**{k: v for k, v in rec.items() if k != "kind"})
            judged[(result.case, result.backend)][result.check] = result  # a later record wins
    if header is None:
        raise ResumeError(f"--resume {run_dir}: results.jsonl has no run header")
    if header.get("schema") != SCHEMA:
        raise ResumeError(f"--resume {run_dir}: written with results schema {header.get('schema')!r}, "
                          f"this deltacheck writes {SCHEMA}; start a new run")
    theirs, ours = header.get("env") or {}, env.to_dict()
    if fingerprint(theirs) != fingerprint(ours):
        def describe(e):
            return f"{e.get('device_name') or 'no GPU'}, " + ", ".join(
                f"{k} {v}" for k, v in sorted((e.get("versions") or {}).items()) if v)
        raise ResumeError(f"--resume {run_dir}: it ran in another environment ({describe(theirs)}) than this one "
                          f"({describe(ours)}); resume it there, or start a new run and `deltacheck compare` the two")
    differs = selection_difference(header, backend_specs, extra, case_ids)
    if differs:
        argv_then = [str(a) for a in header.get("argv") or []]
        then = f" (`deltacheck {shlex.join(argv_then)}`)" if argv_then[:1] in (["run"], ["verify"]) else ""
        raise ResumeError(f"--resume {run_dir}: this selection differs from the run's ({differs}); resume it with "
                          f"the selection it ran{then}, or start a new run")
    gates = availability_records(backend_specs, env, required)
    try:
        with ResultStream(results_path) as out:
            out.write({"kind": "resume", "started": utc_now(), "argv": argv, "env": ours,
                       "backends": backend_specs, **extra, **provenance()})
            for pair, (_, record) in gates.items():
                if pair not in gated:
                    out.write(record)
    except OSError as exc:
        raise ResumeError(f"--resume {run_dir}: cannot append to {results_path}: {exc.strerror or exc}") from None
    return ({pair: verdict for pair, (verdict, _) in gates.items()},
            {key: list(checks.values()) for key, checks in judged.items()})
