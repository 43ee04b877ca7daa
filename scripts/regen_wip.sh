#!/usr/bin/env bash
# Regenerates wip patches onto HEAD after main changed under them (ctest `device_plan_ready` fails
# with "does not apply"). The arguments are one stack, in order: each patch is applied (3-way) on
# top of HEAD and the ones before it, in a temporary worktree, and rewritten as the difference from
# its base there. Within a conflict block, main's and the patch's line edits (aligned to the merge
# base, not paired by position) are both taken where they touch different lines. Where both
# replaced the same single line, their word edits are both taken when at least one unchanged word
# separates them (numbers count as words: 272 -> 274 against 272 -> 282 is a conflict). Anything
# else stops the script naming the file; no patch is rewritten unless the whole stack succeeds.
# Usage: scripts/regen_wip.sh wip/a.patch [wip/b-on-top-of-a.patch ...]   (then: device_plan.sh check)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
(($#)) || { echo "usage: scripts/regen_wip.sh PATCH [PATCH_ON_TOP ...]"; exit 2; }
work=$(mktemp -d)
tree=$work/tree
git worktree add -q --detach "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree"; rm -rf "$work"' EXIT

resolve() {  # resolve FILE: every diff3 conflict block merged as above, or exit 1
  python3 - "$1" <<'EOF'
import difflib, re, sys
path = sys.argv[1]

def edits(base, other):  # (start, end, replacement) in base's coordinates
    sm = difflib.SequenceMatcher(None, base, other, autojunk=False)
    return [(i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != 'equal']

def clash(a, b):  # two line edits that cannot both be taken: they overlap, or their order is unknown
    if a[0] < b[1] and b[0] < a[1]:
        return True
    if a[0] == b[0]:
        return True
    return (a[0] == a[1] and b[0] < a[0] < b[1]) or (b[0] == b[1] and a[0] < b[0] < a[1])

def words_clash(a, b, tokens):  # word edits need an unchanged word (not only a space) between them
    lo, hi = sorted([a, b])
    if hi[0] < lo[1] or (lo[0] == hi[0]):
        return True
    return not any(re.fullmatch(r'\w+', t) for t in tokens[lo[1]:hi[0]])

def apply(base, es):
    out = list(base)
    for i1, i2, rep in sorted(es, key=lambda e: (e[0], e[1]), reverse=True):
        out[i1:i2] = rep
    return out

def words(line):
    return re.findall(r'\w+|\s+|[^\w\s]', line)

def merge_line(base, ours, theirs):
    b = words(base)
    eo, et = edits(b, words(ours)), edits(b, words(theirs))
    if any(words_clash(x, y, b) for x in eo for y in et):
        return None
    return ''.join(apply(b, eo + et))

def merge_block(base, ours, theirs):
    eo, et = edits(base, ours), edits(base, theirs)
    merged, taken = [], set()
    for x in eo:
        hit = [y for y in et if clash(x, y)]
        if not hit:
            merged.append(x)
            continue
        y = hit[0]
        if id(y) in taken:
            return None
        # Both replaced the same single line with one line: merge their words.
        if len(hit) == 1 and x[:2] == y[:2] and x[1] - x[0] == 1 and len(x[2]) == 1 and len(y[2]) == 1:
            line = merge_line(base[x[0]], x[2][0], y[2][0])
            if line is None:
                return None
            merged.append((x[0], x[1], [line]))
            taken.add(id(y))
            continue
        return None
    merged += [y for y in et if id(y) not in taken]
    return apply(base, merged)

lines = open(path).read().split('\n')
out, i = [], 0
while i < len(lines):
    if not lines[i].startswith('<<<<<<< '):
        out.append(lines[i]); i += 1; continue
    b = next(j for j in range(i, len(lines)) if lines[j].startswith('||||||| '))
    m = next(j for j in range(b, len(lines)) if lines[j] == '=======')
    e = next(j for j in range(m, len(lines)) if lines[j].startswith('>>>>>>> '))
    block = merge_block(lines[b + 1:m], lines[i + 1:b], lines[m + 1:e])
    if block is None:
        sys.exit(f"{path}:{i + 1}: main and the patch changed the same words: resolve it by hand")
    out += block
    i = e + 1
open(path, 'w').write('\n'.join(out))
EOF
}

for p in "$@"; do
  base=$(git -C "$tree" rev-parse HEAD)
  if ! git -C "$tree" -c merge.conflictStyle=diff3 apply -3 "$root/$p" > "$work/apply.log" 2>&1 &&
     ! grep -q "with conflicts" "$work/apply.log"; then
    echo "regen_wip: $p does not apply even 3-way:"; head -5 "$work/apply.log"; exit 1
  fi
  for f in $(git -C "$tree" diff --name-only --diff-filter=U); do
    resolve "$tree/$f"
    echo "regen_wip: $p: resolved $f"
  done
  if grep -rlE '^(<<<<<<<|>>>>>>>) ' "$tree" --exclude-dir=.git > /dev/null 2>&1; then
    echo "regen_wip: $p: conflicts left"; exit 1
  fi
  git -C "$tree" add -A
  # Plain a/ b/ paths whatever the user's git config says (diff.noprefix, external diff tools).
  git -C "$tree" diff --cached --no-color --no-ext-diff --src-prefix=a/ --dst-prefix=b/ "$base" > "$work/$(basename "$p")"
  git -C "$tree" -c user.name=regen -c user.email=regen@localhost commit -qm "$p"
done
# Only now, with every patch of the stack made: replace them.
for p in "$@"; do
  mv "$work/$(basename "$p")" "$root/$p"
  echo "regen_wip: $p rewritten onto $(git -C "$root" rev-parse --short HEAD)"
done
