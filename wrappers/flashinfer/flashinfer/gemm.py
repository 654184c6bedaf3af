"""FlashInfer's GEMM names (``flashinfer.gemm``) on top of :mod:`mate.gemm`.

Each function keeps upstream FlashInfer 0.6.17's argument names, order and defaults
(except ``backend``, which defaults to ``"auto"``) and forwards to the mate function of
the same name; mate validates every argument and allocates the outputs. Upstream backend
names are accepted and all mean "let mate choose".
"""

from __future__ import annotations

import torch

import mate.gemm as _mate_gemm
from flashinfer._compat import mate_backend as _mate_backend
from mate.api_logging import mate_api as _mate_api

__all__ = [
    "batch_deepgemm_fp8_nt_groupwise",
    "bmm_bf16",
    "bmm_fp8",
    "gemm_fp8_nt_groupwise",
    "group_deepgemm_fp8_nt_groupwise",
]


@_mate_api
def bmm_bf16(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
) -> torch.Tensor:
    """Batched 16-bit matrix product ``out[i] = A[i] @ B[i]`` (fp32 accumulation).

    Parameters
    ----------
    A : torch.Tensor
        ``[b, m, k]``, bfloat16 or float16, any strides.
    B : torch.Tensor
        ``[b, k, n]``, same dtype as ``A``. Usually the transpose view of a contiguous
        ``[b, n, k]`` weight (column-major, as upstream expects); it is passed to mate as
        it is, without a layout copy.
    out : torch.Tensor, optional
        ``[b, m, n]`` buffer of ``out_dtype``; written and returned when given.
    out_dtype : torch.dtype
        bfloat16 (default), float16 or float32.
    backend : str
        Any upstream name (``"cudnn"``, ``"cutlass"``, ``"auto"``, ...): mate chooses.

    Returns
    -------
    torch.Tensor
        ``[b, m, n]`` of ``out_dtype`` (``out`` itself when given).

    Raises
    ------
    TypeError
        Wrong dtypes (from :func:`mate.gemm.bmm_bf16`).
    ValueError
        Wrong shapes or devices, or a backend name upstream does not know.

    Examples
    --------
    >>> import torch
    >>> import flashinfer
    >>> A = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    >>> W = torch.randn(2, 5, 64, dtype=torch.bfloat16)  # [b, n, k] weight
    >>> out = flashinfer.bmm_bf16(A, W.transpose(1, 2), backend="cudnn")
    >>> out.shape, torch.allclose(out.float(), A.float() @ W.float().transpose(1, 2), rtol=1e-2, atol=1e-2)
    (torch.Size([2, 3, 5]), True)
    """
    return _mate_gemm.bmm_bf16(A, B, out=out, out_dtype=out_dtype, backend=_mate_backend(backend))


@_mate_api
def bmm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Batched FP8 matrix product with scales: ``out = dtype((A @ B) * A_scale * B_scale)``.

    Parameters
    ----------
    A : torch.Tensor
        ``[b, m, k]``, float8_e4m3fn or float8_e5m2.
    B : torch.Tensor
        ``[b, k, n]``, float8_e4m3fn or float8_e5m2 (not both operands e5m2); usually the
        transpose view of a contiguous ``[b, n, k]``, passed through without a copy.
    A_scale, B_scale : torch.Tensor
        float32 multipliers of the dequantized values (real = fp8 * scale). One element
        each (per-tensor, as upstream), or the mate extension ``A_scale`` ``[b, m, 1]`` and
        ``B_scale`` ``[b, 1, n]`` (per row of A and per column of B).
    dtype : torch.dtype
        Output dtype, bfloat16 or float16.
    out : torch.Tensor, optional
        ``[b, m, n]`` of ``dtype``; written and returned when given.
    backend : str
        Any upstream name (``"cublas"``, ``"cudnn"``, ``"cutlass"``, ``"auto"``): mate chooses.

    Returns
    -------
    torch.Tensor
        ``[b, m, n]`` of ``dtype`` (``out`` itself when given).

    Raises
    ------
    TypeError
        Non-FP8 operands or non-float32 scales.
    ValueError
        A ``backend`` name upstream FlashInfer does not know, or :func:`mate.gemm.bmm_fp8`'s value
        errors (shapes, devices, scale layouts).

    Examples
    --------
    >>> import torch
    >>> import flashinfer
    >>> A = torch.randn(1, 4, 32).to(torch.float8_e4m3fn)
    >>> W = torch.randn(1, 8, 32).to(torch.float8_e4m3fn)
    >>> out = flashinfer.bmm_fp8(A, W.transpose(1, 2), torch.tensor(0.5), torch.tensor(2.0), torch.bfloat16)
    >>> ref = (A.float() @ W.float().transpose(1, 2)) * 0.5 * 2.0
    >>> torch.allclose(out.float(), ref, rtol=1e-2, atol=1e-2)  # bf16 output
    True
    """
    return _mate_gemm.bmm_fp8(A, B, A_scale, B_scale, dtype, out=out, backend=_mate_backend(backend))


@_mate_api
def gemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    scale_major_mode: str | None = None,
    mma_sm: int = 1,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
    output_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Groupwise-scaled FP8 product ``out = a @ b.T`` (DeepSeek-V3 1x128 / 128x128 blocks).

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k]`` float8_e4m3fn, k contiguous; ``k % 128 == 0``.
    b : torch.Tensor
        ``[n, k]`` float8_e4m3fn, k contiguous.
    a_scale, b_scale : torch.Tensor
        float32 multipliers, ``kb = k / 128``, ``nb = ceil(n / 128)``: ``[m, kb]`` and
        ``[nb, kb]`` when ``scale_major_mode="K"``, ``[kb, m]`` and ``[kb, nb]`` when
        ``"MN"``; ``None`` lets mate infer the mode from ``a_scale``'s shape.
    scale_major_mode : {"K", "MN"}, optional
    mma_sm : int
        Upstream tuning knob; accepted and ignored.
    scale_granularity_mnk : tuple of int
        Only ``(1, 128, 128)``.
    out : torch.Tensor, optional
        ``[m, n]``; written and returned when given.
    out_dtype : torch.dtype, optional
        bfloat16 (default) or float16.
    backend : str
        Any upstream name (``"cutlass"``, ``"trtllm"``, ``"auto"``): mate chooses.
    output_scale : torch.Tensor, optional
        mate extension, not in upstream: float32 ``[m, nb]`` filled in place with the
        per-row, per-128-column scales of an FP8 (e4m3) output (see
        :func:`mate.gemm.gemm_fp8_nt_groupwise`).

    Returns
    -------
    torch.Tensor
        ``[m, n]`` (``out`` itself when given).

    Raises
    ------
    TypeError
        Non-FP8 operands or non-float32 scales.
    ValueError
        A ``backend`` name upstream FlashInfer does not know, or :func:`mate.gemm.gemm_fp8_nt_groupwise`'s value
        errors (shapes, devices, scale layouts).

    Examples
    --------
    >>> import torch
    >>> from flashinfer.gemm import gemm_fp8_nt_groupwise
    >>> a = torch.randn(4, 128).to(torch.float8_e4m3fn)
    >>> b = torch.randn(64, 128).to(torch.float8_e4m3fn)
    >>> a_scale, b_scale = torch.full((4, 1), 2.0), torch.full((1, 1), 0.25)  # K-major
    >>> out = gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K", backend="cutlass")
    >>> torch.allclose(out.float(), 0.5 * a.float() @ b.float().T, rtol=1e-2, atol=1e-2)  # bf16
    True
    """
    return _mate_gemm.gemm_fp8_nt_groupwise(
        a,
        b,
        a_scale,
        b_scale,
        scale_major_mode=scale_major_mode,
        mma_sm=mma_sm,
        scale_granularity_mnk=scale_granularity_mnk,
        out=out,
        out_dtype=out_dtype,
        backend=_mate_backend(backend),
        output_scale=output_scale,
    )


@_mate_api
def group_deepgemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m_indices: torch.Tensor,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Grouped (MoE "contiguous" layout) groupwise FP8 product: ``out[i] = a[i] @ b[m_indices[i]].T``.

    Parameters
    ----------
    a : torch.Tensor
        ``[m, k]`` float8_e4m3fn.
    b : torch.Tensor
        ``[G, n, k]`` float8_e4m3fn.
    a_scale, b_scale : torch.Tensor
        float32 ``[m, k / 128]`` and ``[G, ceil(n / 128), k / 128]``.
    m_indices : torch.Tensor
        int32 ``[m]``: the group of each row, -1 for padding rows (output unspecified).
        Each group's rows form one range starting at a multiple of 128.
    scale_granularity_mnk : tuple of int
        Only ``(1, 128, 128)``.
    out : torch.Tensor, optional
        bfloat16 ``[m, n]``; written and returned when given.
    out_dtype : torch.dtype, optional
        bfloat16.

    Returns
    -------
    torch.Tensor
        bfloat16 ``[m, n]`` (``out`` itself when given).

    Raises
    ------
    TypeError
        Wrong dtypes.
    ValueError
        Wrong shapes or devices, ``k % 128 != 0``, another granularity, and with
        ``MATE_CHECK_INPUTS=1`` a group that does not start at a multiple of 128.

    Examples
    --------
    >>> import torch
    >>> from flashinfer.gemm import group_deepgemm_fp8_nt_groupwise
    >>> a = torch.randn(256, 128).to(torch.float8_e4m3fn)
    >>> b = torch.randn(2, 64, 128).to(torch.float8_e4m3fn)
    >>> m_indices = torch.tensor([1] * 128 + [0] * 128, dtype=torch.int32)
    >>> out = group_deepgemm_fp8_nt_groupwise(a, b, torch.ones(256, 1), torch.ones(2, 1, 1), m_indices)
    >>> torch.allclose(out[:128].float(), a[:128].float() @ b[1].float().T, rtol=1e-2, atol=1e-2)
    True
    """
    return _mate_gemm.group_deepgemm_fp8_nt_groupwise(
        a, b, a_scale, b_scale, m_indices, scale_granularity_mnk=scale_granularity_mnk, out=out, out_dtype=out_dtype
    )


@_mate_api
def batch_deepgemm_fp8_nt_groupwise(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    scale_granularity_mnk: tuple[int, int, int] = (1, 128, 128),
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Batched (MoE "masked" layout) groupwise FP8 product: ``out[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g].T``.

    Parameters
    ----------
    a : torch.Tensor
        ``[G, max_m, k]`` float8_e4m3fn.
    b : torch.Tensor
        ``[G, n, k]`` float8_e4m3fn.
    a_scale, b_scale : torch.Tensor
        float32 ``[G, max_m, k / 128]`` and ``[G, ceil(n / 128), k / 128]``.
    masked_m : torch.Tensor
        int32 ``[G]`` on the device: valid rows per group (read by the kernel, no host sync).
    expected_m : int
        Positive hint for tile selection.
    scale_granularity_mnk : tuple of int
        Only ``(1, 128, 128)``.
    out : torch.Tensor, optional
        bfloat16 ``[G, max_m, n]``; written and returned when given. Rows at or past
        ``masked_m[g]`` are unspecified.
    out_dtype : torch.dtype, optional
        bfloat16.

    Returns
    -------
    torch.Tensor
        bfloat16 ``[G, max_m, n]`` (``out`` itself when given).

    Raises
    ------
    TypeError
        Wrong dtypes or a non-int ``expected_m``.
    ValueError
        Wrong shapes or devices, ``k % 128 != 0``, another granularity,
        ``expected_m <= 0``.

    Examples
    --------
    >>> import torch
    >>> from flashinfer.gemm import batch_deepgemm_fp8_nt_groupwise
    >>> a = torch.randn(2, 8, 128).to(torch.float8_e4m3fn)
    >>> b = torch.randn(2, 64, 128).to(torch.float8_e4m3fn)
    >>> masked_m = torch.tensor([8, 2], dtype=torch.int32)
    >>> out = batch_deepgemm_fp8_nt_groupwise(a, b, torch.ones(2, 8, 1), torch.ones(2, 1, 1), masked_m, 8)
    >>> torch.allclose(out[1, :2].float(), a[1, :2].float() @ b[1].float().T, rtol=1e-2, atol=1e-2)
    True
    """
    return _mate_gemm.batch_deepgemm_fp8_nt_groupwise(
        a,
        b,
        a_scale,
        b_scale,
        masked_m,
        expected_m,
        scale_granularity_mnk=scale_granularity_mnk,
        out=out,
        out_dtype=out_dtype,
    )
