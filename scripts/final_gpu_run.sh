#!/usr/bin/env bash
# A session's GPU work in two device calls of under 10 minutes each, most important first, logs
# tarred to $OUT/logs.tgz after every stage so that a time-out still returns what finished.
#   scripts/final_gpu_run.sh verify    full build, every ctest (and the prefill tests again on the
#                                      portable kernel), Python, memcheck/racecheck/synccheck, and
#                                      the single-case checks below (~7 min)
#   scripts/final_gpu_run.sh measure   prefill and decode sweeps with peers and reports, the engine
#                                      table (gqattn, expand, 55 GiB pool) (over 10 min on the H200:
#                                      prefill ~2.5, e2e ~6.5; MEASURE_E2E=0 or MEASURE_DECODE=0
#                                      leave a part out)
#   scripts/final_gpu_run.sh land      after a kernel change lands: full build, the decode sweep
#                                      with peers and report (first), every ctest, the sanitizer
#                                      subset, the engine's three gqattn runs (~7 min)
#   scripts/final_gpu_run.sh profile   ncu on the decode cases of perf-notes item 19 (MQA 128 x 32K
#                                      against 8 query heads on one K/V head, MHA 128 x 512; 8/1
#                                      heads 128 x 512), cuDNN's kernel on the last two, on the
#                                      Hopper prefill at hd256 and hd128 (1 x 16K; hd128 16 x 1K
#                                      non-causal: the short items, also per SASS instruction
#                                      against 1 x 16K: NCU_SASS=1, ncu_sass_diff.py), and the engine's
#                                      decode step per kernel for MQA and GQA-8 (~5 min)
# A fresh machine keeps nothing: each call builds (about 30 s). Carry .deps (GoogleTest sources).
set -uo pipefail
cd "$(dirname "$0")/.."
export LOG_DIR=${LOG_DIR:-${OUT:-/tmp}/L}; mkdir -p "$LOG_DIR"
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$LOG_DIR" . ; }
export GPU_CHECK_TAR=  # its stages run gpu_check.sh, whose own tarball would repeat this one
mode=${1:-verify}
# A failed build ends the call: the stages after it would run no binary, or on a warm machine (which
# keeps build-gpu) an earlier build's under this commit's name. Exits 1 when a stage failed.
scripts/gpu_check.sh build > "$LOG_DIR/s_build.txt" 2>&1 || { tail -20 "$LOG_DIR/s_build.txt"; save; exit 1; }
tail -1 "$LOG_DIR/s_build.txt"
status=0
case $mode in
  verify)
    scripts/gpu_check.sh test 2>&1 | grep -E "tests passed|tests failed|PASSED|FAILED" | head -20 || status=1; save
    scripts/decode_probe.sh build-gpu/gqattn-bench; save  # items 10 and 12 of docs/perf-notes.md
    PYTEST_TIMEOUT=200 scripts/gpu_check.sh python 2>&1 | grep -E "passed|failed|error" | head -6 || status=1; save
    scripts/gpu_check.sh sanitize 2>&1 | grep -E "clean|ERROR|error" | head -10 || status=1; save
    ;;
  measure)
    # Every row the median of 30 timed calls (BENCHMARKS.md; gpu_check.sh's default), ours and the
    # peers'. Until session 29 prefill took 10 and decode 20: after a 300 ms idle, 10 calls of a
    # long prefill row are a burst above the card's sustained power (1 x 16K non-causal: the first
    # calls at ~700 TFLOP/s, then ~616, ours and cuDNN alike; perf-notes item 159).
    BENCH_FAMILIES=prefill PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa scripts/gpu_check.sh bench 2>&1 | tail -2 || status=1; save
    # The engine table: ~6.5 min on the H200 since the warm-up and the GEMM search (session 45:
    # prefill and e2e together passed the 560 s limit), so MEASURE_E2E=0 leaves it to a call of its
    # own (gpu_check.sh build e2e).
    if [ "${MEASURE_E2E:-1}" = 1 ]; then
      E2E_TIMEOUT=100 scripts/gpu_check.sh e2e 2>&1 | grep -E "^--|^total|ratio to|preempt" || status=1; save
    fi
    [ "${MEASURE_DECODE:-1}" = 0 ] && { echo "decode sweep skipped (MEASURE_DECODE=0)"; save; exit $status; }
    BENCH_FAMILIES=decode PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa scripts/gpu_check.sh bench 2>&1 | tail -2 || status=1; save
    ;;
  land)
    # The decode table first, straight after the build: with the tests and the sanitizers before
    # it, its first rows ran 4-9% slow in sessions 17 and 18 (perf-notes items 89, 103); a table
    # whose tests then fail is not reported.
    BENCH_FAMILIES=decode PEERS=sdpa_flash,sdpa_cudnn,expand_sdpa scripts/gpu_check.sh bench 2>&1 | tail -2 || status=1; save
    # The sweep's first eight rows again after the sweep (printed, not tabled): item 103's check.
    head -9 bench/sweeps/decode.csv > "$LOG_DIR/first_rows.csv"
    build-gpu/gqattn-bench --device cuda --sweep "$LOG_DIR/first_rows.csv" --iters 20 \
      --csv "$LOG_DIR/ours_decode_rerun.csv" > "$LOG_DIR/rerun.log" 2>&1 &&
      python3 bench/compare.py "$LOG_DIR/ours_decode.csv" "$LOG_DIR/ours_decode_rerun.csv" | tail -1; save
    scripts/gpu_check.sh test 2>&1 | grep -E "tests passed|tests failed|PASSED|FAILED" | head -20 || status=1; save
    scripts/gpu_check.sh sanitize 2>&1 | grep -E "clean|ERROR|error" | head -10 || status=1; save
    E2E_RUNS="gqattn:32 gqattn:8 gqattn:1" E2E_TIMEOUT=100 scripts/gpu_check.sh e2e 2>&1 | grep -E "^--|^total|ratio to|preempt" || status=1; save
    ;;
  profile)
    scripts/ncu_decode.sh build-gpu/gqattn-bench "decode,bf16,32,1,128,16,128,1,32768,1" \
      "decode,bf16,8,1,128,16,128,1,32768,1" "decode,bf16,32,32,128,16,128,1,512,1" \
      "decode,bf16,8,1,128,16,128,1,512,1"; save
    # cuDNN's kernel on the last two (perf-notes item 175: ours at 86% / 45% of DRAM bandwidth).
    LOG_DIR=$LOG_DIR/peer scripts/ncu_peer.sh "cudnn 32 32 128 128 1 512 0" "cudnn 8 1 128 128 1 512 0"; save
    # The Hopper prefill at hd256 against hd128 (perf-notes item 20), and short items (16 x 1K
    # non-causal: 0.78x of 1 x 16K's throughput in session 10's table).
    LOG_DIR=$LOG_DIR/prefill NCU_KERNEL=attention_sm90_kernel scripts/ncu_decode.sh build-gpu/gqattn-bench \
      "prefill,bf16,32,32,256,0,1,16384,16384,1" "prefill,bf16,32,32,128,0,1,16384,16384,1" \
      "prefill,bf16,32,32,128,0,16,1024,1024,0"; save
    # The short items instruction by instruction against steady state (perf-notes item 48).
    NCU_SASS=1 NCU_TIMEOUT=200 LOG_DIR=$LOG_DIR/sass NCU_KERNEL=attention_sm90_kernel scripts/ncu_decode.sh \
      build-gpu/gqattn-bench "prefill,bf16,32,32,128,0,16,1024,1024,0" "prefill,bf16,32,32,128,0,1,16384,16384,0"
    python3 scripts/ncu_sass_diff.py "$LOG_DIR/sass/ncu_1_sass.csv" "$LOG_DIR/sass/ncu_2_sass.csv" --scale 0.0625 \
      > "$LOG_DIR/sass_diff.txt" 2>&1; head -20 "$LOG_DIR/sass_diff.txt"; save
    for heads in 1 8; do
      timeout 150 scripts/profile_engine.sh build-gpu "$heads" "$LOG_DIR/prof_kv$heads.csv" \
        > "$LOG_DIR/prof_kv$heads.txt" 2>&1; head -16 "$LOG_DIR/prof_kv$heads.txt"; rm -f "$LOG_DIR/prof_kv$heads.csv"; save
    done
    ;;
  *) echo "final_gpu_run.sh: unknown mode '$mode' (verify, measure, land or profile)"; exit 2 ;;
esac
save
exit $status
