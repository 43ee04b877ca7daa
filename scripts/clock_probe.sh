#!/usr/bin/env bash
# The spread of one prefill row's time from run to run, and the card's clock state meanwhile:
# each row of ROWS.csv (a sweep file) runs REPEATS times in a row under each "iters:settle_ms"
# setting, one gqattn-bench process per setting, while nvidia-smi samples every 50 ms with a
# timestamp, the SM clock, the power draw and the active clock event reasons (power cap, thermal
# and hardware slowdowns). Prints each row's TFLOP/s per repeat and, per setting, the share of
# samples with the power cap active (docs/perf-notes.md, item 159).
# Usage (on the GPU machine): scripts/clock_probe.sh BENCH ROWS.csv REPEATS "30:300 10:300" [LOG_DIR]
set -uo pipefail
bench=$1 rows=$2 repeats=$3 settings=$4 log=${5:-${LOG_DIR:-/tmp}/clock_probe}
mkdir -p "$log"
# shellcheck source=scripts/build_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_env.sh"  # gqattn_smi_fields
fields=$(gqattn_smi_fields clocks.sm,power.draw,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown)
{ head -1 "$rows"; for _ in $(seq "$repeats"); do tail -n +2 "$rows"; done; } > "$log/rows.csv"
for setting in $settings; do
  iters=${setting%%:*} settle=${setting##*:} name=i${iters}_s${settle}  # no ":" in names ($OUT drops them)
  nvidia-smi --query-gpu=timestamp,$fields --format=csv,noheader -lms 50 > "$log/clocks_$name.csv" 2>&1 &
  watcher=$!
  "$bench" --device cuda --sweep "$log/rows.csv" --iters "$iters" --settle-ms "$settle" \
    --csv "$log/ours_$name.csv" > "$log/ours_$name.log" 2>&1 || { echo "gqattn-bench failed"; tail -5 "$log/ours_$name.log"; }
  kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
  echo "== iters $iters, settle $settle ms"
  python3 - "$log/ours_$name.csv" "$log/clocks_$name.csv" <<'EOF'
import csv, sys
from collections import defaultdict
runs = defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    if r["family"] == "prefill" and r["status"] == "ok":
        key = f'{r["num_qo_heads"]}/{r["num_kv_heads"]} hd{r["head_dim"]} page {r["page_size"]} {r["batch"]}x{r["kv_len"]} causal {r["causal"]}'
        runs[key].append(float(r["achieved"]))
for key, vals in runs.items():
    print(f"  {key}: " + " ".join(f"{v:.1f}" for v in vals) + f"  (spread {max(vals) / min(vals):.3f}x)")
samples = [l.split(", ") for l in open(sys.argv[2]) if l.count(",") >= 5]
busy = [s for s in samples if float(s[2].split()[0]) > 300]  # power.draw in W: the kernel running
if busy:
    cap = sum(s[3].strip() == "Active" for s in busy)
    clocks = sorted(int(s[1].split()[0]) for s in busy)
    print(f"  samples above 300 W: {len(busy)} of {len(samples)}; power cap active in {cap}; "
          f"SM clock {clocks[0]}-{clocks[-1]} MHz (median {clocks[len(clocks) // 2]}); "
          f"hw slowdown {sum(s[4].strip() == 'Active' for s in busy)}, thermal {sum(s[5].strip() == 'Active' for s in busy)}")
EOF
done
