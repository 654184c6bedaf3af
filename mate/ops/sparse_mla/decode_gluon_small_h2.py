"""One-warpgroup Gluon kernel of the FP8 sparse MLA decode for few heads (H <= 32), sm_90.

The 8-warp small-H kernel (``decode_gluon_small_h.py``) runs one program per SM and is bound
by its per-block compute chain, not by the gather. This variant makes each chain one
warpgroup (4 warps, all ``BLOCK_H`` heads on the wgmma N side) with its own ring of
``STAGES`` gathered tiles, so that two programs share an SM (<= 255 registers, <= 113 KB of
shared memory each) and twice as many independent chains run per SM; the plan's split
(``num_splits`` = 2 at B=128 q1) provides the programs, the combine kernel of ``decode.py``
merges them. Plans select it for H <= 16 (``num_warps=4``; at 32 heads it spills).

Per 64-row block: Sᵀ [64, BLOCK_H] = K·Qᵀ (QGMMA, K-major operands in shared memory), the
online softmax over the rows, and Oᵀ [512, BLOCK_H] += Vᵀ·Pᵀ in two halves of 256 value rows
(HGMMA, Vᵀ from registers as in the 8-warp kernel, value rows permuted, see ``_perm_half``).
Sᵀ of block it + 1 is issued before the P·V of block it.

Variants (``variant``, ``WG_VARIANTS``): the ring and how the softmax's row max crosses warps.
Rings: ``"full"`` keeps ``STAGES`` (2) whole 576-byte rows per slot: the gather of
block it + 2 is issued once Vᵀ half 1 of block it is read, and waited for at the top of
iteration it + 1, so a chain has at most one block in flight and none at the top of an
iteration. ``"split"`` cuts each row into three parts with their own rings, freed as soon as
their last reader is done: values [0, 256) ("lo", read by Sᵀ and Vᵀ half 0 in iteration
it - 1) and the rotary part (Sᵀ only) in 2 slots, values [256, 512) ("hi", read by Sᵀ in
iteration it - 1 and Vᵀ half 1 in iteration it) in 3 slots: 2 x 20 + 3 x 16 KB + Q + P = 101
KB (2 programs per SM). Block b's lo part is issued at the top of iteration b - 2, its hi part
in the middle of iteration b - 3, so each part has one to 1.5 iterations to land (cp.async
groups, in commit order: lo0 hi0 hi1 lo1 hi2, then per iteration lo(it + 2), hi(it + 3)).
``"_fold"``: each warp's max over its 16 rows goes to shared memory before the CTA barrier
that frees a ring slot and the 4 are read after it, where the reduction over axis 0 takes two
barriers of its own; the next Vᵀ half 0 is read before that barrier too (a ring read after
the gather would make the compiler add one). sm_90, 16 heads, split plans: full 746
instructions and 5 CTA barriers per block, 255 registers; full_fold 739 / 3, 254; split 834 /
6 (the compiler adds a barrier between the lo refill and Sᵀ), split_fold 839 / 3 (lo refill
before the top barrier, its slot's last read being before the previous one); no spills in
the loop.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mate.ops.sparse_mla.decode_gluon_small_h import _issue_qk, _online_softmax
from mate.ops.sparse_mla.gluon_common import (
    _gather_next,
    _gather_prologue,
    _load_query,
    _split_slots,
    _store_result,
    launch_decode,
)

__all__ = ["sparse_mla_decode_small_h_wg_kernel", "sparse_mla_decode_gluon_small_h_wg", "WG_NUM_WARPS",
           "WG_VARIANT", "WG_VARIANTS", "variant_constexprs"]

WG_BLOCK_N = 64
WG_NUM_WARPS = 4
# Shared memory of one program that lets 2 share an SM (228 KB, 1 KB reserved per program).
WG_SMEM_LIMIT = 113 * 1024
# Variants: the ring ("full" or "split", see the module docstring); "_fold": the row maximum of
# Sᵀ crosses the warps through the CTA barrier that frees the ring slot (each warp stores its
# 16 rows' maxima before it, every thread reads the 4 after it) instead of a reduction with
# two barriers of its own. Plans use WG_VARIANT.
WG_VARIANTS = ("full", "split", "full_fold", "split_fold")
WG_VARIANT = "full"


def variant_constexprs(variant: str) -> dict:
    """Kernel constexprs of a variant of ``WG_VARIANTS`` (``STAGES`` excepted: the split ring
    has fixed depths and takes 3)."""
    if variant not in WG_VARIANTS:
        raise ValueError(f"variant must be one of {WG_VARIANTS}, got {variant!r}")
    return {"SPLIT_RING": variant.startswith("split"), "FOLD_MAX": variant.endswith("_fold")}


@gluon.jit
def _load_query_halves(q_ptr, bt, H, BLOCK_H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                       G_L: gl.constexpr, R_L: gl.constexpr, K_SL: gl.constexpr, R_SL: gl.constexpr):
    """The query's values [0, 256), [256, 512) and rotary part in three shared tiles."""
    D_ROW: gl.constexpr = D_V + D_R
    offs_hg = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, G_L))
    q_rows = (bt * H + offs_hg.to(gl.int64)) * D_ROW
    offs_vg = gl.arange(0, 256, layout=gl.SliceLayout(0, G_L))
    q_a = gl.load(q_ptr + (q_rows[:, None] + offs_vg[None, :]), mask=(offs_hg < H)[:, None], other=0.0)
    q_b = gl.load(q_ptr + (q_rows[:, None] + 256 + offs_vg[None, :]), mask=(offs_hg < H)[:, None], other=0.0)
    offs_hr = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, R_L))
    qr_rows = (bt * H + offs_hr.to(gl.int64)) * D_ROW + D_V
    offs_r = gl.arange(0, D_R, layout=gl.SliceLayout(0, R_L))
    q_rope = gl.load(q_ptr + (qr_rows[:, None] + offs_r[None, :]), mask=(offs_hr < H)[:, None], other=0.0)
    qa_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 256], K_SL, q_a)
    qb_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, 256], K_SL, q_b)
    qr_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_H, D_R], R_SL, q_rope)
    return qa_smem, qb_smem, qr_smem


@gluon.jit
def _tokens(idx_row, start, hi, BLOCK_N: gl.constexpr, L: gl.constexpr):
    """Top-k entries of slots [start, start + BLOCK_N) in the row layout of ``L`` (-1 past hi)."""
    offs = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
    return gl.load(idx_row + offs, mask=offs < hi, other=-1)


@gluon.jit
def _issue_part(kv_ptr, tok, num_tokens, buf, COL0: gl.constexpr, WIDTH: gl.constexpr, D_ROW: gl.constexpr,
                L: gl.constexpr):
    """cp.async of columns [COL0, COL0 + WIDTH) of rows ``tok`` into ``buf`` (invalid rows
    masked: zero-filled, never read); commits nothing."""
    valid = (tok >= 0) & (tok < num_tokens)
    row = gl.where(valid, tok, 0).to(gl.int64) * D_ROW + COL0
    offs = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, L))
    async_copy.async_copy_global_to_shared(buf, kv_ptr + (row[:, None] + offs[None, :]), mask=valid[:, None])


@gluon.jit
def _gather_lo(kv_ptr, tok, tok_r, num_tokens, a_ring, r_ring, block, D_ROW: gl.constexpr, G_L: gl.constexpr,
               R_L: gl.constexpr):
    """Split ring: values [0, 256) and the rotary part of ``block`` into lo slot block % 2."""
    _issue_part(kv_ptr, tok, num_tokens, a_ring.index(block % 2), 0, 256, D_ROW, G_L)
    _issue_part(kv_ptr, tok_r, num_tokens, r_ring.index(block % 2), 512, 64, D_ROW, R_L)
    async_copy.commit_group()


@gluon.jit
def _gather_hi(kv_ptr, tok, num_tokens, b_ring, block, D_ROW: gl.constexpr, G_L: gl.constexpr):
    """Split ring: values [256, 512) of ``block`` into hi slot block % 3."""
    _issue_part(kv_ptr, tok, num_tokens, b_ring.index(block % 3), 256, 256, D_ROW, G_L)
    async_copy.commit_group()


@gluon.jit
def _issue_qk_split(a_ring, b_ring, r_ring, block, qa_smem, qb_smem, qr_smem, s_zero):
    """Sᵀ = K·Qᵀ of ``block`` from the three rings of the split variant (asynchronous)."""
    s = warpgroup_mma(a_ring.index(block % 2), qa_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma(b_ring.index(block % 3), qb_smem.permute((1, 0)), s, is_async=True)
    return warpgroup_mma(r_ring.index(block % 2), qr_smem.permute((1, 0)), s, is_async=True)


@gluon.jit
def _partial_max(s, tok, num_tokens, qk_scale_log2, m_buf, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr):
    """Masks and scales Sᵀ (log2 domain) and stores each warp's max over its 16 rows of every
    head into ``m_buf`` [4, BLOCK_H] (read after the next CTA barrier by ``_softmax_partials``)."""
    valid = (tok >= 0) & (tok < num_tokens)
    s = gl.where(valid[:, None], s * qk_scale_log2, float("-inf"))
    m_buf.store(gl.max(gl.reshape(s, [4, BLOCK_N // 4, BLOCK_H]), 1))
    return s


@gluon.jit
def _softmax_partials(s, m_buf, ML: gl.constexpr, S_L: gl.constexpr, m_i, l_acc):
    """The online softmax step of ``_online_softmax`` from the warps' maxima in ``m_buf``."""
    m_blk = gl.convert_layout(gl.max(m_buf.load(ML), 0), gl.SliceLayout(0, S_L), assert_trivial=True)
    m_new = gl.maximum(m_i, m_blk)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # all-invalid so far: no NaN
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[None, :])
    l_acc = l_acc * alpha[None, :] + p
    return p, alpha, m_new, l_acc


@gluon.jit
def _perm_half(m):
    """Value index (within its half of 256) held by row ``m`` of an Oᵀ half (bits of m, high
    to low: d2 d1 | d7 d6 | d0 | d5 d4 d3)."""
    return ((m & 7) << 3) | ((m >> 3) & 1) | (((m >> 4) & 3) << 6) | (((m >> 6) & 1) << 1) | (((m >> 7) & 1) << 2)


@gluon.jit
def _load_vt_half(v_tile, VL_L: gl.constexpr, A_L: gl.constexpr, BLOCK_N: gl.constexpr):
    """Vᵀ of a [BLOCK_N, 256] tile of values as the fp16 A operand in registers (rows
    permuted, see ``_perm_half``). Widening before the renaming: each F2FP gives a (d, d + 1)
    pair of one row and one PRMT per register pairs the rows (sm_90, full ring: 746
    instructions per block); renaming the e4m3 bytes first and widening in the operand layout
    compiled to 1097."""
    v = v_tile.load(VL_L).to(gl.float16)  # [BLOCK_N, 256]
    # d = D76 | D543 | D21 | d0  ->  m = D21 | D76 | d0 | D543
    v = gl.reshape(v, [BLOCK_N, 4, 8, 4, 2])
    v = gl.permute(v, (3, 1, 4, 2, 0))
    v = gl.reshape(v, [256, BLOCK_N])
    return gl.convert_layout(v, A_L, assert_trivial=True)


@gluon.jit
def sparse_mla_decode_small_h_wg_kernel(
    q_ptr,
    kv_ptr,
    idx_ptr,
    seq_lens_ptr,
    out_ptr,
    lse_ptr,
    po_ptr,
    plse_ptr,
    num_tokens,
    qk_scale_log2,
    out_scale,
    H,
    q_len,
    top_k,
    split_blocks,
    num_splits,
    SPLIT: gl.constexpr,
    HAS_SEQ_LENS: gl.constexpr,
    STAGES: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLIT_RING: gl.constexpr,
    FOLD_MAX: gl.constexpr,
    D_V: gl.constexpr,
    D_R: gl.constexpr,
):
    """One program (one warpgroup): ``BLOCK_H`` (16 or 32, >= H) heads of one query position
    over ``split_blocks`` blocks of 64 top-k slots; grid (splits, B * q_len)."""
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(D_V == 512)
    gl.static_assert((BLOCK_H == 16) or (BLOCK_H == 32))

    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # 4 rows per thread
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    # Vᵀ half loads on the ring tile [rows, 256 values]: registers = 8 contiguous values and
    # rows +1, +8, +16, +32; lanes = rows +2, +4, values +8, +16, +32; warps = values +64, +128.
    VL_L: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128]],
        block_bases=[],
        shape=[BLOCK_N, 256],
    )
    K_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    R_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    F16_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # FOLD_MAX: the 4 warps' row maxima [4, BLOCK_H] of Sᵀ, read back with all 4 in every
    # thread and the heads where SliceLayout(0, S_L) has them (columns +1, +8, +16 in
    # registers, +2, +4 on lanes).
    if BLOCK_H == 16:
        ML: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 8], [1, 0], [2, 0]], lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
            warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, BLOCK_H])
    else:
        ML: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 8], [0, 16], [1, 0], [2, 0]], lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
            warp_bases=[[0, 0], [0, 0]], block_bases=[], shape=[4, BLOCK_H])
    M_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])

    pid_s = gl.program_id(0)
    bt = gl.program_id(1).to(gl.int64)

    D_ROW: gl.constexpr = D_V + D_R
    if SPLIT_RING:
        gl.static_assert(STAGES == 3)
        qa_smem, qb_smem, qr_smem = _load_query_halves(q_ptr, bt, H, BLOCK_H, D_V, D_R, G_L, R_L, K_SL, R_SL)
        a_ring = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_N, 256], K_SL)
        b_ring = gl.allocate_shared_memory(gl.float8e4nv, [3, BLOCK_N, 256], K_SL)
        r_ring = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_N, D_R], R_SL)
    else:
        qa_smem, qr_smem = _load_query(q_ptr, bt, H, 0, BLOCK_H, D_V, D_R, G_L, R_L, K_SL, R_SL)
        k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_V], K_SL)
        r_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_R], R_SL)
    p_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_H, BLOCK_N], F16_SL)
    if FOLD_MAX:
        m_buf = gl.allocate_shared_memory(gl.float32, [4, BLOCK_H], M_SL)

    lo, hi, n_iter, idx_row = _split_slots(idx_ptr, seq_lens_ptr, bt, pid_s, q_len, top_k, split_blocks,
                                           HAS_SEQ_LENS, BLOCK_N)
    if SPLIT_RING:
        # commit order lo0 hi0 hi1 lo1 hi2 (see the module docstring)
        _gather_lo(kv_ptr, _tokens(idx_row, lo, hi, BLOCK_N, G_L), _tokens(idx_row, lo, hi, BLOCK_N, R_L),
                   num_tokens, a_ring, r_ring, 0, D_ROW, G_L, R_L)
        for j in gl.static_range(2):
            _gather_hi(kv_ptr, _tokens(idx_row, lo + j * BLOCK_N, hi, BLOCK_N, G_L), num_tokens, b_ring, j, D_ROW,
                       G_L)
        _gather_lo(kv_ptr, _tokens(idx_row, lo + BLOCK_N, hi, BLOCK_N, G_L),
                   _tokens(idx_row, lo + BLOCK_N, hi, BLOCK_N, R_L), num_tokens, a_ring, r_ring, 1, D_ROW, G_L, R_L)
        _gather_hi(kv_ptr, _tokens(idx_row, lo + 2 * BLOCK_N, hi, BLOCK_N, G_L), num_tokens, b_ring, 2, D_ROW, G_L)
        # entries of the next gathers: tok_a / tok_r lo(2), tok_b hi(3) then lo(3)
        tok_a = _tokens(idx_row, lo + 2 * BLOCK_N, hi, BLOCK_N, G_L)
        tok_r = _tokens(idx_row, lo + 2 * BLOCK_N, hi, BLOCK_N, R_L)
        tok_b = _tokens(idx_row, lo + 3 * BLOCK_N, hi, BLOCK_N, G_L)
    else:
        tok_g, tok_r = _gather_prologue(kv_ptr, idx_row, lo, hi, num_tokens, k_ring, r_ring, STAGES, BLOCK_N, D_V,
                                        D_R, G_L, R_L)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, S_L))
    l_acc = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_L)
    acc0 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    acc1 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    s_zero = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=S_L)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, S_L))
    tok_s = gl.load(idx_row + lo + offs_ns, mask=lo + offs_ns < hi, other=-1)

    if SPLIT_RING:
        async_copy.wait_group(3)  # lo0 and hi0 landed
        fence_async_shared()
        gl.thread_barrier()
        s = _issue_qk_split(a_ring, b_ring, r_ring, 0, qa_smem, qb_smem, qr_smem, s_zero)
    else:
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        gl.thread_barrier()
        tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, STAGES - 1, hi, num_tokens, k_ring, r_ring, lo,
                                    STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        s = _issue_qk(k_ring, r_ring, 0, qa_smem, qr_smem, s_zero)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    tok = tok_s
    slots_next = lo + BLOCK_N + offs_ns
    tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
    p, alpha, m_i, l_acc = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc)
    p_smem.index(0).store(gl.permute(p.to(gl.float16), (1, 0)))
    if SPLIT_RING:
        vt0 = _load_vt_half(a_ring.index(0), VL_L, A_L, BLOCK_N)
    else:
        vt0 = _load_vt_half(k_ring.index(0).slice(0, 256, dim=1), VL_L, A_L, BLOCK_N)
    for it in range(n_iter):
        # block it + 1 landed; P and Vᵀ half 0 of block it staged
        if SPLIT_RING:
            async_copy.wait_group(1)  # all but hi(it + 2)
            # lo slot of block it: Sᵀ and Vᵀ half 0 of it are done (with FOLD_MAX before the
            # last barrier: refilled before this one, so the compiler adds none before Sᵀ)
            if FOLD_MAX:
                _gather_lo(kv_ptr, tok_a, tok_r, num_tokens, a_ring, r_ring, it + 2, D_ROW, G_L, R_L)
            fence_async_shared()
            gl.thread_barrier()
            if not FOLD_MAX:
                _gather_lo(kv_ptr, tok_a, tok_r, num_tokens, a_ring, r_ring, it + 2, D_ROW, G_L, R_L)
            s = _issue_qk_split(a_ring, b_ring, r_ring, it + 1, qa_smem, qb_smem, qr_smem, s_zero)
        else:
            # its slot is refilled once Vᵀ half 1 is read, after the second barrier
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
            gl.thread_barrier()
            cur = it % STAGES  # (computed first: the sm_90 compile of the rest then does not spill)
            s = _issue_qk(k_ring, r_ring, (it + 1) % STAGES, qa_smem, qr_smem, s_zero)
        p_op = p_smem.index(it % 2).permute((1, 0))
        acc0 = warpgroup_mma(vt0, p_op, acc0, is_async=True)
        if SPLIT_RING:
            vt1 = _load_vt_half(b_ring.index(it % 3), VL_L, A_L, BLOCK_N)
        else:
            vt1 = _load_vt_half(k_ring.index(cur).slice(256, 256, dim=1), VL_L, A_L, BLOCK_N)
        acc1 = warpgroup_mma(vt1, p_op, acc1, is_async=True)
        s, acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(s, acc0))  # Sᵀ of it + 1 and P·V half 0 done
        tok = tok_s
        if FOLD_MAX:  # the warps' maxima cross the barrier below (no barriers of a reduction)
            s = _partial_max(s, tok, num_tokens, qk_scale_log2, m_buf, BLOCK_N, BLOCK_H)
            # Vᵀ half 0 of block it + 1 read before the barrier, so that no ring write follows a
            # read without one between (else the compiler inserts a CTA barrier)
            if SPLIT_RING:
                vt0 = _load_vt_half(a_ring.index((it + 1) % 2), VL_L, A_L, BLOCK_N)
            else:
                vt0 = _load_vt_half(k_ring.index((it + 1) % STAGES).slice(0, 256, dim=1), VL_L, A_L, BLOCK_N)
        gl.thread_barrier()  # every thread has read Vᵀ half 1 of block it: refill its slot
        if SPLIT_RING:
            _gather_hi(kv_ptr, tok_b, num_tokens, b_ring, it + 3, D_ROW, G_L)
            # block it + 3's entries serve its lo part too (next iteration's top)
            tok_a = tok_b
            tok_b = _tokens(idx_row, lo + (it + 4) * BLOCK_N, hi, BLOCK_N, G_L)
            tok_r = _tokens(idx_row, lo + (it + 3) * BLOCK_N, hi, BLOCK_N, R_L)
        else:
            tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring,
                                        lo, STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        slots_next = lo + (it + 2) * BLOCK_N + offs_ns
        tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
        if FOLD_MAX:
            p, alpha, m_i, l_acc = _softmax_partials(s, m_buf, ML, S_L, m_i, l_acc)
        else:
            p, alpha, m_i, l_acc = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc)
        p_smem.index((it + 1) % 2).store(gl.permute(p.to(gl.float16), (1, 0)))
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        acc0 = acc0 * alpha_o
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        acc1 = acc1 * alpha_o
        # after P·V half 1: one Vᵀ half live
        if not FOLD_MAX:
            if SPLIT_RING:
                vt0 = _load_vt_half(a_ring.index((it + 1) % 2), VL_L, A_L, BLOCK_N)
            else:
                vt0 = _load_vt_half(k_ring.index((it + 1) % STAGES).slice(0, 256, dim=1), VL_L, A_L, BLOCK_N)

    async_copy.wait_group(0)
    gl.thread_barrier()
    m_o = gl.arange(0, 256, layout=gl.SliceLayout(1, O_L))
    offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, O_L))
    offs_hl = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, S_L))
    l_i = gl.sum(l_acc, 0)
    _store_result(acc0, m_i, l_i, offs_h[None, :], _perm_half(m_o)[:, None], offs_hl, out_ptr, lse_ptr, po_ptr,
                  plse_ptr, out_scale, H, bt, pid_s, num_splits, 1, SPLIT, D_V)
    _store_result(acc1, m_i, l_i, offs_h[None, :], 256 + _perm_half(m_o)[:, None], offs_hl, out_ptr, lse_ptr,
                  po_ptr, plse_ptr, out_scale, H, bt, pid_s, num_splits, 1, SPLIT, D_V)


def sparse_mla_decode_gluon_small_h_wg(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    bmm1_scale: float,
    bmm2_scale: float,
    block_h: int,
    num_splits: int,
    split_blocks: int,
    num_stages: int = 2,
    variant: str = WG_VARIANT,
) -> None:
    """Launches the one-warpgroup small-H decode (contract of
    ``sparse_mla_decode_gluon_small_h``; ``num_stages`` 2 or 3, ignored by the split ring;
    ``variant`` one of ``WG_VARIANTS``). No allocation, no host sync."""
    H = query.shape[2]
    if block_h < H or block_h not in (16, 32):
        raise ValueError(f"the small-H Gluon kernel needs block_h 16 or 32 and H <= block_h, got H={H}, "
                         f"block_h={block_h}")
    if num_stages not in (2, 3):
        raise ValueError(f"num_stages must be 2 or 3 for the one-warpgroup kernel, got {num_stages}")
    constexprs = variant_constexprs(variant)
    if constexprs["SPLIT_RING"]:
        num_stages = 3
    launch_decode(sparse_mla_decode_small_h_wg_kernel, (), query, kv_rows, block_tables, seq_lens, out, lse, partial_o,
                  partial_lse, bmm1_scale, bmm2_scale, num_splits, split_blocks, (block_h, 8, 6, 64, True),
                  WG_NUM_WARPS, STAGES=num_stages, BLOCK_H=block_h, BLOCK_N=WG_BLOCK_N, **constexprs)
