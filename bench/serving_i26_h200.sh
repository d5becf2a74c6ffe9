#!/usr/bin/env bash
# Issue 26 on the H200, session 4 (helper h26): finish L0's causality and graph replay for the backends the last
# session cut or never ran. Call P: `bash .carry/h26/bench/serving_i26_h200.sh` (carry .carry/h26, .whl-w25/pack,
# .whl-w25/jax, .vllm; ends by CAP = 545 s). Call Q, warm, right after: the same with `resume` (CAP = 415 s):
# every process picks up its results file and runs only what is missing (serving_run --resume; a check in flight
# when a process died runs last). Five processes side by side (the GPU is shared with another helper's script):
#   fla-recurrent  every serving check over the serving tier L0 + causality, graph replay, batch invariance over L0
#   fla (3 shards) the same checks (its serving modes decline), L0 split case by case (--shard I/3)
#   jax, then flashqla: causality and graph replay over L0 (jax declines graph replay with why)
#   Q only: vllm-fla (the last session left 70 of its L0 cases not run), in a slot a finished job freed.
# FLA 0.6.0, FlashQLA 0.1.3, TileLang 0.1.15, tvm-ffi 0.1.12 come from .whl-w25/pack/qla.tar.xz (as w25's run1.sh
# unpacked it), jax-linear-attention 0.1.0 from .whl-w25/jax over the image's JAX 0.11.2. FLA's own dispatch is off
# (FLA_DISABLE_BACKEND_DISPATCH=1: the `fla` backend is FLA's Triton, not FlashQLA behind it). Caches (Triton with
# autotune results, TileLang, JAX) under /tmp/h26-cache, kept for Q while the machine stays warm. Returns
# $OUT/h26-P.tgz (or h26-Q.tgz): logs, results JSONL per process, tables; refreshed every 20 s.
set -u
T0=$(date +%s)
MODE=${1:-P}
W=h26; L=/tmp/$W-logs; QLA=/tmp/$W-qla; JAXS=/tmp/$W-jax
if [ "$MODE" = resume ]; then TAG=Q; CAP=${CAP:-415}; else TAG=P; CAP=${CAP:-545}; fi
mkdir -p "$L" "/tmp/dc-$W" && ln -sfn "$PWD/.carry/$W" "/tmp/dc-$W/deltacheck"
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/$W-cache FLA_DISABLE_BACKEND_DISPATCH=1
# Results of P brought back into the carry (when the machine went cold between P and Q): resume from them.
if [ ! -s "$L/fla-recurrent.jsonl" ] && [ -d ".carry/$W/bench/results/serving-i26-P" ]; then
  cp -n .carry/$W/bench/results/serving-i26-P/*.jsonl "$L/" 2>/dev/null; echo "resumed from the carried P results" >> "$L/env-$TAG.txt"
fi
if [ ! -d "$QLA/fla" ]; then
  mkdir -p "$QLA" && xz -T4 -dc .whl-w25/pack/qla.tar.xz | tar -xf - -C "$QLA" || echo "untar failed" >> "$L/env-$TAG.txt"
fi
if [ ! -d "$JAXS/jla" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$JAXS" .whl-w25/jax/*.whl \
    >> "$L/env-$TAG.txt" 2>&1 || echo "jax pip failed" >> "$L/env-$TAG.txt"
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "setup $(( $(date +%s) - T0 ))s"; } >> "$L/env-$TAG.txt" 2>&1
BASE=/tmp/dc-$W
left() { echo $(( CAP - ($(date +%s) - T0) )); }
SERVE="python3 -m deltacheck.harness.run.serving_run --tier L0 --serving-tier L0"
ALL=pool_integrity,decode_chain,speculative,checkpoints,causality,graph_replay,batch_invariance
# serve NAME PYTHONPATH ARGS...: one serving_run, results appended to $L/NAME.jsonl, no new check in the last 12 s
# (nor after MAXB seconds, when set)
serve() {
  local name=$1 path=$2; shift 2; local t=$(date +%s) budget=$(( $(left) - 12 ))
  [ -n "${MAXB:-}" ] && [ "$budget" -gt "$MAXB" ] && budget=$MAXB
  [ "$budget" -gt 20 ] || { echo "$name $TAG skipped: ${budget}s left" >> "$L/times.txt"; return; }
  PYTHONPATH=$path timeout -k 5 "$(( budget + 8 ))" $SERVE --budget-s "$budget" --resume "$L/$name.jsonl" "$@" \
    >> "$L/$name.log" 2>&1
  echo "$name $TAG rc=$? $(( $(date +%s) - t ))s" >> "$L/times.txt"
}
snap() { tar czf /tmp/$W-snap.tgz -C /tmp "$W-logs" 2>/dev/null && mv /tmp/$W-snap.tgz "$OUT/h26-$TAG.tgz"; }
( while sleep 20; do snap; done ) & SNAP=$!
PIDS=()
( serve fla-recurrent "$QLA:$BASE" --backend fla-recurrent --checks $ALL ) & PIDS+=($!)
for i in 1 2 3; do
  ( serve fla-$i "$QLA:$BASE" --backend fla --checks $ALL --shard $i/3 ) & PIDS+=($!)
done
# jax first, for at most 230 s in P (its ~50 runnable cases), then flashqla; in Q vLLM's chunk copy after them
# (vLLM's own switch VLLM_TRITON_FORCE_FIRST_CONFIG=1: one config per chunk kernel, as the last session ran it).
( MAXB=$([ "$TAG" = P ] && echo 230) serve jax "$JAXS:$BASE" --backend jax --checks causality,graph_replay
  serve flashqla "$QLA:$BASE" --backend flashqla --checks causality,graph_replay
  if [ "$TAG" = Q ]; then
    export VLLM_TRITON_FORCE_FIRST_CONFIG=1
    serve vllm-fla "$QLA:$BASE:$PWD/.vllm" --backend vllm-fla --checks causality,graph_replay,batch_invariance
  fi ) & PIDS+=($!)
wait "${PIDS[@]}"
kill "$SNAP" 2>/dev/null
# One table over every results file (P's and Q's lines together; a pair's last result wins).
PYTHONPATH=$BASE python3 - "$L" > "$L/table-$TAG.txt" 2>&1 <<'EOF'
import glob, sys
from deltacheck.harness.run.serving_run import load_done, table
rows = [r for path in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for r in load_done(path)[0]]
print(table(rows))
EOF
cat "$L/times.txt" "$L/table-$TAG.txt"; grep -h "^FAILED\|^ERROR" "$L"/*.log | cut -c1-300 | head -40
snap
echo "total $(( $(date +%s) - T0 ))s"
