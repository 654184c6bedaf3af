"""Benchmark of ``mate.mha_interface`` on the H200 (MSA's dense and paged modes).

- Dense causal prefill, one sequence of 16K tokens, 32 heads, d 128, bf16, through
  ``flash_attn_varlen_func`` (which hands one dense sequence to torch's fused attention)
  against torch SDPA's best backend (cuDNN, flash, memory-efficient; the fastest counts);
  plus the same call returning the LSE (aten's cuDNN attention op, ``SDPA_WITH_LSE``), the
  Triton kernel on that problem (``SDPA_WITH_LSE`` off), all interleaved; and a ragged batch
  of 8 x 2K sequences (Triton) against one cuDNN SDPA call per sequence and aten's
  FlashAttention-2 varlen op (torch's bundled FA2; cuDNN's varlen op blocks the host and took
  54-92 ms a call, ``probe_cudnn_varlen.py``).
- Short prompts: 64 x 128 tokens (32 / 8 heads, causal), GPU time against aten's FA2 varlen,
  and eager calls back to back (host time included).
- Paged prefill: 8 x 2K new tokens over a shuffled cache of 128-key pages (32 / 8 heads,
  causal) against one cuDNN SDPA call per sequence on the same keys laid out contiguously.
- A mixed batch: 127 decode requests and one 2048-token prefill chunk, each at the end of an
  8K context in 128-key pages (32 / 8 heads, causal), through one ``flash_attn_varlen_func``
  call (as vLLM's FlashAttention backend issues it): the default (the chunk on the TMA kernel,
  the decode rows on the packed-heads kernel), without ``split_short`` (every row on the TMA
  kernel), and the caller's split into two calls.
- Paged decode, B = 128, q_len 1, 8K context, 32 q heads / 8 KV heads, page 128 and 16,
  bf16, through ``flash_attn_with_kvcache``: GB/s of the K/V bytes read, against the
  measured copy bandwidth.
"""

from __future__ import annotations

from unittest import mock

import torch

from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from mate.testing.bench import back_to_back_us, record, time_fn, time_interleaved
from mate.testing.inputs import paged_chunk_batch

FAMILY = "mha"


def _prefill_rows(ceilings: dict) -> list[dict]:
    rows = []
    T, H, D = 16384, 32, 128
    q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    flops = 4.0 * D * H * T * (T + 1) / 2
    shape = f"T={T} H={H} d={D} causal"
    out = torch.empty_like(q)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))

    def sdpa(be):
        def fn():
            with sdpa_kernel([be]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        return fn

    from mate import mha_interface

    def with_lse():
        return flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True, out=out, return_softmax_lse=True)

    kernel_with_lse = mock.patch.object(mha_interface, "SDPA_WITH_LSE", False)(with_lse)

    # interleaved (the same clocks for mate and each backend: timed one after another, a 3.3 ms
    # call read 0.98x and 0.87x of cuDNN in two runs)
    backends = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
    cases = {be.name: sdpa(be) for be in backends}
    mate_cases = {
        "mate (fused SDPA path)": lambda: flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True, out=out),
        "mate (fused SDPA path, no out=)": lambda: flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True),
        "mate (with LSE: cuDNN op)": with_lse,
        "mate Triton kernel (with LSE)": kernel_with_lse,
    }
    times = time_interleaved({**cases, **mate_cases}, rounds=4, iters=16)
    best = None
    for be in backends:
        t_us, note = times[be.name], ""
        if isinstance(t_us, Exception):
            t_us, note = None, f"failed: {times[be.name]}"[:150]
        if t_us and (best is None or t_us < best):
            best = t_us
        rows.append(record(ceilings, family=FAMILY, op="varlen_prefill", shape=shape, impl=f"torch SDPA {be.name}",
                           time_us=t_us, flops=flops, dtype="bf16", ceiling="cublas_bf16_TFLOPs", note=note))
    for label in mate_cases:
        t_us = times[label] if isinstance(times[label], float) else None
        rows.append(record(ceilings, family=FAMILY, op="varlen_prefill", shape=shape, impl=label,
                           time_us=t_us, flops=flops, dtype="bf16", ceiling="cublas_bf16_TFLOPs",
                           note=f"{best / t_us:.2f}x of SDPA's best" if best and t_us else str(times[label])[:150]))
    # a ragged batch (Triton kernel) against its sequences one SDPA (cuDNN) call each
    S = T // 8
    cu8 = torch.arange(0, T + 1, S, dtype=torch.int32, device="cuda")

    def sdpa_per_sequence():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for i in range(8):
                sl = slice(i * S, (i + 1) * S)
                torch.nn.functional.scaled_dot_product_attention(qt[:, :, sl], kt[:, :, sl], vt[:, :, sl],
                                                                 is_causal=True)

    times = time_interleaved({
        "mate Triton": lambda: flash_attn_varlen_func(q, k, v, cu8, cu8, S, S, causal=True, out=out),
        "torch SDPA CUDNN_ATTENTION, one call per sequence": sdpa_per_sequence,
        FA2: lambda: _fa2_varlen(q, k, v, cu8, S, True),
    }, rounds=6, iters=20)
    for label, t_us in times.items():
        rows.append(record(ceilings, family=FAMILY, op="varlen_prefill", shape=f"8 x {S} H={H} d={D} causal",
                           impl=label, time_us=t_us if isinstance(t_us, float) else None, flops=flops / 8,
                           dtype="bf16", ceiling="cublas_bf16_TFLOPs",
                           note="" if isinstance(t_us, float) else str(t_us)[:150]))
    return rows


FA2 = "aten FA2 varlen (torch.ops.aten._flash_attention_forward)"


def _fa2_varlen(q, k, v, cu, max_len: int, causal: bool):
    """torch's bundled FlashAttention-2 varlen forward (the same cu_seqlens for q and k)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, causal, False)


def _short_prompt_rows(ceilings: dict) -> list[dict]:
    """64 prompts of 128 tokens (32 / 8 heads, d 128, causal), ragged: GPU time (graph replay)
    against aten's FA2 varlen, and back-to-back eager calls, whose time includes the host's
    (``docs/guides/performance.md``, host overhead)."""
    n, S, HQ, HKV, D = 64, 128, 32, 8, 128
    q = torch.randn(n * S, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n * S, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = torch.arange(0, n * S + 1, S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    cases = {"mate": lambda: flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True, out=out),
             FA2: lambda: _fa2_varlen(q, k, v, cu, S, True)}
    times = time_interleaved(cases, rounds=6, iters=30)
    for label, fn in cases.items():
        times[f"{label}, eager calls back to back"] = back_to_back_us(fn)
    flops = 4.0 * D * HQ * n * S * (S + 1) / 2
    return [record(ceilings, family=FAMILY, op="varlen_prefill", shape=f"{n} x {S} Hq={HQ} Hkv={HKV} d={D} causal",
                   impl=label, time_us=t if isinstance(t, float) else None, flops=flops, dtype="bf16",
                   ceiling="cublas_bf16_TFLOPs", note="" if isinstance(t, float) else str(t)[:150])
            for label, t in times.items()]


def _paged_prefill_rows(ceilings: dict, page: int) -> list[dict]:
    """8 x 2048 new tokens (32 / 8 heads, d 128, causal) whose keys sit in a shuffled paged cache
    (``seqused_k``), against one cuDNN SDPA call per sequence on the same keys laid out contiguously."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S, HQ, HKV, D = 8, 2048, 32, 8, 128
    npg = S // page
    q = torch.randn(B * S, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    table = torch.randperm(B * npg, device="cuda").to(torch.int32).view(B, npg).contiguous()
    kc = torch.empty(B * npg, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.empty_like(kc)
    kc[table.flatten().long()] = k.view(B * npg, page, HKV, D)
    vc[table.flatten().long()] = v.view(B * npg, page, HKV, D)
    cu = torch.arange(0, B * S + 1, S, dtype=torch.int32, device="cuda")
    used = torch.full((B,), S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    qt = q.view(B, S, HQ, D).transpose(1, 2)
    kt, vt = (x.transpose(1, 2) for x in (k, v))

    def sdpa_per_sequence():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for i in range(B):
                torch.nn.functional.scaled_dot_product_attention(qt[i:i + 1], kt[i:i + 1], vt[i:i + 1], is_causal=True,
                                                                 enable_gqa=True)

    times = time_interleaved({
        "mate": lambda: flash_attn_varlen_func(q, kc, vc, cu, None, S, None, seqused_k=used, page_table=table,
                                               causal=True, out=out),
        "torch SDPA CUDNN_ATTENTION, one call per sequence (contiguous keys)": sdpa_per_sequence,
    }, rounds=6, iters=20)
    flops = 4.0 * D * HQ * B * S * (S + 1) / 2
    return [record(ceilings, family=FAMILY, op="paged_prefill", shape=f"{B} x {S} Hq={HQ} Hkv={HKV} d={D} page={page} "
                   "causal", impl=label, time_us=t if isinstance(t, float) else None, flops=flops, dtype="bf16",
                   ceiling="cublas_bf16_TFLOPs", note="" if isinstance(t, float) else str(t)[:150])
            for label, t in times.items()]


def _mixed_rows(ceilings: dict) -> list[dict]:
    from mate.ops.mha import prefill_tma

    n_dec, chunk, ctx, page, HQ, HKV, D = 127, 2048, 8192, 128, 32, 8, 128
    q_lens = [1] * n_dec + [chunk]
    inp = paged_chunk_batch(q_lens, ctx, HQ, HKV, page, D)
    q, kc, vc, table, cu, used = (inp[n] for n in ("q", "k_cache", "v_cache", "page_table", "cu_seqlens_q",
                                                   "seqused_k"))
    out = torch.empty_like(q)

    def one_call():
        return flash_attn_varlen_func(q, kc, vc, cu, None, chunk, None, seqused_k=used, page_table=table,
                                      causal=True, out=out)

    cu_dec, cu_chunk = cu[:n_dec + 1], torch.tensor([0, chunk], dtype=torch.int32, device="cuda")

    def two_calls():
        flash_attn_varlen_func(q[:n_dec], kc, vc, cu_dec, None, 1, None, seqused_k=used[:n_dec],
                               page_table=table[:n_dec], causal=True, out=out[:n_dec])
        flash_attn_varlen_func(q[n_dec:], kc, vc, cu_chunk, None, chunk, None, seqused_k=used[n_dec:],
                               page_table=table[n_dec:], causal=True, out=out[n_dec:])

    unsplit = mock.patch.dict(prefill_tma.PREFILL_TMA, {"split_short": False})(one_call)
    times = time_interleaved({"mate (one call)": one_call, "mate (one call, split_short off)": unsplit,
                              "mate (two calls: decode rows, then the chunk)": two_calls}, rounds=6, iters=20)
    flops = sum(4.0 * D * HQ * n * (ctx - (n - 1) / 2) for n in q_lens)
    shape = f"{n_dec} decodes + {chunk}-token chunk, ctx={ctx} Hq={HQ} Hkv={HKV} page={page} causal"
    return [record(ceilings, family=FAMILY, op="mixed_batch", shape=shape, impl=label,
                   time_us=t if isinstance(t, float) else None, flops=flops, dtype="bf16",
                   ceiling="cublas_bf16_TFLOPs", note="" if isinstance(t, float) else str(t)[:150])
            for label, t in times.items()]


def _decode_rows(ceilings: dict, page: int) -> list[dict]:
    B, ctx, HQ, HKV, D = 128, 8192, 32, 8, 128
    npg = ctx // page
    pages = B * npg
    kc = torch.randn(pages, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(pages, device="cuda").to(torch.int32).view(B, npg).contiguous()
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    nbytes = 2.0 * B * ctx * HKV * D * 2
    t_us = time_fn(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, causal=True),
                   iters=30)
    return [record(ceilings, family=FAMILY, op="paged_decode", shape=f"B={B} ctx={ctx} Hq={HQ} Hkv={HKV} page={page}",
                   impl="mate", time_us=t_us, nbytes=nbytes, flops=4.0 * D * HQ * B * ctx, dtype="bf16",
                   ceiling="copy_GBps", note="K/V bytes read")]


def run(ceilings: dict, quick: bool = False) -> list[dict]:
    rows: list[dict] = []
    for op, job in (("varlen_prefill", lambda: _prefill_rows(ceilings)),
                    ("varlen_prefill", lambda: _short_prompt_rows(ceilings)),
                    ("paged_prefill", lambda: _paged_prefill_rows(ceilings, 128)),
                    ("mixed_batch", lambda: _mixed_rows(ceilings)),
                    ("paged_decode", lambda: _decode_rows(ceilings, 128)),
                    ("paged_decode", lambda: _decode_rows(ceilings, 16))):
        try:
            rows += job()
        except Exception as exc:
            rows.append(record(ceilings, family=FAMILY, op=op, shape="", impl="mate", time_us=None,
                               note=f"crashed: {type(exc).__name__}: {exc}"[:300]))
        torch.cuda.empty_cache()
    return rows
