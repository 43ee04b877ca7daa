#!/usr/bin/env bash
# The generated sources are what their generators write today: src/instantiations/attention_*.cu
# (tools/gen_instantiations.py, every file and no other) and src/prims/wgmma_ops.cuh
# (tools/gen_wgmma.py). A hand edit of a generated file, or a generator changed without a re-run,
# fails here with the difference. The ctest `generated_sources_up_to_date` runs it (no GPU needed;
# exit 77, skipped, without python3).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null 2>&1 || { echo "check_generated: python3 not found, skipped"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/inst"
python3 tools/gen_instantiations.py --out "$tmp/inst" > /dev/null
python3 tools/gen_wgmma.py --out "$tmp/wgmma_ops.cuh" > /dev/null
mkdir "$tmp/repo"
cp src/instantiations/attention_*.cu "$tmp/repo/"
status=0
# The first lines of each difference (< committed, > generated): wgmma_ops.cuh's lines are long.
compare() {
  if ! diff -r "$1" "$2" > "$tmp/diff.txt"; then
    cut -c1-200 "$tmp/diff.txt" | head -20
    echo "check_generated: $1 differs from $3's output (< committed, > generated)"
    status=1
  fi
}
compare "$tmp/repo" "$tmp/inst" tools/gen_instantiations.py
compare src/prims/wgmma_ops.cuh "$tmp/wgmma_ops.cuh" tools/gen_wgmma.py
[ $status = 0 ] && echo "check_generated: $(ls "$tmp/inst" | wc -l) instantiations and wgmma_ops.cuh match their generators"
exit $status
