"""Triton batched GEMM for bf16/fp16 and FP8 (per-tensor or channelwise scales).

A [b, m, k] and B [b, k, n] are read through their strides (a transposed view of a
contiguous [b, n, k] is read in place). The fp32 accumulator is scaled after the K loop
(the scales do not vary along k) and rounded once to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv, dot_operand, to_out_dtype
from mate.ops.gemm.groupwise import tile_coords

__all__ = ["bmm_triton", "SCALE_NONE", "SCALE_TENSOR", "SCALE_CHANNEL"]

SCALE_NONE, SCALE_TENSOR, SCALE_CHANNEL = 0, 1, 2

_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def bmm_kernel(
    a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    SCALE_MODE: tl.constexpr, OUT_DTYPE: tl.constexpr, PROMOTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    bid = tl.program_id(1).to(tl.int64)
    pid_m, pid_n = tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < M
    col_ok = offs_n < N
    a_ptrs = a_ptr + bid * stride_ab + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + bid * stride_bb + offs_k[:, None] * stride_bk + offs_n.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if PROMOTE:
            # FP8 tensor-core MMAs keep only ~14 bits while accumulating: add each
            # BLOCK_K partial product into the fp32 registers instead of chaining them
            acc += tl.dot(a, b)
        else:
            acc = tl.dot(dot_operand(a), dot_operand(b), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALE_MODE == 1:
        acc = acc * (tl.load(as_ptr) * tl.load(bs_ptr))
    elif SCALE_MODE == 2:
        sa = tl.load(as_ptr + bid * M + offs_m, mask=row_ok, other=0.0)
        sb = tl.load(bs_ptr + bid * N + offs_n, mask=col_ok, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    c_ptrs = c_ptr + bid * stride_cb + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, to_out_dtype(acc, OUT_DTYPE), mask=row_ok[:, None] & col_ok[None, :])


def bmm_triton(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor,
    A_scale: torch.Tensor | None = None,
    B_scale: torch.Tensor | None = None,
    *,
    scale_mode: int = SCALE_NONE,
    config: dict,
) -> None:
    """out[b] = A[b] @ B[b] (times the scales). Channelwise scales must be contiguous
    [b, m, 1] / [b, 1, n]; per-tensor scales one fp32 element each."""
    nb, M, K = A.shape
    N = B.shape[2]
    if out.numel() == 0:
        return
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    grid = (cdiv(M, bm) * cdiv(N, bn), nb)
    sa = A_scale if A_scale is not None else out
    sb = B_scale if B_scale is not None else out
    launcher(bmm_kernel)[grid](
        A, B, out, sa, sb, M, N, K,
        *A.stride(), *B.stride(), *out.stride(),
        SCALE_MODE=scale_mode, OUT_DTYPE=_TL_DTYPE[out.dtype], PROMOTE=A.element_size() == 1,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.get("GROUP_M", 8),
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3),
    )
