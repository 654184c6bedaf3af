"""The TMA groupwise kernel with A_PTR: A tiles by masked pointer loads (rows past M not
fetched), B by TMA. Same products in the same order as the all-TMA launch."""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned
from tests.gemm._inputs import fp8_block_operands, launch_groupwise_plain


def _cfg(bn, split, a_ptr, stages=2):
    return {"BLOCK_M": 64, "BLOCK_N": bn, "num_warps": 4, "num_stages": stages, "SPLIT_K": split, "A_PTR": a_ptr}


@pytest.mark.parametrize("m,bn,split,k_major,strided", [
    (1, 128, 1, True, False), (1, 64, 2, False, True), (3, 64, 1, False, False), (70, 128, 3, True, True),
    (70, 64, 1, False, False)])
def test_a_ptr_plain(device, triton_backend, m, bn, split, k_major, strided):
    """n = 200: the last column tile is partial for both tile widths; ``strided``: a is a
    row-strided view (row stride K + 128), so the kernel must use stride_am, not K."""
    n, k = 200, 384
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    if strided:
        wide = torch.zeros(m, k + 128, dtype=a.dtype, device=device)
        wide[:, :k] = a
        a = wide[:, :k]
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    out = poisoned((m, n), torch.bfloat16, device)
    launch_groupwise_plain(a, b, sa, sb, out, _cfg(bn, split, True), k_major)
    assert_close(out, ref)
    tma = poisoned((m, n), torch.bfloat16, device)
    launch_groupwise_plain(a, b, sa, sb, tma, _cfg(bn, split, False), k_major)
    assert torch.equal(out.view(torch.int16), tma.view(torch.int16))


def test_a_ptr_masked(device, triton_backend):
    """MASKED layout: group g's A rows start at g * max_m (rows past masked_m read as zero)."""
    from mate.ops.gemm.groupwise import MASKED, groupwise_gemm_triton

    G, max_m, n, k = 2, 70, 136, 256
    a = torch.stack([fp8_block_operands(max_m, n, k, device)[0] for _ in range(G)])
    b = torch.stack([fp8_block_operands(1, n, k, device)[1] for _ in range(G)])
    sa = torch.rand(G, max_m, k // 128, device=device) * 0.02 + 0.005
    sb = torch.rand(G, -(-n // 128), k // 128, device=device) * 0.02 + 0.005
    masked_m = torch.tensor([1, 70], dtype=torch.int32, device=device)
    out = poisoned((G, max_m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "A_PTR": True}
    groupwise_gemm_triton(a, b, sa, (sa.stride(0), sa.stride(1), 1), sb, (sb.stride(0), sb.stride(1), 1), out, None,
                          layout=MASKED, config=cfg, masked_m=masked_m)
    ref = R.masked_ref(a, b, sa, sb, masked_m, torch.float32)
    assert_close(out[0, :1], ref[0, :1])
    assert_close(out[1], ref[1])
    assert bool(torch.isnan(out[0, 64:].float()).all())  # the tile past masked_m is skipped


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,bn,split", [(1, 24576, 1536, 128, 1), (1, 2112, 7168, 64, 4), (64, 4096, 1536, 64, 1),
                                            (70, 320, 640, 128, 2)])
@pytest.mark.parametrize("k_major", [True, False])
def test_a_ptr_gpu(m, n, k, bn, split, k_major):
    """On the H200: the reference, bitwise equality with the all-TMA launch, repeatability."""
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    outs = []
    for a_ptr in (True, True, False):
        out = poisoned((m, n), torch.bfloat16, "cuda")
        launch_groupwise_plain(a, b, sa, sb, out, _cfg(bn, split, a_ptr, stages=4), k_major)
        outs.append(out)
    assert_close(outs[0], ref, max_rel_error=1e-2)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "A_PTR not repeatable"
    assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16)), "A_PTR differs from the TMA launch"
