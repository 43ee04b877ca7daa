#!/usr/bin/env python3
"""Issue 3's per-row floor against a plain read of the same bytes (perf-notes item 266).

For each decode row of a table (gqattn-bench / report CSV), the bytes it moves (median_us x
achieved GB/s) and the time small_reads.cu took to read that many bytes with the benchmarks'
streaming kernel in the same timing (interpolated linearly between its sizes). A row whose plain
read already takes longer than max(bytes / 4.2 TB/s, 12 us) cannot meet the floor with any kernel
that reads its K/V once; the rest could.
  usage: floor_check.py DECODE_TABLE.csv SMALL_READS.csv [--rate 4.2e12] [--min-us 12]
"""
import argparse
import bisect
import csv
import sys


def load_reads(path):
    sizes, times = [], []
    with open(path) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            sizes.append(float(row["megabytes"]) * (1 << 20))
            times.append(float(row["median_us"]))
    return sizes, times


def read_time(sizes, times, b):
    if b <= sizes[0]:
        return times[0]
    i = bisect.bisect_left(sizes, b)
    if i >= len(sizes):  # past the largest size: its rate
        return times[-1] * b / sizes[-1]
    x0, x1, y0, y1 = sizes[i - 1], sizes[i], times[i - 1], times[i]
    return y0 + (y1 - y0) * (b - x0) / (x1 - x0)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("reads")
    ap.add_argument("--rate", type=float, default=4.2e12, help="the floor's bandwidth, bytes/s")
    ap.add_argument("--min-us", type=float, default=12.0, help="the floor's smallest time")
    ap.add_argument("--impl", default="gqattn")
    a = ap.parse_args(argv)
    sizes, times = load_reads(a.reads)
    met = unattainable = attainable = 0
    rows = []
    with open(a.table) as f:
        for r in csv.DictReader(f):
            if r["family"] != "decode" or r["impl"] != a.impl or r["status"] != "ok":
                continue
            us = float(r["median_us"])
            b = us * 1e-6 * float(r["achieved"]) * 1e9
            floor = max(b / a.rate * 1e6, a.min_us)
            read = read_time(sizes, times, b)
            if us <= floor:
                met += 1
                verdict = "met"
            elif read > floor:
                unattainable += 1
                verdict = "read alone misses it"
            else:
                attainable += 1
                verdict = "missed"
            key = "/".join(r[k] for k in ("num_qo_heads", "num_kv_heads")) + " hd%s p%s %sx%s q%s" % (
                r["head_dim"], r["page_size"], r["batch"], r["kv_len"], r["qo_len"])
            rows.append((verdict, key, b / 1e6, us, floor, read))
    print("verdict,row,megabytes,ours_us,floor_us,plain_read_us")
    for v, k, mb, us, fl, rd in sorted(rows, key=lambda x: (x[0], x[2])):
        print(f"{v},{k},{mb:.1f},{us:.1f},{fl:.1f},{rd:.1f}")
    print(f"# {met} rows meet the floor; of the {unattainable + attainable} that miss it, a plain read of "
          f"the same bytes misses it too in {unattainable}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
