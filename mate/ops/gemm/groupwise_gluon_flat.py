"""Gluon small-M kernel of the block-scaled FP8 GEMM (Hopper) without warp specialization.

Same problem as ``groupwise.py`` (PLAIN layout, 1x128 activation scales, 128x128 weight
scales, fp32 accumulation, bf16/fp16 output). On the H200, Triton 3.6's ``gl.warp_specialize``
region costs a fixed ~0.4 us per launch (a one-block TMA load and wait: 1.87 us without a
region, 2.24-2.29 with one, whatever the partitions' register counts and warp counts), and the
ring's mbarrier inits ~0.026 us per stage (a CTA barrier after each); at small M that fixed
cost is the whole gap to DeepGEMM ((64, 7168, 128): warp-specialized kernel 3.10 us with one
stage, 3.64 with 6x2, DeepGEMM 2.52, the plain-Triton TMA kernel 2.65).

This kernel has one partition, one warpgroup (4 warps) and one output tile per program
(BLOCK_M 64, the grid one wave at small M):

* before the K loop the program issues the TMA loads of its first ``STAGES`` ring stages (A
  [A_ROWS, 128] and B [BLOCK_N, 128] per K block, ``ready[s]`` counting the bytes) and loads every
  activation and weight scale of its tile (K / 128 blocks, up to ``KB_ROWS``) into shared
  memory with plain loads, all in flight at once;
* per ring stage (``KPS`` K blocks): one wait; per K block one FP8 wgmma into a fresh fp32
  product, the block's scales read from shared memory while it runs, then acc += product *
  a_scale[row] * b_scale (``EAGER``: block j + 1's wgmma issued before block j's product is
  waited for and scaled, ``groupwise_gluon.scaled_stage``); the stage is then refilled with stage st + STAGES after a CTA
  barrier (every warp's wgmmas have read it), so up to STAGES stages stay in flight;
* the epilogue stores the tile as bf16/fp16 through shared memory in 16-byte row pieces
  (``groupwise_gluon._store_tile``).

Selected with ``config["GLUON"] = {"FLAT": True, ...}`` (see ``groupwise_gemm_flat``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
)

from mate._core.hopper import SMEM_PER_PROGRAM
from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv, next_power_of_2
from mate.ops.gemm.groupwise import tile_coords
from mate.ops.gemm.groupwise_gluon import (
    _store_tile,
    a_box_rows,
    check_kps,
    issue_stage,
    operand_desc,
    plain_mnk,
    scaled_stage,
)

__all__ = ["fp8_groupwise_flat_kernel", "groupwise_gemm_flat", "check_flat_config", "flat_shared_bytes",
           "FLAT_TILES"]

BLOCK_K = gl.constexpr(128)
FLAT_TILES = {(64, 16), (64, 32), (64, 64), (64, 128)}


@gluon.jit
def fp8_groupwise_flat_kernel(
    a_desc, b_desc, as_ptr, bs_ptr, c_ptr,
    M, N, K,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
    BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, KB_ROWS: gl.constexpr,
    KPS: gl.constexpr = 1, EAGER: gl.constexpr = False,
):
    """One program per 64 x BLOCK_N output tile; ``a_desc`` covers a [M, K] with blocks
    [a_box_rows(M, 64), 128], ``b_desc`` b [N, K] with blocks [BLOCK_N, 128]; ``KPS`` K blocks
    per ring stage (one wait, one CTA barrier and one refill per stage; STAGES <= the stage
    count); ``KB_ROWS``: a power of two >= the stages' K blocks (the scale buffers' rows);
    ``EAGER``: two wgmmas of a stage in flight (``scaled_stage``)."""
    BLOCK_M: gl.constexpr = 64
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_N, 32])
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)
    FLAT_L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    SC_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])

    pid_m, pid_n = tile_coords(gl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    a_row = pid_m * BLOCK_M
    b_row = pid_n * BLOCK_N
    num_kb = K // BLOCK_K
    num_st = gl.cdiv(num_kb, KPS)

    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES * KPS, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES * KPS, BLOCK_N, BLOCK_K], b_desc.layout)
    sa_smem = gl.allocate_shared_memory(gl.float32, [KB_ROWS, BLOCK_M], SC_SL)  # [K block, row]
    sb_smem = gl.allocate_shared_memory(gl.float32, [KB_ROWS, BLOCK_M], SC_SL)  # the weight scale in every row
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()  # the barriers' init before the TMA loads that complete on them
    for s0 in gl.static_range(STAGES):  # the launcher keeps STAGES <= num_st
        issue_stage(a_desc, b_desc, a_bufs, b_bufs, ready.index(s0), s0, 0, s0, num_kb, a_row, b_row, KPS)

    # every scale of the tile, loads all in flight: flat index i = K block * 64 + row
    i = gl.arange(0, KB_ROWS * BLOCK_M, layout=FLAT_L)
    kb_i = i // BLOCK_M
    offs_m = a_row + i % BLOCK_M
    k_ok = kb_i < num_kb
    sa = gl.load(as_ptr + offs_m.to(gl.int64) * stride_asm + kb_i * stride_ask, mask=k_ok & (offs_m < M), other=0.0)
    sb = gl.load(bs_ptr + (b_row // 128) * stride_bsn + kb_i * stride_bsk, mask=k_ok, other=0.0)
    sa_smem._reinterpret(gl.float32, [KB_ROWS * BLOCK_M], SC_SL).store(sa)
    sb_smem._reinterpret(gl.float32, [KB_ROWS * BLOCK_M], SC_SL).store(sb)
    gl.thread_barrier()

    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)
    acc = zero
    for st in range(num_st):
        s = st % STAGES
        mbarrier.wait(ready.index(s), (st // STAGES) & 1)
        acc = scaled_stage(a_bufs, b_bufs, sa_smem, sb_smem, s * KPS, st * KPS, acc, zero, None, s, KPS, ROW_L, EAGER)
        if st + STAGES < num_st:
            gl.thread_barrier()  # every warp's wgmmas have read stage s
            issue_stage(a_desc, b_desc, a_bufs, b_bufs, ready.index(s), s, 0, st + STAGES, num_kb, a_row, b_row, KPS)
    _store_tile(c_ptr, c_ptr, acc, a_row, b_row, M, N, 0, stride_cm, 0, BLOCK_M, BLOCK_N)


def flat_shared_bytes(bn: int, stages: int, k: int, kps: int = 1) -> int:
    """The kernel's shared memory: the ring, the two scale buffers and the barriers (the
    epilogue's layout conversion reuses the ring; equal to the sm_90 builds' size, checked by
    ``tests/gemm/test_groupwise_gluon_flat.py``)."""
    return stages * kps * (64 + bn) * 128 + 2 * _kb_rows(k, kps) * 64 * 4 + stages * 8


def _stage_count(k: int, kps: int) -> int:
    """Ring stages of KPS K blocks that cover K (at least one)."""
    return -(-max(1, k // 128) // kps)


def _kb_rows(k: int, kps: int) -> int:
    """Rows of the scale buffers: a power of two >= the K blocks of every stage."""
    return next_power_of_2(_stage_count(k, kps) * kps)


def check_flat_config(bn: int, stages, k: int, kps=1) -> None:
    """Raises ValueError for a configuration the kernel cannot run."""
    if (64, bn) not in FLAT_TILES:
        raise ValueError(f"the single-partition Gluon GEMM has no 64x{bn} tile (BLOCK_N 16, 32, 64 or 128)")
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"num_stages of the single-partition Gluon GEMM must be a positive int, got {stages!r}")
    check_kps(kps)
    need = flat_shared_bytes(bn, stages, k, kps)
    if need > SMEM_PER_PROGRAM:
        raise ValueError(f"the single-partition Gluon GEMM 64x{bn} with {stages} stages of {kps} K blocks at K={k} needs "
                         f"~{need // 1024} KB of shared memory (at most {SMEM_PER_PROGRAM // 1024} KB)")


def groupwise_gemm_flat(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, *, config: dict) -> None:
    """Launches the kernel on a [M, K] x b [N, K]ᵀ (PLAIN; ``groupwise_gluon.gluon_supported``
    must hold). ``config``: BLOCK_N (16, 32, 64 or 128; BLOCK_M is 64), num_stages (ring
    stages), KPS (K blocks per stage, default 1), GROUP_M, EAGER (KPS > 1: each K block's wgmma
    issued before the previous one is waited for and scaled; default False). One program per
    output tile."""
    M, N, K = plain_mnk(a, b, "single-partition")
    bn, stages, kps = config["BLOCK_N"], config.get("num_stages", 8), config.get("KPS", 1)
    check_flat_config(bn, stages, K, kps)
    if M == 0 or N == 0:
        return
    stages = min(stages, _stage_count(K, kps))
    launcher(fp8_groupwise_flat_kernel)[(cdiv(M, 64) * cdiv(N, bn), )](
        operand_desc(a, a_box_rows(M, 64)), operand_desc(b, bn), a_scale, b_scale, out,
        M, N, K,
        a_scale_strides[1], a_scale_strides[2], b_scale_strides[1], b_scale_strides[2], out.stride(0),
        BLOCK_N=bn, GROUP_M=config.get("GROUP_M", 8), STAGES=stages, KB_ROWS=_kb_rows(K, kps), KPS=kps,
        EAGER=bool(config.get("EAGER", False)) and kps > 1, num_warps=4,
    )
