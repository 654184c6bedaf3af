"""GEMM: bf16/FP8 batched GEMM, groupwise FP8 GEMM (optionally with FP8 output) and
DeepGEMM-style grouped FP8 GEMM for MoE (contiguous and masked layouts).

Public API at MATE's import path. Validation goes through :mod:`mate._core.checks`;
cuBLAS paths live in :mod:`mate.ops.gemm.cublas`, Triton kernels in
:mod:`mate.ops.gemm.groupwise` and :mod:`mate.ops.gemm.bmm` (imported lazily),
references in :mod:`mate.ops.gemm.reference`, and the ``backend="auto"`` table in
:mod:`mate.ops.gemm.tuning`. Every public op calls one flat private custom op
``mate::<name>`` that writes into the buffers allocated here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mate._core.checks import (
    check_choice,
    check_inputs_enabled,
    check_no_overlap,
    check_out_tensor,
    check_positive_int,
    check_same_device,
    check_tensor,
    check_value,
)
from mate._core.custom_op import mate_custom_op
from mate._core.dispatch import requested_backend, select_backend
from mate._core.recipe import RecipeCache, RecipeCall, call_key, recipes_usable, recorded
from mate.api_logging import mate_api
from mate.ops.gemm import cublas, reference, tuning

__all__ = [
    "bmm_bf16",
    "bmm_fp8",
    "gemm_fp8_nt_groupwise",
    "group_deepgemm_fp8_nt_groupwise",
    "batch_deepgemm_fp8_nt_groupwise",
    "get_m_alignment_for_contiguous_layout",
]

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GEMM_BACKENDS = ("auto", "cublas", "triton")
_BLOCK = 128
_M_ALIGNMENT = 128


@mate_api
def get_m_alignment_for_contiguous_layout() -> int:
    """Row alignment of each group in the contiguous MoE layout (128).

    Returns
    -------
    int
        Every group's rows in :func:`group_deepgemm_fp8_nt_groupwise` must start at a
        multiple of this value (pad each group with ``m_indices = -1`` rows).

    Raises
    ------
    None
        It returns a constant.

    Examples
    --------
    >>> from mate.gemm import get_m_alignment_for_contiguous_layout
    >>> align = get_m_alignment_for_contiguous_layout()
    >>> align
    128
    >>> [-(-rows // align) * align for rows in (1, 128, 300)]  # padded group sizes
    [128, 128, 384]
    """
    return _M_ALIGNMENT


# ---------------------------------------------------------------------------- helpers


def _resolve_backend(backend: str, device: torch.device, cublas_reason: str | None,
                     auto_pick: Callable[[], str]) -> str:
    """``"cublas"``, ``"triton"`` or ``"reference"`` for this call."""
    check_choice("backend", backend, GEMM_BACKENDS)
    if backend == "cublas":
        if device.type != "cuda":
            raise ValueError(f"backend 'cublas' needs CUDA tensors, got tensors on {device}")
        if cublas_reason is not None:
            raise ValueError(f"backend 'cublas' cannot run this call: {cublas_reason}")
        return "cublas"
    if backend == "triton":
        return select_backend(device, "triton")
    base = select_backend(device)
    if base == "reference" or device.type != "cuda" or requested_backend() == "triton":
        return base  # MATE_BACKEND=triton: the Triton kernels, not cuBLAS
    return "cublas" if cublas_reason is None and auto_pick() == "cublas" else "triton"


def _check_fp8_pair(names: tuple[str, str], x: torch.Tensor, y: torch.Tensor) -> None:
    check_tensor(names[0], x, dtype=FP8_DTYPES)
    check_tensor(names[1], y, dtype=FP8_DTYPES)
    if x.dtype == torch.float8_e5m2 and y.dtype == torch.float8_e5m2:
        raise ValueError(
            f"{names[0]} and {names[1]} must not both be torch.float8_e5m2 (at most one e5m2 operand), "
            "got both torch.float8_e5m2"
        )


def _check_granularity(scale_granularity_mnk: Sequence[int]) -> None:
    given = tuple(scale_granularity_mnk) if isinstance(scale_granularity_mnk, (tuple, list)) else scale_granularity_mnk
    check_value("scale_granularity_mnk", given == (1, 128, 128), "(1, 128, 128)", given)


def _check_k(k: int) -> None:
    check_value("k (the last dimension of a and b)", k > 0 and k % _BLOCK == 0, "a positive multiple of 128", k)


def _out_dtype(out_dtype: torch.dtype | None, allowed: tuple[torch.dtype, ...], default: torch.dtype | None,
               out: torch.Tensor | None, name: str = "out_dtype") -> torch.dtype:
    """The output dtype: the option ``name`` (``ValueError`` outside ``allowed``), else ``out``'s
    (``TypeError``), else ``default``."""
    if out_dtype is None and out is not None:
        check_tensor("out", out, dtype=allowed)
        return out.dtype
    dtype = default if out_dtype is None else out_dtype
    if dtype not in allowed:
        raise ValueError(f"{name} must be one of {tuple(str(d) for d in allowed)}, got {dtype}")
    return dtype


def _alloc_out(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
               name: str = "out", **inputs: torch.Tensor | None) -> torch.Tensor:
    """``out`` checked (shape, dtype, device, layout, no memory shared with ``inputs``), or a new one."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_out_tensor(name, out, shape=shape, dtype=dtype, device=device, contiguous=False,
                     last_dim_contiguous=True)
    check_no_overlap(name, out, **inputs)
    return out


# ---------------------------------------------------------------------------- bmm_bf16


@mate_custom_op("gemm_bmm_bf16", mutates_args=("out",))
def _bmm_bf16_op(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    if backend == "reference":
        out.copy_(reference.bmm_ref(A, B, out.dtype))
    elif backend == "cublas":
        cublas.bmm_cublas(A, B, out)
    else:
        from mate.ops.gemm.bmm import bmm_triton

        bmm_triton(A, B, out, config=tuning.bmm_config(A.shape[1], B.shape[2], A.shape[2], fp8=False))


@mate_api
def bmm_bf16(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
) -> torch.Tensor:
    """Batched GEMM of bf16 (or fp16) matrices with fp32 accumulation.

    Parameters
    ----------
    A : torch.Tensor
        [b, m, k], bf16 or fp16, any strides.
    B : torch.Tensor
        [b, k, n], the dtype of ``A``, any strides (a transposed view of a contiguous
        [b, n, k] tensor is read in place, never copied).
    out : torch.Tensor, optional
        [b, m, n] of ``out_dtype`` with a contiguous last dimension; written and returned.
    out_dtype : torch.dtype
        bf16 (default), fp16 or fp32.
    backend : str
        ``"auto"`` (cuBLAS on CUDA, the reference on CPU), ``"cublas"`` (CUDA only) or
        ``"triton"`` (on CPU only under Triton's interpreter).

    Returns
    -------
    torch.Tensor
        [b, m, n] ``out_dtype``: ``A @ B``.

    Raises
    ------
    TypeError
        Wrong dtypes.
    ValueError
        Non-3-D inputs, mismatched b or k, a wrong ``out``, devices that differ, an
        unknown backend or ``"cublas"`` on CPU tensors.

    Examples
    --------
    >>> import torch
    >>> from mate.gemm import bmm_bf16
    >>> A = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    >>> B = torch.randn(2, 5, 64, dtype=torch.bfloat16).transpose(1, 2)  # [2, 64, 5] view
    >>> out = bmm_bf16(A, B)
    >>> out.shape, out.dtype
    (torch.Size([2, 3, 5]), torch.bfloat16)
    >>> torch.allclose(out.float(), A.float() @ B.float(), rtol=1e-2, atol=1e-2)  # bf16 output
    True
    """
    check_tensor("A", A, dtype=(torch.bfloat16, torch.float16), ndim=3)
    check_tensor("B", B, dtype=A.dtype, ndim=3)
    b, m, k = A.shape
    check_tensor("B", B, shape=(b, k, None))
    n = B.shape[2]
    device = check_same_device(A=A, B=B, out=out)
    dtype = _out_dtype(out_dtype, (torch.bfloat16, torch.float16, torch.float32), torch.bfloat16, None)
    out = _alloc_out(out, (b, m, n), dtype, device, A=A, B=B)
    impl = _resolve_backend(backend, device, None, lambda: "cublas")
    if out.numel() == 0:
        return out
    _bmm_bf16_op(A, B, out, impl)
    return out


# ---------------------------------------------------------------------------- bmm_fp8


@mate_custom_op("gemm_bmm_fp8", mutates_args=("out",))
def _bmm_fp8_op(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
                out: torch.Tensor, backend: str) -> None:
    if backend == "reference":
        out.copy_(reference.bmm_fp8_ref(A, B, A_scale, B_scale, out.dtype))
    elif backend == "cublas":
        cublas.bmm_fp8_cublas(A, B, A_scale, B_scale, out)
    else:
        from mate.ops.gemm.bmm import SCALE_CHANNEL, SCALE_TENSOR, bmm_triton

        mode = SCALE_TENSOR if A_scale.numel() == 1 and B_scale.numel() == 1 else SCALE_CHANNEL
        bmm_triton(A, B, out, A_scale, B_scale, scale_mode=mode,
                   config=tuning.bmm_config(A.shape[1], B.shape[2], A.shape[2], fp8=True))


@mate_api
def bmm_fp8(
    A: torch.Tensor,
    B: torch.Tensor,
    A_scale: torch.Tensor,
    B_scale: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Batched FP8 GEMM with per-tensor or channelwise scales, fp32 accumulation.

    Parameters
    ----------
    A : torch.Tensor
        [b, m, k], float8_e4m3fn or float8_e5m2 (not both operands e5m2), any strides.
    B : torch.Tensor
        [b, k, n], float8_e4m3fn or float8_e5m2, any strides (cuBLAS takes the transpose
        of a contiguous [b, n, k] in place; other layouts run the Triton kernel).
    A_scale, B_scale : torch.Tensor
        fp32 multipliers. Per-tensor: one element each. Channelwise (MATE extension):
        ``A_scale`` [b, m, 1] and ``B_scale`` [b, 1, n], contiguous.
    dtype : torch.dtype
        Output dtype, bf16 or fp16.
    out : torch.Tensor, optional
        [b, m, n] of ``dtype`` with a contiguous last dimension; written and returned.
    backend : str
        ``"auto"`` (cuBLAS for b == 1, Triton for batches, as measured on the H200),
        ``"cublas"`` (per-tensor, CUDA only; a loop over the batch) or ``"triton"``.

    Returns
    -------
    torch.Tensor
        [b, m, n]: ``dtype((A @ B) * A_scale * B_scale)``.

    Raises
    ------
    TypeError
        Wrong dtypes.
    ValueError
        Both operands e5m2, bad shapes, scale shapes that are neither per-tensor nor
        channelwise, a wrong ``out``, ``"cublas"`` on CPU tensors or with layouts cuBLAS
        does not take.

    Examples
    --------
    >>> import torch
    >>> from mate.gemm import bmm_fp8
    >>> A = torch.randn(1, 4, 32).to(torch.float8_e4m3fn)
    >>> B = torch.randn(1, 32, 8).to(torch.float8_e4m3fn)
    >>> A_scale, B_scale = torch.tensor(0.5), torch.tensor(3.0)  # per-tensor
    >>> out = bmm_fp8(A, B, A_scale, B_scale, torch.bfloat16)
    >>> ref = (A.float() @ B.float()) * 0.5 * 3.0
    >>> out.shape, torch.allclose(out.float(), ref, rtol=1e-2, atol=1e-2)  # bf16 output
    (torch.Size([1, 4, 8]), True)
    """
    check_tensor("A", A, ndim=3)
    check_tensor("B", B, ndim=3)
    _check_fp8_pair(("A", "B"), A, B)
    b, m, k = A.shape
    check_tensor("B", B, shape=(b, k, None))
    n = B.shape[2]
    check_tensor("A_scale", A_scale, dtype=torch.float32)
    check_tensor("B_scale", B_scale, dtype=torch.float32)
    per_tensor = A_scale.numel() == 1 and B_scale.numel() == 1
    if not per_tensor:
        check_tensor("A_scale", A_scale, shape=(b, m, 1), contiguous=True)
        check_tensor("B_scale", B_scale, shape=(b, 1, n), contiguous=True)
    device = check_same_device(A=A, B=B, A_scale=A_scale, B_scale=B_scale, out=out)
    dtype = _out_dtype(dtype, (torch.bfloat16, torch.float16), None, None, "dtype")
    out = _alloc_out(out, (b, m, n), dtype, device, A=A, B=B, A_scale=A_scale, B_scale=B_scale)
    reason = cublas.bmm_fp8_cublas_reason(A, B, out, per_tensor)
    impl = _resolve_backend(backend, device, reason, lambda: tuning.bmm_fp8_backend(b, m, n, k))
    if out.numel() == 0:
        return out
    _bmm_fp8_op(A, B, A_scale, B_scale, out, impl)
    return out


# ---------------------------------------------------------------------------- gemm_fp8_nt_groupwise


def _scale_mode(scale_major_mode: str | None, a_scale: torch.Tensor, b_scale: torch.Tensor,
                m: int, kb: int, nb: int) -> str:
    # None: the mode whose shapes a_scale and b_scale both have; ValueError when both modes fit
    # (m == k / 128 and nb == k / 128) or neither does
    fits_k = tuple(a_scale.shape) == (m, kb) and tuple(b_scale.shape) == (nb, kb)
    fits_mn = tuple(a_scale.shape) == (kb, m) and tuple(b_scale.shape) == (kb, nb)
    if scale_major_mode is None:
        if fits_k and fits_mn:
            raise ValueError(
                f"scale_major_mode must be given ('K' or 'MN'): a_scale {list(a_scale.shape)} and b_scale "
                f"{list(b_scale.shape)} fit both readings, got None"
            )
        if not (fits_k or fits_mn):
            raise ValueError(
                f"a_scale and b_scale must have shapes [{m}, {kb}] and [{nb}, {kb}] (scale_major_mode 'K') or "
                f"[{kb}, {m}] and [{kb}, {nb}] ('MN'), got {list(a_scale.shape)} and {list(b_scale.shape)}"
            )
        return "K" if fits_k else "MN"
    check_choice("scale_major_mode", scale_major_mode, ("K", "MN"))
    if scale_major_mode == "K":
        check_tensor("a_scale", a_scale, shape=(m, kb))
        check_tensor("b_scale", b_scale, shape=(nb, kb))
    else:
        check_tensor("a_scale", a_scale, shape=(kb, m))
        check_tensor("b_scale", b_scale, shape=(kb, nb))
    return scale_major_mode


def _scale_views(a_scale: torch.Tensor, b_scale: torch.Tensor, k_major: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales as [m, kb] and [nb, kb] views, in either major mode."""
    return (a_scale, b_scale) if k_major else (a_scale.t(), b_scale.t())


def _cublas_reads_scales_in_place(a_scale: torch.Tensor, b_scale: torch.Tensor, mode: str) -> bool:
    a_mk, b_nk = _scale_views(a_scale, b_scale, mode == "K")
    return cublas.groupwise_scales_in_place(a_mk, b_nk.t())


def _groupwise_impl(a, b, a_scale, b_scale, k_major, out, output_scale, backend):
    """Shared body of the groupwise op; scales read in place in either major mode."""
    m, k = a.shape
    n = b.shape[0]
    a_mk, b_nk = _scale_views(a_scale, b_scale, k_major)
    if backend == "reference":
        res, scale = reference.gemm_fp8_groupwise_ref(a, b, a_mk, b_nk, out.dtype)
        out.copy_(res)
        if output_scale is not None:
            output_scale.copy_(scale)
    elif backend.endswith("+quant"):  # FP8 output in two steps: bf16 result, then quantized
        res = torch.empty(out.shape, dtype=torch.bfloat16, device=out.device)
        _groupwise_impl(a, b, a_scale, b_scale, k_major, res, None, backend.removesuffix("+quant"))
        from mate.ops.gemm.quantize import quantize_fp8_row_groups

        quantize_fp8_row_groups(res, out, output_scale)
    elif backend == "cublas":
        cublas.groupwise_cublas(a, b, a_mk, b_nk.t(), out)
    else:
        from mate.ops.gemm.groupwise import PLAIN, groupwise_gemm_triton

        cfg = tuning.groupwise_config(m, n, k, fp8_out=output_scale is not None)
        groupwise_gemm_triton(a, b, a_scale, (0, a_mk.stride(0), a_mk.stride(1)),
                              b_scale, (0, b_nk.stride(0), b_nk.stride(1)), out, output_scale,
                              layout=PLAIN, config=cfg)


_GROUPWISE_RECIPES = RecipeCache()
_GROUPED_RECIPES = RecipeCache()
_MASKED_RECIPES = RecipeCache()
"""Launch recipes of eager ``gemm_fp8_nt_groupwise``, ``group_deepgemm_fp8_nt_groupwise`` and
``batch_deepgemm_fp8_nt_groupwise`` calls that run Triton / Gluon kernels only (the layers of a
model repeat each signature)."""


def _gemm_recipe(cache: RecipeCache, tensors: list, others: tuple, out_shape: tuple[int, ...] | None,
                 out_dtype: Any, default_dtype: torch.dtype, outputs: tuple[int, ...]) -> RecipeCall | None:
    """The launch recipe of a GEMM call (``tensors`` in key order, the operands first, the output
    at ``outputs[0]``; an omitted output allocated here as ``out_shape`` of ``out_dtype`` or
    ``default_dtype``, as the call would), or None (not an eager CUDA call, an argument without a
    recipe signature, or an omitted output the call would not allocate so). Besides the
    arguments the key holds the current stream (split-K counters and workspaces are per stream),
    ``MATE_GEMM_SPLITK_REDUCE`` and :func:`mate.ops.gemm.tuning.recipe_settings`. Under CUDA-graph
    capture a call takes the ordinary path, whose split-K workspace comes from the graph's pool
    (a replay would bake the stream's eager workspace into the graph)."""
    a = tensors[0]
    if (not isinstance(a, torch.Tensor) or not recipes_usable(a)
            or (a.is_cuda and torch.cuda.is_current_stream_capturing())):
        return None
    key = call_key(tensors, others, torch._C._cuda_getCurrentRawStream(a.get_device()),
                   os.environ.get("MATE_GEMM_SPLITK_REDUCE"), tuning.recipe_settings())
    if key is None:
        return None
    if tensors[outputs[0]] is None:
        if out_shape is None or not (out_dtype is None or isinstance(out_dtype, torch.dtype)):
            return None  # the ordinary path raises its error
        tensors = list(tensors)
        tensors[outputs[0]] = torch.empty(out_shape, dtype=out_dtype or default_dtype, device=a.device)
    return RecipeCall(cache, key, tensors, outputs=outputs)


def _dims(t: Any, ndim: int) -> tuple[int, ...] | None:
    """``t``'s shape when it is a tensor of ``ndim`` dimensions (an output shape to derive), else None."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) and t.dim() == ndim else None


@mate_custom_op("gemm_fp8_nt_groupwise", mutates_args=("out", "output_scale"))
def _gemm_fp8_nt_groupwise_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                              k_major: bool, out: torch.Tensor, output_scale: torch.Tensor | None,
                              backend: str) -> None:
    _groupwise_impl(a, b, a_scale, b_scale, k_major, out, output_scale, backend)


@mate_api
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
    """Block-scaled FP8 GEMM ``a · bᵀ`` (1x128 activation, 128x128 weight scales).

    Parameters
    ----------
    a : torch.Tensor
        [m, k] float8_e4m3fn (or e5m2, not both operands), k contiguous; k % 128 == 0.
    b : torch.Tensor
        [n, k] float8_e4m3fn (or e5m2), k contiguous.
    a_scale, b_scale : torch.Tensor
        fp32, any strides, with kb = k / 128 and nb = ceil(n / 128):
        ``scale_major_mode="K"``: [m, kb] and [nb, kb]; ``"MN"``: [kb, m] and [kb, nb].
        The Triton kernels read any layout in place. The cuBLAS path reads an M-major
        activation scale and a K-major weight scale in place (e.g. ``"MN"`` with a
        contiguous [kb, m] ``a_scale`` and ``b_scale`` the transposed view of a contiguous
        [nb, kb]); it copies a scale given in the other layout on every call.
    scale_major_mode : {"K", "MN"}, optional
        Inferred from the scale shapes when None; a ``ValueError`` asks for it when both
        readings fit.
    mma_sm : int
        Accepted for compatibility and ignored.
    scale_granularity_mnk : tuple of int
        Only (1, 128, 128).
    out : torch.Tensor, optional
        [m, n] with a contiguous last dimension: bf16/fp16, or e4m3 with ``output_scale``.
    out_dtype : torch.dtype, optional
        bf16 (default) or fp16; fp32 is rejected. With ``output_scale``: None or e4m3.
    backend : str
        ``"auto"`` (measured table: cuBLAS blockwise at large M, Triton at small M),
        ``"cublas"`` (bf16 output, CUDA only) or ``"triton"``.
    output_scale : torch.Tensor, optional
        fp32 [m, nb], contiguous, filled in place (MATE extension): the result is quantized
        per row and 128-column group, ``output_scale[i, g] = amax / 448`` (1 for a zero
        group) and ``out = e4m3(result / output_scale)``. ``backend="triton"`` quantizes the
        fp32 accumulator in the kernel's epilogue; ``"auto"`` does so too except where the
        bf16 path is measured faster (cuBLAS, and the K-interleaved Gluon kernel:
        ``tuning.fp8_out_two_step``), which it runs and then quantizes the bf16 result in a
        second launch (scales within 2^-8 relative, the bf16 unit roundoff, of the fp32 result's).

    Returns
    -------
    torch.Tensor
        ``out`` [m, n]: ``sum_kb a_scale[i, kb] * b_scale[j // 128, kb] * (a_blk · b_blkᵀ)``.

    Raises
    ------
    TypeError
        Wrong dtypes.
    ValueError
        Both operands e5m2, out_dtype fp32 or outside the allowed set, granularity other
        than (1, 128, 128), k % 128 != 0, bad or ambiguous scale shapes, a wrong
        ``out``/``output_scale``, ``"cublas"`` on CPU tensors or for a case cuBLAS does
        not cover.

    Examples
    --------
    m=4, n=192, k=256: ``kb = 2`` K-blocks and ``nb = 2`` N-blocks (the last one partial).
    The check dequantizes both operands block by block:

    >>> import torch
    >>> from mate.gemm import gemm_fp8_nt_groupwise
    >>> a = torch.randn(4, 256).to(torch.float8_e4m3fn)
    >>> b = torch.randn(192, 256).to(torch.float8_e4m3fn)
    >>> a_scale = torch.rand(4, 2) + 0.5  # [m, kb]: one scale per row and 128 columns
    >>> b_scale = torch.rand(2, 2) + 0.5  # [nb, kb]: one scale per 128x128 tile
    >>> out = gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K")
    >>> a_deq = a.float() * a_scale.repeat_interleave(128, dim=1)
    >>> b_deq = b.float() * b_scale.repeat_interleave(128, dim=0)[:192].repeat_interleave(128, dim=1)
    >>> out.shape, torch.allclose(out.float(), a_deq @ b_deq.T, rtol=1e-2, atol=1e-2)  # bf16
    (torch.Size([4, 192]), True)
    >>> same = gemm_fp8_nt_groupwise(a, b, a_scale.T.contiguous(), b_scale.T.contiguous(),
    ...                              scale_major_mode="MN")  # [kb, m] and [kb, nb]
    >>> torch.equal(out, same)
    True

    FP8 output with one scale per row and 128-column group:

    >>> out_scale = torch.empty(4, 2)
    >>> out8 = gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, scale_major_mode="K",
    ...                              output_scale=out_scale)
    >>> deq = out8.float() * out_scale.repeat_interleave(128, dim=1)[:, :192]
    >>> out8.dtype, torch.allclose(deq, a_deq @ b_deq.T, rtol=0.07, atol=0.05)  # e4m3: 3 mantissa bits
    (torch.float8_e4m3fn, True)
    """
    sa, sb = _dims(a, 2), _dims(b, 2)
    recipe = _gemm_recipe(_GROUPWISE_RECIPES, [a, b, a_scale, b_scale, out, output_scale],
                          (scale_major_mode, mma_sm, scale_granularity_mnk, out_dtype, backend),
                          (sa[0], sb[0]) if sa and sb else None, out_dtype,
                          torch.float8_e4m3fn if output_scale is not None else torch.bfloat16, outputs=(4, 5))
    if recipe is not None:
        out = recipe.tensors[4]
        if recipe.replay():
            return out
    check_tensor("a", a, ndim=2, last_dim_contiguous=True)
    check_tensor("b", b, ndim=2, last_dim_contiguous=True)
    _check_fp8_pair(("a", "b"), a, b)
    m, k = a.shape
    check_tensor("b", b, shape=(None, k))
    n = b.shape[0]
    _check_granularity(scale_granularity_mnk)
    _check_k(k)
    kb, nb = k // _BLOCK, -(-n // _BLOCK)
    check_tensor("a_scale", a_scale, dtype=torch.float32, ndim=2)
    check_tensor("b_scale", b_scale, dtype=torch.float32, ndim=2)
    mode = _scale_mode(scale_major_mode, a_scale, b_scale, m, kb, nb)
    device = check_same_device(a=a, b=b, a_scale=a_scale, b_scale=b_scale, out=out, output_scale=output_scale)
    if output_scale is not None:
        dtype = _out_dtype(out_dtype, (torch.float8_e4m3fn,), torch.float8_e4m3fn, out)
        check_out_tensor("output_scale", output_scale, shape=(m, nb), dtype=torch.float32, device=device)
    else:
        dtype = _out_dtype(out_dtype, (torch.bfloat16, torch.float16), torch.bfloat16, out)
    out = _alloc_out(out, (m, n), dtype, device, a=a, b=b, a_scale=a_scale, b_scale=b_scale)
    check_no_overlap("output_scale", output_scale, a=a, b=b, a_scale=a_scale, b_scale=b_scale, out=out)
    reason = cublas.groupwise_cublas_reason(a, b, out)
    pick = lambda: tuning.groupwise_backend(m, n, k, _cublas_reads_scales_in_place(a_scale, b_scale, mode))  # noqa: E731
    impl = _resolve_backend(backend, device, reason, pick)
    if output_scale is not None and backend == "auto" and impl == "triton":
        # the bf16 path and a quantization launch, where measured faster than the fused epilogue
        bf16 = _resolve_backend(backend, device, cublas.groupwise_cublas_operands_reason(a, b), pick)
        if tuning.fp8_out_two_step(m, n, k, bf16):
            impl = bf16 + "+quant"
    if out.numel() == 0:
        return out
    # cuBLAS, the two-step FP8 output and the reference do more than Triton launches: not recorded
    with recorded(recipe if impl == "triton" else None):
        _gemm_fp8_nt_groupwise_op(a, b, a_scale, b_scale, mode == "K", out, output_scale, impl)
    return out


# ---------------------------------------------------------------------------- grouped (MoE) layouts


def _check_grouped_operands(a, b, a_scale, b_scale, scale_granularity_mnk, a_rows_shape):
    check_tensor("b", b, ndim=3, contiguous=True)
    _check_fp8_pair(("a", "b"), a, b)
    _check_granularity(scale_granularity_mnk)
    G, n, k = b.shape
    check_tensor("a", a, shape=(*a_rows_shape, k), contiguous=True)
    _check_k(k)
    kb, nb = k // _BLOCK, -(-n // _BLOCK)
    check_tensor("a_scale", a_scale, dtype=torch.float32, shape=(*a_rows_shape, kb), contiguous=True)
    check_tensor("b_scale", b_scale, dtype=torch.float32, shape=(G, nb, kb), contiguous=True)
    return G, n, k


def _check_contiguous_layout(m_indices: torch.Tensor, G: int) -> None:
    """Host-side check of the contiguous-layout precondition (``MATE_CHECK_INPUTS=1``)."""
    idx = m_indices.long().cpu()
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    check_value("m_indices", lo >= -1 and hi < G, f"values in [-1, {G})", f"values in [{lo}, {hi}]")
    for g in idx[idx >= 0].unique().tolist():
        rows = (idx == g).nonzero().flatten()
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 != rows.numel() or first % _M_ALIGNMENT:
            raise ValueError(
                f"m_indices must give each group one contiguous row range starting at a multiple of "
                f"{_M_ALIGNMENT}, got group {g} on {rows.numel()} rows spanning [{first}, {last}]"
            )


@mate_custom_op("gemm_group_deepgemm_fp8_nt_groupwise", mutates_args=("out",))
def _group_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
              m_indices: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    if backend == "reference":
        res = reference.grouped_contiguous_ref(a, b, a_scale, b_scale, m_indices, torch.float32)
        valid = ((m_indices >= 0) & (m_indices < b.shape[0]))[:, None]
        out.copy_(torch.where(valid, res, out.float()).to(out.dtype))
        return
    from mate.ops.gemm.groupwise import CONTIGUOUS, groupwise_gemm_triton

    m, k = a.shape
    cfg = tuning.grouped_config(m, b.shape[1], k)
    groupwise_gemm_triton(a, b, a_scale, (0, a_scale.stride(0), 1), b_scale,
                          (b_scale.stride(0), b_scale.stride(1), 1), out, None,
                          layout=CONTIGUOUS, config=cfg, m_indices=m_indices)


@mate_api
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
    """Grouped FP8 GEMM, MoE contiguous layout (DeepGEMM's ``m_grouped_fp8_gemm_nt_contiguous``).

    Parameters
    ----------
    a : torch.Tensor
        [m, k] float8_e4m3fn, contiguous; the rows of each group form one contiguous range
        starting at a multiple of :func:`get_m_alignment_for_contiguous_layout` (128).
    b : torch.Tensor
        [G, n, k] float8_e4m3fn, contiguous.
    a_scale : torch.Tensor
        [m, k / 128] fp32, contiguous.
    b_scale : torch.Tensor
        [G, ceil(n / 128), k / 128] fp32, contiguous.
    m_indices : torch.Tensor
        [m] int32 on the device: the group of each row, -1 for padding rows (skipped).
        The layout precondition is checked on the host when ``MATE_CHECK_INPUTS=1``.
    scale_granularity_mnk : tuple of int
        Only (1, 128, 128).
    out : torch.Tensor, optional
        [m, n] bf16 (or fp16) with a contiguous last dimension.
    out_dtype : torch.dtype, optional
        bf16 (default) or fp16.

    Returns
    -------
    torch.Tensor
        ``out`` [m, n]: row i = groupwise product of a[i] with b[m_indices[i]]; padding rows
        are left unspecified (not written).

    Raises
    ------
    TypeError
        Wrong dtypes.
    ValueError
        Shapes, k % 128, granularity, out_dtype, devices, and (with
        ``MATE_CHECK_INPUTS=1``) a violated layout precondition.

    Examples
    --------
    Two experts: 128 rows of group 0, then 100 rows of group 1 padded to 128 rows:

    >>> import torch
    >>> from mate.gemm import group_deepgemm_fp8_nt_groupwise
    >>> a = torch.randn(256, 128).to(torch.float8_e4m3fn)
    >>> b = torch.randn(2, 64, 128).to(torch.float8_e4m3fn)  # [G, n, k]
    >>> a_scale, b_scale = torch.ones(256, 1), torch.full((2, 1, 1), 0.5)
    >>> m_indices = torch.tensor([0] * 128 + [1] * 100 + [-1] * 28, dtype=torch.int32)
    >>> out = group_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indices)
    >>> ref = 0.5 * a[128:228].float() @ b[1].float().T
    >>> out.shape, torch.allclose(out[128:228].float(), ref, rtol=1e-2, atol=1e-2)  # bf16
    (torch.Size([256, 64]), True)
    """
    sa, sb = _dims(a, 2), _dims(b, 3)
    recipe = _gemm_recipe(_GROUPED_RECIPES, [a, b, a_scale, b_scale, m_indices, out],
                          (scale_granularity_mnk, out_dtype), (sa[0], sb[1]) if sa and sb else None, out_dtype,
                          torch.bfloat16, outputs=(5,))
    if recipe is not None:
        out = recipe.tensors[5]
        if recipe.replay():
            return out
    check_tensor("a", a, ndim=2)
    m = a.shape[0]
    G, n, k = _check_grouped_operands(a, b, a_scale, b_scale, scale_granularity_mnk, (m,))
    check_tensor("m_indices", m_indices, dtype=torch.int32, shape=(m,), contiguous=True)
    device = check_same_device(a=a, b=b, a_scale=a_scale, b_scale=b_scale, m_indices=m_indices, out=out)
    dtype = _out_dtype(out_dtype, (torch.bfloat16, torch.float16), torch.bfloat16, out)
    out = _alloc_out(out, (m, n), dtype, device, a=a, b=b, a_scale=a_scale, b_scale=b_scale, m_indices=m_indices)
    if check_inputs_enabled():
        _check_contiguous_layout(m_indices, G)
    impl = select_backend(device)
    if out.numel() == 0 or G == 0:  # no expert: every row is padding (not written)
        return out
    with recorded(recipe if impl == "triton" else None):
        _group_op(a, b, a_scale, b_scale, m_indices, out, impl)
    return out


@mate_custom_op("gemm_batch_deepgemm_fp8_nt_groupwise", mutates_args=("out",))
def _batch_op(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
              masked_m: torch.Tensor, expected_m: int, out: torch.Tensor, backend: str) -> None:
    if backend == "reference":
        res = reference.masked_ref(a, b, a_scale, b_scale, masked_m, torch.float32)
        rows = torch.arange(a.shape[1], device=a.device)[None, :, None]
        valid = rows < masked_m.long().clamp(0, a.shape[1])[:, None, None]
        out.copy_(torch.where(valid, res, out.float()).to(out.dtype))
        return
    from mate.ops.gemm.groupwise import MASKED, groupwise_gemm_triton

    cfg = tuning.masked_config(expected_m, b.shape[1], a.shape[2])
    groupwise_gemm_triton(a, b, a_scale, (a_scale.stride(0), a_scale.stride(1), 1), b_scale,
                          (b_scale.stride(0), b_scale.stride(1), 1), out, None,
                          layout=MASKED, config=cfg, masked_m=masked_m)


@mate_api
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
    """Grouped FP8 GEMM, MoE masked layout (DeepGEMM's ``m_grouped_fp8_gemm_nt_masked``).

    ``masked_m`` is read by the kernel on the device: no host sync, so the call can be
    captured in a CUDA graph and replayed with new ``masked_m`` values.

    Parameters
    ----------
    a : torch.Tensor
        [G, max_m, k] float8_e4m3fn, contiguous.
    b : torch.Tensor
        [G, n, k] float8_e4m3fn, contiguous.
    a_scale : torch.Tensor
        [G, max_m, k / 128] fp32, contiguous.
    b_scale : torch.Tensor
        [G, ceil(n / 128), k / 128] fp32, contiguous.
    masked_m : torch.Tensor
        [G] int32 on the device: valid rows of each group (values are clamped to
        [0, max_m]; checked on the host when ``MATE_CHECK_INPUTS=1``).
    expected_m : int
        Positive hint of the typical masked_m, used to pick tiles.
    scale_granularity_mnk : tuple of int
        Only (1, 128, 128).
    out : torch.Tensor, optional
        [G, max_m, n] bf16 (or fp16) with a contiguous last dimension.
    out_dtype : torch.dtype, optional
        bf16 (default) or fp16.

    Returns
    -------
    torch.Tensor
        ``out`` [G, max_m, n]; rows at or past masked_m[g] are unspecified (not written).

    Raises
    ------
    TypeError
        Wrong dtypes or a non-int ``expected_m``.
    ValueError
        Shapes, k % 128, granularity, out_dtype, devices, ``expected_m <= 0``.

    Examples
    --------
    >>> import torch
    >>> from mate.gemm import batch_deepgemm_fp8_nt_groupwise
    >>> a = torch.randn(2, 8, 128).to(torch.float8_e4m3fn)  # [G, max_m, k]
    >>> b = torch.randn(2, 64, 128).to(torch.float8_e4m3fn)  # [G, n, k]
    >>> a_scale, b_scale = torch.ones(2, 8, 1), torch.ones(2, 1, 1)
    >>> masked_m = torch.tensor([3, 8], dtype=torch.int32)  # valid rows per group
    >>> out = batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, expected_m=8)
    >>> ref = a[0, :3].float() @ b[0].float().T
    >>> out.shape, torch.allclose(out[0, :3].float(), ref, rtol=1e-2, atol=1e-2)  # bf16
    (torch.Size([2, 8, 64]), True)
    """
    sa, sb = _dims(a, 3), _dims(b, 3)
    recipe = _gemm_recipe(_MASKED_RECIPES, [a, b, a_scale, b_scale, masked_m, out],
                          (expected_m, scale_granularity_mnk, out_dtype), (sa[0], sa[1], sb[1]) if sa and sb else None,
                          out_dtype, torch.bfloat16, outputs=(5,))
    if recipe is not None:
        out = recipe.tensors[5]
        if recipe.replay():
            return out
    check_tensor("a", a, ndim=3)
    G, max_m = a.shape[0], a.shape[1]
    check_tensor("b", b, ndim=3, shape=(G, None, None))
    Gb, n, k = _check_grouped_operands(a, b, a_scale, b_scale, scale_granularity_mnk, (G, max_m))
    check_tensor("masked_m", masked_m, dtype=torch.int32, shape=(G,), contiguous=True)
    check_positive_int("expected_m", expected_m)
    device = check_same_device(a=a, b=b, a_scale=a_scale, b_scale=b_scale, masked_m=masked_m, out=out)
    dtype = _out_dtype(out_dtype, (torch.bfloat16, torch.float16), torch.bfloat16, out)
    out = _alloc_out(out, (G, max_m, n), dtype, device, a=a, b=b, a_scale=a_scale, b_scale=b_scale,
                     masked_m=masked_m)
    if check_inputs_enabled():
        mm = masked_m.cpu()
        check_value("masked_m", bool(((mm >= 0) & (mm <= max_m)).all()), f"values in [0, {max_m}]", mm.tolist())
    impl = select_backend(device)
    if out.numel() == 0:
        return out
    with recorded(recipe if impl == "triton" else None):
        _batch_op(a, b, a_scale, b_scale, masked_m, expected_m, out, impl)
    return out
