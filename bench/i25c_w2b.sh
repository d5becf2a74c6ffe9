#!/bin/bash
# i25c W2, call 2 of 2: reassemble and install nvidia-cutlass-dsl 4.8.1 (+ libs), then side by side: the `jax`
# backend over bench/i25c_w2_jax_cases.txt (-j 6) and `flashinfer` / `flashinfer-decode` over their lists (-j 2).
# Carry: .carry/cutlass-b, .carry/i25c. Logs and run tarballs to $OUT.
set -u
C=$PWD/.carry/i25c; B=$PWD/.carry/cutlass-b
JAX_S=${1:-70}; FI_S=${2:-70}
mkdir -p /tmp/i25c-dc /tmp/i25c-site && ln -sfn $C/code /tmp/i25c-dc/deltacheck
export PYTHONPATH=/tmp/i25c-site:/tmp/i25c-dc PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=/tmp/dccache
ids() { mapfile -t xs < "$1"; args=(); for i in "${xs[@]}"; do args+=(--case "$i"); done; }
date -u > $OUT/w2.log
[ -d /tmp/i25c-site/jla ] || timeout 20 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/i25c-site $C/jax_linear_attention-0.1.0-py3-none-any.whl >> $OUT/w2.log 2>&1
ids $C/code/bench/i25c_w2_jax_cases.txt
timeout $JAX_S python3 -m deltacheck run --backend jax "${args[@]}" --out $OUT/runs-jax -j 6 --task-timeout 60 > $OUT/w2-jax.log 2>&1 &
JPID=$!
{
cat /tmp/i25c-dsl/cu13.part00 $B/cu13.part01 $B/cu13.part02 > /tmp/i25c-dsl/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
timeout 40 python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/i25c-dslsite /tmp/i25c-dsl/*.whl $B/*.whl 2>&1 | tail -3
mkdir -p /tmp/i25c-fi && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" $C/fi-nodata.tar.xz /tmp/i25c-fi
date -u
FIP=/tmp/i25c-fi:/tmp/i25c-fisite:/tmp/i25c-dslsite:/tmp/i25c-dslsite/nvidia_cutlass_dsl/dsl_packages:/tmp/i25c-dc
ids $C/code/bench/i25c_w2_fi_cases.txt; a1=("${args[@]}")
ids $C/code/bench/i25c_w2_fid_cases.txt
PYTHONPATH=$FIP timeout $FI_S python3 -m deltacheck run --backend flashinfer --backend flashinfer-decode "${a1[@]}" "${args[@]}" --out $OUT/runs-fi -j 2 --task-timeout 60 2>&1 | tail -30
} >> $OUT/w2.log 2>&1
wait $JPID; echo "jax exit $?" >> $OUT/w2.log; date -u >> $OUT/w2.log
cd $OUT && for d in runs-*; do [ -d $d ] && tar -czf $d.tgz $d && rm -rf $d; done; true
