#!/bin/bash
# Issue 25, session 5, on the H200 (16 cores, one GPU), beside another helper's script on the other 8 cores:
# the two L0 runs that never finished or never ran, as the lane issue 25 times (8 workers in all, bench/lanes.py).
#   cold call:   bash .carry/d25/bench/i25_s5_h200.sh           CAP 560 s
#   next call:   bash .carry/d25/bench/i25_s5_h200.sh resume    CAP 400 s
#   on a fresh machine: PREV=<path of the earlier d25-S5.tgz in the checkout> bash .carry/d25/bench/i25_s5_h200.sh resume
# Carry: .carry/d25 (plus whatever bench/s5_env.sh installs from: .qla for A; .fi, .dsl/a, .dsl/b, .whl for F).
# It sources bench/s5_env.sh of the checkout (S5_ENV=FILE to use another) with S5_CODE = this script's checkout
# (.carry/d25 when run from there), so every worker imports this code.
#   A (S5_PP_QLA: FLA 0.6 + flash-qla 0.1.3 + tilelang 0.1.15 + tvm-ffi 0.1.12 + z3), -j 6:
#     deltacheck run --tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla --threads 1 --task-timeout 420
#   F (S5_PP_FI: FlashInfer 0.7.2 + CuTe DSL 4.8.1 + cuDNN FE 1.32 + tvm-ffi 0.1.15), -j 2:
#     deltacheck run --tier L0 --backend flashinfer --backend flashinfer-decode --threads 1 --task-timeout 420
#     (naming these backends appends their envelope cases to L0, harness/backends/table.py TIER_ON_DEMAND)
# Each lane, in its own loop: a cold run into $W/runs/NAME; a run cut by the cap continues with `--resume DIR` in the
# next call (same selection and environment; the worker count may differ, it is not part of the selection); a run
# that has finished is followed, while at least WARM_MIN s (default 75) are left, by a WARM pass of the same command
# into $W/runs/NAME-warm (caches as the cold run left them): its wall time is the lane's warm number. A cut warm pass
# is not resumed (its wall would mean nothing); the next call starts another. Once F has finished both passes, A's
# next start gets F's 2 workers too (-j 8). Every start, its wall time, exit status and whether it finished is a line
# of $W/walls.tsv.
# Cut: `timeout -s INT -k 15` reaches the whole process group; deltacheck's workers die by SIGINT before writing
# anything judged after it (harness/run/worker.py), so `--resume` runs the interrupted task again; nothing is recorded
# as a kernel error. JIT caches: DELTACHECK_CACHE_DIR=/tmp/s5-cache (shared with the other script): Triton's,
# TileLang's and tvm-ffi's caches go under it (harness/records/cachedir.py), and the CuTe DSL's (CUTE_DSL_CACHE_DIR,
# set here). logs/jit-cache-MODE.txt lists the TileLang kernels built (time, size) and counts Triton's.
# $OUT/d25-S5.tgz (run directories, logs, `deltacheck env` of both environments, walls.tsv, progress, cache sizes) is
# re-packed every 20 s and at the end, at most 15 MiB (big logs slimmed first, see snap).
set -u
MODE=${1:-cold}
R=$PWD; T0=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$MODE" = resume ]; then CAP=${CAP:-400}; else CAP=${CAP:-560}; fi
: "${OUT:?OUT must name the folder results go to}"
WARM_MIN=${WARM_MIN:-75}
A_JOBS=${A_JOBS:-6}; F_JOBS=${F_JOBS:-2}; TASK_TIMEOUT=${TASK_TIMEOUT:-420}
export S5_CODE=${S5_CODE:-$HERE}
S5_ENV=${S5_ENV:-$R/bench/s5_env.sh}
[ -f "$S5_ENV" ] || S5_ENV=$HERE/bench/s5_env.sh
# shellcheck disable=SC1090
source "$S5_ENV"
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s5-cache}
# TileLang logs each JIT phase it runs (tilelang/jit/diagnostics.py: "TileLang JIT phase done: cache.compile
# elapsed=...s ... cache_key=..., kernel=..."): what the cold pass compiled, for how long, and whether two workers
# built one kernel (bench/i25_tilelang_compiles.py reads the logs). Logging only: no cache key or build changes.
export TILELANG_JIT_DIAGNOSTICS=${TILELANG_JIT_DIAGNOSTICS:-1}
W=${D25_WORK:-/tmp/d25-s5}
# A fresh machine has lost /tmp: PREV=<an earlier call's d25-S5.tgz, carried> brings its run directories back, so
# the runs continue with --resume (cold caches, same environment).
if [ ! -d "$W/runs" ] && [ -n "${PREV:-}" ] && [ -f "$PREV" ]; then
  mkdir -p "$(dirname "$W")" && tar -xzf "$PREV" -C "$(dirname "$W")" && rm -f "$W/F.done" && echo "runs from $PREV"
fi
mkdir -p "$W/runs" "$W/logs" "$DELTACHECK_CACHE_DIR"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[d25 $(el)s] $*" | tee -a "$W/logs/script.log"; }
finished() { [ -n "$1" ] && grep -q '"kind": "end"' "$1/results.jsonl" 2>/dev/null; }
latest() { ls -d "$W/runs/$1"/*/ 2>/dev/null | sort | tail -1 | sed 's:/$::'; }
ntasks() { local d; d=$(latest "$1"); [ -z "$d" ] && { echo 0; return; }; cat "$d"/results*.jsonl 2>/dev/null | grep -c '"kind": "task"'; }

# snap: everything under $W into $OUT/d25-S5.tgz, packed aside first so the file is never torn. Past 15 MiB, a log
# over 2 MiB goes in as NAME.slim (its TileLang compile lines, the script's and the run's own lines, errors) instead;
# still past it, every file over 2 MiB but the results is left out.
snap() {
  local t="$W.snap$1.tgz" big="$W.big$1" f
  tar -czf "$t" -C "$(dirname "$W")" "$(basename "$W")" 2>/dev/null
  if [ "$(stat -c %s "$t" 2>/dev/null || echo 0)" -gt 15728640 ]; then
    (cd "$(dirname "$W")" && find "$(basename "$W")/logs" -type f -name '*.log' -size +2M) > "$big"
    while read -r f; do
      grep -E "TileLang JIT phase|rc=|results:|NOTHING RAN|Error|Traceback|deltacheck run" "$(dirname "$W")/$f" \
        | tail -n 30000 > "$(dirname "$W")/$f.slim"
    done < "$big"
    tar -czf "$t" -C "$(dirname "$W")" -X "$big" "$(basename "$W")" 2>/dev/null
  fi
  if [ "$(stat -c %s "$t" 2>/dev/null || echo 0)" -gt 15728640 ]; then
    (cd "$(dirname "$W")" && find "$(basename "$W")" -type f -size +2M ! -name 'results*.jsonl') > "$big"
    tar -czf "$t" -C "$(dirname "$W")" -X "$big" "$(basename "$W")" 2>/dev/null
  fi
  mv -f "$t" "$OUT/d25-S5.tgz"
}

say "$MODE: CAP ${CAP}s, code $S5_CODE, env $S5_ENV, cache $DELTACHECK_CACHE_DIR, work $W"
{ date -u; echo "mode $MODE cap $CAP code $S5_CODE"; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  nvcc --version | tail -1; echo "cores $(nproc); load $(cat /proc/loadavg)"; } >> "$W/logs/machine.txt" 2>&1
HAVE_A=0; HAVE_F=0
s5_have qla && HAVE_A=1
s5_have fi && HAVE_F=1
say "installed: qla=$HAVE_A fi=$HAVE_F"
# `deltacheck env` of each environment, once per machine (the first call), beside the runs
[ $HAVE_A = 1 ] && [ ! -s "$W/logs/env-qla.txt" ] && \
  (PYTHONPATH=$S5_PP_QLA timeout 150 python3 -m deltacheck env > "$W/logs/env-qla.txt" 2>&1 &)
[ $HAVE_F = 1 ] && [ ! -s "$W/logs/env-fi.txt" ] && \
  (PYTHONPATH=$S5_PP_FI timeout 150 python3 -m deltacheck env > "$W/logs/env-fi.txt" 2>&1 &)

# one NAME KIND JOBS PYTHONPATH ARGS...: one deltacheck run (KIND cold: --out; resume: --resume the latest
# directory; warm: --out NAME-warm), cut by the cap (15 s left for the last pack); its line in walls.tsv.
one() { local name=$1 kind=$2 jobs=$3 pp=$4; shift 4
  local left=$(( CAP - $(el) - 15 )) where dir t1 rc
  case $kind in
    resume) dir=$(latest "$name"); where=(--resume "$dir") ;;
    warm) where=(--out "$W/runs/$name-warm") ;;
    *) where=(--out "$W/runs/$name") ;;
  esac
  say "$name $kind: deltacheck run ${where[*]} $* -j $jobs (cut in ${left}s)"
  t1=$(date +%s)
  PYTHONPATH=$pp timeout -s INT -k 15 "$left" python3 -m deltacheck run "${where[@]}" "$@" -j "$jobs" \
    >> "$W/logs/$name-$kind.log" 2>&1
  rc=$?
  [ "$kind" = warm ] && dir=$(latest "$name-warm") || dir=$(latest "$name")
  local fin=cut; finished "$dir" && fin=finished
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$jobs" "$MODE" "$(date -u -d @"$t1" +%H:%M:%S)" \
    "$(( t1 - T0 ))" "$(( $(date +%s) - t1 ))" "$rc" "$fin $dir" >> "$W/walls.tsv"
  say "$name $kind: rc=$rc, $(( $(date +%s) - t1 ))s, $fin ($dir)"
  [ $fin = finished ]
}

# lane NAME JOBS PYTHONPATH ARGS...: cold (or resume) until finished, then one warm pass; stops at a cut.
lane() { local name=$1 jobs=$2 pp=$3; shift 3
  local dir
  while :; do
    dir=$(latest "$name")
    [ $(( CAP - $(el) - 15 )) -lt 20 ] && { say "$name: under 20 s left, nothing started"; break; }
    [ "$name" = A ] && [ -f "$W/F.done" ] && jobs=$(( A_JOBS + F_JOBS ))
    if [ -z "$dir" ]; then one "$name" cold "$jobs" "$pp" "$@" || break
    elif ! finished "$dir"; then one "$name" resume "$jobs" "$pp" "$@" || break
    elif finished "$(latest "$name-warm")"; then say "$name: cold and warm passes both finished"; break
    elif [ $(( CAP - $(el) - 15 )) -lt "$WARM_MIN" ]; then say "$name: finished; under ${WARM_MIN}s left, no warm pass"; break
    else one "$name" warm "$jobs" "$pp" "$@"; break
    fi
  done
  [ "$name" = F ] && finished "$(latest F-warm)" && touch "$W/F.done"
}

A_ARGS=(--tier L0 --op gdn --op kda --backend fla-dispatch --backend flashqla --threads 1 --task-timeout "$TASK_TIMEOUT")
# The CuTe DSL's file cache (FlashInfer's kernels; default /tmp/<user>/cutlass_python_cache) beside the others.
export CUTE_DSL_CACHE_DIR=${CUTE_DSL_CACHE_DIR:-$DELTACHECK_CACHE_DIR/cute-dsl}
F_ARGS=(--tier L0 --backend flashinfer --backend flashinfer-decode --threads 1 --task-timeout "$TASK_TIMEOUT")
PIDS=()
if [ $HAVE_F = 1 ]; then lane F "$F_JOBS" "$S5_PP_FI" "${F_ARGS[@]}" & PIDS+=($!)
else say "F: FlashInfer's environment is not installed (s5_have fi), not run"; touch "$W/F.done"; fi
if [ $HAVE_A = 1 ]; then lane A "$A_JOBS" "$S5_PP_QLA" "${A_ARGS[@]}" & PIDS+=($!)
else say "A: the qla environment is not installed (s5_have qla), not run"; fi

( while sleep 20; do
    echo "t=$(el)s load $(cut -d' ' -f1-3 /proc/loadavg) tasks A:$(ntasks A) A-warm:$(ntasks A-warm) F:$(ntasks F) F-warm:$(ntasks F-warm)" \
      >> "$W/logs/progress.txt"
    tail -1 "$W/logs/progress.txt"; snap ""
  done ) &
SNAP=$!
[ ${#PIDS[@]} -gt 0 ] && wait "${PIDS[@]}"
kill "$SNAP" 2>/dev/null; wait "$SNAP" 2>/dev/null
du -sh "$DELTACHECK_CACHE_DIR"/* > "$W/logs/cache-sizes-$MODE.txt" 2>&1
# What was compiled, and when (the cache is shared with the other script: its kernels are counted too): one line
# per TileLang kernel library (mtime, bytes, path), and the number of Triton kernel directories.
{ echo "tilelang .so files: $(find "$DELTACHECK_CACHE_DIR/tilelang" -type f -name '*.so' 2>/dev/null | wc -l)"
  echo "triton kernel dirs: $(ls "$DELTACHECK_CACHE_DIR/triton" 2>/dev/null | wc -l)"
  find "$DELTACHECK_CACHE_DIR/tilelang" -type f -name '*.so' -printf '%TH:%TM:%.2TS %s %P\n' 2>/dev/null | sort
} > "$W/logs/jit-cache-$MODE.txt"
snap -end
echo "== walls.tsv (lane kind jobs call start_utc start_s wall_s rc state dir)"; cat "$W/walls.tsv" 2>/dev/null
for f in "$W"/logs/*-*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -v "T.vectorized" "$f" | tail -4; }; done
cat "$W/logs/cache-sizes-$MODE.txt"; ls -la "$OUT"; say "$MODE total $(el)s"
