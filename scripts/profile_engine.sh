#!/usr/bin/env bash
# Per-kernel time of the engine's decode steps (ncu, clocks left alone), aggregated by kernel name.
# Usage: [STEP=150] [OUTPUT_LEN=400] scripts/profile_engine.sh BUILD_DIR NUM_KV_HEADS [OUT_CSV]
# Profiles decode steps STEP and STEP + 1 of llama2-7b with 128 requests x (32 + OUTPUT_LEN) tokens
# (STEP 150: ~180 tokens of context; STEP must be below OUTPUT_LEN). The window is the engine's
# (GQATTN_PROFILE_STEPS: cudaProfilerStart / Stop around those steps, ncu --profile-from-start off),
# not a launch count: the start-up's warm-up and GEMM search launch thousands of kernels first
# (session 45: a launch skip of 60,000 landed inside the search).
set -euo pipefail
BUILD=$1 HEADS=$2 OUTCSV=${3:-/tmp/profile_kv$2.csv}
STEP=${STEP:-150} OUTPUT_LEN=${OUTPUT_LEN:-400}
NCU=${NCU:-ncu}
GQATTN_PROFILE_STEPS="$STEP:2" $NCU --clock-control none --graph-profiling node --profile-from-start off \
  --launch-count "${COUNT:-1500}" --metrics gpu__time_duration.sum --csv \
  "$BUILD/gqattn-serve" bench --device cuda --model llama2-7b --num-kv-heads "$HEADS" --requests 128 \
  --prompt-len 32 --output-len "$OUTPUT_LEN" > "$OUTCSV" 2>/dev/null || true
python3 - "$OUTCSV" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if len(rows) < 2:
    sys.exit(f"profile_engine.sh: no kernel profiled in {sys.argv[1]} (is STEP below OUTPUT_LEN? did ncu run?)")
hdr = rows[0]; rows = rows[1:]
ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
unit = hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", "")); u = r[unit]
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    assert u in scale, f"profile_engine.sh: unknown time unit {u!r}"
    v = v * scale[u]
    name = r[ki][:90]; tot[name] += v; cnt[name] += 1
all_us = sum(tot.values())
print(f"{len(rows)} kernels, {all_us:.0f} us total")
# By kind first (the window holds about two steps: halve for one), then by kernel.
kinds = [("gemm", ("nvjet", "gemm", "cutlass", "splitKreduce", "xmma")), ("attention", ("attention",)),
         ("split merge", ("merge",)), ("rope + K/V store", ("rope", "append_kv")), ("add_rmsnorm", ("rmsnorm",)),
         ("swiglu", ("swiglu",)), ("argmax, gather, embed", ("argmax", "gather_rows", "embed")),
         ("read (L2 flush: tuning inside the window)", ("read_kernel",))]
by_kind = collections.defaultdict(float); kind_n = collections.Counter()
for k, v in tot.items():
    kind = next((name for name, keys in kinds if any(x in k for x in keys)), "other")
    by_kind[kind] += v; kind_n[kind] += cnt[k]
for kind, v in sorted(by_kind.items(), key=lambda x: -x[1]):
    print(f"{v:10.1f} us {100*v/all_us:5.1f}% n={kind_n[kind]:4d}  [{kind}]")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:25]:
    print(f"{v:10.1f} us {100*v/all_us:5.1f}% n={cnt[k]:4d} avg={v/cnt[k]:8.2f}  {k}")
PY
