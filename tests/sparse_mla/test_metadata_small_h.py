"""Plans of the small-H Gluon kernels on Hopper (``plan_decode``), checked on the CPU.

``_cuda_capability`` is patched to report compute capability 9.0 so that the Hopper branch
of the plan runs without a GPU (the plan reads no device state besides it and the SM count,
given here). The decode itself is checked by the GPU tests of ``test_decode_gluon_small_h.py``.
"""

from __future__ import annotations

import pytest

from mate.ops.sparse_mla import metadata
from mate.ops.sparse_mla.metadata import GLUON_SMALL_H_STAGES, GLUON_WG_STAGES, plan_decode


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(metadata, "_cuda_capability", lambda device: (9, 0))


@pytest.mark.parametrize("B,q_len,H,chains,programs", [
    (128, 1, 16, 2, 1), (64, 1, 16, 2, 2), (64, 2, 16, 2, 1), (32, 2, 16, 2, 2), (128, 1, 8, 2, 1), (132, 1, 16, 2, 1),
    (264, 1, 16, 1, 1), (8, 1, 16, 2, 16), (1, 1, 16, 1, 32)])
def test_one_warpgroup_default_fills_two_chains_per_sm(hopper, B, q_len, H, chains, programs):
    """H <= 16: the one-warpgroup kernel (4 warps), split to fill 2 x 132 chains; where the
    chains are at least as many as the SMs, two per program (the dual kernel: 8 warps). On a
    "cpu" device a split may be 1 block (on the GPU at least 4): B=8 has 256 chains, B=1 32."""
    md = plan_decode(B, q_len, H, 2048, "cpu", num_sms=132)
    assert md.gluon and md.transposed and md.block_h == 16
    assert (md.num_warps, md.num_stages, md.chains, md.num_splits) == (4, GLUON_WG_STAGES, chains, programs)
    assert md.num_splits * md.chains * md.split_blocks * 64 >= 2048
    assert (md.num_splits * md.chains - 1) * md.split_blocks * 64 < 2048  # at most one chain past top-k


def test_dual_plan_options(hopper):
    """``chains=1`` keeps one chain per program; ``chains=2`` with ``num_splits`` counts
    programs; 3 stages (two rings would not fit) keep one chain or raise when forced."""
    md = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, chains=1)
    assert (md.chains, md.num_splits, md.split_blocks) == (1, 2, 16)
    md = plan_decode(8, 1, 16, 2048, "cpu", num_sms=132, chains=2, num_splits=3)
    assert (md.chains, md.num_splits, md.split_blocks) == (2, 3, 6)
    md = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, gluon=True, transposed=True, num_stages=3)
    assert (md.num_warps, md.num_stages, md.chains, md.num_splits) == (4, 3, 1, 2)
    with pytest.raises(ValueError, match="num_stages 2"):
        plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, gluon=True, transposed=True, num_stages=3, chains=2)


@pytest.mark.parametrize("B,q_len,H,splits", [(128, 1, 32, 1), (128, 1, 17, 1), (64, 1, 32, 2), (64, 2, 20, 1)])
def test_eight_warp_default_above_16_heads(hopper, B, q_len, H, splits):
    """17 <= H <= 32: the 8-warp kernel, one program per SM."""
    md = plan_decode(B, q_len, H, 2048, "cpu", num_sms=132)
    assert md.gluon and md.transposed and md.block_h == 32
    assert (md.num_warps, md.num_stages, md.num_splits) == (8, GLUON_SMALL_H_STAGES, splits)


def test_eight_warp_kernel_selectable_at_16_heads(hopper):
    md = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, gluon=True, transposed=True, num_warps=8)
    assert (md.num_warps, md.num_stages, md.num_splits) == (8, GLUON_SMALL_H_STAGES, 1)


def test_cpu_plans_unchanged():
    """Without a Hopper GPU the plain transposed kernel runs (interpreter): 8 warps, 1 per SM."""
    md = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132)
    assert not md.gluon and md.transposed and (md.num_warps, md.num_stages, md.num_splits) == (8, 6, 1)
    md = plan_decode(128, 1, 16, 2048, "cpu", num_sms=132, gluon=True, transposed=True)
    assert not md.gluon and (md.num_warps, md.num_splits) == (8, 1)
