#!/usr/bin/env bash
# The weight-streaming GEMM experiment (gemm_stream.cu, perf-notes item 236) in one device call:
#   run: bash wip/gemm_stream/gemm_stream.sh      (logs and CSVs under $OUT)
# Builds with nvcc (sm_90a), times every variant at 128 tokens beside cuBLASLt (gemm_n128.csv),
# checks every variant at 77 tokens (gemm_n77.csv), and runs compute-sanitizer memcheck on the o
# shape at 77 tokens. The program's GEMM_STREAM_* settings pass through (gemm_stream.cu: SHAPES,
# KERNELS (stream, rega), CLUSTERS, PLANES, PACKED); item 247's run: scripts/device_plan.sh gmc.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm-stream-out}
mkdir -p "$OUT"
BIN=/tmp/gemm_stream
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
bash wip/build.sh "$BIN" wip/gemm_stream/gemm_stream.cu -lcublasLt -Xptxas -v > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
grep -E "spill|Used" "$OUT/build.log" | sort | uniq -c
rc=0
# A smoke run first (o at 77 tokens, one timed run a variant): a variant that hangs stops the call
# here, after 30 s, instead of at the long runs' limits.
GEMM_STREAM_SHAPES=o GEMM_STREAM_LT_ALGOS=1 timeout 30 "$BIN" 77 1 > "$OUT/smoke.csv" 2>&1 ||
  { echo "gemm_stream: the smoke run failed or hung (rc $?)"; grep -E "WRONG|NOT-REP|error" "$OUT/smoke.csv" | head; tail -3 "$OUT/smoke.csv"; exit 1; }
timeout 240 "$BIN" 128 "${GEMM_STREAM_REPS:-15}" > "$OUT/gemm_n128.csv" 2> "$OUT/gemm_n128.err" || rc=1
cat "$OUT/gemm_n128.err"
timeout 120 "$BIN" 77 1 > "$OUT/gemm_n77.csv" 2> "$OUT/gemm_n77.err" || rc=1
grep -E "^#|WRONG|NOT-REP" "$OUT/gemm_n77.csv"; cat "$OUT/gemm_n77.err"
GEMM_STREAM_SHAPES=o GEMM_STREAM_LT_ALGOS=1 GEMM_STREAM_PACKED=0 timeout 150 compute-sanitizer --tool memcheck "$BIN" 77 1 > "$OUT/memcheck.log" 2>&1 || rc=1
tail -3 "$OUT/memcheck.log"
# Per shape: cuBLASLt, then the best variant of each layout (packed / row-major) and cluster size.
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
    keys = sorted({(d['packed'], d['cluster']) for d in ds if d['kernel'] == 'stream'}, reverse=True)
    for pk, cl in keys:
        c = [d for d in ds if d['kernel'] == 'stream' and d['packed'] == pk and d['cluster'] == cl]
        b = min(c, key=lambda d: float(d['us']))
        name = ('packed' if pk == '1' else 'row-major') + (f' cluster {cl}' if cl != '1' else '')
        out.append(f"{name} {float(b['us']):6.2f} us {b['weight_GBps']:>5s} GB/s (bn {b['bn']} x {b['splits']}"
                   f"{', planes' if b['planes'] == '1' else ''}, grid {b['grid']})")
    for kern in sorted({d['kernel'] for d in ds if d['kernel'].startswith('rega')}):
        b = min((d for d in ds if d['kernel'] == kern), key=lambda d: float(d['us']))
        out.append(f"{kern} {float(b['us']):6.2f} us {b['weight_GBps']:>5s} GB/s (x {b['splits']}, grid {b['grid']})")
    print(' | '.join(out))
PY
grep -E "^#" "$OUT/gemm_n128.csv"
exit $rc
