"""MSA top-k selection with rows on threads (``rows`` variant of :mod:`mate.ops.msa.topk`).

A program holds ``ROWS`` rows as ``[4 (r), ROWS, NC (c), 4 (v)]`` fp32 scores, block
``4 NC r + 4 c + v``: 16-byte vectors, four threads per row, each with ``4 NC`` consecutive
blocks (sm_90 TTGIR: ``sizePerThread [1, 1, 1, 4], threadsPerWarp [4, 8, 1, 1]``, 8 rows per
warp), so a row reduction is 2 shuffle stages. Selection of a long row (``n > W``):

1. the group maxima (4 blocks, NaN-propagating) and a bisection on their order-preserving
   keys to ``lo`` with ``W <= count(max >= lo) <= W + SLACK``: those W groups hold at most
   ``fb + fe`` forced blocks, so at least ``C = W - fb - fe`` candidates are ``>= lo``;
2. the survivors (candidates ``fb <= id < n - fe`` with scores ``>= lo``, ~20 per row, at
   least C) into ``SLOTS`` slots per thread in block order (``SLOTS / 2`` from each 32 blocks,
   by bit masks), their scores reloaded (L1 hits); ``SLOTS`` 0 (``rows*`` configs) keeps all
   64 blocks of a thread instead;
3. a bisection on those scores (others -inf; fp32 compares against the float of a key) from
   ``lo`` until exactly C are ``>= lo`` or the interval is one key (a tie at the C-th place:
   the first ties in block order by popcount prefixes);
4. each thread writes its chosen blocks after the earlier threads' counts (one row sum of
   bytes): ascending ids without a prefix scan; the forced blocks first and last.

Rows with a NaN, a -inf bound (fewer than W finite groups, or invalid blocks at the
threshold) or more survivors than slots in 32 blocks are redone one at a time in the same
program by the lanes kernel's full-row selection (:func:`mate.ops.msa.topk._lanes_full_row`). Rows with ``n <= W`` are the identity.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from mate._core.triton_helpers import INTERPRET
from mate.ops.msa.topk import _dummy_positions, _float_of_key, _lane_keys, _lanes_full_row, _max_nan

__all__ = ["topk_rows_launch", "ROWS_CONFIGS"]

KEY_NEG_INF = tl.constexpr(0x007FFFFF)
""":func:`_lane_keys` of -inf (the smallest key of a non-NaN score)."""


@triton.jit
def _popc(x):
    """Set bits of each uint32 (the interpreter has no ``libdevice.popc``)."""
    if INTERPRET:
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return ((x * 0x01010101) >> 24).to(tl.int32)
    else:
        return libdevice.popc(x.to(tl.int32, bitcast=True))


@triton.jit
def _thread_masks(x):
    """A thread's 0/1 ``[4, ROWS, NC, 4]`` values as bit masks of its ``4 NC <= 64``
    blocks in order (``[4, ROWS, 1, 1]`` uint32 each: blocks 0-31, 32-63 of the thread)."""
    j = tl.arange(0, x.shape[2])[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    bit = tl.full([1, 1, 1, 1], 1, tl.uint32) << (j & 31).to(tl.uint32)
    ml = tl.sum(tl.sum(tl.where(x & (j < 32), bit, 0), axis=3, keep_dims=True), axis=2, keep_dims=True)
    mh = tl.sum(tl.sum(tl.where(x & (j >= 32), bit, 0), axis=3, keep_dims=True), axis=2, keep_dims=True)
    return ml, mh


@triton.jit
def _threads_before(t):
    """Exclusive prefix over the 4 threads of a row of ``t`` ([4, ROWS, 1, 1], 0 <= t <= 64):
    one row sum of the values packed in bytes."""
    sh = tl.arange(0, 4)[:, None, None, None] * 8
    p = tl.sum(t << sh, axis=0, keep_dims=True)  # byte r: thread r's value
    return (((p & ((1 << sh) - 1)) * 0x01010101) >> 24) & 0xFF  # bytes below r


@triton.jit
def _prefix4(x):
    """Inclusive prefix sum of a 0/1 ``[4 (r), ROWS, NC (c), 4 (v)]`` tensor (bool) in block
    order (``4 NC r + 4 c + v``) along each row: popcounts of the thread's bit masks, then
    the earlier threads' totals."""
    ml, mh = _thread_masks(x)
    j = tl.arange(0, x.shape[2])[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    bit = tl.full([1, 1, 1, 1], 1, tl.uint32) << (j & 31).to(tl.uint32)
    upto = bit | (bit - 1)
    cl = _popc(ml)
    own = tl.where(j < 32, _popc(ml & upto), cl + _popc(mh & upto))
    return own + _threads_before(cl + _popc(mh))


@triton.jit
def _count_ge(x, t):
    """``count(x >= t)`` of each row of fp32 ``x`` ([4, ROWS, NC, 4]; ``t`` [ROWS]): on the
    GPU one ``set`` (-1 / 0) per score and 3-input adds."""
    if INTERPRET:
        return _rsum((x >= t[None, :, None, None]).to(tl.int32))
    else:
        m = tl.inline_asm_elementwise("set.ge.s32.f32 $0, $1, $2;", "=r,f,f",
                                      [x, tl.zeros_like(x) + t[None, :, None, None]], dtype=tl.int32,
                                      is_pure=True, pack=1)
        return -_rsum(m)


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
    rank = _prefix4(eq) - 1
    return gt | (eq & (rank < take[None, :, None, None]))


@triton.jit
def _ctz(w):
    """Index of the lowest set bit of each uint32 (garbage for 0)."""
    if INTERPRET:
        return _popc((w & (0 - w)) - 1)
    else:
        return tl.inline_asm_elementwise("{ .reg .b32 t; brev.b32 t, $1; bfind.shiftamt.u32 $0, t; }", "=r,r",
                                         [w], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _below(k):
    """uint32 masks of the bits below ``k`` (clamped to 0 .. 32)."""
    k = tl.minimum(tl.maximum(k, 0), 32)
    return tl.where(k >= 32, 0xFFFFFFFF, (tl.full(k.shape, 1, tl.uint32) << k.to(tl.uint32)) - 1)


@triton.jit
def _survivor_slots(ml, mh, id0, SLOTS: tl.constexpr):
    """Block ids of the set bits (lowest first) of each thread's masks ``ml`` (bit j: block
    ``id0 + j``) and ``mh`` (``id0 + 32 + j``), ``[4, ROWS, 1, 1]`` uint32 with at most
    ``SLOTS // 2`` bits each, as ``[4, ROWS, SLOTS // 4, 4]``: slot ``4 c + v < SLOTS // 2``
    from ``ml``, the others from ``mh`` (every register a constant slot: the selects fold
    away)."""
    ss = tl.arange(0, SLOTS // 4)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    sid = tl.zeros([ml.shape[0], ml.shape[1], SLOTS // 4, 4], tl.int32)
    for k in tl.static_range(SLOTS // 2):
        sid = tl.where(ss == k, id0 + _ctz(ml), sid)
        sid = tl.where(ss == k + SLOTS // 2, id0 + 32 + _ctz(mh), sid)
        ml = ml & (ml - 1)
        mh = mh & (mh - 1)
    return sid


@triton.jit
def _slot_prefix(x):
    """:func:`_prefix4` of a 0/1 ``[4, ROWS, S, 4]`` tensor whose elements are all in one
    thread's registers (constant slots: a running sum, the selects and sums fold away)."""
    ss = tl.arange(0, x.shape[2])[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    xi = x.to(tl.int32)
    acc = tl.zeros([x.shape[0], x.shape[1], 1, 1], tl.int32)
    pre = tl.zeros_like(xi)
    for k in tl.static_range(x.shape[2] * 4):
        acc += tl.sum(tl.sum(tl.where(ss == k, xi, 0), axis=3, keep_dims=True), axis=2, keep_dims=True)
        pre = tl.where(ss == k, acc, pre)
    return pre + _threads_before(acc)


@triton.jit(do_not_specialize=["n_rows", "num_valid_pages", "H", "fb", "fe", "W"])
def _topk_rows_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, W,
    ROWS: tl.constexpr, NC: tl.constexpr, W_P2: tl.constexpr, SLACK: tl.constexpr, G1: tl.constexpr,
    SLOTS: tl.constexpr, HAS_QPOS: tl.constexpr, FULL: tl.constexpr, ALL_FULL: tl.constexpr,
):
    pid = tl.program_id(0)
    ri = tl.arange(0, ROWS)
    rows = pid * ROWS + ri
    row_ok = rows < n_rows
    n = tl.zeros([ROWS], tl.int32) + num_valid_pages
    if HAS_QPOS:
        pos = tl.load(qpos_ptr + rows // H, mask=row_ok, other=0)
        n = tl.where(pos < 0, 0, tl.minimum(pos // 128 + 1, num_valid_pages)).to(tl.int32)
    n = tl.where(row_ok, n, 0)
    long = n > W
    # [4 (r), ROWS, NC (c), 4 (v)], block 4 NC r + 4 c + v: 16-byte vectors (num_tiles % 16 == 0
    # is specialized), then r and the rows on the lanes, the chunks in registers: a thread
    # holds 4 NC consecutive blocks
    rr = tl.arange(0, 4)[:, None, None, None]
    cc = tl.arange(0, NC)[None, None, :, None]
    vv = tl.arange(0, 4)[None, None, None, :]
    idx = rr * (4 * NC) + cc * 4 + vv  # [4, 1, NC, 4]
    r64 = tl.minimum(rows, n_rows - 1).to(tl.int64)[None, :, None, None]
    s_row = s_ptr + r64 * num_tiles
    o_row = out_ptr + rows.to(tl.int64)[None, :, None, None] * W
    n4 = n[None, :, None, None]
    id0 = rr * (4 * NC)
    main = long
    C = W - fb - fe
    if tl.max(long.to(tl.int32), axis=0) > 0:
        valid = idx < n4
        if ALL_FULL:
            x = tl.load(s_row + idx)
        elif FULL:
            # whole 16-byte vectors (in the row), blocks >= n set to -inf after
            x = tl.load(s_row + idx, mask=(idx - vv) < n4, other=float("-inf"))
            x = tl.where(valid, x, float("-inf"))
        else:
            x = tl.load(s_row + idx, mask=valid, other=float("-inf"))
        # 1. a bound from the group maxima (NaN-propagating; a NaN's key is the largest)
        mk = _lane_keys(tl.reduce(x, 3, _max_nan))  # [4, ROWS, NC]
        lo = tl.min(tl.min(mk, axis=2), axis=0)
        hm = tl.max(tl.max(mk, axis=2), axis=0)
        clo = tl.zeros([ROWS], tl.int32) + NC * 4
        work = long & (hm <= 0xFF800000) & (NC * 4 >= W)
        while tl.max((work & (clo > W + SLACK) & (lo != hm)).to(tl.int32), axis=0) > 0:
            mid = lo + ((hm - lo) >> 1) + 1
            c = _rsum3((mk >= mid[None, :, None]).to(tl.int32))
            take = c >= W
            lo = tl.where(take, mid, lo)
            clo = tl.where(take, c, clo)
            hm = tl.where(take, hm, mid - 1)
        # NaN rows and rows whose bound is -inf (invalid blocks are -inf too) take the
        # lanes kernel's full-row selection below
        main = work & (lo > KEY_NEG_INF)
        if SLOTS > 0:
            # 2. the survivors (candidates >= lo, at least C) into SLOTS slots per thread in
            # block order (half from each 32 blocks), their scores reloaded (L1 hits); rows
            # with more take the lanes path
            # (bits of the 64 blocks of a thread, candidates only: fb <= id < n - fe)
            ml, mh = _thread_masks(x >= _float_of_key(lo)[None, :, None, None])
            a = fb - id0
            b = n4 - fe - id0
            ml = ml & (_below(b) ^ _below(a))  # a < b
            mh = mh & (_below(b - 32) ^ _below(a - 32))
            cl = _popc(ml)
            ch = _popc(mh)  # [4, ROWS, 1, 1]
            main = main & (tl.max(tl.max(tl.max(tl.maximum(cl, ch), axis=3), axis=2), axis=0) <= SLOTS // 2)
            ss = tl.arange(0, SLOTS // 4)[None, None, :, None] * 4 + vv
            sid = _survivor_slots(ml, mh, id0, SLOTS)
            sok = tl.where(ss < SLOTS // 2, ss < cl, ss - SLOTS // 2 < ch) & main[None, :, None, None]
            xc = tl.load(s_row + sid, mask=sok, other=float("-inf"))
            clo = _rsum(cl + ch)
            hm = _lane_keys(tl.max(tl.max(tl.max(xc, axis=3), axis=2), axis=0))
        else:
            # 2. all candidates (others -inf)
            cand = (idx >= fb) & (idx < n4 - fe)
            xc = tl.where(cand, x, float("-inf"))
            hm = tl.max(tl.max(mk, axis=2), axis=0)
            clo = tl.zeros([ROWS], tl.int32) + C + 1  # unknown, >= C
        # 3. the exact C-th largest candidate by bisection on the scores from lo until exactly
        # C are >= lo or the interval is one key (a tie at the C-th place: the first ties in
        # block order by popcount prefixes)
        while tl.max((main & (clo != C) & (lo != hm) & (C > 0)).to(tl.int32), axis=0) > 0:
            mid = lo + ((hm - lo) >> 1) + 1
            c = _count_ge(xc, _float_of_key(mid))
            take = c >= C
            lo = tl.where(take, mid, lo)
            clo = tl.where(take, c, clo)
            hm = tl.where(take, hm, mid - 1)
        tau = _float_of_key(lo)[None, :, None, None]
        if tl.max((main & (clo != C) & (C > 0)).to(tl.int32), axis=0) > 0:
            sel = _ties_chosen(xc > tau, xc == tau, C)  # a tie straddles the C-th place
        else:
            sel = xc >= tau
        if SLOTS > 0:
            sel = sel & sok & (C > 0)
            tl.store(o_row + fb + _slot_prefix(sel) - 1, sid, mask=sel)
        else:
            chosen = tl.where(long[None, :, None, None], (sel & (C > 0)) | (valid & ~cand), valid)
    else:
        if SLOTS == 0:
            chosen = idx < n4
    if SLOTS > 0:
        # forced blocks of the selected rows: 0 .. fb-1 first, n-fe .. n-1 last
        for q in range(0, fb + fe, 4):
            e = q + rr  # [4, 1, 1, 1]: forced block e of the row in thread e % 4
            tl.store(o_row + tl.where(e < fb, e, W - fb - fe + e), tl.where(e < fb, e, n4 - fb - fe + e),
                     mask=main[None, :, None, None] & (e < fb + fe))
        short = row_ok & ~long
        if tl.max(short.to(tl.int32), axis=0) > 0:
            # identity rows: 0 .. n-1, then -1 (position p = 8 r + 4 c + v)
            p = rr * 8 + tl.arange(0, 2)[None, None, :, None] * 4 + vv
            tl.store(o_row + p, tl.where(p < n4, p, -1), mask=short[None, :, None, None] & (p < W))
    else:
        # output: each thread writes its chosen blocks in order after the earlier threads'
        ml, mh = _thread_masks(chosen & (main | ~long)[None, :, None, None])
        cnt = _popc(ml) + _popc(mh)  # [4, ROWS, 1, 1]
        o_thr = o_row + _threads_before(cnt)
        for k in range(tl.max(tl.max(tl.max(tl.max(cnt, axis=3), axis=2), axis=1), axis=0)):
            low = ml != 0
            w = tl.where(low, ml, mh)
            j = _popc((w & (0 - w)) - 1) + tl.where(low, 0, 32)
            tl.store(o_thr + k, id0 + j, mask=k < cnt)
            ml = tl.where(low, ml & (ml - 1), ml)
            mh = tl.where(low, mh, mh & (mh - 1))
        short = row_ok & ~long
        if tl.max(short.to(tl.int32), axis=0) > 0:
            wc = tl.arange(0, W_P2)[None, :]
            tl.store(out_ptr + rows.to(tl.int64)[:, None] * W + wc, tl.full([ROWS, W_P2], -1, tl.int32),
                     mask=short[:, None] & (wc < W) & (wc >= n[:, None]))
    rest = long & ~main
    if tl.max(rest.to(tl.int32), axis=0) > 0:
        # rare rows (NaN, -inf bound, more survivors than slots): one at a time on the lanes
        # kernel's full-row path
        R: tl.constexpr = NC // 2
        jj = tl.arange(0, R)[:, None]
        ll = tl.arange(0, 32)[None, :]
        idx2 = jj * 32 + ll
        while tl.max(rest.to(tl.int32), axis=0) > 0:
            r = tl.min(tl.where(rest, ri, ROWS), axis=0)
            rest = rest & (ri != r)
            n1 = tl.sum(tl.where(ri == r, n, 0), axis=0)
            row = (pid * ROWS + r).to(tl.int64)
            s1 = tl.load(s_ptr + row * num_tiles + idx2, mask=idx2 < n1, other=float("-inf"))
            _lanes_full_row(_lane_keys(s1), idx2, n1, fb, fe, W, C, out_ptr + row * W, G1)


ROWS_CONFIGS = {
    "surv8": dict(ROWS=8, num_warps=1, SLOTS=16),
    "surv16": dict(ROWS=16, num_warps=2, SLOTS=16),
    "surv32": dict(ROWS=32, num_warps=4, SLOTS=16),
    "rows8": dict(ROWS=8, num_warps=1, SLOTS=0),
    "rows32": dict(ROWS=32, num_warps=4, SLOTS=0),
}
"""Named configurations of :func:`topk_rows_launch` (8 rows per warp: 4 threads per row):
``surv*`` select among up to ``SLOTS`` survivors per thread, ``rows*`` (``SLOTS`` 0)
bisect all 64 blocks of a thread."""

ROWS_MAX_TILES = 256
"""Longest row (tiles) of the rows kernel; longer rows take the other methods."""


def topk_rows_supported(num_tiles: int, width: int) -> bool:
    return 0 < num_tiles <= ROWS_MAX_TILES and width <= 32


def topk_rows_launch(max_score, output, query_positions, num_valid_pages: int, fb: int, fe: int,
                     config: str = "surv8", slack: int = 2) -> None:
    """Launches :func:`_topk_rows_kernel` on validated tensors (``num_tiles <= 256``, W <= 32)."""
    total_q, H, T = max_score.shape
    W = output.shape[2]
    cfg = ROWS_CONFIGS[config]
    rows = cfg["ROWS"]
    if INTERPRET:
        rows = min(rows, 8)
    n_rows = total_q * H
    nc = max(triton.next_power_of_2(max(T, 1)), 32) // 16
    qpos = query_positions if query_positions is not None else _dummy_positions(max_score.device)
    _topk_rows_kernel[(triton.cdiv(n_rows, rows),)](
        max_score, output, qpos,
        n_rows, T, num_valid_pages, H, fb, fe, W,
        ROWS=rows, NC=nc, W_P2=64, SLACK=slack, G1=max(16, triton.next_power_of_2(max(W - fb - fe, 1))),
        SLOTS=cfg["SLOTS"],
        HAS_QPOS=query_positions is not None, FULL=nc * 16 == T,
        ALL_FULL=nc * 16 == T and query_positions is None and num_valid_pages >= T,
        num_warps=cfg["num_warps"] if not INTERPRET else 1,
    )
