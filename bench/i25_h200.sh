#!/bin/bash
# Issue 25 on the H200: the L0 of every new backend, complete if the two calls allow.
#   call P (cold):  bash .carry/h25/bench/i25_h200.sh          ends by 560 s
#   call Q (warm):  bash .carry/h25/bench/i25_h200.sh resume   ends by ~420 s; --resume of every cut run
#   on a fresh machine: PREV=<path of an earlier h25-runs.tgz in the checkout> bash .carry/h25/bench/i25_h200.sh resume
# Both carry .carry/h25 .whl-w25/pack .whl-w25/jax .vllm (a run resumes only in the environment it started in).
# Shares the 16-core machine with another script: 10 workers here (A -j 5, V -j 1, B -j 4: jax compiles per shape, the long pole), --threads 1 each.
#   A (qla env: FLA 0.6 + FlashQLA 0.1.3 + TileLang 0.1.15 + tvm-ffi 0.1.12):
#     deltacheck run --tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla -j 5 --threads 1
#     one queue for both backends: the pool keeps each worker on one compile family (backend, op, dtype, K, V),
#     and a worker whose family is done takes another, so no worker idles while the run has tasks.
#   V (vLLM 0.33's subtree only): deltacheck run --tier L0 --op gdn --op kda --backend vllm-fla --backend flashkda -j 1
#     with VLLM_TRITON_FORCE_FIRST_CONFIG=1: vLLM's Triton kernels run their first valid config, not the
#     autotuned one (vLLM's switch to skip autotuning); the vllm-fla results judge that config. It is set for V
#     alone: importing vLLM's triton_utils with it set replaces triton's Autotuner.run in the whole process, so
#     an FLA kernel run later in the same worker would skip its autotune too.
#   B (jax env: jax-linear-attention 0.1.0 over the image's JAX 0.11.2): deltacheck run --tier L0 --backend jax -j 4
# JIT caches all under DELTACHECK_CACHE_DIR=/tmp/h25-cache: Triton (triton/), TileLang (tilelang/), JAX (jax/),
# tvm-ffi's torch DLPack addon (tvm-ffi/); every worker of the three runs shares them.
# $OUT/h25-runs.tgz (run directories, logs, `deltacheck env`, cache sizes) is re-packed every 20 s.
set -u
MODE=${1:-cold}
R=$PWD; T0=$(date +%s)
if [ "$MODE" = resume ]; then CAP=${CAP:-415}; else CAP=${CAP:-555}; fi
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/h25-cache TVM_FFI_CACHE_DIR=/tmp/h25-cache/tvm-ffi
export XLA_PYTHON_CLIENT_PREALLOCATE=false
RUNS=/tmp/h25-runs; L=/tmp/h25-logs/$MODE
mkdir -p /tmp/h25-qla /tmp/h25-jax $L /tmp/dc-h25 $DELTACHECK_CACHE_DIR
ln -sfn "$R/.carry/h25" /tmp/dc-h25/deltacheck
QLA=/tmp/dc-h25:/tmp/h25-qla; VLLM=/tmp/dc-h25:$R/.vllm; JAX=/tmp/dc-h25:/tmp/h25-jax
el() { echo $(( $(date +%s) - T0 )); }

# snap [TAG]: the run directories and logs into $OUT/h25-runs.tgz (packed aside first, so the file is never torn)
snap() { local t=/tmp/h25-snap${1:-}.tgz; tar -czf $t -C /tmp h25-runs h25-logs 2>/dev/null && mv -f $t "$OUT/h25-runs.tgz"; }

# A fresh machine has lost /tmp: PREV=<an earlier call's h25-runs.tgz, carried> brings its run directories back, so
# `resume` continues them there (cold caches; the same environment, so --resume accepts them).
if [ "$MODE" = resume ] && [ ! -d $RUNS/A ] && [ -n "${PREV:-}" ] && [ -f "$PREV" ]; then
  tar -xzf "$PREV" -C /tmp h25-runs && echo "resume: run directories from $PREV"
fi
# Install (the same lines as .whl-w25/pack/run1.sh; skipped when a warm machine still has them).
if [ ! -d /tmp/h25-qla/flash_qla ]; then
  [ "$MODE" = resume ] && echo "resume: /tmp/h25-qla is gone (a fresh machine): installing again, runs start cold"
  xz -T4 -dc .whl-w25/pack/qla.tar.xz | tar -xf - -C /tmp/h25-qla || echo "untar failed"
fi
if [ ! -d /tmp/h25-jax/jla ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/h25-jax .whl-w25/jax/*.whl \
    || echo "jax pip failed"
fi
echo "$MODE setup $(el)s"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nvcc --version | tail -1
echo "cores $(nproc); load $(cat /proc/loadavg)"

mkdir -p $RUNS
PIDS=()
# run NAME PYTHONPATH ARGS...: a new run, or --resume of NAME's run directory when one is there (same argv).
run() { local name=$1 pp=$2 extra=$3; shift 3
  local dir; dir=$(ls -d $RUNS/$name/*/ 2>/dev/null | tail -1)
  local rt=$(( CAP - $(el) - 30 ))
  if [ -n "$dir" ] && grep -q '"kind": "end"' "$dir/results.jsonl" 2>/dev/null; then
    echo "$name: finished in the earlier call ($dir), nothing to resume"; return; fi
  local where=(--out $RUNS/$name); [ -n "$dir" ] && where=(--resume "${dir%/}")
  echo "$name: ${where[*]} $* (timeout ${rt}s)"
  ( env $extra PYTHONPATH=$pp timeout -s INT -k 15 $rt python3 -m deltacheck run "${where[@]}" "$@" >> $L/$name.log 2>&1
    echo "rc=$? t=$(el)s" >> $L/$name.log ) &
  PIDS+=($!); }

if [ "$MODE" != resume ]; then
  (PYTHONPATH=$QLA timeout 90 python3 -m deltacheck env > $L/env-qla.txt 2>&1
   PYTHONPATH=$VLLM timeout 90 python3 -m deltacheck env > $L/env-vllm.txt 2>&1
   PYTHONPATH=$JAX timeout 90 python3 -m deltacheck env > $L/env-jax.txt 2>&1) &
fi
run A "$QLA" "" --tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla -j 5 --threads 1 --task-timeout 420
run V "$VLLM" VLLM_TRITON_FORCE_FIRST_CONFIG=1 --tier L0 --op gdn --op kda --backend vllm-fla --backend flashkda \
  -j 1 --threads 1 --task-timeout 420
run B "$JAX" "" --tier L0 --backend jax -j 4 --threads 1 --task-timeout 420

( while sleep 20; do snap; echo "t=$(el)s load $(cut -d' ' -f1-3 /proc/loadavg) $(for n in A V B; do
    printf '%s:%s ' $n "$(cat $RUNS/$n/*/results.jsonl 2>/dev/null | grep -c '"kind": "task"')"; done)" >> $L/progress.txt
  done ) &
SNAP=$!
[ ${#PIDS[@]} -gt 0 ] && wait "${PIDS[@]}"
kill $SNAP 2>/dev/null
du -sh $DELTACHECK_CACHE_DIR/* > $L/cache-sizes.txt 2>&1
snap -end
for n in A V B; do echo "== $n"; grep -v "T.vectorized" $L/$n.log 2>/dev/null | tail -3; done
cat $L/cache-sizes.txt; ls -la "$OUT"; echo "$MODE total $(el)s"
