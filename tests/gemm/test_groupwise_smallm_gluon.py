"""The small-M swap-AB Gluon groupwise kernel (``groupwise_gluon_smallm.py``) against the reference.

GPU tests (Hopper only); on other machines only the support check runs.
"""

from __future__ import annotations

import pytest
import torch

from mate.ops.gemm import reference as R
from mate.ops.gemm.groupwise_gluon_smallm import groupwise_gemm_gluon_smallm, smallm_supported
from mate.testing import assert_close, poisoned
from tests.gemm._inputs import fp8_block_operands

CONFIGS = {
    "w128 s1 st4": {"BLOCK_W": 128, "SPLIT_K": 1, "num_stages": 4},
    "w64 s1 st6": {"BLOCK_W": 64, "SPLIT_K": 1, "num_stages": 6},
    "w128 s4 st8 spread": {"BLOCK_W": 128, "SPLIT_K": 4, "num_stages": 8, "REDUCE": "spread"},
    "w128 s7 st8 spread": {"BLOCK_W": 128, "SPLIT_K": 7, "num_stages": 8, "REDUCE": "spread"},
    "w64 s4 st12 last": {"BLOCK_W": 64, "SPLIT_K": 4, "num_stages": 12, "REDUCE": "last"},
    "w128 s4 st6 launch": {"BLOCK_W": 128, "SPLIT_K": 4, "num_stages": 6, "REDUCE": "launch"},
}


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _run(a, b, sa, sb, out, cfg):
    groupwise_gemm_gluon_smallm(a, b, sa, (0, sa.stride(0), sa.stride(1)), sb, (0, sb.stride(0), sb.stride(1)), out,
                                config=cfg)


def test_smallm_not_supported_off_gpu_or_large_m():
    a, b, _, _ = fp8_block_operands(64, 128, 256)
    assert not smallm_supported(a, b, torch.empty(64, 128, dtype=torch.bfloat16))
    if _hopper():
        a, b, _, _ = fp8_block_operands(129, 128, 256, "cuda")
        assert not smallm_supported(a, b, torch.empty(129, 128, dtype=torch.bfloat16, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (37, 4096, 1536), (64, 2112, 7168), (100, 576, 2048),
                                   (128, 4096, 7168)])
def test_smallm_plain(name, m, n, k):
    a, b, sa, sb = fp8_block_operands(m, n, k, "cuda")
    assert smallm_supported(a, b, torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    ref = R.groupwise_fp32_ref(a, b, sa, sb)
    for mode in ("K", "MN"):  # the scales read in place through their strides
        out = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _run(a, b, sa, sb, out, CONFIGS[name])
        else:
            sa_mn, sb_mn = sa.t().contiguous(), sb.t().contiguous()
            _run(a, b, sa_mn.t(), sb_mn.t(), out, CONFIGS[name])
        assert_close(out, ref, max_rel_error=1e-2, name=f"{name} {mode}")
        again = poisoned((m, n), torch.bfloat16, "cuda")
        if mode == "K":
            _run(a, b, sa, sb, again, CONFIGS[name])
            assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "not deterministic"
