"""Launch recipes of eager mla_rope_quantize_fp8 calls (GPU): from the third call of a signature
the call replays the first calls' launch, bit for bit what the ordinary path writes, on fresh
inputs every call; outputs given as views of merged rows (the usual engine layout) or omitted."""

from __future__ import annotations

import pytest
import torch

from mate._core import recipe as R
from mate.sparse_mla_interface import _ROPE_RECIPES, mla_rope_quantize_fp8

pytestmark = pytest.mark.gpu


def _inputs(nnz, H, g):
    q = torch.randn(nnz, H, 576, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(nnz, 576, generator=g).to("cuda", torch.bfloat16)
    angles = torch.arange(4096.0)[:, None] * torch.rand(32, generator=g)
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).cuda()
    pos = torch.randint(0, 4096, (nnz,), generator=g).cuda()
    return q[..., 512:], k[:, 512:], q[..., :512], k[:, :512], cos_sin, pos


def _merged(nnz, H):
    q_out = torch.full((nnz, H, 576), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    k_out = torch.full((nnz, 576), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    return dict(q_rope_out=q_out[..., 512:], k_rope_out=k_out[:, 512:], q_nope_out=q_out[..., :512],
                k_nope_out=k_out[:, :512])


@pytest.mark.parametrize("outputs", ["merged", "omitted"])
@pytest.mark.parametrize("nnz,H", [(64, 128), (7, 16)])
def test_replayed_rope_quantize_equals_the_ordinary_path(outputs, nnz, H):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    kw = dict(is_neox=False, quant_scale_q=0.75, quant_scale_kv=1.5)
    with R.disabled():
        mla_rope_quantize_fp8(*_inputs(nnz, H, g), **kw)  # compiles
    for call in range(5):
        inputs = _inputs(nnz, H, g)
        given = _merged(nnz, H) if outputs == "merged" else {}
        before = _ROPE_RECIPES.replays
        got = mla_rope_quantize_fp8(*inputs, **kw, **given)
        assert (_ROPE_RECIPES.replays > before) == (call >= 2), f"call {call}"
        if given:
            assert all(a is b for a, b in zip(got, given.values()))
        want = _merged(nnz, H)
        with R.disabled():
            mla_rope_quantize_fp8(*inputs, **kw, **want)
        torch.cuda.synchronize()
        for name, a, b in zip(want, got, want.values()):
            assert not a.float().isnan().any(), f"call {call}: {name} not written"
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"call {call}: {name} differs"
