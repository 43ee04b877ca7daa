#!/usr/bin/env bash
# Regenerates wip patches onto HEAD after main changed under them (ctest `device_plan_ready` fails
# with "does not apply"). The arguments are one stack, in order: each patch is applied (3-way) on
# top of HEAD and the ones before it, in a temporary worktree, and rewritten as the difference from
# its base there. A conflict where both sides changed different lines of one block (the usual case:
# main edited a line next to one the patch edits, as in docs/architecture.md's tables) is resolved
# line by line from the merge base, and where both changed one line at different places in it,
# character by character; any other conflict stops the script, naming the file, and leaves the
# patch unchanged.
# Usage: scripts/regen_wip.sh wip/a.patch [wip/b-on-top-of-a.patch ...]   (then: device_plan.sh check)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
(($#)) || { echo "usage: scripts/regen_wip.sh PATCH [PATCH_ON_TOP ...]"; exit 2; }
tree=$(mktemp -d)/tree
git worktree add -q --detach "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
resolve() {  # resolve FILE: line-by-line resolution of diff3 conflict blocks of equal length
  python3 - "$1" <<'EOF'
import difflib, sys
path = sys.argv[1]

def edits(base, other):  # (start, end, replacement) of each change, in base's coordinates
    sm = difflib.SequenceMatcher(None, base, other, autojunk=False)
    return [(i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != 'equal']

def merge_line(base, ours, theirs):  # both sides' changes where they touch different characters
    eo, et = edits(base, ours), edits(base, theirs)
    for a1, a2, _ in eo:
        for b1, b2, _ in et:
            if a1 == b1 or (a1 < b2 and b1 < a2) or (a1 == a2 and b1 < a1 < b2) or (b1 == b2 and a1 < b1 < a2):
                return None
    out = base
    for i1, i2, rep in sorted(eo + et, reverse=True):
        out = out[:i1] + rep + out[i2:]
    return out

lines = open(path).read().split('\n')
out, i = [], 0
while i < len(lines):
    if not lines[i].startswith('<<<<<<< '):
        out.append(lines[i]); i += 1; continue
    b = next(j for j in range(i, len(lines)) if lines[j].startswith('||||||| '))
    m = next(j for j in range(b, len(lines)) if lines[j] == '=======')
    e = next(j for j in range(m, len(lines)) if lines[j].startswith('>>>>>>> '))
    ours, base, theirs = lines[i + 1:b], lines[b + 1:m], lines[m + 1:e]
    if not (len(ours) == len(base) == len(theirs)):
        sys.exit(f"{path}:{i + 1}: a conflict that changes the number of lines: resolve it by hand")
    for o, s, t in zip(ours, base, theirs):
        if o == s or o == t: out.append(t)
        elif t == s: out.append(o)
        else:
            merged = merge_line(s, o, t)
            if merged is None: sys.exit(f"{path}:{i + 1}: both sides changed the same words: resolve it by hand")
            out.append(merged)
    i = e + 1
open(path, 'w').write('\n'.join(out))
EOF
}
for p in "$@"; do
  base=$(git -C "$tree" rev-parse HEAD)
  if ! git -C "$tree" -c merge.conflictStyle=diff3 apply -3 "$root/$p" > "$tree.log" 2>&1 &&
     ! grep -q "with conflicts" "$tree.log"; then
    echo "regen_wip: $p does not apply even 3-way:"; head -5 "$tree.log"; exit 1
  fi
  for f in $(git -C "$tree" diff --name-only --diff-filter=U); do
    resolve "$tree/$f"
    echo "regen_wip: $p: resolved $f"
  done
  if grep -rlE '^(<<<<<<<|>>>>>>>) ' "$tree" --exclude-dir=.git > /dev/null 2>&1; then
    echo "regen_wip: $p: conflicts left"; exit 1
  fi
  git -C "$tree" add -A
  git -C "$tree" diff --cached "$base" > "$root/$p.new"
  mv "$root/$p.new" "$root/$p"
  git -C "$tree" -c user.name=regen -c user.email=regen@localhost commit -qm "$p"
  echo "regen_wip: $p rewritten onto $(git -C "$root" rev-parse --short HEAD)"
done
