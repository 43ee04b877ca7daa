"""bench/compare.py: the A/B ratios of wip_check.sh, with repeated runs per binary (best of each
config, and the disagreement of the base's own runs). Plain Python, no GPU."""
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
HEADER = "family,impl,dtype,num_qo_heads,num_kv_heads,head_dim,page_size,batch,qo_len,kv_len,causal,median_us,achieved,unit,pct_of_ceiling,status\n"


def write(path, rates):
    """A sweep CSV with one decode row per (batch, rate)."""
    rows = "".join(f"decode,gqattn,bf16,32,8,128,16,{b},1,8192,1,1.0,{r},GB/s,90.0,ok\n" for b, r in rates)
    path.write_text(HEADER + rows)
    return str(path)


def compare(*args):
    out = subprocess.run([sys.executable, str(BENCH / "compare.py"), *args, "--quiet"], check=True,
                         capture_output=True, text=True, cwd=BENCH)
    return out.stdout.strip().splitlines()[-1]


def test_single_runs_give_the_plain_ratio(tmp_path):
    base = write(tmp_path / "main.csv", [(1, 1000), (8, 2000)])
    new = write(tmp_path / "ours.csv", [(1, 1100), (8, 2200)])
    line = compare(base, new)
    assert "2 configs, geomean x1.100, min x1.100, max x1.100" in line
    assert "base runs differ" not in line


def test_repeated_runs_take_each_configs_best_and_report_the_base_spread(tmp_path):
    base = ",".join([write(tmp_path / "main_1.csv", [(1, 1000), (8, 2000)]),
                     write(tmp_path / "main_2.csv", [(1, 1100), (8, 2000)])])
    new = ",".join([write(tmp_path / "ours_1.csv", [(1, 1100), (8, 1800)]),
                    write(tmp_path / "ours_2.csv", [(1, 900), (8, 2200)])])
    line = compare(base, new)
    # best of each: base 1100 / 2000, new 1100 / 2200 -> ratios 1.0 and 1.1
    assert "2 configs" in line and "min x1.000, max x1.100" in line
    # the base's runs: 1100/1000 on one config, equal on the other
    assert "base runs differ by x1.049 (geomean), x1.100 at most" in line
