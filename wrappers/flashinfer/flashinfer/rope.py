"""FlashInfer's ``flashinfer.rope.mla_rope_quantize_fp8`` on top of mate."""

from __future__ import annotations

import torch

import mate.sparse_mla_interface as _mate_mla
from mate.api_logging import mate_api as _mate_api

__all__ = ["mla_rope_quantize_fp8"]


@_mate_api
def mla_rope_quantize_fp8(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor,
    k_nope: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: torch.Tensor | None = None,
    k_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    k_nope_out: torch.Tensor | None = None,
    enable_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rotary embedding of the 64-value rope parts, then FP8 quantization of all four parts.

    Forwards to :func:`mate.sparse_mla_interface.mla_rope_quantize_fp8`, which validates
    the arguments and allocates omitted outputs.

    Parameters
    ----------
    q_rope : torch.Tensor
        bfloat16 ``[nnz, H, 64]``, last dimension contiguous.
    k_rope : torch.Tensor
        bfloat16 ``[nnz, 64]``.
    q_nope : torch.Tensor
        bfloat16 ``[nnz, H, 512]``.
    k_nope : torch.Tensor
        bfloat16 ``[nnz, 512]``.
    cos_sin_cache : torch.Tensor
        float32 or bfloat16 ``[max_seq_len, 64]``: columns ``[:32]`` cos, ``[32:]`` sin.
    pos_ids : torch.Tensor
        int32 or int64 ``[nnz]``, positions in ``[0, max_seq_len)``.
    is_neox : bool
        ``True``: rotate the halves ``[:32]`` / ``[32:]``; ``False``: rotate interleaved pairs.
    quantize_dtype : torch.dtype, optional
        Only ``torch.float8_e4m3fn`` (taken from the output buffers when ``None``).
    quant_scale_q, quant_scale_kv : float
        Multipliers applied before the FP8 cast: ``q_fp8 = fp8(q * quant_scale_q)``,
        ``kv_fp8 = fp8(kv * quant_scale_kv)`` (saturating at +-448).
    q_rope_out, k_rope_out, q_nope_out, k_nope_out : torch.Tensor, optional
        float8_e4m3fn buffers shaped like the matching input; the leading dimensions may be
        strided, so they can be slices ``[..., 512:]`` / ``[..., :512]`` of one merged
        576-value tensor. Supplied buffers are written in place and returned.
    enable_pdl : bool
        Accepted and ignored.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.

    Raises
    ------
    TypeError
        Inputs of the wrong dtype, non-FP8 or mismatched output buffers.
    ValueError
        Wrong shapes, layouts or devices; a quantize dtype other than float8_e4m3fn.
    NotImplementedError
        Tensor-valued quantization scales.

    Examples
    --------
    With every position at angle 0 (cos 1, sin 0) the rotation is the identity, so each
    output is just the scaled input rounded to e4m3:

    >>> import torch
    >>> from flashinfer.rope import mla_rope_quantize_fp8
    >>> q_rope, k_rope = torch.randn(2, 4, 64).bfloat16(), torch.randn(2, 64).bfloat16()
    >>> q_nope, k_nope = torch.randn(2, 4, 512).bfloat16(), torch.randn(2, 512).bfloat16()
    >>> cos_sin = torch.cat([torch.ones(8, 32), torch.zeros(8, 32)], dim=1)
    >>> outs = mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, torch.tensor([3, 7]),
    ...                              quant_scale_kv=0.5)
    >>> [tuple(t.shape) for t in outs]
    [(2, 4, 64), (2, 64), (2, 4, 512), (2, 512)]
    >>> torch.equal(outs[1].float(), (0.5 * k_rope.float()).to(torch.float8_e4m3fn).float())
    True
    """
    return _mate_mla.mla_rope_quantize_fp8(
        q_rope,
        k_rope,
        q_nope,
        k_nope,
        cos_sin_cache,
        pos_ids,
        is_neox=is_neox,
        quantize_dtype=quantize_dtype,
        quant_scale_q=quant_scale_q,
        quant_scale_kv=quant_scale_kv,
        q_rope_out=q_rope_out,
        k_rope_out=k_rope_out,
        q_nope_out=q_nope_out,
        k_nope_out=k_nope_out,
        enable_pdl=enable_pdl,
    )
