"""Issue 26, session 5: the L0 cases the earlier H200 calls did not reach, as case-id files for
bench/serving_i26_s5_h200.sh (``serving_run --case``), computed on the CPU from the serving planner and the recorded
results.

    python bench/serving_i26_s5_lists.py [--check]    (writes bench/serving_i26_s5_cases/*.txt; --check: compare only)

The records hold only what ran (passed / failed): a declined case left no line. Each earlier process took its plan
in order (``serving_run.plan``, then ``--shard I/N``) and was cut by a timeout, so its unreached cases are exactly
the ones after the last case it judged (a decline after that case cannot be told from an unreached case: it is
listed and declines again, cheaply). Checked against the recorded tables' "not run" counts:

- R2 (bench/results/serving-i26-h200-r2/ran.jsonl; shards 1/2 and 2/2 per backend x op): cudnn@gdn_cutile 43 (the
  table: 43), routed cudnn gdn 39 (38: one of them a decline after the cut), cudnn@kda_cutile 2 (2), routed cudnn
  kda 0 (0).
- S4 P + Q (bench/results/serving-i26-h200/ran.jsonl; flashqla one process over every op): 31 (31; 14 gdn, of
  which 10 with K = V = 128 run, the rest decline).

The routed cudnn gdn cases are a subset of gdn_cutile's: the script shards gdn_cutile's list and runs the routed
backend on the same shard after it, so a routed case finds its cuTile kernel compiled.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from deltacheck.harness.run.serving_run import plan, shard

HERE = pathlib.Path(__file__).resolve().parent
R2 = HERE / "results" / "serving-i26-h200-r2" / "ran.jsonl"
S4 = HERE / "results" / "serving-i26-h200" / "ran.jsonl"
OUT = HERE / "serving_i26_s5_cases"
CHECKS = ["causality", "graph_replay"]
GDN_SHARDS = 5  # cuTile GDN: ~20-35 s per case cold (its compile), 43 cases


def judged(path: pathlib.Path) -> set[tuple]:
    with open(path) as f:
        return {(r["backend"], r["check"], r["case"]) for r in map(json.loads, filter(str.strip, f))}


def unreached(done: set, backend: str, op: str | None, shards: int) -> list[str]:
    """The case ids after the last case ``backend`` judged, in each of its ``shards`` processes' order."""
    pairs = plan("L0", "L0", CHECKS, op)
    left = []
    for i in range(1, shards + 1):
        order = list(dict.fromkeys(case.id for _, case in shard(pairs, f"{i}/{shards}")))
        ran = [k for k, cid in enumerate(order) if any((backend, c, cid) in done for c in CHECKS)]
        left += order[(max(ran) + 1 if ran else 0):]
    return left


def lists() -> dict[str, list[str]]:
    r2, s4 = judged(R2), judged(S4)
    gdn_cutile = unreached(r2, "cudnn@gdn_cutile", "gdn", 2)
    routed = set(unreached(r2, "cudnn", "gdn", 2))
    if not routed <= set(gdn_cutile):
        raise SystemExit(f"routed cudnn gdn cases outside gdn_cutile's list: {sorted(routed - set(gdn_cutile))}")
    out = {"kda_cutile": unreached(r2, "cudnn@kda_cutile", "kda", 2),
           "cudnn_kda": unreached(r2, "cudnn", "kda", 2),
           "flashqla": unreached(s4, "flashqla", None, 1)}
    for i in range(GDN_SHARDS):
        mine = gdn_cutile[i::GDN_SHARDS]
        out[f"gdn_cutile-{i + 1}"] = mine
        out[f"cudnn_gdn-{i + 1}"] = [cid for cid in mine if cid in routed]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for name, ids in lists().items():
        path = OUT / f"{name}.txt"
        text = "".join(f"{cid}\n" for cid in ids)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
        print(f"{name}: {len(ids)}")
    if stale:
        print(f"stale: {stale}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
