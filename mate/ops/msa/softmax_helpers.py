"""Pieces shared by the MSA attention kernels (prefill/heads-on-M and transposed decode):
the visible key range of a query, a program's slice of the selected-block list and the merge
of split partial results (the softmax's finish is ``mate._core.triton_helpers.finish_softmax``).
Inlined by Triton."""

from __future__ import annotations

import triton
import triton.language as tl

from mate._core.triton_helpers import to_out_dtype

__all__ = ["merge_split_partials", "split_entries", "token_position", "visible_limit"]


@triton.jit
def visible_limit(pos, kv_len, CAUSAL: tl.constexpr):
    """Last key position a query sees: ``kv_len - 1``, capped at its own position if causal."""
    limit = kv_len - 1
    if CAUSAL:
        limit = tl.minimum(limit, pos)
    return limit


@triton.jit
def split_entries(cnt, split, NUM_SPLITS: tl.constexpr):
    """[e0, e1): the entries of a ``cnt``-long block list that split ``split`` handles."""
    if NUM_SPLITS == 1:
        e0 = 0
        e1 = cnt
    else:
        chunk = (cnt + NUM_SPLITS - 1) // NUM_SPLITS
        e0 = split * chunk
        e1 = tl.minimum(cnt, e0 + chunk)
    return e0, e1


@triton.jit
def token_position(q_off, t, q_start, kv_len):
    """(position, block count) of token ``t`` of a request starting at query row ``q_start``
    with ``kv_len`` keys: ``q_off + t - q_start`` in int64, clamped to [-1, kv_len] (the same
    visibility: a position at or past the keys sees them all, a negative one none), so that
    adversarial offsets cannot wrap; ``ceil(kv_len / 128)`` without overflow."""
    pos = q_off.to(tl.int64) + t - q_start
    pos = tl.minimum(tl.maximum(pos, -1), kv_len).to(tl.int32)
    return pos, kv_len // 128 + (kv_len % 128 != 0).to(tl.int32)


@triton.jit
def merge_split_partials(op_ptr, lp_ptr, o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh, t, h, hv,
                         total_q, HQ, v_scale, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
                         L2_ONLY: tl.constexpr):
    """Merges the ``NUM_SPLITS`` partial results of query row ``t``, heads ``h`` (mask ``hv``):
    partial outputs ``op_ptr`` [splits, total_q, HQ, HEAD_DIM] (each normalized by its own
    denominator) and natural-log LSEs ``lp_ptr`` [splits, total_q, HQ] into ``o`` (times
    ``v_scale``, o's dtype) and ``lse``; a row no split saw gets zeros and -inf. ``L2_ONLY``:
    read the partials from L2 (``.cg``), for a program that merges what other programs of the
    same launch wrote (L1 is not coherent across SMs)."""
    CACHE: tl.constexpr = ".cg" if L2_ONLY else ""
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full(h.shape, float("-inf"), dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        ls = tl.load(lp_ptr + (s * total_q + t).to(tl.int64) * HQ + h, mask=hv, other=float("-inf"),
                     cache_modifier=CACHE)
        m = tl.maximum(m, ls)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    den = tl.zeros(h.shape, dtype=tl.float32)
    acc = tl.zeros([h.shape[0], HEAD_DIM], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        row = (s * total_q + t).to(tl.int64) * HQ + h
        ls = tl.load(lp_ptr + row, mask=hv, other=float("-inf"), cache_modifier=CACHE)
        wgt = tl.exp(ls - m_use)
        os_ = tl.load(op_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=hv[:, None], other=0.0,
                      cache_modifier=CACHE)
        acc += wgt[:, None] * os_
        den += wgt
    empty = den == 0.0
    den_safe = tl.where(empty, 1.0, den)
    o = acc / den_safe[:, None] * v_scale
    lse = tl.where(empty, float("-inf"), m_use + tl.log(den_safe))
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
             to_out_dtype(o, o_ptr.dtype.element_ty), mask=hv[:, None])
    tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=hv)
