"""PyTorch references for sparse MLA: the spec (``spec/sparse_mla.md``) in code.

These functions run on any device (they are the CPU implementation of the public ops and
the oracle of the kernel tests). They take already-validated tensors; the public
functions in :mod:`mate.sparse_mla_interface` do the validation.

All arithmetic is fp32 (the spec's precision); the float64 loops in
``tests/sparse_mla/test_reference.py`` check these functions on tiny inputs.
"""

from __future__ import annotations

import torch

__all__ = [
    "FP8_E4M3_MAX",
    "ROPE_DIM",
    "NOPE_DIM",
    "MLA_ROW",
    "fp8_e4m3_saturate",
    "rope_fp32",
    "mla_rope_quantize_fp8_reference",
    "sparse_mla_decode_reference",
    "sparse_mla_decode_reference_with_magnitude",
]

FP8_E4M3_MAX = 448.0
ROPE_DIM = 64  # rotary part of a 576-value MLA row
NOPE_DIM = 512  # latent ("nope") part, also the value width
MLA_ROW = NOPE_DIM + ROPE_DIM


def fp8_e4m3_saturate(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to +-448; NaN stays NaN."""
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def rope_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotates the last dimension (64) of fp32 ``x`` by ``cos``/``sin`` (fp32, last dim 32).

    ``cos``/``sin`` broadcast against ``x[..., :32]``. NeoX layout rotates the halves
    ``(x[:32], x[32:])``; the interleaved layout rotates the pairs ``(x[2j], x[2j+1])``.
    """
    if is_neox:
        x1, x2 = x[..., :32], x[..., 32:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def mla_rope_quantize_fp8_reference(
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
    """Writes the four FP8 outputs of ``mla_rope_quantize_fp8`` (see the public function).

    Shapes: q_rope [nnz, H, 64], k_rope [nnz, 64], q_nope [nnz, H, 512], k_nope [nnz, 512]
    (bf16); cos_sin_cache [max_seq_len, 64] (fp32 or bf16; [:, :32] cos, [:, 32:] sin);
    pos_ids [nnz] (int32/int64). Outputs: float8_e4m3fn with the inputs' shapes.

    Out-of-range positions are clamped into ``[0, max_seq_len)`` (the spec leaves the
    values written for such rows unspecified; the Triton kernel clamps the same way).
    """
    if q_rope.shape[0] == 0:
        return
    max_seq_len = cos_sin_cache.shape[0]
    pos = pos_ids.long().clamp(0, max_seq_len - 1)
    cs = cos_sin_cache.float()[pos]  # [nnz, 64]
    cos, sin = cs[:, :32], cs[:, 32:]
    # the scales rounded to fp32 (as the kernel receives them), kept as host numbers: no copy to
    # the device, so the reference can be captured in a CUDA graph
    sq = torch.tensor(quant_scale_q, dtype=torch.float32).item()
    skv = torch.tensor(quant_scale_kv, dtype=torch.float32).item()
    q_rot = rope_fp32(q_rope.float(), cos[:, None, :], sin[:, None, :], is_neox)
    k_rot = rope_fp32(k_rope.float(), cos, sin, is_neox)
    q_rope_out.copy_(fp8_e4m3_saturate(q_rot * sq))
    k_rope_out.copy_(fp8_e4m3_saturate(k_rot * skv))
    q_nope_out.copy_(fp8_e4m3_saturate(q_nope.float() * sq))
    k_nope_out.copy_(fp8_e4m3_saturate(k_nope.float() * skv))


def _valid_slots(block_tables: torch.Tensor, seq_lens: torch.Tensor | None, num_rows: int) -> torch.Tensor:
    """bool [B, q_len, topk]: slot j of (b, t) is a key (j < seq_lens[b], 0 <= index < rows)."""
    valid = (block_tables >= 0) & (block_tables < num_rows)
    if seq_lens is not None:
        topk = block_tables.shape[-1]
        j = torch.arange(topk, device=block_tables.device)
        valid &= j[None, None, :] < seq_lens.reshape(-1).long()[:, None, None]
    return valid


def sparse_mla_decode_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    bmm1_scale: float,
    bmm2_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 sparse MLA decode (spec section 3): returns ``(out bf16, lse fp32)``.

    Parameters
    ----------
    query : float8_e4m3fn [B, q_len, H, 576]
    kv_cache : float8_e4m3fn [pages, page_size, 576] or [pages, 1, page_size, 576]
        Viewed as [pages * page_size, 576] rows; keys are whole rows, values the first 512.
    block_tables : int32 [B, q_len, topk]
        Row numbers into the flattened cache.
    seq_lens : int32 [B] (or [B, 1]) or None
        Only slots ``j < seq_lens[b]`` are candidates; None: every slot.
    bmm1_scale, bmm2_scale : float
        ``logit = bmm1_scale * q . k``; ``out = bmm2_scale * softmax(logit) @ v``.

    Returns
    -------
    out : bf16 [B, q_len, H, 512]
        0 where no slot is valid.
    lse : fp32 [B, q_len, H]
        Natural-log logsumexp of the logits; +inf where no slot is valid.

    A slot is valid when ``j < seq_lens[b]`` and ``0 <= block_tables[b, t, j] < rows``;
    invalid slots are never read. A row listed in two valid slots counts twice.
    """
    return _decode(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale)[:2]


def sparse_mla_decode_reference_with_magnitude(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    bmm1_scale: float,
    bmm2_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, magnitude)``: :func:`sparse_mla_decode_reference`'s two outputs and, from
    the same gather and softmax, ``|bmm2_scale| * softmax(logits) @ |v|``, fp32 [B, q_len, H,
    512] (0 where no slot is valid): per output element, the softmax-weighted mean magnitude of
    the values it sums. A P·V that rounds each softmax weight to a relative error r is off by at
    most r times it, which is how the tests bound the FP8 P·V (``decode_gluon_small_h._stage_p``).
    Arguments as :func:`sparse_mla_decode_reference`."""
    return _decode(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, magnitude=True)


def _decode(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, *, magnitude: bool = False):
    """(out bf16, lse, magnitude fp32 or None): :func:`sparse_mla_decode_reference` and, with
    ``magnitude``, |bmm2_scale| P·|v| (:func:`sparse_mla_decode_reference_with_magnitude`)."""
    B, q_len, H, D = query.shape
    topk = block_tables.shape[-1]
    device = query.device
    rows = kv_cache.reshape(-1, D)
    num_rows = rows.shape[0]
    out = torch.zeros(B, q_len, H, NOPE_DIM, dtype=torch.bfloat16, device=device)
    lse = torch.full((B, q_len, H), float("inf"), dtype=torch.float32, device=device)
    mag = torch.zeros(B, q_len, H, NOPE_DIM, dtype=torch.float32, device=device) if magnitude else None
    if B * q_len * H == 0 or topk == 0 or num_rows == 0:
        return out, lse, mag
    valid = _valid_slots(block_tables, seq_lens, num_rows).reshape(B * q_len, topk)
    idx = torch.where(valid, block_tables.reshape(B * q_len, topk).long(), 0)
    q_all = query.reshape(B * q_len, H, D)
    out_flat = out.view(B * q_len, H, NOPE_DIM)
    lse_flat = lse.view(B * q_len, H)
    # bounded memory: at most ~2**24 gathered fp32 values per chunk
    chunk = max(1, (1 << 24) // (topk * D))
    for s in range(0, B * q_len, chunk):
        e = min(B * q_len, s + chunk)
        # invalid slots gather row 0 and are zeroed, so that no value of theirs (NaN included) leaks
        kv = rows[idx[s:e]].float().masked_fill(~valid[s:e, :, None], 0.0)  # [n, topk, 576]
        q = q_all[s:e].float()  # [n, H, 576]
        logits = torch.matmul(q, kv.transpose(1, 2)) * bmm1_scale  # [n, H, topk]
        logits = logits.masked_fill(~valid[s:e, None, :], float("-inf"))
        m = logits.amax(dim=-1, keepdim=True)
        empty = ~valid[s:e].any(dim=-1)  # [n]
        m = torch.where(empty[:, None, None], torch.zeros_like(m), m)
        p = torch.exp(logits - m)  # 0 at masked slots
        denom = p.sum(dim=-1, keepdim=True)
        w = p / torch.where(empty[:, None, None], 1.0, denom)
        o = torch.matmul(w, kv[..., :NOPE_DIM]) * bmm2_scale
        l_ = (m + torch.log(denom)).squeeze(-1)
        o = torch.where(empty[:, None, None], 0.0, o)
        l_ = torch.where(empty[:, None], float("inf"), l_)
        out_flat[s:e] = o.to(out.dtype)
        lse_flat[s:e] = l_
        if magnitude:
            a = torch.matmul(w, kv[..., :NOPE_DIM].abs()) * abs(bmm2_scale)
            mag.view(B * q_len, H, NOPE_DIM)[s:e] = torch.where(empty[:, None, None], 0.0, a)
    return out, lse, mag
