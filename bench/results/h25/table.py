"""Per backend x op from run dirs: L0 cases (selection), reached, declined, ran, passed, failed, errored, known,
worst headroom among passes. Usage: python table.py RUN_DIR..."""
import json, sys, collections
RANK = {"error": 4, "fail": 3, "known": 2, "pass": 1, "skip": 0}
rows = {}
for d in sys.argv[1:]:
    recs = [json.loads(l) for l in open(f"{d}/results.jsonl") if l.strip()]
    head = next(r for r in recs if r.get("kind") == "run")
    ended = any(r.get("kind") == "end" for r in recs)
    sel = collections.Counter(c.split("-")[0] for c in head["case_ids"])
    res = [r for r in recs if r.get("kind") == "result"]
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in res:
        by[(r["backend"], r["op"])][r["case"]].append(r)
    for b in head["backends"]:
        for op in sorted(sel):
            cases = by.get((b, op), {})
            worst = collections.Counter()
            hr = (-1, None)
            for cid, rs in cases.items():
                w = max(rs, key=lambda r: RANK[r["status"]])["status"]
                worst[w if w != "skip" else "declined"] += 1
                for r in rs:
                    h = (r.get("metrics") or {}).get("headroom")
                    if r["status"] == "pass" and isinstance(h, (int, float)) and h > hr[0]:
                        hr = (h, f"{cid} ({r['check']})")
            reached = len(cases)
            ran = reached - worst["declined"]
            rows[(b, op)] = dict(run=d.rstrip("/").split("/")[-2], finished=ended, L0=sel[op], reached=reached,
                                 declined=worst["declined"], ran=ran, passed=worst["pass"], failed=worst["fail"],
                                 errored=worst["error"], known=worst["known"], worst=round(hr[0], 2), worst_case=hr[1])
print("| backend | op | L0 cases | reached | declined | ran | passed | failed | errored | known | worst headroom (passes) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (b, op), r in sorted(rows.items()):
    if r["reached"] == 0 and r["declined"] == 0:
        pass
    print(f"| {b} | {op} | {r['L0']} | {r['reached']}{'' if r['finished'] else ' (cut)'} | {r['declined']} | {r['ran']} | "
          f"{r['passed']} | {r['failed']} | {r['errored']} | {r['known']} | {r['worst']} |")
json.dump({f"{b} {op}": r for (b, op), r in rows.items()}, open("/tmp/h25-an/table.json", "w"), indent=1)
