"""MSA max-score proxy pass in Triton: per query row and 128-key tile, max of raw q.k.

One program owns ``BLOCK_M`` rows (64 for decode, 128 or 256 for prefill) of one request and one KV head, where the rows are the
(token, query head) pairs of the head group (row r -> token r // ratio, head r % ratio),
so each K tile is loaded once per group. It walks the key tiles of its chunk: one
``[BLOCK_M, D] x [D, 128]`` tensor-core dot per tile (fp32 accumulation), a row max, and
masking only on tiles that cross a row's visible limit (causal diagonal or the end of
the context): the tiles every row sees whole run in a separate loop without per-score
compares (H200 compile, 128 rows: 256 instead of 532 instructions per warp per tile,
167 instead of 221 registers). Tiles past the last visible tile of the whole program are never loaded:
their scores are -inf. Maxima of ``OUT_W`` consecutive tiles are staged in registers and
stored together (``OUT_W * 4`` contiguous bytes per row).

K is read in place: dense ragged ``[total_k, Hkv, D]``, or 128-token pages, token-major
``[pages, 128, Hkv, D]`` or head-major ``[pages, Hkv, 128, D]`` (the layouts differ only
in strides), through a page table or flat page ids + pointers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.hopper import planning_sm_count
from mate._core.launch import launcher
from mate._core.triton_helpers import INTERPRET, cdiv, next_power_of_2

__all__ = ["max_score_triton", "max_score_config", "_max_score_fwd_kernel"]

TILE = 128
LAYOUT_DENSE, LAYOUT_TOKEN_MAJOR, LAYOUT_HEAD_MAJOR = 0, 1, 2
# how the kernel finds a key tile: dense offset, page table, flat page ids + pointers
KADDR_DENSE, KADDR_TABLE, KADDR_FLAT = 0, 1, 2
# where a request's first query position comes from: tensor, kv_len - q_len, scalar
QO_TENSOR, QO_DEFAULT, QO_SCALAR = 0, 1, 2


@triton.jit
def _mma_operand(x):
    # under the interpreter bf16/fp16 dots are wrong or low precision: exact fp32 instead
    if INTERPRET:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def _tile_max(q, k_base, kb, b, lim, min_lim, kv_len, table_ptr, stride_table, n_cols, kv_idx_ptr, page_base,
              page_count, n_indices, num_pages, stride_kp, stride_kt, offs_n, offs_d, KADDR: tl.constexpr,
              MASKED: tl.constexpr):
    """Row maxima of q . k over key tile ``kb``; MASKED=False only for tiles every row sees
    whole (no compare/select per score); keys at or past ``kv_len`` are neither read nor
    counted. A paged tile whose page id is missing (past the table's columns or the request's
    ``kv_indices``) or outside [0, num_pages) is skipped: -inf, its loads masked off."""
    BLOCK_N: tl.constexpr = 128
    key0 = kb * BLOCK_N
    page_ok = True
    if KADDR == 0:
        tile_ptr = k_base + key0.to(tl.int64) * stride_kt
    else:
        if KADDR == 1:
            page = tl.load(table_ptr + b.to(tl.int64) * stride_table + kb, mask=kb < n_cols, other=-1)
        else:
            # compared as differences: page_base + kb may exceed int32 for adversarial metadata
            listed = (page_base >= 0) & (kb < page_count) & (kb < n_indices - page_base)
            page = tl.load(kv_idx_ptr + page_base.to(tl.int64) + kb, mask=listed, other=-1)
        page_ok = (page >= 0) & (page < num_pages)
        tile_ptr = k_base + tl.where(page_ok, page, 0).to(tl.int64) * stride_kp
    k_ptrs = tile_ptr + offs_n[:, None] * stride_kt + offs_d[None, :]
    if MASKED:
        key_ok = ((key0 + offs_n) < kv_len) & page_ok
        k = tl.load(k_ptrs, mask=key_ok[:, None], other=0.0)
    elif KADDR == 0:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=(offs_n < BLOCK_N)[:, None] & page_ok, other=0.0)
    s = tl.dot(q, tl.trans(_mma_operand(k)), out_dtype=tl.float32)
    if MASKED:
        s = tl.where(((key0 + offs_n)[None, :] < lim[:, None]) | (key0 + BLOCK_N <= min_lim), s, float("-inf"))
    return tl.where(page_ok, tl.max(s, axis=1), float("-inf"))


@triton.jit
def _max_score_fwd_kernel(
    q_ptr, k_ptr, out_ptr,
    cu_q_ptr, cu_k_ptr, kv_len_ptr, qo_off_ptr, table_ptr, kv_idx_ptr, indptr_ptr,
    qo_offset_value,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_table, n_cols, n_indices, k_dim0, total_q,
    stride_ot, stride_oh,
    num_tiles_out, tiles_per_chunk, num_row_tiles,
    HKV: tl.constexpr, RATIO: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, OUT_W: tl.constexpr,
    KADDR: tl.constexpr, QO_MODE: tl.constexpr, CAUSAL: tl.constexpr, SPLIT_FULL: tl.constexpr = True,
):
    BLOCK_N: tl.constexpr = 128
    pid_bh = tl.program_id(0)
    # heaviest (latest) row tiles first: causal work grows with the row tile index
    row_tile = num_row_tiles - 1 - tl.program_id(1)
    chunk = tl.program_id(2)
    b = pid_bh // HKV
    kvh = pid_bh % HKV

    q_start = tl.load(cu_q_ptr + b)
    q_given = tl.load(cu_q_ptr + b + 1) - q_start
    # rows outside q are neither read nor written: the request's tokens past total_q are dropped,
    # and a request starting before q's first row is not computed (int64: the bounds cannot wrap)
    q_len = tl.where(q_start < 0, 0, tl.minimum(q_given.to(tl.int64), total_q - q_start.to(tl.int64)).to(tl.int32))
    n_rows = q_len * RATIO
    row0 = row_tile * BLOCK_M
    if row0 < n_rows:
        kv_len = tl.load(kv_len_ptr + b)
        if QO_MODE == 0:
            off = tl.load(qo_off_ptr + b)
        elif QO_MODE == 1:
            off = kv_len - q_given
        else:
            off = qo_offset_value
        # the keys a request may see: [0, kv_end); dense: only rows of k (a key range starting
        # before k's first row sees none). Lengths past 2**30 are capped there and the offset at
        # kv_end (the same visibility), so that off + tok + 1 cannot wrap in int32.
        kv_end = tl.minimum(kv_len, 1 << 30)
        if KADDR == 0:
            k_start = tl.load(cu_k_ptr + b)
            k_rows = tl.maximum(k_dim0 - k_start.to(tl.int64), 0)
            kv_end = tl.where(k_start < 0, 0, tl.minimum(kv_end.to(tl.int64), k_rows).to(tl.int32))
        off = tl.minimum(off, kv_end)
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        tok = rows // RATIO
        head = kvh * RATIO + rows % RATIO
        # keys [0, lim) are visible to a row
        if CAUSAL:
            lim = tl.minimum(off + tok + 1, kv_end)
        else:
            lim = tl.zeros([BLOCK_M], dtype=tl.int32) + kv_end
        lim = tl.where(row_ok, tl.maximum(lim, 0), 0)
        max_lim = tl.max(lim, axis=0)
        min_lim = tl.min(tl.where(row_ok, lim, 2147483647), axis=0)
        n_vis_tiles = (max_lim + BLOCK_N - 1) // BLOCK_N

        offs_d = tl.arange(0, D)
        q_rows = (q_start + tok).to(tl.int64)
        q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head[:, None].to(tl.int64) * stride_qh + offs_d[None, :]
        q = _mma_operand(tl.load(q_ptrs, mask=row_ok[:, None], other=0.0))

        offs_n = tl.arange(0, BLOCK_N)
        cols = tl.arange(0, OUT_W)
        o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head[:, None].to(tl.int64) * stride_oh + cols[None, :]
        if KADDR == 0:
            k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kvh * stride_kh
        else:
            k_base = k_ptr + kvh * stride_kh

        c0 = chunk * tiles_per_chunk
        c1 = tl.minimum(c0 + tiles_per_chunk, num_tiles_out)
        t_end = tl.maximum(tl.minimum(c1, n_vis_tiles), c0)
        acc = tl.full([BLOCK_M, OUT_W], float("-inf"), dtype=tl.float32)
        if KADDR == 2:
            pb = tl.load(indptr_ptr + b)
            p_cnt = tl.load(indptr_ptr + b + 1) - pb
        else:
            pb = 0
            p_cnt = 0
        # tiles [c0, t_full) are whole for every row (min_lim <= kv_len): no per-score mask
        if SPLIT_FULL:
            t_full = tl.maximum(tl.minimum(min_lim // BLOCK_N, t_end), c0)
        else:
            t_full = c0
        for kb in range(c0, t_full):
            m = _tile_max(q, k_base, kb, b, lim, min_lim, kv_end, table_ptr, stride_table, n_cols, kv_idx_ptr, pb,
                          p_cnt, n_indices, k_dim0, stride_kp, stride_kt, offs_n, offs_d, KADDR, False)
            j = (kb - c0) % OUT_W
            acc = tl.where(cols[None, :] == j, m[:, None], acc)
            if (j == OUT_W - 1) | (kb == t_end - 1):
                tl.store(o_ptrs + (kb - j), acc, mask=row_ok[:, None] & ((kb - j + cols) < c1)[None, :])
                acc = tl.full([BLOCK_M, OUT_W], float("-inf"), dtype=tl.float32)
        # tiles crossing some row's visible limit (causal diagonal, end of the context): masked
        for kb in range(t_full, t_end):
            m = _tile_max(q, k_base, kb, b, lim, min_lim, kv_end, table_ptr, stride_table, n_cols, kv_idx_ptr, pb,
                          p_cnt, n_indices, k_dim0, stride_kp, stride_kt, offs_n, offs_d, KADDR, True)
            j = (kb - c0) % OUT_W
            acc = tl.where(cols[None, :] == j, m[:, None], acc)
            if (j == OUT_W - 1) | (kb == t_end - 1):
                tl.store(o_ptrs + (kb - j), acc, mask=row_ok[:, None] & ((kb - j + cols) < c1)[None, :])
                acc = tl.full([BLOCK_M, OUT_W], float("-inf"), dtype=tl.float32)
        # tiles of the chunk past the last visible one: -inf, OUT_W at a time
        w_start = c0 + (t_end - c0 + OUT_W - 1) // OUT_W * OUT_W
        for w0 in range(w_start, c1, OUT_W):
            tl.store(o_ptrs + w0, acc, mask=row_ok[:, None] & ((w0 + cols) < c1)[None, :])


PREFILL_BLOCK_M = 256
"""Rows per program of the prefill launch: 256 (16 warps: each K tile serves twice the
rows of a 128-row program, half the L2 reads; H200 compile 128 registers, no spills, 147
KB shared) or 128 (8 warps). Measured on the H200 (2026-11-29, M3 indexer geometry, bf16,
causal): 32K context 1108 us (496 TFLOP/s, 63% of cuBLAS bf16) against 1403 us at 128
rows; 128K context 16.6 ms against 23.0 ms."""


def max_score_config(max_rows: int, batch_size: int, num_kv_heads: int, num_tiles: int,
                     device: torch.device, prefill_block_m: int | None = None) -> dict:
    """Tile sizes, warps and the key-chunk split for one launch (host ints only)."""
    prefill = max_rows > 64
    block_m = (prefill_block_m or (PREFILL_BLOCK_M if max_rows > 128 else 128)) if prefill else 64
    if block_m not in (64, 128, 256):
        raise ValueError(f"prefill_block_m must be 128 or 256, got {block_m}")
    out_w = 16 if num_tiles >= 16 else next_power_of_2(max(num_tiles, 1))
    row_tiles = cdiv(max(max_rows, 1), block_m)
    programs = batch_size * num_kv_heads * row_tiles
    target = 4 * planning_sm_count(device, 1)  # off the GPU one: fewer programs are faster
    groups = cdiv(num_tiles, out_w)
    chunks = max(1, min(groups, cdiv(target, max(programs, 1))))
    tiles_per_chunk = cdiv(groups, chunks) * out_w
    chunks = cdiv(num_tiles, tiles_per_chunk)
    warps = {64: 4, 128: 8, 256: 16}[block_m]
    return dict(BLOCK_M=block_m, OUT_W=out_w, row_tiles=row_tiles, chunks=chunks, tiles_per_chunk=tiles_per_chunk,
                num_warps=warps, num_stages=3 if prefill else 4)


def max_score_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    max_score: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    kv_page_indptr: torch.Tensor | None,
    qo_offset_value: int | None,
    causal: bool,
    layout: int,
    batch_size: int,
    max_seqlen_q: int,
    prefill_block_m: int | None = None,
) -> None:
    """Launches the max-score kernel on validated tensors (writes every element of
    ``max_score``, rows of this batch only). No host reads: sizes come from the plan.
    ``prefill_block_m`` overrides :data:`PREFILL_BLOCK_M`."""
    total_q, Hq, D = q.shape
    num_tiles = max_score.shape[2]
    if layout == LAYOUT_DENSE:
        Hkv = k.shape[1]
        stride_kp, stride_kt, stride_kh = 0, k.stride(0), k.stride(1)
        kaddr = KADDR_DENSE
    else:
        if layout == LAYOUT_TOKEN_MAJOR:
            Hkv = k.shape[2]
            stride_kp, stride_kt, stride_kh = k.stride(0), k.stride(1), k.stride(2)
        else:
            Hkv = k.shape[1]
            stride_kp, stride_kt, stride_kh = k.stride(0), k.stride(2), k.stride(1)
        kaddr = KADDR_TABLE if page_table is not None else KADDR_FLAT
    ratio = Hq // Hkv
    if qo_offset_value is not None:
        qo_mode = QO_SCALAR
    elif qo_offset is not None:
        qo_mode = QO_TENSOR
    else:
        qo_mode = QO_DEFAULT
    cfg = max_score_config(max_seqlen_q * ratio, batch_size, Hkv, num_tiles, q.device, prefill_block_m)
    dummy = cu_seqlens_q
    grid = (batch_size * Hkv, cfg["row_tiles"], cfg["chunks"])
    launcher(_max_score_fwd_kernel)[grid](
        q, k, max_score,
        cu_seqlens_q, cu_seqlens_k if cu_seqlens_k is not None else dummy, kv_lens,
        qo_offset if qo_offset is not None else dummy,
        page_table if page_table is not None else dummy,
        kv_indices if kv_indices is not None else dummy,
        kv_page_indptr if kv_page_indptr is not None else dummy,
        0 if qo_offset_value is None else qo_offset_value,
        q.stride(0), q.stride(1),
        stride_kp, stride_kt, stride_kh,
        page_table.stride(0) if page_table is not None else 0,
        page_table.shape[1] if page_table is not None else 0,
        kv_indices.shape[0] if kv_indices is not None else 0,
        k.shape[0], q.shape[0],  # pages (paged) or key rows (dense); query rows
        max_score.stride(0), max_score.stride(1),
        num_tiles, cfg["tiles_per_chunk"], cfg["row_tiles"],
        HKV=Hkv, RATIO=ratio, D=D, BLOCK_M=cfg["BLOCK_M"], OUT_W=cfg["OUT_W"],
        KADDR=kaddr, QO_MODE=qo_mode, CAUSAL=causal,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
