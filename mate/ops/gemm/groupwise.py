"""Triton kernels for block-scaled (1x128 activations, 128x128 weights) FP8 GEMM.

One kernel serves three layouts (constexpr ``LAYOUT``):

- ``PLAIN``: a [m, k] x b [n, k]ᵀ, optional split-K into an fp32 workspace;
- ``CONTIGUOUS``: MoE rows grouped by expert (``m_indices``, -1 padding rows skipped);
- ``MASKED``: a [G, max_m, k] x b [G, n, k]ᵀ with ``masked_m`` read on the device.

Each K step is 128 wide, so one activation scale per row and one weight scale per tile
apply to each partial product: acc += dot(a, bᵀ) * a_scale[:, None] * b_scale, in fp32.
Scales are read in place through their strides (K-major or MN-major). The epilogue
rounds to bf16/fp16, or quantizes to e4m3 per row and 128-column group and writes the
group scales (amax / 448, 1 for a zero group).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from mate._core.dispatch import interpreter_active
from mate._core.env import ENV_VARS
from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv, to_fp8_e4m3, to_out_dtype

__all__ = ["groupwise_gemm_triton", "PLAIN", "CONTIGUOUS", "MASKED"]

PLAIN, CONTIGUOUS, MASKED = 0, 1, 2

_TL_DTYPE = {
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
}


@triton.jit
def tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share each weight tile while it is in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, c_ptr, cs_ptr, offs_m, offs_n, row_ok, M, N, stride_cm, stride_csm, pid_n,
              OUT_FP8: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Stores an fp32 tile [BLOCK_M, BLOCK_N] (BLOCK_N == 128 when OUT_FP8)."""
    col_ok = offs_n < N
    mask = row_ok[:, None] & col_ok[None, :]
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    if OUT_FP8:
        amax = tl.max(tl.where(mask, tl.abs(acc), 0.0), axis=1)
        scale = tl.where(amax > 0.0, amax / 448.0, 1.0)
        q = to_fp8_e4m3(acc / scale[:, None])
        tl.store(c_ptrs, q, mask=mask)
        tl.store(cs_ptr + offs_m.to(tl.int64) * stride_csm + pid_n, scale, mask=row_ok)
    else:
        tl.store(c_ptrs, to_out_dtype(acc, OUT_DTYPE), mask=mask)


@triton.jit
def fp8_groupwise_gemm_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, cs_ptr, ws_ptr, idx_ptr, mm_ptr,
    M, N, K, G,
    stride_ag, stride_am,
    stride_bg, stride_bn,
    stride_asg, stride_asm, stride_ask,
    stride_bsg, stride_bsn, stride_bsk,
    stride_cg, stride_cm, stride_csm,
    LAYOUT: tl.constexpr, SPLIT_K: tl.constexpr, OUT_FP8: tl.constexpr, OUT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    grp = tl.program_id(2)
    pid_m, pid_n = tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < M
    if LAYOUT == 2:  # MASKED: rows of group grp at or past masked_m[grp] are skipped
        m_valid = tl.minimum(tl.load(mm_ptr + grp), M)
        if pid_m * BLOCK_M >= m_valid:
            return
        row_ok = offs_m < m_valid
        g64 = grp.to(tl.int64)
        a_ptr += g64 * stride_ag
        as_ptr += g64 * stride_asg
        b_ptr += g64 * stride_bg
        bs_ptr += g64 * stride_bsg
        c_ptr += g64 * stride_cg
    if LAYOUT == 1:  # CONTIGUOUS: the tile's expert; rows of another index are not written
        idx = tl.load(idx_ptr + offs_m, mask=row_ok, other=-1)
        idx = tl.where(idx < G, idx, -1)  # an index >= G is skipped like a padding row
        expert = tl.max(idx, axis=0)
        if expert < 0:
            return
        row_ok = idx == expert
        e64 = expert.to(tl.int64)
        b_ptr += e64 * stride_bg
        bs_ptr += e64 * stride_bsg

    num_kb = K // BLOCK_K
    kb_per = tl.cdiv(num_kb, SPLIT_K)
    kb_lo = pid_k * kb_per
    kb_hi = tl.minimum(kb_lo + kb_per, num_kb)

    col_ok = offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + (kb_lo * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[:, None] * stride_bn + (kb_lo * BLOCK_K + offs_k)[None, :]
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm + kb_lo * stride_ask
    bs_ptrs = bs_ptr + (pid_n * BLOCK_N // 128) * stride_bsn + kb_lo * stride_bsk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(kb_lo, kb_hi, num_stages=NUM_STAGES):
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=col_ok[:, None], other=0.0)
        sa = tl.load(as_ptrs, mask=row_ok, other=0.0)
        sb = tl.load(bs_ptrs)
        part = tl.dot(a, tl.trans(b))
        acc += part * (sa * sb)[:, None]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk

    if SPLIT_K > 1:
        w_ptrs = ws_ptr + (pid_k * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
        tl.store(w_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])
    else:
        _epilogue(acc, c_ptr, cs_ptr, offs_m, offs_n, row_ok, M, N, stride_cm, stride_csm, pid_n,
                  OUT_FP8, OUT_DTYPE)


@triton.jit
def _scaled_add(acc, part, sa, sb, BLOCK_N: tl.constexpr):
    """acc + part * a_scale (per row) * b_scale (per tile, or per column when BLOCK_N > 128)."""
    if BLOCK_N > 128:
        res = acc + part * sa[:, None] * sb[None, :]
    else:
        res = acc + part * (sa * sb)[:, None]
    return res


@triton.jit
def fp8_groupwise_tma_kernel(
    a_desc, b_desc, as_ptr, bs_ptr, c_ptr, cs_ptr, ws_ptr, cnt_ptr, idx_ptr, mm_ptr,
    M, N, K, G,
    stride_asg, stride_asm, stride_ask,
    stride_bsg, stride_bsn, stride_bsk,
    stride_cg, stride_cm, stride_csm,
    LAYOUT: tl.constexpr, SPLIT_K: tl.constexpr, FUSED_REDUCE: tl.constexpr, OUT_FP8: tl.constexpr,
    OUT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr, MMA_LAG: tl.constexpr = False,
    A_PTR: tl.constexpr = False, a_ptr=None, stride_am=None,
):
    """Same math as ``fp8_groupwise_gemm_kernel`` with A and B tiles loaded by TMA.

    ``a_desc`` covers a as 2-D rows [rows, K] (MASKED: the G x max_m rows of all groups),
    ``b_desc`` covers b as [G * N, K]; out-of-range rows read as zeros (or as the next
    group's rows, whose products land in masked-off output rows and columns only).
    Split-K partials go to an fp32 workspace; with ``FUSED_REDUCE`` the last program of a
    tile to arrive (counted with an atomic) sums them in split order and runs the epilogue,
    then resets the tile's counter to 0 for the next call, so the sum is deterministic.
    ``A_PTR``: A tiles are masked pointer loads from ``a_ptr`` (row stride ``stride_am``,
    the rows of ``a_desc``'s layout) instead of TMA, so rows past M are not fetched (a TMA
    box mostly out of bounds at M = 1); ``a_desc`` is then unused.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    grp = tl.program_id(2)
    pid_m, pid_n = tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < M  # rows written
    in_a = offs_m < M  # rows whose scales exist in memory (read even when not written)
    a_row = pid_m * BLOCK_M
    b_row = pid_n * BLOCK_N
    if LAYOUT == 2:  # MASKED
        m_valid = tl.minimum(tl.load(mm_ptr + grp), M)
        if pid_m * BLOCK_M >= m_valid:
            return
        row_ok = offs_m < m_valid
        g64 = grp.to(tl.int64)
        as_ptr += g64 * stride_asg
        bs_ptr += g64 * stride_bsg
        c_ptr += g64 * stride_cg
        a_row += grp * M
        b_row += grp * N
    if LAYOUT == 1:  # CONTIGUOUS
        idx = tl.load(idx_ptr + offs_m, mask=row_ok, other=-1)
        idx = tl.where(idx < G, idx, -1)  # an index >= G is skipped like a padding row
        expert = tl.max(idx, axis=0)
        if expert < 0:
            return
        row_ok = idx == expert
        bs_ptr += expert.to(tl.int64) * stride_bsg
        b_row += expert * N

    num_kb = K // BLOCK_K
    kb_per = tl.cdiv(num_kb, SPLIT_K)
    kb_lo = pid_k * kb_per
    kb_hi = tl.minimum(kb_lo + kb_per, num_kb)

    col_ok = offs_n < N
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm + kb_lo * stride_ask
    if BLOCK_N > 128:  # one weight scale per 128 columns of the tile
        bs_ptrs = bs_ptr + (offs_n // 128) * stride_bsn + kb_lo * stride_bsk
    else:
        bs_ptrs = bs_ptr + (pid_n * BLOCK_N // 128) * stride_bsn + kb_lo * stride_bsk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if MMA_LAG:
        # the product of step i is scaled into acc during step i + 1, so the wgmma of one
        # step runs while the previous one is scaled (two products live in registers)
        prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        sa_prev = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if BLOCK_N > 128:
            sb_prev = tl.zeros((BLOCK_N,), dtype=tl.float32)
        else:
            sb_prev = 0.0
    if A_PTR:
        a_rows = a_row + tl.arange(0, BLOCK_M)
        a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + (kb_lo * BLOCK_K + tl.arange(0, BLOCK_K))[None, :]
    for kb in tl.range(kb_lo, kb_hi, num_stages=NUM_STAGES):
        if A_PTR:
            a = tl.load(a_ptrs, mask=in_a[:, None], other=0.0)
            a_ptrs += BLOCK_K
        else:
            a = a_desc.load([a_row, kb * BLOCK_K])
        b = b_desc.load([b_row, kb * BLOCK_K])
        sa = tl.load(as_ptrs, mask=in_a, other=0.0)
        if BLOCK_N > 128:
            sb = tl.load(bs_ptrs, mask=col_ok, other=0.0)
        else:
            sb = tl.load(bs_ptrs)
        part = tl.dot(a, tl.trans(b))
        if MMA_LAG:
            acc = _scaled_add(acc, prev, sa_prev, sb_prev, BLOCK_N)
            prev = part
            sa_prev = sa
            sb_prev = sb
        else:
            acc = _scaled_add(acc, part, sa, sb, BLOCK_N)
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk
    if MMA_LAG:
        acc = _scaled_add(acc, prev, sa_prev, sb_prev, BLOCK_N)

    if SPLIT_K > 1:
        mask = row_ok[:, None] & col_ok[None, :]
        w_ptrs = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        MN = (pid_k.to(tl.int64) * 0 + M) * N  # int64 even when M or N is specialized to 1
        tl.store(w_ptrs + pid_k * MN, acc, mask=mask)
        if FUSED_REDUCE:
            tl.debug_barrier()  # every thread's partial is stored before the arrival is counted
            arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT_K):
                    acc += tl.load(w_ptrs + s * MN, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(acc, c_ptr, cs_ptr, offs_m, offs_n, row_ok, M, N, stride_cm, stride_csm, pid_n,
                          OUT_FP8, OUT_DTYPE)
                tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")
    else:
        _epilogue(acc, c_ptr, cs_ptr, offs_m, offs_n, row_ok, M, N, stride_cm, stride_csm, pid_n,
                  OUT_FP8, OUT_DTYPE)


@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, cs_ptr, M, N, stride_cm, stride_csm,
                         SPLIT_K: tl.constexpr, OUT_FP8: tl.constexpr, OUT_DTYPE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sums the fp32 split-K partials [SPLIT_K, M, N] in a fixed order, then the epilogue."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_m < M
    mask = row_ok[:, None] & (offs_n < N)[None, :]
    ptrs = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ptrs + s * M * N, mask=mask, other=0.0)
    _epilogue(acc, c_ptr, cs_ptr, offs_m, offs_n, row_ok, M, N, stride_cm, stride_csm, pid_n,
              OUT_FP8, OUT_DTYPE)


_COUNTERS: dict[tuple, torch.Tensor] = {}
_RETIRED_COUNTERS: list[torch.Tensor] = []  # replaced buffers that captured graphs may still use


def _counter_key(device: torch.device) -> tuple:
    """(device type, index, stream): the counter buffer of the current stream on ``device``."""
    if device.type != "cuda":
        return (device.type, device.index, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return ("cuda", index, torch.cuda.current_stream(index).cuda_stream)


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """Int32 arrival counters for the fused split-K reduce (zero between calls: the last
    program of each tile resets its counter), one buffer per device and stream, so that eager
    calls on two streams never count each other's arrivals. A capture never allocates (the
    zero fill of a buffer made inside it would only run when the graph replays): it takes its
    capture stream's buffer, else the largest buffer an eager call made on this device (the
    warm-up's; ``torch.cuda.graph`` captures on a side stream of its own), else None. A graph
    thus shares a buffer with the eager calls of one stream and must not replay concurrently
    with them or with another graph holding it. A buffer replaced by a larger one stays
    alive, since graphs captured earlier still point at it. None (the reduce is then a second
    launch) with ``MATE_GEMM_SPLITK_REDUCE=launch``."""
    reduce = os.environ.get("MATE_GEMM_SPLITK_REDUCE", ENV_VARS["MATE_GEMM_SPLITK_REDUCE"][0])
    if reduce not in ("fused", "launch"):
        raise ValueError(f"MATE_GEMM_SPLITK_REDUCE must be 'fused' or 'launch', got {reduce!r}")
    if reduce == "launch":
        return None
    key = _counter_key(device)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= tiles:
        return buf
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        same_device = [b for k, b in _COUNTERS.items() if k[:2] == key[:2] and b.numel() >= tiles]
        return max(same_device, key=lambda b: b.numel()) if same_device else None
    buf = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    if key in _COUNTERS:
        _RETIRED_COUNTERS.append(_COUNTERS[key])
    _COUNTERS[key] = buf
    return buf


_WORKSPACES: dict[tuple, torch.Tensor] = {}


def splitk_workspace(device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    """fp32 scratch of ``shape`` for split-K partials. Eager calls take a view of one growing
    buffer per device and stream (calls on a stream run in order, and each call's partials are
    summed before the stream's next call starts), so repeated calls pass the same address and
    their launches can be replayed (``mate._core.recipe``); under CUDA-graph capture each call
    allocates its own (in the graph's pool)."""
    numel = math.prod(shape)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.empty(shape, dtype=torch.float32, device=device)
    key = _counter_key(device)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACES[key] = torch.empty(numel, dtype=torch.float32, device=device)
    return buf[:numel].view(shape)


def _tma_ok(t: torch.Tensor) -> bool:
    """A [.., rows, k] operand TMA can read as one 2-D [rows_total, k] tensor."""
    if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(-2) * t.element_size()) % 16:
        return False
    return t.dim() == 2 or t.shape[0] == 1 or t.stride(0) == t.shape[1] * t.stride(1)


def _desc(t: torch.Tensor, rows_block: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = t.shape[-2] * (t.shape[0] if t.dim() == 3 else 1)
    return TensorDescriptor(t, [rows, t.shape[-1]], [t.stride(-2), 1], [rows_block, 128])


def groupwise_gemm_triton(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    a_scale_strides: tuple[int, int, int],
    b_scale: torch.Tensor,
    b_scale_strides: tuple[int, int, int],
    out: torch.Tensor,
    output_scale: torch.Tensor | None,
    *,
    layout: int,
    config: dict,
    m_indices: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
) -> None:
    """Launches the kernel on validated tensors (k contiguous) and preallocated outputs.

    ``a`` is [m, k] (PLAIN, CONTIGUOUS) or [G, max_m, k] (MASKED); ``b`` is [n, k] or
    [G, n, k]. ``*_scale_strides`` are (group, row, k-block) element strides of the scale
    tensors, which lets both scale-major modes be read in place. ``config`` holds
    BLOCK_M, BLOCK_N, SPLIT_K, GROUP_M, num_warps, num_stages and optionally TMA (default
    True: TMA loads when both operands allow them, else pointer loads, whose BLOCK_N is
    capped at 128), REDUCE (``"fused"``, the default: the last split of a tile reduces;
    ``"launch"``: a second kernel reduces), MMA_LAG (TMA kernel: scale each step's
    product during the next step, so a wgmma overlaps the scaling; default False), A_PTR
    (TMA kernel: A tiles by masked pointer loads, B by TMA; default False) and
    GLUON (bf16/fp16 output, on a Hopper GPU; MASKED when ``gluon_masked_supported``: the persistent
    warp-specialized kernel of ``groupwise_gluon.py`` with BLOCK_M, BLOCK_N, num_stages,
    GROUP_M, EPI_TMA and KPS (K blocks per ring stage); SPLIT_K is ignored; KINT: the
    K-interleaved small-M kernel of ``groupwise_gluon_kint.py``, which reads SPLIT_K and EAGER
    too; FLAT: the single-partition kernel of ``groupwise_gluon_flat.py``; elsewhere the
    option is ignored. True: the config as is; a dict: its keys override the config's for
    the Gluon kernel, whose other keys still serve the plain-Triton kernel elsewhere).
    """
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-2]
    G = b.shape[0] if b.dim() == 3 else 1
    if M == 0 or N == 0 or out.numel() == 0:
        return
    out_fp8 = out.dtype == torch.float8_e4m3fn
    if config.get("GLUON") and not out_fp8 and not interpreter_active():
        from mate.ops.gemm.groupwise_gluon import gluon_masked_supported, gluon_supported, groupwise_gemm_gluon

        gluon_cfg = {**config, **config["GLUON"]} if isinstance(config["GLUON"], dict) else config
        if gluon_supported(a, b, out) and (layout != MASKED or gluon_masked_supported(a, a_scale_strides, out,
                                                                                        gluon_cfg)):
            groupwise_gemm_gluon(a, b, a_scale, a_scale_strides, b_scale, b_scale_strides, out, layout=layout,
                                 config=gluon_cfg, m_indices=m_indices, masked_m=masked_m)
            return
    use_tma = config.get("TMA", True) and _tma_ok(a) and _tma_ok(b)
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if not use_tma:
        bn = min(bn, 128)  # the pointer-load kernel reads one weight scale per tile
    split_k = config.get("SPLIT_K", 1) if layout == PLAIN else 1
    split_k = max(1, min(split_k, K // 128))
    if out_fp8:
        assert bn == 128, "FP8 output needs BLOCK_N == 128 (one scale group per tile)"
    tiles = cdiv(M, bm) * cdiv(N, bn)
    grid = (tiles, split_k, G if layout == MASKED else 1)
    ws = splitk_workspace(a.device, (split_k, M, N)) if split_k > 1 else out
    cs = output_scale if output_scale is not None else out
    idx = m_indices if m_indices is not None else out
    mm = masked_m if masked_m is not None else out
    stride_cg = out.stride(0) if out.dim() == 3 else 0
    stride_csm = output_scale.stride(0) if output_scale is not None else 0
    common = dict(LAYOUT=layout, SPLIT_K=split_k, OUT_FP8=out_fp8, OUT_DTYPE=_TL_DTYPE[out.dtype],
                  BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=config.get("GROUP_M", 8),
                  NUM_STAGES=config.get("num_stages", 3),
                  num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3))
    reduce_launch = split_k > 1
    if use_tma:
        cnt = None
        if split_k > 1 and config.get("REDUCE", "fused") == "fused":
            cnt = _tile_counters(a.device, tiles)
        reduce_launch = split_k > 1 and cnt is None
        a_ptr = {"A_PTR": True, "a_ptr": a, "stride_am": a.stride(-2)} if config.get("A_PTR") else {}
        launcher(fp8_groupwise_tma_kernel)[grid](
            None if a_ptr else _desc(a, bm), _desc(b, bn), a_scale, b_scale, out, cs, ws,
            cnt if cnt is not None else out, idx, mm,
            M, N, K, G,
            *a_scale_strides, *b_scale_strides,
            stride_cg, out.stride(-2), stride_csm,
            FUSED_REDUCE=cnt is not None, MMA_LAG=config.get("MMA_LAG", False), **a_ptr, **common,
        )
    else:
        launcher(fp8_groupwise_gemm_kernel)[grid](
            a, b, a_scale, b_scale, out, cs, ws, idx, mm,
            M, N, K, G,
            a.stride(0) if a.dim() == 3 else 0, a.stride(-2),
            b.stride(0) if b.dim() == 3 else 0, b.stride(-2),
            *a_scale_strides, *b_scale_strides,
            stride_cg, out.stride(-2), stride_csm,
            **common,
        )
    if reduce_launch:
        rbm = 32
        launcher(splitk_reduce_kernel)[(cdiv(M, rbm), cdiv(N, 128))](
            ws, out, cs, M, N, out.stride(0), stride_csm,
            SPLIT_K=split_k, OUT_FP8=out_fp8, OUT_DTYPE=_TL_DTYPE[out.dtype],
            BLOCK_M=rbm, BLOCK_N=128, num_warps=4,
        )
