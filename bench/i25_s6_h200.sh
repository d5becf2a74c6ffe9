#!/bin/bash
# Issue 25, session 6, on the H200 (16 cores, one GPU): complete the fla-dispatch + flashqla L0 that session 5's run A
# left cut at 517 s (bench/results/s5/d25-S5.tgz, run d25-s5/runs/A/20261202-200900-ed6340; session 4's run was cut
# too and kept no per-task records in the repository, so session 5's run is the one continued). Nothing is run twice:
# the run is continued with `deltacheck run --resume` in its own directory (same selection, same qla environment),
# which runs only the tasks it does not hold every check of (186 of 472 tasks over 94 cases when it starts from
# session 5's records: `bash bench/i25_s6_h200.sh plan` prints them per backend x op, on any machine).
#   call 1:  bash .carry/d25/bench/i25_s6_h200.sh           (carry .qla and .carry/d25; S5_CODE=.carry/d25)
#   call 2:  bash .carry/d25/bench/i25_s6_h200.sh resume    (same carry; continues the same run directory: from
#            /tmp/d25-s6 on a machine still warm, else from call 1's d25-S6.tgz carried back in the checkout at
#            bench/results/s6/d25-S6.tgz, or PREV=<path of that tgz>)
#   CPU:     bash bench/i25_s6_h200.sh plan                 (no library, no GPU: the run it would continue, what is
#            left per backend x op, whether this checkout's selection still matches, the exact command)
# The run: deltacheck run --resume DIR --tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla
#   --threads 1 --task-timeout 420 -j $JOBS (the selection recorded in the run; -j and --threads are not part of it).
#   JOBS default 8: in session 5, 6 workers of this family alone kept the load at 13-15 on the 16 cores (each worker
#   is one torch thread plus TileLang's nvcc and Triton's compiler processes, about 2.3 cores), so 8 workers fill the
#   machine without queueing far past it; the GPU is idle most of the time (first compiles).
# If --resume is refused (another environment fingerprint than session 5's machine, or a checkout that selects other
# cases), the script falls back to a new run of exactly the cases with a task left (`--case` each, both backends,
# $W/cases-left.txt) in $W/runs/A-rest, to be folded with session 5's run by `deltacheck merge`; a later call resumes
# that one instead.
# Hard self-limit: CAP (default 520 s) for the whole call. The run gets `timeout -s INT -k 15` at CAP - elapsed - PACK_S
# (default 25 s); deltacheck's workers die by SIGINT before writing anything judged after it, so the next call's
# --resume runs the interrupted tasks again. Every 20 s and at the end, $W (run directory, logs, walls.tsv, the plan)
# is packed into $OUT/d25-S6.tgz (packed aside, then moved: never torn; logs over 2 MiB slimmed to their TileLang
# compile lines and the run's own lines). Caches: DELTACHECK_CACHE_DIR (default /tmp/s6-cache) holds Triton's,
# TileLang's and tvm-ffi's (harness/records/cachedir.py); TILELANG_JIT_DIAGNOSTICS=1 logs each TileLang compile
# (bench/i25_tilelang_compiles.py counts them into logs/tilelang-MODE.txt). After the run: the issue-25 table
# (bench/results/h25/table.py) of the run directory into logs/table-MODE.md.
# Test hooks (tests/test_i25_s6.py): S6_RUN_CMD replaces `python3 -m deltacheck run` (a fake run on the CPU, no qla
# environment needed); D25_WORK moves $W; S5_ROOT moves the site directories bench/s5_env.sh installs into; MIN_LEFT
# (default 20 s) is the least time left to start a run.
set -u
MODE=${1:-cold}
case $MODE in cold|resume|plan) ;; *) echo "usage: $0 [cold|resume|plan]" >&2; exit 2 ;; esac
R=$PWD; T0=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CAP=${CAP:-520}; PACK_S=${PACK_S:-25}; JOBS=${JOBS:-8}; TASK_TIMEOUT=${TASK_TIMEOUT:-420}
W=${D25_WORK:-/tmp/d25-s6}
S5_TGZ=${S5_TGZ:-$HERE/bench/results/s5/d25-S5.tgz}
S5_RUN=d25-s5/runs/A/20261202-200900-ed6340
PREV=${PREV:-$HERE/bench/results/s6/d25-S6.tgz}
SEL=(--tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla)
OPTS=(--threads 1 --task-timeout "$TASK_TIMEOUT" -j "$JOBS")
if [ "$MODE" != plan ]; then : "${OUT:?OUT must name the folder results go to}"; fi

if [ "$MODE" = plan ]; then  # deltacheck from this checkout, nothing installed
  _dc=$(mktemp -d); ln -s "$HERE" "$_dc/deltacheck"; PP=$_dc
else
  export S5_CODE=${S5_CODE:-$HERE}
  S5_ENV=${S5_ENV:-$R/bench/s5_env.sh}
  [ -f "$S5_ENV" ] || S5_ENV=$HERE/bench/s5_env.sh
  # shellcheck disable=SC1090
  source "$S5_ENV"
  PP=$S5_PP_QLA
fi
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s6-cache}
export TILELANG_JIT_DIAGNOSTICS=${TILELANG_JIT_DIAGNOSTICS:-1}
mkdir -p "$W/runs" "$W/logs"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[d25-s6 $(el)s] $*" | tee -a "$W/logs/script.log"; }
latest() { ls -d "$W/runs/$1"/*/ 2>/dev/null | sort | tail -1 | sed 's:/$::'; }
finished() { [ -n "$1" ] && grep -q '"kind": "end"' "$1/results.jsonl" 2>/dev/null; }
ntasks() { local d; d=$(latest "$1"); [ -z "$d" ] && { echo 0; return; }; cat "$d"/results*.jsonl 2>/dev/null | grep -c '"kind": "task"'; }

# The run directory to continue: $W's (a warm machine), else the previous call's tgz, else session 5's run A.
if [ -z "$(latest A)" ] && [ -z "$(latest A-rest)" ]; then
  if [ "$MODE" != cold ] && [ -f "$PREV" ]; then
    tar -xzf "$PREV" -C "$(dirname "$W")" --transform "s:^d25-s6:$(basename "$W"):" && say "run directories from $PREV"
  fi
  if [ -z "$(latest A)" ] && [ -z "$(latest A-rest)" ]; then
    tmp=$(mktemp -d)
    tar -xzf "$S5_TGZ" -C "$tmp" "$S5_RUN/results.jsonl" && mkdir -p "$W/runs/A" && mv "$tmp/$S5_RUN" "$W/runs/A/" \
      && say "session 5's run A from $S5_TGZ"
    rm -rf "$tmp"
  fi
fi
NAME=A; [ -n "$(latest A-rest)" ] && NAME=A-rest
DIR=$(latest "$NAME")
[ -z "$DIR" ] && { say "no run directory to continue (neither $W, $PREV nor $S5_TGZ held one)"; exit 1; }

# What is left, by this checkout's code (any machine): logs/plan-MODE.txt, $W/cases-left.txt (the fallback's list)
PYTHONPATH=$PP python3 "$HERE/bench/i25_s6_plan.py" "$DIR" --cases-out "$W/cases-left.new" --json "$W/logs/plan-$MODE.json" \
  > "$W/logs/plan-$MODE.txt" 2>&1
PLAN_RC=$?
[ "$NAME" = A ] && mv -f "$W/cases-left.new" "$W/cases-left.txt" || rm -f "$W/cases-left.new"  # A-rest keeps its list
cat "$W/logs/plan-$MODE.txt"
resume_cmd() { echo "python3 -m deltacheck run --resume $DIR ${SEL[*]} ${OPTS[*]}"; }
rest_cmd() { echo "python3 -m deltacheck run --out $W/runs/A-rest --case <each of the $(wc -l < "$W/cases-left.txt") in $W/cases-left.txt> --backend fla-dispatch --backend flashqla ${OPTS[*]}"; }
if [ "$MODE" = plan ]; then
  if finished "$DIR"; then echo "plan: $DIR has finished: nothing to run"
  elif [ "$PLAN_RC" = 3 ]; then echo "plan: --resume would be refused (selection); it would run: $(rest_cmd)"
  else echo "plan: it would run (PYTHONPATH=\$S5_PP_QLA, cut at CAP - elapsed - $PACK_S s): $(resume_cmd)"; fi
  rm -rf "$_dc"
  exit 0
fi

snap() {
  local t="$W.snap$1.tgz" big="$W.big$1" f
  tar -czf "$t" -C "$(dirname "$W")" --transform "s:^$(basename "$W"):d25-s6:" "$(basename "$W")" 2>/dev/null
  if [ "$(stat -c %s "$t" 2>/dev/null || echo 0)" -gt 15728640 ]; then
    (cd "$(dirname "$W")" && find "$(basename "$W")/logs" -type f -name '*.log' -size +2M) > "$big"
    while read -r f; do
      grep -E "TileLang JIT phase (done|failed)|rc=|results:|resuming|NOTHING RAN|Error|Traceback|deltacheck run" \
        "$(dirname "$W")/$f" | tail -n 30000 > "$(dirname "$W")/$f.slim"
    done < "$big"
    tar -czf "$t" -C "$(dirname "$W")" -X "$big" --transform "s:^$(basename "$W"):d25-s6:" "$(basename "$W")" 2>/dev/null
  fi
  mv -f "$t" "$OUT/d25-S6.tgz"
}

say "$MODE: CAP ${CAP}s, -j $JOBS, code ${S5_CODE}, cache $DELTACHECK_CACHE_DIR, run $NAME ($DIR)"
{ date -u; echo "mode $MODE cap $CAP jobs $JOBS code $S5_CODE"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  nvcc --version | tail -1; echo "cores $(nproc); load $(cat /proc/loadavg)"; } >> "$W/logs/machine.txt" 2>&1
if [ -z "${S6_RUN_CMD:-}" ] && ! s5_have qla; then
  say "the qla environment is not installed (carry .qla: bench/s5_env.sh installs it), nothing run"; snap -end; exit 1
fi
[ -n "${S6_RUN_CMD:-}" ] || [ -s "$W/logs/env-qla.txt" ] || (PYTHONPATH=$PP timeout 150 python3 -m deltacheck env > "$W/logs/env-qla.txt" 2>&1 &)
read -r -a RUN <<< "${S6_RUN_CMD:-python3 -m deltacheck run}"

# one KIND ARGS...: one deltacheck run, cut by the cap; its line in walls.tsv; returns its exit status.
one() { local kind=$1; shift
  local left=$(( CAP - $(el) - PACK_S )) t1 rc fin
  [ "$left" -lt "${MIN_LEFT:-20}" ] && { say "$kind: under ${MIN_LEFT:-20} s left, nothing started"; return 124; }
  say "$kind: ${RUN[*]} $* (cut in ${left}s)"
  t1=$(date +%s)
  PYTHONPATH=$PP timeout -s INT -k 15 "$left" "${RUN[@]}" "$@" >> "$W/logs/$NAME-$MODE.log" 2>&1
  rc=$?
  fin=cut; finished "$(latest "$NAME")" && fin=finished
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$NAME" "$kind" "$JOBS" "$MODE" "$(date -u -d @"$t1" +%H:%M:%S)" \
    "$(( t1 - T0 ))" "$(( $(date +%s) - t1 ))" "$rc" "$fin $(latest "$NAME")" >> "$W/walls.tsv"
  say "$kind: rc=$rc, $(( $(date +%s) - t1 ))s, $fin ($(latest "$NAME"))"
  return "$rc"
}

( while sleep 20; do
    echo "t=$(el)s load $(cut -d' ' -f1-3 /proc/loadavg) tasks $NAME:$(ntasks "$NAME")" >> "$W/logs/progress.txt"
    tail -1 "$W/logs/progress.txt"; snap ""
  done ) &
SNAP=$!
CASE_ARGS=()
while read -r c; do [ -n "$c" ] && CASE_ARGS+=(--case "$c"); done < "$W/cases-left.txt"
if finished "$DIR"; then
  say "$NAME ($DIR) has finished: nothing to run"
elif [ "$NAME" = A-rest ]; then
  one resume --resume "$DIR" "${CASE_ARGS[@]}" --backend fla-dispatch --backend flashqla "${OPTS[@]}"
else
  one resume --resume "$DIR" "${SEL[@]}" "${OPTS[@]}"
  rc=$?
  if [ "$rc" = 2 ] && grep -q -- "--resume .*\(another environment\|selection differs\)" "$W/logs/$NAME-$MODE.log"; then
    say "--resume refused (see logs/$NAME-$MODE.log): a new run of the ${#CASE_ARGS[@]} / 2 cases with a task left"
    NAME=A-rest
    one rest --out "$W/runs/A-rest" "${CASE_ARGS[@]}" --backend fla-dispatch --backend flashqla "${OPTS[@]}"
  fi
fi
kill "$SNAP" 2>/dev/null; wait "$SNAP" 2>/dev/null
DIR=$(latest "$NAME")
PYTHONPATH=$PP python3 "$HERE/bench/i25_tilelang_compiles.py" "$W/logs/$NAME-$MODE.log" > "$W/logs/tilelang-$MODE.txt" 2>&1
PYTHONPATH=$PP timeout 60 python3 "$HERE/bench/results/h25/table.py" "$DIR" --json "$W/logs/table-$MODE.json" \
  > "$W/logs/table-$MODE.md" 2>&1
PYTHONPATH=$PP python3 "$HERE/bench/i25_s6_plan.py" "$DIR" > "$W/logs/plan-after-$MODE.txt" 2>&1
du -sh "$DELTACHECK_CACHE_DIR"/* > "$W/logs/cache-sizes-$MODE.txt" 2>&1
snap -end
echo "== walls.tsv (run kind jobs call start_utc start_s wall_s rc state dir)"; cat "$W/walls.tsv" 2>/dev/null
echo "== left after this call"; cat "$W/logs/plan-after-$MODE.txt"
echo "== table"; cat "$W/logs/table-$MODE.md"
echo "== TileLang compiles"; head -12 "$W/logs/tilelang-$MODE.txt"
echo "== $NAME-$MODE.log (tail)"; grep -v "T.vectorized" "$W/logs/$NAME-$MODE.log" | tail -6
ls -la "$OUT"; say "$MODE total $(el)s"
