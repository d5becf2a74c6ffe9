#!/usr/bin/env bash
# Issue 26 on the H200, session 4 (helper h26), call R2: causality and graph replay over L0 for cuDNN's engines,
# after the call that installed the cuTile toolchain from .cutile (docs/ci.md, "The cuDNN engine lane"; as in
# bench/cudnn_engines_h200.sh: tileiras + ptxas + libnvvm 13.4.92 unpacked to <prefix>-tc, the cuda-tile wheel to a
# site directory). Carry .whl and .carry/h26; from the device checkout root:
#   bash .carry/h26/bench/serving_i26_cudnn_h200.sh [resume]       (ends by CAP = 235 s; set CAP to change it)
# The toolchain is found at $CUTILE_TC (the directory holding nvidia/cu13/bin/tileiras) and $CUTILE_SITE (the site
# holding cuda/tile), else searched under /tmp. cuDNN FE 1.32 + tvm-ffi 0.1.15 go to /tmp/h26-site-cudnn, first on
# the path. Eight processes side by side, each backend x op split case by case in two (--shard I/2):
#   cudnn (routed: gdn -> gdn_cutile, kda -> kda_hopper_cuda or kda_cutile), cudnn@gdn_cutile (gdn),
#   cudnn@kda_cutile (kda); causality and graph replay, serving_run --resume (a second call with `resume` runs only
#   what is missing while the machine is warm). Caches (cuda.tile cubins, FE's NVRTC cubins) under /tmp/h26-cache.
# When the machine is still warm from P and Q, two more processes finish FlashQLA's L0 (11 cases Q left).
# Returns $OUT/h26-R2.tgz (logs, results JSONL, the table), refreshed every 20 s.
set -u
T0=$(date +%s); MODE=${1:-}; CAP=${CAP:-235}; W=h26
L=/tmp/$W-logs-r2; CSITE=/tmp/$W-site-cudnn; TAG=R2$([ "$MODE" = resume ] && echo b)
mkdir -p "$L" "/tmp/dc-$W" && ln -sfn "$PWD/.carry/$W" "/tmp/dc-$W/deltacheck"
[ -d "$CSITE/cudnn" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$CSITE" \
  .whl/nvidia_cudnn_frontend-*.whl .whl/apache_tvm_ffi-*.whl >> "$L/env-$TAG.txt" 2>&1
TC=${CUTILE_TC:-$(dirname "$(dirname "$(dirname "$(dirname "$(ls -d /tmp/*/nvidia/cu13/bin/tileiras 2>/dev/null | head -1)")")")")}
SITE=${CUTILE_SITE:-$(ls -d /tmp/*/cuda/tile 2>/dev/null | grep -v "^$CSITE/" | head -1 | sed 's#/cuda/tile$##')}
OLD_CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}; OLD_PATH=$PATH
unset CUDA_HOME CUDA_PATH  # tileiras would take $CUDA_HOME's 13.0 ptxas and libnvvm over its own 13.4 (docs/ci.md)
export PATH=$TC/nvidia/cu13/bin:$PATH CUDAToolkit_ROOT=/usr/local/cuda PYTHONUNBUFFERED=1
export DELTACHECK_CACHE_DIR=/tmp/$W-cache
PP=$CSITE:$SITE:/tmp/dc-$W
{ date -u; echo "tileiras: $TC ($(ls "$TC/nvidia/cu13/bin/tileiras" 2>&1)); cuda_tile site: $SITE"
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader; nproc
  echo "setup $(( $(date +%s) - T0 ))s"; } >> "$L/env-$TAG.txt" 2>&1
( PYTHONPATH=$PP timeout 60 python3 -m deltacheck env > "$L/deltacheck-env-$TAG.txt" 2>&1 ) &
left() { echo $(( CAP - ($(date +%s) - T0) )); }
serve() {  # serve NAME ARGS...: results appended to $L/NAME.jsonl; no new check in the last 12 s
  local name=$1; shift; local t=$(date +%s) budget=$(( $(left) - 12 ))
  [ "$budget" -gt 15 ] || { echo "$name $TAG skipped: ${budget}s left" >> "$L/times.txt"; return; }
  PYTHONPATH=$PP timeout -k 5 "$(( budget + 8 ))" python3 -m deltacheck.harness.run.serving_run --tier L0 \
    --serving-tier L0 --checks causality,graph_replay --budget-s "$budget" --resume "$L/$name.jsonl" "$@" \
    >> "$L/$name.log" 2>&1
  echo "$name $TAG rc=$? $(( $(date +%s) - t ))s" >> "$L/times.txt"
}
snap() { tar czf /tmp/$W-snap-r2.tgz -C /tmp "$W-logs-r2" 2>/dev/null && mv /tmp/$W-snap-r2.tgz "$OUT/h26-R2.tgz"; }
( while sleep 20; do snap; done ) & SNAP=$!
PIDS=()
for i in 1 2; do
  ( serve cudnn-gdn-$i --backend cudnn --op gdn --shard $i/2 ) & PIDS+=($!)
  ( serve cudnn-kda-$i --backend cudnn --op kda --shard $i/2 ) & PIDS+=($!)
  ( serve gdn_cutile-$i --backend cudnn@gdn_cutile --op gdn --shard $i/2 ) & PIDS+=($!)
  ( serve kda_cutile-$i --backend cudnn@kda_cutile --op kda --shard $i/2 ) & PIDS+=($!)
done
# Opportunistic: when the machine is still the warm one of calls P and Q (FlashQLA's prefix and TileLang's cache still
# under /tmp), the FlashQLA cases Q left, in two shards seeded with Q's results, on TileLang's own toolkit settings.
if [ -d /tmp/$W-qla/flash_qla ] && [ -s /tmp/$W-logs/flashqla.jsonl ]; then
  for i in 1 2; do
    [ -s "$L/flashqla-$i.jsonl" ] || cp /tmp/$W-logs/flashqla.jsonl "$L/flashqla-$i.jsonl"
    ( export CUDA_HOME=$OLD_CUDA_HOME PATH=$OLD_PATH FLA_DISABLE_BACKEND_DISPATCH=1; PP=/tmp/$W-qla:/tmp/dc-$W
      serve flashqla-$i --backend flashqla --shard $i/2 ) & PIDS+=($!)
  done
else echo "flashqla: no warm prefix from P/Q, not run" >> "$L/env-$TAG.txt"; fi
wait "${PIDS[@]}"
kill "$SNAP" 2>/dev/null
PYTHONPATH=/tmp/dc-$W python3 - "$L" > "$L/table-$TAG.txt" 2>&1 <<'EOF'
import glob, sys
from deltacheck.harness.run.serving_run import load_done, table
rows = {(r["backend"], r["check"], r["case"]): r for p in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for r in load_done(p)[0]}
print(table(list(rows.values())))  # a pair once (the flashqla shards start from the same results)
EOF
du -sh "$DELTACHECK_CACHE_DIR"/* >> "$L/env-$TAG.txt" 2>&1
cat "$L/times.txt" "$L/table-$TAG.txt"; grep -h "^FAILED\|^ERROR" "$L"/*.log | cut -c1-300 | head -30
snap
echo "total $(( $(date +%s) - T0 ))s"
