"""cuBLAS paths of the GEMM family (through ``torch.bmm`` and ``torch._scaled_mm``).

Operands are passed as the caller's views: a transposed view is a column-major operand
for cuBLAS, never a copy. ``*_eligible`` say whether cuBLAS takes the given layouts; the
interface routes other layouts to Triton (``auto``) or raises (``backend="cublas"``).
"""

from __future__ import annotations

import torch

__all__ = [
    "bmm_cublas",
    "bmm_fp8_cublas",
    "bmm_fp8_cublas_reason",
    "groupwise_cublas",
    "groupwise_cublas_reason",
    "groupwise_scales_in_place",
]


def bmm_cublas(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor) -> None:
    """out = A @ B with cuBLAS; fp32 output from bf16/fp16 inputs uses ``out_dtype``."""
    if out.dtype == A.dtype:
        torch.bmm(A, B, out=out)
    else:
        torch.bmm(A, B, out_dtype=out.dtype, out=out)


def _col_major(t: torch.Tensor) -> bool:
    return t.stride(-2) == 1 and (t.stride(-1) >= max(1, t.shape[-2]) or t.shape[-1] == 1)


def _row_major(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 and (t.stride(-2) >= max(1, t.shape[-1]) or t.shape[-2] == 1)


def bmm_fp8_cublas_reason(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, per_tensor: bool) -> str | None:
    """None when ``torch._scaled_mm`` takes these operands in place, else why not."""
    if not per_tensor:
        return "channelwise scales are computed by the Triton kernel"
    if A.dtype == torch.float8_e5m2 and B.dtype == torch.float8_e5m2:
        return "both operands e5m2"
    if not _row_major(A):
        return f"A must be row-major per batch (k contiguous), got strides {list(A.stride())}"
    if not _col_major(B):
        return f"B must be column-major per batch (the transpose of a [b, n, k] tensor), got strides {list(B.stride())}"
    if A.shape[2] % 16 or B.shape[2] % 16:
        return f"k and n must be multiples of 16, got k={A.shape[2]}, n={B.shape[2]}"
    if not out.is_contiguous():
        return "out must be contiguous"
    return None


def bmm_fp8_cublas(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                   out: torch.Tensor) -> None:
    """Per-tensor FP8 bmm: one ``torch._scaled_mm`` per batch entry (it takes 2-D operands)."""
    sa = A_scale.reshape(())
    sb = B_scale.reshape(())
    for i in range(A.shape[0]):
        torch._scaled_mm(A[i], B[i], scale_a=sa, scale_b=sb, out_dtype=out.dtype, out=out[i])


def groupwise_cublas_reason(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> str | None:
    """None when cuBLAS blockwise takes these shapes (1x128 x 128x128 recipe), else why not."""
    if out.dtype not in (torch.bfloat16,):
        return f"cuBLAS blockwise writes bf16 only, got out dtype {out.dtype}"
    if not out.is_contiguous():
        return "cuBLAS blockwise needs contiguous a, b and out"
    return groupwise_cublas_operands_reason(a, b)


def groupwise_cublas_operands_reason(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """:func:`groupwise_cublas_reason` for a contiguous bf16 output (the operands' part)."""
    m, k = a.shape
    n = b.shape[0]
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "cuBLAS blockwise needs e4m3 operands"
    if m < 16 or m % 16:
        # measured on the H200 (torch 2.11): m = 1 gives CUBLAS_STATUS_NOT_SUPPORTED; multiples
        # of 16 (64, 128, 4096) run; other m are not verified, so they go to Triton
        return f"cuBLAS blockwise is used for m a positive multiple of 16 only, got m={m}"
    if n % 16 or (k // 128) % 4:
        return f"cuBLAS blockwise needs n % 16 == 0 and (k / 128) % 4 == 0, got n={n}, k={k}"
    if a.stride(0) != k or b.stride(0) != k:
        return "cuBLAS blockwise needs contiguous a, b and out"
    return None


def _column_major(scale: torch.Tensor) -> bool:
    """Whether a 2-D scale has the layout cuBLAS blockwise reads: stride (1, rows)."""
    return scale.stride() == (1, scale.shape[0])


def groupwise_scales_in_place(a_scale_mk: torch.Tensor, b_scale_kn: torch.Tensor) -> bool:
    """Whether ``groupwise_cublas`` reads both scales as given (no re-layout launch)."""
    return _column_major(a_scale_mk) and _column_major(b_scale_kn)


def groupwise_cublas(a: torch.Tensor, b: torch.Tensor, a_scale_mk: torch.Tensor, b_scale_kn: torch.Tensor,
                     out: torch.Tensor) -> None:
    """``torch._scaled_mm`` blockwise: a_scale_mk is [m, k/128] and b_scale_kn [k/128, n/128]
    (any strides). cuBLAS wants the activation scale M-major (stride (1, m)) and the weight
    scale as the transpose of a K-major [n/128, k/128]; a scale in the other layout is
    re-laid out here (scales only, at most m * k / 128 floats; operands are never copied).
    """
    if not _column_major(a_scale_mk):
        a_scale_mk = a_scale_mk.t().contiguous().t()
    if not _column_major(b_scale_kn):
        b_scale_kn = b_scale_kn.t().contiguous().t()
    torch._scaled_mm(a, b.t(), scale_a=a_scale_mk, scale_b=b_scale_kn, out_dtype=out.dtype, out=out)
