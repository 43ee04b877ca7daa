#!/usr/bin/env bash
# The weight-streaming GEMM experiment (gemm_stream.cu, perf-notes item 236) in one device call:
#   run: bash wip/gemm_stream/gemm_stream.sh      (logs and CSVs under $OUT)
# Builds with nvcc (sm_90a), times every variant at 128 tokens beside cuBLASLt (gemm_n128.csv),
# checks every variant at 77 tokens (gemm_n77.csv), and runs compute-sanitizer memcheck on the o
# shape at 77 tokens.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm-stream-out}
mkdir -p "$OUT"
BIN=/tmp/gemm_stream
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Xptxas -v -o "$BIN" wip/gemm_stream/gemm_stream.cu \
  -lcublasLt > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
grep -E "spill|Used" "$OUT/build.log" | sort | uniq -c
rc=0
timeout 240 "$BIN" 128 "${GEMM_STREAM_REPS:-15}" > "$OUT/gemm_n128.csv" 2> "$OUT/gemm_n128.err" || rc=1
cat "$OUT/gemm_n128.err"
timeout 120 "$BIN" 77 1 > "$OUT/gemm_n77.csv" 2> "$OUT/gemm_n77.err" || rc=1
grep -E "^#|WRONG|NOT-REP" "$OUT/gemm_n77.csv"; cat "$OUT/gemm_n77.err"
GEMM_STREAM_SHAPES=o GEMM_STREAM_LT_ALGOS=1 timeout 150 compute-sanitizer --tool memcheck "$BIN" 77 1 > "$OUT/memcheck.log" 2>&1 || rc=1
tail -3 "$OUT/memcheck.log"
# Per shape: cuBLASLt, then the best packed and the best row-major variant.
python3 - "$OUT/gemm_n128.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if not l.startswith(('#', 'device', 'ceiling')))]
hdr, rows = rows[0], rows[1:]
print(open(sys.argv[1]).read().split('\n')[1])
by = {}
for r in rows:
    d = dict(zip(hdr, r)); by.setdefault(d['shape'], []).append(d)
for s, ds in by.items():
    lt = [d for d in ds if d['kernel'].startswith('cublas')][0]
    out = [f"{s:9s} cuBLASLt {float(lt['us']):6.2f} us {lt['weight_GBps']:>5s} GB/s"]
    for pk, name in (('1', 'packed'), ('0', 'row-major')):
        c = [d for d in ds if d['kernel'] == 'stream' and d['packed'] == pk]
        if c:
            b = min(c, key=lambda d: float(d['us']))
            out.append(f"{name} {float(b['us']):6.2f} us {b['weight_GBps']:>5s} GB/s (bn {b['bn']} x {b['splits']})")
    print(' | '.join(out))
PY
grep -E "^#" "$OUT/gemm_n128.csv"
exit $rc
