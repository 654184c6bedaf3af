"""MSA sparse_topk_select threshold variants on the H200, each checked against the reference.

    python benchmarks/bench_msa_topk_variants.py

Top-16 + 1 forced end block (not counted) of fp32 scores, 4 heads. For each shape and each
variant (threshold method, rows per program) it prints the time (CUDA-graph replays,
inputs rotated past the L2), the read bandwidth of the scores and its fraction of the copy
bandwidth measured in the same run, and ``exact`` = output equal to the sort-based
reference on the first input set (``MISMATCH`` otherwise). torch.topk (values + indices,
no forced block, unsorted) is the peer.
"""

from __future__ import annotations

import sys

import torch

from mate.ops.msa import topk as tk
from mate.ops.msa.reference_select import topk_select_reference
from mate.testing.bench import time_fn

SHAPES = [(32768, 256, False), (32768, 256, True), (8192, 1024, False), (1024, 12287, False)]
VARIANTS = [  # label, launcher keywords, tile counts it runs at (None: all)
    ("interval (default)", dict(), None),
    ("radix", dict(method="radix"), None),
    ("interval warps2", dict(method="interval", num_warps=2), (256,)),  # a row over 2 warps
]
H, K = 4, 16


def copy_gbps() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), iters=20, use_graph=False)
    return 2 * n / (t * 1e-6) / 1e9


def run_shape(total_q: int, tiles: int, causal: bool, todo: list, ceiling: float) -> int:
    """Times and checks the variants ``todo`` at one shape; returns how many failed."""
    bad = 0
    nbytes = total_q * H * tiles * 4
    sets = max(1, min(8, (512 << 20) // nbytes))
    scores = [torch.randn(total_q, H, tiles, device="cuda") for _ in range(sets)]
    scores[0][:, :, ::7] = 0.5  # ties across the threshold in the checked set
    qpos = None
    if causal:  # token t sees blocks 0 .. t // 128: every row length from 1 to tiles
        qpos = torch.arange(total_q, device="cuda", dtype=torch.int64) + (tiles * 128 - total_q)
    out = torch.empty(total_q, H, K + 1, device="cuda", dtype=torch.int32)
    kw = dict(query_positions=qpos, num_valid_pages=tiles, topk=K, force_begin_blocks=0, force_end_blocks=1,
              force_blocks_count_in_topk=False)
    ref = topk_select_reference(scores[0], **kw)
    shape = f"{total_q}x{H}x{tiles}" + (" causal qpos" if causal else "")
    for label, v in todo:
        try:
            out.fill_(-7)
            tk.sparse_topk_select_triton(scores[0], out, **kw, **v)
            ok = bool(torch.equal(out, ref))
            fns = [lambda s=s, o=out, a=kw, b=v: tk.sparse_topk_select_triton(s, o, **a, **b) for s in scores]
            t = time_fn(fns, iters=50)
            gbps = nbytes / (t * 1e-6) / 1e9
            bad += not ok
            print(f"{shape:26s} {label:28s} {t:8.1f} {gbps:7.0f} {gbps / ceiling:7.1%}  "
                  f"{'exact' if ok else 'MISMATCH'}", flush=True)
        except Exception as exc:  # a variant that fails still leaves a line
            bad += 1
            print(f"{shape:26s} {label:28s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    if not causal:
        t = time_fn([lambda s=s: torch.topk(s, K, dim=-1) for s in scores], iters=50)
        gbps = nbytes / (t * 1e-6) / 1e9
        print(f"{shape:26s} {'torch.topk':28s} {t:8.1f} {gbps:7.0f} {gbps / ceiling:7.1%}  (peer)", flush=True)
    del scores, ref
    torch.cuda.empty_cache()
    return bad


def main() -> int:
    torch.manual_seed(0)
    ceiling = copy_gbps()
    print(f"copy bandwidth {ceiling:.0f} GB/s")
    print(f"{'shape':26s} {'variant':28s} {'us':>8s} {'GB/s':>7s} {'of copy':>7s}  check")
    bad = 0
    for total_q, tiles, causal in SHAPES:
        todo = [(label, v) for label, v, at in VARIANTS if at is None or tiles in at]
        try:
            bad += run_shape(total_q, tiles, causal, todo, ceiling)
        except Exception as exc:  # e.g. a faulted CUDA context after a failed experimental kernel
            bad += 1
            print(f"{total_q}x{H}x{tiles} causal={causal}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    print("all exact" if bad == 0 else f"{bad} variant(s) MISMATCH or failed")
    return int(bad != 0)


if __name__ == "__main__":
    sys.exit(main())
