"""Sparse MLA decode through FlashInfer's names, served by mate.

The calls below are the ones a serving engine written against FlashInfer makes for
DeepSeek-V3.2 sparse attention; with the ``flashinfer-python 0.6.17+mate`` package
installed they run on mate (Triton kernels on a GPU, PyTorch references on the CPU):

1. ``flashinfer.rope.mla_rope_quantize_fp8`` rotates the 64 rope values and quantizes
   query and latent KV rows to FP8 with non-unit scales (``fp8 = value * scale``), writing
   into the two halves of merged 576-value buffers: the query tensor and the paged cache.
2. ``flashinfer.decode.get_batch_decode_metadata_mla`` plans the decode once.
3. ``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla`` runs two decode steps with
   that metadata while ``seq_lens`` changes, the quantization scales folded into
   ``bmm1_scale`` / ``bmm2_scale``.

Each step is compared with attention computed in fp32, from the unquantized bf16 inputs
(FP8 rounding: a few percent) and from the dequantized FP8 values (bf16 rounding only).
Run: ``python wrappers/flashinfer/examples/fp8_mla_decode.py``.
"""

from __future__ import annotations

import math

import flashinfer.decode
import flashinfer.rope
import torch


def rotate_neox(x: torch.Tensor, pos: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """fp32 NeoX rotation of ``x[..., 64]`` at positions ``pos`` (broadcast over heads)."""
    cos, sin = cos_sin[pos, :32], cos_sin[pos, 32:]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x = x.float()
    return torch.cat([x[..., :32] * cos - x[..., 32:] * sin, x[..., 32:] * cos + x[..., :32] * sin], dim=-1)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(1234)
    batch, q_len, heads, top_k, page_size = (16, 2, 64, 2048, 64) if device == "cuda" else (3, 2, 8, 128, 64)
    tokens_per_req = 3 * top_k
    pages = batch * tokens_per_req // page_size
    cached = pages * page_size

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    # Rotary table [positions, 64]: cos in the first 32 columns, sin in the last 32.
    freqs = 1.0 / 10000.0 ** (torch.arange(32, dtype=torch.float32, device=device) / 32)
    angles = torch.arange(tokens_per_req + 8, dtype=torch.float32, device=device)[:, None] * freqs
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1)

    sq, skv = 2.0, 16.0  # quantization multipliers for the query and the KV cache

    # KV cache: every cached token, rotated at its position and quantized into [:512] / [512:].
    kv_nope, kv_rope = normal(cached, 512), normal(cached, 64)
    kv_pos = torch.arange(cached, device=device) % tokens_per_req
    kv_cache = torch.empty(pages, page_size, 576, dtype=torch.float8_e4m3fn, device=device)
    kv_rows = kv_cache.view(cached, 576)
    no_q_rope, no_q_nope = normal(cached, 1, 64), normal(cached, 1, 512)  # this call writes only K
    flashinfer.rope.mla_rope_quantize_fp8(
        no_q_rope, kv_rope, no_q_nope, kv_nope, cos_sin, kv_pos, is_neox=True,
        quant_scale_q=1.0, quant_scale_kv=skv, k_rope_out=kv_rows[:, 512:], k_nope_out=kv_rows[:, :512],
    )

    # Query of this step (q_len positions per request), written into one merged FP8 tensor.
    tokens = batch * q_len
    q_nope, q_rope = normal(tokens, heads, 512), normal(tokens, heads, 64)
    q_pos = (tokens_per_req - q_len + torch.arange(tokens, device=device) % q_len).to(torch.int32)
    query = torch.empty(batch, q_len, heads, 576, dtype=torch.float8_e4m3fn, device=device)
    q_rows = query.view(tokens, heads, 576)
    k_step_rope, k_step_nope = normal(tokens, 64), normal(tokens, 512)  # this step's new KV rows
    q_rope_out, _, q_nope_out, _ = flashinfer.rope.mla_rope_quantize_fp8(
        q_rope, k_step_rope, q_nope, k_step_nope, cos_sin, q_pos, is_neox=True,
        quant_scale_q=sq, quant_scale_kv=skv, q_rope_out=q_rows[..., 512:], q_nope_out=q_rows[..., :512],
    )
    assert q_rope_out.data_ptr() == q_rows[..., 512:].data_ptr()  # written in place, no copy

    # Top-k physical token numbers of each query row; the last 5 slots are invalid (-1).
    first = (torch.arange(batch, device=device) * tokens_per_req).repeat_interleave(q_len)
    picks = torch.stack([torch.randperm(tokens_per_req, generator=gen, device=device)[:top_k] for _ in range(tokens)])
    block_tables = (picks + first[:, None]).to(torch.int32).view(batch, q_len, top_k)
    block_tables[..., -5:] = -1
    seq_lens = torch.full((batch,), top_k, dtype=torch.int32, device=device)

    softmax_scale = 1.0 / math.sqrt(128 + 64)  # DeepSeek's qk head dim before absorption
    bmm1_scale = softmax_scale / (sq * skv)  # undoes both quantization multipliers
    bmm2_scale = 1.0 / skv  # undoes the value multiplier

    metadata = flashinfer.decode.get_batch_decode_metadata_mla(query=query, seq_lens=seq_lens, sparse_mla_top_k=top_k)
    out = torch.empty(batch, q_len, heads, 512, dtype=torch.bfloat16, device=device)

    # fp32 reference from the bf16 inputs.
    q_ref = torch.cat([q_nope.float(), rotate_neox(q_rope, q_pos.long(), cos_sin)], dim=-1)
    kv_ref = torch.cat([kv_nope.float(), rotate_neox(kv_rope, kv_pos, cos_sin)], dim=-1)
    idx = block_tables.view(tokens, top_k).long()
    # The same attention from the FP8 values the decode reads, dequantized with the scales:
    # this checks the scale folding exactly (up to the bf16 output rounding).
    q_deq = q_rows.float() / sq
    kv_deq = kv_rows.float() / skv

    for step, valid in enumerate((top_k - 40, top_k)):
        seq_lens.fill_(valid)  # the metadata stays valid: it depends on shapes and top-k only
        res, lse = flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla(
            query, kv_cache, None, 128, 512, 64, block_tables, seq_lens, tokens_per_req,
            sparse_mla_top_k=top_k, out=out, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
            backend="trtllm-gen", return_lse=True, metadata=metadata,
        )
        assert res is out
        live = (idx >= 0) & (torch.arange(top_k, device=device) < valid)
        keys = kv_ref[idx.clamp(min=0)]
        logits = torch.einsum("thd,tkd->thk", q_ref, keys) * softmax_scale
        logits = logits.masked_fill(~live[:, None, :], float("-inf"))
        ref = torch.einsum("thk,tkd->thd", logits.softmax(-1), keys[..., :512]).view_as(out)
        ref_lse = logits.logsumexp(-1).view(batch, q_len, heads)  # natural log, unscaled logits
        rel = ((res.float() - ref).norm() / ref.norm()).item()
        keys8 = kv_deq[idx.clamp(min=0)]
        logits8 = torch.einsum("thd,tkd->thk", q_deq, keys8) * softmax_scale
        logits8 = logits8.masked_fill(~live[:, None, :], float("-inf"))
        ref8 = torch.einsum("thk,tkd->thd", logits8.softmax(-1), keys8[..., :512]).view_as(out)
        rel8 = ((res.float() - ref8).norm() / ref8.norm()).item()
        assert rel8 < 0.01, rel8  # bf16 output: relative rounding <= 2**-9 per element
        lse_err = (lse - ref_lse).abs().max().item()
        print(f"step {step}: seq_lens={valid}: out {tuple(res.shape)} {res.dtype}; relative error vs the bf16 "
              f"inputs {rel:.4f}, vs the dequantized FP8 values {rel8:.5f}; lse max abs error {lse_err:.4f}")
        # e4m3 keeps 3 mantissa bits: each q / kv value is off by up to 1/16 of itself (about 3.6%
        # RMS), on the values and, through the logits, on the softmax weights: ~6% overall.
        assert rel < 0.1, rel
        assert lse_err < 0.1, lse_err
    print(f"ok on {device} (mate {'Triton kernels' if device == 'cuda' else 'CPU reference'})")


if __name__ == "__main__":
    main()
