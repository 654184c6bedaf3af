"""MSA top-k block selection in Triton (exact; ties to the lower block index).

Scores become order-preserving int32 keys (NaN -> one key above +inf, -0.0 -> 0.0),
forced blocks counted in the top-k get the largest key and everything that may not be
chosen by score (blocks >= n, forced blocks appended outside the top-k) the smallest.
Selection then runs in two steps per row:

1. **threshold**: the K-th largest key ``tau`` (with multiplicity), either by a bitwise
   binary search over the keys held in registers (``radix``: one compare + row sum per
   bit, early exit) or by a bitonic top-K of the
   int32 keys (``tl.topk``). Short rows (``max_k_tiles <= CHUNK``) do it once on
   registers; long rows (up to 12,287 tiles and more) scan ``CHUNK``-wide pieces and merge
   each piece's top-K into a running top-K (a tournament), so registers stay bounded.
2. **compaction**: a block is chosen when its key is ``> tau``, or ``== tau`` and it is
   among the first ``K - #(> tau)`` such ties in index order (a prefix sum). Forced blocks
   are added, and the chosen ids are written in ascending order by a second prefix sum
   (their output slot), which makes the output sorted without a sort. Slots left over
   are -1. Rows with ``n <= W`` take every valid block (the identity fast path; a block
   of rows where all are short skips step 1 entirely).

``lanes`` (the default for rows of up to 256 tiles and W <= 32; :func:`_topk_lanes_kernel`,
"classic", and :func:`_topk_lanes_fast_kernel`, "fast", the default :data:`LANES_KERNEL`)
cuts the per-row work of one-warp programs: a lower bound from the W-th largest of the
32 lanes' maxima leaves ~22 survivors of 256 (a few more with the default ``lanes_slack``
= 2, which stops that bound search early), which are compacted into one key per lane, so the exact bisection, the
ties and the output slots run on 32 keys (ballots) instead of 256; forced blocks take the
first and last output slots directly. sm_90 SASS at 256 tiles: ~460 instructions per row
on the common path (~365 for the fast kernel) against ~590 for ``interval``; 55 registers. Simulated on randn rows of
256 (top-16 + 1 end block): the lane-max bisection takes ~4.6 steps at slack 2 (6.8 at
slack 0), ~25 blocks survive, 3.2% of rows exceed 32 survivors (the full-row fallback; 0.5%
at slack 0), the exact bisection on the survivors ~5.1 steps.

``interval`` (:func:`_topk_interval_kernel`: the other rows of up to 16,384 tiles held in
registers, one warp per 1,024 tiles, two at 1,024) gives every forced block the largest
key, so a long row's output is exactly its W largest keys, finds that W-th largest key by
bisecting a key interval that starts at a cheap group-max lower bound (~6 steps against
13-15 for the bitwise search), and takes prefix sums by warp ballots.

H200 figures: :data:`TOPK_METHOD`. Tried and removed (H200, 2026-11-29): the interval
algorithm in Gluon with several rows per warp was no faster (111.9 us at best against 112.9
at 32768 x 4 x 256), and the one-row interval programs as a persistent loop over rows (next
row prefetched) were slower (128.9-276.7 us). ``lanes`` with P consecutive rows per one-warp
program, the next row (or two) loaded while one is selected (32768 x 4 x 256, copy 4,178
GB/s, all exact): P = 4 / 8 / 16 / 32 92.3 / 92.2 / 96.8 / 103.5 us, 16 / 32 two ahead 105.2
/ 117.7, against one row 87.1 (36.9% of copy) and interval 113.4 (28.3%); causal 96.0 / 95.4
/ 100.5 / 112.4, 109.4 / 123.5 against 93.1 and 121.3 (all with the classic selection).
Floors (loads, no selection): 81.5 us
on the (token, head) grid (39.4%), 81.9 one row per looping program, 40.9 at P = 4 (78.6%),
39.4 / 39.9 / 40.3 at 16 / 32 / 32 two ahead, 37.2 / 37.4 with 4 / 8 warps of a row each
(86.3%). Scores in the L2 (4096 tokens): interval 20.0 us, lanes 16.7, P = 4 / 8 19.9 / 21.3,
floors 15.0 (grid) / 15.6 (one row) / 10.4 (P = 4). More rows per program lift the memory
floor from ~39% to ~80% of copy, but the classic selection (~460 instructions per row) is
the bound. The fast kernel (~365) sits on the one-row floor (83.8 us against 82.0, below);
also tried and removed, the fast kernel on P consecutive rows per one-warp program (next row
prefetched, registers capped at 64; copy 4,179 GB/s, all exact) gained at most 5% and lost
10-18% causal: P = 2 / 4 / 8 / 16 83.2 / 79.7 (40.3% of copy; 81.9 uncapped) / 80.2 / 84.8 us
against one row 83.8 (38.3%) and classic 87.0, floor at P = 4 41.5; causal 103.6 / 97.3
(98.6) / 96.5 / 101.2 against 87.8 and 93.6.

Also tried and removed (H200, 2026-11-29), a rows-on-threads kernel: 4 threads per row, 8
rows per warp, the bound from the row's 64 group maxima, blocks at or above it compacted
into 16 slots per thread (``surv``; more survivors: the lanes full-row path), the exact
step an fp32 bisection on the slots (~260-285 estimated warp-instructions per row against
~365 for the fast kernel). Slower on plain rows and 2x slower on causal ones, where the
rows of a warp differ in length; its compute cost is higher in the L2 too. 32768 x 4 x 256
(copy 4,266 GB/s, all exact, 300 random cases exact): fast lanes 82.7 us (38.0% of copy),
surv 1 warp 90.9 (34.6%), surv 4 warps 125.5, the exact step on all 64 blocks of a thread
224.6; floors 81.1 (one row per one-warp program) / 41.1 (4 rows); causal 86.1 against
166.9 / 365.0 / 302.5. Scores in the L2 (4096 tokens): 14.3 against 18.5 / 22.6 / 33.8,
floors 13.2 / 8.4.

Also tried and removed (H200, 2026-11-30), rows per warp in the 4-warp kernel (``RPW``: P
rows per one-row warp, the next row's loads issued before this row's selection, whole rows
masked by value; sm_90 spills 40 / 18 / 2 STL+LDL at 32 / 40 / 48 registers, 72 uncapped):
32768 x 4 x 256 (copy 4,265 GB/s, all exact on 200 random cases) P = 2 at 32 / 40 / 48
registers 99.0 / 78.7 / 73.6 us, P = 4 at 40 77.4, 8 warps P = 2 at 40 79.0, against one row
per warp 61.6 (whole rows masked by value); causal 103.9 / 88.7 / 85.5, 87.4, 89.2 against 73.6.
The registers the second row needs cost more resident warps (or spills) than the overlap gains.

Also tried and removed (H200, 2026-11-29), the bisections of the 4-warp kernel's selection
(:mod:`mate.ops.msa.topk_warps`, which now sorts the 32 lane maxima for the bound and the
survivors for the exact step by a bitonic shuffle network, and whose full-row fallback
reloads its row; sm_90 at 32 registers ~301 SASS instructions per row on the common path, no
loop, 6 REDUX, against ~373 and 17 REDUX with the bisection loops; no spills either way).
32768 x 4 x 256, top 16 + 1 forced (copy 4,267 GB/s, timed interleaved, all exact on 200
random GPU cases): both bisected 61.3 us (51.3% of copy), causal 73.5 (42.8%), scores in the
L2 12.6; both bisected with the reloading fallback 66.1 / 80.1; only the bound sorted 60.4 /
68.2, only the survivors sorted 61.5 / 74.3 (both with the reload); against both sorted 56.0
(56.1%) / 63.3 (49.7%) / L2 11.0, and 8 warps both sorted 56.1 / 63.6.

Also tried and removed (H200, 2026-11-29), rows loaded after their query position in the
4-warp kernel (``MASKV=False``: each warp's valid blocks loaded once its position is known,
rows past the end skipped by a branch) instead of whole rows masked by value. 32768 x 4 x
256, top 16 + 1 forced, 4 warps at 32 registers (copy 4,265 GB/s, timed interleaved, exact on
200 random cases each, with the bisections): 62.3 us (50.5% of copy), causal 84.5 (37.2%),
against 61.6 (51.1%) / 73.6 (42.8%) masked by value: the loads wait for the position, and the
per-warp row length costs ptxas its divergence checks (sm_90: 1,544 SASS instructions, 14
spills, against 1,168 and none; with the sorted selection and query positions 6 spills and 59
``BRA.DIV`` at 32 registers, never run on the GPU). Streaming floor with 4 rows per program: 41.3 us.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from mate._core.env import ENV_VARS
from mate._core.launch import launcher
from mate._core.triton_helpers import INTERPRET, cdiv, next_power_of_2

__all__ = ["sparse_topk_select_triton", "topk_config", "_topk_select_kernel", "_topk_interval_kernel"]


@triton.jit
def _prefix_sum(x, N: tl.constexpr):
    """Inclusive prefix sum of an int32 [ROWS, N] tensor along axis 1. The interpreter runs
    ``tl.cumsum`` element by element in Python; there a triangular fp32 dot does it exactly
    (counts < 2**24)."""
    if INTERPRET:
        i = tl.arange(0, N)
        tri = (i[:, None] <= i[None, :]).to(tl.float32)
        return tl.dot(x.to(tl.float32), tri).to(tl.int32)
    else:
        return tl.cumsum(x, axis=1)


@triton.jit
def _prefix_sum_ballot(x, N: tl.constexpr):
    """:func:`_prefix_sum` of a 0/1 tensor by warp ballots on the GPU: the row viewed as
    [N / 32, 32] (register, lane) in the one-key-per-lane-per-register layout; each piece's
    bit mask is a lane sum of ``x << lane``, and a key's prefix is the popcounts of the
    earlier pieces plus that of its piece's mask below its lane."""
    if INTERPRET or N < 32:
        return _prefix_sum(x, N)
    else:
        x3 = tl.reshape(x, [x.shape[0], N // 32, 32])
        lane = tl.arange(0, 32)
        mask = tl.sum(x3 << lane[None, None, :], axis=2)
        cnt = libdevice.popc(mask)[:, :, None] + tl.zeros_like(x3)
        off = tl.cumsum(cnt, axis=1) - cnt  # along registers: no data leaves the thread
        below = libdevice.popc(mask[:, :, None] & ((1 << lane) - 1)[None, None, :])
        return tl.reshape(off + below + x3, [x.shape[0], N])


@triton.jit
def _topk_values(x, K: tl.constexpr):
    """The K largest int32 values of each row (with multiplicity), [ROWS, K]. On the GPU a
    bitonic top-K (``tl.topk``); the interpreter runs its XOR reductions element by element
    in Python, so there K rounds of max-and-remove-one give the same multiset."""
    if INTERPRET:
        idx = tl.arange(0, x.shape[1])
        cols = tl.arange(0, K)
        res = tl.full([x.shape[0], K], -2147483648, dtype=tl.int32)
        for i in tl.static_range(K):
            m = tl.max(x, axis=1)
            first = tl.min(tl.where(x == m[:, None], idx[None, :], x.shape[1]), axis=1)
            x = tl.where(idx[None, :] == first[:, None], -2147483648, x)
            res = tl.where(cols[None, :] == i, m[:, None], res)
        return res
    else:
        return tl.topk(x, K)


@triton.jit
def _radix_threshold(key, need, K: tl.constexpr, CHUNK: tl.constexpr):
    """The K-th largest int32 key of each row (with multiplicity) by a bitwise binary search,
    no sort: with ``u`` the keys mapped to unsigned order, the greedy MSB-first search keeps
    ``prefix | bit`` while at least K keys are ``>=`` it (one compare and one row sum per
    bit), so ``prefix`` ends as the largest value with ``count(u >= prefix) >= K``. The
    search stops early (checked every 4 bits) once every row needing it has exactly K keys
    ``>= prefix``: then the K-th largest is the smallest of those K keys, which is also the
    answer after all 32 bits (the K-th largest itself is a key), so one final min gives it.
    ``need`` marks the rows that need a threshold (others may stop at any time)."""
    u = (key ^ -2147483648).to(tl.uint32, bitcast=True)
    prefix = tl.zeros([key.shape[0]], dtype=tl.uint32)
    cnt = tl.zeros([key.shape[0]], dtype=tl.int32) + CHUNK
    pending = tl.max(tl.where(need & (cnt != K), 1, 0), axis=0)
    bit = 31
    while (bit >= 0) & (pending > 0):
        for _ in tl.static_range(4):
            cand = prefix | (tl.full([key.shape[0]], 1, dtype=tl.uint32) << bit.to(tl.uint32))
            c = tl.sum((u >= cand[:, None]).to(tl.int32), axis=1)
            take = c >= K
            prefix = tl.where(take, cand, prefix)
            cnt = tl.where(take, c, cnt)
            bit -= 1
        pending = tl.max(tl.where(need & (cnt != K), 1, 0), axis=0)
    tau_u = tl.min(tl.where(u >= prefix[:, None], u, 0xFFFFFFFF), axis=1)
    return tau_u.to(tl.int32, bitcast=True) ^ -2147483648


@triton.jit
def _interval_threshold(u, u_lo, all_forced, need, K, CHUNK: tl.constexpr, G: tl.constexpr):
    """A threshold ``lo`` whose keys ``u >= lo`` are the K largest of each row of ``u``
    (ties aside) by bisection of an interval of key values, and ``clo``, the number of keys
    ``>= lo``. Invariants: at least K keys are ``>= lo`` and fewer than K are ``>= hi``.
    ``lo`` starts at the smallest of G >= K group maxes (group ``g``: keys ``idx % G == g``;
    G keys are ``>=`` it) and ``hi`` one above the largest key. Each step counts the keys
    ``>= mid`` (one compare and one row sum). It stops once ``clo == K`` (exactly the K
    largest keys are ``>= lo``: no tie straddles the K-th place) or ``hi == lo + 1`` (then
    ``lo`` is the K-th largest key itself and ``clo > K`` counts the ties at it): about 6
    steps on random scores against 13-15 bits of the bitwise search, at most 32. ``need`` marks the rows that need a threshold (others may stop at any time).
    ``u_lo`` are the candidates' keys (forced blocks' keys, the largest, hidden): the bounds
    come from them, so the forced keys do not widen the interval, unless ``all_forced``
    (the forced blocks fill all K places: the answer is their key)."""
    lo = tl.min(tl.max(tl.reshape(u_lo, [u.shape[0], CHUNK // G, G]), axis=1), axis=1)
    hi = tl.max(u_lo, axis=1).to(tl.int64) + 1
    if all_forced:
        lo = tl.zeros_like(lo) + 0xFFFFFFFF
        hi = tl.zeros_like(hi) + 0x100000000
    clo = tl.sum((u >= lo[:, None]).to(tl.int32), axis=1)
    lo = lo.to(tl.int64)
    pending = tl.max(tl.where(need & (clo != K) & (hi - lo > 1), 1, 0), axis=0)
    while pending > 0:
        mid = lo + (hi - lo) // 2
        c = tl.sum((u >= mid.to(tl.uint32)[:, None]).to(tl.int32), axis=1)
        take = c >= K
        lo = tl.where(take, mid, lo)
        clo = tl.where(take, c, clo)
        hi = tl.where(take, hi, mid)
        pending = tl.max(tl.where(need & (clo != K) & (hi - lo > 1), 1, 0), axis=0)
    return lo.to(tl.uint32), clo


@triton.jit
def _interval_threshold_row(u, u_lo, all_forced, K, G: tl.constexpr):
    """:func:`_interval_threshold` of a single row (``u`` [1, CHUNK]) with scalars, so the
    loop state has no layout, and an inclusive upper end ``hm`` (uint32 throughout). The
    G >= topk groups of candidates' keys hold G keys >= ``lo``, the forced keys W - topk
    more."""
    lo = tl.min(tl.max(tl.reshape(u_lo, [u.shape[1] // G, G]), axis=0), axis=0)
    hm = tl.max(tl.max(u_lo, axis=1), axis=0)
    if all_forced:
        lo = 0xFFFFFFFF
        hm = 0xFFFFFFFF
    clo = tl.sum(tl.sum((u >= lo).to(tl.int32), axis=1), axis=0)
    while (clo != K) & (lo != hm):
        mid = lo + ((hm - lo) >> 1) + 1  # lo < mid <= hm
        c = tl.sum(tl.sum((u >= mid).to(tl.int32), axis=1), axis=0)
        if c >= K:
            lo = mid
            clo = c
        else:
            hm = mid - 1
    return lo, clo


@triton.jit
def _score_keys(s, idx, n, fb, fe, counted):
    """int32 keys whose signed order is the float order (NaN largest, -0.0 == 0.0).
    Forced blocks counted in the top-k get INT32_MAX; blocks >= n, and forced blocks
    appended outside the top-k, get INT32_MIN. Also returns the forced and valid masks."""
    idx_ok = idx[None, :] < n[:, None]
    forced = idx_ok & ((idx[None, :] < fb) | (idx[None, :] >= (n - fe)[:, None]))
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where(s != s, 0x7FC00000, key)  # every NaN: the quiet NaN's key, above +inf's 0x7F800000
    key = tl.where(forced & (counted != 0), 2147483647, key)
    key = tl.where(idx_ok & (~forced | (counted != 0)), key, -2147483648)
    return key, forced, idx_ok


@triton.jit
def _row_counts(rows, n_rows, qpos_ptr, num_valid_pages, H, has_qpos):
    """Valid block count n of each row (0 for rows past the end)."""
    row_ok = rows < n_rows
    n = tl.zeros_like(rows) + num_valid_pages
    pos = tl.load(qpos_ptr + rows // H, mask=row_ok & (has_qpos != 0), other=2147483647 * 128)
    lim = tl.where(pos < 0, 0, pos // 128 + 1)
    n = tl.minimum(n.to(tl.int64), lim).to(tl.int32)
    return tl.where(row_ok, n, 0)


@triton.jit
def _chosen(key, forced, tau, take_ties, ties_seen, ALL_TIES, N: tl.constexpr):
    """Chosen mask of one chunk: keys above tau, the first take_ties keys equal to tau
    (index order, counting ties_seen of earlier chunks), and the forced blocks."""
    eq = key == tau[:, None]
    if ALL_TIES:
        chosen = key >= tau[:, None]
    else:
        eq_rank = _prefix_sum(eq.to(tl.int32), N) - 1 + ties_seen[:, None]
        chosen = (key > tau[:, None]) | (eq & (eq_rank < take_ties[:, None]))
    return chosen | forced, tl.sum(eq.to(tl.int32), axis=1)


@triton.jit(do_not_specialize=["n_rows", "num_valid_pages", "H", "fb", "fe", "counted", "W", "has_qpos"])
def _topk_select_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, counted, W, has_qpos,
    K: tl.constexpr, W_P2: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, SINGLE: tl.constexpr,
    RADIX: tl.constexpr = False,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    n = _row_counts(rows, n_rows, qpos_ptr, num_valid_pages, H, has_qpos)
    short = n <= W  # identity rows: 0 .. n-1
    any_long = tl.max(tl.where(row_ok & (n > W), 1, 0), axis=0) > 0
    cols = tl.arange(0, CHUNK)
    s_row = s_ptr + rows.to(tl.int64)[:, None] * num_tiles
    o_row = out_ptr + rows.to(tl.int64)[:, None] * W
    base = tl.zeros([ROWS], dtype=tl.int32)
    if SINGLE:
        # the whole row in registers: one load, one top-K, one compaction
        idx = cols
        s = tl.load(s_row + idx[None, :], mask=row_ok[:, None] & (idx < num_tiles)[None, :], other=0.0)
        key, forced, idx_ok = _score_keys(s, idx, n, fb, fe, counted)
        sel = idx_ok
        if any_long:
            if RADIX:
                tau = _radix_threshold(key, row_ok & ~short, K, CHUNK)
                take_ties = K - tl.sum((key > tau[:, None]).to(tl.int32), axis=1)
            else:
                best = _topk_values(key, K)
                tau = tl.min(best, axis=1)
                take_ties = K - tl.sum((best > tau[:, None]).to(tl.int32), axis=1)
            n_eq = tl.sum((key == tau[:, None]).to(tl.int32), axis=1)
            zero = tl.zeros([ROWS], dtype=tl.int32)
            if tl.max(tl.where(row_ok & ~short, n_eq - take_ties, 0), axis=0) > 0:
                chosen, _ = _chosen(key, forced, tau, take_ties, zero, False, CHUNK)
            else:
                chosen, _ = _chosen(key, forced, tau, take_ties, zero, True, CHUNK)
            sel = tl.where(short[:, None], idx_ok, chosen & idx_ok)
        slot = _prefix_sum(sel.to(tl.int32), CHUNK) - 1
        tl.store(o_row + slot, idx[None, :] + tl.zeros_like(slot), mask=sel & row_ok[:, None])
        base = tl.sum(sel.to(tl.int32), axis=1)
    else:
        # long rows: a running top-K over CHUNK-wide pieces, then a chunked compaction
        tau = tl.zeros([ROWS], dtype=tl.int32) + 2147483647
        take_ties = tl.zeros([ROWS], dtype=tl.int32)
        if any_long:
            best = tl.full([ROWS, K], -2147483648, dtype=tl.int32)
            for c0 in range(0, num_tiles, CHUNK):
                idx = c0 + cols
                s = tl.load(s_row + idx[None, :], mask=row_ok[:, None] & (idx < num_tiles)[None, :], other=0.0)
                key, forced, idx_ok = _score_keys(s, idx, n, fb, fe, counted)
                both = tl.reshape(tl.join(best, _topk_values(key, K)), [ROWS, 2 * K])
                best = _topk_values(both, K)
            tau = tl.min(best, axis=1)
            take_ties = K - tl.sum((best > tau[:, None]).to(tl.int32), axis=1)
        ties_seen = tl.zeros([ROWS], dtype=tl.int32)
        n_max = tl.max(n, axis=0)
        for c0 in range(0, n_max, CHUNK):
            idx = c0 + cols
            s = tl.load(s_row + idx[None, :], mask=row_ok[:, None] & (idx < num_tiles)[None, :], other=0.0)
            key, forced, idx_ok = _score_keys(s, idx, n, fb, fe, counted)
            chosen, n_eq = _chosen(key, forced, tau, take_ties, ties_seen, False, CHUNK)
            ties_seen += n_eq
            sel = tl.where(short[:, None], idx_ok, chosen & idx_ok)
            slot = _prefix_sum(sel.to(tl.int32), CHUNK) - 1 + base[:, None]
            tl.store(o_row + slot, idx[None, :] + tl.zeros_like(slot), mask=sel & row_ok[:, None])
            base += tl.sum(sel.to(tl.int32), axis=1)
    # ---- remaining slots: -1
    wc = tl.arange(0, W_P2)
    tl.store(o_row + wc[None, :], tl.full([ROWS, W_P2], -1, dtype=tl.int32),
             mask=row_ok[:, None] & (wc[None, :] < W) & (wc[None, :] >= base[:, None]))


@triton.jit(do_not_specialize=["n_rows", "num_tiles", "num_valid_pages", "H", "fb", "fe", "counted", "W", "has_qpos"])
def _topk_interval_kernel(
    s_ptr, out_ptr, qpos_ptr,
    n_rows, num_tiles, num_valid_pages, H, fb, fe, counted, W, has_qpos,
    K: tl.constexpr, W_P2: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, G: tl.constexpr,
    G1: tl.constexpr,
):
    """Whole rows in registers with the interval threshold and ballot prefix sums, on
    unsigned keys (``u = key ^ INT32_MIN``: forced blocks 0xFFFFFFFF, invalid blocks 0).
    ``num_tiles`` is not specialized: without 16-byte vector loads key ``i`` sits in lane
    ``i % 32`` of register ``i // 32``, the layout of the ballots. Only the row's valid
    blocks are read. One-row programs run on a (token, head) grid with scalar row data."""
    if ROWS == 1:
        tok = tl.program_id(0)
        n1 = num_valid_pages
        if has_qpos != 0:
            pos = tl.load(qpos_ptr + tok)
            n1 = tl.where(pos < 0, 0, tl.minimum(pos // 128 + 1, num_valid_pages)).to(tl.int32)
        rows = tl.zeros([1], dtype=tl.int64) + tok.to(tl.int64) * H + tl.program_id(1)
        row_ok = rows >= 0
        n = tl.zeros([1], dtype=tl.int32) + n1
        any_long = n1 > W
    else:
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        n = _row_counts(rows, n_rows, qpos_ptr, num_valid_pages, H, has_qpos)
        any_long = tl.max(tl.where(row_ok & (n > W), 1, 0), axis=0) > 0
    short = n <= W
    idx = tl.arange(0, CHUNK)[None, :]
    o_row = out_ptr + rows.to(tl.int64)[:, None] * W
    if any_long:
        s = tl.load(s_ptr + rows.to(tl.int64)[:, None] * num_tiles + idx, mask=(~short)[:, None] & (idx < n[:, None]),
                    other=0.0)
        # candidates by score: fb <= idx < n - fe (one unsigned compare); every other valid
        # block is forced and gets the largest key, so the W output ids of a long row are
        # its W largest keys (W = topk, + fb + fe when forced blocks are not counted)
        valid = idx < n[:, None]
        cand = (idx - fb).to(tl.uint32) < (tl.maximum(n - fe, fb) - fb).to(tl.uint32)[:, None]
        bits = (s + 0.0).to(tl.int32, bitcast=True)  # -0.0 -> +0.0
        # order-preserving unsigned key: flip all bits of negatives, the sign bit of the rest
        u = (bits ^ ((bits >> 31) | -2147483648)).to(tl.uint32, bitcast=True)
        u = tl.where(s != s, 0xFFC00000, u)  # every NaN: one key above +inf
        u = tl.where(cand, u, tl.where(valid, 0xFFFFFFFF, 0))
        need = row_ok & ~short
        u_lo = tl.where(cand, u, 0)
        all_forced = fb + fe >= W  # counted forced blocks filling the top-k
        if ROWS == 1:
            tau1, cnt1 = _interval_threshold_row(u, u_lo, all_forced, W, G1)
            tau = tl.zeros([1], dtype=tl.uint32) + tau1
            cnt = tl.zeros([1], dtype=tl.int32) + cnt1
        else:
            tau, cnt = _interval_threshold(u, u_lo, all_forced, need, W, CHUNK, G)
        if tl.max(tl.where(need, cnt - W, 0), axis=0) > 0:
            # a tie straddles the W-th place (tau is that key): the first ties in index order
            eq = u == tau[:, None]
            take_ties = W - cnt + tl.sum(eq.to(tl.int32), axis=1)
            eq_rank = _prefix_sum_ballot(eq.to(tl.int32), CHUNK) - 1
            chosen = (u > tau[:, None]) | (eq & (eq_rank < take_ties[:, None]))
        else:
            chosen = u >= tau[:, None]
        # a long row has more than W valid keys, all above 0, so chosen keys are valid
        if ROWS == 1:
            sel = chosen
        else:
            sel = tl.where(short[:, None], valid, chosen)
    else:
        sel = idx < n[:, None]
    slot = _prefix_sum_ballot(sel.to(tl.int32), CHUNK) - 1
    tl.store(o_row + slot, idx + tl.zeros_like(slot), mask=sel & row_ok[:, None])
    if tl.max(tl.where(row_ok & short, 1, 0), axis=0) > 0:
        # identity rows (n <= W ids) end with -1; long rows fill all W slots
        wc = tl.arange(0, W_P2)
        tl.store(o_row + wc[None, :], tl.full([ROWS, W_P2], -1, dtype=tl.int32),
                 mask=(row_ok & short)[:, None] & (wc[None, :] < W) & (wc[None, :] >= n[:, None]))


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
def _lane_bisect(k, lo, clo, hm, K, SLACK: tl.constexpr):
    """:func:`_interval_threshold_row` on one key per lane (``k`` [32]): bisects ``lo``
    (``clo = count(k >= lo) >= K``) towards the K-th largest key, stopping once ``clo <=
    K + SLACK`` (with ``SLACK`` 0: ``lo`` is the K-th largest key, or the tie count at it
    exceeds K). Starts from a ``lo`` with ``clo >= K`` and ``hm >= lo`` with ``count(k >
    hm) < K``."""
    while (clo > K + SLACK) & (lo != hm):
        mid = lo + ((hm - lo) >> 1) + 1  # lo < mid <= hm
        c = tl.sum((k >= mid).to(tl.int32), axis=0)
        if c >= K:
            lo = mid
            clo = c
        else:
            hm = mid - 1
    return lo, clo


@triton.jit
def _below_lane(b, lane):
    """Set bits of the uint32 ``b`` (per lane) below bit ``lane``. Layout-free (the Gluon
    kernels of ``topk_warps`` call it as it is)."""
    u = lane.to(tl.uint32)
    return _popc(b & (((u - u + 1) << u) - 1))


@triton.jit
def _lane_keys(s):
    """Unsigned order-preserving keys of the ``lanes`` kernel: every NaN 0xFFC00000 (above
    +inf), -0.0 as +0.0. Blocks past n are loaded as -inf: they tie with -inf scores and
    lose every tie (they have the largest ids)."""
    bits = (s + 0.0).to(tl.int32, bitcast=True)  # -0.0 -> +0.0
    u = (bits ^ ((bits >> 31) | -2147483648)).to(tl.uint32, bitcast=True)
    return tl.where(s != s, 0xFFC00000, u)


@triton.jit
def _ballot_ge(u, t, VOTE: tl.constexpr):
    """Per register of the [R, 32] keys (block ``32 * j + l`` in lane ``l``): the bit mask
    of the lanes with ``u >= t``, in every lane (``vote.ballot`` on the GPU)."""
    if VOTE and not INTERPRET:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ge.u32 p, $1, $2; vote.sync.ballot.b32 $0, p, -1; }", "=r,r,r",
            [u, tl.zeros_like(u) + t], dtype=tl.uint32, is_pure=False, pack=1)
    else:
        lane = tl.arange(0, 32)[None, :].to(tl.uint32)
        return tl.sum((u >= t).to(tl.uint32) << lane, axis=1)[:, None] + tl.zeros_like(u)


@triton.jit
def _lane_survivors(ball, jj, lane, R: tl.constexpr):
    """From the ballots ``ball`` [R, 32] of a row's R registers (``jj`` [R, 1] their index):
    each lane's count ``S`` of survivors in the row (all lanes equal) and the block id of the
    lane's survivor (lane L holds the L-th in block order; meaningful for L < S): it lies in
    the last register starting at or before L. Layout-free (the Gluon kernel calls it)."""
    S = lane - lane
    b = S.to(tl.uint32)
    base = S
    jstar = S
    for j in tl.static_range(R):
        bj = tl.sum(tl.where(jj == j, ball, 0), axis=0)
        at = lane >= S
        b = tl.where(at, bj, b)
        base = tl.where(at, S, base)
        jstar = tl.where(at, j, jstar)
        S += _popc(bj)
    return S, jstar * 32 + _nth_lane(b, lane - base)


@triton.jit
def _nth_lane(b, r):
    """The lane of the ``r``-th set bit (from 0) of each lane's uint32 ``b``: a binary search
    on popcounts below a lane. Layout-free."""
    p = r - r
    for step in tl.static_range(5):
        t = p + (16 >> step)
        p = tl.where(_below_lane(b, t) <= r, t, p)
    return p


@triton.jit
def _lanes_choose(kl, cand, tau, clo, C, fb, lane):
    """The C chosen candidates given the C-th largest key ``tau`` of the candidates' keys
    ``kl`` (one per lane, lanes in block order; ``clo`` of them ``>= tau``): ties at ``tau``
    taken in lane order, and each chosen lane's output slot ``fb`` + its rank among the
    chosen. Layout-free (the Gluon kernel of ``topk_warps`` calls it)."""
    zero = (lane - lane).to(tl.uint32)
    if clo > C:
        # a tie straddles the C-th place: the first ties in block (= lane) order
        eq = kl == tau
        eball = tl.sum(eq.to(tl.uint32) << lane.to(tl.uint32), axis=0)
        take = C - clo + _popc(eball)
        chosen = (kl > tau) | (eq & (_below_lane(zero + eball, lane) < take))
    else:
        chosen = kl >= tau
    chosen = chosen & cand & (C > 0)
    cball = tl.sum(chosen.to(tl.uint32) << lane.to(tl.uint32), axis=0)
    return chosen, fb + _below_lane(zero + cball, lane)


@triton.jit
def _lanes_finish(kl, cand, src, tau0, C, fb, fe, n1, W, o_row):
    """Step 3 of :func:`_topk_lanes_kernel` and the output: the exact C-th largest of the
    candidates' keys ``kl`` (one per lane, lanes in block order, block ids ``src``; ``C``
    or more of them ``>= tau0``) by bisection from ``tau0``, ties by ballot prefix, the
    chosen ids in ascending order after the ``fb`` begin blocks, the ``fe`` end blocks last."""
    lane = tl.arange(0, 32)
    clo = tl.sum(cand.to(tl.int32), axis=0)  # >= C candidates are >= tau0 (keys > 0)
    tau, clo = _lane_bisect(kl, tau0, clo, tl.maximum(tl.max(kl, axis=0), tau0), C, 0)
    chosen, slot = _lanes_choose(kl, cand, tau, clo, C, fb, lane)
    tl.store(o_row + slot, src, mask=chosen)
    # forced blocks: 0 .. fb-1 in the first slots, n-fe .. n-1 in the last
    end = lane - fb
    tl.store(o_row + tl.where(lane < fb, lane, W - fe + end), tl.where(lane < fb, lane, n1 - fe + end),
             mask=lane < fb + fe)


@triton.jit
def _lanes_full_row(u, idx, n1, fb, fe, W, C, o_row, G1: tl.constexpr):
    """The fallback of :func:`_topk_lanes_kernel` (more than 32 survivors): the interval
    bisection on the whole row of keys ``u`` ([R, 32]), forced blocks lifted to the top."""
    R: tl.constexpr = u.shape[0]
    forced = ((idx - (n1 - fe)).to(tl.uint32) < fe.to(tl.uint32)) | (idx < fb)
    uf = tl.reshape(tl.where(forced, 0xFFFFFFFF, u), [1, R * 32])
    u_lo = tl.reshape(tl.where(forced, 0, u), [1, R * 32])
    tau1, cnt1 = _interval_threshold_row(uf, u_lo, C == 0, W, G1)
    if cnt1 > W:
        eqf = uf == tau1
        take_f = W - cnt1 + tl.sum(tl.sum(eqf.to(tl.int32), axis=1), axis=0)
        rank_f = _prefix_sum_ballot(eqf.to(tl.int32), R * 32) - 1
        sel_f = (uf > tau1) | (eqf & (rank_f < take_f))
    else:
        sel_f = uf >= tau1
    slot_f = _prefix_sum_ballot(sel_f.to(tl.int32), R * 32) - 1
    tl.store(o_row + slot_f, tl.reshape(idx, [1, R * 32]), mask=sel_f)


@triton.jit(do_not_specialize=["num_tiles", "num_valid_pages", "H", "fb", "fe", "W", "has_qpos"])
def _topk_lanes_kernel(
    s_ptr, out_ptr, qpos_ptr,
    num_tiles, num_valid_pages, H, fb, fe, W, has_qpos,
    R: tl.constexpr, W_P2: tl.constexpr, G1: tl.constexpr, SLACK: tl.constexpr, VOTE: tl.constexpr,
):
    """One row per one-warp program ((token, head) grid), the row as [R, 32]: block
    ``32 * j + l`` in lane ``l``, register ``j``; keys by :func:`_lane_keys` (W <= 32).
    A long row's output is its ``fb`` begin blocks, then the ``C = W - fb - fe`` best
    candidates (``fb <= id < n - fe``) in id order, then its ``fe`` end blocks.

    1. ``tau0``, a lower bound of the C-th largest candidate key: the largest key of each
       lane and a bisection on those 32 keys to ``lo`` with ``W <= count(lane max >= lo)
       <= W + SLACK`` (those lanes hold W distinct blocks ``>= lo``, at most ``fb + fe`` of
       them forced);
    2. the survivors (keys ``>= tau0``: ~22 of 256 on random rows at ``SLACK`` 0) are
       compacted into lanes in block order: lane ``L`` finds the register of the L-th
       survivor by prefix counts of the per-register ballots and its source lane by a
       popcount binary search, and reloads its score (an L1 hit);
    3. the exact selection of C candidates on one key per lane: bisection from ``tau0``,
       ties by ballot prefix, output slots by ballot prefix.
    Rows with more than 32 survivors take the full-row bisection; rows with ``n <= W``
    the identity."""
    tok = tl.program_id(0)
    n1 = num_valid_pages
    if has_qpos != 0:
        pos = tl.load(qpos_ptr + tok)
        n1 = tl.where(pos < 0, 0, tl.minimum(pos // 128 + 1, num_valid_pages)).to(tl.int32)
    row = tok.to(tl.int64) * H + tl.program_id(1)
    s_row = s_ptr + row * num_tiles
    o_row = out_ptr + row * W
    jj = tl.arange(0, R)[:, None]
    ll = tl.arange(0, 32)[None, :]
    idx = jj * 32 + ll
    lane = tl.arange(0, 32)
    if n1 > W:
        u = _lane_keys(tl.load(s_row + idx, mask=idx < n1, other=float("-inf")))
        C = W - fb - fe  # candidates to choose (0: the forced blocks fill the top-k)
        m = tl.max(u, axis=0)  # each lane's largest key
        m_lo = tl.min(m, axis=0)
        tau0, _c0 = _lane_bisect(m, m_lo, tl.full([], 32, tl.int32), tl.max(m, axis=0), W, SLACK)
        ball = _ballot_ge(u, tau0, VOTE)  # [R, 32]: register j's ballot in every lane
        cnt = _popc(ball)
        S = tl.max(tl.sum(cnt, axis=0), axis=0)
        if S <= 32:
            # compaction: lane L takes the L-th survivor in block order
            excl = tl.cumsum(cnt, axis=0) - cnt  # survivors in earlier registers
            jstar = tl.sum((excl <= ll).to(tl.int32), axis=0) - 1  # last register starting at or before L
            hit = jj == jstar[None, :]
            b = tl.sum(tl.where(hit, ball, 0), axis=0)
            r = lane - tl.sum(tl.where(hit, excl, 0), axis=0)
            src = jstar * 32 + _nth_lane(b, r)
            cand = (lane < S) & (src >= fb) & (src < n1 - fe)
            kl = tl.where(cand, _lane_keys(tl.load(s_row + src, mask=cand, other=0.0)), 0)
            _lanes_finish(kl, cand, src, tau0, C, fb, fe, n1, W, o_row)
        else:
            _lanes_full_row(u, idx, n1, fb, fe, W, C, o_row, G1)
    else:
        # identity rows: 0 .. n-1, then -1
        wc = tl.arange(0, W_P2)
        tl.store(o_row + wc, tl.where(wc < n1, wc, -1), mask=wc < W)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _float_of_key(u):
    """The float whose :func:`_lane_keys` key is ``u`` (keys of -inf .. +inf; 0x7FFFFFFF
    gives -0.0, which compares like +0.0)."""
    ui = u.to(tl.int32, bitcast=True)
    return (ui ^ (((~ui) >> 31) | -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _ballot_ge_f(s, t, VOTE: tl.constexpr):
    """:func:`_ballot_ge` of fp32 scores against an fp32 threshold (no NaN)."""
    if VOTE and not INTERPRET:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ge.f32 p, $1, $2; vote.sync.ballot.b32 $0, p, -1; }", "=r,f,f",
            [s, tl.zeros_like(s) + t], dtype=tl.uint32, is_pure=False, pack=1)
    else:
        lane = tl.arange(0, 32)[None, :].to(tl.uint32)
        return tl.sum((s >= t).to(tl.uint32) << lane, axis=1)[:, None] + tl.zeros([s.shape[0], 32], tl.uint32)


@triton.jit
def _lanes_fast_load(s_row, n_load, R: tl.constexpr, FULL: tl.constexpr):
    """A row's scores as [R, 32] (block ``32 j + l`` in lane ``l``, register ``j``), blocks
    ``>= n_load`` as -inf; a full row (``FULL`` and ``n_load >= 32 R``) without masks, from
    one address with immediate offsets."""
    jj = tl.arange(0, R)[:, None]
    ll = tl.arange(0, 32)[None, :]
    if FULL:
        if n_load >= R * 32:
            s = tl.load((s_row + ll) + jj * 32)
        else:
            s = tl.load((s_row + ll) + jj * 32, mask=jj * 32 + ll < n_load, other=float("-inf"))
    else:
        s = tl.load((s_row + ll) + jj * 32, mask=jj * 32 + ll < n_load, other=float("-inf"))
    return s


@triton.jit
def _lanes_fast_row(s, n1, s_row, o_row, fb, fe, W, G1: tl.constexpr, SLACK: tl.constexpr, VOTE: tl.constexpr):
    """The selection of :func:`_topk_lanes_fast_kernel` on one row with ``n1 > W`` valid
    blocks whose scores ``s`` ([R, 32]) come from :func:`_lanes_fast_load` (``n_load = n1``)."""
    R: tl.constexpr = s.shape[0]
    jj = tl.arange(0, R)[:, None]
    ll = tl.arange(0, 32)[None, :]
    idx = jj * 32 + ll
    lane = tl.arange(0, 32)
    C = W - fb - fe
    m = _lane_keys(tl.reduce(s, 0, _max_nan))  # each lane's largest key; NaN's if it has one
    m_hi = tl.max(m, axis=0)
    if m_hi <= 0xFF800000:  # no NaN (+inf's key)
        tau0, _c0 = _lane_bisect(m, tl.min(m, axis=0), tl.full([], 32, tl.int32), m_hi, W, SLACK)
        ball = _ballot_ge_f(s, _float_of_key(tau0), VOTE)  # [R, 32]
        S, src = _lane_survivors(ball, jj, lane, R)
        S1 = tl.max(S, axis=0)
        if S1 <= 32:
            cand = (lane < S) & (src >= fb) & (src < n1 - fe)
            kl = tl.where(cand, _lane_keys(tl.load(s_row + src, mask=cand, other=0.0)), 0)
            _lanes_finish(kl, cand, src, tau0, C, fb, fe, n1, W, o_row)
        else:
            _lanes_full_row(_lane_keys(s), idx, n1, fb, fe, W, C, o_row, G1)
    else:
        _lanes_full_row(_lane_keys(s), idx, n1, fb, fe, W, C, o_row, G1)


@triton.jit
def _lanes_identity(o_row, n1, W, W_P2: tl.constexpr):
    """The output of a row with ``n1 <= W`` valid blocks: 0 .. n1-1, then -1."""
    wc = tl.arange(0, W_P2)
    tl.store(o_row + wc, tl.where(wc < n1, wc, -1), mask=wc < W)


@triton.jit(do_not_specialize=["num_tiles", "num_valid_pages", "H", "fb", "fe", "W"])
def _topk_lanes_fast_kernel(
    s_ptr, out_ptr, qpos_ptr,
    num_tiles, num_valid_pages, H, fb, fe, W,
    R: tl.constexpr, W_P2: tl.constexpr, G1: tl.constexpr, SLACK: tl.constexpr, VOTE: tl.constexpr,
    HAS_QPOS: tl.constexpr, FULL: tl.constexpr,
):
    """:func:`_topk_lanes_kernel` with fewer instructions on the common path: scores stay
    fp32 (no key per block: the lane maxima, NaN-propagating, get keys, and the survivors
    are the blocks ``>=`` the fp32 value of ``tau0``, -0.0 comparing like +0.0), a row with
    a NaN takes the full-row fallback (its lane max key is NaN's), a full row (``FULL``:
    ``num_tiles == 32 R``, and ``n == num_tiles``) is loaded without masks, the survivors'
    registers come from one pass over the ballots, and query positions are a constexpr.
    The selection is :func:`_lanes_fast_row`."""
    tok = tl.program_id(0)
    n1 = num_valid_pages
    if HAS_QPOS:
        pos = tl.load(qpos_ptr + tok)
        n1 = tl.where(pos < 0, 0, tl.minimum(pos // 128 + 1, num_valid_pages)).to(tl.int32)
    row = tok.to(tl.int64) * H + tl.program_id(1)
    s_row = s_ptr + row * num_tiles
    o_row = out_ptr + row * W
    if n1 > W:
        _lanes_fast_row(_lanes_fast_load(s_row, n1, R, FULL), n1, s_row, o_row, fb, fe, W, G1, SLACK, VOTE)
    else:
        _lanes_identity(o_row, n1, W, W_P2)


TOPK_METHODS = ("bitonic", "radix", "interval", "lanes")
TOPK_METHOD = os.environ.get("MATE_MSA_TOPK_METHOD", ENV_VARS["MATE_MSA_TOPK_METHOD"][0])
"""Threshold method of the public path (see :func:`sparse_topk_select_triton`); the
environment variable ``MATE_MSA_TOPK_METHOD`` (``lanes`` / ``interval`` / ``radix`` /
``bitonic``) overrides it. H200, top-16 + 1 forced end block, 4 heads
(benchmarks/bench_msa_topk_variants.py; CUDA-graph replays, variants interleaved):
32768 x 256 tiles (copy 4,179 GB/s, 2026-12) lanes fast slack 2 83.8 us (38.3% of copy),
classic slack 2 87.0, streaming floors 82.0 (one row per one-warp program) and 41.5 (4 rows
per program); causal fast 87.8, classic 93.6; exact. Before (copy ~4,190 GB/s): fast 82.9
(38.7%), classic 86.5, causal 85.1 / 92.2; fast exact on 200 random GPU cases. Earlier (classic kernel; copy 4,040 GB/s): lanes slack 2 86.7 us (38.3% of copy), lanes slack 0
90.4, slack 2 with lane-sum ballots 89.3, interval 113.2 (29.3%), a streaming floor (the
same one-warp-per-row grid: loads, one reduction, the W ids written, no selection) 81.4
(40.8%); with causal query positions lanes slack 2 92.3, interval 121.3. Earlier run
(copy 4,164 GB/s): 32768 x 256 interval 113.8, radix 251.5, bitonic 360.5, torch.topk
1,657; causal interval 123.2, radix 239.0; 8192 x 1024 interval (2 warps) 124.3, radix
328.8; 1024 x 12287 interval (rows in registers, max_chunk 16384) 525.8, radix
(tournament) 1,234, torch.topk 673."""

LANES_KERNEL = "fast"
"""The ``lanes`` method's kernel: ``"fast"`` (:func:`_topk_lanes_fast_kernel`) or
``"classic"`` (:func:`_topk_lanes_kernel`, the same selection with more instructions per
row)."""

LANES_WARPS = 4
"""One-row warps per program of the fast ``lanes`` kernel (1: :func:`_topk_lanes_fast_kernel`
on the (token, head) grid; 2, 4, 8: :mod:`mate.ops.msa.topk_warps`). H200, 32768 x 4 x 256,
top 16 + 1 forced (copy 4,263 GB/s), timed interleaved: one-warp programs 82.6 us (38.1% of
copy: one-warp programs hit the 32-blocks-per-SM cap), 2 / 4 / 8 warps 69.8 / 70.2 / 71.9,
4 / 8 warps capped at 32 registers (:data:`LANES_MAXNREG`, 64 resident warps per SM) 62.3 /
62.5 (50.6%); causal rows 85.8 one-warp, 87.6 4 warps, 84.4 4 warps capped (rows loaded
after their query position; whole rows masked by value: 61.6, causal 73.6). All
exact on 200 random cases each. With the sorted selection (copy 4,267 GB/s): 4 warps 56.0 us
(56.1% of copy), causal 63.3 (49.7%), 8 warps 56.1 / 63.6."""

LANES_MAXNREG = 32
"""Register cap of the multi-warp ``lanes`` kernel (sm_90 build: 48 uncapped; no spills at
32 or 24, with or without query positions; 32 already lets 64 warps reside per SM)."""

LANES_MAX_CHUNK = 256
"""Longest row (tiles, rounded up to a power of two) of the ``lanes`` kernel (one warp;
up to 32 keys per thread); longer rows take ``interval``."""

INTERVAL_MAX_CHUNK = 16384
"""Longest row the interval kernel holds in registers (16 warps); longer rows take the
chunked tournament."""

_DUMMY: dict[torch.device, torch.Tensor] = {}


def _dummy_positions(device: torch.device) -> torch.Tensor:
    """A cached int64 tensor standing in for absent query positions (never read)."""
    t = _DUMMY.get(device)
    if t is None:
        t = _DUMMY[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return t


def topk_config(num_tiles: int, k: int, max_chunk: int = 4096, method: str = "bitonic",
                rows_per_program: int | None = None) -> dict:
    """Chunk width, rows per program and warps (host ints only). Rows longer than
    ``max_chunk`` take the chunked (tournament) path. ``rows_per_program`` overrides the
    radix path's rows per program (1 on the GPU; the interpreter, which pays per program,
    defaults to the bitonic path's count)."""
    chunk = max(next_power_of_2(max(num_tiles, 1)), k, 16)
    single = chunk <= max_chunk
    if not single:
        chunk = max_chunk
    if method in ("radix", "interval") and single:
        # one row per program, one warp per 1024 keys: the per-bit row sum stays inside a
        # warp (shuffles, no shared memory or barrier) and each row exits its search early
        # (H200 compile at 256 tiles: 55 registers, ~35 instructions per bit per row)
        rows = rows_per_program or (max(1, 1024 // chunk) if INTERPRET else 1)
        warps = max(1, chunk // 1024)
        if method == "interval" and chunk == 1024:
            warps = 2  # H200 8192 x 4 x 1024: 124.3 us against 131.3 (1 warp) and 151.2 (4 warps)
        return dict(CHUNK=chunk, SINGLE=True, ROWS=rows, num_warps=warps)
    # ~8 keys per thread: 60 registers at 256 tiles (H200 compile), so 8 programs fit an SM
    rows = max(1, 1024 // chunk)
    return dict(CHUNK=chunk, SINGLE=single, ROWS=rows, num_warps=4 if chunk <= 1024 else 8)


def sparse_topk_select_triton(
    max_score: torch.Tensor,
    output: torch.Tensor,
    *,
    query_positions: torch.Tensor | None,
    num_valid_pages: int,
    topk: int,
    force_begin_blocks: int,
    force_end_blocks: int,
    force_blocks_count_in_topk: bool,
    max_chunk: int | None = None,
    method: str | None = None,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    lanes_slack: int = 2,
    lanes_vote: bool = True,
    lanes_kernel: str | None = None,
    lanes_warps: int | None = None,
    lanes_maxnreg: int | None = None,
) -> None:
    """Launches the selection on validated tensors (contiguous fp32 scores, int32 output).
    ``max_chunk`` (a power of two >= 16; default :data:`INTERVAL_MAX_CHUNK` for ``interval``,
    4,096 otherwise) is the longest row held in registers; tests lower it to reach the
    long-row path.
    ``method`` picks the threshold step of rows held in registers: ``"lanes"``
    (:func:`_topk_lanes_kernel`, rows of up to :data:`LANES_MAX_CHUNK` tiles (and at most
    ``max_chunk``) and W <= 32, ``interval`` for the others), ``"interval"``
    (:func:`_topk_interval_kernel`), ``"radix"`` (bitwise binary search,
    :func:`_radix_threshold`) or ``"bitonic"`` (``tl.topk``); default :data:`TOPK_METHOD`.
    All give identical results; long rows (the chunked path) always use the tournament.
    ``lanes_slack`` stops the one-row lanes kernels' lane-max bound search early (more
    survivors, fewer steps; the multi-warp kernel sorts the lane maxima), ``lanes_vote=False``
    builds their ballots from lane sums instead of ``vote.ballot``.
    ``lanes_kernel`` (default :data:`LANES_KERNEL`) picks the ``lanes`` kernel: ``"classic"``
    (:func:`_topk_lanes_kernel`) or ``"fast"`` (:func:`_topk_lanes_fast_kernel`).
    ``lanes_warps`` (default :data:`LANES_WARPS`; 1, 2, 4 or 8) runs the fast kernel with that
    many one-row warps per program (:mod:`mate.ops.msa.topk_warps`, Gluon, GPU only: under
    the interpreter the one-row kernel runs); ``lanes_maxnreg`` (default :data:`LANES_MAXNREG`;
    0: no cap) caps its registers per thread.
    ``rows_per_program`` and ``num_warps`` override :func:`topk_config` (experiments)."""
    method = TOPK_METHOD if method is None else method
    if lanes_kernel not in (None, "classic", "fast"):
        raise ValueError(f"lanes_kernel must be 'classic' or 'fast', got {lanes_kernel!r}")
    nw = LANES_WARPS if lanes_warps is None else lanes_warps
    if nw not in (1, 2, 4, 8):
        raise ValueError(f"lanes_warps must be 1, 2, 4 or 8, got {lanes_warps!r}")
    if method not in TOPK_METHODS:
        raise ValueError(f"method must be one of {TOPK_METHODS}, got {method!r}")
    if max_chunk is None:
        max_chunk = INTERVAL_MAX_CHUNK if method in ("interval", "lanes") else 4096
    total_q, H, T = max_score.shape
    W = output.shape[2]
    n_rows = total_q * H
    cfg = topk_config(T, topk, max_chunk, method, rows_per_program)
    if num_warps is not None:
        cfg["num_warps"] = num_warps
    grid = (cdiv(n_rows, cfg["ROWS"]),)
    if method == "lanes":
        chunk = max(next_power_of_2(max(T, 1)), 32)
        if chunk <= min(LANES_MAX_CHUNK, max_chunk) and W <= 32 and total_q and \
                (LANES_KERNEL if lanes_kernel is None else lanes_kernel) == "fast":
            if nw > 1 and not INTERPRET:
                nreg = LANES_MAXNREG if lanes_maxnreg is None else lanes_maxnreg
                from mate.ops.msa.topk_warps import _topk_lanes_warps_kernel
                launcher(_topk_lanes_warps_kernel)[(cdiv(n_rows, nw),)](
                    max_score, output,
                    query_positions if query_positions is not None else _dummy_positions(max_score.device),
                    n_rows, T, num_valid_pages, H, force_begin_blocks, force_end_blocks, W,
                    R=chunk // 32, NW=nw, HAS_QPOS=query_positions is not None,
                    FULL=chunk == T, num_warps=nw,
                    **({"maxnreg": nreg} if nreg else {}),
                )
                return
            launcher(_topk_lanes_fast_kernel)[(total_q, H)](
                max_score, output,
                query_positions if query_positions is not None else _dummy_positions(max_score.device),
                T, num_valid_pages, H, force_begin_blocks, force_end_blocks, W,
                R=chunk // 32, W_P2=64, G1=max(16, next_power_of_2(topk)), SLACK=lanes_slack,
                VOTE=lanes_vote, HAS_QPOS=query_positions is not None, FULL=chunk == T, num_warps=1,
            )
            return
        if chunk <= min(LANES_MAX_CHUNK, max_chunk) and W <= 32 and total_q:
            launcher(_topk_lanes_kernel)[(total_q, H)](
                max_score, output,
                query_positions if query_positions is not None else _dummy_positions(max_score.device),
                T, num_valid_pages, H, force_begin_blocks, force_end_blocks, W, int(query_positions is not None),
                R=chunk // 32, W_P2=64, G1=max(16, next_power_of_2(topk)), SLACK=lanes_slack,
                VOTE=lanes_vote, num_warps=1,
            )
            return
        method = "interval"
        cfg = topk_config(T, topk, max_chunk, method, rows_per_program)
    if method == "interval" and cfg["SINGLE"]:
        if cfg["ROWS"] == 1:
            grid = (total_q, H)
        launcher(_topk_interval_kernel)[grid](
            max_score, output, query_positions if query_positions is not None else _dummy_positions(max_score.device),
            n_rows, T, num_valid_pages, H, force_begin_blocks, force_end_blocks, int(force_blocks_count_in_topk), W,
            int(query_positions is not None),
            K=topk, W_P2=64, ROWS=cfg["ROWS"], CHUNK=cfg["CHUNK"],
            G=min(cfg["CHUNK"], max(32, next_power_of_2(W))),
            G1=min(cfg["CHUNK"], max(16, next_power_of_2(topk))), num_warps=cfg["num_warps"],
        )
        return
    launcher(_topk_select_kernel)[grid](
        max_score, output, query_positions if query_positions is not None else _dummy_positions(max_score.device),
        n_rows, T, num_valid_pages, H, force_begin_blocks, force_end_blocks, int(force_blocks_count_in_topk), W,
        int(query_positions is not None),
        K=topk, W_P2=64, ROWS=cfg["ROWS"], CHUNK=cfg["CHUNK"], SINGLE=cfg["SINGLE"], RADIX=method == "radix",
        num_warps=cfg["num_warps"],
    )
