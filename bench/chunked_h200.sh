#!/usr/bin/env bash
# Issue 28 on the H200, one call: the side-by-side run the issue asks for (fp64 chunked reference against FLA's
# bf16 chunk_gdn2 at N=4 T=4096 H=16 K=V=128), preceded by the exactness check on the device.
# Run from the device's checkout with the worktree carried at .carry/$WHO (default w28) and the wheels at .whl:
#   carry [".whl", ".carry/w28"], command `bash .carry/w28/bench/chunked_h200.sh`, timeout_s 600.
# FLA's first compile takes over 150 s here even with the recorded autotune winners (w28's first call was cut
# there), so the benchmark gets most of the call.
set -u
WHO=${WHO:-w28}
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/$WHO-site" .whl/fla_core-*.whl \
    .whl/flash_linear_attention-*.whl > "$OUT/install.log" 2>&1
mkdir -p "/tmp/dc-$WHO" && ln -sfn "$PWD/.carry/$WHO" "/tmp/dc-$WHO/deltacheck"
export PYTHONPATH="/tmp/$WHO-site:/tmp/dc-$WHO" FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_DIR="/tmp/$WHO-triton" \
    DELTACHECK_CACHE_DIR="/tmp/$WHO-cache" PYTHONUNBUFFERED=1
cd ".carry/$WHO" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
timeout 40 python3 bench/chunked_sweep.py --variants main --exact-only --json "$OUT/exact.json" > "$OUT/exact.log" 2>&1
timeout 480 python3 bench/chunked.py --no-previous --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - T0 ))s" >> "$OUT/bench.log"
cat "$OUT/exact.log" "$OUT/bench.log"
