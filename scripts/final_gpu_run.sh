#!/usr/bin/env bash
# One device call for the session's measurements, most important first, logs tarred after each
# stage so that a time-out still returns what finished. Usage: scripts/final_gpu_run.sh (on the GPU).
export LOG_DIR=${LOG_DIR:-/tmp/L}; mkdir -p "$LOG_DIR"
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$LOG_DIR" . ; }
scripts/gpu_check.sh build > "$LOG_DIR/s_build.txt" 2>&1; tail -2 "$LOG_DIR/s_build.txt"
timeout 120 build-gpu/tests/gqattn_gpu_tests --gtest_filter='GpuPrefill.*:GpuDecode.BitwiseDeterministic' 2>&1 | tail -3
timeout 120 compute-sanitizer --error-exitcode 1 --tool synccheck build-gpu/tests/gqattn_gpu_tests \
  --gtest_filter='GpuDecode.BitwiseDeterministic:GpuPrefill.CachedPrefix*' > "$LOG_DIR/synccheck.log" 2>&1 \
  && echo "synccheck: clean" || tail -5 "$LOG_DIR/synccheck.log"
save
BENCH_FAMILIES=prefill PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa BENCH_ITERS=10 scripts/gpu_check.sh bench 2>&1 | tail -4; save
E2E_TIMEOUT=100 scripts/gpu_check.sh e2e 2>&1 | grep -E "^--|^total|ratio to"; save
BENCH_FAMILIES=decode PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa BENCH_ITERS=20 scripts/gpu_check.sh bench 2>&1 | tail -4; save
