"""The two load paths of the groupwise kernel (TMA tensor descriptors, pointer loads) and
the two split-K reductions (fused into the last-arriving program, second launch).

Tolerances: bf16 output of fp32 sums that differ from the reference only by summation
order: the default bf16 tolerance (1 ulp of bf16 = 2^-8 relative) covers it.
"""

from __future__ import annotations

import pytest
import torch

from mate import gemm
from mate.ops.gemm import reference as R
from mate.testing import assert_close, assert_equal, poisoned, rand_fp8
from tests.gemm._inputs import fp8_block_operands, launch_groupwise_plain


@pytest.mark.parametrize("tma,reduce", [(True, "fused"), (True, "launch"), (False, "launch")])
def test_split_k_paths(device, triton_backend, tma, reduce):
    from mate.ops.gemm import groupwise

    m, n, k = 40, 192, 512  # 1 x 2 tiles of 64x128, 4 K splits; n not a multiple of 128
    a, b, sa, sb = fp8_block_operands(m, n, k, device)
    out = poisoned((m, n), torch.bfloat16, device)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "SPLIT_K": 4, "TMA": tma,
           "REDUCE": reduce}
    launch_groupwise_plain(a, b, sa, sb, out, cfg)
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))
    if tma and reduce == "fused":  # the last program of each tile put its counter back to 0
        cnt = groupwise._COUNTERS[groupwise._counter_key(a.device)]
        assert_equal(cnt, torch.zeros_like(cnt))
        out2 = poisoned((m, n), torch.bfloat16, device)
        launch_groupwise_plain(a, b, sa, sb, out2, cfg)  # a second call sees clean counters: same bits
        assert_equal(out2, out)


def test_split_k_sum_is_deterministic_across_reductions(device, triton_backend):
    """Both reductions add the fp32 partials in split order: bit-identical outputs."""
    a, b, sa, sb = fp8_block_operands(16, 128, 1024, device)
    outs = []
    for reduce in ("fused", "launch"):
        o = poisoned((16, 128), torch.bfloat16, device)
        launch_groupwise_plain(a, b, sa, sb, o, {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2,
                                                 "SPLIT_K": 8, "REDUCE": reduce})
        outs.append(o)
    assert_equal(outs[0], outs[1])


def test_env_launch_reduce_uses_no_shared_counters(device, triton_backend, monkeypatch):
    """``MATE_GEMM_SPLITK_REDUCE=launch`` turns a fused split-K config into the second-launch
    reduce (no per-device counter buffer, so calls may overlap on several streams): the same
    bits as the fused reduce; an unknown value raises naming the variable."""
    from mate.ops.gemm import groupwise

    a, b, sa, sb = fp8_block_operands(16, 128, 1024, device)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "SPLIT_K": 8, "REDUCE": "fused"}
    fused = poisoned((16, 128), torch.bfloat16, device)
    launch_groupwise_plain(a, b, sa, sb, fused, cfg)
    monkeypatch.setenv("MATE_GEMM_SPLITK_REDUCE", "launch")
    assert groupwise._tile_counters(a.device, 2) is None
    launched = poisoned((16, 128), torch.bfloat16, device)
    launch_groupwise_plain(a, b, sa, sb, launched, cfg)
    assert_equal(launched, fused)
    monkeypatch.setenv("MATE_GEMM_SPLITK_REDUCE", "atomic")
    with pytest.raises(ValueError, match="MATE_GEMM_SPLITK_REDUCE must be 'fused' or 'launch', got 'atomic'"):
        launch_groupwise_plain(a, b, sa, sb, launched, cfg)


def test_replaced_counter_buffer_stays_alive(device, triton_backend):
    """A larger split-K call replaces the device's counter buffer; the old one is kept (a
    CUDA graph captured earlier still points at it)."""
    from mate.ops.gemm import groupwise

    old = groupwise._tile_counters(torch.device(device), 4096)
    bigger = groupwise._tile_counters(torch.device(device), old.numel() + 1)
    assert bigger.numel() > old.numel() and any(t is old for t in groupwise._RETIRED_COUNTERS)
    assert groupwise._tile_counters(torch.device(device), 8) is bigger


def test_unaligned_operand_takes_pointer_loads(device, triton_backend):
    from mate.ops.gemm.groupwise import _tma_ok

    m, n, k = 24, 128, 256
    _, b, sa, sb = fp8_block_operands(m, n, k, device)
    flat = rand_fp8((m * k + 1,), device=device, scale=2.0)
    a = flat[1:].view(m, k)  # base address off the 16-byte grid: TMA cannot read it
    assert not _tma_ok(a) and _tma_ok(b)
    out = poisoned((m, n), torch.bfloat16, device)
    gemm.gemm_fp8_nt_groupwise(a, b, sa, sb, scale_major_mode="K", out=out, backend="triton")
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb))


def test_masked_unaligned_a_takes_pointer_loads(device, triton_backend):
    from mate.ops.gemm.groupwise import _tma_ok

    G, max_m, n, k = 2, 64, 128, 256
    flat = rand_fp8((G * max_m * k + 1,), device=device, scale=2.0)
    a = flat[1:].view(G, max_m, k)  # contiguous, but off the 16-byte grid
    assert not _tma_ok(a)
    a_scale = torch.rand(G, max_m, k // 128, device=device) * 0.02 + 0.005
    b = rand_fp8((G, n, k), device=device, scale=2.0)
    b_scale = torch.rand(G, n // 128, k // 128, device=device) * 0.02 + 0.005
    masked_m = torch.tensor([64, 5], dtype=torch.int32, device=device)
    out = poisoned((G, max_m, n), torch.bfloat16, device)
    gemm.batch_deepgemm_fp8_nt_groupwise(a, b, a_scale, b_scale, masked_m, 32, out=out)
    ref = R.masked_ref(a, b, a_scale, b_scale, masked_m, torch.float32)
    assert_close(out[0], ref[0])
    assert_close(out[1, :5], ref[1, :5])
    assert bool(torch.isnan(out[1, 5:].float()).all())
