#!/usr/bin/env bash
# SASS statistics of the kernels in one instantiation file, without a GPU: compiles it to a cubin
# for one architecture and counts, per kernel, the instructions, the warp-divergence checks
# (BRA.DIV, WARPSYNC, ENDCOLLECTIVE: the compiler could not prove the warp converged, e.g. after a
# branch on a shared-memory value), uniform-register moves, shuffles, MUFU, cp.async, wgmma and
# TMA, plus ptxas's spills and its wgmma-serialisation warnings (C7510-C7519). Used to compare a
# change with main before spending GPU time on it (docs/perf-notes.md, session 3: 4096 instructions
# and 48 ENDCOLLECTIVE where main had 3488 and 0).
# --check: ptxas only (no nvdisasm needed), exit 1 if it serialised any kernel's wgmmas (C7510-C7519
# but C7517, which only names the line of another's wait: C7511 / C7512 for registers, C7515 /
# C7518; session 24's first chained-items build lost 21% that way, tests passing): the ctest
# `sm90_wgmma_not_serialised` runs it on the built Hopper instantiations.
# --check-overlap: exit 1 unless, in every Hopper prefill kernel at head_dim > 64, the main loop's
# wait for P V (WARPGROUP.DEPBAR.LE 0) follows most of the softmax's exponentials (>= 16 MUFU.EX2
# after the loop's wait for S): ptxas issues a wgmma wait first in its basic block, which once
# put the whole softmax behind P V (docs/perf-notes.md item 140; main had 0 there, 34-66 now).
# Exit 77 (ctest: skipped) without nvdisasm. The ctest `sm90_softmax_overlaps_pv` runs it.
# --check-exp-turns: exit 1 unless, in every two-consumer Hopper prefill kernel at head_dim 64
# (kExpTurns), some ping-pong turn (a BAR.SYNC on a register barrier id up to the next BAR.ARV on
# one) holds all the MUFU.EX2 of a tile (64 a thread; 32 where the consumers split each tile's
# keys, the kernel's last template argument): ptxas moved a plain bar.arrive above the exponentials
# (docs/perf-notes.md item 291). Exit 77 without nvdisasm; the ctest `sm90_exp_turns_hold_exp2`.
# Needs nvcc and nvdisasm (CUDA toolkit, or: pip install nvidia-cuda-nvdisasm; NVDISASM=path).
# Usage: scripts/sass_stats.sh [-a sm_90a] [--check | --check-overlap | --check-exp-turns] src/instantiations/attention_prefill_sm90_bf16_hd128.cu [...]
set -euo pipefail
cd "$(dirname "$0")/.."
arch=sm_90a check=0 overlap=0 exp_turns=0
if [ "${1:-}" = "-a" ]; then arch=$2; shift 2; fi
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
if [ "${1:-}" = "--check-overlap" ]; then overlap=1; shift; fi
if [ "${1:-}" = "--check-exp-turns" ]; then exp_turns=1; shift; fi
[ $# -ge 1 ] || { sed -n 2,23p "$0"; exit 2; }
NVCC=${NVCC:-nvcc}
if [ $check = 0 ]; then
  NVDISASM=${NVDISASM:-$(command -v nvdisasm || python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13/bin/nvdisasm"))' 2>/dev/null || true)}
  if [ ! -x "$NVDISASM" ]; then
    echo "sass_stats: nvdisasm not found (pip install nvidia-cuda-nvdisasm, or set NVDISASM)"
    [ $overlap = 1 ] || [ $exp_turns = 1 ] && { echo "sass_stats: the SASS check is skipped"; exit 77; }
    exit 1
  fi
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failed=0  # files failing --check or --check-overlap
for src in "$@"; do
  base=$(basename "$src" .cu)
  # The instantiation's own GQATTN_BUILT_* define (dtype and head dim from the file name).
  defs=$(echo "$base" | sed -E 's/.*_(bf16|fp16)_hd([0-9]+)$/-DGQATTN_BUILT_\U\1\E_HD\2=1/')
  "$NVCC" $defs -DGQATTN_BUILT_SM90=1 -DGQATTN_WITH_CUDA=1 -Iinclude -Isrc -O3 -DNDEBUG -std=c++17 \
    --expt-relaxed-constexpr -gencode "arch=compute_${arch#sm_},code=$arch" -cubin -Xptxas -v "$src" \
    -o "$tmp/$base.cubin" 2> "$tmp/ptxas.txt" || { cat "$tmp/ptxas.txt"; exit 1; }
  echo "== $src ($arch)"
  if [ $check = 1 ]; then
    n=$(grep -cE "\(C751[0-689]\)" "$tmp/ptxas.txt" || true)
    echo "  kernels with serialised wgmmas: $n"
    grep -E "\(C751[0-9]\)" "$tmp/ptxas.txt" || true
    failed=$((failed + n))
    continue
  fi
  "$NVDISASM" -c "$tmp/$base.cubin" > "$tmp/$base.sass"
  if [ $exp_turns = 1 ]; then
    # Per two-consumer hd64 kernel (Family 3): the most MUFU.EX2 between a BAR.SYNC and the next
    # BAR.ARV, both on register barrier ids (the turns; the other named barriers use immediates).
    awk '
      /^\.text\./ { name = $0; sub(/^\.text\./, "", name); sub(/:$/, "", name)
                     if (name ~ /Li64ELNS0_6FamilyE3E/) { order[++n] = name; best[name] = 0
                       need[name] = name ~ /ELb1EEEvNS0_15AttentionParams/ ? 32 : 64 } else name = ""; inside = 0; next }
      name == "" { next }
      /BAR\.SYNC(\.DEFER_BLOCKING)? R[0-9]+/ { inside = 1; c = 0; next }
      /BAR\.ARV R[0-9]+/ { if (inside && c > best[name]) best[name] = c; inside = 0; next }
      /MUFU\.EX2/ { if (inside) c++ }
      END {
        for (i = 1; i <= n; i++) {
          k = order[i]; ok = best[k] >= need[k]
          printf "  %s: %d MUFU.EX2 in a turn (>= %d)%s\n", k, best[k], need[k], ok ? "" : "  <- the exponentials left the turn"
          if (!ok) bad++
        }
        exit bad > 0
      }' "$tmp/$base.sass" || failed=$((failed + 1))
    continue
  fi
  if [ $overlap = 1 ]; then
    # Per kernel at head_dim 80 / 96 / 112 / 128 / 256 (kWaitAfterSoftmax): the most MUFU.EX2
    # between a WARPGROUP.DEPBAR.LE 1 (a wait for S with P V in flight: the loop's) and the next
    # DEPBAR.LE 0 (its wait for P V). The most, not the first span's: a kernel may have other
    # DEPBAR.LE 1 waits with no softmax after them (item 299's pipelined first tile, perf-notes
    # item 301).
    awk '
      /^\.text\./ { name = $0; sub(/^\.text\./, "", name); sub(/:$/, "", name)
                     if (name ~ /Li(80|96|112|128|256)E/) { order[++n] = name; mufu[name] = 0; inside = 0 } else name = ""; next }
      name == "" { next }
      /WARPGROUP\.DEPBAR\.LE gsb0, 0x1/ { inside = 1; c = 0; next }
      /WARPGROUP\.DEPBAR\.LE gsb0, 0x0/ { if (inside && c > mufu[name]) mufu[name] = c; inside = 0; next }
      /MUFU\.EX2/ { if (inside) c++ }
      END {
        for (i = 1; i <= n; i++) {
          k = order[i]; ok = mufu[k] >= 16
          printf "  %s: %d MUFU.EX2 before the wait for P V%s\n", k, mufu[k], ok ? "" : "  <- the softmax does not overlap P V"
          if (!ok) bad++
        }
        exit bad > 0
      }' "$tmp/$base.sass" || failed=$((failed + 1))
    continue
  fi
  grep -E "spill stores|Used [0-9]+ registers" "$tmp/ptxas.txt" | sed 's/^ */  ptxas: /'
  # C7510-C7519: ptxas serialised a kernel's wgmmas (each HGMMA then waits for the last; a
  # WARPGROUP.DEPBAR after every one): session 24's first chained-items build lost 21% that way.
  # C7517 names the line where it inserted the wait.
  grep -E "\(C75[0-9]+\)" "$tmp/ptxas.txt" | sed -E 's/^.*\((C75[0-9]+)\) ([^:]*).* function .(_Z[A-Za-z0-9_]*).*$/  ptxas \1 \2: \3/' || true
  awk '
    /^\.text\./ { name = $0; sub(/^\.text\./, "", name); sub(/:$/, "", name); order[++n] = name; next }
    name != "" && /^[ \t]+\/\*[0-9a-f]+\*\// {
      line = $0; sub(/^[ \t]+\/\*[0-9a-f]+\*\/[ \t]+/, "", line); sub(/^@!?U?P[0-9T] /, "", line)
      split(line, w, /[ .;]/); op = w[1]; total[name]++
      if (line ~ /^BRA\.DIV/) op = "BRA.DIV"
      if (line ~ /^WARPGROUP\.DEPBAR/) op = "DEPBAR"  # a wgmma wait: about one a loop turn, unless serialised
      count[name, op]++
    }
    END {
      split("BRA.DIV WARPSYNC ENDCOLLECTIVE R2UR SHFL MUFU LDGSTS HGMMA DEPBAR UTMALDG", ops, " ")
      for (i = 1; i <= n; i++) {
        k = order[i]; printf "  %s\n    instructions %d", k, total[k]
        for (j = 1; j in ops; j++) printf "  %s %d", ops[j], count[k, ops[j]] + 0
        printf "\n"
      }
    }' "$tmp/$base.sass"
done
if [ $exp_turns = 1 ]; then
  [ $failed = 0 ] || { echo "sass_stats: the exponentials are outside the ping-pong turns in $failed files"; exit 1; }
  exit 0
fi
if [ $overlap = 1 ]; then
  [ $failed = 0 ] || { echo "sass_stats: the softmax does not overlap P V in $failed files"; exit 1; }
  exit 0
fi
[ $failed = 0 ] || { echo "sass_stats: ptxas serialised the wgmmas of $failed kernels"; exit 1; }
