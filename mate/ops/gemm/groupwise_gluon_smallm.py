"""Experimental Gluon kernel of the block-scaled FP8 GEMM for small M (<= 128) on Hopper (sm_90).

Same problem as ``groupwise.py`` (1x128 activation scales, 128x128 weight scales, fp32
accumulation, bf16/fp16 output), PLAIN layout, M <= 128. At small M the weights are the
stream to saturate, so the operands are swapped (swap-AB):

* each program owns ``BLOCK_W`` weight rows (output columns; 64 per 4-warp warpgroup) and
  all M activation rows (``BLOCK_M`` 64 or 128, TMA zero-fills rows >= M), and one K slice;
* the weight tile [BLOCK_W, 128] is the wgmma A operand (the M = 64 side of the
  instruction), the activation tile [BLOCK_M, 128]ᵀ the B operand (the N side), so no rows
  of M are padded to a wgmma tile;
* a ring of ``STAGES`` shared-memory slots is filled by TMA; each K block issues one async
  wgmma into a fresh fp32 product, the next block's scales are loaded while it runs, then
  acc += product * w_scale * x_scale[col]; the slot is refilled with the block ``STAGES``
  ahead right after the wgmma is done (one barrier), so ``STAGES`` - 1 loads stay in flight;
* split-K (``SPLIT_K`` > 1) writes fp32 partials to a workspace [SPLIT_K, M, N], then
  reduces in split order (deterministic): ``REDUCE`` 1: the last program of a tile to
  arrive sums the whole tile (the Triton kernel's fused reduce); 2: every program of the
  tile waits until all partials are stored and sums a 1/SPLIT_K slice of the tile, which
  shortens the serial tail (all programs of the grid must be resident at once: the launcher
  requires grid <= SMs); 0: a second launch (``splitk_reduce_kernel``) reduces.

Launched directly (``groupwise_gemm_gluon_smallm``); no dispatch routes to it yet.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

__all__ = ["fp8_groupwise_smallm_kernel", "groupwise_gemm_gluon_smallm", "smallm_supported"]

BLOCK_K = gl.constexpr(128)


@gluon.jit
def _issue(w_desc, x_desc, w_bufs, x_bufs, ready, s, w_row, kb, pred):
    nbytes: gl.constexpr = (w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    mbarrier.expect(ready.index(s), nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [w_row, kb * BLOCK_K], ready.index(s), w_bufs.index(s), pred=pred)
    tma.async_copy_global_to_shared(x_desc, [0, kb * BLOCK_K], ready.index(s), x_bufs.index(s), pred=pred)


@gluon.jit
def _store_out(acc, c_ptr, offs_n, offs_m, M, N, stride_cm):
    """acc [BLOCK_W, BLOCK_M] (output columns x rows) into c [M, N]."""
    ptrs = c_ptr + offs_m.to(gl.int64)[None, :] * stride_cm + offs_n[:, None]
    mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _sum_partials(ws_ptr, c_ptr, n0, M, N, stride_cm, ROWS: gl.constexpr, BLOCK_M: gl.constexpr,
                  SPLIT_K: gl.constexpr, OUT_L: gl.constexpr):
    """Sums the split partials of output columns [n0, n0 + ROWS) in split order, stores c."""
    offs_n = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, OUT_L))
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, OUT_L))
    mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    ptrs = ws_ptr + offs_m.to(gl.int64)[None, :] * N + offs_n[:, None]
    MN = M.to(gl.int64) * N
    acc = gl.zeros([ROWS, BLOCK_M], gl.float32, OUT_L)
    for s in gl.static_range(SPLIT_K):
        acc += gl.load(ptrs + s * MN, mask=mask, other=0.0, cache_modifier=".cg")
    _store_out(acc, c_ptr, offs_n, offs_m, M, N, stride_cm)


@gluon.jit
def fp8_groupwise_smallm_kernel(
    w_desc, x_desc, xs_ptr, ws_scale_ptr, c_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_xsm, stride_xsk, stride_wsn, stride_wsk, stride_cm,
    BLOCK_W: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr,
    REDUCE: gl.constexpr, SLICE: gl.constexpr,
):
    """Grid (cdiv(N, BLOCK_W), SPLIT_K). ``w_desc``: weights [N, K], blocks [BLOCK_W, 128];
    ``x_desc``: activations [M, K], blocks [BLOCK_M, 128]; ``xs_ptr`` [M, K/128] and
    ``ws_scale_ptr`` [N/128, K/128] read through their strides; ``SLICE``: output columns
    each program sums with ``REDUCE`` 2 (a power of two >= BLOCK_W / SPLIT_K)."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_W == 16 * NW)  # 64 weight rows per warpgroup
    MMA_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                    instr_shape=[16, BLOCK_M, 32])
    COL_L: gl.constexpr = gl.SliceLayout(0, MMA_L)
    OUT_L: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, NW], [0, 1])

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_kb = K // BLOCK_K
    kb_per = gl.cdiv(num_kb, SPLIT_K)
    kb_lo = pid_k * kb_per
    n_kb = gl.minimum(kb_lo + kb_per, num_kb) - kb_lo
    w_row = pid_n * BLOCK_W

    w_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_W, BLOCK_K], w_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        _issue(w_desc, x_desc, w_bufs, x_bufs, ready, i, w_row, kb_lo + i, i < n_kb)

    offs_m = gl.arange(0, BLOCK_M, layout=COL_L)
    m_ok = offs_m < M
    xs_ptrs = xs_ptr + offs_m.to(gl.int64) * stride_xsm + kb_lo * stride_xsk
    ws_ptrs = ws_scale_ptr + (w_row // 128) * stride_wsn + kb_lo * stride_wsk
    xs = gl.load(xs_ptrs, mask=m_ok, other=0.0)
    wsc = gl.load(ws_ptrs)
    zero = gl.zeros([BLOCK_W, BLOCK_M], gl.float32, MMA_L)
    acc = zero
    for i in range(n_kb):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w_s = w_bufs.index(s)
        x_s = x_bufs.index(s)
        tok = warpgroup_mma(w_s, x_s.permute((1, 0)), zero, use_acc=False, is_async=True)
        nxt = gl.minimum(i + 1, n_kb - 1)
        xs_n = gl.load(xs_ptrs + nxt * stride_xsk, mask=m_ok, other=0.0)
        wsc_n = gl.load(ws_ptrs + nxt * stride_wsk)
        prod = warpgroup_mma_wait(num_outstanding=0, deps=(tok, ))
        gl.thread_barrier()  # every warpgroup's wgmma has read slot s
        _issue(w_desc, x_desc, w_bufs, x_bufs, ready, s, w_row, kb_lo + i + STAGES, i + STAGES < n_kb)
        acc += prod * (xs * wsc)[None, :]
        xs = xs_n
        wsc = wsc_n
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    out = gl.convert_layout(acc, OUT_L)
    offs_n = w_row + gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, OUT_L))
    offs_mo = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, OUT_L))
    if SPLIT_K == 1:
        _store_out(out, c_ptr, offs_n, offs_mo, M, N, stride_cm)
    else:
        MN = M.to(gl.int64) * N
        ptrs = ws_ptr + pid_k * MN + offs_mo.to(gl.int64)[None, :] * N + offs_n[:, None]
        gl.store(ptrs, out, mask=(offs_n < N)[:, None] & (offs_mo < M)[None, :])
        if REDUCE == 1:
            gl.thread_barrier()  # every thread's partial is stored before the arrival is counted
            arrived = gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                _sum_partials(ws_ptr, c_ptr, w_row, M, N, stride_cm, BLOCK_W, BLOCK_M, SPLIT_K, OUT_L)
                gl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
        elif REDUCE == 2:
            num_n = gl.num_programs(0)
            gl.thread_barrier()
            gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            seen = gl.atomic_add(cnt_ptr + pid_n, 0, sem="acquire", scope="gpu")
            while seen < SPLIT_K:
                seen = gl.atomic_add(cnt_ptr + pid_n, 0, sem="acquire", scope="gpu")
            gl.thread_barrier()
            if pid_k * SLICE < BLOCK_W:
                _sum_partials(ws_ptr, c_ptr, w_row + pid_k * SLICE, M, N, stride_cm, SLICE, BLOCK_M, SPLIT_K, OUT_L)
            left = gl.atomic_add(cnt_ptr + num_n + pid_n, 1, sem="relaxed", scope="gpu")
            if left == SPLIT_K - 1:  # every program of the tile is past its wait: reset both counters
                gl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
                gl.atomic_xchg(cnt_ptr + num_n + pid_n, 0, sem="relaxed", scope="gpu")


def smallm_supported(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """A Hopper GPU, 2-D e4m3 operands TMA can read, M <= 128, bf16/fp16 output."""
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] != 9:
        return False
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] > 128:
        return False
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return False
    if out.dtype not in (torch.bfloat16, torch.float16) or out.stride(-1) != 1:
        return False
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 and t.shape[-1] % 16 == 0 for t in (a, b))


def _desc(t: torch.Tensor, block_rows: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([block_rows, 128], gl.float8e4nv)
    return TensorDescriptor(t, list(t.shape), [t.shape[-1], 1], [block_rows, 128], layout)


def groupwise_gemm_gluon_smallm(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, *,
                                config: dict, num_sms: int | None = None) -> None:
    """Launches the small-M kernel (``smallm_supported`` must hold).

    ``config``: BLOCK_W (64 or 128 weight rows per program), num_stages, SPLIT_K and
    REDUCE (``"last"``, the default; ``"spread"``: every program of a tile sums a slice,
    needs grid <= SMs, else ``"last"`` is used; ``"launch"``: a second kernel).
    ``*_scale_strides`` are (group, row, k-block) element strides as in ``groupwise.py``.
    """
    from mate.ops.gemm.groupwise import _TL_DTYPE, _tile_counters, splitk_reduce_kernel

    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return
    bw = config.get("BLOCK_W", 128)
    bm = 64 if M <= 64 else 128
    split = max(1, min(config.get("SPLIT_K", 1), K // 128))
    tiles = triton.cdiv(N, bw)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    mode = {"launch": 0, "last": 1, "spread": 2}[config.get("REDUCE", "last")] if split > 1 else 0
    if mode == 2 and tiles * split > num_sms:
        mode = 1
    cnt = None
    if mode:
        cnt = _tile_counters(a.device, 2 * tiles)
        if cnt is None:  # capturing a graph before any eager call sized the counters
            mode = 0
    ws = torch.empty((split, M, N), dtype=torch.float32, device=a.device) if split > 1 else out
    slice_rows = triton.next_power_of_2(triton.cdiv(bw, split))
    fp8_groupwise_smallm_kernel[(tiles, split)](
        _desc(b, bw), _desc(a, bm), a_scale, b_scale, out, ws, cnt if cnt is not None else out,
        M, N, K,
        a_scale_strides[1], a_scale_strides[2], b_scale_strides[1], b_scale_strides[2], out.stride(0),
        BLOCK_W=bw, BLOCK_M=bm, STAGES=config.get("num_stages", 6), SPLIT_K=split, REDUCE=mode,
        SLICE=slice_rows, num_warps=bw // 16,
    )
    if split > 1 and mode == 0:
        splitk_reduce_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 128))](
            ws, out, out, M, N, out.stride(0), 0,
            SPLIT_K=split, OUT_FP8=False, OUT_DTYPE=_TL_DTYPE[out.dtype], BLOCK_M=32, BLOCK_N=128, num_warps=4,
        )
