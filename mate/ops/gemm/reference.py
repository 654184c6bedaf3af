"""PyTorch references for the GEMM family: the spec in code.

Every function dequantizes its FP8 operands to fp32 (real = fp8 value * scale), multiplies
in fp32 and rounds once to the output dtype. They run on any device and are the oracle of
the tests; CPU calls of :mod:`mate.gemm` use them directly.
"""

from __future__ import annotations

import torch

__all__ = [
    "bmm_ref",
    "bmm_fp8_ref",
    "expand_block_scales",
    "groupwise_fp32_ref",
    "quantize_fp8_row_groups_ref",
    "gemm_fp8_groupwise_ref",
    "grouped_contiguous_ref",
    "masked_ref",
    "FP8_E4M3_MAX",
]

FP8_E4M3_MAX = 448.0
BLOCK = 128


def bmm_ref(A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[b, m, k] x [b, k, n] in fp32, rounded once to ``out_dtype``."""
    return torch.bmm(A.float(), B.float()).to(out_dtype)


def bmm_fp8_ref(
    A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """FP8 bmm with per-tensor (one element) or channelwise ([b, m, 1] and [b, 1, n]) scales.

    The fp32 product is scaled after accumulation (scales are constant along k).
    """
    acc = torch.bmm(A.float(), B.float())
    if A_scale.numel() == 1 and B_scale.numel() == 1:
        acc = acc * (A_scale.reshape(()).float() * B_scale.reshape(()).float())
    else:
        acc = acc * A_scale.float() * B_scale.float()
    return acc.to(dtype)


def expand_block_scales(scale: torch.Tensor, rows: int, block_rows: int, cols: int) -> torch.Tensor:
    """[ceil(rows / block_rows), cols / 128] block scales -> one fp32 scale per element [rows, cols]."""
    s = scale.float().repeat_interleave(block_rows, dim=0)[:rows]
    return s.repeat_interleave(BLOCK, dim=1)[:, :cols]


def groupwise_fp32_ref(
    a: torch.Tensor, b: torch.Tensor, a_scale_k: torch.Tensor, b_scale_k: torch.Tensor
) -> torch.Tensor:
    """The fp32 result of the 1x128 (a) x 128x128 (b) block-scaled product a · bᵀ.

    a [m, k], b [n, k] FP8; a_scale_k [m, k/128] and b_scale_k [ceil(n/128), k/128] are the
    K-major scales. Dequantize, then one fp32 matmul.
    """
    m, k = a.shape
    n = b.shape[0]
    a_deq = a.float() * expand_block_scales(a_scale_k, m, 1, k)
    b_deq = b.float() * expand_block_scales(b_scale_k, n, BLOCK, k)
    return a_deq @ b_deq.t()


def quantize_fp8_row_groups_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, 128-column-group FP8 quantization of an fp32 matrix [m, n].

    scale[i, g] = amax(|x[i, 128g : 128g + 128]|) / 448, 1 for an all-zero group;
    q = e4m3(x / scale) (saturating). Returns (q [m, n] e4m3, scale [m, ceil(n/128)] fp32).
    """
    m, n = x.shape
    nb = -(-n // BLOCK)
    pad = nb * BLOCK - n
    xp = torch.nn.functional.pad(x.float(), (0, pad)).view(m, nb, BLOCK)
    amax = xp.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / FP8_E4M3_MAX, torch.ones_like(amax))
    q = (xp / scale[:, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).view(m, nb * BLOCK)[:, :n]
    return q.to(torch.float8_e4m3fn), scale


def gemm_fp8_groupwise_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale_k: torch.Tensor,
    b_scale_k: torch.Tensor,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Groupwise GEMM; ``out_dtype`` e4m3 quantizes the result per row and 128 columns.

    Returns (out, output_scale or None).
    """
    acc = groupwise_fp32_ref(a, b, a_scale_k, b_scale_k)
    if out_dtype == torch.float8_e4m3fn:
        return quantize_fp8_row_groups_ref(acc)
    return acc.to(out_dtype), None


def grouped_contiguous_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    m_indices: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """MoE contiguous layout: row i uses expert m_indices[i]; rows with an index outside
    [0, G) (padding, -1) come out as zero here (the API leaves them unspecified)."""
    m, _ = a.shape
    G, n, _ = b.shape
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    idx = m_indices.long()
    for g in range(G):
        rows = (idx == g).nonzero().flatten()
        if rows.numel():
            out[rows] = groupwise_fp32_ref(a[rows], b[g], a_scale[rows], b_scale[g])
    return out.to(out_dtype)


def masked_ref(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    masked_m: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """MoE masked layout: group g multiplies its first masked_m[g] rows (clamped to
    [0, max_m]); the other rows come out as zero here (the API leaves them unspecified)."""
    G, max_m, _ = a.shape
    n = b.shape[1]
    out = torch.zeros(G, max_m, n, dtype=torch.float32, device=a.device)
    counts = masked_m.long().clamp(0, max_m).tolist()
    for g in range(G):
        r = counts[g]
        if r:
            out[g, :r] = groupwise_fp32_ref(a[g, :r], b[g], a_scale[g, :r], b_scale[g])
    return out.to(out_dtype)
