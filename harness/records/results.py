"""Result records and the JSONL stream they are written to as soon as they exist.

One run directory holds ``results.jsonl``: a ``run`` header (environment, versions, commit), then one
availability record (``kind: "gate"``, its schema-1 name) per backend × op (available or not, required or
not, the reason), then one ``result``
record per (case, backend, check), then an ``end`` record. Reports are rendered from these records only.
A crash loses nothing already written: each record is flushed and fsync'd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = 1
STATUSES = ("pass", "fail", "known", "skip", "error")
# Statuses of a check that was judged: 'known' is a failure a known-issues entry covers (harness/ci/known.py).
JUDGED = ("pass", "fail", "known")
# What makes two environments numerically comparable (the host name is left out).
FINGERPRINT_FIELDS = ("cuda", "device_name", "capability", "python", "versions")


def fingerprint(env: dict[str, Any]) -> str:
    """A short hash of an environment record's ``FINGERPRINT_FIELDS``: equal for runs whose results may be
    combined (``deltacheck merge``, ``run --resume``) and compared check by check."""
    picked = {k: env.get(k) for k in FINGERPRINT_FIELDS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Result:
    case: str
    backend: str
    check: str  # forward | state | continuation_ref | continuation_self | grad_<input> | determinism
    status: str  # pass | fail | known | skip | error
    reason: str = ""
    op: str = ""
    io_dtype: str = ""
    layout: str = ""
    gate: str = ""
    tokens: int = 0
    max_len: int = 0
    tier: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    repro: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: expected one of {STATUSES}, got {self.status!r}")
        if self.status in ("skip", "error", "fail", "known") and not self.reason:
            raise ValueError(f"a {self.status} result needs a reason ({self.case} / {self.backend} / {self.check})")

    def to_record(self) -> dict:
        return {"kind": "result", **asdict(self)}


class ResultStream:
    """Append-only JSONL writer; every record reaches the disk before ``write`` returns."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        torn = _ends_mid_line(self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        if torn:  # a crash or a full disk cut the last record short: ours starts on a line of its own
            self._fh.write("\n")

    def write(self, record: dict | Result) -> None:
        if isinstance(record, Result):
            record = record.to_record()
        self._fh.write(json.dumps(record, sort_keys=True, default=_jsonable) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> ResultStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ends_mid_line(path: str) -> bool:
    """Does the file at ``path`` exist, hold something, and end without a newline (a torn last record)?"""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str]]:
    """Yield ``(line_number, record or None, error)``; a corrupt line yields ``None`` and why. Each line is
    decoded on its own, so one line that is not UTF-8 costs that line only."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, f"not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line)"
                continue
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, None, f"not valid JSON ({exc.msg}, column {exc.colno})"
                continue
            if not isinstance(rec, dict) or "kind" not in rec:
                yield lineno, None, "not a deltacheck record (no 'kind')"
                continue
            yield lineno, rec, ""


def fold_parts(main: str | os.PathLike, parts: list) -> None:
    """Append each part file (an xdist worker's or a ``--jobs`` shard's results) to ``main``, then
    delete it. A part is removed only after its records are on disk in ``main``."""
    for part in parts:
        with open(part, "rb") as src:  # bytes: a line that is not UTF-8 is the reader's to report, not a crash here
            text = src.read()
        if text:
            with open(main, "ab") as out:
                out.write(text if text.endswith(b"\n") else text + b"\n")
                out.flush()
                os.fsync(out.fileno())
        os.unlink(part)


def latest_per_check(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (case, backend, check): a later record replaces an earlier one, in its place (a resumed
    run's rerun of a half-judged task; in ``merge``, a later run's)."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in results:
        latest[(r["case"], r["backend"], r["check"])] = r
    return list(latest.values())


def utc_now() -> str:
    """The time stamp every record carries: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def repro_command(case_id: str, backend: str) -> str:
    """The one command that re-runs exactly one case against one backend, as every Result, report and frontier
    record words it (a case id is the case: ``--case`` needs no tier, op or ``-k``)."""
    return f"deltacheck run --case {shlex.quote(case_id)} --backend {shlex.quote(backend)}"


def end_record(counts: dict[str, int], exit_status: int, required_failures: list[str],
               executed: dict[str, int], known_gone: list[str] | None = None) -> dict[str, Any]:
    """The ``end`` record that closes a run directory (``deltacheck run``, the pytest plugin, ``merge``); a run
    without one did not finish. ``counts``: results by status; ``executed``: cases run per ``"backend:op"``."""
    return {"kind": "end", "finished": utc_now(), "counts": dict(counts), "exit_status": exit_status,
            "required_failures": list(required_failures), "executed": dict(executed),
            "known_gone": list(known_gone or [])}
