"""MSA sparse_topk_select threshold variants on the H200, each checked against the reference.

    python benchmarks/bench_msa_topk_variants.py          # every shape and variant
    python benchmarks/bench_msa_topk_variants.py --bar    # the bar shape: default vs lanes
    python benchmarks/bench_msa_topk_variants.py --warps  # the bar shape: NW one-row warps variants

``--bar``: 32768 x 4 x 256 (and the same with causal query positions), the classic
``lanes`` kernel against the ``fast`` one (slack 2; one row per one-warp program) and two
streaming floors (loads without the selection: each row reduced to one key and W ids
written; the lanes grid, and 4 rows per one-warp program, which streams at ~80% of copy
against ~40%), timed interleaved (GB/s: the whole score tensor over the time, also for the
causal rows, which read only their valid blocks); then 200 random GPU cases with ties
checked against the reference for each variant marked in :data:`BAR_VARIANTS`. Between
them, the same kernels on 4096 tokens whose scores stay in the L2 (the compute cost alone).

Top-16 + 1 forced end block (not counted) of fp32 scores, 4 heads. For each shape and each
variant (threshold method, rows per program) it prints the time (CUDA-graph replays,
inputs rotated past the L2), the read bandwidth of the scores and its fraction of the copy
bandwidth measured in the same run, and ``exact`` = output equal to the sort-based
reference on the first input set (``MISMATCH`` otherwise). torch.topk (values + indices,
no forced block, unsorted) is the peer.
"""

from __future__ import annotations

import random
import sys

import torch
import triton
import triton.language as tl

from mate.ops.msa import topk as tk
from mate.ops.msa.reference_select import topk_select_reference
from mate.testing.bench import time_fn, time_interleaved

SHAPES = [(32768, 256, False), (32768, 256, True), (8192, 1024, False), (1024, 12287, False)]
VARIANTS = [  # label, launcher keywords, tile counts it runs at (None: all)
    ("default (lanes fast; interval > 256 tiles)", dict(), None),
    ("interval", dict(method="interval"), None),
    ("radix", dict(method="radix"), None),
    ("interval warps2", dict(method="interval", num_warps=2), (256,)),  # a row over 2 warps
    ("lanes slack0", dict(method="lanes", lanes_slack=0), (256,)),
]
BAR_VARIANTS = [  # label, launcher keywords, checked on the random cases
    ("lanes classic slack2", dict(method="lanes", lanes_kernel="classic"), False),
    ("lanes fast slack2", dict(method="lanes", lanes_kernel="fast", lanes_warps=1), True),
]
WARPS_VARIANTS = [  # --warps: the fast kernel with NW one-row warps per program (topk_warps.py)
    ("warps4 cap32 (default)", dict(method="lanes", lanes_warps=4, lanes_maxnreg=32), True),
    ("warps8 cap32", dict(method="lanes", lanes_warps=8, lanes_maxnreg=32), True),
    ("warps1 (one-row kernel)", dict(method="lanes", lanes_kernel="fast", lanes_warps=1), True),
]


@triton.jit
def _stream_floor_kernel(s_ptr, out_ptr, num_tiles, H, W, R: tl.constexpr):
    """The default lanes kernel's grid without the selection: one row per one-warp
    program, the row's max key written to its W output slots (16-byte loads)."""
    row = tl.program_id(0).to(tl.int64) * H + tl.program_id(1)
    idx = tl.arange(0, R)[:, None] * 32 + tl.arange(0, 32)[None, :]
    s = tl.load(s_ptr + row * num_tiles + idx, mask=idx < num_tiles, other=0.0)
    m = tl.max(tl.max(s, axis=1), axis=0).to(tl.int32, bitcast=True)
    wc = tl.arange(0, 32)
    tl.store(out_ptr + row * W + wc, m + wc, mask=wc < W)


@triton.jit(do_not_specialize=["n_rows", "num_tiles", "W"])
def _floor_rows_kernel(s_ptr, out_ptr, n_rows, num_tiles, W, R: tl.constexpr, P: tl.constexpr):
    """P consecutive rows per one-warp program without the selection, loaded as the lanes
    kernel does (4-byte loads, block 32 j + l in lane l) one row before the row is reduced
    to its max key, written to its W slots."""
    idx = tl.arange(0, R)[:, None] * 32 + tl.arange(0, 32)[None, :]
    wc = tl.arange(0, 32)
    r0 = tl.program_id(0).to(tl.int64) * P
    s = tl.full([R, 32], float("-inf"), tl.float32)
    for i in range(P + 1):
        nxt = r0 + i
        s_next = tl.load(s_ptr + nxt * num_tiles + idx, mask=(idx < num_tiles) & (nxt < n_rows) & (i < P),
                         other=float("-inf"))
        row = nxt - 1
        m = tl.max(tl.max(s, axis=1), axis=0).to(tl.int32, bitcast=True)
        tl.store(out_ptr + row * W + wc, m + wc, mask=(wc < W) & (i >= 1) & (row < n_rows))
        s = s_next


def stream_floor(s: torch.Tensor, out: torch.Tensor) -> None:
    total_q, h, t = s.shape
    _stream_floor_kernel[(total_q, h)](s, out, t, h, out.shape[2], R=triton.next_power_of_2(t) // 32, num_warps=1)


def floor_rows(s: torch.Tensor, out: torch.Tensor, rows: int) -> None:
    total_q, h, t = s.shape
    n = total_q * h
    _floor_rows_kernel[(triton.cdiv(n, rows),)](s, out, n, t, out.shape[2], R=triton.next_power_of_2(t) // 32,
                                                 P=rows, num_warps=1, num_stages=1)


FLOORS = [  # label, launcher(scores, out)
    ("floor (token, head) grid", stream_floor),
    ("floor rows4", lambda s, o: floor_rows(s, o, 4)),
]


def bar(ceiling: float, total_q: int = 32768, variants=None) -> int:
    """The bar shape (and its causal twin): times and exact checks; returns failures."""
    variants = BAR_VARIANTS if variants is None else variants
    bad = 0
    tiles = 256
    nbytes = total_q * H * tiles * 4
    scores = [torch.randn(total_q, H, tiles, device="cuda") for _ in range(4)]
    scores[0][:, :, ::7] = 0.5  # ties across the threshold in the checked set
    out = torch.empty(total_q, H, K + 1, device="cuda", dtype=torch.int32)
    outs = {label: torch.empty_like(out) for label, _, _ in variants}
    for causal in (False, True):
        qpos = None
        if causal:
            qpos = torch.arange(total_q, device="cuda", dtype=torch.int64) + (tiles * 128 - total_q)
        kw = dict(query_positions=qpos, num_valid_pages=tiles, topk=K, force_begin_blocks=0, force_end_blocks=1,
                  force_blocks_count_in_topk=False)
        ref = topk_select_reference(scores[0], **kw)
        shape = f"{total_q}x{H}x{tiles}" + (" causal" if causal else "")
        cases = {}
        exact = {}
        for label, v, _ in variants:
            o = outs[label]
            o.fill_(-7)
            try:
                tk.sparse_topk_select_triton(scores[0], o, **kw, **v)
                exact[label] = bool(torch.equal(o, ref))
            except Exception as exc:  # e.g. a compile error: the other variants still run
                print(f"{shape:22s} {label:28s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                bad += 1
                continue
            bad += not exact[label]
            cases[label] = [lambda s=s, o=o, a=kw, b=v: tk.sparse_topk_select_triton(s, o, **a, **b) for s in scores]
        if not causal:
            for label, fn in FLOORS:
                cases[label] = [lambda s=s, fn=fn: fn(s, out) for s in scores]
        times = time_interleaved(cases, rounds=5, iters=100)
        for label, t in times.items():
            if isinstance(t, Exception):
                bad += 1
                print(f"{shape:22s} {label:28s} failed: {type(t).__name__}: {str(t)[:200]}", flush=True)
                continue
            gbps = nbytes / (t * 1e-6) / 1e9
            chk = ("exact" if exact[label] else "MISMATCH") if label in exact else "-"
            print(f"{shape:22s} {label:28s} {t:8.1f} {gbps:7.0f} {gbps / ceiling:7.1%}  {chk}", flush=True)
    del scores
    torch.cuda.empty_cache()
    return bad


def l2_resident(total_q: int = 4096, variants=None) -> None:
    """The bar's rows from one 16 MB score set that stays in the L2 (no rotation): the
    selection's compute cost with DRAM out of the way, printed per 32768 tokens to set
    beside the bar rows."""
    tiles = 256
    s = torch.randn(total_q, H, tiles, device="cuda")
    out = torch.empty(total_q, H, K + 1, device="cuda", dtype=torch.int32)
    kw = dict(query_positions=None, num_valid_pages=tiles, topk=K, force_begin_blocks=0, force_end_blocks=1,
              force_blocks_count_in_topk=False)
    cases = {label: (lambda v=v: tk.sparse_topk_select_triton(s, out, **kw, **v))
             for label, v, _ in (BAR_VARIANTS if variants is None else variants)}
    for label, fn in FLOORS:
        cases[label] = lambda fn=fn: fn(s, out)
    scale = 32768 / total_q
    for label, t in time_interleaved(cases, rounds=5, iters=100).items():
        if isinstance(t, Exception):
            print(f"L2 {total_q}x{H}x{tiles:<9d} {label:28s} failed: {type(t).__name__}: {str(t)[:200]}", flush=True)
            continue
        print(f"L2 {total_q}x{H}x{tiles:<9d} {label:28s} {t:8.1f} us, x{scale:.0f} = {t * scale:7.1f} us", flush=True)


def random_checks(cases: int = 200, tiles=(17, 40, 100, 200, 256, 256), variants=None) -> int:
    """The variants marked in :data:`BAR_VARIANTS` on ``cases`` random cases (ties,
    NaN/+-inf/-0.0, forced blocks, short rows, query positions, lengths 17..256) against
    the reference; returns failures."""
    bad = 0
    todo = [(label, v) for label, v, check in (BAR_VARIANTS if variants is None else variants) if check]
    ok = {label: 0 for label, _ in todo}
    failed = set()
    rng = random.Random(99)
    gen = torch.Generator().manual_seed(99)
    for i in range(cases):
        T = rng.choice(tiles)
        tq, h = rng.randint(1, 48), rng.randint(1, 4)
        levels = rng.choice([2, 3, 8, 64, None])
        if levels:
            s = torch.randint(0, levels, (tq, h, T), generator=gen).float() - levels // 2
        else:
            s = torch.randn(tq, h, T, generator=gen)
        if i % 2 == 0:  # NaN, -inf, +inf, -0.0
            u = torch.rand(tq, h, T, generator=gen)
            s[u < 0.03] = float("nan")
            s[(u >= 0.03) & (u < 0.08)] = float("-inf")
            s[(u >= 0.08) & (u < 0.10)] = float("inf")
            s[(u >= 0.10) & (u < 0.14)] = -0.0
        s = s.cuda()
        topk = rng.choice([4, 8, 16])
        counted = rng.random() < 0.5
        fb, fe = rng.randint(0, 2), rng.randint(0, 2)
        if counted and fb + fe > topk:
            fb = 0
        nvp = rng.randint(1, T) if rng.random() < 0.3 else T
        qpos = torch.randint(-300, T * 128 + 50, (tq,), generator=gen).cuda() if rng.random() < 0.4 else None
        width = topk if counted else topk + fb + fe
        args = dict(query_positions=qpos, num_valid_pages=nvp, topk=topk, force_begin_blocks=fb,
                    force_end_blocks=fe, force_blocks_count_in_topk=counted)
        ref = topk_select_reference(s, **args)
        for label, v in todo:
            o = torch.full((tq, h, width), -7, dtype=torch.int32, device=s.device)
            try:
                tk.sparse_topk_select_triton(s, o, **args, **v)
            except Exception as exc:  # counted as a mismatch; the other variants still run
                if label not in failed:
                    print(f"random cases {label:28s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                failed.add(label)
                continue
            ok[label] += bool(torch.equal(o, ref))
    for label, _ in todo:
        bad += cases - ok[label]
        print(f"random cases {label:28s} {ok[label]}/{cases} exact", flush=True)
    return bad


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


def fail_fast() -> int:
    """One small launch of the 4-warp kernel against the reference (a build or launch error
    stops the run before the long part)."""
    s = torch.randn(37, 3, 256, device="cuda")
    s[:, :, ::5] = 0.25
    kw = dict(query_positions=None, num_valid_pages=256, topk=K, force_begin_blocks=1, force_end_blocks=1,
              force_blocks_count_in_topk=False)
    o = torch.full((37, 3, K + 2), -7, dtype=torch.int32, device="cuda")
    try:
        tk.sparse_topk_select_triton(s, o, **kw, method="lanes", lanes_warps=4)
        torch.cuda.synchronize()
    except Exception as exc:
        print(f"fail-fast: warps4 failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
        return 1
    ok = bool(torch.equal(o, topk_select_reference(s, **kw)))
    print(f"fail-fast: warps4 37x3x256 {'exact' if ok else 'MISMATCH'}", flush=True)
    return int(not ok)


def main() -> int:
    torch.manual_seed(0)
    if "--warps" in sys.argv and fail_fast():
        return 1
    ceiling = copy_gbps()
    print(f"copy bandwidth {ceiling:.0f} GB/s")
    print(f"{'shape':26s} {'variant':28s} {'us':>8s} {'GB/s':>7s} {'of copy':>7s}  check")
    if "--warps" in sys.argv:
        bad = bar(ceiling, variants=WARPS_VARIANTS)
        l2_resident(variants=WARPS_VARIANTS)
        bad += random_checks(tiles=(256,), variants=WARPS_VARIANTS)
        print("all exact" if bad == 0 else f"{bad} MISMATCH or failed")
        return int(bad != 0)
    if "--bar" in sys.argv:
        bad = bar(ceiling)
        l2_resident()
        bad += random_checks()
        print("all exact" if bad == 0 else f"{bad} MISMATCH or failed")
        return int(bad != 0)
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
