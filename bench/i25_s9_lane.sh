#!/usr/bin/env bash
# Issue 25, session 9, on the H200: the qla family's whole L0 lane (fla-dispatch + flashqla, gdn + kda, -j 8), cold
# and then warm, over two back-to-back calls on one machine (the cold pass is longer than one call; the machine keeps
# /tmp for about 30 s between calls):
#   MODE=cold:   the cold pass from empty caches, cut at COLD_S seconds (bench/lanes.py --passes cold);
#   MODE=finish: the same run resumed to its end (deltacheck run --resume, the same caches and selection), then a warm
#                pass on the caches it left (bench/lanes.py --passes warm), within CAP.
# The task queue's shared-compile-key rule (harness/run/taskqueue.py) is at work in both; TileLang's compile log of
# each step is counted by bench/i25_tilelang_compiles.py.
#   run(command="MODE=cold COLD_S=380 bash bench/i25_s9_lane.sh", carry=[".qla"])   # or after bench/s9_h200.sh
#   run(command="MODE=finish CAP=560 bash bench/i25_s9_lane.sh", carry=[".qla"])    # back to back
# D25_WORK (/tmp/d25-s9: run directories, logs, caches), ARCHIVE (d25-S9-<mode>). Returns $OUT/$ARCHIVE.tgz (run
# directories, logs, lanes' JSON, compile counts; not the caches), every 20 s.
set -u
: "${OUT:?OUT must name the folder results go to}"
T0=$(date +%s); MODE=${MODE:-cold}; CAP=${CAP:-560}; COLD_S=${COLD_S:-380}; JOBS=${JOBS:-8}
W=${D25_WORK:-/tmp/d25-s9}; ARCHIVE=${ARCHIVE:-d25-S9-$MODE}
mkdir -p "$W/logs"
TAG=d25-s9 SAYTAG="d25-s9 $MODE" ENVLOG="$W/logs/env-$MODE.txt"
# shellcheck disable=SC1091
source bench/device_lib.sh
qla_setup
start_snaps
SEL=(--backend fla-dispatch --backend flashqla --op gdn --op kda)
LANE=(python3 bench/lanes.py "${SEL[@]}" -j "$JOBS" --threads 1 --task-timeout 420 --cache-dir "$W/cache" --out "$W/lanes")
if [ "$MODE" = cold ]; then
  say "setup done; the whole L0, -j $JOBS, cut at $COLD_S s"
  LEFT=$(( CAP - 20 - $(el) ))
  lane_pass cold "$LEFT" "$(( COLD_S < LEFT - 30 ? COLD_S : LEFT - 30 ))"
else
  FOUND=$(ls -d "$W"/lanes/cold/*/results.jsonl 2>/dev/null | head -n 1)
  [ -n "$FOUND" ] || { say "no cold run to resume under $W/lanes/cold (the machine was not kept?)"; snap; exit 1; }
  RUN=$(dirname "$FOUND")
  say "resuming $RUN"
  LEFT=$(( CAP - 90 - $(el) ))  # 75 s kept for the warm pass
  S=$(date +%s)
  DELTACHECK_CACHE_DIR="$W/cache" TRITON_CACHE_DIR="$W/cache/triton" PYTHONPATH=$S5_PP_QLA timeout -k 20 "$LEFT" \
    python3 -m deltacheck run --tier L0 "${SEL[@]}" -j "$JOBS" --threads 1 --task-timeout 420 --resume "$RUN" \
    > "$W/logs/resume.log" 2>&1
  RC=$?
  say "resume rc=$RC in $(( $(date +%s) - S )) s ($(du -sh "$W/cache" 2>/dev/null | cut -f1) of caches)"
  python3 bench/i25_tilelang_compiles.py "$W/logs/resume.log" > "$W/logs/tilelang-resume.txt" 2>&1
  snap
  LEFT=$(( CAP - 15 - $(el) ))
  [ "$LEFT" -gt 40 ] && lane_pass warm "$LEFT" "$(( LEFT - 15 ))"
fi
for f in cold resume warm; do
  [ -f "$W/logs/$f.log" ] && { echo "== $f"; grep -A14 "^lanes:" "$W/logs/$f.log" | head -30; tail -n 4 "$W/logs/$f.log";
                               head -n 12 "$W/logs/tilelang-$f.txt" 2>/dev/null; }
done
kill $SNAP 2>/dev/null; snap
say done
exit 0
