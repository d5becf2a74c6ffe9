"""``deltacheck merge``: several runs of one environment -> one run directory that reports read.

For a tier split across CI runners (``run --shard i/n``, docs/ci.md; or ``-k`` / one op per job), or a run that
was interrupted and finished by a second run of what it had not reached. The merged ``results.jsonl`` holds:

- the first run's header, plus ``merged_from`` (each input's run id, start, argv, commit, fingerprint), with
  ``backends`` and ``case_ids`` the union of the inputs' selections (what ``run --resume`` of the merge checks)
  and ``required`` the union of their required pairs;
- one availability record (kind "gate") per backend x op, the first input's (inputs of one environment agree),
  marked required when any input's is (a shard leaves a required pair it has no case of to the others);
- one result per (case, backend, check): the **last** input that has it wins, so a rerun replaces the
  interrupted attempt it repeats; results keep the order in which they were first seen;
- one stability frontier (kind "frontier") per backend x op x dtype x axis, the last input's;
- an end record only when every input finished — otherwise the merged run says it did not finish.

Runs from different environments (fingerprints differ: another GPU, driver or library version) are
refused: one report over two machines would blur exactly what ``deltacheck compare`` exists to separate.
``--allow-mixed-env`` merges them anyway and records every input's environment in ``merged_from``.
``--fold`` merges runs of one machine made in several Python environments, one per backend family
(reports/fold.py): the machine must agree, the backends be disjoint; ``env_by_backend`` says which came whence.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltacheck.harness.records.results import ResultStream, fingerprint
from deltacheck.harness.run.tally import RunTally

from .fold import env_by_backend, fold_problems
from .load import FRONTIER_KEY, RunInputError, latest_per_check, load_run
from .summary import recorded_required_failures

RESULT_FIELDS_DROPPED = ("line",)  # added by the loader, not part of a record


@dataclass(frozen=True)
class Merged:
    directory: Path
    inputs: int
    results: int
    finished: bool

    def __str__(self) -> str:
        return (f"merged {self.inputs} runs into {self.directory / 'results.jsonl'}: {self.results} results"
                + ("" if self.finished else " (at least one input did not finish, so neither does the merge)"))


def merge_runs(inputs: list[str | Path], out: str | Path, *, allow_mixed_env: bool = False,
               fold: bool = False) -> Merged:
    """Write the merge of ``inputs`` (in order; later wins) into the new directory ``out``."""
    if len(inputs) < 2:
        raise RunInputError("merge needs at least two run directories")
    runs = [load_run(p) for p in inputs]  # unreadable lines are warned about and skipped, as report does
    for run in runs:
        if not run.header:
            raise RunInputError(f"{run.results_file} has no run header: cannot tell which environment it ran in")
    prints = [fingerprint(run.env) for run in runs]
    if fold and fold_problems(runs):
        raise RunInputError("cannot fold these runs: " + "; ".join(fold_problems(runs)))
    if len(set(prints)) > 1 and not (allow_mixed_env or fold):
        listing = ", ".join(f"{run.label} {fp}" for run, fp in zip(runs, prints))
        raise RunInputError(f"the runs come from different environments ({listing}); compare them with "
                            "`deltacheck compare`, or pass --allow-mixed-env to merge anyway")

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunInputError(f"--out {out} is a file; merge writes a new run directory")
    if out.exists() and any(out.iterdir()):
        raise RunInputError(f"{out} exists and is not empty; merge writes a new run directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.jsonl").touch()
    except OSError as exc:
        raise RunInputError(f"--out {out}: cannot create the merged run there: {exc.strerror or exc}") from None

    merged = [{k: v for k, v in r.items() if k not in RESULT_FIELDS_DROPPED}
              for r in latest_per_check([r for run in runs for r in run.results])]

    gates: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for g in run.gates:
            gate = gates.setdefault((str(g.get("backend")), str(g.get("op"))), dict(g))
            # required when any input requires it: a shard leaves a required pair it has no case of to the others
            gate["required"] = bool(gate.get("required") or g.get("required"))

    header = dict(runs[0].header)
    # The merge holds every input's selection, so a `run --resume` of it compares against their union.
    header["backends"] = list(dict.fromkeys(b for run in runs for b in run.header.get("backends") or []))
    header["required"] = sorted({p for run in runs for p in run.header.get("required") or []})
    if all(isinstance(run.header.get("case_ids"), list) for run in runs):
        header["case_ids"] = list(dict.fromkeys(c for run in runs for c in run.header["case_ids"]))
        header["cases"] = len(header["case_ids"])
    else:  # some input does not say which cases it selected: neither does the merge
        header.pop("case_ids", None)
        header.pop("cases", None)
    header.update({
        "run_id": out.name,
        "argv": ["merge", *[str(p) for p in inputs]],
        "merged_from": [{"run_id": run.label, "started": run.header.get("started"), "argv": run.header.get("argv"),
                         "commit": run.header.get("commit"), "dirty": run.header.get("dirty"),
                         "fingerprint": fp, "finished": run.finished,
                         **({"env": run.env} if len(set(prints)) > 1 else {})}
                        for run, fp in zip(runs, prints)],
        **({"env_by_backend": env_by_backend(runs)} if fold else {}),
    })
    path = out / "results.jsonl"
    with ResultStream(path) as stream:
        stream.write(header)
        for g in gates.values():
            stream.write(g)
        for r in merged:
            stream.write({**r, "kind": "result"})
        tasks = {(t["case"], t["backend"]): t for run in runs for t in run.tasks}  # a rerun's timing wins
        for t in tasks.values():
            stream.write({**t, "kind": "task"})
        frontiers = {tuple(f[k] for k in FRONTIER_KEY): f for run in runs for f in run.frontiers}  # later wins
        for f in frontiers.values():
            stream.write({**f, "kind": "frontier"})
        finished = all(run.finished for run in runs)
        if finished:
            failures = sorted({line for run in runs for line in recorded_required_failures(run)[0]})
            # One tally over the inputs' (their end records carry theirs): a known issue that no longer reproduces
            # in any shard fails the merge as it failed that shard. Results by status are counted over the merge,
            # where a rerun's results replace the ones it repeats.
            tally = RunTally()
            for run in runs:
                tally.merge(RunTally.of_end(run.end))
            tally.statuses = Counter(r["status"] for r in merged)
            stream.write(tally.end_record(failures))
    return Merged(out, len(runs), len(merged), finished)
