"""The transposed MSA sparse decode kernel (``sparse_decode.DECODE_VARIANT['kernel'] =
'transposed'``) against the reference: CPU interpreter on small shapes, GPU at MiniMax-M3
geometry."""

from __future__ import annotations

import pytest
import torch

from mate.ops.msa import sparse_decode as sd
from mate.testing import assert_close
from tests.msa.test_sparse_attention import TOL, make_problem, run_case


@pytest.fixture
def transposed(monkeypatch):
    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")


def _check(o, l_, ro, rl, dtype):
    atol, rtol = TOL[dtype]
    assert_close(o, ro, atol=atol, rtol=rtol)
    # fp8 Q·K runs on FP8 tensor cores, whose accumulator keeps ~13 mantissa bits (truncating):
    # a request with few visible keys has one dominant logit, so its LSE is off by up to a few
    # 2^-13 relative (measured 1.4e-4 on the H200); 16-bit dtypes accumulate in fp32
    lse_rtol = 5e-4 if dtype == torch.float8_e4m3fn else 1e-4
    assert_close(l_, rl, atol=1e-4, rtol=lse_rtol, name="lse")


# dtype, ratio, layout, splits, keys per tile, flat page list, non-contiguous cache
CASES = [
    (torch.bfloat16, 16, "NHD", 1, 64, False, False),
    (torch.bfloat16, 16, "HND", 2, 128, True, False),
    (torch.float16, 4, "NHD", 2, 64, False, False),  # ratio < 16: padded head columns
    (torch.float16, 32, "HND", 1, 128, False, False),
    (torch.float8_e4m3fn, 16, "NHD", 2, 64, False, False),
    (torch.float8_e4m3fn, 16, "HND", 1, 128, False, False),
    (torch.float8_e4m3fn, 8, "HND", 2, 64, True, True),  # 4D descriptors of a strided cache
    (torch.bfloat16, 16, "NHD", 1, 128, False, True),
]


@pytest.mark.parametrize("dtype,ratio,layout,splits,keys,flat,strided", CASES)
def test_transposed_decode_matches_reference(device, triton_backend, transposed, monkeypatch, dtype, ratio, layout,
                                             splits, keys, flat, strided):
    monkeypatch.setitem(sd.DECODE_VARIANT, "keys", keys)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_keys", keys)
    pb = make_problem([1, 0, 2], [300, 50, 129], hq=ratio, hkv=1, width=8, dtype=dtype, device=device,
                      layout=layout, flat=flat)
    if strided:  # every other page of a cache twice as large: not contiguous, 16-byte aligned
        for name in ("k", "v"):
            big = torch.zeros((2 * pb[name].shape[0], *pb[name].shape[1:]), dtype=dtype, device=device)
            big[::2] = pb[name]
            pb[name] = big[::2]
            assert not pb[name].is_contiguous()
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                             v_scale=scale[2], strided=splits == 2)
    _check(o, l_, ro, rl, dtype)


@pytest.mark.parametrize("dtype,splits", [(torch.float8_e4m3fn, 1), (torch.bfloat16, 2)])
def test_transposed_decode_lsum_matches_reference(device, triton_backend, transposed, monkeypatch, dtype, splits):
    """DECODE_VARIANT ``lsum``: the softmax denominator summed per key and reduced after the loop."""
    monkeypatch.setitem(sd.DECODE_VARIANT, "lsum", True)
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_lsum", True)
    pb = make_problem([1, 0, 2], [300, 50, 129], hq=16, hkv=1, width=8, dtype=dtype, device=device)
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                             v_scale=scale[2])
    _check(o, l_, ro, rl, dtype)


@pytest.mark.parametrize("splits", [1, 2])
def test_transposed_decode_empty_and_invalid_selections(device, triton_backend, transposed, splits):
    pb = make_problem([1, 1, 1], [384, 384, 200], hq=16, hkv=1, width=4, device=device)
    idx = pb["kv_block_indexes"]
    idx.fill_(-1)  # token 0: nothing selected
    idx[1, 0] = torch.tensor([9, -1, 3, 7])  # token 1: only out-of-range ids
    idx[2, 0, 2] = 1  # token 2: one block, partly causal
    o, l_, ro, rl = run_case(device, pb, decode=True, splits=splits)
    _check(o, l_, ro, rl, torch.bfloat16)
    assert (o[:2].float() == 0).all() and torch.isinf(l_[:2]).all() and (l_[:2] < 0).all()
    assert torch.isfinite(l_[2]).all()


def test_transposed_programs_per_sm_and_workspace_bound(monkeypatch):
    """Residency from the compile table, and the auto-split workspace bound of the heads-on-M
    kernel also covers the transposed kernel's splits."""
    from mate.ops.msa import sparse_attention as sa

    cpu = torch.device("cpu")
    monkeypatch.setitem(sd.DECODE_VARIANT, "kernel", "transposed")
    assert sd.t_programs_per_sm(False) == 2  # 64-key tiles, 3 stages: 104 KB
    monkeypatch.setitem(sd.DECODE_VARIANT, "stages", 2)
    assert sd.t_programs_per_sm(False) == 3  # 64-key tiles, 2 stages: 72 KB
    assert sd.t_programs_per_sm(True) == 4  # fp8 64-key tiles, 3 stages: 102 registers
    monkeypatch.setitem(sd.DECODE_VARIANT, "fp8_maxnreg", 96)
    assert sd.t_programs_per_sm(True) == 5  # capped at 96 registers
    monkeypatch.setitem(sd.DECODE_VARIANT, "keys", 128)
    assert sd.t_programs_per_sm(False) == 1  # 139 KB
    for rows in (1, 33, 128):
        _, n_flt = sa.workspace_numel(rows, 64, 4, 17, True, -1, cpu)
        for r in range(1, rows + 1):
            for fp8 in (False, True):
                s = sa.resolve_num_splits(-1, r, 64, 4, 17, True, cpu, fp8)
                assert sa.workspace_numel(r, 64, 4, 17, True, s, cpu)[1] <= n_flt


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits", [-1, 1, 3])
def test_transposed_decode_gpu_m3(transposed, dtype, layout, splits):
    """M3 geometry (64 q heads, 4 KV heads, width 16 + 1 forced) at random lengths, every
    pipelining configuration of the compile table."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    b = 7
    kv_lens = [1 + int(torch.randint(0, 6000, (1,), generator=g)) for _ in range(b)]
    pb = make_problem([1] * b, kv_lens, hq=64, hkv=4, width=17, dtype=dtype, device="cuda", layout=layout)
    scale = (0.05, 2.0, 0.25) if dtype == torch.float8_e4m3fn else (None, 1.0, 1.0)
    is_fp8 = dtype == torch.float8_e4m3fn
    pre = "fp8_" if is_fp8 else ""
    for (fp8, keys, stages) in sd.T_COMPILES:
        if fp8 != is_fp8:
            continue
        old = dict(sd.DECODE_VARIANT)
        sd.DECODE_VARIANT.update({pre + "keys": keys, pre + "stages": stages})
        try:
            o, l_, ro, rl = run_case("cuda", pb, decode=True, splits=splits, sm_scale=scale[0], k_scale=scale[1],
                                     v_scale=scale[2], strided=True)
        finally:
            sd.DECODE_VARIANT.update(old)
        _check(o, l_, ro, rl, dtype)
