"""Experimental Gluon kernel of the block-scaled FP8 GEMM for Hopper (sm_90), warp-specialized.

Same problem as ``groupwise.py`` (1x128 activation scales, 128x128 weight scales, fp32
accumulation, bf16/fp16 output) for the ``PLAIN`` and ``CONTIGUOUS`` (MoE) layouts, with
the schedule DeepGEMM uses, which plain Triton cannot express on sm_90:

* persistent programs (one per SM) walk the output tiles in grouped order;
* a 1-warp producer partition issues the TMA loads of A [BLOCK_M, 128] and B [BLOCK_N, 128]
  into a ring of ``STAGES`` shared-memory slots (mbarriers: ``ready`` = both tiles landed,
  ``empty`` = both consumers are done with the slot);
* two 4-warp consumer partitions (warpgroups) each own half of the tile (half the rows, or
  with ``SPLIT_N`` half the columns, so a 64-row tile still feeds both): per 128-wide K
  block an FP8 wgmma (QGMMA) into a fresh fp32 product, then acc += product * a_scale[row]
  * b_scale on the CUDA cores. While one warpgroup scales, the other's wgmma runs. (Issuing
  the next K block's wgmma before scaling the previous product, with two products in
  registers, spilled and made ptxas serialize the wgmmas in the sm_90 compile: not kept.)
* the epilogue stores the warpgroup's fp32 tile as bf16/fp16 with row/column masks, through
  shared memory in 16-byte row pieces, while the producer already loads the next tile.

Selected with ``config["GLUON"] = True`` in ``groupwise_gemm_triton`` (Hopper GPUs only; the
interpreter and other GPUs run the plain-Triton kernel). Checked against the reference by
the GPU tests in ``tests/gemm/test_groupwise_gluon.py``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from mate.ops.gemm.groupwise import tile_coords

__all__ = ["fp8_groupwise_gluon_kernel", "groupwise_gemm_gluon", "gluon_supported", "GLUON_MAX_REGS"]

BLOCK_K = gl.constexpr(128)
GLUON_MAX_REGS = 168  # launch registers per thread: 3 warpgroups (4 + 4 + 1 warps) fit an SM
CONSUMER_REGS = gl.constexpr(232)
PRODUCER_REGS = gl.constexpr(40)


@gluon.jit
def _tile_expert(idx_ptr, pid_m, M, G, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, IDX_L: gl.constexpr):
    """The tile's expert (CONTIGUOUS: the largest m_indices of its rows), -1 for a tile to
    skip (only padding rows, or an index >= G); 0 for PLAIN."""
    if LAYOUT == 1:
        offs = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=IDX_L)
        idx = gl.load(idx_ptr + offs, mask=offs < M, other=-1)
        expert = gl.max(idx, axis=0)
        expert = gl.where(expert < G, expert, -1)
    else:
        expert = pid_m * 0
    return expert


@gluon.jit
def _producer(a_desc, b_desc, idx_ptr, a_bufs, b_bufs, ready, empty, M, N, K, G,
              LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr):
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_kb = K // BLOCK_K
    nbytes: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        expert = _tile_expert(idx_ptr, pid_m, M, G, LAYOUT, BLOCK_M, IDX_L)
        if expert >= 0:
            a_row = pid_m * BLOCK_M
            b_row = expert * N + pid_n * BLOCK_N
            for kb in range(num_kb):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                tma.async_copy_global_to_shared(a_desc, [a_row, kb * BLOCK_K], ready.index(s), a_bufs.index(s))
                tma.async_copy_global_to_shared(b_desc, [b_row, kb * BLOCK_K], ready.index(s), b_bufs.index(s))
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
    OUT_L: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
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
def _consumer(a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, idx_ptr, M, N, K, G,
              stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk, stride_cm,
              HALF: gl.constexpr, LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_N: gl.constexpr):
    SUB_M: gl.constexpr = BLOCK_M if SPLIT_N else BLOCK_M // 2
    SUB_N: gl.constexpr = BLOCK_N // 2 if SPLIT_N else BLOCK_N
    OFF_M: gl.constexpr = 0 if SPLIT_N else HALF * SUB_M
    OFF_N: gl.constexpr = HALF * SUB_N if SPLIT_N else 0
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, SUB_N, 32])
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_nb = gl.cdiv(N, 128)
    num_kb = K // BLOCK_K
    zero = gl.zeros([SUB_M, SUB_N], gl.float32, MMA_L)
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        expert = _tile_expert(idx_ptr, pid_m, M, G, LAYOUT, BLOCK_M, IDX_L)
        if expert >= 0:
            offs_m = pid_m * BLOCK_M + OFF_M + gl.arange(0, SUB_M, layout=ROW_L)
            in_a = offs_m < M
            nblk = (pid_n * BLOCK_N + OFF_N) // 128
            as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
            bs_base = bs_ptr + expert.to(gl.int64) * stride_bsg + nblk * stride_bsn
            nb_ok = nblk < num_nb
            acc = zero
            for kb in range(num_kb):
                sa = gl.load(as_ptrs + kb * stride_ask, mask=in_a, other=0.0)
                sb = gl.load(bs_base + kb * stride_bsk, mask=nb_ok, other=0.0)
                s = it % STAGES
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                a_s, b_s = _operands(a_bufs, b_bufs, s, HALF, SUB_M, SUB_N, SPLIT_N)
                prod = warpgroup_mma(a_s, b_s, zero, use_acc=False, is_async=True)
                prod = warpgroup_mma_wait(num_outstanding=0, deps=(prod, ))
                mbarrier.arrive(empty.index(s), count=1)
                acc += prod * (sa * sb)[:, None]
                it += 1
            _store_tile(c_ptr, idx_ptr, acc, pid_m * BLOCK_M + OFF_M, pid_n * BLOCK_N + OFF_N, M, N, expert,
                        stride_cm, LAYOUT, SUB_M, SUB_N)


@gluon.jit
def fp8_groupwise_gluon_kernel(
    a_desc, b_desc, as_ptr, bs_ptr, c_ptr, idx_ptr,
    M, N, K, G,
    stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk, stride_cm,
    LAYOUT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, SPLIT_N: gl.constexpr,
):
    """Persistent grid (at most one program per SM); ``a_desc`` covers a [M, K] with blocks
    [BLOCK_M, 128], ``b_desc`` covers b as [G * N, K] with blocks [BLOCK_N, 128]."""
    gl.static_assert(BLOCK_M // 2 == 64 or (SPLIT_N and BLOCK_M == 64))
    gl.static_assert((BLOCK_N // 2 if SPLIT_N else BLOCK_N) <= 128)
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup

    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, idx_ptr, M, N, K, G,
                     stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk, stride_cm,
                     0, LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES, SPLIT_N)),
        (_consumer, (a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, idx_ptr, M, N, K, G,
                     stride_asm, stride_ask, stride_bsg, stride_bsn, stride_bsk, stride_cm,
                     1, LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES, SPLIT_N)),
        (_producer, (a_desc, b_desc, idx_ptr, a_bufs, b_bufs, ready, empty, M, N, K, G,
                     LAYOUT, BLOCK_M, BLOCK_N, GROUP_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def gluon_supported(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """A Hopper GPU, e4m3 operands that TMA can read, bf16/fp16 output."""
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] != 9:
        return False
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return False
    if out.dtype not in (torch.bfloat16, torch.float16) or out.stride(-1) != 1:
        return False
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 and t.shape[-1] % 16 == 0 for t in (a, b))


def _desc(t: torch.Tensor, rows: int, block_rows: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([block_rows, 128], gl.float8e4nv)
    return TensorDescriptor(t, [rows, t.shape[-1]], [t.shape[-1], 1], [block_rows, 128], layout)


def groupwise_gemm_gluon(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, *, layout: int,
                         config: dict, m_indices: torch.Tensor | None = None, num_sms: int | None = None) -> None:
    """Launches the Gluon kernel (``gluon_supported`` must hold; layout PLAIN or CONTIGUOUS).

    ``config``: BLOCK_M (128, or 64 with SPLIT_N), BLOCK_N (<= 128, or 256 with SPLIT_N),
    GROUP_M, num_stages (ring slots) and SPLIT_N (see the module docstring).
    """
    M, K = a.shape
    N = b.shape[-2]
    G = b.shape[0] if b.dim() == 3 else 1
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    split_n = bool(config.get("SPLIT_N", bm == 64))
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (max(1, min(num_sms, tiles)), )
    idx = m_indices if m_indices is not None else out
    fp8_groupwise_gluon_kernel[grid](
        _desc(a, M, bm), _desc(b, G * N, bn), a_scale, b_scale, out, idx,
        M, N, K, G,
        a_scale_strides[1], a_scale_strides[2], *b_scale_strides, out.stride(-2),
        LAYOUT=layout, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=config.get("GROUP_M", 8),
        STAGES=config.get("num_stages", 4), SPLIT_N=split_n,
        num_warps=4, maxnreg=GLUON_MAX_REGS,
    )
