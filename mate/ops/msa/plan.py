"""MSA plans: the plan types, the eager planner from lengths and the static planner.

A plan records everything an :func:`mate.msa_interface.msa` call needs that does not
change between the layers of one forward step: cumulative lengths, page pointers, the
head geometry, the top-k configuration and the execution mode. Planning may read host
values (it runs once per step); executing a plan never does.

Execution modes (``MsaPlan.mode``):

``"dense"``
    ordinary attention over ragged K/V ``[total_k, Hkv, D]`` (no top-k, no pages).
``"paged"``
    ordinary attention over a paged K/V cache (no top-k, ``page_size > 0``).
``"sparse_prefill"`` / ``"sparse_decode"``
    top-k block-sparse attention (``kv_block_num > 0``), paged with 128-token pages.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from mate._core.checks import check_bool, check_choice, check_int32, check_value
from mate.ops.msa.workspace import MsaWorkspace

__all__ = [
    "MsaPrefillPlan",
    "MsaDecodePlan",
    "MsaPlan",
    "MsaRuntimeMetadata",
    "MsaPlanInfo",
    "MSA_BLOCK",
    "SPARSE_DECODE_MAX_Q",
    "DENSE_DECODE_MAX_Q",
    "TOPK_CHOICES",
    "MAX_SELECTED_BLOCKS",
    "check_topk_config",
    "selected_block_count",
    "plan_mode",
    "_msa_plan_from_lengths",
    "msa_plan",
    "sparse_msa_plan",
]

MSA_BLOCK = 128
"""Key-block (and sparse page) size of MSA, in tokens."""
SPARSE_DECODE_MAX_Q = 32
"""Largest per-request query length that a sparse plan in ``auto`` mode runs as decode."""
DENSE_DECODE_MAX_Q = 128
"""Largest per-request query length of the decode part of a split dense/paged batch."""
TOPK_CHOICES = (4, 8, 16)
MAX_SELECTED_BLOCKS = 64
SPARSE_KERNEL_MODES = ("auto", "prefill", "decode")


# ----------------------------------------------------------------------------- types


@dataclasses.dataclass
class MsaPrefillPlan:
    """Ragged-batch lengths of a plan.

    Attributes
    ----------
    cu_seqlens_q, cu_seqlens_k : torch.Tensor or None
        int32 ``[B + 1]`` cumulative query / key lengths on the plan's device (``None``
        in a static plan: the runtime metadata supplies them).
    total_seqlen_k, max_seqlen_q, max_seqlen_k : int
        Host sizes (capacities in a static plan).
    total_seqlen_q : int
        Number of query tokens of the plan (``-1`` when unknown, as in a static plan). Left
        out (a plan built with the five documented fields), it is read from
        ``cu_seqlens_q[-1]`` (one host read). In a mixed plan, the decode part's
        ``total_seqlen_q`` / ``total_seqlen_k`` are the token offsets at which the prefill
        part's queries / dense keys start.
    """

    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    total_seqlen_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    total_seqlen_q: int = -1

    def __post_init__(self) -> None:
        if self.total_seqlen_q < 0 and self.cu_seqlens_q is not None and self.cu_seqlens_q.numel():
            self.total_seqlen_q = int(self.cu_seqlens_q[-1])


@dataclasses.dataclass
class MsaDecodePlan:
    """Decode-side metadata: per-request KV lengths (int32 ``[B]``) and page geometry.

    ``scheduler_metadata`` is an opaque object from
    ``mate.mha_interface.get_scheduler_metadata`` (or ``None``).
    """

    cache_seqlens: torch.Tensor | None
    page_size: int
    sparse_block_size: int
    scheduler_metadata: Any = None


@dataclasses.dataclass
class MsaPlan:
    """One homogeneous MSA plan (all requests run in the same ``mode``).

    Length vectors (``qo_lens``, ``kv_lens``, ``qo_offset``: int32 ``[B]``;
    ``kv_page_indptr``: int32 ``[B + 1]`` or ``None`` without pages) live on the plan's
    device. In a static plan (``is_static=True``) they are capacity placeholders and the
    call must pass :class:`MsaRuntimeMetadata`.
    """

    batch_size: int
    qo_lens: torch.Tensor | None
    kv_lens: torch.Tensor | None
    qo_offset: torch.Tensor | None
    kv_page_indptr: torch.Tensor | None
    num_qo_heads: int
    num_kv_heads: int
    page_size: int
    sparse_block_size: int
    num_kv_splits: int
    kv_block_num: int
    force_begin_blocks: int
    force_end_blocks: int
    force_blocks_count_in_topk: bool
    causal: bool
    output_maxscore: bool
    sparse_kernel_mode: str
    use_fp8_kvcache: bool
    mode: str
    prefill_plan: MsaPrefillPlan
    decode_plan: MsaDecodePlan | None = None
    is_static: bool = False
    default_qo_offset: bool | None = None
    """True when ``qo_offset == kv_lens - qo_lens`` (bottom-right causal alignment). Left out
    (a plan built with the documented fields), it is computed from the tensors, and again
    whenever ``qo_offset``, ``qo_lens`` or ``kv_lens`` is assigned (a host read each time);
    a static plan's placeholders count as the default."""
    kv_pages_end: int | None = None
    """``kv_page_indptr[-1]`` as a host int: the flat ``kv_indices`` entries the plan reads
    (read from ``kv_page_indptr`` when left out)."""
    workspace: MsaWorkspace = dataclasses.field(default_factory=MsaWorkspace, repr=False, compare=False)
    """Scratch buffers of the sparse forward, allocated at the plan's first call and reused
    by every later call (see :mod:`mate.ops.msa.workspace`)."""

    def __post_init__(self) -> None:
        if self.default_qo_offset is None:
            self.default_qo_offset = self._has_default_qo_offset()
        if self.kv_pages_end is None:
            indptr = self.kv_page_indptr
            self.kv_pages_end = int(indptr[-1]) if indptr is not None and indptr.numel() else 0
        self.__dict__["_derived"] = True

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in ("qo_offset", "qo_lens", "kv_lens") and self.__dict__.get("_derived"):
            super().__setattr__("default_qo_offset", self._has_default_qo_offset())

    def _has_default_qo_offset(self) -> bool:
        if self.is_static or self.qo_offset is None or self.qo_lens is None or self.kv_lens is None:
            return True
        return bool(torch.equal(self.qo_offset.to(self.kv_lens.device), self.kv_lens - self.qo_lens))

    @property
    def rows_capacity(self) -> int:
        """Query rows the workspace is sized for: ``batch_size * max_seqlen_q`` in a static
        plan, the plan's query tokens otherwise."""
        if self.is_static:
            return self.batch_size * self.prefill_plan.max_seqlen_q
        return max(0, self.prefill_plan.total_seqlen_q)

    @property
    def selected_block_count(self) -> int:
        """Width of a ``kv_block_indexes`` row: top-k, plus the forced blocks unless they
        are counted inside the top-k (0 for dense and paged plans)."""
        if self.kv_block_num <= 0:
            return 0
        return selected_block_count(
            self.kv_block_num, self.force_begin_blocks, self.force_end_blocks, self.force_blocks_count_in_topk
        )

    @property
    def is_sparse(self) -> bool:
        return self.mode in ("sparse_prefill", "sparse_decode")

    @property
    def max_k_tiles(self) -> int:
        """Number of 128-token key tiles a max-score row needs: ceil(max_seqlen_k / 128)."""
        return -(-self.prefill_plan.max_seqlen_k // MSA_BLOCK)

    @property
    def max_pages(self) -> int:
        """Pages a ``page_table`` row needs (0 without pages)."""
        if self.page_size <= 0:
            return 0
        return -(-self.prefill_plan.max_seqlen_k // self.page_size)


@dataclasses.dataclass
class MsaRuntimeMetadata:
    """Live lengths for executing a (static) plan, written into preallocated buffers.

    ``cu_seqlens_q``, ``cu_seqlens_k`` (int32 ``[B + 1]``) and ``seqused_k`` (int32
    ``[B]``: the KV length of each request) are required with a static plan, plus
    ``page_table`` (int32 ``[B, >= ceil(max_seqlen_k / page_size)]``) for paged and sparse
    modes. ``qo_offset`` (int32 ``[B]``) is optional: ``None`` means ``kv_len - q_len``.
    ``qo_lens`` and ``kv_lens`` are informational (the kernels read the cumulative
    lengths and ``seqused_k``). ``kv_page_indptr`` is accepted and unused by the kernels
    (the page table is the runtime page map). All tensors: contiguous int32 on q's
    device.
    """

    qo_lens: torch.Tensor | None
    kv_lens: torch.Tensor | None
    qo_offset: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    kv_page_indptr: torch.Tensor | None = None
    page_table: torch.Tensor | None = None
    seqused_k: torch.Tensor | None = None


class MsaPlanInfo(NamedTuple):
    """What the planners return.

    ``split`` is the index of the first request of the prefill part (``batch_size`` when
    the plan is not mixed). With ``has_mixed_prefill``, ``plan`` covers requests
    ``[0, split)`` (the decode part) and ``prefill_plan_or_None`` requests
    ``[split, batch_size)``; their query tokens are consecutive in ``q``.
    """

    has_mixed_prefill: bool
    split: int
    batch_size: int
    plan: MsaPlan
    prefill_plan_or_None: MsaPlan | None


# ----------------------------------------------------------------------------- rules


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def selected_block_count(topk: int, force_begin_blocks: int, force_end_blocks: int, counted: bool) -> int:
    return topk if counted else topk + force_begin_blocks + force_end_blocks


def check_topk_config(topk: Any, force_begin_blocks: Any, force_end_blocks: Any, counted: Any,
                      *, topk_name: str = "kv_block_num") -> int:
    """Validates a top-k configuration; returns the selected block count."""
    _check_int(topk_name, topk)
    _check_int("force_begin_blocks", force_begin_blocks)
    _check_int("force_end_blocks", force_end_blocks)
    check_bool("force_blocks_count_in_topk", counted)
    check_value(topk_name, topk in TOPK_CHOICES, f"one of {TOPK_CHOICES}", topk)
    check_value("force_begin_blocks", force_begin_blocks >= 0, ">= 0", force_begin_blocks)
    check_value("force_end_blocks", force_end_blocks >= 0, ">= 0", force_end_blocks)
    forced = force_begin_blocks + force_end_blocks
    if counted and forced > topk:
        raise ValueError(
            f"force_begin_blocks + force_end_blocks counted in the top-k must be <= {topk_name} ({topk}), "
            f"got {force_begin_blocks} + {force_end_blocks} = {forced}"
        )
    count = selected_block_count(topk, force_begin_blocks, force_end_blocks, counted)
    if count > MAX_SELECTED_BLOCKS:
        raise ValueError(f"selected block count ({topk_name} + forced blocks) must be <= {MAX_SELECTED_BLOCKS}, "
                         f"got {count}")
    return count


def plan_mode(kv_block_num: int, page_size: int, sparse_kernel_mode: str, max_seqlen_q: int) -> str:
    if kv_block_num > 0:
        if sparse_kernel_mode == "prefill":
            return "sparse_prefill"
        if sparse_kernel_mode == "decode":
            return "sparse_decode"
        return "sparse_prefill" if max_seqlen_q > SPARSE_DECODE_MAX_Q else "sparse_decode"
    return "paged" if page_size > 0 else "dense"


def _check_config(
    *,
    num_qo_heads: Any,
    num_kv_heads: Any,
    page_size: Any,
    sparse_block_size: Any,
    num_kv_splits: Any,
    kv_block_num: Any,
    force_begin_blocks: Any,
    force_end_blocks: Any,
    force_blocks_count_in_topk: Any,
    causal: Any,
    sparse_kernel_mode: Any,
    output_maxscore: Any,
    use_fp8_kvcache: Any,
) -> None:
    """Every configuration rule shared by the eager and the static planner."""
    _check_int("num_qo_heads", num_qo_heads)
    _check_int("num_kv_heads", num_kv_heads)
    check_value("num_qo_heads", num_qo_heads > 0, "a positive int", num_qo_heads)
    check_value("num_kv_heads", num_kv_heads > 0, "a positive int", num_kv_heads)
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads must be a multiple of num_kv_heads ({num_kv_heads}), got {num_qo_heads}"
        )
    _check_int("page_size", page_size)
    _check_int("sparse_block_size", sparse_block_size)
    _check_int("num_kv_splits", num_kv_splits)
    _check_int("kv_block_num", kv_block_num)
    check_bool("causal", causal)
    check_bool("output_maxscore", output_maxscore)
    check_bool("use_fp8_kvcache", use_fp8_kvcache)
    check_bool("force_blocks_count_in_topk", force_blocks_count_in_topk)
    check_choice("sparse_kernel_mode", sparse_kernel_mode, SPARSE_KERNEL_MODES)
    check_value("page_size", page_size == -1 or page_size == 0 or (page_size >= 16 and page_size & (page_size - 1) == 0),
                "-1 (no pages) or a power of two >= 16", page_size)
    check_value("sparse_block_size", sparse_block_size > 0, "a positive int", sparse_block_size)
    check_value("num_kv_splits", num_kv_splits == -1 or num_kv_splits > 0, "-1 (automatic) or a positive int",
                num_kv_splits)
    if kv_block_num > 0:
        check_topk_config(kv_block_num, force_begin_blocks, force_end_blocks, force_blocks_count_in_topk)
        check_value("page_size", page_size == MSA_BLOCK, f"{MSA_BLOCK} for sparse MSA (kv_block_num > 0)", page_size)
        check_value("sparse_block_size", sparse_block_size == MSA_BLOCK,
                    f"{MSA_BLOCK} for sparse MSA (kv_block_num > 0)", sparse_block_size)
    else:
        check_value("kv_block_num", kv_block_num in (-1, 0), "-1 or 0 (no top-k) or one of (4, 8, 16)",
                    kv_block_num)
        _check_int("force_begin_blocks", force_begin_blocks)
        _check_int("force_end_blocks", force_end_blocks)
        if force_begin_blocks or force_end_blocks:
            raise ValueError(
                "force_begin_blocks / force_end_blocks need a top-k (kv_block_num > 0), got "
                f"force_begin_blocks={force_begin_blocks}, force_end_blocks={force_end_blocks} "
                f"with kv_block_num={kv_block_num}"
            )
    if output_maxscore and page_size > 0:
        check_value("page_size", page_size == MSA_BLOCK, f"{MSA_BLOCK} for a max-score output on a paged plan",
                    page_size)


# ----------------------------------------------------------------------------- eager planner


def _as_cpu_lengths(name: str, value: Any, batch: int | None) -> torch.Tensor:
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value, dtype=torch.int64)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a CPU integer torch.Tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise TypeError(f"{name} must be an integer tensor (int32 or int64), got {value.dtype}")
    if value.device.type != "cpu":
        raise ValueError(
            f"{name} must be a CPU tensor (reading lengths from {value.device} would be a hidden host sync), "
            f"got a tensor on {value.device}"
        )
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D [batch_size], got shape {list(value.shape)}")
    if batch is not None and value.shape[0] != batch:
        raise ValueError(f"{name} must have shape [{batch}] (the batch size of qo_lens), got {list(value.shape)}")
    value = value.to(torch.int64)
    check_int32(name, value)  # the plan stores int32
    return value


def _cumsum0(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0] + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(x, 0)
    return out


def _build_plan(
    qo_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor,
    page_base: int,
    device: torch.device,
    cfg: dict,
    mode: str,
    total_q: int,
) -> MsaPlan:
    """One homogeneous plan from int64 CPU lengths; ``page_base`` is the first page
    pointer (a sub-plan of a mixed batch keeps absolute pointers into ``kv_indices``)."""
    B = qo_lens.shape[0]
    page_size = cfg["page_size"]
    cu_q = _cumsum0(qo_lens)
    cu_k = _cumsum0(kv_lens)
    max_q = int(qo_lens.max()) if B else 0
    max_k = int(kv_lens.max()) if B else 0
    i32 = dict(dtype=torch.int32, device=device)
    indptr, pages_end = None, 0
    if page_size > 0:
        pages = (kv_lens + page_size - 1) // page_size
        indptr = (_cumsum0(pages) + page_base).to(**i32)
        pages_end = page_base + int(pages.sum())
    for name, total in (("qo_lens", int(cu_q[-1])), ("kv_lens", int(cu_k[-1])), ("kv_lens (pages)", pages_end)):
        check_value(f"sum of {name}", total < 2**31, "< 2**31 (int32 offsets)", total)
    prefill = MsaPrefillPlan(cu_q.to(**i32), cu_k.to(**i32), int(cu_k[-1]), max_q, max_k, total_q)
    decode = None
    if page_size > 0:
        decode = MsaDecodePlan(kv_lens.to(**i32), page_size, cfg["sparse_block_size"])
    return MsaPlan(
        batch_size=B,
        qo_lens=qo_lens.to(**i32),
        kv_lens=kv_lens.to(**i32),
        qo_offset=qo_offset.to(**i32),
        kv_page_indptr=indptr,
        num_qo_heads=cfg["num_qo_heads"],
        num_kv_heads=cfg["num_kv_heads"],
        page_size=page_size,
        sparse_block_size=cfg["sparse_block_size"],
        num_kv_splits=cfg["num_kv_splits"],
        kv_block_num=cfg["kv_block_num"],
        force_begin_blocks=cfg["force_begin_blocks"],
        force_end_blocks=cfg["force_end_blocks"],
        force_blocks_count_in_topk=cfg["force_blocks_count_in_topk"],
        causal=cfg["causal"],
        output_maxscore=cfg["output_maxscore"],
        sparse_kernel_mode=cfg["sparse_kernel_mode"],
        use_fp8_kvcache=cfg["use_fp8_kvcache"],
        mode=mode,
        prefill_plan=prefill,
        decode_plan=decode,
        is_static=False,
        default_qo_offset=bool(torch.equal(qo_offset, kv_lens - qo_lens)),
        kv_pages_end=pages_end,
    )


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
    """Eager MSA plan from per-request lengths held on the CPU (public, logged and fully
    documented as :func:`mate.msa_interface._msa_plan_from_lengths`).

    Parameters
    ----------
    qo_lens, kv_lens : torch.Tensor
        Integer CPU tensors ``[B]``: query tokens and KV context length per request
        (device tensors raise ``ValueError``: reading them would be a hidden host sync).
    num_qo_heads, num_kv_heads : int
        Head counts (``num_kv_heads`` defaults to ``num_qo_heads``); Hq must be a multiple
        of Hkv.
    qo_offset : torch.Tensor or int, optional
        Absolute position of each request's first query token; default ``kv_len - q_len``.
    split_prefill_decode : bool
        Split a decode-first batch at the first request whose q_len exceeds the threshold
        (32 for sparse plans, 128 otherwise) into a decode and a prefill plan. Only in
        ``sparse_kernel_mode="auto"``.
    page_size : int
        ``-1`` for dense ragged K/V, else the page size of the paged cache (128 for sparse
        modes and for max-score output).
    kv_block_num : int
        Top-k (4, 8 or 16) for sparse execution, ``-1`` for none.
    force_begin_blocks, force_end_blocks, force_blocks_count_in_topk, causal,
    sparse_kernel_mode, num_kv_splits, output_maxscore, use_fp8_kvcache, sparse_block_size
        See :class:`MsaPlan`.
    device : torch.device or str, optional
        Where the plan's tensors live (the device of the later ``msa`` calls); default CPU.

    Returns
    -------
    MsaPlanInfo
    """
    qo = _as_cpu_lengths("qo_lens", qo_lens, None)
    B = qo.shape[0]
    kv = _as_cpu_lengths("kv_lens", kv_lens, B)
    if num_kv_heads is None:
        num_kv_heads = num_qo_heads
    check_bool("split_prefill_decode", split_prefill_decode)
    _check_config(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, page_size=page_size,
                  sparse_block_size=sparse_block_size, num_kv_splits=num_kv_splits, kv_block_num=kv_block_num,
                  force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
                  force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal,
                  sparse_kernel_mode=sparse_kernel_mode, output_maxscore=output_maxscore,
                  use_fp8_kvcache=use_fp8_kvcache)
    if B and bool((qo < 0).any()):
        raise ValueError(f"qo_lens must be >= 0, got a minimum of {int(qo.min())}")
    if B and bool((kv < 0).any()):
        raise ValueError(f"kv_lens must be >= 0, got a minimum of {int(kv.min())}")
    if qo_offset is None:
        off = kv - qo
    elif isinstance(qo_offset, int) and not isinstance(qo_offset, bool):
        check_int32("qo_offset", qo_offset)
        off = torch.full((B,), qo_offset, dtype=torch.int64)
    else:
        off = _as_cpu_lengths("qo_offset", qo_offset, B)
    try:
        dev = torch.device("cpu") if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be a torch.device or a device string, got {device!r}") from exc
    cfg = dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, page_size=page_size,
               sparse_block_size=sparse_block_size, num_kv_splits=num_kv_splits, kv_block_num=kv_block_num,
               force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
               force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal,
               sparse_kernel_mode=sparse_kernel_mode, output_maxscore=output_maxscore,
               use_fp8_kvcache=use_fp8_kvcache)
    threshold = SPARSE_DECODE_MAX_Q if kv_block_num > 0 else DENSE_DECODE_MAX_Q
    split = B
    if split_prefill_decode and sparse_kernel_mode == "auto" and B > 1:
        over = (qo > threshold).nonzero().flatten()
        if over.numel():
            first = int(over[0])
            # decode-first ordering: everything from the first long request on is long
            if first > 0 and bool((qo[first:] > threshold).all()):
                split = first
    total_q = int(qo.sum())
    if split < B:
        nq0 = int(qo[:split].sum())
        page_base = 0
        if page_size > 0:
            page_base = int(((kv[:split] + page_size - 1) // page_size).sum())
        dec = _build_plan(qo[:split], kv[:split], off[:split], 0, dev, cfg,
                          plan_mode(kv_block_num, page_size, sparse_kernel_mode, int(qo[:split].max())), nq0)
        pre = _build_plan(qo[split:], kv[split:], off[split:], page_base, dev, cfg,
                          plan_mode(kv_block_num, page_size, sparse_kernel_mode, int(qo[split:].max())),
                          total_q - nq0)
        return MsaPlanInfo(True, split, B, dec, pre)
    max_q = int(qo.max()) if B else 0
    plan = _build_plan(qo, kv, off, 0, dev, cfg, plan_mode(kv_block_num, page_size, sparse_kernel_mode, max_q),
                       total_q)
    return MsaPlanInfo(False, B, B, plan, None)


def sparse_msa_plan(
    qo_lens: torch.Tensor,
    kv_lens: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int | None = None,
    kv_block_num: int = 16,
    page_size: int = MSA_BLOCK,
    **kwargs: Any,
) -> MsaPlanInfo:
    """The eager planner with ``sparse_kernel_mode="prefill"`` and no split; raises
    ``ValueError`` unless the result is a single sparse-prefill plan (public form:
    :func:`mate.msa_interface.sparse_msa_plan`)."""
    for key in ("sparse_kernel_mode", "split_prefill_decode"):
        if key in kwargs:
            raise TypeError(f"sparse_msa_plan() got an unexpected keyword argument {key!r} (it is fixed)")
    info = _msa_plan_from_lengths(qo_lens, kv_lens, num_qo_heads, num_kv_heads, kv_block_num=kv_block_num,
                                  page_size=page_size, sparse_kernel_mode="prefill", split_prefill_decode=False,
                                  **kwargs)
    if info.has_mixed_prefill or info.plan.mode != "sparse_prefill":
        raise ValueError(f"sparse_msa_plan must give one sparse_prefill plan, got mode {info.plan.mode!r} "
                         f"(kv_block_num={kv_block_num})")
    return info


# ----------------------------------------------------------------------------- static planner


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
    """Static, capture-safe MSA plan built from capacities only (``is_static=True``; public
    form: :func:`mate.msa_interface.msa_plan`).

    The plan never reads live lengths: its length vectors are CPU placeholders filled with
    the capacities, and executing it requires :class:`MsaRuntimeMetadata` with
    ``cu_seqlens_q``, ``cu_seqlens_k``, ``seqused_k`` (and ``page_table`` for paged and
    sparse modes), written before each launch or graph replay.

    Raises
    ------
    ValueError
        non-positive heads or capacities, Hq not a multiple of Hkv, ``total_seqlen_k <
        max_seqlen_k``, or a mode rule (see :class:`MsaPlan`).
    """
    for name, value in (("batch_size", batch_size), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        _check_int(name, value)
        check_value(name, value > 0, "a positive int", value)
    if num_kv_heads is None:
        num_kv_heads = num_qo_heads
    if total_seqlen_k is None:
        total_seqlen_k = batch_size * max_seqlen_k
    _check_int("total_seqlen_k", total_seqlen_k)
    check_value("total_seqlen_k", total_seqlen_k >= max_seqlen_k, f">= max_seqlen_k ({max_seqlen_k})", total_seqlen_k)
    _check_config(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, page_size=page_size,
                  sparse_block_size=sparse_block_size, num_kv_splits=num_kv_splits, kv_block_num=kv_block_num,
                  force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
                  force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal,
                  sparse_kernel_mode=sparse_kernel_mode, output_maxscore=output_maxscore,
                  use_fp8_kvcache=use_fp8_kvcache)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k),
                        ("total_seqlen_k", total_seqlen_k), ("batch_size * max_seqlen_q", batch_size * max_seqlen_q)):
        check_value(name, value < 2**31, "< 2**31 (int32 lengths and offsets)", value)
    qo = torch.full((batch_size,), max_seqlen_q, dtype=torch.int32)
    kv = torch.full((batch_size,), max_seqlen_k, dtype=torch.int32)
    prefill = MsaPrefillPlan(None, None, total_seqlen_k, max_seqlen_q, max_seqlen_k, -1)
    decode = MsaDecodePlan(None, page_size, sparse_block_size) if page_size > 0 else None
    plan = MsaPlan(
        batch_size=batch_size, qo_lens=qo, kv_lens=kv, qo_offset=kv - qo, kv_page_indptr=None,
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, page_size=page_size,
        sparse_block_size=sparse_block_size, num_kv_splits=num_kv_splits, kv_block_num=kv_block_num,
        force_begin_blocks=force_begin_blocks, force_end_blocks=force_end_blocks,
        force_blocks_count_in_topk=force_blocks_count_in_topk, causal=causal, output_maxscore=output_maxscore,
        sparse_kernel_mode=sparse_kernel_mode, use_fp8_kvcache=use_fp8_kvcache,
        mode=plan_mode(kv_block_num, page_size, sparse_kernel_mode, max_seqlen_q),
        prefill_plan=prefill, decode_plan=decode, is_static=True,
    )
    return MsaPlanInfo(False, batch_size, batch_size, plan, None)
