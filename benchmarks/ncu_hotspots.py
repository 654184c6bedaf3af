"""Where a kernel's warps stall, from Nsight Compute's source-level sampling (SASS view).

    python benchmarks/ncu_hotspots.py REPORT.csv [--top 25] [--regions A-B:name ...]

``REPORT.csv`` is ``ncu -i report.ncu-rep --page source --print-source sass --csv`` of a report
taken with ``--section SourceCounters`` (add ``--clock-control none`` so the clocks are the
ones a benchmark sees). Prints the total of the "Warp Stall Sampling (All Samples)" column,
its split by stall reason, the ``--top`` instructions by samples with their three largest
reasons, and the loops (backward branches spanning more than 100 instructions) with their
samples; ``--regions`` adds per-range totals (instruction indices as printed). Session 19 used
it on the small-H sparse MLA decode (the copy of a loop-carried register waiting for a load,
~13% of one partition's samples) and the MSA fp8 decode (36% of the samples at the TMA waits,
~10% in a two-axis flag reduction); ``benchmarks/results/2026-11-30-h200-s19-probes.txt``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re

SAMPLES = "Warp Stall Sampling (All Samples)"


def load(path: str) -> tuple[list[str], list[list[str]]]:
    """(header, instruction rows) of an ncu SASS-source CSV (a kernel-name line first)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if "Source" in r and SAMPLES in r)
    return rows[start], rows[start + 1:]


def summarize(header: list[str], rows: list[list[str]], top: int = 25,
              regions: list[tuple[int, int, str]] | None = None) -> list[str]:
    """The report's lines (see the module docstring)."""
    src, smp = header.index("Source"), header.index(SAMPLES)
    reasons = {h[len("stall_"):]: i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h}

    def n(r: list[str], i: int) -> int:
        return int(r[i] or 0) if i < len(r) else 0

    total = sum(n(r, smp) for r in rows) or 1
    out = [f"{len(rows)} instructions, {total} samples"]
    by_reason = collections.Counter({k: sum(n(r, i) for r in rows) for k, i in reasons.items()})
    out.append("by reason: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10) if v))
    out.append(f"top {top} instructions (index, % of samples, SASS, largest reasons):")
    for i in sorted(range(len(rows)), key=lambda i: -n(rows[i], smp))[:top]:
        r = rows[i]
        if not n(r, smp):
            break
        why = sorted(((n(r, j), k) for k, j in reasons.items()), reverse=True)[:3]
        why_s = ", ".join(f"{k} {c}" for c, k in why if c)
        out.append(f"  {i:5d} {100 * n(r, smp) / total:5.1f}%  {r[src].strip()[:64]:64s}  {why_s}")
    for a, b, name in loops(rows, src) + (regions or []):
        seg = rows[a:b + 1]
        s = sum(n(r, smp) for r in seg)
        rc = collections.Counter({k: sum(n(r, i) for r in seg) for k, i in reasons.items()})
        top_r = ", ".join(f"{k} {v}" for k, v in rc.most_common(4) if v)
        out.append(f"{name} [{a}, {b}]: {s} samples ({100 * s / total:.1f}%): {top_r}")
    return out


def loops(rows: list[list[str]], src: int, min_len: int = 100) -> list[tuple[int, int, str]]:
    """(first, last, "loop") index ranges of the backward branches spanning more than
    ``min_len`` instructions; a branch's target is matched by the instruction's address
    column."""
    addr = {int(r[0], 16): i for i, r in enumerate(rows) if re.fullmatch(r"0x[0-9a-fA-F]+", r[0] or "")}
    found = []
    for i, r in enumerate(rows):
        m = re.search(r"@!?U?P\w+\s+BRA\s+(0x[0-9a-fA-F]+)", r[src])
        if m and int(m.group(1), 16) in addr:
            j = addr[int(m.group(1), 16)]
            if j < i and i - j > min_len:
                found.append((j, i, "loop"))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--regions", nargs="*", default=[], help="A-B:name instruction ranges to total")
    args = ap.parse_args()
    regions = []
    for spec in args.regions:
        span, _, name = spec.partition(":")
        a, _, b = span.partition("-")
        regions.append((int(a), int(b), name or span))
    header, rows = load(args.csv)
    print("\n".join(summarize(header, rows, args.top, regions)))


if __name__ == "__main__":
    main()
