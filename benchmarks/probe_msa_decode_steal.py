"""Probe (session 23): the fp8 MSA decode with work stealing between programs.

    python benchmarks/probe_msa_decode_steal.py            # H200: A/B against the Triton kernel
    python benchmarks/probe_msa_decode_steal.py --compile  # CPU: sm_90 registers / spills / SASS

Why: a %globaltimer timeline of one decode launch (``probe_msa_decode_fp8_pv.py --trace``, B=128,
64K, M3, 512 programs of 32 tiles each, 4 per SM) shows programs with the same work finishing
between 46 and 68 us: the key loop takes 42-61 us depending on the SM (programs on about 24 SMs
finish ~15 us before the rest), the load-only kernel shows the same spread, and for the last ~20
us of the launch a fifth or more of the programs are done while DRAM serves the others.

How: each program still owns one (token, KV head) and its block list, but claims the list's
blocks one at a time (three ahead) from a per-unit word packing (front, back) with an atomic
add. A program that is done with its own unit writes its output, then steals blocks from the
back of the unit with the most unclaimed blocks (a scan of every unit's word), computes that
block's partial softmax state from scratch and publishes it (normalized O rows and the log2
LSE into scratch, then a release add to the unit's done count). An owner whose blocks ran out
waits for its stolen blocks' partials (acquire) and merges them before writing. Stale words
of an earlier launch are always exhausted (front >= back), so a thief never claims from a unit
whose owner has not started; the owner resets the done count and publishes the limit before
its release of the word.

Claims are per 64-key tile, four tiles ahead of the one computed; an owner's claim is an atomic
of thread 0 whose result is stored to shared memory a tile later and read after that tile's P
barrier (a scalar atomic is broadcast at once, which stalls the whole program on its round trip).
P·V as in ``probe_msa_decode_fp8_pv`` (FP8, P as hi + lo e4m3; the same time as the Triton
kernel without stealing).

H200 (session 23, calls 3-4 of ``benchmarks/results/2026-11-30-h200-s23-probes.txt``, bar inputs,
interleaved, us; every output within 5.6e-4 of the reference): head-major Triton 76.0, this kernel
without stealing 76.0, the owners' claims alone 78.4, with thieves 87.5 (95.5 stealing only from
units with >= 3 unclaimed tiles); token-major 76.1 / 76.4 / 85.3 / 94.2. Only 90 (150) of 16,384
tiles changed hands: by the time the fast programs are done the slow ones have few tiles beyond
their claim window, and the thieves' scans and atomics on the claim words slow the owners (the
owners' ends move later, p90 64 -> 73 us). A first version with block-granular claims (three
blocks ahead) stole 23 blocks and took 82.7 against 79.3. Not kept; removed after this run.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from probe_msa_decode_fp8_pv import (  # noqa: E402
    HEAD_DIM,
    _issue_tile,
    _perm_d,
    _smid,
    _stage_p8,
    _stamp,
    _token_block_list,
    _vt_e4m3_128,
    red_layout,
    v_load_layout,
)

GLUON_WARPS = 4
MAX_TILES = gl.constexpr(32)  # scratch slots per unit (2 tiles per block, the list's capacity C <= 16 here)


@gluon.jit
def _word(front, back):
    return (back << 16) | front


@gluon.jit
def _tile(i, tile, blk, refill, page_r, m_i, l_k, acc, q_t, s_zero, offs_n, limit, qk_scale,
          k_desc, v_desc, k_ring, v_ring, ready, p_buf, f_buf, red_smem, kvh, n_kvh, claim_smem, claimed, owned,
          GP: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr, HEAD_MAJOR: gl.constexpr,
          LAZY: gl.constexpr, P_SCALE: gl.constexpr, CLAIM: gl.constexpr = False):
    """Tile ``tile`` (of block ``blk``) in ring step ``i``; refills the slot with tile
    ``tile + STAGES`` of page ``page_r`` when ``refill``. With ``CLAIM`` (an owner's tile) the
    claim of tile ``tile + STAGES`` (issued a tile earlier when ``claimed``, its result stored in
    ``claim_smem`` before this call) is read after the barrier that publishes P and decides the
    refill: ``owned`` becomes tile + STAGES + 1 on success. Returns (m_i, l_k, acc, owned, lost)."""
    KPB: gl.constexpr = 128 // KEYS
    NW: gl.constexpr = 4
    RED_L: gl.constexpr = red_layout(GP)
    F_L: gl.constexpr = gl.BlockedLayout([NW], [32], [NW], [0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, GP, 32])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=4)
    slot = i % STAGES
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    s = warpgroup_mma(k_ring.index(slot), q_t, s_zero, use_acc=False, is_async=True)
    vt = _vt_e4m3_128(v_ring.index(slot).load(v_load_layout(KEYS)), A_L)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    kpos = blk * 128 + (tile % KPB) * KEYS + offs_n
    s = gl.where((kpos <= limit)[:, None], s * qk_scale, float("-inf"))
    unset = m_i == float("-inf")
    m_use = gl.where(unset, 0.0, m_i)
    x = s - m_use[None, :]
    p = gl.exp2(x)
    thr = gl.where(unset, float("-inf"), LAZY + 0.0)
    hit = (x > thr[None, :]).to(gl.int32)
    f_buf.store(gl.max(gl.max(gl.reshape(hit, (KEYS // 64, NW, 16 * GP)), axis=2), axis=0))
    _stage_p8(p_buf, p, P_SCALE)
    fence_async_shared()
    gl.thread_barrier()  # P and the flags published; every warp is done with this slot
    lost = False
    if CLAIM:
        if claimed:
            old = gl.max(claim_smem.slice(0, 1).load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)
            won = (old & 0xFFFF) < (old >> 16)
            owned = gl.where(won, tile + STAGES + 1, owned)
            lost = not won
        refill = tile + STAGES < owned
    if refill:
        _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, slot, page_r, tile + STAGES, kvh, n_kvh,
                    KEYS, KPB, HEAD_MAJOR)
    if gl.max(f_buf.load(F_L), axis=0) != 0:
        pm = gl.max(gl.max(gl.reshape(s, (KEYS // 64, NW, 16, GP)), axis=2), axis=0)
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
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return m_i, l_k, acc, owned, lost


@gluon.jit
def _owner_tile(i, n_tiles, owned, lost, r_prev, claimed_prev, claim_ptr, u, lane, ubase, m_i, l_k, acc, q_t, s_zero,
                offs_n, limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p_buf, f_buf, red_smem, claim_smem,
                u_page_ptr, u_blk_ptr, kvh, n_kvh, GP: gl.constexpr, KEYS: gl.constexpr, STAGES: gl.constexpr,
                HEAD_MAJOR: gl.constexpr, LAZY: gl.constexpr, P_SCALE: gl.constexpr, STEAL: gl.constexpr):
    """An owner's tile ``i``: stores the claim result of tile i + STAGES (issued at tile i - 1),
    issues the claim of tile i + STAGES + 1 (thread 0, not waited for here), computes the tile."""
    if STEAL > 0:
        claim_smem.store(r_prev)  # a tile after its atomic: the value has landed
        claim_now = (i + STAGES + 1 < n_tiles) & (not lost)
        r_new = gl.atomic_add(claim_ptr + u + lane, lane * 0 + 1, mask=(lane == 0) & claim_now, sem="relaxed")
    else:
        claim_now = False
        r_new = r_prev
    blk = gl.load(u_blk_ptr + ubase + i // 2)
    page_r = gl.load(u_page_ptr + ubase + gl.minimum(i + STAGES, n_tiles - 1) // 2)
    m_i, l_k, acc, owned, lost_now = _tile(i, i, blk, i + STAGES < owned, page_r, m_i, l_k, acc, q_t, s_zero, offs_n,
                                           limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p_buf, f_buf,
                                           red_smem, kvh, n_kvh, claim_smem, claimed_prev, owned, GP, KEYS, STAGES,
                                           HEAD_MAJOR, LAZY, P_SCALE, STEAL > 0)
    return m_i, l_k, acc, owned, lost | lost_now, r_new, claim_now


@gluon.jit
def _state(m_i, l_k, acc, P_SCALE: gl.constexpr):
    """(normalized O [128 rows of _perm_d, GP], log2 LSE [GP] in O's column layout); an empty
    column gives O = 0 and LSE = -inf."""
    O_L: gl.constexpr = acc.type.layout
    l_i = gl.sum(l_k, axis=0)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse2 = gl.where(empty, float("-inf"), m_i + gl.log2(l_safe))
    o = acc / gl.convert_layout(l_safe * P_SCALE, gl.SliceLayout(0, O_L))[None, :]
    return o, gl.convert_layout(lse2, gl.SliceLayout(0, O_L))


@gluon.jit
def msa_decode_steal_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    u_page_ptr, u_blk_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale,
    idx_ptr, stride_it, stride_ih, qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages, W,
    claim_ptr, done_ptr, limit_ptr, spo_ptr, spl_ptr, trace_ptr,
    GP: gl.constexpr, C: gl.constexpr, CAUSAL: gl.constexpr, HEAD_MAJOR: gl.constexpr,
    KEYS: gl.constexpr = 64, STAGES: gl.constexpr = 3, BLOCK_W: gl.constexpr = 16,
    USE_PAGE_TABLE: gl.constexpr = True, HAS_QO_OFFSET: gl.constexpr = False, LAZY: gl.constexpr = 2,
    STEAL: gl.constexpr = 2, MIN_STEAL: gl.constexpr = 1, TRACE: gl.constexpr = False,
):
    """Grid (tokens, KV heads), 4 warps, unsplit; ``msa_decode_t_kernel``'s arguments plus the
    stealing state: ``claim`` / ``done`` / ``limit`` int32 [units], ``spo`` fp32 [units * 32, GP,
    128] and ``spl`` fp32 [units * 32, GP] (partials of stolen tiles). ``STEAL``: 0 off, 1 the
    owners' claims only (their cost), 2 claims and thieves."""
    gl.static_assert(KEYS == 64, "one claimed block = two 64-key tiles")
    gl.static_assert(STAGES == 3)
    gl.static_assert(C <= 16)
    P_SCALE: gl.constexpr = float(2 ** (8 - LAZY))
    t = gl.program_id(0)
    kvh = gl.program_id(1)
    n_kvh = gl.num_programs(1)
    n_units = gl.num_programs(0) * n_kvh
    u = t * n_kvh + kvh
    trace_row = trace_ptr + u.to(gl.int64) * 8
    if TRACE:
        _stamp(trace_row, 0, t)
        gl.store(trace_row + 7, _smid(t).to(gl.int64))
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
    ubase = u.to(gl.int64) * C
    pos, kv_len, cnt = _token_block_list(
        t, 0, ubase, idx_ptr + t.to(gl.int64) * stride_it + kvh * stride_ih, qo_indptr_ptr, kv_lens_ptr,
        qo_offset_ptr, B, n_iter, page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices,
        num_pages, W, u_page_ptr, u_blk_ptr, u_cnt_ptr + u, BLOCK_W, 1, CAUSAL, USE_PAGE_TABLE, HAS_QO_OFFSET)
    limit = kv_len - 1
    if CAUSAL:
        limit = gl.minimum(limit, pos)
    n_tiles = 2 * cnt
    owned = gl.minimum(n_tiles, STAGES + 1)  # tiles 0 .. STAGES pre-claimed
    if STEAL > 0:
        gl.store(limit_ptr + u, limit)
        gl.store(done_ptr + u, 0)
        gl.thread_barrier()
        gl.atomic_xchg(claim_ptr + u, _word(owned, n_tiles), sem="release")
    else:
        owned = n_tiles
    if TRACE:
        _stamp(trace_row, 1, t)

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [GP, HEAD_DIM], Q_SL, q)
    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, KEYS, HEAD_DIM], KV_SL)
    p0 = gl.allocate_shared_memory(gl.float8e4nv, [2 * GP, KEYS], P_SL)
    p1 = gl.allocate_shared_memory(gl.float8e4nv, [2 * GP, KEYS], P_SL)
    f0 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    f1 = gl.allocate_shared_memory(gl.int32, [4], F_SL)
    red_smem = gl.allocate_shared_memory(gl.float32, [4, GP], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    claim_smem = gl.allocate_shared_memory(gl.int32, [128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    fence_async_shared()
    gl.thread_barrier()
    for j in gl.static_range(STAGES):  # prologue
        if j < n_tiles:
            _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, j, gl.load(u_page_ptr + ubase + j // 2), j, kvh,
                        n_kvh, KEYS, 2, HEAD_MAJOR)
    offs_n = gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_L))
    s_zero = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    m_i = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
    l_k = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
    acc = gl.zeros([HEAD_DIM, GP], gl.float32, layout=O_L)
    q_t = q_smem.permute((1, 0))
    if TRACE:
        _stamp(trace_row, 2, t)
    # tile i: the claim of tile i + STAGES + 1 is an atomic of thread 0 (a tensor atomic, so its
    # result is not broadcast at once), stored to shared memory at tile i + 1 and read after that
    # tile's P barrier, where it decides the refill of that very tile
    CL: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    lane = gl.arange(0, 128, layout=CL)
    r_prev = lane * 0
    claimed = False
    lost = False
    i = 0
    while i < owned:
        m_i, l_k, acc, owned, lost, r_prev, claimed = _owner_tile(
            i, n_tiles, owned, lost, r_prev, claimed, claim_ptr, u, lane, ubase, m_i, l_k, acc, q_t, s_zero, offs_n,
            limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p0, f0, red_smem, claim_smem, u_page_ptr,
            u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY, P_SCALE, STEAL)
        if i + 1 < owned:
            m_i, l_k, acc, owned, lost, r_prev, claimed = _owner_tile(
                i + 1, n_tiles, owned, lost, r_prev, claimed, claim_ptr, u, lane, ubase, m_i, l_k, acc, q_t, s_zero,
                offs_n, limit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p1, f1, red_smem, claim_smem,
                u_page_ptr, u_blk_ptr, kvh, n_kvh, GP, KEYS, STAGES, HEAD_MAJOR, LAZY, P_SCALE, STEAL)
        i += 2
    if TRACE:
        _stamp(trace_row, 3, t)
        _stamp(trace_row, 4, t)

    # merge the stolen blocks' partials, write
    o, lse2 = _state(m_i, l_k, acc, P_SCALE)
    m_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, O_L))
    d = _perm_d(m_o)
    hl = gl.arange(0, GP, layout=gl.SliceLayout(0, O_L))
    if STEAL == 2:
        stolen = n_tiles - owned
        if stolen > 0:
            seen = gl.atomic_add(done_ptr + u, 0, sem="acquire")
            spins = 0
            while (seen < stolen) & (spins < 4_000_000):  # the cap only keeps a bug from hanging the probe
                seen = gl.atomic_add(done_ptr + u, 0, sem="acquire")
                spins += 1
            if TRACE:
                gl.store(trace_row + 3, (seen < stolen).to(gl.int64) * 1_000_000_000_000)
            gl.thread_barrier()
            for b in range(owned, n_tiles):
                slot_row = u.to(gl.int64) * MAX_TILES + b
                lb = gl.load(spl_ptr + slot_row * GP + hl, cache_modifier=".cg")
                ob = gl.load(spo_ptr + (slot_row * GP + hl[None, :]) * HEAD_DIM + d[:, None], cache_modifier=".cg")
                mx = gl.maximum(lse2, lb)
                mx_use = gl.where(mx == float("-inf"), 0.0, mx)
                wa = gl.exp2(lse2 - mx_use)
                wb = gl.exp2(lb - mx_use)
                sw = wa + wb
                sw_safe = gl.where(sw == 0.0, 1.0, sw)
                o = (o * wa[None, :] + ob * wb[None, :]) / sw_safe[None, :]
                lse2 = gl.where(sw == 0.0, float("-inf"), mx_use + gl.log2(sw_safe))
    h = kvh * RATIO + hl
    hvalid = hl < RATIO
    gl.store(o_ptr + t.to(gl.int64) * stride_ot + h[None, :] * stride_oh + d[:, None],
             (o * v_scale).to(o_ptr.dtype.element_ty), mask=hvalid[None, :])
    gl.store(lse_ptr + t.to(gl.int64) * stride_lt + h, lse2 * 0.6931471805599453, mask=hvalid)
    if TRACE:
        _stamp(trace_row, 5, t)
        gl.store(trace_row + 6, owned.to(gl.int64))

    if STEAL == 2:
        SCAN_L: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        offs_s = gl.arange(0, 512, layout=SCAN_L)
        i = owned  # ring steps so far
        steals = 0
        attempt = 0
        go = True
        while go:
            # the first unit with at least MIN_STEAL unclaimed tiles after a pseudo-random start,
            # so that the thieves spread over the victims
            start = ((u + 1) * 40503 + attempt * 9973) % n_units
            best = n_units
            for c0 in range(0, n_units, 512):
                wu = c0 + offs_s
                w = gl.load(claim_ptr + wu, mask=wu < n_units, other=0, cache_modifier=".cg")
                rem = (w >> 16) - (w & 0xFFFF)
                dist = gl.where(rem >= MIN_STEAL, (wu - start + n_units) % n_units, n_units)
                best = gl.minimum(best, gl.min(dist, axis=0))
            go = best < n_units
            attempt += 1
            if go:
                v = (best + start) % n_units
                old = gl.atomic_add(claim_ptr + v, -65536, sem="acq_rel")
                tk = (old >> 16) - 1
                if tk >= (old & 0xFFFF):  # tile tk of unit v is ours
                    tv = v // n_kvh
                    kv = v % n_kvh
                    qv = gl.load(q_ptr + tv.to(gl.int64) * stride_qt + (kv * RATIO + offs_hq)[:, None] * stride_qh
                                 + offs_dq[None, :], mask=(offs_hq < RATIO)[:, None], other=0.0)
                    vbase = v.to(gl.int64) * C
                    page = gl.load(u_page_ptr + vbase + tk // 2, cache_modifier=".cg")
                    vblk = gl.load(u_blk_ptr + vbase + tk // 2, cache_modifier=".cg")
                    vlimit = gl.load(limit_ptr + v, cache_modifier=".cg")
                    _issue_tile(k_desc, v_desc, k_ring, v_ring, ready, i % STAGES, page, tk, kv, n_kvh,
                                KEYS, 2, HEAD_MAJOR)
                    gl.thread_barrier()  # every warp is done with the last query
                    q_smem.store(qv)
                    fence_async_shared()
                    gl.thread_barrier()
                    sm_i = gl.full([GP], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
                    sl_k = gl.zeros([KEYS, GP], gl.float32, layout=S_L)
                    sacc = gl.zeros([HEAD_DIM, GP], gl.float32, layout=O_L)
                    sm_i, sl_k, sacc, _o, _l = _tile(i, tk, vblk, False, page, sm_i, sl_k, sacc, q_t, s_zero, offs_n,
                                                     vlimit, qk_scale, k_desc, v_desc, k_ring, v_ring, ready, p0, f0,
                                                     red_smem, kv, n_kvh, claim_smem, False, 0, GP, KEYS, STAGES,
                                                     HEAD_MAJOR, LAZY, P_SCALE, False)
                    i += 1
                    so, sl = _state(sm_i, sl_k, sacc, P_SCALE)
                    slot_row = v.to(gl.int64) * MAX_TILES + tk
                    gl.store(spo_ptr + (slot_row * GP + hl[None, :]) * HEAD_DIM + d[:, None], so)
                    gl.store(spl_ptr + slot_row * GP + hl, sl)
                    gl.thread_barrier()
                    gl.atomic_add(done_ptr + v, 1, sem="release")
                    steals += 1
        if TRACE:
            gl.store(trace_row + 6, owned.to(gl.int64) + 1000 * steals)
            _stamp(trace_row, 4, t)


def _signature(keys: int = 64) -> dict:
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
           "n_indices": "i32", "num_pages": "i32", "W": "i32", "claim_ptr": "*i32", "done_ptr": "*i32",
           "limit_ptr": "*i32", "spo_ptr": "*fp32", "spl_ptr": "*fp32", "trace_ptr": "*i64"}
    return sig


def compile_sm90(steal: int = 2, head_major: bool = True, trace: bool = False, min_steal: int = 1,
                 out_dir: str | None = None):
    """sm_90 build of the M3 tile (16 heads, bf16 output, causal) without a GPU."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from mate.testing.sass import compile_sm90 as _compile
    from mate.testing.sass import divisibility_attrs

    sig = _signature()
    ce = dict(GP=16, C=16, CAUSAL=True, HEAD_MAJOR=head_major, KEYS=64, STAGES=3, BLOCK_W=16, USE_PAGE_TABLE=True,
              HAS_QO_OFFSET=False, LAZY=2, STEAL=steal, MIN_STEAL=min_steal, TRACE=trace)
    sig.update({n: "constexpr" for n in ce})
    aligned = ("q_ptr", "u_page_ptr", "u_blk_ptr", "u_cnt_ptr", "o_ptr", "lse_ptr", "op_ptr", "lp_ptr", "stride_qt",
               "stride_qh", "stride_ot", "stride_oh", "stride_lt", "idx_ptr", "qo_indptr_ptr", "kv_lens_ptr",
               "page_table_ptr", "claim_ptr", "done_ptr", "limit_ptr", "spo_ptr", "spl_ptr")
    src = GluonASTSource(fn=msa_decode_steal_kernel, signature=sig, constexprs=ce,
                         attrs=divisibility_attrs(sig, aligned))
    return _compile(src, {"num_warps": GLUON_WARPS}, out_dir=out_dir, tag=f"msa_steal_s{steal}_t{int(trace)}",
                    ptxas=True, keep_text=out_dir is not None)


class StealSwap:
    """Stands in for ``sparse_decode.msa_decode_t_kernel`` (unsplit launches only)."""

    def __init__(self, steal: int = 2, min_steal: int = 1, trace: torch.Tensor | None = None):
        self.steal, self.min_steal, self.trace = steal, min_steal, trace
        self.state = None

    def __getitem__(self, grid):
        def launch(*args, **kw):
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            assert kw["FLAT"] and kw["IS_FP8"] and kw["NUM_SPLITS"] == 1 and grid[2] == 1, (kw, grid)
            kv_sl = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
            descs = [TensorDescriptor(dsc.base, list(dsc.shape), list(dsc.strides), [64, 128], kv_sl)
                     for dsc in args[3:5]]
            units = grid[0] * grid[1]
            gp = kw["GP"]
            dev = args[0].device
            if self.state is None or self.state[0].numel() < units:
                self.state = (torch.zeros(units, dtype=torch.int32, device=dev),
                              torch.zeros(units, dtype=torch.int32, device=dev),
                              torch.zeros(units, dtype=torch.int32, device=dev),
                              torch.empty(units * MAX_TILES * gp * 128, dtype=torch.float32, device=dev),
                              torch.empty(units * MAX_TILES * gp, dtype=torch.float32, device=dev))
            trace = self.trace if self.trace is not None else self.state[0]
            msa_decode_steal_kernel[grid[:2]](
                *args[:3], *descs, *args[5:], *self.state, trace, GP=gp, C=kw["C"], CAUSAL=kw["CAUSAL"],
                HEAD_MAJOR=kw["HEAD_MAJOR"], KEYS=64, STAGES=3, BLOCK_W=kw["BLOCK_W"],
                USE_PAGE_TABLE=kw["USE_PAGE_TABLE"], HAS_QO_OFFSET=kw["HAS_QO_OFFSET"], LAZY=2, STEAL=self.steal,
                MIN_STEAL=self.min_steal, TRACE=self.trace is not None, num_warps=GLUON_WARPS)

        return launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="sm_90 build report only (no GPU)")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if args.compile:
        for steal in (2, 1, 0):
            rep = compile_sm90(steal=steal)
            print(f"steal={steal}: {rep.registers} regs, {rep.spills} spills, {rep.shared} B shared")
        return 0
    from bench_msa_attention import HKV, HQ, decode_inputs
    from bench_msa_fp8_decode_variants import reference
    from probe_msa_decode_fp8_pv import _pct

    from mate.ops.msa import sparse_decode as sd
    from mate.ops.msa.sparse_attention import sparse_attention
    from mate.testing.bench import measure_ceilings, time_interleaved

    copy = measure_ceilings()["copy_GBps"]
    pb = decode_inputs(128, 65536, torch.float8_e4m3fn)
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    qo, kvl = pb["qo_indptr"], pb["kv_lens"]
    B, sel = q.shape[0], idx.shape[-1]
    nbytes = 2.0 * B * HKV * sel * 128 * 128
    k_hm, v_hm = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))
    real = sd.msa_decode_t_kernel
    outs = {}

    def call(name, kernel, hm):
        out = torch.full((B, HQ, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((B, HQ), float("nan"), device="cuda")
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

    variants = {"triton": real, "gluon no steal": StealSwap(0), "claims only": StealSwap(1), "steal": StealSwap(2),
                "steal min3": StealSwap(2, 3)}
    cases = {}
    for hm in (True, False):
        tag = "HND" if hm else "NHD"
        for vn, kern in variants.items():
            cases[f"{tag} {vn}"] = call(f"{tag} {vn}", kern, hm)
        cases[f"{tag} triton again"] = call(f"{tag} triton again", real, hm)
    for run in cases.values():
        run()
    torch.cuda.synchronize()
    ro, rl = reference(pb)
    print(f"copy {copy:.0f} GB/s, {nbytes / 1e6:.0f} MB of selected K/V")
    errs = {}
    for name, (o, l_) in outs.items():
        base = outs[name.split()[0] + " triton"][0]
        errs[name] = ((o.float() - ro.float()).abs().max().item(), (l_ - rl).abs().max().item(),
                      (o.float() - base.float()).abs().max().item(), bool(o.isnan().any() or l_.isnan().any()))
        print(f"  {name:24} max|out-ref| {errs[name][0]:.2e} max|lse-ref| {errs[name][1]:.2e} "
              f"max|out-triton| {errs[name][2]:.2e} nan {errs[name][3]}", flush=True)
    times = time_interleaved(cases, iters=args.iters)
    print(f"{'case':26} {'us':>8} {'%copy':>6}")
    for name, t in times.items():
        if isinstance(t, Exception):
            print(f"{name:26} FAILED {str(t)[:600]}")
            continue
        print(f"{name:26} {t:8.1f} {nbytes / t / 1e3 / copy:6.1%}")
    # timeline of one stealing launch per layout
    trace = torch.zeros(B * HKV, 8, dtype=torch.int64, device="cuda")
    for lay in ("HND", "NHD"):
        run = call(f"{lay} traced", StealSwap(2, 1, trace), lay == "HND")
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        tr = trace.clone()
        ts = tr[:, :6] - tr[:, 0].min()
        steals = tr[:, 6] // 1000
        print(f"{lay} steal: span {ts[:, 5].max().item() / 1e3:.2f} us (owner end) / {ts[:, 4].max().item() / 1e3:.2f}"
              f" (thief end); steals per program {_pct(steals.float() * 1e3)}; total {int(steals.sum())} blocks; "
              f"spin cap hit {int((tr[:, 3] == 10**12).sum())}")
        print(f"  owner end at {_pct(ts[:, 5])}; thief end at {_pct(ts[:, 4])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
