#!/usr/bin/env bash
# Issue 28 on the H200, one call (<= 330 s wall): the side-by-side run the issue asks for (fp64 chunked reference
# against FLA's bf16 chunk_gdn2 at N=4 T=4096 H=16 K=V=128), preceded by the exactness check on the device.
# Command line (from the device's checkout, the worktree carried at .carry/$WHO, default h28, the wheels at .whl):
#   run(command="bash .carry/h28/bench/chunked_h200.sh", carry=[".whl", ".carry/h28"], timeout_s=420)
# Returns $OUT/h28-results.tgz (snapshotted every 20 s, so a cut call still brings what it had) and prints the table.
#
# FLA's first compile: every FLA autotune key holds H, and the shipped winners were recorded at H <= 4, so at H=16
# FLA autotuned every config of every kernel, one compile after another (> 150 s, w28's call was cut there).
# Here bench/fla_warm.py compiles those configs in 12 processes at once into one Triton cache (while the
# exactness check runs), then autotunes once with every binary cached and writes the winners, which the timed
# process applies (DELTACHECK_FLA_WINNERS): it compiles nothing new and times FLA after the fp64 rows, in the
# same process (side by side). The winners come back in the tarball for the next run.
set -u
WHO=${WHO:-h28}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
R="/tmp/$WHO-out"
rm -rf "$R" && mkdir -p "$R/winners"
snap() { tar czf "$OUT/$WHO-results.tgz.part" -C "$R" . 2>/dev/null && mv -f "$OUT/$WHO-results.tgz.part" "$OUT/$WHO-results.tgz"; }
( while sleep 20; do snap; done ) &
SNAP=$!
python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/$WHO-site" .whl/fla_core-*.whl \
    .whl/flash_linear_attention-*.whl > "$R/install.log" 2>&1
mkdir -p "/tmp/dc-$WHO" && ln -sfn "$PWD/.carry/$WHO" "/tmp/dc-$WHO/deltacheck"
export PYTHONPATH="/tmp/$WHO-site:/tmp/dc-$WHO" FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_DIR="/tmp/$WHO-triton" \
    DELTACHECK_CACHE_DIR="/tmp/$WHO-cache" PYTHONUNBUFFERED=1
cd ".carry/$WHO" || exit 1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc;
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$R/env.txt" 2>&1
echo "[$(el) s] installed" | tee -a "$R/steps.log"

# 1. FLA's configs compiled in 12 processes (background) while the exactness check runs on the same GPU
NS=12
PIDS=()
for i in $(seq 0 $((NS - 1))); do
  timeout 120 python3 bench/fla_warm.py --slice "$i/$NS" > "$R/warm-slice$i.log" 2>&1 &
  PIDS+=($!)
done
timeout 90 python3 bench/chunked_sweep.py --variants main,copies --exact-only --json "$R/exact.json" \
  > "$R/exact.log" 2>&1
RC=$?; echo "[$(el) s] exactness rc=$RC" | tee -a "$R/steps.log"
wait "${PIDS[@]}"
echo "[$(el) s] slices done: $(grep -l 'fwd+bwd done' "$R"/warm-slice*.log | wc -l)/$NS finished fwd+bwd" \
  | tee -a "$R/steps.log"
snap

# 2. FLA's own autotune over all configs (binaries cached), winners written for the timed process and the next run
timeout 90 python3 bench/fla_warm.py --tune --winners "$R/winners/bench-H16.json" > "$R/warm-tune.log" 2>&1
RC=$?; echo "[$(el) s] tune rc=$RC" | tee -a "$R/steps.log"
[ -s "$R/winners/bench-H16.json" ] && export DELTACHECK_FLA_WINNERS="$R/winners/bench-H16.json"
snap

# 3. side by side in one process: fp64 reference rows first, then FLA (winners applied), medians, peaks, rates
LEFT=$(( 315 - $(el) ))
DELTACHECK_RECORD_WINNERS="$R/winners" timeout $(( LEFT > 60 ? LEFT : 60 )) python3 bench/chunked.py \
  --no-previous --no-graph --json "$R/bench.json" > "$R/bench.log" 2>&1
RC=$?; echo "[$(el) s] bench rc=$RC" | tee -a "$R/steps.log"
snap

# 4. each step's effect, if time is left (fp64 only, one process): origin = the reference of the checkout this runs
# from (main, before this branch), main = this branch's defaults, then one change switched off or on at a time;
# then, while the budget allows, the forward through torch.compile (compile_intra)
LEFT=$(( 325 - $(el) ))
if [ "$LEFT" -gt 25 ]; then
  mkdir -p bench/_origin_ref && cp ../../reference/chunked*.py bench/_origin_ref/ && touch bench/_origin_ref/__init__.py
  md5sum ../../reference/chunked*.py reference/chunked*.py > "$R/origin-md5.txt" 2>&1
  timeout "$LEFT" python3 bench/chunked_sweep.py --variants origin,main,copies,no-views,no-direct --reps 5 \
    --settle 2 --profile --profile-variant main --compile --budget-s $(( LEFT - 20 )) --json "$R/steps.json" > "$R/steps-sweep.log" 2>&1
  RC=$?; echo "[$(el) s] steps sweep rc=$RC" | tee -a "$R/steps.log"
fi
kill "$SNAP" 2>/dev/null
snap
cat "$R/steps.log" "$R/exact.log" "$R/bench.log" "$R/steps-sweep.log" 2>/dev/null | tail -c 11000
