"""PyTorch reference of MSA's sparse forward (the spec of ``sparse_attention`` in code).

Math in fp32 (fp64 on request); block lists are sets of logical 128-token blocks of the
token's request, mapped to cache pages through a page table or flat page indices.
"""

from __future__ import annotations

import math

import torch

from mate.ops.mha.reference import block_pages, query_rows

__all__ = ["BLOCK", "kv_layout_of", "gather_pages", "sparse_attention_reference"]

BLOCK = 128


def kv_layout_of(k: torch.Tensor, num_kv_heads: int | None = None) -> str:
    """``"NHD"`` for [pages, 128, Hkv, D] (token-major), ``"HND"`` for [pages, Hkv, 128, D].

    With ``num_kv_heads`` the ambiguous case (Hkv == 128) is resolved; otherwise dim 1 of
    size 128 means token-major.
    """
    if num_kv_heads is not None and num_kv_heads != BLOCK:
        return "NHD" if k.shape[2] == num_kv_heads else "HND"
    return "NHD" if k.shape[1] == BLOCK else "HND"


def gather_pages(cache: torch.Tensor, pages: torch.Tensor, layout: str) -> torch.Tensor:
    """The 128 tokens of each page in ``pages`` (valid ids), in order, as [n * 128, Hkv, D]."""
    sel = cache[pages.long()]
    if layout == "HND":
        sel = sel.transpose(1, 2)
    return sel.reshape(-1, sel.shape[2], sel.shape[3])


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
        request; -1 and ids outside [0, ceil(kv_len / 128)) are skipped; duplicates count once;
        a block whose page is missing (past the table's columns or the request's ``kv_indices``)
        or outside the cache is skipped. An Hq-wide tensor uses the first head of each group.
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
    dev = q.device
    for i in range(len(lens)):
        q0, q1, kv_len = indptr[i], indptr[i + 1], max(lens[i], 0)
        t = query_rows(q0, q1, total_q, dev)
        if t.numel() == 0:
            continue
        nblk = -(-kv_len // BLOCK)
        ids = idx[t].long()  # [n, Hkv, W]
        valid = (ids >= 0) & (ids < nblk)
        blocks = torch.unique(ids[valid])  # the logical blocks any of these tokens selects, sorted
        if blocks.numel() == 0:
            continue
        # their pages; a block the table lacks or whose page lies outside the cache is skipped
        pages = block_pages(blocks[None], torch.tensor([i], device=dev), page_table, kv_indices, kv_page_indptr)[0]
        present = (pages >= 0) & (pages < k.shape[0])
        kr = gather_pages(k, torch.where(present, pages, 0), layout).to(compute_dtype)  # [nb * 128, Hkv, D]
        vr = gather_pages(v, torch.where(present, pages, 0), layout).to(compute_dtype)
        keys = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device=dev)).reshape(-1)  # key positions
        key_ok = present.repeat_interleave(BLOCK) & (keys < kv_len)
        off = (kv_len - (q1 - q0)) if offs is None else offs[i]
        pos = off + (t - q0)
        chosen = ((ids[..., None] == blocks) & valid[..., None]).any(dim=2)  # [n, Hkv, nb]
        vis = chosen.repeat_interleave(BLOCK, dim=2) & key_ok  # [n, Hkv, nb * 128]
        if causal:
            vis = vis & (keys[None, None, :] <= pos[:, None, None])
        vis = vis.repeat_interleave(ratio, dim=1)  # [n, Hq, keys]
        qr = q[t].to(compute_dtype)
        kx = kr.repeat_interleave(ratio, dim=1)
        vx = vr.repeat_interleave(ratio, dim=1)
        s = torch.einsum("thd,khd->thk", qr, kx) * (sm_scale * k_scale)
        s = s.masked_fill(~vis, -math.inf)
        l_ = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(l_), 0.0, l_)[..., None])
        out[t] = torch.einsum("thk,khd->thd", p, vx) * v_scale
        lse[t] = l_
    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    return out.to(out_dtype), lse.to(lse_dtype)
