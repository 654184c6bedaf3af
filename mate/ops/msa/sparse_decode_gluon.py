"""Gluon kernel of the MSA sparse decode with an e4m3 KV cache for Hopper (sm_90).

Same problem, grid and outputs as :func:`mate.ops.msa.sparse_decode.msa_decode_t_kernel`
(one program per query token, KV head and split; keys on the wgmma M side, the query heads
of the KV head on N), for e4m3 q / K / V in contiguous caches (2D TMA views):

* Sᵀ = K·Qᵀ [KEYS, GP] on FP8 tensor cores (QGMMA) straight from the TMA-loaded K tile
  (K-major A) and Q in shared memory (K-major B).
* Oᵀ [128, GP] += Vᵀ·Pᵀ with Vᵀ as the register A operand of an fp16 wgmma and Pᵀ (fp16)
  as the shared B operand. The M rows of Oᵀ are the head dimension in a permuted order
  (the output store un-permutes it): wgmma row ``m = 64 r + 16 w + 8 h + g`` (``g`` = lane
  // 4, ``h`` / ``r`` register bits, ``w`` the warp) holds ``d = 32 w + 4 g + 2 r + h``, so the
  four rows a thread owns are four consecutive bytes of one V row (key): the V tile is read
  with 32-bit shared loads (:data:`v_load_layout`) instead of the byte gathers (LDS.U8) the
  plain-Triton kernel needs to transpose the e4m3 tile, and widened e4m3 -> fp16 (exact)
  in registers. The register tensor is then relabelled (permute / reshape, no data
  movement) into the wgmma A layout.
* TMA loads into a ring of ``STAGES`` K/V slots with one mbarrier each; a slot is refilled
  as soon as its tile is consumed, so ``STAGES`` tiles are in flight.
* Online softmax over the keys (exp2 domain, ``k_scale`` folded into ``qk_scale``); the
  running sum is kept per element and reduced once at the end (one cross-warp reduction per
  tile: the maximum, partials exchanged once through shared memory).

Schedules (constexprs, not measured yet): the compute warps issue the refills themselves
(default), or ``WS``: a producer warp issues them (warp specialization; the refill's
barriers leave the compute warps' loop); ``OVERLAP``: Sᵀ of tile i + 1 is issued before
P·V of tile i, so tile i + 1's softmax runs while the tensor cores do tile i's P·V
(FlashAttention-3's intra-warpgroup overlap).

Gluon cannot run under Triton's interpreter: the CPU runs the plain kernel, this one is
checked against the reference by the GPU tests of ``tests/msa/test_sparse_decode_gluon.py``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

__all__ = ["msa_decode_gluon_kernel", "msa_decode_gluon", "v_load_layout", "GLUON_WARPS"]

GLUON_WARPS = 4  # one warpgroup
PRODUCER_REGS = gl.constexpr(40)  # the TMA warp of the ``WS`` schedule
WS_MAX_REGS = 64  # launch registers with ``WS`` (Triton launches 2 warpgroups): 4 programs per SM
HEAD_DIM = gl.constexpr(128)


@triton.constexpr_function
def v_load_layout(keys: int) -> gl.DistributedLinearLayout:
    """Register layout of the e4m3 V tile [keys, 128 d] read from shared memory: the wgmma
    A layout of Vᵀ [128 rows, keys] (fp16, ``k_width`` 2, 4 warps) with its row index mapped
    to ``d`` by the permutation of the module docstring. Per thread: bits d1, d2 of four
    registers span 4 consecutive bytes (one 32-bit load per key)."""
    assert keys in (64, 128)
    # wgmma A (Triton's DotOperandLayout(0, NVMMA v3 [4, 1], 2)) on [128 m, keys k]:
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
    every thread holds the 4 partials of its head columns, which are those it owns in the Sᵀ
    accumulator, so the maximum over axis 0 lands in that accumulator's head layout."""
    nbits = [[0, 1], [0, 8]] + [[0, 1 << i] for i in range(4, gp.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0]] + nbits,
                                      lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
                                      warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, gp])


@gluon.jit
def _tile_max(s, red_smem, KEYS: gl.constexpr, GP: gl.constexpr, RED_L: gl.constexpr, S_L: gl.constexpr):
    """Per-head maximum of Sᵀ [KEYS, GP] over the keys: within each warp (shuffles), then one
    exchange of the 4 warps' partials through shared memory (a single barrier)."""
    pm = gl.max(gl.max(gl.reshape(s, (KEYS // 64, 4, 16, GP)), axis=2), axis=0)  # [4 warps, GP]
    red_smem.store(pm)
    mx = gl.max(red_smem.load(RED_L), axis=0)
    return gl.convert_layout(mx, gl.SliceLayout(0, S_L))


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
def _produce(k_desc, v_desc, k_ring, v_ring, ready, empty, u_page_ptr, ubase, first, n_tiles, kvh, n_kvh,
             KEYS: gl.constexpr, KPB: gl.constexpr, HEAD_MAJOR: gl.constexpr, STAGES: gl.constexpr):
    """Producer warp (``WS``): refills each ring slot as soon as the consumers release it."""
    for i in range(n_tiles):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        page = gl.load(u_page_ptr + ubase + (first + i) // KPB)
        _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page, first + i, kvh, n_kvh, KEYS, KPB, HEAD_MAJOR)


@gluon.jit
def _softmax_tile(s, ok, kpos, limit, qk_scale, m_i, l_acc, red_smem, KEYS: gl.constexpr, GP: gl.constexpr,
                  RED_L: gl.constexpr, S_L: gl.constexpr):
    """Online softmax of one Sᵀ tile (keys at ``kpos``; none if not ``ok``): P, the rescale
    factor of the previous tiles, the new running maximum and per-element sums."""
    s = gl.where(((kpos <= limit) & ok)[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, _tile_max(s, red_smem, KEYS, GP, RED_L, S_L))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_use[None, :])
    alpha = gl.exp2(m_i - m_use)
    return p, alpha, m_new, l_acc * alpha[None, :] + p


@gluon.jit
def _release(k_desc, v_desc, k_ring, v_ring, ready, empty, slot, idx, n_tiles, first, u_page_ptr, ubase, kvh, n_kvh,
             KEYS: gl.constexpr, KPB: gl.constexpr, HEAD_MAJOR: gl.constexpr, STAGES: gl.constexpr,
             WS: gl.constexpr):
    """Tile ``idx`` (of this program) is consumed: hand its slot to the producer warp, or refill
    it with tile ``idx + STAGES``."""
    if WS:
        if idx < n_tiles:
            mbarrier.arrive(empty.index(slot), count=1)
    elif idx + STAGES < n_tiles:
        page = gl.load(u_page_ptr + ubase + (first + idx + STAGES) // KPB)
        _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page, first + idx + STAGES, kvh, n_kvh,
                    KEYS, KPB, HEAD_MAJOR)


@gluon.jit
def _consume_overlap(q_smem, k_ring, v_ring, p_smem, red_smem, ready, empty, k_desc, v_desc, u_page_ptr, u_blk_ptr,
                     ubase, first, n_tiles, e0, e1, limit, kvh, n_kvh, qk_scale,
                     GP: gl.constexpr, HEAD_MAJOR: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr,
                     WS: gl.constexpr):
    """FlashAttention-3's intra-warpgroup overlap: Sᵀ of tile i + 1 is issued before Oᵀ +=
    Vᵀ·Pᵀ of tile i, so the softmax of tile i + 1 runs while the tensor cores do tile i's
    P·V. Returns (acc, m_i, l_acc)."""
    KPB: gl.constexpr = 128 // KEYS
    V_L: gl.constexpr = v_load_layout(KEYS)
    RED_L: gl.constexpr = red_layout(GP)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    offs_n = gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_L))
    m_i = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
    l_acc = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    acc = gl.zeros([HEAD_DIM, GP], gl.float32, layout=O_L)
    s_zero = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    q_t = q_smem.permute((1, 0))
    # a tile of the last entry (with none: of an entry < cnt, so every index read stays in the list)
    last = gl.minimum(first + gl.maximum(n_tiles, 1) - 1, gl.maximum(e1 - 1, 0) * KPB)
    # tile 0 (with no tile, slot 0's stale contents are read and fully masked)
    blk = gl.load(u_blk_ptr + ubase + gl.minimum(e0, gl.maximum(e1 - 1, 0)))
    if n_tiles > 0:
        mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(k_ring.index(0), q_t, s_zero, use_acc=False, is_async=True)
    vt = _vt_operand(v_ring.index(0), V_L, A_L, KEYS)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    kpos = blk * 128 + (first % KPB) * KEYS + offs_n
    p, alpha, m_i, l_acc = _softmax_tile(s, n_tiles > 0, kpos, limit, qk_scale, m_i, l_acc, red_smem, KEYS, GP,
                                         RED_L, S_L)
    p_smem.store(p.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    _release(k_desc, v_desc, k_ring, v_ring, ready, empty, 0, 0, n_tiles, first, u_page_ptr, ubase, kvh, n_kvh,
             KEYS, KPB, HEAD_MAJOR, STAGES, WS)
    blk = gl.load(u_blk_ptr + ubase + gl.minimum(first + 1, last) // KPB)
    for i in range(n_tiles):
        nxt = i + 1
        slot = nxt % STAGES
        tile = first + nxt
        blk_next = gl.load(u_blk_ptr + ubase + gl.minimum(tile + 1, last) // KPB)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        if nxt < n_tiles:
            mbarrier.wait(ready.index(slot), (nxt // STAGES) & 1)
        s = warpgroup_mma(k_ring.index(slot), q_t, s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(vt, p_smem, acc, is_async=True)
        vt_next = _vt_operand(v_ring.index(slot), V_L, A_L, KEYS)  # stale past the last tile, never used
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # Sᵀ of tile i + 1 done, P·V of tile i runs
        kpos = blk * 128 + (tile % KPB) * KEYS + offs_n
        p, alpha, m_i, l_acc = _softmax_tile(s, nxt < n_tiles, kpos, limit, qk_scale, m_i, l_acc, red_smem, KEYS,
                                             GP, RED_L, S_L)
        acc, vt = warpgroup_mma_wait(num_outstanding=0, deps=(acc, vt))
        p_smem.store(p.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
        _release(k_desc, v_desc, k_ring, v_ring, ready, empty, slot, nxt, n_tiles, first, u_page_ptr, ubase, kvh,
                 n_kvh, KEYS, KPB, HEAD_MAJOR, STAGES, WS)
        vt = vt_next
        blk = blk_next
    return acc, m_i, l_acc


@gluon.jit
def _consume(q_smem, k_ring, v_ring, p_smem, red_smem, ready, empty, k_desc, v_desc, u_page_ptr, u_blk_ptr, ubase,
             first, n_tiles, e0, e1, limit, t, kvh, n_kvh, split,
             o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, op_ptr, lp_ptr, total_q, HQ, RATIO, qk_scale, v_scale,
             GP: gl.constexpr, NUM_SPLITS: gl.constexpr, HEAD_MAJOR: gl.constexpr, KEYS: gl.constexpr,
             STAGES: gl.constexpr, WS: gl.constexpr, OVERLAP: gl.constexpr):
    """The 4 compute warps: per tile Sᵀ, online softmax and Oᵀ += Vᵀ·Pᵀ, then the output."""
    KPB: gl.constexpr = 128 // KEYS
    V_L: gl.constexpr = v_load_layout(KEYS)
    RED_L: gl.constexpr = red_layout(GP)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    if OVERLAP:
        acc, m_i, l_acc = _consume_overlap(q_smem, k_ring, v_ring, p_smem, red_smem, ready, empty, k_desc, v_desc,
                                           u_page_ptr, u_blk_ptr, ubase, first, n_tiles, e0, e1, limit, kvh, n_kvh,
                                           qk_scale, GP, HEAD_MAJOR, KEYS, STAGES, WS)
    else:
        offs_n = gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_L))
        m_i = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
        l_acc = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
        acc = gl.zeros([HEAD_DIM, GP], gl.float32, layout=O_L)
        s_zero = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
        q_t = q_smem.permute((1, 0))
        blk = gl.load(u_blk_ptr + ubase + gl.minimum(e0, gl.maximum(e1 - 1, 0)))
        for i in range(n_tiles):
            slot = i % STAGES
            tile = first + i
            last = first + n_tiles - 1
            blk_next = gl.load(u_blk_ptr + ubase + gl.minimum(tile + 1, last) // KPB)
            if not WS:
                page_r = gl.load(u_page_ptr + ubase + gl.minimum(tile + STAGES, last) // KPB)  # of the refill
            mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
            s = warpgroup_mma(k_ring.index(slot), q_t, s_zero, use_acc=False, is_async=True)
            vt = _vt_operand(v_ring.index(slot), V_L, A_L, KEYS)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            kpos = blk * 128 + (tile % KPB) * KEYS + offs_n
            s = gl.where((kpos <= limit)[:, None], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, _tile_max(s, red_smem, KEYS, GP, RED_L, S_L))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - m_use[None, :])
            alpha = gl.exp2(m_i - m_use)
            l_acc = l_acc * alpha[None, :] + p
            p_smem.store(p.to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()  # P complete; every warp is done with this slot
            if WS:
                mbarrier.arrive(empty.index(slot), count=1)
            elif i + STAGES < n_tiles:
                _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page_r, tile + STAGES, kvh, n_kvh,
                            KEYS, KPB, HEAD_MAJOR)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
            acc = warpgroup_mma(vt, p_smem, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            m_i = m_new
            blk = blk_next

    l_i = gl.sum(l_acc, axis=0)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    # un-permute the rows: m = 64 r + 16 w + 8 h + g holds d = 32 w + 4 g + 2 r + h
    m = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, O_L))
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


@gluon.jit
def msa_decode_gluon_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    tok_pos_ptr, tok_kvlen_ptr,
    u_page_ptr, u_blk_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale,
    GP: gl.constexpr, C: gl.constexpr, NUM_SPLITS: gl.constexpr, CAUSAL: gl.constexpr,
    HEAD_MAJOR: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr = False,
    OVERLAP: gl.constexpr = False,
):
    """Grid (tokens, KV heads, splits); 4 warps, plus a TMA producer warp with ``WS``."""
    t = gl.program_id(0)
    kvh = gl.program_id(1)
    split = gl.program_id(2)
    n_kvh = gl.num_programs(1)
    KPB: gl.constexpr = 128 // KEYS
    Q_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    P_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, GP], gl.float16)
    KV_SL: gl.constexpr = k_desc.layout

    # Q [GP heads, 128] e4m3 (padded heads read as 0), the K-major B operand of Sᵀ = K·Qᵀ
    offs_hq = gl.arange(0, GP, layout=gl.SliceLayout(1, Q_L))
    offs_dq = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, Q_L))
    q = gl.load(q_ptr + t.to(gl.int64) * stride_qt + (kvh * RATIO + offs_hq)[:, None] * stride_qh
                + offs_dq[None, :], mask=(offs_hq < RATIO)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [GP, HEAD_DIM], Q_SL, q)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    p_smem = gl.allocate_shared_memory(gl.float16, [KEYS, GP], P_SL)
    red_smem = gl.allocate_shared_memory(gl.float32, [4, GP], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    gl.thread_barrier()

    pos = gl.load(tok_pos_ptr + t)
    limit = gl.load(tok_kvlen_ptr + t) - 1
    if CAUSAL:
        limit = gl.minimum(limit, pos)
    ubase = (t.to(gl.int64) * n_kvh + kvh) * C
    cnt = gl.load(u_cnt_ptr + t * n_kvh + kvh)
    if NUM_SPLITS == 1:
        e0 = 0
        e1 = cnt
    else:
        chunk = (cnt + NUM_SPLITS - 1) // NUM_SPLITS
        e0 = split * chunk
        e1 = gl.minimum(cnt, e0 + chunk)
    first = e0 * KPB
    n_tiles = gl.maximum(e1 - e0, 0) * KPB

    if WS:
        gl.warp_specialize([
            (_consume, (q_smem, k_ring, v_ring, p_smem, red_smem, ready, empty, k_desc, v_desc, u_page_ptr, u_blk_ptr,
                        ubase, first, n_tiles, e0, e1, limit, t, kvh, n_kvh, split, o_ptr, stride_ot, stride_oh,
                        lse_ptr, stride_lt, op_ptr, lp_ptr, total_q, HQ, RATIO, qk_scale, v_scale,
                        GP, NUM_SPLITS, HEAD_MAJOR, KEYS, STAGES, WS, OVERLAP)),
            (_produce, (k_desc, v_desc, k_ring, v_ring, ready, empty, u_page_ptr, ubase, first, n_tiles, kvh, n_kvh,
                        KEYS, KPB, HEAD_MAJOR, STAGES)),
        ], [1], [PRODUCER_REGS])
    else:
        for j in gl.static_range(STAGES):  # prologue: STAGES tiles in flight
            if j < n_tiles:
                page = gl.load(u_page_ptr + ubase + (first + j) // KPB)
                _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, j, page, first + j, kvh, n_kvh, KEYS, KPB,
                            HEAD_MAJOR)
        _consume(q_smem, k_ring, v_ring, p_smem, red_smem, ready, empty, k_desc, v_desc, u_page_ptr, u_blk_ptr,
                 ubase, first, n_tiles, e0, e1, limit, t, kvh, n_kvh, split, o_ptr, stride_ot, stride_oh,
                 lse_ptr, stride_lt, op_ptr, lp_ptr, total_q, HQ, RATIO, qk_scale, v_scale,
                 GP, NUM_SPLITS, HEAD_MAJOR, KEYS, STAGES, WS, OVERLAP)


def gluon_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ratio: int) -> bool:
    """A Hopper GPU, e4m3 q / K / V, contiguous 16-byte aligned caches, 128-wide heads and a
    group of at most 64 heads."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    if not all(x.dtype == torch.float8_e4m3fn for x in (q, k, v)) or q.shape[-1] != HEAD_DIM.value:
        return False
    return ratio <= 64 and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (k, v))


def msa_decode_gluon(q, k, v, layout, tok_pos, tok_kvlen, u_page, u_blk, u_cnt, out, lse, o_part, l_part,
                     total_q, hq, hkv, ratio, qk_scale, v_scale, capacity, splits, causal, keys, stages, gp,
                     ws=False, overlap=False):
    """Launches :func:`msa_decode_gluon_kernel` (``gluon_supported`` must hold) with the
    arguments of the plain transposed kernel; the caller runs the split combine."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = HEAD_DIM.value
    kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    kv2 = [x.view(-1, d) if layout == "HND" else x.view(-1, hkv * d) for x in (k, v)]
    k_desc, v_desc = (TensorDescriptor(x, list(x.shape), list(x.stride()), [keys, d], kv_sl) for x in kv2)
    msa_decode_gluon_kernel[(total_q, hkv, splits)](
        q, q.stride(0), q.stride(1),
        k_desc, v_desc,
        tok_pos, tok_kvlen, u_page, u_blk, u_cnt,
        out, out.stride(0), out.stride(1), lse, lse.stride(0),
        o_part, l_part,
        total_q, hq, ratio, qk_scale, v_scale,
        GP=gp, C=capacity, NUM_SPLITS=splits, CAUSAL=causal, HEAD_MAJOR=layout == "HND", KEYS=keys,
        STAGES=stages, WS=ws, OVERLAP=overlap, num_warps=GLUON_WARPS, **({"maxnreg": WS_MAX_REGS} if ws else {}),
    )


def compile_sm90(keys: int, stages: int, splits: int = 1, gp: int = 16, head_major: bool = False, ws: bool = False,
                 overlap: bool = False, out_dir: str | None = None):
    """Compiles the kernel for the H200 (sm_90) without a GPU (M3 tile, bf16 output, causal);
    returns :class:`mate.testing.sass.SassReport`."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from mate.testing.sass import compile_sm90 as _compile
    from mate.testing.sass import divisibility_attrs

    kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    desc = f"tensordesc<fp8e4nv[{keys}, 128],{kv_sl}>"
    sig = {"q_ptr": "*fp8e4nv", "stride_qt": "i32", "stride_qh": "i32", "k_desc": desc, "v_desc": desc,
           "tok_pos_ptr": "*i32", "tok_kvlen_ptr": "*i32", "u_page_ptr": "*i32", "u_blk_ptr": "*i32",
           "u_cnt_ptr": "*i32", "o_ptr": "*bf16", "stride_ot": "i32", "stride_oh": "i32", "lse_ptr": "*fp32",
           "stride_lt": "i32", "op_ptr": "*fp32", "lp_ptr": "*fp32", "total_q": "i32", "HQ": "i32",
           "RATIO": "i32", "qk_scale": "fp32", "v_scale": "fp32"}
    ce = dict(GP=gp, C=32, NUM_SPLITS=splits, CAUSAL=True, HEAD_MAJOR=head_major, KEYS=keys, STAGES=stages,
              WS=ws, OVERLAP=overlap)
    sig.update({k: "constexpr" for k in ce})
    aligned = [n for n in sig if n.endswith("_ptr") or n.startswith("stride_")]
    src = GluonASTSource(fn=msa_decode_gluon_kernel, signature=sig, constexprs=ce,
                         attrs=divisibility_attrs(sig, aligned))
    tag = f"msa_decode_gluon_k{keys}_s{stages}_sp{splits}_gp{gp}_hm{int(head_major)}_ws{int(ws)}_ov{int(overlap)}"
    opts = {"num_warps": GLUON_WARPS}
    if ws:
        opts["maxnreg"] = WS_MAX_REGS
    return _compile(src, opts, out_dir=out_dir, tag=tag, ptxas=True,
                    keep_text=out_dir is not None)
