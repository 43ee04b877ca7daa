#!/usr/bin/env python3
"""Where case A spends more time than case B, instruction by instruction (docs/perf-notes.md, item 48).

Reads two exports of NCU_SASS=1 scripts/ncu_decode.sh (ncu --page source --csv --print-source sass) of the same
kernel binary, scales B's warp-state samples by --scale (A's work / B's work, e.g. 1/16 when B has
16x A's FLOPs), and prints the instructions with the largest excess samples of A over scaled B,
each with its two leading stall reasons, and the sums per region (regions split at the instructions
that match --split, by default the producer's setmaxnreg release: consumers before it, producer
after). Usage: scripts/ncu_sass_diff.py A.csv B.csv --scale 0.0625 [--top 40] [--split REGEX]
"""
import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The export starts with a "Kernel Name" line, then the header, then one row per instruction.
    start = next(i for i, r in enumerate(rows) if SAMPLES in r)
    header, data = rows[start], rows[start + 1:]
    return header, [r for r in data if len(r) == len(header)]


def num(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--scale", type=float, required=True, help="A's work / B's work")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--split", default=r"USETMAXREG\.DEALLOC", help="regex of the SASS lines that start a new region")
    args = ap.parse_args()
    ha, da = load(args.a)
    hb, db = load(args.b)
    src_a, src_b = ha.index("Source"), hb.index("Source")
    strip = lambda t: re.sub(r"0x[0-9a-f]{8,}", "ADDR", t.strip())  # branch targets differ by load address
    if len(da) != len(db) or any(strip(x[src_a]) != strip(y[src_b]) for x, y in zip(da, db)):
        sys.exit("ncu_sass_diff: the two exports are not the same SASS (same binary and kernel?)")
    sa, sb, ea = ha.index(SAMPLES), hb.index(SAMPLES), ha.index(EXECUTED)
    stalls = [h for h in ha if h.startswith("stall_") and "Not Issued" not in h]
    stall_cols = [ha.index(h) for h in stalls]
    tot_a = sum(num(r[sa]) for r in da)
    tot_b = sum(num(r[sb]) for r in db) * args.scale
    print(f"samples: A {tot_a:.0f}, B scaled {tot_b:.0f}, A / B {tot_a / tot_b:.3f}")
    bounds = [0]
    for i, r in enumerate(da):
        if re.search(args.split, r[src_a]):
            bounds.append(i)
    bounds.append(len(da))
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        a = sum(num(r[sa]) for r in da[lo:hi])
        b = sum(num(r[sb]) for r in db[lo:hi]) * args.scale
        print(f"region {k} (instructions {lo}-{hi - 1}): A {a:.0f}, B scaled {b:.0f}, excess {a - b:.0f}"
              + (f", A / B {a / b:.3f}" if b > 0 else ""))
    excess = sorted(((num(x[sa]) - num(y[sb]) * args.scale, i) for i, (x, y) in enumerate(zip(da, db))), reverse=True)
    print(f"\n{'index':>5} {'excess':>8} {'A':>7} {'B scaled':>9} {'A executed':>11}  instruction  (leading stalls of A)")
    for ex, i in excess[: args.top]:
        r = da[i]
        lead = sorted(((num(r[c]), h[6:]) for c, h in zip(stall_cols, stalls)), reverse=True)[:2]
        lead_text = ", ".join(f"{name} {n:.0f}" for n, name in lead if n > 0)
        print(f"{i:5d} {ex:8.0f} {num(r[sa]):7.0f} {num(db[i][sb]) * args.scale:9.1f} {num(r[ea]):11.0f}  "
              f"{r[src_a].strip()[:64]}  ({lead_text})")


if __name__ == "__main__":
    main()
