"""Probe: fixed and per-K-block cost of the small-M groupwise FP8 GEMM against DeepGEMM.

At M <= 128 and K = 7168 the K-interleaved Gluon kernel trails DeepGEMM by ~1 us per call.
This times the kernel on one config at several K (N and M fixed) beside DeepGEMM, interleaved
(``time_interleaved``, CUDA-graph replays over rotated inputs), and fits time = fixed +
per_block * (K / 128) by least squares, so the gap splits into a per-launch part (prologue,
pipeline fill, epilogue) and a streaming part.

    python benchmarks/probe_gemm_fixed_cost.py [--ks 128,512,2048,7168]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm_smallm import _dg_fn, _k, _mate_fn, _operands  # noqa: E402

from mate.testing.bench import rotation_count, time_interleaved  # noqa: E402

# (M, N): the K-interleaved configs auto runs at K = 7168 (tuning.GROUPWISE_GLUON)
CASES = {
    (128, 4096): _k(64, 64, 6, 2, 1, True),
    (128, 2112): _k(64, 64, 6, 2, 2, True),
    (64, 4096): _k(64, 32, 4, 4, 1, True),
}


def _fit(ks, ts):
    """Least-squares (fixed, per K block) of t = fixed + per_block * K / 128."""
    per_block, fixed = statistics.linear_regression([k / 128 for k in ks], ts)
    return fixed, per_block


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="128,512,2048,7168")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    import deep_gemm as dg

    print(f"{'M':>4} {'N':>5} {'impl':>26} " + " ".join(f"{'K=' + str(k):>8}" for k in ks) + "    fixed  per-blk")
    for (m, n), (name, cfg) in CASES.items():
        rows = {name: [], "deepgemm": []}
        for k in ks:
            byts = m * k + n * k + 2 * m * n
            sets = [_operands(m, n, k, seed=i) for i in range(rotation_count(byts, max_sets=16))]
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in sets]
            # SPLIT_K capped by the K blocks, as the launcher does
            c = {**cfg, "SPLIT_K": min(cfg["SPLIT_K"], k // 128)}
            cases = {name: [_mate_fn(x, o, c) for x, o in zip(sets, outs)],
                     "deepgemm": [_dg_fn(dg, x, o) for x, o in zip(sets, outs)]}
            times = time_interleaved(cases, rounds=5, iters=400)
            for impl in rows:
                t = times[impl]
                rows[impl].append(t if isinstance(t, float) else float("nan"))
        for impl, ts in rows.items():
            fixed, per = _fit(ks, ts)
            print(f"{m:>4} {n:>5} {impl:>26} " + " ".join(f"{t:8.2f}" for t in ts) + f"  {fixed:7.2f}  {per:7.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
