#!/usr/bin/env bash
# Issue 26 on the H200, session 5 (helper d26): the rest of L0's causality and graph replay (and every serving check
# that applies) for the fused backends that run there. From the device checkout root, on a warm machine whose
# earlier calls installed the packages (bench/s5_env.sh):
#   S5_CODE=.carry/d26 bash .carry/d26/bench/serving_i26_s5_h200.sh            (first call; ends by CAP = 560 s)
#   S5_CODE=.carry/d26 bash .carry/d26/bench/serving_i26_s5_h200.sh resume     (CAP = 400 s: only what is missing)
# Eight workers (NPROC) over one GPU take jobs from one queue in priority order; each job is one process with its
# own results file (serving_run --resume FILE.jsonl: a later call keeps every judged check and runs the rest) and a
# budget that ends before CAP (no new check in the last MARGIN s; the process is killed 5 s before CAP). A job whose
# last run left nothing unrun is marked done and skipped by a later call. Jobs:
#   train        deltacheck run (training checks) of kda_cutile's two beta_zero + bf16 h0 cases that were non-finite
#                in R2's serving checks outside every known-issue entry, with --backend cudnn@kda_cutile; then the
#                four bf16 cases of R2's non-finite graph replays with cudnn@kda_cutile and routed cudnn (Part C's
#                evidence: does an entry's `where` cover them in deltacheck run's checks?)
#   gdnc-1..5    cudnn@gdn_cutile, then routed cudnn on the same cases (warm cuTile cache): the L0 cases R2 left
#                (bench/serving_i26_s5_cases/, from bench/serving_i26_s5_lists.py: 43 and 39)
#   kdac         cudnn@kda_cutile: R2's 2 unreached cases
#   qla-1..2     flashqla: the 31 L0 cases S4 left (10 run, the rest decline), FLA's dispatch off
#   fi, fid      flashinfer, flashinfer-decode: every check over L0 and the serving tier L0
#   kdah, kdahc  cudnn@kda_hopper (CuTe DSL), cudnn@kda_hopper_cuda (NVRTC): causality + graph replay over L0 kda
#   flad-1..3    fla-dispatch (FLA with its dispatch on: FlashQLA, TileLang, Triton): causality + graph replay, L0
# cuDNN processes run under s5_cutile_env (CUDA_HOME unset); the others keep CUDA_HOME (TileLang's nvcc).
# Known issues: serving_run and deltacheck run apply the shipped table (harness/ci/known_issues.toml) by default.
# Returns $OUT/d26-S5.tgz (logs, results JSONL, `deltacheck env` per environment, tables), refreshed every 20 s.
set -u
T0=$(date +%s); MODE=${1:-}
if [ "$MODE" = resume ]; then TAG=S5b; CAP=${CAP:-400}; else TAG=S5a; CAP=${CAP:-560}; fi
NPROC=${NPROC:-8}; MARGIN=${MARGIN:-15}
D=$(cd "$(dirname "$0")" && pwd)            # this script's bench/ (the case lists, the tally)
L=${S5_LOGS:-/tmp/d26-s5}; Q=$L/.queue
OUT=${OUT:-/tmp/d26-out}; mkdir -p "$L" "$OUT"
export PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s5-cache}
# shellcheck disable=SC1090
source "${S5_ENV:-bench/s5_env.sh}" >> "$L/env-$TAG.txt" 2>&1 || echo "sourcing ${S5_ENV:-bench/s5_env.sh} failed" >> "$L/env-$TAG.txt"
{ date -u; echo "mode ${MODE:-first} CAP=$CAP NPROC=$NPROC code=${S5_CODE:-?}"
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1; nproc
  for n in cutile cudnn fla dsl fi qla; do s5_have $n 2>/dev/null && printf ' %s' "$n"; done; echo " installed"
  echo "setup $(( $(date +%s) - T0 ))s"; } >> "$L/env-$TAG.txt" 2>&1
left() { echo $(( CAP - ($(date +%s) - T0) )); }
log() { echo "$(date -u +%T) +$(( $(date +%s) - T0 ))s $*" >> "$L/times.txt"; }
snap() { tar czf "$L.snap.tgz" -C "$(dirname "$L")" "$(basename "$L")" 2>/dev/null && mv "$L.snap.tgz" "$OUT/d26-S5.tgz"; }
have() { local n; for n in "$@"; do s5_have "$n" 2>/dev/null || return 1; done; }
cases() { local f=$D/serving_i26_s5_cases/$1.txt id; [ -f "$f" ] || return; while IFS= read -r id; do
  [ -n "$id" ] && printf -- '--case\n%s\n' "$id"; done < "$f"; }

# One serving_run: serve JOB PYTHONPATH ARGS... ; results appended to $L/JOB.jsonl
serve() {
  local job=$1 path=$2; shift 2; local t=$(date +%s) budget=$(( $(left) - MARGIN )) rc
  [ "$budget" -gt 20 ] || { log "$job skipped: ${budget}s left"; return 3; }
  PYTHONPATH=$path timeout -k 3 "$(( budget + MARGIN - 8 ))" python3 -m deltacheck.harness.run.serving_run \
    --tier L0 --serving-tier L0 --budget-s "$budget" --resume "$L/$job.jsonl" "$@" >> "$L/$job.log" 2>&1
  rc=$?; log "$job rc=$rc $(( $(date +%s) - t ))s"
  # Done when the process ended by itself and its last table has nothing not run (column 9).
  if [ "$rc" -le 1 ] && awk '/^backend check run/{s=0; h=1; next} h && NF==10 && $3 ~ /^[0-9]+$/ {s+=$9}
      END{exit !(h && s==0)}' "$L/$job.log"; then touch "$L/$job.done"; fi
  return "$rc"
}
# s5_cutile_env in the caller's subshell only (it unsets CUDA_HOME, which TileLang needs).
job() {
  local j=$1 i=${1##*-}
  case $j in
    train)
      have cudnn cutile || { log "$j: cudnn/cutile not installed"; return; }
      s5_cutile_env
      local t=$(date +%s) budget=$(( $(left) - MARGIN )); [ "$budget" -gt 60 ] || { log "$j skipped"; return; }
      local run=(--case 'kda-bf16-bhsd-N1-L64-H1/1/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-scale0.0625-h0'
                 --case 'kda-bf16-thd-N5-T[65_0_1_200_3]-H2/2/4-K128-V128-extreme-state_bf16-beta_zero-l2norm-h0')
      local more=(--case 'kda-bf16-bhsd-N4-L31-H2/2/4-K128-V128-trained-beta_one-l2norm-sigmoid-h0'
                  --case 'kda-bf16-bshd-N2-L129-H2/2/2-K128-V128-extreme')
      [ -f "$L/train-a.done" ] || { PYTHONPATH=$S5_PP_CUDNN timeout -k 3 "$budget" python3 -m deltacheck run \
        "${run[@]}" --backend cudnn@kda_cutile --out "$L/train-a" --task-timeout 240 >> "$L/train.log" 2>&1
        local rc=$?; log "train-a rc=$rc $(( $(date +%s) - t ))s"; [ "$rc" -le 1 ] && touch "$L/train-a.done"; }
      t=$(date +%s); budget=$(( $(left) - MARGIN )); [ "$budget" -gt 60 ] || return
      [ -f "$L/train-b.done" ] || { PYTHONPATH=$S5_PP_CUDNN timeout -k 3 "$budget" python3 -m deltacheck run \
        "${run[@]}" "${more[@]}" --backend cudnn --backend cudnn@kda_cutile --out "$L/train-b" --task-timeout 240 \
        >> "$L/train.log" 2>&1; local rc=$?; log "train-b rc=$rc $(( $(date +%s) - t ))s"
        [ "$rc" -le 1 ] && touch "$L/train-b.done"; } ;;
    gdnc-*)
      have cudnn cutile || { log "$j: cudnn/cutile not installed"; return; }
      s5_cutile_env
      local a b; mapfile -t a < <(cases "gdn_cutile-$i"); mapfile -t b < <(cases "cudnn_gdn-$i")
      [ -f "$L/gdn_cutile-$i.done" ] || [ "${#a[@]}" -eq 0 ] || serve "gdn_cutile-$i" "$S5_PP_CUDNN" \
        --backend cudnn@gdn_cutile --checks causality,graph_replay "${a[@]}"
      [ -f "$L/cudnn_gdn-$i.done" ] || [ "${#b[@]}" -eq 0 ] || serve "cudnn_gdn-$i" "$S5_PP_CUDNN" \
        --backend cudnn --checks causality,graph_replay "${b[@]}" ;;
    kdac)
      have cudnn cutile || { log "$j: cudnn/cutile not installed"; return; }
      s5_cutile_env; local a; mapfile -t a < <(cases kda_cutile)
      [ "${#a[@]}" -gt 0 ] || { log "$j: no cases listed"; return; }
      serve kda_cutile "$S5_PP_CUDNN" --backend cudnn@kda_cutile --checks causality,graph_replay "${a[@]}" ;;
    qla-*)
      have qla || { log "$j: qla not installed"; return; }
      local a; mapfile -t a < <(cases flashqla)
      [ "${#a[@]}" -gt 0 ] || { log "$j: no cases listed"; return; }
      export FLA_DISABLE_BACKEND_DISPATCH=1   # flashqla itself, not FLA's dispatch to it (as S4 ran it)
      serve "flashqla-$i" "$S5_PP_QLA" --backend flashqla \
        --checks causality,graph_replay --shard "$i/2" "${a[@]}" ;;
    fi|fid)
      have fi || { log "$j: flashinfer not installed"; return; }
      local b=flashinfer; [ "$j" = fid ] && b=flashinfer-decode
      serve "$b" "$S5_PP_FI" --backend "$b" --op gdn ;;   # every check (serving_run's default)
    kdah)
      have cudnn dsl || { log "$j: cudnn/dsl not installed"; return; }
      s5_cutile_env; serve kda_hopper "$S5_PP_KDAH" --backend cudnn@kda_hopper --op kda --checks causality,graph_replay ;;
    kdahc)
      have cudnn || { log "$j: cudnn not installed"; return; }
      s5_cutile_env; serve kda_hopper_cuda "$S5_PP_KDAH" --backend cudnn@kda_hopper_cuda --op kda \
        --checks causality,graph_replay ;;
    flad-*)
      have qla || { log "$j: qla not installed"; return; }
      unset FLA_DISABLE_BACKEND_DISPATCH   # fla-dispatch: FLA's dispatch on (the backend refuses it off)
      serve "fla-dispatch-$i" "$S5_PP_QLA" --backend fla-dispatch --checks causality,graph_replay --shard "$i/3" ;;
    *) log "unknown job $j" ;;
  esac
}
# Jobs that need no run this call (marked done by an earlier one) stay out of the queue.
done_already() {
  case $1 in
    train) [ -f "$L/train-a.done" ] && [ -f "$L/train-b.done" ] ;;
    gdnc-*) [ -f "$L/gdn_cutile-${1##*-}.done" ] && [ -f "$L/cudnn_gdn-${1##*-}.done" ] ;;
    kdac) [ -f "$L/kda_cutile.done" ] ;;
    qla-*) [ -f "$L/flashqla-${1##*-}.done" ] ;;
    fi) [ -f "$L/flashinfer.done" ] ;;
    fid) [ -f "$L/flashinfer-decode.done" ] ;;
    kdah) [ -f "$L/kda_hopper.done" ] ;;
    kdahc) [ -f "$L/kda_hopper_cuda.done" ] ;;
    flad-*) [ -f "$L/fla-dispatch-${1##*-}.done" ] ;;
    *) return 1 ;;
  esac
}
: > "$Q"
for j in train gdnc-1 gdnc-2 gdnc-3 gdnc-4 gdnc-5 kdac qla-1 qla-2 fi fid kdah kdahc flad-1 flad-2 flad-3; do
  done_already "$j" && log "$j: done in an earlier call" || echo "$j" >> "$Q"
done
# The next job, under a mkdir lock (atomic; no flock needed on the device image).
take() { local j; until mkdir "$Q.lock.d" 2>/dev/null; do sleep 0.1; done
  j=$(head -n 1 "$Q"); [ -n "$j" ] && sed -i 1d "$Q"; rmdir "$Q.lock.d"; echo "$j"; }
rm -rf "$Q.lock.d"
worker() { local j; while [ "$(left)" -gt $(( MARGIN + 20 )) ] && j=$(take) && [ -n "$j" ]; do
  log "worker $1 takes $j"; ( job "$j" ); done; }

# `deltacheck env` per environment, beside the workers (first call only; a few seconds each).
if [ "$TAG" = S5a ]; then (
  for e in CUDNN KDAH FI QLA FLA; do pp=S5_PP_$e
    ( case $e in CUDNN|KDAH) s5_cutile_env 2>/dev/null ;; esac
      PYTHONPATH=${!pp:-} timeout 90 python3 -m deltacheck env > "$L/deltacheck-env-$e.txt" 2>&1 )
  done ) & fi
( while sleep 20; do snap; done ) & SNAP=$!
PIDS=(); for w in $(seq 1 "$NPROC"); do worker "$w" & PIDS+=($!); done
wait "${PIDS[@]}"
kill "$SNAP" 2>/dev/null
log "workers done; queue left: $(tr '\n' ' ' < "$Q")"
# Tables: this session's results alone (serving_run's own table), then the tally over S4 + R2 + S5 (bench/serving_i26_tally.py).
PYTHONPATH=${S5_PP_FLA:-} timeout 60 python3 - "$L" > "$L/table-$TAG.txt" 2>&1 <<'EOF'
import glob, sys
from deltacheck.harness.run.serving_run import load_done, table
rows = {(r["backend"], r["check"], r["case"]): r for p in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for r in load_done(p)[0]}
print(table(list(rows.values())))
EOF
PYTHONPATH=${S5_PP_FLA:-} timeout 120 python3 "$D/serving_i26_tally.py" "$D/results/serving-i26-h200" \
  "$D/results/serving-i26-h200-r2" "$L" > "$L/tally-$TAG.txt" 2>&1
du -sh "$DELTACHECK_CACHE_DIR" >> "$L/env-$TAG.txt" 2>&1
cat "$L/times.txt" "$L/table-$TAG.txt"; grep -h "^FAILED\|^ERROR" "$L"/*.log 2>/dev/null | cut -c1-300 | head -40
snap
echo "total $(( $(date +%s) - T0 ))s"
