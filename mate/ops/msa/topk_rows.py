"""MSA top-k selection with rows on threads (``rows`` variant of :mod:`mate.ops.msa.topk`).

A program holds ``ROWS`` rows as ``[4, ROWS, NC, 4]`` fp32 scores (block ``16 c + 4 r + v``):
four threads per row, each with 4 consecutive blocks of every 16-block chunk (16-byte loads,
8 rows per warp instruction), so per-row work is mostly thread-local and a row reduction is
2 shuffle stages instead of the 5 of a one-warp row. Selection of a long row (``n > W``):

1. the group maxima (4 blocks per thread per chunk, NaN-propagating) and a bisection on their
   order-preserving keys to ``lo`` with ``W <= count(max >= lo) <= W + SLACK``: those W groups
   hold at most ``fb + fe`` forced blocks, so at least ``C = W - fb - fe`` candidates are
   ``>= lo``;
2. a bisection on the scores themselves (fp32 compares against the float of a key) from
   ``lo`` to the largest group max, counting candidates as all blocks ``>=`` the threshold
   less the forced ones (loaded apart, ``[ROWS, FP]``), until exactly C candidates are
   ``>= lo`` or the interval is one key (a tie at the C-th place: the first ties in block
   order by a prefix sum);
3. the chosen candidates and the forced blocks get their output slots by a prefix sum in
   block order.

Rows with a NaN, or whose bound is -inf (fewer than W finite groups), take a key path on the
same registers (forced blocks lifted to the largest key, invalid blocks to 0, the W-th
largest key by bisection). Rows with ``n <= W`` are the identity.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mate._core.triton_helpers import INTERPRET
from mate.ops.msa.topk import _dummy_positions, _float_of_key, _lane_keys, _max_nan

__all__ = ["topk_rows_launch", "ROWS_CONFIGS"]

KEY_NEG_INF = tl.constexpr(0x007FFFFF)
""":func:`_lane_keys` of -inf (the smallest key of a non-NaN score)."""


@triton.jit
def _prefix4(x):
    """Inclusive prefix sum of an int32 ``[4 (r), ROWS, NC (c), 4 (v)]`` tensor in block
    order (``16 c + 4 r + v``) along each row."""
    tv = tl.sum(x, axis=3)
    tr = tl.sum(tv, axis=0)
    in_v = tl.cumsum(x, axis=3)
    ex_r = tl.cumsum(tv, axis=0) - tv
    ex_c = tl.cumsum(tr, axis=1) - tr
    return in_v + ex_r[:, :, :, None] + ex_c[None, :, :, None]


@triton.jit
def _rsum(x):
    """Row sums of a ``[4, ROWS, NC, 4]`` tensor, ``[ROWS]``."""
    return tl.sum(tl.sum(tl.sum(x, axis=3), axis=2), axis=0)


@triton.jit
def _rsum3(x):
    """Row sums of a ``[4, ROWS, NC]`` tensor, ``[ROWS]``."""
    return tl.sum(tl.sum(x, axis=2), axis=0)


@triton.jit
def _ties_chosen(gt, eq, K):
    """Keys above the threshold and the first ``K - count(gt)`` ties in block order."""
    take = K - _rsum(gt.to(tl.int32))
    rank = _prefix4(eq.to(tl.int32)) - 1
    return gt | (eq & (rank < take[None, :, None, None]))


@triton.jit(do_not_specialize=["n_rows", "num_tiles", "num_valid_pages", "H", "fb", "fe", "W"])
def _topk_rows_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, W,
    ROWS: tl.constexpr, NC: tl.constexpr, FP: tl.constexpr, W_P2: tl.constexpr, SLACK: tl.constexpr,
    HAS_QPOS: tl.constexpr, FULL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    n = tl.zeros([ROWS], tl.int32) + num_valid_pages
    if HAS_QPOS:
        pos = tl.load(qpos_ptr + rows // H, mask=row_ok, other=0)
        n = tl.where(pos < 0, 0, tl.minimum(pos // 128 + 1, num_valid_pages)).to(tl.int32)
    n = tl.where(row_ok, n, 0)
    long = n > W
    # [4 (r), ROWS, NC (c), 4 (v)]: Triton's load layout puts v in a thread (16-byte
    # vectors), then r and the rows on the lanes, the chunks in registers
    rr = tl.arange(0, 4)[:, None, None, None]
    cc = tl.arange(0, NC)[None, None, :, None]
    vv = tl.arange(0, 4)[None, None, None, :]
    idx = cc * 16 + rr * 4 + vv  # [4, 1, NC, 4]
    r64 = rows.to(tl.int64)[None, :, None, None]
    s_row = s_ptr + tl.minimum(r64, n_rows - 1) * num_tiles  # rows past the end read the last row
    o_row = out_ptr + r64 * W
    n4 = n[None, :, None, None]
    valid = idx < n4
    any_long = tl.max(long.to(tl.int32), axis=0) > 0
    chosen = valid
    if any_long:
        if FULL:
            x = tl.load(s_row + idx)
            if tl.min(tl.where(row_ok, n, num_tiles), axis=0) < num_tiles:
                x = tl.where(valid, x, float("-inf"))
        else:
            x = tl.load(s_row + idx, mask=valid, other=float("-inf"))
        C = W - fb - fe
        # 1. bound from the group maxima
        m = tl.reduce(x, 3, _max_nan)  # [NC, ROWS, 4]
        mk = _lane_keys(m)
        nan_row = tl.max(tl.max(tl.where(m != m, 1, 0), axis=2), axis=0) > 0
        lo = tl.min(tl.min(mk, axis=2), axis=0)
        hm = tl.max(tl.max(mk, axis=2), axis=0)
        clo = tl.zeros([ROWS], tl.int32) + NC * 4
        work = long & ~nan_row & (NC * 4 >= W)
        pending = tl.max(tl.where(work & (clo > W + SLACK) & (lo != hm), 1, 0), axis=0)
        while pending > 0:
            mid = lo + ((hm - lo) >> 1) + 1
            c = _rsum3((mk >= mid[None, :, None]).to(tl.int32))
            take = c >= W
            lo = tl.where(take, mid, lo)
            clo = tl.where(take, c, clo)
            hm = tl.where(take, hm, mid - 1)
            pending = tl.max(tl.where(work & (clo > W + SLACK) & (lo != hm), 1, 0), axis=0)
        fallback = long & ~(work & (lo > KEY_NEG_INF))
        # 2. bisection on the scores; forced blocks' scores are subtracted from the counts
        jj = tl.arange(0, FP)[None, :]
        fid = tl.where(jj < fb, jj, n[:, None] - fe + (jj - fb))
        fok = (jj < fb + fe) & long[:, None]
        fv = tl.load(s_ptr + rows.to(tl.int64)[:, None] * num_tiles + fid, mask=fok, other=float("-inf"))
        main = long & ~fallback
        hm = tl.max(tl.max(mk, axis=2), axis=0)
        clo = tl.zeros([ROWS], tl.int32) + C + 1  # unknown, >= C
        pending = tl.max(tl.where(main & (clo != C) & (lo != hm), 1, 0), axis=0)
        while pending > 0:
            mid = lo + ((hm - lo) >> 1) + 1
            t = _float_of_key(mid)
            c = _rsum((x >= t[None, :, None, None]).to(tl.int32)) - tl.sum((fv >= t[:, None]).to(tl.int32), axis=1)
            take = c >= C
            lo = tl.where(take, mid, lo)
            clo = tl.where(take, c, clo)
            hm = tl.where(take, hm, mid - 1)
            pending = tl.max(tl.where(main & (clo != C) & (lo != hm), 1, 0), axis=0)
        tau = _float_of_key(lo)[None, :, None, None]
        cand = (idx >= fb) & (idx < n4 - fe)
        forced = valid & ~cand
        if tl.max(tl.where(main & (clo != C), 1, 0), axis=0) > 0:
            sel = _ties_chosen((x > tau) & cand, (x == tau) & cand, C)
        else:
            sel = (x >= tau) & cand
        chosen = tl.where(main[None, :, None, None], sel | forced, chosen)
        if tl.max(fallback.to(tl.int32), axis=0) > 0:
            # 3'. keys: forced blocks largest, invalid blocks 0; the W-th largest key
            xf = tl.load(s_row + idx, mask=valid & fallback[None, :, None, None], other=0.0)  # rare: reloaded
            u = tl.where(valid, tl.where(cand, _lane_keys(xf), 0xFFFFFFFF), 0)
            klo = tl.zeros([ROWS], tl.uint32)
            khm = tl.max(tl.max(tl.max(u, axis=3), axis=2), axis=0)
            kc = tl.zeros([ROWS], tl.int32) + W + 1
            pending = tl.max(tl.where(fallback & (kc != W) & (klo != khm), 1, 0), axis=0)
            while pending > 0:
                mid = klo + ((khm - klo) >> 1) + 1
                c = _rsum((u >= mid[None, :, None, None]).to(tl.int32))
                take = c >= W
                klo = tl.where(take, mid, klo)
                kc = tl.where(take, c, kc)
                khm = tl.where(take, khm, mid - 1)
                pending = tl.max(tl.where(fallback & (kc != W) & (klo != khm), 1, 0), axis=0)
            kt = klo[None, :, None, None]
            sel_k = _ties_chosen(u > kt, u == kt, W)
            chosen = tl.where(fallback[None, :, None, None], sel_k, chosen)
    # 3. output slots in block order
    slot = _prefix4(chosen.to(tl.int32)) - 1
    tl.store(o_row + slot, idx + tl.zeros_like(slot), mask=chosen & row_ok[None, :, None, None])
    short = row_ok & ~long
    if tl.max(short.to(tl.int32), axis=0) > 0:
        wc = tl.arange(0, W_P2)[None, :]
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * W + wc, tl.full([ROWS, W_P2], -1, tl.int32),
                 mask=short[:, None] & (wc < W) & (wc >= n[:, None]))


ROWS_CONFIGS = {
    "rows32": dict(ROWS=32, num_warps=4),
    "rows16": dict(ROWS=16, num_warps=2),
    "rows64": dict(ROWS=64, num_warps=8),
}
"""Named configurations of :func:`topk_rows_launch` (8 rows per warp: 4 threads per row)."""

ROWS_MAX_TILES = 256
"""Longest row (tiles) of the rows kernel; longer rows take the other methods."""


def topk_rows_supported(num_tiles: int, width: int) -> bool:
    return 0 < num_tiles <= ROWS_MAX_TILES and width <= 32


def topk_rows_launch(max_score, output, query_positions, num_valid_pages: int, fb: int, fe: int,
                     config: str = "rows32", slack: int = 2) -> None:
    """Launches :func:`_topk_rows_kernel` on validated tensors (``num_tiles <= 256``, W <= 32)."""
    total_q, H, T = max_score.shape
    W = output.shape[2]
    cfg = ROWS_CONFIGS[config]
    rows = cfg["ROWS"]
    if INTERPRET:
        rows = min(rows, 8)
    n_rows = total_q * H
    nc = max(triton.next_power_of_2(max(T, 1)), 16) // 16
    qpos = query_positions if query_positions is not None else _dummy_positions(max_score.device)
    _topk_rows_kernel[(triton.cdiv(n_rows, rows),)](
        max_score, output, qpos,
        n_rows, T, num_valid_pages, H, fb, fe, W,
        ROWS=rows, NC=nc, FP=max(1, triton.next_power_of_2(max(fb + fe, 1))), W_P2=64, SLACK=slack,
        HAS_QPOS=query_positions is not None, FULL=nc * 16 == T, num_warps=cfg["num_warps"] if not INTERPRET else 1,
    )
