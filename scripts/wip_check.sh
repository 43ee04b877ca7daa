#!/usr/bin/env bash
# Measures the wip/ patches on the GPU in one call: for each patch, a copy of the tree with the
# patch applied is built (sm_90a, hd128, bf16: fast), its GPU tests run (prefill and decode, both
# kernel paths, synccheck on the sm_90a prefill), and the sweep of the family it touches is
# benchmarked (ours only; compare with bench/results/). Logs under $LOG_DIR/<patch>/, tarred to
# $OUT/wip_logs.tgz. Usage (on the GPU machine): LOG_DIR=/tmp/W scripts/wip_check.sh [patch ...]
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG_DIR=${LOG_DIR:-/tmp/wip-logs}
GTEST=${GQATTN_GTEST_SOURCE_DIR:-$ROOT/.deps/googletest}
PATCHES=${*:-$(ls wip/*.patch)}
status=0
for patch in $PATCHES; do
  name=$(basename "$patch" .patch)
  dir=/tmp/wip-tree-$name logs=$LOG_DIR/$name
  rm -rf "$dir" && mkdir -p "$dir" "$logs"
  tar cf - --exclude=./build* --exclude=./.git . | tar xf - -C "$dir"
  (cd "$dir" && patch -p1 < "$ROOT/$patch" > "$logs/apply.log" 2>&1) || { echo "$name: does not apply"; status=1; continue; }
  echo "=== $name ($(date +%H:%M:%S))"
  cmake -S "$dir" -B "$dir/build" -G Ninja -DGQATTN_CUDA=ON -DGQATTN_CUDA_ARCHS=90a -DGQATTN_HEAD_DIMS=128 \
    -DGQATTN_DTYPES=bf16 -DGQATTN_PYTHON=OFF -DGQATTN_GTEST_SOURCE_DIR="$GTEST" > "$logs/configure.log" 2>&1 &&
    cmake --build "$dir/build" -j "$(nproc)" > "$logs/build.log" 2>&1 || { echo "$name: build failed"; status=1; continue; }
  T=$dir/build/tests/gqattn_gpu_tests
  timeout 300 "$T" --gtest_filter='GpuPrefill.*:GpuDecode.*' > "$logs/tests.log" 2>&1 || status=1
  GQATTN_DISABLE_SM90=1 timeout 300 "$T" --gtest_filter='GpuPrefill.*' > "$logs/tests_portable.log" 2>&1 || status=1
  timeout 300 compute-sanitizer --error-exitcode 1 --tool synccheck "$T" --gtest_filter='GpuPrefill.CachedPrefix*' \
    > "$logs/synccheck.log" 2>&1 && echo "synccheck: clean" || { echo "synccheck: errors"; status=1; }
  tail -1 "$logs/tests.log"; tail -1 "$logs/tests_portable.log"
  fam=$(grep -q "attention_sm90\|planner" "$patch" && echo prefill || echo decode)
  awk -F, 'NR == 1 || $5 == 128' "bench/sweeps/$fam.csv" > "$logs/sweep.csv"  # the head dim this build has
  "$dir/build/gqattn-bench" --device cuda --sweep "$logs/sweep.csv" --iters 20 --csv "$logs/ours_$fam.csv" \
    > "$logs/bench.log" 2>&1 || status=1
  tail -3 "$logs/bench.log"
done
[ -n "${OUT:-}" ] && tar czf "$OUT/wip_logs.tgz" -C "$LOG_DIR" .
exit $status
