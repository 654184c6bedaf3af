"""Experimental Gluon kernel of the block-scaled FP8 GEMM for Hopper (sm_90), warp-specialized.

Same problem as ``groupwise.py`` (1x128 activation scales, 128x128 weight scales, fp32
accumulation, bf16/fp16 output) for the ``PLAIN`` and ``CONTIGUOUS`` (MoE) layouts and the
``MASKED`` one run as G * max_m rows (``gluon_masked_supported``; opt-in through a config's
``GLUON`` key: on the H200 it was slower than the Triton kernel at the three benchmark
shapes, ``benchmarks/probe_moe_gluon.py``), with the schedule DeepGEMM uses, which plain Triton cannot
express on sm_90:

* persistent programs (one per SM) walk the output tiles in grouped order;
* a 1-warp producer partition issues the TMA loads of A [BLOCK_M, 128] and B [BLOCK_N, 128]
  into a ring of ``STAGES`` shared-memory slots (mbarriers: ``ready`` = the slot's bytes
  landed, ``empty`` = every consumer is done with the slot);
* two 4-warp consumer partitions (warpgroups), each owning half of the tile: half the
  rows of a 128-row tile, half the columns of a 64-row tile. Per 128-wide K block an FP8
  wgmma (QGMMA) into a fresh fp32 product, then acc += product * a_scale[row] * b_scale on
  the CUDA cores; one warpgroup's wgmma runs while the other scales. (Issuing the next K
  block's wgmma before scaling the previous product, with two products in registers,
  spilled and made ptxas serialize the wgmmas in the sm_90 compile: not kept. One consumer
  warpgroup owning a whole 64-row tile, DeepGEMM's small-M schedule, was removed: on the
  H200 it was 0.1 us faster than the split-column tile at (64, 7168, 2048), 8.2 us against
  8.3, and lost to the Triton kernel wherever it beat the split-column tile.)
* the scales: for tiles up to 128 columns the producer copies the K block's BLOCK_M
  activation scales and its weight scale (cp.async, 4-byte pieces, any scale strides, so
  K- and MN-major alike) into the ring slot, tracked by the slot's ``ready`` barrier: the
  consumers read them from shared memory, STAGES K blocks after the copy was issued, which
  takes the global-load latency off short K-block steps (H200, (64, 2112, 7168), one
  warpgroup on 64x16 with 16 stages: 13.6 us against 28.6 with the scales loaded by it). The 192-column
  tile's consumers load the scales of K block kb + 1 from global memory during block kb
  (grouped benchmark: 901 against 870 TFLOP/s without loading ahead);
* the epilogue stores the warpgroup's fp32 tile as bf16/fp16 with row/column masks, through
  shared memory in 16-byte row pieces, while the producer already loads the next tile; with
  ``EPI_TMA`` tiles without padding rows go out by an asynchronous TMA store from shared
  memory, waited for before the buffer's next use.

``KPS`` K blocks per ring stage (default 1): the producer loads KPS consecutive 128-wide K
blocks (and their scales) into a stage under one expect-bytes, the consumers wait once, run
the KPS wgmmas each followed by its own scaling, and release the stage once. Each mbarrier
wait and arrival costs a consumer warpgroup a CTA-barrier (``bar.sync``) that Triton's
shared-memory analysis inserts around it, which dominates the short K-block steps of narrow
tiles (ncu, H200, (64, 4096, 7168), 64x32 st16: 41% of the stall cycles at a barrier);
KPS 2 halves them per K block. With an odd count of K blocks the last stage's missing block
reloads the last one with zero scales (its product adds 0).

BLOCK_N 192 (BLOCK_M 128, two consumers) splits each warpgroup's 64 rows into a 128-column
part and a 64-column part, each inside one weight-scale block, loaded into two rings (a tile
that starts mid-block loads its first 64 columns into the small ring); both wgmmas are in
flight at once (64 + 32 product registers).

Selected with ``config["GLUON"]`` in ``groupwise_gemm_triton`` (Hopper GPUs only; the
interpreter and other GPUs run the plain-Triton kernel). Checked against the reference by
the GPU tests in ``tests/gemm/test_groupwise_gluon.py``.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mate._core.hopper import cuda_capability, cuda_sm_count
from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv, next_power_of_2
from mate.ops.gemm.groupwise import tile_coords

__all__ = ["fp8_groupwise_gluon_kernel", "groupwise_gemm_gluon", "gluon_supported", "check_kps", "issue_stage",
           "operand_desc", "plain_mnk", "scaled_stage", "GLUON_MAX_REGS", "gluon_masked_supported"]

BLOCK_K = gl.constexpr(128)
GLUON_MAX_REGS = 168  # launch registers per thread: 3 warpgroups (4 + 4 + 1 warps) fit an SM
CONSUMER_REGS = gl.constexpr(232)
PRODUCER_REGS = gl.constexpr(40)


@gluon.jit
def _tile_expert(idx_ptr, pid_m, M, G, rows_per_group, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr,
                 IDX_L: gl.constexpr, FULL: gl.constexpr = False):
    """(expert, full, m_end) of a row tile. expert: the tile's expert (CONTIGUOUS: the largest
    m_indices < G of its rows; MASKED: its group when its first row is below ``masked_m``),
    -1 for a tile to skip; 0 for PLAIN. With ``FULL``, full: whether every row < M of the tile
    belongs to that expert (no row to leave unwritten). m_end: the rows at or past it are not
    the tile's to store (MASKED: the group's first row + masked_m, ``idx_ptr`` pointing at
    masked_m and a group holding ``rows_per_group`` rows, a multiple of BLOCK_M; M elsewhere)."""
    m_end = M
    if LAYOUT == 1:
        offs = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=IDX_L)
        idx = gl.load(idx_ptr + offs, mask=offs < M, other=-1)
        idx = gl.where(idx < G, idx, -1)  # an index >= G is skipped like a padding row
        expert = gl.max(idx, axis=0)
        if FULL:
            full = gl.min(gl.where(offs < M, idx, expert), axis=0) == expert
        else:
            full = expert < 0
    elif LAYOUT == 2:
        row0 = pid_m * BLOCK_M
        group = row0 // rows_per_group
        # masked_m[group] in every lane (one address), capped at the group's rows
        cnt = gl.load(idx_ptr + group + gl.zeros([BLOCK_M], gl.int32, IDX_L))
        cnt = gl.minimum(gl.max(cnt, axis=0), rows_per_group)
        start = row0 - group * rows_per_group
        expert = gl.where(start < cnt, group, -1)
        full = start + BLOCK_M <= cnt
        m_end = group * rows_per_group + gl.maximum(cnt, 0)
    else:
        expert = pid_m * 0
        full = expert == 0
    return expert, full, m_end


def a_box_rows(m: int, block_m: int) -> int:
    """Rows of A's TMA box: BLOCK_M, or for M < BLOCK_M the power of two >= M (at least 8, one
    128-byte swizzle period). A box whose rows are mostly past M costs ~2 us per tile stream on
    the H200 (DeepGEMM takes 16/32-row tiles there for the same reason); the rows of the ring
    slot past the box are never loaded, and the output rows they feed (>= M) are never stored."""
    return block_m if m >= block_m else max(8, next_power_of_2(m))


@gluon.jit
def a_slot(a_bufs, slot, A_ROWS: gl.constexpr):
    """Ring slot ``slot`` of A, its first A_ROWS rows when the box is shorter than the tile."""
    buf = a_bufs.index(slot)
    if buf.shape[0] > A_ROWS:
        buf = buf.slice(0, A_ROWS)
    return buf


@gluon.jit
def issue_stage(a_desc, b_desc, a_bufs, b_bufs, bar, s, kb_lo, st, nkb, a_row, b_row, KPS: gl.constexpr):
    """TMA loads of stage ``st``'s K blocks, kb_lo + st * KPS + j for j < KPS (A [A_ROWS, 128]
    and B [BLOCK_N, 128] each), into ring stage ``s``'s KPS slots, counted on ``bar``; a block
    at or past kb_lo + ``nkb`` reloads block kb_lo + nkb - 1 (the callers give it zero scales,
    so its product adds 0)."""
    A_ROWS: gl.constexpr = a_desc.block_shape[0]  # see a_box_rows
    mbarrier.expect(bar, (A_ROWS + b_desc.block_shape[0]) * BLOCK_K * KPS)
    for j in gl.static_range(KPS):
        kb = kb_lo + gl.minimum(st * KPS + j, nkb - 1)
        tma.async_copy_global_to_shared(a_desc, [a_row, kb * BLOCK_K], bar, a_slot(a_bufs, s * KPS + j, A_ROWS))
        tma.async_copy_global_to_shared(b_desc, [b_row, kb * BLOCK_K], bar, b_bufs.index(s * KPS + j))


@gluon.jit
def _producer(a_desc, b_desc, b2_desc, idx_ptr, as_ptr, bs_ptr, a_bufs, b_bufs, b2_bufs, sa_bufs, sb_bufs, ready,
              empty, M, N, K, G, rows_per_group, stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk,
              LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr, WIDE: gl.constexpr, KPS: gl.constexpr):
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    SC_L: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_kb = K // BLOCK_K
    num_ks = gl.cdiv(num_kb, KPS)
    A_ROWS: gl.constexpr = a_desc.block_shape[0]  # see a_box_rows
    nbytes: gl.constexpr = (A_ROWS + BLOCK_N) * BLOCK_K * KPS
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        expert, _, _ = _tile_expert(idx_ptr, pid_m, M, G, rows_per_group, LAYOUT, BLOCK_M, IDX_L)
        if expert >= 0:
            a_row = pid_m * BLOCK_M
            b_row = expert * N + pid_n * BLOCK_N
            if WIDE:  # the 128-row part inside one weight-scale block, the rest beside it
                off_x = (pid_n * BLOCK_N) % 128
                b2_row = b_row + 128 - 2 * off_x
                b_row += off_x
            else:  # the tile's BLOCK_M activation-scale rows; its one weight scale, in every lane
                offs_m = a_row + gl.arange(0, BLOCK_M, layout=SC_L)
                in_a = offs_m < M
                as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
                bs_ptrs = (bs_ptr + expert.to(gl.int64) * stride_bsg + (pid_n * BLOCK_N // 128) * stride_bsn
                           + gl.zeros([BLOCK_M], gl.int32, SC_L))
            for ks in range(num_ks):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                if not WIDE:
                    for j in gl.static_range(KPS):
                        if KPS == 1:
                            async_copy.async_copy_global_to_shared(sa_bufs.index(s), as_ptrs + ks * stride_ask,
                                                                   mask=in_a)
                            async_copy.async_copy_global_to_shared(sb_bufs.index(s), bs_ptrs + ks * stride_bsk)
                        else:  # a K block past the end (odd count): zero scales, so its product adds 0
                            kb = gl.minimum(ks * KPS + j, num_kb - 1)
                            k_ok = (ks * KPS + j + gl.zeros([BLOCK_M], gl.int32, SC_L)) < num_kb
                            async_copy.async_copy_global_to_shared(sa_bufs.index(s * KPS + j),
                                                                   as_ptrs + kb * stride_ask, mask=in_a & k_ok)
                            async_copy.async_copy_global_to_shared(sb_bufs.index(s * KPS + j),
                                                                   bs_ptrs + kb * stride_bsk, mask=k_ok)
                    # each lane's pending arrival is counted on ``ready`` now, before the TMA
                    # expect's arrival, and completed when its copies have landed
                    async_copy.mbarrier_arrive(ready.index(s), increment_count=True)
                mbarrier.expect(ready.index(s), nbytes)
                for j in gl.static_range(KPS):
                    # KPS > 1: a K block past the end reloads the last one (its scales are 0)
                    kb = ks if KPS == 1 else gl.minimum(ks * KPS + j, num_kb - 1)
                    slot = s if KPS == 1 else s * KPS + j
                    tma.async_copy_global_to_shared(a_desc, [a_row, kb * BLOCK_K], ready.index(s),
                                                    a_slot(a_bufs, slot, A_ROWS))
                    tma.async_copy_global_to_shared(b_desc, [b_row, kb * BLOCK_K], ready.index(s),
                                                    b_bufs.index(slot))
                    if WIDE:
                        tma.async_copy_global_to_shared(b2_desc, [b2_row, kb * BLOCK_K], ready.index(s),
                                                        b2_bufs.index(slot))
                it += 1


@gluon.jit
def _operands(a_bufs, b_bufs, s, HALF: gl.constexpr, SUB_M: gl.constexpr, SUB_N: gl.constexpr,
              SPLIT_N: gl.constexpr):
    """This warpgroup's A [SUB_M, 128] and Bᵀ [128, SUB_N] views of ring slot ``s``."""
    if SPLIT_N:
        a_s = a_bufs.index(s)
        b_s = b_bufs.index(s).slice(HALF * SUB_N, SUB_N, dim=0)
    else:
        a_s = a_bufs.index(s).slice(HALF * SUB_M, SUB_M, dim=0)
        b_s = b_bufs.index(s)
    return a_s, b_s.permute((1, 0))


@gluon.jit
def _store_tile(c_ptr, idx_ptr, acc, m0, n0, M, N, expert, stride_cm, LAYOUT: gl.constexpr, SUB_M: gl.constexpr,
                SUB_N: gl.constexpr):
    """Stores a warpgroup's [SUB_M, SUB_N] fp32 tile as c's dtype (CONTIGUOUS: only the rows of
    ``expert``). The tile goes through shared memory into 16-byte row pieces, so each store
    writes whole 32-byte sectors (from the wgmma layout, 4-byte pieces: twice the L2 write
    sectors, measured 6% slower on the grouped benchmark)."""
    TPW_N: gl.constexpr = 16 if SUB_N >= 128 else SUB_N // 8
    OUT_L: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [4, 1], [1, 0])
    out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), OUT_L)
    offs_m = m0 + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, OUT_L))
    offs_n = n0 + gl.arange(0, SUB_N, layout=gl.SliceLayout(0, OUT_L))
    if LAYOUT == 1:
        row_ok = gl.load(idx_ptr + offs_m, mask=offs_m < M, other=-1) == expert
    else:
        row_ok = offs_m < M
    c_ptrs = c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + offs_n[None, :]
    gl.store(c_ptrs, out, mask=row_ok[:, None] & (offs_n < N)[None, :])


@gluon.jit
def scaled_stage(a_bufs, b_bufs, sa_buf, sb_buf, slot0, row0, acc, zero, release, s, KPS: gl.constexpr,
                 ROW_L: gl.constexpr, EAGER: gl.constexpr):
    """Returns acc + the KPS K blocks of one ring stage: block j's FP8 wgmma on slots slot0 + j
    into a fresh fp32 product, scaled by rows row0 + j of ``sa_buf`` (the activation scales of
    the tile's rows) and ``sb_buf`` (the weight scale, in every row), read while the wgmma runs.
    ``release``: the ring's mbarriers, of which ``release[s]`` is arrived on once the stage's
    last wgmma has read its slots (None: the caller releases them). ``EAGER``: block j + 1's wgmma is issued before block j's is
    waited for and scaled (two in flight)."""
    if EAGER:
        prod = warpgroup_mma(a_bufs.index(slot0), b_bufs.index(slot0).permute((1, 0)), zero, use_acc=False,
                             is_async=True)
        for j in gl.static_range(KPS):
            sc = sa_buf.index(row0 + j).load(ROW_L) * sb_buf.index(row0 + j).load(ROW_L)
            if j + 1 < KPS:
                nxt = warpgroup_mma(a_bufs.index(slot0 + j + 1), b_bufs.index(slot0 + j + 1).permute((1, 0)), zero,
                                    use_acc=False, is_async=True)
                prod = warpgroup_mma_wait(num_outstanding=1, deps=(prod, ))
                acc += prod * sc[:, None]
                prod = nxt
            else:
                prod = warpgroup_mma_wait(num_outstanding=0, deps=(prod, ))
                if release is not None:
                    mbarrier.arrive(release.index(s), count=1)
                acc += prod * sc[:, None]
    else:
        for j in gl.static_range(KPS):
            prod = warpgroup_mma(a_bufs.index(slot0 + j), b_bufs.index(slot0 + j).permute((1, 0)), zero,
                                 use_acc=False, is_async=True)
            sc = sa_buf.index(row0 + j).load(ROW_L) * sb_buf.index(row0 + j).load(ROW_L)  # while the wgmma runs
            prod = warpgroup_mma_wait(num_outstanding=0, deps=(prod, ))
            if j == KPS - 1 and release is not None:
                mbarrier.arrive(release.index(s), count=1)
            acc += prod * sc[:, None]
    return acc


@gluon.jit
def _epilogue(c_ptr, idx_ptr, c_buf, c_desc, acc, m0, n0, M, N, expert, full, stride_cm, LAYOUT: gl.constexpr,
              SUB_M: gl.constexpr, SUB_N: gl.constexpr, EPI_TMA: gl.constexpr):
    """``EPI_TMA``: a tile without padding rows goes out through ``c_buf`` by an asynchronous
    TMA store (rows >= M and columns >= N clipped by the descriptor), waited for only before
    the buffer's next use; other tiles (and every tile without it) through ``_store_tile``."""
    if EPI_TMA:
        if full:
            tma.store_wait(0)
            c_buf.store(acc.to(c_ptr.dtype.element_ty))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [m0, n0], c_buf)
        else:
            _store_tile(c_ptr, idx_ptr, acc, m0, n0, M, N, expert, stride_cm, LAYOUT, SUB_M, SUB_N)
    else:
        _store_tile(c_ptr, idx_ptr, acc, m0, n0, M, N, expert, stride_cm, LAYOUT, SUB_M, SUB_N)


@gluon.jit
def _narrow_tile(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_buf, c_desc, as_ptr, bs_ptr, c_ptr, idx_ptr, it,
                 pid_m, pid_n, expert, full, M, N, K, stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk,
                 stride_cm, HALF: gl.constexpr, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, SPLIT_N: gl.constexpr, EPI_TMA: gl.constexpr, KPS: gl.constexpr):
    """One output tile (BLOCK_N <= 128), one wgmma per K block (KPS per ring stage), the
    scales from the ring: returns the ring counter."""
    SUB_M: gl.constexpr = BLOCK_M if SPLIT_N else BLOCK_M // 2
    SUB_N: gl.constexpr = BLOCK_N // 2 if SPLIT_N else BLOCK_N
    OFF_M: gl.constexpr = 0 if SPLIT_N else HALF * SUB_M
    OFF_N: gl.constexpr = HALF * SUB_N if SPLIT_N else 0
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, SUB_N, 32])
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)
    num_ks = gl.cdiv(K // BLOCK_K, KPS)
    zero = gl.zeros([SUB_M, SUB_N], gl.float32, MMA_L)
    acc = zero
    for _ in range(num_ks):
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        for j in gl.static_range(KPS):
            slot = s if KPS == 1 else s * KPS + j
            a_s, b_s = _operands(a_bufs, b_bufs, slot, HALF, SUB_M, SUB_N, SPLIT_N)
            prod = warpgroup_mma(a_s, b_s, zero, use_acc=False, is_async=True)
            # read while the wgmma runs
            sc = (sa_bufs.index(slot).slice(OFF_M, SUB_M).load(ROW_L)
                  * sb_bufs.index(slot).slice(OFF_M, SUB_M).load(ROW_L))
            prod = warpgroup_mma_wait(num_outstanding=0, deps=(prod, ))
            if j == KPS - 1:
                mbarrier.arrive(empty.index(s), count=1)
            acc += prod * sc[:, None]
        it += 1
    _epilogue(c_ptr, idx_ptr, c_buf, c_desc, acc, pid_m * BLOCK_M + OFF_M, pid_n * BLOCK_N + OFF_N, M, N, expert,
              full, stride_cm, LAYOUT, SUB_M, SUB_N, EPI_TMA)
    return it


@gluon.jit
def _wide_tile(a_bufs, b_bufs, b2_bufs, ready, empty, c_buf, c2_buf, c_desc, c2_desc, as_ptr, bs_ptr, c_ptr,
               idx_ptr, it, pid_m, pid_n, expert, full, M, N, K, stride_asm, stride_ask, stride_bsg, stride_bsn,
               stride_bsk, stride_cm, HALF: gl.constexpr, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, EPI_TMA: gl.constexpr, KPS: gl.constexpr):
    """One 192-column output tile, the warpgroup's 64 rows in two column parts that each lie
    inside one 128-column weight-scale block: X (128 columns, ring ``b_bufs``) and Y (64,
    ``b2_bufs``). A tile that starts 64 columns into a scale block has Y first ([n0, n0 +
    64)) and X after it."""
    LX: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    LY: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 32])
    ROW_L: gl.constexpr = gl.SliceLayout(1, LX)
    num_kb = K // BLOCK_K
    zero_x = gl.zeros([64, 128], gl.float32, LX)
    zero_y = gl.zeros([64, 64], gl.float32, LY)
    m0 = pid_m * BLOCK_M + HALF * 64
    n0 = pid_n * BLOCK_N
    off_x = n0 % 128
    off_y = 128 - 2 * off_x
    offs_m = m0 + gl.arange(0, 64, layout=ROW_L)
    in_a = offs_m < M
    as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
    num_nb = gl.cdiv(N, 128)
    blk_x = (n0 + off_x) // 128
    blk_y = (n0 + off_y) // 128
    bx_ptr = bs_ptr + expert.to(gl.int64) * stride_bsg + blk_x * stride_bsn
    by_ptr = bs_ptr + expert.to(gl.int64) * stride_bsg + blk_y * stride_bsn
    x_ok = blk_x < num_nb
    y_ok = blk_y < num_nb
    sa_n = gl.load(as_ptrs, mask=in_a, other=0.0)  # the scales of K block kb + 1 load during block kb
    sx_n = gl.load(bx_ptr, mask=x_ok, other=0.0)
    sy_n = gl.load(by_ptr, mask=y_ok, other=0.0)
    acc_x = zero_x
    acc_y = zero_y
    for ks in range(gl.cdiv(num_kb, KPS)):
        for j in gl.static_range(KPS):
            # KPS > 1: a K block past the end (odd count) has zero scales (``more`` false before it)
            kb = ks * KPS + j
            sa = sa_n
            sx = sx_n
            sy = sy_n
            more = kb + 1 < num_kb
            sa_n = gl.load(as_ptrs + (kb + 1) * stride_ask, mask=in_a & more, other=0.0)
            sx_n = gl.load(bx_ptr + (kb + 1) * stride_bsk, mask=x_ok & more, other=0.0)
            sy_n = gl.load(by_ptr + (kb + 1) * stride_bsk, mask=y_ok & more, other=0.0)
            s = it % STAGES
            if j == 0:
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            slot = s if KPS == 1 else s * KPS + j
            a_s = a_bufs.index(slot).slice(HALF * 64, 64, dim=0)
            px = warpgroup_mma(a_s, b_bufs.index(slot).permute((1, 0)), zero_x, use_acc=False, is_async=True)
            py = warpgroup_mma(a_s, b2_bufs.index(slot).permute((1, 0)), zero_y, use_acc=False, is_async=True)
            px, py = warpgroup_mma_wait(num_outstanding=0, deps=(px, py))
            if j == KPS - 1:
                mbarrier.arrive(empty.index(s), count=1)
            acc_x += px * (sa * sx)[:, None]
            acc_y += py * gl.convert_layout(sa * sy, gl.SliceLayout(1, LY))[:, None]
        it += 1
    _epilogue(c_ptr, idx_ptr, c_buf, c_desc, acc_x, m0, n0 + off_x, M, N, expert, full, stride_cm, LAYOUT, 64, 128,
              EPI_TMA)
    _epilogue(c_ptr, idx_ptr, c2_buf, c2_desc, acc_y, m0, n0 + off_y, M, N, expert, full, stride_cm, LAYOUT, 64, 64,
              EPI_TMA)
    return it


@gluon.jit
def _consumer(a_bufs, b_bufs, b2_bufs, sa_bufs, sb_bufs, c_bufs, c2_bufs, ready, empty, c_desc, c2_desc, as_ptr,
              bs_ptr, c_ptr, idx_ptr, M, N, K, G, rows_per_group, stride_asm, stride_ask, stride_bsg, stride_bsn,
              stride_bsk, stride_cm, HALF: gl.constexpr, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_N: gl.constexpr, WIDE: gl.constexpr,
              EPI_TMA: gl.constexpr, KPS: gl.constexpr):
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    c_buf = c_bufs.index(HALF)
    c2_buf = c2_bufs.index(HALF)
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        expert, full, m_end = _tile_expert(idx_ptr, pid_m, M, G, rows_per_group, LAYOUT, BLOCK_M, IDX_L, EPI_TMA)
        if expert >= 0:  # m_end as the tile's M: its rows at or past it are neither scaled nor stored
            if WIDE:
                it = _wide_tile(a_bufs, b_bufs, b2_bufs, ready, empty, c_buf, c2_buf, c_desc, c2_desc, as_ptr, bs_ptr,
                                c_ptr, idx_ptr, it, pid_m, pid_n, expert, full, m_end, N, K, stride_asm, stride_ask,
                                stride_bsg, stride_bsn, stride_bsk, stride_cm, HALF, LAYOUT, BLOCK_M, BLOCK_N, STAGES,
                                EPI_TMA, KPS)
            else:
                it = _narrow_tile(a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, c_buf, c_desc, as_ptr, bs_ptr, c_ptr,
                                  idx_ptr, it, pid_m, pid_n, expert, full, m_end, N, K, stride_asm, stride_ask,
                                  stride_bsg, stride_bsn, stride_bsk, stride_cm, HALF, LAYOUT, BLOCK_M, BLOCK_N,
                                  STAGES, SPLIT_N, EPI_TMA, KPS)
    if EPI_TMA:
        tma.store_wait(0)


@gluon.jit
def fp8_groupwise_gluon_kernel(
    a_desc, b_desc, b2_desc, c_desc, c2_desc, as_ptr, bs_ptr, c_ptr, idx_ptr,
    M, N, K, G,
    stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk, stride_cm, rows_per_group,
    LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, EPI_TMA: gl.constexpr = False, KPS: gl.constexpr = 1,
):
    """Persistent grid (at most one program per SM); ``a_desc`` covers a [M, K] with blocks
    [BLOCK_M, 128], ``b_desc`` covers b as [G * N, K] with blocks [min(BLOCK_N, 128), 128]
    (BLOCK_N 192: ``b2_desc`` with blocks [64, 128], else unused); with ``EPI_TMA``
    ``c_desc`` covers c [M, N] with blocks [64, min(BLOCK_N, 128)] and ``c2_desc`` with
    blocks [64, 64] (BLOCK_N 192; unused otherwise). BLOCK_M 64: the warpgroups split the
    columns (BLOCK_N 32..128); BLOCK_M 128: the rows (BLOCK_N 16..128 or 192). Each of the
    ``STAGES`` ring stages holds ``KPS`` consecutive K blocks (one wait and one arrival)."""
    SPLIT_N: gl.constexpr = BLOCK_M == 64
    WIDE: gl.constexpr = BLOCK_N > 128
    gl.static_assert(BLOCK_M == 128 or BLOCK_M == 64)
    gl.static_assert(BLOCK_N <= 128 or (BLOCK_M == 128 and BLOCK_N == 192))
    gl.static_assert(not EPI_TMA or (not SPLIT_N and BLOCK_N >= 128))
    gl.static_assert(KPS >= 1)
    BX: gl.constexpr = 128 if WIDE else BLOCK_N
    SLOTS: gl.constexpr = STAGES * KPS  # slot s * KPS + j: K block j of stage s
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SLOTS, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SLOTS, BX, BLOCK_K], b_desc.layout)
    if WIDE:
        b2_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SLOTS, BLOCK_N - 128, BLOCK_K], b2_desc.layout)
        sa_bufs = a_bufs  # placeholders, never used
        sb_bufs = a_bufs
    else:
        b2_bufs = b_bufs
        SC_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # per ring slot
        sa_bufs = gl.allocate_shared_memory(gl.float32, [SLOTS, BLOCK_M], SC_SL)
        sb_bufs = gl.allocate_shared_memory(gl.float32, [SLOTS, BLOCK_M], SC_SL)
    if EPI_TMA:
        c_bufs = gl.allocate_shared_memory(c_ptr.dtype.element_ty, [2, 64, BX], c_desc.layout)
        if WIDE:
            c2_bufs = gl.allocate_shared_memory(c_ptr.dtype.element_ty, [2, 64, BLOCK_N - 128], c2_desc.layout)
        else:
            c2_bufs = c_bufs
    else:  # placeholders, never used
        c_bufs = a_bufs
        c2_bufs = a_bufs
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup

    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, b2_bufs, sa_bufs, sb_bufs, c_bufs, c2_bufs, ready, empty, c_desc, c2_desc,
                     as_ptr, bs_ptr, c_ptr, idx_ptr, M, N, K, G, rows_per_group, stride_asm, stride_ask,
                     stride_bsg, stride_bsn, stride_bsk, stride_cm, 0, LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES,
                     SPLIT_N, WIDE, EPI_TMA, KPS)),
        (_consumer, (a_bufs, b_bufs, b2_bufs, sa_bufs, sb_bufs, c_bufs, c2_bufs, ready, empty, c_desc, c2_desc,
                     as_ptr, bs_ptr, c_ptr, idx_ptr, M, N, K, G, rows_per_group, stride_asm, stride_ask,
                     stride_bsg, stride_bsn, stride_bsk, stride_cm, 1, LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES,
                     SPLIT_N, WIDE, EPI_TMA, KPS)),
        (_producer, (a_desc, b_desc, b2_desc, idx_ptr, as_ptr, bs_ptr, a_bufs, b_bufs, b2_bufs, sa_bufs, sb_bufs,
                     ready, empty, M, N, K, G, rows_per_group, stride_asm, stride_ask, stride_bsg, stride_bsn,
                     stride_bsk, LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES, WIDE, KPS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def gluon_supported(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """A Hopper GPU, e4m3 operands that TMA can read, bf16/fp16 output."""
    if a.device.type != "cuda" or cuda_capability(a.device)[0] != 9:
        return False
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return False
    if out.dtype not in (torch.bfloat16, torch.float16) or out.stride(-1) != 1:
        return False
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 and t.shape[-1] % 16 == 0 for t in (a, b))


def check_kps(kps) -> None:
    """Raises ValueError unless ``kps`` (K blocks per ring stage) is 1, 2, 3 or 4."""
    if not isinstance(kps, int) or not 1 <= kps <= 4:
        raise ValueError(f"KPS (K blocks per ring stage) must be 1, 2, 3 or 4, got {kps!r}")


def plain_mnk(a: torch.Tensor, b: torch.Tensor, kernel: str) -> tuple[int, int, int]:
    """(M, N, K) of a [M, K] x b [N, K] problem for a kernel that takes the PLAIN layout only
    (``kernel`` names it in the errors): 2-D operands with equal K, a multiple of 128."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"the {kernel} Gluon GEMM takes the PLAIN layout (2-D a and b) only")
    M, K = a.shape
    if b.shape[1] != K or K % 128:
        raise ValueError(f"the {kernel} Gluon GEMM needs a [M, K] and b [N, K] with K a multiple of 128, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    return M, b.shape[0], K


@functools.cache
def _shared_layout(rows: int, cols: int, dtype: torch.dtype):
    """The default NVMMA shared layout of a [rows, cols] block (cached: building it runs
    Triton's constexpr machinery, ~40 us of host time per call on the H200's host)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _GL_DTYPE[dtype])


def operand_desc(t: torch.Tensor, block_rows: int, rows: int | None = None):
    """TMA descriptor of an e4m3 operand viewed as [rows (default: its first dim), K] with
    blocks [block_rows, 128] (the ring slots' 128-byte swizzled layout)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = t.shape[0] if rows is None else rows
    layout = _shared_layout(block_rows, 128, torch.float8_e4m3fn)
    return TensorDescriptor(t, [rows, t.shape[-1]], [t.shape[-1], 1], [block_rows, 128], layout)


_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


def _out_desc(out: torch.Tensor, cols: int):
    """TMA descriptor of the [M, N] output with blocks [64, cols] (the epilogue's store)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = _shared_layout(64, cols, out.dtype)
    return TensorDescriptor(out, list(out.shape), [out.stride(0), 1], [64, cols], layout)


def gluon_masked_supported(a: torch.Tensor, a_scale_strides, out: torch.Tensor, config: dict) -> bool:
    """Whether the persistent kernel takes a MASKED call as rows [G * max_m, K]: its config is
    the warp-specialized one (not FLAT / KINT), each group's rows a whole number of row tiles,
    and the activation scales and the output laid out group after group."""
    G, max_m, _ = a.shape
    bm = config.get("BLOCK_M", 0)
    return (not config.get("FLAT") and not config.get("KINT") and bm in (64, 128) and max_m % bm == 0
            and a_scale_strides[0] == max_m * a_scale_strides[1] and out.is_contiguous())


def groupwise_gemm_gluon(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, *, layout: int,
                         config: dict, m_indices: torch.Tensor | None = None, masked_m: torch.Tensor | None = None,
                         num_sms: int | None = None) -> None:
    """Launches the Gluon kernel (``gluon_supported`` must hold; layout PLAIN, CONTIGUOUS or
    MASKED, the last with ``gluon_masked_supported``: a [G, max_m, K] and out [G, max_m, N]
    run as G * max_m rows, the tiles past ``masked_m[g]`` of each group skipped and the rows
    past it not written).

    ``config``: BLOCK_M (64: the two warpgroups split the columns, BLOCK_N 32, 64 or 128;
    128: they split the rows, BLOCK_N 16, 32, 64, 128 or 192), BLOCK_N, GROUP_M, num_stages
    (ring stages), KPS (K blocks per ring stage, default 1; each stage holds KPS blocks,
    waited for and released once, so shared memory grows with num_stages * KPS) and EPI_TMA
    (TMA-store epilogue for tiles without padding rows; BLOCK_M 128 with BLOCK_N >= 128,
    ignored elsewhere and where the output's rows are not 16-byte aligned). See the module
    docstring. ``KINT``: the K-interleaved small-M kernel of ``groupwise_gluon_kint.py`` (PLAIN
    only; it reads BLOCK_M, BLOCK_N, num_stages, KPS, SPLIT_K, GROUP_M, REDUCE, EAGER).
    ``FLAT``: the single-partition kernel of ``groupwise_gluon_flat.py`` (PLAIN only; it reads
    BLOCK_N, num_stages, KPS, GROUP_M and EAGER; BLOCK_M is 64).
    """
    if config.get("FLAT"):  # one partition, one warpgroup, no warp specialization (groupwise_gluon_flat.py)
        if layout != 0:
            raise ValueError("the single-partition Gluon GEMM (FLAT) takes the PLAIN layout only")
        from mate.ops.gemm.groupwise_gluon_flat import groupwise_gemm_flat

        groupwise_gemm_flat(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, config=config)
        return
    if config.get("KINT"):  # K blocks interleaved over the two math warpgroups (groupwise_gluon_kint.py)
        if layout != 0:
            raise ValueError("the K-interleaved Gluon GEMM (KINT) takes the PLAIN layout only")
        from mate.ops.gemm.groupwise_gluon_kint import groupwise_gemm_kint

        groupwise_gemm_kint(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, config=config,
                            num_sms=num_sms)
        return
    rows_per_group = 0
    if layout == 2:  # MASKED: the groups' rows one after the other
        if not gluon_masked_supported(a, a_scale_strides, out, config):
            raise ValueError("this MASKED call does not fit the Gluon kernel (see gluon_masked_supported)")
        rows_per_group = a.shape[1]
        a = a.reshape(-1, a.shape[-1])
        out = out.view(-1, out.shape[-1])
    M, K = a.shape
    N = b.shape[-2]
    G = b.shape[0] if b.dim() == 3 else 1
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if (bm, bn) not in {(64, 32), (64, 64), (64, 128), (128, 16), (128, 32), (128, 64), (128, 128), (128, 192)}:
        raise ValueError(f"the Gluon GEMM has no {bm}x{bn} tile (BLOCK_M 64: BLOCK_N 32, 64, 128; "
                         "BLOCK_M 128: 16, 32, 64, 128, 192)")
    kps = config.get("KPS", 1)
    check_kps(kps)
    epi_tma = (bool(config.get("EPI_TMA", False)) and bm == 128 and bn >= 128
               and out.dim() == 2 and out.data_ptr() % 16 == 0 and (out.stride(0) * out.element_size()) % 16 == 0)
    tiles = cdiv(M, bm) * cdiv(N, bn)
    if num_sms is None:
        num_sms = cuda_sm_count(a.device)
    grid = (max(1, min(num_sms, tiles)), )
    idx = masked_m if layout == 2 else m_indices if m_indices is not None else out
    wide = bn > 128
    a_desc = operand_desc(a, a_box_rows(M, bm), M)
    b_desc = operand_desc(b, 128 if wide else bn, G * N)
    b2_desc = operand_desc(b, bn - 128, G * N) if wide else b_desc
    c_desc = _out_desc(out, 128 if wide else bn) if epi_tma else a_desc  # a_desc: a placeholder, never used
    c2_desc = _out_desc(out, bn - 128) if epi_tma and wide else c_desc
    launcher(fp8_groupwise_gluon_kernel)[grid](
        a_desc, b_desc, b2_desc, c_desc, c2_desc, a_scale, b_scale, out, idx,
        M, N, K, G,
        a_scale_strides[1], a_scale_strides[2], *b_scale_strides, out.stride(-2), rows_per_group,
        LAYOUT=layout, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=config.get("GROUP_M", 8),
        STAGES=config.get("num_stages", 4), EPI_TMA=epi_tma, KPS=kps, num_warps=4, maxnreg=GLUON_MAX_REGS,
    )
