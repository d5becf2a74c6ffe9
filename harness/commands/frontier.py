"""``deltacheck frontier``: where a kernel stops being right along the log-decay (gate), the sequence length or the
input scale. The searches and the judge live in ``harness/run/frontier_search.py``; this module parses, checks the request,
writes the run directory through a ``RunSession`` (a ``result`` record per judged check, a ``frontier`` record per
backend x op x dtype x axis) and the ``--json`` file, and prints each frontier. Each point runs in a pool worker
(``pool.WorkerClient``): a crashing kernel costs the point it crashed on, not the search."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from deltacheck.cases import Case, CaseError
from deltacheck.cases.spec import IO_DTYPES
from deltacheck.cases.support import OPS
from deltacheck.harness.backends.table import process_conflict
from deltacheck.harness.judge.checks import repro_command
from deltacheck.harness.judge.runner import RunOptions
from deltacheck.harness.machine.availability import load_backend
from deltacheck.harness.machine.environment import probe_env
from deltacheck.harness.records.exitrule import frontier_exit_status
from deltacheck.harness.records.results import Result, fold_parts, latest_per_check, read_records
from deltacheck.harness.run import pool
from deltacheck.harness.run.frontier_search import (
    AXES,
    LENGTH_CAP,
    LENGTH_START,
    CaseJudge,
    case_at,
    choose_base_case,
    search,
)
from deltacheck.harness.run.session import RunSession

PROG = "deltacheck frontier"
EXIT_UNMEASURED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(Exception):
    """A request that cannot be run; the message is the one line printed."""


def _device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(requested).type
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device: {exc}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {requested}: torch.cuda.is_available() is False on this machine")
    return requested


def _check_names(ops: list[str], dtypes: list[str], axes: list[str]) -> None:
    for flag, given, known in (("--op", ops, OPS), ("--dtype", dtypes, IO_DTYPES), ("--axis", axes, AXES)):
        for value in given:
            if value not in known:
                raise UsageError(f"{flag}: unknown value {value!r}; expected one of {', '.join(known)}")


def _backends(specs: list[str], ops: list[str]) -> dict:
    loaded = {}
    for spec in specs:
        backend, why = load_backend(spec)
        if backend is None:
            raise UsageError(why)
        missing = [op for op in ops if op not in backend.ops]
        if missing:
            raise UsageError(f"backend {spec!r} does not serve {', '.join(missing)} (it serves "
                             f"{', '.join(sorted(backend.ops))})")
        loaded[spec] = backend
    return loaded


def _given_base(text: str | None, ops: list[str], dtypes: list[str], axes: list[str]) -> Case | None:
    if text is None:
        return None
    try:
        base = Case.from_id(text)
    except CaseError as exc:
        raise UsageError(f"--base-case: {exc}") from None
    if ops != [base.op] or dtypes != [base.io_dtype]:
        raise UsageError(f"--base-case {base.id} is a {base.op} {base.io_dtype} case: give exactly --op {base.op} "
                         f"and --dtype {base.io_dtype} with it")
    if base.splits:
        raise UsageError("--base-case: a frontier judges forward, state and gradients, not continuation; "
                         "drop the cont[...] token")
    first = {"gate": -0.5, "length": LENGTH_START, "scale": 1.0}
    for axis in axes:
        try:
            case_at(axis, base, first[axis])
        except CaseError as exc:
            raise UsageError(f"--base-case cannot carry the {axis} axis: {exc}") from None
    return base


def _fmt(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return f"{value:g}"


def _print_record(rec: dict, spec: str, stream) -> None:
    w = stream.write
    points = rec["points"]
    w(f"\n{spec}:{rec['op']} {rec['dtype']} {rec['axis']}: last pass {_fmt(rec['last_pass'])}, "
      f"first fail {_fmt(rec['first_fail'])} (resolution {rec['resolution']:.3g}; {len(points)} points)\n")
    w(f"  base case {rec['base_case']}\n")
    for p in points:
        worst = "NaN/Inf" if p["nonfinite"] else ("–" if p["worst_rel_rms"] is None else f"{p['worst_rel_rms']:.2e}")
        line = f"  {_fmt(p['value']):>9}  {p['verdict']:<16} {worst:>9}  {p['worst_check']}"
        if p["verdict"] != "pass":
            line += f"  {p['reason'][:160]}"
        w(line + "\n")
    failing = next((p for p in points if p["verdict"] in ("fail", "error")), None)
    if failing is not None:
        w(f"  re-run a failing point: {repro_command(Case.from_id(failing['case']), spec)}\n")


def measure(args, stream=None) -> int:
    stream = stream or sys.stdout
    ops, dtypes, axes = args.op, args.dtype or ["bf16"], args.axis or ["gate"]
    _check_names(ops, dtypes, axes)
    conflict = process_conflict(args.backend)  # one worker judges every backend's points
    if conflict:
        raise UsageError(conflict)
    backends = _backends(args.backend, ops)
    base_given = _given_base(args.base_case, ops, dtypes, axes)
    device = _device(args.device)
    cap = args.max_length or LENGTH_CAP.get(device.split(":")[0], LENGTH_CAP["cpu"])
    if cap < LENGTH_START:
        raise UsageError(f"--max-length: expected at least {LENGTH_START}, got {cap}")

    env = probe_env()
    opts = RunOptions(device=device, reference="auto", baseline=True)
    request = {"ops": ops, "dtypes": dtypes, "axes": axes, "max_length": cap, "base_case": args.base_case}
    session = RunSession.open(args.out, list(backends), env, set(), sys.argv[1:],
                              extra={"options": asdict(opts), "command": "frontier", "frontier": request})
    run_dir, results_path = session.run_dir, session.results_path
    # Every point runs in a worker process (one kept for the whole search): a kernel that crashes its process
    # costs that point, recorded as an error, and the search goes on in a fresh worker.
    points_path = run_dir / "results.w0.jsonl"
    pool.STOPPING.clear()  # a run before this one in the process (a test, --report) ended its workers on purpose
    client = pool.WorkerClient(points_path, opts, pairs=session.verdicts)
    records, unmeasured = [], []

    def run_case(spec: str):
        def run(case):
            summary = client.run(case, spec)
            session.done(case, spec, summary)
            held = [rec for _, rec, _ in read_records(points_path)
                    if rec and rec.get("kind") == "result" and rec["case"] == case.id and rec["backend"] == spec]
            return [Result(**{k: v for k, v in rec.items() if k != "kind"}) for rec in latest_per_check(held)]
        return run

    def declined(result) -> None:
        session.write(result)
        session.tally.statuses[result.status] += 1

    try:
        for spec, backend in backends.items():
            for op in ops:
                for dtype in dtypes:
                    base, refused = (base_given, []) if base_given else choose_base_case(backend, spec, op, dtype, env)
                    if base is None:
                        unmeasured.append(f"{spec}:{op} {dtype}")
                        stream.write(f"\n{spec}:{op} {dtype}: no frontier: the backend declined every candidate "
                                     "base case:\n" + "".join(f"  {line}\n" for line in refused))
                        continue
                    for axis in axes:
                        judge = CaseJudge(None, backend, spec, base, axis, env, declined, run_case=run_case(spec))
                        record = search(axis, judge, cap).record(spec, op, dtype, base.id)
                        session.write({"kind": "frontier", **record})
                        records.append(record)
                        _print_record(record, spec, stream)
    except KeyboardInterrupt:
        stream.write(f"\n{PROG}: interrupted; the points judged so far are in {results_path} (no end record)\n")
        return EXIT_INTERRUPTED
    finally:
        client.close()
        pool.stop_workers()
        session.close_stream()
        fold_parts(results_path, [points_path] if points_path.exists() else [])
    status = session.finish([], exit_status=frontier_exit_status(unmeasured))
    if args.json:
        target = Path(args.json)
        if target.parent != Path(""):
            target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(records, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        stream.write(f"\nwrote {target}\n")
    stream.write(f"run directory: {run_dir}\n")
    if unmeasured:
        stream.write(f"not measured (no base case inside the envelope): {', '.join(unmeasured)}\n")
    if args.report:
        from deltacheck.harness.cli import main as cli_main  # the reports register themselves as `deltacheck report`

        cli_main(["report", str(run_dir)])
    return status


def cmd_frontier(args) -> int:
    try:
        return measure(args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE


EPILOG = """axes:
  gate     every log-decay entry from U(x, -0.1); x from -0.5 to -1000, bracketed on a log scale, then bisected
           to max(0.1, 2% of |x|)
  length   one sequence of T tokens (gate profile 'long'), T doubling from 64 to --max-length
  scale    magnitude m of v and q (and k under l2norm) from 1 out to 1e3 and to 1e-3, to a tenth of a decade

exit status: 0 every requested frontier was measured (its failing points are the measurement, not an error);
1 some backend x op x dtype had no base case inside the backend's envelope; 2 a usage error.

examples:
  deltacheck frontier --backend cudnn --op kda --axis gate --json kda-gate.json
  deltacheck frontier --backend fla --op kda --op gdn2 --axis gate --axis length --axis scale --report
  deltacheck frontier --backend mypkg.kernels:MyBackend --op gdn2 --dtype fp16 --axis scale"""


def add_cli(sub) -> None:
    p = sub.add_parser("frontier", help="measure where a kernel stops being right: steeper decays, longer "
                                        "sequences, larger or smaller inputs",
                       description="Search one axis per backend x op x dtype for the last value that passes "
                                   "`run`'s checks and the first that fails. Every point is an ordinary case (its "
                                   "id re-runs it); the points' results and one frontier record per axis go to a "
                                   "run directory that `deltacheck report` and `deltacheck compare` read.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", action="append", required=True,
                   help="backend name (cudnn, fla, chunked, ...) or pkg.mod:attr (repeatable)")
    p.add_argument("--op", action="append", required=True, help=f"one of {', '.join(OPS)} (repeatable)")
    p.add_argument("--dtype", action="append", help="bf16 or fp16 (repeatable; default bf16)")
    p.add_argument("--axis", action="append", help="gate, length or scale (repeatable; default gate)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--max-length", type=int, default=None, metavar="T",
                   help=f"the length axis' memory cap (default {LENGTH_CAP['cpu']} on the CPU, "
                        f"{LENGTH_CAP['cuda']} on a GPU)")
    p.add_argument("--base-case", default=None, metavar="ID",
                   help="search from this case instead of the first documented candidate the backend accepts "
                        "(its op and dtype must be the --op and --dtype given)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the frontier records to FILE (a JSON list)")
    p.add_argument("--out", default="runs", help="root folder for the run directory (default ./runs)")
    p.add_argument("--report", action="store_true", help="render the reports into the run directory afterwards")
    p.set_defaults(func=cmd_frontier)
