"""benchmarks/ncu_hotspots.py on a synthetic ncu SASS-source CSV (random sample counts)."""

from __future__ import annotations

import csv
import importlib.util
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("ncu_hotspots", ROOT / "benchmarks" / "ncu_hotspots.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hotspots_totals_reasons_top_and_loops(tmp_path):
    tool = _tool()
    rng = random.Random()
    n = 300
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_barrier",
              "stall_long_sb (Not Issued)"]
    rows, long_sb, barrier = [], [], []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        long_sb.append(a)
        barrier.append(b)
        src = f"FADD R{i % 200}, R1, R2"
        if i == 250:  # a loop from instruction 120 back-branching at 250 (131 instructions)
            src = f"@!P0  BRA 0x{0x1000 + 16 * 120:x}"
        rows.append([f"0x{0x1000 + 16 * i:x}", src, str(a + b), str(a), str(b), "7"])
    hot = rng.randrange(n)
    rows[hot][2:5] = ["500", "500", "0"]
    long_sb[hot], barrier[hot] = 500, 0
    path = tmp_path / "report.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerows(rows)
    head, data = tool.load(str(path))
    assert head == header and len(data) == n
    total = sum(long_sb) + sum(barrier)
    lines = tool.summarize(head, data, top=3, regions=[(0, 9, "first ten")])
    assert lines[0] == f"{n} instructions, {total} samples"
    assert f"long_sb {100 * sum(long_sb) / total:.1f}%" in lines[1] and "Not Issued" not in lines[1]
    assert lines[3].split()[0] == str(hot) and "long_sb 500" in lines[3]
    loop_line = next(x for x in lines if x.startswith("loop"))
    loop_samples = sum(long_sb[120:251]) + sum(barrier[120:251])
    assert loop_line.startswith(f"loop [120, 250]: {loop_samples} samples")
    first = next(x for x in lines if x.startswith("first ten"))
    assert first.startswith(f"first ten [0, 9]: {sum(long_sb[:10]) + sum(barrier[:10])} samples")
