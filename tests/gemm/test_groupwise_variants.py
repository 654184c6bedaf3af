"""Tile variants of the TMA groupwise kernel: 256-column tiles (one weight scale per 128
columns of a tile) and the lagged scaling (each step's product scaled during the next
step), alone, with split-K, in K- and MN-major scales and in the contiguous layout.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned
from tests.gemm._inputs import fp8_block_operands, launch_groupwise_plain


@pytest.mark.parametrize("bn,lag,split,k_major", [(256, False, 1, True), (256, True, 2, False), (64, True, 1, True),
                                                  (128, True, 3, False)])
def test_tile_variants(device, triton_backend, bn, lag, split, k_major):
    m, n, k = 40, 320, 512  # n = 2.5 weight-scale blocks: a 256-column tile straddles the edge
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": 64, "BLOCK_N": bn, "num_warps": 4, "num_stages": 2, "SPLIT_K": split, "MMA_LAG": lag}
    launch_groupwise_plain(a, b, sa, sb, out, cfg, k_major)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))


@pytest.mark.parametrize("bm,bn,split,stages,k_major", [
    (64, 16, 1, 4, False), (64, 32, 3, 4, True), (128, 32, 2, 3, False), (128, 64, 4, 2, True),
    (64, 128, 5, 2, False), (16, 64, 2, 3, True), (32, 32, 1, 2, False)])
def test_small_m_tiles(device, triton_backend, bm, bn, split, stages, k_major):
    """The small-M candidates: 16/32-column tiles, 16/32-row tiles (mma.sync on the GPU),
    128-row tiles on 4 warps, split-K with fewer K blocks per split than pipeline stages
    (n = 2.5 weight-scale blocks)."""
    m, n, k = 72, 320, 640
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": stages, "SPLIT_K": split}
    launch_groupwise_plain(a, b, sa, sb, out, cfg, k_major)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))


def test_wide_tile_pointer_fallback(device, triton_backend):
    """Operands TMA cannot read take pointer loads with BLOCK_N capped at 128."""
    m, n, k = 16, 320, 256
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    launch_groupwise_plain(a, b, sa, sb, out,
                           {"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 4, "num_stages": 2, "TMA": False})
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))


def test_contiguous_lagged(device, triton_backend):
    from mate.ops.gemm.groupwise import CONTIGUOUS, groupwise_gemm_triton

    G, n, k = 2, 128, 384
    a, _, sa, _ = fp8_block_operands(256, n, k, device)
    b = torch.stack([fp8_block_operands(1, n, k, device)[1] for _ in range(G)])
    sb = torch.rand(G, 1, k // 128, device=device) * 0.02 + 0.005
    idx = torch.tensor([1] * 128 + [0] * 100 + [-1] * 28, dtype=torch.int32, device=device)
    out = poisoned((256, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "MMA_LAG": True}
    groupwise_gemm_triton(a, b, sa, (0, sa.stride(0), 1), sb, (sb.stride(0), sb.stride(1), 1), out, None,
                          layout=CONTIGUOUS, config=cfg, m_indices=idx)
    ref = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    assert_close(out[:228], ref[:228])
    assert bool(torch.isnan(out[228:].float()).all())

