"""FlashInfer's sparse MLA decode names (``flashinfer.decode``) on top of mate.

``trtllm_batch_decode_with_kv_cache_mla`` keeps upstream FlashInfer 0.6.17's arguments
(names, order, defaults) and adds ``metadata=``, the reusable schedule made by
``get_batch_decode_metadata_mla``. It runs mate's FP8 sparse MLA decode whatever
``backend`` names.
"""

from __future__ import annotations

from typing import Any

import torch

import mate.sparse_mla_interface as _mate_mla
from flashinfer._compat import mate_backend as _mate_backend
from mate._core.checks import check_default as _check_default
from mate.api_logging import mate_api as _mate_api

__all__ = ["get_batch_decode_metadata_mla", "trtllm_batch_decode_with_kv_cache_mla"]


@_mate_api
def get_batch_decode_metadata_mla(query: torch.Tensor, seq_lens: torch.Tensor, sparse_mla_top_k: int) -> Any:
    """Plans the sparse MLA decode once, for reuse across decode steps.

    Forwards to :func:`mate.sparse_mla_interface.get_batch_decode_metadata_mla`.

    Parameters
    ----------
    query : torch.Tensor
        The decode query, float8_e4m3fn ``[B, q_len, H, 576]``.
    seq_lens : torch.Tensor
        int32 ``[B]`` on the query's device.
    sparse_mla_top_k : int
        Positive multiple of 64.

    Returns
    -------
    object
        Metadata for ``trtllm_batch_decode_with_kv_cache_mla(..., metadata=)``. It depends
        only on (B, q_len, H, top-k) and the device, so it stays valid while the values in
        ``seq_lens`` change (preparing it again after they change is allowed, never needed).
        Do not share one object between overlapping decode calls.

    Raises
    ------
    TypeError
        Wrong dtypes or a non-int ``sparse_mla_top_k``.
    ValueError
        Wrong shapes or devices, a top-k that is not a positive multiple of 64.

    Examples
    --------
    >>> import torch
    >>> from flashinfer.decode import get_batch_decode_metadata_mla
    >>> query = torch.zeros(2, 1, 16, 576, dtype=torch.float8_e4m3fn)
    >>> meta = get_batch_decode_metadata_mla(query, torch.tensor([5, 9], dtype=torch.int32), 64)
    >>> meta is not None
    True
    """
    return _mate_mla.get_batch_decode_metadata_mla(query, seq_lens, sparse_mla_top_k)


@_mate_api
def trtllm_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor | None,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: torch.Tensor | None = None,
    bmm1_scale: float | torch.Tensor = 1.0,
    bmm2_scale: float | torch.Tensor = 1.0,
    sinks: list[torch.Tensor] | None = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    enable_pdl: bool | None = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: torch.Tensor | None = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: torch.Tensor | None = None,
    max_q_len: int | None = None,
    multi_ctas_kv_counter_buffer: torch.Tensor | None = None,
    sparse_mla_top_k_lens: torch.Tensor | None = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: torch.Tensor | None = None,
    metadata: Any = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FP8 sparse MLA decode (DeepSeek-V3.2): each query attends to its top-k cached tokens.

    Forwards to :func:`mate.sparse_mla_interface.sparse_mla_fp8_decode`, which documents
    the semantics and validates the arguments.

    Parameters
    ----------
    query : torch.Tensor
        Contiguous float8_e4m3fn ``[B, q_len, H, 576]`` (512 latent values, then 64 rope values).
    kv_cache : torch.Tensor
        Contiguous float8_e4m3fn ``[pages, page_size, 576]`` or ``[pages, 1, page_size, 576]``.
    workspace_buffer : torch.Tensor or None
        Accepted and ignored (mate owns its scratch space).
    qk_nope_head_dim : int
        Accepted and ignored.
    kv_lora_rank, qk_rope_head_dim : int
        Must be 512 and 64.
    block_tables : torch.Tensor
        Contiguous int32 ``[B, q_len, sparse_mla_top_k]``: physical token numbers
        (``page * page_size + slot``); negative or out-of-range entries are skipped.
    seq_lens : torch.Tensor or None
        int32 ``[B]``: only the first ``seq_lens[b]`` index slots of batch ``b`` count.
    max_seq_len : int
        Accepted and ignored.
    sparse_mla_top_k : int
        Positive multiple of 64 equal to ``block_tables.shape[-1]`` (dense MLA, 0, is not
        provided: ``ValueError``).
    out : torch.Tensor, optional
        Contiguous bfloat16 ``[B, q_len, H, 512]``; written and returned when given.
    bmm1_scale, bmm2_scale : float
        Python floats: ``logits = bmm1_scale * q.k``, ``out = bmm2_scale * softmax @ v``. With
        ``q_fp8 = q * sq`` and ``kv_fp8 = kv * skv``, pass ``softmax_scale / (sq * skv)`` and
        ``1 / skv``. Tensor-valued scales: ``NotImplementedError``.
    sinks, skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx, cum_seq_lens_q, max_q_len
        Only their defaults (``NotImplementedError`` otherwise).
    enable_pdl, is_var_seq, cute_dsl_impl, kv_scale_format, multi_ctas_kv_counter_buffer
        Accepted and ignored.
    backend : str
        Any upstream name (``"trtllm-gen"``, ``"xqa"``, ``"cute-dsl"``, ``"auto"``, ...):
        mate always runs its FP8 sparse MLA decode.
    lse : torch.Tensor, optional
        float32 ``[B * q_len, H]`` or ``[B, q_len, H]``, written in place (natural log).
    return_lse : bool
        Also return the log-sum-exp of the logits (``+inf`` where no slot is valid).
    sparse_mla_top_k_lens, enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global
        Upstream options mate does not implement: only their defaults
        (``None``, ``False``, ``1``, ``0``, ``None``); ``NotImplementedError`` otherwise.
    metadata : object, optional
        Not in upstream: the result of :func:`get_batch_decode_metadata_mla` for this
        query shape and top-k, reused across calls (CUDA-graph friendly). When omitted, eager
        calls reuse the plan kept for their shape on the current stream (mate's
        ``sparse_mla_fp8_decode``); a call under CUDA-graph capture plans for itself.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        ``out`` (bfloat16 ``[B, q_len, H, 512]``), or ``(out, lse)`` when ``return_lse``.

    Raises
    ------
    TypeError
        Wrong dtypes, a non-bool ``return_lse``, a foreign ``metadata`` object.
    ValueError
        Wrong shapes or devices, ``kv_lora_rank != 512``, ``qk_rope_head_dim != 64``, a
        top-k that is not a positive multiple of 64 equal to ``block_tables.shape[-1]``,
        an unknown backend name, metadata made for another configuration.
    NotImplementedError
        One of the unimplemented upstream options above set, tensor-valued scales.

    Examples
    --------
    A query whose only valid slot is cache row 5: the output is that row's first 512
    values (softmax over one key is 1), and the LSE is the single logit:

    >>> import torch
    >>> from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
    >>> query = torch.randn(1, 1, 4, 576).to(torch.float8_e4m3fn)
    >>> kv_cache = torch.randn(1, 64, 576).to(torch.float8_e4m3fn)
    >>> block_tables = torch.full((1, 1, 64), -1, dtype=torch.int32)
    >>> block_tables[0, 0, 0] = 5
    >>> out, lse = trtllm_batch_decode_with_kv_cache_mla(
    ...     query, kv_cache, None, 128, 512, 64, block_tables, torch.tensor([64], dtype=torch.int32),
    ...     64, sparse_mla_top_k=64, bmm1_scale=0.1, return_lse=True, backend="trtllm-gen")
    >>> torch.equal(out[0, 0], kv_cache[0, 5, :512].bfloat16().expand(4, 512))
    True
    >>> torch.allclose(lse[0, 0], 0.1 * query[0, 0].float() @ kv_cache[0, 5].float(), atol=1e-3)
    True
    """
    _check_default("sparse_mla_top_k_lens", sparse_mla_top_k_lens, None)
    _check_default("enable_dcp", enable_dcp, False)
    _check_default("cp_world", cp_world, 1)
    _check_default("cp_rank", cp_rank, 0)
    _check_default("causal_seqlens_kv_global", causal_seqlens_kv_global, None)
    return _mate_mla.sparse_mla_fp8_decode(
        query,
        kv_cache,
        workspace_buffer,
        qk_nope_head_dim,
        kv_lora_rank,
        qk_rope_head_dim,
        block_tables,
        seq_lens,
        max_seq_len,
        sparse_mla_top_k=sparse_mla_top_k,
        out=out,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        sinks=sinks,
        skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        enable_pdl=enable_pdl,
        backend=_mate_backend(backend),
        is_var_seq=is_var_seq,
        uses_shared_paged_kv_idx=uses_shared_paged_kv_idx,
        lse=lse,
        return_lse=return_lse,
        cute_dsl_impl=cute_dsl_impl,
        kv_scale_format=kv_scale_format,
        cum_seq_lens_q=cum_seq_lens_q,
        max_q_len=max_q_len,
        multi_ctas_kv_counter_buffer=multi_ctas_kv_counter_buffer,
        metadata=metadata,
    )
