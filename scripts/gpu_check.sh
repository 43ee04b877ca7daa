#!/usr/bin/env bash
# One call on the GPU machine: configure + build for sm_90a, run the whole test suite, the
# Python tests, the compute-sanitizer subset, the kernel benchmarks (ours, ceilings, peers) with
# their report, and the engine's end-to-end table.
# Usage: LOG_DIR=/path scripts/gpu_check.sh [stage ...]
#   stages: build test python sanitize bench e2e (default: all)
# Env: GQ_COMMIT (the commit the reports name; the device's copy of .git can lag the working tree),
#      BENCH_FAMILIES (decode prefill), BENCH_ITERS, PEERS (peers.py --peers list), SKIP_PEERS=1,
#      BENCH_SETTLE_MS (idle ms before each prefill row, ours and the peers'; default 300, 0: none),
#      E2E_RUNS (default: all nine: gqattn, expand and --kv-pool-gib 55 at 32, 8 and 1 KV heads),
#      CTEST_TIMEOUT (seconds a test may run, default 300; lower it where a new kernel may hang),
#      SAN_TIMEOUT (seconds each compute-sanitizer tool may run, default 400).
# Needs CUDA, CMake, ninja, python3 with torch; GoogleTest sources in .deps/googletest (copied from
# Debian's googletest package: cp -r /usr/src/googletest .deps/) or GQATTN_GTEST_SOURCE_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/build_env.sh
source scripts/build_env.sh  # gqattn_smi_fields, gqattn_cache_args
LOG_DIR=${LOG_DIR:-/tmp/gqattn-logs}   # $OUT returns at most 8 files: everything is tarred there at the end
BUILD=${GQATTN_BUILD_DIR:-build-gpu}
GTEST=${GQATTN_GTEST_SOURCE_DIR:-$PWD/.deps/googletest}
STAGES=${*:-build test python sanitize bench e2e}
BENCH_ITERS=${BENCH_ITERS:-30}
mkdir -p "$LOG_DIR"
status=0
has() { [[ " $STAGES " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date +%H:%M:%S))"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$LOG_DIR/gpu.txt" 2>&1
cat "$LOG_DIR/gpu.txt"

if has build; then
  step build
  # GQATTN_HEAD_DIMS / GQATTN_DTYPES unset: CMake's defaults (every head dim and dtype), not the lists
  # a build dir kept from an earlier call on a warm machine has cached (v201's four head dims, bf16).
  mapfile -t lists < <(gqattn_cache_args GQATTN_HEAD_DIMS GQATTN_DTYPES)
  cmake -S . -B "$BUILD" -G Ninja -DGQATTN_CUDA=ON -DGQATTN_CUDA_ARCHS="${GQATTN_CUDA_ARCHS:-90a}" "${lists[@]}" \
    -DGQATTN_GTEST_SOURCE_DIR="$GTEST" -DPython_EXECUTABLE="$(command -v python3)" > "$LOG_DIR/configure.log" 2>&1 || { tail -30 "$LOG_DIR/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" > "$LOG_DIR/build.log" 2>&1 || { grep -E "error|Error" -A3 "$LOG_DIR/build.log" | head -60; exit 1; }
  grep -E "spill|registers" "$LOG_DIR/build.log" | sort | uniq -c | head -40 > "$LOG_DIR/ptxas.txt" || true
fi

if has test; then
  step test
  ctest --test-dir "$BUILD" --output-on-failure -j 4 --timeout "${CTEST_TIMEOUT:-300}" > "$LOG_DIR/ctest.log" 2>&1 || status=1
  tail -25 "$LOG_DIR/ctest.log"
  # The prefill tests once more on the portable (mma.sync) kernel, which Hopper otherwise skips
  # (with its K/V past 4 GiB, its random shapes, and decode's 128-row items split and unsplit).
  GQATTN_DISABLE_SM90=1 timeout 300 "$BUILD/tests/gqattn_gpu_tests" \
    --gtest_filter='GpuPrefill.*:GpuLargePools.PrefillPastFourGiB:GpuRandomShapes.*:GpuDecode.DraftTokensWithManyRowsSplitLikeUnsplit' \
    > "$LOG_DIR/ctest_portable_prefill.log" 2>&1 || status=1
  tail -3 "$LOG_DIR/ctest_portable_prefill.log"
fi

if has python; then
  step python
  # GPU-marked tests first and in their own process, so a crash elsewhere cannot hide them; a
  # crashing run is repeated under cuda-gdb (it debugs host code too) for a C++ backtrace.
  py_run() {
    local name=$1; shift
    PYTHONPATH="$BUILD/python" timeout "${PYTEST_TIMEOUT:-300}" python3 -X faulthandler -m pytest -q -rs \
      -p no:cacheprovider "$@" tests/python > "$LOG_DIR/pytest_$name.log" 2>&1
    local rc=$?
    tail -6 "$LOG_DIR/pytest_$name.log"
    if [ $rc -ge 128 ] || grep -q "Fatal Python error" "$LOG_DIR/pytest_$name.log"; then
      PYTHONPATH="$BUILD/python" timeout 240 cuda-gdb -batch -ex run -ex bt --args python3 -m pytest -x -q \
        -p no:cacheprovider "$@" tests/python > "$LOG_DIR/pytest_${name}_gdb.log" 2>&1
      grep -A25 "received signal" "$LOG_DIR/pytest_${name}_gdb.log" | head -40
    fi
    [ $rc -eq 0 ] || [ $rc -eq 5 ]
  }
  py_run gpu -m gpu || status=1
  py_run cpu -m "not gpu" || status=1
fi

if has sanitize; then
  step sanitize
  SAN="timeout ${SAN_TIMEOUT:-400} compute-sanitizer --error-exitcode 1"
  T="$BUILD/tests/gqattn_gpu_tests"
  # Every decode family (BitwiseDeterministicEveryFamily: decode, decode_many, decode_mid / _wide,
  # decode_long at hd64, the wgmma kernel's split_item_keys items with and without the merge) and
  # the Hopper kernel's TMA-loaded whole-tile pages.
  $SAN --tool memcheck "$T" --gtest_filter='GpuDecode.BitwiseDeterministic*:GpuDecode.EveryHeadDim*:GpuDecode.WideRowsWithARequestForEverySm:GpuDecode.WideRowsSplitOnTheWgmmaKernel:GpuPrefill.EveryHeadDim*:GpuPrefill.WholeTilePagesEveryHeadDim:GpuAppendKV.*:GpuMergeStates.*:GpuPlanLimits.WorkspaceOneByteShort' \
    > "$LOG_DIR/memcheck.log" 2>&1 && echo "memcheck: clean" || { status=1; tail -30 "$LOG_DIR/memcheck.log"; }
  $SAN --tool racecheck "$T" --gtest_filter='GpuDecode.BitwiseDeterministic*:GpuDecode.WideRowsSplitOnTheWgmmaKernel:GpuPrefill.CachedPrefix*:GpuPrefill.ManyItemsPerCta:GpuPrefill.WideItemsAtHeadDim64:GpuDecode.ManyRequestsOnTheSmallTileFamily:GpuPrefill.CausalTilesPastAWarpgroupsRowsHeadDim256' \
    > "$LOG_DIR/racecheck.log" 2>&1 && echo "racecheck: clean" || { status=1; tail -30 "$LOG_DIR/racecheck.log"; }
  # The portable prefill kernel, which Hopper runs only under GQATTN_DISABLE_SM90 (sm_80's path).
  for tool in memcheck racecheck; do
    GQATTN_DISABLE_SM90=1 $SAN --tool $tool "$T" \
      --gtest_filter='GpuPrefill.CachedPrefixCausalAlignment:GpuPrefill.OddLengthsAllGroupSizesRaggedAndPaged' \
      > "$LOG_DIR/${tool}_portable.log" 2>&1 &&
      echo "$tool (portable prefill): clean" || { status=1; tail -30 "$LOG_DIR/${tool}_portable.log"; }
  done
  # The engine's block reductions (add_rmsnorm's vector and scalar kernels, argmax).
  $SAN --tool racecheck "$BUILD/tests/gqattn_engine_gpu_tests" --gtest_filter='ComputeOps.AddRmsnorm*:ComputeOps.Argmax*' \
    > "$LOG_DIR/racecheck_engine.log" 2>&1 && echo "racecheck (engine): clean" ||
    { status=1; tail -30 "$LOG_DIR/racecheck_engine.log"; }
  $SAN --tool synccheck "$T" --gtest_filter='GpuDecode.BitwiseDeterministic:GpuDecode.WideRowsSplitOnTheWgmmaKernel:GpuPrefill.CachedPrefix*:GpuPrefill.WideItemsAtHeadDim64:GpuPrefill.CausalTilesPastAWarpgroupsRowsHeadDim256' \
    > "$LOG_DIR/synccheck.log" 2>&1 && echo "synccheck: clean" || { status=1; tail -30 "$LOG_DIR/synccheck.log"; }
fi

# The clocks seen (BENCHMARKS.md): nvidia-smi samples every 250 ms while a phase runs, summarised
# by report.py (--clock-log), which also flags phases whose median SM clocks differ by > 5%. They
# explained session 28's prefill drift (one process's repeats of a 330 us row at 355 .. 315 us):
# the power cap (perf-notes items 152-153).
# The fifth column, whether the power cap holds the clock, shows when a compute-bound row ran
# below the card's top clock (perf-notes item 159).
cap_field=$(gqattn_smi_fields clocks_event_reasons.sw_power_cap)
watch_clocks() {  # watch_clocks FILE: sample until the returned pid is killed
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,$cap_field --format=csv,noheader,nounits -lms 250 \
    > "$1" 2>/dev/null &
  echo $!
}
# Prefill rows, ours and the peers', each after BENCH_SETTLE_MS of idle GPU (default 300): run back
# to back, our prefill sweep held the card at its 700 W cap and the SM clock at a median 1755-1770
# MHz while the peers' rows, between Python's gaps, ran at 1965; with the idle before each row ours
# ran at 1980 and 1.107x faster (perf-notes item 153). Decode rows are not power-bound (both ~1965
# MHz) and run without it.
if has bench; then
  step bench
  for fam in ${BENCH_FAMILIES:-decode prefill}; do
    sweep=${BENCH_SWEEP_DIR:-bench/sweeps}/$fam.csv
    settle=$([ "$fam" = prefill ] && echo "${BENCH_SETTLE_MS:-300}" || echo 0)
    watcher=$(watch_clocks "$LOG_DIR/clocks_ours_$fam.csv")
    "$BUILD/gqattn-bench" --device cuda --sweep "$sweep" --iters "$BENCH_ITERS" --settle-ms "$settle" --csv "$LOG_DIR/ours_$fam.csv" \
      > "$LOG_DIR/ours_$fam.log" 2>&1 || { status=1; tail -20 "$LOG_DIR/ours_$fam.log"; }
    kill "$watcher" 2>/dev/null
    tail -5 "$LOG_DIR/ours_$fam.log"
    clock_logs=(--clock-log "gqattn=$LOG_DIR/clocks_ours_$fam.csv")
    if [ -z "${SKIP_PEERS:-}" ]; then
      watcher=$(watch_clocks "$LOG_DIR/clocks_peers_$fam.csv")
      PYTHONUNBUFFERED=1 python3 bench/peers.py --sweep "$sweep" --csv "$LOG_DIR/peers_$fam.csv" ${PEERS:+--peers "$PEERS"} \
        --ceilings "$LOG_DIR/ours_$fam.csv" --iters "$BENCH_ITERS" --settle-ms "$settle" > "$LOG_DIR/peers_$fam.log" 2>&1 || { status=1; tail -20 "$LOG_DIR/peers_$fam.log"; }
      kill "$watcher" 2>/dev/null
      clock_logs+=(--clock-log "peers=$LOG_DIR/clocks_peers_$fam.csv")
    fi
    peers_csv=$([ -z "${SKIP_PEERS:-}" ] && echo "$LOG_DIR/peers_$fam.csv")
    gpu_name=$(head -2 "$LOG_DIR/gpu.txt" | tail -1 | cut -d, -f1)
    # The card in the file name (h100, h200, ...), from nvidia-smi's name, not assumed.
    gpu_tag=$(grep -oiE 'h[0-9]{3}|a100|l40s?|b[0-9]{3}' <<< "$gpu_name" | head -1 | tr 'A-Z' 'a-z')
    python3 bench/report.py --csv "$LOG_DIR/ours_$fam.csv" $peers_csv "${clock_logs[@]}" \
      --out-prefix "$LOG_DIR/$(date +%Y-%m-%d)_${gpu_tag:-gpu}_$fam" --gpu "$gpu_name" \
      --commit "${GQ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
      --command "scripts/gpu_check.sh bench (gqattn-bench and peers.py --settle-ms $settle)" \
      > "$LOG_DIR/report_$fam.log" 2>&1 || { status=1; tail -20 "$LOG_DIR/report_$fam.log"; }
  done
fi

if has e2e; then
  step e2e
  E2E_CSV="$LOG_DIR/e2e.csv"
  e2e() {
    local name=$1; shift
    timeout "${E2E_TIMEOUT:-240}" "$BUILD/gqattn-serve" bench --device cuda --model llama2-7b --csv "$E2E_CSV" "$@" \
      > "$LOG_DIR/e2e_$name.log" 2>&1 || status=1
    echo "-- $name"; grep -E "^(model|total|output|mean|floor|ratio|preempt|CUDA)|error|gqattn-serve:" "$LOG_DIR/e2e_$name.log"
  }
  for run in ${E2E_RUNS:-gqattn:32 gqattn:8 gqattn:1 expand:32 expand:8 expand:1 pool55:32 pool55:8 pool55:1}; do
    kind=${run%%:*} heads=${run##*:}
    case $kind in
      gqattn) e2e "gqattn_kv$heads" --num-kv-heads "$heads" ;;
      expand) e2e "expand_kv$heads" --num-kv-heads "$heads" --attention expand ;;
      pool55) e2e "pool55_kv$heads" --num-kv-heads "$heads" --kv-pool-gib 55 ;;
    esac
  done
fi

step "done (status $status)"
# $OUT/${GPU_CHECK_TAR}.tgz (default gpu_check.tgz, never final_gpu_run.sh's logs.tgz: in sessions 68
# and 69 a later gpu_check.sh in the same call overwrote it and a prefill table was lost);
# GPU_CHECK_TAR= (empty) writes none: device_plan.sh and final_gpu_run.sh tar their own log folders.
tar_name=${GPU_CHECK_TAR-gpu_check}
if [ -n "${OUT:-}" ] && [ -n "$tar_name" ]; then tar czf "$OUT/$tar_name.tgz" -C "$LOG_DIR" . ; fi
exit $status
