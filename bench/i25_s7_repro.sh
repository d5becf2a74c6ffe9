#!/bin/bash
# Issue 25, session 7, on the H200: the four cases whose checks failed when session 6 finished the fla-dispatch L0
# (bench/results/s6/d25-S6.tgz; every other failure of that run is a known-issue entry), each re-run alone so that
# its failure becomes a finding with a cause, or is shown not to reproduce:
#   D  fla-dispatch, as a user gets it (the failures' own runs were -j 8 over the whole family)
#   I  fla-dispatch with TRITON_F32_DEFAULT=ieee (fp32 tl.dot exact instead of TF32: the cause of the shipped entry
#      fla-kda-fp16-safe-gate-forward-tf32, which covers the same FLA kda forward through `fla`)
#   F  fla (dispatch off), the KDA cases only: the same Triton forward FLA serves without dispatch
# Three `deltacheck run`s side by side in the qla environment (bench/s5_env.sh; carry .qla), caches under
# DELTACHECK_CACHE_DIR (/tmp/s7-cache), everything packed into $OUT/d25-S7.tgz every 20 s and at the end.
#   run(command="bash bench/i25_s7_repro.sh", carry=[".qla"], timeout_s=330)
set -u
T0=$(date +%s); CAP=${CAP:-300}
: "${OUT:?OUT must name the folder results go to}"
W=${D25_WORK:-/tmp/d25-s7}
mkdir -p "$W/runs" "$W/logs"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "[d25-s7 $(el)s] $*" | tee -a "$W/logs/script.log"; }
snap() { tar -czf "$W.tgz.part" -C "$(dirname "$W")" --transform "s:^$(basename "$W"):d25-s7:" "$(basename "$W")" \
           2>/dev/null && mv -f "$W.tgz.part" "$OUT/d25-S7.tgz"; }
export S5_CODE=${S5_CODE:-$PWD}
# shellcheck disable=SC1091
source bench/s5_env.sh
s5_have qla || { say "the qla environment is not installed (carry .qla)"; snap; exit 1; }
export PYTHONPATH=$S5_PP_QLA PYTHONUNBUFFERED=1 DELTACHECK_CACHE_DIR=${DELTACHECK_CACHE_DIR:-/tmp/s7-cache}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, triton, fla, deltacheck; print(torch.__version__, triton.__version__, fla.__version__, deltacheck.__file__)"; } \
  > "$W/logs/machine.txt" 2>&1
say "ready: $(tr '\n' ' ' < "$W/logs/machine.txt")"
GDN=(gdn-bf16-bshd-N2-L63-H2/2/2-K128-V64-extreme-beta_one-sigmoid-safegate-alog-bwd
     gdn-fp16-bhsd-N1-L200-H4/4/4-K96-V96-extreme-beta_one-sigmoid-negeig-safegate-alog-h0-bwd)
KDA=(kda-fp16-bshd-N2-L63-H4/4/4-K128-V64-steep-beta_one-safegate-scale0.5
     kda-fp16-bshd-N1-L128-H4/4/4-K128-V64-mild-beta_near2-sigmoid-negeig-safegate-alog-scale0.0625-bwd)
cases() { for c in "$@"; do printf -- '--case\n%s\n' "$c"; done; }
( while sleep 20; do snap; done ) & SNAP=$!
trap 'kill $SNAP 2>/dev/null' EXIT
LEFT=$(( CAP - 20 - $(el) ))
go() {  # name, backend, env assignments..., -- cases
  local name=$1 backend=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  mapfile -t args < <(cases "$@")
  ( env "${envs[@]}" timeout -s INT -k 15 "$LEFT" python3 -m deltacheck run "${args[@]}" --backend "$backend" \
      --out "$W/runs/$name" --threads 1 --task-timeout $(( LEFT - 10 )) -j 2 > "$W/logs/$name.log" 2>&1
    echo "$name rc=$?" >> "$W/logs/rc.txt" ) &
}
go D fla-dispatch X=1 -- "${GDN[@]}" "${KDA[@]}"
go I fla-dispatch TRITON_F32_DEFAULT=ieee -- "${GDN[@]}" "${KDA[@]}"
go F fla X=1 -- "${KDA[@]}"
wait $(jobs -p | grep -v "^$SNAP$") 2>/dev/null
say "runs done: $(tr '\n' ' ' < "$W/logs/rc.txt" 2>/dev/null)"
python3 - "$W" <<'EOF' | tee "$W/logs/summary.txt"
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/runs/*/*/results.jsonl")):
    name = f.split("/runs/")[1].split("/")[0]
    for line in open(f):
        r = json.loads(line)
        if r.get("kind") != "result" or r.get("status") == "skip":
            continue
        m = r.get("metrics") or {}
        if r["check"] in ("forward", "grad_beta", "grad_a_log", "grad_g") or r["status"] != "pass":
            print(name, r["backend"], r["case"], r["check"], r["status"],
                  None if m.get("headroom") is None else round(m["headroom"], 3), m.get("engine", ""))
EOF
kill $SNAP 2>/dev/null; snap
exit 0
