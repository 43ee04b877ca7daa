#!/usr/bin/env bash
# A/B of the engine's run-time switches on one binary, in one call: `gqattn-serve bench`
# (Llama-2-7B, 128 x (32 + 992), gqattn backend) for each KV-head count of E2E_HEADS, once per
# setting in the order given and then in reverse (ABBA for two settings), and a table of total
# seconds and mean decode step per setting. Usage (on the GPU machine, after a build):
#   E2E_HEADS="8 1" scripts/e2e_ab.sh BUILD_DIR OUT_DIR "on:" "off:GQATTN_DISABLE_STEP_OVERLAP=1" ...
# A setting is NAME:VAR=VALUE,VAR2=VALUE (empty after the colon: no variable set); an item that
# starts with -- is a flag of `gqattn-serve bench` instead ("p64:--page-size=64"), and one that
# starts with @ names another build directory whose gqattn-serve runs ("main:@build-main"); E2E_ROUNDS=1
# skips the reversed round. Every run logs
# its GEMM tuning (GQATTN_ENGINE_GEMM_LOG=1) to OUT_DIR/<name>_kv<h>_<round>.log. Exits 1 when
# a run failed (its total is then "?", left out of the best).
set -uo pipefail
build=$1 out=$2; shift 2
mkdir -p "$out"
heads=${E2E_HEADS:-8 1}
summary="$out/summary.txt"
: > "$summary"
status=0
run() {  # run SETTING ROUND
  local name=${1%%:*} vars=${1#*:} round=$2
  local extra="GQATTN_ENGINE_GEMM_LOG=1" env_vars=() flags=() item bin=$build
  for item in $(echo "$vars" | tr ',' ' '); do
    if [[ $item == @* ]]; then bin=${item#@}
    elif [[ $item == --*=* ]]; then flags+=("${item%%=*}" "${item#*=}")
    elif [[ $item == --* ]]; then flags+=("$item")
    else env_vars+=("$item"); fi
  done
  for h in $heads; do
    local log="$out/${name}_kv${h}_$round.log"
    env "${env_vars[@]}" $extra timeout "${E2E_TIMEOUT:-150}" "$bin/gqattn-serve" bench --device cuda \
      --model llama2-7b --num-kv-heads "$h" "${flags[@]}" > "$log" 2>&1 || { echo "$name kv$h round $round: exit $?"; status=1; }
    local total step
    total=$(awk '/^total/ {print $2}' "$log")
    step=$(awk '/^mean decode step/ {print $4}' "$log")
    echo "$name kv$h round $round total ${total:-?} s step ${step:-?} ms" | tee -a "$summary"
  done
}
for s in "$@"; do run "$s" 1; done
settings=("$@")
if [ "${E2E_ROUNDS:-2}" -ge 2 ]; then
  for ((i = ${#settings[@]} - 1; i >= 0; --i)); do run "${settings[$i]}" 2; done
fi
echo "best of two rounds per setting and heads:"
awk '$6 != "?" {k = $1 " " $2; t = $6 + 0; if (!(k in best) || t < best[k]) best[k] = t} END {for (k in best) print k, best[k], "s"}' \
  "$summary" | sort
exit $status
