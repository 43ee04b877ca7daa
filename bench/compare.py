#!/usr/bin/env python3
"""Ratio of gqattn's achieved rate between benchmark CSVs (gqattn-bench / report.py format).

  python3 bench/compare.py BASE.csv NEW.csv [NEW2.csv ...] [--impl gqattn] [--quiet]

Prints, per config present in both files, base -> new and the ratio, then the geometric mean and
the extremes; used for the A/B entries of docs/perf-notes.md."""
import argparse
import csv
import math

KEY = ["family", "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "batch", "qo_len", "kv_len", "causal"]


def load(path, impl):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["impl"] == impl and r["status"] == "ok":
                rows[tuple(r[c] for c in KEY)] = (float(r["achieved"]), r["unit"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new", nargs="+")
    ap.add_argument("--impl", default="gqattn")
    ap.add_argument("--quiet", action="store_true", help="only the summary line per file")
    a = ap.parse_args()
    base = load(a.base, a.impl)
    for path in a.new:
        new = load(path, a.impl)
        ratios = []
        keys = sorted((k for k in new if k in base), key=lambda k: (k[0], int(k[3]), int(k[5]), int(k[7]), k[4], k[2]))
        for k in keys:
            r = new[k][0] / base[k][0]
            ratios.append((r, k))
            if not a.quiet:
                print(f"{path}: " + " ".join(f"{c}={v}" for c, v in zip(KEY, k))
                      + f"  {base[k][0]:9.1f} -> {new[k][0]:9.1f} {new[k][1]}  x{r:.3f}")
        if not ratios:
            print(f"{path}: no config in common with {a.base}")
            continue
        g = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
        lo, hi = min(ratios), max(ratios)
        print(f"{path}: {len(ratios)} configs, geomean x{g:.3f}, min x{lo[0]:.3f}, max x{hi[0]:.3f}")


if __name__ == "__main__":
    main()
