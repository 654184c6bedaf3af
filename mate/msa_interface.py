"""MSA (MiniMax Sparse Attention): plans, the max-score proxy pass, top-k block selection
and the sparse / dense / paged attention entry points.

Public API at MATE's import path. Plans and planners come from
:mod:`mate.ops.msa.plan`; the max-score and top-k kernels from
:mod:`mate.ops.msa.maxscore` and :mod:`mate.ops.msa.topk` (Triton, imported lazily), with
their references in :mod:`mate.ops.msa.reference_select`. Attention itself is computed by
:mod:`mate.ops.msa.sparse_attention` (sparse modes) and :mod:`mate.mha_interface` (dense
and paged modes).

Typical selection pipeline (MiniMax-M3 indexer: one proxy query head per KV head)::

    info = _msa_plan_from_lengths(qo_lens, kv_lens, num_qo_heads=4, num_kv_heads=4,
                                  page_size=128, output_maxscore=True, device="cuda")
    _, max_score = msa(q_idx, k_cache, None, info, page_table=page_table,
                       output_o=False, output_maxscore=True)
    blocks = sparse_topk_select(max_score, 16, force_end_blocks=1,
                                force_blocks_count_in_topk=False)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import torch

from mate._core.checks import (
    byte_ranges,
    check_bool,
    check_inputs_enabled,
    check_int32,
    check_no_overlap,
    check_out_tensor,
    check_tensor,
    check_tma_aligned,
    check_value,
)
from mate._core.custom_op import mate_custom_op
from mate._core.dispatch import select_backend
from mate._core.recipe import Identity, RecipeCache, RecipeCall, call_key, recipes_usable, recorded
from mate.api_logging import mate_api
from mate.ops.msa import plan as _planner
from mate.ops.msa.plan import (
    MSA_BLOCK,
    MsaDecodePlan,
    MsaPlan,
    MsaPlanInfo,
    MsaPrefillPlan,
    MsaRuntimeMetadata,
    check_topk_config,
)

__all__ = [
    "MsaPrefillPlan",
    "MsaDecodePlan",
    "MsaPlan",
    "MsaRuntimeMetadata",
    "MsaPlanInfo",
    "_msa_plan_from_lengths",
    "msa_plan",
    "sparse_msa_plan",
    "msa",
    "sparse_msa",
    "sparse_decode_atten_func",
    "sparse_topk_select",
    "build_page_table_from_flat_kv_indices",
]

QKV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
MSA_KEYWORDS = frozenset({"sm_scale", "lse", "k_scale", "v_scale", "runtime_metadata", "page_table", "output_o",
                          "output_maxscore", "check_input_valid"})

# Page layouts of a paged K cache, as the max-score kernel sees them.
LAYOUT_DENSE, LAYOUT_TOKEN_MAJOR, LAYOUT_HEAD_MAJOR = 0, 1, 2


# ============================================================================ custom ops


@mate_custom_op("msa_max_score", mutates_args=("max_score",))
def _max_score_op(
    q: torch.Tensor,
    k: torch.Tensor,
    max_score: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor],  # noqa: UP045 - torch.library parses typing.Optional
    kv_lens: torch.Tensor,
    qo_offset: Optional[torch.Tensor],  # noqa: UP045
    page_table: Optional[torch.Tensor],  # noqa: UP045
    kv_indices: Optional[torch.Tensor],  # noqa: UP045
    kv_page_indptr: Optional[torch.Tensor],  # noqa: UP045
    qo_offset_value: int,
    has_qo_offset_value: bool,
    causal: bool,
    layout: int,
    batch_size: int,
    max_seqlen_q: int,
) -> None:
    """Flat private op: writes ``max_score`` (see :func:`mate.ops.msa.reference_select.max_score_reference`)."""
    args = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, kv_lens=kv_lens, qo_offset=qo_offset,
                page_table=page_table, kv_indices=kv_indices, kv_page_indptr=kv_page_indptr,
                qo_offset_value=qo_offset_value if has_qo_offset_value else None, causal=causal, layout=layout,
                batch_size=batch_size, max_seqlen_q=max_seqlen_q)
    if select_backend(q.device) == "triton":
        from mate.ops.msa.maxscore import max_score_triton

        max_score_triton(q, k, max_score, **args)
    else:
        from mate.ops.msa.reference_select import max_score_reference

        max_score.copy_(max_score_reference(q, k, num_k_tiles=max_score.shape[2], **args))


@mate_custom_op("msa_sparse_topk_select", mutates_args=("output",))
def _topk_select_op(
    max_score: torch.Tensor,
    output: torch.Tensor,
    query_positions: Optional[torch.Tensor],  # noqa: UP045
    num_valid_pages: int,
    topk: int,
    force_begin_blocks: int,
    force_end_blocks: int,
    force_blocks_count_in_topk: bool,
) -> None:
    """Flat private op: writes ``output`` (see :func:`mate.ops.msa.reference_select.topk_select_reference`)."""
    args = dict(query_positions=query_positions, num_valid_pages=num_valid_pages, topk=topk,
                force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
                force_blocks_count_in_topk=force_blocks_count_in_topk)
    if select_backend(max_score.device) == "triton":
        from mate.ops.msa.topk import sparse_topk_select_triton

        sparse_topk_select_triton(max_score, output, **args)
    else:
        from mate.ops.msa.reference_select import topk_select_reference

        output.copy_(topk_select_reference(max_score, **args))


# ============================================================================ planners

@mate_api
def _msa_plan_from_lengths(
    qo_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int | None = None,
    qo_offset: torch.Tensor | int | None = None,
    split_prefill_decode: bool = True,
    page_size: int = -1,
    kv_block_num: int = -1,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
    force_blocks_count_in_topk: bool = True,
    causal: bool = True,
    sparse_kernel_mode: str = "auto",
    num_kv_splits: int = -1,
    output_maxscore: bool = False,
    use_fp8_kvcache: bool = False,
    sparse_block_size: int = MSA_BLOCK,
    device: torch.device | str | None = None,
) -> MsaPlanInfo:
    """Eager MSA plan from per-request lengths held on the CPU (MATE's name for it).

    Builds the cumulative lengths, page pointers and execution mode that every
    :func:`msa` call of one forward step shares (plan once per step, reuse it in every
    layer). Planning reads the lengths on the host; executing the plan never does.

    Parameters
    ----------
    qo_lens, kv_lens : torch.Tensor
        Integer CPU tensors ``[B]``: query tokens and KV context length (in tokens) of each
        request, both ``>= 0``. Device tensors raise ``ValueError`` (reading them would be
        a hidden host sync).
    num_qo_heads : int
        Query heads ``Hq``.
    num_kv_heads : int, optional
        KV heads ``Hkv`` (default ``Hq``); ``Hq`` must be a multiple of ``Hkv``.
    qo_offset : torch.Tensor or int, optional
        Absolute position of each request's first query token (CPU ``[B]`` or one int for
        all); default ``kv_len - q_len`` (bottom-right causal alignment).
    split_prefill_decode : bool
        In ``sparse_kernel_mode="auto"``, split a decode-first batch at the first request
        whose query length exceeds 32 (sparse plans) or 128 (dense/paged plans) into a
        decode part and a prefill part (``MsaPlanInfo.has_mixed_prefill``).
    page_size : int
        ``-1``: dense ragged K/V ``[total_k, Hkv, D]``; otherwise the page size of a paged
        cache (a power of two >= 16; 128 for sparse plans and for the max-score pass).
    kv_block_num : int
        Top-k blocks per token (4, 8 or 16) for sparse execution; ``-1`` (or 0) for none.
    force_begin_blocks, force_end_blocks : int
        Blocks at the start / end of each token's visible range that are always attended
        (sparse plans only).
    force_blocks_count_in_topk : bool
        True: the forced blocks take top-k slots (row width ``kv_block_num``). False: they
        are extra (row width ``kv_block_num + force_begin_blocks + force_end_blocks``).
    causal : bool
        Causal masking, aligned by ``qo_offset``.
    sparse_kernel_mode : {"auto", "prefill", "decode"}
        Sparse execution mode; ``"auto"`` picks decode for query lengths <= 32.
    num_kv_splits : int
        ``-1`` (automatic) or the number of KV splits of the decode kernels.
    output_maxscore : bool
        Default of :func:`msa`'s ``output_maxscore``.
    use_fp8_kvcache : bool
        Recorded: the cache holds float8_e4m3fn values.
    sparse_block_size : int
        Block size of the sparse selection (must be 128 for sparse plans).
    device : torch.device or str, optional
        Device of the plan's tensors, i.e. of the later :func:`msa` calls (default CPU).

    Returns
    -------
    MsaPlanInfo
        ``(has_mixed_prefill, split, batch_size, plan, prefill_plan_or_None)``. The plan's
        ``mode`` is ``"dense"``, ``"paged"``, ``"sparse_prefill"`` or ``"sparse_decode"``.

    Raises
    ------
    TypeError
        non-int sizes, non-bool flags.
    ValueError
        lengths not on the CPU, negative lengths, wrong ``[B]`` shapes, ``Hq`` not a
        multiple of ``Hkv``, a bad top-k configuration, a page or block size other than
        128 where 128 is required, an unknown ``sparse_kernel_mode``.

    Examples
    --------
    >>> import torch
    >>> from mate.msa_interface import _msa_plan_from_lengths
    >>> info = _msa_plan_from_lengths(torch.tensor([3, 5]), torch.tensor([10, 5]),
    ...                               num_qo_heads=4, num_kv_heads=2)
    >>> info.plan.mode, info.has_mixed_prefill
    ('dense', False)
    >>> info.plan.prefill_plan.cu_seqlens_q.tolist(), info.plan.qo_offset.tolist()
    ([0, 3, 8], [7, 0])
    """
    return _planner._msa_plan_from_lengths(
        qo_lens, kv_lens, num_qo_heads, num_kv_heads=num_kv_heads, qo_offset=qo_offset,
        split_prefill_decode=split_prefill_decode, page_size=page_size, kv_block_num=kv_block_num,
        force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
        force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal, sparse_kernel_mode=sparse_kernel_mode,
        num_kv_splits=num_kv_splits, output_maxscore=output_maxscore, use_fp8_kvcache=use_fp8_kvcache,
        sparse_block_size=sparse_block_size, device=device)


@mate_api
def sparse_msa_plan(
    qo_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int | None = None,
    kv_block_num: int = 16,
    page_size: int = MSA_BLOCK,
    **kwargs: Any,
) -> MsaPlanInfo:
    """Eager plan for :func:`sparse_msa`: one sparse-prefill plan over the whole batch.

    The same as :func:`_msa_plan_from_lengths` with ``sparse_kernel_mode="prefill"`` and
    no prefill/decode split.

    Parameters
    ----------
    qo_lens, kv_lens : torch.Tensor
        Integer CPU tensors ``[B]`` of query and KV lengths in tokens.
    num_qo_heads : int
        Query heads ``Hq``.
    num_kv_heads : int, optional
        KV heads (default ``Hq``), dividing ``Hq``.
    kv_block_num : int
        Top-k blocks per token: 4, 8 or 16.
    page_size : int
        Must be 128 (the MSA block size).
    **kwargs
        The other options of :func:`_msa_plan_from_lengths` (``qo_offset``,
        ``force_begin_blocks``, ``force_end_blocks``, ``force_blocks_count_in_topk``,
        ``causal``, ``device``, ...), except ``sparse_kernel_mode`` and
        ``split_prefill_decode``, which are fixed.

    Returns
    -------
    MsaPlanInfo
        A single (not mixed) plan with ``plan.mode == "sparse_prefill"``.

    Raises
    ------
    TypeError
        ``sparse_kernel_mode`` or ``split_prefill_decode`` given, or a wrong option type.
    ValueError
        the planner's errors, or a configuration that is not sparse (``kv_block_num <= 0``).

    Examples
    --------
    >>> import torch
    >>> from mate.msa_interface import sparse_msa_plan
    >>> info = sparse_msa_plan(torch.tensor([4]), torch.tensor([256]), num_qo_heads=2,
    ...                        num_kv_heads=1, kv_block_num=4)
    >>> info.plan.mode, info.plan.selected_block_count, info.plan.max_pages
    ('sparse_prefill', 4, 2)
    """
    return _planner.sparse_msa_plan(qo_lens, kv_lens, num_qo_heads, num_kv_heads, kv_block_num=kv_block_num,
                                    page_size=page_size, **kwargs)


@mate_api
def msa_plan(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_qo_heads: int,
    *,
    total_seqlen_k: int | None = None,
    num_kv_heads: int | None = None,
    num_kv_splits: int = -1,
    page_size: int = -1,
    sparse_block_size: int = MSA_BLOCK,
    output_maxscore: bool = False,
    kv_block_num: int = -1,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
    force_blocks_count_in_topk: bool = True,
    causal: bool = True,
    sparse_kernel_mode: str = "auto",
    use_fp8_kvcache: bool = False,
) -> MsaPlanInfo:
    """Static, CUDA-graph-safe MSA plan built from capacities only (``plan.is_static``).

    The plan holds no live lengths: each :func:`msa` call must pass
    ``runtime_metadata=MsaRuntimeMetadata(...)`` with ``cu_seqlens_q``, ``cu_seqlens_k``
    and ``seqused_k`` (plus ``page_table`` for paged and sparse modes), device tensors
    that the caller rewrites in place before each launch or graph replay. The mode is
    chosen from the capacities (``max_seqlen_q <= 32`` gives ``sparse_decode`` in
    ``"auto"`` mode); a static plan is never split into decode and prefill parts.

    Parameters
    ----------
    batch_size, max_seqlen_q, max_seqlen_k : int
        Positive capacities: requests, query tokens per request, KV tokens per request.
    num_qo_heads : int
        Query heads ``Hq``.
    total_seqlen_k : int, optional
        Capacity of the ragged K/V rows of a dense plan (default
        ``batch_size * max_seqlen_k``; at least ``max_seqlen_k``).
    num_kv_heads : int, optional
        KV heads (default ``Hq``), dividing ``Hq``.
    page_size, kv_block_num, force_begin_blocks, force_end_blocks : int
        As in :func:`_msa_plan_from_lengths`.
    force_blocks_count_in_topk, causal, output_maxscore, use_fp8_kvcache : bool
        As in :func:`_msa_plan_from_lengths`.
    num_kv_splits, sparse_block_size : int
        As in :func:`_msa_plan_from_lengths`.
    sparse_kernel_mode : {"auto", "prefill", "decode"}
        As in :func:`_msa_plan_from_lengths`.

    Returns
    -------
    MsaPlanInfo
        A single plan with ``is_static=True``.

    Raises
    ------
    TypeError
        non-int sizes, non-bool flags.
    ValueError
        non-positive capacities or heads, ``Hq`` not a multiple of ``Hkv``,
        ``total_seqlen_k < max_seqlen_k``, or a configuration rule of the planner.

    Examples
    --------
    >>> from mate.msa_interface import msa_plan
    >>> info = msa_plan(4, 1, 4096, 8, num_kv_heads=1, page_size=128, kv_block_num=16)
    >>> info.plan.mode, info.plan.is_static, info.plan.max_pages
    ('sparse_decode', True, 32)
    """
    return _planner.msa_plan(
        batch_size, max_seqlen_q, max_seqlen_k, num_qo_heads, total_seqlen_k=total_seqlen_k,
        num_kv_heads=num_kv_heads, num_kv_splits=num_kv_splits, page_size=page_size,
        sparse_block_size=sparse_block_size, output_maxscore=output_maxscore, kv_block_num=kv_block_num,
        force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
        force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal, sparse_kernel_mode=sparse_kernel_mode,
        use_fp8_kvcache=use_fp8_kvcache)


# ============================================================================ sparse_topk_select


@mate_api
def sparse_topk_select(
    max_score: torch.Tensor,
    topk: int,
    num_valid_pages: int | None = None,
    output: torch.Tensor | None = None,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
    force_blocks_count_in_topk: bool = True,
    query_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k 128-token block selection per query token and head.

    Parameters
    ----------
    max_score : torch.Tensor
        float32 ``[total_q, H, max_k_tiles]``, contiguous (the max-score pass output).
    topk : int
        Blocks chosen by score: 4, 8 or 16.
    num_valid_pages : int, optional
        Blocks ``>= num_valid_pages`` are never chosen; in ``(0, max_k_tiles]``, default
        ``max_k_tiles``.
    output : torch.Tensor, optional
        int32 ``[total_q, H, W]`` contiguous buffer, written and returned.
    force_begin_blocks, force_end_blocks : int
        The first / last blocks of each row's valid range are always selected.
    force_blocks_count_in_topk : bool
        True: forced blocks fill top-k slots first, ``W = topk``. False: they are appended,
        ``W = topk + force_begin_blocks + force_end_blocks``.
    query_positions : torch.Tensor, optional
        int64 ``[total_q]`` absolute position of each query token: its row's valid range is
        ``min(num_valid_pages, pos // 128 + 1)`` blocks (0 when ``pos < 0``).

    Returns
    -------
    torch.Tensor
        int32 ``[total_q, H, W]``: each row's chosen block ids sorted ascending, then -1.
        Ties go to the lower block index (NaN counts as the largest score, -0.0 equals
        0.0). A row with ``n <= W`` valid blocks is ``0 .. n-1`` followed by -1.

    Raises
    ------
    TypeError
        wrong dtype of ``max_score`` (float32), ``output`` (int32), ``query_positions``
        (int64), or non-int sizes.
    ValueError
        wrong shapes, non-contiguous tensors, mixed devices, a bad top-k configuration or
        ``num_valid_pages`` outside ``(0, max_k_tiles]``.

    Examples
    --------
    >>> import torch
    >>> from mate.msa_interface import sparse_topk_select
    >>> scores = torch.tensor([[[0.5, 3.0, -1.0, 2.0, 0.0]]])  # 1 token, 1 head, 5 blocks
    >>> sparse_topk_select(scores, 4)  # ids sorted ascending
    tensor([[[0, 1, 3, 4]]], dtype=torch.int32)
    >>> sparse_topk_select(scores, 4, num_valid_pages=3)  # only 3 blocks exist: padded with -1
    tensor([[[ 0,  1,  2, -1]]], dtype=torch.int32)
    >>> scores = torch.randn(3, 2, 40)
    >>> picked = sparse_topk_select(scores, 8)
    >>> torch.equal(picked, scores.topk(8, dim=-1).indices.sort(dim=-1).values.int())
    True
    """
    recipe = _topk_recipe(max_score, output, query_positions, (num_valid_pages, topk, force_begin_blocks,
                                                               force_end_blocks, force_blocks_count_in_topk))
    if recipe is not None:
        if recipe.replay():
            return recipe.tensors[1]
        output = recipe.tensors[1]  # the ordinary path writes the recipe's output
    check_tensor("max_score", max_score, dtype=torch.float32, ndim=3, contiguous=True)
    width = check_topk_config(topk, force_begin_blocks, force_end_blocks, force_blocks_count_in_topk,
                              topk_name="topk")
    total_q, heads, tiles = max_score.shape
    if num_valid_pages is None:
        num_valid_pages = tiles
    if isinstance(num_valid_pages, bool) or not isinstance(num_valid_pages, int):
        raise TypeError(f"num_valid_pages must be an int, got {type(num_valid_pages).__name__}")
    check_value("num_valid_pages", 0 < num_valid_pages <= tiles, f"in (0, {tiles}] (max_k_tiles of max_score)",
                num_valid_pages)
    if query_positions is not None:
        check_tensor("query_positions", query_positions, dtype=torch.int64, shape=(total_q,), contiguous=True,
                     device=max_score.device)
    if output is None:
        output = torch.empty((total_q, heads, width), dtype=torch.int32, device=max_score.device)
    else:
        check_tensor("output", output, dtype=torch.int32, shape=(total_q, heads, width), contiguous=True,
                     device=max_score.device)
    if output.numel() == 0:
        return output
    with recorded(recipe):
        _topk_select_op(max_score, output, query_positions, num_valid_pages, topk, force_begin_blocks,
                        force_end_blocks, force_blocks_count_in_topk)
    return output


_TOPK_RECIPES = RecipeCache()
"""Launch recipes of eager ``sparse_topk_select`` calls, by signature."""


def _topk_recipe(max_score, output, query_positions, others: tuple) -> RecipeCall | None:
    """The launch recipe of a sparse_topk_select call (its output allocated when omitted), or
    None (not an eager CUDA call, an argument without a recipe signature, or a top-k
    configuration the ordinary path will reject). ``others``: its scalar arguments."""
    if not isinstance(max_score, torch.Tensor) or max_score.dim() != 3 or not recipes_usable(max_score):
        return None
    tensors = [max_score, output, query_positions]
    from mate.ops.msa import topk as _topk

    key = call_key(tensors, others, _topk.TOPK_METHOD, _topk.LANES_KERNEL, _topk.LANES_WARPS, _topk.LANES_MAXNREG,
                   _topk.LANES_MAX_CHUNK, _topk.INTERVAL_MAX_CHUNK)
    if key is None:
        return None
    if output is None:
        _, topk, begin, end, in_topk = others
        if not (type(topk) is int and type(begin) is int and type(end) is int and type(in_topk) is bool):
            return None
        width = topk if in_topk else topk + begin + end
        if width <= 0:
            return None
        tensors[1] = torch.empty((*max_score.shape[:2], width), dtype=torch.int32, device=max_score.device)
    return RecipeCall(_TOPK_RECIPES, key, tensors, outputs=(1,))


# ============================================================================ page tables


@mate_api
def build_page_table_from_flat_kv_indices(
    kv_indices: torch.Tensor, kv_lens: torch.Tensor | list[int], page_size: int
) -> torch.Tensor:
    """Page table ``[B, max_pages]`` int32 from flat page ids (a preparation function: it
    reads the lengths on the host).

    Parameters
    ----------
    kv_indices : torch.Tensor
        int32/int64 ``[sum(ceil(kv_lens / page_size))]``: request 0's pages, then request 1's...
    kv_lens : torch.Tensor or list of int
        ``[B]`` KV lengths in tokens.
    page_size : int
        Tokens per page.

    Returns
    -------
    torch.Tensor
        int32 ``[B, max(ceil(kv_lens / page_size))]`` on ``kv_indices``' device, zero-padded.
        Example: indices ``[3, 5, 7, 11, 13]``, kv_lens ``[300, 250]``, page 128 ->
        ``[[3, 5, 7], [11, 13, 0]]``.

    Raises
    ------
    TypeError
        a ``kv_indices`` dtype other than int32/int64, a non-int ``page_size``.
    ValueError
        a non-positive ``page_size``, negative lengths, or a number of indices other than
        the pages the lengths need.

    Examples
    --------
    >>> import torch
    >>> from mate.msa_interface import build_page_table_from_flat_kv_indices
    >>> build_page_table_from_flat_kv_indices(torch.tensor([3, 5, 7, 11, 13]), [300, 250], 128)
    tensor([[ 3,  5,  7],
            [11, 13,  0]], dtype=torch.int32)
    """
    check_tensor("kv_indices", kv_indices, dtype=(torch.int32, torch.int64), ndim=1)
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    check_value("page_size", page_size > 0, "a positive int", page_size)
    if not isinstance(kv_lens, (torch.Tensor, list, tuple)):
        raise TypeError(f"kv_lens must be an integer tensor or a list of ints, got {type(kv_lens).__name__}")
    if isinstance(kv_lens, (list, tuple)) and not all(isinstance(x, int) and not isinstance(x, bool) for x in kv_lens):
        raise TypeError(f"kv_lens must be a list of ints, got {kv_lens!r}")
    lens = torch.as_tensor(kv_lens)
    if lens.dtype.is_floating_point or lens.dtype == torch.bool:
        raise TypeError(f"kv_lens must hold integers, got {lens.dtype}")
    lens = lens.to("cpu", torch.int64)
    if lens.dim() != 1:
        raise ValueError(f"kv_lens must be 1-D [B], got shape {list(lens.shape)}")
    if bool((lens < 0).any()):
        raise ValueError("kv_lens must be >= 0, got a negative length")
    pages = (lens + page_size - 1) // page_size
    need = int(pages.sum())
    if need != kv_indices.shape[0]:
        raise ValueError(f"kv_indices must hold {need} page ids (sum of ceil(kv_lens / {page_size})), "
                         f"got {kv_indices.shape[0]}")
    if kv_indices.dtype == torch.int64:  # the table is int32
        check_int32("kv_indices", kv_indices, "int32 page ids")
    B = lens.shape[0]
    max_pages = int(pages.max()) if B else 0
    dev = kv_indices.device
    table = torch.zeros((B, max_pages), dtype=torch.int32, device=dev)
    if need:
        cols = torch.arange(max_pages)
        mask = (cols[None, :] < pages[:, None]).to(dev)
        table[mask] = kv_indices.to(torch.int32)
    return table


def _page_table_from_flat(kv_indices: torch.Tensor, kv_page_indptr: torch.Tensor, max_pages: int) -> torch.Tensor:
    """Device-side page table from flat indices (no host read): row i holds
    ``kv_indices[indptr[i] : indptr[i+1]]``, zero-padded to ``max_pages``."""
    B = kv_page_indptr.shape[0] - 1
    cols = torch.arange(max_pages, device=kv_indices.device, dtype=torch.int64)
    start = kv_page_indptr[:-1].to(torch.int64)
    count = kv_page_indptr[1:].to(torch.int64) - start
    idx = start[:, None] + cols[None, :]
    valid = cols[None, :] < count[:, None]
    n = kv_indices.shape[0]
    if n == 0:
        return torch.zeros((B, max_pages), dtype=torch.int32, device=kv_indices.device)
    gathered = kv_indices[idx.clamp(0, n - 1)].to(torch.int32)
    return torch.where(valid, gathered, torch.zeros_like(gathered))


# ============================================================================ msa


class _Part(NamedTuple):
    """One homogeneous slice of a call: its plan, its query/key token ranges (host ints)
    and the device tensors the kernels read."""

    plan: MsaPlan
    q_start: int
    q_end: int  # -1: to the end of q
    k_start: int  # dense K: first key token of the slice
    k_end: int  # -1: to the end of k
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    kv_lens: torch.Tensor | None
    qo_offset: torch.Tensor | None  # None: kv_len - q_len (or the int below)
    qo_offset_value: int | None
    page_table: torch.Tensor | None
    kv_indices: torch.Tensor | None
    kv_page_indptr: torch.Tensor | None


def _check_runtime_metadata(rt: Any, plan: MsaPlan, device: torch.device) -> None:
    if not isinstance(rt, MsaRuntimeMetadata):
        raise TypeError(f"runtime_metadata must be an MsaRuntimeMetadata, got {type(rt).__name__}")
    B = plan.batch_size
    need = {"cu_seqlens_q": (B + 1,), "cu_seqlens_k": (B + 1,), "seqused_k": (B,)}
    if plan.page_size > 0:
        need["page_table"] = (B, None)
    for name, shape in need.items():
        t = getattr(rt, name)
        if t is None:
            what = "a static plan" if plan.is_static else f"a {plan.mode} plan"
            raise ValueError(f"runtime_metadata.{name} is required to execute {what}, got None")
        check_tensor(f"runtime_metadata.{name}", t, dtype=torch.int32, shape=shape, contiguous=True, device=device)
    if plan.page_size > 0:
        pt = rt.page_table
        check_value("runtime_metadata.page_table", pt.shape[1] >= plan.max_pages,
                    f"[{B}, >= {plan.max_pages}] (ceil(max_seqlen_k / page_size))", list(pt.shape))
    if rt.qo_offset is not None:
        check_tensor("runtime_metadata.qo_offset", rt.qo_offset, dtype=torch.int32, shape=(B,), contiguous=True,
                     device=device)


def _check_plan_device(plan: MsaPlan, device: torch.device) -> None:
    for name in ("qo_lens", "kv_lens", "qo_offset"):
        t = getattr(plan, name)
        if t is not None and t.device != device:
            raise ValueError(f"plan.{name} must be on {device} (q's device; plan with device=...), got {t.device}")


def _resolve_parts(
    info: MsaPlanInfo,
    q: torch.Tensor,
    *,
    runtime_metadata: MsaRuntimeMetadata | None,
    q_offset_override: torch.Tensor | int | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
) -> list[_Part]:
    """Splits the call into homogeneous parts and picks the metadata each kernel reads."""
    plan = info.plan
    device = q.device
    if runtime_metadata is not None:
        if info.has_mixed_prefill:
            raise ValueError("runtime_metadata must be used with a single (non-mixed) plan, got a mixed plan")
        _check_runtime_metadata(runtime_metadata, plan, device)
        rt = runtime_metadata
        return [_Part(plan, 0, -1, 0, -1, rt.cu_seqlens_q, rt.cu_seqlens_k, rt.seqused_k, rt.qo_offset, None,
                      rt.page_table if plan.page_size > 0 else None, None, None)]
    if plan.is_static:
        raise ValueError("runtime_metadata is required to execute a static plan (msa_plan(...)), got None; "
                         "pass MsaRuntimeMetadata(cu_seqlens_q=..., cu_seqlens_k=..., seqused_k=..., page_table=...)")
    plans = [plan] if not info.has_mixed_prefill else [plan, info.prefill_plan_or_None]
    for p in plans:
        _check_plan_device(p, device)
    parts: list[_Part] = []
    q0 = k0 = 0
    b0 = 0
    for p in plans:
        B = p.batch_size
        nq = p.prefill_plan.total_seqlen_q
        nk = p.prefill_plan.total_seqlen_k
        off, off_val = p.qo_offset, None
        if q_offset_override is not None:
            if isinstance(q_offset_override, int):
                off, off_val = None, q_offset_override
            else:
                off = q_offset_override[b0:b0 + B]
        pt = None
        if p.page_size > 0:
            if page_table is not None:
                pt = page_table[b0:b0 + B]
            elif kv_indices is None:
                raise ValueError(f"page_table or kv_indices is required for a {p.mode} plan (page_size "
                                 f"{p.page_size}), got neither")
            else:
                check_value("kv_indices", kv_indices.shape[0] >= p.kv_pages_end,
                            f"at least {p.kv_pages_end} entries (the pages of the plan's kv_lens)",
                            f"{kv_indices.shape[0]} entries")
        parts.append(_Part(p, q0, q0 + nq, k0, k0 + nk, p.prefill_plan.cu_seqlens_q, p.prefill_plan.cu_seqlens_k,
                           p.kv_lens, off, off_val, pt, kv_indices if p.page_size > 0 else None,
                           p.kv_page_indptr))
        q0, k0, b0 = q0 + nq, k0 + nk, b0 + B
    return parts


def _part_page_table(part: _Part) -> torch.Tensor:
    if part.page_table is not None:
        return part.page_table
    return _page_table_from_flat(part.kv_indices, part.kv_page_indptr, part.plan.max_pages)


def _part_qo_offset_tensor(part: _Part) -> torch.Tensor | None:
    """The part's qo_offset as an int32 [B] tensor (None: the default kv_len - q_len)."""
    if part.qo_offset_value is None:
        return part.qo_offset
    return torch.full((part.plan.batch_size,), part.qo_offset_value, dtype=torch.int32, device=part.kv_lens.device)


def _slice_rows(t: torch.Tensor | None, part: _Part) -> torch.Tensor | None:
    if t is None:
        return None
    return t[part.q_start:] if part.q_end < 0 else t[part.q_start:part.q_end]


def _k_layout(k: torch.Tensor, plan: MsaPlan) -> int:
    """Dense or one of the two paged layouts, from ``k``'s shape."""
    Hkv = plan.num_kv_heads
    if plan.page_size <= 0:
        if k.dim() != 3 or k.shape[1] != Hkv:
            raise ValueError(f"k must be ragged [total_k, {Hkv}, D] for a {plan.mode} plan, got {list(k.shape)}")
        return LAYOUT_DENSE
    ps = plan.page_size
    if k.dim() == 4 and k.shape[1] == ps and k.shape[2] == Hkv:
        return LAYOUT_TOKEN_MAJOR
    if k.dim() == 4 and k.shape[1] == Hkv and k.shape[2] == ps:
        return LAYOUT_HEAD_MAJOR
    raise ValueError(f"k must be paged [num_pages, {ps}, {Hkv}, D] or [num_pages, {Hkv}, {ps}, D], "
                     f"got {list(k.shape)}")


def _run_max_score(q: torch.Tensor, k: torch.Tensor, max_score: torch.Tensor, parts: list[_Part]) -> None:
    """The max-score pass, one launch per part, each writing its rows of ``max_score``."""
    for part in parts:
        plan = part.plan
        layout = _k_layout(k, plan)
        qp = _slice_rows(q, part)
        ms = _slice_rows(max_score, part)
        if qp.shape[0] == 0:
            continue
        kp = k
        if layout == LAYOUT_DENSE and part.k_end >= 0:
            kp = k[part.k_start:part.k_end]
        page_table = part.page_table
        _max_score_op(qp, kp, ms, part.cu_seqlens_q, part.cu_seqlens_k if layout == LAYOUT_DENSE else None,
                      part.kv_lens, part.qo_offset, page_table, part.kv_indices if page_table is None else None,
                      part.kv_page_indptr if page_table is None else None,
                      0 if part.qo_offset_value is None else part.qo_offset_value, part.qo_offset_value is not None,
                      plan.causal, layout, plan.batch_size, plan.prefill_plan.max_seqlen_q)


# ---------------------------------------------------------------------------- attention branches
# The two functions below are the only places that call the attention kernels. Their call
# signatures are the contract with mate.ops.msa.sparse_attention and mate.mha_interface.


def _attend_sparse(q, k, v, part: _Part, kv_block_indexes, out, lse, sm_scale, k_scale, v_scale) -> None:
    """Sparse prefill / decode over the selected blocks of one part (writes out, lse)."""
    from mate.ops.msa.sparse_attention import run_sparse_attention

    qp = _slice_rows(q, part)
    lse_p = _slice_rows(lse, part)
    if lse_p is None:  # the kernels always write an LSE: use the plan's scratch (no allocation per call)
        rows = max(qp.shape[0], part.plan.rows_capacity)
        lse_p = part.plan.workspace.buffer("lse", rows * qp.shape[1], torch.float32, q.device)
        lse_p = lse_p[:qp.shape[0] * qp.shape[1]].view(qp.shape[0], qp.shape[1])
    run_sparse_attention(  # msa() checked what sparse_attention would (_check_qkv, _check_sparse_kv, ...)
        qp, k, v, _slice_rows(kv_block_indexes, part), part.cu_seqlens_q, part.kv_lens,
        _part_qo_offset_tensor(part), part.page_table, part.kv_indices, part.kv_page_indptr,
        _slice_rows(out, part), lse_p,
        head_major=_k_layout(k, part.plan) == LAYOUT_HEAD_MAJOR,
        plan=part.plan,
        sm_scale=sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def _attend_dense_or_paged(q, k, v, part: _Part, out, lse, sm_scale) -> None:
    """Ordinary attention of one dense or paged part through mate.mha_interface."""
    from mate import mha_interface

    plan = part.plan
    custom = (part.qo_offset_value is not None or not plan.default_qo_offset
              or (part.qo_offset is not None and part.qo_offset is not plan.qo_offset))  # a tensor override
    if plan.causal and custom:
        raise NotImplementedError(
            "qo_offset other than kv_len - q_len is not implemented for causal dense/paged attention "
            "(FlashAttention's causal mask is bottom-right aligned); got a custom qo_offset"
        )
    qp = _slice_rows(q, part)
    op = _slice_rows(out, part)
    want_lse = lse is not None
    if plan.is_static:  # straight into out / lse (or the plan's scratch LSE): no allocation per call
        _attend_static_dense_or_paged(qp, k, v, part, op, lse, sm_scale)
        return
    if plan.page_size <= 0:
        kp = k if part.k_end < 0 else k[part.k_start:part.k_end]
        vp = v if part.k_end < 0 else v[part.k_start:part.k_end]
        res = mha_interface.flash_attn_varlen_func(
            qp, kp, vp, cu_seqlens_q=part.cu_seqlens_q, cu_seqlens_k=part.cu_seqlens_k,
            max_seqlen_q=plan.prefill_plan.max_seqlen_q, max_seqlen_k=plan.prefill_plan.max_seqlen_k,
            seqused_k=part.kv_lens, softmax_scale=sm_scale, causal=plan.causal,
            return_softmax_lse=want_lse, out=op,
        )
    else:
        if _k_layout(k, plan) == LAYOUT_HEAD_MAJOR:
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # token-major views of the same pages (read in place)
        res = mha_interface.flash_attn_with_kvcache(
            qp, k, v, cache_seqlens=part.kv_lens, page_table=_part_page_table(part),
            cu_seqlens_q=part.cu_seqlens_q, max_seqlen_q=plan.prefill_plan.max_seqlen_q,
            softmax_scale=sm_scale, causal=plan.causal, return_softmax_lse=want_lse,
            scheduler_metadata=plan.decode_plan.scheduler_metadata if plan.decode_plan is not None else None,
        )
    o, l_ = (res[0], res[1]) if want_lse else (res, None)
    if o is not op:
        op.copy_(o)
    if want_lse:
        _slice_rows(lse, part).copy_(l_.transpose(0, 1))  # mha LSE is [Hq, total_q]


def _attend_static_dense_or_paged(qp, k, v, part: _Part, op, lse, sm_scale) -> None:
    """A static dense or paged plan's attention through the mha kernel itself: the output
    rows ``op``, the caller's LSE rows as an [Hq, rows] view or else a scratch LSE from the
    plan's workspace (the kernel always writes one)."""
    from mate import mha_interface

    plan = part.plan
    rows, hq = qp.shape[0], qp.shape[1]
    if lse is not None:
        lse_hq = _slice_rows(lse, part).t()
    else:
        lse_hq = plan.workspace.buffer("dense_lse", hq * rows, torch.float32, qp.device).view(hq, rows)
    paged = plan.page_size > 0
    if paged and _k_layout(k, plan) == LAYOUT_HEAD_MAJOR:
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # token-major views of the same pages (read in place)
    mha_interface._run(qp, k, v, op, lse_hq, cu_seqlens_q=part.cu_seqlens_q,
                       max_seqlen_q=plan.prefill_plan.max_seqlen_q,
                       cu_seqlens_k=None if paged else part.cu_seqlens_k, seqused_k=part.kv_lens,
                       page_table=part.page_table if paged else None, batched=False, softmax_scale=sm_scale,
                       window=(-1, 0 if plan.causal else -1), backend=select_backend(qp.device))


def _check_block_indexes_valid(kv_block_indexes: torch.Tensor, parts: list[_Part]) -> None:
    """``check_input_valid=True``: every id is -1 or a valid block of its request (host read)."""
    for part in parts:
        cu = part.cu_seqlens_q.to("cpu", torch.int64)
        idx = _slice_rows(kv_block_indexes, part)[:int(cu[-1])].to("cpu", torch.int64)  # not a static plan's spare rows
        blocks = (part.kv_lens.to("cpu", torch.int64) + MSA_BLOCK - 1) // MSA_BLOCK
        req = torch.searchsorted(cu[1:], torch.arange(idx.shape[0]), right=True)
        limit = blocks[req].view(-1, 1, 1)
        bad = (idx != -1) & ((idx < 0) | (idx >= limit))
        if bool(bad.any()):
            t, h, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"kv_block_indexes must hold -1 or a valid block id (< {int(limit[t, 0, 0])} for query token "
                f"{part.q_start + t}), got {int(idx[t, h, j])} at [{part.q_start + t}, {h}, {j}]"
            )


def _check_qkv(q, k, v, plan: MsaPlan, need_v: bool) -> None:
    check_tensor("q", q, dtype=QKV_DTYPES, ndim=3, last_dim_contiguous=True)
    if q.shape[1] != plan.num_qo_heads:
        check_value("q", False, f"[total_q, {plan.num_qo_heads} (num_qo_heads), D]", list(q.shape))
    check_tensor("k", k, dtype=q.dtype, ndim=(3, 4), last_dim_contiguous=True, device=q.device)
    if k.shape[-1] != q.shape[-1]:
        check_value("k", False, f"head dim {q.shape[-1]} (q's)", list(k.shape))
    if need_v:
        check_tensor("v", v, dtype=q.dtype, ndim=k.dim(), last_dim_contiguous=True, device=q.device)
        if v.shape[:-1] != k.shape[:-1]:
            check_value("v", False, f"shape {list(k.shape[:-1])} + [Dv]", list(v.shape))
    elif v is not None:
        check_tensor("v", v, dtype=q.dtype, device=q.device)


def _check_sparse_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: MsaPlan) -> None:
    """What the sparse forward needs of q / k / v beyond :func:`_check_qkv`: head dim 128,
    V's head dim equal to K's, a paged cache of the plan's heads with at least one page, and
    TMA-compatible (16-byte aligned) k / v, which the kernels read in place."""
    d = q.shape[-1]
    if d != MSA_BLOCK:
        check_value("q.shape[2] (head_dim)", False, f"{MSA_BLOCK} for sparse MSA", d)
    _k_layout(k, plan)
    if k.shape[0] == 0:
        check_value("k.shape[0] (pages)", False, "at least 1", k.shape[0])
    if v.shape[-1] != d:
        check_value("v", False, f"head dim {d} (q's) for sparse MSA", list(v.shape))
    check_tma_aligned("k", k)
    check_tma_aligned("v", v)


def _check_plan_extent(q: torch.Tensor, k: torch.Tensor, plan_info: MsaPlanInfo) -> None:
    """An eager plan knows its query tokens and (dense) key rows on the host: q must have
    exactly those tokens and a dense k at least those rows. A static plan's lengths are on
    the device (the kernels skip what lies outside the tensors): q may not have more tokens
    than its capacity."""
    parts = [plan_info.plan] + ([plan_info.prefill_plan_or_None] if plan_info.has_mixed_prefill else [])
    if any(p.is_static for p in parts):  # runtime lengths: q may not exceed the capacity the launches cover
        cap = sum(p.rows_capacity for p in parts)
        if q.shape[0] > cap:
            check_value("q", False, f"[<= {cap} (the plan's batch_size * max_seqlen_q), ...]", list(q.shape))
        return
    want_q = sum(max(0, p.prefill_plan.total_seqlen_q) for p in parts)
    if q.shape[0] != want_q:
        check_value("q", False, f"[{want_q} (the plan's query tokens), ...]", list(q.shape))
    if all(p.page_size <= 0 for p in parts) and k.dim() == 3:  # a mixed plan's prefill keys follow its decode keys
        want_k = sum(p.prefill_plan.total_seqlen_k for p in parts)
        if k.shape[0] < want_k:
            check_value("k", False, f"[>= {want_k} (the plan's key rows), ...]", list(k.shape))


@mate_api
def msa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    plan_info: MsaPlanInfo,
    kv_indices: torch.Tensor | None = None,
    kv_block_indexes: torch.Tensor | None = None,
    q_offset_override: torch.Tensor | int | None = None,
    out: torch.Tensor | None = None,
    max_score: torch.Tensor | None = None,
    **kw: Any,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MSA forward: sparse, dense or paged attention, and/or the max-score pass.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` fp16, bf16 or float8_e4m3fn (ragged by the plan's
        ``cu_seqlens_q``).
    k, v : torch.Tensor
        Same dtype as q. Dense plans: ragged ``[total_k, Hkv, D]``. Paged and sparse plans:
        ``[num_pages, page_size, Hkv, D]`` (token-major) or ``[num_pages, Hkv, page_size, D]``
        (head-major), read in place. ``v`` may be ``None`` when ``output_o=False``.
    plan_info : MsaPlanInfo
        From :func:`_msa_plan_from_lengths`, :func:`msa_plan` or :func:`sparse_msa_plan`.
    kv_indices : torch.Tensor, optional
        Flat int32 page ids indexed by the plan's ``kv_page_indptr`` (alternative to
        ``page_table``). Page ids index the whole ``k`` / ``v`` tensors.
    kv_block_indexes : torch.Tensor, optional
        int32 ``[total_q, Hkv or Hq, selected_block_count]``: per-token selected logical
        blocks (required by sparse plans), read as a set: -1 and ids past the request's
        blocks are skipped, duplicates count once; an Hq-wide tensor is read at the first
        head of each group.
    q_offset_override : int or torch.Tensor, optional
        Replaces the plan's ``qo_offset`` (int32 ``[B]`` on q's device, or one int) for this
        call; not combinable with ``runtime_metadata``.
    out : torch.Tensor, optional
        ``[total_q, Hq, Dv]`` output buffer (q's dtype; bf16 for fp8 inputs).
    max_score : torch.Tensor, optional
        float32 ``[total_q, Hq, >= ceil(max_seqlen_k / 128)]`` contiguous buffer; giving it
        turns the max-score pass on.

    Other Parameters
    ----------------
    sm_scale : float
        Softmax scale, default ``D ** -0.5``.
    lse : torch.Tensor
        float32 ``[total_q, Hq]`` buffer for the natural-log LSE.
    k_scale, v_scale : float
        Dequantization multipliers of K and V (sparse modes; dense/paged accept only 1).
    runtime_metadata : MsaRuntimeMetadata
        Live lengths (required by static plans).
    page_table : torch.Tensor
        int32 ``[B, >= ceil(max_seqlen_k / page_size)]`` page table (paged/sparse modes).
    output_o : bool
        Compute the attention output (default True).
    output_maxscore : bool
        Run the max-score pass (default: the plan's ``output_maxscore``).
    check_input_valid : bool
        Reject out-of-range ids in ``kv_block_indexes`` (reads them on the host; also on
        with ``MATE_CHECK_INPUTS=1``).

    Returns
    -------
    tuple
        ``(out or None, max_score or None)``.

    Raises
    ------
    TypeError
        unknown keywords, wrong dtypes.
    ValueError
        bad shapes/devices, a static plan without complete ``runtime_metadata``,
        ``q_offset_override`` with ``runtime_metadata``, a sparse plan without
        ``kv_block_indexes``, a row width other than ``selected_block_count``, neither
        output requested.
    NotImplementedError
        the max-score pass together with a sparse plan or ``kv_block_indexes``; ``k_scale``
        / ``v_scale`` other than 1 on dense/paged plans.

    Notes
    -----
    Attention is delegated with these exact calls (per homogeneous part of the batch)::

        mate.ops.msa.sparse_attention.run_sparse_attention(  # sparse_attention minus its checks
            q_part, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset, page_table, kv_indices,
            kv_page_indptr, out, lse, *, head_major, plan, sm_scale, k_scale, v_scale)
        mate.mha_interface.flash_attn_varlen_func(
            q_part, k_part, v_part, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=,
            seqused_k=, softmax_scale=, causal=, return_softmax_lse=, out=)
        mate.mha_interface.flash_attn_with_kvcache(
            q_part, k, v, cache_seqlens=, page_table=, cu_seqlens_q=, max_seqlen_q=,
            softmax_scale=, causal=, return_softmax_lse=, scheduler_metadata=)

    For sparse parts: ``qo_indptr`` is the part's int32 ``[B+1]`` query offsets (from 0),
    ``kv_lens`` int32 ``[B]``, ``qo_offset`` int32 ``[B]`` or ``None`` (= kv_len - q_len),
    ``page_table`` int32 ``[B, >= max_pages]`` or ``None`` (then ``kv_indices`` +
    ``kv_page_indptr``, absolute pointers into the whole ``kv_indices``), ``out`` /
    ``lse`` the part's row slices (without ``lse``, the plan's scratch rows); ``plan.mode``
    tells prefill from decode. msa() itself checks everything ``sparse_attention`` would.

    Examples
    --------
    Dense causal attention of 4 new tokens over a 6-token context, checked against
    PyTorch's attention with the bottom-right causal mask:

    >>> import torch
    >>> from mate.msa_interface import _msa_plan_from_lengths, msa
    >>> q = torch.randn(4, 2, 64, dtype=torch.bfloat16)
    >>> k, v = (torch.randn(6, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    >>> info = _msa_plan_from_lengths(torch.tensor([4]), torch.tensor([6]), num_qo_heads=2)
    >>> out, max_score = msa(q, k, v, info)
    >>> out.shape, max_score
    (torch.Size([4, 2, 64]), None)
    >>> mask = torch.ones(4, 6, dtype=torch.bool).tril(diagonal=2)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1),
    ...     attn_mask=mask).transpose(0, 1)
    >>> torch.allclose(out.float(), ref, atol=2e-2)  # bf16 output: ~3 significant digits
    True
    """
    unknown = sorted(set(kw) - MSA_KEYWORDS)
    if unknown:
        raise TypeError(f"msa() got unexpected keyword argument(s) {unknown}; accepted: {sorted(MSA_KEYWORDS)}")
    if not isinstance(plan_info, MsaPlanInfo):
        raise TypeError(f"plan_info must be an MsaPlanInfo, got {type(plan_info).__name__}")
    args = (q, k, v, plan_info, kv_indices, kv_block_indexes, q_offset_override, out, max_score, kw)
    recipe = _msa_recipe(*args)
    if recipe is None:
        return _msa(*args)
    out = recipe.tensors[_RECIPE_OUTPUTS[0]]
    if recipe.replay():  # sparse attention: (out, None); the max-score pass: (None, max_score)
        return (out, None) if max_score is None else (None, max_score)
    with recipe.recorded():  # the ordinary path, into the recipe's out (checked as given)
        return _msa(q, k, v, plan_info, kv_indices, kv_block_indexes, q_offset_override, out, max_score, kw)


_RECIPE_OUTPUTS = (6, 7)
"""Positions of out and lse in a recipe's tensors (:func:`_msa_recipe`)."""


def _out_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def _msa_recipe(q, k, v, plan_info: MsaPlanInfo, kv_indices, kv_block_indexes, q_offset_override, out, max_score,
                kw: dict) -> RecipeCall | None:
    """The launch recipe of an msa() call (:mod:`mate._core.recipe`; its out allocated), or None
    where the call runs the ordinary way. Recipes cover the calls whose every device operation
    is a Triton launch: sparse attention, and the max-score pass alone into a given buffer
    (dense / paged attention may run torch's SDPA and copies); not with the ids checked on the
    host."""
    plan, pre = plan_info.plan, plan_info.prefill_plan_or_None
    sparse = [p.is_sparse for p in (plan, pre) if p is not None]
    output_o = kw.get("output_o", True)
    if all(sparse) and max_score is None and not plan.output_maxscore and output_o is True:
        outputs = _RECIPE_OUTPUTS  # sparse attention
    elif not any(sparse) and isinstance(max_score, torch.Tensor) and output_o is False and kv_block_indexes is None:
        outputs = (9,)  # the max-score pass
    else:
        return None
    if not isinstance(q, torch.Tensor) or not isinstance(v, (torch.Tensor, type(None))) or q.dim() != 3:
        return None
    if kw.get("check_input_valid") or not recipes_usable(q):
        return None
    rt = kw.get("runtime_metadata")
    tensors = [q, k, v, kv_indices, kv_block_indexes, q_offset_override, out, kw.get("lse"), kw.get("page_table"),
               max_score]
    others = [(name, value) for name, value in kw.items() if name not in ("lse", "page_table", "runtime_metadata")]
    if isinstance(q_offset_override, int):
        tensors[5] = None
        others.append(("q_offset_override", q_offset_override))
    if rt is not None:
        if not isinstance(rt, MsaRuntimeMetadata):
            return None
        tensors += [getattr(rt, f.name) for f in dataclasses.fields(rt)]
    key = call_key(tensors, others, Identity(pre), plan_info.split, _msa_launch_config())
    if key is None:
        return None
    if out is None and outputs == _RECIPE_OUTPUTS:
        if v is None:
            return None
        tensors[6] = torch.empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=_out_dtype(q), device=q.device)
    return RecipeCall(plan.workspace.recipes, key, tensors, outputs)


def _msa_launch_config() -> tuple:
    """The module settings that shape msa()'s launches (recipe keys include them: benchmarks
    switch them between calls)."""
    from mate.ops.msa import maxscore
    from mate.ops.msa.sparse_attention import launch_config

    return launch_config(), maxscore.PREFILL_BLOCK_M


def _msa(q, k, v, plan_info: MsaPlanInfo, kv_indices, kv_block_indexes, q_offset_override, out, max_score,
         kw: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """msa() the ordinary way: every check, then the launches."""
    plan = plan_info.plan
    output_o = kw.get("output_o", True)
    check_bool("output_o", output_o)
    output_maxscore = check_bool("output_maxscore", kw.get("output_maxscore", plan.output_maxscore))
    output_maxscore = output_maxscore or max_score is not None
    if not output_o and not output_maxscore:
        raise ValueError("msa must compute at least one output: got output_o=False and output_maxscore=False")
    sparse = plan.is_sparse or (plan_info.prefill_plan_or_None is not None and plan_info.prefill_plan_or_None.is_sparse)
    if output_maxscore and (sparse or kv_block_indexes is not None):
        raise NotImplementedError(
            "the max-score pass (output_maxscore / max_score) is implemented for dense and paged plans only, "
            f"got a {plan.mode} plan" + (" with kv_block_indexes" if kv_block_indexes is not None else "")
        )
    _check_qkv(q, k, v, plan, need_v=output_o)
    _check_plan_extent(q, k, plan_info)
    runtime_metadata = kw.get("runtime_metadata")
    if q_offset_override is not None:
        if runtime_metadata is not None:
            raise ValueError("q_offset_override cannot be combined with runtime_metadata (put qo_offset there), "
                             "got both")
        if isinstance(q_offset_override, bool) or not isinstance(q_offset_override, (int, torch.Tensor)):
            raise TypeError(f"q_offset_override must be an int or an int32 tensor, got "
                            f"{type(q_offset_override).__name__}")
        if isinstance(q_offset_override, torch.Tensor):
            check_tensor("q_offset_override", q_offset_override, dtype=torch.int32, shape=(plan_info.batch_size,),
                         contiguous=True, device=q.device)
        else:
            check_int32("q_offset_override", q_offset_override)
    page_table = kw.get("page_table")
    if page_table is not None:
        max_pages = max(plan.max_pages, plan_info.prefill_plan_or_None.max_pages
                        if plan_info.prefill_plan_or_None is not None else 0)
        check_tensor("page_table", page_table, dtype=torch.int32, shape=(plan_info.batch_size, None),
                     device=q.device, last_dim_contiguous=True)
        check_value("page_table", page_table.shape[1] >= max_pages, f"[{plan_info.batch_size}, >= {max_pages}]",
                    list(page_table.shape))
    if kv_indices is not None:
        check_tensor("kv_indices", kv_indices, dtype=torch.int32, ndim=1, contiguous=True, device=q.device)
    total_q, Hq = q.shape[0], q.shape[1]
    out_dtype = _out_dtype(q)

    # the inputs' extents for the overlap checks of the output buffers given (once for all of them)
    given = max_score is not None or out is not None or kw.get("lse") is not None
    reads = byte_ranges(**_index_reads(q, k, v, page_table, kv_indices, runtime_metadata)) if given else {}
    # ---- max-score buffer
    if output_maxscore:
        plans = [plan] + ([plan_info.prefill_plan_or_None] if plan_info.has_mixed_prefill else [])
        tiles = max(p.max_k_tiles for p in plans)
        if max_score is None:
            max_score = torch.empty((total_q, Hq, tiles), dtype=torch.float32, device=q.device)
        else:
            check_tensor("max_score", max_score, dtype=torch.float32, ndim=3, contiguous=True, device=q.device)
            check_value("max_score", tuple(max_score.shape[:2]) == (total_q, Hq) and max_score.shape[2] >= tiles,
                        f"[{total_q}, {Hq}, >= {tiles}]", list(max_score.shape))
            check_no_overlap("max_score", max_score, **reads)
        for p in plans:
            if p.page_size > 0 and p.page_size != MSA_BLOCK:
                raise ValueError(f"page_size must be {MSA_BLOCK} for the max-score pass on a paged plan, "
                                 f"got {p.page_size}")
    else:
        max_score = None

    # ---- attention buffers and scalars
    lse = kw.get("lse")
    sm_scale = kw.get("sm_scale")
    k_scale = kw.get("k_scale", 1.0)
    v_scale = kw.get("v_scale", 1.0)
    if output_o:
        Dv = v.shape[-1]
        if out is None:
            out = torch.empty((total_q, Hq, Dv), dtype=out_dtype, device=q.device)
        else:
            check_out_tensor("out", out, dtype=out_dtype, shape=(total_q, Hq, Dv), device=q.device,
                             contiguous=False, last_dim_contiguous=True)
            check_no_overlap("out", out, **reads, kv_block_indexes=kv_block_indexes, max_score=max_score)
        if lse is not None:
            check_out_tensor("lse", lse, dtype=torch.float32, shape=(total_q, Hq), device=q.device, contiguous=False)
            check_no_overlap("lse", lse, **reads, kv_block_indexes=kv_block_indexes, max_score=max_score, out=out)
        sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else _float_arg("sm_scale", sm_scale)
        k_scale = _float_arg("k_scale", k_scale)
        v_scale = _float_arg("v_scale", v_scale)
        if sparse:
            if kv_block_indexes is None:
                raise ValueError(f"kv_block_indexes is required by a {plan.mode} plan, got None")
            check_tensor("kv_block_indexes", kv_block_indexes, dtype=torch.int32, ndim=3, device=q.device,
                         last_dim_contiguous=True)
            width = plan.selected_block_count
            heads_ok = kv_block_indexes.shape[1] in (plan.num_kv_heads, plan.num_qo_heads)
            check_value("kv_block_indexes", kv_block_indexes.shape[0] == total_q and heads_ok
                        and kv_block_indexes.shape[2] == width,
                        f"[{total_q}, {plan.num_kv_heads} or {plan.num_qo_heads}, {width} (selected_block_count)]",
                        list(kv_block_indexes.shape))
            _check_sparse_kv(q, k, v, plan)
        else:
            if kv_block_indexes is not None:
                raise ValueError(f"kv_block_indexes needs a sparse plan (kv_block_num > 0), got a {plan.mode} plan")
            if q.dtype == torch.float8_e4m3fn:
                raise NotImplementedError(f"float8_e4m3fn q / k / v are implemented for sparse plans only, got a "
                                          f"{plan.mode} plan")
            if k_scale != 1.0 or v_scale != 1.0:
                raise NotImplementedError(f"k_scale / v_scale other than 1 are not implemented for {plan.mode} "
                                          f"plans, got k_scale={k_scale}, v_scale={v_scale}")
    else:
        out = None

    if plan_info.batch_size == 0 or total_q == 0:
        return out, max_score

    parts = _resolve_parts(plan_info, q, runtime_metadata=runtime_metadata, q_offset_override=q_offset_override,
                           page_table=page_table, kv_indices=kv_indices)
    if max_score is not None:
        _run_max_score(q, k, max_score, parts)
    if out is not None:
        if sparse and (kw.get("check_input_valid", False) or check_inputs_enabled()):
            _check_block_indexes_valid(kv_block_indexes, parts)
        for part in parts:
            if part.plan.is_sparse:
                _attend_sparse(q, k, v, part, kv_block_indexes, out, lse, sm_scale, k_scale, v_scale)
            else:
                _attend_dense_or_paged(q, k, v, part, out, lse, sm_scale)
    return out, max_score


def _index_reads(q, k, v, page_table, kv_indices, runtime_metadata) -> dict[str, torch.Tensor | None]:
    """The tensors an msa() call reads besides kv_block_indexes and max_score, by name (for the
    overlap checks of its outputs): q / k / v, the page map and a static plan's runtime
    lengths."""
    reads = dict(q=q, k=k, v=v, page_table=page_table, kv_indices=kv_indices)
    if runtime_metadata is not None:
        for f in dataclasses.fields(runtime_metadata):
            reads[f"runtime_metadata.{f.name}"] = getattr(runtime_metadata, f.name)
    return reads


def _float_arg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _check_single_sparse_plan(fname: str, plan_info: Any, mode: str, kw: dict) -> None:
    """The entry points for one pure sparse plan: ``plan_info`` of exactly ``mode`` (not
    mixed), and none of msa()'s output-selection keywords."""
    if not isinstance(plan_info, MsaPlanInfo):
        raise TypeError(f"plan_info must be an MsaPlanInfo, got {type(plan_info).__name__}")
    if plan_info.has_mixed_prefill or plan_info.plan.mode != mode:
        raise ValueError(f"plan_info must be a single {mode} plan, got mode {plan_info.plan.mode!r}"
                         + (" (mixed)" if plan_info.has_mixed_prefill else ""))
    for key in ("output_o", "output_maxscore", "max_score"):
        if key in kw:
            raise TypeError(f"{fname}() got an unexpected keyword argument {key!r}")


@mate_api
def sparse_msa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan_info: MsaPlanInfo, **kw: Any
) -> tuple[torch.Tensor, None]:
    """Sparse-prefill MSA for a pure ``sparse_prefill`` plan; returns ``(out, None)``.

    Each query token attends, per KV head, only to the 128-token blocks listed in its row
    of ``kv_block_indexes`` (causally masked inside them).

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, 128]`` bf16, fp16 or float8_e4m3fn.
    k, v : torch.Tensor
        Paged caches in q's dtype, ``[num_pages, 128, Hkv, 128]`` (token-major) or
        ``[num_pages, Hkv, 128, 128]`` (head-major).
    plan_info : MsaPlanInfo
        From :func:`sparse_msa_plan` (or any planner giving one ``sparse_prefill`` plan).
    **kw
        :func:`msa`'s other arguments: ``kv_block_indexes`` (required, int32
        ``[total_q, Hkv or Hq, selected_block_count]``, -1 = unused slot), ``page_table``
        or ``kv_indices``, ``out``, ``lse`` (float32 ``[total_q, Hq]`` buffer),
        ``sm_scale``, ``k_scale``, ``v_scale``, ``runtime_metadata``,
        ``q_offset_override``, ``check_input_valid``.

    Returns
    -------
    tuple
        ``(out, None)``: ``out`` is ``[total_q, Hq, 128]`` in q's dtype (bf16 for FP8
        inputs).

    Raises
    ------
    TypeError
        ``plan_info`` not an :class:`MsaPlanInfo`, ``output_o`` / ``output_maxscore`` /
        ``max_score`` given, or :func:`msa`'s type errors.
    ValueError
        a plan that is not a single ``sparse_prefill`` plan, or :func:`msa`'s value errors.

    Examples
    --------
    Two 128-token pages stored in swapped order; every token selects both blocks, so the
    result equals causal attention over the whole 256-token context:

    >>> import torch
    >>> from mate.msa_interface import sparse_msa, sparse_msa_plan
    >>> q = torch.randn(4, 2, 128, dtype=torch.bfloat16)
    >>> k, v = (torch.randn(2, 128, 1, 128, dtype=torch.bfloat16) for _ in range(2))
    >>> table = torch.tensor([[1, 0]], dtype=torch.int32)
    >>> info = sparse_msa_plan(torch.tensor([4]), torch.tensor([256]), num_qo_heads=2,
    ...                        num_kv_heads=1, kv_block_num=4)
    >>> blocks = torch.tensor([0, 1, -1, -1], dtype=torch.int32).expand(4, 1, 4).contiguous()
    >>> out, _ = sparse_msa(q, k, v, info, kv_block_indexes=blocks, page_table=table)
    >>> kk, vv = (x[table[0].long()].reshape(256, 128).expand(2, 256, 128) for x in (k, v))
    >>> mask = torch.ones(4, 256, dtype=torch.bool).tril(diagonal=252)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q.float().transpose(0, 1), kk.float(), vv.float(), attn_mask=mask).transpose(0, 1)
    >>> torch.allclose(out.float(), ref, atol=2e-2)  # bf16 output
    True
    """
    _check_single_sparse_plan("sparse_msa", plan_info, "sparse_prefill", kw)
    o, _ = msa(q, k, v, plan_info, **kw)
    return o, None


@mate_api
def sparse_decode_atten_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan_info: MsaPlanInfo,
    page_table: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    **kw: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse-decode MSA for a pure ``sparse_decode`` plan (a few query tokens per request).

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, 128]`` bf16, fp16 or float8_e4m3fn (at most 32 tokens per request).
    k, v : torch.Tensor
        Paged caches in q's dtype, ``[num_pages, 128, Hkv, 128]`` or
        ``[num_pages, Hkv, 128, 128]``.
    plan_info : MsaPlanInfo
        A single ``sparse_decode`` plan (:func:`_msa_plan_from_lengths` with short queries
        and ``kv_block_num > 0``, or :func:`msa_plan`).
    page_table : torch.Tensor, optional
        int32 ``[B, >= pages per request]``.
    return_softmax_lse : bool
        Also return the natural-log LSE.
    **kw
        :func:`msa`'s other arguments (``kv_block_indexes`` required, ``kv_indices``,
        ``out``, ``lse``, ``sm_scale``, ``k_scale``, ``v_scale``, ``runtime_metadata``,
        ``q_offset_override``, ``check_input_valid``).

    Returns
    -------
    torch.Tensor or tuple
        ``out`` ``[total_q, Hq, 128]`` (q's dtype, bf16 for FP8 inputs), or ``(out, lse)``
        with float32 ``lse`` ``[total_q, Hq]`` when ``return_softmax_lse=True``.

    Raises
    ------
    TypeError
        ``plan_info`` not an :class:`MsaPlanInfo`, a non-bool ``return_softmax_lse``,
        ``output_o`` / ``output_maxscore`` / ``max_score`` given, or :func:`msa`'s type
        errors.
    ValueError
        a plan that is not a single ``sparse_decode`` plan, or :func:`msa`'s value errors.

    Examples
    --------
    One decode token at position 255 that selects both pages of its context:

    >>> import torch
    >>> from mate.msa_interface import _msa_plan_from_lengths, sparse_decode_atten_func
    >>> q = torch.randn(1, 2, 128, dtype=torch.bfloat16)
    >>> k, v = (torch.randn(2, 128, 1, 128, dtype=torch.bfloat16) for _ in range(2))
    >>> table = torch.tensor([[0, 1]], dtype=torch.int32)
    >>> info = _msa_plan_from_lengths(torch.tensor([1]), torch.tensor([256]), num_qo_heads=2,
    ...                               num_kv_heads=1, page_size=128, kv_block_num=4)
    >>> info.plan.mode
    'sparse_decode'
    >>> blocks = torch.tensor([[[0, 1, -1, -1]]], dtype=torch.int32)
    >>> out, lse = sparse_decode_atten_func(q, k, v, info, page_table=table,
    ...                                     kv_block_indexes=blocks, return_softmax_lse=True)
    >>> logits = torch.einsum("hd,nd->hn", q[0].float(), k.reshape(256, 128).float()) / 128 ** 0.5
    >>> torch.allclose(lse[0], logits.logsumexp(-1), atol=1e-3)
    True
    >>> ref = logits.softmax(-1) @ v.reshape(256, 128).float()
    >>> torch.allclose(out[0].float(), ref, atol=2e-2)  # bf16 output
    True
    """
    _check_single_sparse_plan("sparse_decode_atten_func", plan_info, "sparse_decode", kw)
    check_bool("return_softmax_lse", return_softmax_lse)
    lse = kw.pop("lse", None)
    if return_softmax_lse and lse is None:
        lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    o, _ = msa(q, k, v, plan_info, page_table=page_table, lse=lse, **kw)
    return (o, lse) if return_softmax_lse else o
