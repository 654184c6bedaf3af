"""MSA metadata near INT32_MAX (device lengths a static plan cannot check on the host): an
offset or a length past 2**30 gives the same result as an in-range one with the same
visibility, in sparse prefill, sparse decode and the max-score pass (the kernels clamp their
position arithmetic instead of wrapping)."""

from __future__ import annotations

import pytest
import torch

from mate.msa_interface import MsaRuntimeMetadata, msa, msa_plan
from mate.testing import assert_equal

IMAX = 2**31 - 1
HQ, HKV, D = 2, 1, 128


def _i32(device, *v):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _cache(device):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    k, v = (torch.randn(2, 128, HKV, D, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    q = torch.randn(4, HQ, D, generator=g).to(torch.bfloat16).to(device)
    return q, k, v


def _sparse(q, k, v, mode, nq, kv_len, qo_off):
    dev = q.device
    info = msa_plan(1, nq, 256, HQ, num_kv_heads=HKV, page_size=128, kv_block_num=4, sparse_kernel_mode=mode)
    blocks = _i32(dev, 0, 1, -1, -1).view(1, 1, 4).expand(nq, HKV, 4).contiguous()
    rt = MsaRuntimeMetadata(None, None, None if qo_off is None else _i32(dev, qo_off), cu_seqlens_q=_i32(dev, 0, nq),
                            cu_seqlens_k=_i32(dev, 0, 256), seqused_k=_i32(dev, kv_len),
                            page_table=_i32(dev, 0, 1).view(1, 2))
    lse = torch.empty(nq, HQ, device=dev)
    out, _ = msa(q[:nq], k, v, info, kv_block_indexes=blocks, runtime_metadata=rt, lse=lse)
    return out, lse


@pytest.mark.parametrize("mode,nq", [("prefill", 4), ("decode", 1)])
def test_sparse_offsets_and_lengths_past_2_30(device, triton_backend, mode, nq):
    q, k, v = _cache(device)
    # a causal offset past the keys sees every selected key, as 10**6 does
    a = _sparse(q, k, v, mode, nq, 256, IMAX)
    b = _sparse(q, k, v, mode, nq, 256, 10**6)
    assert_equal(a[0], b[0])
    assert_equal(a[1], b[1])
    assert torch.isfinite(a[1]).all()
    # a length past the cache: the selected blocks 0 and 1 stay valid (one query at len - 1 sees them all)
    a = _sparse(q, k, v, mode, nq, IMAX, 10**6 if mode == "prefill" else None)
    b = _sparse(q, k, v, mode, nq, 256, 10**6 if mode == "prefill" else None)
    assert_equal(a[0], b[0])
    assert_equal(a[1], b[1])


def test_max_score_offsets_and_lengths_past_2_30(device, triton_backend):
    q, k, _ = _cache(device)
    dev = q.device

    def max_score(kv_len, qo_off, causal):
        info = msa_plan(1, 2, 256, HQ, num_kv_heads=HKV, page_size=128, output_maxscore=True, causal=causal)
        rt = MsaRuntimeMetadata(None, None, None if qo_off is None else _i32(dev, qo_off),
                                cu_seqlens_q=_i32(dev, 0, 2), cu_seqlens_k=_i32(dev, 0, 256),
                                seqused_k=_i32(dev, kv_len), page_table=_i32(dev, 0, 1).view(1, 2))
        return msa(q[:2], k, None, info, output_o=False, runtime_metadata=rt)[1]

    a = max_score(256, IMAX - 1, True)
    assert_equal(a, max_score(256, 10**6, True))
    assert torch.isfinite(a).all()
    assert_equal(max_score(IMAX, None, False), max_score(256, None, False))
