#!/usr/bin/env bash
# Issue 26 on the H200, one call: FLA 0.6 (fla-recurrent, then fla) through every serving check (serving tier L0)
# and the causality / graph-replay / batch-invariance checks over the training tier L0, each backend within a
# budget of BUDGET_S seconds (checks past it are counted not_run). Writes $OUT/serving.jsonl line by line.
# Run from the device's checkout with the worktree carried at .carry/i26 and the wheels at .whl.
set -u
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-36}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/i26-site .whl/fla_core-*.whl \
    .whl/flash_linear_attention-*.whl > "$OUT/install.log" 2>&1
mkdir -p /tmp/dc && ln -sfn "$PWD/.carry/i26" /tmp/dc/deltacheck
export PYTHONPATH=/tmp/i26-site:/tmp/dc FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_DIR=/tmp/triton PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
ls /tmp/i26-site | grep -i -E "^(fla|flash)" >> "$OUT/gpu.txt"
timeout 88 python3 -m deltacheck.harness.run.serving_run --backend fla-recurrent --backend fla --tier L0 \
    --serving-tier L0 --budget-s "$BUDGET_S" --out "$OUT/serving.json" > "$OUT/serving.log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - T0 ))s" >> "$OUT/serving.log"
