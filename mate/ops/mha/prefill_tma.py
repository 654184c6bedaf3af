"""Triton prefill attention with TMA tiles (Hopper) for ``mate.mha_interface``: ragged,
batched or paged K/V (``seqused_k`` included).

One program owns BLOCK_M query tokens of one request and one query head; K and V tiles of
its KV head stream in through TMA descriptors (the pipeliner keeps ``stages`` tiles in
flight): over 2D views ``[tokens, heads * D]`` of ragged or batched K/V, or over a paged cache
``[pages, page_size, heads, D]`` whose page size is a multiple of the key tile, each tile's
page looked up one tile ahead. The key loop runs in two parts: the tiles every
valid row sees whole, without masks, then the rest (the causal diagonal or right window, the
request's last partial tile, keys outside the tensors) with masks. Programs take their query
blocks last first, so the longest causal rows start first. Rows outside the request or the
tensor are computed on whatever the tile holds (TMA fills outside the tensor with zeros) and
never stored; key rows outside the request are masked out of the softmax.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from mate._core.env import config_overrides
from mate._core.hopper import GRID_X_MAX, GRID_YZ_MAX, tma_aligned
from mate._core.launch import launcher
from mate._core.triton_helpers import INTERPRET, cdiv, dot_operand, finish_softmax, online_softmax_step, to_out_dtype

__all__ = ["PREFILL_TMA", "VIRTUAL_MAX_BATCH", "prefill_stages", "prefill_tma_supported", "attention_prefill_tma",
           "request_queries", "use_virtual_grid", "virtual_block", "virtual_grid_blocks"]

PREFILL_TMA = {"enabled": True, "block_m": 64, "block_n": 64, "warps": 4, "stages": 3, "stages_d64": 2,
               "min_seqlen_q": 64, "heads_inner": True, "split_short": True, "virtual_grid": 8}
"""Ragged-prefill kernel settings: ``enabled`` (``attention_triton`` routes eligible calls
here), tile rows / keys, warps, pipelining stages (``stages_d64`` for head dim 64), the grid
order (``heads_inner``: the query heads of a query block launched next to each other, else a
head's blocks), and the longest query below which the packed-heads kernel of ``attention.py``
keeps the call (it fills MMA rows with GQA heads and reads a KV head's keys once; this kernel
reads them once per query head, from L2 when the heads of a KV head run together).

``split_short``: in a ragged batch that this kernel takes, the requests with fewer than
``min_seqlen_q`` queries (decode rows mixed into a prefill) go to the packed-heads kernel, each
kernel skipping the other's requests on the device (no host sync); the packed-heads kernel then
runs two launches, the decode rows (one query) and the longer requests, so that decode rows keep
decode tiles (also when this kernel does not take the call). ``virtual_grid``: a ragged batch's
query blocks on one grid axis (:func:`virtual_block`) when a block axis per request would be at
least this many times longer (0: never), its programs for short requests mostly returning at once,
each holding one of an SM's two slots while it does; the search for its block costs each program
of the one axis a few percent where few programs would idle (see below).
``MATE_MHA_PREFILL_TMA="block_n=128,stages=2"`` updates these keys at import.

Mixed batches (H200, session 27, ``PROBE_MIXED=1``: decode rows and prefill chunks, each at the
end of an 8K context in shuffled 128-key pages, causal, d 128; one call / ``virtual_grid`` off /
without ``split_short`` / the packed-heads kernel alone / the caller's two calls, us): 64 decode
rows + a 2048-query chunk, 64 / 4 heads: 1386.8 / 1486.4 / 3354.7 / 2639.7 / 1364.2; 128 + two
512-query chunks: 1110.6 / 1176.0 / 5289.0 / 1819.3 / 1087.9; 127 + 2048, 32 / 8 heads: 1521.7 /
1622.4 / 2937.6 / 2351.1 / 1502.8; 16 + 4096: 1173.3 / 1207.4 / 1181.5 / 2519.4 / 1161.5. A
decode class of the requests that fill the 16-row tile (4 queries at 32 / 8) ran the 127 decode
rows in 1105.0 us against 977.7 for a decode call in the same run (one-query class: 956.4 against
955.8): 136 registers against 128, three programs per SM instead of four. The split's
two extra launches cost 3-4 us where nothing is split (8 x 2048: 644.4 against 640.0). On the
ragged batch below (880 per-request blocks against 263 on one axis) one axis took 1200.7 /
1204.9 / 1257.2 us against 1166.6 / 1172.7 / 1225.9 in three calls, in pages of 64 1244.0 /
1259.8 / 1303.1 against 1297.9 / 1283.7 / 1288.6, whether the axis ran request by request or
the last blocks of every request first; the mixed batches above have 16 to 127 times more
per-request blocks than blocks, hence the factor 8.

Chunked prefill (H200, session 26, ``PROBE_CHUNKS=1``: q_len new queries at the end of an 8K
context in shuffled 128-key pages, 64 / 4 heads, d 128, causal; packed-heads / this kernel /
this kernel with ``heads_inner``, us): q_len 16 (B=256) 5976.5 / 15392.8 / 10900.6, 64 (B=64)
5768.1 / 3175.3 / 2545.4, 128 (B=32) 5471.0 / 2495.0 / 2380.4, 256 (B=16) 5187.6 / 2344.8 /
2305.3, 1024 (B=4) 4857.2 / 2180.4 / 2213.9; on the cases below ``heads_inner`` moved the time
by -2.4% to +2.6%. Before ``split_short``, a batch that mixed decode requests into a prefill ran
them here too (its longest query decided), at the q_len 16 row's cost per decode query.

H200, session 26 (``benchmarks/probe_mha_prefill_tma.py``, bf16, interleaved, us): 64x64 tiles on
4 warps with 3 stages (112 KB of shared memory: two programs per SM) against the packed-heads
kernel and one cuDNN SDPA call per sequence: 8 x 2048 causal, 32 heads, d 128: 640.2 against
878.9 and 673.8; the same with 32 / 8 heads 627.6 / 816.4 / 664.5; non-causal 1148.8 / 1560.6 /
885.5; a ragged batch of 8 lengths 100-7000 (32 / 8 heads) 1184.5 / 1502.1 / 1071.6; one 16K
causal sequence with the LSE 4204.0 / 6002.9; d 64 (32 / 8 heads) 411.4 / 482.1 / 467.0 (2
stages 393.3; session 27, three calls: 2 stages 385.1 / 389.0 / 389.3 against 3 stages 405.8 /
410.8 / 410.0, cuDNN per sequence 468.1 / 472.2 / 471.9, so ``stages_d64`` is 2; at d 128 2
stages lost: non-causal 1493.2 against 1166.7, the ragged batch 1338.4 against 1184.7). Other
tiles, 8 x 2048 causal: 128x64 on 8 warps 778.6-792.0, 128x128 2-3 stages 745.0-835.1, 64x64
with 2 stages 786.3, with 4 (one program per SM) 935.1, 64x128 1064.8.
Without the causal mask (session 27, 8 x 2048, 32 heads) the default tile stays the fastest:
1166.7-1170.4 us against 128x64 on 8 warps 1333.9-1344.8, 128x128 (2 stages) 1483.6-1496.3,
64x128 1896.9-1923.5 (cuDNN per sequence 874.9-883.2).
Paged caches (the same keys in shuffled pages, ``seqused_k``): 8 x 2048 causal, 32 / 8 heads,
pages of 128: 679.0 us against 1492.5 on the packed-heads kernel (cuDNN on the contiguous keys
664.2); the ragged batch in pages of 64: 1248.9 against 2860.4 (1063.1)."""


VIRTUAL_MAX_BATCH = 2048
"""Most requests (plus one) whose ``cu_seqlens_q`` one program loads whole to find its block's
request (:func:`virtual_block`); larger batches keep a grid axis per request."""


def _env_overrides(text: str) -> dict:
    """``key=value,...`` -> PREFILL_TMA updates (flags as 0 / 1, the rest ints)."""
    return config_overrides("MATE_MHA_PREFILL_TMA", text, PREFILL_TMA)


PREFILL_TMA.update(_env_overrides(os.environ.get("MATE_MHA_PREFILL_TMA", "")))


@triton.jit
def request_queries(cu_q_ptr, req, q_uniform, HAS_CU_Q: tl.constexpr):
    """(first query row, query count) of request ``req``: from ``cu_seqlens_q``, or (not HAS_CU_Q)
    ``q_uniform`` queries per request."""
    if HAS_CU_Q:
        q_start = tl.load(cu_q_ptr + req)
        return q_start, tl.load(cu_q_ptr + req + 1) - q_start
    else:
        return req * q_uniform, q_uniform


@triton.jit
def virtual_block(cu_q_ptr, vblk, batch, q_rows, q_len_min, q_len_max, n_mblk, TOKENS: tl.constexpr,
                  BLOCK_B: tl.constexpr):
    """(request, query block, first row, query count) of block ``vblk`` of a ragged batch whose
    blocks are numbered one after another: the blocks of TOKENS queries with a row inside q
    (rows 0 .. ``q_rows`` - 1; at most ``n_mblk`` per request) of each request of ``q_len_min``
    to ``q_len_max`` queries, in request order. One vector load of ``cu_seqlens_q`` (``batch`` + 1
    <= BLOCK_B entries); request -1 past the last block. A request's blocks keep their numbers
    within it (the first may be > 0 when it starts before row 0)."""
    b = tl.arange(0, BLOCK_B)
    cu = tl.load(cu_q_ptr + b, mask=b <= batch, other=0).to(tl.int64)
    cu_next = tl.load(cu_q_ptr + b + 1, mask=b < batch, other=0).to(tl.int64)
    q_len = cu_next - cu
    take = (b < batch) & (q_len >= q_len_min) & (q_len <= q_len_max) & (q_len > 0)
    j0 = tl.maximum(-cu, 0) // TOKENS  # blocks wholly before row 0
    end = tl.minimum(tl.maximum(tl.minimum(cu_next, q_rows) - cu, 0), n_mblk * TOKENS)
    n_blk = tl.where(take, tl.maximum((end + TOKENS - 1) // TOKENS - j0, 0), 0)
    first = tl.cumsum(n_blk, axis=0) - n_blk
    req = tl.max(tl.where((first <= vblk) & (n_blk > 0), b, -1), axis=0)
    mine = b == req
    off = vblk - tl.sum(tl.where(mine, first, 0), axis=0)
    req = tl.where(off < tl.sum(tl.where(mine, n_blk, 0), axis=0), req, -1)
    mblk = tl.sum(tl.where(mine, j0, 0), axis=0) + off
    return (req, mblk.to(tl.int32), tl.sum(tl.where(mine, cu, 0), axis=0).to(tl.int32),
            tl.sum(tl.where(mine, q_len, 0), axis=0).to(tl.int32))


def use_virtual_grid(cu_seqlens_q, batch: int, n_mblk: int, n_virtual: int, axis_limit: int = GRID_X_MAX) -> bool:
    """Whether a launch over ``batch`` ragged requests of up to ``n_mblk`` blocks each takes the
    one axis of ``n_virtual`` blocks (``PREFILL_TMA["virtual_grid"]``; ``axis_limit``: the most
    programs the grid axis it goes on takes, 65535 on y and z)."""
    gain = int(PREFILL_TMA["virtual_grid"])
    return (gain > 0 and cu_seqlens_q is not None and batch + 1 <= VIRTUAL_MAX_BATCH
            and n_mblk * batch >= gain * n_virtual and n_virtual <= axis_limit)


def virtual_grid_blocks(total_q: int, batch: int, tokens: int, q_len_min: int) -> int:
    """Blocks :func:`virtual_block` numbers at most: each request of ``q_len_min`` queries or more
    with rows inside q adds its rows there / ``tokens``, plus one for its partial block; the first
    and the last may also straddle q's ends."""
    requests = min(batch, total_q // max(q_len_min, 1) + 2)
    return total_q // tokens + requests + 2


@triton.jit
def _page(page_table_ptr, req, stride_pt, n_cols, n0, PAGE_SIZE: tl.constexpr):
    """The page holding key ``n0`` of request ``req`` (-1 past the table's ``n_cols`` pages)."""
    return tl.load(page_table_ptr + req.to(tl.int64) * stride_pt + n0 // PAGE_SIZE, mask=n0 // PAGE_SIZE < n_cols,
                   other=-1)


@triton.jit
def _kv_load(desc, k_row, n0, kcol, kvh, page, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
             PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The [BLOCK_N, HEAD_DIM] tile of keys n0.. of one KV head: rows ``k_row + n0`` of a 2D view
    [tokens, heads * D], or (PAGED) offset n0 % PAGE_SIZE of ``page`` of a [pages, PAGE_SIZE, heads,
    D] cache."""
    if PAGED:
        return tl.reshape(desc.load([page, n0 % PAGE_SIZE, kvh, 0]), [BLOCK_N, HEAD_DIM])
    else:
        return desc.load([k_row + n0, kcol])


@triton.jit
def _tile(q, k_desc, v_desc, k_row, n0, kcol, kvh, page, num_pages, rows, m_i, l_i, acc, qk_scale, key_lo, key_hi,
          right_bound, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, HAS_RIGHT: tl.constexpr,
          PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Keys [n0, n0 + BLOCK_N) of the request into the online softmax. MASKED: a key counts
    when key_lo <= n < key_hi and (HAS_RIGHT) n <= right_bound[row]. PAGED: a tile in a page
    outside the cache counts for nothing (its page 0 is read instead)."""
    if PAGED:
        page_ok = (page >= 0) & (page < num_pages)
        page = tl.where(page_ok, page, 0)
    kt = _kv_load(k_desc, k_row, n0, kcol, kvh, page, BLOCK_N, HEAD_DIM, PAGED, PAGE_SIZE)
    s = tl.dot(q, tl.trans(dot_operand(kt))) * qk_scale
    if MASKED:
        n = n0 + tl.arange(0, BLOCK_N)
        vis = ((n >= key_lo) & (n < key_hi))[None, :] & (rows >= 0)[:, None]
        if HAS_RIGHT:
            vis = vis & (n[None, :] <= right_bound[:, None])
        s = tl.where(vis, s, float("-inf"))
    if PAGED:
        s = tl.where(page_ok, s, float("-inf"))
    m_new, p, alpha, l_i = online_softmax_step(s, m_i, l_i)
    vt = _kv_load(v_desc, k_row, n0, kcol, kvh, page, BLOCK_N, HEAD_DIM, PAGED, PAGE_SIZE)
    acc = acc * alpha[:, None] + tl.dot(dot_operand(p.to(vt.dtype)), dot_operand(vt))
    return m_new, l_i, acc


@triton.jit
def _mha_prefill_tma_kernel(
    q_desc, k_desc, v_desc, o_ptr, stride_ot, stride_oh, lse_ptr, stride_lh, stride_lt,
    cu_q_ptr, cu_k_ptr, seqused_k_ptr, page_table_ptr, stride_pt, n_cols, num_pages,
    RATIO, qk_scale, window_right, q_rows, k_rows, q_uniform, k_uniform, min_q, batch, n_mblk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SKIP_WHOLE: tl.constexpr, HAS_CU_Q: tl.constexpr = True, HAS_CU_K: tl.constexpr = True,
    HAS_SEQUSED: tl.constexpr = False, PAGED: tl.constexpr = False, PAGE_SIZE: tl.constexpr = 1,
    HEADS_INNER: tl.constexpr = False, BLOCK_B: tl.constexpr = 0,
):
    # the last (longest causal) query blocks first; HEADS_INNER: the query heads of one block
    # next to each other in launch order, so the heads of a KV head read its tiles from L2
    if HEADS_INNER:
        h = tl.program_id(0)
        blk = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        blk = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(2)
    kvh = h // RATIO
    if BLOCK_B > 0:  # one grid axis over the query blocks of the batch's requests (virtual_block)
        req, mblk, q_start, q_len = virtual_block(cu_q_ptr, blk, batch, q_rows, min_q, 2147483647, n_mblk,
                                                  BLOCK_M, BLOCK_B)
        if req < 0:
            return
    else:
        req = tl.program_id(2) if HEADS_INNER else tl.program_id(1)
        mblk = blk
        q_start, q_len = request_queries(cu_q_ptr, req, q_uniform, HAS_CU_Q)
    m0 = mblk * BLOCK_M
    if (m0 >= q_len) | (q_len < min_q):  # fewer than min_q queries: the packed-heads kernel's request
        return
    if HAS_CU_K:  # ragged: rows k_start.. of k
        k_start = tl.load(cu_k_ptr + req)
        k_len = tl.load(cu_k_ptr + req + 1) - k_start
    else:  # batched (rows req * k_rows.. of the [B * S] view, k_rows = S) or paged (k_start unused)
        k_start = req * k_rows
        k_len = k_uniform
    if SKIP_WHOLE:  # noqa: SIM102 (a constexpr guard): the caller computed a request spanning q and k whole
        if (q_start == 0) & (q_len == q_rows) & (k_start == 0) & (k_len == k_rows):
            return
    if HAS_SEQUSED:
        k_len = tl.load(seqused_k_ptr + req)
    # the block's rows inside q (64-bit: adversarial offsets); a block wholly outside q does nothing
    q_row = q_start.to(tl.int64) + m0
    if (q_row >= q_rows) | (q_row + BLOCK_M <= 0):
        return
    k_len = tl.minimum(k_len, 1 << 30)  # as attention.py: no cache holds more keys
    # the request's keys inside k (the table): [key_lo, key_hi)
    if PAGED:
        key_lo = 0
        key_hi = tl.maximum(tl.minimum(k_len.to(tl.int64), PAGE_SIZE * n_cols.to(tl.int64)), 0).to(tl.int32)
    elif HAS_CU_K:
        key_lo = tl.minimum(tl.maximum(-k_start.to(tl.int64), 0), 1 << 30).to(tl.int32)
        key_hi = tl.maximum(tl.minimum(k_len.to(tl.int64), k_rows - k_start.to(tl.int64)), 0).to(tl.int32)
    else:
        key_lo = 0
        key_hi = tl.maximum(tl.minimum(k_len, k_rows), 0)
    rows = m0 + tl.arange(0, BLOCK_M)
    t = q_start.to(tl.int64) + rows
    rvalid = (rows < q_len) & (t >= 0) & (t < q_rows)
    rows_m = tl.where(rvalid, rows, -1)  # -1: a row nothing is visible to
    right_bound = rows + (k_len - q_len) + window_right  # bottom-right aligned (causal: window_right 0)
    last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    hi = key_hi
    full_end = key_hi
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum(last + (k_len - q_len) + window_right + 1, 0))
        full_end = tl.minimum(full_end, tl.maximum(m0 + (k_len - q_len) + window_right + 1, 0))
    lo = (key_lo // BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(lo, (full_end // BLOCK_N) * BLOCK_N)
    full_hi = tl.where((key_lo > 0) | (q_row < 0), lo, full_hi)  # keys before row 0 or rows before q: masked
    q = dot_operand(q_desc.load([q_row.to(tl.int32), h * HEAD_DIM]))
    kcol = kvh * HEAD_DIM
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # PAGED: each tile's page is loaded one tile ahead (a loop-carried coordinate lets the
    # pipeliner give the TMA loads their stages); the last valid tile's page stands in past the end
    n_last = tl.maximum(hi - 1, 0)
    for masked in tl.static_range(2):  # 0: the tiles every row sees whole [lo, full_hi), 1: [full_hi, hi)
        n_start = lo if masked == 0 else full_hi
        page_n = 0
        if PAGED:
            page_n = _page(page_table_ptr, req, stride_pt, n_cols, tl.minimum(n_start, n_last), PAGE_SIZE)
        for n0 in range(n_start, full_hi if masked == 0 else hi, BLOCK_N):
            page = page_n
            if PAGED:
                page_n = _page(page_table_ptr, req, stride_pt, n_cols, tl.minimum(n0 + BLOCK_N, n_last), PAGE_SIZE)
            m_i, l_i, acc = _tile(q, k_desc, v_desc, k_start, n0, kcol, kvh, page, num_pages, rows_m, m_i, l_i, acc,
                                  qk_scale, key_lo, key_hi, right_bound, BLOCK_N, HEAD_DIM, masked == 1, HAS_RIGHT,
                                  PAGED, PAGE_SIZE)
    l_safe, lse = finish_softmax(m_i, l_i)
    offs_d = tl.arange(0, HEAD_DIM)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + t[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             to_out_dtype(o, o_ptr.dtype.element_ty), mask=rvalid[:, None])
    tl.store(lse_ptr + h.to(tl.int64) * stride_lh + t * stride_lt, lse, mask=rvalid)


def _tma_view_ok(x: torch.Tensor) -> bool:
    """x [tokens, heads, D] as a 2D TMA view [tokens, heads * D]: heads and D packed, 16-byte
    aligned base and row stride."""
    n, _, d = x.shape
    if n == 0:
        return False
    s0, s1, s2 = x.stride()
    return s2 == 1 and s1 == d and x.data_ptr() % 16 == 0 and (s0 * x.element_size()) % 16 == 0


def _kv_ok(x: torch.Tensor, *, paged: bool, batched: bool) -> bool:
    """K or V as the kernel reads it: a ragged [tokens, heads, D] or batched [B, S, heads, D]
    tensor as a 2D view [tokens, heads * D] (batches back to back), or a paged cache [pages,
    page_size, heads, D] whose page size is a multiple of the key tile."""
    if x.numel() == 0:
        return False
    if paged:
        return x.shape[1] % int(PREFILL_TMA["block_n"]) == 0 and tma_aligned(x)
    if batched:
        return (x.stride(0) == x.shape[1] * x.stride(1) and x.shape[0] * x.shape[1] < 2**31
                and _tma_view_ok(x.flatten(0, 1)))
    return _tma_view_ok(x)


def prefill_stages(head_dim: int) -> int:
    """Pipelining stages of the kernel's key loop at this head dim (``PREFILL_TMA``)."""
    return int(PREFILL_TMA["stages_d64" if head_dim == 64 else "stages"])


def prefill_tma_supported(q, k, v, *, max_seqlen_q: int, page_table, batched: bool, window_left: int) -> bool:
    """Whether ``attention_triton``'s call can run this kernel: fp16/bf16, D 64 or 128, no left
    window, prefill-sized queries, TMA-compatible tensors (see :func:`_kv_ok`), a CUDA device (or
    the interpreter)."""
    paged = page_table is not None
    return (PREFILL_TMA["enabled"] and window_left < 0 and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[2] in (64, 128) and max_seqlen_q >= PREFILL_TMA["min_seqlen_q"]
            and (q.is_cuda or INTERPRET) and _tma_view_ok(q)
            and all(_kv_ok(x, paged=paged, batched=batched) for x in (k, v)))


def attention_prefill_tma(q, k, v, out, lse, *, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table, batched: bool,
                          max_seqlen_q: int, softmax_scale: float, window_right: int, skip_whole: bool, batch: int,
                          k_uniform: int, min_q: int = 0) -> None:
    """Launches ``_mha_prefill_tma_kernel`` (arguments as ``attention_triton``'s; the caller
    checked :func:`prefill_tma_supported`); requests with fewer than ``min_q`` queries are
    skipped."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    total_q, hq, d = q.shape
    hkv = k.shape[-2]
    if cu_seqlens_q is not None:
        batch = cu_seqlens_q.shape[0] - 1
    cfg = PREFILL_TMA
    bm, bn = int(cfg["block_m"]), int(cfg["block_n"])
    q_desc = TensorDescriptor(q, [total_q, hq * d], [q.stride(0), 1], [bm, d])
    paged = page_table is not None
    if paged:
        k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, bn, 1, d])
        v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, bn, 1, d])
        k_rows, page_size = 0, k.shape[1]
    else:
        kf, vf = (k.flatten(0, 1), v.flatten(0, 1)) if batched else (k, v)
        k_desc = TensorDescriptor(kf, [kf.shape[0], hkv * d], [kf.stride(0), 1], [bn, d])
        v_desc = TensorDescriptor(vf, [vf.shape[0], hkv * d], [vf.stride(0), 1], [bn, d])
        k_rows, page_size = (k.shape[1] if batched else k.shape[0]), 1
    dummy = cu_seqlens_q if cu_seqlens_q is not None else lse  # for absent pointers (never read)
    window_right = min(window_right, (1 << 30) - 1)
    n_mblk = cdiv(min(max_seqlen_q, total_q), bm)
    heads_inner = bool(cfg["heads_inner"]) and n_mblk <= GRID_YZ_MAX  # else the blocks go on x
    # a ragged batch of short and long requests: one axis over the requests' query blocks, not
    # n_mblk per request, most of which would return at once (two programs fit an SM, so each
    # idle one holds a slot)
    n_virtual = virtual_grid_blocks(total_q, batch, bm, min_q)
    block_b = 0
    if use_virtual_grid(cu_seqlens_q, batch, n_mblk, n_virtual, GRID_YZ_MAX if heads_inner else GRID_X_MAX):
        block_b = max(16, triton.next_power_of_2(batch + 1))
        grid = (hq, n_virtual, 1) if heads_inner else (n_virtual, 1, hq)
    else:
        grid = (hq, n_mblk, batch) if heads_inner else (n_mblk, batch, hq)
    so, sl = out.stride(), lse.stride()
    launcher(_mha_prefill_tma_kernel)[grid](
        q_desc, k_desc, v_desc, out, so[0], so[1], lse, sl[0], sl[1],
        dummy, cu_seqlens_k if cu_seqlens_k is not None else dummy, seqused_k if seqused_k is not None else dummy,
        page_table if paged else dummy, page_table.stride(0) if paged else 0, page_table.shape[1] if paged else 0,
        k.shape[0], hq // hkv, softmax_scale * 1.4426950408889634, window_right, total_q, k_rows, max_seqlen_q,
        k_uniform, min_q, batch, n_mblk,
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, HAS_RIGHT=window_right >= 0,
        SKIP_WHOLE=skip_whole and cu_seqlens_k is not None and seqused_k is None and not paged and not batched,
        HAS_CU_Q=cu_seqlens_q is not None, HAS_CU_K=cu_seqlens_k is not None, HAS_SEQUSED=seqused_k is not None,
        PAGED=paged, PAGE_SIZE=page_size, HEADS_INNER=heads_inner, BLOCK_B=block_b,
        num_warps=int(cfg["warps"]), num_stages=1 if INTERPRET else prefill_stages(d),
    )
