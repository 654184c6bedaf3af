"""Sparse MLA (DeepSeek-V3.2): fused RoPE + FP8 quantization and FP8 sparse decode.

Public API at MATE's import path. Validation goes through :mod:`mate._core.checks`,
kernels live in :mod:`mate.ops.sparse_mla`, references in
:mod:`mate.ops.sparse_mla.reference`.
"""

from __future__ import annotations

# ---- mla_rope_quantize_fp8 (section owned by the RoPE + FP8 work) -------------------

# ---- get_batch_decode_metadata_mla / sparse_mla_fp8_decode (section owned by the decode work)
