#!/usr/bin/env bash
# cuDNN FE's cuTile engines on an H200 (issue 24), in one device call after one install call:
#   call 1, carry .cutile:        mkdir -p $P-tc; tar -xJf .cutile/tc-13.4.92.tar.xz -C $P-tc
#                                 pip install --no-deps --target $P-site .cutile/cuda_tile-*.whl
#   call 2, carry .whl + checkout: pip install --no-deps --target $P-site .whl/*.whl
#                                 PREFIX=$P CAP=<seconds> bash bench/cudnn_engines_h200.sh
# ($P is a prefix of your own, e.g. /tmp/w24: the machine may be shared. docs/ci.md, "The cuDNN engine lane on an
# H100/H200", has the whole recipe, the NVRTC and CuTe DSL engines included.)
# Runs side by side: L0 gdn + kda for cudnn (default routing), cudnn@gdn_cutile and cudnn@kda_cutile from empty
# caches (cold), the gate and length frontiers of the two cuTile engines; then, in what is left of CAP, the same L0
# again on the caches the first pass filled (warm). Run directories and logs go to $OUT/runs.tgz, re-packed every
# 20 s so a call cut by its limit still brings back what it had; wall times to $OUT/times.txt.
set -u
T0=$(date +%s); CAP=${CAP:-300}; P=${PREFIX:-/tmp/lead}
left() { echo $(( CAP - ($(date +%s) - T0) )); }
mkdir -p $P-dc && ln -sfn "$PWD" $P-dc/deltacheck
unset CUDA_HOME CUDA_PATH  # tileiras would take $CUDA_HOME's 13.0 libnvvm and ptxas over its own 13.4 ones
export PATH=$P-tc/nvidia/cu13/bin:$PATH CUDAToolkit_ROOT=/usr/local/cuda
export PYTHONPATH=$P-site:$P-dc FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export DELTACHECK_CACHE_DIR=$P-cache
R=$P-runs; L=$R/logs; mkdir -p $R $L; rm -rf $DELTACHECK_CACHE_DIR
BACKENDS="--backend cudnn --backend cudnn@gdn_cutile --backend cudnn@kda_cutile"
pack() { tar czf $OUT/runs.part -C $R . 2>/dev/null && mv $OUT/runs.part $OUT/runs.tgz; }
( while sleep 20; do pack; cp $L/times.txt $OUT/ 2>/dev/null; done ) & PACKER=$!
timeout 60 python3 -m deltacheck env > $L/env.txt 2>&1 &
l0() {  # l0 NAME: one L0 pass of the three backends, timed
  local t=$(date +%s)
  timeout $(( $(left) - 15 )) python3 -m deltacheck run --tier L0 --op gdn --op kda $BACKENDS -j 8 \
    --out $R/$1 > $L/$1.log 2>&1
  echo "$1 rc $? $(( $(date +%s) - t )) s" >> $L/times.txt
}
( l0 l0-cold; [ $(left) -gt 40 ] && l0 l0-warm ) &
for eo in gdn_cutile:gdn kda_cutile:kda; do e=${eo%:*}; o=${eo#*:}
  ( t=$(date +%s); timeout $(( $(left) - 15 )) python3 -m deltacheck frontier --backend cudnn@$e --op $o \
      --axis gate --axis length --json $L/frontier-$e.json --out $R/fr-$e > $L/frontier-$e.log 2>&1
    echo "frontier $e rc $? $(( $(date +%s) - t )) s" >> $L/times.txt ) &
done
wait $(jobs -p | grep -v "^$PACKER$")
kill $PACKER; du -sh $DELTACHECK_CACHE_DIR/* > $L/cache.txt 2>&1; pack; cp $L/times.txt $OUT/
cat $L/times.txt $L/cache.txt; grep -h "last pass" $L/frontier-*.log; tail -n 3 $L/l0-*.log
