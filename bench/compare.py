#!/usr/bin/env python3
"""Ratio of gqattn's achieved rate between benchmark CSVs (gqattn-bench / report.py format).

  python3 bench/compare.py BASE.csv NEW.csv [NEW2.csv ...] [--impl gqattn] [--quiet]

Prints, per config present in both files, base -> new and the ratio, then the geometric mean and
the extremes; used for the A/B entries of docs/perf-notes.md."""
import argparse
import math
from pathlib import Path

from report import CONFIG_FIELDS, OURS, is_ok, read_rows, to_float

# family + the configuration columns (dtype ... causal): one key per benchmarked configuration.
KEY = ["family"] + CONFIG_FIELDS


def load(path, impl):
    """{config: (achieved, unit)} of `impl`'s ok rows (report.py's reader and ok rule)."""
    return {tuple(r[c] for c in KEY): (to_float(r["achieved"]), r["unit"])
            for r in read_rows([Path(path)]) if r["impl"] == impl and is_ok(r)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new", nargs="+")
    ap.add_argument("--impl", default=OURS)
    ap.add_argument("--quiet", action="store_true", help="only the summary line per file")
    a = ap.parse_args()
    base = load(a.base, a.impl)
    for path in a.new:
        new = load(path, a.impl)
        ratios = []
        keys = sorted((k for k in new if k in base), key=lambda k: (k[0], int(k[4]), int(k[6]), int(k[8]), k[5], k[3]))
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
