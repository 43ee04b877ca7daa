"""scripts/ncu_sass_diff.py: where one case of a kernel spends more warp-state samples than another,
instruction by instruction (docs/perf-notes.md, item 48). Plain Python on small synthetic exports."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ncu_sass_diff.py"
HEADER = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"Instructions Executed"',
          '"stall_long_sb"', '"stall_wait"', '"stall_long_sb (Not Issued)"']


def write(path, rows, base):
    """An export as ncu writes it: a kernel-name line, the header, one line per instruction.
    rows: (source, samples, executed, long_sb, wait); base: the load address (branch targets differ)."""
    lines = ['"Kernel Name","k(int)"', ",".join(HEADER)]
    for i, (src, samples, executed, long_sb, wait) in enumerate(rows):
        src = src.replace("TARGET", hex(base + 0x100))
        lines.append(",".join(f'"{v}"' for v in (hex(base + 16 * i), src, samples, executed, long_sb, wait, 0)))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run(*args, check=True):
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=check, capture_output=True, text=True)


def test_excess_ranks_instructions_and_splits_regions(tmp_path):
    # B has 16x the work: scaled by 1/16, instruction 1 of A carries the excess.
    a = write(tmp_path / "a.csv", [("LDC R1", 10, 10, 0, 10), ("@!P0 BRA TARGET", 100, 40, 90, 10),
                                   ("USETMAXREG.DEALLOC.CTAPOOL 0x58", 0, 4, 0, 0), ("LDG R2", 30, 8, 30, 0)], 0x7FB9AF7BC200)
    b = write(tmp_path / "b.csv", [("LDC R1", 160, 160, 0, 160), ("@!P0 BRA TARGET", 320, 640, 300, 20),
                                   ("USETMAXREG.DEALLOC.CTAPOOL 0x58", 0, 64, 0, 0), ("LDG R2", 480, 128, 480, 0)], 0x7FB0BD7BC200)
    out = run(a, b, "--scale", "0.0625", "--top", "2").stdout
    assert "samples: A 140, B scaled 60, A / B 2.333" in out
    assert "region 0 (instructions 0-1): A 110, B scaled 30, excess 80" in out
    assert "region 1 (instructions 2-3): A 30, B scaled 30, excess 0" in out
    ranked = [line for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))]
    assert ranked[0].split()[:2] == ["1", "80"] and "long_sb 90, wait 10" in ranked[0]


def test_different_binaries_are_refused(tmp_path):
    a = write(tmp_path / "a.csv", [("LDC R1", 1, 1, 0, 1)], 0x100)
    b = write(tmp_path / "b.csv", [("LDC R2", 1, 1, 0, 1)], 0x100)
    result = run(a, b, "--scale", "1", check=False)
    assert result.returncode != 0 and "not the same SASS" in result.stderr
