"""Candidate variants of the one-warpgroup small-H Gluon decode (``decode_gluon_small_h2.py``),
selected by the launcher's arguments only (plans and the public op keep the default kernel).

* ``early_refill``: the ring slot of block it is refilled (gather of block it + 2) as soon as
  every thread has loaded the e4m3 bytes of Vᵀ half 1 of block it, before Sᵀ of block it + 1
  is issued, instead of after the Sᵀ / P·V half 0 wait. In the default kernel that gather is
  issued about half-way through iteration it and waited for at the top of iteration it + 1,
  so with 2 stages it has about half an iteration to land; here it has about one. Cost: the
  P tile and the landed block get separate fence + barrier pairs (6 CTA barriers per block
  instead of 5) and the bytes of Vᵀ half 1 stay in 32 registers across the barrier.
* ``counters`` (split plans): no combine launch. Each split writes its partial rows, then one
  thread counts the split done (``atomic_add`` acq_rel at GPU scope after a CTA barrier, the
  pattern of a grid barrier); the split that counts last merges all partial rows of its query
  position (the arithmetic of ``sparse_mla_decode_combine_kernel``, partial rows read through
  L2 only) and resets the counter to 0, so the int32 [B * q_len] counters, zero when
  allocated, are zero again after every launch (CUDA-graph replays included).

Gluon does not run under the interpreter; the GPU check is ``_self_check`` (``python -m
mate.ops.sparse_mla.decode_gluon_small_h3``) and the device request's reference checks.
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

from mate.ops.sparse_mla.decode_gluon_small_h import _first_block, _issue_qk, _online_softmax
from mate.ops.sparse_mla.decode_gluon_small_h2 import (
    WG_BLOCK_N,
    WG_NUM_WARPS,
    _load_vt_half,
    _perm_half,
    _widen_vt_half,
)
from mate.ops.sparse_mla.gluon_common import _gather_next, _store_result, launch_decode

__all__ = ["sparse_mla_decode_small_h_wg_var_kernel", "sparse_mla_decode_gluon_small_h_wg_var"]


@gluon.jit
def _combine_splits(po_ptr, plse_ptr, out_ptr, lse_ptr, out_scale, H, bt, num_splits, BLOCK_H: gl.constexpr,
                    D_V: gl.constexpr):
    """LSE-weighted merge of the ``num_splits`` partial rows of query position ``bt`` into
    ``out`` (bf16) / ``lse`` (``sparse_mla_decode_combine_kernel``'s arithmetic)."""
    C_L: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, C_L))
    offs_v = gl.arange(0, D_V, layout=gl.SliceLayout(0, C_L))
    h_mask = offs_h < H
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, C_L))
    for s in range(num_splits):
        m = gl.maximum(m, gl.load(plse_ptr + (bt * num_splits + s) * H + offs_h, mask=h_mask, other=float("-inf"),
                                  cache_modifier=".cg"))
    m_use = gl.where(m == float("-inf"), 0.0, m)
    total = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, C_L))
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, layout=C_L)
    for s in range(num_splits):
        rows = (bt * num_splits + s) * H + offs_h.to(gl.int64)
        lse_s = gl.load(plse_ptr + rows, mask=h_mask, other=float("-inf"), cache_modifier=".cg")
        w = gl.exp(lse_s - m_use)  # 0 for an empty split
        o_s = gl.load(po_ptr + (rows[:, None] * D_V + offs_v[None, :]), mask=(h_mask & (w > 0.0))[:, None],
                      other=0.0, cache_modifier=".cg").to(gl.float32)
        total += w
        acc += w[:, None] * o_s
    empty = total == 0.0
    t_safe = gl.where(empty, 1.0, total)
    o = acc / t_safe[:, None] * out_scale
    lse = gl.where(empty, float("inf"), m_use + gl.log(t_safe))
    o_rows = (bt * H + offs_h.to(gl.int64))[:, None] * D_V
    gl.store(out_ptr + (o_rows + offs_v[None, :]), o.to(gl.bfloat16), mask=h_mask[:, None])
    gl.store(lse_ptr + bt * H + offs_h, lse, mask=h_mask)


@gluon.jit
def sparse_mla_decode_small_h_wg_var_kernel(
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
    counter_ptr,
    SPLIT: gl.constexpr,
    HAS_SEQ_LENS: gl.constexpr,
    STAGES: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D_V: gl.constexpr,
    D_R: gl.constexpr,
    EARLY_REFILL: gl.constexpr,
    FUSE_COMBINE: gl.constexpr,
):
    """``sparse_mla_decode_small_h_wg_kernel`` with the module's variants (grid (splits,
    B * q_len)); ``FUSE_COMBINE`` needs ``SPLIT`` and zeroed ``counter_ptr`` [B * q_len]."""
    gl.static_assert(BLOCK_N == 64)
    gl.static_assert(D_V == 512)
    gl.static_assert((BLOCK_H == 16) or (BLOCK_H == 32))
    gl.static_assert(STAGES == 2)
    gl.static_assert(SPLIT or not FUSE_COMBINE)

    G_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    R_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 32])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_H, 16])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
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

    pid_s = gl.program_id(0)
    bt = gl.program_id(1).to(gl.int64)

    (q_smem, qr_smem, k_ring, r_ring, p_smem, lo, hi, n_iter, idx_row, tok_g, tok_r, tok_s, m_i, l_acc, s_zero,
     offs_ns) = _first_block(q_ptr, kv_ptr, idx_ptr, seq_lens_ptr, bt, pid_s, num_tokens, qk_scale_log2, H, q_len,
                             top_k, split_blocks, HAS_SEQ_LENS, STAGES, BLOCK_H, BLOCK_N, D_V, D_R, G_L, R_L, S_L,
                             K_SL, R_SL, F16_SL)
    acc0 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    acc1 = gl.zeros([256, BLOCK_H], gl.float32, layout=O_L)
    vt0 = _load_vt_half(k_ring.index(0).slice(0, 256, dim=1), VL_L, A_L, BLOCK_N)
    for it in range(n_iter):
        if EARLY_REFILL:
            cur = it % STAGES
            p_op = p_smem.index(it % 2).permute((1, 0))
            fence_async_shared()  # P of block it (stored by every thread) read by the wgmma
            gl.thread_barrier()
            acc0 = warpgroup_mma(vt0, p_op, acc0, is_async=True)
            raw1 = k_ring.index(cur).slice(256, 256, dim=1).load(VL_L)
            async_copy.wait_group(STAGES - 2)  # block it + 1 landed
            fence_async_shared()
            gl.thread_barrier()  # ... for every thread, and every thread has read block it's slot
            tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring,
                                        lo, STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
            s = _issue_qk(k_ring, r_ring, (it + 1) % STAGES, q_smem, qr_smem, s_zero)
            vt1 = _widen_vt_half(raw1, A_L, BLOCK_N)
            acc1 = warpgroup_mma(vt1, p_op, acc1, is_async=True)
            s, acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(s, acc0))  # Sᵀ of it + 1, P·V half 0 done
            tok = tok_s
        else:
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
            gl.thread_barrier()
            cur = it % STAGES  # (here, as in the default kernel: placed first, the loop spills)
            s = _issue_qk(k_ring, r_ring, (it + 1) % STAGES, q_smem, qr_smem, s_zero)
            p_op = p_smem.index(it % 2).permute((1, 0))
            acc0 = warpgroup_mma(vt0, p_op, acc0, is_async=True)
            vt1 = _load_vt_half(k_ring.index(cur).slice(256, 256, dim=1), VL_L, A_L, BLOCK_N)
            acc1 = warpgroup_mma(vt1, p_op, acc1, is_async=True)
            s, acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(s, acc0))
            tok = tok_s
            gl.thread_barrier()
            tok_g, tok_r = _gather_next(kv_ptr, idx_row, tok_g, tok_r, it + STAGES, hi, num_tokens, k_ring, r_ring,
                                        lo, STAGES, BLOCK_N, D_V, D_R, G_L, R_L)
        slots_next = lo + (it + 2) * BLOCK_N + offs_ns
        tok_s = gl.load(idx_row + slots_next, mask=slots_next < hi, other=-1)
        p, alpha, m_i, l_acc = _online_softmax(s, tok, num_tokens, qk_scale_log2, m_i, l_acc)
        p_smem.index((it + 1) % 2).store(gl.permute(p.to(gl.float16), (1, 0)))
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(0, O_L))[None, :]
        acc0 = acc0 * alpha_o
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc1,))
        acc1 = acc1 * alpha_o
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
    if FUSE_COMBINE:
        gl.thread_barrier()  # every thread's partial rows are written before the split is counted
        done = gl.atomic_add(counter_ptr + bt, 1, sem="acq_rel", scope="gpu")
        if done == num_splits - 1:
            gl.store(counter_ptr + bt, 0)
            _combine_splits(po_ptr, plse_ptr, out_ptr, lse_ptr, out_scale, H, bt, num_splits, BLOCK_H, D_V)


def sparse_mla_decode_gluon_small_h_wg_var(
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
    early_refill: bool = False,
    counters: torch.Tensor | None = None,
) -> None:
    """Launches the variant kernel (contract of ``sparse_mla_decode_gluon_small_h_wg`` at 2
    stages). ``counters``: int32 [B * q_len] on the query's device, zero before the first
    launch (left zero by every launch): with a split plan the last split merges the partial
    rows and no combine kernel runs; ignored without a split. No allocation, no host sync."""
    B, q_len, H, _ = query.shape
    if block_h < H or block_h not in (16, 32):
        raise ValueError(f"the small-H Gluon kernel needs block_h 16 or 32 and H <= block_h, got H={H}, "
                         f"block_h={block_h}")
    fuse = counters is not None and num_splits > 1
    if fuse and (counters.dtype != torch.int32 or counters.numel() < B * q_len or counters.device != query.device
                 or not counters.is_contiguous()):
        raise ValueError(f"counters must be a contiguous int32 tensor of at least B * q_len = {B * q_len} elements "
                         f"on {query.device}, got {counters.dtype} {tuple(counters.shape)} on {counters.device}")
    launch_decode(sparse_mla_decode_small_h_wg_var_kernel, (), query, kv_rows, block_tables, seq_lens, out, lse,
                  partial_o, partial_lse, bmm1_scale, bmm2_scale, num_splits, split_blocks, (block_h, 8, 6, 64, True),
                  WG_NUM_WARPS, combine=not fuse, counter_ptr=counters if fuse else block_tables, STAGES=2,
                  BLOCK_H=block_h, BLOCK_N=WG_BLOCK_N, EARLY_REFILL=early_refill, FUSE_COMBINE=fuse)


def _self_check() -> None:
    """Each variant on small random problems (invalid slots, short and empty rows, split and
    unsplit plans), launched twice (the counters must be reset), against the reference."""
    from mate.ops.sparse_mla.gluon_common import assert_matches_reference, self_check_problem
    from mate.ops.sparse_mla.metadata import plan_decode

    scale = 576**-0.5
    for B, q_len, H, top_k, splits in ((3, 2, 16, 2112, 3), (2, 1, 12, 2048, 1), (4, 1, 16, 2048, 2)):
        q, kv, idx, sl = self_check_problem(B, q_len, H, top_k)
        md = plan_decode(B, q_len, H, top_k, "cuda", gluon=True, transposed=True, num_splits=splits, num_warps=4)
        counters = torch.zeros(B * q_len, dtype=torch.int32, device="cuda")
        for early in (False, True):
            for fused in (False, True):
                for _ in range(2):
                    out = torch.full((B, q_len, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
                    lse = torch.full((B * q_len * H,), float("nan"), device="cuda")
                    sparse_mla_decode_gluon_small_h_wg_var(q.cuda(), kv.cuda().view(-1, 576), idx.cuda(), sl.cuda(),
                                                          out, lse, md.partial_o, md.partial_lse, scale, 1.25,
                                                          md.block_h, md.num_splits, md.split_blocks, early,
                                                          counters if fused else None)
                    torch.cuda.synchronize()
                    assert_matches_reference(out, lse, q, kv, idx, sl, scale, 1.25,
                                             f" (H={H}, splits {md.num_splits}, early {early}, fused {fused})")
                    assert int(counters.abs().sum()) == 0, "split counters not reset"


if __name__ == "__main__":
    _self_check()
    print("small-H Gluon variants self-check passed")
