#!/usr/bin/env bash
# cuDNN FE's engines one at a time on an H200 (issue 24), in one device call after two install calls:
#   call 1, carry .cutile:  tar -xJf .cutile/tc-13.4.92.tar.xz -C /tmp/tc; pip install --target /tmp/lead-site .cutile/cuda_tile-*.whl
#   call 2, carry .whl:     pip install --target /tmp/lead-site .whl/*.whl
#   call 3:                 CAP=<seconds> bash bench/cudnn_engines_h200.sh
# (docs/ci.md, "cuDNN's engines on Hopper", has the whole recipe, the CuTe DSL for kda_hopper included.)
# Runs side by side: the L0 backward cases of the two cuTile engines, and their gate and length frontiers.
# Logs and the run directories go to $OUT as two tarballs.
set -u
T0=$(date +%s); CAP=${CAP:-150}
left() { echo $(( CAP - ($(date +%s) - T0) )); }
mkdir -p /tmp/lead-dc && ln -sfn "$PWD" /tmp/lead-dc/deltacheck
unset CUDA_HOME CUDA_PATH  # tileiras would take $CUDA_HOME's 13.0 libnvvm and ptxas over its own 13.4 ones
export PATH=/tmp/tc/nvidia/cu13/bin:$PATH CUDAToolkit_ROOT=/usr/local/cuda
export PYTHONPATH=/tmp/lead-site:/tmp/lead-dc FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export DELTACHECK_CACHE_DIR=/tmp/lead-cache
R=/tmp/lead-runs2; L=$OUT/logs; mkdir -p $R $L
( t=$(date +%s); timeout $(( $(left) - 20 )) python3 -m deltacheck run --tier L0 --op gdn --op kda -k bwd \
    --backend cudnn@gdn_cutile --backend cudnn@kda_cutile -j 6 --out $R/bwd > $L/bwd.log 2>&1
  echo "bwd rc $? $(( $(date +%s) - t )) s" >> $L/times.txt ) &
for eo in gdn_cutile:gdn kda_cutile:kda; do e=${eo%:*}; o=${eo#*:}
  ( t=$(date +%s); timeout $(( $(left) - 20 )) python3 -m deltacheck frontier --backend cudnn@$e --op $o --axis gate \
      --axis length --json $L/frontier-$e.json --out $R/fr-$e > $L/frontier-$e.log 2>&1
    echo "frontier $e rc $? $(( $(date +%s) - t )) s" >> $L/times.txt ) &
done
wait
for d in $R/*/*/; do timeout 5 python3 -m deltacheck report "$d" > /dev/null 2>&1; done
tar czf $OUT/runs.tgz -C /tmp lead-runs2; cat $L/times.txt; grep -h "last pass" $L/frontier-*.log; tail -3 $L/bwd.log
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
