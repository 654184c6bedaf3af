"""The experimental Gluon groupwise kernel (``config["GLUON"]``) against the reference on Hopper.

On a machine without a Hopper GPU only the dispatch is checked: the option falls back to
the plain-Triton kernel (interpreter), with the same results as without it.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.ops.gemm.groupwise import CONTIGUOUS, PLAIN, groupwise_gemm_triton
from mate.testing import assert_close, poisoned
from tests.gemm._inputs import fp8_block_operands, grouped_contiguous_operands

CONFIGS = {
    "128x128 st6": {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 6},
    "128x64 st8": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 8},
    "64x256 splitN st4": {"BLOCK_M": 64, "BLOCK_N": 256, "num_stages": 4, "SPLIT_N": True},
    "64x128 splitN st6": {"BLOCK_M": 64, "BLOCK_N": 128, "num_stages": 6, "SPLIT_N": True},
}


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _plain(a, b, sa, sb, out, cfg):
    groupwise_gemm_triton(a, b, sa, (0, sa.stride(0), sa.stride(1)), sb, (0, sb.stride(0), sb.stride(1)), out, None,
                          layout=PLAIN, config={"GLUON": True, "GROUP_M": 8, "num_warps": 4, **cfg})


def test_gluon_option_falls_back_off_hopper():
    if _hopper():
        pytest.skip("covered by the GPU tests")
    a, b, sa, sb = fp8_block_operands(64, 192, 256)
    out = poisoned((64, 192), torch.bfloat16, "cpu")
    _plain(a, b, sa, sb, out, {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2})
    assert_close(out, R.groupwise_fp32_ref(a, b, sa, sb), max_rel_error=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (64, 4096, 7168), (128, 24576, 1536), (300, 7168, 2048)])
def test_gluon_plain(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):  # the scales read in place through their strides
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _plain(a, b, sa, sb, out, CONFIGS[name])
        else:
            sa_mn, sb_mn = sa.t().contiguous(), sb.t().contiguous()
            _plain(a, b, sa_mn.t(), sb_mn.t(), out, CONFIGS[name])
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} {mode}")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", ["128x128 st6", "128x64 st8"])
def test_gluon_grouped_contiguous(name):
    n, k, rows = 4096, 7168, [300, 0, 128, 517]
    idx, a, sa, b, sb = grouped_contiguous_operands(rows, n, k, device="cuda")
    m = idx.numel()
    out = poisoned((m, n), torch.bfloat16, "cuda")
    groupwise_gemm_triton(a, b, sa, (0, sa.stride(0), 1), sb, (sb.stride(0), sb.stride(1), 1), out, None,
                          layout=CONTIGUOUS, config={"GLUON": True, "GROUP_M": 8, **CONFIGS[name]}, m_indices=idx)
    ref = R.grouped_contiguous_ref(a, b, sa, sb, idx, torch.float32)
    valid = idx >= 0
    assert_close(out[valid], ref[valid], max_rel_error=1e-2)
    assert torch.isnan(out[~valid].float()).all()  # padding rows are not written
