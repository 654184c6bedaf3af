"""PyTorch reference of MSA's sparse forward (the spec of ``sparse_attention`` in code).

Math in fp32 (fp64 on request); block lists are sets of logical 128-token blocks of the
token's request, mapped to cache pages through a page table or flat page indices.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BLOCK", "kv_layout_of", "gather_request_kv", "sparse_attention_reference"]

BLOCK = 128


def kv_layout_of(k: torch.Tensor, num_kv_heads: int | None = None) -> str:
    """``"NHD"`` for [pages, 128, Hkv, D] (token-major), ``"HND"`` for [pages, Hkv, 128, D].

    With ``num_kv_heads`` the ambiguous case (Hkv == 128) is resolved; otherwise dim 1 of
    size 128 means token-major.
    """
    if num_kv_heads is not None and num_kv_heads != BLOCK:
        return "NHD" if k.shape[2] == num_kv_heads else "HND"
    return "NHD" if k.shape[1] == BLOCK else "HND"


def gather_request_kv(
    cache: torch.Tensor, pages: torch.Tensor, kv_len: int, layout: str
) -> torch.Tensor:
    """The first ``kv_len`` tokens of one request as [kv_len, Hkv, D] from its pages."""
    sel = cache[pages.long()]
    if layout == "HND":
        sel = sel.transpose(1, 2)
    return sel.reshape(-1, sel.shape[2], sel.shape[3])[:kv_len]


def sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_block_indexes: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None = None,
    *,
    page_table: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    kv_page_indptr: torch.Tensor | None = None,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    causal: bool = True,
    num_kv_heads: int | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of every query token over the union of its selected blocks.

    Parameters
    ----------
    q : [total_q, Hq, D] fp16 / bf16 / float8_e4m3fn
    k, v : paged caches [pages, 128, Hkv, D] or [pages, Hkv, 128, D], q's dtype
    kv_block_indexes : int32 [total_q, Hkv or Hq, width]; logical block ids of the token's
        request; -1 and ids outside [0, ceil(kv_len / 128)) are skipped; duplicates count once.
        An Hq-wide tensor uses the first head of each group.
    qo_indptr : int [B + 1] cumulative query lengths
    kv_lens : int [B]
    qo_offset : int [B] absolute position of each request's first query (default kv_len - q_len)
    page_table : int32 [B, max_pages], or ``kv_indices`` + ``kv_page_indptr`` (flat form)

    Returns
    -------
    out : [total_q, Hq, D], q's dtype (bf16 for fp8 inputs)
    lse : fp32 [total_q, Hq] (fp64 with ``compute_dtype=torch.float64``), natural log; -inf
        (and out 0) where no key is visible
    """
    total_q, hq, d = q.shape
    layout = kv_layout_of(k, num_kv_heads)
    hkv = k.shape[2] if layout == "NHD" else k.shape[1]
    ratio = hq // hkv
    if sm_scale is None:
        sm_scale = d ** -0.5
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    out = torch.zeros(total_q, hq, d, dtype=compute_dtype, device=q.device)
    lse = torch.full((total_q, hq), -math.inf, dtype=compute_dtype, device=q.device)
    idx = kv_block_indexes
    if idx.shape[1] != hkv:
        idx = idx[:, ::ratio]
    indptr = [int(x) for x in qo_indptr.tolist()]
    lens = [int(x) for x in kv_lens.tolist()]
    offs = None if qo_offset is None else [int(x) for x in qo_offset.tolist()]
    for i in range(len(lens)):
        q0, q1, kv_len = indptr[i], indptr[i + 1], lens[i]
        if q1 == q0:
            continue
        nblk = -(-kv_len // BLOCK)
        if page_table is not None:
            pages = page_table[i, :nblk]
        else:
            start = int(kv_page_indptr[i])
            pages = kv_indices[start:start + nblk]
        kr = gather_request_kv(k, pages, kv_len, layout).to(compute_dtype)  # [kv_len, Hkv, D]
        vr = gather_request_kv(v, pages, kv_len, layout).to(compute_dtype)
        off = (kv_len - (q1 - q0)) if offs is None else offs[i]
        pos = off + torch.arange(q1 - q0, device=q.device)
        ids = idx[q0:q1].long()  # [n, Hkv, W]
        valid = (ids >= 0) & (ids < nblk)
        chosen = torch.zeros(q1 - q0, hkv, nblk + 1, dtype=torch.bool, device=q.device)
        chosen.scatter_(2, torch.where(valid, ids, nblk), True)
        keys = torch.arange(kv_len, device=q.device)
        vis = chosen[:, :, keys // BLOCK]  # [n, Hkv, kv_len]
        if causal:
            vis = vis & (keys[None, None, :] <= pos[:, None, None])
        vis = vis.repeat_interleave(ratio, dim=1)  # [n, Hq, kv_len]
        qr = q[q0:q1].to(compute_dtype)
        kx = kr.repeat_interleave(ratio, dim=1)
        vx = vr.repeat_interleave(ratio, dim=1)
        s = torch.einsum("thd,khd->thk", qr, kx) * (sm_scale * k_scale)
        s = s.masked_fill(~vis, -math.inf)
        l_ = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(l_), 0.0, l_)[..., None])
        out[q0:q1] = torch.einsum("thk,khd->thd", p, vx) * v_scale
        lse[q0:q1] = l_
    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    return out.to(out_dtype), lse.to(lse_dtype)
