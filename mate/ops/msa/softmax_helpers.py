"""Pieces shared by the MSA attention kernels (prefill/heads-on-M and transposed decode):
the visible key range of a query, a program's slice of the selected-block list, and the
final log-sum-exp of the exp2-domain online softmax. Inlined by Triton."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["finish_softmax", "split_entries", "visible_limit"]


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
def finish_softmax(m_i, l_i):
    """(denominator safe to divide by, natural-log LSE; -inf for rows that saw no key) of an
    exp2-domain online softmax with running max ``m_i`` and sum ``l_i``."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * 0.6931471805599453)
    return l_safe, lse
