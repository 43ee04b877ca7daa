"""Merges benchmark CSVs (gqattn-bench rows, peers.py rows, ceiling rows) into one CSV, a markdown
report (per family: config, gqattn, each peer, ours over the best peer, % of ceiling) and a PNG
plot of achieved GB/s or TFLOP/s against the ceiling. Columns: shared/BENCHMARKS.md "Outputs".
Layer: bench (Python; needs only the standard library and matplotlib).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

COLUMNS = ["family", "impl", "dtype", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
           "batch", "qo_len", "kv_len", "causal", "median_us", "achieved", "unit",
           "pct_of_ceiling", "status"]
CONFIG_FIELDS = COLUMNS[2:11]
OURS = "gqattn"
PEER_ORDER = ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "expand_sdpa", "flex"]
FAMILY_ORDER = ["decode", "prefill"]
# Which ceiling each family is measured against, by preference: the CLI's rows (impl read / gemm,
# or read_bw / gemm_bf16) win over peers.py's *_torch ones.
FAMILY_CEILING = {"decode": ("read", "read_bw", "read_bw_torch"),
                  "prefill": ("gemm", "gemm_bf16", "gemm_bf16_torch")}
CEILING_ORDER = ["read", "read_bw", "read_bw_torch", "copy", "copy_bw", "copy_bw_torch", "gemm",
                 "gemm_bf16", "gemm_bf16_torch"]
FIGURE_TEXT = {
    "decode": "achieved GB/s = (K + V + Q + O bytes) / median time",
    "prefill": "TFLOP/s = 4 x visible (query, key) pairs x num_qo_heads x head_dim / median time "
               "(causal counts only the visible keys)",
}
FAIL_MARK = "✗"
MISSING = "–"

Row = dict[str, str]
Config = tuple[str, ...]


@dataclass
class Ceiling:
    impl: str
    value: float
    unit: str


@dataclass
class Family:
    """The rows of one family, grouped by configuration in order of first appearance."""
    name: str
    configs: dict[Config, dict[str, Row]] = field(default_factory=dict)
    impls: list[str] = field(default_factory=list)
    ceiling: Optional[Ceiling] = None

    @property
    def unit(self) -> str:
        return "GB/s" if self.name == "decode" else "TFLOP/s"


# ---- reading ---------------------------------------------------------------------------------

def read_rows(paths: list[Path]) -> list[Row]:
    """All rows of all CSVs, exact duplicates dropped, missing files reported."""
    rows: list[Row] = []
    seen: set[tuple[str, ...]] = set()
    for path in paths:
        if not path.exists():
            print(f"[report] warning: {path} not found, skipped", file=sys.stderr)
            continue
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                row = {c: (raw.get(c) or "").strip() for c in COLUMNS}
                key = tuple(row.values())
                if row["family"] and key not in seen:
                    seen.add(key)
                    rows.append(row)
    return rows


def is_ok(row: Row) -> bool:
    """ok (the CLI's CPU rows say "ok (cpu)") with a positive figure."""
    return row["status"].startswith("ok") and to_float(row["achieved"]) > 0


def to_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def ceilings_of(rows: list[Row]) -> dict[str, Ceiling]:
    """The first ok ceiling row of each impl."""
    found: dict[str, Ceiling] = {}
    for r in rows:
        if r["family"] == "ceiling" and is_ok(r) and r["impl"] not in found:
            found[r["impl"]] = Ceiling(r["impl"], float(r["achieved"]), r["unit"])
    return found


def family_ceiling(name: str, ceilings: dict[str, Ceiling]) -> Optional[Ceiling]:
    for impl in FAMILY_CEILING.get(name, ()):
        if impl in ceilings:
            return ceilings[impl]
    return None


def ordered_impls(seen: list[str]) -> list[str]:
    known = [OURS] + PEER_ORDER
    return [i for i in known if i in seen] + [i for i in seen if i not in known]


def group_families(rows: list[Row], ceilings: dict[str, Ceiling]) -> list[Family]:
    """Families in FAMILY_ORDER then in order of appearance; per config the first ok row of each
    impl, else its first row."""
    families: dict[str, Family] = {}
    seen_impls: dict[str, list[str]] = {}
    for r in rows:
        if r["family"] == "ceiling":
            continue
        fam = families.setdefault(r["family"], Family(r["family"]))
        impls = seen_impls.setdefault(fam.name, [])
        if r["impl"] not in impls:
            impls.append(r["impl"])
        cell = fam.configs.setdefault(tuple(r[c] for c in CONFIG_FIELDS), {})
        if r["impl"] not in cell or (is_ok(r) and not is_ok(cell[r["impl"]])):
            cell[r["impl"]] = r
    for fam in families.values():
        fam.impls = ordered_impls(seen_impls[fam.name])
        fam.ceiling = family_ceiling(fam.name, ceilings)
    order = {name: i for i, name in enumerate(FAMILY_ORDER)}
    return sorted(families.values(), key=lambda f: order.get(f.name, len(order)))


# ---- merged CSV ------------------------------------------------------------------------------

def with_pct(row: Row, ceilings: dict[str, Ceiling]) -> Row:
    """row with pct_of_ceiling recomputed against the family's ceiling (when one is known)."""
    ceiling = family_ceiling(row["family"], ceilings)
    if ceiling is None or not is_ok(row):
        return row
    return {**row, "pct_of_ceiling": f"{100.0 * float(row['achieved']) / ceiling.value:.1f}"}


def write_csv(path: Path, rows: list[Row], ceilings: dict[str, Ceiling]) -> None:
    ceiling_rows = [r for r in rows if r["family"] == "ceiling"]
    rank = {impl: i for i, impl in enumerate(CEILING_ORDER)}
    ceiling_rows.sort(key=lambda r: rank.get(r["impl"], len(rank)))
    data = [with_pct(r, ceilings) for r in rows if r["family"] != "ceiling"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(ceiling_rows + data)


# ---- markdown --------------------------------------------------------------------------------

def config_cells(config: Config) -> list[str]:
    c = dict(zip(CONFIG_FIELDS, config))
    page = "contig" if c["page_size"] == "0" else c["page_size"]
    return [f"{c['num_qo_heads']}/{c['num_kv_heads']}", c["head_dim"], page, c["batch"],
            c["qo_len"], c["kv_len"], "yes" if c["causal"] == "1" else "no"]


def short_label(config: Config) -> str:
    c = dict(zip(CONFIG_FIELDS, config))
    page = "c" if c["page_size"] == "0" else f"p{c['page_size']}"
    kv = int(c["kv_len"])
    kv_text = f"{kv // 1024}K" if kv % 1024 == 0 else str(kv)
    causal = "" if c["causal"] == "1" else " nc"
    return (f"{c['num_qo_heads']}/{c['num_kv_heads']} d{c['head_dim']} {page} "
            f"b{c['batch']} q{c['qo_len']} kv{kv_text}{causal}")


def fmt_value(value: float, unit: str) -> str:
    return f"{value:.0f}" if unit == "GB/s" else f"{value:.1f}"


def failure_reason(row: Row) -> str:
    return row["status"].removeprefix("fail:").strip() or row["status"]


def best_peer(cell: dict[str, Row]) -> Optional[Row]:
    peers = [r for impl, r in cell.items() if impl != OURS and is_ok(r)]
    return max(peers, key=lambda r: float(r["achieved"]), default=None)


def ratio(cell: dict[str, Row]) -> Optional[float]:
    ours, best = cell.get(OURS), best_peer(cell)
    if ours is None or best is None or not is_ok(ours):
        return None
    return float(ours["achieved"]) / float(best["achieved"])


def pct(row: Optional[Row], ceiling: Optional[Ceiling]) -> str:
    if row is None or not is_ok(row):
        return MISSING
    value = 100.0 * float(row["achieved"]) / ceiling.value if ceiling else to_float(
        row["pct_of_ceiling"])
    return f"{value:.0f}%"


class FailureLegend:
    """Gives each distinct failure reason a letter, so table cells stay short."""

    def __init__(self) -> None:
        self.letters: dict[str, str] = {}

    def mark(self, reason: str) -> str:
        if reason not in self.letters:
            self.letters[reason] = letter_of(len(self.letters))
        return f"{FAIL_MARK} ({self.letters[reason]})"

    def lines(self) -> list[str]:
        return [f"- ({letter}) {reason}" for reason, letter in self.letters.items()]


def letter_of(index: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return alphabet[index % 26] * (index // 26 + 1)


def value_cell(row: Optional[Row], unit: str, legend: FailureLegend) -> str:
    if row is None:
        return MISSING
    if is_ok(row):
        return fmt_value(float(row["achieved"]), unit)
    return legend.mark(failure_reason(row))


def table_row(config: Config, cell: dict[str, Row], fam: Family, legend: FailureLegend) -> str:
    values = [value_cell(cell.get(impl), fam.unit, legend) for impl in fam.impls]
    if OURS in cell and is_ok(cell[OURS]):
        values[fam.impls.index(OURS)] = f"**{values[fam.impls.index(OURS)]}**"
    best = best_peer(cell)
    r = ratio(cell)
    tail = [best["impl"] if best else MISSING, f"{r:.2f}x" if r is not None else MISSING,
            pct(cell.get(OURS), fam.ceiling)]
    return "| " + " | ".join(config_cells(config) + values + tail) + " |"


def summary_line(fam: Family) -> str:
    ratios = [r for r in (ratio(cell) for cell in fam.configs.values()) if r is not None]
    if not ratios:
        return f"{len(fam.configs)} configs; no config has both a gqattn and a peer figure."
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    wins = sum(r > 1.0 for r in ratios)
    return (f"{len(fam.configs)} configs; gqattn ahead of the best peer in {wins} of "
            f"{len(ratios)} compared, geometric mean ours/best peer {geomean:.2f}x, "
            f"range {min(ratios):.2f}x to {max(ratios):.2f}x.")


# ---- the issues' targets (docs/perf-notes.md quotes them per session) ------------------------

DECODE_TARGET_GBS = 4200.0     # issue 3: every config with >= 1 GB of K/V
DECODE_BIG_BYTES = 1e9
DECODE_MIN_US = 12.0           # issue 3: no slower than max(K/V bytes / 4.2 TB/s, 12 us)
PEER_STREAMING = 0.90          # a peer at >= 90% of the read ceiling: within 3% of it counts
PEER_STREAMING_SLACK = 0.97
PREFILL_PEER = "sdpa_cudnn"    # issue 5: faster than cuDNN, or within 2%
PREFILL_PEER_SLACK = 0.98
PAGED_SLACK = 0.90             # issue 5: paged K/V (page 16 and 64) within 10% of contiguous
PAGED_SIZES = ("16", "64")
DECODE_GQA8_1X32K_GBS = 3000.0  # issue 3: GQA-8 (32/8 heads), batch 1, 32K context: >= 3 TB/s
PREFILL_16K_TFLOPS = {"1": 660.0, "0": 700.0}  # issue 5: hd128, 1 x 16384, causal / non-causal


def kv_bytes(config: Config) -> float:
    """Bytes of K and V a decode config reads (bf16 / fp16: 2-byte elements)."""
    c = dict(zip(CONFIG_FIELDS, config))
    return 2.0 * 2 * int(c["batch"]) * int(c["kv_len"]) * int(c["num_kv_heads"]) * int(c["head_dim"])


def ours_ok(cell: dict[str, Row]) -> Optional[Row]:
    row = cell.get(OURS)
    return row if row is not None and is_ok(row) else None


def point_target(fam: Family, select: Callable[[dict[str, str]], bool], goal: Callable[[dict[str, str]], float]) -> str:
    """'N of M (label value, ...)': the configs `select` names where ours reaches `goal` of the config."""
    hits = [(cfg, ours_ok(cell)) for cfg, cell in fam.configs.items() if select(dict(zip(CONFIG_FIELDS, cfg)))]
    met = sum(r is not None and float(r["achieved"]) >= goal(dict(zip(CONFIG_FIELDS, cfg))) for cfg, r in hits)
    values = "; ".join(f"{short_label(cfg)} " + (fmt_value(float(r["achieved"]), fam.unit) if r else FAIL_MARK)
                       for cfg, r in hits)
    return f"{met} of {len(hits)}" + (f" ({values})" if hits else "")


# Every target counts the configs it names whether or not gqattn has an ok row there: a config
# where ours failed (or has no row) is a miss, never dropped from the count.

def decode_target_lines(fam: Family) -> list[str]:
    big = [(cfg, ours_ok(cell)) for cfg, cell in fam.configs.items() if kv_bytes(cfg) >= DECODE_BIG_BYTES]
    misses = [f"{short_label(cfg)} " + (f"{float(r['achieved']):.0f}" if r else FAIL_MARK) for cfg, r in big
              if r is None or float(r["achieved"]) < DECODE_TARGET_GBS]
    floor_ok = sum(0 < to_float(r["median_us"]) <= max(kv_bytes(cfg) / DECODE_TARGET_GBS / 1e3, DECODE_MIN_US)
                   for cfg, cell in fam.configs.items() if (r := ours_ok(cell)))
    peer_ok = compared = 0
    for cell in fam.configs.values():
        r, best = ratio(cell), best_peer(cell)
        if best is None:
            continue
        compared += 1
        streaming = fam.ceiling is not None and float(best["achieved"]) >= PEER_STREAMING * fam.ceiling.value
        peer_ok += r is not None and (r > 1.0 or (streaming and r >= PEER_STREAMING_SLACK))
    return [f"Targets (issue 3): >= {DECODE_TARGET_GBS / 1e3:.1f} TB/s in {len(big) - len(misses)} of the "
            f"{len(big)} configs with >= 1 GB of K/V" + (f" (below: {'; '.join(misses)})" if misses else "") + "; "
            f"no slower than max(K/V bytes / {DECODE_TARGET_GBS / 1e3:.1f} TB/s, {DECODE_MIN_US:.0f} us) in "
            f"{floor_ok} of {len(fam.configs)}; faster than every peer (within 3% of one streaming at >= 90% of "
            f"the ceiling) in {peer_ok} of {compared}. GQA-8 batch 1 x 32K >= {DECODE_GQA8_1X32K_GBS / 1e3:.1f} TB/s "
            f"in " + point_target(fam, lambda c: (c["num_qo_heads"], c["num_kv_heads"], c["batch"], c["kv_len"])
                                  == ("32", "8", "1", "32768"), lambda c: DECODE_GQA8_1X32K_GBS) + "."]


def prefill_target_lines(fam: Family) -> list[str]:
    vs_peer = [(ours_ok(cell), float(cell[PREFILL_PEER]["achieved"])) for cell in fam.configs.values()
               if PREFILL_PEER in cell and is_ok(cell[PREFILL_PEER])]
    near = sum(ours is not None and float(ours["achieved"]) >= PREFILL_PEER_SLACK * peer for ours, peer in vs_peer)
    page = CONFIG_FIELDS.index("page_size")
    pairs = within = 0
    sizes = set()  # the page sizes the sweep pairs (the prefill sweep has page 16 only)
    for cfg, cell in fam.configs.items():
        contig_cell = fam.configs.get(cfg[:page] + ("0",) + cfg[page + 1:])
        if cfg[page] not in PAGED_SIZES or contig_cell is None:
            continue
        pairs += 1
        sizes.add(cfg[page])
        paged, contig = ours_ok(cell), ours_ok(contig_cell)
        within += (paged is not None and contig is not None
                   and float(paged["achieved"]) >= PAGED_SLACK * float(contig["achieved"]))
    return [f"Targets (issue 5): faster than {PREFILL_PEER} or within 2% in {near} of {len(vs_peer)}; "
            f"paged K/V (page {' and '.join(sorted(sizes, key=int)) or ' or '.join(PAGED_SIZES)}) within 10% of contiguous "
            f"in {within} of {pairs} pairs; "
            f"hd128 1 x 16K >= {PREFILL_16K_TFLOPS['1']:.0f} TFLOP/s causal, {PREFILL_16K_TFLOPS['0']:.0f} non-causal, in "
            + point_target(fam, lambda c: (c["head_dim"], c["batch"], c["qo_len"], c["kv_len"]) == ("128", "1", "16384", "16384"),
                           lambda c: PREFILL_16K_TFLOPS[c["causal"]]) + "."]


TARGET_LINES = {"decode": decode_target_lines, "prefill": prefill_target_lines}


def family_section(fam: Family) -> list[str]:
    legend = FailureLegend()
    ceiling = (f"{fam.ceiling.impl} {fmt_value(fam.ceiling.value, fam.ceiling.unit)} "
               f"{fam.ceiling.unit}" if fam.ceiling else "none measured")
    header = ["heads (qo/kv)", "head_dim", "page", "batch", "qo_len", "kv_len", "causal"]
    header += fam.impls + ["best peer", "ours / best peer", "ours % of ceiling"]
    lines = [f"## {fam.name} ({fam.unit}; ceiling {ceiling})", "",
             FIGURE_TEXT.get(fam.name, ""), "", summary_line(fam), "",
             *(TARGET_LINES[fam.name](fam) + [""] if fam.name in TARGET_LINES else []),
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [table_row(config, cell, fam, legend) for config, cell in fam.configs.items()]
    if legend.letters:
        lines += ["", f"Failures ({FAIL_MARK}):", *legend.lines()]
    return lines + [""]


def clock_samples(path: Path) -> list[list[float]]:
    """`nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu[,
    clocks_event_reasons.sw_power_cap] --format=csv,noheader,nounits -lms N` samples: [SM MHz,
    memory MHz, W, C] each, plus 1.0 / 0.0 where the fifth column says whether the power cap held
    the clock ("Active" / "Not Active")."""
    samples = []
    for line in path.read_text().splitlines() if path.exists() else []:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4:
            continue  # a truncated last line
        try:
            sample = [float(c) for c in cells[:4]]
        except ValueError:
            continue  # a header or "[N/A]"
        if len(cells) >= 5 and cells[4] in ("Active", "Not Active"):
            sample.append(1.0 if cells[4] == "Active" else 0.0)
        samples.append(sample)
    return samples


def median_sm_clock(samples: list[list[float]]) -> float:
    sm = sorted(s[0] for s in samples)
    return sm[len(sm) // 2]


def clock_summary(name: str, samples: list[list[float]]) -> str:
    """One phase's clocks: the SM clock's range and median, the memory clock, power and
    temperature ranges (what BENCHMARKS.md asks a table to say), and how many samples found the
    power cap holding the clock (perf-notes item 159: a long prefill row sustains ~615 TFLOP/s
    under it, ~700 in the burst after an idle)."""
    if not samples:
        return f"{name}: no samples"
    cols = list(zip(*samples))
    span = lambda v, unit: f"{min(v):.0f}-{max(v):.0f} {unit}" if min(v) != max(v) else f"{v[0]:.0f} {unit}"
    text = f"{name}: SM {span(cols[0], 'MHz')} (median {median_sm_clock(samples):.0f})"
    text += f", memory {span(cols[1], 'MHz')}, {span(cols[2], 'W')}, {span(cols[3], 'C')}"
    capped = [s[4] for s in samples if len(s) > 4]
    if capped:  # a compute-bound row timed while the cap held ran below the card's top clock
        text += f", power cap active in {sum(capped):.0f} of {len(capped)}"
    return text + f", {len(samples)} samples"


def clock_gap_line(phases: dict[str, list[list[float]]]) -> str:
    """A warning where the phases' median SM clocks differ by more than 5%: a compute-bound
    figure moves with the clock (docs/perf-notes.md, item 153: ours at the power cap, 1770 MHz,
    the peers at 1965)."""
    medians = {name: median_sm_clock(s) for name, s in phases.items() if s}
    if len(medians) < 2 or max(medians.values()) <= 1.05 * min(medians.values()):
        return ""
    listed = ", ".join(f"{name} {mhz:.0f} MHz" for name, mhz in medians.items())
    return (f"- **the SM clock's median differed between the phases ({listed})**: compute-bound "
            "ratios between them carry that difference")


def header_lines(args: argparse.Namespace, ceilings: dict[str, Ceiling]) -> list[str]:
    listed = [c for impl in CEILING_ORDER if (c := ceilings.get(impl))]
    listed += [c for impl, c in ceilings.items() if impl not in CEILING_ORDER]
    ceiling_text = ", ".join(f"{c.impl} {fmt_value(c.value, c.unit)} {c.unit}" for c in listed)
    lines = [f"# {args.title}", "",
             f"- GPU: {args.gpu or 'not given'}",
             f"- commit: {args.commit or 'not given'}",
             f"- date: {args.date}",
             f"- command: `{args.command}`" if args.command else "- command: not given"]
    clocks = [args.clocks] if args.clocks else []
    phases = {}
    for spec in args.clock_log:
        name, _, path = spec.partition("=")
        phases[name] = clock_samples(Path(path))
        clocks.append(clock_summary(name, phases[name]))
    if clocks:
        lines.append(f"- clocks: {'; '.join(clocks)}")
    if gap := clock_gap_line(phases):
        lines.append(gap)
    lines += [f"- ceilings (same run): {ceiling_text or 'none found'}",
              "- inputs: " + ", ".join(str(p) for p in args.csv),
              "- values are achieved figures, higher is better; % of ceiling is recomputed here "
              "against the family's ceiling; peers read contiguous K/V, gqattn reads pages "
              "(see bench/README.md)", ""]
    return lines


def write_markdown(path: Path, families: list[Family], args: argparse.Namespace,
                   ceilings: dict[str, Ceiling]) -> None:
    lines = header_lines(args, ceilings)
    for fam in families:
        lines += family_section(fam)
    path.write_text("\n".join(lines))


# ---- plot ------------------------------------------------------------------------------------

PLOT_INCH_PER_CONFIG = 0.16
PLOT_MIN_WIDTH = 10.0
PLOT_HEIGHT = 6.0
PLOT_DPI = 150


def series(fam: Family, impl: str) -> list[float]:
    """Achieved per config, NaN where impl failed or has no row (a gap in the line)."""
    out = []
    for cell in fam.configs.values():
        row = cell.get(impl)
        out.append(float(row["achieved"]) if row is not None and is_ok(row) else math.nan)
    return out


def group_of(config: Config) -> tuple[str, ...]:
    """Configs of one group differ only in batch and kv_len; lines are not drawn across groups."""
    c = dict(zip(CONFIG_FIELDS, config))
    return tuple(c[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size",
                                "qo_len" if c["qo_len"] != c["kv_len"] else "causal", "causal"))


def segments(fam: Family) -> list[range]:
    groups = [group_of(c) for c in fam.configs]
    starts = [i for i in range(len(groups)) if i == 0 or groups[i] != groups[i - 1]]
    return [range(s, e) for s, e in zip(starts, starts[1:] + [len(groups)])]


def plot_family(ax, fam: Family) -> None:
    spans = segments(fam)
    for impl in fam.impls:
        ours, ys = impl == OURS, series(fam, impl)
        style = dict(marker="o" if ours else ".", linewidth=2.0 if ours else 0.8,
                     markersize=4 if ours else 3, zorder=3 if ours else 2)
        line = ax.plot(list(spans[0]), ys[spans[0].start:spans[0].stop], label=impl,
                       color="black" if ours else None, **style)[0]
        for span in spans[1:]:
            ax.plot(list(span), ys[span.start:span.stop], color=line.get_color(), **style)
    for span in spans[1:]:
        ax.axvline(span.start - 0.5, color="grey", linewidth=0.5, alpha=0.5)
    if fam.ceiling:
        ax.axhline(fam.ceiling.value, color="red", linestyle="--", linewidth=1,
                   label=f"ceiling {fam.ceiling.impl} {fmt_value(fam.ceiling.value, fam.unit)}")
    n = len(fam.configs)
    ax.set_xticks(range(n))
    ax.set_xticklabels([short_label(c) for c in fam.configs], rotation=90, fontsize=5)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{fam.name}: achieved {fam.unit}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=8, frameon=False)


def write_plot(path: Path, families: list[Family], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not families:
        return
    most = max(len(f.configs) for f in families)
    width = max(PLOT_MIN_WIDTH, PLOT_INCH_PER_CONFIG * most)
    fig, axes = plt.subplots(len(families), 1, figsize=(width, PLOT_HEIGHT * len(families)),
                             squeeze=False)
    for ax, fam in zip(axes[:, 0], families):
        plot_family(ax, fam)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


# ---- main ------------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, nargs="+", required=True, help="input CSVs")
    p.add_argument("--out-prefix", type=Path, required=True,
                   help="writes <prefix>.csv, <prefix>.md, <prefix>.png")
    p.add_argument("--title", default="", help="default: gqattn <families> benchmark")
    p.add_argument("--gpu", default="")
    p.add_argument("--commit", default="")
    p.add_argument("--command", default="")
    p.add_argument("--clocks", default="", help="clocks seen during the run (free text)")
    p.add_argument("--clock-log", action="append", default=[], metavar="NAME=FILE",
                   help="nvidia-smi samples of one phase (scripts/gpu_check.sh writes them), summarised")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rows = read_rows(args.csv)
    if not rows:
        print("[report] no rows found", file=sys.stderr)
        return 1
    ceilings = ceilings_of(rows)
    families = group_families(rows, ceilings)
    args.title = args.title or f"gqattn {', '.join(f.name for f in families)} benchmark"
    prefix = args.out_prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    outputs = [Path(f"{prefix}.{ext}") for ext in ("csv", "md", "png")]
    write_csv(outputs[0], rows, ceilings)
    write_markdown(outputs[1], families, args, ceilings)
    write_plot(outputs[2], families, args.title)
    print("[report] wrote " + ", ".join(str(p) for p in outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
