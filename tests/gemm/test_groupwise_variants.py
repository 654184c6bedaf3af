"""Tile variants of the TMA groupwise kernel: 256-column tiles (one weight scale per 128
columns of a tile) and the lagged scaling (each step's product scaled during the next
step), alone, with split-K, in K- and MN-major scales and in the contiguous layout.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.testing import assert_close, poisoned
from tests.gemm._inputs import fp8_block_operands


def _launch(a, b, sa, sb, out, config, k_major=True):
    from mate.ops.gemm.groupwise import PLAIN, groupwise_gemm_triton

    s_a = sa if k_major else sa.t().contiguous()
    s_b = sb if k_major else sb.t().contiguous()
    a_mk = s_a if k_major else s_a.t()
    b_nk = s_b if k_major else s_b.t()
    groupwise_gemm_triton(a, b, s_a, (0, a_mk.stride(0), a_mk.stride(1)), s_b, (0, b_nk.stride(0), b_nk.stride(1)),
                          out, None, layout=PLAIN, config=config)


@pytest.mark.parametrize("bn,lag,split,k_major", [(256, False, 1, True), (256, True, 2, False), (64, True, 1, True),
                                                  (128, True, 3, False)])
def test_tile_variants(device, triton_backend, bn, lag, split, k_major):
    m, n, k = 40, 320, 512  # n = 2.5 weight-scale blocks: a 256-column tile straddles the edge
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": 64, "BLOCK_N": bn, "num_warps": 4, "num_stages": 2, "SPLIT_K": split, "MMA_LAG": lag}
    _launch(a, b, sa, sb, out, cfg, k_major)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))


@pytest.mark.parametrize("bm,bn,split,stages,k_major,fast", [
    (64, 16, 1, 4, False, False), (64, 32, 3, 4, True, True), (128, 32, 2, 3, False, False),
    (128, 64, 4, 2, True, True), (64, 128, 5, 2, False, True)])
def test_small_m_tiles(device, triton_backend, bm, bn, split, stages, k_major, fast):
    """The small-M candidates: 16/32-column tiles, 128-row tiles on 4 warps, split-K with
    fewer K blocks per split than pipeline stages (n = 2.5 weight-scale blocks), the fast
    fused reduce (row sub-tiles) bitwise equal to the plain one."""
    m, n, k = 72, 320, 640
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": stages, "SPLIT_K": split}
    _launch(a, b, sa, sb, out, {**cfg, "FAST_REDUCE": fast}, k_major)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))
    if fast:
        plain = poisoned((m, n), torch.bfloat16, device)
        _launch(a, b, sa, sb, plain, cfg, k_major)
        assert torch.equal(out.view(torch.int16), plain.view(torch.int16))


def test_wide_tile_pointer_fallback(device, triton_backend):
    """Operands TMA cannot read take pointer loads with BLOCK_N capped at 128."""
    m, n, k = 16, 320, 256
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    _launch(a, b, sa, sb, out, {"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 4, "num_stages": 2, "TMA": False})
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


def test_exact_table_entry_keeps_measured_stages_and_split(monkeypatch):
    from mate.ops.gemm import tuning

    key = "m128,2112,7168"
    entry = {"backend": "triton", "BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 8, "SPLIT_K": 2,
             "FAST_REDUCE": True}
    monkeypatch.setitem(tuning.GROUPWISE_OVERRIDES, key, {**entry, "EXACT": True})
    cfg = tuning.groupwise_config(128, 2112, 7168, fp8_out=False)  # 132 tiles: kept split, 8 stages
    assert (cfg["SPLIT_K"], cfg["num_stages"], cfg["FAST_REDUCE"]) == (2, 8, True) and "EXACT" not in cfg
    cfg = tuning.groupwise_config(128, 2112, 7168, fp8_out=True)  # 128-column tiles: not the measured config
    assert (cfg["BLOCK_N"], cfg["num_stages"]) == (128, 5)
    monkeypatch.setitem(tuning.GROUPWISE_OVERRIDES, key, entry)
    cfg = tuning.groupwise_config(128, 2112, 7168, fp8_out=False)
    assert (cfg["SPLIT_K"], cfg["num_stages"]) == (1, 6)


def test_fast_reduce_fp8_output_matches_plain_reduce(device, triton_backend):
    """FP8 output quantized per row and 128-column group from the row sub-tiles of the
    fast reduce: values and group scales bitwise those of the whole-tile reduce."""
    from mate.ops.gemm.groupwise import PLAIN, groupwise_gemm_triton

    m, n, k = 40, 256, 768
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    res = []
    for fast in (False, True):
        out = poisoned((m, n), torch.float8_e4m3fn, device)
        osc = poisoned((m, 2), torch.float32, device)
        cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "SPLIT_K": 3, "FAST_REDUCE": fast}
        groupwise_gemm_triton(a, b, sa, (0, sa.stride(0), 1), sb, (0, sb.stride(0), 1), out, osc,
                              layout=PLAIN, config=cfg)
        res.append((out.view(torch.uint8), osc))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    assert not bool(torch.isnan(res[1][1]).any())
