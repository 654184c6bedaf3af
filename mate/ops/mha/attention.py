"""Triton attention for ``mate.mha_interface``: ragged varlen, ``seqused_k``, batched and
paged KV caches, GQA, bottom-right causal / sliding windows, natural-log LSE.

One program owns TM query tokens of one request times the query heads of one KV head
(padded to GP, a power of two): BLOCK_M = TM * GP rows, so decode with GQA fills the MMA
rows with heads and K/V are read once per KV head. Keys stream in BLOCK_N tiles; a paged
cache looks up the page of every key (any power-of-two page size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.launch import launcher
from mate._core.triton_helpers import INTERPRET, cdiv, dot_operand, next_power_of_2, online_softmax_step, to_out_dtype
from mate.ops.mha.prefill_tma import (
    PREFILL_TMA,
    attention_prefill_tma,
    prefill_tma_supported,
    request_queries,
    use_virtual_grid,
    virtual_block,
    virtual_grid_blocks,
)

__all__ = ["mha_tiling", "attention_triton", "mha_fwd_op", "PREFILL_VARIANT"]

LOG2E = 1.4426950408889634
INT32_MAX = 2**31 - 1


@triton.jit
def _attend_tile(
    q, k_ptr, v_ptr, kb, vb, k_start, n0, hi, pos, rvalid, m_i, l_i, acc, qk_scale,
    page_table_ptr, req, stride_pt, n_cols, num_pages, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt,
    stride_vh, kvh, window_left, window_right, offs_d, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
):
    """One BLOCK_N tile of keys into the online softmax (m_i, l_i, acc). Unmasked (MASKED
    False): every key of the tile is inside the request and visible to every row, so the
    loads and logits take no mask."""
    n = n0 + tl.arange(0, BLOCK_N)
    nvalid = n < hi
    if PAGED:
        # keys past the table or in pages outside the cache are skipped, never read
        nvalid = nvalid & (n // PAGE_SIZE < n_cols)
        page = tl.load(page_table_ptr + req.to(tl.int64) * stride_pt + n // PAGE_SIZE, mask=nvalid, other=0)
        nvalid = nvalid & (page >= 0) & (page < num_pages)
        krow = page.to(tl.int64) * stride_kb + (n % PAGE_SIZE) * stride_kt + kvh * stride_kh
        vrow = page.to(tl.int64) * stride_vb + (n % PAGE_SIZE) * stride_vt + kvh * stride_vh
    else:
        nvalid = nvalid & (n >= -k_start)  # a ragged request's keys before row 0 (hi bounds the end)
        krow = kb + (k_start + n).to(tl.int64) * stride_kt
        vrow = vb + (k_start + n).to(tl.int64) * stride_vt
    if MASKED:
        kt = tl.load(k_ptr + krow[:, None] + offs_d[None, :], mask=nvalid[:, None], other=0.0)
    else:
        kt = tl.load(k_ptr + krow[:, None] + offs_d[None, :])
    s = tl.dot(q, tl.trans(dot_operand(kt))) * qk_scale
    if MASKED:
        vis = nvalid[None, :] & rvalid[:, None]
        if HAS_RIGHT:
            vis = vis & (n[None, :] <= pos[:, None] + window_right)
        if HAS_LEFT:
            vis = vis & (n[None, :] >= pos[:, None] - window_left)
        s = tl.where(vis, s, float("-inf"))
    m_new, p, alpha, l_i = online_softmax_step(s, m_i, l_i)
    if MASKED:
        vt = tl.load(v_ptr + vrow[:, None] + offs_d[None, :], mask=nvalid[:, None], other=0.0)
    else:
        vt = tl.load(v_ptr + vrow[:, None] + offs_d[None, :])
    acc = acc * alpha[:, None] + tl.dot(dot_operand(p.to(vt.dtype)), dot_operand(vt))
    return m_new, l_i, acc


@triton.jit
def _mha_fwd_kernel(
    q_ptr, stride_qt, stride_qh,
    k_ptr, v_ptr, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    cu_q_ptr, cu_k_ptr, seqused_k_ptr, page_table_ptr, stride_pt, n_cols, num_pages,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lh, stride_lt,
    RATIO, qk_scale, window_left, window_right, q_rows, k_rows, q_uniform, k_uniform, q_len_min, q_len_max,
    batch, n_mblk,
    TM: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_CU_K: tl.constexpr, HAS_SEQUSED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SKIP_WHOLE: tl.constexpr = False,
    SPLIT_LOOP: tl.constexpr = False, HAS_CU_Q: tl.constexpr = True, BLOCK_B: tl.constexpr = 0,
):
    kvh = tl.program_id(2)
    if BLOCK_B > 0:  # one grid axis over the query blocks of the batch's requests (virtual_block)
        req, mblk, q_start, q_len = virtual_block(cu_q_ptr, tl.program_id(0), batch, q_rows, q_len_min, q_len_max,
                                                  n_mblk, TM, BLOCK_B)
        if req < 0:
            return
    else:
        mblk = tl.program_id(0)
        req = tl.program_id(1)
        q_start, q_len = request_queries(cu_q_ptr, req, q_uniform, HAS_CU_Q)
    if (mblk * TM >= q_len) | (q_len < q_len_min) | (q_len > q_len_max):  # another launch's request
        return
    if HAS_CU_K:
        k_start = tl.load(cu_k_ptr + req)
        k_len = tl.load(cu_k_ptr + req + 1) - k_start
    else:  # batched or paged: every request starts at key 0; k_uniform keys unless seqused_k
        k_start = 0
        k_len = k_uniform
    if SKIP_WHOLE:  # noqa: SIM102 (a constexpr guard): the caller computed a request spanning q[:q_rows], k[:k_rows]
        if (q_start == 0) & (q_len == q_rows) & (k_start == 0) & (k_len == k_rows):
            return
    if HAS_SEQUSED:
        k_len = tl.load(seqused_k_ptr + req)
    # lengths past 2**30 count as 2**30: no cache holds that many keys, so the visible keys are the
    # same, and positions and window bounds below stay inside int32
    k_len = tl.minimum(k_len, 1 << 30)
    rows = tl.arange(0, BLOCK_M)
    tok = mblk * TM + rows // GP
    hl = rows % GP
    h = kvh * RATIO + hl
    t = (q_start + tok).to(tl.int64)
    # rows outside q (offsets past its q_rows tokens) are neither read nor written
    rvalid = (tok < q_len) & (hl < RATIO) & (rows // GP < TM) & (t >= 0) & (t < q_rows)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + t[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                mask=rvalid[:, None], other=0.0)
    q = dot_operand(q)
    pos = tok + (k_len - q_len)  # bottom-right aligned position of each row's query
    if HAS_RIGHT:
        hi_row = tl.where(rvalid, pos + window_right, -1)
    else:
        hi_row = tl.where(rvalid, k_len - 1, -1)
    hi = tl.minimum(k_len, tl.max(hi_row, axis=0) + 1)
    lo = 0
    if PAGED:  # keys past the table's pages are skipped: the loop ends there
        hi = tl.minimum(hi.to(tl.int64), tl.full([], PAGE_SIZE, tl.int64) * n_cols).to(tl.int32)
    else:  # keys outside the k_rows rows of k (batched: of the request's row) are skipped, never read
        hi = tl.minimum(hi.to(tl.int64), k_rows - k_start.to(tl.int64)).to(tl.int32)
        lo = (tl.minimum(tl.maximum(-k_start.to(tl.int64), 0), 1 << 30).to(tl.int32) // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo_row = tl.where(rvalid, pos - window_left, k_len)
        lo = tl.maximum(lo, (tl.maximum(0, tl.min(lo_row, axis=0)) // BLOCK_N) * BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kb = req.to(tl.int64) * stride_kb + kvh * stride_kh
    vb = req.to(tl.int64) * stride_vb + kvh * stride_vh
    SPLIT: tl.constexpr = SPLIT_LOOP and not PAGED and not HAS_LEFT
    full_hi = lo
    if SPLIT:
        # tiles that every valid row sees whole (below the earliest row's last visible key, all
        # inside the request) run without masks; the rest take the masked loop
        if HAS_RIGHT:
            end_row = tl.where(rvalid, pos + window_right + 1, k_len)
        else:
            end_row = tl.full([BLOCK_M], 0, dtype=tl.int32) + k_len
        full_hi = tl.maximum(lo, (tl.minimum(tl.min(end_row, axis=0), hi) // BLOCK_N) * BLOCK_N)
        full_hi = tl.where(k_start < 0, lo, full_hi)  # keys before row 0 need the masked tiles
    for masked in tl.static_range(0 if SPLIT else 1, 2):  # 0: the unmasked tiles [lo, full_hi)
        for n0 in range(lo if masked == 0 else full_hi, full_hi if masked == 0 else hi, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, k_ptr, v_ptr, kb, vb, k_start, n0, hi, pos, rvalid, m_i, l_i, acc, qk_scale,
                page_table_ptr, req, stride_pt, n_cols, num_pages, stride_kb, stride_kt, stride_kh, stride_vb,
                stride_vt, stride_vh, kvh, window_left, window_right, offs_d, BLOCK_N, PAGE_SIZE, PAGED, masked == 1,
                HAS_LEFT, HAS_RIGHT)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
             to_out_dtype(o, o_ptr.dtype.element_ty), mask=rvalid[:, None])
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    tl.store(lse_ptr + h.to(tl.int64) * stride_lh + t * stride_lt, lse, mask=rvalid)


PREFILL_VARIANT = {"rows": 64, "split_loop": True}
"""Prefill tiling of ``attention_triton``: ``rows`` query rows per program at most (64 or 128;
128 runs 8 warps, so two warpgroups share each key tile) and ``split_loop`` (the key tiles
every row of a program sees whole run without masks; ragged or batched K/V without a left
window only). Measured on the H200 (``benchmarks/probe_mha_prefill.py``, session 13, us;
64 rows masked / 64 split / 128 masked / 128 split): 8 x 2048 causal 994.4 / 867.0 / 1176.3
/ 972.9; one 16K causal sequence with the LSE 6545.7 / 5607.1 / 7224.2 / 5354.6; 8 x 2048
full 1665.2 / 1519.0 / 1849.0 / 1642.3; paged decode unaffected (887-889)."""


def mha_tiling(ratio: int, max_seqlen_q: int, max_rows: int = 64) -> tuple[int, int, int]:
    """(TM tokens per program, GP padded group, BLOCK_M rows)."""
    gp = next_power_of_2(ratio)
    tm = max(1, min(max_rows // gp if gp <= max_rows else 1, next_power_of_2(max(1, max_seqlen_q))))
    return tm, gp, max(16, tm * gp)


def mha_num_warps(block_m: int) -> int:
    """Warps of a program with ``block_m`` query rows: 4 up to 64 rows (one warpgroup), else 8.
    8 warps on 64 rows ran twice as long on the H200 (2026-11-30, interleaved, a probe that is
    now ``benchmarks/probe_mha_prefill.py``: 8 x 2048 causal 989.9 against 2045.9 us, one 16K
    sequence with the LSE 6495.4 against 13593.8; the 16-row paged decode 888.9 / 887.7). The
    sm_90 builds are in ``benchmarks/compile_mha.py``."""
    return 4 if block_m <= 64 else 8


def attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor | None,
    max_seqlen_q: int,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    page_table: torch.Tensor | None,
    batched: bool,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    skip_whole: bool = False,
    batch: int = 0,
    k_uniform: int = 0,
) -> None:
    """Launches ``_mha_fwd_kernel`` (or, for prefill, ``prefill_tma``'s kernel, and then this one
    for a ragged batch's requests of fewer than ``PREFILL_TMA["min_seqlen_q"]`` queries; in a
    ragged batch, once for the decode rows and once for the longer requests, see
    ``PREFILL_TMA["split_short"]``); inputs validated by the caller.

    q [total_q, Hq, D]; k/v ragged [total_k, Hkv, D] (``cu_seqlens_k``), batched
    [B, S, Hkv, D] (``batched``) or paged [pages, page_size, Hkv, D] (``page_table``);
    out [total_q, Hq, D]; lse [Hq, total_q] (any strides). ``skip_whole`` (one ragged
    request, ``cu_seqlens_k`` given): every program returns at once when ``cu_seqlens_q`` is
    [0, total_q] and ``cu_seqlens_k`` [0, total_k], the case the caller computed otherwise
    (read on the device: no host sync), and computes the request in every other case.
    ``cu_seqlens_q`` None: ``batch`` requests of ``max_seqlen_q`` queries each (no offsets
    tensor to build per call). Without ``cu_seqlens_k`` and ``seqused_k`` (batched or paged)
    every request has ``k_uniform`` keys. Query rows outside q and keys outside k (ragged
    offsets or lengths past the tensors, a batched length past ``S``) are skipped, never
    accessed.
    """
    total_q = q.shape[0]
    if cu_seqlens_q is not None:
        batch = cu_seqlens_q.shape[0] - 1
    if total_q == 0 or batch == 0 or max_seqlen_q <= 0:
        return
    ragged_batch = cu_seqlens_q is not None and batch > 1  # its requests' lengths are known on the device only
    split = ragged_batch and bool(PREFILL_TMA["split_short"])
    max_short, upper = max_seqlen_q, INT32_MAX  # the packed-heads kernel's longest request, and its bound
    if prefill_tma_supported(q, k, v, max_seqlen_q=max_seqlen_q, page_table=page_table, batched=batched,
                             window_left=window_left):
        # a ragged batch may mix short requests (decode rows) into a prefill: they run below
        min_tma = max(1, int(PREFILL_TMA["min_seqlen_q"])) if split else 0
        attention_prefill_tma(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              seqused_k=seqused_k, page_table=page_table, batched=batched,
                              max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, window_right=window_right,
                              skip_whole=skip_whole, batch=batch, k_uniform=k_uniform, min_q=min_tma)
        if min_tma <= 1:
            return
        max_short = upper = min(max_seqlen_q, min_tma - 1)
    # the packed-heads kernel's tile holds TM tokens of GP heads, TM fitted to the longest query:
    # in a ragged batch the decode rows (one query) get a launch of their own, tiled as a decode
    # call, so that a longer request does not widen their tiles. (A class of the requests that
    # fill the 16-row tile, 4 queries at GP 4, ran its decode rows 13% slower than the one-query
    # build: 136 registers against 128, three programs per SM instead of four.)
    if split and max_short > 1:
        classes = ((0, 1, 1), (2, upper, max_short))
    else:
        classes = ((0, upper, max_short),)
    for q_len_min, q_len_max, tile_q in classes:
        _launch_packed(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, q_len_min=q_len_min,
                       q_len_max=q_len_max, tile_q=tile_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                       page_table=page_table, batched=batched, softmax_scale=softmax_scale, window_left=window_left,
                       window_right=window_right, skip_whole=skip_whole, batch=batch, k_uniform=k_uniform)


def _launch_packed(q, k, v, out, lse, *, cu_seqlens_q, max_seqlen_q: int, q_len_min: int, q_len_max: int,
                   tile_q: int, cu_seqlens_k, seqused_k, page_table, batched: bool, softmax_scale: float,
                   window_left: int, window_right: int, skip_whole: bool, batch: int, k_uniform: int) -> None:
    """``_mha_fwd_kernel`` over the requests of ``q_len_min`` to ``q_len_max`` queries, tiled and
    gridded for ``tile_q`` queries (``max_seqlen_q``: the uniform query count without
    ``cu_seqlens_q``)."""
    total_q, hq, d = q.shape
    hkv = k.shape[-2]
    ratio = hq // hkv
    paged = page_table is not None
    tm, gp, block_m = mha_tiling(ratio, tile_q, PREFILL_VARIANT["rows"])
    ks, vs = k.stride(), v.stride()
    if paged or batched:
        skb, skt, skh = ks[0], ks[1], ks[2]
        svb, svt, svh = vs[0], vs[1], vs[2]
        page_size = k.shape[1] if paged else 1
    else:
        skb, skt, skh = 0, ks[0], ks[1]
        svb, svt, svh = 0, vs[0], vs[1]
        page_size = 1
    dummy = cu_seqlens_q if cu_seqlens_q is not None else lse  # for absent pointers (never read)
    # windows past 2**30 keys reach as far as unbounded ones (the kernel caps lengths there) and
    # keep the kernel's position arithmetic inside int32
    window_left, window_right = min(window_left, 1 << 30), min(window_right, (1 << 30) - 1)
    block_n = 64
    num_warps = mha_num_warps(block_m)
    n_mblk = cdiv(min(tile_q, total_q), tm)  # no request has more rows inside q
    n_virtual = virtual_grid_blocks(total_q, batch, tm, q_len_min)
    block_b = 0
    if use_virtual_grid(cu_seqlens_q, batch, n_mblk, n_virtual):  # most per-request programs would return
        block_b = max(16, triton.next_power_of_2(batch + 1))
        grid = (n_virtual, 1, hkv)
    else:
        grid = (n_mblk, batch, hkv)
    qs, so, sl = q.stride(), out.stride(), lse.stride()
    launcher(_mha_fwd_kernel)[grid](
        q, qs[0], qs[1],
        k, v, skb, skt, skh, svb, svt, svh,
        dummy, cu_seqlens_k if cu_seqlens_k is not None else dummy,
        seqused_k if seqused_k is not None else dummy,
        page_table if paged else dummy, page_table.stride(0) if paged else 0,
        page_table.shape[1] if paged else 0, k.shape[0],
        out, so[0], so[1], lse, sl[0], sl[1],
        ratio, softmax_scale * LOG2E, window_left, window_right, total_q, k.shape[1] if batched else k.shape[0],
        max_seqlen_q, k_uniform, q_len_min, q_len_max, batch, n_mblk,
        TM=tm, GP=gp, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, PAGE_SIZE=page_size, PAGED=paged,
        HAS_CU_K=cu_seqlens_k is not None, HAS_SEQUSED=seqused_k is not None,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
        SKIP_WHOLE=skip_whole and cu_seqlens_k is not None and seqused_k is None and not paged and not batched,
        SPLIT_LOOP=bool(PREFILL_VARIANT["split_loop"]) and not paged and window_left < 0,
        HAS_CU_Q=cu_seqlens_q is not None, BLOCK_B=block_b, num_warps=num_warps, num_stages=1 if INTERPRET else 2,
    )


def _mha_fwd_op_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    max_seqlen_q: int,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    page_table: torch.Tensor | None,
    batched: bool,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    skip_whole: bool = False,
    batch: int = 0,
    k_uniform: int = 0,
) -> None:
    attention_triton(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                     cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, page_table=page_table, batched=batched,
                     softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
                     skip_whole=skip_whole, batch=batch, k_uniform=k_uniform)


def _register():
    from mate._core.custom_op import mate_custom_op

    return mate_custom_op("mha_fwd", mutates_args=("out", "lse"))(_mha_fwd_op_impl)


mha_fwd_op = _register()
