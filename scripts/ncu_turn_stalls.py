#!/usr/bin/env python3
"""Where a Hopper prefill kernel's exponentials wait, from one ncu SASS export (perf-notes item 294).

Reads an export of NCU_SASS=1 scripts/ncu_decode.sh or ncu_peer.sh (ncu --page source --csv
--print-source sass: a row per SASS instruction with its executions, warp-state samples and
stall_* columns) and finds the kernel's exponential turns: the spans from a BAR.SYNC to the next
BAR.ARV that hold >= --min-ex2 MUFU.EX2 (ours: kExpTurns' named barriers; cuDNN's: its barriers
4 / 5). For each turn it prints the instructions, executions and warp-state samples (all, and per
executed instruction), and the stall reasons of the whole span and of its MUFU.EX2 alone, so that
ours and cuDNN's can be set side by side. Usage: scripts/ncu_turn_stalls.py EXPORT.csv [...]
[--min-ex2 16] [--top 6]
"""
import argparse
import re

from ncu_sass_diff import EXECUTED, SAMPLES, load, num


def turns(src, min_ex2):
    """(first, last) row indices of each BAR.SYNC .. BAR.ARV span holding >= min_ex2 MUFU.EX2."""
    spans, start = [], None
    for i, text in enumerate(src):
        if re.search(r"\bBAR\.SYNC", text):
            start = i
        elif re.search(r"\bBAR\.ARV", text) and start is not None:
            if sum("MUFU.EX2" in t for t in src[start:i + 1]) >= min_ex2:
                spans.append((start, i))
            start = None
    return spans


def stall_line(rows, stall_cols, top):
    sums = {name: sum(num(r[c]) for r in rows) for name, c in stall_cols}
    total = sum(sums.values()) or 1.0
    lead = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))[:top]  # ties by name
    return ", ".join(f"{name} {100 * v / total:.1f} %" for name, v in lead if v > 0)


def report(path, min_ex2, top):
    header, data = load(path)
    src = [r[header.index("Source")].strip() for r in data]
    s_col, e_col = header.index(SAMPLES), header.index(EXECUTED)
    stall_cols = [(h[6:], header.index(h)) for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(num(r[s_col]) for r in data) or 1.0
    spans = turns(src, min_ex2)
    print(f"== {path}: {len(data)} instructions, {total:.0f} samples, {len(spans)} exponential turn(s)")
    for first, last in spans:
        rows = data[first:last + 1]
        ex2 = [r for r, t in zip(rows, src[first:last + 1]) if "MUFU.EX2" in t]
        samples = sum(num(r[s_col]) for r in rows)
        executed = sum(num(r[e_col]) for r in rows)
        ex2_samples = sum(num(r[s_col]) for r in ex2)
        ex2_executed = sum(num(r[e_col]) for r in ex2)
        print(f"-- rows {first}-{last}: {last - first + 1} instructions ({len(ex2)} MUFU.EX2), "
              f"{samples:.0f} samples ({100 * samples / total:.1f} % of the kernel's), "
              f"{samples / max(executed, 1):.3f} a warp instruction executed")
        print(f"   whole turn: {stall_line(rows, stall_cols, top)}")
        print(f"   MUFU.EX2: {ex2_samples:.0f} samples, {ex2_samples / max(ex2_executed, 1):.3f} an execution; "
              f"{stall_line(ex2, stall_cols, top)}")
        print(f"   opening BAR.SYNC: {num(rows[0][s_col]):.0f} samples; {stall_line([rows[0]], stall_cols, 3)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exports", nargs="+")
    ap.add_argument("--min-ex2", type=int, default=16, help="MUFU.EX2 a span needs to count as a turn")
    ap.add_argument("--top", type=int, default=6, help="stall reasons a line")
    args = ap.parse_args()
    for path in args.exports:
        try:
            report(path, args.min_ex2, args.top)
        except (FileNotFoundError, StopIteration, ValueError) as e:  # a failed ncu run leaves no table
            print(f"== {path}: no SASS table ({type(e).__name__})")


if __name__ == "__main__":
    main()
