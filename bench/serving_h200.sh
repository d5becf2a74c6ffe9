#!/usr/bin/env bash
# Issue 26 on the H200, one call. Side by side, one process per backend (a crash or a long compile costs one
# backend only), each stopping new checks after BUDGET_S seconds (the rest counted not_run, never passed):
#   fla-recurrent, fla, vllm-fla-recurrent, vllm-fla: every serving check over the serving tier L0, and causality,
#     graph replay and batch invariance over the training tier L0 (ops in turn: serving_run.interleave_ops);
#   flashkda (vLLM's _flashkda_C), cudnn: causality and graph replay over the training tier L0;
#   vllm-fla through `deltacheck run` on the empty-sequence cases of its known issue, with their controls.
# vllm-fla (both jobs) runs with VLLM_TRITON_FORCE_FIRST_CONFIG=1 (below).
# Run from the device's checkout with the worktree carried at .carry/$W, the wheels at .whl and vLLM's subtree at
# .vllm. FLA goes into /tmp/$W-site; cuDNN FE + tvm-ffi into /tmp/$W-site-cudnn, on the cudnn process's path only.
# kda_hopper_cuda compiles with CUDAToolkit_ROOT and CUDA_HOME unset; without the cuTile toolchain those engines
# decline with their reason. Writes $OUT/serving-logs.tgz (logs, per-backend JSON/JSONL, the `run` directory),
# refreshed every 20 s while the jobs run (what a cut call still brings back).
set -u
T0=$(date +%s)
W=${W:-w26}; CAP=${CAP:-245}; BUDGET_S=${BUDGET_S:-150}
SITE=/tmp/$W-site; CSITE=/tmp/$W-site-cudnn; L=/tmp/$W-logs; R=/tmp/$W-runs
mkdir -p "$L" "$R" "/tmp/dc-$W" && ln -sfn "$PWD/.carry/$W" "/tmp/dc-$W/deltacheck"
pip_in() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
pip_in "$SITE" .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl > "$L/install.log" 2>&1
pip_in "$CSITE" .whl/nvidia_cudnn_frontend-*.whl .whl/apache_tvm_ffi-*.whl >> "$L/install.log" 2>&1
unset CUDA_HOME CUDA_PATH
export CUDAToolkit_ROOT=/usr/local/cuda FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export DELTACHECK_CACHE_DIR=/tmp/$W-cache
BASE=/tmp/dc-$W:$PWD/.vllm
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch',
  torch.__version__, 'triton', triton.__version__)"; echo "install $(( $(date +%s) - T0 ))s"; } > "$L/env.txt" 2>&1
left() { echo $(( CAP - ($(date +%s) - T0) )); }
job() {  # job NAME PYTHONPATH CMD...
  local name=$1 path=$2; shift 2
  ( t=$(date +%s); PYTHONPATH=$path timeout "$(left)" "$@" > "$L/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - t ))s" >> "$L/times.txt" ) &
  PIDS+=($!)
}
PIDS=()
snap() { tar czf "$OUT/snap.tgz" -C /tmp "$W-logs" "$W-runs" 2>/dev/null && mv "$OUT/snap.tgz" "$OUT/serving-logs.tgz"; }
( while sleep 20; do snap; done ) & SNAP=$!
SERVE="python3 -m deltacheck.harness.run.serving_run --tier L0 --serving-tier L0 --budget-s $BUDGET_S"
ALL=pool_integrity,decode_chain,speculative,checkpoints,causality,graph_replay,batch_invariance
for b in fla-recurrent fla vllm-fla-recurrent; do
  job "$b" "$SITE:$BASE" $SERVE --backend "$b" --checks $ALL --out "$L/$b.json"
done
# vLLM's own switch: one config per chunk kernel instead of autotuning (last session's vllm-fla finished no case
# inside 85 s of first compiles); the recurrent kernel has no autotuning.
export VLLM_TRITON_FORCE_FIRST_CONFIG=1
job vllm-fla "$SITE:$BASE" $SERVE --backend vllm-fla --checks $ALL --out "$L/vllm-fla.json"
job flashkda "$SITE:$BASE" $SERVE --backend flashkda --checks causality,graph_replay --out "$L/flashkda.json"
job cudnn "$CSITE:$SITE:$BASE" $SERVE --backend cudnn --checks causality,graph_replay --out "$L/cudnn.json"
EMPTY=(--case 'gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical' --case 'gdn-bf16-thd-N3-T[0_1_65]-H2/2/2-K96-V96-typical-h0'
       --case 'gdn-bf16-thd-N3-T[1_65_0]-H2/2/2-K96-V96-typical' --case 'gdn-bf16-thd-N2-T[1_65]-H2/2/2-K96-V96-typical'
       --case 'gdn-bf16-thd-N6-T[63_1_0_64_65_2]-H2/2/2-K128-V64-typical-state_bf16-l2norm')
job vllm-empty "$SITE:$BASE" python3 -m deltacheck run "${EMPTY[@]}" --backend vllm-fla --in-process --out "$R"
wait "${PIDS[@]}"
kill "$SNAP"
for d in "$R"/*/; do PYTHONPATH=$SITE:$BASE timeout 20 python3 -m deltacheck report "$d" > "$L/report.txt" 2>&1; done
cat "$L/times.txt"; for b in fla-recurrent fla vllm-fla-recurrent vllm-fla flashkda cudnn; do tail -12 "$L/$b.log"; done
snap
echo "total $(( $(date +%s) - T0 ))s"
