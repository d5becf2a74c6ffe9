#!/usr/bin/env bash
# The pinned cuTile engines on the L0 cases with a bf16 initial or carried state (issue 24: FE asks callers to convert
# it to fp32, which cudnn@gdn_cutile / @kda_cutile now do). After the .cutile call of docs/ci.md (the tileiras bundle
# unpacked in /tmp/lead-tc, cuda_tile installed in /tmp/lead-site), carrying .whl, from the checkout root:
#   CAP=150 bash bench/cutile_bf16_state_h200.sh      (the run directory comes back as $OUT/runs.tgz)
set -u
T0=$(date +%s); CAP=${CAP:-120}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lead-site .whl/nvidia_cudnn_frontend-*.whl \
    .whl/apache_tvm_ffi-*.whl > $OUT/install.log 2>&1
mkdir -p /tmp/lead-dc && ln -sfn "$PWD" /tmp/lead-dc/deltacheck
unset CUDA_HOME CUDA_PATH
export PATH=/tmp/lead-tc/nvidia/cu13/bin:$PATH CUDAToolkit_ROOT=/usr/local/cuda
export PYTHONPATH=/tmp/lead-site:/tmp/lead-dc PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/lead-cache
R=/tmp/lead-runs; mkdir -p $R
( while sleep 15; do tar czf $OUT/runs.tmp.tgz -C /tmp lead-runs 2>/dev/null && mv $OUT/runs.tmp.tgz $OUT/runs.tgz; done ) &
timeout $(( CAP - ($(date +%s) - T0) )) python3 -m deltacheck run --tier L0 --op gdn --op kda \
  -k "state_bf16 and (h0 or cont)" --backend cudnn@gdn_cutile --backend cudnn@kda_cutile -j 8 --out $R > $OUT/run.log 2>&1
echo "rc $? wall $(( $(date +%s) - T0 )) s" >> $OUT/run.log
for d in $R/*/; do timeout 10 python3 -m deltacheck report "$d" > /dev/null 2>&1; done
tar czf $OUT/runs.tgz -C /tmp lead-runs; tail -5 $OUT/run.log
