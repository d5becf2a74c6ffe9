#!/bin/bash
# i25c W2 (issue 25): an L0 run per new backend x op on the H200 — the L0 cases inside each backend's envelope
# (bench/i25c_<backend>_l0.txt, made by bench/i25c_l0_lists.py) plus `--dry-run` counts of the whole L0 tier.
# Usage: bench/i25c_w2.sh SECONDS_FOR_JAX SECONDS_FOR_FLASHINFER. Logs and run tarballs go to $OUT.
set -u
C=$PWD/.carry/i25c
JAX_S=${1:-70}; FI_S=${2:-25}
mkdir -p /tmp/dc /tmp/site && ln -sfn $C/code /tmp/dc/deltacheck
export PYTHONPATH=/tmp/site:/tmp/dc PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/dccache
ids() { mapfile -t xs < "$1"; args=(); for i in "${xs[@]}"; do args+=(--case "$i"); done; }
{
date -u
[ -d /tmp/site/jla ] || timeout 20 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/jax_linear_attention-0.1.0-py3-none-any.whl 2>&1 | tail -2
echo "== jax L0 (envelope cases)"
ids $C/code/bench/i25c_jax_l0.txt
timeout $JAX_S python3 -m deltacheck run --backend jax "${args[@]}" --out $OUT/runs-jax -j 8 --task-timeout 60 2>&1 | tail -40
if [ -d .dsl/site/nvidia_cutlass_dsl ] && [ "$FI_S" -gt 0 ]; then
  echo "== flashinfer L0 (envelope cases)"
  DSL=$PWD/.dsl/site:$PWD/.dsl/site/nvidia_cutlass_dsl/dsl_packages
  [ -d /tmp/fi/flashinfer ] || { mkdir -p /tmp/fi && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $C/fi-nodata.tar.xz /tmp/fi; }
  [ -d /tmp/fisite/tvm_ffi ] || timeout 15 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fisite .whl/apache_tvm_ffi*.whl .whl/nvidia_cudnn_frontend*.whl 2>&1 | tail -2
  ids $C/code/bench/i25c_flashinfer_l0.txt; a1=("${args[@]}")
  ids $C/code/bench/i25c_flashinfer-decode_l0.txt
  PYTHONPATH=/tmp/fi:/tmp/fisite:$DSL:/tmp/dc timeout $FI_S python3 -m deltacheck run --backend flashinfer "${a1[@]}" --backend flashinfer-decode "${args[@]}" --out $OUT/runs-fi -j 4 --task-timeout 60 2>&1 | tail -40
else echo "NO .dsl/site: flashinfer not run"; fi
date -u
} > $OUT/w2.log 2>&1
cd $OUT && for d in runs-*; do [ -d $d ] && tar -czf $d.tgz $d && rm -rf $d; done; true
