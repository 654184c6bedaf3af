"""Dense and paged attention with FlashAttention-3's interface (MSA's dense and paged modes).

``flash_attn_varlen_func``, ``flash_attn_with_kvcache`` and ``get_scheduler_metadata``
keep FA3's signatures. Conventions: causal and window masks are bottom-right aligned
(query i of a request with q_len queries and k_len keys sits at key position
i + k_len - q_len), GQA by head groups (query head h uses KV head h // (Hq / Hkv)), the
LSE is natural-log fp32, and a query that sees no key gets output 0 and LSE -inf.

CUDA tensors run Triton kernels: prefill (fp16 / bf16, head dims 64 and 128, no left window,
queries of 64 tokens or more; ragged, batched or paged K/V with pages of 64 keys or a
multiple) a TMA kernel with one query head per program (``mate.ops.mha.prefill_tma``),
everything else (decode, left windows, smaller pages, other head dims) a kernel that packs
the GQA heads of a KV head into its MMA rows; a single dense sequence goes to torch's fused
SDPA (with the LSE through aten's cuDNN op), which is as fast as it gets there. CPU tensors
run the fp32 PyTorch reference. Arguments listed as not implemented raise
``NotImplementedError`` when given a non-default value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mate._core import checks
from mate._core.dispatch import select_backend
from mate._core.hopper import GRID_YZ_MAX
from mate._core.recipe import RecipeCache, RecipeCall, call_key, recipes_usable, recorded
from mate.api_logging import mate_api

__all__ = ["MhaSchedulerMetadata", "flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata"]

_DTYPES = (torch.float16, torch.bfloat16)
_HEAD_DIMS = (16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class MhaSchedulerMetadata:
    """Opaque scheduling object of ``get_scheduler_metadata``: the configuration it was made
    for. The Triton kernels need no precomputed schedule; calls accept it and check heads."""

    batch_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_heads_q: int
    num_heads_kv: int
    headdim: int
    causal: bool
    window_size: tuple[int, int]
    page_size: int | None


def _not_implemented(**given: tuple[Any, Any]) -> None:
    checks.check_defaults(given)


def _check_window(window_size: Any) -> tuple[int, int]:
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, unbounded
        return -1, -1
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size))
    checks.check_value("window_size", ok, "a pair of ints >= -1", window_size)
    return int(window_size[0]), int(window_size[1])


def _check_max_seqlen_q(cu_seqlens_q: torch.Tensor, max_seqlen_q: Any, type_note: str = "") -> None:
    """``max_seqlen_q`` must be an int (``TypeError`` otherwise, ``type_note`` appended to the
    expectation); it sizes the launch grid: in [0, 2**31). It is a promise (FlashAttention's
    contract): the launch covers that many queries per request, and a longer request's later
    rows are not computed; checked against ``cu_seqlens_q`` (a host read) only when
    ``MATE_CHECK_INPUTS=1``."""
    if max_seqlen_q is None or isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
        raise TypeError(f"max_seqlen_q must be an int{type_note}, got {type(max_seqlen_q).__name__}")
    checks.check_value("max_seqlen_q", 0 <= max_seqlen_q < 2**31, "in [0, 2**31)", max_seqlen_q)
    if checks.check_inputs_enabled() and cu_seqlens_q.numel() > 1:
        longest = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        checks.check_value("max_seqlen_q", longest <= max_seqlen_q,
                           f">= the longest request in cu_seqlens_q ({longest})", max_seqlen_q)


def _check_scheduler(meta: Any, hq: int, hkv: int) -> None:
    if meta is None:
        return
    checks.check_value("scheduler_metadata", isinstance(meta, MhaSchedulerMetadata),
                       "an object returned by get_scheduler_metadata or None", type(meta).__name__)
    checks.check_value("scheduler_metadata.num_heads_q", meta.num_heads_q == hq, f"{hq} (q's heads)", meta.num_heads_q)
    checks.check_value("scheduler_metadata.num_heads_kv", meta.num_heads_kv == hkv, f"{hkv} (k's heads)",
                       meta.num_heads_kv)


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    *_, hq, d = q.shape
    *_, hkv, dk = k.shape
    dv = v.shape[-1]
    if d not in _HEAD_DIMS:
        checks.check_value("q.shape[-1] (headdim)", False, f"one of {_HEAD_DIMS}", d)
    if dk != d:
        checks.check_value("k.shape[-1] (headdim)", False, f"{d} (q's headdim)", dk)
    if dv != d:
        raise NotImplementedError(f"v.shape[-1] (headdim_v) must equal headdim {d}; got {dv} (not implemented)")
    if hkv <= 0 or hq % hkv:
        checks.check_value("k.shape[-2] (num_heads_k)", False, f"a divisor of num_heads_q={hq}", hkv)
    return hq, hkv, d


def _run(q, k, v, out, lse, *, cu_seqlens_q, max_seqlen_q, cu_seqlens_k, seqused_k, page_table, batched,
         softmax_scale, window, backend, skip_whole=False, batch=0, k_uniform=0) -> None:
    """``cu_seqlens_q`` None: ``batch`` requests of ``max_seqlen_q`` queries each;
    ``cu_seqlens_k`` and ``seqused_k`` None: ``k_uniform`` keys per request. ``backend``: the
    one :func:`select_backend` chose."""
    if backend not in ("triton", "reference"):
        raise ValueError(f"backend must be 'triton' or 'reference' (select_backend's choice), got {backend!r}")
    if backend == "reference":
        from mate.ops.mha.reference import attention_varlen_reference

        if cu_seqlens_q is None:
            cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=q.device) * max_seqlen_q
        b = cu_seqlens_q.shape[0] - 1
        if seqused_k is not None:
            k_lens = [int(x) for x in seqused_k.tolist()]
        elif cu_seqlens_k is not None:
            ck = cu_seqlens_k.tolist()
            k_lens = [ck[i + 1] - ck[i] for i in range(b)]
        else:
            k_lens = [k_uniform] * b
        starts = None if cu_seqlens_k is None else [int(x) for x in cu_seqlens_k.tolist()[:b]]
        ro, rl = attention_varlen_reference(q, k, v, cu_seqlens_q, k_lens, k_starts=starts, page_table=page_table,
                                            batched=batched, softmax_scale=softmax_scale, causal=False,
                                            window_size=window)
        out.copy_(ro)
        lse.copy_(rl)
        return
    from mate.ops.mha.attention import mha_fwd_op

    # the requests are a launch-grid y / z axis of both kernels
    requests = batch if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    if requests > GRID_YZ_MAX:
        checks.check_value("cu_seqlens_q" if cu_seqlens_q is not None else "q.shape[0] (batch)", False,
                           f"at most {GRID_YZ_MAX} requests per call", requests)
    mha_fwd_op(q, k, v, out, lse, cu_seqlens_q, int(max_seqlen_q), cu_seqlens_k, seqused_k, page_table,
               bool(batched), float(softmax_scale), int(window[0]), int(window[1]), bool(skip_whole), int(batch),
               int(k_uniform))


def _sdpa_device(device: torch.device) -> bool:
    """Where the single-sequence path hands the work to torch's fused attention (a test may
    widen it to the CPU to exercise the path under the interpreter)."""
    return device.type == "cuda"


SDPA_WITH_LSE = True
"""A single dense sequence that returns the LSE runs aten's cuDNN attention, which returns
it, instead of the Triton kernel. Measured on the H200 (``benchmarks/probe_sdpa_lse.py``,
session 13; causal, d 128): 16K x 32 heads 3409.6 us against the Triton kernel's 7060.6;
4K x 32/8 heads (GQA) 258.5 against 488.9; 1000 x 16 heads 19.9 against 30.4; LSE within
2e-6 of the kernel's (natural log), output within 4e-3. Head dims up to 128 only."""


def _sdpa_single_sequence(q, k, v, out, softmax_scale, causal, lse=None) -> None:
    """One dense sequence through torch's fused attention ([T, H, D] views, GQA native);
    with ``lse`` ([H, T] fp32) aten's cuDNN attention, which also returns the natural-log LSE."""
    import torch.nn.functional as F

    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    if lse is not None:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qh, kh, vh, None, True, 0.0, causal, False,
                                                                 scale=softmax_scale)
        out.copy_(res[0][0].transpose(0, 1))
        lse.copy_(res[1].reshape(lse.shape))
        return
    o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, scale=softmax_scale,
                                       enable_gqa=k.shape[1] != q.shape[1])
    out.copy_(o[0].transpose(0, 1))


@mate_api
def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    scheduler_metadata: MhaSchedulerMetadata | None = None,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    backend: str = "auto",
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_tot_seqused_k: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over ragged (variable-length) sequences, FlashAttention-3 conventions.

    Request ``b`` owns query rows ``cu_seqlens_q[b] : cu_seqlens_q[b + 1]`` and either the
    key rows ``cu_seqlens_k[b] : cu_seqlens_k[b + 1]`` (dense K/V) or the pages of
    ``page_table[b]`` (paged K/V). Grouped-query attention: query head ``h`` reads KV head
    ``h // (Hq // Hkv)``.

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, Hq, D]`` float16 or bfloat16, D in (16, 32, 64, 128, 256), last
        dimension contiguous.
    k, v : torch.Tensor
        q's dtype. Dense: ragged ``[total_k, Hkv, D]`` with ``cu_seqlens_k``. Paged:
        ``[num_pages, page_size, Hkv, D]`` (page_size a power of two >= 16) with
        ``page_table`` and ``seqused_k``. ``Hkv`` divides ``Hq``.
    cu_seqlens_q : torch.Tensor
        int32 ``[B + 1]`` cumulative query lengths (required).
    cu_seqlens_k : torch.Tensor, optional
        int32 ``[B + 1]`` cumulative key lengths (required for dense K/V, must be None
        with a page table).
    max_seqlen_q : int
        Longest query length (required; sizes the launch grid): a longer request's later
        queries are not computed. ``MATE_CHECK_INPUTS=1`` checks it against ``cu_seqlens_q``.
    max_seqlen_k : int, optional
        Accepted and unused.
    seqused_q : torch.Tensor, optional
        Not implemented (must be None).
    seqused_k : torch.Tensor, optional
        int32 ``[B]`` keys used per request: dense, the first ``seqused_k[b]`` rows of
        each sequence; paged, the context length (required).
    page_table : torch.Tensor, optional
        int32 ``[B, max_pages]`` page ids into ``k`` / ``v``.
    softmax_scale : float, optional
        Default ``D ** -0.5``.
    causal : bool
        Causal mask aligned to the bottom right (the last query sees the last key).
    window_size : tuple of int
        ``(left, right)`` sliding window, -1 = unbounded; ``causal`` sets right to 0.
    scheduler_metadata : MhaSchedulerMetadata, optional
        From :func:`get_scheduler_metadata` (head counts are checked).
    num_splits, pack_gqa, sm_margin : optional
        Performance hints, accepted and ignored.
    deterministic : bool
        Accepted; the kernels are deterministic.
    return_softmax_lse : bool
        Also return the natural-log LSE.
    backend : {"auto", "triton", "reference"}
        As ``MATE_BACKEND``; ``"auto"`` uses Triton on CUDA and the reference on the CPU.
    out : torch.Tensor, optional
        ``[total_q, Hq, D]`` in q's dtype (last dimension contiguous), written and returned.
    qv, q_descale, k_descale, v_descale, learnable_sink : optional
        Not implemented: anything but the default raises ``NotImplementedError``.
    attention_chunk, softcap, cp_world_size, cp_rank, cp_tot_seqused_k : optional
        Not implemented: anything but the default raises ``NotImplementedError``.

    Returns
    -------
    torch.Tensor or tuple
        ``out`` ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)`` with float32 ``lse``
        ``[Hq, total_q]`` when ``return_softmax_lse``. A query that sees no key gets
        ``out = 0`` and ``lse = -inf``.

    Raises
    ------
    TypeError
        wrong dtypes, a non-int ``max_seqlen_q``, a non-float ``softmax_scale``.
    ValueError
        wrong shapes or devices, a missing ``cu_seqlens_q`` / ``cu_seqlens_k`` /
        ``seqused_k``, a bad page size or window, an unknown ``backend``.
    NotImplementedError
        one of the unimplemented options above set.

    Examples
    --------
    Two requests (2 and 3 tokens) with grouped-query heads; the second one checked
    against PyTorch's causal attention:

    >>> import torch
    >>> from mate.mha_interface import flash_attn_varlen_func
    >>> q = torch.randn(5, 4, 64, dtype=torch.bfloat16)
    >>> k, v = (torch.randn(5, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    >>> out, lse = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3,
    ...                                   causal=True, return_softmax_lse=True)
    >>> out.shape, lse.shape
    (torch.Size([5, 4, 64]), torch.Size([4, 5]))
    >>> kk, vv = (x[2:].float().repeat_interleave(2, dim=1).transpose(0, 1) for x in (k, v))
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q[2:].float().transpose(0, 1), kk, vv, is_causal=True).transpose(0, 1)
    >>> torch.allclose(out[2:].float(), ref, atol=2e-2)  # bf16 output
    True
    """
    recipe = _varlen_recipe(dict(locals()))
    if recipe is not None:
        if recipe.replay():
            return (recipe.tensors[7], recipe.tensors[8]) if return_softmax_lse else recipe.tensors[7]
        out = recipe.tensors[7]  # the ordinary path below, into the recipe's out and LSE (checked as given)
    _not_implemented(qv=(qv, None), q_descale=(q_descale, None), k_descale=(k_descale, None),
                     v_descale=(v_descale, None), learnable_sink=(learnable_sink, None),
                     attention_chunk=(attention_chunk, 0), softcap=(softcap, 0.0), seqused_q=(seqused_q, None),
                     cp_world_size=(cp_world_size, 1), cp_rank=(cp_rank, 0),
                     cp_tot_seqused_k=(cp_tot_seqused_k, None))
    checks.check_choice("backend", backend, ("auto", "triton", "reference"))
    for flag, value in (("causal", causal), ("deterministic", deterministic),
                        ("return_softmax_lse", return_softmax_lse)):
        checks.check_bool(flag, value)
    checks.check_tensor("q", q, dtype=_DTYPES, ndim=3, last_dim_contiguous=True)
    paged = page_table is not None
    checks.check_tensor("k", k, dtype=q.dtype, ndim=4 if paged else 3, last_dim_contiguous=True)
    checks.check_tensor("v", v, dtype=q.dtype, shape=list(k.shape), last_dim_contiguous=True)
    total_q = q.shape[0]
    hq, hkv, d = _check_heads(q, k, v)
    _check_scheduler(scheduler_metadata, hq, hkv)
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q must be an int32 [batch + 1] tensor, got None")
    checks.check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, ndim=1, contiguous=True)
    batch = cu_seqlens_q.shape[0] - 1
    checks.check_value("cu_seqlens_q.shape[0]", batch >= 0, ">= 1", cu_seqlens_q.shape[0])
    _check_max_seqlen_q(cu_seqlens_q, max_seqlen_q)
    if paged:
        checks.check_tensor("page_table", page_table, dtype=torch.int32, shape=[batch, None], last_dim_contiguous=True)
        ps = k.shape[1]
        checks.check_value("k.shape[1] (page_size)", ps >= 16 and ps & (ps - 1) == 0, "a power of two >= 16", ps)
        if seqused_k is None:
            raise ValueError("seqused_k must be an int32 [batch] tensor with a paged KV cache, got None")
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k must be None with a paged KV cache (use seqused_k), got a tensor")
    else:
        if cu_seqlens_k is None:
            raise ValueError("cu_seqlens_k must be an int32 [batch + 1] tensor for dense k/v, got None")
        checks.check_tensor("cu_seqlens_k", cu_seqlens_k, dtype=torch.int32, shape=[batch + 1], contiguous=True)
    if seqused_k is not None:
        checks.check_tensor("seqused_k", seqused_k, dtype=torch.int32, shape=[batch], contiguous=True)
    left, right = _check_window(window_size)
    if causal:
        right = 0
    device = checks.check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                      seqused_k=seqused_k, page_table=page_table, out=out)
    if out is None:
        out = torch.empty(total_q, hq, d, dtype=q.dtype, device=device)
    else:
        checks.check_out_tensor("out", out, shape=[total_q, hq, d], dtype=q.dtype, device=device,
                                contiguous=False, last_dim_contiguous=True)
        checks.check_no_overlap("out", out, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                seqused_k=seqused_k, page_table=page_table)
    scale = d ** -0.5 if softmax_scale is None else checks.check_python_float("softmax_scale", softmax_scale)
    backend_used = select_backend(device, backend)
    with_lse = bool(return_softmax_lse) and SDPA_WITH_LSE and d <= 128  # cuDNN measured at d 64 and 128
    single = (backend_used == "triton" and _sdpa_device(device) and not paged and seqused_k is None
              and cu_seqlens_k is not None and batch == 1 and (not return_softmax_lse or with_lse) and left < 0
              and (right < 0 or causal) and max_seqlen_q == total_q and (not causal or k.shape[0] == total_q)
              and total_q > 0 and k.shape[0] > 0)
    lse = torch.empty(hq, total_q, dtype=torch.float32, device=device) if recipe is None else recipe.tensors[8]
    if single:
        # one dense sequence spanning the tensors: torch's fused (cuDNN / flash) attention; the
        # kernel below then recomputes the request only if cu_seqlens say it spans less
        _sdpa_single_sequence(q, k, v, out, scale, causal, lse if with_lse else None)
    with recorded(recipe):
        _run(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, cu_seqlens_k=cu_seqlens_k,
             seqused_k=seqused_k, page_table=page_table, batched=False, softmax_scale=scale, window=(left, right),
             backend=backend_used, skip_whole=single)
    return (out, lse) if return_softmax_lse else out


_VARLEN_RECIPES = RecipeCache()
"""Launch recipes of eager ``flash_attn_varlen_func`` calls, by signature (:mod:`mate._core.recipe`)."""

_VARLEN_TENSORS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table", "out")


def _varlen_recipe(args: dict) -> RecipeCall | None:
    """The launch recipe of a flash_attn_varlen_func call (its out and LSE allocated), or None
    where the call may do more than Triton launches (a single dense request may run torch's
    SDPA) or has no recipe signature."""
    key = _varlen_recipe_key(args)
    if key is None:
        return None
    q, out = args["q"], args["out"]
    tensors = [args[name] for name in _VARLEN_TENSORS]
    if out is None:
        tensors[7] = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    tensors.append(torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device))
    return RecipeCall(_VARLEN_RECIPES, key, tensors, outputs=(7, 8))


def _varlen_recipe_key(args: dict) -> Any:
    """The recipe key of a flash_attn_varlen_func call, or None (see :func:`_varlen_recipe`)."""
    q, cu_q = args["q"], args["cu_seqlens_q"]
    if (not isinstance(q, torch.Tensor) or not isinstance(cu_q, torch.Tensor) or q.dim() != 3
            or not recipes_usable(q) or (cu_q.shape[0] == 2 and args["page_table"] is None)):
        return None  # one dense request may run torch's SDPA
    return call_key([args[name] for name in _VARLEN_TENSORS],
                    (v for name, v in args.items() if name not in _VARLEN_TENSORS), SDPA_WITH_LSE, _launch_config())


def _launch_config() -> tuple:
    """The module settings that shape the attention kernels' launches (recipe keys include them:
    benchmarks switch them between calls)."""
    from mate.ops.mha.attention import PREFILL_VARIANT
    from mate.ops.mha.prefill_tma import PREFILL_TMA

    return tuple(PREFILL_VARIANT.items()), tuple(PREFILL_TMA.items())


@mate_api
def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    rotary_seqlens: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    learnable_sink: torch.Tensor | None = None,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: MhaSchedulerMetadata | None = None,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_tot_seqused_k: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of a batch of queries over a KV cache (decode / chunked prefill).

    Parameters
    ----------
    q : torch.Tensor
        ``[B, S_q, Hq, D]`` float16 or bfloat16, D in (16, 32, 64, 128, 256); or ragged
        ``[total_q, Hq, D]`` with ``cu_seqlens_q`` and ``max_seqlen_q``.
    k_cache, v_cache : torch.Tensor
        q's dtype: batched ``[B, S_cache, Hkv, D]``, or paged
        ``[num_pages, page_size, Hkv, D]`` (page_size a power of two >= 16) with
        ``page_table``. ``Hkv`` divides ``Hq``.
    cache_seqlens : torch.Tensor or int, optional
        int32 ``[B]`` (or one int) context length per request; default ``S_cache`` for a
        batched cache, required with ``page_table``.
    page_table : torch.Tensor, optional
        int32 ``[B, max_pages]`` page ids.
    cu_seqlens_q : torch.Tensor, optional
        int32 ``[B + 1]`` cumulative query lengths of a ragged ``q``.
    max_seqlen_q : int, optional
        Longest query length, with ``cu_seqlens_q`` only (a promise, as for
        :func:`flash_attn_varlen_func`).
    softmax_scale : float, optional
        Default ``D ** -0.5``.
    causal : bool
        Causal mask aligned to the bottom right.
    window_size : tuple of int
        ``(left, right)`` sliding window, -1 = unbounded.
    scheduler_metadata : MhaSchedulerMetadata, optional
        From :func:`get_scheduler_metadata`.
    return_softmax_lse : bool
        Also return the natural-log LSE.
    rotary_interleaved, num_splits, pack_gqa, sm_margin : optional
        Accepted and ignored.
    k, v, qv, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad : optional
        Not implemented: anything but the default raises ``NotImplementedError`` (the
        cache is never appended to).
    cu_seqlens_k_new, rotary_seqlens, q_descale, k_descale, v_descale : optional
        Not implemented (``NotImplementedError`` unless at the default).
    learnable_sink, attention_chunk, softcap, cp_world_size, cp_rank, cp_tot_seqused_k : optional
        Not implemented (``NotImplementedError`` unless at the default).

    Returns
    -------
    torch.Tensor or tuple
        ``out`` in q's shape and dtype, or ``(out, lse)`` with ``return_softmax_lse``:
        float32 ``lse`` ``[B, Hq, S_q]`` (``[Hq, total_q]`` for a ragged q).

    Raises
    ------
    TypeError
        wrong dtypes, a non-int ``max_seqlen_q`` with ``cu_seqlens_q``.
    ValueError
        wrong shapes or devices, ``max_seqlen_q`` without ``cu_seqlens_q``, a paged cache
        without ``cache_seqlens``, a bad page size or window.
    NotImplementedError
        one of the unimplemented options above set.

    Examples
    --------
    One decode token per request; request 1 uses only the first 3 cache rows:

    >>> import torch
    >>> from mate.mha_interface import flash_attn_with_kvcache
    >>> q = torch.randn(2, 1, 4, 64, dtype=torch.float16)
    >>> k_cache, v_cache = (torch.randn(2, 8, 4, 64, dtype=torch.float16) for _ in range(2))
    >>> out = flash_attn_with_kvcache(q, k_cache, v_cache,
    ...                               cache_seqlens=torch.tensor([8, 3], dtype=torch.int32))
    >>> out.shape
    torch.Size([2, 1, 4, 64])
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q[1].float().transpose(0, 1), k_cache[1, :3].float().transpose(0, 1),
    ...     v_cache[1, :3].float().transpose(0, 1)).transpose(0, 1)
    >>> torch.allclose(out[1].float(), ref, atol=2e-3)  # fp16 output
    True
    """
    recipe = _kvcache_recipe(dict(locals()))
    if recipe is not None and recipe.replay():
        return _kvcache_result(q, recipe.tensors[6], recipe.tensors[7], cu_seqlens_q, return_softmax_lse)
    _not_implemented(k=(k, None), v=(v, None), qv=(qv, None), rotary_cos=(rotary_cos, None),
                     rotary_sin=(rotary_sin, None), cache_batch_idx=(cache_batch_idx, None),
                     cache_leftpad=(cache_leftpad, None),
                     cu_seqlens_k_new=(cu_seqlens_k_new, None),
                     rotary_seqlens=(rotary_seqlens, None), q_descale=(q_descale, None),
                     k_descale=(k_descale, None), v_descale=(v_descale, None),
                     learnable_sink=(learnable_sink, None), attention_chunk=(attention_chunk, 0),
                     softcap=(softcap, 0.0), cp_world_size=(cp_world_size, 1), cp_rank=(cp_rank, 0),
                     cp_tot_seqused_k=(cp_tot_seqused_k, None))
    checks.check_bool("causal", causal)
    checks.check_bool("return_softmax_lse", return_softmax_lse)
    varlen = cu_seqlens_q is not None
    checks.check_tensor("q", q, dtype=_DTYPES, ndim=3 if varlen else 4, last_dim_contiguous=True)
    checks.check_tensor("k_cache", k_cache, dtype=q.dtype, ndim=4, last_dim_contiguous=True)
    checks.check_tensor("v_cache", v_cache, dtype=q.dtype, shape=list(k_cache.shape), last_dim_contiguous=True)
    if varlen:
        checks.check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, ndim=1, contiguous=True)
        b = cu_seqlens_q.shape[0] - 1
        checks.check_value("cu_seqlens_q.shape[0]", b >= 0, ">= 1", cu_seqlens_q.shape[0])
        _check_max_seqlen_q(cu_seqlens_q, max_seqlen_q, " with cu_seqlens_q")
        sq = max_seqlen_q
    else:
        if max_seqlen_q is not None:
            raise ValueError("max_seqlen_q must be None without cu_seqlens_q, got an int")
        b, sq = q.shape[0], q.shape[1]
    hq, hkv, d = _check_heads(q, k_cache, v_cache)
    _check_scheduler(scheduler_metadata, hq, hkv)
    paged = page_table is not None
    if paged:
        checks.check_tensor("page_table", page_table, dtype=torch.int32, shape=[b, None], last_dim_contiguous=True)
        ps = k_cache.shape[1]
        checks.check_value("k_cache.shape[1] (page_size)", ps >= 16 and ps & (ps - 1) == 0, "a power of two >= 16",
                           ps)
        if cache_seqlens is None:
            raise ValueError("cache_seqlens must be given with a paged KV cache, got None")
    else:
        checks.check_shape("k_cache", k_cache, [b, None, hkv, d])
    device = checks.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                                      cu_seqlens_q=cu_seqlens_q,
                                      cache_seqlens=cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None)
    # an int (or the batched default S_cache) is passed as a scalar: no per-call lengths tensor
    seqused, k_uniform = None, k_cache.shape[1]
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        checks.check_value("cache_seqlens", 0 <= cache_seqlens < 2**31, "in [0, 2**31)", cache_seqlens)
        k_uniform = cache_seqlens
    elif cache_seqlens is not None:
        seqused = checks.check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, shape=[b], contiguous=True)
    left, right = _check_window(window_size)
    if causal:
        right = 0
    scale = d ** -0.5 if softmax_scale is None else checks.check_python_float("softmax_scale", softmax_scale)
    total_q = q.shape[0] if varlen else b * sq
    if recipe is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=device)
        lse = torch.empty(hq, total_q, dtype=torch.float32, device=device)
    else:  # the ordinary path into the recipe's buffers
        out, lse = recipe.tensors[6], recipe.tensors[7]
    qf = q.reshape(total_q, hq, d)
    of = out.view(total_q, hq, d)
    # without cu_seqlens_q every request has sq queries: the kernel computes their offsets
    with recorded(recipe):
        _run(qf, k_cache, v_cache, of, lse, cu_seqlens_q=cu_seqlens_q if varlen else None, max_seqlen_q=sq,
             cu_seqlens_k=None, seqused_k=seqused, page_table=page_table, batched=not paged, softmax_scale=scale,
             window=(left, right), backend=select_backend(device), batch=b, k_uniform=k_uniform)
    return _kvcache_result(q, out, lse, cu_seqlens_q, return_softmax_lse)


def _kvcache_result(q, out, lse, cu_seqlens_q, return_softmax_lse):
    """flash_attn_with_kvcache's return value: ``out``, and with ``return_softmax_lse`` the LSE
    ([Hq, total_q] for ragged queries, [B, Hq, S] for batched ones)."""
    if not return_softmax_lse:
        return out
    if cu_seqlens_q is not None:
        return out, lse
    b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
    return out, lse.view(hq, b, sq).permute(1, 0, 2).contiguous()


_KVCACHE_RECIPES = RecipeCache()
"""Launch recipes of eager ``flash_attn_with_kvcache`` calls, by signature."""

_KVCACHE_TENSORS = ("q", "k_cache", "v_cache", "cache_seqlens", "page_table", "cu_seqlens_q")


def _kvcache_recipe(args: dict) -> RecipeCall | None:
    """The launch recipe of a flash_attn_with_kvcache call (its out and LSE allocated), or None
    where it has no recipe signature (an int ``cache_seqlens`` is a scalar of the key)."""
    q = args["q"]
    if not isinstance(q, torch.Tensor) or q.dim() not in (3, 4) or not recipes_usable(q):
        return None
    tensors = [args[name] for name in _KVCACHE_TENSORS]
    if not isinstance(tensors[3], torch.Tensor):
        tensors[3] = None
    key = call_key(tensors, (v for name, v in args.items()
                             if name not in _KVCACHE_TENSORS or (name == "cache_seqlens" and tensors[3] is None)),
                   _launch_config())
    if key is None:
        return None
    total_q = q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]
    tensors += [torch.empty(q.shape, dtype=q.dtype, device=q.device),
                torch.empty(q.shape[-2], total_q, dtype=torch.float32, device=q.device)]
    return RecipeCall(_KVCACHE_RECIPES, key, tensors, outputs=(6, 7))


@mate_api
def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads_q: int,
    num_heads_kv: int,
    headdim: int,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_size: int | None = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    mp_margin: int = 0,
) -> MhaSchedulerMetadata:
    """Scheduling object for later ``flash_attn_*`` calls (no device work, no host sync).

    Parameters
    ----------
    batch_size, num_heads_q, num_heads_kv, headdim : int
        Positive; ``num_heads_kv`` divides ``num_heads_q``.
    max_seqlen_q, max_seqlen_k : int
        ``>= 0``.
    qkv_dtype : torch.dtype
        torch.float16 or torch.bfloat16.
    causal, window_size, page_size : optional
        Recorded in the result.
    seqused_q, seqused_k, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new, cache_leftpad : optional
        Accepted and never read (no host sync).
    max_seqlen_k_new, num_splits, pack_gqa, mp_margin : optional
        Accepted and ignored.
    headdim_v, attention_chunk, has_softcap : optional
        Not implemented unless at their defaults (``headdim_v`` may equal ``headdim``).

    Returns
    -------
    MhaSchedulerMetadata
        The configuration; the Triton kernels schedule from each call's own arguments, and
        calls check that its head counts match.

    Raises
    ------
    TypeError
        non-int sizes.
    ValueError
        non-positive sizes or heads, ``num_heads_kv`` not dividing ``num_heads_q``, a
        ``qkv_dtype`` other than float16 / bfloat16, a bad window.
    NotImplementedError
        ``headdim_v`` other than ``headdim``, ``attention_chunk``, ``has_softcap``.

    Examples
    --------
    >>> import torch
    >>> from mate.mha_interface import get_scheduler_metadata
    >>> meta = get_scheduler_metadata(2, 1, 8, 4, 4, 64, qkv_dtype=torch.float16)
    >>> meta.batch_size, meta.num_heads_q, meta.headdim
    (2, 4, 64)
    """
    for name, value in (("batch_size", batch_size), ("num_heads_q", num_heads_q), ("num_heads_kv", num_heads_kv),
                        ("headdim", headdim)):
        checks.check_positive_int(name, value)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        checks.check_value(name, value >= 0, ">= 0", value)
    checks.check_value("num_heads_kv", num_heads_q % num_heads_kv == 0, f"a divisor of num_heads_q={num_heads_q}",
                       num_heads_kv)
    if not isinstance(qkv_dtype, torch.dtype):
        raise TypeError(f"qkv_dtype must be a torch.dtype, got {type(qkv_dtype).__name__}")
    checks.check_dtype("qkv_dtype", torch.empty(0, dtype=qkv_dtype), _DTYPES)
    if headdim_v is not None and headdim_v != headdim:
        raise NotImplementedError(f"headdim_v={headdim_v} different from headdim={headdim} is not implemented")
    _not_implemented(attention_chunk=(attention_chunk, 0), has_softcap=(has_softcap, False))
    left, right = _check_window(window_size)
    return MhaSchedulerMetadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                                bool(causal), (left, right), page_size)
