"""Experimental Gluon kernel of the MSA top-k selection for Hopper: several rows per warp.

Selected with ``method="gluon"`` in :func:`mate.ops.msa.topk.sparse_topk_select_triton`
(or ``MATE_MSA_TOPK_METHOD=gluon``); rows longer than :data:`GLUON_MAX_CHUNK` tiles take the
``interval`` kernel. Gluon cannot run under the interpreter: the GPU tests check it.

Same algorithm as ``_topk_interval_kernel`` (unsigned order-preserving keys, forced blocks
0xFFFFFFFF, invalid blocks 0, bisection of a key interval from a group-max lower bound, ties
to the lower index, ascending output, identity rows padded with -1), with an explicit layout
of the keys as ``[R, TPR, S1, S2]``: ``RPW = 32 / TPR`` rows per warp, ``TPR`` threads per
row, each thread holding ``S1 * S2`` consecutive keys (``idx = t * S1 * S2 + s1 * S2 + s2``).
A row count is then in-thread adds and ``log2(TPR)`` shuffle rounds shared by ``RPW`` rows,
and prefix sums (tie ranks, output slots) are in-thread scans plus one lane scan per row.
The ``TPR * S1 >= topk`` groups ``(t, s1)`` give the lower bound. With ``COALESCE`` the scores
are loaded in a layout where consecutive lanes read consecutive 16-byte pieces of a row and
moved to the key layout through shared memory.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["sparse_topk_select_gluon", "gluon_topk_config", "GLUON_MAX_CHUNK"]

GLUON_MAX_CHUNK = 1024
"""Longest row (tiles, rounded up to a power of two) the Gluon kernel takes."""


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _b4(x):
    """A per-row vector [R] back to the key layout [R, 1, 1, 1]."""
    return gl.expand_dims(gl.expand_dims(gl.expand_dims(x, 1), 2), 3)


@gluon.jit
def _row_sum(x):
    return gl.sum(gl.sum(gl.sum(x, axis=3), axis=2), axis=1)


@gluon.jit
def _prefix(x):
    """Inclusive prefix sum of int32 [R, TPR, S1, S2] along each row in index order."""
    TPR: gl.constexpr = x.shape[1]
    S1: gl.constexpr = x.shape[2]
    NW: gl.constexpr = gl.num_warps()
    # scans need blocked layouts: the row sums' slice layouts hold the same elements per thread
    B3: gl.constexpr = gl.BlockedLayout([1, 1, S1], [32 // TPR, TPR, 1], [NW, 1, 1], [2, 1, 0])
    B2: gl.constexpr = gl.BlockedLayout([1, 1], [32 // TPR, TPR], [NW, 1], [1, 0])
    c3 = gl.associative_scan(x, 3, _add)
    t3 = gl.sum(x, axis=3)
    t3b = gl.convert_layout(t3, B3)
    c2 = gl.convert_layout(gl.associative_scan(t3b, 2, _add), t3.type.layout)
    t2 = gl.sum(t3, axis=2)
    t2b = gl.convert_layout(t2, B2)
    c1 = gl.convert_layout(gl.associative_scan(t2b, 1, _add), t2.type.layout)
    return c3 + gl.expand_dims(c2 - t3, 3) + gl.expand_dims(gl.expand_dims(c1 - t2, 2), 3)


@gluon.jit
def _index(R: gl.constexpr, TPR: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, L: gl.constexpr):
    """Row ids [R] (per-row layout) and in-row block ids [1, TPR, S1, S2] of layout L."""
    r = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L))))
    t = gl.arange(0, TPR, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L))))
    a = gl.arange(0, S1, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L))))
    b = gl.arange(0, S2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L))))
    t4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(t, 0), 2), 3)
    a4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(a, 0), 1), 3)
    b4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(b, 0), 1), 2)
    return r, t4 * (S1 * S2) + a4 * S2 + b4


@gluon.jit
def _split_index(TPR: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, L: gl.constexpr):
    """Block ids of layout L as a thread's base [1, TPR, 1, 1] and register offsets
    [1, 1, S1, S2] (constants: compares against them take immediates)."""
    t = gl.arange(0, TPR, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L))))
    a = gl.arange(0, S1, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L))))
    b = gl.arange(0, S2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L))))
    t4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(t, 0), 2), 3)
    a4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(a, 0), 1), 3)
    b4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(b, 0), 1), 2)
    return t4 * (S1 * S2), a4 * S2 + b4


@gluon.jit(do_not_specialize=["n_rows", "num_valid_pages", "H", "fb", "fe", "W", "has_qpos"])
def _topk_gluon_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, W, has_qpos,
    TPR: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, LOWER_BOUND: gl.constexpr,
    COALESCE: gl.constexpr, A1: gl.constexpr, A2: gl.constexpr, A3: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    RPW: gl.constexpr = 32 // TPR
    R: gl.constexpr = RPW * NW
    L: gl.constexpr = gl.BlockedLayout([1, 1, S1, S2], [RPW, TPR, 1, 1], [NW, 1, 1, 1], [3, 2, 1, 0])
    r, idx = _index(R, TPR, S1, S2, L)
    rows = gl.program_id(0) * R + r
    row_ok = rows < n_rows
    n = gl.zeros_like(rows) + num_valid_pages
    if has_qpos != 0:
        pos = gl.load(qpos_ptr + rows // H, mask=row_ok, other=0)
        n = gl.where(pos < 0, 0, gl.minimum(pos // 128 + 1, num_valid_pages)).to(gl.int32)
    n = gl.where(row_ok, n, 0)
    long = n > W
    n4 = _b4(n)
    long4 = _b4(long)
    o_row = out_ptr + _b4(rows.to(gl.int64) * W)
    if gl.max(long.to(gl.int32), axis=0) > 0:
        s_off = _b4(rows.to(gl.int64) * num_tiles) + idx
        if COALESCE:
            LD: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [32 // (A1 * A2 * A3), A1, A2, A3], [NW, 1, 1, 1],
                                                [3, 2, 1, 0])
            rl, il = _index(R, TPR, S1, S2, LD)
            rows_l = gl.program_id(0) * R + rl
            n_l = gl.convert_layout(n, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LD))))
            nl4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(n_l, 1), 2), 3)
            rl4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(rows_l.to(gl.int64) * num_tiles, 1), 2), 3)
            nl4 = ((nl4 + 15) >> 4) << 4  # a multiple of 16: 16-byte loads
            s = gl.load(s_ptr + (rl4 + il), mask=(nl4 > W) & (il < nl4) & (il < num_tiles), other=0.0)
            s = gl.convert_layout(s, L)
        else:
            nr4 = ((n4 + 15) >> 4) << 4  # a multiple of 16: 16-byte loads
            s = gl.load(s_ptr + s_off, mask=long4 & (idx < nr4) & (idx < num_tiles), other=0.0)
        tb, kk = _split_index(TPR, S1, S2, L)
        valid = kk < n4 - tb
        cand = (kk >= fb - tb) & (kk < _b4(gl.maximum(n - fe, fb)) - tb)
        bits = (s + 0.0).to(gl.int32, bitcast=True)  # -0.0 -> +0.0
        u = (bits ^ ((bits >> 31) | -2147483648)).to(gl.uint32, bitcast=True)
        u = gl.where(s != s, 0xFFC00000, u)
        u = gl.where(cand, u, gl.where(valid, 0xFFFFFFFF, 0))
        u_lo = gl.where(cand, u, 0)
        hm = gl.max(gl.max(gl.max(u_lo, axis=3), axis=2), axis=1)
        if LOWER_BOUND:
            lo = gl.min(gl.min(gl.max(u_lo, axis=3), axis=2), axis=1)
        else:
            lo = gl.zeros_like(hm)
        if fb + fe >= W:  # counted forced blocks fill the top-k
            lo = gl.zeros_like(lo) + 0xFFFFFFFF
            hm = lo
        clo = _row_sum((u >= _b4(lo)).to(gl.int32))
        pend = long & (clo != W) & (lo != hm)
        while gl.max(pend.to(gl.int32), axis=0) > 0:
            mid = lo + ((hm - lo) >> 1) + 1  # lo < mid <= hm where pending
            c = _row_sum((u >= _b4(mid)).to(gl.int32))
            take = pend & (c >= W)
            lo = gl.where(take, mid, lo)
            clo = gl.where(take, c, clo)
            hm = gl.where(pend & (c < W), mid - 1, hm)
            pend = long & (clo != W) & (lo != hm)
        lo4 = _b4(lo)
        if gl.max((long & (clo > W)).to(gl.int32), axis=0) > 0:
            # a tie straddles the W-th place (lo is that key): the first ties in index order
            eq = (u == lo4).to(gl.int32)
            take_ties = W - clo + _row_sum(eq)
            chosen = (u > lo4) | ((eq != 0) & (_prefix(eq) <= _b4(take_ties)))
        else:
            chosen = u >= lo4
        chosen = chosen & long4
        gl.store(o_row + (_prefix(chosen.to(gl.int32)) - 1), idx, mask=chosen)
    short = row_ok & ~long
    if gl.max(short.to(gl.int32), axis=0) > 0:
        # identity rows: id i at slot i, -1 in slots n .. W - 1
        gl.store(o_row + idx, gl.where(idx < n4, idx, -1), mask=(idx < W) & _b4(short))


def gluon_topk_config(num_tiles: int, topk: int, W: int, rows_per_warp: int | None = None,
                      coalesce: bool = False) -> dict | None:
    """Layout of a row of ``num_tiles`` (None when the kernel does not take it): ``TPR``
    threads per row (``32 // rows_per_warp``; default 4 at <= 256 tiles, 16 beyond), the
    ``S1`` groups per thread (``TPR * S1 >= topk`` when possible) and the load layout."""
    chunk = max(triton.next_power_of_2(max(num_tiles, 1)), triton.next_power_of_2(max(W, 1)), 64)
    if chunk > GLUON_MAX_CHUNK:
        return None
    rpw = rows_per_warp or (8 if chunk <= 256 else 2)
    tpr = 32 // rpw
    kpt = chunk // tpr
    if kpt < 4 or kpt > 64:  # more keys per thread spill (255 registers at 64)
        return None
    g = max(16, triton.next_power_of_2(topk))
    s1 = max(1, min(g // tpr, kpt // 4))
    s2 = kpt // s1
    a3 = min(32, s2 // 4)
    a2 = min(32 // a3, s1)
    a1 = min(32 // (a3 * a2), tpr)
    return dict(TPR=tpr, S1=s1, S2=s2, LOWER_BOUND=tpr * s1 >= topk, COALESCE=coalesce, A1=a1, A2=a2, A3=a3)


def sparse_topk_select_gluon(max_score: torch.Tensor, output: torch.Tensor, query_positions: torch.Tensor,
                             has_qpos: bool, num_valid_pages: int, topk: int, force_begin_blocks: int,
                             force_end_blocks: int, num_warps: int = 4, rows_per_warp: int | None = None,
                             coalesce: bool = False) -> bool:
    """Launches the Gluon kernel (``query_positions`` read only when ``has_qpos``); False
    (nothing launched) when it does not take rows of this length."""
    total_q, H, T = max_score.shape
    W = output.shape[2]
    cfg = gluon_topk_config(T, topk, W, rows_per_warp, coalesce)
    if cfg is None:
        return False
    n_rows = total_q * H
    rows_per_cta = (32 // cfg["TPR"]) * num_warps
    if n_rows:
        _topk_gluon_kernel[(triton.cdiv(n_rows, rows_per_cta),)](
            max_score, output, query_positions, n_rows, T, num_valid_pages, H, force_begin_blocks, force_end_blocks,
            W, int(has_qpos), **cfg, num_warps=num_warps,
        )
    return True
