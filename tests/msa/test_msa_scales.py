"""The softmax and quantization scales reach the kernels: msa() with a random sm_scale in
sparse and dense modes, and k_scale / v_scale with an e4m3 cache, against the references
given the same scales (a kernel that dropped one would use 1 or D^-1/2 instead)."""

from __future__ import annotations

import random

import torch

from mate.msa_interface import _msa_plan_from_lengths, msa
from mate.ops.mha.reference import attention_varlen_reference
from mate.ops.msa.reference_attention import sparse_attention_reference
from mate.testing import assert_close, poisoned


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def test_sparse_scales(device, triton_backend):
    q_lens, kv_lens, hq, hkv = [3, 2], [300, 140], 4, 2
    info = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), hq, hkv, page_size=128,
                                  kv_block_num=4, sparse_kernel_mode="prefill", device=device)
    table = _i32([[4, 1, 3], [0, 5, 0]], device)
    idx = torch.randint(-1, 3, (5, hkv, 4), dtype=torch.int32, device=device)
    sm_scale, k_scale, v_scale = random.uniform(0.02, 0.2), random.uniform(0.5, 2.0), random.uniform(0.5, 2.0)
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        q = torch.randn(5, hq, 128, device=device).to(dtype)
        k = torch.randn(6, 128, hkv, 128, device=device).to(dtype)
        v = torch.randn(6, 128, hkv, 128, device=device).to(dtype)
        ks, vs = (k_scale, v_scale) if dtype == torch.float8_e4m3fn else (1.0, 1.0)
        out = poisoned((5, hq, 128), torch.bfloat16, device)
        lse = poisoned((5, hq), torch.float32, device)
        msa(q, k, v, info, kv_block_indexes=idx, page_table=table, out=out, lse=lse, sm_scale=sm_scale, k_scale=ks,
            v_scale=vs)
        ro, rl = sparse_attention_reference(q.cpu(), k.cpu(), v.cpu(), idx.cpu(), torch.tensor([0, 3, 5]),
                                            torch.tensor(kv_lens), page_table=table.cpu(), sm_scale=sm_scale,
                                            k_scale=ks, v_scale=vs, num_kv_heads=hkv)
        assert_close(out, ro, atol=3e-2, rtol=3e-2, name=f"out {dtype} sm_scale={sm_scale} v_scale={vs}")
        assert_close(lse, rl, atol=2e-3, rtol=2e-3, name=f"lse {dtype} k_scale={ks}")


def test_dense_sm_scale(device, triton_backend):
    q_lens, kv_lens = [3, 5], [7, 5]
    info = _msa_plan_from_lengths(torch.tensor(q_lens), torch.tensor(kv_lens), num_qo_heads=4, num_kv_heads=2,
                                  device=device)
    q = torch.randn(8, 4, 64, device=device).bfloat16()
    k, v = (torch.randn(12, 2, 64, device=device).bfloat16() for _ in range(2))
    sm_scale = random.uniform(0.02, 0.5)
    out, _ = msa(q, k, v, info, sm_scale=sm_scale)
    ro, _ = attention_varlen_reference(q.cpu(), k.cpu(), v.cpu(), torch.tensor([0, 3, 8]), kv_lens, k_starts=[0, 7],
                                       softmax_scale=sm_scale, causal=True)
    assert_close(out, ro, atol=2e-2, rtol=2e-2, name=f"sm_scale={sm_scale}")
