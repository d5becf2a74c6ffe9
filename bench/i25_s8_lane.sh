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
TAG=d25-s8 ARCHIVE=${ARCHIVE:-d25-S8} ENVLOG="$W/logs/env.txt"
# shellcheck disable=SC1091
source bench/device_lib.sh
qla_setup
say "setup done; shard $SHARD, -j $JOBS"
start_snaps
LANE=(python3 bench/lanes.py --backend fla-dispatch --backend flashqla --op gdn --op kda -j "$JOBS" --threads 1
      --task-timeout 420 --shard "$SHARD" --cache-dir "$W/cache" --out "$W/lanes")
LEFT=$(( CAP - 25 - $(el) ))
lane_pass cold "$LEFT" "$(( COLD_S < LEFT - 40 ? COLD_S : LEFT - 40 ))"
snap
LEFT=$(( CAP - 15 - $(el) ))
[ "$LEFT" -gt 30 ] && lane_pass warm "$LEFT" "$(( LEFT - 15 ))"
for p in cold warm; do echo "== $p"; grep -A12 "^lanes:" "$W/logs/$p.log" 2>/dev/null; head -n 12 "$W/logs/tilelang-$p.txt" 2>/dev/null; done
kill $SNAP 2>/dev/null; snap
say done
exit 0
