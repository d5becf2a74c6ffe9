#!/usr/bin/env bash
# Issue 28 on the H200, one call (<= CAP s wall, default 240): the side-by-side run the issue asks for (fp64 chunked
# reference, with the fused kernel of reference/chunked_fused.py ON and OFF, against FLA's bf16 chunk_gdn2 at N=4
# T=4096 H=16 K=V=128, one process), preceded by the on-device exactness check of both paths.
# Command line (from the device's checkout root, this worktree carried at .carry/$WHO, default h28, the wheels at .whl):
#   run(command="bash .carry/h28/bench/chunked_h200.sh", carry=[".whl", ".carry/h28"], timeout_s=300)
# The code is found through PYTHONPATH=/tmp/dc-$WHO, where /tmp/dc-$WHO/deltacheck links to $PWD/.carry/$WHO. FLA: the
# site directory $FLA_SITE (default /tmp/s5/fla) when `import fla` works from it, else installed from .whl into
# /tmp/$WHO-site. Returns $OUT/$WHO-results.tgz (snapshotted every 20 s, so a cut call still brings what it had).
#
# 1. bench/chunked.py --exact-only (fused at the default settings, and unfused, fwd+bwd against the token oracle on
#    the device, -1000 and -inf decays), beside: bench/fla_warm.py --apply (compiles FLA's recorded winners; the
#    shipped H200 file holds H=16) and bench/fused_configs.py --compile-only per kernel setting, into one Triton cache.
# 2. bench/fused_configs.py: each setting of the fused kernel timed (alone and in the forward), the fastest that
#    agrees with the unfused forward to 1e-13 is used by step 3 (DELTACHECK_CHUNKED_FUSED_CONFIG).
# 3. bench/chunked.py: the exactness check again at that setting, then the fp64 rows (fused = the default "chunked",
#    then "chunked (unfused)") and FLA's, one process, medians of 5, peaks, ratios, rates; --profile prints the
#    fused forward's and forward+backward's top kernels.
# 4. the backward's segment budgets and the hand-off slices (bench/chunked_steps.py); 4b. step 3 with the opt-in
#    hand-off kernel (DELTACHECK_CHUNKED_HANDOFF_KERNEL=1); 5. step 3 with the hand-off in one slice; 6. the hand-off
#    kernel's settings against the per-chunk products, one process (bench/chunked_sweep.py).
#    r. the side-by-side run at the default settings REPEATS times (default 3), each its own process, without the
#    profile, the unfused row or the graph row: the spread of the ratio between processes.
# SWEEP (step 6's variants), SWEEP_ARGS (more of its options, e.g. "--launch --fla") and SWEEP_BUDGET (its
# --budget-s, default 1: no graph or FLA rows) set step 6.
# STEPS (default 1,2,3,4,4b,5) picks the steps to run, e.g. STEPS=1,4b,6 CONFIGS=16x1sdpt for the hand-off alone,
# STEPS=1,r CONFIGS=16x1sdpt for the default's ratio again and again.
set -u
STEPS=",${STEPS:-1,2,3,4,4b,5},"
on() { [[ "$STEPS" == *",$1,"* ]]; }
WHO=${WHO:-h28}
CAP=${CAP:-240}
CONFIGS=${CONFIGS:-16x2sdpt,16x2sdp,16x1sdpt,32x2sdpt,8x2sdpt,16x2sdt}  # reference/chunked_fused.py settings tried in step 2
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
R="/tmp/$WHO-out"
rm -rf "$R" && mkdir -p "$R/winners"
snap() { tar czf "$OUT/$WHO-results.tgz.part" -C "$R" . 2>/dev/null && mv -f "$OUT/$WHO-results.tgz.part" "$OUT/$WHO-results.tgz"; }
( while sleep 20; do snap; done ) &
SNAP=$!
trap 'kill $SNAP 2>/dev/null' EXIT

FLA_SITE=${FLA_SITE:-/tmp/s5/fla}
if PYTHONPATH="$FLA_SITE" python3 -c "import fla" > "$R/install.log" 2>&1; then
  SITE="$FLA_SITE"
else
  SITE="/tmp/$WHO-site"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/fla_core-*.whl \
      .whl/flash_linear_attention-*.whl >> "$R/install.log" 2>&1
fi
CODE=${CODE:-.carry/$WHO}  # the checkout to measure: a carried copy, or CODE=. for the device's own
mkdir -p "/tmp/dc-$WHO" && ln -sfn "$(cd "$CODE" && pwd)" "/tmp/dc-$WHO/deltacheck"
export PYTHONPATH="$SITE:/tmp/dc-$WHO" FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_DIR="/tmp/$WHO-triton-cache" \
    DELTACHECK_CACHE_DIR="/tmp/$WHO-cache" PYTHONUNBUFFERED=1
cd "$CODE" || exit 1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; nproc; echo "fla site: $SITE";
  python3 -c "import torch, triton, fla, deltacheck; print(torch.__version__, triton.__version__, fla.__version__, deltacheck.__file__)"; } \
  > "$R/env.txt" 2>&1
echo "[$(el) s] ready: $(tail -n 2 "$R/env.txt" | tr '\n' ' ')" | tee -a "$R/steps.log"

# 1. exactness on the device (fused with the default settings, and unfused) beside FLA's compile of its recorded
#    winners and the compile of each fused-kernel setting (one process each, into the shared Triton cache)
if on 1; then
timeout 100 python3 bench/fla_warm.py --apply > "$R/warm-apply.log" 2>&1 &
WARMS=($!)
for cfg in ${CONFIGS//,/ }; do
  timeout 100 python3 bench/fused_configs.py --compile-only --configs "$cfg" > "$R/compile-$cfg.log" 2>&1 &
  WARMS+=($!)
done
timeout 100 python3 bench/chunked.py --exact-only --no-previous --json "$R/exact.json" > "$R/exact.log" 2>&1
RC=$?; echo "[$(el) s] exactness rc=$RC" | tee -a "$R/steps.log"
wait "${WARMS[@]}"
echo "[$(el) s] warm: $(grep -h 'fla_warm' "$R/warm-apply.log" | tr '\n' ' ' | cut -c1-250)" | tee -a "$R/steps.log"
snap
fi

# 2. the kernel's settings timed (the kernel alone and the forward; each checked against the unfused forward)
if on 2; then
timeout 60 python3 bench/fused_configs.py --configs "$CONFIGS" --budget-s 45 --jsonl "$R/configs.jsonl" \
  --best "$R/best-config.txt" > "$R/configs.log" 2>&1
RC=$?; echo "[$(el) s] configs rc=$RC best=$(cat "$R/best-config.txt" 2>/dev/null)" | tee -a "$R/steps.log"
fi
[ -s "$R/best-config.txt" ] && export DELTACHECK_CHUNKED_FUSED_CONFIG="$(cat "$R/best-config.txt")"
snap

# 3. side by side in one process: the exactness check of the fused path at the chosen setting (fwd+bwd against the
#    token oracle, -1000 and -inf), then fp64 fused, fp64 unfused, then FLA (winners applied); medians, peaks, ratios
LEFT=$(( CAP - 46 - $(el) ))  # 40 s kept for step 4
if on 3; then
DELTACHECK_RECORD_WINNERS="$R/winners" timeout $(( LEFT > 45 ? LEFT : 45 )) python3 bench/chunked.py \
  --no-previous --no-graph --profile --json "$R/bench.json" > "$R/bench.log" 2>&1
RC=$?; echo "[$(el) s] bench rc=$RC" | tee -a "$R/steps.log"
fi

# 4. the backward's segment budget, now (64 MiB: 1024-token segments), before (32 MiB), now again: wall, CPU, peak;
#    the forward with the state hand-off made in 4 (now) and 1 slices
LEFT=$(( CAP - 4 - $(el) ))
if on 4 && [ "$LEFT" -gt 20 ]; then
timeout "$(( LEFT < 40 ? LEFT : 40 ))" python3 bench/chunked_steps.py --budgets-mib 64,32,64 --json "$R/bwd-steps.json" \
  > "$R/bwd-steps.log" 2>&1
RC=$?; echo "[$(el) s] steps rc=$RC" | tee -a "$R/steps.log"
fi

# 4b. the side-by-side run again with the opt-in hand-off kernel (reference/chunked_fused.py HANDOFF: the chunks'
#    state hand-off as one kernel instead of one product per chunk), its exactness check first, then the fp64 rows
#    and FLA's, one process, with the forward's profile and the forward replayed from a CUDA graph (its GPU time
#    without launch gaps: how much of the rest is the CPU's)
LEFT=$(( CAP - 3 - $(el) ))
if on 4b && [ "$LEFT" -gt 45 ]; then
  DELTACHECK_CHUNKED_HANDOFF_KERNEL=1 timeout "$LEFT" python3 bench/chunked.py --no-previous --no-unfused \
    --profile --json "$R/bench-handoff.json" > "$R/bench-handoff.log" 2>&1
  RC=$?; echo "[$(el) s] bench (hand-off kernel) rc=$RC" | tee -a "$R/steps.log"
fi

# 5. the side-by-side run again with the forward's state hand-off made in one slice instead of four (more memory, fewer
#    kernels), when there is time: the fp64 rows and FLA's, one process
LEFT=$(( CAP - 3 - $(el) ))
if on 5 && [ "$LEFT" -gt 45 ]; then
  DELTACHECK_CHUNKED_HANDOFF_SLICES=1 timeout "$LEFT" python3 bench/chunked.py --no-previous --no-graph --no-unfused \
    --no-exact --json "$R/bench-slices1.json" > "$R/bench-slices1.log" 2>&1
  RC=$?; echo "[$(el) s] bench (1 slice) rc=$RC" | tee -a "$R/steps.log"
fi
# r. the default's side-by-side run, REPEATS processes (the first with its exactness check)
for i in $(seq 1 "${REPEATS:-3}"); do
  LEFT=$(( CAP - 3 - $(el) ))
  on r && [ "$LEFT" -gt 40 ] || break
  EXACT=$([ "$i" = 1 ] || echo --no-exact)
  timeout "$LEFT" python3 bench/chunked.py --no-previous --no-unfused --no-graph $EXACT --json "$R/bench-r$i.json" \
    > "$R/bench-r$i.log" 2>&1
  RC=$?; echo "[$(el) s] bench (default, repeat $i) rc=$RC" | tee -a "$R/steps.log"
done
# 6. the hand-off kernel's settings and the per-chunk products one after another in one process (exactness first)
LEFT=$(( CAP - 3 - $(el) ))
if on 6 && [ "$LEFT" -gt 30 ]; then
  timeout "$LEFT" python3 bench/chunked_sweep.py --variants "${SWEEP:-no-handoff,handoff,handoff-vt16,handoff-vt64,handoff-w4,handoff-s1}" \
    --json "$R/sweep-handoff.json" --budget-s "${SWEEP_BUDGET:-1}" ${SWEEP_ARGS:-} > "$R/sweep-handoff.log" 2>&1
  RC=$?; echo "[$(el) s] sweep (hand-off settings) rc=$RC" | tee -a "$R/steps.log"
fi
kill "$SNAP" 2>/dev/null
snap
tail -c 3000 "$R/exact.log" 2>/dev/null
grep -v '^ *$' "$R/bench.log" 2>/dev/null | tail -c 7000
tail -c 1500 "$R/configs.log" 2>/dev/null
cat "$R/bwd-steps.log" 2>/dev/null
grep -E "exact|^(chunked|fla)|x  " "$R/bench-handoff.log" 2>/dev/null
grep -E "^(chunked|fla)|x  " "$R/bench-slices1.log" 2>/dev/null
grep -vE '^ *$' "$R/sweep-handoff.log" 2>/dev/null | tail -c 2500
for f in "$R"/bench-r*.log; do [ -f "$f" ] && echo "== $f" && grep -E "exact|^(chunked|fla)|x  " "$f"; done
exit 0
