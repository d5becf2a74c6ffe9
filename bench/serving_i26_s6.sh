#!/usr/bin/env bash
# Issue 26, session 6 (helper d26): the pinned-engine fix on the H200, with what this session can carry (cuDNN FE's
# wheel in .whl; no cuTile toolchain, no CuTe DSL). The one cuDNN engine that needs neither is kda_hopper_cuda
# (NVRTC; CUDAToolkit_ROOT=/usr/local/cuda gives it the include tree); kda_hopper needs the CuTe DSL, the cuTile
# engines tileiras, the FROST engines Blackwell. From the device checkout root, carry [".whl", ".carry/d26"]:
#   S5_CODE=.carry/d26 bash .carry/d26/bench/serving_i26_s6.sh          (CAP = 190 s)
# 1. bench/serving_i26_s6_fe_pin.py: FE's cached graph after a refused pin, asked of FE itself (seconds).
# 2. serving_run --backend cudnn@kda_hopper_cuda --checks causality,graph_replay over L0 kda, as session 5's job
#    kdahc ran it (114 s beside seven other jobs): expected with the fix, causality 40 run (35 passed, 5 known),
#    graph replay 40 (36 passed, 4 known), no error, no failure, no "no longer reproduces"; the case session 5
#    recorded as an error, kda-bf16-thd-N4-T[1_64_0_130]-H4/4/4-K128-V128-zero-beta_one-l2norm-sigmoid-safegate-alog,
#    declined in both checks.
# Returns $OUT/d26-S6.tgz (logs, results JSONL, `deltacheck env`, the tally).
set -u
T0=$(date +%s); CAP=${CAP:-190}; MARGIN=${MARGIN:-10}
D=$(cd "$(dirname "$0")" && pwd)
L=${S6_LOGS:-/tmp/d26-s6}; OUT=${OUT:-/tmp/d26-out}; mkdir -p "$L" "$OUT"
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s5-cache}
# shellcheck disable=SC1090
source "${S5_ENV:-bench/s5_env.sh}" >> "$L/env.txt" 2>&1 || echo "sourcing the environment failed" >> "$L/env.txt"
unset CUDA_HOME CUDA_PATH; export CUDAToolkit_ROOT=/usr/local/cuda
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1; echo "setup $(( $(date +%s) - T0 ))s"
  PYTHONPATH=$S5_PP_CUDNN timeout 60 python3 -m deltacheck env 2>&1 | head -40; } >> "$L/env.txt" 2>&1
PYTHONPATH=$S5_PP_CUDNN timeout 60 python3 "$D/serving_i26_s6_fe_pin.py" > "$L/fe_pin.log" 2>&1
echo "fe_pin rc=$? $(( $(date +%s) - T0 ))s" >> "$L/times.txt"
budget=$(( CAP - ($(date +%s) - T0) - MARGIN ))
PYTHONPATH=$S5_PP_CUDNN timeout -k 3 "$(( budget + MARGIN - 5 ))" python3 -m deltacheck.harness.run.serving_run \
  --backend cudnn@kda_hopper_cuda --op kda --tier L0 --checks causality,graph_replay --budget-s "$budget" \
  --resume "$L/kda_hopper_cuda.jsonl" > "$L/kda_hopper_cuda.log" 2>&1
echo "kda_hopper_cuda rc=$? $(( $(date +%s) - T0 ))s" >> "$L/times.txt"
PYTHONPATH=$S5_PP_CUDNN python3 "$D/serving_i26_tally.py" "$L" --backend cudnn@kda_hopper_cuda > "$L/tally.txt" 2>&1
tar czf "$OUT/d26-S6.tgz" -C "$(dirname "$L")" "$(basename "$L")"
cat "$L/fe_pin.log" "$L/times.txt"; grep -E "^(ERROR|FAILED|KNOWN|DECLINED)|no longer" "$L/kda_hopper_cuda.log" | head -20
tail -25 "$L/tally.txt"
