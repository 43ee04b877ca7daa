#!/usr/bin/env python3
"""Ratio of gqattn's achieved rate between benchmark CSVs (gqattn-bench / report.py format).

  python3 bench/compare.py BASE.csv NEW.csv [NEW2.csv ...] [--impl gqattn] [--quiet]

Prints, per config present in both files, base -> new and the ratio, then the geometric mean and
the extremes; used for the A/B entries of docs/perf-notes.md. A comma-joined list in place of a
file (BASE_1.csv,BASE_2.csv) stands for repeated runs of one binary: each config takes its best
rate over them, and for a repeated base the summary adds how far its runs disagreed (the noise
an A/B of that call cannot resolve)."""
import argparse
import math
from pathlib import Path

from report import CONFIG_FIELDS, OURS, is_ok, read_rows, to_float

# family + the configuration columns (dtype ... causal): one key per benchmarked configuration.
KEY = ["family"] + CONFIG_FIELDS


def load_one(path, impl):
    """{config: (achieved, unit)} of `impl`'s ok rows (report.py's reader and ok rule)."""
    return {tuple(r[c] for c in KEY): (to_float(r["achieved"]), r["unit"])
            for r in read_rows([Path(path)]) if r["impl"] == impl and is_ok(r)}


def load(paths, impl):
    """load_one of each comma-separated path; each config keeps its best rate over the runs."""
    best = {}
    for path in paths.split(","):
        for k, v in load_one(path, impl).items():
            if k not in best or v[0] > best[k][0]:
                best[k] = v
    return best


def spread(paths, impl):
    """Geometric mean and largest of max/min over the runs, per config present in every run."""
    runs = [load_one(p, impl) for p in paths.split(",")]
    common = set(runs[0]).intersection(*runs[1:])
    if len(runs) < 2 or not common:
        return None
    ratios = [max(r[k][0] for r in runs) / min(r[k][0] for r in runs) for k in common]
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios)), max(ratios)


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
        noise = spread(a.base, a.impl)
        extra = f"; base runs differ by x{noise[0]:.3f} (geomean), x{noise[1]:.3f} at most" if noise else ""
        print(f"{path}: {len(ratios)} configs, geomean x{g:.3f}, min x{lo[0]:.3f}, max x{hi[0]:.3f}{extra}")


if __name__ == "__main__":
    main()
