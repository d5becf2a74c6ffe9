#!/usr/bin/env bash
# Issue 26, session 7, on the H200: the fla-dispatch causality and graph-replay pairs session 5 left unrun (122 / 123:
# its three shards were cut at the call's end, bench/results/s5/d26-S5.tgz; session 7's call left 18 / 20,
# bench/results/s7/d26-S7.tgz). Each shard's newest results file is taken from the newest of those archives and
# continued with `serving_run --resume FILE` (the checks it holds are kept, the rest run), the three shards side by
# side in the qla environment (bench/s5_env.sh; carry .qla), FLA's dispatch on.
#   run(command="bash bench/serving_i26_s7.sh", carry=[".qla"], timeout_s=560)
# Returns $OUT/d26-S7.tgz (the three results files, logs, the tally), refreshed every 20 s.
set -u
T0=$(date +%s); CAP=${CAP:-500}; MARGIN=${MARGIN:-20}
: "${OUT:?OUT must name the folder results go to}"
L=${D26_WORK:-/tmp/d26-s7}
mkdir -p "$L"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[d26-s7 $(el)s] $*" | tee -a "$L/script.log"; }
snap() { tar czf "$L.tgz.part" -C "$(dirname "$L")" --transform "s:^$(basename "$L"):d26-s7:" "$(basename "$L")" \
           2>/dev/null && mv -f "$L.tgz.part" "$OUT/d26-S7.tgz"; }
export S5_CODE=${S5_CODE:-$PWD} PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s7-cache}
# shellcheck disable=SC1091
source bench/s5_env.sh >> "$L/env.txt" 2>&1
s5_have qla || { say "the qla environment is not installed (carry .qla)"; snap; exit 1; }
unset FLA_DISABLE_BACKEND_DISPATCH  # fla-dispatch refuses to run with FLA's dispatch off
# The newest recorded shards: session 7's call (bench/results/s7/d26-S7.tgz) where the checkout has it, else session 5's
if [ -f bench/results/s7/d26-S7.tgz ]; then PREV=bench/results/s7/d26-S7.tgz TOP=d26-s7
else PREV=bench/results/s5/d26-S5.tgz TOP=d26-s5; fi
for i in 1 2 3; do
  [ -f "$L/fla-dispatch-$i.jsonl" ] || tar -xzf "$PREV" -O "$TOP/fla-dispatch-$i.jsonl" > "$L/fla-dispatch-$i.jsonl"
done
say "shards from $PREV"
say "results kept: $(cat "$L"/fla-dispatch-*.jsonl | wc -l) lines"
( while sleep 20; do snap; done ) & SNAP=$!
trap 'kill $SNAP 2>/dev/null' EXIT
BUDGET=$(( CAP - MARGIN - $(el) ))
PIDS=()
for i in 1 2 3; do
  PYTHONPATH=$S5_PP_QLA timeout -k 3 "$(( BUDGET + MARGIN - 8 ))" python3 -m deltacheck.harness.run.serving_run \
    --tier L0 --serving-tier L0 --backend fla-dispatch --checks causality,graph_replay --shard "$i/3" \
    --budget-s "$BUDGET" --resume "$L/fla-dispatch-$i.jsonl" > "$L/fla-dispatch-$i.log" 2>&1 &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p"; echo "shard pid $p rc=$?" >> "$L/script.log"; done
say "shards done"
PYTHONPATH=$S5_PP_QLA python3 bench/serving_i26_tally.py --help > /dev/null 2>&1 && \
  PYTHONPATH=$S5_PP_QLA python3 bench/serving_i26_tally.py --backend fla-dispatch "$L" \
    > "$L/tally.txt" 2>&1
for i in 1 2 3; do tail -n 14 "$L/fla-dispatch-$i.log"; done
cat "$L/tally.txt" 2>/dev/null | tail -20
kill $SNAP 2>/dev/null; snap
exit 0
