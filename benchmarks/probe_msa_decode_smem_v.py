"""Probe (session 20): the MSA fp8 decode with V widened through shared memory, in Gluon.

    python benchmarks/probe_msa_decode_smem_v.py            # H200: A/B against the Triton kernel
    python benchmarks/probe_msa_decode_smem_v.py --compile  # CPU: sm_90 registers / shared memory

The Triton kernel (``sparse_decode.msa_decode_t_kernel``) and the earlier Gluon port (removed in
47a84ef, restored here as ``V_SMEM=False``) both feed P·V's Vᵀ to the fp16 wgmma as a
*register* operand, gathered from the e4m3 tile byte by byte (Triton) or with 32-bit loads and
byte permutes (Gluon). Session 19's diagnosis: with the tile's P·V replaced by an fp8 wgmma of
both operands from shared memory (no gather, no widening) the loop streams at ~92% of copy
against ~87%, while fewer instructions alone (the Gluon port) did not help. ``V_SMEM=True``
widens the tile with 16-byte shared loads into a separate fp16 shared buffer (plain layout,
16-byte stores) and runs P·V as an fp16 wgmma with *both* operands in shared memory (Vᵀ as a
transposed view, which 16-bit wgmma accepts), left in flight across the next tile's Sᵀ issue
and V load. Shared memory: 2 stages (the fp16 buffer takes the third stage's room, so that 4
programs still share an SM); each slot is refilled as soon as its K and V bytes are consumed.

sm_90: smem-V 2 stages 131 registers uncapped (3 programs per SM), 128 with a 128 cap (2 spill
instructions), 55.6 KB; per tile 4 LDS.128 + 32 F2FP + 8 STS.128 for V instead of the register
path's byte permutes (PRMT 121 -> 9 over the two unrolled tiles). H200 (session 20, interleaved, bar
inputs, 268 MB, copy 4260 GB/s; us, every output bit-identical to the Triton kernel's): head-major
Triton 74.3 / again 74.4, Gluon register V (3 stages) 74.9, smem V 98.9 uncapped / 76.1 capped;
token-major 76.7 / 76.8, 78.3, 102.5 / 77.7. Not faster: removed after this run (the result is in
``sparse_decode.DECODE_VARIANT``'s docstring and the performance guide).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

# layout-free helpers of the Triton kernel, called as they are
from mate.ops.msa.softmax_helpers import split_entries
from mate.ops.msa.sparse_decode import token_request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


GLUON_WARPS = 4  # one warpgroup
HEAD_DIM = gl.constexpr(128)


@triton.constexpr_function
def v_load_layout(keys: int) -> gl.DistributedLinearLayout:
    """Register layout of the e4m3 V tile [keys, 128 d] read from shared memory: the wgmma
    A layout of Vᵀ [128 rows, keys] (fp16, ``k_width`` 2, 4 warps) with its row index mapped
    to ``d`` by the permutation of the module docstring. Per thread: bits d1, d2 of four
    registers span 4 consecutive bytes (one 32-bit load per key)."""
    assert keys in (64, 128)
    # wgmma A (DotOperandLayout(0, NVMMA v3 [4, 1], 2)) on [128 m, keys k]:
    #   registers k1, m8, k8, k16, k32 (, k64), m64; lanes k2, k4, m1, m2, m4; warps m16, m32.
    # m -> d: m1, m2, m4 -> d4, d8, d16; m8 -> d1; m16, m32 -> d32, d64; m64 -> d2.
    kbits = [[1 << i, 0] for i in range(3, keys.bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [0, 1]] + kbits + [[0, 2]],
        lane_bases=[[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]],
        warp_bases=[[0, 32], [0, 64]],
        block_bases=[],
        shape=[keys, HEAD_DIM.value],
    )


@triton.constexpr_function
def red_layout(gp: int) -> gl.DistributedLinearLayout:
    """Layout of the per-warp partial maxima [4 warps, gp heads] read back from shared memory:
    every thread holds the 4 partials of the head columns it owns in the Sᵀ accumulator."""
    nbits = [[0, 1], [0, 8]] + [[0, 1 << i] for i in range(4, gp.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0]] + nbits,
                                      lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
                                      warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, gp])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _token_block_list(t, split, ubase, idx_row, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
                      page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages,
                      W, u_page_ptr, u_blk_ptr, cnt_ptr,
                      BLOCK_W: gl.constexpr, NUM_SPLITS: gl.constexpr, CAUSAL: gl.constexpr,
                      USE_PAGE_TABLE: gl.constexpr, HAS_QO_OFFSET: gl.constexpr):
    """``sparse_decode.token_block_list`` (same entries, order and slots): returns (position,
    KV length, kept count); the count is read back from ``cnt_ptr`` after a CTA barrier, which
    also makes the entries visible to every thread."""
    L2: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0])
    LR: gl.constexpr = gl.SliceLayout(1, L2)
    LC: gl.constexpr = gl.SliceLayout(0, L2)
    tvalid = t < gl.load(qo_indptr_ptr + B)
    w = gl.arange(0, BLOCK_W, layout=LR)
    wc = gl.arange(0, BLOCK_W, layout=LC)
    ids = gl.load(idx_row + w, mask=tvalid & (w < W), other=-1)
    ids_c = gl.load(idx_row + wc, mask=tvalid & (wc < W), other=-1)
    pos, kv_len, page, valid = token_request(
        t, tvalid, ids, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter, page_table_ptr, stride_pt, n_cols,
        kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, USE_PAGE_TABLE, HAS_QO_OFFSET, CAUSAL)
    # one request: equal ids have equal pages and validity (see token_block_list)
    dup = gl.max(((ids[:, None] == ids_c[None, :]) & (wc[None, :] < w[:, None])).to(gl.int32), axis=1)
    first = (valid & (dup == 0)).to(gl.int32)
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # scans need a plain layout
    slot = gl.convert_layout(gl.associative_scan(gl.convert_layout(first, L1), 0, _add), LR) - 1
    cnt = gl.sum(first, axis=0)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    mine = (first != 0) & (slot >= e0) & (slot < e1)
    gl.store(u_page_ptr + ubase + slot, page, mask=mine)
    gl.store(u_blk_ptr + ubase + slot, ids, mask=mine)
    gl.store(cnt_ptr, cnt)
    gl.thread_barrier()  # the loop's threads read entries other threads wrote
    return pos, kv_len, gl.load(cnt_ptr)


@gluon.jit
def _vt_operand(v_slot, V_L: gl.constexpr, A_L: gl.constexpr, KEYS: gl.constexpr):
    """Vᵀ of one ring slot as the fp16 register A operand (rows in the permuted d order)."""
    v = v_slot.load(V_L).to(gl.float16)  # [KEYS, 128 d], exact
    vt = gl.permute(v, (1, 0))  # [d, KEYS]
    vt = gl.reshape(vt, (4, 8, 2, 2, KEYS))  # d = 32 w + 4 g + 2 r + h
    vt = gl.permute(vt, (2, 0, 3, 1, 4))  # (r, w, h, g): m = 64 r + 16 w + 8 h + g
    vt = gl.reshape(vt, (HEAD_DIM, KEYS))
    return gl.convert_layout(vt, A_L, assert_trivial=True)


@gluon.jit
def _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page, tile, kvh, n_kvh,
                KEYS: gl.constexpr, KPB: gl.constexpr, HEAD_MAJOR: gl.constexpr):
    """TMA loads of the K and V tile ``tile`` (keys (tile % KPB) * KEYS of page ``page``)."""
    k0 = (tile % KPB) * KEYS
    if HEAD_MAJOR:
        row = (page * n_kvh + kvh) * 128 + k0
        col = 0
    else:
        row = page * 128 + k0
        col = kvh * HEAD_DIM
    bar = ready.index(slot)
    mbarrier.expect(bar, 2 * KEYS * HEAD_DIM)
    tma.async_copy_global_to_shared(k_desc, [row, col], bar, k_ring.index(slot))
    tma.async_copy_global_to_shared(v_desc, [row, col], bar, v_ring.index(slot))


@gluon.jit
def _tile(i, first, n_tiles, last, ubase, blk, m_i, l_k, acc, q_t, s_zero, offs_n, limit, qk_scale,
          k_desc, v_desc, k_ring, v_ring, ready, p_buf, f_buf, red_smem, v16, u_page_ptr, u_blk_ptr, kvh, n_kvh,
          GP: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr, HEAD_MAJOR: gl.constexpr,
          LAZY: gl.constexpr, V_SMEM: gl.constexpr):
    """Tile ``i`` of this program (P and the flags go to this parity's buffers ``p_buf`` /
    ``f_buf``). Returns (block of tile i + 1, m_i, l_k, acc); with ``V_SMEM`` acc is the
    accumulator of a P·V wgmma still in flight."""
    KPB: gl.constexpr = 128 // KEYS
    NW: gl.constexpr = 4
    RED_L: gl.constexpr = red_layout(GP)
    F_L: gl.constexpr = gl.BlockedLayout([NW], [32], [NW], [0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 16])
    slot = i % STAGES
    tile = first + i
    blk_next = gl.load(u_blk_ptr + ubase + gl.minimum(tile + 1, last) // KPB)
    page_r = gl.load(u_page_ptr + ubase + gl.minimum(tile + STAGES, last) // KPB)  # of the refill
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    s = warpgroup_mma(k_ring.index(slot), q_t, s_zero, use_acc=False, is_async=True)
    if V_SMEM:
        VB_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # 16-byte vectors, 8 per row
        v8 = v_ring.index(slot).load(VB_L)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))  # this Sᵀ and the last tile's P·V
    else:
        A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        vt = _vt_operand(v_ring.index(slot), v_load_layout(KEYS), A_L, KEYS)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    kpos = blk * 128 + (tile % KPB) * KEYS + offs_n
    s = gl.where((kpos <= limit)[:, None], s * qk_scale, float("-inf"))
    unset = m_i == float("-inf")
    m_use = gl.where(unset, 0.0, m_i)
    x = s - m_use[None, :]
    p = gl.exp2(x)
    # the exponent itself is tested (s > m + LAZY rounds for |m| >= 2^27); -inf: any finite logit
    thr = gl.where(unset, float("-inf"), LAZY + 0.0)
    hit = (x > thr[None, :]).to(gl.int32)
    f_buf.store(gl.max(gl.max(gl.reshape(hit, (KEYS // 64, NW, 16 * GP)), axis=2), axis=0))  # per warp
    p_buf.store(p.to(gl.float16))
    if V_SMEM:
        v16.store(v8.to(gl.float16))  # exact for e4m3; the last P·V (its reader) is complete
    fence_async_shared()
    gl.thread_barrier()  # P, the flags and V16 published; every warp is done with this slot
    if i + STAGES < n_tiles:
        _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page_r, tile + STAGES, kvh, n_kvh,
                    KEYS, KPB, HEAD_MAJOR)
    if gl.max(f_buf.load(F_L), axis=0) != 0:  # a logit above the reference max + LAZY: rescale
        pm = gl.max(gl.max(gl.reshape(s, (KEYS // 64, NW, 16, GP)), axis=2), axis=0)  # [4 warps, GP]
        red_smem.store(pm)
        gl.thread_barrier()
        mx = gl.convert_layout(gl.max(red_smem.load(RED_L), axis=0), gl.SliceLayout(0, S_L))
        m_new = gl.maximum(m_i, mx)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_use[None, :])
        alpha = gl.exp2(m_i - m_use)
        l_k = l_k * alpha[None, :]
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        m_i = m_new
        p_buf.store(p.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
    l_k = l_k + p
    if V_SMEM:
        acc = warpgroup_mma(v16.permute((1, 0)), p_buf, acc, is_async=True)  # waited for at the next tile
    else:
        acc = warpgroup_mma(vt, p_buf, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return blk_next, m_i, l_k, acc


@gluon.jit
def msa_decode_gluon_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    u_page_ptr, u_blk_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale,
    idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, W,
    GP: gl.constexpr, C: gl.constexpr, NUM_SPLITS: gl.constexpr, CAUSAL: gl.constexpr,
    HEAD_MAJOR: gl.constexpr, KEYS: gl.constexpr = 64, STAGES: gl.constexpr = 3, BLOCK_W: gl.constexpr = 16,
    USE_PAGE_TABLE: gl.constexpr = True, HAS_QO_OFFSET: gl.constexpr = False, LAZY: gl.constexpr = 8,
    V_SMEM: gl.constexpr = True,
):
    """Grid (tokens, KV heads, splits), 4 warps; the arguments of ``msa_decode_t_kernel``
    (contiguous caches as 2D TMA views, e4m3 q / K / V)."""
    gl.static_assert(LAZY > 0, "the Gluon kernel implements the lazy rescale only (LAZY > 0)")
    t = gl.program_id(0)
    kvh = gl.program_id(1)
    split = gl.program_id(2)
    n_kvh = gl.num_programs(1)
    KPB: gl.constexpr = 128 // KEYS
    Q_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, GP], gl.float16)
    F_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    KV_SL: gl.constexpr = k_desc.layout
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 16])

    # Q [GP heads, 128] e4m3 (padded heads read as 0): the K-major B operand of Sᵀ = K·Qᵀ;
    # loaded first, its latency overlaps the list's
    offs_hq = gl.arange(0, GP, layout=gl.SliceLayout(1, Q_L))
    offs_dq = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, Q_L))
    q = gl.load(q_ptr + t.to(gl.int64) * stride_qt + (kvh * RATIO + offs_hq)[:, None] * stride_qh
                + offs_dq[None, :], mask=(offs_hq < RATIO)[:, None], other=0.0)
    ubase = (t.to(gl.int64) * n_kvh + kvh) * C
    pos, kv_len, cnt = _token_block_list(
        t, split, ubase, idx_ptr + t.to(gl.int64) * stride_it + kvh * stride_ih, qo_indptr_ptr, kv_lens_ptr,
        qo_offset_ptr, B, n_iter, page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices,
        num_pages, W, u_page_ptr, u_blk_ptr, u_cnt_ptr + t * n_kvh + kvh, BLOCK_W, NUM_SPLITS, CAUSAL,
        USE_PAGE_TABLE, HAS_QO_OFFSET)
    limit = kv_len - 1
    if CAUSAL:
        limit = gl.minimum(limit, pos)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    first = e0 * KPB
    n_tiles = gl.maximum(e1 - e0, 0) * KPB
    last = first + gl.maximum(n_tiles, 1) - 1  # n_tiles = 0: an index < C, never used

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [GP, HEAD_DIM], Q_SL, q)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    p0 = gl.allocate_shared_memory(gl.float16, [KEYS, GP], P_SL)
    p1 = gl.allocate_shared_memory(gl.float16, [KEYS, GP], P_SL)
    f0 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    f1 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    red_smem = gl.allocate_shared_memory(gl.float32, [4, GP], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    V16_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HEAD_DIM], gl.float16)
    if V_SMEM:
        v16 = gl.allocate_shared_memory(gl.float16, [KEYS, HEAD_DIM], V16_SL)
    else:
        v16 = p0  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    fence_async_shared()
    gl.thread_barrier()
    for j in gl.static_range(STAGES):  # prologue: STAGES tiles in flight
        if j < n_tiles:
            page = gl.load(u_page_ptr + ubase + (first + j) // KPB)
            _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, j, page, first + j, kvh, n_kvh, KEYS, KPB,
                        HEAD_MAJOR)

    offs_n = gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_L))
    m_i = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
    l_k = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    acc = gl.zeros([HEAD_DIM, GP], gl.float32, layout=O_L)
    if V_SMEM:
        acc = warpgroup_mma_init(acc)  # loop-carried as an accumulator: the last P·V stays in flight
    s_zero = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    q_t = q_smem.permute((1, 0))
    blk = gl.load(u_blk_ptr + ubase + first // KPB, mask=n_tiles > 0, other=0)
    for i0 in range(0, n_tiles, 2):  # unrolled by two: P / flag buffers of each parity
        blk, m_i, l_k, acc = _tile(i0, first, n_tiles, last, ubase, blk, m_i, l_k, acc, q_t, s_zero, offs_n, limit,
                                   qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p0, f0, red_smem, v16,
                                   u_page_ptr, u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY, V_SMEM)
        if i0 + 1 < n_tiles:
            blk, m_i, l_k, acc = _tile(i0 + 1, first, n_tiles, last, ubase, blk, m_i, l_k, acc, q_t, s_zero, offs_n,
                                       limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p1, f1, red_smem,
                                       v16, u_page_ptr, u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY,
                                       V_SMEM)

    if V_SMEM:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    l_i = gl.sum(l_k, axis=0)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    # un-permute the rows: m = 64 r + 16 w + 8 h + g holds d = 32 w + 4 g + 2 r + h
    m = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, O_L))
    if V_SMEM:
        d = m  # Vᵀ rows in the natural order
    else:
        d = ((m >> 4) & 3) * 32 + (m & 7) * 4 + (m >> 6) * 2 + ((m >> 3) & 1)
    hl = gl.arange(0, GP, layout=gl.SliceLayout(0, O_L))
    hvalid = hl < RATIO
    h = kvh * RATIO + hl
    l_o = gl.convert_layout(l_safe, gl.SliceLayout(0, O_L))
    hl_s = gl.arange(0, GP, layout=gl.SliceLayout(0, S_L))
    if NUM_SPLITS == 1:
        o = acc / l_o[None, :] * v_scale
        gl.store(o_ptr + t.to(gl.int64) * stride_ot + h[None, :] * stride_oh + d[:, None],
                 o.to(o_ptr.dtype.element_ty), mask=hvalid[None, :])
        gl.store(lse_ptr + t.to(gl.int64) * stride_lt + kvh * RATIO + hl_s, lse, mask=hl_s < RATIO)
    else:
        o = acc / l_o[None, :]
        prow = (split.to(gl.int64) * total_q + t) * HQ + h
        gl.store(op_ptr + prow[None, :] * HEAD_DIM + d[:, None], o, mask=hvalid[None, :])
        prow_s = (split.to(gl.int64) * total_q + t) * HQ + kvh * RATIO + hl_s
        gl.store(lp_ptr + prow_s, lse, mask=hl_s < RATIO)


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, layout: str, hkv: int, keys: int):
    """2D TMA descriptors ([keys, 128] boxes, 128-byte swizzle) of contiguous e4m3 caches."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = HEAD_DIM.value
    kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    kv2 = [x.view(-1, d) if layout == "HND" else x.view(-1, hkv * d) for x in (k, v)]
    return [TensorDescriptor(x, list(x.shape), list(x.stride()), [keys, d], kv_sl) for x in kv2]


class GluonSwap:
    """Stands in for ``sparse_decode.msa_decode_t_kernel`` where ``sparse_attention`` launches it:
    the same positional arguments, the Triton TMA descriptors replaced by Gluon ones of the same
    tensors (contiguous e4m3 caches, 2D views)."""

    def __init__(self, v_smem: bool, stages: int, maxnreg: int | None = None):
        self.v_smem, self.stages = v_smem, stages
        self.extra = {"maxnreg": maxnreg} if maxnreg else {}

    def __getitem__(self, grid):
        def launch(*args, **kw):
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
            descs = [TensorDescriptor(dsc.base, list(dsc.shape), list(dsc.strides), list(dsc.block_shape), kv_sl)
                     for dsc in args[3:5]]
            assert kw["FLAT"] and kw["IS_FP8"] and kw["KEYS"] == 64, kw
            msa_decode_gluon_kernel[grid](
                *args[:3], *descs, *args[5:], GP=kw["GP"], C=kw["C"], NUM_SPLITS=kw["NUM_SPLITS"],
                CAUSAL=kw["CAUSAL"], HEAD_MAJOR=kw["HEAD_MAJOR"], KEYS=64, STAGES=self.stages,
                BLOCK_W=kw["BLOCK_W"], USE_PAGE_TABLE=kw["USE_PAGE_TABLE"], HAS_QO_OFFSET=kw["HAS_QO_OFFSET"],
                LAZY=kw["LAZY"], V_SMEM=self.v_smem, num_warps=GLUON_WARPS, **self.extra)

        return launch


def compile_sm90(keys: int = 64, stages: int = 2, splits: int = 1, gp: int = 16, head_major: bool = False,
                 lazy: int = 8, block_w: int = 16, use_page_table: bool = True, v_smem: bool = True,
                 out_dir: str | None = None):
    """Compiles the kernel for the H200 (sm_90) without a GPU (M3 tile, bf16 output, causal);
    returns :class:`mate.testing.sass.SassReport`."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from mate.testing.sass import compile_sm90 as _compile
    from mate.testing.sass import divisibility_attrs

    kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    desc = f"tensordesc<fp8e4nv[{keys}, 128],{kv_sl}>"
    sig = {"q_ptr": "*fp8e4nv", "stride_qt": "i32", "stride_qh": "i32", "k_desc": desc, "v_desc": desc,
           "u_page_ptr": "*i32", "u_blk_ptr": "*i32", "u_cnt_ptr": "*i32",
           "o_ptr": "*bf16", "stride_ot": "i32", "stride_oh": "i32", "lse_ptr": "*fp32", "stride_lt": "i32",
           "op_ptr": "*fp32", "lp_ptr": "*fp32", "total_q": "i32", "HQ": "i32", "RATIO": "i32",
           "qk_scale": "fp32", "v_scale": "fp32",
           "idx_ptr": "*i32", "stride_it": "i32", "stride_ih": "i32", "qo_indptr_ptr": "*i32",
           "kv_lens_ptr": "*i32", "qo_offset_ptr": "*i32", "B": "i32", "n_iter": "i32", "page_table_ptr": "*i32",
           "stride_pt": "i32", "n_cols": "i32", "kv_indices_ptr": "*i32", "kv_page_indptr_ptr": "*i32",
           "n_indices": "i32", "num_pages": "i32", "W": "i32"}
    ce = dict(GP=gp, C=block_w, NUM_SPLITS=splits, CAUSAL=True, HEAD_MAJOR=head_major, KEYS=keys, STAGES=stages,
              BLOCK_W=block_w, USE_PAGE_TABLE=use_page_table, HAS_QO_OFFSET=False, LAZY=lazy, V_SMEM=v_smem)
    sig.update({n: "constexpr" for n in ce})
    aligned = ("q_ptr", "u_page_ptr", "u_blk_ptr", "u_cnt_ptr", "o_ptr", "lse_ptr", "op_ptr", "lp_ptr", "stride_qt",
               "stride_qh", "stride_ot", "stride_oh", "stride_lt", "idx_ptr", "qo_indptr_ptr", "kv_lens_ptr",
               "page_table_ptr")
    src = GluonASTSource(fn=msa_decode_gluon_kernel, signature=sig, constexprs=ce,
                         attrs=divisibility_attrs(sig, aligned))
    tag = f"msa_decode_smem_v_k{keys}_s{stages}_v{int(v_smem)}_hm{int(head_major)}"
    return _compile(src, {"num_warps": GLUON_WARPS}, out_dir=out_dir, tag=tag, ptxas=True,
                    keep_text=out_dir is not None)


def _compile_report() -> None:
    from mate.testing.sass import opcode_counts

    for v_smem, stages in ((True, 2), (True, 3), (False, 3)):
        rep = compile_sm90(stages=stages, v_smem=v_smem)
        ops = opcode_counts(rep.sass)
        pick = {k: v for k, v in ops.items() if "GMMA" in k or k.startswith(("LDS", "STS", "BAR", "F2FP", "PRMT"))}
        print(f"v_smem={int(v_smem)} stages={stages}: {rep.registers} regs, {rep.spills} spill instr, "
              f"{rep.shared} B shared, {sum(ops.values())} instr; {pick}; ptxas: {rep.ptxas_warnings[:2]}",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="sm_90 build report only (no GPU)")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if args.compile:
        _compile_report()
        return 0
    from bench_msa_attention import HKV, HQ, decode_inputs

    from mate.ops.msa import sparse_decode as sd
    from mate.ops.msa.sparse_attention import sparse_attention
    from mate.testing.bench import measure_ceilings, time_interleaved

    ceil = measure_ceilings()
    copy = ceil["copy_GBps"]
    pb = decode_inputs(128, 65536, torch.float8_e4m3fn)
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    qo, kvl = pb["qo_indptr"], pb["kv_lens"]
    B, sel = q.shape[0], idx.shape[-1]
    nbytes = 2.0 * B * HKV * sel * 128 * 128
    k_hm, v_hm = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))
    real = sd.msa_decode_t_kernel
    outs = {}

    def call(name, kernel, hm):
        out = torch.empty(B, HQ, 128, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(B, HQ, device="cuda")
        outs[name] = (out, lse)

        def run():
            sd.msa_decode_t_kernel = kernel
            try:
                kk, vv = (k_hm, v_hm) if hm else (k, v)
                sparse_attention(q, kk, vv, kv_block_indexes=idx, page_table=table, qo_indptr=qo, kv_lens=kvl,
                                 out=out, lse=lse, causal=True, decode=True, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = real
        return run

    # smem-V, 2 stages: 131 registers uncapped (3 programs per SM), 128 with 2 spill instructions capped
    variants = {"triton": real, "gluon reg-V 3st": GluonSwap(False, 3), "gluon smem-V 2st": GluonSwap(True, 2),
                "gluon smem-V 2st r128": GluonSwap(True, 2, 128)}
    cases = {}
    for hm in (True, False):
        for vn, kern in variants.items():
            name = f"{'HND' if hm else 'NHD'} {vn}"
            cases[name] = call(name, kern, hm)
        cases[f"{'HND' if hm else 'NHD'} triton again"] = call(f"{'HND' if hm else 'NHD'} triton again", real, hm)
    times = time_interleaved(cases, iters=args.iters)
    from bench_msa_fp8_decode_variants import reference

    ro, rl = reference(pb)
    print(f"copy {copy:.0f} GB/s, {nbytes / 1e6:.0f} MB of selected K/V")
    print(f"{'case':26} {'us':>8} {'%copy':>6} {'max|out-ref|':>13} {'max|lse-ref|':>13} {'bits = triton':>14}")
    for name, t in times.items():
        o, l_ = outs[name]
        if isinstance(t, Exception):
            print(f"{name:26} FAILED {str(t)[:600]}")
            continue
        base = outs[name.split()[0] + " triton"]
        same = bool(torch.equal(o, base[0]) and torch.equal(l_, base[1]))
        err_o = (o.float() - ro.float()).abs().max().item()
        err_l = (l_ - rl).abs().max().item()
        print(f"{name:26} {t:8.1f} {nbytes / t / 1e3 / copy:6.1%} {err_o:13.2e} {err_l:13.2e} {str(same):>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
