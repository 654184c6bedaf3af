"""Sparse MLA (DeepSeek-V3.2): fused RoPE + FP8 quantization and FP8 sparse decode.

Public API at MATE's import path. Validation goes through :mod:`mate._core.checks`,
kernels live in :mod:`mate.ops.sparse_mla`, references in
:mod:`mate.ops.sparse_mla.reference`.
"""

from __future__ import annotations

import collections
import contextlib
import weakref

import torch

from mate._core import checks
from mate._core.custom_op import mate_custom_op
from mate._core.dispatch import select_backend
from mate._core.hopper import GRID_YZ_MAX
from mate._core.recipe import RecipeCache, RecipeCall, call_key, recipes_usable, recorded
from mate.api_logging import mate_api
from mate.ops.sparse_mla.reference import mla_rope_quantize_fp8_reference

_FP8 = torch.float8_e4m3fn

# ---- mla_rope_quantize_fp8 -------------------------------------------------------------

_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)
)


@mate_custom_op(
    "mla_rope_quantize_fp8",
    mutates_args=("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out"),
)
def _mla_rope_quantize_fp8_op(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor,
    k_nope: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool,
    quant_scale_q: float,
    quant_scale_kv: float,
    q_rope_out: torch.Tensor,
    k_rope_out: torch.Tensor,
    q_nope_out: torch.Tensor,
    k_nope_out: torch.Tensor,
) -> None:
    args = (q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q, quant_scale_kv,
            q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    if select_backend(q_rope.device) == "triton":
        from mate.ops.sparse_mla.rope_quant import mla_rope_quantize_fp8_triton

        mla_rope_quantize_fp8_triton(*args)
    else:
        mla_rope_quantize_fp8_reference(*args)


_ROPE_RECIPES = RecipeCache()
"""Launch recipes of eager ``mla_rope_quantize_fp8`` calls (one per signature: the layers of a
step repeat it)."""


def _rope_recipe(tensors: list, others: tuple) -> RecipeCall | None:
    """The launch recipe of an mla_rope_quantize_fp8 call (``tensors``: the six inputs, then the
    four outputs, omitted ones allocated here as e4m3 like their inputs), or None (not an eager
    CUDA call, an argument without a recipe signature, or an omitted output whose dtype the
    call decides otherwise). The outputs may be views of one merged buffer, as the ordinary path
    allows."""
    q_rope = tensors[0]
    if not isinstance(q_rope, torch.Tensor) or not recipes_usable(q_rope):
        return None
    key = call_key(tensors, others)
    if key is None:
        return None
    given = [t for t in tensors[6:] if t is not None]
    if len(given) < 4:
        dtype = others[1] if others[1] is not None else (given[0].dtype if given else _FP8)
        if dtype != _FP8:
            return None  # the ordinary path raises its error
        tensors = list(tensors)
        for i in range(6, 10):
            if tensors[i] is None:
                tensors[i] = torch.empty(tensors[i - 6].shape, dtype=_FP8, device=q_rope.device)
    return RecipeCall(_ROPE_RECIPES, key, tensors, outputs=(6, 7, 8, 9), outputs_may_share=True)


def _resolve_quantize_dtype(quantize_dtype: torch.dtype | None, outs: dict[str, torch.Tensor | None]) -> torch.dtype:
    """The spec's rules: e4m3 only; None takes the first supplied buffer's dtype, else e4m3."""
    supplied = {name: t for name, t in outs.items() if t is not None}
    for name, t in supplied.items():
        checks.check_is_tensor(name, t)
        if t.dtype not in _FP8_DTYPES:
            raise TypeError(f"{name} must be an FP8 tensor (torch.float8_e4m3fn), got {t.dtype}")
    if supplied:
        first_name, first = next(iter(supplied.items()))
        for name, t in supplied.items():
            if t.dtype != first.dtype:
                raise TypeError(f"{name} must have the dtype of {first_name} ({first.dtype}), got {t.dtype}")
    if quantize_dtype is None:
        resolved, source = (first.dtype, first_name) if supplied else (torch.float8_e4m3fn, "quantize_dtype")
    else:
        if not isinstance(quantize_dtype, torch.dtype):
            raise TypeError(f"quantize_dtype must be a torch.dtype or None, got {type(quantize_dtype).__name__}")
        resolved, source = quantize_dtype, "quantize_dtype"
    checks.check_value(source, resolved == torch.float8_e4m3fn, "torch.float8_e4m3fn (the only supported "
                       "quantize dtype)", resolved)
    for name, t in supplied.items():
        checks.check_value(name, t.dtype == resolved, f"{resolved} (quantize_dtype)", t.dtype)
    return resolved


@mate_api
def mla_rope_quantize_fp8(
    q_rope: torch.Tensor,
    k_rope: torch.Tensor,
    q_nope: torch.Tensor,
    k_nope: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    pos_ids: torch.Tensor,
    is_neox: bool = True,
    quantize_dtype: torch.dtype | None = None,
    quant_scale_q: float = 1.0,
    quant_scale_kv: float = 1.0,
    q_rope_out: torch.Tensor | None = None,
    k_rope_out: torch.Tensor | None = None,
    q_nope_out: torch.Tensor | None = None,
    k_nope_out: torch.Tensor | None = None,
    enable_pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE on the 64-value tails and per-tensor FP8 quantization of MLA query and key rows.

    For token ``i`` at position ``p = pos_ids[i]``, with ``c = cos_sin_cache[p, :32]`` and
    ``s = cos_sin_cache[p, 32:]`` and all arithmetic in fp32::

        q_rope_out = fp8(rope(q_rope) * quant_scale_q)    q_nope_out = fp8(q_nope * quant_scale_q)
        k_rope_out = fp8(rope(k_rope) * quant_scale_kv)   k_nope_out = fp8(k_nope * quant_scale_kv)

    where ``fp8`` rounds to nearest even and saturates to +-448 (NaN stays NaN). NeoX
    layout (``is_neox=True``) rotates the halves: ``[x1*c - x2*s, x2*c + x1*s]`` with
    ``x1 = x[:32], x2 = x[32:]``; the interleaved layout rotates the pairs
    ``(x[2j], x[2j+1])`` by ``(c[j], s[j])``. One kernel launch writes all four outputs.

    Parameters
    ----------
    q_rope : torch.Tensor
        bf16 [nnz, H, 64], last dimension contiguous.
    k_rope : torch.Tensor
        bf16 [nnz, 64], last dimension contiguous.
    q_nope : torch.Tensor
        bf16 [nnz, H, 512], last dimension contiguous.
    k_nope : torch.Tensor
        bf16 [nnz, 512], last dimension contiguous.
    cos_sin_cache : torch.Tensor
        fp32 or bf16 [max_seq_len, 64], contiguous; columns [:32] cos, [32:] sin.
    pos_ids : torch.Tensor
        int32 or int64 [nnz], contiguous, values in ``[0, max_seq_len)``. Out-of-range
        values never read outside the cache (they are clamped; what is written for such
        a token is unspecified); with ``MATE_CHECK_INPUTS=1`` they raise ``ValueError``.
    is_neox : bool
        NeoX (halves) or interleaved (pairs) rotary layout.
    quantize_dtype : torch.dtype or None
        Only ``torch.float8_e4m3fn``. None: the dtype of the first supplied output buffer,
        else e4m3.
    quant_scale_q, quant_scale_kv : float
        Multipliers applied before the FP8 cast (Python numbers).
    q_rope_out, k_rope_out, q_nope_out, k_nope_out : torch.Tensor, optional
        float8_e4m3fn outputs with the shapes of the matching inputs. Leading dimensions
        may be strided, the last must be contiguous: e.g. ``q_nope_out = q[..., :512]``
        and ``q_rope_out = q[..., 512:]`` of one merged [nnz, H, 576] tensor. Omitted
        ones are allocated; supplied ones are written in place and returned.
    enable_pdl : bool
        Accepted for compatibility and ignored.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``, float8_e4m3fn, shaped like
        ``q_rope``, ``k_rope``, ``q_nope``, ``k_nope``.

    Raises
    ------
    TypeError
        An input of the wrong dtype, an output that is not FP8 or whose dtype differs
        from the other outputs'.
    ValueError
        Wrong shapes, layouts or devices; a quantize dtype (given or implied by an output
        buffer) other than float8_e4m3fn; out-of-range ``pos_ids`` with
        ``MATE_CHECK_INPUTS=1``.
    NotImplementedError
        A tensor-valued quantization scale.

    Examples
    --------
    Quantize a query straight into the two parts of one 576-value FP8 row per head, and
    check the key's rotated tail against the formula above:

    >>> import torch
    >>> from mate.sparse_mla_interface import mla_rope_quantize_fp8
    >>> nnz, H = 3, 2
    >>> q_rope, k_rope = torch.randn(nnz, H, 64).bfloat16(), torch.randn(nnz, 64).bfloat16()
    >>> q_nope, k_nope = torch.randn(nnz, H, 512).bfloat16(), torch.randn(nnz, 512).bfloat16()
    >>> angles = torch.arange(16.0)[:, None] * torch.rand(32)  # 16 positions, 32 frequencies
    >>> cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1)  # [16, 64]
    >>> pos = torch.tensor([0, 5, 9])
    >>> q_fp8 = torch.empty(nnz, H, 576, dtype=torch.float8_e4m3fn)
    >>> _, k_rope_fp8, _, _ = mla_rope_quantize_fp8(
    ...     q_rope, k_rope, q_nope, k_nope, cos_sin, pos, quant_scale_q=2.0,
    ...     q_nope_out=q_fp8[..., :512], q_rope_out=q_fp8[..., 512:])
    >>> torch.equal(q_fp8[..., :512].float(), (2.0 * q_nope.float()).to(torch.float8_e4m3fn).float())
    True
    >>> c, s = cos_sin[pos, :32], cos_sin[pos, 32:]
    >>> x1, x2 = k_rope.float()[:, :32], k_rope.float()[:, 32:]
    >>> rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=1)
    >>> torch.allclose(k_rope_fp8.float(), rotated, rtol=0.0625, atol=2e-3)  # e4m3 rounding
    True
    """
    outs = {"q_rope_out": q_rope_out, "k_rope_out": k_rope_out, "q_nope_out": q_nope_out,
            "k_nope_out": k_nope_out}
    recipe = _rope_recipe([q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, *outs.values()],
                          (is_neox, quantize_dtype, quant_scale_q, quant_scale_kv, enable_pdl))
    if recipe is not None:
        outs = dict(zip(outs, recipe.tensors[6:]))
        if recipe.replay():
            return outs["q_rope_out"], outs["k_rope_out"], outs["q_nope_out"], outs["k_nope_out"]
    bf16 = torch.bfloat16
    checks.check_tensor("q_rope", q_rope, dtype=bf16, ndim=3)
    nnz, num_heads = q_rope.shape[0], q_rope.shape[1]
    checks.check_shape("q_rope", q_rope, [nnz, num_heads, 64])
    checks.check_value("q_rope", num_heads > 0, "[nnz, H, 64] with H >= 1", list(q_rope.shape))
    checks.check_last_dim_contiguous("q_rope", q_rope)
    checks.check_tensor("k_rope", k_rope, dtype=bf16, shape=[nnz, 64], last_dim_contiguous=True)
    checks.check_tensor("q_nope", q_nope, dtype=bf16, shape=[nnz, num_heads, 512], last_dim_contiguous=True)
    checks.check_tensor("k_nope", k_nope, dtype=bf16, shape=[nnz, 512], last_dim_contiguous=True)
    checks.check_tensor("cos_sin_cache", cos_sin_cache, dtype=(torch.float32, bf16), shape=[None, 64],
                        contiguous=True)
    checks.check_tensor("pos_ids", pos_ids, dtype=(torch.int32, torch.int64), shape=[nnz], contiguous=True)
    checks.check_bool("is_neox", is_neox)
    quant_scale_q = checks.check_python_float("quant_scale_q", quant_scale_q)
    quant_scale_kv = checks.check_python_float("quant_scale_kv", quant_scale_kv)
    out_dtype = _resolve_quantize_dtype(quantize_dtype, outs)
    device = checks.check_same_device(q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope,
                                      cos_sin_cache=cos_sin_cache, pos_ids=pos_ids, **outs)
    max_seq_len = cos_sin_cache.shape[0]
    checks.check_value("cos_sin_cache", max_seq_len > 0 or nnz == 0,
                       "at least one row when nnz > 0 (shape [max_seq_len, 64])", list(cos_sin_cache.shape))
    if nnz > 0 and checks.check_inputs_enabled():
        lo, hi = int(pos_ids.min()), int(pos_ids.max())
        checks.check_value("pos_ids", lo >= 0 and hi < max_seq_len,
                           f"in [0, {max_seq_len}) (max_seq_len = cos_sin_cache.shape[0])", f"values in [{lo}, {hi}]")
    like = {"q_rope_out": q_rope, "k_rope_out": k_rope, "q_nope_out": q_nope, "k_nope_out": k_nope}
    reads = {}  # the inputs' extents, once for the output buffers given
    if any(t is not None for t in outs.values()):
        reads = checks.byte_ranges(q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope,
                                   cos_sin_cache=cos_sin_cache, pos_ids=pos_ids)
    for name, src in like.items():
        t = outs[name]
        if t is None:
            outs[name] = torch.empty(src.shape, dtype=out_dtype, device=device)
        else:
            checks.check_out_tensor(name, t, shape=list(src.shape), dtype=out_dtype, device=device,
                                    contiguous=False, last_dim_contiguous=True)
            # the outputs may be views of one merged buffer; none may share memory with an input
            checks.check_no_overlap(name, t, **reads)
    with recorded(recipe):
        _mla_rope_quantize_fp8_op(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q,
                                  quant_scale_kv, outs["q_rope_out"], outs["k_rope_out"], outs["q_nope_out"],
                                  outs["k_nope_out"])
    return outs["q_rope_out"], outs["k_rope_out"], outs["q_nope_out"], outs["k_nope_out"]


# ---- get_batch_decode_metadata_mla / sparse_mla_fp8_decode ----------------------------

from mate.ops.sparse_mla.metadata import BLOCK_N as _DECODE_BLOCK_N  # noqa: E402
from mate.ops.sparse_mla.metadata import DecodeMetadata, plan_decode, plan_settings  # noqa: E402

_ROW = 576  # kv_lora_rank + qk_rope_head_dim

_DECODE_RECIPES: weakref.WeakKeyDictionary[DecodeMetadata, RecipeCache] = weakref.WeakKeyDictionary()
"""Launch recipes of eager ``sparse_mla_fp8_decode`` calls, one cache per metadata object (it
holds the scratch the launches use, and the layers of a step share it)."""


_IMPLICIT_PLANS: collections.OrderedDict[tuple, DecodeMetadata] = collections.OrderedDict()
IMPLICIT_PLANS_KEPT = 8
"""Plans kept for eager calls without metadata (least recently used dropped first)."""


def _implicit_plan_key(query, top_k) -> tuple | None:
    """The key under which an eager call without metadata keeps its plan, or None where it plans
    for itself: (B, q_len, H, top-k, device, current stream). One stream runs its calls in
    order, so they can share the plan's scratch as the layers of a step share a metadata object,
    and keep its launch recipes; calls on other streams get their own plan. The planning
    settings (:func:`~mate.ops.sparse_mla.metadata.plan_settings`) are part of the key. Under CUDA-graph
    capture, with recipes off (``MATE_LAUNCH_RECIPES=0``, ``MATE_CHECK_INPUTS=1``) or off the
    GPU a call plans per call and its scratch lives as long as the call (in a capture, in the
    graph's pool)."""
    if (not isinstance(query, torch.Tensor) or query.dim() != 4 or type(top_k) is not int
            or not recipes_usable(query)):
        return None
    stream = None
    if query.is_cuda:
        if torch.cuda.is_current_stream_capturing():
            return None
        stream = torch.cuda.current_stream(query.device).cuda_stream
    return (*query.shape[:3], top_k, query.device, stream, plan_settings())


def _keep_implicit_plan(key: tuple, metadata: DecodeMetadata) -> None:
    _IMPLICIT_PLANS[key] = metadata
    while len(_IMPLICIT_PLANS) > IMPLICIT_PLANS_KEPT:
        with contextlib.suppress(KeyError):  # emptied by another thread meanwhile
            _IMPLICIT_PLANS.popitem(last=False)


def _decode_launch_config() -> tuple:
    """The module settings that shape the decode's launches beyond its metadata (recipe keys
    include them: benchmarks switch them between calls)."""
    from mate.ops.sparse_mla import decode_gluon_small_h as small_h
    from mate.ops.sparse_mla import decode_gluon_small_h2 as small_h2

    return small_h.SMALL_H_V_EARLY, small_h.SMALL_H_PV_FP8, small_h2.WG_PV_FP8


def _decode_recipe(metadata, query, kv_cache, block_tables, seq_lens, out, lse, return_lse,
                   others: tuple) -> RecipeCall | None:
    """The launch recipe of a sparse_mla_fp8_decode call with prepared ``metadata`` (its omitted
    outputs allocated: ``out``, and ``lse`` when returned), or None (no metadata, not an eager
    CUDA call, or an argument without a recipe signature). ``others``: the arguments that are
    checked or shape the launches, besides the tensors."""
    if (not isinstance(metadata, DecodeMetadata) or not isinstance(query, torch.Tensor) or query.dim() != 4
            or not recipes_usable(query)):
        return None
    tensors = [query, kv_cache, block_tables, seq_lens, out, lse]
    key = call_key(tensors, others, _decode_launch_config())
    if key is None:
        return None
    batch, q_len, heads = query.shape[:3]
    if out is None:
        tensors[4] = torch.empty((batch, q_len, heads, 512), dtype=torch.bfloat16, device=query.device)
    if lse is None and return_lse is True:
        tensors[5] = torch.empty((batch, q_len, heads), dtype=torch.float32, device=query.device)
    cache = _DECODE_RECIPES.get(metadata)
    if cache is None:
        cache = _DECODE_RECIPES[metadata] = RecipeCache()
    return RecipeCall(cache, key, tensors, outputs=(4, 5))


@mate_custom_op("sparse_mla_fp8_decode", mutates_args=("out", "lse", "partial_o", "partial_lse"))
def _sparse_mla_fp8_decode_op(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    bmm1_scale: float,
    bmm2_scale: float,
    block_h: int,
    num_splits: int,
    split_blocks: int,
    num_warps: int,
    num_stages: int,
    block_n: int,
    transposed: bool,
    max_regs: int,
    prefetch_idx: bool,
    gluon: bool = False,
    chains: int = 1,
    pdl: bool = False,
) -> None:
    backend = select_backend(query.device)
    if backend == "triton" and gluon and query.is_cuda and transposed:
        from mate.ops.sparse_mla.decode_gluon_small_h import sparse_mla_decode_gluon_small_h

        sparse_mla_decode_gluon_small_h(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                        bmm1_scale, bmm2_scale, block_h, num_splits, split_blocks, num_stages,
                                        num_warps=num_warps, chains=chains, pdl=pdl)
    elif backend == "triton" and gluon and query.is_cuda:
        from mate.ops.sparse_mla.decode_gluon import sparse_mla_decode_gluon

        sparse_mla_decode_gluon(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                bmm1_scale, bmm2_scale, num_splits, split_blocks, num_stages, pdl=pdl)
    elif backend == "triton":
        from mate.ops.sparse_mla.decode import sparse_mla_decode_triton

        sparse_mla_decode_triton(query, kv_rows, block_tables, seq_lens, out, lse, partial_o, partial_lse,
                                 bmm1_scale, bmm2_scale, block_h, num_splits, split_blocks, num_warps, num_stages,
                                 block_n, transposed, max_regs, prefetch_idx)
    else:
        from mate.ops.sparse_mla.reference import sparse_mla_decode_reference

        o, l_ = sparse_mla_decode_reference(query, kv_rows, block_tables, seq_lens, bmm1_scale, bmm2_scale)
        out.copy_(o)
        lse.copy_(l_.view(lse.shape))


def _check_decode_query(query: torch.Tensor) -> tuple[int, int, int]:
    checks.check_tensor("query", query, dtype=_FP8, ndim=4, contiguous=True)
    batch, q_len, heads = query.shape[:3]
    checks.check_shape("query", query, [batch, q_len, heads, _ROW])
    # the query rows are a launch-grid axis of the decode and combine kernels (at most 65535)
    checks.check_value("query", batch * q_len <= GRID_YZ_MAX, f"at most {GRID_YZ_MAX} rows B * q_len per call",
                       f"B={batch}, q_len={q_len}")
    return batch, q_len, heads


def _check_seq_lens(seq_lens: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """int32 [B] or [B, 1]; returns the flat [B] view (or None)."""
    if seq_lens is None:
        return None
    checks.check_tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=(1, 2), contiguous=True)
    checks.check_shape("seq_lens", seq_lens, [batch] if seq_lens.dim() == 1 else [batch, 1])
    return seq_lens.view(batch)


@mate_api
def get_batch_decode_metadata_mla(
    query: torch.Tensor,
    seq_lens: torch.Tensor | None,
    sparse_mla_top_k: int,
) -> DecodeMetadata:
    """Plans :func:`sparse_mla_fp8_decode` once for a (B, q_len, H, top-k) configuration.

    The plan (heads per program, how each query position's top-k list is split across
    programs, launch configuration) depends only on the shapes and the device, never on
    the values in ``seq_lens``, which the kernel reads on the device. So one metadata
    object stays valid while ``seq_lens`` changes from step to step, and a decode call
    given it does no planning, no host sync and no allocation (none at all when ``out``
    and, if requested, ``lse`` are supplied): the call can be captured in a CUDA graph and
    replayed. Preparing it again after ``seq_lens`` changes, as MATE asks, is allowed and
    never needed.

    Parameters
    ----------
    query : torch.Tensor
        The decode query: contiguous float8_e4m3fn [B, q_len, H, 576] (only its shape and
        device are used).
    seq_lens : torch.Tensor or None
        int32 [B] (or [B, 1]) on the query's device; only validated.
    sparse_mla_top_k : int
        Positive multiple of 64: the top-k width of ``block_tables``.

    Returns
    -------
    DecodeMetadata
        A frozen object that records (B, q_len, H, top-k, device) and owns the scratch
        for the split path's partial results (fp16 partial outputs by default, fp32 LSEs).
        It must not be shared by overlapping decode calls.

    Raises
    ------
    TypeError
        Wrong dtypes or a non-int ``sparse_mla_top_k``.
    ValueError
        Wrong shapes, devices or a top-k that is not a positive multiple of 64.

    Examples
    --------
    >>> import torch
    >>> from mate.sparse_mla_interface import get_batch_decode_metadata_mla
    >>> query = torch.zeros(4, 1, 16, 576, dtype=torch.float8_e4m3fn)
    >>> seq_lens = torch.full((4,), 128, dtype=torch.int32)
    >>> meta = get_batch_decode_metadata_mla(query, seq_lens, 128)
    >>> type(meta).__name__
    'DecodeMetadata'
    >>> get_batch_decode_metadata_mla(query, seq_lens, 100)
    Traceback (most recent call last):
        ...
    ValueError: sparse_mla_top_k must be a positive multiple of 64, got 100
    """
    batch, q_len, heads = _check_decode_query(query)
    top_k = checks.check_positive_int("sparse_mla_top_k", sparse_mla_top_k, multiple_of=_DECODE_BLOCK_N)
    _check_seq_lens(seq_lens, batch)
    checks.check_same_device(query=query, seq_lens=seq_lens)
    return plan_decode(batch, q_len, heads, top_k, query.device)


@mate_api
def sparse_mla_fp8_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: object,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor | None,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: torch.Tensor | None = None,
    bmm1_scale: float = 1.0,
    bmm2_scale: float = 1.0,
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
    metadata: DecodeMetadata | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FP8 sparse MLA decode (DeepSeek-V3.2): each query attends to its own top-k cache rows.

    For batch ``b``, query position ``t`` and head ``h``, the valid slots are
    ``J = {j < seq_lens[b] : 0 <= block_tables[b, t, j] < pages * page_size}`` and
    ``row(j)`` is the cache viewed as [pages * page_size, 576] at ``block_tables[b, t, j]``::

        logit_j = bmm1_scale * dot(query[b, t, h], row(j))            (fp32, FP8 upcast)
        out[b, t, h] = bf16(bmm2_scale * sum_j softmax(logit)_j * row(j)[:512])
        lse[b, t, h] = log(sum_j exp(logit_j))                        (natural log)

    Keys are whole 576-value rows, values their first 512 values. Invalid slots (negative,
    out of range, or at ``j >= seq_lens[b]``) are skipped and never read; a row listed in
    two valid slots counts twice; when ``J`` is empty, ``out = 0`` and ``lse = +inf``.
    With per-tensor quantization ``Q_fp8 = Q * sq`` and ``KV_fp8 = KV * skv``, pass
    ``bmm1_scale = softmax_scale / (sq * skv)`` and ``bmm2_scale = 1 / skv``.

    On CUDA the Triton kernel computes Q·Kᵀ on FP8 tensor cores straight from the e4m3
    rows, P·V on fp16 tensor cores, the softmax online in fp32, and splits the top-k list
    across programs (with a combine step) when the query positions do not fill the GPU.

    Parameters
    ----------
    query : torch.Tensor
        Contiguous float8_e4m3fn [B, q_len, H, 576].
    kv_cache : torch.Tensor
        Contiguous float8_e4m3fn [pages, page_size, 576] or [pages, 1, page_size, 576]:
        row ``page * page_size + slot`` holds 512 latent values then 64 rotary values.
    workspace_buffer : object
        Ignored (compatibility).
    qk_nope_head_dim : int
        Ignored (compatibility).
    kv_lora_rank : int
        Must be 512.
    qk_rope_head_dim : int
        Must be 64.
    block_tables : torch.Tensor
        Contiguous int32 [B, q_len, sparse_mla_top_k]: physical token indices (row numbers
        of the flattened cache); -1 or any out-of-range value marks an unused slot.
    seq_lens : torch.Tensor or None
        Contiguous int32 [B] (or [B, 1]): only the first ``seq_lens[b]`` slots of batch
        ``b`` are candidates. None: every slot.
    max_seq_len : int
        Ignored (compatibility).
    sparse_mla_top_k : int
        Positive multiple of 64 equal to ``block_tables.shape[-1]``.
    out : torch.Tensor, optional
        Contiguous bf16 [B, q_len, H, 512], written and returned.
    bmm1_scale, bmm2_scale : float
        Logit and output multipliers (Python numbers).
    sinks, skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx, cum_seq_lens_q, max_q_len
        Accepted only at their defaults (None, None, True, None, None):
        ``NotImplementedError`` otherwise, since ignoring them would change the result.
    enable_pdl, backend, is_var_seq, cute_dsl_impl, kv_scale_format, multi_ctas_kv_counter_buffer
        Ignored whatever their value (they only steer performance or storage). The decode is
        launched plainly after whatever precedes it; inside the call, a split plan with a small
        grid launches its combine as a programmatic dependent of the decode (the plan's
        ``pdl``, see :class:`~mate.ops.sparse_mla.metadata.DecodeMetadata`).
    lse : torch.Tensor, optional
        Contiguous fp32 [B * q_len, H] or [B, q_len, H], written in place.
    return_lse : bool
        Return ``(out, lse)``; ``lse`` is allocated as [B, q_len, H] when not supplied.
    metadata : DecodeMetadata, optional
        From :func:`get_batch_decode_metadata_mla` for this (B, q_len, H, top-k, device).
        With it the call does no host sync and allocates nothing beyond omitted outputs. When
        omitted, an eager CUDA call reuses the plan of the last calls of its shape on the
        current stream (up to ``IMPLICIT_PLANS_KEPT`` plans are kept, with their scratch), so
        repeated calls allocate no scratch and replay launch recipes; a call under CUDA-graph
        capture or with recipes off plans for itself.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        ``out`` bf16 [B, q_len, H, 512], or ``(out, lse)`` when ``return_lse``.

    Raises
    ------
    TypeError
        Wrong dtypes, non-bool ``return_lse``, a ``metadata`` that is not a DecodeMetadata.
    ValueError
        Wrong shapes, layouts or devices; ``kv_lora_rank != 512`` or
        ``qk_rope_head_dim != 64``; a top-k that is not a positive multiple of 64 equal to
        ``block_tables.shape[-1]``; metadata prepared for another configuration.
    NotImplementedError
        A non-default ``sinks``, ``skip_softmax_threshold_scale_factor``,
        ``uses_shared_paged_kv_idx``, ``cum_seq_lens_q`` or ``max_q_len``; tensor-valued
        ``bmm1_scale`` / ``bmm2_scale``.

    Examples
    --------
    One query token attending to 3 of the 128 cache rows (the other 61 slots are -1),
    checked against the formula above:

    >>> import torch
    >>> from mate.sparse_mla_interface import get_batch_decode_metadata_mla, sparse_mla_fp8_decode
    >>> query = torch.randn(1, 1, 2, 576).to(torch.float8_e4m3fn)  # [B, q_len, H, 576]
    >>> kv_cache = torch.randn(2, 64, 576).to(torch.float8_e4m3fn)  # 2 pages of 64 rows
    >>> block_tables = torch.full((1, 1, 64), -1, dtype=torch.int32)
    >>> block_tables[0, 0, :3] = torch.tensor([70, 3, 127])
    >>> seq_lens = torch.tensor([64], dtype=torch.int32)
    >>> meta = get_batch_decode_metadata_mla(query, seq_lens, 64)
    >>> out, lse = sparse_mla_fp8_decode(query, kv_cache, None, 128, 512, 64, block_tables, seq_lens,
    ...                                  128, sparse_mla_top_k=64, bmm1_scale=576 ** -0.5,
    ...                                  return_lse=True, metadata=meta)
    >>> rows = kv_cache.reshape(-1, 576)[[70, 3, 127]].float()
    >>> logits = query[0, 0].float() @ rows.T * 576 ** -0.5
    >>> out.shape, torch.allclose(out[0, 0].float(), logits.softmax(-1) @ rows[:, :512], atol=2e-2)
    (torch.Size([1, 1, 2, 512]), True)
    >>> torch.allclose(lse[0, 0], logits.logsumexp(-1), atol=1e-4)
    True
    """
    implicit_key = _implicit_plan_key(query, sparse_mla_top_k) if metadata is None else None
    if implicit_key is not None:
        metadata = _IMPLICIT_PLANS.get(implicit_key)  # None on the first call of its shape and stream
        if metadata is not None:
            with contextlib.suppress(KeyError):  # another thread may have dropped it meanwhile
                _IMPLICIT_PLANS.move_to_end(implicit_key)
    recipe = _decode_recipe(metadata, query, kv_cache, block_tables, seq_lens, out, lse, return_lse,
                            (kv_lora_rank, qk_rope_head_dim, sparse_mla_top_k, bmm1_scale, bmm2_scale, sinks,
                             skip_softmax_threshold_scale_factor, uses_shared_paged_kv_idx, return_lse,
                             cum_seq_lens_q, max_q_len))
    if recipe is not None:
        if recipe.replay():
            out, lse = recipe.tensors[4], recipe.tensors[5]
            return (out, lse) if return_lse else out
        out, lse = recipe.tensors[4], recipe.tensors[5]  # the ordinary path writes the recipe's outputs
    checks.check_default("sinks", sinks, None)
    checks.check_default("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor, None)
    checks.check_default("uses_shared_paged_kv_idx", uses_shared_paged_kv_idx, True)
    checks.check_default("cum_seq_lens_q", cum_seq_lens_q, None)
    checks.check_default("max_q_len", max_q_len, None)
    checks.check_value("kv_lora_rank", kv_lora_rank == 512, "512", kv_lora_rank)
    checks.check_value("qk_rope_head_dim", qk_rope_head_dim == 64, "64", qk_rope_head_dim)
    bmm1_scale = checks.check_python_float("bmm1_scale", bmm1_scale)
    bmm2_scale = checks.check_python_float("bmm2_scale", bmm2_scale)
    checks.check_bool("return_lse", return_lse)

    batch, q_len, heads = _check_decode_query(query)
    checks.check_tensor("kv_cache", kv_cache, dtype=_FP8, ndim=(3, 4), contiguous=True)
    if kv_cache.dim() == 3:
        checks.check_shape("kv_cache", kv_cache, [None, None, _ROW])
    else:
        checks.check_shape("kv_cache", kv_cache, [None, 1, None, _ROW])
    top_k = checks.check_positive_int("sparse_mla_top_k", sparse_mla_top_k, multiple_of=_DECODE_BLOCK_N)
    checks.check_tensor("block_tables", block_tables, dtype=torch.int32, ndim=3, contiguous=True)
    checks.check_value("sparse_mla_top_k", top_k == block_tables.shape[-1],
                       f"equal to block_tables.shape[-1] ({block_tables.shape[-1]})", top_k)
    checks.check_shape("block_tables", block_tables, [batch, q_len, top_k])
    reads = dict(query=query, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens)  # what the kernels read
    device = checks.check_same_device(**reads, out=out, lse=lse)
    seq_lens = _check_seq_lens(seq_lens, batch)
    read_ranges = checks.byte_ranges(**reads) if out is not None or lse is not None else {}  # for the overlap checks

    if metadata is None:
        metadata = plan_decode(batch, q_len, heads, top_k, device)
        if implicit_key is not None:
            _keep_implicit_plan(implicit_key, metadata)
    elif not isinstance(metadata, DecodeMetadata):
        raise TypeError(
            f"metadata must be a DecodeMetadata from get_batch_decode_metadata_mla, got {type(metadata).__name__}"
        )
    metadata.check_matches(batch, q_len, heads, top_k, device)

    if out is None:
        out = torch.empty((batch, q_len, heads, 512), dtype=torch.bfloat16, device=device)
    else:
        checks.check_out_tensor("out", out, shape=[batch, q_len, heads, 512], dtype=torch.bfloat16, device=device)
        checks.check_no_overlap("out", out, **read_ranges)
    if lse is not None:
        checks.check_tensor("lse", lse, dtype=torch.float32, ndim=(2, 3), contiguous=True)
        checks.check_shape("lse", lse, [batch * q_len, heads] if lse.dim() == 2 else [batch, q_len, heads])
        checks.check_no_overlap("lse", lse, **read_ranges, out=out)
        lse_buf = lse
    elif return_lse:
        lse = lse_buf = torch.empty((batch, q_len, heads), dtype=torch.float32, device=device)
    else:
        lse_buf = metadata.lse_scratch

    with recorded(recipe):
        _sparse_mla_fp8_decode_op(query, kv_cache.view(-1, _ROW), block_tables, seq_lens, out, lse_buf,
                                  metadata.partial_o, metadata.partial_lse, bmm1_scale, bmm2_scale, metadata.block_h,
                                  metadata.num_splits, metadata.split_blocks, metadata.num_warps, metadata.num_stages,
                                  metadata.block_n, metadata.transposed, metadata.max_regs, metadata.prefetch_idx,
                                  metadata.gluon, metadata.chains, metadata.pdl)
    return (out, lse) if return_lse else out
