"""Probe: where the time of a small-batch sparse MLA decode goes (B = 1 and 8, H = 128).

FlashMLA runs B=1 q1 H=128 in 18 us, mate in 24-27 us at 8-32 splits (session 12; more
splits did not help). This times, interleaved: the default decode; the same with every index
-1 (no gather: the programs' fixed cost and the combine); the combine step alone; one split
(the 32 blocks of a head tile in one program: the per-block chain of a program alone on an
SM); and FlashMLA.

    python benchmarks/probe_sparse_mla_small_b.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sparse_mla as bm  # noqa: E402

from mate.ops.sparse_mla.decode import launch_combine  # noqa: E402
from mate.ops.sparse_mla.metadata import plan_decode  # noqa: E402


def _shape(B: int, H: int) -> str:
    kv = bm._cache(B)
    tokens = kv.shape[0] * bm.PAGE
    sets = bm._sets(B, 1, H, tokens)
    scale = 1 / math.sqrt(576)
    md = plan_decode(B, 1, H, bm.TOP_K, "cuda")
    # one split on the default's kernel (the plain kernel at these shapes) and on Gluon
    md1 = plan_decode(B, 1, H, bm.TOP_K, "cuda", num_splits=1, gluon=md.gluon or None,
                      prefetch_idx=None if md.gluon else True)
    md1g = plan_decode(B, 1, H, bm.TOP_K, "cuda", num_splits=1)
    empty = [{**s, "idx": torch.full_like(s["idx"], -1)} for s in sets]
    cases = {
        f"default ({md.num_splits} splits, gluon={md.gluon})": [bm._mate_fn(s, kv, scale, md) for s in sets],
        "all ids -1": [bm._mate_fn(s, kv, scale, md) for s in empty],
        f"1 split (gluon={md1.gluon})": [bm._mate_fn(s, kv, scale, md1) for s in sets],
        f"1 split, all ids -1 (gluon={md1.gluon})": [bm._mate_fn(s, kv, scale, md1) for s in empty],
        f"1 split (gluon={md1g.gluon})": [bm._mate_fn(s, kv, scale, md1g) for s in sets],
    }
    if md.num_splits > 1:
        lse = torch.empty(B, 1, H, device="cuda")
        cases["combine alone"] = [lambda s=s: launch_combine(md.partial_o, md.partial_lse, s["out"], lse, 1.0, H,
                                                             md.num_splits, B) for s in sets]
    cases[next(iter(cases))][0]()  # mate's output in sets[0]["out"], which FlashMLA's note compares against
    return bm.probe_line(f"B={B} H={H}", cases, sets, kv, B, H, scale)


def main() -> None:
    for B, H in ((1, 128), (8, 128), (1, 64)):
        print(_shape(B, H), flush=True)


if __name__ == "__main__":
    main()
