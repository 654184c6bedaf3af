"""Pieces shared by the MSA attention kernels (prefill/heads-on-M and transposed decode):
the visible key range of a query and a program's slice of the selected-block list (the
softmax's finish is ``mate._core.triton_helpers.finish_softmax``). Inlined by Triton."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["split_entries", "token_position", "visible_limit"]


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
