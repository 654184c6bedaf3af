"""The fast ``lanes`` top-k selection (:func:`mate.ops.msa.topk._topk_lanes_fast_kernel`)
with NW one-row warps per program, in Gluon (the GPU only; the interpreter keeps the
one-row Triton kernel).

A one-warp program per row caps an SM at 32 resident warps (32 blocks per SM): half the
warp slots stay empty. Here a program of NW warps selects NW rows, warp ``w`` the row
``NW * pid + w``, with the one-row kernel's algorithm and instruction count per row. The
warps never talk to each other: every per-row tensor has a layout whose warps hold copies
(``size_per_thread`` covers the row, warps along a dimension of extent 1 in the tile), so
the compiler sees replicated data and keeps every reduction inside a warp, while each
warp actually loads its own row through a warp-dependent row index (``%tid.x / 32`` from
inline PTX). Scalars therefore differ between warps, which only steers each warp's own
branches (no shared memory, no barrier). Stores would be issued by warp 0 only on a
replicated layout, so each store goes through a [NW, ...] layout with one warp per
leading index, where warp ``w`` holds (and writes) its own row's values.

Selection (per row, on the warp's row): the bound is the W-th largest of the 32 lane
maxima, sorted across the lanes by a bitonic shuffle network (the one-row kernel's
bisection at slack 0); the blocks at or above it (~22.7 on randn rows of 256) are compacted
into lanes and the exact threshold is the C-th largest of these survivors, sorted the same
way; NaN rows and rows with more than 32 survivors (~0.3%) take a full-row bisection that
reloads the row (an L1 / L2 hit), so the scores die after the ballots. sm_90 at 32
registers: ~301 SASS instructions per row on the common path, no loop, 6 REDUX, no spills,
against ~373 with the two bisection loops (~4.6 and ~5.1 steps, 17 REDUX).

Status (H200): the default of the ``lanes`` method (4 warps, capped at 32 registers: 64
resident warps per SM), whole rows masked by value: each warp loads its whole row together
with the query position and sets blocks past the row's end to -inf by value (one bound per
register), the length made warp-uniform by a lane max, so the row's loads do not wait for
the position and ptxas sees no divergent branch (sm_90 at 32 registers: no spills, no
``BRA.DIV``). 32768 x 4 x 256 rows, top 16 + 1 forced (copy 4,267 GB/s, timed interleaved):
56.0 us (56.1% of copy), causal 63.3 (49.7%), scores in the L2 11.0 us, against 61.3 (51.3%)
/ 73.5 (42.8%) / 12.6 with the bisections of the bound and the exact step (with the
reloading fallback: both bisected 66.1 / 80.1, only the bound sorted 60.4 / 68.2, only the
survivors sorted 61.5 / 74.3; 8 warps 56.1 / 63.6; one-warp programs 82.6 in an earlier
run); all exact on 200 random GPU cases with ties. Numbers per variant:
:data:`mate.ops.msa.topk.LANES_WARPS` and the module docstring of :mod:`mate.ops.msa.topk`,
which records the removed variant loading each row after its query position (62.3 us, causal 84.5).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# layout-free element-wise and reduction helpers of the one-row kernel, shared as they are
from mate.ops.msa.topk import (
    _below_lane,
    _float_of_key,
    _lane_keys,
    _lane_survivors,
    _lanes_choose,
    _max_nan,
    _popc,
)


@gluon.jit
def _warp_id(x):
    """This thread's warp in the program (``x``: any int32 scalar, unused)."""
    return gl.inline_asm_elementwise("{ mov.u32 $0, %tid.x; shr.u32 $0, $0, 5; }", "=r,r", [x],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _ballot(p):
    """Per element: the bit mask of the lanes of its register whose ``p`` (int32) is nonzero."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred q; setp.ne.u32 q, $1, 0; vote.sync.ballot.b32 $0, q, -1; }", "=r,r",
        [p.to(gl.int32)], dtype=gl.uint32, is_pure=False, pack=1)


@gluon.jit
def _ballot_ge_f(s, t):
    return gl.inline_asm_elementwise(
        "{ .reg .pred q; setp.ge.f32 q, $1, $2; vote.sync.ballot.b32 $0, q, -1; }", "=r,f,f",
        [s, gl.zeros_like(s) + t], dtype=gl.uint32, is_pure=False, pack=1)


@gluon.jit
def _shfl_xor(x, mask: gl.constexpr):
    """Per lane: ``x`` (uint32 [32]) of lane ``lane ^ mask``."""
    return gl.inline_asm_elementwise(
        "shfl.sync.bfly.b32 $0, $1, $2, 31, -1;", "=r,r,r",
        [x.to(gl.int32, bitcast=True), gl.full(x.shape, mask, gl.int32, x.type.layout)],
        dtype=gl.int32, is_pure=False, pack=1).to(gl.uint32, bitcast=True)


@gluon.jit
def _sort_desc(k):
    """The 32 uint32 keys ``k`` (one per lane) sorted in descending order across the lanes
    (lane 0 the largest): a bitonic network whose comparators all point one way (each
    merge starts by comparing mirrored lanes), 15 steps of a butterfly shuffle and a
    min / max chosen by one lane bit."""
    lane = gl.arange(0, 32, layout=k.type.layout)
    for kk in gl.static_range(5):
        p = _shfl_xor(k, (2 << kk) - 1)
        k = gl.where((lane & (1 << kk)) == 0, gl.maximum(k, p), gl.minimum(k, p))
        for i in gl.static_range(kk):
            p = _shfl_xor(k, 1 << (kk - 1 - i))
            k = gl.where((lane & (1 << (kk - 1 - i))) == 0, gl.maximum(k, p), gl.minimum(k, p))
    return k


@gluon.jit
def _store_lanes(o_row, offs, vals, mask, NW: gl.constexpr):
    """``o_row[offs] = vals`` where ``mask`` for [32] lane tensors, by every warp for its own row."""
    LS: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
    L1: gl.constexpr = gl.SliceLayout(0, LS)
    z = gl.zeros([NW, 32], gl.int32, LS)
    o2 = gl.expand_dims(gl.convert_layout(offs, L1), 0) + z
    v2 = gl.expand_dims(gl.convert_layout(vals, L1), 0) + z
    m2 = gl.expand_dims(gl.convert_layout(mask.to(gl.int32), L1), 0) + z
    gl.store(o_row + o2, v2, mask=m2 != 0)


@gluon.jit
def _store_row(o_row, offs, vals, mask, NW: gl.constexpr):
    """:func:`_store_lanes` for [R, 32] tensors."""
    R: gl.constexpr = offs.shape[0]
    L3: gl.constexpr = gl.BlockedLayout([1, R, 1], [1, 1, 32], [NW, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(0, L3)
    z = gl.zeros([NW, R, 32], gl.int32, L3)
    o3 = gl.expand_dims(gl.convert_layout(offs, L2), 0) + z
    v3 = gl.expand_dims(gl.convert_layout(vals, L2), 0) + z
    m3 = gl.expand_dims(gl.convert_layout(mask.to(gl.int32), L2), 0) + z
    gl.store(o_row + o3, v3, mask=m3 != 0)


@gluon.jit
def _prefix_ballot(x, jj, lane):
    """Inclusive prefix sum in block order (block ``32 j + l``) of the 0/1 int32 [R, 32] ``x``."""
    mask = _ballot(x)
    cnt = _popc(mask)
    off = gl.associative_scan(cnt, 0, _add) - cnt
    return off + _below_lane(mask, gl.expand_dims(lane, 0) + gl.zeros_like(x)) + x


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _sum2(x):
    return gl.sum(gl.sum(x, axis=0), axis=0)


@gluon.jit
def _lanes_finish(kl, cand, src, C, fb, fe, n1, W, o_row, NW: gl.constexpr):
    lane = gl.arange(0, 32, layout=kl.type.layout)
    # the C-th largest key of the sorted survivors (C > 0: at least C candidates, keys > 0)
    tau = gl.max(gl.where(lane == C - 1, _sort_desc(kl), 0), axis=0)
    clo = gl.sum((kl >= tau).to(gl.int32), axis=0)
    chosen, slot = _lanes_choose(kl, cand, tau, clo, C, fb, lane)
    end = lane - fb
    first = lane < fb
    # the chosen candidates, then the forced blocks: 0 .. fb-1 first, n-fe .. n-1 last (disjoint slots)
    _store_lanes(o_row, slot, src, chosen, NW)
    _store_lanes(o_row, gl.where(first, lane, W - fe + end), gl.where(first, lane, n1 - fe + end),
                 lane < fb + fe, NW)


@gluon.jit
def _lanes_full_row(u, jj, ll, n1, fb, fe, W, C, o_row, NW: gl.constexpr):
    """The full-row fallback (NaN or more than 32 survivors): bisection on the row's keys
    ``u`` ([R, 32]) with the forced blocks lifted to the top, from the smallest lane max of
    the candidates (32 keys at or above it, so at least W), ties and slots by ballot prefixes."""
    idx = jj * 32 + ll
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, u.type.layout))
    forced = ((idx - (n1 - fe)).to(gl.uint32) < fe.to(gl.uint32)) | (idx < fb)
    uf = gl.where(forced, 0xFFFFFFFF, u)
    u_lo = gl.where(forced, 0, u)
    lm = gl.max(u_lo, axis=0)
    lo = gl.min(lm, axis=0)
    hm = gl.max(lm, axis=0)
    if C == 0:
        lo = 0xFFFFFFFF
        hm = 0xFFFFFFFF
    clo = _sum2((uf >= lo).to(gl.int32))
    while (clo != W) & (lo != hm):
        mid = lo + ((hm - lo) >> 1) + 1
        c = _sum2((uf >= mid).to(gl.int32))
        if c >= W:
            lo = mid
            clo = c
        else:
            hm = mid - 1
    if clo > W:
        eqf = uf == lo
        take_f = W - clo + _sum2(eqf.to(gl.int32))
        rank_f = _prefix_ballot(eqf.to(gl.int32), jj, lane) - 1
        sel_f = (uf > lo) | (eqf & (rank_f < take_f))
    else:
        sel_f = uf >= lo
    slot_f = _prefix_ballot(sel_f.to(gl.int32), jj, lane) - 1
    _store_row(o_row, slot_f, idx, sel_f, NW)


@gluon.jit
def _lanes_warps_select(s, s_row, o_row, n1, fb, fe, W, NW: gl.constexpr):
    """:func:`mate.ops.msa.topk._lanes_fast_row` of one row (``n1 > W``) on this warp, on its
    scores ``s`` ([R, 32], blocks ``>= n1`` -inf): the bound ``tau0`` is the W-th largest lane max (the lane maxima sorted: the
    one-row kernel's bisection at slack 0), the exact threshold the C-th largest survivor
    (the survivors sorted), and the full-row fallback reloads the row (an L1 / L2 hit), so
    the scores die after the ballots."""
    L2: gl.constexpr = s.type.layout
    LL: gl.constexpr = gl.SliceLayout(0, L2)
    R: gl.constexpr = s.shape[0]
    jj = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(1, L2)), 1)
    ll = gl.expand_dims(gl.arange(0, 32, layout=LL), 0)
    lane = gl.arange(0, 32, layout=LL)
    C = W - fb - fe
    m = _lane_keys(gl.reduce(s, 0, _max_nan))
    m_hi = gl.max(m, axis=0)
    if m_hi <= 0xFF800000:
        tau0 = gl.max(gl.where(lane == W - 1, _sort_desc(m), 0), axis=0)
        ball = _ballot_ge_f(s, _float_of_key(tau0))
        S, src = _lane_survivors(ball, jj, lane, R)
        S1 = gl.max(S, axis=0)
        if S1 <= 32:
            cand = (lane < S) & (src >= fb) & (src < n1 - fe)
            kl = gl.where(cand, _lane_keys(gl.load(s_row + src, mask=cand, other=0.0)), 0)
            _lanes_finish(kl, cand, src, C, fb, fe, n1, W, o_row, NW)
        else:
            s2 = gl.load((s_row + ll) + jj * 32, mask=jj * 32 + ll < n1, other=float("-inf"))
            _lanes_full_row(_lane_keys(s2), jj, ll, n1, fb, fe, W, C, o_row, NW)
    else:
        _lanes_full_row(_lane_keys(s), jj, ll, n1, fb, fe, W, C, o_row, NW)


@gluon.jit
def _lanes_load_row(s_ptr, qpos_ptr, row, num_tiles, H, jj, ll, HAS_QPOS: gl.constexpr, FULL: gl.constexpr):
    """The scores of row ``row`` ([R, 32], every tile of the row) and its query position (0
    without), loaded together: the row's loads do not wait for the position."""
    ptrs = (s_ptr + row.to(gl.int64) * num_tiles + ll) + jj * 32
    if FULL:
        s = gl.load(ptrs)
    else:
        s = gl.load(ptrs, mask=jj * 32 + ll < num_tiles, other=float("-inf"))
    if HAS_QPOS:
        pos = gl.load(qpos_ptr + row // H)
    else:
        pos = gl.to_tensor(0).to(gl.int64)
    return s, pos


@gluon.jit
def _lanes_warps_masked_row(s, pos, row, s_ptr, out_ptr, num_tiles, num_valid_pages, fb, fe, W,
                            NW: gl.constexpr, HAS_QPOS: gl.constexpr):
    """Row ``row`` from the scores of :func:`_lanes_load_row`: blocks ``>= n`` set to -inf by
    value (``n`` made warp-uniform by a lane max, so no branch diverges; one bound per
    register, not an index per block), then :func:`_lanes_warps_select`."""
    LL: gl.constexpr = gl.SliceLayout(0, s.type.layout)
    n1 = num_valid_pages
    if HAS_QPOS:
        n1 = gl.where(pos < 0, 0, gl.minimum(pos // 128 + 1, num_valid_pages)).to(gl.int32)
        n1 = gl.max(gl.zeros([32], gl.int32, LL) + n1, axis=0)
    o_row = out_ptr + row.to(gl.int64) * W
    if n1 > W:
        if n1 < s.shape[0] * 32:
            # per register j: lane < n - 32 j
            jj = gl.expand_dims(gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s.type.layout)), 1)
            s = gl.where(gl.expand_dims(gl.arange(0, 32, layout=LL), 0) < n1 - jj * 32, s, float("-inf"))
        _lanes_warps_select(s, s_ptr + row.to(gl.int64) * num_tiles, o_row, n1, fb, fe, W, NW)
    else:
        wc = gl.arange(0, 32, layout=LL)
        _store_lanes(o_row, wc, gl.where(wc < n1, wc, -1), wc < W, NW)


@gluon.jit(do_not_specialize=["n_rows", "num_tiles", "num_valid_pages", "H", "fb", "fe", "W"])
def _topk_lanes_warps_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, W,
    R: gl.constexpr, NW: gl.constexpr, HAS_QPOS: gl.constexpr, FULL: gl.constexpr,
):
    """Rows ``NW * pid + w`` (w: the warp) of the fast ``lanes`` selection (``W <= 32``):
    each row loaded whole together with its query position, blocks past ``n`` masked by
    value (a warp past the last row repeats it: same output, written twice, and no
    divergent branch)."""
    L2: gl.constexpr = gl.BlockedLayout([R, 1], [1, 32], [NW, 1], [1, 0])
    jj = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(1, L2)), 1)
    ll = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, L2)), 0)
    row = gl.minimum(gl.program_id(0) * NW + _warp_id(gl.program_id(0)), n_rows - 1)
    s, pos = _lanes_load_row(s_ptr, qpos_ptr, row, num_tiles, H, jj, ll, HAS_QPOS, FULL)
    _lanes_warps_masked_row(s, pos, row, s_ptr, out_ptr, num_tiles, num_valid_pages, fb, fe, W, NW, HAS_QPOS)
