# shellcheck shell=bash
# Shared by the issue-25 lane scripts run on the H200 (bench/i25_s8_lane.sh, bench/i25_s9_lane.sh): the timer, a
# logger, the snapshot of the work folder into $OUT (without its caches) and the qla environment's setup.
# Set before sourcing: T0 (the start, in epoch seconds), W (the work folder, with W/logs), TAG (the archive's top
# folder), ARCHIVE (its name under $OUT, without .tgz), ENVLOG (where the setup writes); SAYTAG (the log lines'
# prefix, default TAG) may be set too.
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[${SAYTAG:-$TAG} $(el)s] $*" | tee -a "$W/logs/script.log"; }
snap() { tar czf "$W.tgz.part" --exclude="$(basename "$W")/cache" -C "$(dirname "$W")" \
           --transform "s:^$(basename "$W"):$TAG:" "$(basename "$W")" 2>/dev/null && mv -f "$W.tgz.part" "$OUT/$ARCHIVE.tgz"; }
# The qla site directory from the carried tarball (bench/s5_env.sh), FLA's dispatch on (fla-dispatch refuses to run
# with it off), TileLang's compile log on, the machine's description in ENVLOG; exits when the tarball was not carried.
qla_setup() {
  export S5_CODE=${S5_CODE:-$PWD} PYTHONUNBUFFERED=1 TILELANG_JIT_DIAGNOSTICS=1
  # shellcheck disable=SC1091
  source bench/s5_env.sh >> "$ENVLOG" 2>&1
  s5_have qla || { say "the qla environment is not installed (carry .qla)"; snap; exit 1; }
  unset FLA_DISABLE_BACKEND_DISPATCH
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime; } >> "$ENVLOG" 2>&1
}
# A snapshot every 20 s until the script exits, so a call cut short still brings what it had.
start_snaps() { ( while sleep 20; do snap; done ) & SNAP=$!; trap 'kill $SNAP 2>/dev/null' EXIT; }
# lane_pass PASS LIMIT CUT: one pass of bench/lanes.py (the command in the array LANE), killed after LIMIT seconds and
# cut by lanes.py itself after CUT; its log, its JSON and TileLang's compile counts go under W.
lane_pass() {
  PYTHONPATH=$S5_PP_QLA timeout -k 20 "$2" "${LANE[@]}" --passes "$1" --timeout "$3" --json "$W/$1.json" \
    > "$W/logs/$1.log" 2>&1
  say "$1 rc=$? ($(du -sh "$W/cache" 2>/dev/null | cut -f1) of caches)"
  python3 bench/i25_tilelang_compiles.py "$W/logs/$1.log" > "$W/logs/tilelang-$1.txt" 2>&1
}
