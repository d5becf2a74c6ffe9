"""Issue 26: one table per backend x check over the results files of the H200 calls (session 4's P, Q and R2,
session 5's S5), with the known-issue entries applied, each planned pair counted once.

    python bench/serving_i26_tally.py DIR... [--json out.json] [--markdown] [--no-known] [--version KEY=VER ...]
                                             [--backend NAME ...]

DIR: unpacked result folders (every serving results JSONL below them is read, a run directory's results.jsonl of
``deltacheck run`` is not; a pair's last result wins, DIRs in the order given). Prints
``backend check run passed failed known error declined reported not_run`` (run = passed + failed + known + error +
reported) and then every failure and error with its reason, and any entry that no longer reproduces.

Each backend is counted against the plan it was given (``PLANS``: the checks and ops its scripts asked for, over
L0). A planned pair with no result is "not run" or "declined": the session-4 records (ran.jsonl) keep only what
ran, not the declines, and each of their processes took its plan in order until a timeout cut it, so a missing
pair is a decline when it lies before its process's cut and unreached after it. The cases after the cuts are the
session-5 case lists (bench/serving_i26_s5_cases/, bench/serving_i26_s5_lists.py): a missing pair is not run when its
case is on its backend's list (or the backend ran only in session 5, whose files record declines), else an
unrecorded decline (counted in declined and reported on a line of its own).

Refused pins (``redeclare_refused_pins``): the pinned cuDNN engines' errors "no <engine> plan for this graph" of the
records made before the pinned-engine fix, and that backend's other results on the same case (another engine's, on
FE's cached unpinned graph), count as declined, as the fixed adapter records them; a ``REDECLARED`` line names each.

Known issues: the shipped table (plus ``--known-issues FILE``) applied as ``serving_run`` applies it
(``serving_run.apply_known``: idempotent, so results already marked ``known`` stay so), on an environment with the
versions of the runs (``--version``; default the H200 calls' versions below), since the session-4 records hold none.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pathlib

from deltacheck.harness.run.serving_run import ALL_CHECKS, apply_known, plan

HERE = pathlib.Path(__file__).resolve().parent
LISTS = HERE / "serving_i26_s5_cases"
PAIR = ("causality", "graph_replay")
# What each backend was asked (bench/serving_i26_h200.sh, serving_i26_cudnn_h200.sh, serving_i26_s5_h200.sh):
# checks, ops (None: every op), and where its unreached cases are listed ("s5": it ran only in session 5, every
# missing pair unreached; a list prefix: the session-5 list files of its unreached cases; None: finished in
# session 4, every missing pair an unrecorded decline).
PLANS = {
    "fla-recurrent": (ALL_CHECKS, None, None), "fla": (ALL_CHECKS, None, None),
    "jax": (PAIR, None, None), "vllm-fla": ((*PAIR, "batch_invariance"), None, None),
    "flashqla": (PAIR, None, ("flashqla",)),
    "cudnn": (PAIR, ("gdn", "kda"), ("cudnn_gdn-", "cudnn_kda")),
    "cudnn@gdn_cutile": (PAIR, ("gdn",), ("gdn_cutile-",)),
    "cudnn@kda_cutile": (PAIR, ("kda",), ("kda_cutile",)),
    "flashinfer": (ALL_CHECKS, ("gdn",), "s5"), "flashinfer-decode": (ALL_CHECKS, ("gdn",), "s5"),
    "cudnn@kda_hopper": (PAIR, ("kda",), "s5"), "cudnn@kda_hopper_cuda": (PAIR, ("kda",), "s5"),
    "fla-dispatch": (PAIR, None, "s5"),
    # the second session's call (bench/results/serving-h200-w26, `--backend` them alone): both finished there
    "vllm-fla-recurrent": (ALL_CHECKS, None, None), "flashkda": (PAIR, None, None),
}
# The versions of the H200 calls (docs/serving.md; flashinfer: session 5's 0.7.2.post1).
VERSIONS = {"cudnn_frontend": "1.32.0", "fla": "0.6.0", "triton": "3.6.0", "vllm": "0.33.0", "flash_qla": "0.1.3",
            "flashinfer": "0.7.2.post1"}
COLS = ("passed", "failed", "known", "error", "declined", "reported", "not_run")


def serving_rows(path: str) -> list[dict]:
    """The serving results in one JSONL (status not_run dropped); [] for a file of another kind."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill: not a result
            if isinstance(r, dict) and r.get("check") in ALL_CHECKS and {"backend", "case", "status"} <= r.keys() \
                    and r["status"] != "not_run":
                rows.append(r)
    return rows


def read(dirs) -> dict[tuple, dict]:
    results: dict[tuple, dict] = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True)):
            for r in serving_rows(path):
                results[(r["backend"], r["check"], r["case"])] = r
    return results


def unreached(backend: str, lists: pathlib.Path = LISTS) -> set[str] | None:
    """The case ids of ``backend`` left for session 5 (None: all of them)."""
    where = PLANS.get(backend, (None, None, "s5"))[2]
    if where == "s5":
        return None
    ids: set[str] = set()
    for prefix in where or ():
        for path in lists.glob(f"{prefix}*.txt"):
            ids |= {line.strip() for line in path.read_text().splitlines() if line.strip()}
    return ids


def redeclare_refused_pins(results: dict[tuple, dict]) -> list[str]:
    """The records made before the pinned-engine fix (session 5): FE's refusal of a pin at the call was recorded as
    an error ("cudnnGraphNotSupportedError: no <engine> plan for this graph (offered: [...])"), and every later
    call of that backend on that case met the unpinned graph FE had cached for the refused pin, so its results
    (graph replay "passed") are another engine's. The adapter now declines both (``RunDeclined``: the refusal, and
    a pinned call served by another engine); this applies the same rule to the records: every result of such a
    backend x case becomes ``declined`` with FE's words and the engines it offered. Returns a line per result."""
    from deltacheck.harness.backends.cudnn.adapter import refusal_reason

    refused = {}
    for (backend, _, case), r in results.items():
        engine = backend.split("@", 1)[1] if backend.startswith("cudnn@") else None
        text = r.get("reason", "")
        if engine and r["status"] == "error" and f"no {engine} plan for this graph" in text:
            refused[(backend, case)] = text.split(": ", 1)[-1]
    lines = []
    for (backend, check, case), r in sorted(results.items()):
        if (backend, case) not in refused or r["status"] == "declined":
            continue
        was = r["status"]
        lines.append(f"REDECLARED {backend} {check} {case}: recorded {was}")
        r["status"] = "declined"
        r["reason"] = (f"{refusal_reason(backend.split('@', 1)[1], refused[(backend, case)])} (recorded {was} before "
                       "the pinned-engine fix: FE's refusal at the call, or another engine's result on FE's cached "
                       "unpinned graph)")
    return lines


def tally(results: dict[tuple, dict], lists: pathlib.Path = LISTS):
    """counts[(backend, check)][status] over each backend's plan; inferred[(backend, check)]: unrecorded declines."""
    counts = collections.defaultdict(collections.Counter)
    inferred = collections.Counter()
    for backend in sorted({b for b, _, _ in results}):
        checks, ops, _ = PLANS.get(backend, (ALL_CHECKS, None, "s5"))
        left = unreached(backend, lists)
        pairs = [p for op in (ops or (None,)) for p in plan("L0", "L0", list(checks), op)]
        for name, case in pairs:
            r = results.get((backend, name, case.id))
            if r is not None:
                counts[(backend, name)][r["status"]] += 1
            elif left is None or case.id in left:
                counts[(backend, name)]["not_run"] += 1
            else:
                counts[(backend, name)]["declined"] += 1
                inferred[(backend, name)] += 1
    return counts, inferred


def env_for(versions: dict[str, str]):
    from deltacheck.harness.machine.environment import Env

    return Env(cuda=True, device_name="NVIDIA H200", capability=(9, 0), versions=dict(versions))


def markdown(counts, inferred) -> str:
    lines = ["| backend | check | run | passed | failed | known | error | declined | not run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (backend, check), c in sorted(counts.items()):
        ran = c["passed"] + c["failed"] + c["known"] + c["error"] + c["reported"]
        rep = f" ({c['reported']} reported)" if c["reported"] else ""
        dec = f"{c['declined']}" + (f" ({inferred[(backend, check)]} unrecorded)" if inferred[(backend, check)] else "")
        lines.append(f"| {backend} | {check} | {ran}{rep} | {c['passed']} | {c['failed']} | {c['known']} | "
                     f"{c['error']} | {dec} | {c['not_run']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown (README / note)")
    parser.add_argument("--no-known", action="store_true", help="count the statuses as recorded (no known-issue "
                        "entries, no refused pins re-declared)")
    parser.add_argument("--known-issues", action="append", default=[], metavar="FILE")
    parser.add_argument("--version", action="append", default=[], metavar="KEY=VER",
                        help="an Env.versions entry for the known issues (default: the H200 calls' versions)")
    parser.add_argument("--backend", action="append", default=[], metavar="NAME",
                        help="only these backends' results (repeatable; default every backend found)")
    parser.add_argument("--lists", default=str(LISTS), help="the session-5 case lists (the unreached cases)")
    args = parser.parse_args(argv)
    results = read(args.dirs)
    if args.backend:
        results = {k: r for k, r in results.items() if k[0] in args.backend}
    gone, redeclared = [], []
    if not args.no_known:
        redeclared = redeclare_refused_pins(results)
        from deltacheck.harness.backends.base import backend_for
        from deltacheck.harness.ci.known import format_known_report, known_issue_paths, load_known_issues

        versions = {**VERSIONS, **dict(v.split("=", 1) for v in args.version)}
        specs = sorted({b for b, _, _ in results})
        issues = load_known_issues(known_issue_paths(args.known_issues))
        names = {spec: getattr(backend_for(spec), "name", spec) for spec in specs}
        gone = apply_known(list(results.values()), issues, env_for(versions), names)
    counts, inferred = tally(results, pathlib.Path(args.lists))
    if args.markdown:
        print(markdown(counts, inferred))
    else:
        print("backend check run " + " ".join(COLS))
        for (backend, check), c in sorted(counts.items()):
            ran = c["passed"] + c["failed"] + c["known"] + c["error"] + c["reported"]
            print(f"{backend} {check} {ran} " + " ".join(str(c[k]) for k in COLS))
        for key, n in sorted(inferred.items()):
            print(f"unrecorded declines (before the cut of a session-4 process): {' '.join(key)} {n}")
    for line in redeclared:
        print(line)
    for r in results.values():
        if r["status"] in ("failed", "error"):
            print(f"{r['status'].upper()} {r['backend']} {r['check']} {r['case']}: {r.get('reason', '')[:300]}")
    if gone:
        print(format_known_report(gone))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{b} {c}": dict(v) for (b, c), v in counts.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
