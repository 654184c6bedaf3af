"""Sparse MLA (DeepSeek-V3.2): fused RoPE + FP8 quantization and FP8 sparse decode.

Public API at MATE's import path. Validation goes through :mod:`mate._core.checks`,
kernels live in :mod:`mate.ops.sparse_mla`, references in
:mod:`mate.ops.sparse_mla.reference`.
"""

from __future__ import annotations

import torch

from mate._core import checks
from mate._core.custom_op import mate_custom_op
from mate._core.dispatch import select_backend
from mate.api_logging import mate_api
from mate.ops.sparse_mla.reference import mla_rope_quantize_fp8_reference

# ---- mla_rope_quantize_fp8 (section owned by the RoPE + FP8 work) -------------------

_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)
)


@mate_custom_op(
    "mla_rope_quantize_fp8",
    mutates_args=("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"),
)
def _mla_rope_quantize_fp8_op(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor,
    k_nope: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool,
    quant_scale_q: float,
    quant_scale_kv: float,
    q_rope_out: torch.Tensor,
    k_rope_out: torch.Tensor,
    q_nope_out: torch.Tensor,
    k_nope_out: torch.Tensor,
) -> None:
    args = (q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q, quant_scale_kv,
            q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    if select_backend(q_rope.device) == "triton":
        from mate.ops.sparse_mla.rope_quant import mla_rope_quantize_fp8_triton

        mla_rope_quantize_fp8_triton(*args)
    else:
        mla_rope_quantize_fp8_reference(*args)


def _resolve_quantize_dtype(quantize_dtype: torch.dtype | None, outs: dict[str, torch.Tensor | None]) -> torch.dtype:
    """The spec's rules: e4m3 only; None takes the first supplied buffer's dtype, else e4m3."""
    supplied = {name: t for name, t in outs.items() if t is not None}
    for name, t in supplied.items():
        checks.check_is_tensor(name, t)
        if t.dtype not in _FP8_DTYPES:
            raise TypeError(f"{name} must be an FP8 tensor (torch.float8_e4m3fn), got {t.dtype}")
    if supplied:
        first_name, first = next(iter(supplied.items()))
        for name, t in supplied.items():
            if t.dtype != first.dtype:
                raise TypeError(f"{name} must have the dtype of {first_name} ({first.dtype}), got {t.dtype}")
    if quantize_dtype is None:
        resolved, source = (first.dtype, first_name) if supplied else (torch.float8_e4m3fn, "quantize_dtype")
    else:
        if not isinstance(quantize_dtype, torch.dtype):
            raise TypeError(f"quantize_dtype must be a torch.dtype or None, got {type(quantize_dtype).__name__}")
        resolved, source = quantize_dtype, "quantize_dtype"
    checks.check_value(source, resolved == torch.float8_e4m3fn, "torch.float8_e4m3fn (the only supported "
                       "quantize dtype)", resolved)
    for name, t in supplied.items():
        checks.check_value(name, t.dtype == resolved, f"{resolved} (quantize_dtype)", t.dtype)
    return resolved


@mate_api
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
    """RoPE on the 64-value tails and per-tensor FP8 quantization of MLA query and key rows.

    For token ``i`` at position ``p = pos_ids[i]``, with ``c = cos_sin_cache[p, :32]`` and
    ``s = cos_sin_cache[p, 32:]`` and all arithmetic in fp32::

        q_rope_out = fp8(rope(q_rope) * quant_scale_q)    q_nope_out = fp8(q_nope * quant_scale_q)
        k_rope_out = fp8(rope(k_rope) * quant_scale_kv)   k_nope_out = fp8(k_nope * quant_scale_kv)

    where ``fp8`` rounds to nearest even and saturates to +-448 (NaN stays NaN). NeoX
    layout (``is_neox=True``) rotates the halves: ``[x1*c - x2*s, x2*c + x1*s]`` with
    ``x1 = x[:32], x2 = x[32:]``; the interleaved layout rotates the pairs
    ``(x[2j], x[2j+1])`` by ``(c[j], s[j])``. One kernel launch writes all four outputs.

    Parameters
    ----------
    q_rope : torch.Tensor
        bf16 [nnz, H, 64], last dimension contiguous.
    k_rope : torch.Tensor
        bf16 [nnz, 64], last dimension contiguous.
    q_nope : torch.Tensor
        bf16 [nnz, H, 512], last dimension contiguous.
    k_nope : torch.Tensor
        bf16 [nnz, 512], last dimension contiguous.
    cos_sin_cache : torch.Tensor
        fp32 or bf16 [max_seq_len, 64], contiguous; columns [:32] cos, [32:] sin.
    pos_ids : torch.Tensor
        int32 or int64 [nnz], contiguous, values in ``[0, max_seq_len)``. Out-of-range
        values never read outside the cache (they are clamped; what is written for such
        a token is unspecified); with ``MATE_CHECK_INPUTS=1`` they raise ``ValueError``.
    is_neox : bool
        NeoX (halves) or interleaved (pairs) rotary layout.
    quantize_dtype : torch.dtype or None
        Only ``torch.float8_e4m3fn``. None: the dtype of the first supplied output buffer,
        else e4m3.
    quant_scale_q, quant_scale_kv : float
        Multipliers applied before the FP8 cast (Python numbers).
    q_rope_out, k_rope_out, q_nope_out, k_nope_out : torch.Tensor, optional
        float8_e4m3fn outputs with the shapes of the matching inputs. Leading dimensions
        may be strided, the last must be contiguous: e.g. ``q_nope_out = q[..., :512]``
        and ``q_rope_out = q[..., 512:]`` of one merged [nnz, H, 576] tensor. Omitted
        ones are allocated; supplied ones are written in place and returned.
    enable_pdl : bool
        Accepted for compatibility and ignored.

    Returns
    -------
    (q_rope_out, k_rope_out, q_nope_out, k_nope_out)

    Raises
    ------
    TypeError
        An input of the wrong dtype, an output that is not FP8 or whose dtype differs
        from the other outputs'.
    ValueError
        Wrong shapes, layouts or devices; a quantize dtype (given or implied by an output
        buffer) other than float8_e4m3fn; out-of-range ``pos_ids`` with
        ``MATE_CHECK_INPUTS=1``.
    NotImplementedError
        A tensor-valued quantization scale.
    """
    bf16 = torch.bfloat16
    checks.check_tensor("q_rope", q_rope, dtype=bf16, ndim=3)
    nnz, num_heads = q_rope.shape[0], q_rope.shape[1]
    checks.check_shape("q_rope", q_rope, [nnz, num_heads, 64])
    checks.check_last_dim_contiguous("q_rope", q_rope)
    checks.check_tensor("k_rope", k_rope, dtype=bf16, shape=[nnz, 64], last_dim_contiguous=True)
    checks.check_tensor("q_nope", q_nope, dtype=bf16, shape=[nnz, num_heads, 512], last_dim_contiguous=True)
    checks.check_tensor("k_nope", k_nope, dtype=bf16, shape=[nnz, 512], last_dim_contiguous=True)
    checks.check_tensor("cos_sin_cache", cos_sin_cache, dtype=(torch.float32, bf16), shape=[None, 64],
                        contiguous=True)
    checks.check_tensor("pos_ids", pos_ids, dtype=(torch.int32, torch.int64), shape=[nnz], contiguous=True)
    if not isinstance(is_neox, bool):
        raise TypeError(f"is_neox must be a bool, got {type(is_neox).__name__}")
    quant_scale_q = checks.check_python_float("quant_scale_q", quant_scale_q)
    quant_scale_kv = checks.check_python_float("quant_scale_kv", quant_scale_kv)
    outs = {"q_rope_out": q_rope_out, "k_rope_out": k_rope_out, "q_nope_out": q_nope_out,
            "k_nope_out": k_nope_out}
    out_dtype = _resolve_quantize_dtype(quantize_dtype, outs)
    device = checks.check_same_device(q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope,
                                      cos_sin_cache=cos_sin_cache, pos_ids=pos_ids, **outs)
    max_seq_len = cos_sin_cache.shape[0]
    checks.check_value("cos_sin_cache", max_seq_len > 0 or nnz == 0,
                       "at least one row when nnz > 0 (shape [max_seq_len, 64])", list(cos_sin_cache.shape))
    if nnz > 0 and checks.check_inputs_enabled():
        lo, hi = int(pos_ids.min()), int(pos_ids.max())
        checks.check_value("pos_ids", lo >= 0 and hi < max_seq_len,
                           f"in [0, {max_seq_len}) (max_seq_len = cos_sin_cache.shape[0])", f"values in [{lo}, {hi}]")
    like = {"q_rope_out": q_rope, "k_rope_out": k_rope, "q_nope_out": q_nope, "k_nope_out": k_nope}
    for name, src in like.items():
        t = outs[name]
        if t is None:
            outs[name] = torch.empty(src.shape, dtype=out_dtype, device=device)
        else:
            checks.check_out_tensor(name, t, shape=list(src.shape), dtype=out_dtype, device=device,
                                    contiguous=False, last_dim_contiguous=True)
    _mla_rope_quantize_fp8_op(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q,
                              quant_scale_kv, outs["q_rope_out"], outs["k_rope_out"], outs["q_nope_out"],
                              outs["k_nope_out"])
    return outs["q_rope_out"], outs["k_rope_out"], outs["q_nope_out"], outs["k_nope_out"]


# ---- get_batch_decode_metadata_mla / sparse_mla_fp8_decode (section owned by the decode work)
