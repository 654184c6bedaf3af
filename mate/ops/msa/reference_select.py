"""PyTorch references of MSA block selection: the max-score pass and top-k selection.

These are the spec in code and the CPU backend. They run on any device without host
reads (no ``.item()``, ``.tolist()``, ``.cpu()``): the loops are over host sizes only.
"""

from __future__ import annotations

import torch

from mate.ops.mha.reference import block_pages

__all__ = ["max_score_reference", "topk_select_reference", "valid_block_counts", "MSA_BLOCK"]

MSA_BLOCK = 128
LAYOUT_DENSE, LAYOUT_TOKEN_MAJOR, LAYOUT_HEAD_MAJOR = 0, 1, 2
_CHUNK_ELEMS = 1 << 24  # scores materialized per step (tokens x heads x keys)


def _token_requests(cu_seqlens_q: torch.Tensor, total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request id and index within the request of each query token."""
    cu = cu_seqlens_q.to(torch.int64)
    t = torch.arange(total_q, device=cu.device, dtype=torch.int64)
    req = torch.searchsorted(cu[1:].contiguous(), t, right=True)
    req = req.clamp(max=cu.shape[0] - 2)
    return req, t - cu[req]


def max_score_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    kv_page_indptr: torch.Tensor | None,
    qo_offset_value: int | None,
    causal: bool,
    layout: int,
    batch_size: int,
    max_seqlen_q: int,
    num_k_tiles: int,
) -> torch.Tensor:
    """fp32 ``[total_q, Hq, num_k_tiles]``: per 128-key block, the max over visible keys of
    the raw dot product ``q[t, h] . k[key, h // (Hq / Hkv)]`` (fp32 math); -inf where no key
    is visible.

    K is dense ragged (``layout`` 0, ``cu_seqlens_k``) or paged with 128-token pages,
    token-major ``[pages, 128, Hkv, D]`` (1) or head-major ``[pages, Hkv, 128, D]`` (2);
    pages come from ``page_table[b, block]`` or ``kv_indices[kv_page_indptr[b] + block]``; a
    block whose page is missing (no such table column, past the request's ``kv_indices``) or
    outside ``[0, k.shape[0])`` is skipped (-inf), as the kernel skips it.
    A key ``j`` of request ``b`` is visible to the token at position ``p`` when
    ``j < kv_lens[b]`` and, under ``causal``, ``j <= p``; ``p = qo_offset[b] + i`` (default
    ``qo_offset = kv_len - q_len``, or the scalar ``qo_offset_value``). Dense keys past k's
    rows (``cu_seqlens_k[b] + j >= k.shape[0]``) are skipped, and a request whose key range
    starts before k's first row sees none; a token that no request's ``[cu_seqlens_q[b],
    cu_seqlens_q[b + 1])`` covers, or of a request starting before q's first row, stays -inf
    (the kernel leaves its row unwritten). Lengths past ``2**30`` count as ``2**30``.
    """
    total_q, Hq, D = q.shape
    dev = q.device
    out = torch.full((total_q, Hq, num_k_tiles), float("-inf"), dtype=torch.float32, device=dev)
    if total_q == 0 or num_k_tiles == 0:
        return out
    if layout != LAYOUT_DENSE and k.shape[0] == 0:  # no page to read
        return out
    Hkv = k.shape[2] if layout == LAYOUT_TOKEN_MAJOR else k.shape[1]
    ratio = Hq // Hkv
    req, local = _token_requests(cu_seqlens_q, total_q)
    q_len = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)[req]
    # a token no request's [start, end) covers, or of a request starting before q's first row, is not computed
    covered = (local >= 0) & (local < q_len) & (cu_seqlens_q.to(torch.int64)[req] >= 0)
    kv_len = kv_lens.to(torch.int64)[req]
    if qo_offset_value is not None:
        pos = qo_offset_value + local
    elif qo_offset is not None:
        pos = qo_offset.to(torch.int64)[req] + local
    else:
        pos = kv_len - q_len + local
    nkeys = num_k_tiles * MSA_BLOCK
    keys = torch.arange(nkeys, device=dev, dtype=torch.int64)
    kf = k.float()
    qf = q.float()
    heads_kv = torch.arange(Hq, device=dev) // ratio
    step = max(1, _CHUNK_ELEMS // max(1, Hq * nkeys))
    for t0 in range(0, total_q, step):
        t1 = min(total_q, t0 + step)
        r = req[t0:t1]
        visible = (keys[None, :] < kv_len[t0:t1, None]) & covered[t0:t1, None]
        if causal:
            visible &= keys[None, :] <= pos[t0:t1, None]
        if layout == LAYOUT_DENSE:
            start = cu_seqlens_k.to(torch.int64)[r][:, None]
            row = start + keys[None, :]
            # keys past k's rows are skipped, and a range starting before its first row sees none (the kernel's)
            visible &= (start >= 0) & (row < k.shape[0])
            row = torch.where(visible, row, torch.zeros_like(row))
            kk = kf[row]  # [n, keys, Hkv, D]
        else:
            blk = (keys // MSA_BLOCK)[None, :].expand(t1 - t0, -1)
            page = block_pages(blk, r, page_table, kv_indices, kv_page_indptr)
            visible &= (page >= 0) & (page < k.shape[0])  # a missing or out-of-range page is skipped
            page = torch.where(visible, page, torch.zeros_like(page))
            slot = (keys % MSA_BLOCK)[None, :].expand_as(page)
            if layout == LAYOUT_TOKEN_MAJOR:
                kk = kf[page, slot]  # [n, keys, Hkv, D]
            else:
                kk = kf[page, :, slot]  # [n, keys, Hkv, D]
        kk = kk[:, :, heads_kv]  # [n, keys, Hq, D]
        s = torch.einsum("nhd,nkhd->nhk", qf[t0:t1], kk)
        s = torch.where(visible[:, None, :], s, torch.full_like(s, float("-inf")))
        out[t0:t1] = s.view(t1 - t0, Hq, num_k_tiles, MSA_BLOCK).amax(dim=3)
    return out


def valid_block_counts(total_q: int, tiles: int, num_valid_pages: int, query_positions: torch.Tensor | None,
                       device: torch.device) -> torch.Tensor:
    """int64 ``[total_q]``: the number n of blocks a token may select."""
    n = torch.full((total_q,), num_valid_pages, dtype=torch.int64, device=device)
    if query_positions is not None:
        pos = query_positions.to(torch.int64)
        n = torch.where(pos < 0, torch.zeros_like(n), torch.minimum(n, torch.div(pos, MSA_BLOCK,
                                                                                  rounding_mode="floor") + 1))
    return n


def topk_select_reference(
    max_score: torch.Tensor,
    *,
    query_positions: torch.Tensor | None,
    num_valid_pages: int,
    topk: int,
    force_begin_blocks: int,
    force_end_blocks: int,
    force_blocks_count_in_topk: bool,
) -> torch.Tensor:
    """int32 ``[total_q, H, W]`` by stable sorts (see ``sparse_topk_select``).

    Order of candidates: group (forced first when counted in the top-k), then NaN first,
    then score descending (-0.0 equals 0.0), then block index ascending.
    """
    total_q, H, T = max_score.shape
    dev = max_score.device
    counted = force_blocks_count_in_topk
    width = topk if counted else topk + force_begin_blocks + force_end_blocks
    n = valid_block_counts(total_q, T, num_valid_pages, query_positions, dev)[:, None, None]
    idx = torch.arange(T, device=dev, dtype=torch.int64).view(1, 1, T).expand(total_q, H, T)
    valid = idx < n
    forced = valid & ((idx < force_begin_blocks) | (idx >= n - force_end_blocks))
    s = max_score.float()
    nan = torch.isnan(s)
    s = torch.where(nan | (s == 0), torch.zeros_like(s), s)
    # stable sorts, least significant key first; the initial order is the block index
    order = torch.sort(s, dim=2, descending=True, stable=True).indices
    order = order.gather(2, torch.sort(nan.gather(2, order).to(torch.int8), dim=2, descending=True,
                                       stable=True).indices)
    # group: 0 = forced (counted) / 1 = candidate / 2 = never chosen by score
    group = torch.where(forced, 0 if counted else 2, 1)
    group = torch.where(valid, group, torch.full_like(group, 2))
    order = order.gather(2, torch.sort(group.gather(2, order), dim=2, stable=True).indices)
    chosen = torch.zeros((total_q, H, T), dtype=torch.bool, device=dev)
    k_take = min(topk, T)
    top = order[:, :, :k_take]
    chosen.scatter_(2, top, torch.ones_like(top, dtype=torch.bool))
    chosen = (chosen & (group < 2)) | forced
    chosen = torch.where((n <= width).expand(total_q, H, T), valid, chosen)
    key = torch.where(chosen, idx, torch.full_like(idx, T))
    sel = torch.sort(key, dim=2).values[:, :, :width]
    res = torch.full((total_q, H, width), -1, dtype=torch.int32, device=dev)
    w = min(width, T)
    res[:, :, :w] = torch.where(sel[:, :, :w] < T, sel[:, :, :w], torch.full_like(sel[:, :, :w], -1)).to(torch.int32)
    return res
