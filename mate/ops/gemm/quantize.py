"""Per-row, 128-column-group FP8 quantization of a 16-bit matrix: the second step of an FP8-output
groupwise GEMM whose first step writes bf16 (cuBLAS blockwise, which has no per-group
epilogue, or a bf16-output Gluon kernel). Semantics of ``reference.quantize_fp8_row_groups_ref``
applied to the bf16 result: scale = amax / 448 per row and group (1 for a zero group), q =
e4m3(x / scale), saturating.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv
from mate.ops.gemm.groupwise import _epilogue

__all__ = ["quantize_fp8_row_groups"]

QUANT_BLOCK_M = 32  # rows per program; each program quantizes one 128-column group of them


@triton.jit
def _quantize_row_groups_kernel(x_ptr, q_ptr, s_ptr, M, N, stride_xm, stride_qm, stride_sm,
                                BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    g = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = g * 128 + tl.arange(0, 128)
    row_ok = offs_m < M
    mask = row_ok[:, None] & (offs_n < N)[None, :]
    x = tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_n[None, :], mask=mask, other=0.0)
    # the GEMM kernel's FP8 epilogue: amax / 448 per row of the group, saturating e4m3
    _epilogue(x.to(tl.float32), q_ptr, s_ptr, offs_m, offs_n, row_ok, M, N, stride_qm, stride_sm, g,
              OUT_FP8=True, OUT_DTYPE=q_ptr.dtype.element_ty)


def quantize_fp8_row_groups(x: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
    """x [m, n] bf16/fp16 (last dim contiguous) -> out [m, n] e4m3 and scale [m, ceil(n / 128)]
    fp32 (last dims contiguous), in place. One launch; no allocation, no host sync."""
    m, n = x.shape
    if m == 0 or n == 0:
        return
    grid = (cdiv(m, QUANT_BLOCK_M), cdiv(n, 128))
    launcher(_quantize_row_groups_kernel)[grid](x, out, scale, m, n, x.stride(0), out.stride(0), scale.stride(0),
                                      BLOCK_M=QUANT_BLOCK_M, num_warps=4)
