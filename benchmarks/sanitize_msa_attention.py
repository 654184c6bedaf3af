"""Adversarial-id run of MSA sparse attention and paged MHA for compute-sanitizer (GPU).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_msa_attention.py

Caches sized exactly, block ids at every boundary (-1, INT32_MIN, INT32_MAX, ceil(kv_len /
128), 2**30, duplicates), kv_len 0 / 1 / 129, page tables narrower than the context and
holding pages outside the cache, prefill and split decode, both page layouts, flat page
indices. Every result is compared with the reference on the sanitized inputs (bad pages
and ids removed); the script exits non-zero on a mismatch. Checked under Triton's interpreter on the CPU;
not yet run under compute-sanitizer on the GPU.
"""

from __future__ import annotations

import sys

import torch

from mate.mha_interface import flash_attn_with_kvcache
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
    cases = [  # q_lens, kv_lens, hq, hkv, width, layout, decode, flat
        ([5, 0, 9], [300, 0, 129], 64, 4, 16, "NHD", False, False),
        ([1, 1, 1], [1, 700, 256], 64, 4, 16, "HND", True, True),
        ([2, 3], [129, 1000], 16, 1, 64, "NHD", True, False),
        ([70], [4000], 8, 8, 4, "HND", False, True),
    ]
    for q_lens, kv_lens, hq, hkv, width, layout, decode, flat in cases:
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
        k = torch.randn(shape, generator=gen).to(torch.bfloat16)
        v = torch.randn(shape, generator=gen).to(torch.bfloat16)
        total_q = sum(q_lens)
        q = torch.randn(total_q, hq, 128, generator=gen).to(torch.bfloat16)
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
        try:
            assert_close(out, ref_o, atol=2e-2, rtol=2e-2)
            assert_close(lse, ref_l, atol=1e-4, rtol=1e-4, name="lse")
            print(f"ok   sparse q_lens={q_lens} kv_lens={kv_lens} {layout} decode={decode} flat={flat}")
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
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
