"""Probe (session 26): the ragged dense prefill kernel (``mate/ops/mha/prefill_tma.py``: TMA
tiles, one query head per program) against the packed-heads kernel it replaces for prefill and
one cuDNN SDPA call per sequence, interleaved.

    python benchmarks/probe_mha_prefill_tma.py

Cases (bf16, d 128 unless marked): 8 x 2048 causal with 32 heads (the benchmark's ragged row) and with 32 / 8
GQA heads, the same batch without the causal mask, one 16K causal sequence with the LSE (the
kernel's route when the cuDNN LSE op is off), a ragged batch of 8 lengths from 100 to 7000, and
8 x 2048 causal at d 64 (32 / 8 heads), and two of them over a shuffled paged cache (pages of
128 and 64 keys, ``seqused_k``; cuDNN on the contiguous keys). ``PROBE_TILES=1`` adds the tile
sweep of session 26; ``PROBE_CHUNKS=1`` times chunked prefill (new queries at the end of an
8K paged context, 64 / 4 heads) on both kernels, for the ``min_seqlen_q`` crossover;
``PROBE_MIXED=1`` (session 27) times batches mixing decode rows into a chunked prefill with
``split_short`` on and off, ``virtual_grid`` off and the TMA kernel off, and the extra launches'
cost on the benchmark's 8 x 2048 ragged batch (``split_short`` on and off; nothing to split
there); ``PROBE_MIXED=only`` adds just the two ragged cases. ``PROBE_PARTS=1`` times a mixed
batch's launches one by one beside the caller's two calls. ``PROBE_CASES=a,b`` runs only those
cases; ``PROBE_TILES=2`` times 2 stages and larger tiles instead of the default's variants.
Tile configurations of ``PREFILL_TMA`` (block_m, block_n, warps, stages) are timed beside the
default; each case's output is compared with the old kernel's (max |difference|).
"""

from __future__ import annotations

import os

import torch

from mate import mha_interface
from mate.mha_interface import flash_attn_varlen_func
from mate.ops.mha import prefill_tma
from mate.testing.bench import time_interleaved
from mate.testing.inputs import paged_chunk_batch

CONFIGS = {"tma (default)": {}, "tma heads outer": {"heads_inner": 0}, "tma virtual_grid off": {"virtual_grid": 0}}
if os.environ.get("PROBE_TILES"):  # the tile sweep of session 26's second call
    CONFIGS.update({"tma 64x64 w4 s2": dict(block_m=64, block_n=64, warps=4, stages=2),
                    "tma 64x64 w4 s4": dict(block_m=64, block_n=64, warps=4, stages=4),
                    "tma 64x128 w4 s2": dict(block_m=64, block_n=128, warps=4, stages=2),
                    "tma 128x64 w8 s3": dict(block_m=128, block_n=64, warps=8, stages=3)})
if os.environ.get("PROBE_TILES") == "2":  # session 27: d 64 stages, and larger tiles without the causal mask
    CONFIGS = {"tma (default)": {}, "tma 64x64 w4 s2": dict(stages=2, stages_d64=2),
               "tma 64x64 w4 s3": dict(stages=3, stages_d64=3),
               "tma 128x64 w8 s3": dict(block_m=128, block_n=64, warps=8, stages=3),
               "tma 128x128 w8 s2": dict(block_m=128, block_n=128, warps=8, stages=2),
               "tma 64x128 w4 s2": dict(block_m=64, block_n=128, warps=4, stages=2)}


def _with(cfg: dict, fn):
    def run():
        saved = dict(prefill_tma.PREFILL_TMA)
        prefill_tma.PREFILL_TMA.update(cfg)
        try:
            return fn()
        finally:
            prefill_tma.PREFILL_TMA.clear()
            prefill_tma.PREFILL_TMA.update(saved)
    return run


def _chunk_inputs(q_lens: list[int], ctx: int, hq: int, hkv: int, page: int):
    inp = paged_chunk_batch(q_lens, ctx, hq, hkv, page)
    return tuple(inp[n] for n in ("q", "k_cache", "v_cache", "page_table", "cu_seqlens_q", "seqused_k"))


def case(name: str, lens: list[int], hq: int, hkv: int, causal: bool, lse: bool, D: int = 128,
         page: int = 0) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    T = sum(lens)
    q = torch.randn(T, hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, hkv, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    flops = sum(4.0 * D * hq * n * ((n + 1) / 2 if causal else n) for n in lens)

    if page:  # the same keys in a shuffled paged cache, read through seqused_k
        npages = [-(-n // page) for n in lens]
        perm = torch.randperm(sum(npages), device="cuda")
        kc = torch.zeros(sum(npages), page, hkv, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        table = torch.zeros(len(lens), max(npages), dtype=torch.int32, device="cuda")
        p0, r0 = 0, 0
        for i, n in enumerate(lens):
            pages = perm[p0:p0 + npages[i]]
            table[i, :npages[i]] = pages.to(torch.int32)
            pad = npages[i] * page - n
            for src, dst in ((k, kc), (v, vc)):
                rows = torch.cat([src[r0:r0 + n], src.new_zeros(pad, hkv, D)])
                dst[pages] = rows.view(npages[i], page, hkv, D)
            p0, r0 = p0 + npages[i], r0 + n
        used = torch.tensor(lens, dtype=torch.int32, device="cuda")

        def mate():
            return flash_attn_varlen_func(q, kc, vc, cu, None, max(lens), None, seqused_k=used, page_table=table,
                                          causal=causal, out=out, return_softmax_lse=lse)
    else:
        def mate():
            return flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal, out=out,
                                          return_softmax_lse=lse)

    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))
    starts = cu.tolist()

    def sdpa_per_sequence():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for i in range(len(lens)):
                sl = slice(starts[i], starts[i + 1])
                torch.nn.functional.scaled_dot_product_attention(qt[:, :, sl], kt[:, :, sl], vt[:, :, sl],
                                                                 is_causal=causal, enable_gqa=hq != hkv)

    old = _with({"enabled": False}, mate)
    cases = {"old kernel": old, **{n: _with(c, mate) for n, c in CONFIGS.items()}}
    if not lse:
        cases["cuDNN per sequence"] = sdpa_per_sequence
    single = mha_interface.SDPA_WITH_LSE
    mha_interface.SDPA_WITH_LSE = False  # the 16K case with the LSE: the kernel, not cuDNN's op
    try:
        with torch.no_grad():
            old()
            ref = out.clone()
            diffs = {}
            for n, c in CONFIGS.items():
                out.fill_(float("nan"))
                _with(c, mate)()
                diffs[n] = (out.float() - ref.float()).abs().max().item()
            times = time_interleaved(cases, rounds=4, iters=16)
    finally:
        mha_interface.SDPA_WITH_LSE = single
    print(f"--- {name}: {len(lens)} requests, {T} tokens, {hq}/{hkv} heads, d {D}, causal={causal}, lse={lse}"
          + (f", paged {page}" if page else ""), flush=True)
    for n, t in times.items():
        if isinstance(t, Exception):
            print(f"  {n:22s} failed: {t}"[:200])
            continue
        d = f"  max|diff| vs old {diffs[n]:.3g}" if n in diffs else ""
        print(f"  {n:22s} {t:8.1f} us  {flops / t / 1e6:5.0f} TFLOP/s{d}", flush=True)


def chunk_case(B: int, q_len: int, ctx: int, hq: int, hkv: int, page: int) -> None:
    """Chunked prefill: ``q_len`` new queries per request at the end of ``ctx`` keys in a
    shuffled paged cache (causal), the TMA kernel against the packed-heads kernel."""
    D = 128
    q, kc, vc, table, cu, used = _chunk_inputs([q_len] * B, ctx, hq, hkv, page)
    out = torch.empty_like(q)

    def mate():
        return flash_attn_varlen_func(q, kc, vc, cu, None, q_len, None, seqused_k=used, page_table=table,
                                      causal=True, out=out)

    times = time_interleaved({"packed-heads": _with({"enabled": False}, mate),
                              "tma": _with({"min_seqlen_q": 1, "heads_inner": 0}, mate),
                              "tma heads inner": _with({"min_seqlen_q": 1, "heads_inner": 1}, mate)},
                             rounds=4, iters=16)
    flops = 4.0 * D * hq * B * q_len * (ctx - q_len / 2)
    line = "  ".join(f"{n} {t:7.1f} us {flops / t / 1e6:4.0f} TF" for n, t in times.items())
    print(f"--- chunk B={B} q_len={q_len} ctx={ctx} {hq}/{hkv} heads page {page}: {line}", flush=True)


def mixed_case(n_dec: int, chunks: list[int], ctx: int, hq: int, hkv: int, page: int = 128) -> None:
    """``n_dec`` decode requests (one query each) and prefill chunks of ``chunks`` new queries,
    every request at the end of ``ctx`` keys in a shuffled paged cache (causal): the split
    launch, the TMA kernel alone and the packed-heads kernel alone."""
    q_lens = [1] * n_dec + chunks
    q, kc, vc, table, cu, used = _chunk_inputs(q_lens, ctx, hq, hkv, page)
    out = torch.empty_like(q)

    def mate():
        return flash_attn_varlen_func(q, kc, vc, cu, None, max(q_lens), None, seqused_k=used, page_table=table,
                                      causal=True, out=out)

    nd = n_dec
    cu_chunks = cu[nd:] - cu[nd]

    def two_calls():  # the decode rows, then the chunks: the caller's split
        flash_attn_varlen_func(q[:nd], kc, vc, cu[:nd + 1], None, 1, None, seqused_k=used[:nd], page_table=table[:nd],
                               causal=True, out=out[:nd])
        flash_attn_varlen_func(q[nd:], kc, vc, cu_chunks, None, max(chunks), None, seqused_k=used[nd:],
                               page_table=table[nd:], causal=True, out=out[nd:])

    cases = {"split (default)": mate, "virtual_grid off": _with({"virtual_grid": False}, mate),
             "tma alone": _with({"split_short": False}, mate), "packed-heads alone": _with({"enabled": False}, mate),
             "two calls": two_calls}
    with torch.no_grad():
        _with({"enabled": False}, mate)()
        ref = out.clone()
        out.fill_(float("nan"))
        mate()
        diff = (out.float() - ref.float()).abs().max().item()
        times = time_interleaved(cases, rounds=4, iters=16)
    line = "  ".join(f"{n} {t:7.1f} us" for n, t in times.items())
    print(f"--- mixed {n_dec} decodes + chunks {chunks} ctx={ctx} {hq}/{hkv} heads page {page}: {line}  "
          f"max|diff| split vs packed {diff:.3g}", flush=True)


def mixed_parts(n_dec: int, chunk: int, ctx: int, hq: int, hkv: int, page: int = 128) -> None:
    """The mixed batch's launches timed one by one (the others patched out) beside the caller's
    two calls, to place the one call's extra time."""
    from unittest import mock

    from mate.ops.mha import attention

    q, kc, vc, table, cu, used = _chunk_inputs([1] * n_dec + [chunk], ctx, hq, hkv, page)
    out = torch.empty_like(q)
    real_packed = attention._launch_packed

    def one(tma=True, classes=(0, 1, 2)):
        def packed(*a, **kw):
            cls = 0 if kw["q_len_min"] == 0 else 1
            if cls in classes:
                real_packed(*a, **kw)

        def run():
            with mock.patch.object(attention, "_launch_packed", packed):
                if tma:
                    return flash_attn_varlen_func(q, kc, vc, cu, None, chunk, None, seqused_k=used, page_table=table,
                                                  causal=True, out=out)
                with mock.patch.object(attention, "attention_prefill_tma", lambda *a, **kw: None):
                    return flash_attn_varlen_func(q, kc, vc, cu, None, chunk, None, seqused_k=used,
                                                  page_table=table, causal=True, out=out)
        return run

    nd = n_dec
    cu_chunk = cu[nd:] - cu[nd]
    cases = {
        "one call": one(),
        "its TMA launch": one(classes=()),
        "its packed class A": one(tma=False, classes=(0,)),
        "its packed class B": one(tma=False, classes=(1,)),
        "decode call": lambda: flash_attn_varlen_func(q[:nd], kc, vc, cu[:nd + 1], None, 1, None, seqused_k=used[:nd],
                                                      page_table=table[:nd], causal=True, out=out[:nd]),
        "chunk call": lambda: flash_attn_varlen_func(q[nd:], kc, vc, cu_chunk, None, chunk, None,
                                                     seqused_k=used[nd:], page_table=table[nd:], causal=True,
                                                     out=out[nd:]),
    }
    with torch.no_grad():
        times = time_interleaved(cases, rounds=4, iters=16)
    line = "  ".join(f"{n} {t:7.1f}" for n, t in times.items())
    print(f"--- parts {n_dec} decodes + {chunk} ctx={ctx} {hq}/{hkv}: {line} us", flush=True)


def split_overhead(lens: list[int], hq: int, hkv: int) -> None:
    """The split launch's cost on a ragged prefill with no short request (the second kernel's
    programs all return at once)."""
    D = 128
    T = sum(lens)
    q, k, v = (torch.randn(T, h, D, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def mate():
        return flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, out=out)

    with torch.no_grad():
        times = time_interleaved({"split (default)": mate, "no split": _with({"split_short": False}, mate)},
                                 rounds=4, iters=16)
    line = "  ".join(f"{n} {t:7.1f} us" for n, t in times.items())
    print(f"--- split overhead {len(lens)} x {lens[0]} {hq}/{hkv} heads: {line}", flush=True)


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    if os.environ.get("PROBE_PARTS"):  # the mixed batch's launches one by one (session 27)
        mixed_parts(127, 2048, 8192, 32, 8)
        mixed_parts(64, 2048, 8192, 64, 4)
        return
    if os.environ.get("PROBE_MIXED"):  # decode rows inside a prefill batch (session 27)
        mixed_case(64, [2048], 8192, 64, 4)
        mixed_case(128, [512, 512], 8192, 64, 4)
        mixed_case(127, [2048], 8192, 32, 8)
        mixed_case(16, [4096], 8192, 32, 8)
        split_overhead([2048] * 8, 32, 32)
        split_overhead([128] * 4, 32, 8)
        if os.environ.get("PROBE_MIXED") == "only":  # and the ragged batches (the virtual grid's other cases)
            case("ragged", [3000, 500, 1200, 7000, 100, 2000, 900, 1500], 32, 8, True, False)
            case("ragged paged 64", [3000, 500, 1200, 7000, 100, 2000, 900, 1500], 32, 8, True, False, page=64)
            return
    if os.environ.get("PROBE_CHUNKS"):  # the min_seqlen_q crossover (M3 heads, 8K context in 128-key pages)
        for q_len in (16, 64, 128, 256, 1024):
            chunk_case(max(1, 4096 // q_len), q_len, 8192, 64, 4, 128)
    ragged = [3000, 500, 1200, 7000, 100, 2000, 900, 1500]
    cases = {"8 x 2048": ([2048] * 8, 32, 32, True, False, {}),
             "8 x 2048 GQA": ([2048] * 8, 32, 8, True, False, {}),
             "8 x 2048 full": ([2048] * 8, 32, 32, False, False, {}),
             "ragged": (ragged, 32, 8, True, False, {}),
             "16K with LSE": ([16384], 32, 32, True, True, {}),
             "8 x 2048 d64": ([2048] * 8, 32, 8, True, False, {"D": 64}),
             "8 x 2048 paged 128": ([2048] * 8, 32, 8, True, False, {"page": 128}),
             "ragged paged 64": (ragged, 32, 8, True, False, {"page": 64})}
    wanted = os.environ.get("PROBE_CASES")  # a comma list of the names above (all by default)
    for name, (lens, hq, hkv, causal, lse, kw) in cases.items():
        if not wanted or name in wanted.split(","):
            case(name, lens, hq, hkv, causal, lse, **kw)


if __name__ == "__main__":
    main()
