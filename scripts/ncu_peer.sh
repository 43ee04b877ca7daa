#!/usr/bin/env bash
# ncu on one launch of a PyTorch SDPA backend (scripts/ncu_peer.py) per case: the kernel's name,
# launch figures, occupancy, speed of light and pipe use, to set beside ours (ncu_decode.sh with
# NCU_KERNEL=attention_sm90_kernel). Clocks are left alone.
# Usage: LOG_DIR=dir scripts/ncu_peer.sh "BACKEND HQ HKV D BATCH QO_LEN KV_LEN CAUSAL" [...]
# Writes LOG_DIR/ncu_peer_<n>.txt and prints the main lines of each. NCU_SASS=1: the full set, and
# LOG_DIR/ncu_peer_<n>_sass.csv, each SASS instruction's executions and warp-state samples (as
# ncu_decode.sh's NCU_SASS=1 writes for ours).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${LOG_DIR:-/tmp}; mkdir -p "$LOG_DIR"
n=0
for spec in "$@"; do
  n=$((n + 1))
  # shellcheck disable=SC2086  # spec is the word list of ncu_peer.py's arguments
  if [ "${NCU_SASS:-0}" = 1 ]; then
    what=(--set full -f -o "$LOG_DIR/ncu_peer_rep_$n")
  else
    what=(--section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis
          --section WarpStateStats --print-details all)
  fi
  timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-sdpa|fmha|flash|attn|attention|cudnn}" \
    --launch-skip "${NCU_SKIP:-4}" --launch-count 1 "${what[@]}" --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed \
    python3 scripts/ncu_peer.py $spec > "$LOG_DIR/ncu_peer_$n.txt" 2>&1
  if [ "${NCU_SASS:-0}" = 1 ]; then
    ncu -i "$LOG_DIR/ncu_peer_rep_$n.ncu-rep" --page details --print-details all > "$LOG_DIR/ncu_peer_$n.txt" 2>&1
    ncu -i "$LOG_DIR/ncu_peer_rep_$n.ncu-rep" --page source --csv --print-source sass > "$LOG_DIR/ncu_peer_${n}_sass.csv" 2>&1
    rm -f "$LOG_DIR/ncu_peer_rep_$n.ncu-rep"
  fi
  echo "== $spec"
  grep -E '^  [A-Za-z_].*\(|^ +(Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per Thread|Block Size|Grid Size|Cluster Size|Dynamic Shared Memory Per Block|Static Shared Memory Per Block|Threads|Waves Per SM|Achieved Occupancy|Theoretical Occupancy|Executed Ipc Active|Issue Slots Busy|SM Busy|Warp Cycles Per Issued Instruction|sm__pipe_tensor_cycles_active[.a-z_]*) ' \
    "$LOG_DIR/ncu_peer_$n.txt" | head -30
done
