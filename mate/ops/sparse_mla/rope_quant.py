"""Triton kernel for ``mla_rope_quantize_fp8``: RoPE on the 64-value tail + FP8 quantization.

One launch writes all four outputs. The grid is ``(nnz, head_blocks + 1)``: program
``(i, b)`` with ``b < head_blocks`` handles ``BLOCK_H`` query heads of token ``i`` (their
512 latent and 64 rotary values); program ``(i, head_blocks)`` handles the key row of token
``i``. Every row is read once and written once with its last dimension contiguous, so the
loads and stores are 16-byte vectors; leading dimensions take any stride (outputs may be
slices of merged 576-value rows).

RoPE: NeoX rows are loaded as two contiguous 32-value halves; interleaved rows as one
contiguous [32, 2] tile split into even and odd values (``tl.split``) and joined back
after the rotation, so both layouts read and write each value once, vectorized.

Positions outside ``[0, max_seq_len)`` are clamped, so the cache is never read out of
bounds (the spec leaves those rows' values unspecified).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mate._core.launch import launcher
from mate._core.triton_helpers import cdiv, next_power_of_2, to_fp8_e4m3

__all__ = ["mla_rope_quantize_fp8_kernel", "mla_rope_quantize_fp8_triton", "rope_quant_config"]

NOPE: tl.constexpr = tl.constexpr(512)


@triton.jit
def _rope_quant_rows(
    rope_ptr, nope_ptr, rope_out_ptr, nope_out_ptr,
    stride_rope, stride_nope, stride_rope_out, stride_nope_out,
    n_rows, cos, sin, scale,
    IS_NEOX: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Rotates and quantizes ``n_rows`` rows (row r at ``ptr + r * stride``).

    ``cos``/``sin`` are the 32 fp32 values of the token's position.
    """
    r = tl.arange(0, BLOCK_R)
    rmask = (r < n_rows)[:, None]
    r64 = r.to(tl.int64)[:, None]
    j = tl.arange(0, 32)[None, :]
    c = cos[None, :]
    s = sin[None, :]
    # 64-value rotary tail, fp32 right after the load
    if IS_NEOX:
        # halves: two contiguous 32-value loads per row
        in_off = r64 * stride_rope + j
        out_off = r64 * stride_rope_out + j
        x1 = tl.load(rope_ptr + in_off, mask=rmask, other=0.0).to(tl.float32)
        x2 = tl.load(rope_ptr + in_off + 32, mask=rmask, other=0.0).to(tl.float32)
        tl.store(rope_out_ptr + out_off, to_fp8_e4m3((x1 * c - x2 * s) * scale), mask=rmask)
        tl.store(rope_out_ptr + out_off + 32, to_fp8_e4m3((x2 * c + x1 * s) * scale), mask=rmask)
    else:
        # pairs: one contiguous [BLOCK_R, 32, 2] load, split into even and odd values
        k = tl.arange(0, 2)[None, None, :]
        in_off = r64[:, :, None] * stride_rope + 2 * j[:, :, None] + k
        out_off = r64[:, :, None] * stride_rope_out + 2 * j[:, :, None] + k
        m3 = rmask[:, :, None]
        x = tl.load(rope_ptr + in_off, mask=m3, other=0.0).to(tl.float32)
        x1, x2 = tl.split(x)
        y = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)
        tl.store(rope_out_ptr + out_off, to_fp8_e4m3(y * scale), mask=m3)
    # 512-value latent part: scale and quantize
    n = tl.arange(0, NOPE)[None, :]
    y = tl.load(nope_ptr + r64 * stride_nope + n, mask=rmask, other=0.0).to(tl.float32)
    tl.store(nope_out_ptr + r64 * stride_nope_out + n, to_fp8_e4m3(y * scale), mask=rmask)


@triton.jit
def mla_rope_quantize_fp8_kernel(
    q_rope_ptr, k_rope_ptr, q_nope_ptr, k_nope_ptr, cache_ptr, pos_ptr,
    q_rope_out_ptr, k_rope_out_ptr, q_nope_out_ptr, k_nope_out_ptr,
    H, max_seq_len,
    s_qr_t, s_qr_h, s_kr_t, s_qn_t, s_qn_h, s_kn_t,
    s_qro_t, s_qro_h, s_kro_t, s_qno_t, s_qno_h, s_kno_t,
    quant_scale_q, quant_scale_kv,
    IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    num_hb = tl.cdiv(H, BLOCK_H)

    # cos/sin of this token's position, clamped into the cache, fp32
    pos = tl.load(pos_ptr + i).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), max_seq_len - 1)
    col = tl.arange(0, 32)
    cos = tl.load(cache_ptr + pos * 64 + col).to(tl.float32)
    sin = tl.load(cache_ptr + pos * 64 + 32 + col).to(tl.float32)

    if hb < num_hb:
        h0 = hb * BLOCK_H
        _rope_quant_rows(
            q_rope_ptr + i * s_qr_t + h0 * s_qr_h, q_nope_ptr + i * s_qn_t + h0 * s_qn_h,
            q_rope_out_ptr + i * s_qro_t + h0 * s_qro_h, q_nope_out_ptr + i * s_qno_t + h0 * s_qno_h,
            s_qr_h, s_qn_h, s_qro_h, s_qno_h,
            H - h0, cos, sin, quant_scale_q,
            IS_NEOX, BLOCK_H,
        )
    else:
        _rope_quant_rows(
            k_rope_ptr + i * s_kr_t, k_nope_ptr + i * s_kn_t,
            k_rope_out_ptr + i * s_kro_t, k_nope_out_ptr + i * s_kno_t,
            0, 0, 0, 0,
            1, cos, sin, quant_scale_kv,
            IS_NEOX, 1,
        )


def rope_quant_config(num_heads: int) -> tuple[int, int]:
    """(BLOCK_H, num_warps) by head count, from the H200 benchmark (2026-11-29, copy = 4101 GB/s).

    nnz=8192: H=128 gave 96.6% of copy bandwidth with (16, 8) against 93% with (8, 4);
    H=16 gave 89% with (8, 4) against 82-88% for the others.
    """
    if num_heads >= 64:
        return 16, 8
    return min(8, next_power_of_2(num_heads)), 4


def mla_rope_quantize_fp8_triton(
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
    *,
    config: tuple[int, int] | None = None,
) -> None:
    """Launches the kernel on validated tensors (see the public function); nnz = 0: nothing.

    ``config`` = (BLOCK_H, num_warps) overrides :func:`rope_quant_config` (benchmarks).
    """
    nnz, H = q_rope.shape[0], q_rope.shape[1]
    if nnz == 0:
        return
    block_h, num_warps = config if config is not None else rope_quant_config(H)
    grid = (nnz, cdiv(H, block_h) + 1)
    launcher(mla_rope_quantize_fp8_kernel)[grid](
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids,
        q_rope_out, k_rope_out, q_nope_out, k_nope_out,
        H, cos_sin_cache.shape[0],
        q_rope.stride(0), q_rope.stride(1), k_rope.stride(0), q_nope.stride(0), q_nope.stride(1), k_nope.stride(0),
        q_rope_out.stride(0), q_rope_out.stride(1), k_rope_out.stride(0),
        q_nope_out.stride(0), q_nope_out.stride(1), k_nope_out.stride(0),
        float(quant_scale_q), float(quant_scale_kv),
        IS_NEOX=bool(is_neox),
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
