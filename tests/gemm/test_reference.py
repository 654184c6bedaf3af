"""The references against plain float64 loops on tiny inputs."""

from __future__ import annotations

import torch

from mate.ops.gemm import reference as R
from mate.testing import assert_close, rand_fp8
from tests.gemm._inputs import fp8_block_operands, fp64_groupwise_loop


def test_groupwise_ref_matches_fp64_loop():
    a, b, sa, sb = fp8_block_operands(3, 130, 256)  # n spans two weight blocks, the second partial
    got = R.groupwise_fp32_ref(a, b, sa, sb)
    # fp32 accumulation of 256 products of magnitude <~ 1e-1: relative error well under 1e-5
    assert_close(got, fp64_groupwise_loop(a, b, sa, sb).float(), atol=1e-5, rtol=1e-5)


def test_quantize_row_groups_ref_matches_loop():
    x = torch.randn(3, 200) * 10
    x[1, 128:] = 0.0  # an all-zero group gets scale 1
    q, s = R.quantize_fp8_row_groups_ref(x)
    for i in range(3):
        for g in range(2):
            blk = x[i, g * 128:(g + 1) * 128].double()
            amax = float(blk.abs().max())
            want = amax / 448.0 if amax > 0 else 1.0
            assert abs(float(s[i, g]) - want) <= 1e-6 * want
            expect = (blk / float(s[i, g])).float().clamp(-448, 448).to(torch.float8_e4m3fn)
            assert torch.equal(q[i, g * 128:(g + 1) * 128].view(torch.uint8), expect.view(torch.uint8))
    assert float(s[1, 1]) == 1.0 and bool((q[1, 128:].float() == 0).all())


def test_bmm_fp8_ref_channelwise_matches_loop():
    A = rand_fp8((2, 3, 32))
    B = rand_fp8((2, 32, 5))
    sa = torch.rand(2, 3, 1) + 0.5
    sb = torch.rand(2, 1, 5) + 0.5
    got = R.bmm_fp8_ref(A, B, sa, sb, torch.float32)
    want = torch.zeros(2, 3, 5, dtype=torch.float64)
    for z in range(2):
        for i in range(3):
            for j in range(5):
                dot = sum(float(A[z, i, t].float()) * float(B[z, t, j].float()) for t in range(32))
                want[z, i, j] = float(sa[z, i, 0]) * float(sb[z, 0, j]) * dot
    assert_close(got, want.float(), atol=1e-4, rtol=1e-5)  # fp32 vs fp64, 32 terms


def test_grouped_refs_match_loops():
    a, b0, sa, sb0 = fp8_block_operands(6, 128, 128)
    _, b1, _, sb1 = fp8_block_operands(6, 128, 128)
    b, sb = torch.stack([b0, b1]), torch.stack([sb0, sb1])
    idx = torch.tensor([1, 1, -1, 0, 0, -1], dtype=torch.int32)
    got = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    for i, g in enumerate(idx.tolist()):
        if g < 0:
            assert bool((got[i] == 0).all())
        else:
            want = fp64_groupwise_loop(a[i:i + 1], b[g], sa[i:i + 1], sb[g]).float()
            assert_close(got[i:i + 1], want, atol=1e-5, rtol=1e-5)
    masked = R.masked_ref(a.view(2, 3, 128), b, sa.view(2, 3, 1), sb, torch.tensor([2, 0], dtype=torch.int32),
                          torch.float32)
    want = fp64_groupwise_loop(a[:2], b[0], sa[:2], sb[0]).float()
    assert_close(masked[0, :2], want, atol=1e-5, rtol=1e-5)
    assert bool((masked[0, 2] == 0).all()) and bool((masked[1] == 0).all())
