"""Gluon small-M kernel of the block-scaled FP8 GEMM (Hopper): K blocks interleaved over two
math warpgroups, optional split-K over programs.

Same problem as ``groupwise.py`` (PLAIN layout, 1x128 activation scales, 128x128 weight
scales, fp32 accumulation, bf16/fp16 output). At small M and long K the tile is narrow and
each 128-wide K block is a short chain (wait for the slot, wgmma, wait for it, release the
slot, scale the product into the accumulator) that one math warpgroup runs back to back,
with the tensor cores idle outside the wgmma. Here both math warpgroups own the whole
output tile: warpgroup h takes ring stages h, h + 2, ... (each ``KPS`` K blocks; stages
counted over the program's work units, ``STAGES`` even, so each ring slot has one reader) into its
own accumulator, so one warpgroup's wgmma runs while the other waits, releases and scales;
at the end warpgroup 1 hands its accumulator to warpgroup 0 through shared memory (two
mbarriers) and warpgroup 0 adds it and stores the tile. A 1-warp producer fills the TMA
ring as in ``groupwise_gluon.py`` (the K blocks' activation scales and weight scale copied
into the slot by cp.async, tracked by the slot's ``ready`` barrier); each slot is released
by the one warpgroup that read it.

``SPLIT_K`` > 1: work units are (tile, K split) pairs, programs persistent over them. When
every unit has its own program (the auto configs) the tile's last split waits for the
others: they store their fp32 partials to a workspace [SPLIT_K, M, N] and count themselves
on the tile's atomic counter (release), and the last split, once the counter shows them all
(acquire), adds them in split order before its own accumulator and stores the tile (REDUCE
"wait"; it waits only on lower-numbered programs, which the GPU starts first). Otherwise
every unit stores its partial and the last to arrive sums them in split order (``"fused"``).
Both reset the counter and give the same bits (without counters, e.g. in a CUDA-graph
capture before any eager split-K call on the device, a second launch reduces). The wait takes
the partial store, the fence and the atomic round trip of the last split off the tile's
critical path: H200 session 17,
us, (128, 2112, 7168) 64x64 st6 kps2 s2 11.5 -> 10.9-11.0 (DeepGEMM 10.8), (64, 2112, 7168)
64x32 st4 kps4 s2 9.9 -> 9.4 (DeepGEMM 9.9).

Tried and removed: ``ROWS`` (128-row tile, warpgroup h computing rows 64h..64h+63 over every
stage, B read once for both halves): H200 M=128 N=2112 / 4096, K=7168: 13.4-15.5 / 17.1-22.9 us
against 11.8 / 14.1 for the default and DeepGEMM's 10.7 / 12.9. One wgmma in flight across
stages (the next stage's first wgmma issued before the current stage's last product is
scaled): the in-flight product carried around the stage loop is copied between registers (or
zero-initialised before it), and ptxas then serializes every wgmma (C7514/C7515) at sm_90.
Two programs per SM (80 launch registers, setmaxnreg 112 / 24, rings within 113 KB: four math
warpgroups per SM on twice the units): H200 (session 15, same bench; us) (128, 2112, 7168)
64x32 st4 kps2 s2 14.1, 64x64 st4 s4 16.5 against 11.8; (128, 4096, 7168) 64x32 st4 kps2 20.5,
64x64 st4 s2 19.1 against 14.3; (64, 4096, 7168) 64x32 st4 kps2 s2 14.6 against 12.7.
Three math warpgroups (stage q to warpgroup q % 3, 16 warps at 128 launch registers, 152-160
after setmaxnreg; session 16, us): (64, 4096) 64x32 st6 kps2 12.7 against 12.6; (128, 2112)
64x32 st6 kps2 11.9 against 11.8; (128, 4096) 64x64 st3 kps2 18.5 against 14.0. A third K
chain gains nothing because per K block the kernel already keeps pace with DeepGEMM: fitted
over K = 128..7168 (``benchmarks/probe_gemm_fixed_cost.py``) it takes 0.16-0.18 us per K block
against DeepGEMM's 0.17-0.18 plus a fixed 3.6 us against 2.5-2.8; the whole gap is that fixed
cost. Of it, the epilogue (hand-over and store) is ~0.2 us (a variant that stores nothing ran
13.48 against 13.70 us at (128, 4096)) and the warp-specialized region's set-up ~0.4 us
(``benchmarks/probe_gluon_ws_overhead.py``). Loading the first 1, 2 or all ring stages from the
launch warpgroup before the warp-specialized region (to overlap its set-up) was slower: 13.8-14.4
against 13.7 us (Triton puts a CTA barrier between the launch warpgroup's TMA issues). Letting the
warpgroup that ran the last stage store the tile (the other handing over while it runs) puts the
epilogue's layout-conversion scratch in both partitions: +8 KB, over the limit at 64x64 st6.

Prefetching the two TMA descriptors at kernel start (``prefetch.tensormap`` from the launch
warpgroup, as CUTLASS and DeepGEMM do) changed nothing on the H200 (session 17, every auto Gluon
config, interleaved: 0.0-0.1 us either way; fitted fixed cost 3.67 / 4.99 / 3.73 us with it,
3.66 / 5.00 / 3.65 without) and was not kept.

Selected with ``config["GLUON"] = {"KINT": True, ...}`` (see ``groupwise_gemm_kint``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from mate._core.hopper import SMEM_PER_PROGRAM, cuda_sm_count
from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv
from mate.ops.gemm.groupwise import tile_coords
from mate.ops.gemm.groupwise_gluon import (
    GLUON_MAX_REGS,
    _store_tile,
    a_box_rows,
    check_kps,
    issue_stage,
    operand_desc,
    plain_mnk,
    scaled_stage,
)

__all__ = ["fp8_groupwise_kint_kernel", "groupwise_gemm_kint", "check_kint_config", "kint_shared_bytes", "KINT_TILES"]

BLOCK_K = gl.constexpr(128)
CONSUMER_REGS = gl.constexpr(232)
PRODUCER_REGS = gl.constexpr(40)
KINT_TILES = {(64, 16), (64, 32), (64, 64), (64, 128), (128, 16), (128, 32), (128, 64)}


@gluon.jit
def _unit(u, M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
          SPLIT_K: gl.constexpr):
    """Work unit u: its tile, K split, tile coordinates, first K block and K-block count."""
    t = u // SPLIT_K
    pid_k = u % SPLIT_K
    pid_m, pid_n = tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    num_kb = K // BLOCK_K
    kb_per = gl.cdiv(num_kb, SPLIT_K)
    kb_lo = pid_k * kb_per
    nkb = gl.maximum(gl.minimum(num_kb - kb_lo, kb_per), 0)
    return t, pid_k, pid_m, pid_n, kb_lo, nkb


@gluon.jit
def _producer(a_desc, b_desc, as_ptr, bs_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, M, N, K,
              stride_asm, stride_ask, stride_bsn, stride_bsk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, KPS: gl.constexpr, SPLIT_K: gl.constexpr):
    SC_L: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    num_units = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * SPLIT_K
    zeros = gl.zeros([BLOCK_M], gl.int32, SC_L)
    it = 0
    for u in range(gl.program_id(0), num_units, gl.num_programs(0)):
        _, _, pid_m, pid_n, kb_lo, nkb = _unit(u, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_K)
        a_row = pid_m * BLOCK_M
        b_row = pid_n * BLOCK_N
        offs_m = a_row + gl.arange(0, BLOCK_M, layout=SC_L)
        in_a = offs_m < M
        as_ptrs = as_ptr + offs_m.to(gl.int64) * stride_asm
        bs_ptrs = bs_ptr + (b_row // 128) * stride_bsn + zeros  # the tile's one weight scale, in every lane
        for ks in range(gl.cdiv(nkb, KPS)):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            for j in gl.static_range(KPS):
                # a K block past the split's end (nkb not a multiple of KPS) reloads its last
                # block with zero scales, so its product adds 0
                kb = kb_lo + gl.minimum(ks * KPS + j, nkb - 1)
                k_ok = (ks * KPS + j + zeros) < nkb
                async_copy.async_copy_global_to_shared(sa_bufs.index(s * KPS + j), as_ptrs + kb * stride_ask,
                                                       mask=in_a & k_ok)
                async_copy.async_copy_global_to_shared(sb_bufs.index(s * KPS + j), bs_ptrs + kb * stride_bsk,
                                                       mask=k_ok)
            async_copy.mbarrier_arrive(ready.index(s), increment_count=True)
            issue_stage(a_desc, b_desc, a_bufs, b_bufs, ready.index(s), s, kb_lo, ks, nkb, a_row, b_row, KPS)
            it += 1


@gluon.jit
def _sum_partials(w_ptrs, mn, mask, COUNT: gl.constexpr, SPLIT_K: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, LAYOUT: gl.constexpr):
    """The first ``COUNT`` split partials of the tile, added in split order."""
    tot = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, LAYOUT)
    if BLOCK_M * BLOCK_N * SPLIT_K <= 64 * 256:  # all partials' loads in flight (<= 128 registers)
        for sp in gl.static_range(COUNT):
            tot += gl.load(w_ptrs + sp * mn, mask=mask, other=0.0, cache_modifier=".cg")
    else:  # one at a time (all at once spills at 64x128 and 128x64 with 4 splits)
        for sp in range(COUNT):
            tot += gl.load(w_ptrs + sp * mn, mask=mask, other=0.0, cache_modifier=".cg")
    return tot


@gluon.jit
def _store_partial(c_ptr, ws_ptr, cnt_ptr, acc, t, pid_k, m0, n0, M, N, stride_cm, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr, FUSED: gl.constexpr, WAIT: gl.constexpr,
                   LAYOUT: gl.constexpr):
    """Split-K: the unit's partial into the workspace; with ``FUSED`` the tile's last unit to
    arrive sums the partials in split order, stores the tile and resets the tile's counter.
    With ``WAIT`` (one unit per program, so a unit's lower splits run on lower-numbered
    programs, which the GPU starts first) the tile's last split does not store its partial:
    it waits for the counter to show the others' partials, adds them in split order before
    its own registers (the same sum, bit for bit) and stores the tile; one atomic round trip
    and one partial store fewer on the tile's critical path.
    Stored from the wgmma layout (4 lanes x 8 bytes: whole 32-byte sectors of fp32), so no
    shared-memory scratch beside the ring."""
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, LAYOUT))
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    mn = gl.to_tensor(M).to(gl.int64) * N  # M is a constexpr when it is 1
    w_ptrs = ws_ptr + offs_m.to(gl.int64)[:, None] * N + offs_n[None, :]
    c_ptrs = c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + offs_n[None, :]
    if WAIT:
        if pid_k < SPLIT_K - 1:
            gl.store(w_ptrs + pid_k * mn, acc, mask=mask)
            gl.thread_barrier()  # every thread's partial is stored before the arrival is counted
            gl.atomic_add(cnt_ptr + t, 1, sem="release", scope="gpu")
        else:
            while gl.atomic_add(cnt_ptr + t, 0, sem="acquire", scope="gpu") < SPLIT_K - 1:
                pass
            tot = _sum_partials(w_ptrs, mn, mask, SPLIT_K - 1, SPLIT_K, BLOCK_M, BLOCK_N, LAYOUT) + acc
            gl.store(c_ptrs, tot.to(c_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed", scope="gpu")
    else:
        gl.store(w_ptrs + pid_k * mn, acc, mask=mask)
        if FUSED:
            gl.thread_barrier()  # every thread's partial is stored before the arrival is counted
            arrived = gl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                tot = _sum_partials(w_ptrs, mn, mask, SPLIT_K, SPLIT_K, BLOCK_M, BLOCK_N, LAYOUT)
                gl.store(c_ptrs, tot.to(c_ptr.dtype.element_ty), mask=mask)
                gl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _consumer(a_bufs, b_bufs, sa_bufs, sb_bufs, red_buf, ready, empty, red_full, red_empty, c_ptr, ws_ptr,
              cnt_ptr, M, N, K, stride_cm, HALF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, KPS: gl.constexpr, SPLIT_K: gl.constexpr,
              FUSED: gl.constexpr, WAIT: gl.constexpr, EAGER: gl.constexpr):
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_N, 32])
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA_L)
    num_units = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N) * SPLIT_K
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA_L)
    it = 0
    for u in range(gl.program_id(0), num_units, gl.num_programs(0)):
        n = (u - gl.program_id(0)) // gl.num_programs(0)  # the program's unit count so far
        t, pid_k, pid_m, pid_n, kb_lo, nkb = _unit(u, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, SPLIT_K)
        num_ks = gl.cdiv(nkb, KPS)
        acc = zero
        # ring stage q (counted over the program's units) goes to warpgroup q % 2: with STAGES
        # even each slot has one reader, which waits for phase q // STAGES only after consuming
        # the slot's previous phase itself (a slot shared by both warpgroups lets one wait while
        # the other's phase has not landed, and a parity wait cannot tell the two phases apart)
        for ks in range((it + HALF) % 2, num_ks, 2):
            q = it + ks
            s = q % STAGES
            mbarrier.wait(ready.index(s), (q // STAGES) & 1)
            acc = scaled_stage(a_bufs, b_bufs, sa_bufs, sb_bufs, s * KPS, s * KPS, acc, zero, empty, s, KPS, ROW_L,
                               EAGER)
        it += num_ks
        if HALF == 1:
            mbarrier.wait(red_empty.index(0), (n & 1) ^ 1)
            red_buf.store(acc)
            mbarrier.arrive(red_full.index(0), count=1)
        else:
            mbarrier.wait(red_full.index(0), n & 1)
            acc += red_buf.load(MMA_L)
            mbarrier.arrive(red_empty.index(0), count=1)
            if SPLIT_K == 1:
                _store_tile(c_ptr, c_ptr, acc, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, 0, stride_cm, 0, BLOCK_M,
                            BLOCK_N)
            else:
                _store_partial(c_ptr, ws_ptr, cnt_ptr, acc, t, pid_k, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                               stride_cm, BLOCK_M, BLOCK_N, SPLIT_K, FUSED, WAIT, MMA_L)


@gluon.jit
def fp8_groupwise_kint_kernel(
    a_desc, b_desc, as_ptr, bs_ptr, c_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
    KPS: gl.constexpr = 1, SPLIT_K: gl.constexpr = 1, FUSED: gl.constexpr = False, EAGER: gl.constexpr = False,
    WAIT: gl.constexpr = False,
):
    """Persistent grid over (tile, K split) units; ``a_desc`` covers a [M, K] with blocks
    [BLOCK_M, 128], ``b_desc`` b [N, K] with blocks [BLOCK_N, 128]. ``ws_ptr``/``cnt_ptr``:
    the split-K workspace and per-tile counters (``FUSED``), unused when SPLIT_K is 1."""
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128 and 128 % BLOCK_N == 0)
    gl.static_assert(STAGES % 2 == 0, "each ring slot must have one reader: STAGES even")
    SLOTS: gl.constexpr = STAGES * KPS  # slot s * KPS + j: K block j of stage s
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SLOTS, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [SLOTS, BLOCK_N, BLOCK_K], b_desc.layout)
    SC_SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    sa_bufs = gl.allocate_shared_memory(gl.float32, [SLOTS, BLOCK_M], SC_SL)
    sb_bufs = gl.allocate_shared_memory(gl.float32, [SLOTS, BLOCK_M], SC_SL)
    # 8-float vectors (4 at 16 columns) XORed with row % 4: a warp's 8-byte wgmma-layout stores
    # and loads of 8 rows then take 2 wavefronts per instruction (unswizzled, the rows share banks: 8;
    # H200 session 16: (128, 2112 | 4096, 7168) 11.8 / 14.0 -> 11.4 / 13.7 us)
    RED_SL: gl.constexpr = gl.SwizzledSharedLayout(4 if BLOCK_N == 16 else 8, 1, 4, order=[1, 0])
    red_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_M, BLOCK_N], RED_SL)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    red_full = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    red_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # released by the one warpgroup that read it
    mbarrier.init(red_full.index(0), count=1)
    mbarrier.init(red_empty.index(0), count=1)

    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, sa_bufs, sb_bufs, red_buf, ready, empty, red_full, red_empty, c_ptr, ws_ptr,
                     cnt_ptr, M, N, K, stride_cm, 0, BLOCK_M, BLOCK_N, GROUP_M, STAGES, KPS, SPLIT_K, FUSED,
                     WAIT, EAGER)),
        (_consumer, (a_bufs, b_bufs, sa_bufs, sb_bufs, red_buf, ready, empty, red_full, red_empty, c_ptr, ws_ptr,
                     cnt_ptr, M, N, K, stride_cm, 1, BLOCK_M, BLOCK_N, GROUP_M, STAGES, KPS, SPLIT_K, FUSED,
                     WAIT, EAGER)),
        (_producer, (a_desc, b_desc, as_ptr, bs_ptr, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, M, N, K,
                     stride_asm, stride_ask, stride_bsn, stride_bsk, BLOCK_M, BLOCK_N, GROUP_M, STAGES, KPS,
                     SPLIT_K)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def kint_shared_bytes(bm: int, bn: int, stages: int, kps: int, split: int) -> int:
    """Upper bound of the kernel's shared memory: the ring (operands and scales), the
    reduction buffer, the barriers and the epilogue's layout conversion (bf16 tile without
    split-K; the split-K store needs only a few bytes for the counter's value), plus 1 KB of
    alignment. Checked against the sm_90 builds by ``benchmarks/compile_gemm_gluon.py``."""
    slots = stages * kps
    ring = slots * (bm + bn) * 128 + 2 * slots * bm * 4
    epilogue = bm * bn * 2 if split == 1 else 256
    return ring + bm * bn * 4 + (2 * stages + 2) * 8 + epilogue + 1024


def check_kint_config(bm: int, bn: int, stages, kps, split) -> None:
    """Raises ValueError for a configuration the kernel cannot run."""
    if (bm, bn) not in KINT_TILES:
        raise ValueError(f"the K-interleaved Gluon GEMM has no {bm}x{bn} tile (BLOCK_M 64: BLOCK_N 16, 32, 64, "
                         "128; BLOCK_M 128: 16, 32, 64)")
    check_kps(kps)
    if not isinstance(split, int) or split < 1:
        raise ValueError(f"SPLIT_K must be a positive int, got {split!r}")
    if not isinstance(stages, int) or stages < 2 or stages % 2:
        # stage q goes to warpgroup q % 2: an odd ring lets both read one slot, and a parity
        # wait of one can pass on the other's phase before it lands
        raise ValueError(f"num_stages (ring stages) of the K-interleaved Gluon GEMM must be even and >= 2, "
                         f"got {stages!r}")
    need = kint_shared_bytes(bm, bn, stages, kps, split)
    if need > SMEM_PER_PROGRAM:
        raise ValueError(f"the K-interleaved Gluon GEMM {bm}x{bn} with {stages} stages of {kps} K blocks needs "
                         f"~{need // 1024} KB of shared memory (at most {SMEM_PER_PROGRAM // 1024} KB)")


def groupwise_gemm_kint(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, *, config: dict,
                        num_sms: int | None = None) -> None:
    """Launches the kernel on a [M, K] x b [N, K]ᵀ (PLAIN; ``groupwise_gluon.gluon_supported``
    must hold). ``config``: BLOCK_M (64 or 128), BLOCK_N (16, 32, 64, 128 for BLOCK_M 64;
    16, 32, 64 for 128), num_stages (ring stages, even), KPS (K blocks per stage, 1-4), SPLIT_K
    (K splits over programs, capped by K / 128), GROUP_M, REDUCE (``"wait"``, the default:
    the tile's last split waits for the others' partials when every unit has its own program,
    else as ``"fused"``; ``"fused"``: the tile's last unit to arrive sums the partials; or
    ``"launch"``: a second kernel sums the split-K partials), EAGER (KPS > 1: each K block's
    wgmma issued before the previous one is waited for and scaled; default False)."""
    from mate.ops.gemm.groupwise import _TL_DTYPE, _tile_counters, splitk_reduce_kernel, splitk_workspace

    M, N, K = plain_mnk(a, b, "K-interleaved")
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    kps, split, stages = config.get("KPS", 1), config.get("SPLIT_K", 1), config.get("num_stages", 8)
    check_kint_config(bm, bn, stages, kps, split)
    reduce = config.get("REDUCE", "wait")
    if reduce not in ("fused", "wait", "launch"):
        raise ValueError(f"REDUCE must be 'fused', 'wait' or 'launch', got {reduce!r}")
    if M == 0 or N == 0:
        return
    split = min(split, max(1, K // 128))
    tiles = cdiv(M, bm) * cdiv(N, bn)
    if num_sms is None:
        num_sms = cuda_sm_count(a.device)
    grid = max(1, min(num_sms, tiles * split))
    cnt = None
    if split > 1 and reduce != "launch":
        cnt = _tile_counters(a.device, tiles)
    ws = splitk_workspace(a.device, (split, M, N)) if split > 1 else out
    launcher(fp8_groupwise_kint_kernel)[(grid, )](
        operand_desc(a, a_box_rows(M, bm)), operand_desc(b, bn), a_scale, b_scale, out, ws, cnt if cnt is not None else ws,
        M, N, K,
        a_scale_strides[1], a_scale_strides[2], b_scale_strides[1], b_scale_strides[2], out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, GROUP_M=config.get("GROUP_M", 8), STAGES=stages, KPS=kps,
        SPLIT_K=split, FUSED=cnt is not None, EAGER=bool(config.get("EAGER", False)) and kps > 1,
        # waiting is safe only when every unit has its own program (a wait on a later unit of a
        # program that is itself waiting would never end)
        WAIT=cnt is not None and reduce == "wait" and tiles * split <= grid, num_warps=4, maxnreg=GLUON_MAX_REGS,
    )
    if split > 1 and cnt is None:
        launcher(splitk_reduce_kernel)[(cdiv(M, 32), cdiv(N, 128))](
            ws, out, out, M, N, out.stride(0), 0,
            SPLIT_K=split, OUT_FP8=False, OUT_DTYPE=_TL_DTYPE[out.dtype],
            BLOCK_M=32, BLOCK_N=128, num_warps=4,
        )
