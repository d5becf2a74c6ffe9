#!/bin/bash
# w25 H200 call 1: L0 of fla-dispatch/flashqla/vllm-fla (gdn), fla-dispatch kda, jax, fla-dispatch-cp long cases
set -u
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/w25-cache
R=$PWD; T0=$(date +%s); RT=${RT:-280}
mkdir -p /tmp/w25-qla /tmp/w25-jax /tmp/w25-runs /tmp/w25-logs /tmp/dc-w25
ln -sfn "$R/.carry/w25" /tmp/dc-w25/deltacheck
xz -T4 -dc .whl-w25/pack/qla.tar.xz | tar -xf - -C /tmp/w25-qla || echo "untar failed"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/w25-jax .whl-w25/jax/*.whl || echo "jax pip failed"
echo "setup $(( $(date +%s)-T0 ))s"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; which nvcc; nvcc --version | tail -1
QLA=/tmp/dc-w25:/tmp/w25-qla:$R/.vllm; JAX=/tmp/dc-w25:/tmp/w25-jax; L=/tmp/w25-logs
PIDS=()
run() { local name=$1 pp=$2; shift 2
  ( PYTHONPATH=$pp timeout -s INT -k 20 $RT python3 -m deltacheck run --out /tmp/w25-runs/$name "$@" > $L/$name.log 2>&1; echo "rc=$? t=$(( $(date +%s)-T0 ))s" >> $L/$name.log ) &
  PIDS+=($!); }
(PYTHONPATH=$QLA timeout 60 python3 -m deltacheck env > $L/env-qla.txt 2>&1; PYTHONPATH=$JAX timeout 60 python3 -m deltacheck env > $L/env-jax.txt 2>&1) &
run A "$QLA" --tier L0 --op gdn --backend fla-dispatch --backend flashqla --backend vllm-fla -j 8 --threads 1
run B "$JAX" --tier L0 --backend jax -j 3 --threads 1
run C "$QLA" --backend fla-dispatch-cp -j 2 --threads 1 \
  --case 'gdn-bf16-thd-N1-T[32768]-H4/4/4-K64-V64-mild-l2norm' \
  --case 'gdn-bf16-thd-N3-T[32768_0_1000]-H4/4/4-K128-V128-mild-l2norm-sigmoid-h0' \
  --case 'gdn-fp16-thd-N2-T[40000_20000]-H4/4/4-K64-V64-steep-l2norm-h0' \
  --case 'gdn-bf16-thd-N1-T[16384]-H4/4/4-K128-V128-mild-l2norm' \
  --case 'kda-bf16-thd-N1-T[32768]-H4/4/4-K128-V128-mild-l2norm'
run D "$QLA" --tier L0 --op kda --backend fla-dispatch -j 3 --threads 1
( while sleep 40; do tar -czf $OUT/snap.tmp -C /tmp w25-runs w25-logs 2>/dev/null && mv $OUT/snap.tmp $OUT/snap.tgz; done ) &
SNAP=$!
wait "${PIDS[@]}"; kill $SNAP 2>/dev/null
for n in A B C D; do tar -czf $OUT/$n.tgz -C /tmp/w25-runs $n 2>/dev/null; done
du -sh /tmp/w25-cache/* 2>/dev/null > $L/cache-sizes.txt
tar -czf $OUT/logs.tgz -C /tmp w25-logs; rm -f $OUT/snap.tgz $OUT/snap.tmp
for n in A B C D; do echo "== $n"; tail -4 $L/$n.log; done; ls -la $OUT; echo "total $(( $(date +%s)-T0 ))s"
