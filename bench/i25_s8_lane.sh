#!/usr/bin/env bash
# Issue 25, session 8, on the H200: the qla family's L0 lane (fla-dispatch + flashqla, gdn + kda) cold and then warm
# on one shard of the tier, so both passes fit one call (the whole cold L0 is about 6,100 worker-seconds, more than a
# call: docs/ci.md, "The qla family's lane"). The cold pass starts from empty caches; the warm pass reuses them
# (DELTACHECK_CACHE_DIR: Triton's, TileLang's and tvm-ffi's caches). TileLang's compile log of each pass is counted
# by bench/i25_tilelang_compiles.py (keys built more than once: the run queue's rules at work, on a shard that holds
# GDN cases of FlashQLA's shared family; shard 1/6 holds only KDA).
#   run(command="bash bench/i25_s8_lane.sh", carry=[".qla"], timeout_s=500)
# SHARD (default 1/6), JOBS (8), COLD_S (300: the cold pass's cut), CAP (460: the whole call; the cold pass is cut
# at min(COLD_S, CAP - 65 s), the warm pass at what is left less 30 s), D25_WORK (/tmp/d25-s8: the run directories,
# logs and caches), ARCHIVE (d25-S8). Returns $OUT/$ARCHIVE.tgz (both run directories, logs, lanes' JSON, the
# compile counts; not the caches), every 20 s.
set -u
: "${OUT:?OUT must name the folder results go to}"
T0=$(date +%s); CAP=${CAP:-460}; SHARD=${SHARD:-1/6}; JOBS=${JOBS:-8}; COLD_S=${COLD_S:-300}
W=${D25_WORK:-/tmp/d25-s8}
mkdir -p "$W/logs"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[d25-s8 $(el)s] $*" | tee -a "$W/logs/script.log"; }
snap() { tar czf "$W.tgz.part" --exclude="$(basename "$W")/cache" -C "$(dirname "$W")" \
           --transform "s:^$(basename "$W"):d25-s8:" "$(basename "$W")" 2>/dev/null && mv -f "$W.tgz.part" "$OUT/${ARCHIVE:-d25-S8}.tgz"; }
export S5_CODE=${S5_CODE:-$PWD} PYTHONUNBUFFERED=1 TILELANG_JIT_DIAGNOSTICS=1
# shellcheck disable=SC1091
source bench/s5_env.sh >> "$W/logs/env.txt" 2>&1
s5_have qla || { say "the qla environment is not installed (carry .qla)"; snap; exit 1; }
unset FLA_DISABLE_BACKEND_DISPATCH  # fla-dispatch refuses to run with FLA's dispatch off
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime; } >> "$W/logs/env.txt" 2>&1
say "setup done; shard $SHARD, -j $JOBS"
( while sleep 20; do snap; done ) & SNAP=$!
trap 'kill $SNAP 2>/dev/null' EXIT
LANE=(python3 bench/lanes.py --backend fla-dispatch --backend flashqla --op gdn --op kda -j "$JOBS" --threads 1
      --task-timeout 420 --shard "$SHARD" --cache-dir "$W/cache" --out "$W/lanes")
LEFT=$(( CAP - 25 - $(el) ))
PYTHONPATH=$S5_PP_QLA timeout -k 20 "$LEFT" "${LANE[@]}" --passes cold --timeout "$(( COLD_S < LEFT - 40 ? COLD_S : LEFT - 40 ))" \
  --json "$W/cold.json" > "$W/logs/cold.log" 2>&1
say "cold rc=$? ($(du -sh "$W/cache" 2>/dev/null | cut -f1) of caches)"
snap
LEFT=$(( CAP - 15 - $(el) ))
if [ "$LEFT" -gt 30 ]; then
  PYTHONPATH=$S5_PP_QLA timeout -k 10 "$LEFT" "${LANE[@]}" --passes warm --timeout "$(( LEFT - 15 ))" \
    --json "$W/warm.json" > "$W/logs/warm.log" 2>&1
  say "warm rc=$?"
fi
for p in cold warm; do
  [ -f "$W/logs/$p.log" ] && python3 bench/i25_tilelang_compiles.py "$W/logs/$p.log" > "$W/logs/tilelang-$p.txt" 2>&1
done
for p in cold warm; do echo "== $p"; grep -A12 "^lanes:" "$W/logs/$p.log" 2>/dev/null; head -n 12 "$W/logs/tilelang-$p.txt" 2>/dev/null; done
kill $SNAP 2>/dev/null; snap
say done
exit 0
