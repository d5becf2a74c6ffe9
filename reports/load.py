"""Reading a run directory back: the header, the availability records (kind "gate"), the results, the stability
frontiers (kind "frontier"), the end record, and every line that could not be used (with its line number), so a
report can render what survived.

Only ``deltacheck.harness.records.results`` is imported from the harness: the JSONL stream is the whole
contract between running and reporting.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltacheck.harness.records.results import SCHEMA, STATUSES, latest_per_check, read_records

RESULTS_FILE = "results.jsonl"
FRONTIER_KEY = ("backend", "op", "dtype", "axis")  # one frontier record per these
PART_GLOB = "results.*w*.jsonl"  # results.w3.jsonl (--jobs shard), results.gw3.jsonl (xdist worker)


class RunInputError(Exception):
    """A run directory cannot be read at all (missing, empty, or written with another schema).

    The message is one line a person can act on; the CLI prints it and exits with status 2."""


@dataclass(frozen=True)
class InputProblem:
    """A line of results.jsonl that was skipped, and why."""

    line: int | None  # None: about the file as a whole
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line is not None else self.message


@dataclass
class Run:
    """One run directory, as read from its results.jsonl."""

    directory: Path
    results_file: Path
    header: dict[str, Any] = field(default_factory=dict)
    gates: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    frontiers: list[dict[str, Any]] = field(default_factory=list)  # `deltacheck frontier`'s, one per backend x op x dtype x axis
    end: dict[str, Any] | None = None
    resumes: list[dict[str, Any]] = field(default_factory=list)  # one per `deltacheck run --resume`
    tasks: list[dict[str, Any]] = field(default_factory=list)  # where each case x backend's time went (kind "task")
    problems: list[InputProblem] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def env(self) -> dict[str, Any]:
        env = self.header.get("env")
        return env if isinstance(env, dict) else {}

    @property
    def versions(self) -> dict[str, Any]:
        versions = self.env.get("versions")
        return versions if isinstance(versions, dict) else {}

    @property
    def label(self) -> str:
        """How the run is named in reports: its run id, else its directory name."""
        return str(self.header.get("run_id") or self.directory.name)


def number(value: Any) -> float | None:
    """A metric as a float, or None when it is missing or not a number (NaN and inf are kept)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def finite(value: Any) -> float | None:
    """A metric as a finite float, or None."""
    x = number(value)
    return x if x is not None and math.isfinite(x) else None


# --- what a case id says: the one id grammar (cases/spec.py, importable without torch) ---------------


def id_fields(case_id: str) -> dict[str, Any]:
    """op, io dtype, layout, gate profile, longest sequence and token count of a case id; {} when the id does not
    parse (a result written by another version keeps the fields its record holds)."""
    from deltacheck.cases.spec import CaseError, parse_id

    try:
        case = parse_id(case_id)
    except (CaseError, ValueError, TypeError):
        return {}
    return {"op": case.op, "io_dtype": case.io_dtype, "layout": case.layout, "gate": case.gate,
            "max_len": case.max_len, "tokens": case.total_tokens}


def _normalize_result(rec: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    missing = [k for k in ("case", "backend", "check", "status") if not isinstance(rec.get(k), str) or not rec.get(k)]
    if missing:
        return None, f"result record without {', '.join(missing)}"
    if rec["status"] not in STATUSES:
        return None, f"result status {rec['status']!r} is not one of {', '.join(STATUSES)}"
    out = dict(rec)
    metrics = out.get("metrics")
    out["metrics"] = metrics if isinstance(metrics, dict) else {}
    missing = (any(not out.get(key) for key in ("op", "io_dtype", "layout", "gate"))
               or any(not isinstance(out.get(key), int) or out.get(key) <= 0 for key in ("max_len", "tokens")))
    derived = id_fields(out["case"]) if missing else {}  # parsing an id costs: only for a record that lacks fields
    for key in ("op", "io_dtype", "layout", "gate"):
        if not out.get(key):
            out[key] = derived.get(key, "?")
    for key in ("max_len", "tokens"):
        if not isinstance(out.get(key), int) or out.get(key) <= 0:
            out[key] = derived.get(key, 0)
    for key in ("reason", "repro", "tier"):
        if not isinstance(out.get(key), str):
            out[key] = "" if out.get(key) is None else str(out.get(key))
    out["seconds"] = finite(out.get("seconds")) or 0.0
    return out, ""


def _read_into(run: Run, results_file: Path, problem) -> bool:
    """Add one JSONL file's records to ``run``; True when it held any readable record."""
    seen_any = False
    for lineno, rec, error in read_records(results_file):
        if rec is None:
            problem(lineno, error)
            continue
        seen_any = True
        kind = rec.get("kind")
        if kind == "run":
            if "schema" not in rec:
                raise RunInputError(f"{results_file} line {lineno}: the run header has no schema field; "
                                    f"this deltacheck reads schema {SCHEMA}")
            if rec.get("schema") != SCHEMA:
                raise RunInputError(f"{results_file} line {lineno}: written with results schema "
                                    f"{rec.get('schema')!r}, this deltacheck reads schema {SCHEMA}; "
                                    f"render it with the deltacheck version that wrote it")
            if run.header:
                problem(lineno, "a second run header (the file was appended to by another run); "
                                "keeping the first header")
                continue
            run.header = rec
        elif kind == "gate":
            if not rec.get("backend") or not rec.get("op"):
                problem(lineno, "availability record (kind \"gate\") without backend or op")
                continue
            run.gates.append(rec)
        elif kind == "result":
            result, why = _normalize_result(rec)
            if result is None:
                problem(lineno, why)
                continue
            result["line"] = lineno
            run.results.append(result)
        elif kind == "frontier":
            missing = [k for k in FRONTIER_KEY if not isinstance(rec.get(k), str) or not rec.get(k)]
            if missing or not isinstance(rec.get("points"), list):
                problem(lineno, f"frontier record without {', '.join(missing) or 'a points list'}")
                continue
            run.frontiers.append({k: v for k, v in rec.items() if k != "kind"})
        elif kind == "end":
            run.end = rec  # a resumed run appends its own; the last one describes the whole run
        elif kind == "task":
            if not rec.get("case") or not rec.get("backend") or not isinstance(rec.get("phases"), dict):
                problem(lineno, "task record without case, backend or phases")
                continue
            run.tasks.append({k: v for k, v in rec.items() if k != "kind"})
        elif kind == "resume":
            run.resumes.append(rec)
        else:
            problem(lineno, f"unknown record kind {kind!r}")
    return seen_any


def load_run(path: str | Path, *, warn: bool = True) -> Run:
    """Read a run directory (or a results.jsonl file directly).

    Corrupt or unusable lines (invalid JSON, not UTF-8, not a record) are skipped and kept in ``Run.problems``,
    each with its line number; with ``warn`` each is also printed to stderr once the run is read. Raises
    ``RunInputError`` when nothing can be rendered."""
    path = Path(path)
    if path.is_file():
        directory, results_file = path.parent, path
    elif path.is_dir():
        directory, results_file = path, path / RESULTS_FILE
        if not results_file.is_file():
            raise RunInputError(f"{path} is not a run directory: it has no {RESULTS_FILE}")
    else:
        raise RunInputError(f"no run directory at {path}")

    run = Run(directory=directory, results_file=results_file)
    # A run killed before it folded its workers' files (``--jobs`` shards, pytest-xdist workers) left
    # their records beside results.jsonl; they are read too, so nothing judged is lost from the report.
    parts = sorted(directory.glob(PART_GLOB)) if path.is_dir() else []
    source = results_file

    warnings: list[str] = []  # printed once the run proved readable: an unreadable one is one error line

    def problem(line: int | None, message: str) -> None:
        if source != results_file:
            message = f"{source.name}: {message}"
        run.problems.append(InputProblem(line, message))
        where = f"{source} line {line}" if line is not None else str(source)
        warnings.append(f"warning: {where}: {message}" + ("; skipped" if line is not None else ""))

    seen_any = False
    for source in [results_file, *parts]:
        try:
            seen_any |= _read_into(run, source, problem)
        except OSError as exc:
            raise RunInputError(f"cannot read {source}: {exc.strerror or exc}") from None
    source = results_file
    # `run --resume` re-runs tasks an interruption left half-judged.
    run.results = latest_per_check(run.results)
    run.frontiers = list({tuple(f[k] for k in FRONTIER_KEY): f for f in run.frontiers}.values())  # a later one wins
    if parts:
        problem(None, f"{len(parts)} worker file(s) were never folded into {RESULTS_FILE} (the run was "
                      f"killed before it ended); their records are included: {', '.join(p.name for p in parts)}")

    if not seen_any:
        if run.problems and all(p.message.startswith("not UTF-8 text") for p in run.problems):
            raise RunInputError(f"{results_file} is not UTF-8 text ({run.problems[0]})")
        raise RunInputError(f"{results_file} holds no readable deltacheck records")
    if not run.header:
        problem(None, "no run header: environment, versions and commit are unknown")
    if warn:
        for line in warnings:
            print(line, file=sys.stderr)
    return run
