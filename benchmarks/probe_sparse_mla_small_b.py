"""Probe: where the time of a small-batch sparse MLA decode goes (B = 1 and 8, H = 128).

FlashMLA runs B=1 q1 H=128 in 18 us, mate in 24-27 us at 8-32 splits (session 12; more
splits did not help). This times, interleaved: the default decode; the same with every index
-1 (no gather: the programs' fixed cost and the combine); the combine step alone; one split
(the 32 blocks of a head tile in one program: the per-block chain of a program alone on an
SM); and FlashMLA.

    python benchmarks/probe_sparse_mla_small_b.py            # the breakdown above
    python benchmarks/probe_sparse_mla_small_b.py --splits   # shorter Gluon splits (session 25)
    python benchmarks/probe_sparse_mla_small_b.py --plans    # the plans against a rounded split model
    python benchmarks/probe_sparse_mla_small_b.py --small-h  # shorter splits of the small-H kernels

Session 25 (H200, us; ``--plans`` as first run: the rounded model with 2-block Gluon splits
against the plans before the session, FlashMLA in parentheses): B=1 q1 H=128 16 x 2 16.5 / 8 x
4 19.3 (17.8); B=4 q1 H=128 16 x 2 19.7 / 8 x 4 20.0 (19.6); B=6 q1 H=128 11 x 3 22.0 / 8 x 4
21.3 (22.8); B=3 q2 H=128 11 x 3 22.2 / 8 x 4 21.3 (22.7); B=12 q2 H=128 8 x 4 58.7 / 5 x 7 53.3
(51.6); B=8 q1 H=64 16 x 2 19.9 / 8 x 4 20.1 (21.0); B=24 q1 H=64 11 x 3 42.2 / 5 x 7 29.2
(38.0); B=48 q2 H=16 4 x 4 dual 52.6 / 3 x 7 dual 56.2 (107.7). So the plans keep the old split
model and take 2-block Gluon splits only where they fit in one wave.
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


def _plan_name(m) -> str:
    return f"{m.num_splits} x {m.split_blocks} chains={m.chains} gluon={m.gluon} pdl={m.pdl}"


def _time_plans(B: int, q_len: int, H: int, plans: dict) -> str:
    """``plans`` (name -> DecodeMetadata; the first the reference) timed interleaved beside
    FlashMLA on one shape, with the largest output difference to the first plan."""
    kv = bm._cache(B)
    sets = bm._sets(B, q_len, H, kv.shape[0] * bm.PAGE)
    scale = 1 / math.sqrt(576)
    cases = {name: [bm._mate_fn(s, kv, scale, m) for s in sets] for name, m in plans.items()}
    outs = []
    for fns in cases.values():
        fns[0]()
        outs.append(sets[0]["out"].clone())
    err = max(float((o.float() - outs[0].float()).abs().max()) for o in outs)
    cases[next(iter(cases))][0]()  # the first plan's output in sets[0]["out"] for FlashMLA's note
    return bm.probe_line(f"B={B} q{q_len} H={H} (max |diff| to the first {err:.1e})", cases, sets, kv, B, H, scale)


def _splits(B: int, q_len: int, H: int) -> str:
    """The default plan against the Gluon kernel on 16 and 32 splits (2 and 1 blocks) and the
    plain kernel on 16, all with the plan's PDL rule (session 25 ran it when the plan stopped at
    4 blocks per split)."""
    md = plan_decode(B, q_len, H, bm.TOP_K, "cuda")
    plans = {f"default {_plan_name(md)}": md}
    for kw in (dict(gluon=True, num_splits=16), dict(gluon=True, num_splits=32), dict(num_splits=16)):
        mdk = plan_decode(B, q_len, H, bm.TOP_K, "cuda", **kw)
        plans[_plan_name(mdk)] = mdk
    return _time_plans(B, q_len, H, plans)


def _rounded_choose_splits(base: int, slots: int, n_blocks: int, max_splits: int) -> int:
    """The split model session 25 measured and dropped: the blocks per split rounded up
    (ceil(n_blocks / s)) and the splits that leaves, times the waves."""
    def cost(s: int) -> int:
        blocks = -(-n_blocks // s)
        return -(-base * -(-n_blocks // blocks) // slots) * blocks

    best, best_cost = 1, cost(1)
    for s in range(2, max_splits + 1):
        if cost(s) < 0.9 * best_cost:
            best, best_cost = s, cost(s)
    return best


def _plans(B: int, q_len: int, H: int) -> str:
    """The plan against the splits of the rounded model (with 2-block splits allowed), both
    with the PDL rule. Session 25 ran it with the roles the other way round ("new" the rounded
    model, "old" the plan before the session, which kept 4-block splits)."""
    from mate._core.hopper import cuda_sm_count

    md = plan_decode(B, q_len, H, bm.TOP_K, "cuda")
    n_blocks, base = bm.TOP_K // 64, B * q_len * md.num_head_tiles
    per_sm = 2 if md.num_warps == 4 and md.gluon else 1
    slots = cuda_sm_count(torch.device("cuda")) * per_sm
    rounded = plan_decode(B, q_len, H, bm.TOP_K, "cuda",
                          num_splits=_rounded_choose_splits(base, slots, n_blocks, n_blocks // 2))
    return _time_plans(B, q_len, H, {f"plan {_plan_name(md)}": md, f"rounded model {_plan_name(rounded)}": rounded})


def _small_h(B: int, q_len: int, H: int) -> str:
    """The small-H default plan against 16 and 32 splits (2 and 1 blocks) of the same kernel."""
    md = plan_decode(B, q_len, H, bm.TOP_K, "cuda")
    plans = {f"default {_plan_name(md)}": md}
    for splits in (16, 32):
        m = plan_decode(B, q_len, H, bm.TOP_K, "cuda", num_splits=splits)
        plans[_plan_name(m)] = m
    return _time_plans(B, q_len, H, plans)


def main() -> None:
    if "--small-h" in sys.argv:  # session 25: shorter splits for the small-H kernels at small B
        for B, q_len, H in ((1, 1, 16), (1, 2, 16), (2, 1, 16), (4, 1, 16), (1, 1, 32), (2, 1, 32)):
            print(_small_h(B, q_len, H), flush=True)
        return
    if "--plans" in sys.argv:  # session 25: the plans against a split model with rounded blocks
        for B, q_len, H in ((1, 1, 128), (4, 1, 128), (6, 1, 128), (3, 2, 128), (12, 2, 128), (8, 1, 64),
                            (24, 1, 64), (48, 2, 16)):
            print(_plans(B, q_len, H), flush=True)
        return
    if "--splits" in sys.argv:  # session 25: shorter Gluon splits at small B
        for B, q_len, H in ((1, 1, 128), (1, 2, 128), (2, 1, 128), (4, 1, 128), (1, 1, 64), (2, 1, 64)):
            print(_splits(B, q_len, H), flush=True)
        return
    for B, H in ((1, 128), (8, 128), (1, 64)):
        print(_shape(B, H), flush=True)


if __name__ == "__main__":
    main()
