"""Issue 26, session 4: one table over the results files of calls P, Q (and R2), with "not run" counted against the
plan each backend was given (a pair with no result is not run, never passed).

    python bench/serving_i26_tally.py DIR... [--json out.json]

DIR: unpacked h26-*.tgz folders (every *.jsonl below them is read; a pair's last result wins). Prints
``backend check run passed failed declined reported error not_run known`` and the failures with their reasons.
It counts the statuses as recorded: a result serving_run marked ``known`` (known-issue entries, applied since
k26) is counted so; the session-4 files predate that, and hold no library versions to apply the entries with
afterwards, so their failures stay failures here (tests/test_known.py applies the shipped table to them).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os

from deltacheck.harness.run.serving_run import ALL_CHECKS, load_done, plan

# What each backend was asked (bench/serving_i26_h200.sh, bench/serving_i26_cudnn_h200.sh).
PLANS = {
    "fla-recurrent": (ALL_CHECKS, None), "fla": (ALL_CHECKS, None),
    "jax": (("causality", "graph_replay"), None), "flashqla": (("causality", "graph_replay"), None),
    "vllm-fla": (("causality", "graph_replay", "batch_invariance"), None),
    "cudnn": (("causality", "graph_replay"), ("gdn", "kda")),
    "cudnn@gdn_cutile": (("causality", "graph_replay"), ("gdn",)),
    "cudnn@kda_cutile": (("causality", "graph_replay"), ("kda",)),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results: dict[tuple, dict] = {}
    for d in args.dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True)):
            for r in load_done(path)[0]:
                results[(r["backend"], r["check"], r["case"])] = r
    seen = {b for b, _, _ in results}
    counts = collections.defaultdict(collections.Counter)
    for backend in sorted(seen):
        checks, ops = PLANS.get(backend, (ALL_CHECKS, None))
        pairs = [p for op in (ops or (None,)) for p in plan("L0", "L0", list(checks), op)]
        for name, case in pairs:
            r = results.get((backend, name, case.id))
            counts[(backend, name)][r["status"] if r else "not_run"] += 1
    cols = ("passed", "failed", "declined", "reported", "error", "not_run", "known")
    print("backend check run " + " ".join(cols))
    for (backend, check), c in sorted(counts.items()):
        ran = c["passed"] + c["failed"] + c["reported"] + c["error"] + c["known"]
        print(f"{backend} {check} {ran} " + " ".join(str(c[k]) for k in cols))
    for r in results.values():
        if r["status"] in ("failed", "error"):
            print(f"{r['status'].upper()} {r['backend']} {r['check']} {r['case']}: {r['reason'][:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{b} {c}": dict(v) for (b, c), v in counts.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
