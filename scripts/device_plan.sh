#!/usr/bin/env bash
# The standing device plan (docs/perf-notes.md, "Left for the next session"), one step a device
# call, so that a session with a GPU runs each step as one short command:
#   run: scripts/device_plan.sh STEP      (carry .deps: mkdir -p .deps && cp -r /usr/src/googletest .deps/)
# Each step tars its logs into $OUT/STEP.tgz (after every stage, so a time-out keeps what finished)
# and names the commit $GQ_COMMIT (default: git rev-parse --short HEAD, where .git came along, with
# "+changes" where the tree differs from it; pass GQ_COMMIT=<sha> in the run command to be sure).
# Steps, in the plan's order (device seconds estimated); several may run in one call, one after
# another (each tars its own logs):
# (Steps h1 and h2, items 195 + 197, ran in session 38 and landed: perf-notes item 199.)
#   v201  main after items 187 + 189 landed on SASS identity with their session-38 binaries (perf-notes
#         item 201): the GPU tests at hd 64 / 80 / 128 / 256 and the sanitizers, whose racecheck
#         names both items' tests, and session 40's review fixes and GPU tests (gpu_check.sh build
#         test sanitize, ~300 s)
#   t213  item 213 (decode splits a partial last wave; landed in session 43) on this tree: the v201
#         build, ctest and sanitizers, then the wave rows' A/B, then
#         split_probe.sh with fixed chunks of 128 / 256 / 512 keys on the rows that trail cuDNN (~400 s;
#         T213_STAGES="build test": without the sanitizers, ~320 s)
#   l213  after items 200 (hd80 four stages) and 213 landed:
#         final_gpu_run.sh land (full build, the decode table with peers, every test, sanitizers,
#         the engine's gqattn runs), then the wave rows (bench/sweeps/ab/decode_waves_hd128.csv)
#         with and without the partial-wave split (GQATTN_DISABLE_PARTIAL_WAVE_SPLIT=1) (~470 s)
# (Steps w216, e188 and w192 ran in session 44: item 216 rejected, items 188 and 192 landed;
# g221 ran in session 45: its patch rejected, perf-notes item 226.)
# (Steps pe, p64, hnd and l2p ran in session 46: perf-notes items 234-237; l2p's patch rejected.
# Steps gsk, gqk and gsu ran in session 48: perf-notes item 246, their three patches rejected;
# gmc ran in session 49: item 251, the clustered patches gck and gqc would have measured deleted;
# d32 ran in session 51: item 258, its patch rejected; dl128 (twice) and dpf ran in session 52:
# items 262 and 264, their patches rejected; cm ran in session 53: item 267, its patch rejected;
# ml (twice) and mt ran in session 54: item 272, the tree merge landed, the lanes forms rejected;
# mp ran in session 55: item 274, the epilogue's row skip landed, the two prefetches rejected;
# lt ran in session 57: item 276, its patch rejected; qp ran in session 63: item 288, item 286's patch
# landed, items 285 and 287's rejected; ph ran in session 65: item 294; ip ran in session 67 (its
# hd64 and turn-only patches): items 300-301, item 299's three patches deleted; so ran in session 68:
# items 302-303, item 303's patch deleted; fe ran in session 68: items 304-305, item 302's patch landed,
# the two exp2 patches deleted; ts ran in session 69: item 307, item 306's patch landed; hx ran in
# session 70: item 308, its patch rejected.)
#   pe    the engine's decode step per kernel, ncu (profile_engine.sh): MHA and MQA at ~180 tokens
#         of context, MHA at ~730 (~200 s)
#   land  scripts/final_gpu_run.sh land, after a landing (~400 s)
#   l215  land, then split_probe.sh with fixed chunks (item 215) on the batch-1 long rows (~500 s)
#   n96   ncu of decode hd96 against hd128, MHA 16 x 8K (a build of the two head dims, ~150 s)
#   pord  item 263: the rows furthest behind cuDNN with random pages and pages in order, then
#         cuDNN on them (a build of hd128 bf16, ~60 s)
#   l2f   item 314: the bench's small decode cases (bench/sweeps/ab/decode_l2_flush.csv) with the
#         256 MB read before each call and without it (GQATTN_BENCH_NO_L2_FLUSH=1), then cuDNN on
#         them (a build of hd128 bf16, ~150 s)
#   s72   l2f, then that build's GPU tests (gpu_check.sh test) and sanitizer subsets (gpu_check.sh
#         sanitize, item 318's wider ones) (~450 s)
#   ncg   cuDNN's decode kernel (ncu, enable_gqa as the bench runs it) and ours on the four rows
#         furthest behind it (8/1 heads 128 x 2K and 512, 32/4 and MQA 32 x 512) (~150 s)
#   ncp   ncu --set full of cuDNN's hd128 prefill kernel and ours, MHA non-causal 1 x 16K and 16 x 1K
#         (or NCP_ROWS), with per-instruction SASS exports (a build of one head dim; 45 s warm, item 277),
#         and turn_stalls.txt: each export's exponential turns and their stall reasons
#         (scripts/ncu_turn_stalls.py; for hd64: NCP_ROWS="32 32 64 8 2048 2048 1")
#   flexd, flexp  the decode (prefill) sweep, ours beside FlexAttention and cuDNN's SDPA in one call:
#         the issue's FlexAttention peer, left out of the tables since session 2 for its compile
#         time (one torch.compile a shape, ~110 decode and ~40 prefill shapes) (~500-560 s each)
#   tl    item 271: wip/diag-timeline.patch applied (per-CTA %globaltimer stamps of the attention
#         kernel and the split merge), the decode rows under 60 us and eight larger ones without
#         and with the stamps; timeline.csv: a line a row (~60 s)
#   tlp   item 280: wip/diag-timeline.patch's stamps of the wgmma prefill kernel's item boundary (WG1's
#         release of Q, the producer past its wait, WG0 at and past its wait for Q, the first K
#         tile) on bench/sweeps/ab/prefill_two_q_v2_hd128.csv (a build of hd128 bf16, ~90 s)
#   g1    the 33 hd128 decode rows of >= 1 GB of K/V (issue 3's 4.2 TB/s target,
#         bench/sweeps/ab/decode_1gb_hd128.csv): split_probe.sh with fixed chunks of 1K / 2K / 4K keys
#         against the planner's plan (rows whose split does not fit the workspace left out), then
#         tl's stamps on the same rows: do finer chunks shorten the tails of one-wave plans (a build
#         of hd128 bf16, ~200 s; in session 55 split_probe stopped at the 1K run's three misfits, so
#         2K and 4K did not run)
#   ph    item 293's open question: wip/diag-sm90-phases.patch applied (%clock64 spans of the
#         two-consumer hd64 kernel's tile loop, CTA 0's consumer warp 0 of each warpgroup, read
#         back under GQATTN_DIAG_PHASES), six hd64 rows on that kernel; phases.txt: the median
#         cycles a tile of each phase, a line a row and warpgroup (a build of hd64 bf16, ~60 s)
#   check (no GPU; ctest `device_plan_ready`): every wip/*.patch applies to this tree (stacked ones
#         on the patch below them), and every sweep and GPU test the steps name exists (each pattern
#         of gpu_check.sh's and wip_check.sh's gtest filters too), so a change to main that breaks a
#         planned call fails in CI, not on the device
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
step=${1:?usage: scripts/device_plan.sh v201|t213|l213|pe|land|l215|n96|pord|l2f|s72|ncg|ncp|flexd|flexp|tl|tlp|g1|ph|check}
# The patches each step applies (the later on top of the earlier), and what its commands name.
STACKS=()  # each a string "LOWER UPPER ...": a patch applied on the ones before it (none now)
# Left to rebase by hand onto items 195 + 197 (their kernel lines conflict with the head-dims
# change; regen_wip.sh stops there): check skips them, saying so.
NEEDS_REBASE=" "
WAVES=bench/sweeps/ab/decode_waves_hd128.csv
L2F=bench/sweeps/ab/decode_l2_flush.csv
below() {  # below PATCH: the patches under PATCH in its stack (STACKS), in order; none if unstacked
  local s p
  for s in "${STACKS[@]}"; do
    [[ " $s " == *" $1 "* ]] || continue
    for p in $s; do [[ $p == "$1" ]] && return; echo "$p"; done
  done
}
if [[ $step == check ]]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  status=0
  # A copy of the tree as a repository of its own: git apply inside another repository's work tree
  # (a TMPDIR there) would skip every path outside it and report success.
  copy() {
    rm -rf "$tmp/t" && mkdir "$tmp/t" && tar cf - --exclude=./build* --exclude=./.git --exclude=./.deps . | tar xf - -C "$tmp/t"
    git init -q "$tmp/t"
  }
  apply_all() {  # apply_all PATCH...: in order, on a fresh copy
    copy
    local p
    for p in "$@"; do
      if [[ "$NEEDS_REBASE" == *" $p "* ]]; then
        echo "device_plan check: skipped: $p (to rebase by hand onto items 195 + 197: wip/README.md)"; return 1
      fi
      (cd "$tmp/t" && git apply "$ROOT/$p" > "$tmp/apply.log" 2>&1) ||
        { echo "device_plan check: $p does not apply${2:+ (stack: $*)}: scripts/regen_wip.sh $* rewrites it onto HEAD"
          head -5 "$tmp/apply.log"; status=1; return 1; }
    done
  }
  stacked=" "
  for s in "${STACKS[@]}"; do
    # shellcheck disable=SC2086
    apply_all $s && echo "device_plan check: applies: $s"
    stacked+="$s "  # each member applied in its stack (the ones above need those below)
  done
  for p in wip/*.patch; do
    [[ -e $p ]] || continue  # no patch in wip/
    [[ "$stacked" == *" $p "* ]] && continue
    apply_all "$p" && echo "device_plan check: applies: $p"
  done
  [[ -f $WAVES ]] || { echo "device_plan check: $WAVES (for l213) is missing"; status=1; }
  [[ -f $L2F ]] || { echo "device_plan check: $L2F (for l2f) is missing"; status=1; }
  # The GPU scripts' fixed gtest filters (gpu_check.sh's portable rerun and sanitizers, wip_check.sh's
  # runs): a renamed test leaves a pattern that matches nothing, which gtest and compute-sanitizer
  # report as a clean pass. Each against its binary's sources (gqattn_engine_gpu_tests:
  # tests/engine/gpu, gqattn_gpu_tests: tests/gpu).
  while IFS= read -r line; do
    dir=tests/gpu; [[ $line == *gqattn_engine_gpu_tests* ]] && dir=tests/engine/gpu
    filter=${line#*gtest_filter=\'}; filter=${filter%%\'*}
    IFS=: read -ra pats <<< "$filter"
    for t in "${pats[@]}"; do
      re="TEST(_F)?\\(${t%%.*}, ${t#*.}\\)"; re=${re//\*/[A-Za-z0-9_]*}
      grep -rqE "$re" "$dir" ||
        { echo "device_plan check: gtest filter $t (${line%%:*}) matches no test in $dir"; status=1; }
    done
  done < <(grep -HE "gtest_filter='" scripts/gpu_check.sh scripts/wip_check.sh)
  [[ $status == 0 ]] && echo "device_plan check: every planned call's patches, sweeps and tests are there"
  exit $status
fi

OUT=${OUT:-/tmp/dp-out}
mkdir -p "$OUT"
# The device's copy of .git can lag the working tree (session 43's table named 92a0b20 for 60341f6):
# a tree that differs from that HEAD is named "<HEAD>+changes", never as HEAD itself.
if [[ -z "${GQ_COMMIT:-}" ]]; then
  GQ_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ $GQ_COMMIT == unknown ]] || git diff --quiet HEAD -- . 2>/dev/null || GQ_COMMIT+="+changes"
fi
export GQ_COMMIT
[[ -d .deps/googletest ]] || echo "device_plan: no .deps/googletest (carry it): the builds will look for GTest"
L=/tmp/dp-logs-$step
rm -rf "$L" && mkdir -p "$L"
# Every step's logs live under $L and leave as $OUT/$step.tgz; gpu_check.sh writes no logs.tgz of its
# own here, which would overwrite one from a command run before this step in the same call.
export GPU_CHECK_TAR=
save() { tar czf "$OUT/$step.tgz.part" -C "$L" . 2>/dev/null && mv "$OUT/$step.tgz.part" "$OUT/$step.tgz"; }
# Every 45 s as well, so that a call stopped at its time limit still returns the logs so far. At the
# end the saver stops its sleep (left running, it held the call's output open for up to 45 s more)
# and is waited for (a save of its own still running would write the same .part as the last one).
( trap 'kill $! 2>/dev/null; exit 0' TERM; while :; do sleep 45 & wait $!; save; done ) > /dev/null 2>&1 &
saver=$!
trap 'kill $saver 2>/dev/null; wait $saver 2>/dev/null; save' EXIT

# The engine A/B of an engine patch's step: E2E_AB_TWICE's K/V heads in the order A, B, ..., then back
# (ABBA), then E2E_AB_ONCE's once a setting (e2e_ab.sh); the two summaries printed. Usage:
# engine_ab A B [C ...].
engine_ab() {
  local rc=0
  E2E_HEADS=$E2E_AB_TWICE E2E_TIMEOUT=90 scripts/e2e_ab.sh build-gpu "$L/ab_twice" "$@" || rc=1; save
  E2E_HEADS=$E2E_AB_ONCE E2E_ROUNDS=1 E2E_TIMEOUT=90 scripts/e2e_ab.sh build-gpu "$L/ab_once" "$@" || rc=1
  cat "$L/ab_twice/summary.txt" "$L/ab_once/summary.txt"
  return $rc
}

# An engine patch's step (session 48's gsk, gqk and gsu; no step calls it now): main's
# engine built in build-main (where an earlier call on this machine has not left it), PATCHES
# applied in order and built, the engine's whole GPU suite and memcheck of FILTER, then engine_ab of
# the arms, the first the patched engine (its tuner's "gemm planes" lines printed, where it has
# them; kept in build-STEP, statically linked, as a later step's arm); the patches reverted. MHA
# twice an arm, GQA-8 and MQA once. Usage: patch_ab "PATCHES" FILTER ARM...
patch_ab() {
  local patches=$1 filter=$2 p rc=0 reverse=""
  shift 2
  [[ -x build-main/gqattn-serve ]] ||
    GQATTN_BUILD_DIR=build-main GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L/main scripts/gpu_check.sh build ||
    return 1
  for p in $patches; do
    git apply "$p" || { rc=1; break; }
    reverse="$p $reverse"
  done
  [[ $rc == 0 ]] && { GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || rc=1; }
  if [[ $rc == 0 ]]; then
    mkdir -p "build-$step" && cp build-gpu/gqattn-serve "build-$step/"
    timeout 240 build-gpu/tests/gqattn_engine_gpu_tests > "$L/tests.log" 2>&1 || { echo "engine GPU tests failed"; rc=1; }
    grep -E "PASSED|FAILED" "$L/tests.log"; save
    timeout 150 compute-sanitizer --tool memcheck build-gpu/tests/gqattn_engine_gpu_tests \
      --gtest_filter="$filter" > "$L/memcheck.log" 2>&1 || rc=1
    tail -2 "$L/memcheck.log"; save
    E2E_AB_TWICE=32 E2E_AB_ONCE="8 1" engine_ab "$@" || rc=1
    local first=${1%%:*}
    grep -h "gemm planes" "$L/ab_twice/${first}_kv32_1.log" "$L"/ab_once/"${first}"_kv*_1.log | sort | uniq -c
  fi
  for p in $reverse; do git apply -R "$p"; done
  return $rc
}

# A build of hd128 bf16, SWEEP under two settings of one binary (ab_sweep.sh: A, B, then A again),
# compare.txt (B / A, then A's own repeat), then cuDNN on the same rows (contiguous K/V).
# Usage: ab_then_cudnn SWEEP DIR A_NAME B_NAME:VAR=VALUE
ab_then_cudnn() {
  local sweep=$1 dir=$2 a=$3 b=$4
  GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
  scripts/ab_sweep.sh build-gpu "$sweep" "$dir" "$a:" "$b"
  python3 bench/compare.py "$dir/$a.csv" "$dir/${b%%:*}.csv" > "$dir/compare.txt" 2>&1
  python3 bench/compare.py "$dir/$a.csv" "$dir/${a}_again.csv" | tail -1 >> "$dir/compare.txt"
  cat "$dir/compare.txt"; save
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/peers.py --sweep "$sweep" --csv "$dir/cudnn.csv" --peers sdpa_cudnn \
    --ceilings "$dir/$a.csv" --iters 30 > "$dir/cudnn.log" 2>&1 || tail -5 "$dir/cudnn.log"
  save
}

case $step in
  v201)
    GQATTN_HEAD_DIMS="64;80;128;256" GQATTN_DTYPES=bf16 CTEST_TIMEOUT=150 LOG_DIR=$L \
      scripts/gpu_check.sh build test sanitize
    ;;
  l213|t213)
    rc=0
    if [[ $step == l213 ]]; then
      LOG_DIR=$L scripts/final_gpu_run.sh land || rc=1
    else
      GQATTN_HEAD_DIMS="64;80;128;256" GQATTN_DTYPES=bf16 CTEST_TIMEOUT=150 LOG_DIR=$L \
        scripts/gpu_check.sh ${T213_STAGES:-build test sanitize} || rc=1
    fi
    scripts/ab_sweep.sh build-gpu "$WAVES" "$L/waves" "split:" "nosplit:GQATTN_DISABLE_PARTIAL_WAVE_SPLIT=1"
    python3 bench/compare.py "$L/waves/nosplit.csv" "$L/waves/split.csv" > "$L/waves/compare.txt" 2>&1
    python3 bench/compare.py "$L/waves/split.csv" "$L/waves/split_again.csv" | tail -1 >> "$L/waves/compare.txt"
    cat "$L/waves/compare.txt"
    # The rows that trail cuDNN (decode_cudnn_gap_hd128.csv: 128 items of 8 rows and others) with
    # fixed chunks the planner does not choose (PlanInputs::fixed_split_size), beside the caps.
    [[ $step == t213 ]] && SPLIT_PROBE_CHUNKS="128 256 512" LOG_DIR=$L/sp scripts/split_probe.sh build-gpu/gqattn-bench
    exit $rc
    ;;
  pe)
    # The engine's decode step per kernel (profile_engine.sh, the engine's own profiler window):
    # MHA and MQA at ~180 tokens of context, MHA again at ~730 (late in the table's run), to see
    # what holds MHA's step above its floor (perf-notes items 225, 228).
    GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    prof() {  # prof NAME HEADS STEP OUTPUT_LEN
      STEP=$3 OUTPUT_LEN=$4 timeout 150 scripts/profile_engine.sh build-gpu "$2" "$L/$1.csv" > "$L/$1.txt" 2>&1
      echo "== $1"; head -24 "$L/$1.txt"; rm -f "$L/$1.csv"; save
    }
    prof mha_s150 32 150 400
    prof mqa_s150 1 150 400
    prof mha_s700 32 700 992
    ;;
  land)
    LOG_DIR=$L scripts/final_gpu_run.sh land
    ;;
  n96)
    # Why decode at hd96 runs at ~0.8x of hd128 (perf-notes items 199, 200: a fourth stage did not
    # help, so bytes in flight do not explain it): one launch each under ncu, MHA 16 x 8K.
    GQATTN_HEAD_DIMS="96;128" GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    LOG_DIR=$L/ncu scripts/ncu_decode.sh build-gpu/gqattn-bench "decode,bf16,32,32,96,16,16,1,8192,1" \
      "decode,bf16,32,32,128,16,16,1,8192,1"
    ;;
  l215)
    LOG_DIR=$L scripts/final_gpu_run.sh land; rc=$?
    # The batch-1 long rows (and two 8-request MQA rows) with fixed chunks (item 215): 8/1 heads
    # 1 x 32K ran 1.105x in chunks of 256 keys against the planner's 128 (t213).
    SPLIT_PROBE_CAPS="" SPLIT_PROBE_CHUNKS="128 256 512 1024" LOG_DIR=$L/sp timeout 120 \
      scripts/split_probe.sh build-gpu/gqattn-bench bench/sweeps/ab/decode_batch1_long_hd128.csv
    exit $rc
    ;;
  ncg)
    # The decode rows furthest behind cuDNN (0.84-0.88x in item 259's table), cuDNN as the bench
    # runs it (enable_gqa, K/V not expanded: item 176 profiled expanded K/V), then ours, one launch
    # each under ncu: which kernel, grid and CTAs an SM cuDNN uses where we trail it most.
    rows=("8 1 128 128 1 2048" "8 1 128 128 1 512" "32 4 128 32 1 512" "32 1 128 32 1 512")
    specs=(); for r in "${rows[@]}"; do specs+=("cudnn $r 0"); done
    LOG_DIR=$L/peer scripts/ncu_peer.sh "${specs[@]}"; save
    GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    ours=(); for r in "${rows[@]}"; do read -r hq hkv d b qo kv <<< "$r"; ours+=("decode,bf16,$hq,$hkv,$d,16,$b,$qo,$kv,1"); done
    # The first three run on the decode family; MQA's 32 rows on the wgmma kernel (item 261's run
    # profiled nothing there under the default kernel name).
    LOG_DIR=$L/ncu scripts/ncu_decode.sh build-gpu/gqattn-bench "${ours[@]:0:3}"
    NCU_KERNEL=attention_sm90_kernel LOG_DIR=$L/ncu_sm90 scripts/ncu_decode.sh build-gpu/gqattn-bench "${ours[3]}"
    ;;
  pord)
    # Item 263: the rows furthest behind cuDNN with our pages random (the bench's default) and in
    # order (GQATTN_BENCH_PAGES_IN_ORDER=1), ABA, then cuDNN on the same rows (contiguous K/V): how
    # much of each gap is the page order the peers never pay.
    ab_then_cudnn bench/sweeps/ab/decode_page_order_hd128.csv "$L/order" random in_order:GQATTN_BENCH_PAGES_IN_ORDER=1
    ;;
  l2f|s72)
    # Item 314: how far the small decode rows move with the L2 flushed before each call (the bench's
    # default since session 71, as peers.py times the peers), ABA, then cuDNN on the same rows.
    ab_then_cudnn "$L2F" "$L/l2" flush no_flush:GQATTN_BENCH_NO_L2_FLUSH=1
    # s72: then the same hd128 bf16 build's GPU tests (items 312-318 untested on a GPU) and the
    # sanitizers' subsets (item 318 widened them).
    if [[ $step == s72 ]]; then
      rc=0
      LOG_DIR=$L/t CTEST_TIMEOUT=200 scripts/gpu_check.sh test || rc=1; save
      LOG_DIR=$L/t SAN_TIMEOUT=150 scripts/gpu_check.sh sanitize || rc=1
      exit $rc
    fi
    ;;
  flexd|flexp)
    fam=$([ "$step" = flexd ] && echo decode || echo prefill)
    # Only the head dims and dtypes of the sweep's rows (bf16 at 64 / 128 / 256: a quarter of the
    # full build's kernels, ~40 s less in a call near its limit).
    col() { awk -F, -v c="$1" 'NR > 1 && $c != "" { print $c }' "bench/sweeps/$fam.csv" | sort -u | paste -sd';'; }
    GQATTN_HEAD_DIMS=$(col 5) GQATTN_DTYPES=$(col 2) BENCH_FAMILIES=$fam PEERS=flex,sdpa_cudnn LOG_DIR=$L \
      scripts/gpu_check.sh build bench
    ;;
  ncp)
    # Issue 5's hd128 gap to cuDNN (item 277): ncu --set full of cuDNN's prefill kernel (enable_gqa,
    # as the bench runs it) and ours, one launch each, MHA non-causal 1 x 16K and 16 x 1K, with each
    # SASS instruction's executions and warp-state samples (the *_sass.csv files), to set the two
    # consumers' tile loops side by side.
    # NCP_ROWS="HQ HKV D BATCH QO KV CAUSAL;...": other rows (one head dim), e.g. hd64 MHA causal 8 x 2K,
    # the row furthest behind cuDNN in item 278: NCP_ROWS="32 32 64 8 2048 2048 1".
    IFS=';' read -ra rows <<< "${NCP_ROWS:-32 32 128 1 16384 16384 0;32 32 128 16 1024 1024 0}"
    specs=(); for r in "${rows[@]}"; do specs+=("cudnn $r"); done
    NCU_SASS=1 NCU_TIMEOUT=200 LOG_DIR=$L/peer scripts/ncu_peer.sh "${specs[@]}"; save
    read -r _ _ hd _ <<< "${rows[0]}"
    GQATTN_HEAD_DIMS=$hd GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    ours=(); for r in "${rows[@]}"; do read -r hq hkv d b qo kv c <<< "$r"; ours+=("prefill,bf16,$hq,$hkv,$d,0,$b,$qo,$kv,$c"); done
    NCU_SASS=1 NCU_TIMEOUT=200 NCU_KERNEL=attention_sm90_kernel LOG_DIR=$L/ncu scripts/ncu_decode.sh \
      build-gpu/gqattn-bench "${ours[@]}"
    # Each kernel's exponential turns (BAR.SYNC .. BAR.ARV spans holding the MUFU.EX2) and their
    # stall reasons, cuDNN's and ours, row by row (item 294's open question at hd64).
    python3 scripts/ncu_turn_stalls.py "$L"/peer/ncu_peer_*_sass.csv "$L"/ncu/ncu_*_sass.csv > "$L/turn_stalls.txt" 2>&1
    cat "$L/turn_stalls.txt"
    ;;
  tl|tlp)
    # wip/diag-timeline.patch stamps every CTA (%globaltimer); the sweep runs without the stamps,
    # with them (GQATTN_DIAG_TIMELINE: a line a row in timeline.csv) and without again, so that
    # compare.py shows what the stamps themselves cost.
    # tl, item 271: where a decode call's time goes past a plain read of its bytes (the attention
    # kernel's CTAs and the split merge's).
    # tlp, item 280: what the wgmma prefill kernel's consumers wait for between two items (item 277:
    # Q 3.1 % and the first K tile 1.4 % of the consumers' samples at 16 x 1K): each CTA's boundary
    # between its items 1 and 2, the timeline columns s3_s4 .. s3_s5 (us, medians over CTAs and
    # replays).
    git apply wip/diag-timeline.patch || exit 1
    trap 'git apply -R wip/diag-timeline.patch; kill $saver 2>/dev/null; wait $saver 2>/dev/null; save' EXIT
    GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    S=bench/sweeps/ab/decode_timeline_hd128.csv
    [[ $step == tlp ]] && S=bench/sweeps/ab/prefill_two_q_v2_hd128.csv
    D=$L/$step
    scripts/ab_sweep.sh build-gpu "$S" "$D" "plain:" "tl:GQATTN_DIAG_TIMELINE=$D/timeline.csv"
    python3 bench/compare.py "$D/plain.csv" "$D/tl.csv" > "$D/compare.txt" 2>&1
    python3 bench/compare.py "$D/plain.csv" "$D/plain_again.csv" | tail -1 >> "$D/compare.txt"
    tail -3 "$D/compare.txt"; cat "$D/timeline.csv"
    ;;
  g1)
    # Do the >= 1 GB rows' tails shrink with finer chunks? The planner keeps one-wave plans whole
    # (32/8 8 x 32K: 256 CTAs of 8K keys on 264 slots, its last CTA 16 us after the median on an
    # H100, item 271); split_probe times fixed chunks against its choice, tl's stamps show the
    # CTAs' spread.
    GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    S=bench/sweeps/ab/decode_1gb_hd128.csv
    SPLIT_PROBE_CAPS="" SPLIT_PROBE_CHUNKS="1024 2048 4096" LOG_DIR=$L/sp timeout 300 \
      scripts/split_probe.sh build-gpu/gqattn-bench "$S"; save
    git apply wip/diag-timeline.patch || exit 1
    trap 'git apply -R wip/diag-timeline.patch; kill $saver 2>/dev/null; wait $saver 2>/dev/null; save' EXIT
    GQATTN_HEAD_DIMS=128 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    mkdir -p "$L/tl"; GQATTN_DIAG_TIMELINE=$L/tl/timeline.csv timeout 120 build-gpu/gqattn-bench --device cuda --sweep "$S" \
      --iters 20 --csv "$L/tl/tl.csv" > "$L/tl/tl.log" 2>&1
    cat "$L/tl/timeline.csv"
    ;;
  ph)
    # Why a tile's exponentials take ~1,140 cycles against ~625 scheduled (perf-notes items 293,
    # 294): where a consumer warp's time goes, phase by phase (wait for K / V, issue, wait for S, mask
    # and maxima, wait for the turn, the turn, wait for P V + rescale + pack), and the row's time.
    git apply wip/diag-sm90-phases.patch || exit 1
    trap 'git apply -R wip/diag-sm90-phases.patch; kill $saver 2>/dev/null; wait $saver 2>/dev/null; save' EXIT
    GQATTN_HEAD_DIMS=64 GQATTN_DTYPES=bf16 LOG_DIR=$L scripts/gpu_check.sh build || exit 1
    n=0
    for r in "32 32 0 8 2048 2048 1" "32 32 16 8 2048 2048 1" "32 32 0 16 1024 1024 0" "32 32 0 16 1024 1024 1" \
             "32 16 0 8 1024 1024 1" "32 8 16 1 512 8704 1"; do
      read -r hq hkv pg b q kv c <<< "$r"; n=$((n + 1))
      GQATTN_DIAG_PHASES=1 timeout 60 build-gpu/gqattn-bench --device cuda --family prefill --dtype bf16 \
        --num-qo-heads "$hq" --num-kv-heads "$hkv" --head-dim 64 --page-size "$pg" --batch "$b" --qo-len "$q" \
        --kv-len "$kv" --causal "$c" --iters 10 > "$L/ph_$n.log" 2>&1
      # A line a warpgroup: each field's median over the launches (mawk has no sort: python).
      python3 - "$L/ph_$n.log" "$r" >> "$L/phases.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("GQ_PHASES "):
        f = dict(kv.split("=") for kv in line.split()[1:])
        rows.setdefault(f.pop("wg"), []).append(f)
for wg, launches in sorted(rows.items()):
    med = {k: statistics.median(float(l[k]) for l in launches) for k in launches[0]}
    print(sys.argv[2], f"wg={wg} launches={len(launches)}", " ".join(f"{k}={v:.0f}" for k, v in med.items()))
PY
      grep -E "TFLOP/s" "$L/ph_$n.log" | tail -1 >> "$L/phases.txt"
    done
    cat "$L/phases.txt"
    ;;
  *)
    echo "device_plan: unknown step '$step' (v201, t213, l213, pe, land, l215, n96, pord, l2f, ncg, ncp, flexd, flexp, tl, tlp, g1, ph, check)"
    exit 2
    ;;
esac
