"""DeepSeek-V3.2 sparse-attention decode with mate: RoPE -> FP8 -> sparse MLA decode.

1. ``mla_rope_quantize_fp8`` rotates and quantizes the query and the latent KV rows with
   non-unit per-tensor scales, writing straight into merged 576-value FP8 buffers (the
   query tensor and the paged KV cache).
2. ``get_batch_decode_metadata_mla`` plans the decode once; the metadata is reused while
   ``seq_lens`` changes from step to step.
3. ``sparse_mla_fp8_decode`` attends each query to its top-k cached tokens, with the
   quantization scales folded into ``bmm1_scale`` / ``bmm2_scale``.
The result is checked against attention computed in fp32 from the unquantized bf16
tensors. Runs on the GPU when one is present, else on the CPU reference.
"""

from __future__ import annotations

import math

import torch

from mate.sparse_mla_interface import get_batch_decode_metadata_mla, mla_rope_quantize_fp8, sparse_mla_fp8_decode
from mate.testing import rel_error


def rope_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation of the last 64 values, in fp32."""
    x = x.float()
    x1, x2 = x[..., :32], x[..., 32:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 attention of q [n, H, 576] over rows kv[idx] (keys: 576 values, values: first 512)."""
    keys = kv[idx.clamp(min=0)]  # [n, top_k, 576]
    logits = torch.einsum("nhd,nkd->nhk", q, keys) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("nhk,nkd->nhd", logits.softmax(-1), keys[..., :512])


def main() -> None:
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    B, q_len, H, top_k, page_size = (32, 1, 128, 2048, 64) if gpu else (4, 1, 16, 128, 64)
    ctx = 4 * top_k  # tokens cached per request
    pages_per_req = ctx // page_size
    num_pages = B * pages_per_req
    max_pos = ctx + 16

    # Rotary table: columns [:32] cos, [32:] sin.
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, dtype=torch.float32) / 32))
    angles = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)

    # --- KV cache: every cached token's latent row, rotated and quantized into the cache.
    n_tok = num_pages * page_size
    k_nope = torch.randn(n_tok, 512, device=device).to(torch.bfloat16)
    k_rope = torch.randn(n_tok, 64, device=device).to(torch.bfloat16)
    kv_pos = (torch.arange(n_tok, device=device) % ctx).to(torch.int64)
    kv_cache = torch.empty(num_pages, page_size, 576, dtype=torch.float8_e4m3fn, device=device)
    rows = kv_cache.view(n_tok, 576)
    q_scale, kv_scale = 4.0, 8.0  # non-unit quantization scales: fp8 = value * scale

    # --- Query of this decode step.
    nnz = B * q_len
    q_nope = torch.randn(nnz, H, 512, device=device).to(torch.bfloat16)
    q_rope = torch.randn(nnz, H, 64, device=device).to(torch.bfloat16)
    q_pos = torch.full((nnz,), ctx - 1, dtype=torch.int64, device=device)
    query = torch.empty(B, q_len, H, 576, dtype=torch.float8_e4m3fn, device=device)
    q_rows = query.view(nnz, H, 576)

    # One call rotates and quantizes query rows; the KV rows go through the same op.
    mla_rope_quantize_fp8(q_rope, k_rope[:nnz], q_nope, k_nope[:nnz], cos_sin, q_pos,
                          is_neox=True, quant_scale_q=q_scale, quant_scale_kv=kv_scale,
                          q_rope_out=q_rows[..., 512:], q_nope_out=q_rows[..., :512])
    dummy_q = torch.empty(n_tok, 1, 64, dtype=torch.bfloat16, device=device).normal_()
    dummy_qn = torch.empty(n_tok, 1, 512, dtype=torch.bfloat16, device=device).normal_()
    mla_rope_quantize_fp8(dummy_q, k_rope, dummy_qn, k_nope, cos_sin, kv_pos,
                          is_neox=True, quant_scale_q=1.0, quant_scale_kv=kv_scale,
                          k_rope_out=rows[:, 512:], k_nope_out=rows[:, :512])

    # --- Top-k indices (physical token numbers), some slots invalid (-1).
    base = (torch.arange(B, device=device) * pages_per_req * page_size)[:, None, None]
    picks = torch.stack([torch.randperm(ctx, device=device)[:top_k] for _ in range(B * q_len)])
    block_tables = (picks.view(B, q_len, top_k) + base).to(torch.int32)
    block_tables[:, :, -7:] = -1
    seq_lens = torch.full((B,), top_k, dtype=torch.int32, device=device)

    softmax_scale = 1.0 / math.sqrt(128 + 64)
    bmm1_scale = softmax_scale / (q_scale * kv_scale)
    bmm2_scale = 1.0 / kv_scale
    metadata = get_batch_decode_metadata_mla(query, seq_lens, top_k)
    workspace = torch.empty(0, dtype=torch.uint8, device=device)

    # Fp32 reference from the unquantized bf16 tensors (rotated in fp32).
    cos, sin = cos_sin[:, :32], cos_sin[:, 32:]
    q_ref = torch.cat([q_nope.float(), rope_fp32(q_rope, cos[q_pos][:, None], sin[q_pos][:, None])], -1)
    kv_ref = torch.cat([k_nope.float(), rope_fp32(k_rope, cos[kv_pos], sin[kv_pos])], -1)

    for step, valid in enumerate([top_k - 32, top_k]):  # seq_lens changes; metadata is reused
        seq_lens.fill_(valid)
        out, lse = sparse_mla_fp8_decode(query, kv_cache, workspace, 128, 512, 64, block_tables, seq_lens,
                                         ctx, sparse_mla_top_k=top_k, bmm1_scale=bmm1_scale,
                                         bmm2_scale=bmm2_scale, return_lse=True, metadata=metadata)
        idx = block_tables.view(nnz, top_k).long()
        slot_ok = (idx >= 0) & (torch.arange(top_k, device=device)[None, :] < valid)
        # (a) exactly what the kernel computes: attention over the dequantized FP8 values
        exact = attention(query.view(nnz, H, 576).float() / q_scale, rows.float() / kv_scale, idx, slot_ok,
                          softmax_scale).view(B, q_len, H, 512)
        # (b) what the model meant: attention over the unquantized bf16 values
        model = attention(q_ref.view(nnz, H, 576), kv_ref, idx, slot_ok, softmax_scale).view(B, q_len, H, 512)
        err_exact = rel_error(out, exact)
        err_model = rel_error(out, model)
        print(f"step {step}: seq_lens={valid}, out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}; "
              f"relative error vs dequantized reference {err_exact:.2e}, vs bf16 model {err_model:.3f}")
        assert err_exact < 1e-2, err_exact  # bf16 output rounding (2^-9) plus FP8 tensor-core accumulation
        assert err_model < 0.1, err_model  # e4m3 keeps 3 mantissa bits: a few percent per element
        assert torch.isfinite(lse).all()
    print(f"ok ({'GPU Triton kernels' if gpu else 'CPU reference'})")


if __name__ == "__main__":
    main()
