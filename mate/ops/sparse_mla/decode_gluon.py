"""Gluon kernel of the FP8 sparse MLA decode for Hopper (sm_90), 64 heads per program.

On Hopper, ``plan_decode`` selects it for H > 32 without a split or with splits of at least
``GLUON_MIN_SPLIT_BLOCKS`` (2) blocks (``gluon=True`` forces it); the plain-Triton kernels of
``decode.py`` run shorter splits and every other device. Gluon
cannot run under Triton's interpreter, so on the CPU the plan option falls back to the
plain kernel; the kernel is checked against the reference by the GPU tests in
``tests/sparse_mla/test_decode_gluon.py``.

Same problem and outputs as ``sparse_mla_decode_split_kernel`` (heads on M, 64 heads per
program, split-K over the top-k list + the shared combine kernel), but with explicit
layouts and data movement:

* 8 warps = 2 warpgroups. S = Q·Kᵀ [64 heads, 64 rows] is split by rows between the
  warpgroups (wgmma warps ``[4, 2]``: each computes 64 x 32 on FP8 tensor cores, QGMMA),
  so the Q·Kᵀ work is not duplicated as in the plain kernel. O [64, 512] fp32 is split by
  the value dimension (each warpgroup 64 x 256, 128 registers per thread).
* Gathered rows arrive with ``cp.async`` (16-byte pieces of each 576-byte row, masked
  rows zero-filled and never read) into a ring of ``STAGES`` shared-memory buffers in the
  wgmma (NVMMA, 128-byte swizzled) layout. K rows are contiguous along the reduction
  dimension, i.e. K-major, as FP8 wgmma needs for its B operand.
* Online softmax in fp32 registers (``exp2``, log2(e)-folded scale).
* P·V: P rounded to fp16 into a shared tile, the V tile (the first 512 values of the same
  rows) read back from the ring, widened e4m3 -> fp16 (exact) into a shared tile (B
  operand, N-major, allowed for 16-bit wgmma: HGMMA).
* Schedule (FlashAttention-3's intra-warpgroup overlap): Q·Kᵀ of block j + 1 is issued
  before P·V of block j, so the softmax of block j + 1 runs on the CUDA cores while the
  tensor cores do P·V of block j (H200, B=64 H=128 top-k 2048: 97.6 us, against 113 us for
  the serial schedule it replaced: Q·Kᵀ, softmax, P·V one after the other).
* Per block only the row max crosses the warpgroups (one barrier); the row sums stay per
  warpgroup until the epilogue, and the wgmma are issued before the next gather. This took
  the loop from 8 barriers to 4 (H200, interleaved with FlashMLA: B=64 H=128 94.5 us
  against 97.8, FlashMLA 94.1; B=128 q2 352.8 against 363.9, FlashMLA 367.5).
* P is double-buffered and each warpgroup widens only its own half of V, so a warpgroup
  that has waited for its own P·V never overwrites a tile the other one still reads.
* P·V runs as two async groups over 32 keys each, with V in two half tiles: once the first
  group is done, the next block's first 32 V rows are widened while the second group still
  runs, so half of the widening leaves the serial part of the step (H200, interleaved with
  FlashMLA: B=64 H=128 90.4 us against 95.3, FlashMLA 95.2; B=128 q2 344.7 against 358.7,
  FlashMLA 372.2; bit-identical outputs).
* The output goes out in 16-byte stores of 8 consecutive values (the rounded tile converted
  to ``OUT_L`` through shared memory the ring no longer needs: 16 ``STS.128`` + 16 ``LDSM``
  per thread) instead of the accumulator layout's 64 four-byte stores (H200, session 24,
  interleaved, bit-identical, us: B=64 q1 H=128 88.6 -> 84.2, B=128 q2 H=128 336.5 -> 322.8,
  B=128 q1 H=64 90.5 -> 85.7, B=32 q1 H=128 2 splits 55.7 -> 50.6).
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

from mate._core.triton_helpers import cdiv
from mate.ops.sparse_mla.gluon_common import (
    _gather_next,
    _gather_prologue,
    _load_query,
    _signal_dependents,
    _split_slots,
    _store_result,
    assert_matches_reference,
    launch_decode,
    self_check_problem,
)
from mate.ops.sparse_mla.gluon_common import probe_in_subprocess as _probe
from mate.ops.sparse_mla.metadata import GLUON_STAGES

__all__ = ["sparse_mla_decode_gluon_kernel", "sparse_mla_decode_gluon", "GLUON_BLOCK_H", "GLUON_NUM_WARPS"]

GLUON_BLOCK_H = 64  # heads per program (the wgmma M)
GLUON_BLOCK_N = 64  # gathered rows per step
GLUON_NUM_WARPS = 8  # two warpgroups


@gluon.jit
def _issue_qk(q_smem, qr_smem, k_ring, r_ring, slot, s_zero):
    """S = Q·Kᵀ (512 + 64) of the block in ring ``slot`` on FP8 tensor cores, issued
    asynchronously (both operands from shared memory)."""
    s = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(qr_smem, r_ring.index(slot).permute((1, 0)), s, is_async=True)


@gluon.jit
def _stage_v_half(k_slot, v_half, h: gl.constexpr, VC_L: gl.constexpr):
    """Keys [32 h, 32 h + 32) of V (e4m3 -> fp16, exact) into the shared half tile."""
    HALF: gl.constexpr = v_half.shape[0]
    v_half.store(k_slot.slice(h * HALF, HALF, dim=0).load(VC_L).to(gl.float16))


@gluon.jit
def _issue_pv(p_buf, v_lo, v_hi, acc):
    """O += P·V as two async groups, keys [0, 32) then [32, 64)."""
    HALF: gl.constexpr = v_lo.shape[0]
    acc = warpgroup_mma(p_buf.slice(0, HALF, dim=1), v_lo, acc, is_async=True)
    return warpgroup_mma(p_buf.slice(HALF, HALF, dim=1), v_hi, acc, is_async=True)


@gluon.jit
def _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_wg, red_smem):
    """One block of the online softmax (log2 domain): masks invalid slots, returns P, the
    rescale factor of the previous blocks and the updated running max and per-warpgroup
    sums.

    S is split by keys between the two warpgroups (``[64 heads, 2, 32 keys]``). Only the
    row max crosses them, through ``red_smem`` [64, 2] and one barrier; the row sums stay
    per warpgroup (``l_wg`` [64, 2]) until the epilogue adds them. (A plain ``gl.max`` /
    ``gl.sum`` over all 64 keys cost five barriers per block.)"""
    BLOCK_H: gl.constexpr = s.shape[0]
    BLOCK_N: gl.constexpr = s.shape[1]
    valid = (tok >= 0) & (tok < num_tokens)
    s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    s3 = gl.reshape(s, [BLOCK_H, 2, BLOCK_N // 2])
    m_wg = gl.max(s3, 2)  # [64, 2]: each warpgroup's column
    red_smem.store(m_wg)
    gl.thread_barrier()
    m_blk = gl.maximum(gl.max(red_smem.slice(0, 1, dim=1).load(m_wg.type.layout), 1),
                       gl.max(red_smem.slice(1, 1, dim=1).load(m_wg.type.layout), 1))
    m_new = gl.maximum(m_i, m_blk)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # all-invalid so far: no NaN
    alpha = gl.exp2(m_i - m_use)
    p3 = gl.exp2(s3 - gl.expand_dims(gl.expand_dims(m_use, 1), 2))
    l_wg = l_wg * gl.expand_dims(alpha, 1) + gl.sum(p3, 2)
    return gl.reshape(p3, [BLOCK_H, BLOCK_N]), alpha, m_new, l_wg


@gluon.jit
def sparse_mla_decode_gluon_kernel(
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
    D_V: gl.constexpr,
    D_R: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """One program: ``BLOCK_H`` (64) heads of one query position over ``split_blocks``
    blocks of ``BLOCK_N`` (64) top-k slots; grid (head tiles, splits, B * q_len)."""
    gl.static_assert(BLOCK_H == 64)
    gl.static_assert(BLOCK_N == 64)

    # Register layouts (8 warps). G_L / R_L: 16 contiguous bytes per thread for the loads
    # and cp.async of 512- and 64-byte row pieces.
    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0])
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    # V widening (ring -> fp16 half tile of 32 rows): a warp covers 8 rows x 64 values, i.e. one 128-byte
    # swizzle atom of the fp16 tile, so its stores are free of bank conflicts (row-wide
    # warps, as in G_L, put all eight 128-byte column blocks of a row on the same banks).
    # Warpgroup w widens only the value columns [256 w, 256 w + 256) that its own P·V
    # reads (warp bit 2 -> column 256), so a warpgroup that has waited for its P·V may
    # overwrite its half while the other warpgroup's P·V still reads the other half.
    VC_L: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 64], [0, 128]],
        lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[8, 0], [16, 0], [0, 256]],
        block_bases=[],
        shape=[BLOCK_N // 2, D_V],
    )
    # S [64 heads, 64 rows]: warpgroups side by side on N (32 gathered rows each); k = 32 for FP8.
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 32])
    # O [64, 512]: each warpgroup owns 256 value columns; k = 16 for fp16.
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    # Shared layouts: 128-byte swizzle for 512-byte fp8 rows and the fp16 V and P tiles, 64
    # for the 64-byte rotary rows.
    K_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    R_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    V_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    pid_h = gl.program_id(0)
    pid_s = gl.program_id(1)
    bt = gl.program_id(2).to(gl.int64)  # query position b * q_len + t
    _signal_dependents(bt, PDL)  # a split plan's combine may launch (PDL)

    q_smem, qr_smem = _load_query(q_ptr, bt, H, pid_h * BLOCK_H, BLOCK_H, D_V, D_R, G_L, R_L, K_SL, R_SL)

    k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_V], K_SL)
    r_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D_R], R_SL)
    v_lo = gl.allocate_shared_memory(gl.float16, [BLOCK_N // 2, D_V], V_SL)
    v_hi = gl.allocate_shared_memory(gl.float16, [BLOCK_N // 2, D_V], V_SL)

    lo, hi, n_iter, idx_row = _split_slots(idx_ptr, seq_lens_ptr, bt, pid_s, q_len, top_k, split_blocks,
                                           HAS_SEQ_LENS, BLOCK_N)
    tok_g, tok_r = _gather_prologue(kv_ptr, idx_row, lo, hi, num_tokens, k_ring, r_ring, STAGES, BLOCK_N, D_V, D_R,
                                    G_L, R_L)

    # running max [64] and per-warpgroup sums [64, 2] in the layouts of the softmax's
    # [64 heads, 2 warpgroups, 32 keys] view of S (see _online_softmax)
    l_wg = gl.sum(gl.reshape(gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L), [BLOCK_H, 2, BLOCK_N // 2]), 2)
    m_i = gl.max(l_wg, 1) + float("-inf")
    red_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H, 2], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, layout=O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    offs_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    tok_s = gl.load(idx_row + lo + offs_ns, mask=lo + offs_ns < hi, other=-1)

    # FlashAttention-3's intra-warpgroup overlap: Q·Kᵀ of block it + 1 is issued before
    # P·V of block it, so the softmax of block it + 1 runs on the CUDA cores while the
    # tensor cores do P·V of block it (wgmma groups retire in order: a wait with one
    # group outstanding leaves the P·V running). P goes through shared memory (both
    # warpgroups read all of it); every wait is in the iteration that issued the wgmma
    # (ptxas serializes wgmma whose accumulators are waited for across the back-edge).
    # P of block j goes to buffer j % 2: a warpgroup writes P of block it + 1 once its
    # own P·V of block it is done, while the other warpgroup's may still read P of block it.
    p_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_H, BLOCK_N], V_SL)
    async_copy.wait_group(STAGES - 2)  # block 0 landed
    fence_async_shared()
    gl.thread_barrier()
    tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, STAGES - 1, hi, num_tokens, k_ring, r_ring, lo, STAGES,
                                BLOCK_N, D_V, D_R, G_L, R_L)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_qk(q_smem, qr_smem, k_ring, r_ring, 0, s_zero),))
    tok = tok_s
    slots_next = lo + BLOCK_N + offs_ns
    tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
    p, alpha, m_i, l_wg = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_wg, red_smem)
    p_smem.index(0).store(p.to(gl.float16))
    _stage_v_half(k_ring.index(0), v_lo, 0, VC_L)
    _stage_v_half(k_ring.index(0), v_hi, 1, VC_L)
    for it in range(n_iter):
        # block it + 1 landed; P and V of block it are in shared memory; every thread is
        # done with block it's ring slot, refilled next
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        gl.thread_barrier()
        nxt = (it + 1) % STAGES
        s = _issue_qk(q_smem, qr_smem, k_ring, r_ring, nxt, s_zero)
        acc = _issue_pv(p_smem.index(it % 2), v_lo, v_hi, acc)
        tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring, lo,
                                    STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        s = warpgroup_mma_wait(num_outstanding=2, deps=(s,))  # Q·Kᵀ of block it + 1 done
        tok = tok_s
        slots_next = lo + (it + 2) * BLOCK_N + offs_ns
        tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
        # (past the last block every slot is masked: p = 0, alpha = 1 or, for a row
        # without any valid slot so far, 0 on a zero accumulator)
        p, alpha, m_i, l_wg = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_wg, red_smem)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # first half of P·V of block it done
        _stage_v_half(k_ring.index(nxt), v_lo, 0, VC_L)  # while the second half runs
        p_smem.index((it + 1) % 2).store(p.to(gl.float16))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))  # P·V of block it done
        _stage_v_half(k_ring.index(nxt), v_hi, 1, VC_L)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]

    # The (masked, zero-filling) copies issued past the last block land before any thread
    # reuses shared memory for the epilogue's layout conversions.
    async_copy.wait_group(0)
    gl.thread_barrier()

    # the output layout: each thread 8 consecutive values of a head (one 16-byte store)
    OUT_L: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32], [0, 64], [0, 128]],
        lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0], [0, 256]],
        block_bases=[],
        shape=[BLOCK_H, D_V],
    )
    offs_h = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, OUT_L))
    offs_v = gl.arange(0, D_V, layout=gl.SliceLayout(0, OUT_L))
    offs_hl = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=m_i.type.layout)
    _store_result(acc, m_i, gl.sum(l_wg, 1), offs_h[:, None], offs_v[None, :], offs_hl, out_ptr, lse_ptr, po_ptr,
                  plse_ptr, out_scale, H, bt, pid_s, num_splits, 0, SPLIT, D_V, 1.0, OUT_L)


def sparse_mla_decode_gluon(
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
    num_splits: int,
    split_blocks: int,
    num_stages: int = GLUON_STAGES,
    pdl: bool = False,
) -> None:
    """Launches the Gluon decode on validated CUDA tensors (same contract as
    ``sparse_mla_decode_triton`` with ``block_h`` 64): ``query`` [B, q_len, H, 576] e4m3,
    ``kv_rows`` [tokens, 576] e4m3, ``block_tables`` int32 [B, q_len, top_k], ``seq_lens``
    int32 [B] or None, ``out`` bf16 [B, q_len, H, 512], ``lse`` fp32 (B * q_len * H), all
    contiguous; ``partial_o`` / ``partial_lse`` the plan's split scratch (used when
    ``num_splits > 1``, merged by the plain-Triton combine kernel; with ``pdl`` launched as a
    programmatic dependent of the decode). No allocation, no host sync."""
    launch_decode(sparse_mla_decode_gluon_kernel, (cdiv(query.shape[2], GLUON_BLOCK_H),), query, kv_rows,
                  block_tables, seq_lens, out, lse, partial_o, partial_lse, bmm1_scale, bmm2_scale, num_splits,
                  split_blocks, (GLUON_BLOCK_H, GLUON_NUM_WARPS, 5, GLUON_BLOCK_N, False), GLUON_NUM_WARPS,
                  pdl=pdl, STAGES=num_stages, BLOCK_H=GLUON_BLOCK_H, BLOCK_N=GLUON_BLOCK_N)


def _self_check() -> None:
    """Decodes two small random problems (split and unsplit plans, invalid slots, an empty
    row) with the Gluon kernel on the current GPU and compares them with the reference;
    raises on a mismatch. Run in a child process by :func:`probe_in_subprocess`."""
    from mate.ops.sparse_mla.metadata import plan_decode
    from mate.sparse_mla_interface import sparse_mla_fp8_decode

    for B, q_len, H, top_k, splits in ((3, 2, 128, 2112, None), (2, 1, 64, 2048, 1), (2, 1, 128, 2048, 1)):
        q, kv, idx, sl = self_check_problem(B, q_len, H, top_k)
        md = plan_decode(B, q_len, H, top_k, "cuda", gluon=True, num_splits=splits)
        assert md.gluon
        scale = 576**-0.5
        out, lse = sparse_mla_fp8_decode(q.cuda(), kv.cuda(), None, 128, 512, 64, idx.cuda(), sl.cuda(), 0, top_k,
                                         bmm1_scale=scale, bmm2_scale=1.25, return_lse=True, metadata=md)
        torch.cuda.synchronize()
        assert_matches_reference(out, lse, q, kv, idx, sl, scale, 1.25)


def probe_in_subprocess(timeout_s: float = 240.0) -> str | None:
    """Runs :func:`_self_check` in a child process (``python -m
    mate.ops.sparse_mla.decode_gluon``), so that a kernel that faults cannot poison the
    caller's CUDA context; returns None when it passed, else the reason."""
    return _probe("mate.ops.sparse_mla.decode_gluon", "Gluon decode", timeout_s)


if __name__ == "__main__":
    _self_check()
    print("Gluon sparse MLA decode self-check passed")
