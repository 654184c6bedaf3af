"""MSA sparse forward scratch: a plan owns its work buffers (sized by its capacities at the
first call) and every later call reuses them, so a static plan executes without
allocating (CPU: same buffers and allocation count; GPU: CUDA allocator counters)."""

from __future__ import annotations

import pytest
import torch

from mate.msa_interface import msa, msa_plan
from mate.ops.mha.reference import attention_varlen_reference
from mate.ops.msa.plan import MsaRuntimeMetadata
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.ops.msa.workspace import MsaWorkspace
from mate.testing import assert_close, poisoned

BLK = 128


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)


def _static_problem(device, *, bmax, max_q, max_k, hq, hkv, topk, decode, dtype=torch.bfloat16):
    mode = "decode" if decode else "prefill"
    info = msa_plan(bmax, max_q, max_k, hq, num_kv_heads=hkv, page_size=BLK, kv_block_num=topk,
                    force_end_blocks=1, sparse_kernel_mode=mode)
    n_pages = bmax * (max_k // BLK) + 1
    k = torch.randn(n_pages, BLK, hkv, 128).to(dtype).to(device)
    v = torch.randn(n_pages, BLK, hkv, 128).to(dtype).to(device)
    total_q = bmax * max_q
    q = torch.randn(total_q, hq, 128).to(dtype).to(device)
    width = info.plan.selected_block_count
    idx = torch.randint(-1, max_k // BLK, (total_q, hkv, width), dtype=torch.int32).to(device)
    table = torch.randperm(n_pages)[:bmax * (max_k // BLK)].to(torch.int32).view(bmax, -1).contiguous().to(device)
    rt = MsaRuntimeMetadata(None, None, None,
                            cu_seqlens_q=torch.zeros(bmax + 1, dtype=torch.int32, device=device),
                            cu_seqlens_k=torch.zeros(bmax + 1, dtype=torch.int32, device=device),
                            seqused_k=torch.zeros(bmax, dtype=torch.int32, device=device), page_table=table)
    return info, q, k, v, idx, table, rt


def _set_lengths(rt, q_lens, kv_lens):
    rt.cu_seqlens_q.copy_(_cu(q_lens))
    rt.cu_seqlens_k.copy_(_cu(kv_lens))
    rt.seqused_k.copy_(torch.tensor(kv_lens, dtype=torch.int32))


def _check(q, k, v, idx, table, q_lens, kv_lens, out, lse, hkv):
    n = sum(q_lens)
    ro, rl = sparse_attention_reference(q[:n].cpu(), k.cpu(), v.cpu(), idx[:n].cpu(), _cu(q_lens),
                                        torch.tensor(kv_lens, dtype=torch.int32), page_table=table.cpu(),
                                        num_kv_heads=hkv)
    # bf16 output, P rounded to bf16 before the PV product: a few bf16 ulps (2^-8)
    assert_close(out[:n], ro, atol=2e-2, rtol=2e-2)
    if lse is not None:
        assert_close(lse[:n], rl, atol=1e-4, rtol=1e-4, name="lse")  # fp32 math on identical logits
        assert torch.isinf(lse[n:]).all()  # padding rows past cu_seqlens_q[B] see no key
    assert (out[n:].float() == 0).all()


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("with_lse", [True, False])
def test_static_plan_reuses_workspace(device, triton_backend, decode, with_lse):
    """Two calls with different live lengths: the scratch is allocated once (at the first
    call, sized by the plan's capacities) and the second call uses the same storage."""
    hq, hkv = 16, 2
    bmax, max_q, max_k = (3, 1, 512) if decode else (2, 8, 512)
    info, q, k, v, idx, table, rt = _static_problem(device, bmax=bmax, max_q=max_q, max_k=max_k, hq=hq, hkv=hkv,
                                                    topk=4, decode=decode)
    ws = info.plan.workspace
    assert isinstance(ws, MsaWorkspace) and ws.allocations == 0
    out = poisoned(q.shape, q.dtype, device)
    lse = poisoned(q.shape[:2], torch.float32, device) if with_lse else None
    cases = ([[1, 1, 0], [400, 130, 0]], [[1, 1, 1], [512, 1, 257]]) if decode else \
        ([[3, 8], [200, 512]], [[8, 0], [512, 7]])
    ptrs = None
    for q_lens, kv_lens in cases:
        _set_lengths(rt, q_lens, kv_lens)
        out.fill_(float("nan"))
        if lse is not None:
            lse.fill_(float("nan"))
        o, _ = msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=out, lse=lse)
        assert o is out
        _check(q, k, v, idx, table, q_lens, kv_lens, out, lse, hkv)
        if ptrs is None:
            ptrs = ws.data_ptrs()
            allocs = ws.allocations
            expected = {"sparse_int", "sparse_float"} | (set() if with_lse else {"lse"})
            assert set(ptrs) == expected, ptrs
        else:
            assert ws.data_ptrs() == ptrs
            assert ws.allocations == allocs


def test_workspace_sized_by_capacity_not_first_call(device, triton_backend):
    """A small first call must not under-size the buffers: a later call at the plan's
    capacity (more tokens, the automatic decode split) reuses them."""
    info, q, k, v, idx, table, rt = _static_problem(device, bmax=4, max_q=1, max_k=256, hq=8, hkv=1, topk=4,
                                                    decode=True)
    ws = info.plan.workspace
    out = poisoned(q.shape, q.dtype, device)
    lse = poisoned(q.shape[:2], torch.float32, device)
    _set_lengths(rt, [1, 0, 0, 0], [100, 0, 0, 0])
    msa(q[:1], k, v, info, kv_block_indexes=idx[:1], runtime_metadata=rt, page_table=table, out=out[:1],
        lse=lse[:1])
    ptrs, allocs = ws.data_ptrs(), ws.allocations
    _set_lengths(rt, [1, 1, 1, 1], [256, 129, 3, 200])
    msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=out, lse=lse)
    assert ws.data_ptrs() == ptrs and ws.allocations == allocs
    _check(q, k, v, idx, table, [1, 1, 1, 1], [256, 129, 3, 200], out, lse, 1)


def test_workspace_buffer_semantics():
    ws = MsaWorkspace()
    a = ws.buffer("x", 10, torch.int32, "cpu")
    assert a.numel() == 10 and ws.allocations == 1
    b = ws.buffer("x", 4, torch.int32, "cpu")
    assert b.data_ptr() == a.data_ptr() and b.numel() == 4 and ws.allocations == 1
    c = ws.buffer("x", 11, torch.int32, "cpu")  # larger: replaced
    assert c.numel() == 11 and ws.allocations == 2
    d = ws.buffer("x", 4, torch.float32, "cpu")  # other dtype: replaced
    assert d.dtype == torch.float32 and ws.allocations == 3
    assert ws.buffer("y", 0, torch.float32, "cpu").numel() == 1  # never empty
    assert "x=4xfloat32" in repr(ws)


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [False, True])
def test_static_plan_call_does_not_allocate_gpu(decode):
    device = "cuda"
    hq, hkv = 64, 4
    bmax, max_q, max_k = (128, 1, 8192) if decode else (2, 512, 4096)
    info, q, k, v, idx, table, rt = _static_problem(device, bmax=bmax, max_q=max_q, max_k=max_k, hq=hq, hkv=hkv,
                                                    topk=16, decode=decode)
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    for with_lse in (True, False):
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=device) if with_lse else None
        _set_lengths(rt, [max_q] * bmax, [max_k] * bmax)
        msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=out, lse=lse)  # warm-up
        _set_lengths(rt, [max_q // 2 or 1] * bmax, [max_k - 5] * bmax)
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        msa(q, k, v, info, kv_block_indexes=idx, runtime_metadata=rt, page_table=table, out=out, lse=lse)
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


@pytest.mark.parametrize("paged", [False, True])
def test_static_dense_and_paged_plans_write_in_place(device, triton_backend, paged):
    """A static dense / paged plan runs the attention kernel straight into out and lse (the
    caller's, or the plan's scratch LSE): right values on the valid rows, and the second call
    allocates nothing in the plan's workspace."""
    hq, hkv, bmax, max_q, max_k = 4, 2, 2, 4, 384
    info = msa_plan(bmax, max_q, max_k, hq, num_kv_heads=hkv, page_size=BLK if paged else -1)
    q = torch.randn(bmax * max_q, hq, 128).bfloat16().to(device)
    if paged:
        k = torch.randn(7, BLK, hkv, 128).bfloat16().to(device)
        v = torch.randn(7, BLK, hkv, 128).bfloat16().to(device)
        table = torch.tensor([[4, 1, 3], [0, 6, 2]], dtype=torch.int32, device=device)
    else:
        k = torch.randn(bmax * max_k, hkv, 128).bfloat16().to(device)
        v = torch.randn(bmax * max_k, hkv, 128).bfloat16().to(device)
        table = None
    q_lens, kv_lens = [3, 2], [300, 140]
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=_cu(q_lens).to(device), cu_seqlens_k=_cu(kv_lens).to(device),
                            seqused_k=torch.tensor(kv_lens, dtype=torch.int32, device=device), page_table=table)
    allocations = None
    for call, with_lse in enumerate((True, False, False)):
        out = poisoned(q.shape, q.dtype, device)
        lse = poisoned(q.shape[:2], torch.float32, device) if with_lse else None
        msa(q, k, v, info, runtime_metadata=rt, out=out, lse=lse)
        n = sum(q_lens)
        ro, rl = attention_varlen_reference(q[:n].cpu(), k.cpu(), v.cpu(), _cu(q_lens), kv_lens,
                                            k_starts=None if paged else _cu(kv_lens)[:-1].tolist(),
                                            page_table=None if table is None else table.cpu(), causal=True)
        assert_close(out[:n], ro, atol=2e-2, rtol=2e-2)
        if with_lse:
            assert_close(lse[:n], rl.t(), atol=1e-3, rtol=1e-3, name="lse")
        if call == 1:  # the first call without lse allocated the scratch LSE
            allocations = info.plan.workspace.allocations
    assert info.plan.workspace.allocations == allocations  # the third call reused it


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True])
def test_static_dense_and_paged_plan_calls_do_not_allocate_gpu(paged):
    device, hq, hkv, bmax, max_q, max_k = "cuda", 64, 4, 4, 256, 4096
    info = msa_plan(bmax, max_q, max_k, hq, num_kv_heads=hkv, page_size=BLK if paged else -1)
    q = torch.randn(bmax * max_q, hq, 128, device=device).bfloat16()
    pages = bmax * max_k // BLK
    shape = (pages, BLK, hkv, 128) if paged else (bmax * max_k, hkv, 128)
    k, v = torch.randn(shape, device=device).bfloat16(), torch.randn(shape, device=device).bfloat16()
    table = torch.randperm(pages, device=device).to(torch.int32).view(bmax, -1).contiguous() if paged else None
    lens = [max_k - 7 * i for i in range(bmax)]
    rt = MsaRuntimeMetadata(None, None, None, cu_seqlens_q=_cu([max_q] * bmax).to(device),
                            cu_seqlens_k=_cu(lens).to(device), seqused_k=torch.tensor(lens, dtype=torch.int32,
                                                                                      device=device), page_table=table)
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    for with_lse in (True, False):
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=device) if with_lse else None
        msa(q, k, v, info, runtime_metadata=rt, out=out, lse=lse)  # warm-up
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        msa(q, k, v, info, runtime_metadata=rt, out=out, lse=lse)
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
