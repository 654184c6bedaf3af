"""Benchmark of MSA sparse attention (prefill and decode) on the H200, MiniMax-M3 geometry.

Geometry: 64 query heads, 4 KV heads, head_dim 128, paged bf16 (or fp8) K/V with page =
block = 128 tokens, per-token per-KV-head lists of 16 blocks: the token's own block forced
plus 15 from a top-k over a max-score pass.

Selections (prefill) come from structured data as ``shared/notes/msa-in-triton.md``
describes: per KV head, index q and k = a slowly varying rank-8 component + noise of
standard deviation sigma (0.25, 0.5 = the main case, 1.0), plus fully random selections.
The max-score pass and top-k run through mate's own kernels (``msa`` with
``output_maxscore`` and ``sparse_topk_select``) when they work, else a torch reference.
The union size of each 4-token tile is reported with every row.

Rows:
- mate sparse prefill, 32K tokens in one request, end to end (union pre-kernel + forward); the
  sigma-0.5 case also with e4m3 q / K / V;
- torch SDPA dense causal (cuDNN) over the full context: the peer to beat;
- FlexAttention with a token-level ``mask_mod`` encoding the same sigma-0.5 selections
  (compiled, ``create_block_mask`` compiled) on the same 32K problem, when
  ``MATE_BENCH_FLEX=1`` (it costs about a minute of compilation; gpu-peers.md measured
  13.8 ms at 8K and 277 ms at 32K);
- decode, B = 128, q_len 1, 64K context, bf16 and fp8 KV (timed first, see ``run``): mate's
  default (the transposed kernel of ``sparse_decode.py``) with the automatic, 1 and 2
  splits, the previous heads-on-M kernel beside it, the default on a head-major copy of the
  same cache (``mate head-major cache``), and a naive PyTorch gather + einsum; GB/s of the
  selected K/V bytes against the copy bandwidth. Token-major fp8 caches read each key row of
  a KV head as a 128-byte piece: ``probe_msa_decode_floor`` measured the decode's loads alone
  at 88-96% of copy there depending on the machine, 94-99% head-major; the ``read floor`` rows
  (:func:`selected_read_kernel`: the decode's grid and TMA loads of the same bytes, no compute)
  give that ceiling for each layout in the same run.
  Each decode case is timed as a layer loop: ``LOOP_CALLS`` calls per CUDA-graph replay,
  alternating two selections over the same cache (no L2 reuse between neighbours), the
  time divided by the calls, as FlashInfer's ``bench_gpu_time_with_cudagraph`` and Triton's
  ``do_bench_cudagraph`` time a kernel. One call per replay also carries the replay's own
  launch (a null kernel with the decode's grid: 3.0 us alone, 1.2 us per call in a loop,
  ``probe_msa_decode_pdl``), which the 1 GiB copy of the ceiling spreads over 2 GiB; the
  default and the head-major case are also timed that way (``one call per replay``).
  The lists hold 16 blocks (15 + the forced end block); the MSA decode device requests use
  17 (16 + 1), which reads 6% more bytes.

Effective TFLOP/s count 4 * d * (visible selected keys) per query head.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing.bench import record, time_fn, time_interleaved

FAMILY = "msa_attention"
LOOP_CALLS = 8  # decode calls per graph replay (a layer loop)
HQ, HKV, D, BLK, TOPK = 64, 4, 128, 128, 16


def _structured(T: int, sigma: float | None, g: torch.Generator, heads: int, rank: int = 8, amp: float = 0.6) -> tuple:
    """Index q/k per KV head [T, heads, D]: slow rank-8 component + noise (None: pure noise).

    ``amp`` 0.6 with periods of 4K-8K tokens reproduces the note's locality on the last
    tokens of a 32K prompt (checked on the CPU with a torch selection: adjacent tokens share
    14.8 / 13.6 / 11.5 of 16 blocks and 4-token unions are 18.3 / 20.6 / 25.1 at sigma 0.25
    / 0.5 / 1.0; the note: 14.7 / 13.5 / 11.1 and 18.4 / 20.8 / 26.2)."""
    t = torch.arange(T, device="cuda", dtype=torch.float32)
    qs, ks = [], []
    for _ in range(heads):
        basis = torch.randn(rank, D, device="cuda", generator=g)
        periods = 512.0 * 2.0 ** torch.rand(rank, device="cuda", generator=g) * 8
        phase = torch.rand(rank, device="cuda", generator=g) * 6.28
        coef = torch.sin(t[:, None] * (6.283 / periods[None, :]) + phase[None, :])
        base = coef @ basis
        s = 1.0 if sigma is None else sigma
        w = 0.0 if sigma is None else amp
        qs.append(w * base + s * torch.randn(T, D, device="cuda", generator=g))
        ks.append(w * base + s * torch.randn(T, D, device="cuda", generator=g))
    return torch.stack(qs, 1), torch.stack(ks, 1)


def _select_torch(qi: torch.Tensor, ki: torch.Tensor, topk: int) -> torch.Tensor:
    """Causal max-score per (token, KV head, block) and top-k with the own block forced."""
    T = qi.shape[0]
    nb = -(-T // BLK)
    out = torch.empty(T, HKV, topk, dtype=torch.int32, device="cuda")
    pos = torch.arange(T, device="cuda")
    for c0 in range(0, T, 2048):
        c1 = min(T, c0 + 2048)
        s = torch.einsum("thd,khd->htk", qi[c0:c1].float(), ki.float())  # [H, n, T]
        s = s.masked_fill(pos[None, None, :] > pos[None, c0:c1, None], -math.inf)
        pad = nb * BLK - T
        if pad:
            s = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
        ms = s.view(HKV, c1 - c0, nb, BLK).amax(-1)  # [H, n, nb]
        own = (pos[c0:c1] // BLK)
        ms.scatter_(2, own[None, :, None].expand(HKV, -1, 1), math.inf)
        sel = ms.topk(min(topk, nb), dim=-1)
        ids = torch.where(torch.isinf(sel.values) & (sel.values < 0), -1, sel.indices)
        out[c0:c1] = ids.permute(1, 0, 2).to(torch.int32)
    return out


def _select_mate(qi: torch.Tensor, ki: torch.Tensor, topk: int) -> torch.Tensor:
    """The same selection through mate's max-score and top-k kernels (paged, identity table)."""
    from mate.msa_interface import _msa_plan_from_lengths, msa, sparse_topk_select

    T = qi.shape[0]
    nb = -(-T // BLK)
    kp = torch.zeros(nb * BLK, HKV, D, device="cuda", dtype=torch.bfloat16)
    kp[:T] = ki.to(torch.bfloat16)
    kp = kp.view(nb, BLK, HKV, D)
    table = torch.arange(nb, device="cuda", dtype=torch.int32)[None]
    plan = _msa_plan_from_lengths(torch.tensor([T]), torch.tensor([T]), HKV, num_kv_heads=HKV, page_size=BLK,
                                  output_maxscore=True, device="cuda")
    ms = torch.empty(T, HKV, nb, dtype=torch.float32, device="cuda")
    msa(qi.to(torch.bfloat16), kp, None, plan, max_score=ms, output_o=False, page_table=table)
    pos = torch.arange(T, device="cuda", dtype=torch.int64)
    return sparse_topk_select(ms, topk, force_end_blocks=1, query_positions=pos)


def _union_and_work(idx: torch.Tensor, T: int, tile: int = 4) -> tuple[float, float, float]:
    """Mean union size of a tile's lists (per KV head) over all tiles and over the last 1024
    tokens (steady state, the note's figure), and visible selected keys summed over tokens
    and KV heads (causal)."""
    n = T // tile
    ids = idx[: n * tile].view(n, tile, HKV, -1).permute(0, 2, 1, 3).reshape(n, HKV, -1).long()
    s, _ = ids.sort(-1)
    first = torch.ones_like(s, dtype=torch.bool)
    first[..., 1:] = s[..., 1:] != s[..., :-1]
    sizes = ((s >= 0) & first).sum(-1).float()
    union, union_last = sizes.mean().item(), sizes[-(1024 // tile):].mean().item()
    s2, _ = idx.long().sort(-1)
    f2 = torch.ones_like(s2, dtype=torch.bool)
    f2[..., 1:] = s2[..., 1:] != s2[..., :-1]
    pos = torch.arange(T, device=idx.device)[:, None, None]
    vis = (pos - s2 * BLK + 1).clamp(0, BLK)
    keys = torch.where((s2 >= 0) & f2, vis, 0).sum().item()
    return union, union_last, float(keys)


def _prefill_rows(ceilings: dict, T: int) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    nb = -(-T // BLK)
    # paged cache in shuffled pages (in-place reads), one request of T tokens
    perm = torch.randperm(nb + 7, device="cuda", generator=g).to(torch.int32)
    table = perm[:nb][None].contiguous()
    k = torch.randn(nb + 7, BLK, HKV, D, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn_like(k)
    qo = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    kvl = torch.tensor([T], dtype=torch.int32, device="cuda")
    out = torch.empty(T, HQ, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(T, HQ, device="cuda")
    shape = f"T={T} Hq={HQ} Hkv={HKV} d={D} top{TOPK}"
    sdpa_us = None
    try:  # dense causal SDPA (cuDNN) over the whole context: the peer to beat
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qd = torch.randn(1, HQ, T, D, device="cuda", dtype=torch.bfloat16)
        kd = torch.randn(1, HKV, T, D, device="cuda", dtype=torch.bfloat16).repeat_interleave(HQ // HKV, 1)
        vd = torch.randn_like(kd)
        best = None
        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            try:
                with sdpa_kernel([be]):
                    t_ = time_fn(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True),
                                 iters=10, use_graph=False)
                best = t_ if best is None else min(best, t_)
            except Exception:
                continue
        sdpa_us = best
        rows.append(record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl="torch SDPA dense causal",
                           time_us=sdpa_us, flops=4.0 * D * HQ * T * (T + 1) / 2, dtype="bf16",
                           ceiling="cublas_bf16_TFLOPs", note="full causal context (best of cuDNN / flash)"))
    except Exception as exc:
        rows.append(record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl="torch SDPA dense causal",
                           time_us=None, note=f"failed: {exc}"[:200]))
    for sigma in (0.5, 0.25, 1.0, None):
        label = "random" if sigma is None else f"sigma {sigma}"
        qi, ki = _structured(T, sigma, g, HKV)
        how = "mate max-score + top-k"
        try:
            idx = _select_mate(qi, ki, TOPK)
        except Exception as exc:
            how = f"torch selection ({type(exc).__name__} in mate's)"
            idx = _select_torch(qi, ki, TOPK)
        union, union_last, keys = _union_and_work(idx, T)
        q = (qi.repeat_interleave(HQ // HKV, 1) + 0.1 * torch.randn(T, HQ, D, device="cuda", generator=g))
        q = (q * D ** -0.25).to(torch.bfloat16)
        del qi, ki

        def run(q=q, idx=idx):
            sparse_attention(q, k, v, kv_block_indexes=idx, page_table=table, qo_indptr=qo, kv_lens=kvl,
                             out=out, lse=lse, causal=True, decode=False, num_kv_heads=HKV)

        try:
            t_us = time_fn(run, iters=20)
            note = f"{label}; union/4-token tile {union:.1f} (last 1K tokens {union_last:.1f}); {how}"
            if sdpa_us:
                note += f"; {sdpa_us / t_us:.2f}x dense"
        except Exception as exc:
            t_us, note = None, f"{label}: failed: {exc}"[:300]
        rows.append(record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl=f"mate ({label})",
                           time_us=t_us, flops=4.0 * D * (HQ // HKV) * keys, dtype="bf16",
                           ceiling="cublas_bf16_TFLOPs", note=note))
        if sigma == 0.5:
            rows.append(_fp8_prefill_row(ceilings, q, k, v, idx, table, qo, kvl, out, lse, shape, keys, label, sdpa_us))
        if sigma == 0.5 and os.environ.get("MATE_BENCH_FLEX") == "1":
            rows.append(_flex_row(ceilings, idx, q, k, v, table, T))
    return rows


def _fp8_prefill_row(ceilings, q, k, v, idx, table, qo, kvl, out, lse, shape, keys, label, sdpa_us) -> dict:
    """The same prefill with e4m3 q / K / V (a cache quantized once, k_scale = v_scale = 1)."""
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))

    def run():
        sparse_attention(q8, k8, v8, kv_block_indexes=idx, page_table=table, qo_indptr=qo, kv_lens=kvl,
                         out=out, lse=lse, causal=True, decode=False, num_kv_heads=HKV)

    try:
        t_us = time_fn(run, iters=20)
        note = f"{label}; e4m3 q / K / V, bf16 out" + (f"; {sdpa_us / t_us:.2f}x dense (bf16)" if sdpa_us else "")
    except Exception as exc:
        t_us, note = None, f"{label}: failed: {exc}"[:300]
    return record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl=f"mate fp8 ({label})",
                  time_us=t_us, flops=4.0 * D * (HQ // HKV) * keys, dtype="fp8", ceiling="cublas_fp8_TFLOPs",
                  note=note)


def _flex_row(ceilings, idx, q, k, v, table, T) -> dict:
    shape = f"T={T} Hq={HQ} Hkv={HKV} d={D} top{TOPK}"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        nb = -(-T // BLK)
        sel = torch.zeros(T, HKV, nb + 1, dtype=torch.bool, device="cuda")
        sel.scatter_(2, torch.where(idx >= 0, idx.long(), nb), True)
        ratio = HQ // HKV

        def mask_mod(b, h, qi, kv):
            return (kv <= qi) & sel[qi, h // ratio, kv // BLK]

        bm = torch.compile(create_block_mask)(mask_mod, 1, HQ, T, T, device="cuda")
        kd = k[table[0].long()].reshape(-1, HKV, D)[:T].transpose(0, 1)[None]
        vd = v[table[0].long()].reshape(-1, HKV, D)[:T].transpose(0, 1)[None]
        qd = q.transpose(0, 1)[None]
        fa = torch.compile(flex_attention)
        t_us = time_fn(lambda: fa(qd, kd, vd, block_mask=bm, enable_gqa=True), iters=5, use_graph=False)
        return record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl="FlexAttention token mask",
                      time_us=t_us, dtype="bf16", note="sigma 0.5 selections as mask_mod (compiled)")
    except Exception as exc:
        return record(ceilings, family=FAMILY, op="sparse_prefill", shape=shape, impl="FlexAttention token mask",
                      time_us=None, note=f"failed: {exc}"[:200])


@triton.jit
def selected_read_kernel(k_desc, v_desc, pg_ptr, q_ptr, sink_ptr, HKV: tl.constexpr, SEL: tl.constexpr,
                         BLK: tl.constexpr, D: tl.constexpr, KEYS: tl.constexpr, PER_PROG: tl.constexpr,
                         HEAD_MAJOR: tl.constexpr):
    """Reads the K and V rows of ``PER_PROG`` selected blocks of one (token, KV head) (pages
    ``pg_ptr`` [tokens, HKV, SEL]) as TMA boxes [KEYS, D] through the pipeliner (the launch's
    ``num_stages``), each tile consumed by a small wgmma against a [D, 16] tile (the pipeliner
    only buffers loads that feed a dot), from 2D views of the cache: [pages * HKV * BLK, D]
    head-major, [pages * BLK, HKV * D] token-major; each block's page loaded one step ahead, as
    the decode does. The decode's loads without its compute: the read floor of its bytes."""
    p = tl.program_id(0)
    per_tok = SEL // PER_PROG
    slot = p % per_tok
    h = (p // per_tok) % HKV
    t = p // (per_tok * HKV)
    base = pg_ptr + (t * HKV + h) * SEL + slot * PER_PROG
    KPB: tl.constexpr = BLK // KEYS
    qt = tl.load(q_ptr + tl.arange(0, D)[:, None] + 0 * tl.arange(0, 16)[None, :])
    acc = tl.zeros([KEYS, 16], dtype=tl.float32)
    page_n = tl.load(base)
    for it in range(PER_PROG * KPB):
        page = page_n
        page_n = tl.load(base + tl.minimum((it + 1) // KPB, PER_PROG - 1))
        k0 = (it % KPB) * KEYS
        if HEAD_MAJOR:
            row = (page * HKV + h) * BLK + k0
            col = 0
        else:
            row = page * BLK + k0
            col = h * D
        acc = tl.dot(k_desc.load([row, col]), qt, acc)
        acc = tl.dot(v_desc.load([row, col]), qt, acc)
    tl.store(sink_ptr + p, tl.sum(tl.sum(acc, axis=1), axis=0).to(tl.int32))


def read_floor_call(k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor, head_major: bool, *, per_prog: int = 0,
                    keys: int = 64, warps: int = 4, stages: int = 3):
    """A call of :func:`selected_read_kernel` over the contiguous cache ``k`` / ``v`` ([pages, BLK,
    HKV, D] or, ``head_major``, [pages, HKV, BLK, D]) for the selected pages ``pages`` [tokens,
    HKV, SEL] int32; ``per_prog`` blocks per program (0: all SEL, the decode's grid)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    tokens, hkv, sel = pages.shape
    per_prog = per_prog or sel
    d = k.shape[-1]
    views = [x.view(-1, d) if head_major else x.view(-1, hkv * d) for x in (k, v)]
    kd, vd = (TensorDescriptor.from_tensor(x, [keys, d]) for x in views)
    q = torch.full((d,), 0.5, device=k.device).to(k.dtype)
    n = tokens * hkv * (sel // per_prog)
    sink = torch.empty(n, dtype=torch.int32, device=k.device)

    def fn() -> None:
        selected_read_kernel[(n,)](kd, vd, pages, q, sink, hkv, sel, BLK, d, keys, per_prog, head_major,
                                   num_warps=warps, num_stages=stages)
    return fn


def decode_inputs(B: int, ctx: int, dtype: torch.dtype, sel: int = TOPK) -> dict:
    """The decode bar's inputs (seeded): a shuffled page table over a ``dtype`` NHD cache and,
    per token and KV head, ``sel - 1`` distinct blocks from a random ranking + the own (last)
    block; keys named as ``sparse_attention``'s arguments."""
    g = torch.Generator(device="cuda").manual_seed(1)
    nb = ctx // BLK
    pages = B * nb
    k = (torch.randn(pages, BLK, HKV, D, device="cuda", generator=g) * 0.5).to(dtype)
    v = (torch.randn(pages, BLK, HKV, D, device="cuda", generator=g) * 0.5).to(dtype)
    table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(B, nb).contiguous()
    scores = torch.rand(B, HKV, nb - 1, device="cuda", generator=g)
    idx = decode_selection(scores, sel)
    q = (torch.randn(B, HQ, D, device="cuda", generator=g) * 0.5).to(dtype)
    return dict(q=q, k=k, v=v, kv_block_indexes=idx, page_table=table,
                qo_indptr=torch.arange(B + 1, dtype=torch.int32, device="cuda"),
                kv_lens=torch.full((B,), ctx, dtype=torch.int32, device="cuda"))


def decode_selection(scores: torch.Tensor, sel: int) -> torch.Tensor:
    """int32 [B, Hkv, sel] block lists: the top ``sel - 1`` of ``scores`` [B, Hkv, nb - 1] (the
    blocks before the last) + the own (last) block."""
    B, nb = scores.shape[0], scores.shape[2] + 1
    return torch.cat([scores.topk(sel - 1, -1).indices,
                      torch.full((B, HKV, 1), nb - 1, device=scores.device)], -1).to(torch.int32).contiguous()


def _decode_rows(ceilings: dict, B: int, ctx: int, dtype: torch.dtype) -> list[dict]:
    rows = []
    pb = decode_inputs(B, ctx, dtype)
    q, k, v, idx, table = pb["q"], pb["k"], pb["v"], pb["kv_block_indexes"], pb["page_table"]
    g = torch.Generator(device="cuda").manual_seed(2)
    selections = (idx, decode_selection(torch.rand(B, HKV, ctx // BLK - 1, device="cuda", generator=g), TOPK))
    qo, kvl = pb["qo_indptr"], pb["kv_lens"]
    out_dtype = torch.bfloat16
    out = torch.empty(B, HQ, D, device="cuda", dtype=out_dtype)
    lse = torch.empty(B, HQ, device="cuda")
    nbytes = 2.0 * B * HKV * TOPK * BLK * D * k.element_size()
    flops = 4.0 * D * HQ * B * TOPK * BLK
    name = "bf16" if dtype == torch.bfloat16 else "fp8"
    shape = f"B={B} ctx={ctx} Hq={HQ} Hkv={HKV} top{TOPK}"
    from mate.ops.msa import sparse_decode as sd

    t_default = dict(sd.DECODE_VARIANT)
    # the default (transposed) kernel, then the previous default, 16-row heads-on-M tiles
    # (mma.sync), for comparison
    kernels = ((t_default["kernel"], "mate", ""), ("heads", "mate heads kernel", "; heads-on-M kernel"))

    # the same cache head-major ([pages, Hkv, 128, D]): a key block of one KV head is one
    # contiguous 16 KB (fp8) piece instead of 128 rows of 128 bytes at a 512-byte stride
    k_hm, v_hm = (x.permute(0, 2, 1, 3).contiguous() for x in (k, v))

    def call(kernel: str, splits: int, head_major: bool = False, which: int = 0):
        def run() -> None:
            sd.DECODE_VARIANT["kernel"] = kernel  # read while the call launches (and is captured)
            try:
                kk, vv = (k_hm, v_hm) if head_major else (k, v)
                sparse_attention(q, kk, vv, kv_block_indexes=selections[which], page_table=table, qo_indptr=qo,
                                 kv_lens=kvl, out=out, lse=lse, causal=True, decode=True, num_kv_splits=splits,
                                 num_kv_heads=HKV)
            finally:
                sd.DECODE_VARIANT.clear()
                sd.DECODE_VARIANT.update(t_default)
        return run

    def loop(kernel: str, splits: int, head_major: bool = False) -> list:
        return [call(kernel, splits, head_major, i % 2) for i in range(LOOP_CALLS)]

    # all plans timed interleaved (time_interleaved): none is measured alone from idle or
    # right after another family's rows
    looped = f"; {LOOP_CALLS} calls per graph replay"
    cases, extras = {}, {}
    for kernel, impl, extra in kernels:
        for splits in (-1, 1, 2):
            label = impl + ("" if splits == -1 else f" splits={splits}")
            cases[label], extras[label] = loop(kernel, splits), extra + looped
    hnd = "; the same cache head-major (HND)"
    cases["mate head-major cache"], extras["mate head-major cache"] = loop(t_default["kernel"], -1, True), hnd + looped
    # the read floor of the same bytes (the decode's TMA loads and grid, no compute): a ceiling
    # of this layout in this run, beside the copy bandwidth
    pages_sel = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, TOPK).to(torch.int32).contiguous()
    for label, kk, vv, hm in (("read floor: the same bytes, TMA loads only", k, v, False),
                              ("read floor: the same bytes head-major, TMA loads only", k_hm, v_hm, True)):
        cases[label] = [read_floor_call(kk, vv, pages_sel, hm)] * LOOP_CALLS
        extras[label] = ("; selected_read_kernel: the decode's grid and TMA boxes, each tile consumed by a small "
                         "wgmma, no softmax" + looped)
    one = ", one call per replay"
    cases["mate" + one], extras["mate" + one] = [call(t_default["kernel"], -1)], "; one call per graph replay"
    cases["mate head-major cache" + one] = [call(t_default["kernel"], -1, True)]
    extras["mate head-major cache" + one] = hnd + "; one call per graph replay"
    times = time_interleaved(cases, iters=50)
    for impl, t_us in times.items():
        note = "selected K/V bytes" + extras[impl]
        if isinstance(t_us, Exception):
            t_us, note = None, f"failed: {t_us}"[:300]
        rows.append(record(ceilings, family=FAMILY, op="sparse_decode", shape=shape, impl=impl, time_us=t_us,
                           flops=flops, nbytes=nbytes, dtype=name, ceiling="copy_GBps", note=note))

    def naive():
        pg = torch.gather(table, 1, idx.view(B, -1).long()).view(B, HKV, TOPK)  # [B, Hkv, 16]
        kk = k[pg.long(), :, torch.arange(HKV, device="cuda")[None, :, None]]  # [B, Hkv, 16, 128, D]
        vv = v[pg.long(), :, torch.arange(HKV, device="cuda")[None, :, None]]
        kk = kk.reshape(B, HKV, TOPK * BLK, D).float()
        vv = vv.reshape(B, HKV, TOPK * BLK, D).float()
        qq = q.view(B, HKV, HQ // HKV, D).float()
        s = torch.einsum("bgrd,bgkd->bgrk", qq, kk) * D ** -0.5
        return torch.einsum("bgrk,bgkd->bgrd", s.softmax(-1), vv)

    try:
        t_us = time_fn(naive, iters=10)
        note = "gather + einsum (fp32)"
    except Exception as exc:
        t_us, note = None, f"failed: {exc}"[:200]
    rows.append(record(ceilings, family=FAMILY, op="sparse_decode", shape=shape, impl="naive PyTorch gather",
                       time_us=t_us, flops=flops, nbytes=nbytes, dtype=name, ceiling="copy_GBps", note=note))
    torch.cuda.empty_cache()
    return rows


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    rows: list[dict] = []
    # decode first: right after the ~30 ms dense-prefill rows the GPU ran the same decode
    # plan ~10% slower than later in the run (H200, 2026-11-29: 155.5 vs 138.4 us when each
    # plan was timed alone; the plans are now timed interleaved)
    jobs = [("sparse_decode", lambda d=d: _decode_rows(ceilings, 128, 65536, d))
             for d in (torch.bfloat16, torch.float8_e4m3fn)]
    jobs += [("sparse_prefill", lambda: _prefill_rows(ceilings, 32768))]
    for op, job in jobs:
        try:
            rows += job()
        except Exception as exc:  # one failing part must not hide the others
            rows.append(record(ceilings, family=FAMILY, op=op, shape="", impl="mate", time_us=None,
                               note=f"crashed: {type(exc).__name__}: {exc}"[:300]))
        torch.cuda.empty_cache()
    return rows
