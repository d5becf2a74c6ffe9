#!/usr/bin/env bash
# Session 8 on the H200, one call (<= CAP s, default 560): issue 28's side-by-side run at the default settings, one
# process per repeat (bench/chunked_h200.sh steps 1 and r, FLA from the qla tarball with its dispatch off; REPEATS
# default 3, but within H28_CAP (default 190 s) two fit on a fresh machine), then issue 26's fla-dispatch serving
# shards resumed from session 7's archive (bench/serving_i26_s7.sh) in the time left. The GPU is never shared: the
# timing runs finish before the serving shards start.
#   run(command="bash bench/s8_h200.sh", carry=[".qla"], timeout_s=590)
# Returns $OUT/h28-results.tgz and $OUT/d26-S7.tgz (kept in the repository as bench/results/s8/h28-default.tgz and
# d26-S7b.tgz).
set -u
: "${OUT:?OUT must name the folder results go to}"
T0=$(date +%s); CAP=${CAP:-560}
# shellcheck disable=SC1091
source bench/s5_env.sh > /tmp/s8-env.txt 2>&1
s5_have qla || { echo "the qla environment is not installed (carry .qla)"; cat /tmp/s8-env.txt; exit 1; }
CODE=. FLA_SITE=$S5/qla STEPS=1,r CONFIGS=16x1sdpt REPEATS=${REPEATS:-3} CAP=${H28_CAP:-190} \
  bash bench/chunked_h200.sh
echo "[s8 $(( $(date +%s) - T0 )) s] issue 28 done"
CAP=$(( CAP - ($(date +%s) - T0) )) bash bench/serving_i26_s7.sh
echo "[s8 $(( $(date +%s) - T0 )) s] done"
