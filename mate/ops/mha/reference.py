"""PyTorch reference of ``mate.mha_interface`` (FlashAttention-3 conventions) in fp32.

Causal and window masks are bottom-right aligned: query i of a request with q_len queries
and k_len keys sits at key position i + k_len - q_len; it sees key j when
``pos - left <= j <= pos + right`` (``left``/``right`` of ``window_size``, -1 = unbounded;
``causal`` sets right = 0). Query head h uses KV head h // (Hq / Hkv).
"""

from __future__ import annotations

import math

import torch

__all__ = ["request_keys", "block_pages", "missing_keys", "query_rows", "attention_varlen_reference"]


def request_keys(
    cache: torch.Tensor,
    i: int,
    k_len: int,
    *,
    k_start: int = 0,
    page_table: torch.Tensor | None = None,
    batched: bool = False,
) -> torch.Tensor:
    """The ``k_len`` keys of request ``i`` as [k_len, Hkv, D].

    ``cache`` is ragged [total_k, Hkv, D] (rows from ``k_start``), batched [B, S, Hkv, D]
    (``batched=True``) or paged [pages, page_size, Hkv, D] with ``page_table`` [B, max_pages];
    keys outside the cache (ragged rows outside [0, total_k), batched rows past S, pages the
    table lacks or that lie outside the cache) are zero and masked by the caller, see
    :func:`missing_keys`.
    """
    if page_table is not None:
        page_size = cache.shape[1]
        n = -(-k_len // page_size)
        pages = _request_pages(page_table, i, n, cache.shape[0])
        sel = cache[pages.clamp(min=0)].clone() if cache.shape[0] else cache.new_zeros((n,) + cache.shape[1:])
        sel[pages < 0] = 0
        return sel.reshape(-1, cache.shape[2], cache.shape[3])[:k_len]
    rows = cache[i] if batched else cache
    idx = torch.arange(k_len, device=cache.device) + (0 if batched else k_start)
    inside = (idx >= 0) & (idx < rows.shape[0])
    sel = rows[idx.clamp(0, max(rows.shape[0] - 1, 0))] if rows.shape[0] else rows.new_zeros((k_len,) + rows.shape[1:])
    sel[~inside] = 0
    return sel


def block_pages(blk: torch.Tensor, req: torch.Tensor, page_table: torch.Tensor | None,
                kv_indices: torch.Tensor | None = None, kv_page_indptr: torch.Tensor | None = None) -> torch.Tensor:
    """The page of block ``blk[i, j]`` of request ``req[i]`` (int64), from ``page_table[req,
    blk]`` or the flat ``kv_indices[kv_page_indptr[req] + blk]``; -1 where the table has no
    such column or the request's ``kv_indices`` range no such entry."""
    if page_table is not None:
        width = page_table.shape[1]
        page = page_table.to(torch.int64)[req[:, None], blk.clamp(0, max(width - 1, 0))] if width else blk * 0 - 1
        return torch.where(blk < width, page, -1)
    start = kv_page_indptr.to(torch.int64)[req][:, None]
    count = kv_page_indptr.to(torch.int64)[req + 1][:, None] - start
    n = kv_indices.shape[0]
    listed = (start >= 0) & (blk < count) & (start + blk < n)
    flat = torch.where(listed, start + blk, 0)
    page = kv_indices.to(torch.int64)[flat] if n else torch.zeros_like(flat)
    return torch.where(listed, page, -1)


def _request_pages(page_table: torch.Tensor, i: int, n: int, num_pages: int) -> torch.Tensor:
    """The first ``n`` page ids of request ``i``, -1 where the table has no such column or
    the id is outside [0, num_pages)."""
    dev = page_table.device
    pages = block_pages(torch.arange(n, device=dev)[None], torch.tensor([i], device=dev), page_table)[0]
    return torch.where((pages >= 0) & (pages < num_pages), pages, -1)


def query_rows(q0: int, q1: int, total_q: int, device: torch.device | str) -> torch.Tensor:
    """int64 [n]: the rows [q0, q1) of a request that lie inside q's [0, total_q) (offsets past
    q are not computed, as the kernels neither read nor write them)."""
    lo, hi = max(q0, 0), min(q1, total_q)
    return torch.arange(lo, max(lo, hi), device=device)


def missing_keys(page_table: torch.Tensor | None, i: int, k_len: int, page_size: int, num_pages: int,
                 k_start: int = 0, rows: int | None = None) -> torch.Tensor:
    """Bool [k_len]: the keys of request ``i`` whose page is missing or out of range (the
    kernels skip them, as if masked); without a page table, the keys ``k_start + j`` outside
    [0, ``rows``) (none when ``rows`` is None)."""
    if page_table is None:
        j = torch.arange(k_len) + k_start
        return (j < 0) | (j >= rows) if rows is not None else torch.zeros(k_len, dtype=torch.bool)
    pages = _request_pages(page_table, i, -(-k_len // page_size), num_pages).cpu()
    return (pages < 0).repeat_interleave(page_size)[:k_len]


def attention_varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    k_lens: list[int] | torch.Tensor,
    *,
    k_starts: list[int] | None = None,
    page_table: torch.Tensor | None = None,
    batched: bool = False,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ragged queries [total_q, Hq, D] over each request's keys.

    Returns ``out`` [total_q, Hq, D] (q's dtype; fp32/fp64 math) and ``lse`` [Hq, total_q]
    (natural log, -inf where a query sees no key; its output row is 0).
    """
    total_q, hq, d = q.shape
    hkv = k.shape[-2]
    ratio = hq // hkv
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0
    out = torch.zeros(total_q, hq, d, dtype=compute_dtype, device=q.device)
    lse = torch.full((hq, total_q), -math.inf, dtype=compute_dtype, device=q.device)
    cu = [int(x) for x in cu_seqlens_q.tolist()]
    lens = [int(x) for x in (k_lens.tolist() if isinstance(k_lens, torch.Tensor) else k_lens)]
    for i, k_len in enumerate(lens):
        q0, q1 = cu[i], cu[i + 1]
        k_len = max(k_len, 0)  # a negative length: no keys
        if q1 <= q0:
            continue
        start = 0 if k_starts is None else k_starts[i]
        kr = request_keys(k, i, k_len, k_start=start, page_table=page_table, batched=batched).to(compute_dtype)
        vr = request_keys(v, i, k_len, k_start=start, page_table=page_table, batched=batched).to(compute_dtype)
        kr = kr.repeat_interleave(ratio, dim=1)
        vr = vr.repeat_interleave(ratio, dim=1)
        t = query_rows(q0, q1, total_q, q.device)
        pos = (t - q0) + (k_len - (q1 - q0))
        keys = torch.arange(k_len, device=q.device)
        vis = torch.ones(t.numel(), k_len, dtype=torch.bool, device=q.device)
        if right >= 0:
            vis &= keys[None, :] <= pos[:, None] + right
        if left >= 0:
            vis &= keys[None, :] >= pos[:, None] - left
        page_size = k.shape[1] if page_table is not None else 1
        rows = None if page_table is not None else (k.shape[1] if batched else k.shape[0])
        missing = missing_keys(page_table, i, k_len, page_size, k.shape[0], 0 if batched else start, rows)
        vis &= ~missing.to(q.device)[None, :]
        s = torch.einsum("thd,khd->htk", q[t].to(compute_dtype), kr) * scale
        s = s.masked_fill(~vis[None], -math.inf)
        l_ = torch.logsumexp(s, dim=-1)  # [Hq, n]
        p = torch.exp(s - torch.where(torch.isinf(l_), 0.0, l_)[..., None])
        out[t] = torch.einsum("htk,khd->thd", p, vr)
        lse[:, t] = l_
    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    return out.to(q.dtype), lse.to(lse_dtype)
