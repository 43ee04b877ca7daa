#!/usr/bin/env bash
# A session's GPU work in two device calls of under 10 minutes each, most important first, logs
# tarred to $OUT/logs.tgz after every stage so that a time-out still returns what finished.
#   scripts/final_gpu_run.sh verify    full build, every ctest (and the prefill tests again on the
#                                      portable kernel), Python, memcheck/racecheck/synccheck, and
#                                      the single-case checks below (~7 min)
#   scripts/final_gpu_run.sh measure   prefill and decode sweeps with peers and reports, the engine
#                                      table (gqattn, expand, 55 GiB pool) (~6-8 min)
# A fresh machine keeps nothing: each call builds (about 30 s). Carry .deps (GoogleTest sources).
set -uo pipefail
cd "$(dirname "$0")/.."
export LOG_DIR=${LOG_DIR:-${OUT:-/tmp}/L}; mkdir -p "$LOG_DIR"
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$LOG_DIR" . ; }
mode=${1:-verify}
scripts/gpu_check.sh build > "$LOG_DIR/s_build.txt" 2>&1; tail -1 "$LOG_DIR/s_build.txt"
case $mode in
  verify)
    scripts/gpu_check.sh test 2>&1 | grep -E "tests passed|tests failed|PASSED|FAILED" | head -20; save
    scripts/decode_probe.sh build-gpu/gqattn-bench; save  # items 10 and 12 of docs/perf-notes.md
    PYTEST_TIMEOUT=200 scripts/gpu_check.sh python 2>&1 | grep -E "passed|failed|error" | head -6; save
    scripts/gpu_check.sh sanitize 2>&1 | grep -E "clean|ERROR|error" | head -10; save
    ;;
  measure)
    BENCH_FAMILIES=prefill PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa BENCH_ITERS=10 scripts/gpu_check.sh bench 2>&1 | tail -2; save
    E2E_TIMEOUT=100 scripts/gpu_check.sh e2e 2>&1 | grep -E "^--|^total|ratio to|preempt"; save
    BENCH_FAMILIES=decode PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa BENCH_ITERS=20 scripts/gpu_check.sh bench 2>&1 | tail -2; save
    ;;
  *) echo "final_gpu_run.sh: unknown mode '$mode' (verify or measure)"; exit 2 ;;
esac
save
