"""MSA sparse forward in Triton: attention of each query token over its selected blocks.

Design (see ``shared/notes/msa-in-triton.md``):

* A **tile** is TT consecutive query tokens x the query heads of one KV head (padded to a
  power of two), 64 rows for MiniMax-M3 (4 tokens x 16 heads), so the QK^T and PV products
  are 64-row Hopper wgmma's. Tokens of a tile may belong to different requests.
* ``_msa_union_kernel`` (one program per tile and KV head) maps each token's logical
  block ids through its request's page table, drops -1, out-of-range and causally
  invisible ids, de-duplicates the (page, block) pairs of the tile and writes the union
  with a bit mask of the tile tokens that selected each entry. It also writes each
  token's position and KV length.
* ``_msa_sparse_fwd_kernel`` streams the union's 128-key pages once per tile and masks
  per row (the row's token must have selected the entry; causal and key-length masks),
  with an online softmax in the exp2 domain. Decode uses one-token tiles and splits a
  tile's union across programs; ``_msa_combine_kernel`` merges the partial results.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from mate._core.hopper import planning_sm_count
from mate._core.launch import launcher
from mate._core.triton_helpers import (
    INTERPRET,
    dot_operand,
    finish_softmax,
    next_power_of_2,
    online_softmax_step,
    to_out_dtype,
)
from mate.ops.msa import sparse_decode as _sd
from mate.ops.msa.softmax_helpers import split_entries, token_position, visible_limit

__all__ = ["SparseTiling", "sparse_attention", "run_sparse_attention", "sparse_attention_triton", "sparse_tiling",
           "workspace_numel", "resolve_num_splits"]

BLOCK = 128
LOG2E = 1.4426950408889634
NUM_SMS_DEFAULT = 132


@triton.jit
def _or_combine(a, b):
    return a | b


@triton.jit
def _msa_union_kernel(
    idx_ptr, stride_it, stride_ih,
    qo_indptr_ptr, kv_lens_ptr, qo_offset_ptr, B, n_iter,
    page_table_ptr, stride_pt, n_cols, kv_indices_ptr, kv_page_indptr_ptr, n_indices, num_pages,
    tok_pos_ptr, tok_kvlen_ptr,
    u_page_ptr, u_blk_ptr, u_mask_ptr, u_cnt_ptr,
    total_q, W,
    TT: tl.constexpr, BLOCK_W: tl.constexpr,
    CAUSAL: tl.constexpr, USE_PAGE_TABLE: tl.constexpr, HAS_QO_OFFSET: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    n_kvh = tl.num_programs(1)
    C: tl.constexpr = TT * BLOCK_W
    c = tl.arange(0, C)
    tok_l = c // BLOCK_W
    w = c % BLOCK_W
    t = tile * TT + tok_l
    in_bounds = t < total_q
    # rows past qo_indptr[B] (a static plan's padding) see no key: out 0, lse -inf
    tvalid = in_bounds & (t < tl.load(qo_indptr_ptr + B))
    # request of each token: the largest i with qo_indptr[i] <= t (binary search)
    lo = tl.zeros([C], dtype=tl.int32)
    hi = tl.zeros([C], dtype=tl.int32) + B
    for _ in range(n_iter):
        mid = (lo + hi) // 2
        vm = tl.load(qo_indptr_ptr + mid, mask=tvalid, other=0)
        go = vm <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    req = lo
    q_start = tl.load(qo_indptr_ptr + req, mask=tvalid, other=0)
    q_end = tl.load(qo_indptr_ptr + req + 1, mask=tvalid, other=0)
    kv_len = tl.load(kv_lens_ptr + req, mask=tvalid, other=0)
    if HAS_QO_OFFSET:
        q_off = tl.load(qo_offset_ptr + req, mask=tvalid, other=0)
    else:
        q_off = kv_len - (q_end - q_start)
    pos, nblk = token_position(q_off, t, q_start, kv_len)
    if kvh == 0:
        tl.store(tok_pos_ptr + t, tl.where(tvalid, pos, -1), mask=in_bounds & (w == 0))
        tl.store(tok_kvlen_ptr + t, tl.where(tvalid, kv_len, 0), mask=in_bounds & (w == 0))
    ids = tl.load(idx_ptr + t.to(tl.int64) * stride_it + kvh * stride_ih + w,
                  mask=tvalid & (w < W), other=-1)
    valid = (ids >= 0) & (ids < nblk) & tvalid
    if CAUSAL:
        valid = valid & (ids * 128 <= pos)
    # inconsistent metadata (a table narrower than the context, pages outside the cache) is
    # skipped rather than read out of bounds
    if USE_PAGE_TABLE:
        valid = valid & (ids < n_cols)
        page = tl.load(page_table_ptr + req.to(tl.int64) * stride_pt + ids, mask=valid, other=0)
    else:
        pstart = tl.load(kv_page_indptr_ptr + req, mask=valid, other=0)
        pend = tl.load(kv_page_indptr_ptr + req + 1, mask=valid, other=0)
        # compared as differences: pstart + ids may exceed int32 for adversarial metadata
        valid = valid & (pstart >= 0) & (ids < pend - pstart) & (ids < n_indices - pstart)
        page = tl.load(kv_indices_ptr + pstart + ids, mask=valid, other=0)
    valid = valid & (page >= 0) & (page < num_pages)
    # de-duplicate (page, block) pairs: an entry is kept where no earlier one equals it
    same = (page[:, None] == page[None, :]) & (ids[:, None] == ids[None, :])
    same = same & valid[:, None] & valid[None, :]
    earlier = c[None, :] < c[:, None]
    dup = tl.max((same & earlier).to(tl.int32), axis=1)
    first = valid & (dup == 0)
    bits = tl.where(same, (1 << tok_l)[None, :], 0)
    mask = tl.reduce(bits, 1, _or_combine)
    slot = tl.cumsum(first.to(tl.int32), axis=0) - 1
    base = (tile.to(tl.int64) * n_kvh + kvh) * C
    tl.store(u_page_ptr + base + slot, page, mask=first)
    tl.store(u_blk_ptr + base + slot, ids, mask=first)
    tl.store(u_mask_ptr + base + slot, mask, mask=first)
    cnt = tl.sum(first.to(tl.int32), axis=0)
    tl.store(u_cnt_ptr + tile * n_kvh + kvh, cnt)


@triton.jit
def _msa_sparse_fwd_kernel(
    q_ptr, stride_qt, stride_qh,
    k_desc, v_desc,
    tok_pos_ptr, tok_kvlen_ptr,
    u_page_ptr, u_blk_ptr, u_mask_ptr, u_cnt_ptr,
    o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh,
    op_ptr, lp_ptr,
    total_q, HQ, RATIO, qk_scale, v_scale, one,
    TT: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, C: tl.constexpr,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, CAUSAL: tl.constexpr,
    IS_FP8: tl.constexpr, HEAD_MAJOR: tl.constexpr, FP8_F16: tl.constexpr = False,
    KEYS: tl.constexpr = 128,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n_kvh = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_M)
    tok_l = rows // GP
    hl = rows % GP
    t = tile * TT + tok_l
    h = kvh * RATIO + hl
    rvalid = (t < total_q) & (hl < RATIO) & (tok_l < TT)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, KEYS)
    KPB: tl.constexpr = 128 // KEYS  # key sub-blocks per selected block
    q = tl.load(q_ptr + t.to(tl.int64)[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :],
                mask=rvalid[:, None], other=0.0)
    q = dot_operand(q)
    if IS_FP8 and FP8_F16 and BLOCK_M < 64:
        q = q.to(tl.float16)  # mma.sync has no e4m3 path here: fp16 operands (exact for e4m3 values)
    pos = tl.load(tok_pos_ptr + t, mask=rvalid, other=-1)
    kv_len = tl.load(tok_kvlen_ptr + t, mask=rvalid, other=0)
    limit = visible_limit(pos, kv_len, CAUSAL)
    ubase = (tile.to(tl.int64) * n_kvh + kvh) * C
    cnt = tl.load(u_cnt_ptr + tile * n_kvh + kvh)
    e0, e1 = split_entries(cnt, split, NUM_SPLITS)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for it in range(e0 * KPB, e1 * KPB):
        e = it // KPB
        k0 = (it % KPB) * KEYS
        page = tl.load(u_page_ptr + ubase + e)
        blk = tl.load(u_blk_ptr + ubase + e)
        sel = tl.load(u_mask_ptr + ubase + e)
        # TMA loads of the page's KEYS x 128 tile, straight into shared memory
        if HEAD_MAJOR:
            kt = tl.reshape(k_desc.load([page, kvh, k0, 0]), [KEYS, HEAD_DIM])
        else:
            kt = tl.reshape(k_desc.load([page, k0, kvh, 0]), [KEYS, HEAD_DIM])
        if IS_FP8 and FP8_F16 and BLOCK_M < 64:
            kt = kt.to(tl.float16)
        s = tl.dot(q, tl.trans(dot_operand(kt))) * qk_scale
        kpos = blk * 128 + k0 + offs_n
        row_sel = ((sel >> tok_l) & 1) != 0
        vis = row_sel[:, None] & (kpos[None, :] <= limit[:, None])
        s = tl.where(vis, s, float("-inf"))
        m_new, p, alpha, l_i = online_softmax_step(s, m_i, l_i)
        if HEAD_MAJOR:
            vt = tl.reshape(v_desc.load([page, kvh, k0, 0]), [KEYS, HEAD_DIM])
        else:
            vt = tl.reshape(v_desc.load([page, k0, kvh, 0]), [KEYS, HEAD_DIM])
        if IS_FP8:
            if FP8_F16:
                vt = vt.to(tl.float16)  # exact, and P keeps 10 mantissa bits (bf16: 7)
                if BLOCK_M < 64:
                    # x * 1.0 is exact; with the 1.0 a runtime value Triton cannot move V's layout
                    # change (a transpose for mma.sync) before the conversion, where it gathers
                    # fp8 bytes one by one (LDS.U8); in fp16 it uses ldmatrix
                    vt = vt * tl.full([1, 1], one, tl.float16)
            else:
                vt = vt.to(tl.bfloat16)
        acc = acc * alpha[:, None] + tl.dot(dot_operand(p.to(vt.dtype)), dot_operand(vt))
        m_i = m_new
    l_safe, lse = finish_softmax(m_i, l_i)
    if NUM_SPLITS == 1:
        o = acc / l_safe[:, None] * v_scale
        o_dtype = o_ptr.dtype.element_ty
        tl.store(o_ptr + t.to(tl.int64)[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
                 to_out_dtype(o, o_dtype), mask=rvalid[:, None])
        tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=rvalid)
    else:
        o = acc / l_safe[:, None]
        prow = (split.to(tl.int64) * total_q + t) * HQ + h
        tl.store(op_ptr + prow[:, None] * HEAD_DIM + offs_d[None, :], o, mask=rvalid[:, None])
        tl.store(lp_ptr + prow, lse, mask=rvalid)


@triton.jit
def _msa_combine_kernel(
    op_ptr, lp_ptr, o_ptr, stride_ot, stride_oh, lse_ptr, stride_lt, stride_lh,
    total_q, HQ, v_scale,
    NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hv = h < HQ
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        ls = tl.load(lp_ptr + (s * total_q + t).to(tl.int64) * HQ + h, mask=hv, other=float("-inf"))
        m = tl.maximum(m, ls)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    den = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        row = (s * total_q + t).to(tl.int64) * HQ + h
        ls = tl.load(lp_ptr + row, mask=hv, other=float("-inf"))
        wgt = tl.exp(ls - m_use)
        os_ = tl.load(op_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=hv[:, None], other=0.0)
        acc += wgt[:, None] * os_
        den += wgt
    empty = den == 0.0
    den_safe = tl.where(empty, 1.0, den)
    o = acc / den_safe[:, None] * v_scale
    lse = tl.where(empty, float("-inf"), m_use + tl.log(den_safe))
    o_dtype = o_ptr.dtype.element_ty
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
             to_out_dtype(o, o_dtype), mask=hv[:, None])
    tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h.to(tl.int64) * stride_lh, lse, mask=hv)


class SparseTiling:
    """Tile geometry of one call: tokens per tile, padded group, rows, union capacity."""

    def __init__(self, ratio: int, width: int, decode: bool):
        self.gp = next_power_of_2(ratio)
        self.block_w = max(4, next_power_of_2(width))
        if decode:
            self.tt = 1
        else:
            self.tt = max(1, min(64 // self.gp, 128 // self.block_w))
        self.block_m = max(16, self.tt * self.gp)
        self.capacity = self.tt * self.block_w

    def __repr__(self) -> str:
        return f"SparseTiling(tt={self.tt}, gp={self.gp}, block_m={self.block_m}, capacity={self.capacity})"


@functools.lru_cache(maxsize=256)
def sparse_tiling(ratio: int, width: int, decode: bool) -> SparseTiling:
    """The (shared, not to be modified) :class:`SparseTiling` of a call's geometry."""
    return SparseTiling(ratio, width, decode)


FP8_VARIANT = {"f16": True, "decode_stages": 2, "decode_maxnreg": 168, "decode_keys": 128, "prefill_keys": 128,
               "prefill_stages": 2}
"""FP8 code path of the sparse forward (module defaults; the benchmark times the others).

``f16``: convert V (and, on 16-row decode tiles, q and K, whose mma.sync has no e4m3
form) to fp16 instead of bf16, and P to fp16: exact for e4m3 values and 3 more mantissa
bits for P; on 16-row tiles V is converted before its layout change (ldmatrix instead of
byte-wise LDS.U8 gathers). ``decode_stages`` / ``decode_maxnreg``: 2-stage TMA
pipelining, registers capped at 168. H200 compile of the M3 decode tile (16 rows,
launch-time divisibility): 157 registers, no spills, 74 KB shared (3 programs per SM,
as before), 876 instead of 1,072 instructions per 128-key block, two blocks in flight
per program instead of one. Not yet timed on the H200; the previous path is
``{"f16": False, "decode_stages": 1, "decode_maxnreg": None}`` (168 registers, 20 KB).
With 1 stage the new path takes 128 registers and 41 KB (4 programs per SM): a benchmark
row. Prefill (64-row tiles) uses ``f16`` only: 943 instead of 1,128 instructions per block.

``prefill_keys`` / ``prefill_stages``: the 64-row (prefill) tiles' keys per TMA tile and pipelining
stages for e4m3 inputs (16-bit inputs: 128 keys, 1 stage, a 168-register cap, 3 programs per SM;
e4m3 takes 198 registers, 75 spill instructions under that cap, so 2 programs per SM). H200,
session 30 (``benchmarks/probe_msa_prefill_fp8.py``: the prefill bar's inputs, sigma 0.5,
interleaved, us at 32K / 8K tokens; bf16 4647.1 / 1020.6): 128 keys with 1 stage 6146.2 / 1337.2,
2 stages 5324.2-5345.5 / 1166.0-1167.2 (the default; bit-identical to 1 stage), 3 stages 5576.2 /
1191.4; 64 keys (149 registers, 3 programs per SM) with 1 / 2 / 3 stages 5988.7 / 5415.2-5418.3 /
5590.5-5630.3."""


def decode_programs_per_sm(is_fp8: bool) -> int:
    """Programs resident per SM of the decode kernel in use: the transposed kernel's from its
    compile (:func:`mate.ops.msa.sparse_decode.t_programs_per_sm`), else those of the one-token decode kernel that fit on an SM at once (sm_90 compiles of the
    M3 tile: bf16 126 registers / 37 KB; fp8 by ``FP8_VARIANT``: 128-key blocks with 2 TMA
    stages 74 KB, 1 stage 128 registers / 41 KB; 64-key halves, 2 stages, cap 96: 96
    registers / 39 KB, no spills)."""
    if _sd.DECODE_VARIANT["kernel"] == "transposed":
        return _sd.t_programs_per_sm(is_fp8)
    if not is_fp8:
        return 4
    if int(FP8_VARIANT["decode_keys"]) == 64:
        cap = FP8_VARIANT["decode_maxnreg"]
        return 5 if cap and int(cap) <= 96 else 4
    return 3 if int(FP8_VARIANT["decode_stages"]) >= 2 else 4


_MAX_SPLITS = 8


def choose_num_splits(num_tiles: int, num_kv_heads: int, width: int, device: torch.device,
                      per_sm: int = 4) -> int:
    """Decode split count: the most splits (at most 8, at most ``width``) whose programs still
    fit one wave of ``SMs * per_sm``, else 1. The decode is memory-bound: a partial wave of
    unsplit programs shares the bandwidth among fewer programs, while a second wave and the
    combine cost time, so splitting pays only while it keeps one wave.

    H200, session 30 (64K context, M3 geometry, 16 blocks, token-major, 8 calls per graph
    replay, us for 1 / 2 / 4 / 8 / 16 splits): bf16 B=1 23.0 / 15.3 / 10.8 / 8.9 / 8.5, B=4 24.0 /
    16.3 / 11.6 / 9.8 / 10.9, B=16 28.6 / 25.1 / 24.9 / 28.2 / 31.1, B=48 53.0 / 59.8 / 62.4 /
    66.6 / 76.7 (the wave model used before took 4 there: 1.18x the best); fp8 B=1 27.2 / 17.1 /
    11.7 / 9.3 / 8.6, B=4 27.4 / 17.6 / 12.0 / 9.8 / 10.0, B=16 28.8 / 20.0 / 17.3 / 18.0 / 21.5,
    B=48 35.9 / 35.4 / 39.9 / 43.7 / 51.9; this rule picks within 8% of the best in each. B=128:
    512 unsplit programs 130 us bf16 (2 splits 141), 73 fp8 (2 splits 82)."""
    return _choose(num_tiles, num_kv_heads, width, planning_sm_count(device, NUM_SMS_DEFAULT) * per_sm)


def resolve_num_splits(num_splits: int, total_q: int, hq: int, hkv: int, width: int, decode: bool,
                       device: torch.device, is_fp8: bool = False) -> int:
    """The split count a call runs with: ``num_splits`` when positive, else
    :func:`choose_num_splits` for decode and 1 for prefill."""
    if num_splits > 0:
        return int(num_splits)
    if not decode:
        return 1
    til = sparse_tiling(hq // hkv, width, decode)
    return choose_num_splits(-(-total_q // til.tt), hkv, width, device, decode_programs_per_sm(is_fp8))


def _choose(tiles: int, hkv: int, width: int, slots: int) -> int:
    programs = max(1, tiles * hkv)
    best = 1
    for s in range(2, max(1, min(_MAX_SPLITS, width)) + 1):
        if programs * s <= slots:
            best = s
    return best


@functools.lru_cache(maxsize=64)
def _split_rows_prefix(hkv: int, width: int, sms: int) -> tuple[int, ...]:
    """prefix[t] = max over t' <= t of splits(t') * t' among split calls (0 if none), for every
    programs-per-SM figure in use. A call splits only while programs * 2 <= slots (at most
    ``sms * 5``), so past ``sms * 5 // (2 * hkv)`` tiles every call is unsplit and the prefix stays
    flat."""
    last = sms * 5 // (2 * hkv) + 1
    best = [0] * (last + 1)
    for t in range(1, last + 1):
        m = best[t - 1]
        for per_sm in range(1, 6):
            sp = _choose(t, hkv, width, sms * per_sm)
            if sp > 1:
                m = max(m, sp * t)
        best[t] = m
    return tuple(best)


def launch_config() -> tuple:
    """The module settings that shape this module's launches (a launch recipe's key includes
    them: benchmarks switch variants between calls)."""
    return tuple(_sd.DECODE_VARIANT.items()), tuple(FP8_VARIANT.items())


def workspace_numel(rows: int, hq: int, hkv: int, width: int, decode: bool, num_splits: int,
                    device: torch.device, head_dim: int = 128) -> tuple[int, int]:
    """(int32, float32) element counts of the scratch of a call with ``rows`` query rows.

    With ``num_splits <= 0`` (the automatic decode split) the float part is sized for the
    largest automatic split of any call with at most ``rows`` rows (bf16 or fp8)."""
    til = sparse_tiling(hq // hkv, width, decode)
    tiles = -(-rows // til.tt)
    n_int = 3 * tiles * hkv * til.capacity + tiles * hkv + 2 * rows
    if num_splits > 0:
        part_rows = num_splits * rows if num_splits > 1 else 0
    elif decode:
        prefix = _split_rows_prefix(hkv, width, planning_sm_count(device, NUM_SMS_DEFAULT))
        part_rows = prefix[min(tiles, len(prefix) - 1)] * til.tt
    else:
        part_rows = 0
    return n_int, part_rows * hq * (head_dim + 1)


def sparse_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_block_indexes: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    kv_page_indptr: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    layout: str,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
    causal: bool,
    decode: bool,
    num_splits: int = -1,
    iws: torch.Tensor | None = None,
    fws: torch.Tensor | None = None,
) -> None:
    """Launches the union pre-kernel (not for the transposed decode kernel, which builds its
    token's block list itself), the sparse forward and (split decode) the combine.

    All tensors validated by the caller; ``out`` [total_q, Hq, D] may be a strided view (last
    dimension contiguous), ``lse`` [total_q, Hq] of any strides. ``iws`` (int32) and ``fws`` (float32)
    are flat scratch buffers of at least :func:`workspace_numel` elements for this call's
    split count; without them the scratch is allocated here. No host sync.
    """
    total_q, hq, d = q.shape
    hkv = k.shape[2] if layout == "NHD" else k.shape[1]
    ratio = hq // hkv
    width = kv_block_indexes.shape[2]
    batch = kv_lens.shape[0]
    if total_q == 0 or batch == 0:
        return
    til = sparse_tiling(ratio, width, decode)
    num_tiles = -(-total_q // til.tt)
    dev = q.device
    is_fp8 = q.dtype == torch.float8_e4m3fn
    splits = resolve_num_splits(num_splits, total_q, hq, hkv, width, decode, dev, is_fp8)
    n_int = 3 * num_tiles * hkv * til.capacity + num_tiles * hkv + 2 * total_q
    n_flt = splits * total_q * hq * (d + 1) if splits > 1 else 0
    if iws is None or iws.numel() < n_int:
        iws = torch.empty(n_int, dtype=torch.int32, device=dev)
    if splits > 1 and (fws is None or fws.numel() < n_flt):
        fws = torch.empty(n_flt, dtype=torch.float32, device=dev)
    n_u = num_tiles * hkv * til.capacity
    u_page, u_blk, u_mask = iws[:n_u], iws[n_u:2 * n_u], iws[2 * n_u:3 * n_u]
    o = 3 * n_u
    u_cnt = iws[o:o + num_tiles * hkv]
    o += num_tiles * hkv
    tok_pos, tok_kvlen = iws[o:o + total_q], iws[o + total_q:o + 2 * total_q]
    head_step = 1 if kv_block_indexes.shape[1] == hkv else ratio
    use_pt = page_table is not None
    dummy = u_cnt
    n_iter = max(1, math.ceil(math.log2(batch + 1)) + 1)
    transposed = decode and _sd.DECODE_VARIANT["kernel"] == "transposed"
    sel_args = (
        kv_block_indexes, kv_block_indexes.stride(0), kv_block_indexes.stride(1) * head_step,
        qo_indptr, kv_lens, qo_offset if qo_offset is not None else dummy, batch, n_iter,
        page_table if use_pt else dummy, page_table.stride(0) if use_pt else 0, page_table.shape[1] if use_pt else 0,
        kv_indices if not use_pt else dummy, kv_page_indptr if not use_pt else dummy,
        kv_indices.shape[0] if not use_pt else 0, k.shape[0],
    )
    if not transposed:
        launcher(_msa_union_kernel)[(num_tiles, hkv)](
            *sel_args,
            tok_pos, tok_kvlen, u_page, u_blk, u_mask, u_cnt,
            total_q, width,
            TT=til.tt, BLOCK_W=til.block_w, CAUSAL=causal, USE_PAGE_TABLE=use_pt,
            HAS_QO_OFFSET=qo_offset is not None,
            num_warps=4 if til.capacity <= 64 else 8,
        )
    from triton.tools.tensor_descriptor import TensorDescriptor

    if splits > 1:
        o_part = fws[:splits * total_q * hq * d]
        l_part = fws[splits * total_q * hq * d:n_flt]
    else:
        o_part = l_part = out
    if transposed:
        keys, stages, cap = _sd.t_config(is_fp8)
        gp = _sd.decode_t_heads(ratio)
        t_const = _sd.t_constexprs(is_fp8, gp)
        dv = d // 2 if t_const["V_MMA"] else d  # V_MMA: V read as two column halves
        flat = k.is_contiguous() and v.is_contiguous()
        if flat:  # 2D views: a tile of ``keys`` rows is a plain [keys, d] box (no reshape in the kernel)
            kv2 = [t_.view(-1, d) if layout == "HND" else t_.view(-1, hkv * d) for t_ in (k, v)]
            k_desc, v_desc = (TensorDescriptor(t_, list(t_.shape), list(t_.stride()), [keys, w])
                              for t_, w in zip(kv2, (d, dv)))
        else:
            box = [1, keys, 1] if layout == "NHD" else [1, 1, keys]
            k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), box + [d])
            v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), box + [dv])
        extra = {"maxnreg": cap} if cap and not INTERPRET else {}
        launcher(_sd.msa_decode_t_kernel)[(total_q, hkv, splits)](
            q, q.stride(0), q.stride(1), k_desc, v_desc, u_page, u_blk, u_cnt,
            out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1), o_part, l_part,
            total_q, hq, ratio, sm_scale * k_scale * LOG2E, v_scale, *sel_args, width,
            GP=gp, C=til.capacity, HEAD_DIM=d, NUM_SPLITS=splits, CAUSAL=causal,
            IS_FP8=is_fp8, HEAD_MAJOR=layout == "HND", FLAT=flat, KEYS=keys,
            BLOCK_W=til.block_w, USE_PAGE_TABLE=use_pt, HAS_QO_OFFSET=qo_offset is not None,
            **t_const, num_warps=4, num_stages=stages, **extra,
        )
        _combine(o_part, l_part, out, lse, total_q, hq, d, v_scale, splits)
        return
    big = til.block_m >= 64
    keys = int(FP8_VARIANT["prefill_keys" if big else "decode_keys"]) if is_fp8 else 128
    block_shape = [1, keys, 1, d] if layout == "NHD" else [1, 1, keys, d]
    k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), block_shape)
    v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), block_shape)
    stages = int(FP8_VARIANT["prefill_stages"]) if is_fp8 and big else 1
    # 64-row tiles: a 168-register cap gives 3 programs per SM (measured: no spills for 16-bit inputs)
    extra = {} if INTERPRET or not big or is_fp8 else {"maxnreg": 168}
    fp8_f16 = bool(FP8_VARIANT["f16"])
    if is_fp8 and not big:
        stages = int(FP8_VARIANT["decode_stages"])
        if FP8_VARIANT["decode_maxnreg"] and not INTERPRET:
            extra = {"maxnreg": int(FP8_VARIANT["decode_maxnreg"])}
    launcher(_msa_sparse_fwd_kernel)[(num_tiles, hkv, splits)](
        q, q.stride(0), q.stride(1),
        k_desc, v_desc,
        tok_pos, tok_kvlen, u_page, u_blk, u_mask, u_cnt,
        out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1),
        o_part, l_part,
        total_q, hq, ratio, sm_scale * k_scale * LOG2E, v_scale, 1.0,
        TT=til.tt, GP=til.gp, BLOCK_M=til.block_m, C=til.capacity, HEAD_DIM=d,
        NUM_SPLITS=splits, CAUSAL=causal, IS_FP8=is_fp8, HEAD_MAJOR=layout == "HND",
        FP8_F16=fp8_f16, KEYS=keys, num_warps=4, num_stages=stages, **extra,
    )
    _combine(o_part, l_part, out, lse, total_q, hq, d, v_scale, splits)


def _combine(o_part, l_part, out, lse, total_q, hq, d, v_scale, splits) -> None:
    if splits > 1:
        block_h = min(16, next_power_of_2(hq))
        launcher(_msa_combine_kernel)[(total_q, -(-hq // block_h))](
            o_part, l_part, out, out.stride(0), out.stride(1), lse, lse.stride(0), lse.stride(1),
            total_q, hq, v_scale,
            NUM_SPLITS=splits, BLOCK_H=block_h, HEAD_DIM=d, num_warps=4,
        )


# ------------------------------------------------------------------ custom op + entry


def _sparse_attention_op_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_block_indexes: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    kv_page_indptr: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    iws: torch.Tensor,
    fws: torch.Tensor,
    head_major: bool,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
    causal: bool,
    decode: bool,
    num_splits: int,
) -> None:
    sparse_attention_triton(
        q, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset, page_table, kv_indices,
        kv_page_indptr, out, lse, layout="HND" if head_major else "NHD", sm_scale=sm_scale,
        k_scale=k_scale, v_scale=v_scale, causal=causal, decode=decode, num_splits=num_splits,
        iws=iws, fws=fws,
    )


def _register():
    from mate._core.custom_op import mate_custom_op

    return mate_custom_op("msa_sparse_attention", mutates_args=("out", "lse", "iws", "fws"))(
        _sparse_attention_op_impl)


msa_sparse_attention_op = _register()


_QKV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
_MAX_WIDTH = 64


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    plan=None,
    kv_block_indexes: torch.Tensor,
    page_table: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    kv_page_indptr: torch.Tensor | None = None,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None = None,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    causal: bool | None = None,
    decode: bool | None = None,
    num_kv_splits: int | None = None,
    num_kv_heads: int | None = None,
    workspace=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MSA sparse forward over the selected 128-token blocks (the ``msa()`` sparse modes).

    Parameters
    ----------
    q : [total_q, Hq, 128] fp16 / bf16 / float8_e4m3fn
    k, v : paged caches, page size 128, [pages, 128, Hkv, 128] (token-major) or
        [pages, Hkv, 128, 128] (head-major), q's dtype; read in place.
    plan : an ``MsaPlan`` (or None); supplies ``causal``, ``mode`` ("sparse_decode" schedules
        one-token tiles with split blocks), ``num_kv_splits`` and ``num_kv_heads`` unless the
        keywords below override them.
    kv_block_indexes : int32 [total_q, Hkv or Hq, width], 1 <= width <= 64. Logical block ids
        of the token's request; -1 / out-of-range ids are skipped; duplicates count once.
    page_table : int32 [B, max_pages], or ``kv_indices`` int32 [pages] + ``kv_page_indptr``
        int32 [B + 1].
    qo_indptr : int32 [B + 1]; kv_lens : int32 [B]; qo_offset : int32 [B] or None
        (default kv_len - q_len).
    sm_scale : softmax scale (default D ** -0.5); k_scale folds into it, v_scale scales out.
    out : [total_q, Hq, 128] q's dtype (bf16 for fp8 inputs), last dim contiguous (a strided
        slice of a larger buffer is fine); lse : fp32 [total_q, Hq] (natural log), any strides
        (FlashAttention's [Hq, total_q] transposed is fine).
    workspace : an :class:`mate.ops.msa.workspace.MsaWorkspace` for the scratch buffers
        (default: the plan's; without either, the scratch is allocated per call). Sized at
        its first use by ``max(total_q, plan.rows_capacity)`` query rows and reused after.

    Returns
    -------
    (out, lse); rows without a visible key get out 0 and lse -inf.

    Raises
    ------
    TypeError for wrong dtypes, ValueError for wrong shapes / devices / values.
    """
    from mate._core import checks

    checks.check_tensor("q", q, dtype=_QKV_DTYPES, ndim=3, last_dim_contiguous=True)
    total_q, hq, d = q.shape
    checks.check_value("q.shape[2] (head_dim)", d == 128, "128", d)
    checks.check_tensor("k", k, dtype=q.dtype, ndim=4, last_dim_contiguous=True)
    checks.check_tensor("v", v, dtype=q.dtype, ndim=4, last_dim_contiguous=True)
    if num_kv_heads is None and plan is not None:
        num_kv_heads = getattr(plan, "num_kv_heads", None)
    from mate.ops.msa.reference_attention import kv_layout_of

    layout = kv_layout_of(k, num_kv_heads)
    hkv = k.shape[2] if layout == "NHD" else k.shape[1]
    page_shape = [None, 128, hkv, d] if layout == "NHD" else [None, hkv, 128, d]
    checks.check_shape("k", k, page_shape)
    checks.check_value("k.shape[0] (pages)", k.shape[0] > 0, "at least 1", k.shape[0])
    checks.check_shape("v", v, [k.shape[0], *page_shape[1:]])
    checks.check_tma_aligned("k", k)  # the kernels read pages with TMA descriptors
    checks.check_tma_aligned("v", v)
    if hkv <= 0 or hq % hkv:
        checks.check_value("q.shape[1] (num_qo_heads)", False, f"a multiple of num_kv_heads={hkv}", hq)
    checks.check_tensor("kv_block_indexes", kv_block_indexes, dtype=torch.int32, ndim=3,
                        last_dim_contiguous=True)
    width = kv_block_indexes.shape[2]
    checks.check_shape("kv_block_indexes", kv_block_indexes, [total_q, None, None])
    if kv_block_indexes.shape[1] not in (hkv, hq):
        checks.check_value("kv_block_indexes.shape[1]", False, f"num_kv_heads={hkv} or num_qo_heads={hq}",
                           kv_block_indexes.shape[1])
    if not 1 <= width <= _MAX_WIDTH:
        checks.check_value("kv_block_indexes.shape[2] (width)", False, f"in [1, {_MAX_WIDTH}]", width)
    checks.check_tensor("kv_lens", kv_lens, dtype=torch.int32, ndim=1, contiguous=True)
    batch = kv_lens.shape[0]
    checks.check_tensor("qo_indptr", qo_indptr, dtype=torch.int32, shape=[batch + 1], contiguous=True)
    if qo_offset is not None:
        checks.check_tensor("qo_offset", qo_offset, dtype=torch.int32, shape=[batch], contiguous=True)
    if page_table is not None:
        checks.check_tensor("page_table", page_table, dtype=torch.int32, shape=[batch, None],
                            last_dim_contiguous=True)
    else:
        if kv_indices is None or kv_page_indptr is None:
            raise ValueError("page_table or both kv_indices and kv_page_indptr must be given, got neither")
        checks.check_tensor("kv_indices", kv_indices, dtype=torch.int32, ndim=1, contiguous=True)
        checks.check_tensor("kv_page_indptr", kv_page_indptr, dtype=torch.int32, shape=[batch + 1],
                            contiguous=True)
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    inputs = dict(q=q, k=k, v=v, kv_block_indexes=kv_block_indexes, qo_indptr=qo_indptr, kv_lens=kv_lens,
                  qo_offset=qo_offset, page_table=page_table, kv_indices=kv_indices, kv_page_indptr=kv_page_indptr)
    device = checks.check_same_device(**inputs, out=out, lse=lse)
    reads = checks.byte_ranges(**inputs) if out is not None or lse is not None else {}  # for the overlap checks
    if out is None:
        out = torch.empty(total_q, hq, d, dtype=out_dtype, device=device)
    else:
        checks.check_out_tensor("out", out, shape=[total_q, hq, d], dtype=out_dtype, device=device,
                                contiguous=False, last_dim_contiguous=True)
        checks.check_no_overlap("out", out, **reads)
    if lse is None:
        lse = torch.empty(total_q, hq, dtype=torch.float32, device=device)
    else:
        checks.check_out_tensor("lse", lse, shape=[total_q, hq], dtype=torch.float32, device=device,
                                contiguous=False)  # any strides: the kernels take both
        checks.check_no_overlap("lse", lse, **reads, out=out)
    return run_sparse_attention(
        q, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset, page_table, kv_indices, kv_page_indptr, out, lse,
        head_major=layout == "HND", plan=plan, sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale, causal=causal,
        decode=decode, num_kv_splits=num_kv_splits, workspace=workspace)


def run_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_block_indexes: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    qo_offset: torch.Tensor | None,
    page_table: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    kv_page_indptr: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    head_major: bool,
    plan=None,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    causal: bool | None = None,
    decode: bool | None = None,
    num_kv_splits: int | None = None,
    workspace=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sparse_attention` on arguments that already hold what it checks (``msa()``
    validates the same conditions on the whole call): no checks, no defaults for ``out`` /
    ``lse``. ``head_major``: k / v are [pages, Hkv, 128, D]."""
    from mate._core.dispatch import select_backend

    total_q, hq, d = q.shape
    hkv = k.shape[1] if head_major else k.shape[2]
    width = kv_block_indexes.shape[2]
    device = q.device
    if sm_scale is None:
        sm_scale = d ** -0.5
    if causal is None:
        causal = bool(getattr(plan, "causal", True))
    if decode is None:
        decode = getattr(plan, "mode", "sparse_prefill") == "sparse_decode"
    if num_kv_splits is None:
        num_kv_splits = int(getattr(plan, "num_kv_splits", -1) or -1)
    if select_backend(device) == "reference":
        from mate.ops.msa.reference_attention import sparse_attention_reference

        ro, rl = sparse_attention_reference(
            q, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset, page_table=page_table,
            kv_indices=kv_indices, kv_page_indptr=kv_page_indptr, sm_scale=sm_scale, k_scale=k_scale,
            v_scale=v_scale, causal=causal, num_kv_heads=hkv)
        out.copy_(ro)
        lse.copy_(rl)
        return out, lse
    if workspace is None and plan is not None:
        workspace = getattr(plan, "workspace", None)
    splits = resolve_num_splits(int(num_kv_splits), total_q, hq, hkv, width, decode, device,
                                q.dtype == torch.float8_e4m3fn)
    if workspace is not None:
        rows_cap = max(total_q, int(getattr(plan, "rows_capacity", 0) or 0))
        n_int, n_flt = workspace_numel(rows_cap, hq, hkv, width, decode, int(num_kv_splits), device)
        n_int_now, n_flt_now = workspace_numel(total_q, hq, hkv, width, decode, splits, device)
        iws = workspace.buffer("sparse_int", max(n_int, n_int_now), torch.int32, device)
        fws = workspace.buffer("sparse_float", max(n_flt, n_flt_now), torch.float32, device)
    else:
        n_int, n_flt = workspace_numel(total_q, hq, hkv, width, decode, splits, device)
        iws = torch.empty(n_int, dtype=torch.int32, device=device)
        fws = torch.empty(max(1, n_flt), dtype=torch.float32, device=device)
    msa_sparse_attention_op(
        q, k, v, kv_block_indexes, qo_indptr, kv_lens, qo_offset, page_table, kv_indices, kv_page_indptr,
        out, lse, iws, fws, head_major, float(sm_scale), float(k_scale), float(v_scale), bool(causal),
        bool(decode), splits,
    )
    return out, lse
