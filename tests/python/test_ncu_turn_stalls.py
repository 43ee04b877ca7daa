"""scripts/ncu_turn_stalls.py: a kernel's exponential turns (BAR.SYNC .. BAR.ARV spans holding the
MUFU.EX2) and their stall reasons, from one ncu SASS export (docs/perf-notes.md, item 294). Plain
Python on small synthetic exports."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ncu_turn_stalls.py"
HEADER = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"Instructions Executed"',
          '"stall_mio_throttle"', '"stall_barrier"', '"stall_mio_throttle (Not Issued)"']


def write(path, rows):
    """rows: (source, samples, executed, mio_throttle, barrier)."""
    lines = ['"Kernel Name","k(int)"', ",".join(HEADER)]
    for i, (src, samples, executed, mio, barrier) in enumerate(rows):
        lines.append(",".join(f'"{v}"' for v in (hex(0x100 + 16 * i), src, samples, executed, mio, barrier, 0)))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout


def test_finds_the_turn_and_splits_its_stalls(tmp_path):
    turn = [("BAR.SYNC.DEFER_BLOCKING R154, 0x100", 30, 10, 0, 30)]
    turn += [("FFMA R2, R3, R4, -R5", 2, 10, 2, 0), ("MUFU.EX2 R2, R2", 8, 10, 6, 0)] * 3
    turn += [("BAR.ARV R24, 0x100", 0, 10, 0, 0)]
    # A barrier span with too few exponentials before it is not a turn.
    rows = [("BAR.SYNC.DEFER_BLOCKING 0x0", 10, 10, 0, 10), ("MUFU.EX2 R1, R1", 10, 10, 10, 0),
            ("BAR.ARV 0x2, 0x100", 0, 10, 0, 0)] + turn + [("EXIT", 0, 1, 0, 0)]
    out = run(write(tmp_path / "a.csv", rows), "--min-ex2", "3")
    assert "12 instructions, 80 samples, 1 exponential turn(s)" in out
    assert "-- rows 3-10: 8 instructions (3 MUFU.EX2), 60 samples (75.0 % of the kernel's)" in out
    assert "whole turn: barrier 55.6 %, mio_throttle 44.4 %" in out
    assert "MUFU.EX2: 24 samples, 0.800 an execution; mio_throttle 100.0 %" in out
    assert "opening BAR.SYNC: 30 samples; barrier 100.0 %" in out
