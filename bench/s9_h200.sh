#!/usr/bin/env bash
# Session 9 on the H200, one call (<= CAP s, default 575): issue 28: the fused kernel's settings with the levels as a kept
# loop (step 2) and the sweep of where the forward's time goes (bench/
# chunked_h200.sh steps 1 and 6: exactness on the device, then bench/chunked_sweep.py with --launch --fla: per variant
# the eager median, the CPU's launch time with the GPU kept busy and the CUDA graph replay, and FLA's rows), then
# issue 25's whole-L0 qla lane, cold, in the time left (bench/i25_s9_lane.sh MODE=cold; MODE=finish follows back to
# back). The GPU is never shared: the sweep finishes before the lane starts.
#   run(command="bash bench/s9_h200.sh", carry=[".qla"], timeout_s=595)
# Returns $OUT/h28-results.tgz and $OUT/d25-S9-cold.tgz.
set -u
: "${OUT:?OUT must name the folder results go to}"
T0=$(date +%s); CAP=${CAP:-575}
# shellcheck disable=SC1091
source bench/s5_env.sh > /tmp/s9-env.txt 2>&1
s5_have qla || { echo "the qla environment is not installed (carry .qla)"; cat /tmp/s9-env.txt; exit 1; }
CODE=. FLA_SITE=$S5/qla STEPS=1,2,6 CONFIGS=${CONFIGS:-16x1sdpt,16x1sdptl,16x2sdptl,16x4sdptl,16x2sdpt} CAP=${H28_CAP:-215} SWEEP_BUDGET=1000 SWEEP_ARGS="--launch --fla" \
  SWEEP=${SWEEP:-main,slices1,slices2,slices8,c128,handoff} bash bench/chunked_h200.sh
echo "[s9 $(( $(date +%s) - T0 )) s] issue 28 done"
MODE=cold CAP=$(( CAP - ($(date +%s) - T0) )) bash bench/i25_s9_lane.sh
echo "[s9 $(( $(date +%s) - T0 )) s] done"
