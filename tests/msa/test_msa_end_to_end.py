"""MSA end to end: max-score -> top-k -> sparse attention through msa(), mixed decode +
prefill plans, the dense/paged modes through mha_interface, and (GPU) M3 geometry at
4K-64K, shuffled page tables and CUDA-graph capture of a static plan."""

from __future__ import annotations

import pytest
import torch

from mate.msa_interface import _msa_plan_from_lengths, msa, msa_plan, sparse_topk_select
from mate.ops.mha.reference import attention_varlen_reference
from mate.ops.msa.plan import MsaRuntimeMetadata
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.testing import assert_close, poisoned
from mate.testing.graphs import capture_graph

BLK = 128


def layer_inputs(q_lens, kv_lens, hq, hkv, *, dtype=torch.bfloat16, device="cpu", head_major=False, sigma=0.5,
                 rank=8, seed=None):
    """Structured q/k (slowly varying rank-`rank` component + noise sigma), as the benchmark
    note describes, in a shuffled paged cache; returns tensors and the CPU page table."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    d = 128
    nblk = [-(-n // BLK) for n in kv_lens]
    pages = sum(nblk) + 1
    perm = torch.randperm(pages, generator=g).to(torch.int32)
    table = torch.zeros(len(kv_lens), max(nblk) + 1, dtype=torch.int32)
    p = 0
    for i, n in enumerate(nblk):
        table[i, :n] = perm[p:p + n]
        p += n
    basis = torch.randn(rank, d, generator=g)

    def base(n):
        t = torch.linspace(0, 6.28, max(n, 1))[:n]
        coef = torch.stack([torch.sin(t * (j + 1) / rank + j) for j in range(rank)], -1)  # [n, rank]
        return coef @ basis  # [n, d]

    kcache = torch.randn(pages, BLK, hkv, d, generator=g)
    vcache = torch.randn(pages, BLK, hkv, d, generator=g)
    qs = []
    for i, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        b = base(kl)
        full = torch.zeros(nblk[i] * BLK, hkv, d)
        full[:kl] = b[:, None, :] + sigma * torch.randn(kl, hkv, d, generator=g)
        kcache[table[i, :nblk[i]].long()] = full.view(nblk[i], BLK, hkv, d)
        qs.append(b[kl - ql:, None, :] + sigma * torch.randn(ql, hq, d, generator=g))
    q = torch.cat(qs).to(dtype)
    k, v = kcache.to(dtype), vcache.to(dtype)
    if head_major:
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    return q.to(device), k.to(device), v.to(device), table


def select_blocks(q, k, plan_kw, q_lens, kv_lens, table, topk, device):
    """max-score over the paged cache (dense paged plan), then top-k with the own block forced."""
    hq = q.shape[1]
    ms_plan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), hq, page_size=BLK,
                                     output_maxscore=True, split_prefill_decode=False, device=device, **plan_kw)
    tiles = max(-(-n // BLK) for n in kv_lens)
    max_score = torch.empty(q.shape[0], hq, tiles, dtype=torch.float32, device=device)
    msa(q, k, None, ms_plan, max_score=max_score, output_o=False, page_table=table.to(device))
    pos = torch.cat([torch.arange(kl - ql, kl) for ql, kl in zip(q_lens, kv_lens)]).to(device)
    return sparse_topk_select(max_score, topk, force_end_blocks=1, query_positions=pos)


def run_sparse(q, k, v, idx, q_lens, kv_lens, table, topk, device, hkv, transposed_lse=False):
    hq = q.shape[1]
    plan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), hq, num_kv_heads=hkv, page_size=BLK,
                                  kv_block_num=topk, force_end_blocks=1, device=device)
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    out = poisoned(q.shape, out_dtype, device)
    lse = poisoned(q.shape[:2], torch.float32, device)
    if transposed_lse:  # FlashAttention's [Hq, total_q] LSE, seen as [total_q, Hq]
        lse = poisoned(q.shape[:2][::-1], torch.float32, device).t()
    o, _ = msa(q, k, v, plan, kv_block_indexes=idx, page_table=table.to(device), out=out, lse=lse)
    assert o is out
    return plan, out, lse


def check_against_reference(q, k, v, idx, q_lens, kv_lens, table, out, lse, hkv):
    qi = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    ro, rl = sparse_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), qi, torch.tensor(kv_lens,
                                        dtype=torch.int32), page_table=table, num_kv_heads=hkv)
    # bf16 output and P rounded to bf16 before PV: a few bf16 ulps (2^-8)
    assert_close(out, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl, atol=1e-4, rtol=1e-4, name="lse")  # fp32 math on identical logits


@pytest.mark.parametrize("head_major", [False, True])
def test_pipeline_mixed_decode_prefill(device, triton_backend, head_major):
    q_lens, kv_lens = [1, 2, 40], [300, 129, 420]  # two decode requests, then a prefill one: a mixed plan
    hq, hkv, topk = 16, 1, 4
    q, k, v, table = layer_inputs(q_lens, kv_lens, hq, hkv, device=device, head_major=head_major)
    idx = select_blocks(q, k, {"num_kv_heads": hkv}, q_lens, kv_lens, table, topk, device)
    plan, out, lse = run_sparse(q, k, v, idx, q_lens, kv_lens, table, topk, device, hkv, transposed_lse=head_major)
    assert plan.has_mixed_prefill
    check_against_reference(q, k, v, idx, q_lens, kv_lens, table, out, lse, hkv)


def test_paged_and_dense_modes(device, triton_backend):
    q_lens, kv_lens = [3, 2], [200, 130]
    hq, hkv = 4, 2
    q, k, v, table = layer_inputs(q_lens, kv_lens, hq, hkv, device=device)
    plan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), hq, num_kv_heads=hkv, page_size=BLK,
                                  device=device)
    lse = poisoned((5, hq), torch.float32, device)
    o, _ = msa(q, k, v, plan, page_table=table.to(device), lse=lse)
    cq = torch.tensor([0, 3, 5], dtype=torch.int32)
    ro, rl = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), cq, kv_lens, page_table=table, causal=True)
    assert_close(o, ro, atol=2e-2, rtol=2e-2)
    assert_close(lse, rl.t(), atol=1e-4, rtol=1e-4, name="lse")
    # dense ragged K/V: the same keys gathered per request
    kd = torch.cat([k.cpu()[table[i, :-(-n // BLK)].long()].reshape(-1, hkv, 128)[:n] for i, n in enumerate(kv_lens)])
    vd = torch.cat([v.cpu()[table[i, :-(-n // BLK)].long()].reshape(-1, hkv, 128)[:n] for i, n in enumerate(kv_lens)])
    dplan = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), hq, num_kv_heads=hkv, device=device)
    o2, _ = msa(q, kd.to(device), vd.to(device), dplan)
    assert_close(o2, ro, atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [4096, 65536])
@pytest.mark.parametrize("shuffled", [False, True])
def test_m3_geometry_prefill_and_decode(ctx, shuffled):
    device = "cuda"
    hq, hkv, topk = 64, 4, 16
    n_pre = 1024 if ctx > 4096 else ctx
    q_lens, kv_lens = [1, 1, 1, 1, n_pre], [ctx, ctx - 77, 5000, 129, ctx]
    seed = torch.seed() % 2**31
    q, k, v, table = layer_inputs(q_lens, kv_lens, hq, hkv, device=device, seed=seed)
    if not shuffled:  # identity page table: pages in request order
        nblk = [-(-n // BLK) for n in kv_lens]
        ident = torch.zeros_like(table)
        start = 0
        for i, n in enumerate(nblk):
            order = table[i, :n].long()
            k[start:start + n], v[start:start + n] = k[order].clone(), v[order].clone()
            ident[i, :n] = torch.arange(start, start + n, dtype=torch.int32)
            start += n
        table = ident
    idx = select_blocks(q, k, {"num_kv_heads": hkv}, q_lens, kv_lens, table, topk, device)
    plan, out, lse = run_sparse(q, k, v, idx, q_lens, kv_lens, table, topk, device, hkv)
    # reference (on the GPU, fp32) for every row: the decode rows, then the prefill request in
    # chunks of 256 tokens (each a request of its own at its absolute positions)
    kvl = torch.tensor(kv_lens, dtype=torch.int32, device=device)
    table = table.to(device)
    chunks = [(0, 4, torch.arange(5, dtype=torch.int32), kvl[:4], None, table[:4])]
    for c0 in range(0, n_pre, 256):
        c1 = min(n_pre, c0 + 256)
        chunks.append((4 + c0, 4 + c1, torch.tensor([0, c1 - c0], dtype=torch.int32), kvl[4:],
                       torch.tensor([ctx - n_pre + c0], dtype=torch.int32, device=device), table[4:]))
    for r0, r1, qi, lens, offset, pt in chunks:
        ro, rl = sparse_attention_reference(q[r0:r1], k, v, idx[r0:r1], qi.to(device), lens, offset, page_table=pt,
                                            num_kv_heads=hkv)
        # bf16 output, P rounded to bf16 before PV: a few bf16 ulps; LSE fp32 on the same logits
        assert_close(out[r0:r1], ro, atol=2e-2, rtol=2e-2, name=f"out rows {r0}:{r1} (seed {seed})")
        assert_close(lse[r0:r1], rl, atol=1e-3, rtol=1e-4, name=f"lse rows {r0}:{r1} (seed {seed})")


@pytest.mark.gpu
def test_static_plan_cuda_graph_replay_equals_eager():
    device = "cuda"
    hq, hkv, topk, bmax, max_q, max_k = 64, 4, 16, 4, 256, 4096
    info = msa_plan(bmax, max_q, max_k, hq, total_seqlen_k=bmax * max_k, num_kv_heads=hkv, page_size=BLK,
                    kv_block_num=topk, force_end_blocks=1, sparse_kernel_mode="prefill")
    n_pages = bmax * (max_k // BLK)
    k = torch.randn(n_pages, BLK, hkv, 128, device=device).to(torch.bfloat16)
    v = torch.randn_like(k)
    total_q = bmax * max_q
    q = torch.randn(total_q, hq, 128, device=device).to(torch.bfloat16)
    idx = torch.randint(-1, max_k // BLK, (total_q, hkv, topk), device=device, dtype=torch.int32)
    cu_q = torch.zeros(bmax + 1, dtype=torch.int32, device=device)
    cu_k = torch.zeros(bmax + 1, dtype=torch.int32, device=device)
    used = torch.zeros(bmax, dtype=torch.int32, device=device)
    table = torch.randperm(n_pages, device=device).to(torch.int32).view(bmax, -1).contiguous()
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used, page_table=table)
    out = torch.zeros(total_q, hq, 128, device=device, dtype=torch.bfloat16)
    lse = torch.zeros(total_q, hq, device=device)

    def set_lengths(q_lens, kv_lens):
        cu_q.copy_(torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32))
        cu_k.copy_(torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0).tolist()), dtype=torch.int32))
        used.copy_(torch.tensor(kv_lens, dtype=torch.int32))

    def step():
        msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=out, lse=lse)

    set_lengths([max_q] * bmax, [max_k] * bmax)
    graph = capture_graph(step)
    for q_lens, kv_lens in (([256, 100, 0, 256], [4096, 1000, 7, 300]), ([10, 256, 256, 256], [129, 4096, 2048, 256])):
        set_lengths(q_lens, kv_lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        got_o, got_l = out.clone(), lse.clone()
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        step()
        n = sum(q_lens)
        assert torch.equal(got_o[:n], out[:n]) and torch.equal(got_l[:n], lse[:n])
        assert (got_o[n:].float() == 0).all() and torch.isinf(got_l[n:]).all()  # padding rows: no key
        # and both equal the reference
        qi = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
        ro, rl = sparse_attention_reference(q[:n], k, v, idx[:n], qi, torch.tensor(kv_lens, dtype=torch.int32,
                                            device=device), page_table=table, num_kv_heads=hkv)
        assert_close(got_o[:n], ro, atol=2e-2, rtol=2e-2)
        assert_close(got_l[:n], rl, atol=1e-3, rtol=1e-4, name="lse")
