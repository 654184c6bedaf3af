"""Probe: host microseconds per eager MHA and MSA call, for A/B runs of two versions of mate.

The host's speed varies between processes on the device machine (session 28: the same
no-op measurement differed 2x between two processes), so compare versions by alternating
processes, each importing ``mate`` from its ``PYTHONPATH``::

    for i in 1 2 3; do
        PYTHONPATH=$PWD python benchmarks/probe_host_ab.py new
        PYTHONPATH=/path/to/old/checkout python benchmarks/probe_host_ab.py old
    done

A second argument times only the calls whose name contains it (``... new gemm``).

Each figure is the minimum over five rounds of the median host time of 300 back-to-back
calls issued behind a GPU spin (nothing waits on the GPU); aten's FA2 varlen op is the peer.
Where mate has launch recipes (``mate._core.recipe``) each call is also timed with them off.
Calls: MHA varlen and paged decode, msa() sparse decode / prefill / max-score, and (session 33)
sparse_topk_select and the sparse MLA decode with metadata; (session 34) the sparse MLA decode
without metadata, mla_rope_quantize_fp8 into merged rows and gemm_fp8_nt_groupwise.
"""

from __future__ import annotations

import functools
import sys

import torch

from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from mate.msa_interface import _msa_plan_from_lengths, msa
from mate.testing.bench import host_us


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else ""
    only = sys.argv[2] if len(sys.argv) > 2 else ""  # a substring of the call names to time
    lens = [128] * 64
    total = sum(lens)
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(total, 32, 128, device=dev, dtype=bf16)
    k = torch.randn(total, 8, 128, device=dev, dtype=bf16)
    v = torch.randn_like(k)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    k_cache = torch.randn(512, 128, 8, 128, device=dev, dtype=bf16)
    v_cache = torch.randn_like(k_cache)
    table = torch.arange(512, dtype=torch.int32, device=dev).view(64, 8)
    seqlens = torch.full((64,), 1000, dtype=torch.int32, device=dev)
    q_decode = torch.randn(64, 1, 32, 128, device=dev, dtype=bf16)
    def host(fn):
        return host_us(fn, calls=300, rounds=5, spin_cycles=1_500_000_000)

    calls = {
        "varlen 64x128 causal (3 launches)": lambda: flash_attn_varlen_func(q, k, v, cu, cu, 128, 128, causal=True,
                                                                            out=out),
        "with_kvcache paged decode B=64": lambda: flash_attn_with_kvcache(
            q_decode, k_cache, v_cache, cache_seqlens=seqlens, page_table=table, causal=True),
    }
    calls.update(msa_calls())
    calls.update(selection_and_mla_calls())
    res = {"aten FA2 varlen (peer)": host(
        lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 128, 128, 0.0, True, False))}
    try:
        from mate._core import recipe
    except ImportError:  # an older checkout: no launch recipes
        recipe = None
    for name, fn in calls.items():
        if only not in name:
            continue
        res[name] = host(fn)
        if recipe is not None:  # the same call the ordinary way (every check, Triton's binder)
            with recipe.disabled():
                res[name + " (no recipes)"] = host(fn)
    print(tag, "  ".join(f"{n}: {t:.1f}" for n, t in res.items()), flush=True)


def msa_calls() -> dict:
    """Eager msa() calls of MiniMax-M3 geometry (64 / 4 heads, d 128, top-16 + 1 forced block):
    64 decode tokens at 8K and one 512-token prefill chunk at the end of 4K, token-major cache;
    and the max-score pass of that chunk (4 indexer heads) into a given buffer."""
    dev, bf16 = "cuda", torch.bfloat16
    calls = {}
    for name, q_lens, kv_lens in (("msa sparse decode B=64 8K", [1] * 64, [8192] * 64),
                                  ("msa sparse prefill 512 at 4K", [512], [4096])):
        b, pages = len(q_lens), -(-max(kv_lens) // 128)
        info = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), 64, num_kv_heads=4,
                                      page_size=128, kv_block_num=16, force_end_blocks=1, device=dev)
        cache = torch.randn(b * pages, 128, 4, 128, device=dev, dtype=bf16)
        table = torch.arange(b * pages, dtype=torch.int32, device=dev).view(b, pages)
        total = sum(q_lens)
        q = torch.randn(total, 64, 128, device=dev, dtype=bf16)
        idx = torch.randint(0, 32, (total, 4, info.plan.selected_block_count), dtype=torch.int32, device=dev)
        out = torch.empty_like(q)
        calls[name] = functools.partial(msa, q, cache, cache, info, kv_block_indexes=idx, page_table=table, out=out)
    ms_info = _msa_plan_from_lengths(torch.tensor([512]), torch.tensor([4096]), 4, num_kv_heads=4, page_size=128,
                                     output_maxscore=True, split_prefill_decode=False, device=dev)
    qi = torch.randn(512, 4, 128, device=dev, dtype=bf16)
    ms = torch.empty(512, 4, ms_info.plan.max_k_tiles, device=dev)
    calls["msa max-score 512 at 4K"] = functools.partial(msa, qi, cache, None, ms_info, max_score=ms, output_o=False,
                                                         page_table=table)
    return calls


def selection_and_mla_calls() -> dict:
    """Eager sparse_topk_select (4096 tokens x 4 heads x 64 tiles, top 16 + the own block,
    output and positions given) and sparse_mla_fp8_decode with metadata (B=64 H=128 unsplit;
    B=8 H=16 split, so decode and combine), top-k 2048, out given (session 33 and later)."""
    try:
        from mate.msa_interface import sparse_topk_select
    except ImportError:  # an older checkout
        return {}
    from probe_host_overhead import sparse_mla_decode_call
    dev = "cuda"
    scores = torch.randn(4096, 4, 64, device=dev)
    pos = torch.arange(4096, device=dev, dtype=torch.int64) + 4096
    sel = torch.empty(4096, 4, 16, dtype=torch.int32, device=dev)
    calls = {"topk select 4096x4x64": functools.partial(sparse_topk_select, scores, 16, output=sel,
                                                         force_end_blocks=1, query_positions=pos)}
    for b, h in ((64, 128), (8, 16)):
        calls[f"sparse MLA decode B={b} H={h}"] = sparse_mla_decode_call(b, h, with_out=True)
    calls["sparse MLA decode B=64 H=128, no metadata"] = sparse_mla_decode_call(64, 128, with_out=True,
                                                                                with_metadata=False)
    calls["rope quantize nnz=64 H=128, merged out"] = rope_quantize_call(64, 128)
    calls.update(gemm_calls())
    return calls


def gemm_calls() -> dict:
    """Eager GEMM calls, ``out`` given (session 34): gemm_fp8_nt_groupwise at (64, 4096, 7168) on
    the K-interleaved Gluon kernel and at (1, 2112, 7168) on it with split-K; the MoE layouts with
    8 experts of 128 rows, N=4096, K=7168 (contiguous, masked with expected_m 64)."""
    from mate.gemm import batch_deepgemm_fp8_nt_groupwise, gemm_fp8_nt_groupwise, group_deepgemm_fp8_nt_groupwise

    fp8 = torch.float8_e4m3fn
    calls = {}
    for m, n, k in ((64, 4096, 7168), (1, 2112, 7168)):
        a = torch.randn(m, k, device="cuda").to(fp8)
        b = torch.randn(n, k, device="cuda").to(fp8)
        sa, sb = torch.rand(m, k // 128, device="cuda"), torch.rand(-(-n // 128), k // 128, device="cuda")
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls[f"gemm_fp8_nt_groupwise ({m}, {n}, {k})"] = functools.partial(
            gemm_fp8_nt_groupwise, a, b, sa, sb, scale_major_mode="K", out=out)
    groups, n, k = 8, 4096, 7168
    b = torch.randn(groups, n, k, device="cuda").to(fp8)
    sb = torch.rand(groups, n // 128, k // 128, device="cuda")
    a = torch.randn(groups * 128, k, device="cuda").to(fp8)
    idx = torch.arange(groups, device="cuda", dtype=torch.int32).repeat_interleave(128)
    calls["group_deepgemm 8 x 128 rows"] = functools.partial(
        group_deepgemm_fp8_nt_groupwise, a, b, torch.rand(groups * 128, k // 128, device="cuda"), sb, idx,
        out=torch.empty(groups * 128, n, device="cuda", dtype=torch.bfloat16))
    calls["batch_deepgemm 8 x 128, expected 64"] = functools.partial(
        batch_deepgemm_fp8_nt_groupwise, a.view(groups, 128, k), b,
        torch.rand(groups, 128, k // 128, device="cuda"), sb, torch.full((groups,), 64, device="cuda",
                                                                         dtype=torch.int32), 64,
        out=torch.empty(groups, 128, n, device="cuda", dtype=torch.bfloat16))
    return calls


def rope_quantize_call(nnz: int, heads: int):
    """An eager mla_rope_quantize_fp8 call writing views of merged [nnz, H, 576] / [nnz, 576]
    FP8 rows (session 34)."""
    from mate.sparse_mla_interface import mla_rope_quantize_fp8

    dev, bf16, fp8 = "cuda", torch.bfloat16, torch.float8_e4m3fn
    q = torch.randn(nnz, heads, 576, device=dev, dtype=bf16)
    k = torch.randn(nnz, 576, device=dev, dtype=bf16)
    cos_sin = torch.randn(4096, 64, device=dev)
    pos = torch.randint(0, 4096, (nnz,), device=dev)
    q_out = torch.empty(nnz, heads, 576, device=dev, dtype=fp8)
    k_out = torch.empty(nnz, 576, device=dev, dtype=fp8)
    return functools.partial(mla_rope_quantize_fp8, q[..., 512:], k[:, 512:], q[..., :512], k[:, :512], cos_sin, pos,
                             q_rope_out=q_out[..., 512:], k_rope_out=k_out[:, 512:], q_nope_out=q_out[..., :512],
                             k_nope_out=k_out[:, :512])


if __name__ == "__main__":
    main()
