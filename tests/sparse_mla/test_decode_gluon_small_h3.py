"""Tests of the candidate variants of the one-warpgroup small-H Gluon decode
(``decode_gluon_small_h3.py``: early ring refill, combine fused into the last split).

Gluon cannot run under Triton's interpreter: on the CPU these tests check that the module
imports and that the launcher validates the split counters; the ``gpu`` test runs the
module's self-check (every variant against ``sparse_mla_decode_reference`` on problems with
-1 / out-of-range slots and short or empty rows, each launched twice so that the counters
must have been reset) in a child process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def test_variants_module_imports():
    from mate.ops.sparse_mla import decode_gluon_small_h3 as m

    assert callable(m.sparse_mla_decode_gluon_small_h_wg_var)


@pytest.mark.parametrize("counters", [torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)])
def test_variant_counters_validated(counters):
    from mate.ops.sparse_mla.decode_gluon_small_h3 import sparse_mla_decode_gluon_small_h_wg_var
    from mate.ops.sparse_mla.metadata import plan_decode

    B, q_len, H, top_k = 3, 1, 16, 256
    md = plan_decode(B, q_len, H, top_k, "cpu", num_splits=2)
    q = torch.zeros(B, q_len, H, 576, dtype=torch.float8_e4m3fn)
    kv = torch.zeros(64, 576, dtype=torch.float8_e4m3fn)
    idx = torch.zeros(B, q_len, top_k, dtype=torch.int32)
    out = torch.empty(B, q_len, H, 512, dtype=torch.bfloat16)
    lse = torch.empty(B * q_len * H)
    with pytest.raises(ValueError, match="counters must be a contiguous int32 tensor"):
        sparse_mla_decode_gluon_small_h_wg_var(q, kv, idx, None, out, lse, md.partial_o, md.partial_lse, 0.1, 1.0,
                                               16, md.num_splits, md.split_blocks, True, counters)


@pytest.mark.gpu
def test_variants_self_check_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU")
    res = subprocess.run([sys.executable, "-m", "mate.ops.sparse_mla.decode_gluon_small_h3"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
