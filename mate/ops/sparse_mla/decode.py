"""Triton kernels of the FP8 sparse MLA decode: split-K attention over gathered rows + combine.

Layout: query e4m3 [B * q_len, H, 576]; cache rows e4m3 [tokens, 576] (the paged cache
viewed flat: row = page * page_size + slot); ``block_tables`` int32 [B * q_len, top_k].

One program of ``sparse_mla_decode_split_kernel`` handles ``BLOCK_H`` heads of one query
position and ``split_blocks * BLOCK_N`` slots of its top-k list. Per step it gathers
``BLOCK_N`` rows (invalid slots are masked, never read), computes Q·Kᵀ on FP8 tensor cores
straight from the e4m3 rows (512 + 64 as two dots), runs the online softmax in fp32 with
``exp2`` and a log2(e)-folded scale, and accumulates P·V in fp16 with V (the first 512
values of the same rows, already loaded for Q·Kᵀ) converted e4m3 -> fp16 in registers.
Without a split it writes the bf16 output and the natural-log LSE; with a split it writes
partial results (outputs normalised by their own softmax sum, in the dtype of the
metadata's ``partial_o``: fp16 by default, fp32 LSEs) that
``sparse_mla_decode_combine_kernel`` merges.

Kernel variants (chosen by the plan, see ``metadata.py``): 64 heads per program (H > 32)
use Hopper wgmma (QGMMA for Q·Kᵀ, HGMMA for P·V) at 255 registers, one program per SM.
For H <= 32 the default is ``sparse_mla_decode_split_kernel_t`` (Sᵀ = K·Qᵀ on wgmma, 64
gathered rows on M). A plan option runs the heads-on-M kernel with ``SMALL_H``: Triton
emits ``mma.sync`` (HMMA.16816; e4m3 operands widened to fp16 exactly) on 16-row tiles; 16
heads at 5 stages compile to 128 registers under ``maxnreg`` without spilling and 54 KB of
shared memory, so 4 programs share an SM. Measured on the H200 (B=128, H=16, top-k 2048)
it took 203 us against 111 us for the transposed kernel, so it is not the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.checks import launch_fits
from mate._core.launch import launcher
from mate._core.triton_helpers import INTERPRET, cdiv, next_power_of_2, to_bf16
from mate.ops.sparse_mla.metadata import HEAD_DIM_ROPE, HEAD_DIM_V

__all__ = [
    "sparse_mla_decode_split_kernel",
    "sparse_mla_decode_split_kernel_t",
    "sparse_mla_decode_combine_kernel",
    "sparse_mla_decode_triton",
    "launch_combine",
]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _split_slot_range(pid_s, split_blocks, top_k, seq_lens_ptr, bt, q_len, BLOCK_N: tl.constexpr,
                      HAS_SEQ_LENS: tl.constexpr):
    """Slots [lo, hi) of split ``pid_s``, cut at the seq_lens entry of query row ``bt`` (blocks wholly past it are not
    visited), and the clamped seq_len that masks the slots inside the last block."""
    lo = pid_s * (split_blocks * BLOCK_N)
    hi = tl.minimum(lo + split_blocks * BLOCK_N, top_k)
    if HAS_SEQ_LENS:
        seq_len = tl.load(seq_lens_ptr + bt // q_len)
        seq_len = tl.minimum(tl.maximum(seq_len, 0), top_k)
        hi = tl.minimum(hi, seq_len)
    else:
        seq_len = top_k
    return lo, hi, seq_len


@triton.jit
def _gather_rows(kv_ptr, tok, num_tokens, offs_v, offs_r, D_V: tl.constexpr, D_ROW: tl.constexpr):
    """The cache rows of top-k entries ``tok`` (value part [n, 512] and rotary part [n, 64],
    e4m3) and which entries are valid; invalid rows read as 0 and are never touched."""
    valid = (tok >= 0) & (tok < num_tokens)
    kv_rows = kv_ptr + tok.to(tl.int64)[:, None] * D_ROW
    k_nope = tl.load(kv_rows + offs_v[None, :], mask=valid[:, None], other=0.0)
    k_rope = tl.load(kv_rows + D_V + offs_r[None, :], mask=valid[:, None], other=0.0)
    return valid, k_nope, k_rope


@triton.jit
def _finish_softmax(m_i, l_i):
    """From the running max (log2 domain) and sum: the empty-row flag, the divisor and the
    natural-log LSE (+inf for a row with no valid slot)."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)  # ln 2
    return empty, l_safe, lse


@triton.jit
def sparse_mla_decode_split_kernel(
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
    v_one,
    SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_V: tl.constexpr,
    D_R: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr,
    SMALL_H: tl.constexpr,
    PREFETCH_IDX: tl.constexpr,
):
    """Heads on M: wgmma for ``BLOCK_H`` = 64; for 16 or 32 heads (``SMALL_H``) Triton
    uses ``mma.sync`` with small ``BLOCK_N`` tiles, so several programs fit on one SM."""
    D_ROW: tl.constexpr = D_V + D_R
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    bt = tl.program_id(2).to(tl.int64)  # query position b * q_len + t

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_v = tl.arange(0, D_V)
    offs_r = tl.arange(0, D_R)
    offs_n = tl.arange(0, BLOCK_N)

    # Query tile, e4m3, kept for the whole loop (padded heads read as 0).
    q_rows = q_ptr + (bt * H + offs_h.to(tl.int64))[:, None] * D_ROW
    q_nope = tl.load(q_rows + offs_v[None, :], mask=h_mask[:, None], other=0.0)
    q_rope = tl.load(q_rows + D_V + offs_r[None, :], mask=h_mask[:, None], other=0.0)

    lo, hi, seq_len = _split_slot_range(pid_s, split_blocks, top_k, seq_lens_ptr, bt, q_len, BLOCK_N, HAS_SEQ_LENS)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    idx_row = idx_ptr + bt * top_k
    if PREFETCH_IDX:  # slots past hi (<= seq_len) are masked, as slots past seq_len below
        tok_next = tl.load(idx_row + lo + offs_n, mask=lo + offs_n < hi, other=-1)
    for start in tl.range(lo, hi, BLOCK_N):
        if PREFETCH_IDX:
            # The next block's indices, loaded one step ahead into registers: the gathers
            # then depend on a loop-carried value, so the pipeliner gives the gathered
            # rows num_stages - 1 shared-memory buffers instead of 2.
            tok = tok_next
            nxt = start + BLOCK_N + offs_n
            tok_next = tl.load(idx_row + nxt, mask=nxt < hi, other=-1)
        else:
            slots = start + offs_n
            tok = tl.load(idx_row + slots, mask=slots < seq_len, other=-1)
        valid, k_nope, k_rope = _gather_rows(kv_ptr, tok, num_tokens, offs_v, offs_r, D_V, D_ROW)

        s = tl.dot(q_nope, tl.trans(k_nope))
        s = tl.dot(q_rope, tl.trans(k_rope), s)
        s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-invalid so far: no NaN
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p16 = p.to(tl.float16)
        v16 = k_nope.to(tl.float16)  # e4m3 -> fp16 is exact
        if SMALL_H:
            # x * 1.0 is exact; with the 1.0 a runtime value, Triton cannot move the layout
            # change of V (to the mma.sync operand, a transpose) before the fp16 conversion,
            # where it gathers fp8 bytes one by one (LDS.U8); in fp16 it uses ldmatrix.
            v16 = v16 * tl.full([1, 1], v_one, tl.float16)
        if INTERPRET:
            acc = acc * alpha[:, None] + tl.dot(p16.to(tl.float32), v16.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p16, v16)
        m_i = m_new

    empty, l_safe, lse = _finish_softmax(m_i, l_i)
    o = acc / l_safe[:, None]
    if not SPLIT:
        o_rows = (bt * H + offs_h.to(tl.int64))[:, None] * D_V
        tl.store(out_ptr + o_rows + offs_v[None, :], to_bf16(o * out_scale), mask=h_mask[:, None])
        tl.store(lse_ptr + bt * H + offs_h, lse, mask=h_mask)
    else:
        p_rows = (bt * num_splits + pid_s) * H + offs_h.to(tl.int64)
        o_part = o.to(po_ptr.dtype.element_ty)  # fp16 partials: |o| <= max |v| <= 448
        tl.store(po_ptr + p_rows[:, None] * D_V + offs_v[None, :], o_part, mask=h_mask[:, None])
        tl.store(plse_ptr + p_rows, tl.where(empty, float("-inf"), lse), mask=h_mask)


@triton.jit
def sparse_mla_decode_split_kernel_t(
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
    v_one,
    SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_V: tl.constexpr,
    D_R: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr,
    SMALL_H: tl.constexpr,
    PREFETCH_IDX: tl.constexpr,
):
    """Transposed small-H variant (H <= 32, ``plan_decode(transposed=True)``): the same
    math with Sᵀ = K·Qᵀ.

    Sᵀ = K·Qᵀ puts the 64 gathered rows on M (the smallest wgmma M) and the few heads on
    N, so no M rows are padding; Oᵀ = Vᵀ·Pᵀ accumulates [512, BLOCK_H] in fp32. The
    gathered rows feed the first dot straight from shared memory, which lets Triton
    pipeline their loads (cp.async) over ``num_stages`` buffers.
    """
    D_ROW: tl.constexpr = D_V + D_R
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    bt = tl.program_id(2).to(tl.int64)

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_v = tl.arange(0, D_V)
    offs_r = tl.arange(0, D_R)
    offs_n = tl.arange(0, BLOCK_N)

    # Qᵀ tiles [576, BLOCK_H] (K-major for the FP8 dot), padded heads read as 0.
    q_cols = q_ptr + (bt * H + offs_h.to(tl.int64))[None, :] * D_ROW
    q_nope_t = tl.load(q_cols + offs_v[:, None], mask=h_mask[None, :], other=0.0)
    q_rope_t = tl.load(q_cols + D_V + offs_r[:, None], mask=h_mask[None, :], other=0.0)

    lo, hi, seq_len = _split_slot_range(pid_s, split_blocks, top_k, seq_lens_ptr, bt, q_len, BLOCK_N, HAS_SEQ_LENS)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([D_V, BLOCK_H], tl.float32)
    idx_row = idx_ptr + bt * top_k
    if PREFETCH_IDX:  # slots past hi (<= seq_len) are masked, as slots past seq_len below
        tok_next = tl.load(idx_row + lo + offs_n, mask=lo + offs_n < hi, other=-1)
    for start in tl.range(lo, hi, BLOCK_N):
        if PREFETCH_IDX:
            # The next block's indices, loaded one step ahead into registers: the gathers
            # then depend on a loop-carried value, so the pipeliner gives the gathered
            # rows num_stages - 1 shared-memory buffers instead of 2.
            tok = tok_next
            nxt = start + BLOCK_N + offs_n
            tok_next = tl.load(idx_row + nxt, mask=nxt < hi, other=-1)
        else:
            slots = start + offs_n
            tok = tl.load(idx_row + slots, mask=slots < seq_len, other=-1)
        valid, k_nope, k_rope = _gather_rows(kv_ptr, tok, num_tokens, offs_v, offs_r, D_V, D_ROW)

        s = tl.dot(k_nope, q_nope_t)  # [BLOCK_N, BLOCK_H]
        s = tl.dot(k_rope, q_rope_t, s)
        s = tl.where(valid[:, None], s * qk_scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        p16 = p.to(tl.float16)
        v16_t = tl.trans(k_nope.to(tl.float16))  # [512, BLOCK_N], e4m3 -> fp16 is exact
        if INTERPRET:
            acc = acc * alpha[None, :] + tl.dot(v16_t.to(tl.float32), p16.to(tl.float32))
        else:
            acc = acc * alpha[None, :] + tl.dot(v16_t, p16)
        m_i = m_new

    empty, l_safe, lse = _finish_softmax(m_i, l_i)
    o = acc / l_safe[None, :]
    if not SPLIT:
        o_cols = (bt * H + offs_h.to(tl.int64))[None, :] * D_V
        tl.store(out_ptr + o_cols + offs_v[:, None], to_bf16(o * out_scale), mask=h_mask[None, :])
        tl.store(lse_ptr + bt * H + offs_h, lse, mask=h_mask)
    else:
        p_rows = (bt * num_splits + pid_s) * H + offs_h.to(tl.int64)
        o_part = o.to(po_ptr.dtype.element_ty)
        tl.store(po_ptr + p_rows[None, :] * D_V + offs_v[:, None], o_part, mask=h_mask[None, :])
        tl.store(plse_ptr + p_rows, tl.where(empty, float("-inf"), lse), mask=h_mask)


@triton.jit
def sparse_mla_decode_combine_kernel(
    po_ptr,
    plse_ptr,
    out_ptr,
    lse_ptr,
    out_scale,
    H,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    BLOCK_HC: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_V: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Merges the splits of ``BLOCK_HC`` heads x ``BLOCK_D`` value columns of one query
    position (LSE-weighted). The split count is a constexpr, so the loop unrolls and no load
    waits on another: one memory latency for the LSEs, one for the partial outputs. ``PDL``
    (launched as a programmatic dependent of the decode): waits for the decode first."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    pid_h = tl.program_id(0)
    pid_d = tl.program_id(1)
    bt = tl.program_id(2).to(tl.int64)
    offs_h = pid_h * BLOCK_HC + tl.arange(0, BLOCK_HC)
    h_mask = offs_h < H
    offs_v = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, SPLITS_P2)
    lse_rows = (bt * NUM_SPLITS + offs_s[:, None]) * H + offs_h[None, :]
    lse_all = tl.load(plse_ptr + lse_rows, mask=(offs_s < NUM_SPLITS)[:, None] & h_mask[None, :],
                      other=float("-inf"))  # [SPLITS_P2, BLOCK_HC]
    m = tl.max(lse_all, axis=0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w_all = tl.exp(lse_all - m_use[None, :])  # 0 for an empty split and the padding
    total = tl.sum(w_all, axis=0)
    acc = tl.zeros([BLOCK_HC, BLOCK_D], tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        rows = (bt * NUM_SPLITS + s) * H + offs_h.to(tl.int64)
        o_s = tl.load(po_ptr + rows[:, None] * D_V + offs_v[None, :], mask=h_mask[:, None], other=0.0)
        w = tl.sum(tl.where(offs_s[:, None] == s, w_all, 0.0), axis=0)
        # an empty split's partial output is never used (where, not a product: it may be NaN)
        acc += tl.where(w[:, None] > 0.0, w[:, None] * o_s.to(tl.float32), 0.0)
    empty = total == 0.0
    t_safe = tl.where(empty, 1.0, total)
    o = acc / t_safe[:, None] * out_scale
    o_rows = (bt * H + offs_h.to(tl.int64))[:, None] * D_V
    tl.store(out_ptr + o_rows + offs_v[None, :], to_bf16(o), mask=h_mask[:, None])
    if pid_d == 0:
        lse = tl.where(empty, float("inf"), m_use + tl.log(t_safe))
        tl.store(lse_ptr + bt * H + offs_h, lse, mask=h_mask)


def combine_tiling(H: int, num_splits: int) -> tuple[int, int]:
    """(heads, value columns) per combine program: the unrolled loads of all splits stay
    within ~64 fp32 registers a thread (4 warps)."""
    block_hc = min(16, next_power_of_2(H))
    block_d = max(16, min(HEAD_DIM_V, 8192 // (block_hc * next_power_of_2(num_splits))))
    return block_hc, block_d


def launch_combine(partial_o: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   bmm2_scale: float, H: int, num_splits: int, rows: int, pdl: bool = False) -> None:
    """Merges a split plan's partial outputs into ``out`` / ``lse`` (the combine step shared
    by the plain and Gluon decode launchers); ``pdl``: launched as a programmatic dependent
    of the decode launched just before it (which signals its dependents)."""
    block_hc, block_d = combine_tiling(H, num_splits)
    launcher(sparse_mla_decode_combine_kernel)[(cdiv(H, block_hc), HEAD_DIM_V // block_d, rows)](
        partial_o,
        partial_lse,
        out,
        lse,
        bmm2_scale,
        H,
        NUM_SPLITS=num_splits,
        SPLITS_P2=next_power_of_2(num_splits),
        BLOCK_HC=block_hc,
        BLOCK_D=block_d,
        D_V=HEAD_DIM_V,
        PDL=pdl,
        num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )


def kv_kernel_arg(kv_rows: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """The cache argument of the decode kernels: ``kv_rows``, or ``query`` as a placeholder for
    an empty cache (never read)."""
    return kv_rows if kv_rows.numel() > 0 else query


def decode_kernel_args(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse, bmm1_scale: float,
                       bmm2_scale: float, split_blocks: int, num_splits: int) -> tuple:
    """The leading positional arguments every decode kernel takes (Triton and Gluon): the
    tensors (placeholders where unused: an empty cache is never read, the split scratch only
    with ``num_splits > 1``), the cache's rows, the scales (bmm1 in log2 units) and the shape."""
    _, q_len, H, _ = query.shape
    split = num_splits > 1
    return (query, kv_kernel_arg(kv_rows, query), block_tables,
            seq_lens if seq_lens is not None else block_tables, out, lse, partial_o if split else out,
            partial_lse if split else lse, kv_rows.shape[0], bmm1_scale * LOG2E, bmm2_scale, H, q_len,
            block_tables.shape[-1], split_blocks, num_splits)


def sparse_mla_decode_triton(
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
    num_warps: int,
    num_stages: int,
    block_n: int,
    transposed: bool,
    max_regs: int,
    prefetch_idx: bool,
) -> None:
    """Launches the decode on validated tensors; writes ``out`` (bf16) and ``lse`` (fp32).

    ``query`` [B, q_len, H, 576], ``kv_rows`` [tokens, 576], ``block_tables``
    [B, q_len, top_k], ``seq_lens`` [B] or None, ``out`` [B, q_len, H, 512], ``lse`` with
    B * q_len * H contiguous elements; all contiguous. ``partial_o`` / ``partial_lse`` are
    the split scratch of a :class:`DecodeMetadata` (read only when ``num_splits > 1``) and
    the remaining arguments its launch configuration. No allocation, no host sync.
    """
    B, q_len, H, _ = query.shape
    rows = B * q_len
    if rows == 0 or H == 0:
        return
    if transposed and kv_rows.numel() > 0 and kv_rows.data_ptr() % 16:
        # On the H200 the transposed kernel faulted (illegal address) or returned wrong
        # values (max error 0.7-1.4) on a cache view whose base is not 16-byte aligned, for
        # every tried launch (4 or 8 warps, 3 or 6 stages, indices prefetched or not);
        # aligned views are exact. The heads-on-M kernel on a 64-head tile (padded heads
        # masked) reads such a view correctly. Same plan, same split scratch.
        block_h, num_warps, num_stages, block_n, transposed, max_regs = 64, 8, 5, 64, False, 0
    split = num_splits > 1
    grid = (cdiv(H, block_h), num_splits, rows)
    kernel = sparse_mla_decode_split_kernel_t if transposed else sparse_mla_decode_split_kernel
    with launch_fits("the sparse MLA decode kernel", block_h=block_h, block_n=block_n, num_stages=num_stages,
                     num_warps=num_warps, transposed=transposed):
        launcher(kernel)[grid](
            *decode_kernel_args(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                bmm1_scale, bmm2_scale, split_blocks, num_splits),
            1.0,
            SPLIT=split,
            BLOCK_H=block_h,
            BLOCK_N=block_n,
            D_V=HEAD_DIM_V,
            D_R=HEAD_DIM_ROPE,
            HAS_SEQ_LENS=seq_lens is not None,
            SMALL_H=block_h <= 32,
            PREFETCH_IDX=prefetch_idx,
            num_warps=num_warps,
            num_stages=num_stages,
            maxnreg=max_regs or None,
        )
    if split:
        launch_combine(partial_o, partial_lse, out, lse, bmm2_scale, H, num_splits, rows)
