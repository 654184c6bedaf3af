"""Triton prefill attention over ragged dense K/V with TMA tiles (Hopper), for
``mate.mha_interface``'s varlen path.

One program owns BLOCK_M query tokens of one request and one query head; K and V tiles of
its KV head stream in through TMA descriptors over 2D views ``[tokens, heads * D]`` (the
pipeliner keeps ``stages`` tiles in flight). The key loop runs in two parts: the tiles every
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

from mate._core.triton_helpers import INTERPRET, cdiv, dot_operand, finish_softmax, online_softmax_step, to_out_dtype

__all__ = ["PREFILL_TMA", "prefill_tma_supported", "attention_prefill_tma"]

PREFILL_TMA = {"enabled": True, "block_m": 64, "block_n": 64, "warps": 4, "stages": 3, "min_seqlen_q": 128}
"""Ragged-prefill kernel settings: ``enabled`` (``attention_triton`` routes eligible calls
here), tile rows / keys, warps, pipelining stages, and the longest query below which the
packed-heads kernel of ``attention.py`` keeps the call (it fills MMA rows with GQA heads; the
crossover is not measured). ``MATE_MHA_PREFILL_TMA="block_n=128,stages=2"`` updates these keys
at import.

H200, session 26 (``benchmarks/probe_mha_prefill_tma.py``, bf16, interleaved, us): 64x64 tiles on
4 warps with 3 stages (112 KB of shared memory: two programs per SM) against the packed-heads
kernel and one cuDNN SDPA call per sequence: 8 x 2048 causal, 32 heads, d 128: 640.2 against
878.9 and 673.8; the same with 32 / 8 heads 627.6 / 816.4 / 664.5; non-causal 1148.8 / 1560.6 /
885.5; a ragged batch of 8 lengths 100-7000 (32 / 8 heads) 1184.5 / 1502.1 / 1071.6; one 16K
causal sequence with the LSE 4204.0 / 6002.9; d 64 (32 / 8 heads) 411.4 / 482.1 / 467.0 (2
stages 393.3). Other tiles, 8 x 2048 causal: 128x64 on 8 warps 778.6-792.0, 128x128 2-3 stages
745.0-835.1, 64x64 with 2 stages 786.3, with 4 (one program per SM) 935.1, 64x128 1064.8."""


def _env_overrides(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, val = item.partition("=")
        if key.strip() not in PREFILL_TMA:
            raise ValueError(f"MATE_MHA_PREFILL_TMA: unknown key {key.strip()!r} (known: {sorted(PREFILL_TMA)})")
        out[key.strip()] = bool(int(val)) if key.strip() == "enabled" else int(val)
    return out


PREFILL_TMA.update(_env_overrides(os.environ.get("MATE_MHA_PREFILL_TMA", "")))


@triton.jit
def _tile(q, k_desc, v_desc, k_row, n0, kcol, rows, m_i, l_i, acc, qk_scale, key_lo, key_hi, right_bound,
          BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Keys [n0, n0 + BLOCK_N) of the request into the online softmax. MASKED: a key counts
    when key_lo <= n < key_hi and (HAS_RIGHT) n <= right_bound[row]."""
    kt = k_desc.load([k_row + n0, kcol])
    s = tl.dot(q, tl.trans(dot_operand(kt))) * qk_scale
    if MASKED:
        n = n0 + tl.arange(0, BLOCK_N)
        vis = ((n >= key_lo) & (n < key_hi))[None, :] & (rows >= 0)[:, None]
        if HAS_RIGHT:
            vis = vis & (n[None, :] <= right_bound[:, None])
        s = tl.where(vis, s, float("-inf"))
    m_new, p, alpha, l_i = online_softmax_step(s, m_i, l_i)
    vt = v_desc.load([k_row + n0, kcol])
    acc = acc * alpha[:, None] + tl.dot(dot_operand(p.to(vt.dtype)), dot_operand(vt))
    return m_new, l_i, acc


@triton.jit
def _mha_prefill_tma_kernel(
    q_desc, k_desc, v_desc, o_ptr, stride_ot, stride_oh, lse_ptr, stride_lh, stride_lt,
    cu_q_ptr, cu_k_ptr, RATIO, qk_scale, window_right, q_rows, k_rows,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SKIP_WHOLE: tl.constexpr,
):
    mblk = tl.num_programs(0) - 1 - tl.program_id(0)  # the last (longest causal) query blocks first
    req = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // RATIO
    q_start = tl.load(cu_q_ptr + req)
    q_len = tl.load(cu_q_ptr + req + 1) - q_start
    m0 = mblk * BLOCK_M
    if m0 >= q_len:
        return
    k_start = tl.load(cu_k_ptr + req)
    k_len = tl.load(cu_k_ptr + req + 1) - k_start
    if SKIP_WHOLE:  # noqa: SIM102 (a constexpr guard): the caller computed a request spanning q and k whole
        if (q_start == 0) & (q_len == q_rows) & (k_start == 0) & (k_len == k_rows):
            return
    # the block's rows inside q (64-bit: adversarial offsets); a block wholly outside q does nothing
    q_row = q_start.to(tl.int64) + m0
    if (q_row >= q_rows) | (q_row + BLOCK_M <= 0):
        return
    k_len = tl.minimum(k_len, 1 << 30)  # as attention.py: no cache holds more keys
    # the request's keys inside k: [key_lo, key_hi)
    key_lo = tl.minimum(tl.maximum(-k_start.to(tl.int64), 0), 1 << 30).to(tl.int32)
    key_hi = tl.maximum(tl.minimum(k_len.to(tl.int64), k_rows - k_start.to(tl.int64)), 0).to(tl.int32)
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
    for n0 in range(lo, full_hi, BLOCK_N):
        m_i, l_i, acc = _tile(q, k_desc, v_desc, k_start, n0, kcol, rows_m, m_i, l_i, acc, qk_scale, key_lo,
                              key_hi, right_bound, BLOCK_N, False, HAS_RIGHT)
    for n0 in range(full_hi, hi, BLOCK_N):
        m_i, l_i, acc = _tile(q, k_desc, v_desc, k_start, n0, kcol, rows_m, m_i, l_i, acc, qk_scale, key_lo,
                              key_hi, right_bound, BLOCK_N, True, HAS_RIGHT)
    l_safe, lse = finish_softmax(m_i, l_i)
    offs_d = tl.arange(0, HEAD_DIM)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + t[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             to_out_dtype(o, o_ptr.dtype.element_ty), mask=rvalid[:, None])
    tl.store(lse_ptr + h.to(tl.int64) * stride_lh + t * stride_lt, lse, mask=rvalid)


def _tma_view_ok(x: torch.Tensor) -> bool:
    """x [tokens, heads, D] as a 2D TMA view [tokens, heads * D]: heads and D packed, 16-byte
    aligned base and row stride."""
    es = x.element_size()
    return (x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.data_ptr() % 16 == 0
            and (x.stride(0) * es) % 16 == 0 and x.shape[0] > 0)


def prefill_tma_supported(q, k, v, *, max_seqlen_q: int, cu_seqlens_k, seqused_k, page_table, batched: bool,
                          window_left: int) -> bool:
    """Whether ``attention_triton``'s call can run this kernel: ragged dense K/V (``cu_seqlens_k``,
    no ``seqused_k``), no left window, fp16/bf16, D 64 or 128, TMA-compatible views, prefill-sized
    queries, a CUDA device (or the interpreter)."""
    return (PREFILL_TMA["enabled"] and cu_seqlens_k is not None and seqused_k is None and page_table is None
            and not batched and window_left < 0 and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[2] in (64, 128) and max_seqlen_q >= PREFILL_TMA["min_seqlen_q"]
            and (q.is_cuda or INTERPRET) and all(_tma_view_ok(x) for x in (q, k, v)))


def attention_prefill_tma(q, k, v, out, lse, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, softmax_scale: float,
                          window_right: int, skip_whole: bool) -> None:
    """Launches ``_mha_prefill_tma_kernel`` (arguments as ``attention_triton``'s; the caller
    checked :func:`prefill_tma_supported`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    total_q, hq, d = q.shape
    hkv = k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    cfg = PREFILL_TMA
    bm, bn = int(cfg["block_m"]), int(cfg["block_n"])
    q_desc = TensorDescriptor(q, [total_q, hq * d], [q.stride(0), 1], [bm, d])
    k_desc = TensorDescriptor(k, [k.shape[0], hkv * d], [k.stride(0), 1], [bn, d])
    v_desc = TensorDescriptor(v, [v.shape[0], hkv * d], [v.stride(0), 1], [bn, d])
    window_right = min(window_right, (1 << 30) - 1)
    grid = (cdiv(min(max_seqlen_q, total_q), bm), batch, hq)
    _mha_prefill_tma_kernel[grid](
        q_desc, k_desc, v_desc, out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1),
        cu_seqlens_q, cu_seqlens_k, hq // hkv, softmax_scale * 1.4426950408889634, window_right, total_q, k.shape[0],
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, HAS_RIGHT=window_right >= 0, SKIP_WHOLE=skip_whole,
        num_warps=int(cfg["warps"]), num_stages=1 if INTERPRET else int(cfg["stages"]),
    )
