"""Adversarial-id run of MSA sparse attention and paged MHA for compute-sanitizer (GPU).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_msa_attention.py

Caches sized exactly, block ids at every boundary (-1, INT32_MIN, INT32_MAX, ceil(kv_len /
128), 2**30, duplicates), kv_len 0 / 1 / 129, page tables narrower than the context and
holding pages outside the cache, prefill and split decode, both page layouts, flat page
indices, bf16 and e4m3 caches (the fp8 decode's in-kernel block list and TMA loads). Then
``mate.mha_interface`` with lengths outside the tensors: a paged table narrower than the
context, batched ``cache_seqlens`` past ``S_cache`` (tensor and int), ragged key ranges
starting before row 0 or ending past ``total_k``, a request running past ``total_q``, lengths
near INT32_MAX; and the max-score pass with device lengths outside q / k.
Every result is compared with the reference on the sanitized inputs (bad pages and ids
removed); the script exits non-zero on a mismatch. H200 runs: sessions 8 and 20, and 30
(the fp8 decode's Vᵀ by identity wgmma, V read as two 64-column boxes; 0 errors), in the
results files of those sessions.
"""

from __future__ import annotations

import sys

import torch

from mate.mha_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from mate.ops.mha.reference import attention_varlen_reference
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.ops.msa.sparse_attention import sparse_attention
from mate.testing import assert_close

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
# the GPU under compute-sanitizer; on a CPU (TRITON_INTERPRET=1 MATE_BACKEND=triton) a dry run
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def _ids(total_q: int, heads: int, width: int, nblk: int, gen: torch.Generator) -> torch.Tensor:
    edge = torch.tensor([-1, INT_MIN, INT_MAX, nblk, nblk + 1, max(nblk - 1, 0), 0, -2, 2**30], dtype=torch.int64)
    idx = torch.randint(0, max(nblk, 1), (total_q, heads, width), generator=gen)
    pick = torch.randint(0, len(edge), idx.shape, generator=gen)
    idx = torch.where(torch.rand(idx.shape, generator=gen) < 0.4, edge[pick], idx)
    idx[..., 1] = idx[..., 0]  # duplicates
    return idx.to(torch.int32)


def main() -> int:
    gen = torch.Generator().manual_seed(7)
    failures = 0
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    cases = [  # q_lens, kv_lens, hq, hkv, width, layout, decode, flat, dtype
        ([5, 0, 9], [300, 0, 129], 64, 4, 16, "NHD", False, False, bf16),
        ([1, 1, 1], [1, 700, 256], 64, 4, 16, "HND", True, True, bf16),
        ([2, 3], [129, 1000], 16, 1, 64, "NHD", True, False, bf16),
        ([70], [4000], 8, 8, 4, "HND", False, True, bf16),
        ([1, 1, 1, 1], [1, 700, 256, 0], 64, 4, 16, "HND", True, False, fp8),
        ([1, 1, 1], [2000, 129, 5], 64, 4, 17, "NHD", True, True, fp8),
        ([3, 4], [300, 129], 16, 2, 8, "NHD", False, False, fp8),
    ]
    for q_lens, kv_lens, hq, hkv, width, layout, decode, flat, dtype in cases:
        nblk = [-(-n // 128) for n in kv_lens]
        pages = max(sum(nblk), 1)
        perm = torch.randperm(pages, generator=gen).to(torch.int32)
        table = torch.full((len(kv_lens), max(max(nblk), 1)), 0, dtype=torch.int32)
        p = 0
        for i, n in enumerate(nblk):
            table[i, :n] = perm[p:p + n]
            p += n
        bad_table = table.clone()
        if table.shape[1] > 1:
            bad_table[-1, 1] = 10**6  # a page outside the cache
        shape = (pages, 128, hkv, 128) if layout == "NHD" else (pages, hkv, 128, 128)
        k = torch.randn(shape, generator=gen).to(dtype)
        v = torch.randn(shape, generator=gen).to(dtype)
        total_q = sum(q_lens)
        q = torch.randn(total_q, hq, 128, generator=gen).to(dtype)
        idx = _ids(total_q, hkv, width, max(nblk), gen)
        qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
        kvl = torch.tensor(kv_lens, dtype=torch.int32)
        # what the kernel must compute: the bad page's block dropped from the last request
        ref_idx = idx.clone()
        if table.shape[1] > 1:
            ref_idx[qo[-2]:qo[-1]][ref_idx[qo[-2]:qo[-1]] == 1] = -1
        ref_o, ref_l = sparse_attention_reference(q, k, v, ref_idx, qo, kvl, page_table=table, num_kv_heads=hkv)
        kw = {}
        if flat:
            kw["kv_indices"] = torch.cat([bad_table[i, :n] for i, n in enumerate(nblk)]).to(DEV)
            kw["kv_page_indptr"] = torch.tensor([0] + torch.tensor(nblk).cumsum(0).tolist(), dtype=torch.int32).to(DEV)
        else:
            kw["page_table"] = bad_table.to(DEV)
        out, lse = sparse_attention(q.to(DEV), k.to(DEV), v.to(DEV), kv_block_indexes=idx.to(DEV), qo_indptr=qo.to(DEV),
                                    kv_lens=kvl.to(DEV), decode=decode, num_kv_heads=hkv, **kw)
        _sync()
        tol = 3e-2 if dtype == fp8 else 2e-2  # fp8: P·V in fp16 against the reference's fp32
        try:
            assert_close(out, ref_o, atol=tol, rtol=tol)
            assert_close(lse, ref_l, atol=1e-4 if dtype == bf16 else 2e-3, rtol=1e-4 if dtype == bf16 else 2e-3,
                         name="lse")
            print(f"ok   sparse q_lens={q_lens} kv_lens={kv_lens} {layout} decode={decode} flat={flat} {dtype}")
        except AssertionError as exc:
            failures += 1
            print(f"FAIL sparse q_lens={q_lens} kv_lens={kv_lens}: {exc}")
    # paged MHA decode with a narrow table and an out-of-cache page
    lens = [100, 33]
    kc = torch.randn(12, 16, 2, 64, generator=gen).to(torch.float16)
    table = torch.randperm(12, generator=gen)[:10].view(2, 5).to(torch.int32)
    q = torch.randn(2, 1, 4, 64, generator=gen).to(torch.float16)
    out = flash_attn_with_kvcache(q.to(DEV), kc.to(DEV), kc.to(DEV), cache_seqlens=torch.tensor(lens).int().to(DEV),
                                  page_table=table.to(DEV))
    ref, _ = attention_varlen_reference(q.view(2, 4, 64), kc, kc, torch.tensor([0, 1, 2], dtype=torch.int32),
                                        [80, 33], page_table=table)
    _sync()
    try:
        assert_close(out.view(2, 4, 64), ref, atol=3e-3, rtol=3e-3)
        print("ok   paged mha, table narrower than the context")
    except AssertionError as exc:
        failures += 1
        print(f"FAIL paged mha: {exc}")
    failures += _mha_lengths_outside(gen)
    failures += _max_score_outside(gen)
    return 1 if failures else 0


def _max_score_outside(gen: torch.Generator) -> int:
    """The max-score pass of a static dense plan with device lengths outside q / k (keys past
    k, a range before its first row, seqused_k 2**30 and INT32_MAX, requests past or before q),
    and a paged plan with an offset and a length near INT32_MAX."""
    from mate.msa_interface import MsaRuntimeMetadata, msa, msa_plan
    from mate.ops.msa.reference_select import max_score_reference

    failures = 0
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32).to(DEV)  # noqa: E731
    k = torch.randn(128, 1, 32, generator=gen).to(torch.bfloat16).to(DEV)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16).to(DEV)
    cases = [(i32(0, 2), i32(0, 128), i32(256)), (i32(0, 2), i32(-64, 0), i32(200)),
             (i32(0, 2), i32(0, 128), i32(2**31 - 1)), (i32(0, 4), i32(0, 128), i32(128)),
             (i32(2**28, 2**28 + 1), i32(0, 128), i32(128)), (i32(-1, 2), i32(0, 128), i32(128))]
    for cu_q, cu_k, used in cases:
        info = msa_plan(1, 4, 256, 2, num_kv_heads=1, output_maxscore=True, causal=True)
        buf = torch.full((2, 2, 2), float("nan"), device=DEV)
        rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used)
        msa(q, k, None, info, output_o=False, runtime_metadata=rt, max_score=buf)
        ref = max_score_reference(q.cpu(), k.cpu(), cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu(),
                                  kv_lens=used.cpu().clamp(max=2**30), qo_offset=None, page_table=None,
                                  kv_indices=None, kv_page_indptr=None, qo_offset_value=None, causal=True, layout=0,
                                  batch_size=1, max_seqlen_q=4, num_k_tiles=2)
        covered = ref.isfinite().any(-1).any(-1)
        failures += _check(f"max-score dense cu_q={cu_q.tolist()} cu_k={cu_k.tolist()} used={used.tolist()}",
                           buf.cpu()[covered], ref[covered], 1e-4)
    kp = torch.randn(2, 128, 1, 32, generator=gen).to(torch.bfloat16).to(DEV)
    for used, off in ((2**31 - 1, None), (256, 2**31 - 2)):
        info = msa_plan(1, 2, 256, 2, num_kv_heads=1, page_size=128, output_maxscore=True, causal=True)
        rt = MsaRuntimeMetadata(None, None, None if off is None else i32(off), cu_seqlens_q=i32(0, 2),
                                cu_seqlens_k=i32(0, 256), seqused_k=i32(used), page_table=i32(0, 1).view(1, 2))
        _, ms = msa(q, kp, None, info, output_o=False, runtime_metadata=rt)
        rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=i32(0, 2), cu_seqlens_k=i32(0, 256),
                                seqused_k=i32(256), page_table=i32(0, 1).view(1, 2))
        info = msa_plan(1, 2, 256, 2, num_kv_heads=1, page_size=128, output_maxscore=True, causal=False)
        _, want = msa(q, kp, None, info, output_o=False, runtime_metadata=rt)
        failures += _check(f"max-score paged seqused_k={used} qo_offset={off}", ms, want, 0.0)
    return failures


def _mha_lengths_outside(gen: torch.Generator) -> int:
    """Batched cache lengths past S_cache, ragged ranges outside q / k: the kernel skips what is
    outside (exact-size tensors, so a read past them leaves the allocation)."""
    failures = 0
    b, s_cache = 3, 40
    q = torch.randn(b, 1, 8, 64, generator=gen).to(torch.float16)
    kc, vc = (torch.randn(b, s_cache, 2, 64, generator=gen).to(torch.float16) for _ in range(2))
    cu1 = torch.arange(b + 1, dtype=torch.int32)
    for lens in ([s_cache + 9, -3, 2**31 - 1], 50):
        sl = torch.tensor(lens, dtype=torch.int32).to(DEV) if isinstance(lens, list) else lens
        out = flash_attn_with_kvcache(q.to(DEV), kc.to(DEV), vc.to(DEV), cache_seqlens=sl, causal=True)
        # one causal query at len - 1 >= S_cache sees the whole cache (tests/mha: the same as S_cache)
        ref_lens = [min(max(n, 0), s_cache) for n in (lens if isinstance(lens, list) else [lens] * b)]
        ref, _ = attention_varlen_reference(q.view(b, 8, 64), kc, vc, cu1, ref_lens, batched=True, causal=True)
        failures += _check(f"batched mha, cache_seqlens={lens}", out.view(b, 8, 64), ref, 3e-3)
    q = torch.randn(10, 4, 64, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(12, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    cq = torch.tensor([0, 4, 13], dtype=torch.int32)
    ck = torch.tensor([-3, 5, 90], dtype=torch.int32)
    out = flash_attn_varlen_func(q.to(DEV), k.to(DEV), v.to(DEV), cq.to(DEV), ck.to(DEV), 9, 85, causal=True)
    ref, _ = attention_varlen_reference(q, k, v, cq, [8, 85], k_starts=[-3, 5], causal=True)
    failures += _check("ragged mha, ranges outside q and k", out, ref, 2e-2)
    # lengths near INT32_MAX: the key loops end at the table / at k
    kp = torch.randn(4, 16, 1, 64, generator=gen).to(torch.float16)
    table = torch.tensor([[0, 1], [3, 2]], dtype=torch.int32)
    qp = torch.randn(2, 1, 4, 64, generator=gen).to(torch.float16)
    out = flash_attn_with_kvcache(qp.to(DEV), kp.to(DEV), kp.to(DEV), page_table=table.to(DEV), causal=True,
                                  cache_seqlens=torch.tensor([2**31 - 1, 2**30 + 5], dtype=torch.int32).to(DEV))
    ref, _ = attention_varlen_reference(qp.view(2, 4, 64), kp, kp, torch.tensor([0, 1, 2], dtype=torch.int32),
                                        [32, 32], page_table=table)
    failures += _check("paged mha, cache_seqlens near INT32_MAX", out.view(2, 4, 64), ref, 3e-3)
    out = flash_attn_varlen_func(q[:1].to(DEV), k.to(DEV), k.to(DEV), cq[:2].clamp(max=1).to(DEV),
                                 torch.tensor([-2**31 + 150, 100], dtype=torch.int32).to(DEV), 1, 128)
    return failures + _check("ragged mha, a key range starting 2**31 - 150 rows before k", out.cpu(),
                             torch.zeros_like(out.cpu()), 0.0)


def _check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> int:
    _sync()
    try:
        assert_close(out, ref, atol=tol, rtol=tol)
        print(f"ok   {name}")
        return 0
    except AssertionError as exc:
        print(f"FAIL {name}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
