"""Probe (session 23): the fp8 MSA decode in Gluon with P·V on FP8 tensor cores.

    python benchmarks/probe_msa_decode_fp8_pv.py            # H200: A/B against the Triton kernel
    python benchmarks/probe_msa_decode_fp8_pv.py --compile  # CPU: sm_90 registers / spills / SASS

The Triton kernel (``sparse_decode.msa_decode_t_kernel``) widens every e4m3 V tile to fp16 for
an fp16 P·V (64 LDS.U8 byte gathers, 32 F2FP and the packing per thread and 64-key tile);
FP8 P·V cannot be written there (``tl.dot(tl.trans(v), p_e4m3)`` compiles to a round trip of V
through shared memory). This kernel keeps Vᵀ e4m3 as the 8-bit register A operand, as the small-H
sparse MLA kernel does (``decode_gluon_small_h._vt_e4m3``): each thread loads 4 contiguous values
of 16 keys (16 LDS.32 per 64-key tile), byte-transposes each 4 x 4 block (8 PRMT per 4 words) and
the rest is a renaming of registers. P is staged as hi = e4m3(s P) and lo = e4m3(s P - hi), two
QGMMAs on the same Vᵀ (~2^-8 relative in P). The lazy softmax keeps P <= 2^LAZY, so the scale is
s = 2^(8 - LAZY) (s P <= 256 < 448) and LAZY is small (2 by default).

Everything else is the removed Gluon port of the transposed kernel (47a84ef, restored in 6d1ad15's
probe): in-kernel block list, lazy rescale with the grow flags published by the barrier that
publishes P, 3-stage TMA ring, loop unrolled by two for the P / flag buffers.

sm_90 (``--compile``): 109 registers (123 with the P·V left in flight across the next tile's Sᵀ,
``defer``), no spills, 55.6 KB (4 programs per SM); per 64-key tile 8 LDS.32 + 28 PRMT for Vᵀ and
8 QGMMA for P·V, ~300 instructions on the common path (Triton kernel 482). 128-key tiles: 194
registers, 2 programs per SM, not timed.

H200 (session 23, call 1 of ``benchmarks/results/2026-11-30-h200-s23-probes.txt``; bar inputs,
268 MB, copy 4261 GB/s, interleaved, us): head-major Triton 80.4 / again 80.0, FP8 P·V 80.9,
deferred 80.9, lazy 1 80.8, lazy 4 81.2; token-major Triton 77.3 / 77.1, FP8 P·V 77.1, deferred
77.1, lazy 1 76.9, lazy 4 77.3 (max |out - ref| 5.6e-4 against 1.3e-4, LSE identical, no NaN).
No gain: with the widening, its byte gathers and ~180 instructions per tile gone, the loop takes
the Triton kernel's time.

``--trace``: a %globaltimer timeline of one launch (per program: start, block list built, prologue
issued, first tile landed, key loop done, end; its SM), of this kernel and of a load-only variant
(``LOAD_ONLY``: each tile released as soon as it lands). H200 (call 2; head-major, graph-timed
Triton 71.4 us, this kernel 71.3, load-only 68.0): the launch spans 67.7 us from the first
program's start; building the block list takes 1.8-2.5 us and the first tile lands 0.8-8.7 us
later, so DRAM is nearly idle for the first ~3 us; the key loop of programs with the same 32
tiles takes 41.7 to 61.3 us (median 55.7): programs on about a fifth of the SMs finish ~15 us
before the rest, and for the last ~20 us of the launch 10-20% of the programs, then more, are
done. The load-only kernel shows the same spread (loop 41.9-60.2 us, span 64.8), so the spread
is the SMs' unequal share of the memory system, not the decode's compute. Balancing it by work
stealing was slower (``probe_msa_decode_steal.py`` in git history, session 23).
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

from mate.ops.msa.softmax_helpers import split_entries
from mate.ops.msa.sparse_decode import publish_entries, token_request
from mate.ops.sparse_mla.decode_gluon_small_h import _transpose_bytes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GLUON_WARPS = 4  # one warpgroup
HEAD_DIM = gl.constexpr(128)


@triton.constexpr_function
def v_load_layout(keys: int) -> gl.DistributedLinearLayout:
    """Register layout of the e4m3 V tile [keys, 128 d] read from the ring: registers = 4
    contiguous values (one 32-bit load) of rows +1, +8, +16, +32 (, +64); lanes = rows +2, +4,
    values +4, +8, +16; warps = values +32, +64 (see ``_vt_e4m3_128``)."""
    rows = [[1, 0]] + [[1 << i, 0] for i in range(3, keys.bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2]] + rows,
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
    dup = gl.max(((ids[:, None] == ids_c[None, :]) & (wc[None, :] < w[:, None])).to(gl.int32), axis=1)
    first = valid & (dup == 0)
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # scans need a plain layout
    slot = gl.convert_layout(gl.associative_scan(gl.convert_layout(first.to(gl.int32), L1), 0, _add), LR) - 1
    cnt = gl.sum(first.to(gl.int32), axis=0)
    return pos, kv_len, publish_entries(first, slot, cnt, page, ids, split, ubase, u_page_ptr, u_blk_ptr, cnt_ptr,
                                        NUM_SPLITS)


@gluon.jit
def _vt_e4m3_128(v, A_L: gl.constexpr):
    """The e4m3 V tile [KEYS, 128] in ``v_load_layout`` as the 8-bit A operand Vᵀ [128, KEYS],
    not widened: each word (4 values of one key) is byte-transposed with the words of keys
    r + 1, r + 8, r + 9, so that a word holds 4 keys of one value (k bits, high to low: keys
    +64 +32 +16 +4 +2 +1 +8, as ``_stage_p8`` orders P); rows of Oᵀ hold value ``_perm_d(m)``."""
    KEYS: gl.constexpr = v.shape[0]
    v = gl.reshape(v, [KEYS // 16, 2, 2, 2, 2, 128])  # [BH, b3, b2, b1, b0, d]
    v = gl.permute(v, (0, 2, 3, 5, 1, 4))  # [BH, b2, b1, d, b3, b0]
    v_0, v_1 = gl.split(v)
    a0, a1 = gl.split(v_0)
    a2, a3 = gl.split(v_1)
    o0, o1, o2, o3 = _transpose_bytes(a0, a1, a2, a3)  # word byte i = b3 + 2 b0
    t = gl.join(gl.join(o0, o1), gl.join(o2, o3))  # [BH, b2, b1, 4q + i, j0, j1]: value 4q + j
    t = gl.reshape(t, [KEYS // 16, 2, 2, 2, 2, 8, 2, 2, 2, 2])  # [BH b2 b1 | d6 d5 D432 | b0 b3 | d0 d1]
    t = gl.permute(t, (9, 3, 4, 8, 5, 0, 1, 2, 6, 7))  # m = d1 d6 d5 d0 D432, k = BH b2 b1 b0 b3
    t = gl.reshape(t, [128, KEYS])
    return gl.convert_layout(t, A_L, assert_trivial=True)


@gluon.jit
def _perm_d(m):
    """Value index held by row ``m`` of Oᵀ (bits of m, high to low: d1 d6 d5 d0 d4 d3 d2)."""
    return ((m & 7) << 2) | ((m >> 3) & 1) | (((m >> 4) & 3) << 5) | (((m >> 6) & 1) << 1)


@gluon.jit
def _stage_p8(p_buf, p, P_SCALE: gl.constexpr):
    """P [KEYS, GP] as Pᵀ hi / lo e4m3 tiles [2 GP, KEYS] (keys in ``_vt_e4m3_128``'s k order):
    hi = e4m3(P_SCALE P), lo = e4m3(P_SCALE P - hi); one store of both."""
    KEYS: gl.constexpr = p.shape[0]
    GP: gl.constexpr = p.shape[1]
    p = gl.reshape(p, [KEYS // 16, 2, 2, 2, 2, GP])  # [BH, b3, b2, b1, b0, h]
    p = gl.permute(p, (0, 2, 3, 4, 1, 5))  # [BH, b2, b1, b0, b3, h]
    p = gl.reshape(p, [KEYS, GP])
    ps = p * P_SCALE
    hi = ps.to(gl.float8e4nv)
    lo = (ps - hi.to(gl.float32)).to(gl.float8e4nv)
    p_buf.store(gl.reshape(gl.permute(gl.join(hi, lo), (2, 1, 0)), [2 * GP, KEYS]))


@gluon.jit
def _stamp(row, k: gl.constexpr, dep):
    """Stores %globaltimer (ns) into ``row[k]`` (``dep``: any scalar, so the asm has an operand)."""
    now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64, is_pure=False,
                                    pack=1)
    gl.store(row + k, now)


@gluon.jit
def _smid(dep):
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=gl.int32, is_pure=True, pack=1)


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
          k_desc, v_desc, k_ring, v_ring, ready, p_buf, f_buf, red_smem, u_page_ptr, u_blk_ptr, kvh, n_kvh,
          GP: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr, HEAD_MAJOR: gl.constexpr,
          LAZY: gl.constexpr, P_SCALE: gl.constexpr, PV_DEFER: gl.constexpr, LOAD_ONLY: gl.constexpr = False):
    """Tile ``i`` of this program (P and the flags go to this parity's buffers). Returns (block
    of tile i + 1, m_i, l_k, acc); with ``PV_DEFER`` the P·V wgmmas are left in flight (waited
    for with the next tile's Sᵀ)."""
    KPB: gl.constexpr = 128 // KEYS
    NW: gl.constexpr = 4
    RED_L: gl.constexpr = red_layout(GP)
    F_L: gl.constexpr = gl.BlockedLayout([NW], [32], [NW], [0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4)
    slot = i % STAGES
    tile = first + i
    blk_next = gl.load(u_blk_ptr + ubase + gl.minimum(tile + 1, last) // KPB)
    page_r = gl.load(u_page_ptr + ubase + gl.minimum(tile + STAGES, last) // KPB)  # of the refill
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    if LOAD_ONLY:  # the floor: the tile is released as soon as it landed (outputs meaningless)
        gl.thread_barrier()
        if i + STAGES < n_tiles:
            _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page_r, tile + STAGES, kvh, n_kvh,
                        KEYS, KPB, HEAD_MAJOR)
        return blk_next, m_i, l_k, acc
    s = warpgroup_mma(k_ring.index(slot), q_t, s_zero, use_acc=False, is_async=True)
    vt = _vt_e4m3_128(v_ring.index(slot).load(v_load_layout(KEYS)), A_L)
    if PV_DEFER:
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))  # this Sᵀ and the last tile's P·V
    else:
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
    _stage_p8(p_buf, p, P_SCALE)
    fence_async_shared()
    gl.thread_barrier()  # P and the flags published; every warp is done with this slot
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
        _stage_p8(p_buf, p, P_SCALE)
        fence_async_shared()
        gl.thread_barrier()
    l_k = l_k + p
    acc = warpgroup_mma(vt, p_buf.slice(0, GP, dim=0).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(vt, p_buf.slice(GP, GP, dim=0).permute((1, 0)), acc, is_async=True)
    if not PV_DEFER:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return blk_next, m_i, l_k, acc


@gluon.jit
def msa_decode_fp8_pv_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    u_page_ptr, u_blk_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale,
    idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, W, trace_ptr,
    GP: gl.constexpr, C: gl.constexpr, NUM_SPLITS: gl.constexpr, CAUSAL: gl.constexpr,
    HEAD_MAJOR: gl.constexpr, KEYS: gl.constexpr = 64, STAGES: gl.constexpr = 3, BLOCK_W: gl.constexpr = 16,
    USE_PAGE_TABLE: gl.constexpr = True, HAS_QO_OFFSET: gl.constexpr = False, LAZY: gl.constexpr = 2,
    PV_DEFER: gl.constexpr = False, TRACE: gl.constexpr = False, LOAD_ONLY: gl.constexpr = False,
):
    """Grid (tokens, KV heads, splits), 4 warps; the arguments of ``msa_decode_t_kernel``
    (contiguous caches as 2D TMA views, e4m3 q / K / V)."""
    gl.static_assert(LAZY > 0, "the lazy rescale only (LAZY > 0)")
    gl.static_assert(LAZY <= 8, "P_SCALE = 2^(8 - LAZY) keeps P_SCALE * P <= 256")
    P_SCALE: gl.constexpr = float(2 ** (8 - LAZY))
    t = gl.program_id(0)
    kvh = gl.program_id(1)
    split = gl.program_id(2)
    n_kvh = gl.num_programs(1)
    trace_row = trace_ptr + ((split * gl.num_programs(1) + kvh) * gl.num_programs(0) + t).to(gl.int64) * 8
    if TRACE:
        _stamp(trace_row, 0, t)
        gl.store(trace_row + 7, _smid(t).to(gl.int64))
    KPB: gl.constexpr = 128 // KEYS
    Q_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    P_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=KEYS, element_bitwidth=8, rank=2)
    F_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    KV_SL: gl.constexpr = k_desc.layout
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])

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
    if TRACE:
        _stamp(trace_row, 1, t)
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
    p0 = gl.allocate_shared_memory(gl.float8e4nv, [2 * GP, KEYS], P_SL)
    p1 = gl.allocate_shared_memory(gl.float8e4nv, [2 * GP, KEYS], P_SL)
    f0 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    f1 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    red_smem = gl.allocate_shared_memory(gl.float32, [4, GP], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
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
    if PV_DEFER:
        acc = warpgroup_mma_init(acc)  # loop-carried as an accumulator: the last P·V stays in flight
    s_zero = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    q_t = q_smem.permute((1, 0))
    blk = gl.load(u_blk_ptr + ubase + first // KPB, mask=n_tiles > 0, other=0)
    if TRACE:
        _stamp(trace_row, 2, t)
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)  # the first tile landed (the loop's wait then passes at once)
        _stamp(trace_row, 3, t)
    for i0 in range(0, n_tiles, 2):  # unrolled by two: P / flag buffers of each parity
        blk, m_i, l_k, acc = _tile(i0, first, n_tiles, last, ubase, blk, m_i, l_k, acc, q_t, s_zero, offs_n, limit,
                                   qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p0, f0, red_smem,
                                   u_page_ptr, u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY, P_SCALE,
                                   PV_DEFER, LOAD_ONLY)
        if i0 + 1 < n_tiles:
            blk, m_i, l_k, acc = _tile(i0 + 1, first, n_tiles, last, ubase, blk, m_i, l_k, acc, q_t, s_zero, offs_n,
                                       limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p1, f1, red_smem,
                                       u_page_ptr, u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY,
                                       P_SCALE, PV_DEFER, LOAD_ONLY)
    if PV_DEFER:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if TRACE:
        _stamp(trace_row, 4, t)

    l_i = gl.sum(l_k, axis=0)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    m = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, O_L))
    d = _perm_d(m)
    hl = gl.arange(0, GP, layout=gl.SliceLayout(0, O_L))
    hvalid = hl < RATIO
    h = kvh * RATIO + hl
    l_o = gl.convert_layout(l_safe * P_SCALE, gl.SliceLayout(0, O_L))  # acc holds P_SCALE O
    hl_s = gl.arange(0, GP, layout=gl.SliceLayout(0, S_L))
    if NUM_SPLITS == 1:
        o = acc / l_o[None, :] * v_scale
        gl.store(o_ptr + t.to(gl.int64) * stride_ot + h[None, :] * stride_oh + d[:, None],
                 o.to(o_ptr.dtype.element_ty), mask=hvalid[None, :])
        gl.store(lse_ptr + t.to(gl.int64) * stride_lt + (kvh * RATIO + hl_s) * stride_lh, lse, mask=hl_s < RATIO)
    else:
        o = acc / l_o[None, :]
        prow = (split.to(gl.int64) * total_q + t) * HQ + h
        gl.store(op_ptr + prow[None, :] * HEAD_DIM + d[:, None], o, mask=hvalid[None, :])
        prow_s = (split.to(gl.int64) * total_q + t) * HQ + kvh * RATIO + hl_s
        gl.store(lp_ptr + prow_s, lse, mask=hl_s < RATIO)
    if TRACE:
        _stamp(trace_row, 5, t)
        gl.store(trace_row + 6, n_tiles.to(gl.int64))


class GluonSwap:
    """Stands in for ``sparse_decode.msa_decode_t_kernel`` where ``sparse_attention`` launches it:
    the same positional arguments, the Triton TMA descriptors replaced by Gluon ones of the same
    tensors (contiguous e4m3 caches, 2D views, [keys, 128] boxes)."""

    def __init__(self, keys: int = 64, stages: int = 3, lazy: int = 2, defer: bool = False,
                 maxnreg: int | None = None, trace: torch.Tensor | None = None, load_only: bool = False):
        self.keys, self.stages, self.lazy, self.defer, self.load_only = keys, stages, lazy, defer, load_only
        self.extra = {"maxnreg": maxnreg} if maxnreg else {}
        self.trace = trace  # int64 [programs, 8]: timestamps 0-5, tiles, SM

    def __getitem__(self, grid):
        def launch(*args, **kw):
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
            descs = [TensorDescriptor(dsc.base, list(dsc.shape), list(dsc.strides), [self.keys, 128], kv_sl)
                     for dsc in args[3:5]]
            assert kw["FLAT"] and kw["IS_FP8"], kw
            trace = self.trace if self.trace is not None else args[0]
            msa_decode_fp8_pv_kernel[grid](
                *args[:3], *descs, *args[5:], trace, TRACE=self.trace is not None, LOAD_ONLY=self.load_only,
                GP=kw["GP"], C=kw["C"], NUM_SPLITS=kw["NUM_SPLITS"],
                CAUSAL=kw["CAUSAL"], HEAD_MAJOR=kw["HEAD_MAJOR"], KEYS=self.keys, STAGES=self.stages,
                BLOCK_W=kw["BLOCK_W"], USE_PAGE_TABLE=kw["USE_PAGE_TABLE"], HAS_QO_OFFSET=kw["HAS_QO_OFFSET"],
                LAZY=self.lazy, PV_DEFER=self.defer, num_warps=GLUON_WARPS, **self.extra)

        return launch


def compile_sm90(keys: int = 64, stages: int = 3, splits: int = 1, gp: int = 16, head_major: bool = True,
                 lazy: int = 2, defer: bool = False, block_w: int = 16, maxnreg: int | None = None,
                 trace: bool = False, load_only: bool = False, out_dir: str | None = None):
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
           "stride_lh": "constexpr", "op_ptr": "*fp32", "lp_ptr": "*fp32", "total_q": "i32", "HQ": "i32",
           "RATIO": "i32",
           "qk_scale": "fp32", "v_scale": "fp32",
           "idx_ptr": "*i32", "stride_it": "i32", "stride_ih": "i32", "qo_indptr_ptr": "*i32",
           "kv_lens_ptr": "*i32", "qo_offset_ptr": "*i32", "B": "i32", "n_iter": "i32", "page_table_ptr": "*i32",
           "stride_pt": "i32", "n_cols": "i32", "kv_indices_ptr": "*i32", "kv_page_indptr_ptr": "*i32",
           "n_indices": "i32", "num_pages": "i32", "W": "i32", "trace_ptr": "*i64"}
    ce = dict(GP=gp, C=block_w, NUM_SPLITS=splits, CAUSAL=True, HEAD_MAJOR=head_major, KEYS=keys, STAGES=stages,
              BLOCK_W=block_w, USE_PAGE_TABLE=True, HAS_QO_OFFSET=False, LAZY=lazy, PV_DEFER=defer,
              TRACE=trace, LOAD_ONLY=load_only, stride_lh=1)
    sig.update({n: "constexpr" for n in ce})
    aligned = ("q_ptr", "u_page_ptr", "u_blk_ptr", "u_cnt_ptr", "o_ptr", "lse_ptr", "op_ptr", "lp_ptr", "stride_qt",
               "stride_qh", "stride_ot", "stride_oh", "stride_lt", "idx_ptr", "qo_indptr_ptr", "kv_lens_ptr",
               "page_table_ptr")
    src = GluonASTSource(fn=msa_decode_fp8_pv_kernel, signature=sig, constexprs=ce,
                         attrs=divisibility_attrs(sig, aligned))
    tag = f"msa_decode_fp8pv_k{keys}_s{stages}_d{int(defer)}_hm{int(head_major)}"
    opts = {"num_warps": GLUON_WARPS}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return _compile(src, opts, out_dir=out_dir, tag=tag, ptxas=True, keep_text=out_dir is not None)


# 128-key tiles: 194 registers (228 deferred), 76 KB at 2 stages: 2 programs per SM, not timed
COMPILE_VARIANTS = ((64, 3, False, None), (64, 3, True, None), (64, 3, True, 128), (128, 2, False, None))


def _compile_report() -> None:
    from mate.testing.sass import opcode_counts

    for keys, stages, defer, cap in COMPILE_VARIANTS:
        rep = compile_sm90(keys=keys, stages=stages, defer=defer, maxnreg=cap)
        ops = opcode_counts(rep.sass)
        pick = {k: v for k, v in ops.items() if "GMMA" in k or k.startswith(("LDS", "STS", "BAR", "F2FP", "PRMT"))}
        print(f"keys={keys} stages={stages} defer={int(defer)} cap={cap}: {rep.registers} regs, {rep.spills} spill "
              f"instr, {rep.shared} B shared, {sum(ops.values())} instr; {pick}; ptxas: {rep.ptxas_warnings[:2]}",
              flush=True)


def _decode_problem():
    """The bar's decode inputs (B=128, 64K, M3, fp8) with a head-major copy of the cache, and
    ``runner(kernel, head_major, out, lse)``: a call of ``sparse_attention`` with ``kernel``
    standing in for ``sparse_decode.msa_decode_t_kernel``."""
    from bench_msa_attention import HKV, decode_inputs

    from mate.ops.msa import sparse_decode as sd
    from mate.ops.msa.sparse_attention import sparse_attention

    pb = decode_inputs(128, 65536, torch.float8_e4m3fn)
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    qo, kvl = pb["qo_indptr"], pb["kv_lens"]
    k_hm, v_hm = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))
    real = sd.msa_decode_t_kernel

    def runner(kernel, hm, out, lse):
        def run():
            sd.msa_decode_t_kernel = kernel
            try:
                kk, vv = (k_hm, v_hm) if hm else (k, v)
                sparse_attention(q, kk, vv, kv_block_indexes=idx, page_table=table, qo_indptr=qo, kv_lens=kvl,
                                 out=out, lse=lse, causal=True, decode=True, num_kv_heads=HKV)
            finally:
                sd.msa_decode_t_kernel = real
        return run

    return pb, real, runner


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="sm_90 build report only (no GPU)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--trace", action="store_true", help="per-program %globaltimer timeline (H200)")
    args = ap.parse_args()
    if args.compile:
        _compile_report()
        return 0
    if args.trace:
        return trace_main()
    from bench_msa_attention import HKV, HQ
    from bench_msa_fp8_decode_variants import reference

    from mate.testing.bench import measure_ceilings, time_interleaved

    copy = measure_ceilings()["copy_GBps"]
    pb, real, runner = _decode_problem()
    B, sel = pb["q"].shape[0], pb["kv_block_indexes"].shape[-1]
    nbytes = 2.0 * B * HKV * sel * 128 * 128
    outs = {}

    def call(name, kernel, hm):
        outs[name] = (torch.full((B, HQ, 128), float("nan"), device="cuda", dtype=torch.bfloat16),
                      torch.full((B, HQ), float("nan"), device="cuda"))
        return runner(kernel, hm, *outs[name])

    variants = {"triton": real, "fp8pv 64k 3st": GluonSwap(64, 3), "fp8pv 64k 3st defer": GluonSwap(64, 3, defer=True),
                "fp8pv 64k 3st lazy1": GluonSwap(64, 3, lazy=1), "fp8pv 64k 3st lazy4": GluonSwap(64, 3, lazy=4)}
    variants = {n: v for n, v in variants.items() if n in os.environ.get("PROBE_VARIANTS", ",".join(variants))}
    cases = {}
    for hm in (True, False):
        tag = "HND" if hm else "NHD"
        for vn, kern in variants.items():
            cases[f"{tag} {vn}"] = call(f"{tag} {vn}", kern, hm)
        cases[f"{tag} triton again"] = call(f"{tag} triton again", real, hm)
    for run in cases.values():  # compile, and check outputs before timing
        run()
    torch.cuda.synchronize()
    times = time_interleaved(cases, iters=args.iters)
    ro, rl = reference(pb)
    print(f"copy {copy:.0f} GB/s, {nbytes / 1e6:.0f} MB of selected K/V")
    print(f"{'case':26} {'us':>8} {'%copy':>6} {'max|out-ref|':>13} {'max|lse-ref|':>13} {'max|out-triton|':>16} "
          f"{'nan':>4}")
    for name, t in times.items():
        o, l_ = outs[name]
        if isinstance(t, Exception):
            print(f"{name:26} FAILED {str(t)[:600]}")
            continue
        err_o = (o.float() - ro.float()).abs().max().item()
        err_l = (l_ - rl).abs().max().item()
        nan = bool(o.isnan().any() or l_.isnan().any())
        err_t = (o.float() - outs[name.split()[0] + " triton"][0].float()).abs().max().item()
        print(f"{name:26} {t:8.1f} {nbytes / t / 1e3 / copy:6.1%} {err_o:13.2e} {err_l:13.2e} {err_t:16.2e} "
              f"{str(nan):>4}")
    return 0


def _pct(x: torch.Tensor, qs=(0.0, 0.1, 0.5, 0.9, 1.0)) -> str:
    x = x.double()
    return " / ".join(f"{torch.quantile(x, q).item() / 1e3:.2f}" for q in qs)


def trace_main() -> int:
    """Timeline of one decode launch per cache layout: per-program phases (us, quantiles 0 / 10 /
    50 / 90 / 100 %), programs per SM, and how many programs are in their key loop over time."""
    from bench_msa_attention import HKV, HQ

    from mate.testing.bench import time_interleaved

    pb, real, runner = _decode_problem()
    B = pb["q"].shape[0]
    trace = torch.zeros(B * HKV, 8, dtype=torch.int64, device="cuda")
    out = torch.empty(B, HQ, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, HQ, device="cuda")

    def call(kernel, hm):
        return runner(kernel, hm, out, lse)

    traced, plain = GluonSwap(trace=trace), GluonSwap()
    floor, floor_traced = GluonSwap(load_only=True), GluonSwap(trace=trace, load_only=True)
    cases = {f"{lay} {n}": call(kern, lay == "HND") for lay in ("HND", "NHD")
             for n, kern in (("triton", real), ("gluon", plain), ("gluon traced", traced), ("load-only", floor))}
    times = time_interleaved(cases, iters=30)
    print("  ".join(f"{n} {t:.1f}" for n, t in times.items()))
    for lay, kern in (("HND", traced), ("NHD", traced), ("HND load-only", floor_traced),
                      ("NHD load-only", floor_traced)):
        run = call(kern, lay.startswith("HND"))
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        tr = trace.clone()
        t0 = tr[:, 0].min()
        ts = tr[:, :6] - t0
        diffs = (tr[:, :6].flatten() % 1000)
        print(f"{lay}: span {(ts[:, 5].max()).item() / 1e3:.2f} us; timer ns mod 1000 nonzero: "
              f"{bool((diffs != 0).any())}; tiles {tr[:, 6].min().item()}-{tr[:, 6].max().item()}")
        names = ("start", "list built", "prologue issued", "first tile", "loop end", "end")
        for j in range(6):
            print(f"  {names[j]:16} at {_pct(ts[:, j])}")
        for j, n in ((1, "list"), (3, "first wait"), (4, "loop"), (5, "epilogue")):
            print(f"  {n:16} takes {_pct(ts[:, j] - ts[:, j - 1 if j != 3 else 1])}")
        sm = tr[:, 7]
        per_sm = torch.bincount(sm, minlength=132)
        print(f"  programs per SM: {torch.bincount(per_sm).tolist()} (count of SMs with 0, 1, 2, ...)")
        for c in sorted(set(per_sm.tolist()) - {0}):
            sel = per_sm[sm] == c
            print(f"    SMs with {c}: end {_pct(ts[sel, 5])}, loop {_pct(ts[sel, 4] - ts[sel, 3])}")
        edges = torch.arange(0, ts[:, 5].max().item() + 2000, 2000, device="cuda")
        in_loop = [int(((ts[:, 3] <= e) & (ts[:, 4] > e)).sum()) for e in edges.tolist()]
        alive = [int(((ts[:, 0] <= e) & (ts[:, 5] > e)).sum()) for e in edges.tolist()]
        print(f"  every 2 us, programs in loop: {in_loop}")
        print(f"  every 2 us, programs alive:   {alive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
