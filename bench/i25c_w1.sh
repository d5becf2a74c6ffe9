#!/bin/bash
# i25c W1 (issue 25): jla smoke (one case per op with a backward, through deltacheck's `jax` backend) and a
# FlashInfer SM90 GDN prefill probe. Run from /work/main's root on the H200; logs go to $OUT.
set -u
C=$PWD/.carry/i25c
mkdir -p /tmp/dc /tmp/site && ln -sfn $C/code /tmp/dc/deltacheck
export PYTHONPATH=/tmp/site:/tmp/dc PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/dccache
log=$OUT/w1.log
{
date -u; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 20 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/jax_linear_attention-0.1.0-py3-none-any.whl 2>&1 | tail -2
XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -c "import jax; print(jax.__version__, jax.devices())" 2>&1 | tail -2
echo "== jax smoke"
mapfile -t ids < $C/code/bench/i25c_w1_cases.txt; args=(); for i in "${ids[@]}"; do args+=(--case "$i"); done
timeout 48 python3 -m deltacheck run --backend jax "${args[@]}" --out $OUT/runs --in-process 2>&1 | tail -30
echo "== flashinfer probe"
if [ -d .dsl/site/nvidia_cutlass_dsl ]; then echo "lead's .dsl/site present"; DSL=$PWD/.dsl/site:$PWD/.dsl/site/nvidia_cutlass_dsl/dsl_packages; ls .dsl/site/nvidia_cutlass_dsl; else echo "NO .dsl/site"; DSL=; fi
mkdir -p /tmp/fi && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $C/fi-nodata.tar.xz /tmp/fi
timeout 15 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fisite .whl/apache_tvm_ffi*.whl .whl/nvidia_cudnn_frontend*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/fi:/tmp/fisite:$DSL:/tmp/dc timeout 28 python3 $C/code/bench/i25c_flashinfer_probe.py 2>&1 | tail -40
date -u
} > $log 2>&1
cd $OUT && tar -czf runs.tgz runs 2>/dev/null; rm -rf runs; true
