#!/usr/bin/env bash
# Measures the wip/ patches on the GPU in one call: main itself and, for each patch, a copy of the
# tree with the patch applied are built (sm_90a, bf16, hd128 plus the WIP_HEAD_DIMS list: fast);
# the patch's GPU tests run (prefill and decode, both kernel paths, synccheck on the sm_90a
# prefill), and the sweep rows of those head dims, of the family the patch touches, run on main's
# binary and the patched one, WIP_ROUNDS times each (default 2, in the order ABBA), compared by
# bench/compare.py (machines differ by up to 10%, so only an A/B inside one call counts).
# Logs under $LOG_DIR/<patch>/, tarred to $OUT/wip_logs.tgz.
# Usage (on the GPU machine): LOG_DIR=/tmp/W [WIP_HEAD_DIMS="128;256"] [WIP_SWEEP_DIMS="256"] [WIP_ROUNDS=1]
#   [WIP_SWEEP_FILE=bench/sweeps/x.csv] [WIP_TEST_TIMEOUT=300] [WIP_BENCH_TIMEOUT=300]
#   [WIP_NO_TESTS="name ..."] [WIP_NO_PORTABLE=1] [WIP_SETTLE_MS=300] [WIP_RACECHECK=gtest-filter]
#   scripts/wip_check.sh [patch[@sweep.csv[@rounds[@racecheck-filter]]] ...]
# (WIP_SWEEP_DIMS: the head dims whose sweep rows run, default WIP_HEAD_DIMS; a patch's own
# @sweep.csv, @rounds and @racecheck-filter override WIP_SWEEP_FILE, WIP_ROUNDS and WIP_RACECHECK
# for it (empty fields keep them), so patches aimed at different rows share one call and one
# build of main; WIP_NO_TESTS: patches, by name, whose GPU tests already passed unchanged, measured
# only; WIP_SETTLE_MS: idle ms before each row, so that prefill rows do not inherit the power cap
# of the rows before them (perf-notes item 153): by default 300 for prefill sweeps, 0 for decode)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG_DIR=${LOG_DIR:-/tmp/wip-logs}
GTEST=${GQATTN_GTEST_SOURCE_DIR:-$ROOT/.deps/googletest}
PATCHES=${*:-$(ls wip/*.patch)}
status=0
TEST_TIMEOUT=${WIP_TEST_TIMEOUT:-300}  # seconds a test run (65-100 s at hd128, ~210 s at hd 64 / 128 / 256)
HEAD_DIMS=${WIP_HEAD_DIMS:-128}  # e.g. WIP_HEAD_DIMS="256" for a patch aimed at hd256
SWEEP_DIMS=${WIP_SWEEP_DIMS:-$HEAD_DIMS}
# Most GPU tests run at hd128 only, so hd128 is always built (session 12: an hd256-only build
# failed ten tests with "head_dim 128 is not compiled").
[[ ";$HEAD_DIMS;" == *";128;"* ]] || HEAD_DIMS="128;$HEAD_DIMS"
configure() {  # configure SRC BUILD LOG: the fast build every tree of this script uses
  cmake -S "$1" -B "$2" -G Ninja -DGQATTN_CUDA=ON -DGQATTN_CUDA_ARCHS=90a -DGQATTN_HEAD_DIMS="$HEAD_DIMS" \
    -DGQATTN_DTYPES=bf16 -DGQATTN_PYTHON=OFF -DGQATTN_GTEST_SOURCE_DIR="$GTEST" > "$3" 2>&1
}
main_dir=/tmp/wip-tree-main
rm -rf "$main_dir" && mkdir -p "$main_dir" "$LOG_DIR"
tar cf - --exclude=./build* --exclude=./.git . | tar xf - -C "$main_dir"
configure "$main_dir" "$main_dir/build" "$LOG_DIR/main_configure.log" &&
  cmake --build "$main_dir/build" -j "$(nproc)" --target gqattn-bench > "$LOG_DIR/main_build.log" 2>&1 ||
  { echo "main: build failed"; exit 1; }
for spec in $PATCHES; do
  IFS=@ read -r patch sweep_file rounds racecheck <<< "$spec"
  sweep_file=${sweep_file:-${WIP_SWEEP_FILE:-}} rounds=${rounds:-${WIP_ROUNDS:-2}}
  racecheck=${racecheck:-${WIP_RACECHECK:-}}
  name=$(basename "$patch" .patch)
  dir=/tmp/wip-tree-$name logs=$LOG_DIR/$name
  rm -rf "$dir" && mkdir -p "$dir" "$logs"
  tar cf - --exclude=./build* --exclude=./.git . | tar xf - -C "$dir"
  (cd "$dir" && patch -p1 < "$ROOT/$patch" > "$logs/apply.log" 2>&1) || { echo "$name: does not apply"; status=1; continue; }
  echo "=== $name ($(date +%H:%M:%S))"
  configure "$dir" "$dir/build" "$logs/configure.log" &&
    cmake --build "$dir/build" -j "$(nproc)" > "$logs/build.log" 2>&1 || { echo "$name: build failed"; status=1; continue; }
  # ptxas's wgmma-serialisation warnings (C751x but C7517, a note naming another's line: every
  # wgmma waits for the last; session 24's first chained-items build lost 21% that way), against
  # main's build of the bench.
  serial=$(grep -cE "\(C751[0-689]\)" "$logs/build.log"); serial_main=$(grep -cE "\(C751[0-689]\)" "$LOG_DIR/main_build.log")
  [ "$serial" -gt "$serial_main" ] && echo "$name: ptxas serialised wgmmas in $serial kernels (main: $serial_main): grep C751 $logs/build.log"
  T=$dir/build/tests/gqattn_gpu_tests
  if [[ " ${WIP_NO_TESTS:-} " == *" $name "* ]]; then echo "tests: skipped (WIP_NO_TESTS)"; else
    # A hang (a kernel deadlock, or the host looping: session 13's split search) must not take the
    # whole call: TEST_TIMEOUT seconds a run, and a patch whose first test run timed out gets
    # nothing more (its other runs would hang the same way).
    timeout "$TEST_TIMEOUT" "$T" --gtest_filter='GpuPrefill.*:GpuDecode.*' > "$logs/tests.log" 2>&1
    rc=$?
    if [ $rc -eq 124 ]; then
      echo "$name: tests timed out after $TEST_TIMEOUT s in $(grep '^\[ RUN' "$logs/tests.log" | tail -1 | cut -c14-); skipped"
      status=1; continue
    fi
    [ $rc -eq 0 ] || status=1
    # WIP_NO_PORTABLE=1: a patch that leaves the portable kernel alone skips its run (~70 s).
    [ -n "${WIP_NO_PORTABLE:-}" ] && echo "portable-kernel tests: skipped (WIP_NO_PORTABLE)" > "$logs/tests_portable.log" ||
      GQATTN_DISABLE_SM90=1 timeout "$TEST_TIMEOUT" "$T" --gtest_filter='GpuPrefill.*:GpuLargePools.PrefillPastFourGiB:GpuRandomShapes.*' > "$logs/tests_portable.log" 2>&1 || status=1
    timeout "$TEST_TIMEOUT" compute-sanitizer --error-exitcode 1 --tool synccheck "$T" --gtest_filter='GpuPrefill.CachedPrefix*' \
      > "$logs/synccheck.log" 2>&1 && echo "synccheck: clean" || { echo "synccheck: errors"; status=1; }
    # WIP_RACECHECK="GpuDecode.X:GpuDecode.Y" (or the patch's own @filter): racecheck of the patched
    # build on those tests (~20 s each for decode's; session 33 ran it by hand after the script).
    [ -n "$racecheck" ] && { timeout "$TEST_TIMEOUT" compute-sanitizer --error-exitcode 1 --tool racecheck "$T" \
      --gtest_filter="$racecheck" > "$logs/racecheck.log" 2>&1 && echo "racecheck: clean" || { echo "racecheck: errors"; status=1; }; }
    tail -1 "$logs/tests.log"; tail -1 "$logs/tests_portable.log"
  fi
  # The family whose sweep runs: the sweep file's, else from the patch's name (decode-*,
  # prefill-* / sm90-*), else from what it touches.
  if [ -n "$sweep_file" ]; then fam=$(awk -F, 'NR == 2 { print $1 }' "$sweep_file")
  else
    case $name in
      decode-*) fam=decode ;;
      prefill-*|sm90-*) fam=prefill ;;
      *) fam=$(grep -q "attention_sm90\|planner" "$patch" && echo prefill || echo decode) ;;
    esac
  fi
  awk -F, -v dims=";$SWEEP_DIMS;" 'NR == 1 || index(dims, ";" $5 ";") > 0' "${sweep_file:-bench/sweeps/$fam.csv}" \
    > "$logs/sweep.csv"  # the head dims asked for (built); WIP_SWEEP_FILE: a shorter sweep of the same columns
  # WIP_ROUNDS sweeps per binary in the order main, patch, patch, main, main, ... (a drift over
  # the call falls on both alike); compare.py takes each row's best run and reports how far
  # main's own runs differed, the noise this call cannot resolve.
  main_csvs="" ours_csvs=""
  for ((r = 1; r <= rounds; ++r)); do
    order="main ours"; ((r % 2 == 0)) && order="ours main"
    for who in $order; do
      bin=$([ "$who" = main ] && echo "$main_dir" || echo "$dir")/build/gqattn-bench
      timeout "${WIP_BENCH_TIMEOUT:-300}" "$bin" --device cuda --sweep "$logs/sweep.csv" --iters 20 \
        --settle-ms "${WIP_SETTLE_MS:-$([ "$fam" = prefill ] && echo 300 || echo 0)}" --csv "$logs/${who}_${fam}_$r.csv" \
        > "$logs/bench_${who}_$r.log" 2>&1 || status=1
    done
    main_csvs+="${main_csvs:+,}$logs/main_${fam}_$r.csv" ours_csvs+="${ours_csvs:+,}$logs/ours_${fam}_$r.csv"
  done
  python3 bench/compare.py "$main_csvs" "$ours_csvs" > "$logs/compare.txt" 2>&1
  tail -1 "$logs/compare.txt"
  [ -n "${OUT:-}" ] && tar czf "$OUT/wip_logs.tgz" -C "$LOG_DIR" .  # what finished, should the call time out
done
[ -n "${OUT:-}" ] && tar czf "$OUT/wip_logs.tgz" -C "$LOG_DIR" .
exit $status
