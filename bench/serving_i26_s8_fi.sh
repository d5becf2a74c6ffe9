#!/usr/bin/env bash
# Issue 26, session 8, on the H200: FlashInfer's serving checks again (flashinfer and flashinfer-decode, every check
# over L0 gdn and the serving tier L0), after the adapter's fix of its own host-to-device copies under capture (25
# graph replays of session 5 were declined "capture refused" because of them). FlashInfer's SM90 GDN kernels are
# CuTe DSL: nvidia-cutlass-dsl 4.8.1 does not fit one call's 64 MiB with FlashInfer, so two back-to-back calls
# (bench/s5_env.sh, which installs whatever is carried into /tmp/s5, kept while the machine stays warm):
#   run(command="bash bench/serving_i26_s8_fi.sh stash", carry=[".dsl/a"], timeout_s=60)
#   run(command="bash bench/serving_i26_s8_fi.sh", carry=[".dsl/b", ".fi", ".whl"], timeout_s=400)
# Returns $OUT/d26-S8.tgz (results JSONL and logs per backend, the tally), refreshed every 20 s.
set -u
: "${OUT:?OUT must name the folder results go to}"
T0=$(date +%s); CAP=${CAP:-330}; MARGIN=${MARGIN:-15}
L=${D26_WORK:-/tmp/d26-s8}
mkdir -p "$L"
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s8-cache}
# shellcheck disable=SC1091
source bench/s5_env.sh >> "$L/env.txt" 2>&1
if [ "${1:-}" = stash ]; then cat "$L/env.txt"; ls -la /tmp/s5/dslparts; exit 0; fi
snap() { tar czf "$L.tgz.part" -C "$(dirname "$L")" --transform "s:^$(basename "$L"):d26-s8:" "$(basename "$L")" \
           2>/dev/null && mv -f "$L.tgz.part" "$OUT/d26-S8.tgz"; }
s5_have fi || { echo "FlashInfer or the CuTe DSL is not installed:"; cat "$L/env.txt"; snap; exit 1; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "setup $(( $(date +%s) - T0 )) s"
  PYTHONPATH=$S5_PP_FI python3 -m deltacheck env 2>&1 | grep -iE "flashinfer|cutlass|cudnn|torch|triton" | head -20; } >> "$L/env.txt" 2>&1
( while sleep 20; do snap; done ) & SNAP=$!
trap 'kill $SNAP 2>/dev/null' EXIT
BUDGET=$(( CAP - MARGIN - ($(date +%s) - T0) ))
PIDS=()
for b in flashinfer flashinfer-decode; do
  PYTHONPATH=$S5_PP_FI timeout -k 3 "$(( BUDGET + MARGIN - 5 ))" python3 -m deltacheck.harness.run.serving_run \
    --tier L0 --serving-tier L0 --backend "$b" --op gdn --budget-s "$BUDGET" --resume "$L/$b.jsonl" \
    > "$L/$b.log" 2>&1 &
  PIDS+=($!)
done
for p in "${PIDS[@]}"; do wait "$p"; echo "pid $p rc=$?" >> "$L/env.txt"; done
PYTHONPATH=$S5_PP_FI python3 bench/serving_i26_tally.py --backend flashinfer --backend flashinfer-decode "$L" \
  > "$L/tally.txt" 2>&1
for b in flashinfer flashinfer-decode; do grep -E "^(FAILED|ERROR|KNOWN)" "$L/$b.log" | cut -c1-400; tail -n 9 "$L/$b.log"; done
cat "$L/tally.txt"
echo "[$(( $(date +%s) - T0 )) s] done"
kill $SNAP 2>/dev/null; snap
exit 0
